// Dueling aggregation, log-softmax over atoms and expected Q: forward and backward.
//
// NumPy twins: foxhunt_core/net/network.py (BranchingC51.forward / .backward, the lines around
// "V + Adv - mean_a Adv"), foxhunt_core/net/layers.py (log_softmax) and
// foxhunt_core/qpipe.py (expected_q). Launch wrappers: foxhunt_core/gpu/kernels.py.
//
// Compile-time sizes (load_module's #define preamble; defines.cuh's defaults, from the table in
// foxhunt_core/gpu/defines.py, let the file compile on its own):
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
// Both walk their rows with a grid stride (the wrappers launch DUELING_BLOCKS_PER_SM blocks of
// 256 threads per SM, fewer for few rows) and load the next rows' inputs while they work on one.
// Sample and row indices are 32-bit (B D < 2^32), element offsets 64-bit.

#include "dueling_row.cuh"

// DUELING_BLOCKS_PER_SM: blocks of 256 threads per SM that __launch_bounds__ guarantees the two row
// kernels, from the floats a lane keeps per row (a row's logits, exps and the next row's inputs,
// the sums of up to SPREAD_ACTIONS actions): 64 registers for the default 51 atoms in branches of
// 3, then 80, 128 and 255 as they grow, so that no size spills to local memory. The launch passes
// its layout's (foxhunt_core/gpu/launch.py: dueling_blocks_per_sm) and launches as many.

__constant__ int kAdvColumns[NUM_BRANCHES + 1] = ADV_COLUMNS;
__constant__ int kBranchOfAction[NUM_ACTIONS] = BRANCH_OF_ACTION;

// Where the forward's grid-stride walk over rows (b, d) stands: the row's sample and its branch
// counted from the first branch computed.
struct DuelingPos {
    unsigned b, d;
};

// The dueling forward (dueling_row.cuh) of rows (b, d) for the samples b < batch and branches
// d in [branch_begin, branch_end) (the magnitude branch reads the direction branch's Q, so the
// network may run the direction branch first), a warp per row.
// v_bias / adv_bias (the value head's and the advantage layers' biases) are added as the
// inputs are read, when given. log_probs, probs and var may be null: a forward that only needs
// the expected Q (the bootstrap's action choice) skips their writes.
// Segments: the rows fall into consecutive segments of seg_rows rows (forwards of different
// networks or inputs run as one), and segment s writes log_probs / probs / var only where bit
// 0 / 1 / 2 of (seg_wants >> 3 s) is set; every output is indexed by the row over all segments.
// zq (optional, row pitch zq_pitch): the direction branch's (branch 0's) Q times zq_scale is
// also written there: the magnitude branch's input columns in the augmented z.
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, DUELING_BLOCKS_PER_SM) dueling_softmax_forward(
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
    constexpr int M = MAX_BRANCH_SIZE;
    const int lane = threadIdx.x & 31;
    const unsigned warps = blockDim.x >> 5;
    const unsigned nbr = branch_end - branch_begin;
    const unsigned adv_pitch = kAdvColumns[NUM_BRANCHES];
    float zz[ATOMS_PER_LANE], zz2[ATOMS_PER_LANE];
    dueling_support(z, lane, zz, zz2);
    const unsigned spread_lanes = dueling_spread_lanes(lane);
    const DuelingOutputs outs{log_probs, probs, q, var, zq, zq_pitch, zq_scale};

    const unsigned stride = gridDim.x * warps;
    const unsigned stride_b = stride / nbr, stride_d = stride % nbr;
    auto advance = [&](DuelingPos p) {
        p.b += stride_b;
        p.d += stride_d;
        if (p.d >= nbr) {
            p.d -= nbr;
            ++p.b;
        }
        return p;
    };
    auto load_inputs = [&](const DuelingPos& p, DuelingInputs& in) {
        if (p.b >= (unsigned)batch) return;
        const int d = branch_begin + (int)p.d;
        const int n = branch_size(d);
        const float* vr = v + (size_t)p.b * (unsigned)v_pitch;
        const float* ar = adv + ((size_t)p.b * adv_pitch + (unsigned)kAdvColumns[d]);
#pragma unroll
        for (int k = 0; k < ATOMS_PER_LANE; ++k) {
            const int j = lane + 32 * k;
            if (j < NUM_ATOMS) in.v[k] = vr[j];
#pragma unroll
            for (int i = 0; i < M; ++i)
                if (i < n && j < NUM_ATOMS) in.adv[i][k] = ar[i * NUM_ATOMS + j];
        }
    };

    DuelingPos pos;
    const unsigned row = blockIdx.x * warps + (threadIdx.x >> 5);  // b nbr + d
    pos.b = row / nbr;
    pos.d = row - pos.b * nbr;
    DuelingPos pos1 = advance(pos);
    DuelingInputs in;
    load_inputs(pos, in);
    unsigned seg_end = seg_rows;  // the end of the segment of the rows' sample (samples only grow)
    int wants = seg_wants;

    while (pos.b < (unsigned)batch) {
        DuelingInputs in1;
        load_inputs(pos1, in1);
        while (pos.b >= seg_end) {
            seg_end += seg_rows;
            wants >>= 3;
        }
        const int d = branch_begin + (int)pos.d;
        if (v_bias != nullptr || adv_bias != nullptr) {
            const int a0 = kBranchOffsets[d], n = branch_size(d);
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                const int j = lane + 32 * k;
                if (j >= NUM_ATOMS) continue;
                if (v_bias != nullptr) in.v[k] += v_bias[j];
#pragma unroll
                for (int i = 0; i < M; ++i)
                    if (i < n && adv_bias != nullptr) in.adv[i][k] += adv_bias[(a0 + i) * NUM_ATOMS + j];
            }
        }
        dueling_row(in, lane, pos.b, d, wants, zz, zz2, spread_lanes, outs);

        pos = pos1;
        pos1 = advance(pos1);
        in = in1;
    }
}

