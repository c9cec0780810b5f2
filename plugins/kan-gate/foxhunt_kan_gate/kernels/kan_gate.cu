// kan_gate's standalone kernels over [rows, width] gate pre-activations (row-major, C-contiguous),
// one thread per unit column and row stride, KG_UNIT_TILE units x KG_ROW_THREADS rows per block:
//   kan_gate_forward           gate [rows, width]
//   kan_gate_backward_partial  dpre [rows, width] and, per block, the units' parameter-gradient
//                              sums over the block's rows: partial [chunks, KG_TERMS, width]
//   kan_gate_param_reduce      dcoeff [width, KG_NUM_BASES] and dresidual [width]: the partials
//                              summed over the chunks in chunk order
//   kan_power                  the units' knot-power floats [width, KG_NUM_BASES] (what the fused
//                              GLU kernels read: kan_fragment.cuh) from their coefficients, for up
//                              to KG_POWER_SETS branches in one launch
// No atomics: the gradients are the same bits on every run. Launch wrappers: foxhunt_kan_gate/cuda.py.
#include "kan_gate.cuh"

#ifndef KG_UNIT_TILE
#define KG_UNIT_TILE 32
#endif
#ifndef KG_ROW_THREADS
#define KG_ROW_THREADS 8
#endif

extern "C" __global__ void kan_gate_forward(const float* __restrict__ pre, const float* __restrict__ coeff,
                                            const float* __restrict__ residual, float* __restrict__ gate, int rows,
                                            int width) {
    const int unit = blockIdx.x * KG_UNIT_TILE + threadIdx.x;
    if (unit >= width) return;
    const float* c = coeff + (size_t)unit * KG_NUM_BASES;
    const float r = residual[unit];
    for (int row = blockIdx.y * KG_ROW_THREADS + threadIdx.y; row < rows; row += gridDim.y * KG_ROW_THREADS) {
        const size_t i = (size_t)row * width + unit;
        gate[i] = kan_gate_value(pre[i], c, r);
    }
}

// Block (x, y) takes units x * KG_UNIT_TILE .. + KG_UNIT_TILE - 1 over rows
// y * rows_per_chunk .. min(rows, (y + 1) * rows_per_chunk) - 1.
extern "C" __global__ void kan_gate_backward_partial(const float* __restrict__ pre, const float* __restrict__ dgate,
                                                     const float* __restrict__ coeff,
                                                     const float* __restrict__ residual, float* __restrict__ dpre,
                                                     float* __restrict__ partial, int rows, int width,
                                                     int rows_per_chunk) {
    __shared__ float red[KG_ROW_THREADS][KG_TERMS][KG_UNIT_TILE];
    const int unit = blockIdx.x * KG_UNIT_TILE + threadIdx.x;
    const int r0 = blockIdx.y * rows_per_chunk;
    const int r1 = min(rows, r0 + rows_per_chunk);
    float acc[KG_TERMS];
#pragma unroll
    for (int k = 0; k < KG_TERMS; ++k) acc[k] = 0.0f;
    if (unit < width) {
        const float* c = coeff + (size_t)unit * KG_NUM_BASES;
        const float r = residual[unit];
        for (int row = r0 + threadIdx.y; row < r1; row += KG_ROW_THREADS) {
            const size_t i = (size_t)row * width + unit;
            const float x = pre[i];
            KanPoint p;
            float md;
            dpre[i] = kan_gate_grad(x, c, r, dgate[i], &p, &md);
            kan_accumulate(acc, p, md, x);
        }
    }
#pragma unroll
    for (int k = 0; k < KG_TERMS; ++k) red[threadIdx.y][k][threadIdx.x] = acc[k];
    __syncthreads();
    // the block's row threads summed in a fixed order
    for (int k = threadIdx.y; k < KG_TERMS; k += KG_ROW_THREADS) {
        float s = 0.0f;
#pragma unroll
        for (int y = 0; y < KG_ROW_THREADS; ++y) s += red[y][k][threadIdx.x];
        if (unit < width) partial[((size_t)blockIdx.y * KG_TERMS + k) * width + unit] = s;
    }
}

// One thread per (term, unit); consecutive threads read consecutive units of a chunk's row.
extern "C" __global__ void kan_gate_param_reduce(const float* __restrict__ partial, int chunks, int width,
                                                 float* __restrict__ dcoeff, float* __restrict__ dresidual) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width * KG_TERMS) return;
    const int k = i / width, unit = i % width;
    double s = 0.0;
    for (int ch = 0; ch < chunks; ++ch) s += (double)partial[((size_t)ch * KG_TERMS + k) * width + unit];
    if (k < KG_NUM_BASES) {
        dcoeff[(size_t)unit * KG_NUM_BASES + k] = (float)s;
    } else {
        dresidual[unit] = (float)s;
    }
}

#ifndef KG_POWER_SETS
#define KG_POWER_SETS 8
#endif

// The branches' coefficient arrays and where their knot-power floats go, by value.
struct __align__(8) KanPowerArgs {
    const float* coeff[KG_POWER_SETS];
    float* power[KG_POWER_SETS];
};

#ifdef KG_POWER_MAP  // (defined by the launch wrappers: foxhunt_kan_gate/cuda.py defines)
// spline.knot_power_map: row k is basis k in the knot-power form (float64, compiled in, so that
// the launch needs no copy to the device inside a captured step)
__constant__ double kan_power_map[KG_NUM_BASES * KG_NUM_BASES] = KG_POWER_MAP;

// Thread i of set blockIdx.y: unit i / K's float j = i % K, sum_k c[k] M[k, j] in double, rounded once.
extern "C" __global__ void kan_power(const __grid_constant__ KanPowerArgs a, int width) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width * KG_NUM_BASES) return;
    const int unit = i / KG_NUM_BASES, j = i % KG_NUM_BASES;
    const float* c = a.coeff[blockIdx.y] + (size_t)unit * KG_NUM_BASES;
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < KG_NUM_BASES; ++k) s += (double)c[k] * kan_power_map[k * KG_NUM_BASES + j];
    a.power[blockIdx.y][i] = (float)s;
}
#endif
