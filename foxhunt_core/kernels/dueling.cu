// Dueling aggregation, log-softmax over atoms and expected Q: forward and backward.
//
// NumPy twins: foxhunt_core/net/network.py (BranchingC51.forward / .backward, the lines around
// "V + Adv - mean_a Adv"), foxhunt_core/net/layers.py (log_softmax) and
// foxhunt_core/qpipe.py (expected_q). Launch wrappers: foxhunt_core/gpu/kernels.py.
//
// Compile-time sizes (load_module's #define preamble; the defaults below match
// foxhunt_core.gpu.kernels.DEFAULT_DEFINES):
//   NUM_ATOMS        N, atoms per distribution
//   NUM_ACTIONS      A, actions over all branches
//   NUM_BRANCHES     D
//   BRANCH_OFFSETS   {o_0, ..., o_D}: branch d owns actions [o_d, o_{d+1})
//   MAX_BRANCH_SIZE  the largest o_{d+1} - o_d
//   ADV_COLUMNS      {c_0, ..., c_D}: branch d's advantages (its actions' atoms, action-major)
//                    start at column c_d of an advantage row; c_D is the row's width. Packed:
//                    c_d = o_d N. The GPU network pads each block to a multiple of 4 floats, so
//                    that the advantage GEMMs run on cuBLAS's aligned kernels.
//   V_COLUMNS        the value head's width (N, or N padded to a multiple of 4); its rows are
//                    v_pitch floats apart (an argument: the value head may share its GEMM's
//                    output with other columns)
// Padding columns of v and adv are never read; the backward writes zeros into those of dv and
// dadv (they are the GEMMs' inputs, and the weight gradients over the padding must be zero).
//
// Thread mapping: one warp per (sample, branch) in the forward, one warp per sample in the
// backward (the value-head gradient sums over every branch). Lane l holds atoms l, l + 32, ...

#include "sizes.cuh"

#define ATOMS_PER_LANE ((NUM_ATOMS + 31) / 32)
#define FULL_MASK 0xffffffffu

#ifndef ADV_COLUMNS
#define ADV_COLUMNS {0, 153, 306, 459, 612}
#endif
#ifndef V_COLUMNS
#define V_COLUMNS 51
#endif

__constant__ int kBranchOffsets[NUM_BRANCHES + 1] = BRANCH_OFFSETS;
__constant__ int kAdvColumns[NUM_BRANCHES + 1] = ADV_COLUMNS;
__constant__ int kBranchOfAction[NUM_ACTIONS] = BRANCH_OF_ACTION;

// Warp-wide max / sum of M values per lane at once.
template <int M>
__device__ __forceinline__ void warp_max_n(float (&x)[M]) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int i = 0; i < M; ++i) x[i] = fmaxf(x[i], __shfl_xor_sync(FULL_MASK, x[i], o));
    }
}

template <int M>
__device__ __forceinline__ void warp_sum_n(float (&x)[M]) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int i = 0; i < M; ++i) x[i] += __shfl_xor_sync(FULL_MASK, x[i], o);
    }
}

