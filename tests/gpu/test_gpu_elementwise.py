"""Parity of elementwise.cu (GLU, bias+ReLU, ReLU backward, VSN) with the NumPy layers.

Tolerance: ``||out - ref|| / ||ref|| < 1e-5``.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import assert_close, host64, nan_like, to_dev

from foxhunt_core.gpu import kernels as K
from foxhunt_core.gpu import reference as R

pytestmark = pytest.mark.gpu
TOL = 1e-5
SHAPES = [(257, 256), (33, 37)]


def _rand(rng, *shape, scale=2.0):
    return rng.normal(0, scale, shape).astype(np.float32)


@pytest.mark.parametrize("width", [None, "augmented"])
@pytest.mark.parametrize("B,H", SHAPES)
def test_glu_forward_and_backward(cp, rng, B, H, width):
    """The joint layout pv = [pre_gate | val]; the augmented output [h, 0, ..., 0, 1] is the
    input of a GEMM whose weight block keeps the bias in its last row; the backward recomputes
    gate and value and may write over its input."""
    pv = np.concatenate([_rand(rng, B, H, scale=6.0), _rand(rng, B, H)], axis=1)  # large |pre|: both sigmoid branches
    W = None if width is None else -(-(H + 1) // 4) * 4
    dh = _rand(rng, B, H)
    d_pv = to_dev(cp, pv)
    h = K.glu_forward(d_pv, width=W, h=nan_like(cp, (B, W or H)))
    _, rh, _ = R.glu_forward(host64(pv), W)
    assert_close("h", h, rh, TOL)
    if W is not None:
        assert np.array_equal(host64(h)[:, H:], rh[:, H:])  # exact zeros and ones
    assert_close("pv untouched", d_pv, pv, 1e-7)
    dpv = K.glu_backward(to_dev(cp, dh), d_pv, dpv=nan_like(cp, (B, 2 * H)))
    assert_close("dpv", dpv, R.glu_backward(host64(dh), host64(pv)), TOL)
    out = K.glu_backward(to_dev(cp, dh), d_pv, dpv=d_pv)  # in place
    assert out is d_pv
    assert_close("dpv in place", out, R.glu_backward(host64(dh), host64(pv)), TOL)


@pytest.mark.parametrize("H", [64, 37])  # float4 kernel, scalar kernel
def test_glu_over_several_branches_in_views(cp, rng, H):
    """Three branches' joint blocks side by side, read from and written to column blocks of
    wider arrays (the network's [rows, branches x ...] buffers); the backward in place."""
    B, n = 203, 3
    W = -(-(H + 1) // 4) * 4
    pv = np.concatenate([np.concatenate([_rand(rng, B, H, scale=6.0), _rand(rng, B, H)], axis=1) for _ in range(n)],
                        axis=1)
    dh = _rand(rng, B, n * H)
    wide_pv = nan_like(cp, (B, 2 * H * (n + 1)))
    wide_pv[:, 2 * H :] = to_dev(cp, pv)
    wide_h = nan_like(cp, (B, W * (n + 1)))
    h = K.glu_forward(wide_pv[:, 2 * H :], width=W, blocks=n, h=wide_h[:, W:])
    _, rh, _ = R.glu_forward(host64(pv), W, n)
    assert_close("h", h, rh, TOL)
    assert np.isnan(host64(wide_h)[:, :W]).all()
    wide_dh = nan_like(cp, (B, H * (n + 2)))
    wide_dh[:, H : H * (n + 1)] = to_dev(cp, dh)
    dpv = K.glu_backward(wide_dh[:, H : H * (n + 1)], wide_pv[:, 2 * H :], blocks=n, dpv=wide_pv[:, 2 * H :])
    assert_close("dpv", dpv, R.glu_backward(host64(dh), host64(pv), n), TOL)
    assert np.isnan(host64(wide_pv)[:, : 2 * H]).all()
    with pytest.raises(ValueError, match="3 joint blocks"):
        K.glu_forward(wide_pv[:, : 2 * H * 2], blocks=3)


@pytest.mark.parametrize("B,H", SHAPES)
def test_bias_relu_forward_in_place(cp, rng, B, H):
    x, b = _rand(rng, B, H), _rand(rng, H)
    xd = to_dev(cp, x)
    out = K.bias_relu_forward(xd, to_dev(cp, b), out=xd)
    assert out is xd
    assert_close("y", xd, R.bias_relu_forward(host64(x), host64(b)), TOL)


@pytest.mark.parametrize("with_addend", [False, True])
def test_relu_backward(cp, rng, with_addend):
    B, H = 129, 256
    dy, add = _rand(rng, B, H), _rand(rng, B, H)
    y = np.maximum(_rand(rng, B, H), 0.0).astype(np.float32)
    out = K.relu_backward(to_dev(cp, dy), to_dev(cp, y), addend=to_dev(cp, add) if with_addend else None,
                          out=nan_like(cp, (B, H)))
    ref = R.relu_backward(host64(dy), host64(y), host64(add) if with_addend else None)
    assert_close("dx", out, ref, TOL)


@pytest.mark.parametrize("H", [256, 37])  # float4 kernel, scalar kernel
@pytest.mark.parametrize("width", [None, "augmented"])
def test_vsn_forward_and_backward(cp, rng, width, H):
    """z plain or augmented ([z, 0, ..., 0, 1], 4 wider than the next multiple of 4 for the
    network's direction-Q columns), m kept for the first rows only (in place over mpre), and the
    backward reading dz as a column block of a wider array."""
    B, keep = 200, 120
    W = None if width is None else -(-(H + 4) // 4) * 4
    h2 = np.maximum(_rand(rng, B, H), 0).astype(np.float32)
    mpre, dz = _rand(rng, B, H, scale=5.0), _rand(rng, B, H)
    m, z = K.vsn_forward(to_dev(cp, h2), to_dev(cp, mpre), width=W, m=nan_like(cp, (B, H)), z=nan_like(cp, (B, W or H)))
    rm, rz = R.vsn_forward(host64(h2), host64(mpre), W)
    assert_close("m", m, rm, TOL)
    assert_close("z", z, rz, TOL)
    # m for the first `keep` rows only, written over mpre; nothing for keep_rows = 0.
    dmpre_in = to_dev(cp, mpre)
    m2, z2 = K.vsn_forward(to_dev(cp, h2), dmpre_in, width=W, keep_rows=keep, m=dmpre_in[:keep],
                           z=nan_like(cp, (B, W or H)))
    assert_close("m (kept rows)", m2, rm[:keep], TOL)
    assert_close("z (kept rows)", z2, rz, TOL)
    assert_close("mpre past the kept rows", dmpre_in[keep:], mpre[keep:], 1e-7)
    m3, _ = K.vsn_forward(to_dev(cp, h2), to_dev(cp, mpre), width=W, keep_rows=0)
    assert m3 is None
    # Rounded to TF32 (for glu_gemm, which then reads z as it is): exactly the plain z rounded to
    # nearest, every element a TF32 value, and as close to the reference as TF32 allows.
    _, z4 = K.vsn_forward(to_dev(cp, h2), to_dev(cp, mpre), width=W, z=nan_like(cp, (B, W or H)), tf32=True)
    z4, z_plain = z4.get(), z.get()
    assert np.array_equal(z4, R.tf32_nearest(z_plain))
    assert not (z4.view(np.uint32) & np.uint32(0x1FFF)).any()
    assert not np.array_equal(z4, z_plain)  # (the plain z is not TF32 already)
    assert_close("z (TF32)", z4, R.vsn_forward(host64(h2), host64(mpre), W, tf32=True)[1], 5e-4)
    wide = nan_like(cp, (B, H + 5))
    wide[:, :H] = to_dev(cp, dz)
    dh2, dmpre = K.vsn_backward(wide[:, :H], to_dev(cp, h2), m,
                                dh2=nan_like(cp, (B, H)), dmpre=nan_like(cp, (B, H)))
    rdh2, rdmpre = R.vsn_backward(host64(dz), host64(h2), host64(m))
    assert_close("dh2", dh2, rdh2, TOL)
    assert_close("dmpre", dmpre, rdmpre, TOL)
    # dmpre rounded to TF32 (for linear_gemm_relu_backward, which then reads it as it is): exactly
    # the plain dmpre rounded to nearest; dh2 as before.
    dh2_t, dmpre_t = K.vsn_backward(wide[:, :H], to_dev(cp, h2), m, dh2=nan_like(cp, (B, H)),
                                    dmpre=nan_like(cp, (B, H)), tf32=True)
    dmpre_t, dmpre_plain = dmpre_t.get(), dmpre.get()
    assert np.array_equal(dh2_t.get(), dh2.get())
    assert np.array_equal(dmpre_t, R.tf32_nearest(dmpre_plain))
    assert not (dmpre_t.view(np.uint32) & np.uint32(0x1FFF)).any()
    assert not np.array_equal(dmpre_t, dmpre_plain)  # (the plain dmpre is not TF32 already)


@pytest.mark.parametrize("counts", [(37,), (20, 9), (16, 16, 16)])
def test_pack_rows(cp, rng, counts):
    """The network's input: the rows of up to three sources one after another, augmented."""
    S = 50
    xs = [_rand(rng, n, S) for n in counts]
    out = K.pack_rows([to_dev(cp, x) for x in xs], 52, out=nan_like(cp, (sum(counts), 52)))
    ref = R.pack_rows([host64(x) for x in xs], 52)
    assert np.array_equal(host64(out), ref)
    assert np.array_equal(host64(K.pack_rows([to_dev(cp, xs[0])], S)), host64(xs[0]))


@pytest.mark.parametrize("n", [4096 * 3 + 64, 1001])  # float4 kernel, CuPy's copy
def test_copy_of_flat_buffers(cp, rng, n):
    src = to_dev(cp, _rand(rng, n))
    dst = nan_like(cp, (n,))
    assert K.copy(dst, src) is dst
    assert cp.array_equal(dst, src)
    with pytest.raises(ValueError, match="copy: dst has shape"):
        K.copy(cp.zeros(n + 1, cp.float32), src)


def test_elementwise_wrappers_check_shapes(cp):
    x = cp.zeros((4, 8), cp.float32)
    with pytest.raises(ValueError, match="bias_relu_forward: bias has shape"):
        K.bias_relu_forward(x, cp.zeros(7, cp.float32))
    with pytest.raises(ValueError, match=r"glu_backward: dh must be a \[4, 4\] float32 matrix"):
        K.glu_backward(cp.zeros((4, 7), cp.float32), x)
    with pytest.raises(ValueError, match="glu_forward: pv has 7 columns"):
        K.glu_forward(cp.zeros((4, 7), cp.float32))
    with pytest.raises(TypeError, match="relu_backward: out must be float32"):
        K.relu_backward(x, x, out=cp.zeros((4, 8), cp.float64))
    with pytest.raises(ValueError, match="glu_forward: width 3 is less than"):
        K.glu_forward(x, width=3)
    with pytest.raises(ValueError, match="vsn_forward: keep_rows 5 outside"):
        K.vsn_forward(x, x, keep_rows=5)
    with pytest.raises(ValueError, match="vsn_backward: dz must have unit column stride"):
        K.vsn_backward(cp.zeros((8, 4), cp.float32).T, x, x)
    with pytest.raises(ValueError, match="pack_rows: takes one to three sources"):
        K.pack_rows([x] * 4, 8)
