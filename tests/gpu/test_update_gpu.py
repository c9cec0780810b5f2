"""The whole update on the GPU against the NumPy update, and graph replay against eager launch."""

import numpy as np
import pytest

from foxhunt_core.agent import Agent, tree_copy
from foxhunt_core.config import NetSettings, RunSettings, TrainSettings
from foxhunt_core.plugins import LoadedPlugin, PluginSet
from hook_plugins import AffinePostPlugin, CenterPlugin, OfiColumnPlugin, TanhGatePlugin

pytestmark = pytest.mark.gpu


def _cp():
    import cupy

    from foxhunt_core.gpu import cublas

    cublas.set_tf32(False)  # fp32 GEMMs: these tests compare against the NumPy float32 update
    return cupy


def _settings(tf32=False):
    net = NetSettings(shared_h1=64, shared_h2=64, adv_h=48)
    return RunSettings(net=net, train=TrainSettings(lr=1e-3, tf32=tf32))


def _plugins(with_stages):
    if not with_stages:
        return PluginSet()
    table = {"center": CenterPlugin, "affine_post": AffinePostPlugin,
             "tanh_gate": TanhGatePlugin, "ofi_column": OfiColumnPlugin}
    return PluginSet([LoadedPlugin(n, c.POSITION, c()) for n, c in table.items()])


def _batch(rng, B):
    return {
        "obs": rng.normal(size=(B, 50)).astype(np.float32),
        "next_obs": rng.normal(size=(B, 50)).astype(np.float32),
        "action": rng.integers(0, 3, size=(B, 4)),
        "reward": rng.normal(size=B).astype(np.float32),
        "terminal": (rng.random(B) < 0.1).astype(np.float32),
    }


