"""Typed launch wrappers of the core's CUDA kernels (``foxhunt_core/kernels/*.cu``).

Every wrapper checks dtype, shape and contiguity of its arrays (errors name the kernel), accepts
preallocated outputs (keyword arguments named like the outputs) and then neither allocates nor
synchronizes with the host: it only launches on the current CuPy stream, so a sequence of them
can be captured into a CUDA graph and replayed. Without an output argument a new array is
allocated (convenient outside graph capture). Scalars are passed by value as float32/int32.

Kernel: NumPy twin (the oracle of ``tests/gpu``); thread mapping.

- ``dueling_softmax_forward``: ``network.py`` dueling ``V + A - mean A`` (biases added on read),
  ``layers.log_softmax``, ``qpipe.expected_q``; outputs nobody reads can be skipped, per segment
  of rows; a warp per (sample, branch).
- ``dueling_backward``: ``network.py`` ``dadv = dl - mean dl``, ``dv = sum_a dl``, with the
  direction-conditioning term ``dq * p * (z - q)`` optionally fused, over a range of branches; a
  warp per sample.
- ``branch_argmax``: ``qpipe.branch_argmax`` (the first of ties); a thread per (sample, branch).
- ``aux_error``: the auxiliary loss's ``take_along_axis`` / ``put_along_axis`` lines of
  ``agent.py`` (squared error and gradient at the taken actions); a thread per (sample, action).
- ``c51_target_loss``: ``c51.project`` + ``c51.loss_and_grad`` (gradient / (B D), as
  ``agent.py``), optionally reading the chosen rows of whole outputs and writing the gradient
  over all actions; a warp per (sample, branch).
- ``glu_forward/backward`` (the gate and value GEMM outputs side by side, the backward
  recomputing both), ``bias_relu_forward``, ``relu_backward``, ``vsn_forward/backward``:
  the GLU (several branches side by side), trunk and VSN lines of ``network.py`` with
  ``layers.sigmoid/relu``, outputs augmented with a ones column where asked; ``pack_rows`` (the
  network's augmented input) and ``copy`` (flat buffers); a thread per element (four per thread,
  ``float4``, where the rows allow).
- ``glu_gemm`` and ``linear_gemm`` (TF32 tensor-core GEMMs: TMA, wgmma, warp-specialized and
  persistent, ``tc_gemm.cuh``): ``reference.glu_gemm`` (the GLU layer, the gate in the GEMM's
  epilogue) and ``reference.linear_gemm`` (up to four linear layers per launch); a CTA per SM,
  a tile of 128 rows per two consumer warpgroups. ``heads_dueling``: ``linear_gemm`` over the
  advantage heads and the dueling forward of ``dueling_softmax_forward`` from the staged tiles,
  by seven dueling warps per CTA beside the consumers (eight lanes per row, four rows at once).
  ``transpose``: the weights transposed and rounded to TF32 as both read them. ``wgrad_gemm``:
  ``reference.wgrad_gemm`` (a weight gradient over the batch, its operand A from registers); a
  CTA per 128 output columns and slice of the batch, then a thread per element sums the slices;
  ``wgrad_gemm_sets`` likewise for up to four products at once, the batch-major input transposed
  in shared memory. ``glu_backward_gemm``: ``reference.glu_backward_gemm`` (the heads' input
  gradient and the GLU's backward in its epilogue); a CTA per SM, a tile of 128 rows and 128 GLU
  columns. ``round_tf32``: a thread per element.
- ``attention_forward/backward`` (:mod:`.qkernels`): ``attention.forward/backward``; 16 threads
  per sample, then a deterministic two-pass reduction of the parameter gradients.
- ``q_stats_reduce`` (:mod:`.qkernels`): ``qpipe.q_statistics``; multi-block partials + one block.
- ``boltzmann_select`` (:mod:`.qkernels`): ``explore.boltzmann_select`` fed by :mod:`.philox`;
  a thread per sample.
- ``adam_step`` (:mod:`.optim`): ``optim.Adam.step`` over a :class:`.flat.FlatTree`; multi-block
  norm, one-warp prepare, a thread per element.

Shapes: ``B`` samples, ``A`` actions in branches given by ``offsets`` (``(0, 3, 6, 9, 12)``),
``N`` atoms on the support ``z`` [N] (``z_j = v_min + j dz``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import check_array
from . import tma
from .defines import DEFAULT_DEFINES, value
from .launch import (
    HEAD_ALIGN,
    THREADS,
    blocks_for,
    branch_defines,
    dueling_blocks_per_sm,
    f32,
    head_columns,
    i32,
    i64,
    output,
    sm_count,
    validate_offsets,
)
from .launch import get_kernel as _kernel
from .launch import padded as pad_to  # ``padded`` is a keyword argument of dueling_backward
from .optim import adam_step, adam_workspace
from .qkernels import (
    attention_backward,
    attention_forward,
    attention_workspace,
    boltzmann_select,
    q_stats_keys,
    q_stats_reduce,
    q_stats_workspace,
)

__all__ = [
    "DEFAULT_DEFINES",
    "adam_step",
    "adam_workspace",
    "attention_backward",
    "attention_forward",
    "attention_workspace",
    "aux_error",
    "bias_relu_forward",
    "boltzmann_select",
    "branch_argmax",
    "c51_target_loss",
    "copy",
    "dueling_backward",
    "dueling_softmax_forward",
    "glu_backward",
    "GluBackwardGemmConfig",
    "GluGemmConfig",
    "LinearGemmConfig",
    "WgradGemmConfig",
    "glu_backward_gemm",
    "glu_forward",
    "glu_gemm",
    "glu_gemm_supported",
    "heads_dueling",
    "heads_dueling_supported",
    "linear_gemm",
    "linear_gemm_relu_backward",
    "pack_rows",
    "q_stats_keys",
    "q_stats_reduce",
    "q_stats_workspace",
    "relu_backward",
    "round_tf32",
    "transpose",
    "vsn_backward",
    "vsn_forward",
    "wgrad_gemm",
    "wgrad_gemm_sets",
    "wgrad_gemm_supported",
]

Array = Any
F32 = np.float32
WARPS = THREADS // 32
ROW_BLOCKS_PER_SM = 4  # blocks per SM of the C51 loss, whose warps walk several rows each


def _elementwise_grid(total: int) -> int:
    return blocks_for(total, THREADS, 32 * sm_count())


# ------------------------------------------------------------------ dueling.cu
def _dueling_grid(items: int, num_atoms: int, offsets: Sequence[int]) -> int:
    """Blocks of the two dueling row kernels, whose warps walk ``items`` rows (forward) or samples
    (backward) with a grid stride: at most as many as are resident at once, and no more than give
    every warp the same number of items (the busiest warp sets the time)."""
    per_warp = max(1, -(-int(items) // (dueling_blocks_per_sm(num_atoms, offsets) * sm_count() * WARPS)))
    return blocks_for(-(-int(items) // per_warp), WARPS)


def _dueling_outputs(k: str, segs: Sequence[tuple[str, ...]], seg_rows: int, A: int, N: int, log_probs: Array | None,
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
    v_pitch = _rows_view(k, "v", v, (B, pad_to(N, align)))
    if v_bias is not None:
        check_array(k, "v_bias", v_bias, F32, (N,))
    if adv_bias is not None:
        check_array(k, "adv_bias", adv_bias, F32, (A, N))
    seg_wants, log_probs, probs, q, var = _dueling_outputs(k, segs, seg_rows, A, N, log_probs, probs, q, var)
    zq_pitch = _rows_view(k, "zq", zq, (B, offs[1])) if zq is not None else 0
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
        ld_dq = _rows_view(k, "dq", dq, tuple(dq.shape))
        check_array(k, "probs", probs, F32, (B, A, N))
        check_array(k, "q", q, F32, (B, A))
    if accumulate_dv and dv is None:
        raise ValueError(f"{k}: accumulate_dv needs dv")
    align = HEAD_ALIGN if padded else 1
    if dv is None:
        dv = output(k, "dv", dv, (B, pad_to(N, align)))
    v_pitch = _rows_view(k, "dv", dv, (B, pad_to(N, align)))
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


# ------------------------------------------------------------------ c51_loss.cu
def c51_target_loss(
    p_next: Array | None,
    reward: Array,
    discount: Array,
    log_probs_taken: Array,
    z: Array,
    entropy_coeff: float | Array,
    *,
    grad_scale: float | None = None,
    next_action: Array | None = None,
    action: Array | None = None,
    offsets: Sequence[int] | None = None,
    dlogits_full: bool = False,
    m: Array | None = None,
    dlogits: Array | None = None,
    loss: Array | None = None,
    entropy: Array | None = None,
    write_m: bool = True,
    m_mean: Array | None = None,
    next_heads: tuple[Array, Array] | None = None,
) -> tuple[Array | None, Array, Array, Array]:
    """C51 target projection (Eq. 7) and the loss ``CE(m, p) - entropy_coeff H(p)`` per (b, d).

    Args:
        p_next: [B, D, N] target distribution of each branch's bootstrap action; or, with
            ``next_action`` [B, D] (absolute action indices, int64), the target network's whole
            [B, A, N] output, read at those actions; or None with ``next_heads``.
        next_heads: ``(v, adv)``, the target network's value head [B, N rounded up to 4] and
            advantage row [B, W] in the GPU network's padded layout (any row pitch; see
            :func:`dueling_softmax_forward`): the kernel forms each bootstrap action's
            distribution itself (the dueling aggregation and softmax of that action alone).
            Needs ``next_action`` and ``offsets``.
        reward, discount: [B]; ``discount = gamma (1 - terminal)``.
        log_probs_taken: [B, D, N] online log-probabilities of the taken actions; or, with
            ``action`` [B, D], the whole [B, A, N] online output read at those actions.
        entropy_coeff: a float, or a float32 device array of one element that the kernel reads
            when it runs (so a captured graph picks up a coefficient changed between replays).
        grad_scale: multiplies the gradient; default ``1 / (B D)`` (the mean over samples and branches).
        offsets, dlogits_full: with ``action`` and ``offsets``, ``dlogits_full=True`` writes the
            gradient as [B, A, N] over every action (zeros off the taken ones).
        write_m: write the projected targets ``m`` (else None is returned for them).
        m_mean: [B, D], receives ``E[m] = sum_i m_i z_i`` when given (the auxiliary loss's target).

    Returns:
        ``(m [B, D, N] or None, dlogits [B, D, N] or [B, A, N], loss [B, D], entropy [B, D])``;
        the loss and the entropy are not scaled.
    """
    k = "c51_target_loss"
    check_array(k, "reward", reward, F32, (None,))
    B = reward.shape[0]
    D = None
    for name, idx in (("next_action", next_action), ("action", action)):
        if idx is not None:
            check_array(k, name, idx, np.int64, (B, None))
            D = idx.shape[1]
    if next_heads is not None:
        if p_next is not None or next_action is None or offsets is None:
            raise ValueError(f"{k}: next_heads replaces p_next and needs next_action and offsets")
        check_array(k, "z", z, F32, (None,))
        N = z.shape[0]
        A = int(offsets[-1])
    else:
        check_array(k, "p_next", p_next, F32, (B, None, None))
        N = p_next.shape[2]
        A = p_next.shape[1] if next_action is not None else None
        if next_action is None:
            D = p_next.shape[1]
    if action is not None:
        check_array(k, "log_probs_taken", log_probs_taken, F32, (B, None, N))
        A = log_probs_taken.shape[1] if A is None else A
        check_array(k, "log_probs_taken", log_probs_taken, F32, (B, A, N))
        check_array(k, "action", action, np.int64, (B, D))
    else:
        check_array(k, "log_probs_taken", log_probs_taken, F32, (B, D, N))
    if next_action is not None:
        check_array(k, "next_action", next_action, np.int64, (B, D))
    check_array(k, "discount", discount, F32, (B,))
    check_array(k, "z", z, F32, (N,))
    defines: dict[str, str] = {"NUM_ATOMS": str(N)}
    v_next = adv_next = None
    v_pitch = adv_pitch = 0
    if dlogits_full or next_heads is not None:
        if dlogits_full and (action is None or offsets is None):
            raise ValueError(f"{k}: dlogits_full needs action and offsets")
        offs = validate_offsets(k, offsets, A)
        if len(offs) - 1 != D:
            raise ValueError(f"{k}: the actions have {D} branches, offsets {offs} have {len(offs) - 1}")
        defines = branch_defines(offs, N, HEAD_ALIGN)
        if next_heads is not None:
            v_next, adv_next = next_heads
            v_pitch = _rows_view(k, "next_heads v", v_next, (B, pad_to(N, HEAD_ALIGN)))
            adv_pitch = _rows_view(k, "next_heads adv", adv_next, (B, head_columns(offs, N, HEAD_ALIGN)[-1]))
    scale = 1.0 / (B * D) if grad_scale is None else float(grad_scale)
    m = output(k, "m", m, (B, D, N)) if write_m else None
    if m_mean is not None:
        check_array(k, "m_mean", m_mean, F32, (B, D))
    dlogits = output(k, "dlogits", dlogits, (B, A, N) if dlogits_full else (B, D, N))
    loss = output(k, "loss", loss, (B, D))
    entropy = output(k, "entropy", entropy, (B, D))
    if isinstance(entropy_coeff, (int, float, np.floating)):
        import cupy

        coeff = cupy.full((1,), entropy_coeff, dtype=F32)
    else:
        coeff = entropy_coeff.reshape(1) if entropy_coeff.ndim == 0 else entropy_coeff
        check_array(k, "entropy_coeff", coeff, F32, (1,))
    fn = _kernel("c51_loss.cu", k, defines)
    fn(
        (blocks_for(B * D, WARPS, ROW_BLOCKS_PER_SM * sm_count()),),  # warps walk several rows
        (THREADS,),
        (p_next, v_next, i32(v_pitch), adv_next, i32(adv_pitch), next_action, reward, discount, log_probs_taken,
         action, z, coeff, f32(scale),
         m, dlogits, loss, entropy, m_mean, i32(B), i32(D), i32(A or 0), i32(int(dlogits_full))),
    )
    return m, dlogits, loss, entropy


# ------------------------------------------------------------------ elementwise.cu
MAX_ELEMENTWISE = 1 << 30  # elementwise.cu indexes with 32-bit integers


def _matrix(k: str, name: str, a: Array) -> tuple[int, int]:
    check_array(k, name, a, F32, (None, None))
    if a.size >= MAX_ELEMENTWISE:
        raise ValueError(f"{k}: {name} has {a.size} elements; the elementwise kernels take fewer than 2^30")
    return a.shape


def _rows_view(k: str, name: str, a: Array, shape: tuple[int, int]) -> int:
    """Row pitch (floats) of ``a``: a [rows, cols] float32 view with unit column stride (e.g. a
    column block of a wider array)."""
    import cupy

    if not isinstance(a, cupy.ndarray):
        raise TypeError(f"{k}: {name} must be a CuPy array, got {type(a).__name__}")
    if a.dtype != F32:
        raise TypeError(f"{k}: {name} must be float32, got {a.dtype}")
    if a.ndim != 2 or tuple(a.shape) != tuple(shape):
        raise ValueError(f"{k}: {name} must be a {list(shape)} float32 matrix, got {list(a.shape)}")
    ld = a.strides[0] // 4
    if a.strides[1] != 4 or ld < shape[1] or a.strides[0] % 4:
        raise ValueError(f"{k}: {name} must have unit column stride and a row pitch of at least {shape[1]}")
    return ld


def _augmented(k: str, name: str, out: Array | None, rows: int, cols: int, width: int | None) -> Array:
    """An output of ``rows`` rows and ``width`` (>= ``cols``) columns: given (checked) or new."""
    width = cols if width is None else int(width)
    if width < cols:
        raise ValueError(f"{k}: width {width} is less than the layer's {cols} columns")
    if width * max(rows, 1) >= MAX_ELEMENTWISE:
        raise ValueError(f"{k}: {name} would have {rows * width} elements; "
                         "the elementwise kernels take fewer than 2^30")
    return output(k, name, out, (rows, width))


def _vec4(*arrays: Array | None) -> bool:
    return all(a is None or a.data.ptr % 16 == 0 for a in arrays)


def _view_out(k: str, name: str, out: Array | None, shape: tuple[int, int]) -> tuple[Array, int]:
    """An output view (any row pitch, unit column stride) of ``shape``, or a new array; and its pitch."""
    if out is None:
        import cupy

        out = cupy.empty(shape, dtype=F32)
    return out, _rows_view(k, name, out, shape)


def _glu_blocks(k: str, pv: Array, blocks: int) -> tuple[int, int, int]:
    """``(B, H, ld_pv)`` of the GLU's input: ``blocks`` joint [gate | value] blocks per row."""
    import cupy

    if not isinstance(pv, cupy.ndarray) or pv.ndim != 2:
        raise ValueError(f"{k}: pv must be a 2-D CuPy array")
    B, cols = pv.shape
    if blocks < 1 or cols % (2 * blocks):
        raise ValueError(f"{k}: pv has {cols} columns; {blocks} joint blocks [gate | value] need a multiple of "
                         f"{2 * blocks}")
    ld = _rows_view(k, "pv", pv, (B, cols))
    if ld * max(B, 1) >= MAX_ELEMENTWISE:
        raise ValueError(f"{k}: pv spans {ld * B} elements; the elementwise kernels take fewer than 2^30")
    return B, cols // (2 * blocks), ld


def glu_forward(pv: Array, *, width: int | None = None, blocks: int = 1, h: Array | None = None) -> Array:
    """GLU over the joint layout: ``pv`` [B, 2H] is ``[u W_gate | u W_val]`` (one GEMM with the
    two weights side by side, biases included). Returns ``h = sigmoid(gate pre-activation) * value``
    [B, H], or with ``width`` > H the augmented ``[h, 0, ..., 0, 1]`` [B, width] (the input of a
    GEMM whose weight block keeps the bias in its last row). ``blocks`` branches side by side:
    ``pv`` [B, blocks 2H] gives ``h`` [B, blocks width]. ``pv`` and ``h`` may be views with any
    row pitch (column blocks of wider arrays)."""
    k = "glu_forward"
    B, H, ld_pv = _glu_blocks(k, pv, blocks)
    W = H if width is None else int(width)
    if W < H:
        raise ValueError(f"{k}: width {W} is less than the layer's {H} columns")
    h, ld_h = _view_out(k, "h", h, (B, blocks * W))
    vec4 = H % 4 == 0 and W % 4 == 0 and ld_pv % 4 == 0 and ld_h % 4 == 0 and _vec4(pv, h)
    total = B * blocks * W
    _kernel("elementwise.cu", k + "_vec4" if vec4 else k)(
        (_elementwise_grid(total // 4 if vec4 else total),), (THREADS,),
        (pv, i32(ld_pv), h, i32(ld_h), i64(total), i32(H), i32(W), i32(blocks)))
    return h


GLU_GEMM_ROWS, GLU_GEMM_COLS, GLU_GEMM_THREADS = value("TC_BM"), value("GW_BH"), value("TC_THREADS")
GLU_GEMM_BOX_K = value("TC_BK")  # columns of K per TMA box (one 128-byte swizzle row)
GLU_GEMM_STAGES = value("GW_STAGES")
# h's boxes (32 columns x 128 rows, 16 KiB) glu_gemm.cu's staging buffer holds, and how many of them
# a hand-off to the TMA unit takes (GW_STAGED_BOXES, GW_STORE_BOXES): the tile's four at once take
# 64 KiB, which leaves room for three stages only; two used in turn, one at a time, make room for a
# fourth.
GLU_GEMM_STAGED_BOXES, GLU_GEMM_STORE_BOXES = value("GW_STAGED_BOXES"), value("GW_STORE_BOXES")
GLU_GEMM_CLUSTER = value("GW_CLUSTER")  # CTAs per cluster, sharing their weight loads (TMA multicast)
_BIG_SMEM: set[int] = set()  # (ids of) the kernels given their shared memory limit
SMEM_LIMIT = 227 * 1024  # a Hopper block's shared memory, at most
TILE_A = GLU_GEMM_ROWS * GLU_GEMM_BOX_K * 4  # a stage's rows of A (TC_TILE_A): 16 KiB
BOX = GLU_GEMM_ROWS * 128  # a box of 32 columns x 128 rows: 16 KiB


@dataclass(frozen=True)
class GluGemmConfig:
    """How :func:`glu_gemm`'s kernel is built: its ring of shared-memory stages, h's staging buffer
    (boxes of 32 columns x 128 rows, 16 KiB) and how many boxes a hand-off to the TMA unit takes,
    the CTAs per cluster (sharing their weight loads by TMA multicast), and whether pv leaves
    through the staging buffer by TMA stores where TMA can address it (16-byte aligned, a row pitch
    of a multiple of 4 floats; otherwise, or with ``pv_tma`` off, from the registers). The default
    is the table's: four stages beside two boxes used in turn, one at a time (the tile's four at
    once, 64 KiB, leave room for three stages only)."""

    stages: int = GLU_GEMM_STAGES
    staged_boxes: int = GLU_GEMM_STAGED_BOXES
    store_boxes: int = GLU_GEMM_STORE_BOXES
    cluster: int = GLU_GEMM_CLUSTER
    pv_tma: bool = True
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


def glu_gemm_supported(H: int | None = None) -> bool:
    """Whether :func:`glu_gemm` runs on the current device (Hopper's wgmma and TMA: compute
    capability 9.0) and, given ``H``, GLUs of that width (a multiple of its 128-column tile)."""
    from ..backend import compute_capability

    return compute_capability() == "90" and (H is None or H % GLU_GEMM_COLS == 0)


def _tc_operands(k: str, names: str, arrays: Sequence[Any]) -> None:
    """The checks every tensor-core kernel's wrapper starts with: ``arrays`` (called ``names`` in
    the message) are 2-D CuPy arrays, and the device has wgmma (:func:`glu_gemm_supported`)."""
    import cupy

    if not all(isinstance(x, cupy.ndarray) and x.ndim == 2 for x in arrays):
        raise ValueError(f"{k}: {names} must be 2-D CuPy arrays")
    if not glu_gemm_supported():
        raise RuntimeError(f"{k}: needs a compute capability 9.0 GPU (wgmma)")


def transpose(w: Array, *, out: Array | None = None) -> Array:
    """``w.T`` rounded to TF32 (to nearest, as cuBLAS rounds its TF32 operands) as a new row-major
    array (``out`` [N, K] may be a view with any row pitch): the weights as :func:`glu_gemm`
    reads them."""
    k = "transpose_tile"
    if getattr(w, "ndim", 0) != 2:
        raise ValueError(f"{k}: w must be a 2-D CuPy array")
    K, N = w.shape
    ld_w = _rows_view(k, "w", w, (K, N))
    out, ld_out = _view_out(k, "out", out, (N, K))
    if K and N:
        _kernel("glu_gemm.cu", k)((-(-N // 32), -(-K // 32)), (32, 8), (w, i32(ld_w), out, i32(ld_out), i32(K), i32(N)))
    return out


def glu_gemm(u: Array, w: Array, *, bias: Array | None = None, width: int | None = None, blocks: int = 1,
             h: Array | None = None, pv: Array | None = None, wt: Array | None = None, rounded: int = 0,
             tf32_h: bool = False, config: GluGemmConfig | None = None) -> Array:
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
    readers that are TF32 GEMMs (:func:`linear_gemm` with ``rounded``)."""
    k = "glu_gemm"
    cfg = config if config is not None else GluGemmConfig()
    _tc_operands(k, "u and w", (u, w))
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
    _rows_view(k, "u", u, (B, K))
    if wt is None:
        wt = transpose(w)
    _rows_view(k, "wt", wt, (cols, K))
    if bias is not None:
        check_array(k, "bias", bias, F32, (cols,))
    h, ld_h = _view_out(k, "h", h, (B, blocks * W))
    pv_rows, ld_pv = 0, 0
    if pv is not None:
        pv_rows = pv.shape[0] if getattr(pv, "ndim", 0) == 2 else -1
        if not 0 <= pv_rows <= B:
            raise ValueError(f"{k}: pv must be [at most {B}, {cols}], got {list(getattr(pv, 'shape', ()))}")
        ld_pv = _rows_view(k, "pv", pv, (pv_rows, cols))
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
    fn = _kernel(cfg.source, k, {"GW_STAGES": cfg.stages, "GW_CLUSTER": c, "GW_TAIL_STEPS": tail,
                                    "GW_ROUND_H": int(bool(tf32_h)), "GW_STAGED_BOXES": cfg.staged_boxes,
                                    "GW_STORE_BOXES": cfg.store_boxes, "GW_PV_TMA": int(pv_tma)})
    smem = cfg.smem
    if id(fn) not in _BIG_SMEM:  # opt in to more than 48 KiB of shared memory (once per compiled kernel)
        fn.max_dynamic_shared_size_bytes = smem
        _BIG_SMEM.add(id(fn))
    groups = blocks * (H // GLU_GEMM_COLS) * -(-B // (GLU_GEMM_ROWS * c))  # c row tiles of one column tile
    clusters = min(groups, tma.max_active_clusters(k, fn, GLU_GEMM_THREADS, smem, c))  # all resident (persistent)
    fn((clusters * c,), (GLU_GEMM_THREADS,),
       (map_u, map_wt, map_h, map_pv, bias, h, i32(ld_h), pv, i32(ld_pv), i32(pv_rows), i32(B), i32(K), i32(H),
        i32(W), i32(blocks), i32(rounded)), shared_mem=smem)
    return h


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


def _linear_gemm_smem(dueling: bool = False, cols: int = LINEAR_GEMM_COLS, stages: int = LINEAR_GEMM_STAGES) -> int:
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
    M, K, N = _linear_operands(k, a, wt, bias, rounded)
    if out is not None and len(out) != len(a):
        raise ValueError(f"{k}: {len(out)} outputs for {len(a)} sets of a")
    outs = [_view_out(k, f"out[{i}]", None if out is None else out[i], (M, N))[0] for i in range(len(a))]
    if M:
        _linear_launch(k, a, wt, outs, bias, (M, K, N), rounded,
                       {"LG_RELU": int(bool(relu)), "LG_ROUND_OUT": int(bool(tf32_out))}, config=config)
    return outs


def _linear_operands(k: str, a: Sequence[Array], wt: Sequence[Array], bias: Sequence[Array | None] | None,
                     rounded: int) -> tuple[int, int, int]:
    """linear_gemm's operands checked (see :func:`linear_gemm`): ``(M, K, N)``."""
    sets = len(a)
    if not 1 <= sets <= LINEAR_GEMM_SETS or len(wt) != sets or (bias is not None and len(bias) != sets):
        raise ValueError(f"{k}: 1 to {LINEAR_GEMM_SETS} sets of a, wt (and bias), got {sets} a, {len(wt)} wt")
    _tc_operands(k, "a and wt", (*a, *wt))
    M, K = a[0].shape
    N = wt[0].shape[0]
    if N % 2 or K % 4 or K <= 0 or N <= 0:
        raise ValueError(f"{k}: needs N even and K a positive multiple of 4; got N {N}, K {K}")
    if not 0 <= rounded <= K:
        raise ValueError(f"{k}: rounded {rounded} outside 0..{K} (a's columns)")
    for i in range(sets):
        _rows_view(k, f"a[{i}]", a[i], (M, K))
        _rows_view(k, f"wt[{i}]", wt[i], (N, K))
        b = None if bias is None else bias[i]
        if b is not None:
            check_array(k, f"bias[{i}]", b, F32, (N,))
            if b.data.ptr % 8:
                raise ValueError(f"{k}: bias[{i}] needs 8-byte alignment")
    return M, K, N


def _linear_launch(k: str, a: Sequence[Array], wt: Sequence[Array], outs: Sequence[Array] | None,
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
    smem = _linear_gemm_smem(dueling, cols, cfg.stages)
    if id(fn) not in _BIG_SMEM:  # opt in to more than 48 KiB of shared memory (once per compiled kernel)
        fn.max_dynamic_shared_size_bytes = smem
        _BIG_SMEM.add(id(fn))
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
    M, K, N = _linear_operands(k, [a], [wt], None, rounded)
    lds = []
    for name, x in (("y", y), ("addend", addend)):
        if x is None:
            lds.append(0)
            continue
        lds.append(_rows_view(k, name, x, (M, N)))
        if lds[-1] % 2 or x.data.ptr % 8:  # (read as float2)
            raise ValueError(f"{k}: {name} needs 8-byte alignment and an even row pitch")
    ld_y, ld_addend = lds
    out, _ = _view_out(k, "out", out, (M, N))
    if M:
        _linear_launch(k, [a], [wt], [out], None, (M, K, N), rounded,
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
    M, K, n = _linear_operands(k, a, wt, bias, rounded)
    if n != cols[d0 + 1] - cols[d0]:
        raise ValueError(f"{k}: wt has {n} rows, branch {d0}'s advantage block {cols[d0 + 1] - cols[d0]} columns")
    segs = [tuple(w) for w in segments]
    if not 1 <= len(segs) <= 10 or seg_rows <= 0 or len(segs) * seg_rows > M:
        raise ValueError(f"{k}: {len(segs)} segments of {seg_rows} rows (1 to 10 segments within the {M} rows)")
    duel_rows = len(segs) * seg_rows
    v_pitch = _rows_view(k, "v", v, (M, pad_to(N, HEAD_ALIGN)))
    seg_wants, log_probs, probs, q, var = _dueling_outputs(k, segs, seg_rows, A, N, log_probs, probs, q, var)
    zq_pitch = _rows_view(k, "zq", zq, (duel_rows, offs[1])) if zq is not None else 0
    outs = None
    if adv is not None:
        if len(adv) != len(a):
            raise ValueError(f"{k}: {len(adv)} adv outputs for {len(a)} sets")
        outs = [_view_out(k, f"adv[{i}]", x, (M, n))[0] for i, x in enumerate(adv)]
    ptr = [0 if x is None else x.data.ptr for x in (v, z, log_probs, probs, q, var, zq)]
    du = np.array([(*ptr, zq_pitch, zq_scale, v_pitch, d0, duel_rows, seg_rows, seg_wants, int(outs is not None))],
                  dtype=DUELING_ARGS)
    staged = {"LG_DUELING_STAGED": 0} if straight else {}  # (else the layout's default)
    _linear_launch(k, a, wt, outs, bias, (M, K, n), rounded,
                   {"LG_RELU": 0, "LG_ROUND_OUT": 0, "LG_DUELING": 1, **staged, **branch_defines(offs, N, HEAD_ALIGN)},
                   (du,), config=config)
    return log_probs, probs, q, var


GLU_BACKWARD_GEMM_SETS = value("GB_SETS")  # branches per launch, at most
GLU_BACKWARD_GEMM_STAGES = value("GB_STAGES")
GLU_BACKWARD_GEMM_THREADS = value("GB_THREADS")  # the consumers, the ring's producer, pv's loader and storer
GLU_BACKWARD_GEMM_PARTS = value("GB_PARTS")  # the staging buffer's parts, three mbarriers each
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


def _glu_backward_gemm_smem() -> int:
    return GluBackwardGemmConfig().smem


def round_tf32(x: Array, *, out: Array | None = None) -> Array:
    """``x`` [rows, cols] (any row pitch) rounded to TF32, to nearest (as cuBLAS rounds its TF32
    operands): the advantage heads' weights as :func:`glu_backward_gemm` reads them."""
    k = "round_tf32"
    if getattr(x, "ndim", 0) != 2:
        raise ValueError(f"{k}: x must be a 2-D CuPy array")
    ld_x = _rows_view(k, "x", x, tuple(x.shape))
    out, ld_out = _view_out(k, "out", out, tuple(x.shape))
    if x.size:
        _kernel("glu_backward_gemm.cu", k)((_elementwise_grid(x.size),), (THREADS,),
                                           (x, i32(ld_x), out, i32(ld_out), i32(x.shape[0]), i32(x.shape[1])))
    return out


GLU_BACKWARD_GEMM_DQ_COLS = value("GB_NQ_MAX")  # dq's columns, at most
GLU_BACKWARD_GEMM_DQ_H = 2 * value("GB_BH")  # dq's widest GLU: two column tiles, whose sums add exactly in either order


def glu_backward_gemm(dadv: Sequence[Array], wo: Sequence[Array], pv: Array, *, dq: Array | None = None,
                      wq: Array | None = None, dq_set: int = 0, config: GluBackwardGemmConfig | None = None,
                      ctas: int | None = None) -> Array:
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

    ``config``: how the kernel is built (:class:`GluBackwardGemmConfig`); ``ctas``: the persistent
    grid's CTAs, at most one per tile (default: one per SM)."""
    k = "glu_backward_gemm"
    cfg = config if config is not None else GluBackwardGemmConfig()
    sets = len(dadv)
    if not 1 <= sets <= GLU_BACKWARD_GEMM_SETS or len(wo) != sets:
        raise ValueError(f"{k}: 1 to {GLU_BACKWARD_GEMM_SETS} branches of dadv and wo, got {sets} dadv, {len(wo)} wo")
    _tc_operands(k, "dadv, wo and pv", (*dadv, *wo, pv))
    M, Kd = dadv[0].shape
    H = wo[0].shape[0]
    if H % GLU_GEMM_COLS or Kd % 4 or Kd <= 0:
        raise ValueError(f"{k}: needs H a multiple of {GLU_GEMM_COLS} and K a positive multiple of 4; got H {H}, "
                         f"K {Kd}")
    for i in range(sets):
        _rows_view(k, f"dadv[{i}]", dadv[i], (M, Kd))
        _rows_view(k, f"wo[{i}]", wo[i], (H, Kd))
    _rows_view(k, "pv", pv, (M, sets * 2 * H))
    nq, ld_dq, ld_wq = 0, 0, 0
    if (dq is None) != (wq is None):
        raise ValueError(f"{k}: dq and wq go together")
    if dq is not None:
        _tc_operands(k, "dq and wq", (dq, wq))
        nq = wq.shape[0]
        if not 1 <= nq <= GLU_BACKWARD_GEMM_DQ_COLS:
            raise ValueError(f"{k}: wq must have 1 to {GLU_BACKWARD_GEMM_DQ_COLS} rows, got {nq}")
        if H > GLU_BACKWARD_GEMM_DQ_H:
            raise ValueError(f"{k}: dq needs H up to {GLU_BACKWARD_GEMM_DQ_H} (two column tiles), got {H}")
        if not 0 <= dq_set < sets:
            raise ValueError(f"{k}: dq_set must name one of the {sets} branches, got {dq_set}")
        ld_wq = _rows_view(k, "wq", wq, (nq, 2 * H))
        ld_dq = _rows_view(k, "dq", dq, (M, nq))
        dq.fill(0.0)
    if M == 0:
        return pv
    args = np.zeros(1, dtype=GLU_BACK_ARGS)
    for i in range(sets):
        args["maps"][0, i] = tma.matrix_map(k, f"dadv[{i}]", dadv[i], GLU_GEMM_BOX_K, GLU_GEMM_ROWS)["opaque"][0]
        args["maps"][0, GLU_BACKWARD_GEMM_SETS + i] = tma.matrix_map(
            k, f"wo[{i}]", wo[i], GLU_GEMM_BOX_K, GLU_GEMM_COLS)["opaque"][0]
    args["maps"][0, 2 * GLU_BACKWARD_GEMM_SETS] = tma.matrix_map(
        k, "pv", pv, GLU_GEMM_BOX_K, GLU_GEMM_ROWS)["opaque"][0]
    tail = (Kd - 1) % GLU_GEMM_BOX_K // 8 + 1  # k steps of 8 in the last chunk (a variant per count)
    fn = _kernel("glu_backward_gemm.cu", k, {"GB_STAGES": cfg.stages, "GB_TAIL_STEPS": tail, "GB_NQ": nq})
    smem = cfg.smem
    if id(fn) not in _BIG_SMEM:  # opt in to more than 48 KiB of shared memory (once per compiled kernel)
        fn.max_dynamic_shared_size_bytes = smem
        _BIG_SMEM.add(id(fn))
    tiles = sets * (H // GLU_GEMM_COLS) * -(-M // GLU_GEMM_ROWS)
    fn((min(tiles, sm_count() if ctas is None else int(ctas)),), (GLU_BACKWARD_GEMM_THREADS,),
       (args, i32(M), i32(Kd), i32(H), i32(sets), dq, i32(ld_dq), wq, i32(ld_wq), i32(dq_set)), shared_mem=smem)
    return pv


WGRAD_GEMM_ROWS = value("WG_ROWS")  # wgrad_gemm.cu's N per tile: one wgmma of 256 columns and one of 8
WGRAD_GEMM_BOX_ROWS = value("WG_BOX_ROWS")  # xt's rows per TMA box
WGRAD_GEMM_STAGES = value("WG_STAGES")
WGRAD_GEMM_THREADS = value("WG_THREADS")  # two consumer warpgroups and the producer's
WGRAD_GEMM_MIN_CHUNKS = 4  # each slice of the batch at least this many 32-row chunks


@dataclass(frozen=True)
class WgradGemmConfig:
    """How :func:`wgrad_gemm`'s kernels (and :func:`wgrad_gemm_sets`', built from the same file) are
    built: wgrad_gemm's shared-memory stages (the table's four)."""

    stages: int = WGRAD_GEMM_STAGES

    def __post_init__(self) -> None:
        if self.stages < 3 or self.smem > SMEM_LIMIT:
            raise ValueError(f"wgrad_gemm: {self.stages} stages (at least 3) do not fit 227 KiB")

    @property
    def smem(self) -> int:
        """Bytes of shared memory of wgrad_gemm: its stages (16 KiB of y and 33 KiB of xt each), two
        mbarriers per stage, the 1024-byte alignment of the swizzled tiles."""
        return self.stages * (TILE_A + WGRAD_GEMM_ROWS * GLU_GEMM_BOX_K * 4) + 16 * self.stages + 1024


def _wgrad_gemm_smem() -> int:
    return WgradGemmConfig().smem


def wgrad_gemm_supported(n: int | None = None) -> bool:
    """Whether :func:`wgrad_gemm` runs on the current device (as :func:`glu_gemm_supported`) and,
    given ``n``, for a layer input that wide: more than 256 and at most 264 columns (one tile: the
    network's augmented z is 260)."""
    return glu_gemm_supported() and (n is None or 256 < n <= WGRAD_GEMM_ROWS)


def wgrad_splits(K: int, M: int, sets: int = 1) -> tuple[int, int]:
    """``(splits, k_split)``: the slices of the batch ``K`` (``k_split`` rows each, a multiple of
    32; the last may be shorter) for ``M`` output columns of each of ``sets`` products, so that the
    CTAs (128 columns of one set by one slice each) fill the device's SMs about once."""
    tiles, chunks = sets * -(-M // GLU_GEMM_ROWS), -(-K // GLU_GEMM_BOX_K)
    splits = max(1, min(max(1, chunks // WGRAD_GEMM_MIN_CHUNKS), round(sm_count() / tiles)))
    k_split = -(-chunks // splits) * GLU_GEMM_BOX_K
    return -(-K // k_split), k_split


def wgrad_gemm(xt: Array, y: Array, *, out: Array | None = None, zero_rows: tuple[int, int] = (0, 0),
               keep_cols: tuple[int, int] = (0, 0), config: WgradGemmConfig | None = None) -> Array:
    """A weight gradient over the batch: ``out`` [N, M] = ``xt @ y`` = ``x.T @ y`` on the TF32
    tensor cores (wgmma; see :func:`wgrad_gemm_supported`; both operands rounded to TF32 to
    nearest, as cuBLAS does, the products accumulated in float32), rows ``zero_rows`` then zero
    outside columns ``keep_cols``.

    ``xt`` [N, K]: the layer's input ``x`` [K, N] transposed and rounded to TF32
    (:func:`transpose`); ``y`` [K, M] the gradient of the layer's output; K the batch, split over
    the CTAs (:func:`wgrad_splits`) and the slices' partial sums added in a fixed order, so that the
    result does not depend on timing. ``xt`` and ``y`` (moved by TMA) may be views with row
    pitches of a multiple of 4 floats, 16-byte aligned; ``out`` (new when not given) any view.
    ``config``: how the kernel is built (:class:`WgradGemmConfig`)."""
    import cupy

    k = "wgrad_gemm"
    cfg = config if config is not None else WgradGemmConfig()
    _tc_operands(k, "xt and y", (xt, y))
    N, K = xt.shape
    M = y.shape[1]
    if y.shape[0] != K:
        raise ValueError(f"{k}: xt has {K} columns but y has {y.shape[0]} rows")
    if not 256 < N <= WGRAD_GEMM_ROWS:
        raise ValueError(f"{k}: xt needs more than 256 and at most {WGRAD_GEMM_ROWS} rows, got {N}")
    if K % 4 or M % 4:
        raise ValueError(f"{k}: needs K and M multiples of 4; got K {K}, M {M}")
    if not (0 <= zero_rows[0] <= zero_rows[1] <= N and 0 <= keep_cols[0] <= keep_cols[1] <= M):
        raise ValueError(f"{k}: zero_rows {zero_rows} or keep_cols {keep_cols} outside [{N}, {M}]")
    _rows_view(k, "xt", xt, (N, K))
    _rows_view(k, "y", y, (K, M))
    out, ld_out = _view_out(k, "out", out, (N, M))
    if M == 0:
        return out
    if K == 0:
        out[...] = 0.0
        return out
    splits, k_split = wgrad_splits(K, M)
    tiles = -(-M // GLU_GEMM_ROWS)
    part = cupy.empty((splits, WGRAD_GEMM_ROWS, tiles * GLU_GEMM_ROWS), dtype=F32)
    map_y = tma.matrix_map(k, "y", y, GLU_GEMM_BOX_K, GLU_GEMM_BOX_K)
    map_xt = tma.matrix_map(k, "xt", xt, GLU_GEMM_BOX_K, WGRAD_GEMM_BOX_ROWS)
    fn = _kernel("wgrad_gemm.cu", k, {"WG_STAGES": cfg.stages})
    smem = cfg.smem
    if id(fn) not in _BIG_SMEM:  # opt in to more than 48 KiB of shared memory (once per compiled kernel)
        fn.max_dynamic_shared_size_bytes = smem
        _BIG_SMEM.add(id(fn))
    fn((tiles * splits,), (WGRAD_GEMM_THREADS,), (map_y, map_xt, part, i32(K), i32(M), i32(k_split), i32(tiles)),
       shared_mem=smem)
    _wgrad_reduce(part, [out], ld_out, splits, tiles, N, M, cfg, zero_rows, keep_cols)
    return out


# wgrad_gemm.cu's OutSets: wgrad_reduce's output pointers; WgradSets: wgrad_gemm_tx's tensor maps.
WGRAD_SETS = value("WT_SETS")
OUT_SETS = np.dtype([("out", np.uint64, (WGRAD_SETS,))])
WGRAD_SETS_ARGS = np.dtype([("maps", np.uint64, (2 * WGRAD_SETS, 16))])
WGRAD_GEMM_TX_STAGES = value("WT_STAGES")


def _wgrad_reduce(part: Array, outs: Sequence[Array], ld_out: int, splits: int, tiles: int, N: int, M: int,
                  cfg: WgradGemmConfig, zero_rows: tuple[int, int] = (0, 0),
                  keep_cols: tuple[int, int] = (0, 0)) -> None:
    """wgrad_reduce: each set's slices of the batch summed in order into its output."""
    ptrs = np.zeros(1, dtype=OUT_SETS)
    for i, o in enumerate(outs):
        ptrs["out"][0, i] = o.data.ptr
    _kernel("wgrad_gemm.cu", "wgrad_reduce", {"WG_STAGES": cfg.stages})(
        (_elementwise_grid(len(outs) * N * M),), (THREADS,),
        (part, i32(len(outs)), i32(splits), i32(tiles * GLU_GEMM_ROWS), ptrs, i32(ld_out), i32(N), i32(M),
         i32(zero_rows[0]), i32(zero_rows[1]), i32(keep_cols[0]), i32(keep_cols[1])))


def _wgrad_gemm_tx_smem() -> int:
    """Bytes of shared memory of wgrad_gemm_tx: its stages (16 KiB of y, 36 KiB of x as loaded: nine
    boxes of 32 columns), the two transposed buffers (33 KiB each), the mbarriers, the alignment
    (222 KiB in all)."""
    raw = -(-WGRAD_GEMM_ROWS // 32) * GLU_GEMM_BOX_K * 128
    return (WGRAD_GEMM_TX_STAGES * (TILE_A + raw) + 2 * WGRAD_GEMM_ROWS * GLU_GEMM_BOX_K * 4
            + 16 * WGRAD_GEMM_TX_STAGES + 1024)


def wgrad_gemm_sets(x: Sequence[Array], y: Sequence[Array], out: Sequence[Array], *,
                    config: WgradGemmConfig | None = None) -> list[Array]:
    """Up to :data:`WGRAD_SETS` weight gradients over the batch in one launch, ``out[b]`` [N, M] =
    ``x[b].T @ y[b]``, with ``x[b]`` [K, N] as the layer's input is (batch-major: the advantage
    heads' h, which no pass transposes) and ``y[b]`` [K, M]: as :func:`wgrad_gemm`, x transposed in
    shared memory by the kernel (``wgrad_gemm_tx``). Every matrix may be a view (x and y with row
    pitches of a multiple of 4 floats, 16-byte aligned; the outputs with one row pitch for all);
    256 < N <= 264, M a multiple of 4; ``config`` as for :func:`wgrad_gemm` (the kernels' file)."""
    import cupy

    k = "wgrad_gemm_tx"
    cfg = config if config is not None else WgradGemmConfig()
    sets = len(x)
    if not 1 <= sets <= WGRAD_SETS or len(y) != sets or len(out) != sets:
        raise ValueError(f"{k}: 1 to {WGRAD_SETS} sets of x, y and out, got {sets} x, {len(y)} y, {len(out)} out")
    _tc_operands(k, "x, y and out", (*x, *y, *out))
    K, N = x[0].shape
    M = y[0].shape[1]
    if not 256 < N <= WGRAD_GEMM_ROWS:
        raise ValueError(f"{k}: x needs more than 256 and at most {WGRAD_GEMM_ROWS} columns, got {N}")
    if M % 4:
        raise ValueError(f"{k}: needs M a multiple of 4, got {M}")
    lds = set()
    for i in range(sets):
        _rows_view(k, f"x[{i}]", x[i], (K, N))
        _rows_view(k, f"y[{i}]", y[i], (K, M))
        lds.add(_rows_view(k, f"out[{i}]", out[i], (N, M)))
    if len(lds) != 1:
        raise ValueError(f"{k}: the outputs need one row pitch, got {sorted(lds)}")
    if M == 0:
        return list(out)
    if K == 0:
        for o in out:
            o[...] = 0.0
        return list(out)
    splits, k_split = wgrad_splits(K, M, sets)
    tiles = -(-M // GLU_GEMM_ROWS)
    part = cupy.empty((sets, splits, WGRAD_GEMM_ROWS, tiles * GLU_GEMM_ROWS), dtype=F32)
    args = np.zeros(1, dtype=WGRAD_SETS_ARGS)
    for i in range(sets):
        args["maps"][0, i] = tma.matrix_map(k, f"y[{i}]", y[i], GLU_GEMM_BOX_K, GLU_GEMM_BOX_K)["opaque"][0]
        args["maps"][0, WGRAD_SETS + i] = tma.matrix_map(k, f"x[{i}]", x[i], GLU_GEMM_BOX_K,
                                                         GLU_GEMM_BOX_K)["opaque"][0]
    fn = _kernel("wgrad_gemm.cu", k, {"WG_STAGES": cfg.stages})
    smem = _wgrad_gemm_tx_smem()
    if id(fn) not in _BIG_SMEM:
        fn.max_dynamic_shared_size_bytes = smem
        _BIG_SMEM.add(id(fn))
    fn((sets * tiles * splits,), (WGRAD_GEMM_THREADS,),
       (args, part, i32(K), i32(M), i32(k_split), i32(tiles), i32(splits)), shared_mem=smem)
    _wgrad_reduce(part, out, lds.pop(), splits, tiles, N, M, cfg)
    return list(out)


def glu_backward(dh: Array, pv: Array, *, blocks: int = 1, dpv: Array | None = None) -> Array:
    """Backward of :func:`glu_forward` from its input (the gate and value are recomputed, the
    forward keeps nothing else): ``dpv`` [B, blocks 2H] = ``[d gate pre-activation | d value]``
    per branch, with ``dpre = dh * val * gate * (1 - gate)``, ``dval = dh * gate``, from ``dh``
    [B, blocks H]. ``dpv=pv`` runs in place; every array may be a view with any row pitch."""
    k = "glu_backward"
    B, H, ld_pv = _glu_blocks(k, pv, blocks)
    ld_dh = _rows_view(k, "dh", dh, (B, blocks * H))
    dpv, ld_dpv = _view_out(k, "dpv", dpv, (B, blocks * 2 * H))
    vec4 = H % 4 == 0 and ld_pv % 4 == 0 and ld_dh % 4 == 0 and ld_dpv % 4 == 0 and _vec4(dh, pv, dpv)
    total = B * blocks * H
    _kernel("elementwise.cu", k + "_vec4" if vec4 else k)(
        (_elementwise_grid(total // 4 if vec4 else total),), (THREADS,),
        (dh, i32(ld_dh), pv, i32(ld_pv), dpv, i32(ld_dpv), i64(total), i32(H), i32(blocks)))
    return dpv


def bias_relu_forward(x: Array, bias: Array, *, out: Array | None = None) -> Array:
    """``relu(x + bias)`` for ``x`` [B, H] (the GEMM output), ``bias`` [H]; ``out=x`` runs in place."""
    k = "bias_relu_forward"
    B, H = _matrix(k, "x", x)
    check_array(k, "bias", bias, F32, (H,))
    out = output(k, "out", out, (B, H))
    total = B * H
    _kernel("elementwise.cu", k)((_elementwise_grid(total),), (THREADS,), (x, bias, out, i64(total), i32(H)))
    return out


def relu_backward(dy: Array, y: Array, *, addend: Array | None = None, out: Array | None = None) -> Array:
    """``(dy + addend) * (y > 0)`` from the ReLU's output ``y``; ``addend`` is optional."""
    k = "relu_backward"
    B, H = _matrix(k, "dy", dy)
    check_array(k, "y", y, F32, (B, H))
    if addend is not None:
        check_array(k, "addend", addend, F32, (B, H))
    out = output(k, "out", out, (B, H))
    total = B * H
    _kernel("elementwise.cu", k)((_elementwise_grid(total),), (THREADS,), (dy, y, addend, out, i64(total)))
    return out


def vsn_forward(
    h2: Array, mpre: Array, *, width: int | None = None, keep_rows: int | None = None,
    m: Array | None = None, z: Array | None = None, tf32: bool = False,
) -> tuple[Array | None, Array]:
    """Variable-selection mask: ``m = sigmoid(mpre)``, ``z = h2 * m``; returns ``(m, z)``.

    ``width`` > H gives the augmented ``z`` = ``[h2 * m, 0, ..., 0, 1]`` [B, width]. ``m`` is
    written for the first ``keep_rows`` rows (default all; the rows a backward will read) and
    is None for ``keep_rows=0``. With ``tf32`` z is written rounded to TF32, to nearest
    (:func:`.reference.tf32_nearest`): where only TF32 GEMMs read it, which round it so anyway,
    :func:`glu_gemm` then need not (its ``rounded``)."""
    k = "vsn_forward"
    B, H = _matrix(k, "h2", h2)
    check_array(k, "mpre", mpre, F32, (B, H))
    keep = B if keep_rows is None else int(keep_rows)
    if not 0 <= keep <= B:
        raise ValueError(f"{k}: keep_rows {keep} outside 0..{B}")
    m = output(k, "m", m, (keep, H)) if keep else None
    z = _augmented(k, "z", z, B, H, width)
    W = z.shape[1]
    vec4 = H % 4 == 0 and W % 4 == 0 and _vec4(h2, mpre, m, z)
    total = B * W
    _kernel("elementwise.cu", k + "_vec4" if vec4 else k)(
        (_elementwise_grid(total // 4 if vec4 else total),), (THREADS,),
        (h2, mpre, m, z, i64(total), i32(H), i32(W), i32(keep), i32(bool(tf32))))
    return m, z


def vsn_backward(
    dz: Array, h2: Array, m: Array, *, dh2: Array | None = None, dmpre: Array | None = None, tf32: bool = False
) -> tuple[Array, Array]:
    """``(dh2, dmpre) = (dz * m, dz * h2 * m * (1 - m))`` — the mask's share of ``dh2`` and its
    pre-activation. ``dz`` may be a column block of a wider array (any row pitch). With ``tf32``
    dmpre is written rounded to TF32, to nearest (:func:`.reference.tf32_nearest`), for TF32 GEMMs
    to read as it is (:func:`linear_gemm_relu_backward`'s ``rounded``)."""
    k = "vsn_backward"
    B, H = _matrix(k, "h2", h2)
    ld = _rows_view(k, "dz", dz, (B, H))
    check_array(k, "m", m, F32, (B, H))
    dh2 = output(k, "dh2", dh2, (B, H))
    dmpre = output(k, "dmpre", dmpre, (B, H))
    total = B * H
    _kernel("elementwise.cu", k)((_elementwise_grid(total),), (THREADS,),
                                 (dz, h2, m, dh2, dmpre, i64(total), i32(H), i32(ld), i32(bool(tf32))))
    return dh2, dmpre


def copy(dst: Array, src: Array) -> Array:
    """``dst[...] = src`` for 1-D float32 buffers of one size (flat parameter buffers): a float4
    kernel where both are 16-byte aligned and the size is a multiple of 4, else CuPy's copy."""
    k = "copy"
    check_array(k, "src", src, F32, (None,))
    check_array(k, "dst", dst, F32, src.shape)
    n = src.shape[0]
    if n % 4 or not _vec4(src, dst) or n >= 4 * MAX_ELEMENTWISE:
        dst[...] = src
        return dst
    _kernel("elementwise.cu", "copy_vec4")((_elementwise_grid(n // 4),), (THREADS,), (src, dst, i64(n // 4)))
    return dst


def pack_rows(sources: Sequence[Array], width: int, *, out: Array | None = None) -> Array:
    """The rows of up to three [rows_i, S] sources one after another, each row augmented:
    ``[x, 0, ..., 0, 1]`` [sum rows_i, width] (``width`` > S; ``width`` = S copies them)."""
    k = "pack_rows"
    if not 1 <= len(sources) <= 3:
        raise ValueError(f"{k}: takes one to three sources, got {len(sources)}")
    S = None
    for i, x in enumerate(sources):
        check_array(k, f"sources[{i}]", x, F32, (None, S))
        S = x.shape[1]
    rows = [x.shape[0] for x in sources]
    R = sum(rows)
    out = _augmented(k, "out", out, R, S, width)
    W = out.shape[1]
    xs = list(sources) + [sources[-1]] * (3 - len(sources))
    r1, r2 = rows[0], rows[0] + (rows[1] if len(rows) > 1 else R)
    total = R * W
    _kernel("elementwise.cu", k)((_elementwise_grid(total),), (THREADS,),
                                 (xs[0], xs[1], xs[2], i32(r1), i32(min(r2, R)), out, i64(total), i32(S), i32(W)))
    return out
