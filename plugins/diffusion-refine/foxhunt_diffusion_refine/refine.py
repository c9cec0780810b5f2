"""Variance-conditioned iterative refinement of Q (plan Task 5): the NumPy twin, forward and backward.

K denoising steps, each an FC-SiLU-FC residual block on ``[Q; noise]`` with the noise level
``sigma = sqrt(Var[Q])`` of the raw atom distributions on a falling schedule (per sample, A actions,
H hidden units, step k = 0 .. K-1)::

    c_k     = 1 - k / K                                   (1, 2/3, 1/3 for K = 3)
    pre_k   = Wq_k Q_k + Ws_k (c_k sigma) + b1_k          [H]
    h_k     = SiLU(pre_k) = pre_k * sigmoid(pre_k)
    Q_{k+1} = Q_k + s (W2_k h_k + b2_k)                   s = ``step_scale`` (0.1)

``Q_0`` is the stage's input, ``Q_K`` its output. ``sigma`` is a constant (no gradient flows into
Var[Q]). Parameters, stacked over the steps: ``w_q`` [K, H, A], ``w_sigma`` [K, H, A], ``b1``
[K, H], ``w2`` [K, A, H], ``b2`` [K, A]: K (3 A H + H + A) = 2 700 for K = 3, H = 24, A = 12.
(The plan's first layer ``W1`` [H, 2A] is ``[Wq | Ws]``; its count of 924 per step, 2 772 in all, is
an arithmetic slip: 24 * 24 + 24 + 12 * 24 + 12 = 900.)

The schedule: the plan's kernel is launched with k = 1 .. K, so its last step sees ``sigma * 0``
and that step's ``Ws`` can never learn (its gradient is ``c_K = 0`` times something); k = 0 .. K-1
keeps every parameter live and still lowers the noise step by step.

Init: ``Wq, Ws`` Glorot-uniform (fan-in 2A, fan-out H), biases 0, and ``W2`` 0 by default, so the
stage starts as the identity (a warm start from the previous stage keeps its function) and W2's
gradient, ``s dQ h^T``, is not zero there; ``W2`` Glorot as in the plan is an option.

Backward (``dQ_K`` = dloss / d output; k = K-1 .. 0)::

    dr      = s dQ_{k+1}
    dW2_k  += dr h_k^T,   db2_k += dr
    dpre    = (W2_k^T dr) * SiLU'(pre_k),   SiLU'(x) = g (1 + x (1 - g)),  g = sigmoid(x)
    dWq_k  += dpre Q_k^T,  dWs_k += c_k dpre sigma^T,  db1_k += dpre
    dQ_k    = dQ_{k+1} + Wq_k^T dpre

The functions run on NumPy and CuPy (``xp``); the CUDA kernels (:mod:`.cuda`) are checked against them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Array = Any
NAMES = ("w_q", "w_sigma", "b1", "w2", "b2")
"""The tensors, in the kernels' order."""


def param_shapes(steps: int, hidden: int, actions: int) -> dict[str, tuple[int, ...]]:
    K, H, A = steps, hidden, actions
    return {"w_q": (K, H, A), "w_sigma": (K, H, A), "b1": (K, H), "w2": (K, A, H), "b2": (K, A)}


def schedule(steps: int) -> list[float]:
    """``c_k = 1 - k / K`` for k = 0 .. K-1."""
    return [1.0 - k / steps for k in range(steps)]


def init_params(steps: int, hidden: int, actions: int, rng: np.random.Generator,
                zero_output: bool = True) -> dict[str, np.ndarray]:
    """Glorot-uniform first layer, zero biases, zero (or Glorot) second layer; float64."""
    K, H, A = steps, hidden, actions
    lim1 = np.sqrt(6.0 / (2 * A + H))
    lim2 = np.sqrt(6.0 / (H + A))
    return {
        "w_q": rng.uniform(-lim1, lim1, size=(K, H, A)),
        "w_sigma": rng.uniform(-lim1, lim1, size=(K, H, A)),
        "b1": np.zeros((K, H)),
        "w2": np.zeros((K, A, H)) if zero_output else rng.uniform(-lim2, lim2, size=(K, A, H)),
        "b2": np.zeros((K, A)),
    }


def _sigmoid(xp: Any, x: Array) -> Array:
    return 1.0 / (1.0 + xp.exp(-x))


def forward(xp: Any, params: dict[str, Array], q: Array, var: Array, step_scale: float) -> tuple[Array, dict]:
    """``Q_K`` [B, A] from ``Q_0 = q`` and ``var`` (Var[Q], [B, A]); the cache keeps each step's
    input and pre-activation."""
    K = params["w_q"].shape[0]
    sigma = xp.sqrt(xp.maximum(var, 0))
    qs, pres = [], []
    x = q
    for k, c in enumerate(schedule(K)):
        pre = x @ params["w_q"][k].T + (sigma * c) @ params["w_sigma"][k].T + params["b1"][k]
        h = pre * _sigmoid(xp, pre)
        qs.append(x)
        pres.append(pre)
        x = x + step_scale * (h @ params["w2"][k].T + params["b2"][k])
    return x, {"qs": qs, "pres": pres, "sigma": sigma, "step_scale": step_scale}


def backward(xp: Any, params: dict[str, Array], cache: dict, dy: Array) -> tuple[Array, dict[str, Array]]:
    """``(dQ_0, grads)`` from ``dy`` = dloss / dQ_K [B, A]."""
    K = params["w_q"].shape[0]
    s, sigma = cache["step_scale"], cache["sigma"]
    grads = {n: xp.zeros_like(params[n]) for n in NAMES}
    dq = dy
    for k in reversed(range(K)):
        c = schedule(K)[k]
        pre, x = cache["pres"][k], cache["qs"][k]
        g = _sigmoid(xp, pre)
        h = pre * g
        dr = s * dq
        grads["w2"][k] = dr.T @ h
        grads["b2"][k] = dr.sum(axis=0)
        dpre = (dr @ params["w2"][k]) * (g * (1.0 + pre * (1.0 - g)))
        grads["w_q"][k] = dpre.T @ x
        grads["w_sigma"][k] = c * (dpre.T @ sigma)
        grads["b1"][k] = dpre.sum(axis=0)
        dq = dq + dpre @ params["w_q"][k]
    return dq, grads
