"""Launch wrapper of glu_gemm.cu: the GLU layer as one TF32 tensor-core GEMM with the gate in its
epilogue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...backend import check_array
from .. import tma
from ..arrays import F32, rows_view, view_out
from ..gate import GATE_ARGS, GateLaunch
from ..launch import get_kernel as _kernel
from ..launch import i32
from .common import (
    BOX,
    GLU_GEMM_BOX_K,
    GLU_GEMM_CLUSTER,
    GLU_GEMM_COLS,
    GLU_GEMM_ROWS,
    GLU_GEMM_STAGED_BOXES,
    GLU_GEMM_STAGES,
    GLU_GEMM_STORE_BOXES,
    GLU_GEMM_THREADS,
    SMEM_LIMIT,
    TILE_A,
    opt_in_smem,
    tc_operands,
    transpose,
)

Array = Any


@dataclass(frozen=True)
class GluGemmConfig:
    """How :func:`glu_gemm`'s kernel is built: its ring of shared-memory stages, h's staging buffer
    (boxes of 32 columns x 128 rows, 16 KiB) and how many boxes a hand-off to the TMA unit takes,
    the CTAs per cluster (sharing their weight loads by TMA multicast), and whether pv leaves
    through the staging buffer by TMA stores where TMA can address it (16-byte aligned, a row pitch
    of a multiple of 4 floats; otherwise, or with ``pv_tma`` off, from the registers), and whether
    the producer is a whole warpgroup that hands its registers to the consumers (``wide``; None:
    for a gate fragment with parameters, whose epilogue needs them, not for the sigmoid). The default
    is the table's: four stages beside two boxes used in turn, one at a time (the tile's four at
    once, 64 KiB, leave room for three stages only)."""

    stages: int = GLU_GEMM_STAGES
    staged_boxes: int = GLU_GEMM_STAGED_BOXES
    store_boxes: int = GLU_GEMM_STORE_BOXES
    cluster: int = GLU_GEMM_CLUSTER
    pv_tma: bool = True
    wide: bool | None = None
    source: str = "glu_gemm.cu"  # the kernel's source: a file of kernels/, or a path (a diagnostic variant)

    def __post_init__(self) -> None:
        if self.stages < 3 or self.staged_boxes not in (1, 2, 4) or self.staged_boxes % self.store_boxes:
            raise ValueError(f"glu_gemm: no ring of {self.stages} stages with {self.staged_boxes} staged boxes, "
                             f"{self.store_boxes} a hand-off")
        if self.cluster not in (1, 2, 4):
            raise ValueError(f"glu_gemm: clusters of 1, 2 or 4 CTAs, not {self.cluster}")
        if self.smem > SMEM_LIMIT:
            raise ValueError(f"glu_gemm: {self.stages} stages and {self.staged_boxes} staged boxes need more than "
                             "227 KiB")

    @classmethod
    def ring(cls, stages: int, staged_boxes: int | None = None, store_boxes: int | None = None,
             **kw: Any) -> GluGemmConfig:
        """The ring of ``stages`` with the staging buffer that fits beside it unless given: four
        boxes at once with three stages, two in turn, one at a time, with four."""
        staged = staged_boxes if staged_boxes is not None else (4 if stages == 3 else 2)
        store = store_boxes if store_boxes is not None else (staged if staged == 4 else 1)
        return cls(stages, staged, store, **kw)

    @property
    def smem(self) -> int:
        """Bytes of shared memory of the kernel: its stages (16 KiB of u and 32 KiB of weights each),
        h's staging buffer, the stages' two mbarriers each and the 1024-byte alignment of the
        swizzled tiles (225 KiB with 4 stages and 2 boxes)."""
        return (self.stages * (TILE_A + 2 * GLU_GEMM_COLS * GLU_GEMM_BOX_K * 4) + self.staged_boxes * BOX
                + 16 * self.stages + 1024)


def glu_gemm(u: Array, w: Array, *, bias: Array | None = None, width: int | None = None, blocks: int = 1,
             h: Array | None = None, pv: Array | None = None, wt: Array | None = None, rounded: int = 0,
             tf32_h: bool = False, config: GluGemmConfig | None = None, gate: GateLaunch | None = None) -> Array:
    """The GLU layer in one launch: ``pv = u @ w (+ bias)`` on the TF32 tensor cores (wgmma; see
    :func:`glu_gemm_supported`; both operands rounded to TF32 to nearest, as cuBLAS does, the
    products accumulated in float32) and :func:`glu_forward` applied in the GEMM's epilogue.

    ``u`` [B, K]; ``w`` [K, blocks 2H] with each branch's gate and value columns side by side
    (``[W_gate | W_val]``), read through its rounded transpose ``wt`` [blocks 2H, K]
    (:func:`transpose`; made here from ``w`` unless given); ``bias`` [blocks 2H] or None. Writes
    ``h`` [B, blocks width] (augmented as :func:`glu_forward`) and, when ``pv`` [P, blocks 2H] is
    given, the pre-activations of the first ``P`` rows (what the backward reads); the other rows'
    never reach memory. Every array may be a view with any row pitch: ``u``, ``wt`` and ``h``
    (moved by TMA) with pitches of a multiple of 4 floats and 16-byte aligned, ``pv`` with an
    even pitch (moved by TMA too where it is aligned so and ``config.pv_tma``; stored from the
    registers otherwise); K a multiple of 4, H of 128. ``config``: how the kernel is built
    (:class:`GluGemmConfig`; default the table's).

    ``rounded``: u's first columns up to this one hold TF32 values already, rounded to nearest by
    u's writer (:func:`vsn_forward` with ``tf32``): the kernel takes the k chunks (of
    :data:`GLU_GEMM_BOX_K` columns) wholly within them as they are, and rounds only the others
    (rounding in shared memory costs bandwidth the products need). Columns not so rounded would be
    truncated by the tensor cores. ``tf32_h``: h is written rounded to TF32 (to nearest), for
    readers that are TF32 GEMMs (:func:`linear_gemm` with ``rounded``). ``gate``: the gate compiled
    into the epilogue (:class:`~foxhunt_core.gpu.gate.GateLaunch`: its fragment, branch ``b``
    reading ``gate.params[b]``); the built-in sigmoid when None."""
    k = "glu_gemm"
    cfg = config if config is not None else GluGemmConfig()
    tc_operands(k, "u and w", (u, w))
    B, K = u.shape
    cols = w.shape[1]
    if w.shape[0] != K:
        raise ValueError(f"{k}: u has {K} columns but w has {w.shape[0]} rows")
    if blocks < 1 or cols % (2 * blocks):
        raise ValueError(f"{k}: w has {cols} columns; {blocks} joint blocks [gate | value] need a multiple of "
                         f"{2 * blocks}")
    H = cols // (2 * blocks)
    W = H if width is None else int(width)
    if H % GLU_GEMM_COLS or K % 4 or K <= 0 or W < H or W % 2:
        raise ValueError(f"{k}: needs H a multiple of {GLU_GEMM_COLS}, K a positive multiple of 4 and an even "
                         f"width >= H; got H {H}, K {K}, width {W}")
    if not 0 <= rounded <= K:
        raise ValueError(f"{k}: rounded {rounded} outside 0..{K} (u's columns)")
    rows_view(k, "u", u, (B, K))
    if wt is None:
        wt = transpose(w)
    rows_view(k, "wt", wt, (cols, K))
    if bias is not None:
        check_array(k, "bias", bias, F32, (cols,))
    h, ld_h = view_out(k, "h", h, (B, blocks * W))
    pv_rows, ld_pv = 0, 0
    if pv is not None:
        pv_rows = pv.shape[0] if getattr(pv, "ndim", 0) == 2 else -1
        if not 0 <= pv_rows <= B:
            raise ValueError(f"{k}: pv must be [at most {B}, {cols}], got {list(getattr(pv, 'shape', ()))}")
        ld_pv = rows_view(k, "pv", pv, (pv_rows, cols))
    if ld_pv % 2 or any(a is not None and a.data.ptr % 8 for a in (pv, bias)):
        raise ValueError(f"{k}: pv needs an even row pitch, and pv and bias 8-byte alignment")
    if B == 0:
        return h
    map_u = tma.matrix_map(k, "u", u, GLU_GEMM_BOX_K, GLU_GEMM_ROWS)
    c = cfg.cluster
    map_wt = tma.matrix_map(k, "wt", wt, GLU_GEMM_BOX_K, GLU_GEMM_COLS // c)
    map_h = tma.matrix_map(k, "h", h, GLU_GEMM_BOX_K, GLU_GEMM_ROWS)
    pv_tma = cfg.pv_tma and pv_rows > 0 and ld_pv % 4 == 0 and pv.data.ptr % 16 == 0
    map_pv = tma.matrix_map(k, "pv", pv, GLU_GEMM_BOX_K, GLU_GEMM_ROWS) if pv_tma else map_h  # (unread unless pv_tma)
    tail = (K - 1) % GLU_GEMM_BOX_K // 8 + 1  # k steps of 8 in the last chunk (a variant per count)
    if gate is not None:
        gate.check_forward(k)
    gate_defs, gate_inc = gate.compile_options() if gate is not None else ({}, ())
    wide = cfg.wide if cfg.wide is not None else bool(gate is not None and gate_defs and gate.terms)
    gate_args = gate.args(k, blocks, H) if gate is not None else np.zeros(1, dtype=GATE_ARGS)
    fn = _kernel(cfg.source, k, {"GW_STAGES": cfg.stages, "GW_CLUSTER": c, "GW_TAIL_STEPS": tail,
                                    "GW_ROUND_H": int(bool(tf32_h)), "GW_STAGED_BOXES": cfg.staged_boxes,
                                    "GW_STORE_BOXES": cfg.store_boxes, "GW_PV_TMA": int(pv_tma),
                                    "GW_WIDE": int(wide), **gate_defs},
                 gate_inc)
    smem = cfg.smem
    opt_in_smem(fn, smem)
    groups = blocks * (H // GLU_GEMM_COLS) * -(-B // (GLU_GEMM_ROWS * c))  # c row tiles of one column tile
    threads = GLU_GEMM_THREADS - 32 + 128 if wide else GLU_GEMM_THREADS
    clusters = min(groups, tma.max_active_clusters(k, fn, threads, smem, c))  # all resident (persistent)
    fn((clusters * c,), (threads,),
       (map_u, map_wt, map_h, map_pv, bias, gate_args, h, i32(ld_h), pv, i32(ld_pv), i32(pv_rows), i32(B), i32(K),
        i32(H), i32(W), i32(blocks), i32(rounded)), shared_mem=smem)
    return h

