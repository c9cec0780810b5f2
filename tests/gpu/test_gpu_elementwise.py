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


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("B,H", SHAPES)
def test_glu_forward_and_backward(cp, rng, B, H, with_bias):
    """The joint layout pv = [pre_gate | val]; the backward recomputes gate and value."""
    pv = np.concatenate([_rand(rng, B, H, scale=6.0), _rand(rng, B, H)], axis=1)  # large |pre|: both sigmoid branches
    bias = _rand(rng, 2 * H) if with_bias else None
    dh = _rand(rng, B, H)
    dbias = None if bias is None else to_dev(cp, bias)
    h = K.glu_forward(to_dev(cp, pv), bias=dbias, h=nan_like(cp, (B, H)))
    _, rh, _ = R.glu_forward(host64(pv), None if bias is None else host64(bias))
    assert_close("h", h, rh, TOL)
    dpv = K.glu_backward(to_dev(cp, dh), to_dev(cp, pv), bias=dbias, dpv=nan_like(cp, (B, 2 * H)))
    assert_close("dpv", dpv, R.glu_backward(host64(dh), host64(pv), None if bias is None else host64(bias)), TOL)


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
@pytest.mark.parametrize("with_bias", [False, True])
def test_vsn_forward_and_backward(cp, rng, with_bias, H):
    B = 200
    h2 = np.maximum(_rand(rng, B, H), 0).astype(np.float32)
    mpre, b, dz = _rand(rng, B, H, scale=5.0), _rand(rng, H), _rand(rng, B, H)
    m, z = K.vsn_forward(to_dev(cp, h2), to_dev(cp, mpre), bias=to_dev(cp, b) if with_bias else None,
                         m=nan_like(cp, (B, H)), z=nan_like(cp, (B, H)))
    rm, rz = R.vsn_forward(host64(h2), host64(mpre), host64(b) if with_bias else None)
    assert_close("m", m, rm, TOL)
    assert_close("z", z, rz, TOL)
    # Without keep only z is written (m stays as it was: here, in place over mpre).
    dmpre_in = to_dev(cp, mpre)
    m2, z2 = K.vsn_forward(to_dev(cp, h2), dmpre_in, bias=to_dev(cp, b) if with_bias else None, m=dmpre_in,
                           z=nan_like(cp, (B, H)), keep=False)
    assert m2 is None
    assert_close("z (no keep)", z2, rz, TOL)
    assert_close("mpre untouched", dmpre_in, mpre, 1e-7)
    dh2, dmpre = K.vsn_backward(to_dev(cp, dz), to_dev(cp, h2), m,
                                dh2=nan_like(cp, (B, H)), dmpre=nan_like(cp, (B, H)))
    rdh2, rdmpre = R.vsn_backward(host64(dz), host64(h2), host64(m))
    assert_close("dh2", dh2, rdh2, TOL)
    assert_close("dmpre", dmpre, rdmpre, TOL)


def test_elementwise_wrappers_check_shapes(cp):
    x = cp.zeros((4, 8), cp.float32)
    with pytest.raises(ValueError, match="bias_relu_forward: bias has shape"):
        K.bias_relu_forward(x, cp.zeros(7, cp.float32))
    with pytest.raises(ValueError, match="glu_backward: dh has shape"):
        K.glu_backward(cp.zeros((4, 7), cp.float32), x)
    with pytest.raises(ValueError, match="glu_forward: pv has 7 columns"):
        K.glu_forward(cp.zeros((4, 7), cp.float32))
    with pytest.raises(TypeError, match="relu_backward: out must be float32"):
        K.relu_backward(x, x, out=cp.zeros((4, 8), cp.float64))
