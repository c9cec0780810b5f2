// Variance-conditioned refinement of Q, K FC-SiLU-FC residual steps: forward, backward and the
// deterministic reduction of the parameter gradients over the batch.
//
// NumPy twin: foxhunt_diffusion_refine/refine.py (the equations are in its docstring). Launch
// wrappers: foxhunt_diffusion_refine/cuda.py.
//
// Per sample (A actions, H hidden units, sigma = sqrt(max(var, 0)), c_k = 1 - k / K):
//   pre = Wq_k Q_k + Ws_k (c_k sigma) + b1_k,  h = SiLU(pre),  Q_{k+1} = Q_k + s (W2_k h + b2_k)
// A step's parameters are packed as [Wq (H x A) | Ws (H x A) | b1 (H) | W2 (A x H) | b2 (A)] (DR_E
// floats), step after step; each block copies them into shared memory from the five tensors
// (w_q [K, H, A], w_sigma [K, H, A], b1 [K, H], w2 [K, A, H], b2 [K, A]).
//
// Forward: a thread per sample, its row in registers, grid-stride over the batch.
// Backward: a block takes tiles of DR_ROWS samples, a thread per sample. The thread recomputes its
// row's forward (the steps' inputs Q_k kept in shared memory), then walks the steps backwards: it
// writes the step's dpre, h and dQ_{k+1} of its row into shared memory, and after a barrier every
// thread adds, over the tile's rows, the terms of the parameter-gradient entries it owns (entry e of
// a step belongs to thread e mod DR_ROWS; outer products as dpre Q^T, dQ h^T), in float registers
// that live across the tiles. At the end each block writes its sums (in double) as one row of
// partials, and diffusion_refine_grad_reduce adds the rows in a fixed order: no atomics, the result
// is the same bit for bit from run to run.

#ifndef NUM_ACTIONS
#define NUM_ACTIONS 12
#endif
#ifndef DR_STEPS
#define DR_STEPS 3
#endif
#ifndef DR_HIDDEN
#define DR_HIDDEN 24
#endif
#ifndef DR_THREADS
#define DR_THREADS 128   // forward: threads per block
#endif
#ifndef DR_ROWS
#define DR_ROWS 64       // backward: threads per block = samples per tile
#endif

#define A_ NUM_ACTIONS
#define H_ DR_HIDDEN
#define K_ DR_STEPS
#define DR_E (2 * H_ * A_ + H_ + A_ * H_ + A_)            // one step's parameters
#define DR_P (K_ * DR_E)                                   // all of them: a row of partials
#define DR_EPT ((DR_E + DR_ROWS - 1) / DR_ROWS)            // a backward thread's entries per step
#define DR_MAX_ACC 256                                     // (local memory; cuda.py: MAX_ACC)
#define DR_AS (A_ + 1)                                     // row strides in shared memory (odd:
#define DR_HS (H_ + 1)                                     //  no bank conflicts on the row stores)
#define DR_REDUCE_WARPS 32                                 // the reduction's 1024 threads
#define DR_BACKWARD_SMEM (4 * (DR_P + DR_ROWS * ((K_ + 2) * DR_AS + 2 * DR_HS) + 1))

static_assert(DR_THREADS % 32 == 0 && DR_ROWS % 32 == 0, "whole warps (and DR_ROWS a multiple of 4)");
static_assert(4 * DR_P <= 48 * 1024, "diffusion_refine_forward: the parameters exceed 48 KiB of shared memory");
static_assert(DR_BACKWARD_SMEM <= 48 * 1024, "diffusion_refine_backward: over 48 KiB of shared memory");
static_assert(K_ * DR_EPT <= DR_MAX_ACC, "diffusion_refine_backward: too many gradient entries per thread");

__device__ __forceinline__ float dr_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// A compiler barrier: shared memory is read again after it. Without it the compiler hoists the
// loop-invariant weight loads out of the row loop and spills the thousands of values to local memory.
__device__ __forceinline__ void dr_reload() { asm volatile("" ::: "memory"); }

// Tensor src ([K_, n], step after step) into step k's entries at..at + n - 1 of P, by NT threads:
// every loop bound a compile-time constant, so each thread's loads are all in flight at once.
template <int NT, int N>
__device__ __forceinline__ void dr_copy(float* P, int at, const float* __restrict__ src) {
#pragma unroll
    for (int k = 0; k < K_; ++k)
#pragma unroll
        for (int i0 = 0; i0 < N; i0 += NT) {
            const int i = i0 + (int)threadIdx.x;
            if (i < N) P[k * DR_E + at + i] = src[k * N + i];
        }
}

