"""NumPy twins of the CUDA kernels, built from the core's own functions wherever they exist.

Each function takes and returns NumPy arrays with the kernel wrapper's shapes and computes in the
dtype it is given (the parity tests pass float64 copies of the float32 kernel inputs). They are
the oracles of ``tests/gpu``; the core modules they call are the product's CPU path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import c51, explore
from ..net import layers as L
from ..qpipe import QOut, expected_q, q_statistics
from .philox import boltzmann_uniforms

Array = np.ndarray


def _branch_mean(x: Array, offsets: Sequence[int]) -> Array:
    """Mean over each branch's actions, broadcast back to every action of the branch: [B, A, N]."""
    out = np.empty_like(x)
    for a, b in zip(offsets[:-1], offsets[1:]):
        out[:, a:b] = x[:, a:b].mean(axis=1, keepdims=True)
    return out


def dueling_softmax_forward(v: Array, adv: Array, z: Array, offsets: Sequence[int],
                            v_bias: Array | None = None, adv_bias: Array | None = None) -> tuple[Array, ...]:
    """``(log_probs, probs, q, var)`` of the dueling logits ``v + adv - mean_branch adv``
    (with the value and advantage biases added first when given)."""
    if v_bias is not None:
        v = v + v_bias
    if adv_bias is not None:
        adv = adv + adv_bias
    logits = v[:, None, :] + adv - _branch_mean(adv, offsets)
    log_probs = L.log_softmax(logits)
    probs = np.exp(log_probs)
    q, var = expected_q(probs, z)
    return log_probs, probs, q, var


def adv_from_columns(adv: Array, offsets: Sequence[int], num_atoms: int, align: int = 4) -> Array:
    """[B, A, N] advantages from the padded [B, W] layout (:func:`..gpu.launch.head_columns`)."""
    from .launch import head_columns

    cols = head_columns(offsets, num_atoms, align)
    B = adv.shape[0]
    return np.concatenate([adv[:, c : c + (b - a) * num_atoms].reshape(B, b - a, num_atoms)
                           for a, b, c in zip(offsets[:-1], offsets[1:], cols)], axis=1)


def columns_from_adv(adv: Array, offsets: Sequence[int], align: int = 4) -> Array:
    """The padded [B, W] layout of [B, A, N] advantages, zeros in the padding."""
    from .launch import head_columns

    B, _, N = adv.shape
    cols = head_columns(offsets, N, align)
    out = np.zeros((B, cols[-1]), dtype=adv.dtype)
    for a, b, c in zip(offsets[:-1], offsets[1:], cols):
        out[:, c : c + (b - a) * N] = adv[:, a:b].reshape(B, -1)
    return out


def expected_q_backward(dq: Array, probs: Array, q: Array, z: Array) -> Array:
    """``dq * p * (z - q)``: the gradient of ``q = sum_j p_j z_j`` with respect to the logits."""
    return dq[:, :, None] * probs * (z - q[:, :, None])


def dueling_backward(
    dlogits: Array,
    offsets: Sequence[int],
    dq: Array | None = None,
    probs: Array | None = None,
    q: Array | None = None,
    z: Array | None = None,
    branches: tuple[int, int] | None = None,
) -> tuple[Array, Array]:
    """``(dv, dadv)`` of the dueling aggregation, with the optional expected-Q term added first.
    With ``branches=(first, end)``: ``dv`` sums only those branches and ``dadv`` is returned for
    their actions only ([B, o_end - o_first, N])."""
    dl = dlogits if dq is None else dlogits + expected_q_backward(dq, probs, q, z)
    dadv = dl - _branch_mean(dl, offsets)
    if branches is None:
        return dl.sum(axis=1), dadv
    a0, a1 = offsets[branches[0]], offsets[branches[1]]
    return dl[:, a0:a1].sum(axis=1), dadv[:, a0:a1]


def gather_actions(x: Array, action: Array) -> Array:
    """``x[b, action[b, d]]``: [B, D] or [B, D, N]."""
    idx = action if x.ndim == 2 else action[:, :, None]
    return np.take_along_axis(x, idx, axis=1)


def scatter_actions(vals: Array, action: Array, num_actions: int) -> Array:
    """Zeros [B, A(, N)] with ``vals[b, d]`` at ``action[b, d]``."""
    out = np.zeros((vals.shape[0], num_actions) + vals.shape[2:], dtype=vals.dtype)
    idx = action if vals.ndim == 2 else action[:, :, None]
    np.put_along_axis(out, idx, vals, axis=1)
    return out


def c51_target_loss(
    p_next: Array,
    reward: Array,
    discount: Array,
    log_probs_taken: Array,
    z: Array,
    entropy_coeff: float,
    grad_scale: float | None = None,
) -> tuple[Array, Array, Array, Array]:
    """``(m, dlogits, loss, entropy)`` as ``agent.Agent.loss_and_grads`` forms them."""
    B, D, N = p_next.shape
    m = c51.project(p_next.reshape(B * D, N), np.repeat(reward, D), np.repeat(discount, D), z).reshape(B, D, N)
    loss, dl, ent = c51.loss_and_grad(log_probs_taken, m, entropy_coeff)
    scale = 1.0 / (B * D) if grad_scale is None else grad_scale
    return m, dl * scale, loss, ent


