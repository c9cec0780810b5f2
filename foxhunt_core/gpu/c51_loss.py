"""Launch wrapper of c51_loss.cu: the C51 target projection and the loss with its gradient."""

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
    f32,
    head_columns,
    i32,
    output,
    sm_count,
    validate_offsets,
)
from .launch import get_kernel as _kernel
from .launch import padded as pad_to

Array = Any
WARPS = THREADS // 32
ROW_BLOCKS_PER_SM = 4  # blocks per SM of the C51 loss, whose warps walk several rows each


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
            v_pitch = rows_view(k, "next_heads v", v_next, (B, pad_to(N, HEAD_ALIGN)))
            adv_pitch = rows_view(k, "next_heads adv", adv_next, (B, head_columns(offs, N, HEAD_ALIGN)[-1]))
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

