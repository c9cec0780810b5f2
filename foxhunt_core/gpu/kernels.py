"""Typed launch wrappers of the core's CUDA kernels (``foxhunt_core/kernels/*.cu``).

Every wrapper checks dtype, shape and contiguity of its arrays (errors name the kernel), accepts
preallocated outputs (keyword arguments named like the outputs) and then neither allocates nor
synchronizes with the host: it only launches on the current CuPy stream, so a sequence of them
can be captured into a CUDA graph and replayed. Without an output argument a new array is
allocated (convenient outside graph capture). Scalars are passed by value as float32/int32.

Kernel: NumPy twin (the oracle of ``tests/gpu``); thread mapping.

- ``dueling_softmax_forward``: ``network.py`` dueling ``V + A - mean A`` (biases added on read),
  ``layers.log_softmax``, ``qpipe.expected_q``; outputs nobody reads can be skipped; a warp per
  (sample, branch).
- ``dueling_backward``: ``network.py`` ``dadv = dl - mean dl``, ``dv = sum_a dl``, with the
  direction-conditioning term of ``expected_q_backward`` optionally fused, over a range of
  branches; a warp per sample.
- ``gather_actions`` / ``scatter_actions``: ``take_along_axis`` / ``put_along_axis`` on zeros at
  the chosen action of each branch; a thread per element.
- ``expected_q_backward``: ``network.py`` ``dq * p * (z - q)``; a thread per element.
- ``c51_target_loss``: ``c51.project`` + ``c51.loss_and_grad`` (gradient / (B D), as
  ``agent.py``), optionally reading the chosen rows of whole outputs and writing the gradient
  over all actions; a warp per (sample, branch).
- ``glu_forward/backward`` (the gate and value GEMM outputs side by side, the backward
  recomputing both), ``bias_relu_forward``, ``relu_backward``, ``vsn_forward/backward``:
  the GLU (with a branch's extra input columns), trunk and VSN lines of ``network.py`` with
  ``layers.sigmoid/relu``; a thread per element (four per thread, ``float4``, for the GLU
  forward where the rows allow).
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
from typing import Any

import numpy as np

from ..backend import check_array
from .launch import (
    DEFAULT_DEFINES,
    HEAD_ALIGN,
    THREADS,
    blocks_for,
    branch_defines,
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
    "bias_relu_forward",
    "boltzmann_select",
    "c51_target_loss",
    "dueling_backward",
    "dueling_softmax_forward",
    "expected_q_backward",
    "glu_backward",
    "gather_actions",
    "glu_forward",
    "q_stats_keys",
    "q_stats_reduce",
    "q_stats_workspace",
    "relu_backward",
    "scatter_actions",
    "vsn_backward",
    "vsn_forward",
]

Array = Any
F32 = np.float32
WARPS = THREADS // 32
ROW_BLOCKS_PER_SM = 4  # blocks per SM of the C51 loss, whose warps walk several rows each


def _elementwise_grid(total: int) -> int:
    return blocks_for(total, THREADS, 32 * sm_count())


# ------------------------------------------------------------------ dueling.cu
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
    log_probs: Array | None = None,
    probs: Array | None = None,
    q: Array | None = None,
    var: Array | None = None,
) -> tuple[Array | None, Array | None, Array, Array | None]:
    """Dueling logits ``v + adv - mean_branch(adv)``, log-softmax over atoms, E[Q] and Var[Q].

    Args:
        v: [B, N] value head; adv: [B, A, N] advantages; z: [N] support. Or the padded layout
            of the GPU network: ``adv`` [B, W] with each branch's block padded to a multiple of
            4 floats (:func:`.launch.head_columns`) and ``v`` [B, N rounded up to 4]; the
            padding is not read.
        offsets: branch boundaries in the action axis.
        branches: ``(first, end)`` to compute only those branches (the rest of the outputs is
            left untouched), e.g. ``(0, 1)`` for the direction branch the magnitude branch reads.
        v_bias, adv_bias: [N] and [A, N] biases added to ``v`` and ``adv`` as they are read.
        want: which outputs to write; ``q`` always. The others not wanted are returned as None.

    Returns:
        ``(log_probs [B, A, N], probs [B, A, N], q [B, A], var [B, A])``.
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
    unknown = set(want) - {"log_probs", "probs", "q", "var"}
    if unknown:
        raise ValueError(f"{k}: unknown outputs {sorted(unknown)} in want")
    check_array(k, "v", v, F32, (B, pad_to(N, align)))
    if v_bias is not None:
        check_array(k, "v_bias", v_bias, F32, (N,))
    if adv_bias is not None:
        check_array(k, "adv_bias", adv_bias, F32, (A, N))
    log_probs = output(k, "log_probs", log_probs, (B, A, N)) if "log_probs" in want else None
    probs = output(k, "probs", probs, (B, A, N)) if "probs" in want else None
    q = output(k, "q", q, (B, A))
    var = output(k, "var", var, (B, A)) if "var" in want else None
    fn = _kernel("dueling.cu", k, branch_defines(offs, N, align))
    grid = blocks_for(B * (d1 - d0), WARPS)
    fn((grid,), (THREADS,), (v, adv, v_bias, adv_bias, z, log_probs, probs, q, var, i32(B), i32(d0), i32(d1)))
    return log_probs, probs, q, var


