"""Parity of linear_gemm.cu (up to four linear layers as one TF32 tensor-core GEMM: TMA loads and
stores, warp-specialized, persistent) with the NumPy twin ``reference.linear_gemm``.

The inputs are TF32 values (the low 13 mantissa bits cleared: the kernel's rounding to nearest
leaves them as they are), so the products are exact and the tolerance is float32 accumulation's:
``||out - ref|| / ||ref|| < 2e-5``. The outputs are column blocks of one NaN-poisoned wider array,
as the network's advantage heads are: every element a set should write is checked, and every
other one (its neighbours' columns, the margins) must stay NaN.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import assert_close, host64, nan_like, skip_without_wgmma, to_dev
from gpu_parity import tf32_truncated as tf32

from foxhunt_core.gpu import kernels as K
from foxhunt_core.gpu import reference as R

pytestmark = pytest.mark.gpu
TOL = 2e-5


@pytest.fixture(autouse=True)
def _hopper(cp):
    skip_without_wgmma()


def _sets(cp, rng, M, K_, N, sets, pitch_a, lead=4):
    """``sets`` inputs as column blocks of one [M, pitch_a * sets] array, their weights, biases, and
    outputs as column blocks (N apart, after ``lead`` columns) of one NaN-poisoned array."""
    a_host = [tf32(rng.normal(0, 1.0, (M, K_))) for _ in range(sets)]
    w_host = [tf32(rng.normal(0, 1.0 / np.sqrt(K_), (K_, N))) for _ in range(sets)]
    b_host = [rng.normal(0, 1.0, N).astype(np.float32) for _ in range(sets)]
    a_wide = cp.zeros((M, pitch_a * sets), cp.float32)
    for i, x in enumerate(a_host):
        a_wide[:, pitch_a * i : pitch_a * i + K_] = to_dev(cp, x)
    a = [a_wide[:, pitch_a * i : pitch_a * i + K_] for i in range(sets)]
    wt = [K.transpose(to_dev(cp, w)) for w in w_host]
    bias = [to_dev(cp, b) for b in b_host]
    out_wide = nan_like(cp, (M, lead + N * sets + 8))
    out = [out_wide[:, lead + N * i : lead + N * (i + 1)] for i in range(sets)]
    return a_host, w_host, b_host, a, wt, bias, out_wide, out


def _check_outputs(out_wide, refs, N, lead=4):
    got = host64(out_wide)
    for i, ref in enumerate(refs):
        assert_close(f"out[{i}]", got[:, lead + N * i : lead + N * (i + 1)], ref, TOL)
    cols = lead + N * len(refs)
    assert np.isnan(got[:, :lead]).all() and np.isnan(got[:, cols:]).all(), "written outside the sets' columns"


# M: row tiles with a tail (300), past one tile per SM (6000: the persistent loop)
@pytest.mark.parametrize("M", [300, 6000])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_gemm_four_heads_side_by_side(cp, rng, M, with_bias):
    """The network's advantage heads: four sets of [M, 256] x [256, 156], the inputs column blocks
    of the GLUs' augmented output (260 apart), the outputs adjacent column blocks of one array:
    each tile's 160 columns reach 4 past a set's 156, which must not be written."""
    K_, N, sets = 256, 156, 4
    a_host, w_host, b_host, a, wt, bias, out_wide, out = _sets(cp, rng, M, K_, N, sets, pitch_a=260)
    K.linear_gemm(a, wt, out, bias=bias if with_bias else None)
    refs = R.linear_gemm([host64(x) for x in a_host], [host64(w) for w in w_host],
                         [host64(b) for b in b_host] if with_bias else None)
    _check_outputs(out_wide, refs, N)


@pytest.mark.parametrize(("K_", "N", "sets"), [(100, 200, 1), (44, 64, 3), (260, 320, 2), (120, 156, 2)])
def test_linear_gemm_other_shapes(cp, rng, K_, N, sets):
    """Last k chunks of 1 (100 = 3 x 32 + 4, 260 = 8 x 32 + 4), 2 (44 = 32 + 12) and 3 (120 =
    3 x 32 + 24) k steps of 8 (the heads' K = 256 has 4); N past one 160-column tile (200, 320:
    two column tiles, the second clipped) and under one (64)."""
    M = 700
    a_host, w_host, b_host, a, wt, bias, out_wide, out = _sets(cp, rng, M, K_, N, sets, pitch_a=-(-K_ // 4) * 4 + 8)
    K.linear_gemm(a, wt, out, bias=bias)
    refs = R.linear_gemm([host64(x) for x in a_host], [host64(w) for w in w_host], [host64(b) for b in b_host])
    _check_outputs(out_wide, refs, N)


def test_linear_gemm_relu_and_rounded_output(cp, rng):
    """``relu`` and ``tf32_out``: the output is the ReLU of the product, every element a TF32 value,
    each the float32 result rounded to nearest."""
    M, K_, N, sets = 900, 256, 156, 2
    a_host, w_host, b_host, a, wt, bias, out_wide, out = _sets(cp, rng, M, K_, N, sets, pitch_a=260)
    K.linear_gemm(a, wt, out, bias=bias, relu=True)
    plain = out_wide.get().copy()
    refs = R.linear_gemm([host64(x) for x in a_host], [host64(w) for w in w_host], [host64(b) for b in b_host],
                         relu=True)
    _check_outputs(out_wide, refs, N)
    assert (plain[:, 4 : 4 + N * sets] == 0).mean() > 0.3  # (the ReLU clipped a good share)
    out_wide[...] = np.nan
    K.linear_gemm(a, wt, out, bias=bias, relu=True, tf32_out=True)
    rounded = out_wide.get()
    cols = slice(4, 4 + N * sets)
    assert np.array_equal(rounded[:, cols], R.tf32_nearest(plain[:, cols]))
    assert not (rounded[:, cols].view(np.uint32) & np.uint32(0x1FFF)).any()


def test_linear_gemm_rounds_a_except_where_its_writer_did(cp, rng):
    """Inputs not representable in TF32, ``rounded`` 128: the first 4 k chunks are read as they are
    (the tensor cores truncate them), the others rounded to nearest, as are the weights."""
    M, K_, N, rounded = 800, 256, 156, 128
    a_host = rng.normal(0, 1.0, (M, K_)).astype(np.float32)
    w_host = (rng.normal(0, 1.0 / np.sqrt(K_), (K_, N)) + 0.02).astype(np.float32)
    a, wt = to_dev(cp, a_host), K.transpose(to_dev(cp, w_host))
    out = K.linear_gemm([a], [wt], rounded=rounded)[0]
    expect_a = np.concatenate([tf32(a_host[:, :rounded]), R.tf32_nearest(a_host[:, rounded:])], axis=1)
    ref = host64(expect_a) @ host64(R.tf32_nearest(w_host))
    all_rounded = host64(R.tf32_nearest(a_host)) @ host64(R.tf32_nearest(w_host))
    assert_close("out", out, ref, TOL)
    err, err_all = (float(np.linalg.norm(host64(out) - r) / np.linalg.norm(r)) for r in (ref, all_rounded))
    assert err_all > 20 * err, f"out is about as close to the all-rounded product ({err_all:.3g} vs {err:.3g})"
    out0 = K.linear_gemm([a], [wt])[0]  # rounded = 0: all of a rounded
    assert_close("out (a rounded in the kernel)", out0, all_rounded, TOL)


def test_linear_gemm_in_a_cuda_graph(cp, rng):
    """Captured once (the tensor maps travel in the kernel's by-value argument), replayed on new
    inputs written into the same buffers."""
    M, K_, N, sets = 1000, 128, 156, 3
    a_host, w_host, b_host, a, wt, bias, out_wide, out = _sets(cp, rng, M, K_, N, sets, pitch_a=K_)
    K.linear_gemm(a, wt, out, bias=bias)  # compiled outside the capture
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        K.linear_gemm(a, wt, out, bias=bias)
        graph = stream.end_capture()
        for _ in range(2):
            a_host = [tf32(rng.normal(0, 1.0, (M, K_))) for _ in range(sets)]
            for x, xh in zip(a, a_host):
                x[...] = to_dev(cp, xh)
            out_wide[...] = np.nan
            stream.synchronize()
            graph.launch(stream)
            stream.synchronize()
            refs = R.linear_gemm([host64(x) for x in a_host], [host64(w) for w in w_host],
                                 [host64(b) for b in b_host])
            _check_outputs(out_wide, refs, N)


def test_linear_gemm_rejects_bad_layouts(cp):
    a = cp.zeros((64, 256), cp.float32)
    wt = cp.zeros((156, 256), cp.float32)
    with pytest.raises(ValueError, match="linear_gemm: 1 to 4 sets"):
        K.linear_gemm([a] * 5, [wt] * 5)
    with pytest.raises(ValueError, match="linear_gemm: needs N even"):
        K.linear_gemm([a], [cp.zeros((155, 256), cp.float32)])
    with pytest.raises(ValueError, match=r"linear_gemm: wt\[1\] must be a \[156, 256\]"):
        K.linear_gemm([a, a], [wt, cp.zeros((156, 252), cp.float32)])
    with pytest.raises(ValueError, match="linear_gemm: rounded 300 outside 0..256"):
        K.linear_gemm([a], [wt], rounded=300)
    with pytest.raises(ValueError, match=r"linear_gemm: a\[0\] must .* row pitch a multiple of 16 bytes"):
        K.linear_gemm([cp.zeros((64, 258), cp.float32)[:, :256]], [wt])
    with pytest.raises(ValueError, match=r"linear_gemm: bias\[0\] has shape"):
        K.linear_gemm([a], [wt], bias=[cp.zeros(150, cp.float32)])


# M: a row tile with a tail (300), past one tile per SM of both column tiles (9000: the persistent
# loop); N: two whole column tiles of 128 (the trunk's 256), a clipped second one (200)
@pytest.mark.parametrize(("M", "K_", "N"), [(300, 256, 256), (9000, 256, 256), (700, 100, 200)])
@pytest.mark.parametrize("with_addend", [True, False])
def test_linear_gemm_relu_backward(cp, rng, M, K_, N, with_addend):
    """``(a @ wt.T + addend) * (y > 0)``: a ReLU layer's input gradient, every operand a view of a
    wider array (the output's neighbours NaN-poisoned: they must stay NaN); y holds negatives,
    zeros and positives, and the output is exactly zero wherever y is not positive."""
    a_host = tf32(rng.normal(0, 1.0, (M, K_)))
    w_host = tf32(rng.normal(0, 1.0 / np.sqrt(K_), (N, K_)))  # [N, K]: the next layer's weights as it holds them
    y_host = np.maximum(rng.normal(0, 1.0, (M, N)), -0.5).astype(np.float32)
    y_host[rng.random((M, N)) < 0.1] = 0.0
    add_host = rng.normal(0, 1.0, (M, N)).astype(np.float32)
    a_wide, y_wide, add_wide = (cp.zeros((M, n + 12), cp.float32) for n in (K_, N, N))
    a, y, addend = a_wide[:, 4 : 4 + K_], y_wide[:, 8 : 8 + N], add_wide[:, 4 : 4 + N]
    a[...], y[...], addend[...] = to_dev(cp, a_host), to_dev(cp, y_host), to_dev(cp, add_host)
    out_wide = nan_like(cp, (M, 4 + N + 8))
    got = K.linear_gemm_relu_backward(a, K.round_tf32(to_dev(cp, w_host)), y, addend=addend if with_addend else None,
                                      out=out_wide[:, 4 : 4 + N])
    assert got.data.ptr == out_wide[:, 4:].data.ptr
    ref = R.linear_gemm_relu_backward(host64(a_host), host64(w_host).T, host64(y_host),
                                      host64(add_host) if with_addend else None)
    _check_outputs(out_wide, [ref], N)
    assert (host64(out_wide)[:, 4 : 4 + N][y_host <= 0] == 0).all()
    assert (y_host <= 0).mean() > 0.3 and (y_host > 0).mean() > 0.3


def test_linear_gemm_relu_backward_rounding(cp, rng):
    """Inputs not representable in TF32: a rounded to nearest in the kernel (``rounded`` 0) or read
    as it is (``rounded`` K: its writer's word); ``tf32_out``: every element of the output the
    float32 result rounded to nearest."""
    M, K_, N = 2000, 256, 256
    a_host = rng.normal(0, 1.0, (M, K_)).astype(np.float32)
    w_host = (rng.normal(0, 1.0 / np.sqrt(K_), (N, K_)) + 0.02).astype(np.float32)
    y_host = rng.normal(0, 1.0, (M, N)).astype(np.float32)
    a, wt, y = to_dev(cp, a_host), K.round_tf32(to_dev(cp, w_host)), to_dev(cp, y_host)
    w64 = host64(R.tf32_nearest(w_host)).T
    out = K.linear_gemm_relu_backward(a, wt, y)
    assert_close("out (a rounded)", out, R.linear_gemm_relu_backward(host64(R.tf32_nearest(a_host)), w64, y_host), TOL)
    out_t = K.linear_gemm_relu_backward(a, wt, y, rounded=K_)
    assert_close("out (a as it is)", out_t, R.linear_gemm_relu_backward(host64(tf32(a_host)), w64, y_host), TOL)
    plain = out.get()
    rounded = K.linear_gemm_relu_backward(a, wt, y, tf32_out=True).get()
    assert np.array_equal(rounded, R.tf32_nearest(plain))
    assert not (rounded.view(np.uint32) & np.uint32(0x1FFF)).any()


def test_linear_gemm_relu_backward_rejects_bad_operands(cp):
    a, wt, y = cp.zeros((64, 256), cp.float32), cp.zeros((256, 256), cp.float32), cp.zeros((64, 256), cp.float32)
    with pytest.raises(ValueError, match=r"linear_gemm_relu_backward: y must be a \[64, 256\]"):
        K.linear_gemm_relu_backward(a, wt, y[:, :128])
    with pytest.raises(ValueError, match="linear_gemm_relu_backward: addend needs 8-byte alignment"):
        K.linear_gemm_relu_backward(a, wt, y, addend=cp.zeros((64, 260), cp.float32)[:, 1:257])
    with pytest.raises(ValueError, match=r"linear_gemm_relu_backward: wt\[0\] must be a \[256, 256\]"):
        K.linear_gemm_relu_backward(a, wt[:, :128], y)
