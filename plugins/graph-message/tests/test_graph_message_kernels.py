"""graph_message.cu without a GPU: it compiles for sm_90 (nvcc, where present), and its launches,
run on host threads by foxhunt_core.testing.cuda_emu, match the float64 twin.

Tolerance of the emulated kernels: ``||out - ref|| / ||ref|| < 2e-6`` (float32 arithmetic of a
few terms per output; the gradients' block sums in double).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from foxhunt_graph_message import cuda, graph

from foxhunt_core.testing import cuda_emu

TOL = 2e-6
# Parameter gradients are sums over the batch of float32 products against a float64 twin; a
# batch of one has no averaging, and 8.5e-6 was seen there: the float32 scale of DESIGN.md.
TOL_GRAD = 2e-5
LAYOUTS = {"3-3-3-3": (3, 3, 3, 3), "3-2-4-2": (3, 2, 4, 2), "1-2-1-3": (1, 2, 1, 3)}


def _offsets(sizes):
    return tuple(int(x) for x in np.concatenate([[0], np.cumsum(sizes)]))


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _preamble(defines: dict) -> str:
    return "".join(f"#define {k} {v}\n" for k, v in defines.items())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on this machine")
@pytest.mark.parametrize("layout", sorted(LAYOUTS), ids=str)
def test_kernels_compile_for_sm90_without_spills(layout, tmp_path):
    src = tmp_path / "graph_message.cu"
    src.write_text(_preamble(cuda.defines(_offsets(LAYOUTS[layout]))) + cuda.KERNEL_FILE.read_text())
    res = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", str(src),
                          "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
    assert len(spills) == 3 and set(spills) == {"0"}, res.stderr


needs_cxx = pytest.mark.skipif(cuda_emu.compiler() is None, reason="no host C++ compiler")


@needs_cxx
@pytest.mark.parametrize(("layout", "batch", "grid"), [("3-3-3-3", 300, 2), ("3-2-4-2", 37, 1), ("1-2-1-3", 1, 1),
                                                       ("3-3-3-3", 129, 3)])
def test_emulated_kernels_match_the_twin(layout, batch, grid):
    """Forward, backward and the gradient reduction, outputs poisoned with NaN; ``grid`` blocks of
    128 threads (fewer than the rows: the grid-stride loops; more: idle threads)."""
    sizes = LAYOUTS[layout]
    offs = _offsets(sizes)
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    A = offs[-1]
    q = (rng.normal(size=(batch, A)) * 2.0).astype(np.float32)
    dy = rng.normal(size=(batch, A)).astype(np.float32)
    params = {k: (rng.normal(size=s) * 0.6).astype(np.float32) for k, s in graph.param_shapes(sizes).items()}
    names = graph.param_names()
    P = cuda.packed_size(offs)
    bufs = {"q": q, "dy": dy, "out": np.full_like(q, np.nan), "dq": np.full_like(q, np.nan),
            "partials": np.full((grid, P), np.nan)}
    for i, n in enumerate(names):
        bufs[f"p{i}"] = params[n]
        bufs[f"g{i}"] = np.full_like(params[n], np.nan)
    ps = [f"p{i}" for i in range(len(names))]
    L = cuda_emu.Launch
    res = cuda_emu.run(cuda.KERNEL_FILE, bufs, [
        L("graph_message_forward", grid, cuda.THREADS, ["q", "out", np.int32(batch), *ps]),
        L("graph_message_backward", grid, cuda.THREADS, ["q", "dy", "dq", "partials", np.int32(batch), *ps]),
        L("graph_message_grad_reduce", -(-P // 32), cuda.REDUCE_THREADS,
          ["partials", np.int32(grid), *(f"g{i}" for i in range(len(names)))]),
    ], defines=cuda.defines(offs))
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    ref, cache = graph.forward(np, p64, q.astype(np.float64), offs)
    dref, gref = graph.backward(np, p64, cache, dy.astype(np.float64), offs)
    assert _rel(res["out"], ref) < TOL, f"forward (seed {seed})"
    assert _rel(res["dq"], dref) < TOL, f"dq (seed {seed})"
    for i, n in enumerate(names):
        assert np.isfinite(res[f"g{i}"]).all(), f"{n} not written (seed {seed})"
        assert _rel(res[f"g{i}"], gref[n]) < TOL_GRAD, f"{n} (seed {seed})"
    np.testing.assert_array_equal(res["q"], q)
    np.testing.assert_array_equal(res["dy"], dy)
