"""kan_gate's CUDA sources on a machine without a GPU: they compile (nvcc, where present) for the
grids the options allow, without spills; the fragment stands on its own for a fused epilogue;
no atomics; the backward's launch shape covers every row once.

Compiled as :func:`foxhunt_core.backend.load_module` compiles them: the ``#define``s of
:func:`foxhunt_kan_gate.cuda.defines` as a preamble, the kernel's folder on the include path.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from foxhunt_kan_gate.cuda import (
    FRAGMENT_FILE,
    KERNEL_FILE,
    KERNEL_FUNCTIONS,
    MIN_CHUNK_ROWS,
    TARGET_BLOCKS,
    UNIT_TILE,
    backward_shape,
    defines,
)
from foxhunt_kan_gate.options import MAX_BASES
from foxhunt_kan_gate.spline import Grid

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
GRIDS = [Grid(), Grid(-4.0, 4.0, 4), Grid(-3.3, 0.001, 5), Grid(-2.5, 3.0, 12), Grid(-6.0, 6.0, MAX_BASES)]

# A GEMM epilogue's use of the fragment, in miniature: gate values of a tile, then the backward
# with the per-unit accumulators reduced by the caller (here: written out per thread).
EPILOGUE_PROBE = r"""
#include "kan_gate.cuh"
extern "C" __global__ void probe(const float* pre, const float* coeff, const float* residual, const float* dgate,
                                 float* gate, float* dpre, float* terms, int rows, int width) {
    const int unit = blockIdx.x * blockDim.x + threadIdx.x;
    if (unit >= width) return;
    const float* c = coeff + unit * KG_NUM_BASES;
    float acc[KG_TERMS] = {};
    for (int row = 0; row < rows; ++row) {
        const int i = row * width + unit;
        gate[i] = kan_gate_value(pre[i], c, residual[unit]);
        KanPoint p;
        float md;
        dpre[i] = kan_gate_grad(pre[i], c, residual[unit], dgate[i], &p, &md);
        kan_accumulate(acc, p, md, pre[i]);
    }
    for (int k = 0; k < KG_TERMS; ++k) terms[k * width + unit] = acc[k];
}
"""


def _compile(src: str, defs: dict[str, str], tmp: Path, name: str) -> str:
    cu = tmp / f"{name}.cu"
    cu.write_text("".join(f"#define {k} {v}\n" for k, v in defs.items()) + f'#line 1 "{name}.cu"\n' + src)
    cmd = [NVCC, "-cubin", "-Xptxas", "-v", "-arch=sm_90", "-std=c++17", f"-I{KERNEL_FILE.parent}",
           "-o", str(tmp / f"{name}.cubin"), str(cu)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{name} does not compile with {defs}:\n{res.stderr}{res.stdout}"
    return res.stderr + res.stdout


@needs_nvcc
@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_kernels_compile_for_each_grid_without_spills(grid, tmp_path):
    msgs = _compile(KERNEL_FILE.read_text(), defines(grid), tmp_path, "kan_gate")
    for fn in KERNEL_FUNCTIONS:
        assert f"Compiling entry function '{fn}'" in msgs, fn
    spills = re.findall(r"(\d+) bytes spill stores", msgs)
    assert len(spills) == len(KERNEL_FUNCTIONS) and all(n == "0" for n in spills), msgs


@needs_nvcc
@pytest.mark.parametrize("grid", [Grid(), Grid(-2.5, 3.0, 12)], ids=str)
def test_fragment_compiles_into_another_kernel(grid, tmp_path):
    """The fusion contract: kan_gate.cuh alone (no kan_gate.cu) gives an epilogue the gate, its
    derivative and the per-unit gradient terms."""
    msgs = _compile(EPILOGUE_PROBE, {k: v for k, v in defines(grid).items() if k.startswith("KG_") and
                                     k not in ("KG_UNIT_TILE", "KG_ROW_THREADS")}, tmp_path, "probe")
    assert "Compiling entry function 'probe'" in msgs


@needs_nvcc
def test_fragment_defaults_are_the_default_options(tmp_path):
    """Without a preamble the fragment compiles for the default grid (8 bases on [-4, 4])."""
    src = FRAGMENT_FILE.read_text()
    got = dict(re.findall(r"#ifndef (KG_\w+)\s*\n\s*#define \1 ([^\n]+)", src))
    want = defines(Grid())
    assert {k: got[k] for k in ("KG_NUM_BASES", "KG_GRID_LO", "KG_GRID_HI")} == {
        k: want[k] for k in ("KG_NUM_BASES", "KG_GRID_LO", "KG_GRID_HI")}
    _compile(EPILOGUE_PROBE, {}, tmp_path, "probe_defaults")


def test_sources_use_no_atomics():
    """Parameter gradients are reduced by per-block partials and a fixed-order second pass."""
    for path in (KERNEL_FILE, FRAGMENT_FILE):
        calls = re.findall(r"\b(atomic\w*|red\.global\w*)\s*\(", path.read_text())
        assert calls == [], f"{path.name}: {calls}"


@pytest.mark.parametrize("rows", [1, 63, 64, 65, 1000, 4096, 16_384, 65_536, 262_147])
@pytest.mark.parametrize("width", [1, 32, 100, 256, 1024])
def test_backward_shape_covers_every_row_once(rows, width):
    tiles, chunks, per = backward_shape(rows, width)
    assert tiles * UNIT_TILE >= width > (tiles - 1) * UNIT_TILE
    assert chunks * per >= rows > (chunks - 1) * per  # the last chunk is not empty
    assert per >= min(rows, MIN_CHUNK_ROWS)
    assert tiles * chunks <= max(TARGET_BLOCKS + tiles, tiles)


def test_defines_are_c_float_literals():
    d = defines(Grid(-3.3, 0.001, 5))
    assert d["KG_NUM_BASES"] == "5" and d["KG_GRID_LO"] == "(-3.3f)" and d["KG_GRID_HI"] == "(0.001f)"