// The five tensors into the packed layout P (every thread of the block calls it; one barrier). A
// loop over P's entries that chose each entry's tensor at run time waited for one load from L2
// after another: at small batches, where the kernels are bound by latency, most of their time.
template <int NT>
__device__ __forceinline__ void dr_load_params(float* P, const float* __restrict__ w_q,
                                               const float* __restrict__ w_sigma, const float* __restrict__ b1,
                                               const float* __restrict__ w2, const float* __restrict__ b2) {
    dr_copy<NT, H_ * A_>(P, 0, w_q);
    dr_copy<NT, H_ * A_>(P, H_ * A_, w_sigma);
    dr_copy<NT, H_>(P, 2 * H_ * A_, b1);
    dr_copy<NT, A_ * H_>(P, 2 * H_ * A_ + H_, w2);
    dr_copy<NT, A_>(P, 2 * H_ * A_ + H_ + A_ * H_, b2);
    __syncthreads();
}

__device__ __forceinline__ float dr_schedule(int k) { return 1.0f - (float)k / (float)K_; }

// Row b of q and var into registers: x = Q, sig = sqrt(max(var, 0)); zeros past the batch.
__device__ __forceinline__ void dr_load_row(const float* __restrict__ q, const float* __restrict__ var,
                                            long long b, int batch, float* x, float* sig) {
#pragma unroll
    for (int a = 0; a < A_; ++a) {
        x[a] = b < batch ? q[b * A_ + a] : 0.0f;
        sig[a] = b < batch ? sqrtf(fmaxf(var[b * A_ + a], 0.0f)) : 0.0f;
    }
}

// Hidden unit i of step k (parameters W) for the row x, with n = c_k sigma: its pre-activation.
__device__ __forceinline__ float dr_unit(const float* W, int i, const float* x, const float* n) {
    const float* wq = W + i * A_;
    const float* ws = W + H_ * A_ + i * A_;
    float a = W[2 * H_ * A_ + i];
#pragma unroll
    for (int j = 0; j < A_; ++j) a = fmaf(wq[j], x[j], a);
#pragma unroll
    for (int j = 0; j < A_; ++j) a = fmaf(ws[j], n[j], a);
    return a;
}

// One step in place: x <- x + s (W2 SiLU(pre) + b2), unit by unit (few registers live).
__device__ __forceinline__ void dr_step(const float* W, int k, float s, float* x, const float* sig) {
    const float* w2 = W + 2 * H_ * A_ + H_;
    const float* b2 = w2 + A_ * H_;
    float n[A_], r[A_];
#pragma unroll
    for (int j = 0; j < A_; ++j) {
        n[j] = dr_schedule(k) * sig[j];
        r[j] = b2[j];
    }
#pragma unroll 4
    for (int i = 0; i < H_; ++i) {
        const float a = dr_unit(W, i, x, n);
        const float h = a * dr_sigmoid(a);
#pragma unroll
        for (int j = 0; j < A_; ++j) r[j] = fmaf(w2[j * H_ + i], h, r[j]);
    }
#pragma unroll
    for (int j = 0; j < A_; ++j) x[j] = fmaf(s, r[j], x[j]);
}

extern "C" __global__ void __launch_bounds__(DR_THREADS) diffusion_refine_forward(
    const float* __restrict__ q,     // [B, A] input Q
    const float* __restrict__ var,   // [B, A] Var[Q]
    float* __restrict__ out,         // [B, A] refined Q; must alias neither input
    int batch,
    float step_scale,
    const float* __restrict__ w_q, const float* __restrict__ w_sigma, const float* __restrict__ b1,
    const float* __restrict__ w2, const float* __restrict__ b2)
{
    __shared__ __align__(16) float P[DR_P];
    dr_load_params<DR_THREADS>(P, w_q, w_sigma, b1, w2, b2);
    const long long stride = (long long)gridDim.x * DR_THREADS;
    for (long long b = (long long)blockIdx.x * DR_THREADS + threadIdx.x; b < batch; b += stride) {
        dr_reload();
        float x[A_], sig[A_];
        dr_load_row(q, var, b, batch, x, sig);
#pragma unroll
        for (int k = 0; k < K_; ++k) dr_step(P + k * DR_E, k, step_scale, x, sig);
#pragma unroll
        for (int a = 0; a < A_; ++a) out[b * A_ + a] = x[a];
    }
}

// Where the row terms of step-local entry e live: the entry's sum over the tile's rows r is
// sum_r a[r * sa] * b[r * sb] (sb = 0 and b = the shared 1.0 for a bias).
struct DrEntry {
    const float* a;
    const float* b;
    int sa, sb;
};

