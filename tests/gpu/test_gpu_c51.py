"""Parity of c51_loss.cu (projection + loss + gradient) with c51.project / c51.loss_and_grad.

Tolerance: ``||out - ref|| / ||ref|| < 1e-5`` for m, dlogits, loss and entropy; the golden cases
(atoms landing exactly on grid points, clipping, terminal transitions) to 1e-6 absolute.
Outputs are poisoned with NaN, so an element the kernel does not write fails.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import assert_close, check_c51_indexed, host64, nan_like, to_dev

from foxhunt_core.gpu import kernels as K
from foxhunt_core.gpu import reference as R
from foxhunt_core.net import layers as L

pytestmark = pytest.mark.gpu
TOL = 1e-5
# Samples of the test whose warps walk many rows each: more than the grid's 32 warps per SM times
# the SMs of any current device (ROW_BLOCKS_PER_SM blocks of 8 warps), and a prime.
MANY_ROWS_B = 9001


def _softmax(rng, shape, scale=1.5):
    return L.softmax(rng.normal(0, scale, shape)).astype(np.float32)


def _run(cp, p_next, reward, discount, logp, z, beta):
    B, D, N = p_next.shape
    outs = dict(m=nan_like(cp, (B, D, N)), dlogits=nan_like(cp, (B, D, N)),
                loss=nan_like(cp, (B, D)), entropy=nan_like(cp, (B, D)))
    return K.c51_target_loss(to_dev(cp, p_next), to_dev(cp, reward), to_dev(cp, discount),
                             to_dev(cp, logp), to_dev(cp, z), beta, **outs)


@pytest.mark.parametrize("N,D", [(51, 4), (21, 3), (101, 4)])
def test_c51_target_loss_matches_numpy(cp, rng, N, D):
    B, beta = 301, 0.01
    z = np.linspace(-10.0, 10.0, N, dtype=np.float32)
    p_next = _softmax(rng, (B, D, N))
    reward = rng.uniform(-12.0, 12.0, B).astype(np.float32)  # some shifts clip at v_min / v_max
    terminal = rng.random(B) < 0.2
    discount = (0.99 * (1.0 - terminal)).astype(np.float32)
    logp = L.log_softmax(rng.normal(0, 1.5, (B, D, N))).astype(np.float32)
    got = _run(cp, p_next, reward, discount, logp, z, beta)
    ref = R.c51_target_loss(host64(p_next), host64(reward), host64(discount), host64(logp), host64(z), beta)
    for name, g, r in zip(("m", "dlogits", "loss", "entropy"), got, ref):
        assert_close(name, g, r, TOL)
    np.testing.assert_allclose(host64(got[0]).sum(axis=-1), 1.0, atol=1e-5)


def test_c51_projection_golden_cases(cp):
    z = np.array([-2.0, -1.0, 0.0, 1.0, 2.0], np.float32)
    p = np.array([0.1, 0.2, 0.3, 0.25, 0.15], np.float32)
    onehot = np.array([0.0, 1.0, 0.0, 0.0, 0.0], np.float32)
    # rows: identity shift; shift by one atom (lands on the grid, clips at v_max); one-hot moved
    # exactly onto atom 3; terminal (point mass at r on the grid); reward far beyond v_min.
    cases = [
        (p, 0.0, 1.0, p),
        (p, 1.0, 1.0, [0.0, 0.1, 0.2, 0.3, 0.4]),
        (onehot, 2.0, 1.0, [0.0, 0.0, 0.0, 1.0, 0.0]),
        (p, 1.0, 0.0, [0.0, 0.0, 0.0, 1.0, 0.0]),
        (p, -50.0, 0.5, [1.0, 0.0, 0.0, 0.0, 0.0]),
        (p, 0.5, 0.0, [0.0, 0.0, 0.5, 0.5, 0.0]),
    ]
    p_next = np.stack([c[0] for c in cases])[:, None, :]
    reward = np.array([c[1] for c in cases], np.float32)
    discount = np.array([c[2] for c in cases], np.float32)
    logp = np.log(np.full((len(cases), 1, 5), 0.2, np.float32))
    m, _, _, _ = _run(cp, p_next, reward, discount, logp, z, 0.0)
    np.testing.assert_allclose(host64(m)[:, 0, :], np.array([c[3] for c in cases]), atol=1e-6)


def test_c51_gradient_scale_and_entropy_sign(cp, rng):
    B, D, N = 8, 4, 51
    z = np.linspace(-10.0, 10.0, N, dtype=np.float32)
    p_next = _softmax(rng, (B, D, N))
    logp = L.log_softmax(rng.normal(0, 1.0, (B, D, N))).astype(np.float32)
    reward = np.zeros(B, np.float32)
    discount = np.full(B, 0.99, np.float32)
    _, d1, _, _ = K.c51_target_loss(*(to_dev(cp, a) for a in (p_next, reward, discount, logp, z)), 0.05)
    _, d2, _, _ = K.c51_target_loss(*(to_dev(cp, a) for a in (p_next, reward, discount, logp, z)), 0.05,
                                    grad_scale=1.0)
    np.testing.assert_allclose(host64(d1) * B * D, host64(d2), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("N,offsets", [(51, (0, 3, 6, 9, 12)), (21, (0, 2, 5, 7)), (101, (0, 4, 6, 9, 12))])
def test_c51_target_loss_many_rows_per_warp(cp, rng, N, offsets):
    """The update's form (indexed inputs, the gradient over all actions, E[m]) with each warp
    walking many rows, whose inputs and action indices it loads ahead: a prime batch, so the last
    rows of the grid stride end anywhere. The transitions mix what makes the projection's runs of
    equal keys short or long: gamma 0.99, terminal rows (every atom on one key), rewards that
    clip many atoms at v_min or v_max, a small discount, and negative ones (keys descending)."""
    B, A = MANY_ROWS_B, offsets[-1]
    D = len(offsets) - 1
    sizes = np.diff(offsets)
    z = np.linspace(-10.0, 10.0, N, dtype=np.float32)
    tgt = _softmax(rng, (B, A, N))
    logp = L.log_softmax(rng.normal(0, 1.5, (B, A, N))).astype(np.float32)
    reward = rng.uniform(-12.0, 12.0, B).astype(np.float32)
    discount = rng.choice(np.array([0.99, 0.0, 0.3, -0.6], np.float32), size=B, p=[0.7, 0.2, 0.05, 0.05])
    a_next = (rng.integers(0, 99, (B, D)) % sizes + np.asarray(offsets[:-1])).astype(np.int64)
    a_taken = (rng.integers(0, 99, (B, D)) % sizes + np.asarray(offsets[:-1])).astype(np.int64)
    outs = dict(m=nan_like(cp, (B, D, N)), dlogits=nan_like(cp, (B, A, N)), loss=nan_like(cp, (B, D)),
                entropy=nan_like(cp, (B, D)), m_mean=nan_like(cp, (B, D)))
    got = K.c51_target_loss(to_dev(cp, tgt), to_dev(cp, reward), to_dev(cp, discount), to_dev(cp, logp),
                            to_dev(cp, z), 0.01, next_action=cp.asarray(a_next), action=cp.asarray(a_taken),
                            offsets=offsets, dlogits_full=True, **outs)
    rm = check_c51_indexed(got, tgt, logp, reward, discount, z, a_next, a_taken, A, TOL)
    assert_close("E[m]", outs["m_mean"], (rm * host64(z)).sum(-1), TOL)
    np.testing.assert_allclose(host64(got[0]).sum(axis=-1), 1.0, atol=1e-5)


def test_c51_projection_exact_landings_on_51_atoms(cp, rng):
    """Unit atoms (z = -25 .. 25), integer rewards: with discount 1 every shifted atom lands on an
    atom, with 0 the point mass does, with 0.5 every other one does and the rest split 1/2 - 1/2;
    rewards up to +-60 pile up to every atom at v_min or v_max. All of it exact in float32, so
    the masses must match to rounding of their sums (runs of equal keys over many lanes)."""
    B, D, N = 257, 2, 51
    z = np.linspace(-25.0, 25.0, N, dtype=np.float32)
    p_next = _softmax(rng, (B, D, N))
    reward = rng.integers(-60, 61, B).astype(np.float32)
    discount = rng.choice(np.array([1.0, 0.0, 0.5], np.float32), size=B)
    logp = L.log_softmax(rng.normal(0, 1.5, (B, D, N))).astype(np.float32)
    m, _, _, _ = _run(cp, p_next, reward, discount, logp, z, 0.0)
    ref = R.c51_target_loss(host64(p_next), host64(reward), host64(discount), host64(logp), host64(z), 0.0)[0]
    np.testing.assert_allclose(host64(m), ref, rtol=0, atol=1e-6)
