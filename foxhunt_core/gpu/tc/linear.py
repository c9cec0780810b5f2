"""Launch wrappers of linear_gemm.cu: up to four linear layers in one TF32 tensor-core launch, the
ReLU's backward in the epilogue (linear_gemm_relu_backward), and the advantage heads with the
dueling forward on warps beside the products (heads_dueling)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...backend import check_array
from .. import tma
from ..arrays import F32, rows_view, view_out
from ..defines import value
from ..dueling import dueling_outputs
from ..launch import HEAD_ALIGN, branch_defines, head_columns, i32, validate_offsets
from ..launch import get_kernel as _kernel
from ..launch import padded as pad_to
from .common import BOX, GLU_GEMM_BOX_K, GLU_GEMM_ROWS, GLU_GEMM_THREADS, TILE_A, opt_in_smem, tc_operands

Array = Any
LINEAR_GEMM_COLS = value("LG_BN")  # linear_gemm.cu's tile: 128 rows x 160 columns (the wgmma's N)
LINEAR_GEMM_STAGES = value("LG_STAGES")
LINEAR_GEMM_CLUSTER = value("LG_CLUSTER")
LINEAR_GEMM_SETS = value("LG_BRANCHES")  # operand sets per launch, at most
LINEAR_GEMM_DUELING_WARPS = value("LG_DUELING_WARPS")  # heads_dueling's dueling warps beside the others
LINEAR_GEMM_DUELING_THREADS = value("LG_DUELING_THREADS")
# linear_gemm.cu's LinearArgs: every set's three tensor maps, then its bias pointer (64-byte aligned).
LINEAR_ARGS = np.dtype([("maps", np.uint64, (3 * LINEAR_GEMM_SETS, 16)), ("bias", np.uint64, (LINEAR_GEMM_SETS,)),
                        ("pad", np.uint64, (-LINEAR_GEMM_SETS % 8,))])


@dataclass(frozen=True)
class LinearGemmConfig:
    """How :func:`linear_gemm`'s kernel (and :func:`heads_dueling`'s and
    :func:`linear_gemm_relu_backward`'s, its variants) is built: its shared-memory stages and the
    CTAs per cluster sharing their weight loads. The default is the table's."""

    stages: int = LINEAR_GEMM_STAGES
    cluster: int = LINEAR_GEMM_CLUSTER

    def __post_init__(self) -> None:
        if self.stages < 3 or self.cluster not in (1, 2, 4):
            raise ValueError(f"linear_gemm: at least 3 stages and clusters of 1, 2 or 4 CTAs, not {self.stages} "
                             f"stages and {self.cluster}")