// What a backward row (b, d) reads, loaded ahead of its turn: the logits' gradient, and with dq
// the probabilities, dq and q of the branch's actions (kDq; without, those fields are never set
// and take no registers); with accumulate_dv at a sample's last branch its dv so far. The padding
// atoms are not loaded.
struct DuelingGrads {
    float dl[MAX_BRANCH_SIZE][ATOMS_PER_LANE];
    float p[MAX_BRANCH_SIZE][ATOMS_PER_LANE];
    float dq[MAX_BRANCH_SIZE], q[MAX_BRANCH_SIZE];
    float dv[ATOMS_PER_LANE];
};

// The backward's walk: a warp takes samples b = w, w + W, ... (W warps in all) and each sample's
// branches in turn, summing dv over them in registers, with the inputs of the next kAhead rows
// loading while one is worked on (two without dq, whose rows read little; one with dq).
template <bool kDq, int kAhead>
__device__ __forceinline__ void dueling_backward_rows(
    const float* __restrict__ dlogits, const float* __restrict__ dq, int ld_dq, float dq_scale,
    const float* __restrict__ probs, const float* __restrict__ q, const float* __restrict__ z,
    float* __restrict__ dv, int v_pitch, float* __restrict__ dadv,
    int batch, int branch_begin, int branch_end, int accumulate_dv)
{
    constexpr int M = MAX_BRANCH_SIZE;
    const int lane = threadIdx.x & 31;
    const unsigned adv_pitch = kAdvColumns[NUM_BRANCHES];
    const unsigned stride = gridDim.x * (blockDim.x >> 5);
    float zz[ATOMS_PER_LANE];
#pragma unroll
    for (int k = 0; k < ATOMS_PER_LANE; ++k) {
        const int j = lane + 32 * k;
        zz[k] = j < NUM_ATOMS ? z[j] : 0.0f;
    }

    struct Pos {
        unsigned b;
        int d;
    };
    auto advance = [&](Pos p) {
        if (++p.d == branch_end) {
            p.d = branch_begin;
            p.b += stride;
        }
        return p;
    };
    auto load_inputs = [&](const Pos& p, DuelingGrads& in) {
        if (p.b >= (unsigned)batch) return;
        const int a0 = kBranchOffsets[p.d];
        const int n = branch_size(p.d);
        const size_t row = (size_t)p.b * NUM_ACTIONS + a0;  // the branch's first action's row
#pragma unroll
        for (int i = 0; i < M; ++i) {
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                const int j = lane + 32 * k;
                if (i < n && j < NUM_ATOMS) {
                    in.dl[i][k] = dlogits[(row + i) * NUM_ATOMS + j];
                    if (kDq) in.p[i][k] = probs[(row + i) * NUM_ATOMS + j];
                }
            }
            if (kDq && i < n) {
                in.dq[i] = dq[(size_t)p.b * (unsigned)ld_dq + a0 + i];
                in.q[i] = q[row + i];
            }
        }
        if (accumulate_dv && p.d == branch_end - 1) {
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                const int j = lane + 32 * k;
                if (j < NUM_ATOMS) in.dv[k] = dv[(size_t)p.b * (unsigned)v_pitch + j];
            }
        }
    };

    Pos pos[kAhead + 1];  // pos[0]: the row worked on, pos[k]: the row k ahead
    DuelingGrads in[kAhead + 1];
    pos[0].b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    pos[0].d = branch_begin;
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
        load_inputs(pos[k], in[k]);
        pos[k + 1] = advance(pos[k]);
    }
    float acc_v[ATOMS_PER_LANE];