def _to(xp, tree):
    return {o: {k: xp.asarray(v) for k, v in s.items()} for o, s in tree.items()}


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _flat_index(cp, view):
    """Element offsets (from the view's first element) of every element of a strided view."""
    idx = cp.zeros((), dtype=cp.int64)
    for n, st in zip(view.shape, view.strides):
        idx = idx[..., None] + cp.arange(n, dtype=cp.int64) * (st // view.itemsize)
    return idx.ravel()


def _rel(a, b):
    a, b = _host(a).astype(np.float64), _host(b).astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("with_stages", [False, True], ids=["core", "with-stages"])
def test_gpu_update_matches_cpu_update(with_stages):
    cp = _cp()
    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 30))
    cpu = Agent(_settings(), _plugins(with_stages), np, np.random.default_rng(seed))
    gpu = Agent(_settings(), _plugins(with_stages), cp, np.random.default_rng(seed))
    for o, s in cpu.online.items():
        for k, v in s.items():
            # A target network other than the online one: its forward (run in the same
            # strided-batched GEMMs as the online forwards on the GPU) must use its own weights.
            cpu.target[o][k][...] = v + rng.normal(0.0, 0.05, v.shape).astype(v.dtype)
            gpu.online[o][k][...] = cp.asarray(v)
            gpu.target[o][k][...] = cp.asarray(cpu.target[o][k])
    batch = _batch(rng, 256)
    g_cpu, s_cpu, _, _ = cpu.loss_and_grads(batch, 0.01)
    g_gpu, s_gpu, _, _ = gpu.loss_and_grads(_to(cp, {"b": batch})["b"], 0.01)
    for key in ("loss", "aux_loss", "entropy"):
        assert abs(float(s_cpu[key]) - float(s_gpu[key])) < 1e-4 * abs(float(s_cpu[key])), key
    for o, s in g_cpu.items():
        for k, v in s.items():
            assert _rel(g_gpu[o][k], v) < 2e-3, f"{o}/{k}"  # fp32 on both, different summation order
    before = {o: {k: v.copy() for k, v in s.items()} for o, s in cpu.online.items()}
    cpu.opt.step(cpu.online, g_cpu)
    gpu.opt.step(gpu.online, g_gpu)
    # Adam's first step is ~lr * sign(g): compare the parameter changes, allowing for the few
    # near-zero gradient entries whose sign the two summation orders may disagree on.
    for o, s in cpu.online.items():
        for k, v in s.items():
            d_cpu = v - before[o][k]
            d_gpu = _host(gpu.online[o][k]) - before[o][k]
            assert _rel(d_gpu, d_cpu) < 2e-2, f"{o}/{k} after Adam"
    # The padded weight blocks of the flat buffers: their padding stays zero through the step,
    # and the target network (same layout) takes all of it in one copy.
    flat = gpu.opt.flat
    covered = cp.zeros(flat.buffer.shape, dtype=bool)  # the elements some tensor lives in
    for _, _, view in flat.items():
        covered[view.data.ptr // 4 - flat.buffer.data.ptr // 4 + _flat_index(cp, view)] = True
    assert not _host(flat.buffer[~covered]).any(), "padding written"
    assert gpu.online["core"].storage, "the fused path pads and joins the head and GLU weights"
    gpu.sync_target()
    for o, s in gpu.online.items():
        for k, v in s.items():
            assert cp.array_equal(gpu.target[o][k], v), f"target {o}/{k}"


def _replay_against_eager(cp, rng, eager, graphed, g, rows, steps):
    """``steps`` updates on fresh batches of ``rows``, eagerly by ``eager`` and replayed by ``g``
    (``graphed``'s captured update): the same losses, and the same parameters after."""
    for step in range(steps):
        batch = _to(cp, {"b": _batch(rng, rows)})["b"]
        coeff = 0.01 * (step + 1)
        s_e, _, _ = eager.update(batch, cp.asarray(coeff, dtype=cp.float32))
        g.load_batch(batch)
        s_g, _, _ = g.replay(coeff)
        cp.cuda.get_current_stream().synchronize()
        assert abs(float(s_e["loss"]) - float(s_g["loss"])) <= 1e-5 * abs(float(s_e["loss"]))
    for o, s in eager.online.items():
        for k, v in s.items():
            assert _rel(graphed.online[o][k], v) < 1e-5, f"{o}/{k}"


@pytest.mark.parametrize("with_stages", [False, True], ids=["core", "with-stages"])
def test_graph_replay_equals_eager_updates(with_stages):
    cp = _cp()
    from foxhunt_core.graphs import GraphedUpdate

    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 30))
    eager = Agent(_settings(), _plugins(with_stages), cp, np.random.default_rng(seed))
    graphed = Agent(_settings(), _plugins(with_stages), cp, np.random.default_rng(seed))
    start = tree_copy(graphed.online)
    g = GraphedUpdate(graphed, 128)
    for o, s in start.items():  # capture left the parameters untouched
        for k, v in s.items():
            assert cp.array_equal(graphed.online[o][k], v), f"capture changed {o}/{k}"
    _replay_against_eager(cp, rng, eager, graphed, g, 128, 5)
    assert graphed.opt.t == eager.opt.t == 5
    assert int(graphed.opt.t_dev.get().ravel()[0]) == 5


def test_q_pipeline_beside_the_backward_changes_no_bit():
    """The plan's q_stream: the Q pipeline at s (attention, the post-attention stage, the auxiliary
    loss and their backward) on a stream of its own, its forward forking beside the bootstrap
    (q_early) or after the loss kernel, gives the same bits as in line after the network's
    backward, eagerly (gradients and scalars of one update at 4096 rows, where they overlap) and
    captured (five replays against five in-line eager updates)."""
    cp = _cp()
    from foxhunt_core.graphs import GraphedUpdate

    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 30))
    agent = Agent(_settings(), _plugins(True), cp, np.random.default_rng(seed))
    assert agent.plan.q_stream and agent.plan.knobs.q_early, agent.plan.q_stream.why
    batch = _to(cp, {"b": _batch(rng, 4096)})["b"]
    results = []
    for overrides in ({}, {"q_early": False}, {"q_stream": False}):
        if overrides:
            agent.replan(**overrides)
            assert bool(agent.plan.q_stream) is overrides.get("q_stream", True)
            assert agent.plan.knobs.q_early is overrides.get("q_early", True)
        g, sc, _, q = agent.loss_and_grads(batch, 0.01)
        # (the gradients are views of the flat buffer that the next call overwrites)
        results.append(({o: {k: _host(v) for k, v in sub.items()} for o, sub in g.items()},
                        {k: float(v) for k, v in sc.items()}, _host(q.q_coord)))
    g_off, s_off, q_off = results[-1]
    assert {"affine_post"} <= g_off.keys()
    for g_on, s_on, q_on in results[:-1]:
        assert s_on == s_off
        np.testing.assert_array_equal(q_on, q_off)
        assert g_on.keys() == g_off.keys()
        for o, sub in g_off.items():
            for k, v in sub.items():
                np.testing.assert_array_equal(g_on[o][k], v, err_msg=f"{o}/{k}")

    eager = Agent(_settings(), _plugins(True), cp, np.random.default_rng(seed), plan_overrides={"q_stream": False})
    graphed = Agent(_settings(), _plugins(True), cp, np.random.default_rng(seed))
    assert graphed.plan.q_stream and not eager.plan.q_stream
    g = GraphedUpdate(graphed, 1024)
    _replay_against_eager(cp, rng, eager, graphed, g, 1024, 5)


