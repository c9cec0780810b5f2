"""Gated message passing over the branch graph (plan Task 3): the NumPy twin, forward and backward.

The four branches are the nodes (direction 0, magnitude 1, order 2, urgency 3); the Q-values of a
branch are its node's features, ``Q_d`` = the columns ``[o_d, o_{d+1})`` of Q [B, A]. Four directed
edges carry the dependencies the action space has: direction -> magnitude, direction -> order,
magnitude -> urgency, order -> urgency. Per edge ``e = (s -> d)`` and sample::

    g_e   = sigmoid(u_e . Q_s + v_e . Q_d)        gate; u_e = ``gate_src`` [n_s], v_e = ``gate_dst`` [n_d]
    msg_e = g_e * (M_e Q_s)                       message; M_e = ``msg`` [n_d, n_s]
    Q'_d  = Q_d + (1 / c_d) sum_{e into d} msg_e  (c_d edges end at d; a node without any keeps Q_d)

Every edge reads the input Q (not a node already updated). 60 parameters with four branches of three
actions; the branch sizes come from the run's ``net.branch_sizes``. Init: ``M_e = msg_init * I``
(ones on the leading diagonal where ``n_d != n_s``), ``u_e = v_e = 0``, so every gate starts at 1/2.

Backward (``dY`` = dloss / dQ'; ``delta_e = dY_d / c_d``)::

    dQ       = dY + sum_e [ M_e^T (g_e delta_e) + a_e u_e  on Q_s ;  a_e v_e  on Q_d ]
    a_e      = g_e (1 - g_e) (delta_e . M_e Q_s)        (dloss / d gate pre-activation)
    dM_e     = sum_b g_e delta_e Q_s^T,   du_e = sum_b a_e Q_s,   dv_e = sum_b a_e Q_d

The same functions run on NumPy and CuPy (``xp``); the CUDA kernels (:mod:`.cuda`) are checked
against them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

Array = Any
EDGES: tuple[tuple[str, int, int], ...] = (
    ("dir_mag", 0, 1),
    ("dir_ord", 0, 2),
    ("mag_urg", 1, 3),
    ("ord_urg", 2, 3),
)
"""``(name, source branch, destination branch)`` in the order the kernels number them."""
TENSORS = ("gate_src", "gate_dst", "msg")
"""Each edge's tensors, in the kernels' packed order."""


def incoming(num_branches: int = 4) -> tuple[int, ...]:
    """``c_d``: how many edges end at each branch."""
    return tuple(sum(1 for _, _, d in EDGES if d == b) for b in range(num_branches))


def param_names() -> list[str]:
    """Every tensor name, edge by edge, in the kernels' order (``dir_mag.gate_src``, ...)."""
    return [f"{e}.{t}" for e, _, _ in EDGES for t in TENSORS]


def param_shapes(sizes: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """Tensor shapes for branch sizes ``sizes``."""
    out = {}
    for e, s, d in EDGES:
        out[f"{e}.gate_src"] = (sizes[s],)
        out[f"{e}.gate_dst"] = (sizes[d],)
        out[f"{e}.msg"] = (sizes[d], sizes[s])
    return out


def init_params(sizes: Sequence[int], msg_init: float) -> dict[str, np.ndarray]:
    """``M_e = msg_init * I``, gates zero (float64; the engine casts)."""
    out = {}
    for name, shape in param_shapes(sizes).items():
        out[name] = msg_init * np.eye(*shape) if name.endswith(".msg") else np.zeros(shape)
    return out


def _cols(offsets: Sequence[int], b: int) -> slice:
    return slice(offsets[b], offsets[b + 1])


def forward(xp: Any, params: dict[str, Array], q: Array, offsets: Sequence[int]) -> tuple[Array, dict[str, Any]]:
    """``Q'`` [B, A] from Q [B, A]; the cache holds the input and each edge's gate and message."""
    cnt = incoming(len(offsets) - 1)
    out = q.copy()
    gates, msgs = [], []
    for e, s, d in EDGES:
        qs, qd = q[:, _cols(offsets, s)], q[:, _cols(offsets, d)]
        g = 1.0 / (1.0 + xp.exp(-(qs @ params[f"{e}.gate_src"] + qd @ params[f"{e}.gate_dst"])))
        m = qs @ params[f"{e}.msg"].T  # M_e Q_s, [B, n_d]
        out[:, _cols(offsets, d)] += (g / cnt[d])[:, None] * m
        gates.append(g)
        msgs.append(m)
    return out, {"q": q, "gates": gates, "msgs": msgs}


def backward(xp: Any, params: dict[str, Array], cache: dict[str, Any], dy: Array,
             offsets: Sequence[int]) -> tuple[Array, dict[str, Array]]:
    """``(dQ, grads)`` from ``dY`` = dloss / dQ' [B, A]."""
    q = cache["q"]
    cnt = incoming(len(offsets) - 1)
    dq = dy.copy()
    grads = {}
    for (e, s, d), g, m in zip(EDGES, cache["gates"], cache["msgs"]):
        cs, cd = _cols(offsets, s), _cols(offsets, d)
        qs, qd = q[:, cs], q[:, cd]
        delta = dy[:, cd] / cnt[d]
        gd = g[:, None] * delta  # dloss / d(M_e Q_s)
        a = g * (1.0 - g) * (delta * m).sum(axis=1)  # dloss / d gate pre-activation
        M = params[f"{e}.msg"]
        dq[:, cs] += gd @ M + a[:, None] * params[f"{e}.gate_src"]
        dq[:, cd] += a[:, None] * params[f"{e}.gate_dst"]
        grads[f"{e}.msg"] = gd.T @ qs
        grads[f"{e}.gate_src"] = a @ qs
        grads[f"{e}.gate_dst"] = a @ qd
    return dq, grads
