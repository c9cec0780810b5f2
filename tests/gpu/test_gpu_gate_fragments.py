"""A gate's CUDA fragment inside the GLU kernels (gate.cuh): glu_gemm's forward epilogue,
glu_backward_gemm's backward epilogue with its parameter-gradient sums, the elementwise
gate_glu_forward and gate_glu_backward, against the NumPy twins (``reference.glu_gemm``,
``reference.glu_backward_gemm``, ``reference.gate_glu_*`` with the gate stage's own float64
forward and backward), for the tests' tanh gate and kan_gate; then the whole update with each gate
on the fused path against the CPU update, and its graph replay against eager updates.

Fresh random inputs (the seed is printed), every output poisoned with NaN first. GEMM operands are
TF32 values (the low 13 mantissa bits cleared), so the products are exact and the errors
float32's: ``||out - ref|| / ||ref|| < 2e-5`` for h and dpv, ``< 5e-5`` for the parameter
gradients (sums over thousands of rows, in float32 per CTA or block, then in double). kan_gate's
derivative jumps at the grid's ends and where its output clamp bites: pre-activations within 1e-4
of either are moved off them (float32 could fall on the other side of a kink).
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import assert_close, host64, nan_like, skip_without_wgmma, to_dev
from gpu_parity import tf32_truncated as tf32

from foxhunt_core.gpu import kernels as K
from foxhunt_core.gpu import reference as R
from hook_plugins import TanhGateStage

pytestmark = pytest.mark.gpu
TOL, TOL_GRAD, KINK = 2e-5, 5e-5, 1e-4


def _kan():
    from foxhunt_kan_gate.stage import KanGateStage

    return KanGateStage()


GATES = {"tanh_gate": TanhGateStage, "kan_gate": _kan}


def _params(stage, H, sets, rng):
    """The gate's parameters for ``sets`` branches of ``H`` units, moved off their initial values."""
    tree = stage.init_params((H,) * sets, rng)
    for k, v in tree.items():
        spread = 0.3 if k.endswith(("slope", "coeff")) else 0.1
        tree[k] = np.asarray(v, np.float64) + rng.normal(0, spread, v.shape)
    return {k: v.astype(np.float32).astype(np.float64) for k, v in tree.items()}


def _off_kinks(stage, tree, pre, sets, H, rng):
    """``pre`` [M, sets H] with kan_gate's kinks avoided (its grid's ends, raw gate 0 and 1): the
    elements within KINK of one are drawn again until none is."""
    if not hasattr(stage, "grid"):
        return pre
    from foxhunt_kan_gate.gate import gate_forward

    g = stage.grid
    pre = pre.copy()
    for _ in range(50):
        near = np.zeros(pre.shape, bool)
        for end in (g.lo, g.hi):
            near |= np.abs(pre - end) < KINK
        for d in range(sets):
            c, r = tree[f"b{d}.coeff"], tree[f"b{d}.residual"]
            x = pre[:, H * d : H * (d + 1)]
            _, cache = gate_forward(np, g, c, r, x)
            raw = r * x
            for j, b in enumerate(cache.basis):
                raw = raw + c.reshape(-1)[cache.first + j] * b
            near[:, H * d : H * (d + 1)] |= (np.abs(raw) < KINK) | (np.abs(raw - 1.0) < KINK)
        if not near.any():
            return pre
        pre[near] = rng.normal(0, 2.0, int(near.sum())).astype(np.float32)
    raise AssertionError("could not draw pre-activations off kan_gate's kinks")


def _launches(cp, stage, tree, sets, with_grads):
    """The device launch (its parameters as float32 arrays, gradients NaN-poisoned) and the twin's."""
    dev = {k: to_dev(cp, v) for k, v in tree.items()}
    grads = {k: nan_like(cp, v.shape) for k, v in tree.items()} if with_grads else None
    branches = tuple(range(sets))
    return K.branch_launch(stage, dev, branches, grads), K.branch_launch(stage, tree, branches), grads