// logits[b, a, :] = v[b, :] + adv[b, a, :] - mean_{a' in branch(a)} adv[b, a', :]
// log_probs = log_softmax(logits) over atoms, probs = exp(log_probs),
// q = sum_j p_j z_j, var = max(sum_j p_j z_j^2 - q^2, 0).
// Only branches [branch_begin, branch_end) are computed (the magnitude branch reads the
// direction branch's Q, so the network may run the direction branch first).
// v_bias / adv_bias (the value head's and the advantage layers' biases) are added as the
// inputs are read, when given. log_probs, probs and var may be null: a forward that only needs
// the expected Q (the bootstrap's action choice) skips their writes.
// Segments: the rows fall into consecutive segments of seg_rows rows (forwards of different
// networks or inputs run as one), and segment s writes log_probs / probs / var only where bit
// 0 / 1 / 2 of (seg_wants >> 3 s) is set; every output is indexed by the row over all segments.
// zq (optional, row pitch zq_pitch): the direction branch's (branch 0's) Q times zq_scale is
// also written there: the magnitude branch's input columns in the augmented z.
extern "C" __global__ void dueling_softmax_forward(
    const float* __restrict__ v,          // [B, V_COLUMNS], rows v_pitch apart
    int v_pitch,
    const float* __restrict__ adv,        // [B, c_D]
    const float* __restrict__ v_bias,     // [N] or null
    const float* __restrict__ adv_bias,   // [A, N] or null
    const float* __restrict__ z,          // [N]
    float* __restrict__ log_probs,        // [B, A, N] or null
    float* __restrict__ probs,            // [B, A, N] or null
    float* __restrict__ q,                // [B, A]
    float* __restrict__ var,              // [B, A] or null
    float* __restrict__ zq,               // [B, zq_pitch] or null
    int zq_pitch, float zq_scale,
    int batch, int branch_begin, int branch_end, int seg_rows, int seg_wants)
{
    const int lane = threadIdx.x & 31;
    const int warps_per_block = blockDim.x >> 5;
    const int nbr = branch_end - branch_begin;
    const long long rows = (long long)batch * nbr;
    const int adv_pitch = kAdvColumns[NUM_BRANCHES];
    const float neg_inf = __int_as_float(0xff800000);

    float zz[ATOMS_PER_LANE];
#pragma unroll
    for (int k = 0; k < ATOMS_PER_LANE; ++k) {
        const int j = lane + 32 * k;
        zz[k] = j < NUM_ATOMS ? z[j] : 0.0f;
    }

    for (long long row = (long long)blockIdx.x * warps_per_block + (threadIdx.x >> 5); row < rows;
         row += (long long)gridDim.x * warps_per_block) {
        const long long b = row / nbr;
        const int d = branch_begin + (int)(row % nbr);
        const int wants = seg_wants >> (3 * (int)(b / seg_rows));
        float* __restrict__ lp_out = (wants & 1) ? log_probs : nullptr;
        float* __restrict__ p_out = (wants & 2) ? probs : nullptr;
        const int a0 = kBranchOffsets[d];
        const int n = kBranchOffsets[d + 1] - a0;
        const float* adv_d = adv + b * adv_pitch + kAdvColumns[d];

        float vv[ATOMS_PER_LANE], mean[ATOMS_PER_LANE];
        float ad[MAX_BRANCH_SIZE][ATOMS_PER_LANE];
#pragma unroll
        for (int k = 0; k < ATOMS_PER_LANE; ++k) {
            const int j = lane + 32 * k;
            vv[k] = j < NUM_ATOMS ? v[b * v_pitch + j] + (v_bias != nullptr ? v_bias[j] : 0.0f) : 0.0f;
            mean[k] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < MAX_BRANCH_SIZE; ++i) {
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                const int j = lane + 32 * k;
                const bool ok = i < n && j < NUM_ATOMS;
                ad[i][k] = ok ? adv_d[i * NUM_ATOMS + j]
                                    + (adv_bias != nullptr ? adv_bias[(a0 + i) * NUM_ATOMS + j] : 0.0f)
                              : 0.0f;
                mean[k] += ad[i][k];
            }
        }
#pragma unroll
        for (int k = 0; k < ATOMS_PER_LANE; ++k) mean[k] /= (float)n;

        // The branch's actions side by side: each warp reduction below runs for all of them at
        // once (independent shuffles interleave), instead of one dependent chain per action.
        float lg[MAX_BRANCH_SIZE][ATOMS_PER_LANE], mx[MAX_BRANCH_SIZE], se[MAX_BRANCH_SIZE];
#pragma unroll
        for (int i = 0; i < MAX_BRANCH_SIZE; ++i) {
            mx[i] = neg_inf;
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                const int j = lane + 32 * k;
                lg[i][k] = i < n && j < NUM_ATOMS ? (vv[k] + ad[i][k]) - mean[k] : neg_inf;
                mx[i] = fmaxf(mx[i], lg[i][k]);
            }
        }
        warp_max_n(mx);
#pragma unroll
        for (int i = 0; i < MAX_BRANCH_SIZE; ++i) {
            se[i] = 0.0f;
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                lg[i][k] -= mx[i];  // padded atoms stay at -inf and contribute exp(-inf) = 0
                if (i < n) se[i] += expf(lg[i][k]);
            }
        }
        warp_sum_n(se);
        float s1[MAX_BRANCH_SIZE], s2[MAX_BRANCH_SIZE];
#pragma unroll
        for (int i = 0; i < MAX_BRANCH_SIZE; ++i) {
            s1[i] = 0.0f;
            s2[i] = 0.0f;
            if (i >= n) continue;
            const float lse = logf(se[i]);
            const long long base = (b * NUM_ACTIONS + a0 + i) * NUM_ATOMS;
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                const int j = lane + 32 * k;
                if (j < NUM_ATOMS) {
                    const float lp = lg[i][k] - lse;
                    const float p = expf(lp);
                    if (lp_out != nullptr) lp_out[base + j] = lp;
                    if (p_out != nullptr) p_out[base + j] = p;
                    s1[i] += p * zz[k];
                    s2[i] += p * zz[k] * zz[k];
                }
            }
        }
        warp_sum_n(s1);
        warp_sum_n(s2);
        if (lane == 0) {
#pragma unroll
            for (int i = 0; i < MAX_BRANCH_SIZE; ++i) {
                if (i >= n) break;
                q[b * NUM_ACTIONS + a0 + i] = s1[i];
                if (var != nullptr && (wants & 4)) var[b * NUM_ACTIONS + a0 + i] = fmaxf(s2[i] - s1[i] * s1[i], 0.0f);
                if (zq != nullptr && d == 0) zq[b * zq_pitch + i] = s1[i] * zq_scale;
            }
        }
    }
}

