"""Cross-branch Q attention: mixes the A expected Q-values of a sample into coordinated Q.

Each action ``i`` is a token ``t_i = [q_i, e_i]`` (its Q-value and a learned embedding
``e_i`` of width ``k``). Single-head scaled dot-product attention over the A tokens::

    Qry_i = t_i Wq,   Key_j = t_j Wk                     (k wide)
    a_ij  = softmax_j( Qry_i . Key_j / sqrt(k) )
    o_i   = sum_j a_ij q_j
    qc_i  = q_i + g_i (o_i - q_i)

The gate ``g`` starts at zero, so coordinated Q equals its input until the auxiliary loss (the
coordinated Q of the taken actions regressed on the C51 target's expectation) teaches it to mix.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .net import layers as L
from .net.layers import matmul as mm

Array = Any
PREFIX = "attn."


def init_params(num_actions: int, dim: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Parameters under ``core``: ``attn.emb`` [A, k], ``attn.wq``/``attn.wk`` [k+1, k], ``attn.gate`` [A]."""
    lim = np.sqrt(6.0 / (2 * dim + 1))
    return {
        "attn.emb": rng.normal(0.0, 1.0, size=(num_actions, dim)),
        "attn.wq": rng.uniform(-lim, lim, size=(dim + 1, dim)),
        "attn.wk": rng.uniform(-lim, lim, size=(dim + 1, dim)),
        "attn.gate": np.zeros(num_actions),
    }


def forward(params: dict[str, Array], q: Array) -> tuple[Array, dict[str, Array]]:
    """Coordinated Q [B, A] from Q [B, A]; returns ``(qc, cache)``. (The GPU step runs it as one
    kernel: :class:`foxhunt_core.gpu.step.KernelAttention`.)"""
    xp = L._xp(q)
    B, A = q.shape
    emb = params["attn.emb"]
    k = emb.shape[1]
    t = xp.concatenate([q[:, :, None], xp.broadcast_to(emb, (B, A, k))], axis=2)  # [B, A, k+1]
    qry = mm(t, params["attn.wq"])
    key = mm(t, params["attn.wk"])
    scores = mm(qry, key.transpose(0, 2, 1)) / math.sqrt(k)  # [B, A, A]
    a = L.softmax(scores, axis=-1)
    o = (a * q[:, None, :]).sum(axis=2)
    g = params["attn.gate"]
    qc = q + g * (o - q)
    return qc, {"q": q, "t": t, "qry": qry, "key": key, "a": a, "o": o}


def backward(
    params: dict[str, Array], cache: dict[str, Array], dqc: Array, grads_into: dict[str, Array] | None = None
) -> tuple[Array, dict[str, Array]]:
    """``(dq, grads)`` from ``dloss/dqc`` [B, A] (``grads_into``, the views a GPU step's gradients
    go into, is not used here: the grads are new arrays)."""
    q, t, qry, key, a, o = (cache[n] for n in ("q", "t", "qry", "key", "a", "o"))
    k = params["attn.emb"].shape[1]
    g = params["attn.gate"]
    dgate = (dqc * (o - q)).sum(axis=0)
    do = dqc * g
    dq = dqc * (1.0 - g)
    da = do[:, :, None] * q[:, None, :]  # d o_i / d a_ij = q_j
    dq = dq + (a * do[:, :, None]).sum(axis=1)  # d o_i / d q_j = a_ij
    ds = L.softmax_backward(a, da, axis=-1) / math.sqrt(k)
    dqry = mm(ds, key)
    dkey = mm(ds.transpose(0, 2, 1), qry)
    dt = mm(dqry, params["attn.wq"].T) + mm(dkey, params["attn.wk"].T)
    dq = dq + dt[:, :, 0]
    grads = {
        "attn.emb": dt[:, :, 1:].sum(axis=0),
        "attn.wq": mm(t.reshape(-1, k + 1).T, dqry.reshape(-1, k)),
        "attn.wk": mm(t.reshape(-1, k + 1).T, dkey.reshape(-1, k)),
        "attn.gate": dgate,
    }
    return dq, grads
