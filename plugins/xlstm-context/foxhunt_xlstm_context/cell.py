"""The stabilized mLSTM cell (Beck et al. 2024, "xLSTM", Sec. 2.3 and App. A.3) and its backward.

One head, ``d``-dimensional memory, input ``z`` of width ``D`` (the normalized Q-statistics).
With ``[q; k; v; o_pre; i_pre; f_pre] = W z + b`` (``k`` scaled by ``1/sqrt(d)``), one step is::

    log f = log sigmoid(f_pre)                       forget gate, in log space
    m     = max(log f + m_prev, i_pre)               stabilizer state
    f'    = exp(log f + m_prev - m)                  stabilized gates, both <= 1
    i'    = exp(i_pre - m)
    C     = f' C_prev + i' v k^T                     matrix memory        [d, d]
    n     = f' n_prev + i' k                         normalizer state     [d]
    h     = sigmoid(o_pre) * C q / max(|n^T q|, exp(-m))

``C``, ``n`` are the paper's memory and normalizer times ``exp(-m)``: the exponential input gate
``exp(i_pre)`` is never formed, so nothing overflows whatever the pre-activations, and the
normalizer ``max(|n^T q|, exp(-m))`` is the paper's ``max(|n^T q|, 1)`` in that scale (the
plan clamped ``exp(i_pre)`` at 1e6 instead: DESIGN.md, defect 7).

The prediction head reads the context: ``y = W_p h + b_p`` estimates how the normalized
statistics change by the next interval, ``z_next - z`` (so a head near zero predicts no change,
the persistence forecast); the loss is ``0.5 * mean((y - (z_next - z))^2)``. :func:`step_backward`
differentiates one step with the previous state held constant (truncated backpropagation
through time, one step), which is what the online learner trains with.

All parameters live in one flat float64 vector; :class:`Params` are named views into it, so the
optimizer updates one array.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Array = np.ndarray


@dataclass(frozen=True)
class Layout:
    """Shapes of the cell: ``inputs`` (D) statistics in, a ``dim`` (d) dimensional context out."""

    inputs: int = 11
    dim: int = 8

    @property
    def rows(self) -> int:
        """Rows of the input projection W: q, k, v, o (d each), then the input and forget gates."""
        return 4 * self.dim + 2

    @property
    def size(self) -> int:
        return self.rows * self.inputs + self.rows + self.inputs * self.dim + self.inputs

    def views(self, flat: Array) -> Params:
        """Named views of a flat vector of :attr:`size` entries (parameters or their gradients)."""
        if flat.shape != (self.size,):
            raise ValueError(f"flat parameters have shape {flat.shape}, the layout needs ({self.size},)")
        r, D, d = self.rows, self.inputs, self.dim
        ends = (r * D, r * D + r, r * D + r + D * d, self.size)
        return Params(
            w=flat[: ends[0]].reshape(r, D),
            b=flat[ends[0] : ends[1]],
            wp=flat[ends[1] : ends[2]].reshape(D, d),
            bp=flat[ends[2] : ends[3]],
        )


@dataclass
class Params:
    """Views: input projection ``w`` [4d+2, D], ``b`` [4d+2]; head ``wp`` [D, d], ``bp`` [D]."""

    w: Array
    b: Array
    wp: Array
    bp: Array


@dataclass
class State:
    """The recurrent state: stabilized memory ``c`` [d, d], normalizer ``n`` [d], stabilizer ``m``."""

    c: Array
    n: Array
    m: float

    @staticmethod
    def zeros(dim: int) -> State:
        return State(np.zeros((dim, dim)), np.zeros(dim), 0.0)

    def copy(self) -> State:
        return State(self.c.copy(), self.n.copy(), float(self.m))


@dataclass
class Cache:
    """What :func:`step_backward` needs from the forward."""

    z: Array
    q: Array
    k: Array
    v: Array
    o: Array
    f_pre: float
    log_f: float
    i_pre: float
    prev: State
    m: float
    a: float
    g: float
    c: Array
    n: Array
    s: float
    den: float
    h_tilde: Array
    forget_wins: bool
    """``m`` came from ``log f + m_prev`` (else from ``i_pre``)."""
    abs_wins: bool
    """The normalizer was ``|n^T q|`` (else ``exp(-m)``)."""
    h: Array
    """The step's output, the context."""


def init_params(layout: Layout, rng: np.random.Generator, forget_bias: float) -> Array:
    """Glorot-scaled projections, zero biases but the forget gate's (``forget_bias``: sigmoid(3) ~ 0.95
    keeps memory over about twenty intervals), and a small prediction head."""
    flat = np.zeros(layout.size)
    p = layout.views(flat)
    D, d = layout.inputs, layout.dim
    p.w[...] = rng.normal(0.0, math.sqrt(2.0 / (D + d)), size=p.w.shape)
    p.w[4 * d :] *= 0.1  # the gates start near their biases
    p.b[4 * d + 1] = forget_bias
    p.wp[...] = rng.normal(0.0, 0.1 / math.sqrt(d), size=p.wp.shape)
    return flat