@pytest.fixture(autouse=True)
def _hopper(cp):
    skip_without_wgmma()


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("M, sets", [(300, 1), (5000, 3), (16384, 3)])
def test_glu_gemm_applies_the_fragments_gate(cp, rng, gate, M, sets):
    stage, H, Kw, Wh = GATES[gate](), 256, 256, 260
    tree = _params(stage, H, sets, rng)
    u64 = host64(tf32(rng.normal(0, 1, (M, Kw))))
    w64 = host64(tf32(rng.normal(0, 1.5 / np.sqrt(Kw), (Kw, sets * 2 * H))))
    dev, twin, _ = _launches(cp, stage, tree, sets, False)
    h = nan_like(cp, (M, sets * Wh))
    K.glu_gemm(to_dev(cp, u64), to_dev(cp, w64), width=Wh, blocks=sets, h=h, gate=dev)
    _, ref = R.glu_gemm(u64, w64, None, Wh, sets, twin)
    assert_close("h", h, ref, TOL)


def _backward_case(cp, rng, stage, tree, M, Kw, H, sets):
    dadv64 = host64(tf32(rng.normal(0, 0.5, (M, sets * Kw))))
    wo64 = host64(tf32(rng.normal(0, 1.0 / np.sqrt(Kw), (H, sets * Kw))))
    pv64 = rng.normal(0, 2.0, (M, sets * 2 * H)).astype(np.float32).astype(np.float64)
    gates = np.concatenate([pv64[:, 2 * H * d : 2 * H * d + H] for d in range(sets)], axis=1)
    gates = _off_kinks(stage, tree, gates, sets, H, rng)
    for d in range(sets):
        pv64[:, 2 * H * d : 2 * H * d + H] = gates[:, H * d : H * (d + 1)]
    return dadv64, wo64, pv64


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("M, sets", [(300, 1), (5000, 3), (16384, 3)])
def test_glu_backward_gemm_runs_the_fragments_backward(cp, rng, gate, M, sets):
    """dpv and the gate's parameter gradients from the epilogue; the gradients are the same bits on
    a second run (fixed-order sums, no atomics)."""
    stage, H, Kw = GATES[gate](), 256, 156
    tree = _params(stage, H, sets, rng)
    dadv64, wo64, pv64 = _backward_case(cp, rng, stage, tree, M, Kw, H, sets)
    d_dev, w_dev = to_dev(cp, dadv64), to_dev(cp, wo64)
    dadv = [d_dev[:, Kw * i : Kw * (i + 1)] for i in range(sets)]
    wo = [w_dev[:, Kw * i : Kw * (i + 1)] for i in range(sets)]
    split = lambda a: [a[:, Kw * i : Kw * (i + 1)] for i in range(sets)]  # noqa: E731
    ref_dpv, ref_grads = R.glu_backward_gemm(split(dadv64), split(wo64), pv64, _launches(cp, stage, tree, sets,
                                                                                         False)[1])
    runs = []
    for _ in range(2):
        dev, _, grads = _launches(cp, stage, tree, sets, True)
        pv = to_dev(cp, pv64)
        K.glu_backward_gemm(dadv, wo, pv, gate=dev)
        assert_close("dpv", pv, ref_dpv, TOL)
        for k, v in ref_grads.items():
            assert_close(k, grads[k], v, TOL_GRAD)
        runs.append({k: g.get() for k, g in grads.items()})
    for k in runs[0]:
        assert np.array_equal(runs[0][k].view(np.uint32), runs[1][k].view(np.uint32)), f"{k} differs between runs"


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("M, H, sets", [(1, 48, 1), (777, 100, 3), (20000, 256, 2)])
def test_elementwise_glu_with_the_fragments_gate(cp, rng, gate, M, H, sets):
    stage = GATES[gate]()
    tree = _params(stage, H, sets, rng)
    pv64 = rng.normal(0, 2.0, (M, sets * 2 * H)).astype(np.float32).astype(np.float64)
    gates = np.concatenate([pv64[:, 2 * H * d : 2 * H * d + H] for d in range(sets)], axis=1)
    gates = _off_kinks(stage, tree, gates, sets, H, rng)
    for d in range(sets):
        pv64[:, 2 * H * d : 2 * H * d + H] = gates[:, H * d : H * (d + 1)]
    dh64 = rng.normal(0, 1.0, (M, sets * H)).astype(np.float32).astype(np.float64)
    fwd, twin, _ = _launches(cp, stage, tree, sets, False)
    W = H + 4
    h = nan_like(cp, (M, sets * W))
    K.gate_glu_forward(to_dev(cp, pv64), fwd, width=W, blocks=sets, h=h)
    assert_close("h", h, R.gate_glu_forward(pv64, twin, W, sets), TOL)
    dev, twin, grads = _launches(cp, stage, tree, sets, True)
    ref_dpv, ref_grads = R.gate_glu_backward(dh64, pv64, twin, sets)
    pv = to_dev(cp, pv64)
    K.gate_glu_backward(to_dev(cp, dh64), pv, dev, blocks=sets, dpv=pv)  # in place, as the update runs it
    assert_close("dpv", pv, ref_dpv, TOL)
    for k, v in ref_grads.items():
        assert_close(k, grads[k], v, TOL_GRAD)


