"""The host emulation of CUDA kernels (foxhunt_core.testing.cuda_emu) on a kernel with barriers
and warp shuffles whose GPU parity is established: q_mean_center's two-launch reduction."""

from __future__ import annotations

import numpy as np
import pytest

from foxhunt_core.testing import cuda_emu

pytestmark = pytest.mark.skipif(cuda_emu.compiler() is None, reason="no host C++ compiler")


def test_emulated_reduction_matches_numpy():
    from foxhunt_q_mean_center.center import KERNEL_FILE

    rng = np.random.default_rng()
    q = (rng.normal(size=(97, 12)) + 3.0).astype(np.float32)
    parts, blocks, threads = 3, 2, 64  # grid-stride loops, several blocks, two warps each
    out = cuda_emu.run(
        KERNEL_FILE,
        {"q": q, "partial": np.full(parts, np.nan), "out": np.full_like(q, np.nan)},
        [cuda_emu.Launch("q_mean_partial", parts, threads, ["q", "partial", np.int64(q.size)]),
         cuda_emu.Launch("q_mean_subtract", blocks, threads, ["q", "partial", np.int32(parts), "out",
                                                             np.int64(q.size)])],
        defines={"QMC_THREADS": threads},
    )
    np.testing.assert_allclose(out["partial"].sum(), q.astype(np.float64).sum(), rtol=1e-12)
    ref = q.astype(np.float64) - q.astype(np.float64).mean()
    np.testing.assert_allclose(out["out"], ref, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(out["q"], q)


def test_emulated_shuffles_follow_cuda_semantics(tmp_path):
    src = tmp_path / "shfl.cu"
    src.write_text(r'''
extern "C" __global__ void shuffles(const float* x, float* out) {
    const int t = threadIdx.x, lane = t % 32;
    float v = x[blockIdx.x * blockDim.x + t];
    float* o = out + 4 * (blockIdx.x * blockDim.x + t);
    o[0] = __shfl_down_sync(0xffffffffu, v, 3);
    o[1] = __shfl_xor_sync(0xffffffffu, v, 5);
    o[2] = __shfl_sync(0xffffffffu, v, 7, 16);
    __shared__ float s[64];
    s[t] = v;
    __syncthreads();
    o[3] = s[63 - t] + (float)lane;
}
''')
    x = np.arange(128, dtype=np.float32)
    res = cuda_emu.run(src, {"x": x, "out": np.full(512, np.nan, np.float32)},
                       [cuda_emu.Launch("shuffles", 2, 64, ["x", "out"])])["out"].reshape(2, 64, 4)
    for b in range(2):
        for t in range(64):
            lane, v = t % 32, x[b * 64 : (b + 1) * 64]
            assert res[b, t, 0] == v[t + 3 if lane + 3 < 32 else t]
            assert res[b, t, 1] == v[t ^ 5]
            assert res[b, t, 2] == v[t // 16 * 16 + 7]
            assert res[b, t, 3] == v[63 - t] + lane


def test_a_barrier_some_threads_never_reach_is_reported(tmp_path):
    src = tmp_path / "divergent.cu"
    src.write_text(r'''
extern "C" __global__ void divergent(float* out) {
    if (threadIdx.x < 40) {
        __syncthreads();   // lanes 40..63 of the second warp meet a warp barrier instead
    } else {
        __syncwarp();
    }
    out[threadIdx.x] = 1.0f;
}
''')
    with pytest.raises(RuntimeError, match="deadlocks"):
        cuda_emu.run(src, {"out": np.zeros(64, np.float32)}, [cuda_emu.Launch("divergent", 1, 64, ["out"])])


def test_threads_that_return_early_drop_out_of_the_barrier(tmp_path):
    src = tmp_path / "early.cu"
    src.write_text(r'''
extern "C" __global__ void early(const int* n, float* out) {
    __shared__ float s[64];
    if ((int)threadIdx.x >= n[0]) return;
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[n[0] - 1 - threadIdx.x];
}
''')
    res = cuda_emu.run(src, {"n": np.array([37], np.int32), "out": np.full(64, -1.0, np.float32)},
                       [cuda_emu.Launch("early", 1, 64, ["n", "out"])])["out"]
    np.testing.assert_array_equal(res[:37], np.arange(36, -1, -1, dtype=np.float32))
    assert (res[37:] == -1.0).all()