def _log_sigmoid(x: float) -> float:
    return -max(-x, 0.0) - math.log1p(math.exp(-abs(x)))  # = -log(1 + exp(-x)), without overflow


def _sigmoid(x: Array) -> Array:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # = 1 / (1 + exp(-x)), without overflow


def step(p: Params, z: Array, prev: State) -> tuple[Array, State, Cache]:
    """One stabilized mLSTM step: ``(context h [d], new state, cache)``."""
    d = p.wp.shape[1]
    pre = p.w @ z + p.b
    q, k, v = pre[:d], pre[d : 2 * d] / math.sqrt(d), pre[2 * d : 3 * d]
    o = _sigmoid(pre[3 * d : 4 * d])
    i_pre, f_pre = float(pre[4 * d]), float(pre[4 * d + 1])
    log_f = _log_sigmoid(f_pre)
    forget_wins = log_f + prev.m >= i_pre
    m = log_f + prev.m if forget_wins else i_pre
    a = math.exp(log_f + prev.m - m)
    g = math.exp(i_pre - m)
    c = a * prev.c + g * (v[:, None] * k)
    n = a * prev.n + g * k
    s = float(n @ q)
    floor = math.exp(-m) if m > -700.0 else math.inf  # exp(-m) above 1e304: the floor is the normalizer
    abs_wins = abs(s) >= floor
    den = abs(s) if abs_wins else floor
    h_tilde = (c @ q) / den if 0.0 < den < math.inf else np.zeros(d)  # 0 or inf: the limit, h = 0
    h = o * h_tilde
    cache = Cache(z, q, k, v, o, f_pre, log_f, i_pre, prev, m, a, g, c, n, s, den, h_tilde, forget_wins, abs_wins, h)
    return h, State(c, n, m), cache


def step_backward(p: Params, cache: Cache, dh: Array, grads: Params) -> None:
    """Add the gradient of one step, given ``dL/dh``, to ``grads`` (the previous state is held fixed)."""
    x = cache
    d = p.wp.shape[1]
    dpre = np.zeros(4 * d + 2)
    dpre[3 * d : 4 * d] = dh * x.h_tilde * x.o * (1.0 - x.o)
    dht = dh * x.o
    if 0.0 < x.den < math.inf:
        dnum = dht / x.den
        dden = -float(dht @ x.h_tilde) / x.den
    else:
        dnum, dden = np.zeros(d), 0.0
    ds, dm = 0.0, 0.0
    if x.abs_wins:
        ds = dden * math.copysign(1.0, x.s)
    else:
        dm = -dden * x.den  # d exp(-m) / dm = -exp(-m)
    dq = x.c.T @ dnum + ds * x.n
    dc = dnum[:, None] * x.q
    dn = ds * x.q
    # C = a C_prev + g v k^T, n = a n_prev + g k
    da = float((dc * x.prev.c).sum() + dn @ x.prev.n)
    dg = float(x.v @ dc @ x.k + dn @ x.k)
    dv = x.g * (dc @ x.k)
    dk = x.g * (dc.T @ x.v + dn)
    # a = exp(log_f + m_prev - m), g = exp(i_pre - m), m = max(log_f + m_prev, i_pre)
    dlog_f = da * x.a
    di = dg * x.g
    dm -= da * x.a + dg * x.g
    if x.forget_wins:
        dlog_f += dm
    else:
        di += dm
    df = dlog_f * 0.5 * (1.0 - math.tanh(0.5 * x.f_pre))  # d log sigmoid(f) / df = sigmoid(-f)
    dpre[:d] = dq
    dpre[d : 2 * d] = dk / math.sqrt(d)
    dpre[2 * d : 3 * d] = dv
    dpre[4 * d] = di
    dpre[4 * d + 1] = df
    grads.w += dpre[:, None] * x.z
    grads.b += dpre


def predict(p: Params, h: Array) -> Array:
    """The head's estimate of the change of the normalized statistics by the next interval."""
    return p.wp @ h + p.bp


def prediction_loss(p: Params, h: Array, target: Array, grads: Params) -> tuple[float, Array]:
    """``0.5 * mean((W_p h + b_p - target)^2)``; adds the head's gradients, returns ``(loss, dL/dh)``."""
    r = predict(p, h) - target
    dy = r / r.size
    grads.wp += dy[:, None] * h
    grads.bp += dy
    return 0.5 * float(r @ r) / r.size, p.wp.T @ dy