def _glu_net_settings():
    """GLUs 128 wide (glu_gemm's tile) under TF32: the update's GLUs run as glu_gemm."""
    net = NetSettings(shared_h1=64, shared_h2=64, adv_h=128)
    return RunSettings(net=net, train=TrainSettings(lr=1e-3, tf32=True))


def _paired_agents(cp, settings, **plan):
    """A CPU agent and a GPU agent of ``settings`` with the same parameters, the target network
    other than the online one (the GPU agent's execution plan built with ``plan``'s overrides);
    and the random generator that made them."""
    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 30))
    cpu = Agent(settings, PluginSet(), np, np.random.default_rng(seed))
    gpu = Agent(settings, PluginSet(), cp, np.random.default_rng(seed), plan_overrides=plan)
    for o, s in cpu.online.items():
        for k, v in s.items():
            cpu.target[o][k][...] = v + rng.normal(0.0, 0.05, v.shape).astype(v.dtype)
            gpu.online[o][k][...] = cp.asarray(v)
            gpu.target[o][k][...] = cp.asarray(cpu.target[o][k])
    return rng, cpu, gpu


def _record(agent, names):
    """The calls, in order, of the kernels ``names`` that ``agent``'s fused network makes from now
    on (the kernel namespace it was given, wrapped; a new plan keeps the wrapper)."""
    calls = []
    fnet = agent.fused_network
    real = fnet.K

    class Recording:
        def __getattr__(self, name):
            fn = getattr(real, name)
            if name not in names:
                return fn
            return lambda *a, **kw: calls.append((name, kw)) or fn(*a, **kw)

    fnet.K = Recording()
    return calls


def _names(calls):
    return [n for n, _ in calls]


def _glu_agents(cp, **plan):
    """A CPU agent and a GPU agent of the GLU network with the same parameters (the target network
    other than the online one), the GPU under TF32, and a record of its glu_gemm, linear_gemm,
    heads_dueling and glu_backward_gemm calls."""
    from foxhunt_core.gpu import cublas
    from foxhunt_core.gpu import kernels as K

    if not K.glu_gemm_supported(128):
        pytest.skip("glu_gemm needs a compute capability 9.0 GPU")
    rng, cpu, gpu = _paired_agents(cp, _glu_net_settings(), **plan)
    calls = _record(gpu, ("glu_gemm", "linear_gemm", "heads_dueling", "glu_backward_gemm"))
    cublas.set_tf32(True)
    return rng, cpu, gpu, calls


