"""diffusion_refine.cu without a GPU: it compiles for sm_90 without spills where the wrapper says a
kernel fits (and stops at its static_assert where it says not), and its launches, run on host
threads by foxhunt_core.testing.cuda_emu, match the float64 twin.

Tolerance of the emulated kernels: ``||out - ref|| / ||ref|| < 2e-6`` (float32 sums of at most a
few dozen terms per value; the gradients' block sums in double).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from foxhunt_diffusion_refine import cuda, refine

from foxhunt_core.testing import cuda_emu

TOL = 2e-6
# Parameter gradients are sums over the batch of float32 products against a float64 twin; a
# batch of one has no averaging, and 8.5e-6 was seen there: the float32 scale of DESIGN.md.
TOL_GRAD = 2e-5
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on this machine")


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _nvcc(defines: dict, tmp_path) -> subprocess.CompletedProcess:
    src = tmp_path / "diffusion_refine.cu"
    src.write_text("".join(f"#define {k} {v}\n" for k, v in defines.items()) + cuda.KERNEL_FILE.read_text())
    return subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", str(src),
                           "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True, timeout=300)


@needs_nvcc
# tiles of 32, 16, 32 and 16 rows; 1, 3, 1 and 2 gradient tiles a thread; then 8 rows, 8 tiles;
# the defaults at 4 lanes a sample (32 rows, 2 tiles a thread); two samples a forward thread
@pytest.mark.parametrize(("A", "K", "H", "lanes", "rows", "spills"), [
    (12, 3, 24, 8, 1, False), (12, 3, 48, 8, 1, False), (7, 2, 8, 8, 1, False), (12, 4, 24, 8, 1, False),
    (12, 3, 64, 8, 1, True), (12, 8, 22, 8, 1, True), (12, 3, 24, 4, 1, False), (12, 3, 24, 8, 2, False),
    (12, 3, 24, 4, 2, False)])
def test_kernels_compile_without_spills_where_they_fit(A, K, H, lanes, rows, spills, tmp_path):
    """Without spills at the defaults and the moderate sizes here (up to 3 gradient tiles a
    backward thread); at the largest sizes (8 tiles) the backward's 128 sums and the row's state
    pass 255 registers and spill a little: those compile, and run correctly (the emulated test
    below), but are not timed."""
    res = _nvcc(cuda.defines(A, K, H, lanes, rows), tmp_path)
    assert res.returncode == 0, res.stderr
    found = [int(n) for n in re.findall(r"(\d+) bytes spill stores", res.stderr)]
    assert len(found) == 3, res.stderr
    if not spills:
        assert found == [0, 0, 0], res.stderr


@needs_nvcc
@pytest.mark.parametrize(("A", "K", "H"), [(12, 3, 70), (12, 8, 23)])
def test_the_kernel_refuses_exactly_where_the_wrapper_does(A, K, H, tmp_path):
    assert cuda.backward_rows(A, K, H) is None
    with pytest.raises(ValueError, match="no kernel"):
        cuda.defines(A, K, H)
    res = _nvcc({"NUM_ACTIONS": A, "DR_STEPS": K, "DR_HIDDEN": H, "DR_ROWS": 32}, tmp_path)
    assert res.returncode != 0 and "static assertion failed" in res.stderr


def test_the_lanes_follow_the_batch_size_where_a_kernel_fits():
    few = cuda.FORWARD_FEW_LANES_FROM
    assert few is not None
    assert cuda.forward_lanes(few - 1) == cuda.LANES and cuda.forward_lanes(few) == cuda.FEW_LANES
    assert cuda.forward_lanes(few, (12, 3, 64)) == cuda.LANES  # no 4-lane kernel fits there
    assert cuda.backward_rows(12, 3, 64, cuda.FEW_LANES) is None and cuda.backward_rows(12, 3, 64) == 8
    with pytest.raises(ValueError, match="lanes must be"):
        cuda.defines(12, 3, 24, 2)
    assert cuda.forward_blocks_per_sm(24) == 3 and cuda.forward_blocks_per_sm(25) == 2
    assert cuda.forward_blocks_per_sm(24, cuda.FEW_LANES) == 2 and cuda.forward_blocks_per_sm(24, rows=2) == 2
    two = cuda.FORWARD_TWO_ROWS_FROM
    assert two is not None and cuda.forward_rows(two - 1) == 1 and cuda.forward_rows(two) == 2
    with pytest.raises(ValueError, match="1 or 2 samples"):
        cuda.defines(12, 3, 24, 8, 3)


def test_the_wrapper_picks_the_largest_tile_that_fits():
    assert cuda.backward_rows(12, 3, 24) == 32
    assert cuda.backward_rows(12, 3, 8) == 32
    assert cuda.backward_rows(12, 3, 48) == 16
    assert cuda.backward_rows(12, 3, 64) == 8
    for K, H in [(3, 24), (3, 67), (8, 22)]:
        rows = cuda.backward_rows(12, K, H)
        assert cuda.backward_smem(12, K, H, rows) <= cuda.SMEM_LIMIT
        assert -(-cuda.gradient_tiles(12, K, H) // (rows * cuda.LANES)) <= cuda.MAX_TILES
        for bigger in (r for r in cuda.ROW_CHOICES if r > rows):  # no larger tile fits
            assert (cuda.backward_smem(12, K, H, bigger) > cuda.SMEM_LIMIT
                    or -(-cuda.gradient_tiles(12, K, H) // (bigger * cuda.LANES)) > cuda.MAX_TILES)
    # where the kernels reach: the defaults' neighbourhood and K = 8 (the options' largest)
    assert max(H for H in range(1, 257) if cuda.backward_rows(12, 3, H)) == 67
    assert max(H for H in range(1, 257) if cuda.backward_rows(12, 8, H)) == 22


def _emulated(A, K, H, batch, grid, lanes, q, var, dy, p, rows=1):
    defs = cuda.defines(A, K, H, lanes, rows)
    rows, P = int(defs["DR_ROWS"]), K * cuda.step_entries(A, H)
    bufs = {"q": q, "var": var, "dy": dy, "out": np.full_like(q, np.nan), "dq": np.full_like(q, np.nan),
            "partials": np.full((grid, P), np.nan)}
    for n in refine.NAMES:
        bufs[n] = p[n]
        bufs["d" + n] = np.full_like(p[n], np.nan)
    s = np.float32(0.1)
    L = cuda_emu.Launch
    res = cuda_emu.run(cuda.KERNEL_FILE, bufs, [
        L("diffusion_refine_forward", grid, cuda.THREADS, ["q", "var", "out", np.int32(batch), s, *refine.NAMES]),
        L("diffusion_refine_backward", grid, rows * lanes,
          ["q", "var", "dy", "dq", "partials", np.int32(batch), s, *refine.NAMES]),
        L("diffusion_refine_grad_reduce", -(-P // 32), cuda.REDUCE_THREADS,
          ["partials", np.int32(grid), *("d" + n for n in refine.NAMES)]),
    ], defines=defs)
    for n in ("q", "var", "dy"):
        np.testing.assert_array_equal(res[n], bufs[n])
    return res


def _fresh(A, K, H, batch):
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, A)).astype(np.float32)
    var = (rng.random(size=(batch, A)) * 2.0).astype(np.float32)
    var[0, 0] = -1e-4  # a variance rounded below zero: sigma 0
    dy = rng.normal(size=(batch, A)).astype(np.float32)
    p = refine.init_params(K, H, A, rng, zero_output=False)
    p = {k: (v + rng.normal(size=v.shape) * 0.3).astype(np.float32) for k, v in p.items()}
    return seed, q, var, dy, p


@pytest.mark.skipif(cuda_emu.compiler() is None, reason="no host C++ compiler")
@pytest.mark.parametrize(("A", "K", "H", "batch", "grid", "lanes", "rows"), [
    (12, 3, 24, 150, 2, 8, 1), (7, 2, 8, 300, 2, 8, 1), (12, 1, 5, 1, 1, 8, 1), (12, 3, 48, 70, 1, 8, 1),
    (12, 3, 64, 29, 2, 8, 1), (12, 3, 24, 150, 2, 4, 1), (7, 2, 8, 300, 2, 4, 1), (12, 3, 24, 150, 2, 4, 2),
    (7, 2, 8, 300, 1, 8, 2)])
def test_emulated_kernels_match_the_twin(A, K, H, batch, grid, lanes, rows):
    """Forward, backward and the gradient reduction, outputs poisoned with NaN; ``grid`` blocks
    (tiles looped over, a partial last tile, idle threads; with two samples a forward thread, a
    thread whose second sample is past the batch)."""
    seed, q, var, dy, p = _fresh(A, K, H, batch)
    res = _emulated(A, K, H, batch, grid, lanes, q, var, dy, p, rows)
    p64 = {k: v.astype(np.float64) for k, v in p.items()}
    ref, cache = refine.forward(np, p64, q.astype(np.float64), var.astype(np.float64), 0.1)
    dref, gref = refine.backward(np, p64, cache, dy.astype(np.float64))
    assert _rel(res["out"], ref) < TOL, f"forward (seed {seed})"
    assert _rel(res["dq"], dref) < TOL, f"dq (seed {seed})"
    for n in refine.NAMES:
        assert np.isfinite(res["d" + n]).all(), f"{n} not written (seed {seed})"
        assert _rel(res["d" + n], gref[n]) < TOL_GRAD, f"{n} (seed {seed})"


@pytest.mark.skipif(cuda_emu.compiler() is None, reason="no host C++ compiler")
@pytest.mark.parametrize(("A", "K", "H"), [(12, 3, 24), (7, 2, 8)])
def test_the_bits_do_not_depend_on_the_lanes_or_the_rows(A, K, H):
    """The sums of a sample's parts are added in one tree whichever lanes add them, and a forward
    thread's samples share only their weights' loads: the refined Q, dQ and every gradient are the
    same bits at 8 and at 4 lanes a sample, one or two samples a forward thread."""
    seed, q, var, dy, p = _fresh(A, K, H, 97)
    a = _emulated(A, K, H, 97, 2, 8, q, var, dy, p)
    for lanes, rows in ((4, 1), (8, 2), (4, 2)):
        b = _emulated(A, K, H, 97, 2, lanes, q, var, dy, p, rows)
        for n in ("out", "dq", *("d" + n for n in refine.NAMES)):
            np.testing.assert_array_equal(a[n], b[n], err_msg=f"{n} at {lanes} lanes, {rows} rows (seed {seed})")
