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
@pytest.mark.parametrize(("A", "K", "H"), [(12, 3, 24), (12, 3, 48), (7, 2, 8)])  # tiles of 64, 32, 128
def test_kernels_compile_without_spills_where_they_fit(A, K, H, tmp_path):
    res = _nvcc(cuda.defines(A, K, H), tmp_path)
    assert res.returncode == 0, res.stderr
    spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
    assert len(spills) == 3 and set(spills) == {"0"}, res.stderr


@needs_nvcc
@pytest.mark.parametrize(("A", "K", "H"), [(12, 3, 58), (12, 8, 23)])
def test_the_kernel_refuses_exactly_where_the_wrapper_does(A, K, H, tmp_path):
    assert cuda.backward_rows(A, K, H) is None
    with pytest.raises(ValueError, match="no kernel"):
        cuda.defines(A, K, H)
    res = _nvcc({"NUM_ACTIONS": A, "DR_STEPS": K, "DR_HIDDEN": H, "DR_ROWS": 32}, tmp_path)
    assert res.returncode != 0 and "static assertion failed" in res.stderr


def test_the_wrapper_picks_the_largest_tile_that_fits():
    assert cuda.backward_rows(12, 3, 24) == 64
    assert cuda.backward_rows(12, 3, 8) == 128
    assert cuda.backward_rows(12, 3, 48) == 32
    for K, H in [(3, 24), (3, 57), (8, 22)]:
        rows = cuda.backward_rows(12, K, H)
        assert cuda.backward_smem(12, K, H, rows) <= cuda.SMEM_LIMIT


@pytest.mark.skipif(cuda_emu.compiler() is None, reason="no host C++ compiler")
@pytest.mark.parametrize(("A", "K", "H", "batch", "grid"), [(12, 3, 24, 150, 2), (7, 2, 8, 300, 2), (12, 1, 5, 1, 1),
                                                            (12, 3, 48, 70, 1)])
def test_emulated_kernels_match_the_twin(A, K, H, batch, grid):
    """Forward, backward and the gradient reduction, outputs poisoned with NaN; ``grid`` blocks
    (tiles looped over, a partial last tile, idle threads)."""
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, A)).astype(np.float32)
    var = (rng.random(size=(batch, A)) * 2.0).astype(np.float32)
    var[0, 0] = -1e-4  # a variance rounded below zero: sigma 0
    dy = rng.normal(size=(batch, A)).astype(np.float32)
    p = refine.init_params(K, H, A, rng, zero_output=False)
    p = {k: (v + rng.normal(size=v.shape) * 0.3).astype(np.float32) for k, v in p.items()}
    defs = cuda.defines(A, K, H)
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
        L("diffusion_refine_backward", grid, rows,
          ["q", "var", "dy", "dq", "partials", np.int32(batch), s, *refine.NAMES]),
        L("diffusion_refine_grad_reduce", -(-P // 32), cuda.REDUCE_THREADS,
          ["partials", np.int32(grid), *("d" + n for n in refine.NAMES)]),
    ], defines=defs)
    p64 = {k: v.astype(np.float64) for k, v in p.items()}
    ref, cache = refine.forward(np, p64, q.astype(np.float64), var.astype(np.float64), 0.1)
    dref, gref = refine.backward(np, p64, cache, dy.astype(np.float64))
    assert _rel(res["out"], ref) < TOL, f"forward (seed {seed})"
    assert _rel(res["dq"], dref) < TOL, f"dq (seed {seed})"
    for n in refine.NAMES:
        assert np.isfinite(res["d" + n]).all(), f"{n} not written (seed {seed})"
        assert _rel(res["d" + n], gref[n]) < TOL_GRAD, f"{n} (seed {seed})"
    for n in ("q", "var", "dy"):
        np.testing.assert_array_equal(res[n], bufs[n])