// Backward of the dueling aggregation, with the expected-Q path optionally fused in:
//   dl[b, a, j] = dlogits[b, a, j] + dq[b, a] * p[b, a, j] * (z_j - q[b, a])   (dq may be null)
//   dv[b, j]    = sum_a dl[b, a, j]
//   dadv[b, a, j] = dl[b, a, j] - mean_{a' in branch(a)} dl[b, a', j]
// Only branches [branch_begin, branch_end) are read and written; with accumulate_dv != 0 their
// share of dv is added to dv instead of overwriting it (the network runs the magnitude branch's
// backward before the direction branch's dq is known, so it calls this twice).
extern "C" __global__ void dueling_backward(
    const float* __restrict__ dlogits,    // [B, A, N]
    const float* __restrict__ dq,         // [B, ld_dq] or null (column a: action a's gradient)
    int ld_dq, float dq_scale,            // dq's row pitch; it is read times dq_scale
    const float* __restrict__ probs,      // [B, A, N] (read only when dq is given)
    const float* __restrict__ q,          // [B, A]    (read only when dq is given)
    const float* __restrict__ z,          // [N]
    float* __restrict__ dv,               // [B, V_COLUMNS], rows v_pitch apart
    int v_pitch,
    float* __restrict__ dadv,             // [B, c_D]
    int batch, int branch_begin, int branch_end, int accumulate_dv)
{
    const int lane = threadIdx.x & 31;
    const int adv_pitch = kAdvColumns[NUM_BRANCHES];
    const int warps_per_block = blockDim.x >> 5;
    float zz[ATOMS_PER_LANE];
#pragma unroll
    for (int k = 0; k < ATOMS_PER_LANE; ++k) {
        const int j = lane + 32 * k;
        zz[k] = j < NUM_ATOMS ? z[j] : 0.0f;
    }

    for (long long b = (long long)blockIdx.x * warps_per_block + (threadIdx.x >> 5); b < batch;
         b += (long long)gridDim.x * warps_per_block) {
        float acc_v[ATOMS_PER_LANE];
#pragma unroll
        for (int k = 0; k < ATOMS_PER_LANE; ++k) acc_v[k] = 0.0f;

        for (int d = branch_begin; d < branch_end; ++d) {
            const int a0 = kBranchOffsets[d];
            const int n = kBranchOffsets[d + 1] - a0;
            float dl[MAX_BRANCH_SIZE][ATOMS_PER_LANE];
            float mean[ATOMS_PER_LANE];
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) mean[k] = 0.0f;
#pragma unroll
            for (int i = 0; i < MAX_BRANCH_SIZE; ++i) {
                const long long ba = b * NUM_ACTIONS + a0 + i;
                float dqa = 0.0f, qa = 0.0f;
                if (dq != nullptr && i < n) {
                    dqa = dq[b * ld_dq + a0 + i] * dq_scale;
                    qa = q[ba];
                }
#pragma unroll
                for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                    const int j = lane + 32 * k;
                    float g = 0.0f;
                    if (i < n && j < NUM_ATOMS) {
                        g = dlogits[ba * NUM_ATOMS + j];
                        if (dq != nullptr) g += dqa * probs[ba * NUM_ATOMS + j] * (zz[k] - qa);
                    }
                    dl[i][k] = g;
                    mean[k] += g;
                }
            }
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                acc_v[k] += mean[k];
                mean[k] /= (float)n;
            }
            float* dadv_d = dadv + b * adv_pitch + kAdvColumns[d];
#pragma unroll
            for (int i = 0; i < MAX_BRANCH_SIZE; ++i) {
                if (i >= n) break;
#pragma unroll
                for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                    const int j = lane + 32 * k;
                    if (j < NUM_ATOMS) dadv_d[i * NUM_ATOMS + j] = dl[i][k] - mean[k];
                }
            }
            for (int c = n * NUM_ATOMS + lane; c < kAdvColumns[d + 1] - kAdvColumns[d]; c += 32)
                dadv_d[c] = 0.0f;  // the block's padding
        }
        float* dv_b = dv + b * v_pitch;
#pragma unroll
        for (int k = 0; k < ATOMS_PER_LANE; ++k) {
            const int j = lane + 32 * k;
            if (j < NUM_ATOMS) dv_b[j] = accumulate_dv ? dv_b[j] + acc_v[k] : acc_v[k];
        }
        for (int j = NUM_ATOMS + lane; j < V_COLUMNS; j += 32) dv_b[j] = 0.0f;
    }
}

