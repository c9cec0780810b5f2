// Adam with global-norm gradient clipping over one flat parameter buffer, replayable as a CUDA
// graph: the step counter, the clip scale and the bias corrections live in device memory.
//
// NumPy twin: foxhunt_core/optim.py (Adam.step, global_norm). Launch wrapper:
// foxhunt_core/gpu/optim.py. Flat buffers: foxhunt_core/gpu/flat.py (FlatTree).
//
//   grad_sumsq_partial  multi-block, grid-stride: partials[block] = sum of g^2 over its share
//                       (double, one row per block, block tree in a fixed order)
//   adam_prepare        one warp: norm = sqrt(sum partials), t = ++step[0],
//                       scalars = [norm, clip scale, lr / (1 - b1^t), 1 - b2^t]
//   adam_update         one thread per element, grid-stride:
//                       g *= scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//                       p -= (lr / c1) m / (sqrt(v / c2) + eps)

#define FULL_MASK 0xffffffffu
#include "defines.cuh"
#define SUMSQ_THREADS BLOCK_THREADS  // the wrapper launches BLOCK_THREADS threads per block

extern "C" __global__ void __launch_bounds__(SUMSQ_THREADS) grad_sumsq_partial(
    const float* __restrict__ grads,      // [n]
    long long n,
    double* __restrict__ partials)        // [gridDim.x]
{
    __shared__ double s_warp[SUMSQ_THREADS / 32];
    double acc = 0.0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const double g = (double)grads[i];
        acc += g * g;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, o);
    if ((threadIdx.x & 31) == 0) s_warp[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int w = 0; w < SUMSQ_THREADS / 32; ++w) total += s_warp[w];
        partials[blockIdx.x] = total;
    }
}

// Launched with one warp. clip_norm <= 0 disables clipping. lr_device (nullable) overrides lr,
// so a learning-rate schedule can live on the device too.
extern "C" __global__ void adam_prepare(
    const double* __restrict__ partials,  // [num_partials]
    int num_partials,
    int* __restrict__ step,               // [1] Adam's t, incremented here
    double lr, const float* __restrict__ lr_device,
    double b1, double b2, double clip_norm,
    float* __restrict__ scalars)          // [4] norm, clip scale, lr / c1, c2
{
    double total = 0.0;
    for (int k = threadIdx.x; k < num_partials; k += 32) total += partials[k];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(FULL_MASK, total, o);
    if (threadIdx.x == 0) {
        const double norm = sqrt(total);
        const double scale = (clip_norm > 0.0 && norm > clip_norm) ? clip_norm / (norm + 1e-12) : 1.0;
        const int t = step[0] + 1;
        step[0] = t;
        const double c1 = 1.0 - pow(b1, (double)t);
        const double c2 = 1.0 - pow(b2, (double)t);
        const double rate = lr_device != nullptr ? (double)lr_device[0] : lr;
        scalars[0] = (float)norm;
        scalars[1] = (float)scale;
        scalars[2] = (float)(rate / c1);
        scalars[3] = (float)c2;
    }
}

extern "C" __global__ void adam_update(
    float* __restrict__ params,           // [n]
    const float* __restrict__ grads,      // [n]
    float* __restrict__ m,                // [n]
    float* __restrict__ v,                // [n]
    long long n,
    float b1, float one_minus_b1,         // 1 - b1 and 1 - b2 come rounded from double: in float
    float b2, float one_minus_b2,         // 1.0f - 0.999f is 1.3e-5 off
    float eps,
    const float* __restrict__ scalars)    // [4] from adam_prepare
{
    const float scale = scalars[1];
    const float step_size = scalars[2];
    const float c2 = scalars[3];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = grads[i] * scale;
        const float mi = b1 * m[i] + one_minus_b1 * g;
        const float vi = b2 * v[i] + one_minus_b2 * (g * g);
        m[i] = mi;
        v[i] = vi;
        params[i] -= step_size * mi / (sqrtf(vi / c2) + eps);
    }
}
