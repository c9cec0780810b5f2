"""The fused GPU arrangement of the network (``foxhunt_core.net.fused``), checked on the CPU.

``FusedNetwork`` runs on CuPy with the core's kernels and cuBLAS. Here the same code runs with
NumPy standing in for CuPy and the kernels' NumPy twins (``foxhunt_core.gpu.reference``) standing
in for the kernel wrappers, in float64, handed to it as its ``xp``, ``kernels``, ``blas`` and
``streams``; its execution plan is built with the twins' limits (they take any size) and with
thresholds and fill rules set so that every arrangement runs at these few rows. That checks the
arrangement itself on every CI run — the biases in the last rows of the weight blocks met by the
inputs' ones columns, the direction Q in the augmented z, the GLU's gate and value weights joined
into one block (one GEMM), a branch's extra input columns in its own augmented input, the
zero-padded head blocks, the advantage GEMMs writing into one buffer, several forwards run as one
(stacked parameter trees as strided-batched GEMMs), the dueling backward in two passes, gradients
written into flat slots (with and without the padded and joined storage) — against the reference
network. The kernels
themselves are checked against the same twins on the GPU (``tests/gpu``). The stand-ins: ``fused_twins.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from fused_twins import fused_network, twin_blas, twin_kernels

from foxhunt_core.config import NetSettings
from foxhunt_core.gpu import reference as R
from foxhunt_core.gpu.flat import FlatTree
from foxhunt_core.net import BranchingC51, fused
from foxhunt_core.net import layers as L
from foxhunt_core.net.fused import heads_fit
from foxhunt_core.net.fused import layout as Lay
from hook_plugins import PlainTanhGateStage, TanhGateStage


class WideColumns:
    """Two extra columns for the magnitude and urgency branches (the magnitude branch then has
    its direction-Q columns and these)."""

    name = "wide_columns"
    branches = (1, 3)
    width = 2

    def init_params(self, rng):
        return {"w": rng.normal(size=(2,))}

    def forward(self, xp, params, obs):
        x = obs[:, :2]
        return x * params["w"], x

    def backward(self, xp, params, cache, dcols):
        return {"w": (dcols * cache).sum(axis=0)}


class DirectionColumns(WideColumns):
    """Two extra columns for the direction and urgency branches: the direction branch's input is
    then not z, and the value head keeps a block of its own."""

    name = "direction_columns"
    branches = (0, 3)


class ObsColumns:
    """Observation columns 3, 4 and 1 (two runs) for the magnitude and urgency branches, declared
    as such (``observation_columns``): the fast path copies them into z."""

    name = "obs_columns"
    branches = (1, 3)
    width = 3
    observation_columns = (3, 4, 1)
    zero_init_rows = False  # (rows drawn at random: the columns' paths are exercised at once)

    def init_params(self, rng):
        return {}

    def forward(self, xp, params, obs):
        return obs[:, [3, 4, 1]], None

    def backward(self, xp, params, cache, dcols):
        return {}


class ObsColumnsOrder(ObsColumns):
    """One observation column for the order branch (a second stage: z holds each branch's columns
    after the previous branch's)."""

    name = "obs_order"
    branches = (2,)
    width = 1
    observation_columns = (0,)

    def forward(self, xp, params, obs):
        return obs[:, :1], None


class ObsColumnsDirection(ObsColumns):
    """Observation columns for the direction branch too (its GLU then reads past z's first H2
    columns)."""

    name = "obs_direction"
    branches = (0, 2)


@pytest.fixture(params=[False, True], ids=["cublas-then-glu", "glu-gemm"])
def numpy_fused(request):
    """A maker of fused networks over the twins (:func:`fused_network`), TF32 off and on."""
    return lambda net, **kw: fused_network(net, request.param, **kw)


def _net(stages: bool | str) -> BranchingC51:
    """The core network; with ``stages`` a gate plugin and branch-input columns, or only one of
    them (``"gate"``: the joint weight blocks with the plugin's gate; ``"columns"``: per-branch
    blocks with the sigmoid gate; ``"direction-columns"``: columns on the direction branch too,
    so the value head is not joined to its GLU)."""
    s = NetSettings(shared_h1=24, shared_h2=16, adv_h=12, num_atoms=11)
    gate = TanhGateStage() if stages in (True, "gate") else None
    columns = [WideColumns()] if stages in (True, "columns") else []
    columns += [DirectionColumns()] if stages == "direction-columns" else []
    columns += [ObsColumns(), ObsColumnsOrder()] if stages in ("obs-columns", "gate+obs-columns") else []
    columns += [ObsColumnsDirection()] if stages == "obs-direction-columns" else []
    columns += [ObsColumns(), WideColumns()] if stages == "obs+computed-columns" else []
    if stages == "gate+obs-columns":
        gate = TanhGateStage()
    return BranchingC51(s, gate=gate, branch_inputs=columns)


def _flat_params(net: BranchingC51, rng, padded: bool = True) -> dict:
    tree = net.init_params(rng, dtype=np.float64)
    for sub in tree.values():  # non-zero biases, so that their paths are exercised
        for k, v in sub.items():
            if ".b" in k or k.endswith("slope"):
                v[...] = rng.normal(0.0, 0.3, v.shape)
    storage = {"core": Lay.storage_shapes(net)} if padded else None
    return FlatTree.from_tree(tree, dtype=np.float64, storage=storage)


def test_storage_spec_pads_and_joins_the_weights():
    from foxhunt_core.gpu.flat import Shared

    # 11 atoms, branches of 3: 11 -> 12 and 33 -> 36 columns. The augmented z is 16 features,
    # 3 direction Q, the ones column -> 20 wide; a GLU's augmented output 12 + 1 -> 16.
    net = _net(True)
    spec = Lay.storage_shapes(net)
    assert Lay.z_width(net) == 20 and Lay.h_width(net) == 16 and Lay.x_width(net) == 52
    # The value head (11 -> 16 columns) in front of the direction branch's GLU, whose input is z too.
    assert Lay.value_joined(net) and Lay.value_width(net) == 16 and Lay.pv_lead(net) == 16
    assert spec["value.w"] == (20, 16 + 24) and spec["value.b"] == Shared("value.w", 0, 19)
    assert spec["trunk.w1"] == (52, 24) and spec["trunk.b1"] == Shared("trunk.w1", 0, 51)  # 50 features + 1
    assert all(spec[f"branch{d}.w_out"] == (16, 36) for d in range(4))
    assert spec["branch2.b_out"] == Shared("branch2.w_out", 0, 15)
    # Each GLU's gate and value weights side by side (adv_h 12 -> 24 columns), biases in the last row.
    assert spec["branch0.w_gate"] == Shared("value.w", 16) and spec["branch0.w_val"] == Shared("value.w", 28)
    assert spec["branch0.b_val"] == Shared("value.w", 28, 19)
    assert spec["branch1.w_gate"] == (24, 24)  # 16 + 3 (direction Q) + 2 (the wide columns) + 1 -> 24
    assert spec["branch3.w_gate"] == (20, 24)  # 16 + 2 + 1 -> 20
    assert spec["branch2.b_val"] == Shared("branch2.w_gate", 12, 19)
    # A flat buffer with this spec hands the joint blocks themselves to the GEMMs (no copies).
    flat = FlatTree.from_tree(net.init_params(np.random.default_rng(0), dtype=np.float64), storage={"core": spec})
    core = flat.tree["core"]
    w = Lay.block_of(core, net, "branch1.w_gate", np)
    assert w is flat.storage["core"]["branch1.w_gate"] and w is flat.storage["core"]["branch1.b_val"]
    assert np.array_equal(w[:19, 12:], core["branch1.w_val"]) and np.array_equal(w[23, 12:], core["branch1.b_val"])
    assert np.array_equal(w[19:21, 12:], core["branch1.w_val_in"])  # the rows reading the wide columns
    assert spec["branch1.w_val_in"] == Shared("branch1.w_gate", 12, 19)
    assert not w[21:23].any()
    # Plain parameters: the same block, assembled.
    plain = {k: np.array(v) for k, v in core.items()}
    np.testing.assert_array_equal(Lay.block_of(plain, net, "branch1.w_gate", np), w)
    # Without branch-input columns every branch's GLU weights share one block, and every
    # branch's advantage weights another: one GEMM serves several branches.
    net = _net(False)
    spec = Lay.storage_shapes(net)
    assert Lay.joint(net) and not Lay.joint(_net(True))
    assert spec["value.w"] == (20, 16 + 4 * 24) and spec["branch2.w_val"] == Shared("value.w", 16 + 60)
    assert spec["branch3.b_gate"] == Shared("value.w", 16 + 72, 19)
    assert spec["branch0.w_out"] == (16, 4 * 36) and spec["branch1.w_out"] == Shared("branch0.w_out", 36)
    assert spec["branch1.b_out"] == Shared("branch0.w_out", 36, 15)
    assert spec["branch1.w_gate"] == Shared("value.w", 16 + 24)
    # With extra columns on the direction branch its input is not z: the value head stands alone.
    dnet = _net("direction-columns")
    spec = Lay.storage_shapes(dnet)
    assert not Lay.value_joined(dnet) and Lay.pv_lead(dnet) == 0 and spec["value.w"] == (20, 12)
    assert spec["branch0.w_gate"] == (20, 24) and spec["branch0.w_val"] == Shared("branch0.w_gate", 12)
    assert Lay.branch_groups(net) == [(0,), (1, 2, 3)] and Lay.branch_groups(_net(True)) == [(0,), (1,), (2,), (3,)]


def _assert_padding_zero(flat):
    """Every element of a storage block outside the tensors that live in it is zero."""
    blocks: dict[int, tuple] = {}
    for name, blk in flat.storage["core"].items():
        key = (blk.__array_interface__["data"][0], blk.shape)  # the block, shared or not
        covered = blocks.setdefault(key, (blk, np.zeros(blk.shape, bool)))[1]
        slot = flat.slots["core"][name]
        if slot.row is not None and len(slot.shape) == 2:  # a matrix from a row down (w_gate_in)
            region = (slice(slot.row, slot.row + slot.shape[0]), slice(slot.col, slot.col + slot.shape[1]))
        elif slot.row is not None:
            region = (slot.row, slice(slot.col, slot.col + slot.shape[0]))
        elif blk.ndim == 1:
            region = (slice(slot.col, slot.col + slot.shape[0]),)
        else:
            region = (slice(0, slot.shape[0]), slice(slot.col, slot.col + slot.shape[1]))
        covered[region] = True
    for blk, covered in blocks.values():
        assert not blk[~covered].any(), "padding written"
    assert len(blocks) < len(flat.storage["core"])  # some blocks hold two tensors


@pytest.mark.parametrize("fill_sms", [1, 2], ids=["every-kernel-fills", "one-tile-too-few"])
@pytest.mark.parametrize("padded", [True, False], ids=["padded-storage", "plain-storage"])
@pytest.mark.parametrize("stages", [False, True, "gate", "columns", "direction-columns", "obs-columns",
                                    "gate+obs-columns", "obs-direction-columns", "obs+computed-columns"],
                         ids=["core", "gate+columns", "gate", "columns", "direction-columns", "obs-columns",
                              "gate+obs-columns", "obs-direction-columns", "obs+computed-columns"])
def test_fused_forward_and_backward_match_the_reference(numpy_fused, stages, padded, fill_sms):
    net = _net(stages)
    _check_against_the_reference(numpy_fused(net, fill_sms=fill_sms), net, padded)


@pytest.mark.parametrize("fill_sms", [1, 2], ids=["every-kernel-fills", "one-tile-too-few"])
def test_a_gate_with_a_fragment_runs_inside_the_glu_kernels(numpy_fused, fill_sms):
    """The tests' tanh gate ships a CUDA fragment: the plan keeps every fused arrangement, the GLU
    kernels (glu_gemm and glu_backward_gemm under TF32, else gate_glu_forward and
    gate_glu_backward) take the gate with its parameters, its gradients go straight into the
    gradient buffer's slots, and forward and backward are the reference's."""
    net = _net("gate")
    fn = numpy_fused(net, fill_sms=fill_sms)
    plan = fn.plan
    assert plan.gate_fast and not plan.gate_built_in and plan.pairs
    assert not plan.stacks(16) and "parameters of its own" in plan.stacks(16).why
    assert [s.path for s in plan.stages if s.hook == "gate_activation"] == ["fast"]
    assert bool(plan.glu_gemm) == bool(plan.glu_backward_gemm) == plan.tf32
    fn.K.launches.clear()
    _check_against_the_reference(fn, net, True)
    kernels = {k for k, gate in fn.K.launches if gate is not None and gate.stage is net.gate}
    if plan.tf32:
        assert "glu_gemm" in kernels and "glu_backward_gemm" in kernels
        assert ("gate_glu_backward" in kernels) == (fill_sms == 2)  # the single direction branch: one tile
    else:
        assert kernels == {"gate_glu_forward", "gate_glu_backward"}
    launched = [gate for _, gate in fn.K.launches]
    assert all(g is not None and g.stage is net.gate for g in launched) and launched


def test_a_gate_without_a_fragment_takes_the_slow_path(numpy_fused):
    """The same gate without its fragment: its forward and backward per branch, no stacking, no
    GLU kernels; the results are the reference's all the same."""
    s = NetSettings(shared_h1=24, shared_h2=16, adv_h=12, num_atoms=11)
    net = BranchingC51(s, gate=PlainTanhGateStage())
    fn = numpy_fused(net)
    assert not fn.plan.gate_fast and not fn.plan.glu_gemm and not fn.plan.pairs
    assert "no CUDA fragment" in fn.plan.glu_gemm.why
    fn.K.launches.clear()
    _check_against_the_reference(fn, net, True)
    assert not fn.K.launches


def test_a_direction_branch_wider_than_glu_backward_gemms_dq(numpy_fused):
    """Five direction actions: z's direction-Q columns are more than glu_backward_gemm's dq takes
    (four), so their gradient comes from the separate product."""
    s = NetSettings(shared_h1=24, shared_h2=16, adv_h=12, num_atoms=11, branch_sizes=(5, 3, 3, 3))
    net = BranchingC51(s)
    fn = numpy_fused(net)
    assert not fn.plan.glu_backward_dq and "5 direction actions > 4" in fn.plan.glu_backward_dq.why
    _check_against_the_reference(fn, net, True)


@pytest.mark.parametrize("one_gemm", [True, False], ids=["one-gemm", "one-per-group"])
def test_z_gradient_in_one_gemm_or_one_per_group(numpy_fused, one_gemm):
    """With every GLU in the value head's block, z's gradient is one GEMM over the whole
    ``[dv | dpv]`` row (K = lead + branches x 2 adv_h; the plan's joint_dz), else one GEMM per GLU
    group; the gradients are the reference's either way."""
    net = _net(False)
    ks = []
    blas = twin_blas()
    real = blas.matmul

    def recording(a, b, out=None, **kw):
        ks.append((a.shape[1], b.shape[1]))
        return real(a, b, out=out, **kw)

    blas.matmul = recording
    fn = numpy_fused(net, blas=blas, joint_dz=one_gemm)
    assert bool(fn.plan.joint_dz) == one_gemm
    _check_against_the_reference(fn, net, True)
    H, H2, D = net.settings.adv_h, net.settings.shared_h2, len(net.sizes)
    lead = Lay.pv_lead(net)
    z_grads = [k for k, n in ks if n == H2 and k in (lead + 2 * H * D, lead + 2 * H, 2 * H * (D - 1))]
    assert z_grads == ([lead + 2 * H * D] if one_gemm else [2 * H * (D - 1), lead + 2 * H])


def _check_against_the_reference(fn, net, padded):
    """The fused forward and backward of ``net`` (by the fused network ``fn``) against its
    reference ones (float64)."""
    rng = np.random.default_rng(7)
    flat = _flat_params(net, rng, padded)
    params = flat.tree
    obs = rng.normal(size=(9, net.settings.state_dim))
    ref = net.forward(params, obs, keep_cache=True)
    got = fn.forward(params, obs, keep_cache=True)
    for name in ("log_probs", "probs"):
        np.testing.assert_allclose(getattr(got, name), getattr(ref, name), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got.q, (ref.probs * net.support64).sum(-1), rtol=1e-10, atol=1e-12)

    dlogits = rng.normal(size=ref.log_probs.shape)
    g_ref = net.backward(params, ref, dlogits)
    slots = flat.zeros_like()
    slots.buffer[...] = np.nan  # a gradient the backward does not write would stay NaN
    g_got = fn.backward(params, got, dlogits, grads_into=slots.tree)
    assert set(g_got) == set(g_ref)
    for owner, sub in g_ref.items():
        assert set(g_got[owner]) == set(sub)
        for k, v in sub.items():
            np.testing.assert_allclose(g_got[owner][k], v, rtol=1e-9, atol=1e-12, err_msg=f"{owner}/{k}")
    for k, v in g_got["core"].items():  # the core's gradients live in the given slots
        assert np.shares_memory(v, slots.buffer), k
    if padded:  # the padding of every padded gradient block is zero
        _assert_padding_zero(slots)
    assert set(slots.storage["core"]) == (set(Lay.storage_shapes(net)) if padded else set())


def test_forward_without_cache_writes_only_what_is_asked(numpy_fused):
    rng = np.random.default_rng(3)
    net = _net(True)
    fn = numpy_fused(net)
    params = _flat_params(net, rng).tree
    obs = rng.normal(size=(5, net.settings.state_dim))
    ref = net.forward(params, obs)
    got = fn.forward(params, obs, keep_cache=False, outputs=("q",))
    assert got.probs is None and got.log_probs is None and got.var is None and got.cache is None
    np.testing.assert_allclose(got.q, (ref.probs * net.support64).sum(-1), rtol=1e-10)
    got = fn.forward(params, obs, keep_cache=False, outputs=("probs",))
    np.testing.assert_allclose(got.probs, ref.probs, rtol=1e-10, atol=1e-14)
    assert np.allclose(L.softmax(ref.logits), ref.probs)


def test_forward_carries_the_next_observations_along(numpy_fused):
    """The update's online forward on s with the rows of s' carried along: E[Q] of s' as its own
    forward gives it, and the cache and gradients of s alone (as a forward on s alone)."""
    rng = np.random.default_rng(11)
    net = _net(False)
    fn = numpy_fused(net)
    flat = _flat_params(net, rng)
    params = flat.tree
    obs, nxt = rng.normal(size=(7, net.settings.state_dim)), rng.normal(size=(5, net.settings.state_dim))
    got = fn.forward(params, obs, keep_cache=True, next_obs=nxt)
    ref, ref_next = net.forward(params, obs, keep_cache=True), net.forward(params, nxt)
    np.testing.assert_allclose(got.log_probs, ref.log_probs, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got.q_next, (ref_next.probs * net.support64).sum(-1), rtol=1e-10, atol=1e-12)
    assert got.q.shape == (7, 12) and got.cache["z"].shape[0] == 7
    dlogits = rng.normal(size=ref.log_probs.shape)
    g_ref = net.backward(params, ref, dlogits)
    g_got = fn.backward(params, got, dlogits, grads_into=flat.zeros_like().tree)
    for k, v in g_ref["core"].items():
        np.testing.assert_allclose(g_got["core"][k], v, rtol=1e-9, atol=1e-12, err_msg=k)
    # Plugin stages keep caches of their own rows: no carrying along then.
    staged = _net(True)
    staged_fn = numpy_fused(staged)
    out = staged_fn.forward(_flat_params(staged, rng).tree, obs, keep_cache=True, next_obs=nxt)
    assert out.q_next is None and not staged_fn.plan.pairs and fn.plan.pairs


@pytest.mark.parametrize("fill_sms", [1, 2], ids=["every-kernel-fills", "one-tile-too-few"])
@pytest.mark.parametrize("large", [False, True], ids=["stacked", "past-the-row-threshold"])
@pytest.mark.parametrize("stages", [False, "obs-columns"], ids=["core", "obs-columns"])
def test_the_updates_three_forwards(numpy_fused, large, fill_sms, stages):
    """The update's three forwards — online on s (kept for backward), online on s' (E[Q] only),
    target on s' (probabilities only). Over parameter trees stacked in one allocation they run as
    strided-batched GEMMs; past the row threshold (set to zero here) the online forwards run as
    one and the target's apart, as the agent calls them then. Each gives what its own forward
    gives, and the backward of the first what the reference backward gives. A fused kernel takes a
    group of branches where its tiles cover ``fill_sms`` (a single branch's heads have one tile:
    with two, their dueling forward runs apart). Branch-input columns of the observation, in z,
    keep all of it."""
    rng = np.random.default_rng(5)
    net = _net(stages)
    tree = _flat_params(net, rng).tree
    other = _flat_params(net, rng).tree  # the target network: other values
    online, copy, target = FlatTree.stacked(3, {o: {k: v.shape for k, v in s.items()} for o, s in tree.items()},
                                            dtype=np.float64, storage={"core": Lay.storage_shapes(net)})
    for t, src in ((online, tree), (copy, tree), (target, other)):
        t.load(src)
    stacks = []
    blas, kernels = twin_blas(), twin_kernels()
    real = blas.matmul

    def counting(a, b, out=None, beta=0.0, bias=None, relu=False, stack=None, batch=None):
        stacks.append(stack)
        return real(a, b, out=out, beta=beta, bias=bias, relu=relu, stack=stack, batch=batch)

    blas.matmul = counting
    dueling_rows = []
    real_dueling = kernels.dueling_softmax_forward

    def dueling_counting(v, adv, z, offsets, **kw):
        dueling_rows.append((kw.get("branches"), v.shape[0]))
        return real_dueling(v, adv, z, offsets, **kw)

    kernels.dueling_softmax_forward = dueling_counting
    real_heads = kernels.heads_dueling

    def heads_counting(a, wt, v, z, offsets, **kw):  # (the heads' GEMM with the dueling forward in it)
        dueling_rows.append(("heads", kw["branches"], len(kw["segments"]) * kw["seg_rows"], kw["adv"] is not None))
        return real_heads(a, wt, v, z, offsets, **kw)

    kernels.heads_dueling = heads_counting
    glu_pv_rows = []  # per glu_gemm call: the rows whose pre-activations it keeps
    real_glu = kernels.glu_gemm

    def glu_counting(u, w, **kw):
        glu_pv_rows.append(None if kw.get("pv") is None else kw["pv"].shape[0])
        return real_glu(u, w, **kw)

    kernels.glu_gemm = glu_counting
    fn = numpy_fused(net, kernels=kernels, blas=blas, fill_sms=fill_sms, **({"stack_max_rows": 0} if large else {}))
    obs, nxt = rng.normal(size=(6, net.settings.state_dim)), rng.normal(size=(6, net.settings.state_dim))
    twin = online if large else copy
    got, got_next, got_target = fn.forward_segments(
        [(online.tree, obs, ("log_probs",)), (twin.tree, nxt, ("q",)), (target.tree, nxt, (fused.HEADS,))],
        keep_cache=True)
    if large and fn.plan.glu_gemm:
        # Each forward's two GLU groups in one kernel each; only the rows of s keep pv.
        assert sorted(glu_pv_rows, key=str) == [6, 6, None, None]
    else:
        assert not glu_pv_rows  # (stacked parameter trees: cuBLAS's strided-batched GEMMs)
    if large:
        assert all(s is None for s in stacks)
    else:
        assert (3, online.size) in stacks and all(s in (None, (3, online.size)) for s in stacks)
    ref = net.forward(online.tree, obs, keep_cache=True)
    np.testing.assert_allclose(got.log_probs, ref.log_probs, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got.probs, ref.probs, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(got_next.q, (net.forward(tree, nxt).probs * net.support64).sum(-1), rtol=1e-10)
    # The target forward's heads: the dueling aggregation over them is the target network's output;
    # only the direction branch's dueling kernel ran over its rows (the magnitude branch reads its Q).
    v_t, adv_t = got_target.heads
    N, offs = net.num_atoms, net.offsets
    np.testing.assert_allclose(R.dueling_softmax_forward(v_t[:, :N], R.adv_from_columns(adv_t, offs, N),
                                                         net.support64, offs)[1],
                               net.forward(other, nxt).probs, rtol=1e-10, atol=1e-14)
    assert got_next.probs is None and got_next.log_probs is None and got_target.log_probs is None
    assert got_target.probs is None and got_target.q is None and got.cache["z"].shape[0] == 6
    assert got_next.heads is None and got.heads is None
    if large and fn.plan.glu_gemm and fill_sms == 1:
        # The target's direction branch in its heads' kernel (its heads written: the loss reads
        # them; its magnitude branches' heads alone, no dueling forward wanted), then the online
        # pair's direction branch and magnitude branches in the heads' kernel (no heads written).
        assert dueling_rows == [("heads", (0, 1), 6, True), ("heads", (0, 1), 12, False), ("heads", (1, 4), 12, False)]
    elif large and fn.plan.glu_gemm:
        # A single branch's heads have too few tiles: the direction branch's dueling forward apart,
        # the online pair's magnitude branches' in their heads' kernel.
        assert dueling_rows == [((0, 1), 6), ((0, 1), 12), ("heads", (1, 4), 12, False)]
    elif large:  # the target alone (queued first: on the side stream, beside the online pair), the online pair
        assert dueling_rows == [((0, 1), 6), ((0, 1), 12), ((1, 4), 12)]
    else:
        assert dueling_rows == [((0, 1), 18), ((1, 4), 12)]
    dlogits = rng.normal(size=ref.log_probs.shape)
    g_ref = net.backward(online.tree, ref, dlogits)
    slots = online.zeros_like()
    g_got = fn.backward(online.tree, got, dlogits, grads_into=slots.tree)
    for k, v in g_ref["core"].items():
        np.testing.assert_allclose(g_got["core"][k], v, rtol=1e-9, atol=1e-12, err_msg=k)
    _assert_padding_zero(slots)
    # Trees that are not stacked (or unequal row counts) fall back to one forward per tree.
    stacks.clear()
    outs = fn.forward_segments([(tree, obs, ("q",)), (tree, nxt[:4], ("q",)), (other, nxt, ("probs",))],
                               keep_cache=False)
    assert all(s is None for s in stacks) and [o.q.shape[0] for o in outs] == [6, 4, 6]
    np.testing.assert_allclose(outs[2].probs, net.forward(other, nxt).probs, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(outs[1].q, (net.forward(tree, nxt[:4]).probs * net.support64).sum(-1), rtol=1e-10)


@pytest.mark.parametrize(("offsets", "atoms", "fused_ok"), [
    ((0, 3, 6, 9, 12), 51, True),  # the default: 7 atoms per lane x 3 actions
    ((0, 12, 24), 11, True),  # 2 x 12 = 24 values per lane, the most
    ((0, 13), 12, False),  # 156 columns fit the tile, 2 x 13 = 26 values per lane do not
    ((0, 4, 12), 51, False),  # a branch of 8 actions: 408 columns, wider than the tile
])
def test_heads_carry_the_dueling_forward_only_where_the_kernel_takes_the_layout(offsets, atoms, fused_ok):
    """The plan's heads_dueling: the heads' tile (160 columns) and the dueling warps' registers
    (heads_fit, the twin of the kernel's DG_FITS) both decide; otherwise the dueling forward runs
    apart."""
    assert heads_fit(offsets, atoms).on is fused_ok


def test_observation_columns_ride_in_z_and_keep_the_fast_path(numpy_fused):
    """Stages that declare ``observation_columns``: their columns in the augmented z behind the
    direction Q's (each branch's after the previous branch's), every branch reading z, the joint
    blocks with each branch's w_gate_in / w_val_in where its columns are, and the fast path; one
    stage without the declaration sends every stage back to inputs of their own."""
    net = _net("obs-columns")
    H2, n_dir = 16, net.sizes[0]
    assert Lay.columns_in_z(net) and Lay.joint(net) and Lay.value_joined(net)
    assert [Lay.z_extra_col(net, d) for d in (1, 2, 3)] == [H2 + n_dir, H2 + n_dir + 3, H2 + n_dir + 4]
    assert Lay.z_width(net) == 28  # z 16, q_dir 3, magnitude's 3, order's 1, urgency's 3, ones 1: 27 -> 28
    spec = Lay.storage_shapes(net)
    assert spec["branch1.w_gate_in"].row == H2 + n_dir and spec["branch3.w_val_in"].row == H2 + n_dir + 4
    fn = numpy_fused(net)
    assert fn.plan.pairs and [s.path for s in fn.plan.stages if s.hook == "branch_inputs"] == ["fast", "fast"]
    assert Lay.branch_groups(net) == [(0,), (1, 2, 3)]
    mixed = _net("obs+computed-columns")
    plan = numpy_fused(mixed).plan
    assert not Lay.columns_in_z(mixed) and not plan.pairs
    assert [s.path for s in plan.stages if s.hook == "branch_inputs"] == ["slow", "slow"]
    assert "another branch-input stage computes its columns" in plan.stages[-2].why
