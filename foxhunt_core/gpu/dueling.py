"""Launch wrappers of dueling.cu: the dueling forward (log-softmax, E[Q], Var[Q]) and backward, the
greedy action of each branch, the auxiliary loss's error at the taken actions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backend import check_array
from .arrays import F32, rows_view
from .launch import (
    HEAD_ALIGN,
    THREADS,
    blocks_for,
    branch_defines,
    dueling_blocks_per_sm,
    f32,
    head_columns,
    i32,
    output,
    sm_count,
    validate_offsets,
)
from .launch import get_kernel as _kernel
from .launch import padded as pad_to  # ``padded`` is a keyword argument of dueling_backward

Array = Any
WARPS = THREADS // 32


def _dueling_grid(items: int, num_atoms: int, offsets: Sequence[int]) -> int:
    """Blocks of the two dueling row kernels, whose warps walk ``items`` rows (forward) or samples
    (backward) with a grid stride: at most as many as are resident at once, and no more than give
    every warp the same number of items (the busiest warp sets the time)."""
    per_warp = max(1, -(-int(items) // (dueling_blocks_per_sm(num_atoms, offsets) * sm_count() * WARPS)))
    return blocks_for(-(-int(items) // per_warp), WARPS)


def dueling_outputs(k: str, segs: Sequence[tuple[str, ...]], seg_rows: int, A: int, N: int, log_probs: Array | None,
                     probs: Array | None, q: Array | None, var: Array | None) -> tuple:
    """The dueling forward's per-segment wants as the kernels read them (3 bits a segment:
    log_probs, probs, var) and its outputs, checked or made: log_probs, probs [r, A, N] and var
    [r, A] with ``r`` the rows up to the last segment that wants each (None: none does), q over
    every segment's rows."""
    for w in segs:
        unknown = set(w) - {"log_probs", "probs", "q", "var"}
        if unknown:
            raise ValueError(f"{k}: unknown outputs {sorted(unknown)} in want")
    bits = {"log_probs": 1, "probs": 2, "var": 4}
    seg_wants = sum(sum(bits.get(o, 0) for o in set(w)) << (3 * i) for i, w in enumerate(segs))

    def rows_of(name: str) -> int:  # rows up to the last segment that wants the output
        return max((i + 1 for i, w in enumerate(segs) if name in w), default=0) * seg_rows

    log_probs = output(k, "log_probs", log_probs, (rows_of("log_probs"), A, N)) if rows_of("log_probs") else None
    probs = output(k, "probs", probs, (rows_of("probs"), A, N)) if rows_of("probs") else None
    q = output(k, "q", q, (len(segs) * seg_rows, A))
    var = output(k, "var", var, (rows_of("var"), A)) if rows_of("var") else None
    return seg_wants, log_probs, probs, q, var


