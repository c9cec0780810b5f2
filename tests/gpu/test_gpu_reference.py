"""CPU checks of the math the kernels use where it is not the core's formula written out.

Each kernel that reorganizes a computation (a gather instead of a scatter, gradient sums factored
through the shared embedding, a running best/second-best instead of a sort) gets a NumPy mirror
of that reorganization here, compared with the core function, so the algebra is verified on
machines without a GPU. The reference twins themselves are gradient-checked.
"""

from __future__ import annotations

import numpy as np
import pytest

from foxhunt_core import attention, c51
from foxhunt_core.gpu import reference as R
from foxhunt_core.gpu.qkernels import attention_params_size, q_stats_keys
from foxhunt_core.net import layers as L
from foxhunt_core.testing.gradcheck import numeric_gradient


def project_gather(p, reward, discount, z):
    """c51_loss.cu's projection: m_i = sum_j p_j max(0, 1 - |b_j - i|)."""
    N = z.shape[0]
    v_min, v_max = z[0], z[-1]
    dz = (v_max - v_min) / (N - 1)
    tz = np.clip(reward[:, None] + discount[:, None] * z[None, :], v_min, v_max)
    b = np.clip((tz - v_min) / dz, 0, N - 1)  # [R, N] indexed by j
    w = np.maximum(0, 1 - np.abs(b[:, None, :] - np.arange(N, dtype=z.dtype)[None, :, None]))  # [R, i, j]
    return (w * p[:, None, :]).sum(axis=-1)


def project_runs_float32(p, reward, discount, z):
    """c51_loss.cu's projection as it runs: float32, each target atom summing only its run of
    source atoms, found by binary search (b_j is monotone in j)."""
    p, reward, discount, z = (np.asarray(a, np.float32) for a in (p, reward, discount, z))
    N = z.shape[0]
    v_min, v_max = z[0], z[-1]
    dz = (v_max - v_min) / np.float32(N - 1)
    m = np.zeros_like(p)
    for r in range(p.shape[0]):
        tz = np.clip(reward[r] + discount[r] * z, v_min, v_max)
        b = np.clip((tz - v_min) / dz, np.float32(0), np.float32(N - 1))
        order = np.arange(N) if b[-1] >= b[0] else np.arange(N)[::-1]
        assert (np.diff(b[order]) >= 0).all(), "b_j is not monotone"
        for i in range(N):
            acc = np.float32(0)
            for j in order[np.searchsorted(b[order], np.float32(i - 1), side="right"):]:
                if b[j] >= i + 1:
                    break
                acc += p[r, j] * max(np.float32(0), np.float32(1) - abs(b[j] - np.float32(i)))
            m[r, i] = acc
    return m