def augment(x: Array, width: int | None) -> Array:
    """``[x, 0, ..., 0, 1]`` [B, width] (``x`` itself when ``width`` is None or its width)."""
    if width is None or width == x.shape[1]:
        return x
    out = np.zeros((x.shape[0], width), dtype=x.dtype)
    out[:, : x.shape[1]] = x
    out[:, -1] = 1.0
    return out


def glu_forward(pv: Array, width: int | None = None, blocks: int = 1) -> tuple[Array, Array, Array]:
    """``(gate, h, value)`` of the GLU over the joint layout: ``pv`` [B, 2H] = ``[pre_gate | val]``;
    ``h`` augmented to ``width`` columns when given. ``blocks`` branches side by side: each
    result [B, blocks, ...] stacked along the columns (``h`` [B, blocks width])."""
    if blocks > 1:
        parts = [glu_forward(p, width) for p in np.split(pv, blocks, axis=1)]
        return tuple(np.concatenate([r[i] for r in parts], axis=1) for i in range(3))
    H = pv.shape[1] // 2
    gate = L.sigmoid(pv[:, :H])
    return gate, augment(gate * pv[:, H:], width), pv[:, H:]


def gate_glu_forward(pv: Array, gate: Any, width: int | None = None, blocks: int = 1) -> Array:
    """The augmented ``h`` [B, blocks width] of the GLU with the gate of ``gate`` (a
    :class:`~foxhunt_core.gpu.gate.GateLaunch`): block ``b``'s gate is the stage's own forward for
    the network's branch ``gate.branches[b]``."""
    H = pv.shape[1] // (2 * blocks)
    outs = []
    for b, d in enumerate(gate.branches):
        pre, val = pv[:, 2 * H * b : 2 * H * b + H], pv[:, 2 * H * b + H : 2 * H * (b + 1)]
        g, _ = gate.stage.forward(np, gate.tree, d, pre)
        outs.append(augment(g * val, width))
    return np.concatenate(outs, axis=1)


def gate_glu_backward(dh: Array, pv: Array, gate: Any, blocks: int = 1) -> tuple[Array, dict]:
    """``(dpv, grads)``: :func:`gate_glu_forward`'s backward, ``dpv`` ``[dpre | dval]`` per block
    and the gate's parameter gradients of the launch's branches (the stage's own backward)."""
    H = pv.shape[1] // (2 * blocks)
    dpv, grads = np.empty_like(pv), {}
    for b, d in enumerate(gate.branches):
        pre, val = pv[:, 2 * H * b : 2 * H * b + H], pv[:, 2 * H * b + H : 2 * H * (b + 1)]
        g, cache = gate.stage.forward(np, gate.tree, d, pre)
        dhb = dh[:, H * b : H * (b + 1)]
        dpre, gg = gate.stage.backward(np, gate.tree, d, cache, dhb * val)
        dpv[:, 2 * H * b : 2 * H * b + H] = dpre
        dpv[:, 2 * H * b + H : 2 * H * (b + 1)] = dhb * g
        grads.update(gg)
    return dpv, grads


def glu_gemm(u: Array, w: Array, bias: Array | None = None, width: int | None = None,
             blocks: int = 1, gate: Any = None) -> tuple[Array, Array]:
    """``(pv, h)`` of the GLU layer in one: ``pv = u w (+ bias)`` [B, blocks 2H], then
    :func:`glu_forward`'s augmented ``h`` [B, blocks width] (:func:`gate_glu_forward`'s with a
    ``gate`` other than the sigmoid)."""
    pv = u @ w + (0.0 if bias is None else bias)
    if gate is not None and not _sigmoid(gate):
        return pv, gate_glu_forward(pv, gate, width, blocks)
    return pv, glu_forward(pv, width, blocks)[1]


def _sigmoid(gate: Any) -> bool:
    from .gate import built_in

    return built_in(gate.fragment)


def linear_gemm(a: Sequence[Array], w: Sequence[Array], bias: Sequence[Array | None] | None = None,
                relu: bool = False) -> list[Array]:
    """``a[b] @ w[b] (+ bias[b])``, then ``relu``, for each set ``b`` (``w[b]`` [K, N], the
    weights as the layer holds them: the kernel reads their transpose)."""
    outs = []
    for i, (x, wi) in enumerate(zip(a, w)):
        y = x @ wi + (0.0 if bias is None or bias[i] is None else bias[i])
        outs.append(L.relu(y) if relu else y)
    return outs


