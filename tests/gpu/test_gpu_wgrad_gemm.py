"""Parity of wgrad_gemm.cu (a weight gradient over the batch as a TF32 tensor-core GEMM, the batch
split over the CTAs, operand A from registers; then the splits' ordered sum) with the NumPy twin
``reference.wgrad_gemm``.

With TF32 inputs (the low 13 mantissa bits cleared: rounding to nearest leaves them as they are)
the products are exact and the error is float32 accumulation's over K terms:
``||out - ref|| / ||ref|| < 5e-5`` up to K = 16384 (a float32 sum's relative error grows like
``sqrt(K)`` ulps: 128 x 6e-8 = 8e-6 there). With float32 inputs the reference is the float64
product of the inputs rounded to TF32 to nearest (``reference.tf32_nearest``, as cuBLAS rounds
them): the same tolerance holds there, while the product of the truncated inputs (what the tensor
cores alone would use) is an order of magnitude further off. The output is a column block of a
NaN-poisoned wider array, whose other columns must stay NaN; y a column block of a wider array.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import assert_close, host64, nan_like, rel_err, skip_without_wgmma, to_dev
from gpu_parity import tf32_truncated as tf32

from foxhunt_core.gpu import kernels as K
from foxhunt_core.gpu import reference as R

pytestmark = pytest.mark.gpu
TOL = 5e-5


@pytest.fixture(autouse=True)
def _hopper(cp):
    skip_without_wgmma()


def _run(cp, x, y, lead=8, pitch_pad=12, **kw):
    """wgrad_gemm over x [K, N] (transposed on the device) and y [K, M] (a column block of a wider
    array), into a column block of a NaN-poisoned [N, lead + M + 8] array; returns the whole array."""
    Kb, M = y.shape
    wide_y = cp.zeros((Kb, 4 + M + pitch_pad), cp.float32)
    wide_y[:, 4 : 4 + M] = to_dev(cp, y)
    xt = K.transpose(to_dev(cp, x))
    out_wide = nan_like(cp, (x.shape[1], lead + M + 8))
    got = K.wgrad_gemm(xt, wide_y[:, 4 : 4 + M], out=out_wide[:, lead : lead + M], **kw)
    assert got.data.ptr == out_wide[:, lead:].data.ptr
    return host64(out_wide)


def _check(got, ref, lead=8):
    M = ref.shape[1]
    assert_close("out", got[:, lead : lead + M], ref, TOL)
    assert np.isnan(got[:, :lead]).all() and np.isnan(got[:, lead + M :]).all(), "written outside out's columns"


# (K, M): the network's joint GLU block and the direction branch's with the value head at 16384 rows;
# one chunk of 32 rows and a K tail inside a chunk; M under one tile, with a tile tail; one split.
# N: the tail of 8 (up to 264: the default z is 260) and the wide variant's of 16 (265 to 272: z
# with tlob_inject's columns is 268)
@pytest.mark.parametrize("Kb,M", [(16384, 1536), (16384, 576), (4, 4), (300, 100), (1000, 260), (132, 8)])
@pytest.mark.parametrize("N", [260, 257, 264, 265, 268, 272])
def test_wgrad_gemm_matches_the_reference(cp, rng, Kb, M, N):
    x = tf32(rng.normal(0, 1.0, (Kb, N)))
    y = tf32(rng.normal(0, 1.0, (Kb, M)))
    _check(_run(cp, x, y), R.wgrad_gemm(host64(x), host64(y)))


def test_wgrad_gemm_zeroes_rows_outside_the_kept_columns(cp, rng):
    """The network's direction-Q rows of z (256..258) meet only the magnitude branch's weights:
    their gradient is zero outside its columns, and everything else is the product."""
    Kb, N, M = 2048, 260, 1536
    x, y = tf32(rng.normal(0, 1.0, (Kb, N))), tf32(rng.normal(0, 1.0, (Kb, M)))
    ref = R.wgrad_gemm(host64(x), host64(y), (256, 259), (0, 512))
    assert np.all(ref[256:259, 512:] == 0.0) and np.all(ref[256:259, :512] != 0.0)
    _check(_run(cp, x, y, zero_rows=(256, 259), keep_cols=(0, 512)), ref)
    ref = R.wgrad_gemm(host64(x), host64(y), (256, 259))  # nothing kept
    _check(_run(cp, x, y, zero_rows=(256, 259)), ref)
    x = tf32(rng.normal(0, 1.0, (Kb, 268)))  # the wide variant (z with branch-input columns)
    ref = R.wgrad_gemm(host64(x), host64(y), (256, 259), (512, 1024))
    _check(_run(cp, x, y, zero_rows=(256, 259), keep_cols=(512, 1024)), ref)


def test_wgrad_gemm_rounds_both_operands_to_nearest(cp, rng):
    """float32 inputs: y is rounded in the kernel's registers, x by the transpose; the result is the
    product of the inputs rounded to nearest, not of the truncated ones."""
    Kb, N, M = 8192, 260, 576
    x = rng.normal(0, 1.0, (Kb, N)).astype(np.float32)
    y = rng.normal(0, 1.0, (Kb, M)).astype(np.float32)
    got = _run(cp, x, y)[:, 8 : 8 + M]
    nearest = host64(R.tf32_nearest(x)).T @ host64(R.tf32_nearest(y))
    truncated = host64(tf32(x)).T @ host64(tf32(y))
    e_near, e_trunc = rel_err(got, nearest), rel_err(got, truncated)
    assert e_near < TOL, e_near
    assert e_trunc > 10 * e_near, (e_near, e_trunc)


def test_wgrad_gemm_splits_cover_the_batch(cp):
    """Each CTA takes 128 columns over one slice of the batch: slices a multiple of 32 rows long, as
    many as to fill the SMs about once (never shorter than 4 chunks), the last one ending at K."""
    from foxhunt_core.gpu.launch import sm_count

    for Kb, M in [(65536, 1536), (65536, 576), (16384, 1536), (4096, 576), (4, 4), (100, 128), (1 << 20, 4)]:
        splits, k_split = K.wgrad_splits(Kb, M)
        tiles = -(-M // 128)
        assert k_split % 32 == 0 and (splits - 1) * k_split < Kb <= splits * k_split, (Kb, M, splits, k_split)
        assert splits * tiles <= sm_count() + tiles, (Kb, M, splits)
        assert splits == 1 or k_split >= 4 * 32, (Kb, M, splits, k_split)


def test_wgrad_gemm_replays_from_a_graph(cp, rng):
    """Captured (its tensor maps are kernel parameters, its partial sums a buffer of the capture's
    own memory pool, as the update's graph has one), the graph replays to the product of the inputs
    it is given then."""
    Kb, N, M = 4096, 260, 576
    xt = cp.empty((N, Kb), cp.float32)
    y = cp.empty((Kb, M), cp.float32)
    out = nan_like(cp, (N, M))
    pool = cp.cuda.MemoryPool()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream, cp.cuda.using_allocator(pool.malloc):
        K.wgrad_gemm(xt, y, out=out)  # compiled, and its scratch pooled, outside the capture
        stream.synchronize()
        stream.begin_capture()
        K.wgrad_gemm(xt, y, out=out)
        graph = stream.end_capture()
    for _ in range(2):
        x_h, y_h = tf32(rng.normal(0, 1.0, (Kb, N))), tf32(rng.normal(0, 1.0, (Kb, M)))
        xt[...] = to_dev(cp, np.ascontiguousarray(x_h.T))
        y[...] = to_dev(cp, y_h)
        out.fill(np.nan)
        cp.cuda.Device().synchronize()
        graph.launch(stream=stream)
        stream.synchronize()
        assert_close("replay", out, R.wgrad_gemm(host64(x_h), host64(y_h)), TOL)


@pytest.mark.parametrize("case", ["N", "N wide", "K", "M", "pitch"])
def test_wgrad_gemm_refuses_bad_layouts(cp, case):
    xt, y = cp.zeros((260, 64), cp.float32), cp.zeros((64, 128), cp.float32)
    if case == "N":
        xt = cp.zeros((256, 64), cp.float32)  # one wgmma of 256 would do: not this kernel's tile
    elif case == "N wide":
        xt = cp.zeros((273, 64), cp.float32)  # past the wide variant's tail
    elif case == "K":
        y = cp.zeros((60, 128), cp.float32)
    elif case == "M":
        y = cp.zeros((64, 130), cp.float32)[:, :126]
    else:
        y = cp.zeros((64, 131), cp.float32)[:, :128]  # a row pitch TMA cannot take
    with pytest.raises(ValueError, match="wgrad_gemm"):
        K.wgrad_gemm(xt, y)


def _run_sets(cp, xs, ys, lead=4):
    """wgrad_gemm_sets over x's as column blocks (260 apart, as the GLUs' augmented outputs; 264 for
    N = 264) of one array and y's as column blocks of one [K, sets M + 4] array, into column blocks
    (M apart, after ``lead`` columns) of one NaN-poisoned [N, lead + sets M + 8] array."""
    Kb, N = xs[0].shape
    M = ys[0].shape[1]
    sets = len(xs)
    W = max(260, -(-N // 4) * 4)  # (x's blocks 260 apart, or N rounded up to 4 past that)
    x_wide = cp.zeros((Kb, W * sets), cp.float32)
    y_wide = cp.zeros((Kb, M * sets + 4), cp.float32)
    for i in range(sets):
        x_wide[:, W * i : W * i + N] = to_dev(cp, xs[i])
        y_wide[:, M * i : M * (i + 1)] = to_dev(cp, ys[i])
    out_wide = nan_like(cp, (N, lead + M * sets + 8))
    K.wgrad_gemm_sets([x_wide[:, W * i : W * i + N] for i in range(sets)],
                      [y_wide[:, M * i : M * (i + 1)] for i in range(sets)],
                      [out_wide[:, lead + M * i : lead + M * (i + 1)] for i in range(sets)])
    return host64(out_wide)


# the advantage heads' weight gradients (N = 260 of h, M = 156) at 16384 rows, K tails, M within
# and past one tile, N at both ends of the kernel's range
@pytest.mark.parametrize("Kb,M,N,sets", [(16384, 156, 260, 3), (16384, 156, 260, 1), (1000, 156, 257, 4),
                                         (300, 100, 264, 2), (132, 8, 260, 4), (4, 256, 260, 2)])
def test_wgrad_gemm_sets_matches_the_reference(cp, rng, Kb, M, N, sets):
    xs = [tf32(rng.normal(0, 1.0, (Kb, N))) for _ in range(sets)]
    ys = [tf32(rng.normal(0, 1.0, (Kb, M))) for _ in range(sets)]
    got = _run_sets(cp, xs, ys)
    for i in range(sets):
        assert_close(f"out[{i}]", got[:, 4 + M * i : 4 + M * (i + 1)], R.wgrad_gemm(host64(xs[i]), host64(ys[i])), TOL)
    assert np.isnan(got[:, :4]).all() and np.isnan(got[:, 4 + M * sets :]).all(), "written outside the outputs"


def test_wgrad_gemm_sets_rounds_both_operands_to_nearest(cp, rng):
    """float32 inputs: x rounded as the kernel transposes it, y in registers: the product of the
    inputs rounded to nearest, not of the truncated ones."""
    Kb, N, M = 8192, 260, 156
    x = rng.normal(0, 1.0, (Kb, N)).astype(np.float32)
    y = rng.normal(0, 1.0, (Kb, M)).astype(np.float32)
    got = _run_sets(cp, [x], [y])[:, 4 : 4 + M]
    e_near = rel_err(got, host64(R.tf32_nearest(x)).T @ host64(R.tf32_nearest(y)))
    e_trunc = rel_err(got, host64(tf32(x)).T @ host64(tf32(y)))
    assert e_near < TOL and e_trunc > 10 * e_near, (e_near, e_trunc)


def test_wgrad_gemm_sets_replays_from_a_graph(cp, rng):
    Kb, N, M = 4096, 260, 156
    x = cp.empty((Kb, 2 * N), cp.float32)
    y = cp.empty((Kb, 2 * M), cp.float32)
    out = nan_like(cp, (N, 2 * M))
    args = ([x[:, :N], x[:, N:]], [y[:, :M], y[:, M:]], [out[:, :M], out[:, M:]])
    pool = cp.cuda.MemoryPool()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream, cp.cuda.using_allocator(pool.malloc):
        K.wgrad_gemm_sets(*args)
        stream.synchronize()
        stream.begin_capture()
        K.wgrad_gemm_sets(*args)
        graph = stream.end_capture()
    for _ in range(2):
        x_h, y_h = tf32(rng.normal(0, 1.0, (Kb, 2 * N))), tf32(rng.normal(0, 1.0, (Kb, 2 * M)))
        x[...], y[...] = to_dev(cp, x_h), to_dev(cp, y_h)
        out.fill(np.nan)
        cp.cuda.Device().synchronize()
        graph.launch(stream=stream)
        stream.synchronize()
        for i in range(2):
            assert_close(f"replay {i}", out[:, M * i : M * (i + 1)],
                         R.wgrad_gemm(host64(x_h)[:, N * i : N * (i + 1)], host64(y_h)[:, M * i : M * (i + 1)]), TOL)


def test_wgrad_gemm_sets_refuses_bad_layouts(cp):
    x, y, o = cp.zeros((64, 260), cp.float32), cp.zeros((64, 156), cp.float32), cp.zeros((260, 320), cp.float32)
    with pytest.raises(ValueError, match="wgrad_gemm_tx"):
        K.wgrad_gemm_sets([x] * 5, [y] * 5, [o[:, :156]] * 5)
    with pytest.raises(ValueError, match="wgrad_gemm_tx"):
        K.wgrad_gemm_sets([x, x], [y, y], [o[:, :156], cp.zeros((260, 156), cp.float32)])  # two row pitches
    with pytest.raises(ValueError, match="wgrad_gemm_tx"):
        K.wgrad_gemm_sets([cp.zeros((64, 256), cp.float32)], [y], [cp.zeros((256, 156), cp.float32)])