__device__ __forceinline__ DrEntry dr_entry(int e, const float* dpre, const float* qk, const float* sig,
                                            const float* h, const float* dqn, const float* one) {
    constexpr int HA = H_ * A_;
    if (e < HA) return {dpre + e / A_, qk + e % A_, DR_HS, DR_AS};                       // Wq
    if (e < 2 * HA) return {dpre + (e - HA) / A_, sig + (e - HA) % A_, DR_HS, DR_AS};    // Ws (x c_k)
    if (e < 2 * HA + H_) return {dpre + e - 2 * HA, one, DR_HS, 0};                     // b1
    const int f = e - 2 * HA - H_;
    if (f < A_ * H_) return {dqn + f / H_, h + f % H_, DR_AS, DR_HS};                   // W2 (x s)
    return {dqn + f - A_ * H_, one, DR_AS, 0};                                          // b2 (x s)
}

extern "C" __global__ void __launch_bounds__(DR_ROWS) diffusion_refine_backward(
    const float* __restrict__ q,     // [B, A] the forward's input
    const float* __restrict__ var,   // [B, A]
    const float* __restrict__ dy,    // [B, A] dloss / d output
    float* __restrict__ dq,          // [B, A] dloss / dq (no gradient flows into var)
    double* __restrict__ partials,   // [gridDim.x, DR_P] the blocks' parameter-gradient sums
    int batch,
    float step_scale,
    const float* __restrict__ w_q, const float* __restrict__ w_sigma, const float* __restrict__ b1,
    const float* __restrict__ w2, const float* __restrict__ b2)
{
    __shared__ __align__(16) float P[DR_P];
    __shared__ float sig_s[DR_ROWS * DR_AS];
    __shared__ float qk_s[K_ * DR_ROWS * DR_AS];   // each step's input Q_k, per row
    __shared__ float dpre_s[DR_ROWS * DR_HS];
    __shared__ float h_s[DR_ROWS * DR_HS];
    __shared__ float dqn_s[DR_ROWS * DR_AS];       // dQ_{k+1}
    __shared__ float one_s;
    if (threadIdx.x == 0) one_s = 1.0f;
    dr_load_params<DR_ROWS>(P, w_q, w_sigma, b1, w2, b2);

    const int r = threadIdx.x;
    float acc[K_][DR_EPT];
#pragma unroll
    for (int k = 0; k < K_; ++k)
#pragma unroll
        for (int u = 0; u < DR_EPT; ++u) acc[k][u] = 0.0f;

    const int tiles = (batch + DR_ROWS - 1) / DR_ROWS;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {   // uniform over the block
        dr_reload();
        const long long b = (long long)tile * DR_ROWS + r;
        float x[A_], sig[A_], g[A_];
        dr_load_row(q, var, b, batch, x, sig);
#pragma unroll
        for (int a = 0; a < A_; ++a) {
            sig_s[r * DR_AS + a] = sig[a];
            g[a] = b < batch ? dy[b * A_ + a] : 0.0f;   // a padded row adds exact zeros
        }
#pragma unroll
        for (int k = 0; k < K_; ++k) {
#pragma unroll
            for (int a = 0; a < A_; ++a) qk_s[(k * DR_ROWS + r) * DR_AS + a] = x[a];
            if (k + 1 < K_) dr_step(P + k * DR_E, k, step_scale, x, sig);
        }
#pragma unroll
        for (int k = K_ - 1; k >= 0; --k) {
            const float* W = P + k * DR_E;
            const float* wq = W;
            const float* w2 = W + 2 * H_ * A_ + H_;
#pragma unroll
            for (int a = 0; a < A_; ++a) x[a] = qk_s[(k * DR_ROWS + r) * DR_AS + a];
            // Unit by unit: h and dpre into shared memory, dQ_k = dQ_{k+1} + Wq^T dpre into gn.
            float n[A_], gn[A_];
#pragma unroll
            for (int j = 0; j < A_; ++j) {
                n[j] = dr_schedule(k) * sig[j];
                gn[j] = g[j];
            }
#pragma unroll 4
            for (int i = 0; i < H_; ++i) {
                const float a = dr_unit(W, i, x, n);
                float dh = 0.0f;   // (W2^T dQ_{k+1})_i
#pragma unroll
                for (int j = 0; j < A_; ++j) dh = fmaf(w2[j * H_ + i], g[j], dh);
                const float gi = dr_sigmoid(a);
                const float dp = step_scale * dh * (gi * (1.0f + a * (1.0f - gi)));   // SiLU'
                h_s[r * DR_HS + i] = a * gi;
                dpre_s[r * DR_HS + i] = dp;
#pragma unroll
                for (int j = 0; j < A_; ++j) gn[j] = fmaf(dp, wq[i * A_ + j], gn[j]);
            }
#pragma unroll
            for (int a = 0; a < A_; ++a) {
                dqn_s[r * DR_AS + a] = g[a];
                g[a] = gn[a];   // dQ_k
            }
            __syncthreads();
            // The entries this thread owns, over the tile's rows.
            // (Not unrolled over the entries: unrolled, the compiler interleaves all of them and
            // spills; acc then lives in local memory, a few cached accesses per entry and tile.)
            const float* qk = qk_s + k * DR_ROWS * DR_AS;
#pragma unroll 1
            for (int u = 0; u < DR_EPT; ++u) {
                const int e = r + u * DR_ROWS;
                if (e < DR_E) {
                    const DrEntry t = dr_entry(e, dpre_s, qk, sig_s, h_s, dqn_s, &one_s);
                    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;   // four chains: more in flight
#pragma unroll 2
                    for (int rr = 0; rr < DR_ROWS; rr += 4) {
                        s0 = fmaf(t.a[rr * t.sa], t.b[rr * t.sb], s0);
                        s1 = fmaf(t.a[(rr + 1) * t.sa], t.b[(rr + 1) * t.sb], s1);
                        s2 = fmaf(t.a[(rr + 2) * t.sa], t.b[(rr + 2) * t.sb], s2);
                        s3 = fmaf(t.a[(rr + 3) * t.sa], t.b[(rr + 3) * t.sb], s3);
                    }
                    acc[k][u] += (s0 + s1) + (s2 + s3);
                }
            }
            __syncthreads();
        }
        if (b < batch) {
#pragma unroll
            for (int a = 0; a < A_; ++a) dq[b * A_ + a] = g[a];
        }
    }
    // The block's row of partials: Ws's entries times c_k, W2's and b2's times s (their row terms
    // above are dQ_{k+1} h^T and dQ_{k+1}, without the step scale).
    double* row = partials + (long long)blockIdx.x * DR_P;
#pragma unroll
    for (int k = 0; k < K_; ++k)
#pragma unroll
        for (int u = 0; u < DR_EPT; ++u) {
            const int e = r + u * DR_ROWS;
            if (e < DR_E) {
                double f = 1.0;
                if (e >= H_ * A_ && e < 2 * H_ * A_) f = (double)dr_schedule(k);
                if (e >= 2 * H_ * A_ + H_) f = (double)step_scale;
                row[k * DR_E + e] = (double)acc[k][u] * f;
            }
        }
}