def test_glu_gemm_forward_is_as_accurate_as_cublas():
    """Under TF32 the fused network's GLUs run as one kernel each (glu_gemm) and its advantage
    heads with the dueling forward as one more (heads_dueling; linear_gemm then
    dueling_softmax_forward without it). Its outputs (every action's log-probabilities and E[Q]
    over 2048 rows) are as close to the float64 reference forward as those of the path through
    cuBLAS's GEMMs and glu_forward, also TF32: both round their operands to TF32 to nearest
    (glu_gemm with truncated operands was 2.5x further off)."""
    cp = _cp()
    from foxhunt_core.gpu import cublas

    # heads_dueling as from the rows where its tiles fill the GPU, here at 2048
    rng, cpu, gpu, calls = _glu_agents(cp, fill_sms=1)
    try:
        obs = rng.normal(size=(2048, 50)).astype(np.float32)
        params64 = {o: {k: v.astype(np.float64) for k, v in s.items()} for o, s in cpu.online.items()}
        ref = cpu.net.forward(params64, obs.astype(np.float64))
        q_ref = (ref.probs * cpu.net.support64).sum(-1)
        assert gpu.plan.glu_gemm and gpu.plan.heads_dueling_at(2048, 1), gpu.plan.glu_gemm.why
        glu = gpu.fused_network.forward(gpu.online, cp.asarray(obs))
        assert _names(calls) == ["glu_gemm", "heads_dueling", "glu_gemm", "heads_dueling"], calls
        gpu.replan(fill_sms=1, heads_dueling=False)
        apart = gpu.fused_network.forward(gpu.online, cp.asarray(obs))
        assert _names(calls[4:]) == ["glu_gemm", "linear_gemm", "glu_gemm", "linear_gemm"], calls
        gpu.replan(glu_gemm=False)
        assert not gpu.plan.glu_gemm
        n = len(calls)
        lt = gpu.fused_network.forward(gpu.online, cp.asarray(obs))
        assert len(calls) == n
    finally:
        cublas.set_tf32(False)
    for name, r in (("log_probs", ref.log_probs), ("q", q_ref)):
        e_glu, e_lt = _rel(getattr(glu, name), r), _rel(getattr(lt, name), r)
        assert e_glu < 1e-2, f"{name}: {e_glu:.3g}"
        assert e_glu < 1.25 * e_lt, f"{name}: glu_gemm {e_glu:.3g} against cuBLAS {e_lt:.3g}"
        # The dueling forward in the heads' epilogue computes what the kernel apart computes.
        assert _rel(getattr(glu, name), getattr(apart, name)) < 1e-5, name


def test_update_through_glu_gemm_matches_the_cpu_update():
    """The whole update with the GLUs as glu_gemm and the heads as heads_dueling (linear_gemm where
    no dueling forward follows; past the stacking threshold, as large batches run), their backward
    as glu_backward_gemm, against the NumPy float32 update: the loss to 2e-3, all gradients
    together to 2e-2, each parameter's to 1e-1. The plan says which kernels the update takes and
    the record of the calls shows each of them ran: the GLU groups of the online pair's forward and
    the target's (glu_gemm), the online pair's heads with their dueling forward and the target's
    direction heads with theirs (heads_dueling), the target's magnitude heads (linear_gemm), both
    GLU groups' backward (glu_backward_gemm).
    (The C51 gradient, a difference of two distributions, amplifies TF32's relative error in small
    gradients; the forward's accuracy is compared with cuBLAS's above. A wiring error —
    pre-activations of the wrong rows, a missing value head — is off by order one.)"""
    cp = _cp()
    from foxhunt_core.gpu import cublas

    # One parameter tree per forward; glu_backward_gemm and heads_dueling as from the batch where
    # they have a tile for every SM, here at 512 rows.
    rng, cpu, gpu, calls = _glu_agents(cp, stack_max_rows=0, fill_sms=1)
    plan = gpu.plan
    assert not plan.stacks(512) and plan.glu_gemm and plan.heads_dueling_at(512, 1) and plan.glu_backward_at(512, 1)
    batch = _batch(rng, 512)
    try:
        g_gpu, s_gpu, _, _ = gpu.loss_and_grads(_to(cp, {"b": batch})["b"], 0.01)
    finally:
        cublas.set_tf32(False)
    # target forward (on the side stream, queued first), then the online pair's; then the backward
    assert _names(calls) == ["glu_gemm", "heads_dueling", "glu_gemm", "linear_gemm",
                             "glu_gemm", "heads_dueling", "glu_gemm", "heads_dueling",
                             "glu_backward_gemm", "glu_backward_gemm"], calls
    g_cpu, s_cpu, _, _ = cpu.loss_and_grads(batch, 0.01)
    assert_tf32_update_close(g_gpu, s_gpu, g_cpu, s_cpu)


