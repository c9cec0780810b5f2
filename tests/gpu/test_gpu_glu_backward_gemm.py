"""Parity of glu_backward_gemm.cu (the GLU layers' backward from their advantage heads' gradients:
dh = dadv Wo^T on the TF32 tensor cores, the gate's backward in the epilogue, written over pv) with
the NumPy twin ``reference.glu_backward_gemm``, and of its ``round_tf32``.

With TF32 inputs (the low 13 mantissa bits cleared: rounding to nearest leaves them as they are)
dh's products are exact and the error is float32's (accumulation over K = 156, the sigmoid, the
products): ``||out - ref|| / ||ref|| < 2e-5``. With float32 dadv the reference takes it rounded to
TF32 to nearest (as cuBLAS would); the truncated inputs' result is an order of magnitude further
off. pv is a column block of a wider array whose other columns hold a sentinel that must survive;
dadv and Wo are column blocks of the heads' wider arrays, as in the network.

dq (branch ``dq_set``'s pre-activation gradients times Wq^T, in the epilogue, in FP32) against
``reference.glu_backward_dq`` of the float64 reference gradients: ``< 5e-5`` (dpv's error carried
through a 2H-long dot product with random weights). dq is a column block of a NaN-poisoned wider
array whose other columns must stay NaN; Wq a column block of a wider weight block, as in the network.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import assert_close, host64, nan_like, rel_err, skip_without_wgmma, to_dev
from gpu_parity import tf32_truncated as tf32

from foxhunt_core.gpu import kernels as K
from foxhunt_core.gpu import reference as R

pytestmark = pytest.mark.gpu
TOL = 2e-5
SENTINEL = 7.0


@pytest.fixture(autouse=True)
def _hopper(cp):
    skip_without_wgmma()


def _case(cp, rng, M, Kw, H, sets, dadv_host=None):
    """Host and device operands: dadv and Wo as column blocks (Kw apart) of [M, sets Kw + 4] and
    [H, sets Kw + 4] arrays; pv as the block after 4 sentinel columns of [M, 4 + sets 2H + 4]."""
    if dadv_host is None:
        dadv_host = tf32(rng.normal(0, 0.5, (M, sets * Kw)))
    wo_host = tf32(rng.normal(0, 1.0 / np.sqrt(Kw), (H, sets * Kw)))
    pv_host = rng.normal(0, 2.0, (M, sets * 2 * H)).astype(np.float32)
    dadv_wide = cp.zeros((M, sets * Kw + 4), cp.float32)
    dadv_wide[:, : sets * Kw] = to_dev(cp, dadv_host)
    wo_wide = cp.zeros((H, sets * Kw + 4), cp.float32)
    wo_wide[:, : sets * Kw] = to_dev(cp, wo_host)
    pv_wide = cp.full((M, 4 + sets * 2 * H + 4), SENTINEL, cp.float32)
    pv_wide[:, 4 : 4 + sets * 2 * H] = to_dev(cp, pv_host)
    dadv = [dadv_wide[:, Kw * i : Kw * (i + 1)] for i in range(sets)]
    wo = [wo_wide[:, Kw * i : Kw * (i + 1)] for i in range(sets)]
    split = lambda a: [host64(a)[:, Kw * i : Kw * (i + 1)] for i in range(sets)]  # noqa: E731
    return dadv, wo, pv_wide, split(dadv_host), split(wo_host), host64(pv_host)


def _check(pv_wide, ref, width):
    got = host64(pv_wide)
    assert_close("dpv", got[:, 4 : 4 + width], ref, TOL)
    assert np.all(got[:, :4] == SENTINEL) and np.all(got[:, 4 + width :] == SENTINEL), "written outside pv"


# M: a row tail (300), past one tile per SM (5000, 16384: the persistent loop); K: the heads' 156
# (a last chunk of 4 k steps of 8: 28 columns), 100 (1 step), 44 (2), 120 (3)
@pytest.mark.parametrize("M", [300, 5000, 16384])
@pytest.mark.parametrize("sets", [1, 3])
def test_glu_backward_gemm_matches_the_reference(cp, rng, M, sets):
    dadv, wo, pv_wide, d64, w64, p64 = _case(cp, rng, M, 156, 256, sets)
    out = K.glu_backward_gemm(dadv, wo, pv_wide[:, 4 : 4 + sets * 512])
    assert out.data.ptr == pv_wide[:, 4:].data.ptr
    _check(pv_wide, R.glu_backward_gemm(d64, w64, p64), sets * 512)


@pytest.mark.parametrize("Kw", [100, 44, 120, 32])
@pytest.mark.parametrize("H", [128, 384])
def test_glu_backward_gemm_k_tails_and_widths(cp, rng, Kw, H):
    dadv, wo, pv_wide, d64, w64, p64 = _case(cp, rng, 1000, Kw, H, 2)
    K.glu_backward_gemm(dadv, wo, pv_wide[:, 4 : 4 + 4 * H])
    _check(pv_wide, R.glu_backward_gemm(d64, w64, p64), 4 * H)


def test_glu_backward_gemm_rounds_dadv_to_nearest(cp, rng):
    """float32 dadv: rounded to TF32 to nearest in shared memory (as cuBLAS rounds its operands),
    not truncated by the tensor cores."""
    M, Kw = 8192, 156
    raw = rng.normal(0, 0.5, (M, Kw)).astype(np.float32)
    dadv, wo, pv_wide, _, w64, p64 = _case(cp, rng, M, Kw, 256, 1, dadv_host=raw)
    K.glu_backward_gemm(dadv, wo, pv_wide[:, 4:516])
    got = host64(pv_wide)[:, 4:516]
    near = R.glu_backward_gemm([host64(R.tf32_nearest(raw))], w64, p64)
    trunc = R.glu_backward_gemm([host64(tf32(raw))], w64, p64)
    e_near, e_trunc = rel_err(got, near), rel_err(got, trunc)
    assert e_near < TOL, e_near
    assert e_trunc > 10 * e_near, (e_near, e_trunc)


DQ_TOL = 5e-5


def _dq_case(cp, rng, M, H, nq):
    """wq [nq, 2H] as a column block (at 8) of a wider array; dq [M, nq] as a column block (at 1)
    of a NaN-poisoned [M, nq + 3] array."""
    wq_host = rng.normal(0, 1.0 / np.sqrt(2 * H), (nq, 2 * H)).astype(np.float32)
    wq_wide = cp.zeros((nq, 2 * H + 12), cp.float32)
    wq_wide[:, 8 : 8 + 2 * H] = to_dev(cp, wq_host)
    dq_wide = nan_like(cp, (M, nq + 3))
    return wq_wide[:, 8 : 8 + 2 * H], dq_wide, host64(wq_host)


def _check_dq(dq_wide, ref, nq):
    got = host64(dq_wide)
    assert_close("dq", got[:, 1 : 1 + nq], ref, DQ_TOL)
    assert np.isnan(got[:, :1]).all() and np.isnan(got[:, 1 + nq :]).all(), "written outside dq"


# the branch that carries dq first, in the middle, last; one column tile (H 128) or two; a row tail
@pytest.mark.parametrize("M,H,sets,dq_set,nq", [(300, 256, 1, 0, 3), (16384, 256, 3, 1, 3), (5000, 256, 3, 2, 4),
                                                (5000, 128, 2, 0, 1), (16384, 128, 3, 2, 2)])
def test_glu_backward_gemm_dq_matches_the_reference(cp, rng, M, H, sets, dq_set, nq):
    dadv, wo, pv_wide, d64, w64, p64 = _case(cp, rng, M, 156, H, sets)
    wq, dq_wide, wq64 = _dq_case(cp, rng, M, H, nq)
    K.glu_backward_gemm(dadv, wo, pv_wide[:, 4 : 4 + sets * 2 * H], dq=dq_wide[:, 1 : 1 + nq], wq=wq, dq_set=dq_set)
    ref = R.glu_backward_gemm(d64, w64, p64)
    _check(pv_wide, ref, sets * 2 * H)  # the gradients as without dq
    _check_dq(dq_wide, R.glu_backward_dq(ref, wq64, dq_set, H), nq)


def test_glu_backward_gemm_dq_over_column_tiles_that_change_from_tile_to_tile(cp, rng):
    """A grid of 7 CTAs over 6 column tiles: each CTA's tiles walk through the column tiles, so the
    weights it holds for dq are loaded again whenever its column tile changes (with a grid of
    every SM, 132 on an H200, each CTA keeps one column tile)."""
    M, H, sets = 5000, 256, 3
    dadv, wo, pv_wide, d64, w64, p64 = _case(cp, rng, M, 156, H, sets)
    wq, dq_wide, wq64 = _dq_case(cp, rng, M, H, 3)
    K.glu_backward_gemm(dadv, wo, pv_wide[:, 4 : 4 + sets * 2 * H], dq=dq_wide[:, 1:4], wq=wq, dq_set=1, ctas=7)
    ref = R.glu_backward_gemm(d64, w64, p64)
    _check(pv_wide, ref, sets * 2 * H)
    _check_dq(dq_wide, R.glu_backward_dq(ref, wq64, 1, H), 3)


def test_glu_backward_gemm_dq_is_the_same_bit_for_bit_each_time(cp, rng):
    """The two column tiles' sums reach dq (zeroed first) by atomic adds in either order: the same
    bits each time."""
    M, H, sets = 16384, 256, 3
    dadv, wo, pv_wide, _, _, _ = _case(cp, rng, M, 156, H, sets)
    pv0 = pv_wide.copy()
    wq, dq_wide, _ = _dq_case(cp, rng, M, H, 3)
    outs = []
    for _ in range(4):
        pv_wide[...] = pv0
        K.glu_backward_gemm(dadv, wo, pv_wide[:, 4 : 4 + sets * 2 * H], dq=dq_wide[:, 1:4], wq=wq, dq_set=1)
        outs.append(cp.asnumpy(dq_wide[:, 1:4]))
    assert all(np.array_equal(o.view(np.uint32), outs[0].view(np.uint32)) for o in outs[1:])


def test_round_tf32_rounds_to_nearest_bit_for_bit(cp, rng):
    x = rng.normal(0, 3.0, (37, 300)).astype(np.float32)
    wide = cp.asarray(np.pad(x, ((0, 0), (0, 5))))
    out = cp.full((37, 310), np.nan, cp.float32)
    K.round_tf32(wide[:, :300], out=out[:, 2:302])
    got = cp.asnumpy(out)
    assert np.array_equal(got[:, 2:302].view(np.uint32), R.tf32_nearest(x).view(np.uint32))
    assert np.isnan(got[:, :2]).all() and np.isnan(got[:, 302:]).all()


@pytest.mark.parametrize("with_dq", [False, True])
def test_glu_backward_gemm_replays_from_a_graph(cp, rng, with_dq):
    """Captured (its tensor maps a kernel parameter; with dq, its zeroing too), the graph replays
    to the gradient of the inputs it is given then."""
    M, Kw, H = 4096, 156, 256
    dadv, wo, pv_wide, _, _, _ = _case(cp, rng, M, Kw, H, 3)
    pv = pv_wide[:, 4 : 4 + 3 * 2 * H]
    wq, dq_wide, wq64 = _dq_case(cp, rng, M, H, 3)
    q_kw = {"dq": dq_wide[:, 1:4], "wq": wq, "dq_set": 2} if with_dq else {}
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        K.glu_backward_gemm(dadv, wo, pv, **q_kw)  # compiled outside the capture
        stream.synchronize()
        stream.begin_capture()
        K.glu_backward_gemm(dadv, wo, pv, **q_kw)
        graph = stream.end_capture()
    for _ in range(2):
        d_h = tf32(rng.normal(0, 0.5, (M, 3 * Kw)))
        p_h = rng.normal(0, 2.0, (M, 6 * H)).astype(np.float32)
        for i in range(3):
            dadv[i][...] = to_dev(cp, d_h[:, Kw * i : Kw * (i + 1)])
        pv[...] = to_dev(cp, p_h)
        cp.cuda.Device().synchronize()
        graph.launch(stream=stream)
        stream.synchronize()
        w64 = [host64(w) for w in wo]
        ref = R.glu_backward_gemm([host64(d_h)[:, Kw * i : Kw * (i + 1)] for i in range(3)], w64, host64(p_h))
        _check(pv_wide, ref, 6 * H)
        if with_dq:
            _check_dq(dq_wide, R.glu_backward_dq(ref, wq64, 2, H), 3)


@pytest.mark.parametrize("case", ["sets", "H", "K", "pv"])
def test_glu_backward_gemm_refuses_bad_layouts(cp, case):
    dadv, wo = [cp.zeros((64, 156), cp.float32)], [cp.zeros((256, 156), cp.float32)]
    pv = cp.zeros((64, 512), cp.float32)
    if case == "sets":
        dadv, wo = dadv * 4, wo * 4
        pv = cp.zeros((64, 2048), cp.float32)
    elif case == "H":
        wo, pv = [cp.zeros((200, 156), cp.float32)], cp.zeros((64, 400), cp.float32)
    elif case == "K":
        dadv, wo = [cp.zeros((64, 154), cp.float32)], [cp.zeros((256, 154), cp.float32)]
    else:
        pv = cp.zeros((64, 500), cp.float32)
    with pytest.raises(ValueError, match="glu_backward_gemm"):
        K.glu_backward_gemm(dadv, wo, pv)


@pytest.mark.parametrize("case", ["alone", "rows", "H", "set", "shape"])
def test_glu_backward_gemm_refuses_bad_dq(cp, case):
    H = 384 if case == "H" else 256
    dadv, wo = [cp.zeros((64, 156), cp.float32)], [cp.zeros((H, 156), cp.float32)]
    pv = cp.zeros((64, 2 * H), cp.float32)
    q_kw = {"dq": cp.zeros((64, 3), cp.float32), "wq": cp.zeros((3, 2 * H), cp.float32), "dq_set": 0}
    if case == "alone":
        del q_kw["wq"]
    elif case == "rows":
        q_kw["dq"], q_kw["wq"] = cp.zeros((64, 5), cp.float32), cp.zeros((5, 2 * H), cp.float32)
    elif case == "set":
        q_kw["dq_set"] = 1
    elif case == "shape":
        q_kw["dq"] = cp.zeros((63, 3), cp.float32)
    with pytest.raises(ValueError, match="glu_backward_gemm"):
        K.glu_backward_gemm(dadv, wo, pv, **q_kw)
