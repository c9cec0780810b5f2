// Every Q-statistic of one batch in one multi-block reduction (two kernels), result on the device.
//
// NumPy twin: foxhunt_core/qpipe.py (q_statistics). Launch wrapper: foxhunt_core/gpu/qkernels.py.
// DESIGN.md defect 8: the plan reduced B * 12 values with a single block of 256 threads; here
// every block takes a grid-stride share of the batch and writes one row of partial sums, and a
// second one-block kernel adds the rows in a fixed order (deterministic, no atomics).
//
// Partial row (double), Q_P = 7 + 2 D entries:
//   [min qc, max qc, sum qc, sum qc^2, sum q_raw, sum H/log N, sum utilization,
//    sum_b gap_d (D), sum_b max_d (D)]
// Output (double), Q_K = 8 + D entries, in the order of q_statistics' record:
//   [q_min, q_max, q_mean, q_var, raw_q_mean, atom_entropy, atom_utilization,
//    q_gap_0 .. q_gap_{D-1}, avg_max_q]
//
// Thread mapping in q_stats_partial: per-sample work (Q-values, branch maxima and gaps) is one
// thread per sample; the atom work (entropy, utilization over N atoms) is one warp per QS_ROWS
// (b, a) rows, lane l holding atoms l, l + 32, ... Both loops are grid-stride over the same block.

#include "sizes.cuh"

#define ATOMS_PER_LANE ((NUM_ATOMS + 31) / 32)
#define Q_P (7 + 2 * NUM_BRANCHES)
#define Q_K (8 + NUM_BRANCHES)
#define QS_THREADS BLOCK_THREADS  // the wrapper launches BLOCK_THREADS threads per block
#define QS_WARPS (QS_THREADS / 32)
#define QS_ROWS 4        // (b, a) rows a warp loads at once
#define FULL_MASK 0xffffffffu

__constant__ int kBranchOffsets[NUM_BRANCHES + 1] = BRANCH_OFFSETS;

__device__ __forceinline__ double warp_sum_d(double x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(FULL_MASK, x, o);
    return x;
}

__device__ __forceinline__ float warp_sum_f(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(FULL_MASK, x, o);
    return x;
}

extern "C" __global__ void __launch_bounds__(QS_THREADS) q_stats_partial(
    const float* __restrict__ q_coord,    // [B, A]
    const float* __restrict__ q_raw,      // [B, A]
    const float* __restrict__ probs,      // [B, A, N]
    float mass_threshold,                 // an atom is used when p >= mass_threshold (already / N)
    double* __restrict__ partials,        // [gridDim.x, Q_P]
    int batch)
{
    __shared__ double s_part[QS_WARPS][Q_P];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const double inf = __longlong_as_double(0x7ff0000000000000LL);

    double acc[Q_P];
    acc[0] = inf;
    acc[1] = -inf;
#pragma unroll
    for (int k = 2; k < Q_P; ++k) acc[k] = 0.0;

    // Per-sample statistics: one thread per sample.
    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < batch;
         b += (long long)gridDim.x * blockDim.x) {
        const float* qc = q_coord + b * NUM_ACTIONS;
        const float* qr = q_raw + b * NUM_ACTIONS;
#pragma unroll
        for (int a = 0; a < NUM_ACTIONS; ++a) {
            const double x = (double)qc[a];
            acc[0] = fmin(acc[0], x);
            acc[1] = fmax(acc[1], x);
            acc[2] += x;
            acc[3] += x * x;
            acc[4] += (double)qr[a];
        }
#pragma unroll
        for (int d = 0; d < NUM_BRANCHES; ++d) {
            // best and second best (a tie gives a zero gap, as sorting does)
            float best = qc[kBranchOffsets[d]];
            float second = __int_as_float(0xff800000);
            for (int a = kBranchOffsets[d] + 1; a < kBranchOffsets[d + 1]; ++a) {
                const float x = qc[a];
                if (x > best) {
                    second = best;
                    best = x;
                } else if (x > second) {
                    second = x;
                }
            }
            acc[7 + d] += (double)best - (double)second;
            acc[7 + NUM_BRANCHES + d] += (double)best;
        }
    }

    // Atom statistics: one warp per QS_ROWS consecutive (b, a) rows, their loads issued together
    // (a reduction grid is capped, so each warp must keep several loads in flight). Rows past
    // the end read as p = 0, which adds nothing to either sum.
    const float inv_log_n = 1.0f / logf((float)NUM_ATOMS);
    const long long rows = (long long)batch * NUM_ACTIONS;
    for (long long row0 = ((long long)blockIdx.x * QS_WARPS + warp) * QS_ROWS; row0 < rows;
         row0 += (long long)gridDim.x * QS_WARPS * QS_ROWS) {
        float p[QS_ROWS][ATOMS_PER_LANE];
#pragma unroll
        for (int r = 0; r < QS_ROWS; ++r) {
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                const int j = lane + 32 * k;
                p[r][k] = (row0 + r < rows && j < NUM_ATOMS) ? probs[(row0 + r) * NUM_ATOMS + j] : 0.0f;
            }
        }
