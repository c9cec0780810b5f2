"""cuBLASLt algorithm autotuning: tuned products still equal the float64 ones, the output is written
once (``beta = 1`` accumulates once), every tuned plan is reported with a valid choice, and a
call inside a stream capture does not tune (the captured graph still replays to the right result).

Tolerance: ``||out - ref|| / ||ref||`` below ``max(1e-6, 1e-7 sqrt(K))`` for fp32 (float32 against
float64 of the same inputs; the error of a length-K fp32 reduction grows like ``sqrt(K)``), 5e-3
under TF32, as in ``test_gpu_fused_paths``. Outputs written with ``beta = 0`` are poisoned with NaN
first, and lie in a column block of a wider buffer whose other columns must stay untouched.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from gpu_parity import assert_close, host64, nan_like, to_dev

pytestmark = pytest.mark.gpu
TF32_TOL = 5e-3

# (M, K, N) of the row-major product [M, K] @ [K, N]; whether the left operand is a transpose view
SHAPES = [
    pytest.param(4096, 256, 153, False, id="4096x256x153"),
    pytest.param(4096, 153, 256, False, id="4096x153x256"),
    pytest.param(256, 4096, 153, True, id="xT-dy-K4096"),
    pytest.param(37, 4096, 29, False, id="37x4096x29"),
    pytest.param(1001, 97, 3, True, id="1001x97x3"),
]


@pytest.fixture
def lt(cp):
    """cuBLASLt on, autotuning on; the switches (and TF32) restored afterwards."""
    from foxhunt_core.gpu import cublas, cublaslt

    saved = cublaslt.enabled(), cublaslt.autotune_enabled(), cublas.tf32_enabled()
    cublaslt.set_enabled(True)
    cublaslt.set_autotune(True)
    try:
        yield cublaslt
    finally:
        cublaslt.set_enabled(saved[0])
        cublaslt.set_autotune(saved[1])
        cublas.set_tf32(saved[2])


def _tol(tf32: bool, K: int) -> float:
    return TF32_TOL if tf32 else max(1e-6, 1e-7 * math.sqrt(K))


def _left(cp, a: np.ndarray, transposed: bool):
    """``a`` on the device, C-contiguous or as the transpose view of a contiguous array."""
    return to_dev(cp, a.T.copy()).T if transposed else to_dev(cp, a)


def _check_new_entries(report: list[dict], M: int, K: int, N: int) -> None:
    """The entries a call added: at least one for the product (cuBLASLt's m, n, k = N, M, K), and
    each with a chosen index in range, timed (best no slower than the heuristic's first) when
    there was a choice."""
    assert any((e["m"], e["n"], e["k"]) == (N, M, K) for e in report), report
    for e in report:
        assert 0 <= e["chosen"] < e["candidates"] <= 8, e
        assert set(e["config"]) == {"id", "tile", "split_k", "reduction", "stages"}, e
        assert isinstance(e["config"]["id"], int), e
        if e["candidates"] > 1:
            assert len(e["times_ms"]) == e["candidates"], e
            assert e["best_ms"] is not None, e
            assert e["first_ms"] is None or e["best_ms"] <= e["first_ms"], e
        else:
            assert e["times_ms"] == [] and e["best_ms"] is None, e


@pytest.mark.parametrize("tf32", [False, True], ids=["fp32", "tf32"])
@pytest.mark.parametrize("M,K,N,ta", SHAPES)
def test_autotuned_products_match_float64(cp, rng, lt, M, K, N, ta, tf32):
    from foxhunt_core.gpu import cublas

    cublas.set_tf32(tf32)
    tol = _tol(tf32, K)
    a, b = rng.normal(size=(M, K)).astype(np.float32), rng.normal(size=(K, N)).astype(np.float32)
    ref = host64(a) @ host64(b)
    da, db = _left(cp, a, ta), to_dev(cp, b)

    # beta = 1 first, so that the plan is tuned by this call (C is read: the scratch gets a copy),
    # into a column block of a wider buffer (its own ldc and alignment: a plan of its own).
    c0 = rng.normal(size=(M, N + 7)).astype(np.float32)
    buf = to_dev(cp, c0)
    n0 = len(lt.tuning_report())
    cublas.matmul(da, db, out=buf[:, 3 : 3 + N], beta=1.0)
    got = host64(buf)
    assert_close("beta=1 (accumulated once)", got[:, 3 : 3 + N], host64(c0)[:, 3 : 3 + N] + ref, tol)
    assert np.array_equal(got[:, :3], host64(c0)[:, :3]) and np.array_equal(got[:, 3 + N :], host64(c0)[:, 3 + N :])
    _check_new_entries(lt.tuning_report()[n0:], M, K, N)
    # Once more: the tuned plan, accumulating a second time.
    cublas.matmul(da, db, out=buf[:, 3 : 3 + N], beta=1.0)
    assert_close("beta=1 twice", buf[:, 3 : 3 + N], host64(c0)[:, 3 : 3 + N] + 2.0 * ref, tol)

    # beta = 0 into a NaN-poisoned, contiguous output (another plan, tuned by this call).
    out = nan_like(cp, (M, N))
    n0 = len(lt.tuning_report())
    cublas.matmul(da, db, out=out)
    assert_close("beta=0", out, ref, tol)
    _check_new_entries(lt.tuning_report()[n0:], M, K, N)
    out = nan_like(cp, (M, N))
    cublas.matmul(da, db, out=out)  # tuned plan: no new entry
    assert_close("beta=0 tuned", out, ref, tol)

    # beta = 0 into a NaN-poisoned column block: the columns around it stay NaN.
    wide = nan_like(cp, (M, N + 9))
    cublas.matmul(da, db, out=wide[:, 5 : 5 + N])
    assert_close("beta=0 into view", wide[:, 5 : 5 + N], ref, tol)
    rest = host64(wide)
    assert np.isnan(rest[:, :5]).all() and np.isnan(rest[:, 5 + N :]).all()


@pytest.mark.parametrize("tf32", [False, True], ids=["fp32", "tf32"])
@pytest.mark.parametrize("M,K,N", [(4096, 256, 153), (301, 40, 17), (4096, 256, 64)])
def test_autotuned_epilogues(cp, rng, lt, M, K, N, tf32):
    """Bias and ReLU + bias (fused by cuBLASLt where it can) and ReLU alone, with autotuning."""
    from foxhunt_core.gpu import cublas

    cublas.set_tf32(tf32)
    tol = _tol(tf32, K)
    a, b = rng.normal(size=(M, K)).astype(np.float32), rng.normal(size=(K, N)).astype(np.float32)
    bias, bias2 = (rng.normal(size=N).astype(np.float32) for _ in range(2))
    prod = host64(a) @ host64(b)
    da, db, dbias = to_dev(cp, a), to_dev(cp, b), to_dev(cp, bias)
    for _ in range(2):  # the call that tunes, then the tuned plan
        out = nan_like(cp, (M, N))
        assert_close("bias", cublas.matmul(da, db, out=out, bias=dbias), prod + host64(bias), tol)
        out = nan_like(cp, (M, N))
        assert_close("relu+bias", cublas.matmul(da, db, out=out, bias=dbias, relu=True),
                     np.maximum(prod + host64(bias), 0.0), tol)
        out = nan_like(cp, (M, N))
        assert_close("relu", cublas.matmul(da, db, out=out, relu=True), np.maximum(prod, 0.0), tol)
    # another bias vector through the same (tuned) plan
    out = nan_like(cp, (M, N))
    cublas.matmul(da, db, out=out, bias=to_dev(cp, bias2), relu=True)
    assert_close("relu+bias2", out, np.maximum(prod + host64(bias2), 0.0), tol)
    for e in lt.tuning_report():
        assert 0 <= e["chosen"] < e["candidates"], e


def test_no_tuning_inside_a_capture(cp, rng, lt):
    """A plan first used inside a stream capture runs the heuristic's first algorithm there and is
    not tuned (no report entry); the graph replays to the right result; the first call outside the
    capture tunes it, and the graph (which keeps the algorithm it captured) still replays right."""
    from foxhunt_core.gpu import cublas

    cublas.set_tf32(False)
    M, K, N = 1237, 211, 43  # used by no other test: the plan is new
    a, b = rng.normal(size=(M, K)).astype(np.float32), rng.normal(size=(K, N)).astype(np.float32)
    ref = host64(a) @ host64(b)
    tol = _tol(False, K)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        da, db = to_dev(cp, a), to_dev(cp, b)
        out = nan_like(cp, (M, N))
        cublas.matmul(da[:5], db)  # cuBLASLt's library, handle and workspace made outside the capture
        stream.synchronize()
        n0 = len(lt.tuning_report())
        stream.begin_capture()
        try:
            cublas.matmul(da, db, out=out)
        finally:
            graph = stream.end_capture()
        assert len(lt.tuning_report()) == n0, "tuned during a capture"
        assert np.isnan(host64(out)).all()  # captured, not run
        graph.launch(stream=stream)
        stream.synchronize()
        assert_close("captured", out, ref, tol)
        assert not any((e["m"], e["n"], e["k"]) == (N, M, K) for e in lt.tuning_report())

        # The first call outside a capture tunes the plan and writes the output once.
        out2 = nan_like(cp, (M, N))
        cublas.matmul(da, db, out=out2)
        stream.synchronize()
        assert_close("tuned after the capture", out2, ref, tol)
        _check_new_entries(lt.tuning_report()[n0:], M, K, N)

        out.fill(np.nan)
        graph.launch(stream=stream)
        stream.synchronize()
        assert_close("replayed", out, ref, tol)


def test_a_tuning_record_repeats_the_choices_untimed(cp, rng, lt):
    """The record of the chosen algorithms (what a run directory keeps), loaded into a fresh set
    of plans, gives every plan the same algorithm without timing it, so the products are bitwise
    the same; a record for another GPU is set aside, a malformed one refused."""
    from foxhunt_core.gpu import cublas

    a, b = to_dev(cp, rng.normal(size=(4096, 256))), to_dev(cp, rng.normal(size=(256, 512)))
    first = cublas.matmul(a, b)
    rec = lt.tuning_record()
    assert rec["plans"] and rec["device"] == lt.device_tag()
    mine = {p.name for p in lt._tuned if p.shape == (512, 4096, 256)}  # cuBLASLt's m, n, k
    assert mine and mine <= set(rec["plans"])
    chosen = {p.name: p.chosen for p in lt._tuned if p.name in mine}
    saved_plans, saved_tuned = dict(lt._plans), list(lt._tuned)
    lt._plans.clear()
    lt._tuned.clear()
    try:
        assert lt.load_tuning_record(rec, "run/gemm_tuning.json")
        again = cublas.matmul(a, b)
        assert cp.array_equal(first, again)
        assert {p.name: p.chosen for p in lt._tuned if p.name in mine} == chosen
        assert all(p.times_ms == [] for p in lt._tuned if p.name in mine)  # taken from the record, not timed
        assert not lt.load_tuning_record({**rec, "device": "another GPU; cublasLt 1"}, "x.json")
        with pytest.raises(ValueError, match="x.json: plans"):
            lt.load_tuning_record({**rec, "plans": {"p": "zz"}}, "x.json")
    finally:
        lt._plans.clear()
        lt._plans.update(saved_plans)
        lt._tuned[:] = saved_tuned
        lt._recorded.clear()
