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
themselves are checked against the same twins on the GPU (``tests/gpu``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import types

import numpy as np
import pytest

from foxhunt_core.config import NetSettings
from foxhunt_core.gpu import gate as K
from foxhunt_core.gpu import reference as R
from foxhunt_core.gpu.flat import FlatTree
from foxhunt_core.gpu.launch import head_columns
from foxhunt_core.net import BranchingC51, fused
from foxhunt_core.net import layers as L
from foxhunt_core.net.fused import KERNEL_LIMITS, Device, ExecutionPlan, FusedNetwork, heads_fit
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


def _numpy_cupy() -> types.ModuleType:
    """NumPy under CuPy's name, with float32 meaning float64 (the check runs in float64)."""
    shim = types.ModuleType("cupy")
    shim.__getattr__ = lambda name: getattr(np, name)
    shim.float32 = np.float64
    shim.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0))
    return shim


def _put(out, value):
    if out is None:
        return value
    out[...] = value
    return out


def _kernels() -> types.SimpleNamespace:
    """The kernel wrappers' signatures over their NumPy twins, honouring ``out`` arguments,
    branch subsets and skipped outputs as the kernels do (``glu_backward_gemm`` here two branches a
    launch at most, so that a group of three takes two launches)."""

    def transpose(w, *, out=None):
        return _put(out, w.T.copy())

    rounded_out: list = []  # (array, columns) written rounded to TF32 (vsn_forward's z, glu_gemm's h)
    launches: list = []  # (kernel, gate launch) of the GLU kernels, in order

    def written_rounded(x, rounded):
        """Columns a kernel takes as they are must come rounded by their writer: its first
        ``rounded`` columns within what a writer rounded (z: its own columns, not the
        direction-Q ones the dueling kernel writes behind them)."""
        return rounded == 0 or any(np.shares_memory(x, y) and rounded <= cols for y, cols in rounded_out)

    def glu_gemm(u, w, *, bias=None, width=None, blocks=1, h=None, pv=None, wt=None, rounded=0, tf32_h=False,
                 config=None, gate=None):
        assert wt is None or np.array_equal(wt, w.T)
        assert written_rounded(u, rounded), rounded
        launches.append(("glu_gemm", gate))
        rpv, rh = R.glu_gemm(u, w, bias, width, blocks, gate)
        if pv is not None:  # only the rows asked for
            pv[...] = rpv[: pv.shape[0]]
        h = _put(h, rh)
        if tf32_h:  # (float64 here: TF32 modelled as exact, as in matmul); each branch's h as wide
            rounded_out.append((h, rh.shape[1] // blocks))
        return h

    def linear_gemm(a, wt, out=None, *, bias=None, relu=False, tf32_out=False, rounded=0, config=None):
        assert all(written_rounded(x, rounded) for x in a), rounded
        refs = R.linear_gemm(a, [t.T for t in wt], bias, relu)
        return [_put(None if out is None else o, r) for o, r in zip(out or [None] * len(a), refs)]

    def linear_gemm_relu_backward(a, wt, y, *, addend=None, out=None, rounded=0, tf32_out=False, config=None):
        assert written_rounded(a, rounded), rounded
        r = _put(out, R.linear_gemm_relu_backward(a, wt.T, y, addend))
        if tf32_out:
            rounded_out.append((r, r.shape[1]))
        return r

    def round_tf32(x, *, out=None):  # (float64 here: TF32 modelled as exact, as in matmul)
        return _put(out, x.copy())

    def glu_backward_gemm(dadv, wo, pv, *, dq=None, wq=None, dq_set=0, config=None, ctas=None, gate=None):
        launches.append(("glu_backward_gemm", gate))
        if gate is not None and not K.built_in(gate.fragment):
            pv[...], grads = R.glu_backward_gemm(dadv, wo, pv, gate)
            _put_grads(gate, grads)
        else:
            pv[...] = R.glu_backward_gemm(dadv, wo, pv)
        if dq is not None:
            assert wq.shape[0] <= 4 and wo[0].shape[0] <= 256 and 0 <= dq_set < len(dadv)
            dq[...] = R.glu_backward_dq(pv, wq, dq_set, wo[0].shape[0])
        return pv

    def wgrad_gemm(xt, y, *, out=None, zero_rows=(0, 0), keep_cols=(0, 0), config=None):
        return _put(out, R.wgrad_gemm(xt.T, y, zero_rows, keep_cols))

    def wgrad_gemm_sets(x, y, out, *, config=None):
        return [_put(o, R.wgrad_gemm(a, b)) for a, b, o in zip(x, y, out)]

    def vsn_forward(h2, mpre, *, width=None, keep_rows=None, m=None, z=None, tf32=False):
        rm, rz = R.vsn_forward(h2, mpre, width)  # (float64 here: TF32 modelled as exact, as in matmul)
        keep = h2.shape[0] if keep_rows is None else keep_rows
        z = _put(z, rz)
        if tf32:
            rounded_out.append((z, h2.shape[1]))
        return (_put(m, rm[:keep]) if keep else None), z

    def glu_forward(pv, *, width=None, blocks=1, h=None):
        return _put(h, R.glu_forward(pv, width, blocks)[1])

    def gate_glu_forward(pv, gate, *, width=None, blocks=1, h=None):
        launches.append(("gate_glu_forward", gate))
        return _put(h, R.gate_glu_forward(pv, gate, width, blocks))

    def gate_glu_backward(dh, pv, gate, *, blocks=1, dpv=None):
        launches.append(("gate_glu_backward", gate))
        r, grads = R.gate_glu_backward(dh, pv, gate, blocks)
        _put_grads(gate, grads)
        return _put(dpv, r)

    def glu_backward(dh, pv, *, blocks=1, dpv=None):
        return _put(dpv, R.glu_backward(dh, pv, blocks))

    def pack_rows(sources, width, *, out=None):
        return _put(out, R.pack_rows(sources, width))

    def relu_backward(dy, y, *, addend=None, out=None):
        return _put(out, R.relu_backward(dy, y, addend))

    def vsn_backward(dz, h2, m, *, dh2=None, dmpre=None, tf32=False):
        a, b = R.vsn_backward(dz, h2, m)
        dh2, dmpre = _put(dh2, a), _put(dmpre, b)
        if tf32:
            rounded_out.append((dmpre, dmpre.shape[1]))
        return dh2, dmpre

    def dueling_softmax_forward(v, adv, z, offsets, *, branches=None, v_bias=None, adv_bias=None,
                                want=("log_probs", "probs", "q", "var"), segments=None, log_probs=None,
                                probs=None, q=None, var=None, zq=None, zq_scale=1.0):
        N = z.shape[0]
        if adv.ndim == 2:  # the padded layout: the padding is not read
            adv, v = R.adv_from_columns(adv, offsets, N), v[:, :N]
        ref = R.dueling_softmax_forward(v, adv, z, offsets, v_bias, adv_bias)
        d0, d1 = branches or (0, len(offsets) - 1)
        a0, a1 = offsets[d0], offsets[d1]
        segs = [want] if segments is None else segments
        rows = v.shape[0] // len(segs)
        for i, w in enumerate(segs):  # each segment writes only what it wants
            r = slice(i * rows, (i + 1) * rows)
            for name, out, full in zip(("log_probs", "probs", "q", "var"), (log_probs, probs, q, var), ref):
                if name in w or name == "q":
                    out[r, a0:a1] = full[r, a0:a1]
        if zq is not None and d0 == 0:
            zq[...] = ref[2][:, : offsets[1]] * zq_scale
        return log_probs, probs, q, var

    def heads_dueling(a, wt, v, z, offsets, *, branches, segments, seg_rows, bias=None, adv=None, log_probs=None,
                      probs=None, q=None, var=None, zq=None, zq_scale=1.0, rounded=0, straight=False, config=None):
        # The heads as linear_gemm computes them, then the dueling forward of the segments' rows
        # from them: the heads reach memory (adv) only when asked.
        heads = linear_gemm(a, wt, adv, bias=bias, rounded=rounded)
        rows = len(segments) * seg_rows
        cols = head_columns(offsets, z.shape[0], 4)
        full = np.full((rows, cols[-1]), np.nan)  # (the other branches' blocks: never read)
        for d, x in zip(range(*branches), heads):
            full[:, cols[d] : cols[d + 1]] = x[:rows]
        return dueling_softmax_forward(v[:rows], full, z, offsets, branches=branches, segments=segments,
                                       log_probs=log_probs, probs=probs, q=q, var=var, zq=zq, zq_scale=zq_scale)

    def dueling_backward(dlogits, z, offsets, *, branches=None, accumulate_dv=False, dq=None, dq_scale=1.0,
                         probs=None, q=None, dv=None, dadv=None, padded=False):
        if dq is not None:  # any view covering the branches' actions, read times dq_scale
            end = offsets[(branches or (0, len(offsets) - 1))[1]]
            full = np.zeros(dlogits.shape[:2])
            full[:, :end] = dq[:, :end] * dq_scale
            dq = full
        rdv, rdadv = R.dueling_backward(dlogits, offsets, dq, probs, q, z, branches)
        d0, d1 = branches or (0, len(offsets) - 1)
        full = np.full(dlogits.shape, np.nan)
        full[:, offsets[d0] : offsets[d1]] = rdadv
        if padded:  # the padding written as zeros, the branches not computed left as they were
            wide = R.columns_from_adv(full, offsets)
            cols = head_columns(offsets, dlogits.shape[2], 4)
            dadv = np.full(wide.shape, np.nan) if dadv is None else dadv
            dadv[:, cols[d0] : cols[d1]] = wide[:, cols[d0] : cols[d1]]
            rdv = np.concatenate([rdv, np.zeros((rdv.shape[0], -(-rdv.shape[1] // 4) * 4 - rdv.shape[1]))], axis=1)
        else:
            dadv = full if dadv is None else dadv
            dadv[:, offsets[d0] : offsets[d1]] = rdadv
        dv = _put(dv, dv + rdv if accumulate_dv else rdv)
        return dv, dadv

    return types.SimpleNamespace(**{f.__name__: f for f in (
        vsn_forward, glu_forward, glu_backward, relu_backward, vsn_backward, pack_rows,
        dueling_softmax_forward, dueling_backward, glu_gemm, transpose, linear_gemm,
        wgrad_gemm, wgrad_gemm_sets, round_tf32, glu_backward_gemm, heads_dueling,
        linear_gemm_relu_backward, gate_glu_forward, gate_glu_backward)}, GLU_BACKWARD_GEMM_SETS=2,
        branch_launch=K.branch_launch, built_in=K.built_in, launches=launches)


def _put_grads(gate, grads):
    """The gate's gradients of the launch's branches into its gradient tree, as the kernels write them."""
    for d in gate.branches:
        for name in gate.fragment.arrays:
            key = name.format(d=d)
            gate.grad_tree[key][...] = grads[key]


def _one_stream() -> types.SimpleNamespace:
    """No side stream: the work queued beside the main stream runs in line."""
    return types.SimpleNamespace(beside=contextlib.nullcontext, join=lambda: None)


def _blas() -> types.SimpleNamespace:
    def matmul(a, b, out=None, beta=0.0, bias=None, relu=False, stack=None, batch=None):
        if batch is not None and batch[0] > 1:  # product i: each operand i * its stride further on
            for i in range(batch[0]):
                ai, bi, oi = (_nth(x, i * st) for x, st in zip((a, b, out), batch[1:]))
                matmul(ai, bi, out=oi, beta=beta)
            return out
        if stack is not None and stack[1]:  # part i of a's rows times the tree i * stride after b
            count, stride = stack
            part = a.shape[0] // count
            r = np.concatenate([a[i * part:(i + 1) * part] @ _nth(b, i * stride)
                                + (0.0 if bias is None else _nth(bias, i * stride)) for i in range(count)])
            bias = None
        else:
            r = a @ b
        if out is not None and beta != 0.0:  # cuBLAS ignores C when beta = 0
            r = r + beta * out
        if bias is not None:
            r = r + bias
        if relu:
            r = L.relu(r)
        return _put(out, r)

    def ones_row(rows, dtype):
        return np.ones((1, rows))

    return types.SimpleNamespace(matmul=matmul, ones_row=ones_row)


def _nth(x, elements):
    """The same view as ``x``, ``elements`` further into its buffer."""
    return np.ndarray(x.shape, x.dtype, buffer=_base(x), offset=_offset(x) + elements * x.itemsize, strides=x.strides)


def _base(x):
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x


def _offset(x):
    return x.__array_interface__["data"][0] - _base(x).__array_interface__["data"][0]


# The twins take any size: GLUs of the test networks' width (12) are one tile, every batch one row
# tile, and any layer input suits wgrad_gemm; the dueling warps' and dq's limits stay the kernels'.
TWIN_LIMITS = dataclasses.replace(KERNEL_LIMITS, tile_rows=10**9, glu_cols=12, relu_cols=1, wgrad_min=0,
                                  wgrad_max=10**9)


def _fused(net: BranchingC51, glu_gemm_on: bool, kernels: types.SimpleNamespace | None = None,
           blas: types.SimpleNamespace | None = None, **knobs) -> FusedNetwork:
    """``net``'s fused network over the twins. With ``glu_gemm_on`` its plan is a Hopper GPU's
    under TF32 (every tensor-core arrangement where it applies), the heads' weight gradients and the
    trunk's ReLU backward on their kernels from any batch, and a fused kernel taken where it has two
    tiles at least: a single branch's GLU backward and heads (one tile) take the other path, so both
    run; otherwise TF32 is off (cuBLAS's GEMMs and the elementwise kernels). ``knobs`` override."""
    knobs = {"wgrad_heads_min_rows": 0, "relu_gemm_min_rows": 0, "fill_sms": 2, **knobs}
    plan = ExecutionPlan.build(net, Device("90", 132), glu_gemm_on, 16, limits=TWIN_LIMITS, **knobs)
    return FusedNetwork(net, plan, kernels=kernels or _kernels(), blas=blas or _blas(), streams=_one_stream(),
                        xp=_numpy_cupy())


@pytest.fixture(params=[False, True], ids=["cublas-then-glu", "glu-gemm"])
def numpy_fused(request):
    """A maker of fused networks over the twins (:func:`_fused`), TF32 off and on."""
    return lambda net, **kw: _fused(net, request.param, **kw)


def _net(stages: bool | str) -> BranchingC51:
    """The core network; with ``stages`` a gate plugin and branch-input columns, or only one of
    them (``"gate"``: the joint weight blocks with the plugin's gate; ``"columns"``: per-branch
    blocks with the sigmoid gate; ``"direction-columns"``: columns on the direction branch too,
    so the value head is not joined to its GLU)."""
    s = NetSettings(shared_h1=24, shared_h2=16, adv_h=12, num_atoms=11)
    gate = TanhGateStage() if stages in (True, "gate") else None
    columns = [WideColumns()] if stages in (True, "columns") else []
    columns += [DirectionColumns()] if stages == "direction-columns" else []
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
    assert np.array_equal(w[:21, 12:], core["branch1.w_val"]) and np.array_equal(w[23, 12:], core["branch1.b_val"])
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
        if slot.row is not None:
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
@pytest.mark.parametrize("stages", [False, True, "gate", "columns", "direction-columns"],
                         ids=["core", "gate+columns", "gate", "columns", "direction-columns"])
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
    blas = _blas()
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
def test_the_updates_three_forwards(numpy_fused, large, fill_sms):
    """The update's three forwards — online on s (kept for backward), online on s' (E[Q] only),
    target on s' (probabilities only). Over parameter trees stacked in one allocation they run as
    strided-batched GEMMs; past the row threshold (set to zero here) the online forwards run as
    one and the target's apart, as the agent calls them then. Each gives what its own forward
    gives, and the backward of the first what the reference backward gives. A fused kernel takes a
    group of branches where its tiles cover ``fill_sms`` (a single branch's heads have one tile:
    with two, their dueling forward runs apart)."""
    rng = np.random.default_rng(5)
    net = _net(False)
    tree = _flat_params(net, rng).tree
    other = _flat_params(net, rng).tree  # the target network: other values
    online, copy, target = FlatTree.stacked(3, {o: {k: v.shape for k, v in s.items()} for o, s in tree.items()},
                                            dtype=np.float64, storage={"core": Lay.storage_shapes(net)})
    for t, src in ((online, tree), (copy, tree), (target, other)):
        t.load(src)
    stacks = []
    blas, kernels = _blas(), _kernels()
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
