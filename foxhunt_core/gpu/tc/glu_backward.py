"""Launch wrapper of glu_backward_gemm.cu: the GLU layers' backward from their heads' gradients in
one TF32 tensor-core launch (the gate's backward in the epilogue, z's direction-Q gradient
beside), and round_tf32, the heads' weights as it reads them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import tma
from ..arrays import elementwise_grid, rows_view, view_out
from ..defines import value
from ..gate import GATE_ARGS, GateLaunch, gate_terms_reduce
from ..launch import THREADS, i32, sm_count
from ..launch import get_kernel as _kernel
from .common import BOX, GLU_GEMM_BOX_K, GLU_GEMM_COLS, GLU_GEMM_ROWS, SMEM_LIMIT, TILE_A, opt_in_smem, tc_operands

Array = Any
GLU_BACKWARD_GEMM_SETS = value("GB_SETS")  # branches per launch, at most
GLU_BACKWARD_GEMM_STAGES = value("GB_STAGES")
GLU_BACKWARD_GEMM_THREADS = value("GB_THREADS")  # the consumers, the ring's producer, pv's loader and storer
GLU_BACKWARD_GEMM_PARTS = value("GB_PARTS")  # the staging buffer's parts, three mbarriers each
GLU_BACKWARD_GEMM_WARPS = value("TC_CONSUMER_WARPS")  # the consumer warps: each writes its gate sums
# glu_backward_gemm.cu's GluBackArgs: every branch's dadv and Wo tensor maps, then pv's.
GLU_BACK_ARGS = np.dtype([("maps", np.uint64, (2 * GLU_BACKWARD_GEMM_SETS + 1, 16))])


@dataclass(frozen=True)
class GluBackwardGemmConfig:
    """How :func:`glu_backward_gemm`'s kernel is built: its ring's shared-memory stages (beside its
    128 KiB of staged pre-activations; the table's three fill the block)."""

    stages: int = GLU_BACKWARD_GEMM_STAGES

    def __post_init__(self) -> None:
        if self.stages < 3 or self.smem > SMEM_LIMIT:
            raise ValueError(f"glu_backward_gemm: {self.stages} stages (at least 3) do not fit 227 KiB")

    @property
    def smem(self) -> int:
        """Bytes of shared memory of glu_backward_gemm.cu: its stages (16 KiB of dadv and of Wo each),
        the tile's pre-activations (128 KiB), two mbarriers per stage and three per part of the staging
        buffer, the alignment (225 KiB in all with 3 stages)."""
        return (self.stages * (TILE_A + GLU_GEMM_COLS * GLU_GEMM_BOX_K * 4) + 2 * GLU_BACKWARD_GEMM_PARTS * BOX
                + 16 * self.stages + 24 * GLU_BACKWARD_GEMM_PARTS + 1024)


def round_tf32(x: Array, *, out: Array | None = None) -> Array:
    """``x`` [rows, cols] (any row pitch) rounded to TF32, to nearest (as cuBLAS rounds its TF32
    operands): the advantage heads' weights as :func:`glu_backward_gemm` reads them."""
    k = "round_tf32"
    if getattr(x, "ndim", 0) != 2:
        raise ValueError(f"{k}: x must be a 2-D CuPy array")
    ld_x = rows_view(k, "x", x, tuple(x.shape))
    out, ld_out = view_out(k, "out", out, tuple(x.shape))
    if x.size:
        _kernel("glu_backward_gemm.cu", k)((elementwise_grid(x.size),), (THREADS,),
                                           (x, i32(ld_x), out, i32(ld_out), i32(x.shape[0]), i32(x.shape[1])))
    return out


GLU_BACKWARD_GEMM_DQ_COLS = value("GB_NQ_MAX")  # dq's columns, at most
GLU_BACKWARD_GEMM_DQ_H = 2 * value("GB_BH")  # dq's widest GLU: two column tiles, whose sums add exactly in either order


def glu_backward_gemm(dadv: Sequence[Array], wo: Sequence[Array], pv: Array, *, dq: Array | None = None,
                      wq: Array | None = None, dq_set: int = 0, config: GluBackwardGemmConfig | None = None,
                      ctas: int | None = None, gate: GateLaunch | None = None) -> Array:
    """The GLU layers' backward from their advantage heads' gradients in one launch:
    :func:`glu_backward` of ``dh = [dadv[b] @ wo[b].T, ...]``, dh on the TF32 tensor cores (wgmma;
    see :func:`glu_gemm_supported`; both operands rounded to TF32 to nearest, as cuBLAS does) and
    never written: the gate's backward runs in the GEMM's epilogue. Up to
    :data:`GLU_BACKWARD_GEMM_SETS` branches side by side.

    ``dadv[b]`` [M, K] the head's output gradient; ``wo[b]`` [H, K] the head's weights as the layer
    holds them, rounded to TF32 (:func:`round_tf32`); ``pv`` [M, blocks 2H]: branch b's
    ``[gate | value]`` pre-activations at column 2 H b, replaced by their gradients (in place;
    returned). Every matrix may be a view with a row pitch of a multiple of 4 floats, 16-byte
    aligned (TMA moves them); K a multiple of 4, H of 128.

    With ``dq`` [M, n] and ``wq`` [n, 2H] (n up to :data:`GLU_BACKWARD_GEMM_DQ_COLS`, any row
    pitch), ``dq`` is written with ``dpv_s @ wq.T``, ``dpv_s`` branch ``dq_set``'s pre-activation
    gradients (in FP32, from the epilogue's registers): the gradient of the input columns that
    ``wq`` joins to that branch. ``dq`` is zeroed here and each column tile adds its sum: H up to
    :data:`GLU_BACKWARD_GEMM_DQ_H` (two tiles, whose order cannot change the sum).

    ``gate``: the gate whose backward runs in the epilogue (:class:`~foxhunt_core.gpu.gate.
    GateLaunch`: its fragment, branch ``b`` reading ``gate.params[b]``; the built-in sigmoid when
    None). A gate with parameters has their gradients written into ``gate.grads``: each CTA sums
    its tiles' terms and :func:`~foxhunt_core.gpu.gate.gate_terms_reduce` the CTAs' (a fixed order;
    the grid then a multiple of the column tiles, so that a CTA's tiles share their columns).

    ``config``: how the kernel is built (:class:`GluBackwardGemmConfig`); ``ctas``: the persistent
    grid's CTAs, at most one per tile (default: one per SM)."""
    import cupy

    k = "glu_backward_gemm"
    cfg = config if config is not None else GluBackwardGemmConfig()
    sets = len(dadv)
    if not 1 <= sets <= GLU_BACKWARD_GEMM_SETS or len(wo) != sets:
        raise ValueError(f"{k}: 1 to {GLU_BACKWARD_GEMM_SETS} branches of dadv and wo, got {sets} dadv, {len(wo)} wo")
    tc_operands(k, "dadv, wo and pv", (*dadv, *wo, pv))
    M, Kd = dadv[0].shape
    H = wo[0].shape[0]
    if H % GLU_GEMM_COLS or Kd % 4 or Kd <= 0:
        raise ValueError(f"{k}: needs H a multiple of {GLU_GEMM_COLS} and K a positive multiple of 4; got H {H}, "
                         f"K {Kd}")
    for i in range(sets):
        rows_view(k, f"dadv[{i}]", dadv[i], (M, Kd))
        rows_view(k, f"wo[{i}]", wo[i], (H, Kd))
    rows_view(k, "pv", pv, (M, sets * 2 * H))
    nq, ld_dq, ld_wq = 0, 0, 0
    if (dq is None) != (wq is None):
        raise ValueError(f"{k}: dq and wq go together")
    if dq is not None:
        tc_operands(k, "dq and wq", (dq, wq))
        nq = wq.shape[0]
        if not 1 <= nq <= GLU_BACKWARD_GEMM_DQ_COLS:
            raise ValueError(f"{k}: wq must have 1 to {GLU_BACKWARD_GEMM_DQ_COLS} rows, got {nq}")
        if H > GLU_BACKWARD_GEMM_DQ_H:
            raise ValueError(f"{k}: dq needs H up to {GLU_BACKWARD_GEMM_DQ_H} (two column tiles), got {H}")
        if not 0 <= dq_set < sets:
            raise ValueError(f"{k}: dq_set must name one of the {sets} branches, got {dq_set}")
        ld_wq = rows_view(k, "wq", wq, (nq, 2 * H))
        ld_dq = rows_view(k, "dq", dq, (M, nq))
        dq.fill(0.0)
    if M == 0:
        for arrays in (gate.grads or ()) if gate is not None else ():
            for g in arrays:
                g.fill(0.0)
        return pv
    args = np.zeros(1, dtype=GLU_BACK_ARGS)
    for i in range(sets):
        args["maps"][0, i] = tma.matrix_map(k, f"dadv[{i}]", dadv[i], GLU_GEMM_BOX_K, GLU_GEMM_ROWS)["opaque"][0]
        args["maps"][0, GLU_BACKWARD_GEMM_SETS + i] = tma.matrix_map(
            k, f"wo[{i}]", wo[i], GLU_GEMM_BOX_K, GLU_GEMM_COLS)["opaque"][0]
    args["maps"][0, 2 * GLU_BACKWARD_GEMM_SETS] = tma.matrix_map(
        k, "pv", pv, GLU_GEMM_BOX_K, GLU_GEMM_ROWS)["opaque"][0]
    tail = (Kd - 1) % GLU_GEMM_BOX_K // 8 + 1  # k steps of 8 in the last chunk (a variant per count)
    gate_defs, gate_inc = gate.compile_options() if gate is not None else ({}, ())
    terms = gate.terms if gate is not None else 0
    if terms and gate.grads is None:
        raise ValueError(f"{k}: a gate with parameters needs gate.grads, where their gradients go")
    gate_args = gate.args(k, sets, H) if gate is not None else np.zeros(1, dtype=GATE_ARGS)
    fn = _kernel("glu_backward_gemm.cu", k, {"GB_STAGES": cfg.stages, "GB_TAIL_STEPS": tail, "GB_NQ": nq,
                                             **gate_defs}, gate_inc)
    smem = cfg.smem
    opt_in_smem(fn, smem)
    col_tiles = sets * (H // GLU_GEMM_COLS)
    tiles = col_tiles * -(-M // GLU_GEMM_ROWS)
    grid = min(tiles, sm_count() if ctas is None else int(ctas))
    partial = None
    if terms:  # a CTA's tiles all of one column tile (its sums are that tile's)
        grid = max(col_tiles, grid // col_tiles * col_tiles)
        partial = cupy.empty((grid, GLU_BACKWARD_GEMM_WARPS, terms, GLU_GEMM_COLS), dtype=np.float32)
    fn((grid,), (GLU_BACKWARD_GEMM_THREADS,),
       (args, i32(M), i32(Kd), i32(H), i32(sets), dq, i32(ld_dq), wq, i32(ld_wq), i32(dq_set), gate_args, partial),
       shared_mem=smem)
    if terms:
        gate_terms_reduce(partial, gate, ctas=grid, warps=GLU_BACKWARD_GEMM_WARPS, tile_cols=GLU_GEMM_COLS, H=H,
                          blocks=sets)
    return pv