// Entry p of the packed gradient = sum_k partials[k, p] in a fixed order: a block of 32 warps takes
// 32 entries (lane = entry), warp w adds the rows w, w + 32, ..., then warp 0 adds the 32 sums and
// writes the entry into its tensor.
extern "C" __global__ void __launch_bounds__(32 * DR_REDUCE_WARPS) diffusion_refine_grad_reduce(
    const double* __restrict__ partials,   // [num_partials, DR_P]
    int num_partials,
    float* __restrict__ dw_q, float* __restrict__ dw_sigma, float* __restrict__ db1,
    float* __restrict__ dw2, float* __restrict__ db2)
{
    __shared__ double sums[DR_REDUCE_WARPS][32];
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    const int p = blockIdx.x * 32 + lane;
    double s = 0.0;
    if (p < DR_P)
        for (int k = w; k < num_partials; k += DR_REDUCE_WARPS) s += partials[(long long)k * DR_P + p];
    sums[w][lane] = s;
    __syncthreads();
    if (w == 0 && p < DR_P) {
        double t = 0.0;
        for (int rr = 0; rr < DR_REDUCE_WARPS; ++rr) t += sums[rr][lane];
        const int k = p / DR_E, e = p % DR_E;
        const float v = (float)t;
        if (e < H_ * A_)
            dw_q[k * H_ * A_ + e] = v;
        else if (e < 2 * H_ * A_)
            dw_sigma[k * H_ * A_ + e - H_ * A_] = v;
        else if (e < 2 * H_ * A_ + H_)
            db1[k * H_ + e - 2 * H_ * A_] = v;
        else if (e < 2 * H_ * A_ + H_ + A_ * H_)
            dw2[k * A_ * H_ + e - 2 * H_ * A_ - H_] = v;
        else
            db2[k * A_ + e - 2 * H_ * A_ - H_ - A_ * H_] = v;
    }
}