def dueling_backward(
    dlogits: Array,
    z: Array,
    offsets: Sequence[int],
    *,
    branches: tuple[int, int] | None = None,
    accumulate_dv: bool = False,
    dq: Array | None = None,
    probs: Array | None = None,
    q: Array | None = None,
    dv: Array | None = None,
    dadv: Array | None = None,
    padded: bool = False,
) -> tuple[Array, Array]:
    """Backward of the dueling aggregation: ``(dv [B, N], dadv [B, A, N])``, or with
    ``padded`` in the padded layout of :func:`dueling_softmax_forward` (``dv`` [B, N rounded up
    to 4], ``dadv`` [B, W]) with zeros written into the padding.

    With ``dq`` [B, A] (and the forward's ``probs``, ``q``) the expected-Q gradient
    ``dq * p * (z - q)`` is added to ``dlogits`` first — the magnitude branch's conditioning on the
    direction branch's Q (pass zeros outside the direction branch). ``branches=(first, end)``
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
        check_array(k, "dq", dq, F32, (B, A))
        check_array(k, "probs", probs, F32, (B, A, N))
        check_array(k, "q", q, F32, (B, A))
    if accumulate_dv and dv is None:
        raise ValueError(f"{k}: accumulate_dv needs dv")
    align = HEAD_ALIGN if padded else 1
    dv = output(k, "dv", dv, (B, pad_to(N, align)))
    dadv = output(k, "dadv", dadv, (B, head_columns(offs, N, align)[-1]) if padded else (B, A, N))
    fn = _kernel("dueling.cu", k, branch_defines(offs, N, align))
    fn((blocks_for(B, WARPS),), (THREADS,),
       (dlogits, dq, probs, q, z, dv, dadv, i32(B), i32(d0), i32(d1), i32(int(accumulate_dv))))
    return dv, dadv


def gather_actions(x: Array, action: Array, offsets: Sequence[int], *, out: Array | None = None) -> Array:
    """``out[b, d] = x[b, action[b, d]]`` for ``x`` [B, A] or [B, A, N] and absolute action
    indices ``action`` [B, D] (int64): the rows of the chosen action of every branch."""
    k = "gather_actions"
    return _action_rows(k, x, action, offsets, out, gather=True)


def scatter_actions(vals: Array, action: Array, offsets: Sequence[int], *, out: Array | None = None) -> Array:
    """The inverse of :func:`gather_actions`: ``out`` [B, A(, N)] holds ``vals[b, d]`` at
    ``action[b, d]`` and zeros at every other action (written in one pass, no memset)."""
    k = "scatter_actions"
    return _action_rows(k, vals, action, offsets, out, gather=False)


def _action_rows(k: str, src: Array, action: Array, offsets: Sequence[int], out: Array | None,
                 gather: bool) -> Array:
    if src.ndim not in (2, 3):
        raise ValueError(f"{k}: expected a 2-D or 3-D array, got shape {src.shape}")
    check_array(k, "x" if gather else "vals", src, F32, (None,) * src.ndim)
    check_array(k, "action", action, np.int64, (src.shape[0], None))
    B, D = action.shape
    width = src.shape[2] if src.ndim == 3 else 1
    A = src.shape[1] if gather else int(offsets[-1])
    offs = validate_offsets(k, offsets, A)
    if len(offs) - 1 != D:
        raise ValueError(f"{k}: action has {D} branches, offsets {offs} have {len(offs) - 1}")
    if not gather and src.shape[1] != D:
        raise ValueError(f"{k}: vals has {src.shape[1]} rows per sample, expected {D}")
    rows = D if gather else A
    shape = (B, rows) + ((width,) if src.ndim == 3 else ())
    out = output(k, "out", out, shape)
    total = B * rows * width
    fn = _kernel("dueling.cu", k, branch_defines(offs))
    fn((_elementwise_grid(total),), (THREADS,), (src, action, out, i64(total), i32(width)))
    return out


def expected_q_backward(
    dq: Array, probs: Array, q: Array, z: Array, *, out: Array | None = None, accumulate: bool = False
) -> Array:
    """``dlogits[b, a, j] = dq[b, a] p[b, a, j] (z_j - q[b, a])``; ``accumulate`` adds it to ``out``."""
    k = "expected_q_backward"
    check_array(k, "probs", probs, F32, (None, None, None))
    B, A, N = probs.shape
    check_array(k, "dq", dq, F32, (B, A))
    check_array(k, "q", q, F32, (B, A))
    check_array(k, "z", z, F32, (N,))
    if accumulate and out is None:
        raise ValueError(f"{k}: accumulate=True needs out")
    out = output(k, "out", out, (B, A, N))
    total = B * A * N
    fn = _kernel("dueling.cu", k, {"NUM_ATOMS": N})
    fn((_elementwise_grid(total),), (THREADS,), (dq, probs, q, z, out, i64(total), i32(int(accumulate))))
    return out


# ------------------------------------------------------------------ c51_loss.cu
def c51_target_loss(
    p_next: Array,
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
) -> tuple[Array, Array, Array, Array]:
    """C51 target projection (Eq. 7) and the loss ``CE(m, p) - entropy_coeff H(p)`` per (b, d).

    Args:
        p_next: [B, D, N] target distribution of each branch's bootstrap action; or, with
            ``next_action`` [B, D] (absolute action indices, int64), the target network's whole
            [B, A, N] output, read at those actions.
        reward, discount: [B]; ``discount = gamma (1 - terminal)``.
        log_probs_taken: [B, D, N] online log-probabilities of the taken actions; or, with
            ``action`` [B, D], the whole [B, A, N] online output read at those actions.
        entropy_coeff: a float, or a float32 device array of one element that the kernel reads
            when it runs (so a captured graph picks up a coefficient changed between replays).
        grad_scale: multiplies the gradient; default ``1 / (B D)`` (the mean over samples and branches).
        offsets, dlogits_full: with ``action`` and ``offsets``, ``dlogits_full=True`` writes the
            gradient as [B, A, N] over every action (zeros off the taken ones).

    Returns:
        ``(m [B, D, N], dlogits [B, D, N] or [B, A, N], loss [B, D], entropy [B, D])``; the loss
        and the entropy are not scaled.
    """
    k = "c51_target_loss"
    check_array(k, "reward", reward, F32, (None,))
    B = reward.shape[0]
    D = None
    for name, idx in (("next_action", next_action), ("action", action)):
        if idx is not None:
            check_array(k, name, idx, np.int64, (B, None))
            D = idx.shape[1]
    check_array(k, "p_next", p_next, F32, (B, None, None))
    N = p_next.shape[2]
    A = None
    if next_action is not None:
        A = p_next.shape[1]
    else:
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
    if dlogits_full:
        if action is None or offsets is None:
            raise ValueError(f"{k}: dlogits_full needs action and offsets")
        offs = validate_offsets(k, offsets, A)
        if len(offs) - 1 != D:
            raise ValueError(f"{k}: action has {D} branches, offsets {offs} have {len(offs) - 1}")
        defines = branch_defines(offs, N)
    scale = 1.0 / (B * D) if grad_scale is None else float(grad_scale)
    m = output(k, "m", m, (B, D, N))
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
        (p_next, next_action, reward, discount, log_probs_taken, action, z, coeff, f32(scale),
         m, dlogits, loss, entropy, i32(B), i32(D), i32(A or 0), i32(int(dlogits_full))),
    )
    return m, dlogits, loss, entropy


# ------------------------------------------------------------------ elementwise.cu
MAX_ELEMENTWISE = 1 << 30  # elementwise.cu indexes with 32-bit integers


def _matrix(k: str, name: str, a: Array) -> tuple[int, int]:
    check_array(k, name, a, F32, (None, None))
    if a.size >= MAX_ELEMENTWISE:
        raise ValueError(f"{k}: {name} has {a.size} elements; the elementwise kernels take fewer than 2^30")
    return a.shape


def _glu_args(k: str, pv: Array, bias: Array | None, x_extra: Array | None,
              w_extra: Array | None) -> tuple[int, int, int, Array | None, Array | None]:
    """Checks of the GLU's joint inputs; ``(B, H, E, x_extra, w_extra)`` (None when E = 0)."""
    B, H2 = _matrix(k, "pv", pv)
    if H2 % 2:
        raise ValueError(f"{k}: pv has {H2} columns; the joint layout [gate | value] needs an even number")
    H = H2 // 2
    if bias is not None:
        check_array(k, "bias", bias, F32, (H2,))
    E = 0
    if x_extra is not None:
        E = _matrix(k, "x_extra", x_extra)[1]
        check_array(k, "x_extra", x_extra, F32, (B, E))
        if w_extra is None:
            raise ValueError(f"{k}: x_extra needs w_extra")
        check_array(k, "w_extra", w_extra, F32, (E, H2))
    if E == 0:
        x_extra = w_extra = None
    return B, H, E, x_extra, w_extra