#pragma unroll
    for (int k = 0; k < ATOMS_PER_LANE; ++k) acc_v[k] = 0.0f;

    while (pos[0].b < (unsigned)batch) {
        load_inputs(pos[kAhead], in[kAhead]);
        DuelingGrads& g = in[0];
        const int d = pos[0].d;
        const int n = branch_size(d);

        float sum[ATOMS_PER_LANE];
#pragma unroll
        for (int i = 0; i < M; ++i) {
            if (i < n) {
                const float dqa = kDq ? g.dq[i] * dq_scale : 0.0f;
#pragma unroll
                for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                    if (kDq) g.dl[i][k] += dqa * g.p[i][k] * (zz[k] - g.q[i]);
                    sum[k] = i == 0 ? g.dl[0][k] : sum[k] + g.dl[i][k];
                }
            }
        }
        const float inv_n = rcp_approx((float)n);
        float* dadv_d = dadv + ((size_t)pos[0].b * adv_pitch + (unsigned)kAdvColumns[d]);
#pragma unroll
        for (int i = 0; i < M; ++i) {
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                const int j = lane + 32 * k;
                if (i < n && j < NUM_ATOMS) dadv_d[i * NUM_ATOMS + j] = g.dl[i][k] - sum[k] * inv_n;
            }
        }
#pragma unroll 1
        for (int c = n * NUM_ATOMS + lane; c < kAdvColumns[d + 1] - kAdvColumns[d]; c += 32)
            dadv_d[c] = 0.0f;  // the block's padding
#pragma unroll
        for (int k = 0; k < ATOMS_PER_LANE; ++k) acc_v[k] += sum[k];

        if (d == branch_end - 1) {  // the sample's last branch: its share of dv is complete
            float* dv_b = dv + (size_t)pos[0].b * (unsigned)v_pitch;
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                const int j = lane + 32 * k;
                if (j < NUM_ATOMS) dv_b[j] = accumulate_dv ? g.dv[k] + acc_v[k] : acc_v[k];
                acc_v[k] = 0.0f;
            }
            for (int j = NUM_ATOMS + lane; j < V_COLUMNS; j += 32) dv_b[j] = 0.0f;
        }

#pragma unroll
        for (int k = 0; k < kAhead; ++k) {
            pos[k] = pos[k + 1];
            in[k] = in[k + 1];
        }
        pos[kAhead] = advance(pos[kAhead]);
    }
}

// Backward of the dueling aggregation, with the expected-Q path optionally fused in:
//   dl[b, a, j] = dlogits[b, a, j] + dq[b, a] * p[b, a, j] * (z_j - q[b, a])   (dq may be null)
//   dv[b, j]    = sum_a dl[b, a, j]
//   dadv[b, a, j] = dl[b, a, j] - mean_{a' in branch(a)} dl[b, a', j]
// Only branches [branch_begin, branch_end) are read and written; with accumulate_dv != 0 their
// share of dv is added to dv instead of overwriting it (the network runs the magnitude branch's
// backward before the direction branch's dq is known, so it calls this twice).
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, DUELING_BLOCKS_PER_SM) dueling_backward(
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
    if (dq != nullptr)
        dueling_backward_rows<true, 1>(dlogits, dq, ld_dq, dq_scale, probs, q, z, dv, v_pitch, dadv, batch,
                                       branch_begin, branch_end, accumulate_dv);
    else
        dueling_backward_rows<false, 2>(dlogits, dq, ld_dq, dq_scale, probs, q, z, dv, v_pitch, dadv, batch,
                                        branch_begin, branch_end, accumulate_dv);
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
