"""Categorical (C51) distributional RL: support, target projection, loss and its gradient.

Follows Bellemare, Dabney & Munos (2017), "A Distributional Perspective on Reinforcement
Learning", Algorithm 1.

How the target is formed across the four branches
-------------------------------------------------
The network predicts one return distribution per action of each branch (direction, magnitude,
order, urgency), all sharing the value head (per-atom dueling). For a transition
``(s, a = (a_0..a_3), r, s', terminal)`` each branch ``d`` gets its own target:

1. selection (double DQN): ``a*_d = argmax_a Q^online_coord(s')[d, a]`` — the coordinated
   Q-values of the online network (the same values greedy evaluation acts on), taken within
   branch ``d`` only;
2. evaluation: the target network's distribution ``p^target(s', d, a*_d)``;
3. projection: the Bellman update ``T z_j = r + gamma (1 - terminal) z_j`` (the shared reward —
   the four branches act together, so each is credited with the whole reward), clipped to
   ``[v_min, v_max]`` and projected onto the support (Eq. 7);
4. loss: ``L = mean_b mean_d [ CE(m_d, p^online(s, d, a_d)) - entropy_coeff * H(p^online(s, d, a_d)) ]``.

Branches are independent Q-learners over a shared torso (Tavakoli et al., 2018, "Action
Branching Architectures"), each bootstrapping from its own greedy action.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .backend import scatter_add
from .net.layers import _xp

Array = Any


def support(v_min: float, v_max: float, num_atoms: int, xp: Any = np, dtype: Any = np.float32) -> Array:
    """The atoms ``z_j = v_min + j * dz``, ``dz = (v_max - v_min) / (num_atoms - 1)``."""
    return xp.linspace(v_min, v_max, num_atoms, dtype=dtype)


def project(next_probs: Array, rewards: Array, discounts: Array, z: Array) -> Array:
    """Project the distribution of ``r + discount * Z`` onto the support ``z`` (Eq. 7).

    Args:
        next_probs: [B, N] distribution of the bootstrap action at ``s'``.
        rewards: [B] rewards.
        discounts: [B] ``gamma * (1 - terminal)``; zero gives a point mass at ``r``.
        z: [N] the support.

    Returns:
        [B, N] projected distribution ``m`` (each row sums to 1).
    """
    xp = _xp(next_probs)
    B, N = next_probs.shape
    v_min, v_max = z[0], z[-1]
    dz = (v_max - v_min) / (N - 1)
    tz = xp.clip(rewards[:, None] + discounts[:, None] * z[None, :], v_min, v_max)
    # Fractional atom index of each shifted atom. Clip it too: (v_max - v_min) / dz can round to
    # a hair above N - 1, and ceil() would then write into the next row.
    b = xp.clip((tz - v_min) / dz, 0, N - 1)
    low = xp.floor(b)
    up = xp.ceil(b)
    # When T z_j lands exactly on an atom, low == up and both (up - b) and (b - low) vanish:
    # the whole mass must go to that atom, so give it the weight 1 through the low index.
    w_low = (up - b) + (low == up)
    w_up = b - low
    low_i = low.astype(xp.int64)
    up_i = up.astype(xp.int64)
    rows = (xp.arange(B, dtype=xp.int64) * N)[:, None]
    idx = xp.concatenate([(rows + low_i).ravel(), (rows + up_i).ravel()])
    mass = xp.concatenate([(next_probs * w_low).ravel(), (next_probs * w_up).ravel()])
    flat = scatter_add(idx, mass, B * N)  # the mass of each shifted atom onto its two neighbours
    return flat.reshape(B, N).astype(next_probs.dtype, copy=False)


def loss_and_grad(
    log_probs: Array, target: Array, entropy_coeff: float
) -> tuple[Array, Array, Array]:
    """Per-sample loss ``CE(m, p) - entropy_coeff * H(p)`` and its gradient w.r.t. the logits.

    Args:
        log_probs: [..., N] log-softmax of the predicted logits.
        target: [..., N] projected target ``m`` (treated as a constant).
        entropy_coeff: the coefficient of the entropy bonus.

    Returns:
        ``(loss [...], dloss/dlogits [..., N], entropy [...])``. With ``sum(m) = 1``:
        ``dCE/dl = p - m`` and ``dH/dl = -p (log p + H)``.
    """
    p = _xp(log_probs).exp(log_probs)
    ce = -(target * log_probs).sum(axis=-1)
    ent = -(p * log_probs).sum(axis=-1)
    loss = ce - entropy_coeff * ent
    dlogits = (p - target) + entropy_coeff * p * (log_probs + ent[..., None])
    return loss, dlogits, ent