def linear_gemm_relu_backward(a: Array, w: Array, y: Array, addend: Array | None = None) -> Array:
    """``(a @ w (+ addend)) * (y > 0)``: a ReLU layer's input gradient from the next layer's
    (``w`` [K, N] that layer's weights transposed, as the product reads them: the kernel takes the
    weights as they are, ``wt = w.T``)."""
    return relu_backward(a @ w, y, addend)


def wgrad_gemm(x: Array, y: Array, zero_rows: tuple[int, int] = (0, 0),
               keep_cols: tuple[int, int] = (0, 0)) -> Array:
    """``x.T @ y`` [N, M] (a weight gradient: ``x`` [K, N] the layer's input, ``y`` [K, M] its
    output's gradient), rows ``zero_rows`` zero outside columns ``keep_cols``. (The kernel reads
    ``x`` transposed: ``xt = x.T``.)"""
    out = x.T @ y
    z0, z1 = zero_rows
    keep = np.zeros(out.shape[1], dtype=bool)
    keep[keep_cols[0] : keep_cols[1]] = True
    out[z0:z1, ~keep] = 0.0
    return out


def glu_backward(dh: Array, pv: Array, blocks: int = 1) -> Array:
    """``[d pre_gate | d val]`` per branch [B, blocks 2H] of :func:`glu_forward`."""
    if blocks > 1:
        return np.concatenate([glu_backward(d, p) for d, p in zip(np.split(dh, blocks, axis=1),
                                                                 np.split(pv, blocks, axis=1))], axis=1)
    gate, _, val = glu_forward(pv)
    return np.concatenate([L.sigmoid_backward(gate, dh * val), dh * gate], axis=1)


def glu_backward_gemm(dadv: Sequence[Array], wo: Sequence[Array], pv: Array, gate: Any = None) -> Any:
    """:func:`glu_backward` of ``dh = [dadv[b] @ wo[b].T, ...]`` (each branch's GLU output gradient
    from its advantage head's, ``wo[b]`` [H, K] the head's weights as the layer holds them): pv's
    gradient [B, blocks 2H]; with a ``gate`` other than the sigmoid, :func:`gate_glu_backward`'s
    ``(dpv, grads)``."""
    dh = np.concatenate([a @ w.T for a, w in zip(dadv, wo)], axis=1)
    if gate is not None and not _sigmoid(gate):
        return gate_glu_backward(dh, pv, gate, len(dadv))
    return glu_backward(dh, pv, len(dadv))


def glu_backward_dq(dpv: Array, wq: Array, dq_set: int, H: int) -> Array:
    """:func:`glu_backward_gemm`'s ``dq``: branch ``dq_set``'s pre-activation gradients (of ``dpv``
    [B, blocks 2H]) times ``wq`` [n, 2H] transposed."""
    return dpv[:, 2 * H * dq_set : 2 * H * (dq_set + 1)] @ wq.T


def bias_relu_forward(x: Array, bias: Array) -> Array:
    return L.relu(x + bias)


def relu_backward(dy: Array, y: Array, addend: Array | None = None) -> Array:
    return L.relu_backward(y, dy if addend is None else dy + addend)


def tf32_nearest(a: Array) -> Array:
    """``a`` as float32 rounded to TF32 (10 mantissa bits), to nearest with ties away from zero
    (``cvt.rna.tf32.f32``; the sign-magnitude bits rounded up by half a TF32 unit, then cut)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def vsn_forward(h2: Array, mpre: Array, width: int | None = None, tf32: bool = False) -> tuple[Array, Array]:
    m = L.sigmoid(mpre)
    z = augment(h2 * m, width)
    return m, tf32_nearest(z).astype(z.dtype) if tf32 else z


def pack_rows(sources: Sequence[Array], width: int) -> Array:
    return augment(np.concatenate(list(sources), axis=0), width)


def vsn_backward(dz: Array, h2: Array, m: Array) -> tuple[Array, Array]:
    return dz * m, L.sigmoid_backward(m, dz * h2)


def q_stats(q_coord: Array, q_raw: Array, probs: Array, offsets: Sequence[int], mass_threshold: float) -> Array:
    """``qpipe.q_statistics`` as a vector in the order of ``qkernels.q_stats_keys``."""
    rec = q_statistics(QOut(q_raw, np.zeros_like(q_raw), q_coord), probs, tuple(offsets), mass_threshold)
    D = len(offsets) - 1
    keys = (["q_min", "q_max", "q_mean", "q_var", "raw_q_mean", "atom_entropy", "atom_utilization"]
            + [f"q_gap_{d}" for d in range(D)] + ["avg_max_q"])
    return np.array([rec[k] for k in keys])


def boltzmann_select(values: Array, offsets: Sequence[int], temps: Array, seed: int, counter: int) -> Array:
    """``explore.boltzmann_select`` fed with the Philox uniforms the GPU kernel draws."""
    B = values.shape[0]
    u = boltzmann_uniforms(seed, counter, B, len(offsets) - 1)
    return explore.boltzmann_select(values, tuple(offsets), temps, u)