def assert_tf32_update_close(g_gpu, s_gpu, g_cpu, s_cpu, owners=()):
    """A GPU update under TF32 against the CPU float32 one: the loss to 2e-3, each parameter's
    gradient to 1e-1, all of them together to 2e-2, and each of ``owners``' together to 2e-2."""
    assert abs(float(s_cpu["loss"]) - float(s_gpu["loss"])) < 2e-3 * abs(float(s_cpu["loss"]))
    for o, s in g_cpu.items():
        for k, v in s.items():
            assert _rel(g_gpu[o][k], v) < 1e-1, f"{o}/{k}: {_rel(g_gpu[o][k], v):.3g}"
    for group in (list(g_cpu), *([o] for o in owners)):
        names = [(o, k) for o in group for k in g_cpu[o]]
        every = np.concatenate([np.ravel(g_cpu[o][k]) for o, k in names])
        assert _rel(np.concatenate([np.ravel(_host(g_gpu[o][k])) for o, k in names]), every) < 2e-2, group


def test_graph_replay_through_glu_gemm_equals_eager_updates():
    """The GLUs as glu_gemm (TF32, 128 wide) inside the captured update: replay gives the eager
    updates (the tensor maps are kernel parameters copied into the graph). The plan takes glu_gemm
    for the update at 16384 rows (past the stacking threshold: one parameter tree per forward), and
    the capture launched it for both forwards' GLU groups."""
    cp = _cp()
    from foxhunt_core.gpu import cublas
    from foxhunt_core.gpu import kernels as K
    from foxhunt_core.graphs import GraphedUpdate

    if not K.glu_gemm_supported(128):
        pytest.skip("glu_gemm needs a compute capability 9.0 GPU")
    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 30))
    eager = Agent(_glu_net_settings(), PluginSet(), cp, np.random.default_rng(seed))
    graphed = Agent(_glu_net_settings(), PluginSet(), cp, np.random.default_rng(seed))
    plan = graphed.plan.but(batch=16384)
    assert plan.glu_gemm and not plan.stacks(16384), (plan.glu_gemm.why, plan.stacks(16384).why)
    calls = _record(graphed, ("glu_gemm",))
    cublas.set_tf32(True)
    try:
        g = GraphedUpdate(graphed, 16384)
        # each warm-up run and the captured one: the target's two GLU groups and the online pair's
        assert _names(calls) == ["glu_gemm"] * 4 * 3, calls
        _replay_against_eager(cp, rng, eager, graphed, g, 16384, 3)
    finally:
        cublas.set_tf32(False)


def _default_tf32_settings():
    """The default network (trunk 256/256, adv_h 256: z is 260 wide, wgrad_gemm's tile) under TF32."""
    return RunSettings(train=TrainSettings(lr=1e-3, tf32=True))


def test_weight_gradients_through_wgrad_gemm_are_as_accurate_as_cublas():
    """The default network under TF32: the GLU blocks' weight gradients (every branch's gate and
    value weights and biases, and the value head's, which shares the direction branch's block) come
    from wgrad_gemm, the advantage heads' (weights and biases) from wgrad_gemm_sets. Against the
    NumPy float32 update from the same parameters and batch they are as close as the same update's
    through cuBLAS's GEMMs (both TF32, the same forward): all of them together within 10%, each
    within 50% of cuBLAS's error (a wiring error, e.g. a column block off by one branch or the
    direction-Q rows not zeroed, is off by order one)."""
    cp = _cp()
    from foxhunt_core.gpu import cublas
    from foxhunt_core.gpu import kernels as K

    if not K.wgrad_gemm_supported(260):
        pytest.skip("wgrad_gemm needs a compute capability 9.0 GPU")
    # the heads' as from 32768 rows, here at 2048
    rng, cpu, gpu = _paired_agents(cp, _default_tf32_settings(), wgrad_heads_min_rows=0)
    calls = _record(gpu, ("wgrad_gemm", "wgrad_gemm_sets"))
    batch = _batch(rng, 2048)
    cublas.set_tf32(True)
    try:
        g_tc, s_tc, _, _ = gpu.loss_and_grads(_to(cp, {"b": batch})["b"], 0.01)
        # both GLU blocks', and the heads' of both groups
        assert sorted(_names(calls)) == ["wgrad_gemm"] * 2 + ["wgrad_gemm_sets"] * 2, calls
        gpu.replan(wgrad_heads_min_rows=0, wgrad_gemm=False)
        g_lt, s_lt, _, _ = gpu.loss_and_grads(_to(cp, {"b": batch})["b"], 0.01)
        assert len(calls) == 4
    finally:
        cublas.set_tf32(False)
    assert abs(float(s_tc["loss"]) - float(s_lt["loss"])) <= 1e-6 * abs(float(s_lt["loss"]))  # the same forward
    g_cpu, _, _, _ = cpu.loss_and_grads(batch, 0.01)
    names = [k for k in g_cpu["core"] if k.startswith("value.") or k.split(".")[-1] in ("w_gate", "w_val", "b_gate",
                                                                                        "b_val", "w_out", "b_out")]
    assert len(names) == 2 + 4 * 6
    _assert_as_accurate("wgrad_gemm", g_tc["core"], g_lt["core"], g_cpu["core"], names)