def dueling_softmax_forward(
    v: Array,
    adv: Array,
    z: Array,
    offsets: Sequence[int],
    *,
    branches: tuple[int, int] | None = None,
    v_bias: Array | None = None,
    adv_bias: Array | None = None,
    want: Sequence[str] = ("log_probs", "probs", "q", "var"),
    segments: Sequence[Sequence[str]] | None = None,
    log_probs: Array | None = None,
    probs: Array | None = None,
    q: Array | None = None,
    var: Array | None = None,
    zq: Array | None = None,
    zq_scale: float = 1.0,
) -> tuple[Array | None, Array | None, Array, Array | None]:
    """Dueling logits ``v + adv - mean_branch(adv)``, log-softmax over atoms, E[Q] and Var[Q].

    Args:
        v: [B, N] value head; adv: [B, A, N] advantages; z: [N] support. Or the padded layout
            of the GPU network: ``adv`` [B, W] with each branch's block padded to a multiple of
            4 floats (:func:`.launch.head_columns`) and ``v`` [B, N rounded up to 4]; the
            padding is not read. ``v`` may be a column block of a wider array (any row pitch).
        offsets: branch boundaries in the action axis.
        branches: ``(first, end)`` to compute only those branches (the rest of the outputs is
            left untouched), e.g. ``(0, 1)`` for the direction branch the magnitude branch reads.
        v_bias, adv_bias: [N] and [A, N] biases added to ``v`` and ``adv`` as they are read.
        want: which outputs to write; ``q`` always. The others not wanted are returned as None.
        segments: instead of ``want``, one ``want`` per segment of ``B / len(segments)`` rows
            (forwards of different inputs or networks in one launch). An output is then
            ``[r, ...]`` with ``r`` the rows up to the last segment that wants it, and only the
            rows of the segments that want it are written.
        zq, zq_scale: also write the direction branch's (branch 0's) Q times ``zq_scale`` into
            ``zq`` [B, n_0] (any row pitch), when the branches computed include it.

    Returns:
        ``(log_probs [.., A, N], probs [.., A, N], q [B, A], var [.., A])``.
    """
    k = "dueling_softmax_forward"
    if getattr(adv, "ndim", 0) == 2:  # the padded layout
        check_array(k, "z", z, F32, (None,))
        N, align = z.shape[0], HEAD_ALIGN
        offs = validate_offsets(k, offsets, int(offsets[-1]) if len(offsets) else 0)
        check_array(k, "adv", adv, F32, (None, head_columns(offs, N, align)[-1]))
    else:
        check_array(k, "adv", adv, F32, (None, None, None))
        N, align = adv.shape[2], 1
        offs = validate_offsets(k, offsets, adv.shape[1])
        check_array(k, "z", z, F32, (N,))
    B, A = adv.shape[0], offs[-1]
    D = len(offs) - 1
    d0, d1 = branches if branches is not None else (0, D)
    if not 0 <= d0 < d1 <= D:
        raise ValueError(f"{k}: branches {branches} outside 0..{D}")
    segs = [tuple(want)] if segments is None else [tuple(w) for w in segments]
    if not segs or B % len(segs) or len(segs) > 10:
        raise ValueError(f"{k}: {len(segs)} segments do not split {B} rows evenly (at most 10)")
    seg_rows = B // len(segs)
    v_pitch = rows_view(k, "v", v, (B, pad_to(N, align)))
    if v_bias is not None:
        check_array(k, "v_bias", v_bias, F32, (N,))
    if adv_bias is not None:
        check_array(k, "adv_bias", adv_bias, F32, (A, N))
    seg_wants, log_probs, probs, q, var = dueling_outputs(k, segs, seg_rows, A, N, log_probs, probs, q, var)
    zq_pitch = rows_view(k, "zq", zq, (B, offs[1])) if zq is not None else 0
    fn = _kernel("dueling.cu", k, branch_defines(offs, N, align))
    grid = _dueling_grid(B * (d1 - d0), N, offs)
    fn((grid,), (THREADS,), (v, i32(v_pitch), adv, v_bias, adv_bias, z, log_probs, probs, q, var, zq, i32(zq_pitch),
                             f32(zq_scale),
                             i32(B), i32(d0), i32(d1), i32(seg_rows), i32(seg_wants)))
    return log_probs, probs, q, var


