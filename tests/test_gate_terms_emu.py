"""gate_glu.cu's reduction of glu_backward_gemm's per-CTA gate sums (``terms_reduce``, the body of
``gate_terms_reduce``) run on host threads by foxhunt_core.testing.cuda_emu, against NumPy.

The GPU kernels themselves are checked on the GPU (tests/gpu/test_gpu_gate_fragments.py); here the
indexing: which CTAs hold which column tile, every (CTA, warp) pair summed once, each term written
into its array at its unit (two arrays of 2 and 1 floats a unit), every gradient element written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from foxhunt_core.testing import cuda_emu

KERNELS = Path(__file__).resolve().parent.parent / "foxhunt_core" / "kernels"
pytestmark = pytest.mark.skipif(cuda_emu.compiler() is None, reason="no host C++ compiler")

FRAGMENT = """#pragma once
#define GATE_UNIT0 2
#define GATE_UNIT1 1
__device__ __forceinline__ float gate_value(float x, const GateUnit&) { return x; }
__device__ __forceinline__ float gate_backward(float x, const GateUnit&, float dh, float v, float* gate, float* t) {
    *gate = x; t[0] = t[1] = t[2] = dh * v; return dh;
}
"""


def _wrapper(tmp: Path) -> Path:
    (tmp / "emu_gate.cuh").write_text(FRAGMENT)
    cu = tmp / "terms_reduce_plain.cu"
    cu.write_text(f"""#define __grid_constant__
static inline int min(int a, int b) {{ return a < b ? a : b; }}  // (CUDA's, for gate_glu_backward)
#define GATE_HEADER "emu_gate.cuh"
#include "{KERNELS / 'gate_glu.cu'}"
// terms_reduce with its gradient arrays passed as plain pointers (branch s's at s H units)
extern "C" __global__ void reduce_plain(const float* partial, int ctas, int warps, int tile_cols, int H, int blocks,
                                        float* g0, float* g1) {{
    GateArgs a = {{}};
    for (int s = 0; s < blocks; ++s) a.g[s][0] = g0 + 2LL * H * s, a.g[s][1] = g1 + (long long)H * s;
    terms_reduce(partial, ctas, warps, tile_cols, H, blocks, a);
}}
""")
    return cu


@pytest.mark.parametrize("H, blocks, ctas", [(256, 3, 132), (128, 1, 2), (384, 2, 12)])
def test_terms_reduce_sums_each_column_tiles_ctas(tmp_path, H, blocks, ctas):
    rng = np.random.default_rng()
    warps, tile, T = 8, 128, 3
    partial = rng.normal(size=(ctas, warps, T, tile)).astype(np.float32)
    bufs = {"partial": partial, "g0": np.full((blocks * H, 2), np.nan, np.float32),
            "g1": np.full(blocks * H, np.nan, np.float32)}
    L = cuda_emu.Launch
    res = cuda_emu.run(_wrapper(tmp_path), bufs, [
        L("reduce_plain", (blocks * H // 32, T), (32, 32),
          ["partial", np.int32(ctas), np.int32(warps), np.int32(tile), np.int32(H), np.int32(blocks), "g0", "g1"])])
    per_branch, col_tiles = H // tile, blocks * H // tile
    ref = np.zeros((blocks * H, T))
    p64 = partial.astype(np.float64)
    for u in range(blocks * H):
        b, j = divmod(u, H)
        ct = b * per_branch + j // tile
        ref[u] = p64[ct::col_tiles, :, :, j % tile].sum(axis=(0, 1))
    np.testing.assert_allclose(res["g0"], ref[:, :2], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(res["g1"], ref[:, 2], rtol=1e-6, atol=1e-6)
