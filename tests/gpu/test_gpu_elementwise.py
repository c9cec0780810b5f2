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
def test_glu_forward(cp, rng, B, H, with_bias):
    pre, val = _rand(rng, B, H, scale=6.0), _rand(rng, B, H)  # large |pre|: both sigmoid branches
    bg, bv = (_rand(rng, H), _rand(rng, H)) if with_bias else (None, None)
    val_d = to_dev(cp, val)
    gate, h = K.glu_forward(
        to_dev(cp, pre), val_d,
        gate_bias=None if bg is None else to_dev(cp, bg), val_bias=None if bv is None else to_dev(cp, bv),
        gate=nan_like(cp, (B, H)), h=nan_like(cp, (B, H)),
    )
    rg, rh, rval = R.glu_forward(host64(pre), host64(val), None if bg is None else host64(bg),
                                 None if bv is None else host64(bv))
    assert_close("gate", gate, rg, TOL)
    assert_close("h", h, rh, TOL)
    assert_close("val", val_d, rval, TOL)


@pytest.mark.parametrize("B,H", SHAPES)
def test_glu_backward(cp, rng, B, H):
    dh, val = _rand(rng, B, H), _rand(rng, B, H)
    gate = (1.0 / (1.0 + np.exp(-_rand(rng, B, H)))).astype(np.float32)
    dpre, dval = K.glu_backward(to_dev(cp, dh), to_dev(cp, gate), to_dev(cp, val),
                                dpre_gate=nan_like(cp, (B, H)), dval=nan_like(cp, (B, H)))
    rdpre, rdval = R.glu_backward(host64(dh), host64(gate), host64(val))
    assert_close("dpre_gate", dpre, rdpre, TOL)
    assert_close("dval", dval, rdval, TOL)


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
    with pytest.raises(ValueError, match="glu_backward: gate has shape"):
        K.glu_backward(x, cp.zeros((4, 7), cp.float32), x)
    with pytest.raises(TypeError, match="relu_backward: out must be float32"):
        K.relu_backward(x, x, out=cp.zeros((4, 8), cp.float64))
