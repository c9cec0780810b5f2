"""NumPy stand-ins of what the fused GPU network runs on (``foxhunt_core.net.fused``): CuPy as
NumPy in float64, the kernel wrappers' signatures over their NumPy twins
(``foxhunt_core.gpu.reference``), cuBLAS's ``matmul``, one stream, and the execution plan with the
twins' limits. ``test_fused_arrangement.py`` runs the fused network's own code on them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types

import numpy as np

from foxhunt_core.gpu import gate as K
from foxhunt_core.gpu import reference as R
from foxhunt_core.gpu.launch import head_columns
from foxhunt_core.net import BranchingC51
from foxhunt_core.net import layers as L
from foxhunt_core.net.fused import KERNEL_LIMITS, Device, ExecutionPlan, FusedNetwork


def numpy_cupy() -> types.ModuleType:
    """NumPy under CuPy's name, with float32 meaning float64 (the check runs in float64)."""
    shim = types.ModuleType("cupy")
    shim.__getattr__ = lambda name: getattr(np, name)
    shim.float32 = np.float64
    shim.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0))
    return shim


def put(out, value):
    if out is None:
        return value
    out[...] = value
    return out


def twin_kernels() -> types.SimpleNamespace:
    """The kernel wrappers' signatures over their NumPy twins, honouring ``out`` arguments,
    branch subsets and skipped outputs as the kernels do (``glu_backward_gemm`` here two branches a
    launch at most, so that a group of three takes two launches)."""

    def transpose(w, *, out=None):
        return put(out, w.T.copy())

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
        h = put(h, rh)
        if tf32_h:  # (float64 here: TF32 modelled as exact, as in matmul); each branch's h as wide
            rounded_out.append((h, rh.shape[1] // blocks))
        return h

    def linear_gemm(a, wt, out=None, *, bias=None, relu=False, tf32_out=False, rounded=0, config=None):
        assert all(written_rounded(x, rounded) for x in a), rounded
        refs = R.linear_gemm(a, [t.T for t in wt], bias, relu)
        return [put(None if out is None else o, r) for o, r in zip(out or [None] * len(a), refs)]

    def linear_gemm_relu_backward(a, wt, y, *, addend=None, out=None, rounded=0, tf32_out=False, config=None):
        assert written_rounded(a, rounded), rounded
        r = put(out, R.linear_gemm_relu_backward(a, wt.T, y, addend))
        if tf32_out:
            rounded_out.append((r, r.shape[1]))
        return r

    def round_tf32(x, *, out=None):  # (float64 here: TF32 modelled as exact, as in matmul)
        return put(out, x.copy())

    def glu_backward_gemm(dadv, wo, pv, *, dq=None, wq=None, dq_set=0, config=None, ctas=None, gate=None):
        launches.append(("glu_backward_gemm", gate))
        if gate is not None and not K.built_in(gate.fragment):
            pv[...], grads = R.glu_backward_gemm(dadv, wo, pv, gate)
            put_grads(gate, grads)
        else:
            pv[...] = R.glu_backward_gemm(dadv, wo, pv)
        if dq is not None:
            assert wq.shape[0] <= 4 and wo[0].shape[0] <= 256 and 0 <= dq_set < len(dadv)
            dq[...] = R.glu_backward_dq(pv, wq, dq_set, wo[0].shape[0])
        return pv

    def wgrad_gemm(xt, y, *, out=None, zero_rows=(0, 0), keep_cols=(0, 0), config=None):
        return put(out, R.wgrad_gemm(xt.T, y, zero_rows, keep_cols))

    def wgrad_gemm_sets(x, y, out, *, config=None):
        return [put(o, R.wgrad_gemm(a, b)) for a, b, o in zip(x, y, out)]

    def vsn_forward(h2, mpre, *, width=None, keep_rows=None, m=None, z=None, tf32=False):
        rm, rz = R.vsn_forward(h2, mpre, width)  # (float64 here: TF32 modelled as exact, as in matmul)
        keep = h2.shape[0] if keep_rows is None else keep_rows
        z = put(z, rz)
        if tf32:
            rounded_out.append((z, h2.shape[1]))
        return (put(m, rm[:keep]) if keep else None), z

    def glu_forward(pv, *, width=None, blocks=1, h=None):
        return put(h, R.glu_forward(pv, width, blocks)[1])

    def gate_glu_forward(pv, gate, *, width=None, blocks=1, h=None):
        launches.append(("gate_glu_forward", gate))
        return put(h, R.gate_glu_forward(pv, gate, width, blocks))

    def gate_glu_backward(dh, pv, gate, *, blocks=1, dpv=None):
        launches.append(("gate_glu_backward", gate))
        r, grads = R.gate_glu_backward(dh, pv, gate, blocks)
        put_grads(gate, grads)
        return put(dpv, r)

    def glu_backward(dh, pv, *, blocks=1, dpv=None):
        return put(dpv, R.glu_backward(dh, pv, blocks))

    def pack_rows(sources, width, *, out=None):
        return put(out, R.pack_rows(sources, width))

    def relu_backward(dy, y, *, addend=None, out=None):
        return put(out, R.relu_backward(dy, y, addend))

    def vsn_backward(dz, h2, m, *, dh2=None, dmpre=None, tf32=False):
        a, b = R.vsn_backward(dz, h2, m)
        dh2, dmpre = put(dh2, a), put(dmpre, b)
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
        dv = put(dv, dv + rdv if accumulate_dv else rdv)
        return dv, dadv

    return types.SimpleNamespace(**{f.__name__: f for f in (
        vsn_forward, glu_forward, glu_backward, relu_backward, vsn_backward, pack_rows,
        dueling_softmax_forward, dueling_backward, glu_gemm, transpose, linear_gemm,
        wgrad_gemm, wgrad_gemm_sets, round_tf32, glu_backward_gemm, heads_dueling,
        linear_gemm_relu_backward, gate_glu_forward, gate_glu_backward)}, GLU_BACKWARD_GEMM_SETS=2,
        branch_launch=K.branch_launch, built_in=K.built_in, launches=launches)


def put_grads(gate, grads):
    """The gate's gradients of the launch's branches into its gradient tree, as the kernels write them."""
    for d in gate.branches:
        for name in gate.fragment.arrays:
            key = name.format(d=d)
            gate.grad_tree[key][...] = grads[key]


def one_stream() -> types.SimpleNamespace:
    """No side stream: the work queued beside the main stream runs in line."""
    return types.SimpleNamespace(beside=contextlib.nullcontext, join=lambda: None)


def twin_blas() -> types.SimpleNamespace:
    def matmul(a, b, out=None, beta=0.0, bias=None, relu=False, stack=None, batch=None):
        if batch is not None and batch[0] > 1:  # product i: each operand i * its stride further on
            for i in range(batch[0]):
                ai, bi, oi = (nth(x, i * st) for x, st in zip((a, b, out), batch[1:]))
                matmul(ai, bi, out=oi, beta=beta)
            return out
        if stack is not None and stack[1]:  # part i of a's rows times the tree i * stride after b
            count, stride = stack
            part = a.shape[0] // count
            r = np.concatenate([a[i * part:(i + 1) * part] @ nth(b, i * stride)
                                + (0.0 if bias is None else nth(bias, i * stride)) for i in range(count)])
            bias = None
        else:
            r = a @ b
        if out is not None and beta != 0.0:  # cuBLAS ignores C when beta = 0
            r = r + beta * out
        if bias is not None:
            r = r + bias
        if relu:
            r = L.relu(r)
        return put(out, r)

    def ones_row(rows, dtype):
        return np.ones((1, rows))

    return types.SimpleNamespace(matmul=matmul, ones_row=ones_row)


def nth(x, elements):
    """The same view as ``x``, ``elements`` further into its buffer."""
    return np.ndarray(x.shape, x.dtype, buffer=base(x), offset=offset(x) + elements * x.itemsize, strides=x.strides)


def base(x):
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x


def offset(x):
    return x.__array_interface__["data"][0] - base(x).__array_interface__["data"][0]


# The twins take any size: GLUs of the test networks' width (12) are one tile, every batch one row
# tile, and any layer input suits wgrad_gemm; the dueling warps' and dq's limits stay the kernels'.
TWIN_LIMITS = dataclasses.replace(KERNEL_LIMITS, tile_rows=10**9, glu_cols=12, relu_cols=1, wgrad_min=0,
                                  wgrad_max=10**9, wgrad_sets_max=10**9)


def fused_network(net: BranchingC51, glu_gemm_on: bool, kernels: types.SimpleNamespace | None = None,
           blas: types.SimpleNamespace | None = None, **knobs) -> FusedNetwork:
    """``net``'s fused network over the twins. With ``glu_gemm_on`` its plan is a Hopper GPU's
    under TF32 (every tensor-core arrangement where it applies), the heads' weight gradients and the
    trunk's ReLU backward on their kernels from any batch, and a fused kernel taken where it has two
    tiles at least: a single branch's GLU backward and heads (one tile) take the other path, so both
    run; otherwise TF32 is off (cuBLAS's GEMMs and the elementwise kernels). ``knobs`` override."""
    knobs = {"wgrad_heads_min_rows": 0, "relu_gemm_min_rows": 0, "fill_sms": 2, **knobs}
    plan = ExecutionPlan.build(net, Device("90", 132), glu_gemm_on, 16, limits=TWIN_LIMITS, **knobs)
    return FusedNetwork(net, plan, kernels=kernels or twin_kernels(), blas=blas or twin_blas(), streams=one_stream(),
                        xp=numpy_cupy())