# ---------------------------------------------------------------------------------------- the update
def _gate_plugins(gate):
    from foxhunt_core.plugins import LoadedPlugin, PluginSet, discover

    if gate == "tanh_gate":
        from hook_plugins import TanhGatePlugin

        return PluginSet([LoadedPlugin("tanh_gate", 5, TanhGatePlugin())])
    return discover().plugin_set(["kan_gate"])


def _settings():
    from foxhunt_core.config import NetSettings, RunSettings, TrainSettings

    return RunSettings(net=NetSettings(shared_h1=64, shared_h2=64, adv_h=128), train=TrainSettings(lr=1e-3, tf32=True))


@pytest.mark.parametrize("gate", GATES)
def test_update_with_the_gate_in_the_glu_kernels_matches_the_cpu_update(cp, gate):
    """The update with the gate's fragment in glu_gemm and glu_backward_gemm (TF32, GLUs 128 wide,
    512 rows, every fused kernel taken) against the NumPy float32 update, at the tolerances of the
    sigmoid's (tests/gpu/test_update_gpu.py: the loss to 2e-3, all gradients together to 2e-2, each
    parameter's to 1e-1); the kernels ran with the gate."""
    from test_update_gpu import _batch, _names, _record, _to, assert_tf32_update_close

    from foxhunt_core.agent import Agent
    from foxhunt_core.gpu import cublas

    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 30))
    print(f"seed {seed}")
    cpu = Agent(_settings(), _gate_plugins(gate), np, np.random.default_rng(seed))
    gpu = Agent(_settings(), _gate_plugins(gate), cp, np.random.default_rng(seed), plan_overrides=dict(fill_sms=1))
    for o, s in cpu.online.items():
        for k, v in s.items():
            cpu.target[o][k][...] = v + rng.normal(0.0, 0.05, v.shape).astype(v.dtype)
            gpu.online[o][k][...] = cp.asarray(v)
            gpu.target[o][k][...] = cp.asarray(cpu.target[o][k])
    plan = gpu.plan
    assert plan.gate_fast and plan.glu_gemm and plan.glu_backward_at(512, 1), plan.glu_gemm.why
    calls = _record(gpu, ("glu_gemm", "glu_backward_gemm"))
    batch = _batch(rng, 512)
    cublas.set_tf32(True)
    try:
        g_gpu, s_gpu, _, _ = gpu.loss_and_grads(_to(cp, {"b": batch})["b"], 0.01)
    finally:
        cublas.set_tf32(False)
    assert _names(calls) == ["glu_gemm"] * 4 + ["glu_backward_gemm"] * 2, calls
    assert all(kw.get("gate") is not None and kw["gate"].stage is gpu.net.gate for _, kw in calls)
    g_cpu, s_cpu, _, _ = cpu.loss_and_grads(batch, 0.01)
    assert_tf32_update_close(g_gpu, s_gpu, g_cpu, s_cpu, owners=(gate,))


@pytest.mark.parametrize("gate", GATES)
def test_graph_replay_with_the_gate_in_the_glu_kernels_equals_eager_updates(cp, gate):
    from test_update_gpu import _replay_against_eager

    from foxhunt_core.agent import Agent
    from foxhunt_core.gpu import cublas
    from foxhunt_core.graphs import GraphedUpdate

    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 30))
    print(f"seed {seed}")
    eager = Agent(_settings(), _gate_plugins(gate), cp, np.random.default_rng(seed))
    graphed = Agent(_settings(), _gate_plugins(gate), cp, np.random.default_rng(seed))
    cublas.set_tf32(True)
    try:
        g = GraphedUpdate(graphed, 4096)
        assert graphed.plan.but(batch=4096).glu_gemm
        _replay_against_eager(cp, rng, eager, graphed, g, 4096, 3)
    finally:
        cublas.set_tf32(False)
