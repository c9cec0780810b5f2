"""Parity of dueling.cu (dueling softmax forward, dueling backward) with NumPy.

Tolerance: ``||out - ref|| / ||ref|| < 1e-5`` (float32 kernel, float64 reference of the same
float32 inputs).
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import assert_close, check_three_segments, host64, nan_like, to_dev

from foxhunt_core.gpu import kernels as K
from foxhunt_core.gpu import reference as R
from foxhunt_core.gpu.launch import HEAD_ALIGN, branch_defines, head_columns, padded

pytestmark = pytest.mark.gpu
TOL = 1e-5
# (atoms, branch offsets): the default, fewer atoms than a warp, exactly 2 per lane, 4 per lane
# with uneven branches, and a branch of more actions than the forward reduces at once (10).
LAYOUTS = [(51, (0, 3, 6, 9, 12)), (21, (0, 2, 5, 7)), (64, (0, 3, 6, 9, 12)), (101, (0, 4, 6, 9, 12)),
           (33, (0, 12, 14))]
# Samples of the tests whose warps walk many rows each: more than the grid's warps (at most 32 per
# SM) times the SMs of any current device, and a prime.
MANY_ROWS_B = 9001


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


@pytest.mark.parametrize("N,offsets", LAYOUTS)
def test_dueling_forward_many_rows_per_warp(cp, rng, N, offsets):
    """The update's form with each warp walking many rows, whose inputs it loads one row ahead:
    three segments of a prime number of rows (each writing what it wants), the direction branch
    with its Q into a column block of a wider array and then the other branches, the padded
    layout with NaN in the padding and around the value head's columns. Some samples have logits
    spread over hundreds of nats (probabilities that underflow to zero)."""
    S, A = 3001, offsets[-1]
    B, D = 3 * S, len(offsets) - 1
    Nv, W = padded(N), head_columns(offsets, N, HEAD_ALIGN)[-1]
    v, adv, z = _inputs(rng, B, offsets, N)
    v[::7] *= 40.0
    adv[::5] *= 30.0
    ref = R.dueling_softmax_forward(host64(v), host64(adv), host64(z), offsets)
    vwide = np.full((B, Nv + 20), np.nan, np.float32)
    vwide[:, 8 : 8 + N] = v
    adv_pad = R.columns_from_adv(adv, offsets)
    adv_pad[R.columns_from_adv(np.ones((1, A, N)), offsets).repeat(B, 0) == 0.0] = np.nan
    wants = [("log_probs", "probs", "q", "var"), ("q",), ("probs",)]
    outs = dict(log_probs=nan_like(cp, (S, A, N)), probs=nan_like(cp, (B, A, N)), q=nan_like(cp, (B, A)),
                var=nan_like(cp, (S, A)))
    zwide = nan_like(cp, (B, offsets[1] + 9))
    dvw, dadv, dz = to_dev(cp, vwide), to_dev(cp, adv_pad), to_dev(cp, z)
    assert dadv.shape == (B, W)
    dv = dvw[:, 8 : 8 + Nv]
    K.dueling_softmax_forward(dv, dadv, dz, offsets, branches=(0, 1), segments=wants, zq=zwide[:, 5 : 5 + offsets[1]],
                              zq_scale=0.25, **outs)
    K.dueling_softmax_forward(dv, dadv, dz, offsets, branches=(1, D), segments=wants, **outs)
    check_three_segments(outs, zwide, ref, S, offsets[1], TOL)


@pytest.mark.parametrize("N,offsets", LAYOUTS)
def test_dueling_backward_many_samples_per_warp(cp, rng, N, offsets):
    """The update's two passes with each warp walking many samples, whose rows it loads ahead (two
    rows without dq, one with): every branch but the direction branch, then the direction branch
    with dq read from a scaled column block and dv accumulated into a column block of a wider
    array; the padded layout, a prime batch."""
    B, A = MANY_ROWS_B, offsets[-1]
    D, n0 = len(offsets) - 1, offsets[1]
    Nv, W = padded(N), head_columns(offsets, N, HEAD_ALIGN)[-1]
    v, adv, z = _inputs(rng, B, offsets, N)
    _, probs, q, _ = R.dueling_softmax_forward(v, adv, z, offsets)
    probs, q = probs.astype(np.float32), q.astype(np.float32)
    dlogits = rng.normal(0, 1.0, (B, A, N)).astype(np.float32)
    cols = rng.normal(0, 1.0, (B, n0)).astype(np.float32)
    wide = nan_like(cp, (B, n0 + 9))
    wide[:, 5 : 5 + n0] = to_dev(cp, cols)
    dvwide, dadv = nan_like(cp, (B, Nv + 7)), nan_like(cp, (B, W))
    dv = dvwide[:, 3 : 3 + Nv]
    ddl, dzz = to_dev(cp, dlogits), to_dev(cp, z)
    K.dueling_backward(ddl, dzz, offsets, branches=(1, D), dv=dv, dadv=dadv, padded=True)
    K.dueling_backward(ddl, dzz, offsets, branches=(0, 1), accumulate_dv=True, dq=wide[:, 5 : 5 + n0], dq_scale=0.25,
                       probs=to_dev(cp, probs), q=to_dev(cp, q), dv=dv, dadv=dadv, padded=True)
    dq = np.zeros((B, A))
    dq[:, :n0] = 0.25 * host64(cols)
    rdv, rdadv = R.dueling_backward(host64(dlogits), offsets, dq, host64(probs), host64(q), host64(z))
    rdv_pad = np.zeros((B, Nv))
    rdv_pad[:, :N] = rdv
    assert_close("dv", dv, rdv_pad, TOL)
    assert_close("dadv", dadv, R.columns_from_adv(rdadv, offsets), TOL)
    dvw = host64(dvwide)
    assert np.isnan(dvw[:, :3]).all() and np.isnan(dvw[:, 3 + Nv :]).all()


@pytest.mark.parametrize("N,offsets", LAYOUTS)
def test_dueling_kernels_fit_their_grid(cp, N, offsets):
    """The blocks per SM the wrappers launch (DUELING_BLOCKS_PER_SM, which the layout's preamble
    passes the kernels' __launch_bounds__) fit the registers NVRTC gives the two row kernels, which
    keep everything in registers (no local memory)."""
    from foxhunt_core.gpu.launch import dueling_blocks_per_sm, get_kernel

    per_sm = dueling_blocks_per_sm(N, offsets)
    assert branch_defines(offsets, N, HEAD_ALIGN)["DUELING_BLOCKS_PER_SM"] == str(per_sm)
    for name in ("dueling_softmax_forward", "dueling_backward"):
        fn = get_kernel("dueling.cu", name, branch_defines(offsets, N, HEAD_ALIGN))
        assert fn.local_size_bytes == 0, f"{name} spills {fn.local_size_bytes} bytes per thread"
        regs = -(-fn.num_regs // 8) * 8  # allocated per warp in units of 8 per thread
        assert regs * K.THREADS * per_sm <= 65536, f"{name}: {fn.num_regs} registers, {per_sm} blocks per SM"
