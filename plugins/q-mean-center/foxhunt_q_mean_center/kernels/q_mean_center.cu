/*
 * Q-mean centering: out[i] = q[i] - mean(q), the mean over all B * A expected Q-values.
 *
 * A multi-block reduction in two launches (the plan reduced B * A values with one block of 256
 * threads, which leaves all but one SM idle at large batch):
 *
 *   q_mean_partial   grid P: block b reduces a grid-stride slice of q to partial[b] (double);
 *   q_mean_subtract  grid G: every block first sums the P partials itself (P is small, at most
 *                    QMC_MAX_PARTIALS, and read from L2), then writes its grid-stride slice of
 *                    out = q - mean.
 *
 * Sums are accumulated in double and combined in a fixed order without atomics, so the result is
 * the same bit for bit from run to run. Both kernels must be launched with QMC_THREADS threads.
 */
#ifndef QMC_THREADS
#define QMC_THREADS 256
#endif

#define QMC_WARPS (QMC_THREADS / 32)

__device__ __forceinline__ double qmc_warp_sum(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

/* Sum of v over the block; the result is valid in thread 0 only. */
__device__ __forceinline__ double qmc_block_sum(double v) {
    __shared__ double warp_sums[QMC_WARPS];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = qmc_warp_sum(v);
    if (lane == 0) {
        warp_sums[warp] = v;
    }
    __syncthreads();
    v = (threadIdx.x < QMC_WARPS) ? warp_sums[threadIdx.x] : 0.0;
    if (warp == 0) {
        v = qmc_warp_sum(v);
    }
    return v;
}

extern "C" __global__ void q_mean_partial(
    const float* __restrict__ q,   /* [total] expected Q, row-major [B, A] */
    double* __restrict__ partial,  /* [gridDim.x] one partial sum per block */
    long long total)
{
    const long long stride = (long long)gridDim.x * QMC_THREADS;
    double s = 0.0;
    for (long long i = (long long)blockIdx.x * QMC_THREADS + threadIdx.x; i < total; i += stride) {
        s += (double)q[i];
    }
    s = qmc_block_sum(s);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = s;
    }
}

extern "C" __global__ void q_mean_subtract(
    const float* __restrict__ q,          /* [total] */
    const double* __restrict__ partial,   /* [num_partials] from q_mean_partial */
    int num_partials,
    float* __restrict__ out,              /* [total], may not alias q */
    long long total)
{
    __shared__ double mean_shared;
    double s = 0.0;
    for (int j = threadIdx.x; j < num_partials; j += QMC_THREADS) {
        s += partial[j];
    }
    s = qmc_block_sum(s);
    if (threadIdx.x == 0) {
        mean_shared = s / (double)total;
    }
    __syncthreads();
    const double mean = mean_shared;
    const long long stride = (long long)gridDim.x * QMC_THREADS;
    for (long long i = (long long)blockIdx.x * QMC_THREADS + threadIdx.x; i < total; i += stride) {
        out[i] = (float)((double)q[i] - mean);
    }
}