// d q_a / d logit_{a, j} = p_{a, j} (z_j - q_a):
//   out[b, a, j] (+)= dq[b, a] * p[b, a, j] * (z_j - q[b, a])
// One thread per element. accumulate != 0 adds to out instead of overwriting it.
extern "C" __global__ void expected_q_backward(
    const float* __restrict__ dq,         // [B, A]
    const float* __restrict__ probs,      // [B, A, N]
    const float* __restrict__ q,          // [B, A]
    const float* __restrict__ z,          // [N]
    float* __restrict__ out,              // [B, A, N]
    long long total, int accumulate)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long ba = i / NUM_ATOMS;
        const int j = (int)(i - ba * NUM_ATOMS);
        const float g = dq[ba] * probs[i] * (z[j] - q[ba]);
        out[i] = accumulate ? out[i] + g : g;
    }
}

// The rows of the chosen actions, one per branch, and their inverse:
//   gather_actions:  out[b, d, j] = x[b, action[b, d], j]
//   scatter_actions: out[b, a, j] = vals[b, d, j] if a == action[b, d] (d = branch of a), else 0
// `action` holds absolute action indices (branch offset included). A thread per output element;
// `width` is N (atoms) or 1 (a value per action).
extern "C" __global__ void gather_actions(
    const float* __restrict__ x,          // [B, A, width]
    const long long* __restrict__ action, // [B, D]
    float* __restrict__ out,              // [B, D, width]
    long long total, int width)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long bd = i / width;
        const int j = (int)(i - bd * width);
        const long long b = bd / NUM_BRANCHES;
        out[i] = x[(b * NUM_ACTIONS + action[bd]) * width + j];
    }
}

extern "C" __global__ void scatter_actions(
    const float* __restrict__ vals,       // [B, D, width]
    const long long* __restrict__ action, // [B, D]
    float* __restrict__ out,              // [B, A, width]
    long long total, int width)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long ba = i / width;
        const int j = (int)(i - ba * width);
        const long long b = ba / NUM_ACTIONS;
        const int a = (int)(ba - b * NUM_ACTIONS);
        const int d = kBranchOfAction[a];
        const long long bd = b * NUM_BRANCHES + d;
        out[i] = action[bd] == a ? vals[bd * width + j] : 0.0f;
    }
}

// The greedy action of each branch (the first of ties, as numpy.argmax):
//   out[b, d] = argmax_{a in branch d} values[b, a] (+ o_d with absolute != 0: the index over all actions)
// One thread per (sample, branch).
extern "C" __global__ void branch_argmax(
    const float* __restrict__ values,     // [B, A]
    long long* __restrict__ out,          // [B, D]
    int batch, int absolute)
{
    const long long rows = (long long)batch * NUM_BRANCHES;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < rows;
         t += (long long)gridDim.x * blockDim.x) {
        const long long b = t / NUM_BRANCHES;
        const int d = (int)(t - b * NUM_BRANCHES);
        const int a0 = kBranchOffsets[d], a1 = kBranchOffsets[d + 1];
        const float* v = values + b * NUM_ACTIONS;
        int best = a0;
        float vb = v[a0];
        for (int a = a0 + 1; a < a1; ++a) {
            const float x = v[a];
            if (vb == vb && (x > vb || x != x)) {  // as numpy: a NaN wins, the first of them
                best = a;
                vb = x;
            }
        }
        out[t] = absolute ? best : best - a0;
    }
}

// The auxiliary loss's error and its gradient, one thread per (sample, action):
//   e[b, d]        = values[b, action[b, d]] - target[b, d]        (action: absolute indices)
//   err2[b, d]     = e[b, d]^2                                      (by the taken action's thread)
//   dvalues[b, a]  = scale * e[b, d] where a = action[b, d], else 0 (d the branch of a)
// NumPy twin: agent.py (Agent.loss_and_grads, the take_along_axis / put_along_axis lines).
extern "C" __global__ void aux_error(
    const float* __restrict__ values,      // [B, A]
    const long long* __restrict__ action,  // [B, D]
    const float* __restrict__ target,      // [B, D]
    float scale,
    float* __restrict__ err2,              // [B, D]
    float* __restrict__ dvalues,           // [B, A]
    int batch)
{
    const long long total = (long long)batch * NUM_ACTIONS;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long b = t / NUM_ACTIONS;
        const int a = (int)(t - b * NUM_ACTIONS);
        const long long bd = b * NUM_BRANCHES + kBranchOfAction[a];
        float g = 0.0f;
        if (action[bd] == a) {
            const float e = values[t] - target[bd];
            err2[bd] = e * e;
            g = scale * e;
        }
        dvalues[t] = g;
    }
}