def dueling_backward(
    dlogits: Array,
    z: Array,
    offsets: Sequence[int],
    *,
    branches: tuple[int, int] | None = None,
    accumulate_dv: bool = False,
    dq: Array | None = None,
    dq_scale: float = 1.0,
    probs: Array | None = None,
    q: Array | None = None,
    dv: Array | None = None,
    dadv: Array | None = None,
    padded: bool = False,
) -> tuple[Array, Array]:
    """Backward of the dueling aggregation: ``(dv [B, N], dadv [B, A, N])``, or with
    ``padded`` in the padded layout of :func:`dueling_softmax_forward` (``dv`` [B, N rounded up
    to 4], ``dadv`` [B, W]) with zeros written into the padding. A given ``dv`` may be a column
    block of a wider array (any row pitch).

    With ``dq`` [B, A] (and the forward's ``probs``, ``q``) the expected-Q gradient
    ``dq * p * (z - q)`` is added to ``dlogits`` first — the magnitude branch's conditioning on the
    direction branch's Q (pass zeros outside the direction branch). ``dq`` may be any row-major
    view whose columns cover the actions of ``branches`` (e.g. ``[B, n_0]`` columns of a wider
    array for ``branches=(0, 1)``); it is read times ``dq_scale``. ``branches=(first, end)``
    reads and writes only those branches; ``accumulate_dv`` adds their share to ``dv``.
    """
    k = "dueling_backward"
    check_array(k, "dlogits", dlogits, F32, (None, None, None))
    B, A, N = dlogits.shape
    offs = validate_offsets(k, offsets, A)
    D = len(offs) - 1
    d0, d1 = branches if branches is not None else (0, D)
    if not 0 <= d0 < d1 <= D:
        raise ValueError(f"{k}: branches {branches} outside 0..{D}")
    check_array(k, "z", z, F32, (N,))
    if dq is not None:
        if probs is None or q is None:
            raise ValueError(f"{k}: dq needs the forward's probs and q")
        if getattr(dq, "ndim", 0) != 2 or dq.shape[0] != B or dq.shape[1] < offs[d1]:
            raise ValueError(f"{k}: dq must be [{B}, at least {offs[d1]}], got {list(getattr(dq, 'shape', ()))}")
        ld_dq = rows_view(k, "dq", dq, tuple(dq.shape))
        check_array(k, "probs", probs, F32, (B, A, N))
        check_array(k, "q", q, F32, (B, A))
    if accumulate_dv and dv is None:
        raise ValueError(f"{k}: accumulate_dv needs dv")
    align = HEAD_ALIGN if padded else 1
    if dv is None:
        dv = output(k, "dv", dv, (B, pad_to(N, align)))
    v_pitch = rows_view(k, "dv", dv, (B, pad_to(N, align)))
    dadv = output(k, "dadv", dadv, (B, head_columns(offs, N, align)[-1]) if padded else (B, A, N))
    fn = _kernel("dueling.cu", k, branch_defines(offs, N, align))
    fn((_dueling_grid(B, N, offs),), (THREADS,),
       (dlogits, dq, i32(ld_dq if dq is not None else 0), f32(dq_scale), probs, q, z, dv, i32(v_pitch), dadv,
        i32(B), i32(d0), i32(d1), i32(int(accumulate_dv))))
    return dv, dadv


def aux_error(values: Array, action: Array, target: Array, scale: float, offsets: Sequence[int], *,
              err2: Array | None = None, dvalues: Array | None = None) -> tuple[Array, Array]:
    """The auxiliary loss's squared error and gradient in one launch: with ``e = values[b,
    action[b, d]] - target[b, d]`` (``action`` [B, D], absolute indices), returns ``(err2 = e^2
    [B, D], dvalues [B, A])`` where ``dvalues`` is ``scale * e`` at each taken action and zero
    elsewhere (``take_along_axis`` / ``put_along_axis`` of ``agent.py``)."""
    k = "aux_error"
    check_array(k, "values", values, F32, (None, None))
    B, A = values.shape
    offs = validate_offsets(k, offsets, A)
    D = len(offs) - 1
    check_array(k, "action", action, np.int64, (B, D))
    check_array(k, "target", target, F32, (B, D))
    err2 = output(k, "err2", err2, (B, D))
    dvalues = output(k, "dvalues", dvalues, (B, A))
    _kernel("dueling.cu", k, branch_defines(offs))((blocks_for(B * A, THREADS),), (THREADS,),
                                                   (values, action, target, f32(scale), err2, dvalues, i32(B)))
    return err2, dvalues


def branch_argmax(values: Array, offsets: Sequence[int], *, absolute: bool = False,
                  out: Array | None = None) -> Array:
    """Greedy action of each branch [B, D] (int64; the first of ties, as ``qpipe.branch_argmax``),
    as an index within the branch, or with ``absolute`` over all actions (``+ offsets[d]``)."""
    k = "branch_argmax"
    check_array(k, "values", values, F32, (None, None))
    B, A = values.shape
    offs = validate_offsets(k, offsets, A)
    D = len(offs) - 1
    out = output(k, "out", out, (B, D), np.int64)
    _kernel("dueling.cu", k, branch_defines(offs))((blocks_for(B * D, THREADS),), (THREADS,),
                                                   (values, out, i32(B), i32(int(absolute))))
    return out

