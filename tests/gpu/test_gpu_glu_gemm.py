"""Parity of glu_gemm.cu (the GLU layer as one TF32 tensor-core GEMM with the gate in its
epilogue; TMA loads, warp-specialized, persistent) with the NumPy twin ``reference.glu_gemm``.

The inputs are rounded to TF32 first (the low 13 mantissa bits dropped: the kernel's own rounding
to nearest leaves them as they are), so the products are exact and the tolerance is float32
accumulation's:
``||out - ref|| / ||ref|| < 2e-5``. Outputs are views into NaN-poisoned wider arrays: every element
the kernel should write is checked, every other one must stay NaN.
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


def _case(rng, B, K_, H, blocks, bias):
    u = tf32(rng.normal(0, 1.0, (B, K_)))
    w = tf32(rng.normal(0, 3.0 / np.sqrt(K_), (K_, 2 * H * blocks)))  # |pre| up to ~10: both sigmoid branches
    b = rng.normal(0, 1.0, 2 * H * blocks).astype(np.float32) if bias else None
    return u, w, b


def _check(cp, u, w, b, blocks, width, h_wide, lead, pv_wide, P, H, pv_lead=None):
    rpv, rh = R.glu_gemm(host64(u), host64(w), None if b is None else host64(b), width, blocks)
    cols = blocks * width
    h = host64(h_wide)
    assert_close("h", h[:, lead : lead + cols], rh, TOL)
    for i in range(blocks):  # the augmented tails exactly
        tail = h[:, lead + i * width + H : lead + (i + 1) * width]
        assert np.array_equal(tail, rh[:, i * width + H : (i + 1) * width])
    assert np.isnan(h[:, :lead]).all() and np.isnan(h[:, lead + cols :]).all(), "h written outside its view"
    if pv_wide is not None:
        pl = lead if pv_lead is None else pv_lead
        pv = host64(pv_wide)
        assert_close("pv", pv[:P, pl : pl + 2 * H * blocks], rpv[:P], TOL)
        assert np.isnan(pv[P:]).all(), "pv written past its rows"
        assert np.isnan(pv[:, :pl]).all() and np.isnan(pv[:, pl + 2 * H * blocks :]).all()


@pytest.mark.parametrize("B", [300, 3000])  # 18 tiles; 144 tiles (past one per SM: the persistent loop)
def test_glu_gemm_three_branches_ones_column(cp, rng, B):
    """The network's joint GLU of three branches: K = 260 (the augmented z, its bias in W's last
    row), row counts no multiple of the 128-row tile, pv kept for the first rows only."""
    H, blocks, K_, width, lead = 256, 3, 260, 260, 8
    u, w, _ = _case(rng, B, K_, H, blocks, bias=False)
    h_wide = nan_like(cp, (B, lead + blocks * width + 4))
    P = B // 3
    pv_wide = nan_like(cp, (P, lead + 2 * H * blocks + 4))
    out = K.glu_gemm(to_dev(cp, u), to_dev(cp, w), width=width, blocks=blocks,
                     h=h_wide[:, lead : lead + blocks * width], pv=pv_wide[:, lead : lead + 2 * H * blocks])
    assert out.data.ptr == h_wide[:, lead:].data.ptr
    _check(cp, u, w, None, blocks, width, h_wide, lead, pv_wide, P, H)


@pytest.mark.parametrize("ring", [(3, 4, 4), (3, 4, 1), (4, 2, 2), (4, 1, 1)])
def test_glu_gemm_other_rings_and_staging(cp, rng, ring):
    """The rings of stages and h's staging buffers the kernel builds besides its default (four
    stages, two boxes used in turn; the test above): the three-stage ring with the whole tile's h
    at once, and hand-offs of one box or two into buffers that take them in turn, over 40 tiles per
    SM (each staging slot reused many times) with pv for the first third of the rows."""
    config = K.GluGemmConfig.ring(*ring)
    B, H, blocks, K_, width, lead = 40 * 128 * 132 // 6, 256, 3, 260, 260, 8
    u, w, _ = _case(rng, B, K_, H, blocks, bias=False)
    h_wide = nan_like(cp, (B, lead + blocks * width + 4))
    P = B // 3
    pv_wide = nan_like(cp, (P, lead + 2 * H * blocks + 4))
    K.glu_gemm(to_dev(cp, u), to_dev(cp, w), width=width, blocks=blocks,
               h=h_wide[:, lead : lead + blocks * width], pv=pv_wide[:, lead : lead + 2 * H * blocks], config=config)
    _check(cp, u, w, None, blocks, width, h_wide, lead, pv_wide, P, H)


@pytest.mark.parametrize("cluster", [1, 2])
def test_glu_gemm_wide_producer_warpgroup(cp, rng, cluster):
    """The variant whose producer is a whole warpgroup handing its registers to the consumers
    (GluGemmConfig.wide, what a gate fragment with parameters gets) with the sigmoid: the twin's
    results, over many tiles an SM, and the same bits as the single producer warp's."""
    B, H, blocks, K_, width, lead = 20 * 128 * 132 // 6 + 77, 256, 3, 260, 260, 8
    u, w, _ = _case(rng, B, K_, H, blocks, bias=False)
    du, dw = to_dev(cp, u), to_dev(cp, w)
    outs = []
    for wide in (True, False):
        h_wide = nan_like(cp, (B, lead + blocks * width + 4))
        P = B // 3
        pv_wide = nan_like(cp, (P, lead + 2 * H * blocks + 4))
        K.glu_gemm(du, dw, width=width, blocks=blocks, h=h_wide[:, lead : lead + blocks * width],
                   pv=pv_wide[:, lead : lead + 2 * H * blocks], config=K.GluGemmConfig(wide=wide, cluster=cluster))
        _check(cp, u, w, None, blocks, width, h_wide, lead, pv_wide, P, H)
        outs.append((h_wide, pv_wide))
    assert cp.array_equal(outs[0][0], outs[1][0], equal_nan=True)
    assert cp.array_equal(outs[0][1], outs[1][1], equal_nan=True)


