"""Parity of dueling.cu (dueling softmax forward, dueling backward, expected-Q backward) with NumPy.

Tolerance: ``||out - ref|| / ||ref|| < 1e-5`` (float32 kernel, float64 reference of the same
float32 inputs).
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import assert_close, host64, nan_like, to_dev

from foxhunt_core.gpu import kernels as K
from foxhunt_core.gpu import reference as R

pytestmark = pytest.mark.gpu
TOL = 1e-5
# (atoms, branch offsets): the default, fewer atoms than a warp, exactly 2 per lane, 4 per lane
# with uneven branches.
LAYOUTS = [(51, (0, 3, 6, 9, 12)), (21, (0, 2, 5, 7)), (64, (0, 3, 6, 9, 12)), (101, (0, 4, 6, 9, 12))]


def _inputs(rng, B, offsets, N):
    A = offsets[-1]
    v = rng.normal(0, 1.0, (B, N)).astype(np.float32)
    adv = rng.normal(0, 1.0, (B, A, N)).astype(np.float32)
    z = np.linspace(-10.0, 10.0, N, dtype=np.float32)
    return v, adv, z


@pytest.mark.parametrize("N,offsets", LAYOUTS)
def test_dueling_softmax_forward_matches_numpy(cp, rng, N, offsets):
    B, A = 257, offsets[-1]
    v, adv, z = _inputs(rng, B, offsets, N)
    outs = dict(log_probs=nan_like(cp, (B, A, N)), probs=nan_like(cp, (B, A, N)),
                q=nan_like(cp, (B, A)), var=nan_like(cp, (B, A)))
    got = K.dueling_softmax_forward(to_dev(cp, v), to_dev(cp, adv), to_dev(cp, z), offsets, **outs)
    ref = R.dueling_softmax_forward(host64(v), host64(adv), host64(z), offsets)
    for name, g, r in zip(("log_probs", "probs", "q", "var"), got, ref):
        assert_close(name, g, r, TOL)


def test_dueling_softmax_forward_branch_subset(cp, rng):
    B, N, offsets = 64, 51, (0, 3, 6, 9, 12)
    v, adv, z = (to_dev(cp, a) for a in _inputs(rng, B, offsets, N))
    outs = dict(log_probs=nan_like(cp, (B, 12, N)), probs=nan_like(cp, (B, 12, N)),
                q=nan_like(cp, (B, 12)), var=nan_like(cp, (B, 12)))
    K.dueling_softmax_forward(v, adv, z, offsets, branches=(0, 1), **outs)
    q = host64(outs["q"])
    assert np.isfinite(q[:, :3]).all() and np.isnan(q[:, 3:]).all()
    K.dueling_softmax_forward(v, adv, z, offsets, branches=(1, 4), **outs)
    ref = R.dueling_softmax_forward(host64(v), host64(adv), host64(z), offsets)
    assert_close("q", outs["q"], ref[2], TOL)
    assert_close("log_probs", outs["log_probs"], ref[0], TOL)


@pytest.mark.parametrize("with_dq", [False, True])
@pytest.mark.parametrize("N,offsets", LAYOUTS)
def test_dueling_backward_matches_numpy(cp, rng, N, offsets, with_dq):
    B, A = 193, offsets[-1]
    v, adv, z = _inputs(rng, B, offsets, N)
    _, probs, q, _ = R.dueling_softmax_forward(v, adv, z, offsets)
    probs, q = probs.astype(np.float32), q.astype(np.float32)
    dlogits = rng.normal(0, 1.0, (B, A, N)).astype(np.float32)
    dq = np.zeros((B, A), np.float32)
    dq[:, : offsets[1]] = rng.normal(0, 1.0, (B, offsets[1]))  # the direction branch only
    kw = dict(dq=to_dev(cp, dq), probs=to_dev(cp, probs), q=to_dev(cp, q)) if with_dq else {}
    dv, dadv = K.dueling_backward(
        to_dev(cp, dlogits), to_dev(cp, z), offsets,
        dv=nan_like(cp, (B, N)), dadv=nan_like(cp, (B, A, N)), **kw,
    )
    if with_dq:
        rdv, rdadv = R.dueling_backward(host64(dlogits), offsets, host64(dq), host64(probs), host64(q), host64(z))
    else:
        rdv, rdadv = R.dueling_backward(host64(dlogits), offsets)
    assert_close("dv", dv, rdv, TOL)
    assert_close("dadv", dadv, rdadv, TOL)


@pytest.mark.parametrize("accumulate", [False, True])
def test_expected_q_backward_matches_numpy(cp, rng, accumulate):
    B, N, offsets = 300, 51, (0, 3, 6, 9, 12)
    v, adv, z = _inputs(rng, B, offsets, N)
    _, probs, q, _ = R.dueling_softmax_forward(v, adv, z, offsets)
    dq = rng.normal(0, 1.0, (B, 12))
    base = rng.normal(0, 1.0, (B, 12, N)).astype(np.float32)
    out = to_dev(cp, base) if accumulate else nan_like(cp, (B, 12, N))
    K.expected_q_backward(to_dev(cp, dq), to_dev(cp, probs), to_dev(cp, q), to_dev(cp, z),
                          out=out, accumulate=accumulate)
    ref = R.expected_q_backward(host64(dq.astype(np.float32)), host64(probs.astype(np.float32)),
                                host64(q.astype(np.float32)), host64(z))
    if accumulate:
        ref = ref + host64(base)
    assert_close("dlogits", out, ref, TOL)


def test_wrappers_name_the_kernel_and_reject_bad_arrays(cp):
    z = cp.zeros(51, cp.float32)
    v = cp.zeros((4, 51), cp.float32)
    adv = cp.zeros((4, 12, 51), cp.float32)
    with pytest.raises(TypeError, match="dueling_softmax_forward: v must be float32"):
        K.dueling_softmax_forward(v.astype(cp.float64), adv, z, (0, 3, 6, 9, 12))
    with pytest.raises(ValueError, match="dueling_softmax_forward: z has shape"):
        K.dueling_softmax_forward(v, adv, z[:50], (0, 3, 6, 9, 12))
    with pytest.raises(ValueError, match="dueling_softmax_forward: offsets"):
        K.dueling_softmax_forward(v, adv, z, (0, 3, 6, 9, 11))
    with pytest.raises(ValueError, match="dueling_backward: dlogits must be C-contiguous"):
        K.dueling_backward(cp.zeros((4, 51, 12), cp.float32).transpose(0, 2, 1), z, (0, 3, 6, 9, 12))
    with pytest.raises(TypeError, match="dueling_backward: dlogits must be a CuPy array"):
        K.dueling_backward(np.zeros((4, 12, 51), np.float32), z, (0, 3, 6, 9, 12))


def test_no_allocation_when_outputs_are_given(cp, rng):
    B, N, offsets = 128, 51, (0, 3, 6, 9, 12)
    v, adv, z = (to_dev(cp, a) for a in _inputs(rng, B, offsets, N))
    outs = K.dueling_softmax_forward(v, adv, z, offsets)  # compiles, allocates outputs
    grads = K.dueling_backward(outs[1], z, offsets)
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    before = pool.used_bytes()
    names = ("log_probs", "probs", "q", "var")
    for _ in range(3):
        K.dueling_softmax_forward(v, adv, z, offsets, **dict(zip(names, outs)))
        K.dueling_backward(outs[1], z, offsets, dv=grads[0], dadv=grads[1])
    assert pool.used_bytes() == before