def test_c51_gather_projection_equals_scatter():
    rng = np.random.default_rng()
    R_, N = 500, 51
    z = np.linspace(-10.0, 10.0, N)
    p = L.softmax(rng.normal(0, 1.5, (R_, N)))
    reward = rng.uniform(-12, 12, R_)
    reward[:50] = np.round(reward[:50] / 0.4) * 0.4  # shifts landing on the grid (low == up)
    discount = np.where(rng.random(R_) < 0.2, 0.0, rng.choice([0.99, 1.0], R_))
    ref = c51.project(p, reward, discount, z)
    np.testing.assert_allclose(project_gather(p, reward, discount, z), ref, atol=1e-12)
    # The bounded runs in float32, with negative discounts too (b_j then falls with j): the same
    # sums as the full float32 gather (up to the order of the terms), and the float64 projection
    # up to float32 rounding of b_j.
    rows = np.r_[0:60, R_ - 40 : R_]
    discount[-40:] *= -1.0
    runs = project_runs_float32(p[rows], reward[rows], discount[rows], z)
    full = project_gather(*(np.asarray(a, np.float32) for a in (p[rows], reward[rows], discount[rows], z)))
    assert full.dtype == np.float32
    np.testing.assert_allclose(runs, full, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(runs, c51.project(p[rows], reward[rows], discount[rows], z), atol=1e-5)


def attention_backward_as_the_kernel(params, q, dqc):
    """attention.cu's backward: factored scores, per-sample terms, the sums over the batch of the
    gradients of the score constants, and their map to the parameters."""
    emb, wq, wk, g = (params[n] for n in ("attn.emb", "attn.wq", "attn.wk", "attn.gate"))
    B, A = q.shape
    k = emb.shape[1]
    eq, ek = emb @ wq[1:], emb @ wk[1:]
    alpha, beta, gamma, delta = (wq[0] @ wk[0], ek @ wq[0], eq @ wk[0], eq @ ek.T)
    u = alpha * q + gamma  # S_ij = u_i q_j + q_i beta_j + delta_ij (times sqrt(k))
    a = L.softmax((u[:, :, None] * q[:, None, :] + q[:, :, None] * beta + delta) / np.sqrt(k))
    o = (a * q[:, None, :]).sum(-1)
    d = q[:, None, :] - o[:, :, None]
    ds = a * (dqc * g)[:, :, None] * d  # dloss / dS
    r = (ds * d).sum(-1)  # sum_j dS_ij q_j
    dq = (
        dqc * (1 - g)
        + (a * (dqc * g)[:, :, None]).sum(axis=1)
        + (ds * (alpha * q[:, None, :] + beta)).sum(-1) / np.sqrt(k)
        + (ds * (alpha * q + gamma)[:, :, None]).sum(axis=1) / np.sqrt(k)
    )
    # The sums each block accumulates ...
    M, C, R, T = ds.sum(0), (q[:, :, None] * ds).sum((0, 1)), r.sum(0), (q * r).sum()
    dgate = (dqc * (o - q)).sum(0)
    # ... and their map to the parameters (per block, then added).
    deq = (R[:, None] * wk[0] + M @ ek) / np.sqrt(k)
    dek = (C[:, None] * wq[0] + M.T @ eq) / np.sqrt(k)
    dwq = np.vstack([(T * wk[0] + C @ ek) / np.sqrt(k), emb.T @ deq])
    dwk = np.vstack([(T * wq[0] + R @ eq) / np.sqrt(k), emb.T @ dek])
    demb = deq @ wq[1:].T + dek @ wk[1:].T
    assert demb.size + dwq.size + dwk.size + dgate.size == attention_params_size(A, k)
    return dq, {"attn.emb": demb, "attn.wq": dwq, "attn.wk": dwk, "attn.gate": dgate}


@pytest.mark.parametrize("A,k", [(12, 8), (7, 3)])
def test_attention_factored_gradients_equal_backward(A, k):
    rng = np.random.default_rng()
    params = attention.init_params(A, k, rng)
    params["attn.gate"] = rng.uniform(-1, 1, A)
    q = rng.normal(0, 3.0, (64, A))
    dqc = rng.normal(0, 1.0, (64, A))
    dq, grads = attention_backward_as_the_kernel(params, q, dqc)
    _, cache = attention.forward(params, q)
    rdq, rgrads = attention.backward(params, cache, dqc)
    np.testing.assert_allclose(dq, rdq, rtol=1e-10, atol=1e-12)
    for n, v in rgrads.items():
        np.testing.assert_allclose(grads[n], v, rtol=1e-10, atol=1e-12, err_msg=n)


def test_running_best_and_second_best_equal_sort():
    rng = np.random.default_rng()
    x = rng.integers(0, 4, (1000, 3)).astype(float)  # many ties
    best = np.full(1000, -np.inf)
    second = np.full(1000, -np.inf)
    best[:] = x[:, 0]
    for a in range(1, 3):  # qstats.cu's loop
        v = x[:, a]
        up = v > best
        second = np.where(up, best, np.where(v > second, v, second))
        best = np.where(up, v, best)
    s = np.sort(x, axis=1)
    np.testing.assert_array_equal(best - second, s[:, -1] - s[:, -2])


def test_dueling_reference_backward_is_the_gradient_of_its_forward():
    rng = np.random.default_rng()
    offsets, B, N = (0, 2, 5), 3, 6
    z = np.linspace(-1, 1, N)
    v, adv = rng.normal(size=(B, N)), rng.normal(size=(B, 5, N))
    w_lp, w_q = rng.normal(size=(B, 5, N)), rng.normal(size=(B, 5))

    def loss():
        lp, _, q, _ = R.dueling_softmax_forward(v, adv, z, offsets)
        return float((w_lp * lp).sum() + (w_q * q).sum())

    lp, p, q, _ = R.dueling_softmax_forward(v, adv, z, offsets)
    dlogits = w_lp - p * w_lp.sum(-1, keepdims=True)  # through log-softmax
    dv, dadv = R.dueling_backward(dlogits, offsets, dq=w_q, probs=p, q=q, z=z)
    for arr, grad in ((v, dv), (adv, dadv)):
        for idx in [tuple(rng.integers(0, s) for s in arr.shape) for _ in range(8)]:
            assert numeric_gradient(loss, arr, idx) == pytest.approx(grad[idx], rel=1e-6, abs=1e-8)


def test_reference_q_stats_uses_the_kernel_order():
    rng = np.random.default_rng()
    probs = L.softmax(rng.normal(size=(10, 12, 51)))
    q = rng.normal(size=(10, 12))
    vec = R.q_stats(q, q, probs, (0, 3, 6, 9, 12), 0.1)
    assert vec.shape == (len(q_stats_keys(4)),)
    assert vec[0] == q.min() and vec[1] == q.max()