def _assert_as_accurate(label, g_tc, g_lt, g_ref, names):
    """The gradients ``names`` of ``g_tc`` (through our kernel) are as close to ``g_ref`` as those of
    ``g_lt`` (through cuBLAS): each within 50% of cuBLAS's error, all of them together within 10%
    (and 2e-2)."""
    for k in names:
        e_tc, e_lt = _rel(g_tc[k], g_ref[k]), _rel(g_lt[k], g_ref[k])
        assert e_tc < 1.5 * e_lt + 1e-7, f"{k}: {label} {e_tc:.3g} against cuBLAS {e_lt:.3g}"
    every = np.concatenate([np.ravel(g_ref[k]) for k in names])
    e_tc = _rel(np.concatenate([np.ravel(_host(g_tc[k])) for k in names]), every)
    e_lt = _rel(np.concatenate([np.ravel(_host(g_lt[k])) for k in names]), every)
    assert e_tc < 1.1 * e_lt and e_tc < 2e-2, (e_tc, e_lt)


def test_graph_replay_through_wgrad_gemm_equals_eager_updates():
    """The default network under TF32 (its GLU blocks' weight gradients through wgrad_gemm and the
    heads' through wgrad_gemm_sets, here from any batch size, their scratch from the graph's own
    memory pool; at 16384 rows the trunk's input gradients through linear_gemm_relu_backward)
    inside the captured update: replay gives the eager updates, at a stacked batch size and past
    the stacking threshold."""
    cp = _cp()
    from foxhunt_core.gpu import cublas
    from foxhunt_core.gpu import kernels as K
    from foxhunt_core.graphs import GraphedUpdate

    if not K.wgrad_gemm_supported(260):
        pytest.skip("wgrad_gemm needs a compute capability 9.0 GPU")
    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 30))
    plan = dict(wgrad_heads_min_rows=0, relu_gemm_min_rows=0)  # (linear_gemm_relu_backward at 16384 rows too)
    cublas.set_tf32(True)
    try:
        for rows in (4096, 16384):
            eager = Agent(_default_tf32_settings(), PluginSet(), cp, np.random.default_rng(seed), plan_overrides=plan)
            graphed = Agent(_default_tf32_settings(), PluginSet(), cp, np.random.default_rng(seed), plan_overrides=plan)
            assert graphed.plan.wgrad_heads_at(rows) and (rows < 16384 or graphed.plan.relu_gemm_at(rows))
            _replay_against_eager(cp, rng, eager, graphed, GraphedUpdate(graphed, rows), rows, 2)
    finally:
        cublas.set_tf32(False)