@pytest.mark.parametrize("lead", [2, 4])
def test_glu_gemm_pv_from_the_registers_where_tma_cannot_store_it(cp, rng, lead):
    """pv 8-byte aligned only (lead 2: TMA needs 16) goes out from the registers; so does a
    16-byte aligned pv with the config's pv_tma off (lead 4). Both with the bias, rows past pv's
    last one left alone."""
    B, H, K_, width, blocks, h_lead = 1500, 256, 260, 260, 2, 4
    u, w, b = _case(rng, B, K_, H, blocks, bias=True)
    h_wide = nan_like(cp, (B, h_lead + blocks * width + 4))  # (h moves by TMA: 16-byte aligned)
    P = 700
    pv_wide = nan_like(cp, (P, lead + 2 * H * blocks + 2))
    config = K.GluGemmConfig(pv_tma=lead == 2)  # (lead 2: on, but the wrapper must not use it)
    K.glu_gemm(to_dev(cp, u), to_dev(cp, w), bias=to_dev(cp, b), width=width, blocks=blocks,
               h=h_wide[:, h_lead : h_lead + blocks * width], pv=pv_wide[:, lead : lead + 2 * H * blocks],
               config=config)
    _check(cp, u, w, b, blocks, width, h_wide, h_lead, pv_wide, P, H, pv_lead=lead)


def test_glu_gemm_direction_branch_bias_in_epilogue(cp, rng):
    """The direction branch's GLU: u a [B, 256] view of the wider augmented z, the bias added in the
    epilogue, a K that ends inside a k chunk of 32 nowhere (256), pv of every row."""
    B, H, K_, width, lead = 1000, 256, 256, 260, 4
    u, w, b = _case(rng, B, K_, H, 1, bias=True)
    z = nan_like(cp, (B, 260))
    z[:, :K_] = to_dev(cp, u)
    h_wide = nan_like(cp, (B, lead + width + 4))
    pv_wide = nan_like(cp, (B, lead + 2 * H))
    K.glu_gemm(z[:, :K_], to_dev(cp, w), bias=to_dev(cp, b), width=width, h=h_wide[:, lead : lead + width],
               pv=pv_wide[:, lead:])
    _check(cp, u, w, b, 1, width, h_wide, lead, pv_wide, B, H)


def test_glu_gemm_in_a_cuda_graph(cp, rng):
    """Captured once, replayed over new contents of the same buffers: the tensor maps travel with
    the graph (kernel parameters by value)."""
    B, H, blocks, K_, width = 700, 128, 2, 132, 132
    u_d = cp.empty((B, K_), cp.float32)
    w_d = cp.empty((K_, 2 * H * blocks), cp.float32)
    wt_d = cp.empty((2 * H * blocks, K_), cp.float32)
    h_d = nan_like(cp, (B, blocks * width))
    u, w, _ = _case(rng, B, K_, H, blocks, bias=False)
    u_d[...], w_d[...] = to_dev(cp, u), to_dev(cp, w)
    K.glu_gemm(u_d, w_d, width=width, blocks=blocks, h=h_d, wt=K.transpose(w_d, out=wt_d))  # warm-up: compiles
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        K.transpose(w_d, out=wt_d)
        K.glu_gemm(u_d, w_d, width=width, blocks=blocks, h=h_d, wt=wt_d)
        graph = stream.end_capture()
        for _ in range(2):
            u, w, _ = _case(rng, B, K_, H, blocks, bias=False)
            u_d[...], w_d[...] = to_dev(cp, u), to_dev(cp, w)
            h_d[...] = np.nan
            stream.synchronize()
            graph.launch(stream)
            stream.synchronize()
            _check(cp, u, w, None, blocks, width, h_d, 0, None, 0, H)