def linear_gemm_smem(dueling: bool = False, cols: int = LINEAR_GEMM_COLS, stages: int = LINEAR_GEMM_STAGES) -> int:
    """Bytes of shared memory of linear_gemm.cu with tiles of ``cols`` columns: its stages (16 KiB
    of A and ``cols`` rows of weights each), the tile on its way out (boxes of 16 KiB), two
    mbarriers per stage (and with the dueling warps two for the staged tile), the alignment (224
    KiB with 4 stages of 160 columns: a Hopper block may have 227)."""
    boxes = -(-cols // 32)
    return stages * (TILE_A + cols * GLU_GEMM_BOX_K * 4) + boxes * BOX + 16 * stages + 16 * dueling + 1024


def linear_gemm(a: Sequence[Array], wt: Sequence[Array], out: Sequence[Array] | None = None, *,
                bias: Sequence[Array | None] | None = None, relu: bool = False, tf32_out: bool = False,
                rounded: int = 0, config: LinearGemmConfig | None = None) -> list[Array]:
    """Up to four linear layers in one launch: ``out[b] = a[b] @ wt[b].T (+ bias[b])`` (then
    ``relu``) on the TF32 tensor cores (wgmma; see :func:`glu_gemm_supported`; both operands
    rounded to TF32 to nearest, as cuBLAS does, the products accumulated in float32).

    ``a[b]`` [M, K]; ``wt[b]`` [N, K], the weights transposed and rounded (:func:`transpose`);
    ``bias[b]`` [N] or None; ``out[b]`` [M, N] (new arrays when not given). Every matrix may be a
    view with any row pitch that is a multiple of 4 floats, 16-byte aligned (TMA moves them), e.g.
    the column blocks of one wider array: a set writes only its own columns. N even, K a multiple
    of 4. ``rounded``: a's columns up to this one hold TF32 values already, rounded to nearest by
    their writer (:func:`glu_gemm` with ``tf32_h``; see its ``rounded``). ``tf32_out``: out is
    written rounded to TF32 (to nearest). ``config``: how the kernel is built (:class:`LinearGemmConfig`)."""
    k = "linear_gemm"
    M, K, N = linear_operands(k, a, wt, bias, rounded)
    if out is not None and len(out) != len(a):
        raise ValueError(f"{k}: {len(out)} outputs for {len(a)} sets of a")
    outs = [view_out(k, f"out[{i}]", None if out is None else out[i], (M, N))[0] for i in range(len(a))]
    if M:
        linear_launch(k, a, wt, outs, bias, (M, K, N), rounded,
                       {"LG_RELU": int(bool(relu)), "LG_ROUND_OUT": int(bool(tf32_out))}, config=config)
    return outs


def linear_operands(k: str, a: Sequence[Array], wt: Sequence[Array], bias: Sequence[Array | None] | None,
                     rounded: int) -> tuple[int, int, int]:
    """linear_gemm's operands checked (see :func:`linear_gemm`): ``(M, K, N)``."""
    sets = len(a)
    if not 1 <= sets <= LINEAR_GEMM_SETS or len(wt) != sets or (bias is not None and len(bias) != sets):
        raise ValueError(f"{k}: 1 to {LINEAR_GEMM_SETS} sets of a, wt (and bias), got {sets} a, {len(wt)} wt")
    tc_operands(k, "a and wt", (*a, *wt))
    M, K = a[0].shape
    N = wt[0].shape[0]
    if N % 2 or K % 4 or K <= 0 or N <= 0:
        raise ValueError(f"{k}: needs N even and K a positive multiple of 4; got N {N}, K {K}")
    if not 0 <= rounded <= K:
        raise ValueError(f"{k}: rounded {rounded} outside 0..{K} (a's columns)")
    for i in range(sets):
        rows_view(k, f"a[{i}]", a[i], (M, K))
        rows_view(k, f"wt[{i}]", wt[i], (N, K))
        b = None if bias is None else bias[i]
        if b is not None:
            check_array(k, f"bias[{i}]", b, F32, (N,))
            if b.data.ptr % 8:
                raise ValueError(f"{k}: bias[{i}] needs 8-byte alignment")
    return M, K, N


def linear_launch(k: str, a: Sequence[Array], wt: Sequence[Array], outs: Sequence[Array] | None,
                   bias: Sequence[Array | None] | None, mkn: tuple[int, int, int], rounded: int,
                   defines: dict[str, Any], extra: tuple = (), cols: int = LINEAR_GEMM_COLS,
                   config: LinearGemmConfig | None = None) -> None:
    """linear_gemm.cu's launch over checked operands (``outs`` None: no output maps, for the
    dueling variant, which writes none); ``defines`` and ``extra`` arguments pick a variant,
    ``cols`` its tile's columns (LG_BN), ``config`` its stages and cluster."""
    cfg = config if config is not None else LinearGemmConfig()
    M, K, N = mkn
    sets = len(a)
    c = cfg.cluster
    args = np.zeros(1, dtype=LINEAR_ARGS)
    for i in range(sets):
        args["maps"][0, i] = tma.matrix_map(k, f"a[{i}]", a[i], GLU_GEMM_BOX_K, GLU_GEMM_ROWS)["opaque"][0]
        args["maps"][0, LINEAR_GEMM_SETS + i] = tma.matrix_map(
            k, f"wt[{i}]", wt[i], GLU_GEMM_BOX_K, cols // c)["opaque"][0]
        if outs is not None:
            args["maps"][0, 2 * LINEAR_GEMM_SETS + i] = tma.matrix_map(
                k, f"out[{i}]", outs[i], GLU_GEMM_BOX_K, GLU_GEMM_ROWS)["opaque"][0]
        b = None if bias is None else bias[i]
        args["bias"][0, i] = 0 if b is None else b.data.ptr
    tail = (K - 1) % GLU_GEMM_BOX_K // 8 + 1  # k steps of 8 in the last chunk (a variant per count)
    tile = {} if cols == LINEAR_GEMM_COLS else {"LG_BN": cols}
    fn = _kernel("linear_gemm.cu", "linear_gemm",
                 {"LG_STAGES": cfg.stages, "LG_CLUSTER": c, "LG_TAIL_STEPS": tail, **tile, **defines})
    dueling = bool(defines.get("LG_DUELING"))
    threads = LINEAR_GEMM_DUELING_THREADS if dueling else GLU_GEMM_THREADS
    smem = linear_gemm_smem(dueling, cols, cfg.stages)
    opt_in_smem(fn, smem)
    groups = sets * -(-N // cols) * -(-M // (GLU_GEMM_ROWS * c))  # c row tiles of one column tile
    clusters = min(groups, tma.max_active_clusters(k, fn, threads, smem, c))  # all resident (persistent)
    fn((clusters * c,), (threads,), (args, i32(M), i32(K), i32(N), i32(sets), i32(rounded), *extra),
       shared_mem=smem)


LINEAR_RELU_BACKWARD_COLS = 128  # linear_gemm_relu_backward's tile: 128 x 128 (160 columns spill)


def linear_gemm_relu_backward(a: Array, wt: Array, y: Array, *, addend: Array | None = None,
                              out: Array | None = None, rounded: int = 0, tf32_out: bool = False,
                              config: LinearGemmConfig | None = None) -> Array:
    """A ReLU layer's input gradient on the TF32 tensor cores with the ReLU's backward in the GEMM's
    epilogue: ``out = (a @ wt.T + addend) * (y > 0)`` (:func:`relu_backward` of the product, without
    the product's round trip through memory).

    ``a`` [M, K] the gradient of the next layer's pre-activation, ``wt`` [N, K] that layer's weights
    as the layer holds them ([its inputs, its outputs]), rounded to TF32 (:func:`round_tf32`);
    ``y`` [M, N] this ReLU's output; ``addend`` [M, N] (the output's gradient from elsewhere) or
    None; ``out`` [M, N] (a new array when not given). Matrices may be views with any row pitch
    that is a multiple of 4 floats, 16-byte aligned. ``rounded`` and ``tf32_out`` as for
    :func:`linear_gemm`, ``config`` too. (One tile of 128 x 128 per SM at least is what makes it
    pay: the execution plan's ``relu_gemm_at``.)"""
    k = "linear_gemm_relu_backward"
    M, K, N = linear_operands(k, [a], [wt], None, rounded)
    lds = []
    for name, x in (("y", y), ("addend", addend)):
        if x is None:
            lds.append(0)
            continue
        lds.append(rows_view(k, name, x, (M, N)))
        if lds[-1] % 2 or x.data.ptr % 8:  # (read as float2)
            raise ValueError(f"{k}: {name} needs 8-byte alignment and an even row pitch")
    ld_y, ld_addend = lds
    out, _ = view_out(k, "out", out, (M, N))
    if M:
        linear_launch(k, [a], [wt], [out], None, (M, K, N), rounded,
                       {"LG_DRELU": 1, "LG_ROUND_OUT": int(bool(tf32_out))},
                       (y, i32(ld_y), addend, i32(ld_addend)), cols=LINEAR_RELU_BACKWARD_COLS, config=config)
    return out


HEADS_DUELING_LANES = value("DG_LANES")  # lanes per row of heads_dueling's dueling warps
HEADS_DUELING_BUDGET = value("DG_BUDGET")  # a branch's logits per lane, at most


def heads_dueling_supported(offsets: Sequence[int], num_atoms: int, lanes: int = HEADS_DUELING_LANES,
                            budget: int = HEADS_DUELING_BUDGET) -> bool:
    """Whether :func:`heads_dueling`'s dueling warps take the branch layout: each lane of a row's
    ``lanes`` (8) holds its atoms of every action of a branch, at most ``budget`` (24) values
    (dueling_row.cuh DG_FITS). Branches of 13 or more actions with 9 to 12 atoms (or of 25 or more)
    do not fit; their dueling forward runs apart (:func:`dueling_softmax_forward`)."""
    largest = max(int(b) - int(a) for a, b in zip(offsets[:-1], offsets[1:]))
    return largest * -(-int(num_atoms) // lanes) <= budget


# linear_gemm.cu's DuelingArgs (LG_DUELING): v, z, the outputs (dueling_row.cuh's DuelingOutputs),
# then the epilogue's sizes.
DUELING_ARGS = np.dtype([("v", np.uint64), ("z", np.uint64), ("log_probs", np.uint64), ("probs", np.uint64),
                         ("q", np.uint64), ("var", np.uint64), ("zq", np.uint64), ("zq_pitch", np.int32),
                         ("zq_scale", np.float32), ("v_pitch", np.int32), ("branch0", np.int32),
                         ("duel_rows", np.int32), ("seg_rows", np.int32), ("seg_wants", np.int32),
                         ("store_out", np.int32)], align=True)


def heads_dueling(
    a: Sequence[Array],
    wt: Sequence[Array],
    v: Array,
    z: Array,
    offsets: Sequence[int],
    *,
    branches: tuple[int, int],
    segments: Sequence[Sequence[str]],
    seg_rows: int,
    bias: Sequence[Array | None] | None = None,
    adv: Sequence[Array] | None = None,
    log_probs: Array | None = None,
    probs: Array | None = None,
    q: Array | None = None,
    var: Array | None = None,
    zq: Array | None = None,
    zq_scale: float = 1.0,
    rounded: int = 0,
    straight: bool = False,
    config: LinearGemmConfig | None = None,
) -> tuple[Array | None, Array | None, Array, Array | None]:
    """The advantage heads of ``branches`` ``(d0, d1)`` and the dueling forward over them in one
    launch: :func:`linear_gemm` (one set per branch: ``a[i]`` [M, K] branch ``d0 + i``'s GLU
    output, ``wt[i]`` its [n, K] transposed weights, n its block of the padded advantage row,
    :func:`.launch.head_columns`, at most :data:`LINEAR_GEMM_COLS`; ``bias[i]`` [n] or None) with
    :func:`dueling_softmax_forward` of those branches (its ``segments``, ``log_probs`` .. ``zq``)
    from the staged tiles, by warps beside the products, over the rows of the ``segments``
    (``seg_rows`` each, from row 0; ``M`` may
    be more: those rows' heads are computed, their dueling not). ``v`` [M, N padded] the value
    head (any row pitch), ``z`` [N] the support. ``adv[i]`` ([M, n] views, any row pitch of a
    multiple of 4 floats): the heads are written there as well (a caller that reads them);
    otherwise they never reach memory. ``straight``: the distributions go from the lanes straight to
    memory rather than through the staging buffer where the layout's registers allow it (for
    comparison); ``config`` as for :func:`linear_gemm`.

    Returns ``(log_probs, probs, q, var)`` as :func:`dueling_softmax_forward`."""
    k = "heads_dueling"
    check_array(k, "z", z, F32, (None,))
    N = z.shape[0]
    offs = validate_offsets(k, offsets, int(offsets[-1]) if len(offsets) else 0)
    A, D = offs[-1], len(offs) - 1
    d0, d1 = branches
    if not 0 <= d0 < d1 <= D or len(a) != d1 - d0:
        raise ValueError(f"{k}: branches {branches} outside 0..{D} or not one set of a each ({len(a)} sets)")
    cols = head_columns(offs, N, HEAD_ALIGN)
    widths = {cols[d + 1] - cols[d] for d in range(d0, d1)}
    if len(widths) != 1 or widths.pop() > LINEAR_GEMM_COLS:
        raise ValueError(f"{k}: the branches' advantage blocks must be of one width, at most {LINEAR_GEMM_COLS} "
                         f"columns; got {[cols[d + 1] - cols[d] for d in range(d0, d1)]}")
    if not heads_dueling_supported(offs, N):
        raise ValueError(f"{k}: branches of {max(np.diff(offs))} actions of {N} atoms take more than "
                         f"{HEADS_DUELING_BUDGET} values per lane of the dueling warps (run the dueling forward apart)")
    M, K, n = linear_operands(k, a, wt, bias, rounded)
    if n != cols[d0 + 1] - cols[d0]:
        raise ValueError(f"{k}: wt has {n} rows, branch {d0}'s advantage block {cols[d0 + 1] - cols[d0]} columns")
    segs = [tuple(w) for w in segments]
    if not 1 <= len(segs) <= 10 or seg_rows <= 0 or len(segs) * seg_rows > M:
        raise ValueError(f"{k}: {len(segs)} segments of {seg_rows} rows (1 to 10 segments within the {M} rows)")
    duel_rows = len(segs) * seg_rows
    v_pitch = rows_view(k, "v", v, (M, pad_to(N, HEAD_ALIGN)))
    seg_wants, log_probs, probs, q, var = dueling_outputs(k, segs, seg_rows, A, N, log_probs, probs, q, var)
    zq_pitch = rows_view(k, "zq", zq, (duel_rows, offs[1])) if zq is not None else 0
    outs = None
    if adv is not None:
        if len(adv) != len(a):
            raise ValueError(f"{k}: {len(adv)} adv outputs for {len(a)} sets")
        outs = [view_out(k, f"adv[{i}]", x, (M, n))[0] for i, x in enumerate(adv)]
    ptr = [0 if x is None else x.data.ptr for x in (v, z, log_probs, probs, q, var, zq)]
    du = np.array([(*ptr, zq_pitch, zq_scale, v_pitch, d0, duel_rows, seg_rows, seg_wants, int(outs is not None))],
                  dtype=DUELING_ARGS)
    staged = {"LG_DUELING_STAGED": 0} if straight else {}  # (else the layout's default)
    linear_launch(k, a, wt, outs, bias, (M, K, n), rounded,
                   {"LG_RELU": 0, "LG_ROUND_OUT": 0, "LG_DUELING": 1, **staged, **branch_defines(offs, N, HEAD_ALIGN)},
                   (du,), config=config)
    return log_probs, probs, q, var