def test_trunk_gradients_through_linear_gemm_relu_backward_are_as_accurate_as_cublas():
    """The default network under TF32: the trunk's input gradients (into h2 through the VSN's
    weights, into h1 through trunk.w2) from linear_gemm_relu_backward, the ReLUs' backward in the
    GEMM's epilogue (here at 2048 rows, as if they filled the SMs). Against the NumPy float32 update
    from the same parameters and batch, the trunk's weight and bias gradients are as close as the
    same update's through cuBLAS's GEMMs and relu_backward (both TF32, the same forward): each
    within 50% of cuBLAS's error, all of them together within 10% (a wiring error, e.g. the wrong
    ReLU's output as the mask or the addend left out, is off by order one)."""
    cp = _cp()
    from foxhunt_core.gpu import cublas
    from foxhunt_core.gpu import kernels as K

    if not K.glu_gemm_supported():
        pytest.skip("linear_gemm_relu_backward needs a compute capability 9.0 GPU")
    rng, cpu, gpu = _paired_agents(cp, _default_tf32_settings(), relu_gemm_min_rows=0, fill_sms=1)
    calls = _record(gpu, ("linear_gemm_relu_backward",))
    batch = _batch(rng, 2048)
    cublas.set_tf32(True)
    try:
        assert gpu.plan.relu_gemm_at(2048), gpu.plan.relu_gemm_at(2048).why
        g_tc, s_tc, _, _ = gpu.loss_and_grads(_to(cp, {"b": batch})["b"], 0.01)
        assert len(calls) == 2, calls  # dh2, then dh1
        gpu.replan(relu_gemm_min_rows=0, fill_sms=1, relu_gemm=False)
        g_lt, s_lt, _, _ = gpu.loss_and_grads(_to(cp, {"b": batch})["b"], 0.01)
        assert len(calls) == 2
    finally:
        cublas.set_tf32(False)
    assert abs(float(s_tc["loss"]) - float(s_lt["loss"])) <= 1e-6 * abs(float(s_lt["loss"]))  # the same forward
    g_cpu, _, _, _ = cpu.loss_and_grads(batch, 0.01)
    _assert_as_accurate("linear_gemm_relu_backward", g_tc["core"], g_lt["core"], g_cpu["core"],
                        ["trunk.w1", "trunk.b1", "trunk.w2", "trunk.b2"])


def test_direction_q_gradient_from_glu_backward_gemm_is_as_accurate_as_cublas():
    """The default network under TF32 (adv_h 256: two column tiles a branch), glu_backward_gemm as
    if it filled the SMs (here at 2048 rows): the gradient of z's direction-Q columns (dq, which the
    direction branch's dueling backward reads) from the magnitude branch's pre-activation gradients
    in the kernel's epilogue. Against the NumPy float32 update from the same parameters and batch,
    every core gradient is as close as the same update's with dq from cuBLAS's product: each within
    50% of cuBLAS's error, all of them together within 10% (dq from the wrong branch, the wrong
    half of Wq or one column tile missing is off by order one in the direction branch's)."""
    cp = _cp()
    from foxhunt_core.gpu import cublas
    from foxhunt_core.gpu import kernels as K

    if not K.glu_gemm_supported():
        pytest.skip("glu_backward_gemm needs a compute capability 9.0 GPU")
    rng, cpu, gpu = _paired_agents(cp, _default_tf32_settings(), fill_sms=1)
    calls = _record(gpu, ("glu_backward_gemm",))  # whether each glu_backward_gemm call took dq
    batch = _batch(rng, 2048)
    cublas.set_tf32(True)
    try:
        assert gpu.plan.glu_backward_dq and gpu.plan.glu_backward_at(2048, 1)
        g_tc, s_tc, _, _ = gpu.loss_and_grads(_to(cp, {"b": batch})["b"], 0.01)
        # two groups: the magnitude branch's took dq
        assert sorted("dq" in kw for _, kw in calls) == [False, True], calls
        gpu.replan(fill_sms=1, glu_backward_dq=False)  # dq through cuBLAS
        g_lt, s_lt, _, _ = gpu.loss_and_grads(_to(cp, {"b": batch})["b"], 0.01)
        assert sorted("dq" in kw for _, kw in calls) == [False, False, False, True], calls
    finally:
        cublas.set_tf32(False)
    assert abs(float(s_tc["loss"]) - float(s_lt["loss"])) <= 1e-6 * abs(float(s_lt["loss"]))  # the same forward
    g_cpu, _, _, _ = cpu.loss_and_grads(batch, 0.01)
    _assert_as_accurate("glu_backward_gemm's dq", g_tc["core"], g_lt["core"], g_cpu["core"], list(g_cpu["core"]))