def _glu_launch(k: str, arrays: tuple, H: int, total: int, args: tuple) -> None:
    vec4 = H % 4 == 0 and all(a is None or a.data.ptr % 16 == 0 for a in arrays)
    _kernel("elementwise.cu", k + "_vec4" if vec4 else k)(
        (_elementwise_grid(total // 4 if vec4 else total),), (THREADS,), args + (i64(total), i32(H)))


def glu_forward(
    pv: Array,
    *,
    bias: Array | None = None,
    x_extra: Array | None = None,
    w_extra: Array | None = None,
    h: Array | None = None,
) -> Array:
    """GLU over the joint layout: ``pv`` [B, 2H] is ``[z W_gate | z W_val]`` (one GEMM with the
    two weights side by side), ``bias`` [2H] is ``[b_gate | b_val]``, ``x_extra`` [B, E] are
    further input columns with weights ``w_extra`` [E, 2H]. Returns
    ``h = sigmoid(gate pre-activation) * value`` [B, H]."""
    k = "glu_forward"
    B, H, E, x_extra, w_extra = _glu_args(k, pv, bias, x_extra, w_extra)
    h = output(k, "h", h, (B, H))
    _glu_launch(k, (pv, bias, x_extra, w_extra, h), H, B * H, (pv, bias, x_extra, w_extra, i32(E), h))
    return h


def glu_backward(
    dh: Array,
    pv: Array,
    *,
    bias: Array | None = None,
    x_extra: Array | None = None,
    w_extra: Array | None = None,
    dpv: Array | None = None,
) -> Array:
    """Backward of :func:`glu_forward` from its inputs (the gate and value are recomputed, the
    forward keeps nothing else): ``dpv`` [B, 2H] = ``[d gate pre-activation | d value]``, with
    ``dpre = dh * val * gate * (1 - gate)``, ``dval = dh * gate``. ``dpv=pv`` runs in place."""
    k = "glu_backward"
    B, H, E, x_extra, w_extra = _glu_args(k, pv, bias, x_extra, w_extra)
    check_array(k, "dh", dh, F32, (B, H))
    dpv = output(k, "dpv", dpv, (B, 2 * H))
    _glu_launch(k, (dh, pv, bias, x_extra, w_extra, dpv), H, B * H, (dh, pv, bias, x_extra, w_extra, i32(E), dpv))
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
    h2: Array, mpre: Array, *, bias: Array | None = None, m: Array | None = None, z: Array | None = None,
    keep: bool = True,
) -> tuple[Array | None, Array]:
    """Variable-selection mask: ``m = sigmoid(mpre + bias)``, ``z = h2 * m``; returns ``(m, z)``.
    Without ``keep`` (no backward follows) only ``z`` is written and ``m`` is None."""
    k = "vsn_forward"
    B, H = _matrix(k, "h2", h2)
    check_array(k, "mpre", mpre, F32, (B, H))
    if bias is not None:
        check_array(k, "bias", bias, F32, (H,))
    m = output(k, "m", m, (B, H)) if keep else None
    z = output(k, "z", z, (B, H))
    total = B * H
    vec4 = H % 4 == 0 and all(a is None or a.data.ptr % 16 == 0 for a in (h2, mpre, bias, m, z))
    _kernel("elementwise.cu", k + "_vec4" if vec4 else k)(
        (_elementwise_grid(total // 4 if vec4 else total),), (THREADS,), (h2, mpre, bias, m, z, i64(total), i32(H)))
    return m, z


def vsn_backward(
    dz: Array, h2: Array, m: Array, *, dh2: Array | None = None, dmpre: Array | None = None
) -> tuple[Array, Array]:
    """``(dh2, dmpre) = (dz * m, dz * h2 * m * (1 - m))`` — the mask's share of ``dh2`` and its pre-activation."""
    k = "vsn_backward"
    B, H = _matrix(k, "dz", dz)
    check_array(k, "h2", h2, F32, (B, H))
    check_array(k, "m", m, F32, (B, H))
    dh2 = output(k, "dh2", dh2, (B, H))
    dmpre = output(k, "dmpre", dmpre, (B, H))
    total = B * H
    _kernel("elementwise.cu", k)((_elementwise_grid(total),), (THREADS,), (dz, h2, m, dh2, dmpre, i64(total)))
    return dh2, dmpre