#pragma unroll
        for (int r = 0; r < QS_ROWS; ++r) {
            float h = 0.0f, used = 0.0f;
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                h -= p[r][k] * logf(fmaxf(p[r][k], 1e-30f));
                used += p[r][k] >= mass_threshold ? 1.0f : 0.0f;
            }
            h = warp_sum_f(h);
            used = warp_sum_f(used);
            if (lane == 0) {
                acc[5] += (double)(h * inv_log_n);
                acc[6] += (double)used / NUM_ATOMS;
            }
        }
    }

    // Block reduction: warps first, then one thread per entry over the warps.
#pragma unroll
    for (int k = 0; k < Q_P; ++k) {
        double x = acc[k];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const double y = __shfl_xor_sync(FULL_MASK, x, o);
            x = k == 0 ? fmin(x, y) : (k == 1 ? fmax(x, y) : x + y);
        }
        if (lane == 0) s_part[warp][k] = x;
    }
    __syncthreads();
    if (threadIdx.x < Q_P) {
        const int k = threadIdx.x;
        double x = s_part[0][k];
        for (int w = 1; w < QS_WARPS; ++w) {
            const double y = s_part[w][k];
            x = k == 0 ? fmin(x, y) : (k == 1 ? fmax(x, y) : x + y);
        }
        partials[(long long)blockIdx.x * Q_P + k] = x;
    }
}

// One block of 32 * Q_P threads: warp k folds column k of the partial rows (lanes stride over the
// rows, then a fixed shuffle tree), then thread 0 writes the statistics.
extern "C" __global__ void q_stats_finalize(
    const double* __restrict__ partials,  // [num_partials, Q_P]
    int num_partials, int batch,
    double* __restrict__ out)             // [Q_K]
{
    __shared__ double s_tot[Q_P];
    const int lane = threadIdx.x & 31;
    const int k = threadIdx.x >> 5;
    if (k < Q_P) {
        const double inf = __longlong_as_double(0x7ff0000000000000LL);
        double x = k == 0 ? inf : (k == 1 ? -inf : 0.0);
        for (int r = lane; r < num_partials; r += 32) {
            const double y = partials[(long long)r * Q_P + k];
            x = k == 0 ? fmin(x, y) : (k == 1 ? fmax(x, y) : x + y);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const double y = __shfl_xor_sync(FULL_MASK, x, o);
            x = k == 0 ? fmin(x, y) : (k == 1 ? fmax(x, y) : x + y);
        }
        if (lane == 0) s_tot[k] = x;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const double n_q = (double)batch * NUM_ACTIONS;
        const double mean = s_tot[2] / n_q;
        out[0] = s_tot[0];
        out[1] = s_tot[1];
        out[2] = mean;
        out[3] = fmax(s_tot[3] / n_q - mean * mean, 0.0);
        out[4] = s_tot[4] / n_q;
        out[5] = s_tot[5] / n_q;
        out[6] = s_tot[6] / n_q;
        double max_sum = 0.0;
        for (int d = 0; d < NUM_BRANCHES; ++d) {
            out[7 + d] = s_tot[7 + d] / batch;
            max_sum += s_tot[7 + NUM_BRANCHES + d];
        }
        out[7 + NUM_BRANCHES] = max_sum / ((double)batch * NUM_BRANCHES);
    }
}