def test_glu_gemm_rounds_its_operands_to_nearest(cp, rng):
    """Inputs not representable in TF32: the kernel rounds both operands to nearest, as cuBLAS's
    TF32 GEMMs do (the tensor cores alone would truncate: a bias toward zero). Against the float64
    product of the inputs rounded so on the host the error is float32 accumulation's; against the
    truncated inputs' it is not."""
    B, H, blocks, K_, width = 2000, 256, 3, 260, 260
    u = rng.normal(0, 1.0, (B, K_)).astype(np.float32)
    w = (rng.normal(0, 3.0 / np.sqrt(K_), (K_, 2 * H * blocks)) + 0.05).astype(np.float32)  # one-signed part
    h = K.glu_gemm(to_dev(cp, u), to_dev(cp, w), width=width, blocks=blocks, h=nan_like(cp, (B, blocks * width)))
    _, r_nearest = R.glu_gemm(host64(R.tf32_nearest(u)), host64(R.tf32_nearest(w)), None, width, blocks)
    _, r_trunc = R.glu_gemm(host64(tf32(u)), host64(tf32(w)), None, width, blocks)
    assert_close("h (operands rounded to nearest)", h, r_nearest, TOL)
    err_trunc = float(np.linalg.norm(host64(h) - r_trunc) / np.linalg.norm(r_trunc))
    assert err_trunc > 10 * TOL, f"h is as close to the truncated operands' product ({err_trunc:.3g})"
    wt = K.transpose(to_dev(cp, w))
    assert np.array_equal(wt.get(), R.tf32_nearest(w).T)


# (K, rounded): the k chunks' last holding 1 (K = 260, 100), 4 (256), 2 (140) and 3 (152) k steps of 8
@pytest.mark.parametrize(("K_", "rounded"), [(260, 256), (256, 96), (140, 64), (152, 0), (100, 100)])
def test_glu_gemm_takes_columns_rounded_by_the_writer_as_they_are(cp, rng, K_, rounded):
    """``rounded``: the k chunks (32 columns) wholly within u's first ``rounded`` columns are read
    as they are (the network's z comes rounded), the others rounded to nearest. With inputs not
    representable in TF32 the tensor cores truncate the former, which shows which chunks the
    kernel rounded: the result is the product of u truncated there and rounded elsewhere."""
    B, H, blocks = 1500, 128, 2
    u = rng.normal(0, 1.0, (B, K_)).astype(np.float32)
    w = (rng.normal(0, 3.0 / np.sqrt(K_), (K_, 2 * H * blocks)) + 0.05).astype(np.float32)
    taken = rounded // 32 * 32  # columns in chunks the kernel does not round
    expect_u = np.concatenate([tf32(u[:, :taken]), R.tf32_nearest(u[:, taken:])], axis=1)
    h = K.glu_gemm(to_dev(cp, u), to_dev(cp, w), width=H, blocks=blocks, h=nan_like(cp, (B, blocks * H)),
                   rounded=rounded)
    _, ref = R.glu_gemm(host64(expect_u), host64(R.tf32_nearest(w)), None, H, blocks)
    assert_close("h", h, ref, TOL)
    if taken:  # ... and far closer to it than to the product of u rounded everywhere
        _, all_rounded = R.glu_gemm(host64(R.tf32_nearest(u)), host64(R.tf32_nearest(w)), None, H, blocks)
        err, err_all = (float(np.linalg.norm(host64(h) - r) / np.linalg.norm(r)) for r in (ref, all_rounded))
        assert err_all > 20 * err, f"h is about as close to the all-rounded product ({err_all:.3g} vs {err:.3g})"
    # Already-rounded columns read as they are give the all-rounded product.
    u_r = np.concatenate([R.tf32_nearest(u[:, :rounded]), u[:, rounded:]], axis=1)
    h2 = K.glu_gemm(to_dev(cp, u_r), to_dev(cp, w), width=H, blocks=blocks, rounded=rounded)
    _, ref2 = R.glu_gemm(host64(R.tf32_nearest(u)), host64(R.tf32_nearest(w)), None, H, blocks)
    assert_close("h (writer-rounded columns)", h2, ref2, TOL)


def test_glu_gemm_rejects_bad_layouts(cp, rng):
    u = cp.zeros((64, 260), cp.float32)
    with pytest.raises(ValueError, match="glu_gemm: needs H a multiple of 128"):
        K.glu_gemm(u, cp.zeros((260, 2 * 96), cp.float32))
    with pytest.raises(ValueError, match="glu_gemm: rounded 261 outside 0..260"):
        K.glu_gemm(u, cp.zeros((260, 256), cp.float32), rounded=261)
    with pytest.raises(ValueError, match="glu_gemm: u has 260 columns but w has 256 rows"):
        K.glu_gemm(u, cp.zeros((256, 256), cp.float32))
    with pytest.raises(ValueError, match="glu_gemm: u must"):
        K.glu_gemm(cp.zeros((64, 1040), cp.float32)[:, 1::4][:, :260], cp.zeros((260, 256), cp.float32))
    with pytest.raises(ValueError, match="glu_gemm: u must .* row pitch a multiple of 16 bytes"):  # TMA's rule
        K.glu_gemm(cp.zeros((64, 262), cp.float32)[:, :260], cp.zeros((260, 256), cp.float32))
