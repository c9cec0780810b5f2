// Variance-conditioned refinement of Q, K FC-SiLU-FC residual steps: forward, backward and the
// deterministic reduction of the parameter gradients over the batch.
//
// NumPy twin: foxhunt_diffusion_refine/refine.py (the equations are in its docstring). Launch
// wrappers: foxhunt_diffusion_refine/cuda.py.
//
// Per sample (A actions, H hidden units, sigma = sqrt(max(var, 0)), c_k = 1 - k / K):
//   pre = Wq_k Q_k + Ws_k (c_k sigma) + b1_k,  h = SiLU(pre),  Q_{k+1} = Q_k + s (W2_k h + b2_k)
// A step's parameters are packed as [Wq (H x A) | Ws (H x A) | b1 (H) | W2 (A x H) | b2 (A)] (DR_E
// floats), step after step, in the rows of partials; each block copies them into shared memory
// from the five tensors (w_q [K, H, A], w_sigma [K, H, A], b1 [K, H], w2 [K, A, H], b2 [K, A]),
// W2 there transposed (H x A): a hidden unit's A weights of each matrix are then contiguous and
// aligned, read as float4s (a shared-memory load per weight bound the kernels at large batches,
// where every load serves only the few rows of a warp that share the unit).
//
// A row's hidden units are split into DR_SPLIT parts, part v holding the units v, v + DR_SPLIT, ...;
// a part's share of W2 h (and, in the backward, of Wq^T dpre) is one chain of multiply-adds, and
// the row's sum adds the DR_SPLIT shares in one fixed tree, ((p0 + p1) + (p2 + p3)) + (...). The
// row belongs to DR_LANES lanes of a warp (a power of two dividing DR_SPLIT; lanes DR_RW apart,
// dr_lane and dr_row say why), its lane t holding the parts t DR_W ... t DR_W + DR_W - 1: the
// tree's lower levels are its own additions, the upper ones a butterfly of shuffles, after which
// every lane holds the row's sum. So the bits
// do not depend on DR_LANES (each exchange adds the same two values, whichever lane adds them),
// and the wrapper picks the lanes by batch size: many lanes where a few thousand rows would leave
// most of the device idle, few where the rows fill it and the shuffles would cost throughput.

// A row's sums are bound by shared memory, not by arithmetic: a load serves a warp a float per
// lane (32 floats a cycle an SM; 128-bit loads in four wavefronts, two where lane pairs share
// their addresses, as they do here), against 128 multiply-adds a cycle. So a forward thread may take DR_RPT rows at once, each weight
// it loads then serving DR_RPT of them; every row's arithmetic is the same, so the bits do not
// depend on DR_RPT either. Ws sits in shared memory already scaled by its step's c_k.

// Forward: blocks of DR_THREADS threads, (DR_THREADS / DR_LANES) DR_RPT rows at a time, grid-stride.
// Backward: a block takes tiles of DR_ROWS rows (DR_ROWS x DR_LANES threads). Phase 1, per row:
// the forward again (each step's input Q_k and h_k, and sigma, staged in shared memory, the
// pre-activations of the lane's units kept in registers), then the steps backwards, staging each
// step's dpre and dQ_{k+1}. Phase 2, after a barrier: every parameter gradient of the tile is an
// entry of one of two outer products per step summed over the tile's rows,
//   [dWq_k | dWs_k / c_k | db1_k] = dpre_k^T [Q_k | sigma | 1],   [dW2_k | db2_k] = s dQ_{k+1}^T [h_k | 1],
// and each thread owns 4 x 4 tiles of them (float4 loads of both factors, 16 multiply-adds a row),
// summed in registers over the tiles the block takes. At the end each block writes its sums (in
// double) as one row of partials, and diffusion_refine_grad_reduce adds the rows in a fixed order:
// no atomics, the result is the same bit for bit from run to run.

#ifndef NUM_ACTIONS
#define NUM_ACTIONS 12
#endif
#ifndef DR_STEPS
#define DR_STEPS 3
#endif
#ifndef DR_HIDDEN
#define DR_HIDDEN 24
#endif
#ifndef DR_SPLIT
#define DR_SPLIT 8       // parts of a row's hidden units (fixes the order of its sums)
#endif
#ifndef DR_LANES
#define DR_LANES 8       // lanes per row: a power of two dividing DR_SPLIT
#endif
#ifndef DR_THREADS
#define DR_THREADS 256   // forward: threads per block
#endif
#ifndef DR_RPT
#define DR_RPT 1         // forward: rows a thread takes at once (1 or 2)
#endif
#ifndef DR_ROWS
#define DR_ROWS 32       // backward: rows per tile (threads per block: DR_ROWS x DR_LANES)
#endif

#define A_ NUM_ACTIONS
#define H_ DR_HIDDEN
#define K_ DR_STEPS
#define G_ DR_LANES
#define DR_W (DR_SPLIT / G_)                               // parts per lane
#define DR_U ((H_ + DR_SPLIT - 1) / DR_SPLIT)              // hidden units per part
#define DR_LU (DR_W * DR_U)                                // hidden units per lane
#define DR_E (2 * H_ * A_ + H_ + A_ * H_ + A_)            // one step's parameters
#define DR_P (K_ * DR_E)                                   // all of them: a row of partials
#define DR_BT (DR_ROWS * G_)                               // backward: threads per block
#define DR_RW (32 / G_)                                    // rows of a warp
// The forward's blocks resident per SM (its launch bound): three (80 registers) where a lane has
// at most 3 units of one row, which fits them without spills, else two (cuda.py:
// forward_blocks_per_sm)
#define DR_FORWARD_BLOCKS (DR_LU <= 3 && DR_RPT == 1 ? 3 : 2)
#define DR_UP4(n) (((n) + 3) / 4 * 4)
// The backward's staging, per step and row (strides in floats, multiples of 4 for float4 loads;
// the columns past the values hold zeros, the "1" columns ones, written once):
#define DR_MS DR_UP4(H_)                                   //   dpre_k
#define DR_NS DR_UP4(2 * A_ + 1)                           //   [Q_k | sigma | 1]
#define DR_DS DR_UP4(A_)                                   //   dQ_{k+1}
#define DR_HS DR_UP4(H_ + 1)                               //   [h_k | 1]
#define DR_T1 ((DR_MS / 4) * (DR_NS / 4))                  // 4 x 4 tiles of a step's first product
#define DR_T2 ((DR_DS / 4) * (DR_HS / 4))                  //   and of its second
#define DR_TILES (K_ * (DR_T1 + DR_T2))
#define DR_MT ((DR_TILES + DR_BT - 1) / DR_BT)             // tiles per thread
#define DR_MAX_MT 8                                        // (16 sums each, in registers; cuda.py: MAX_TILES)
#define DR_STAGE (K_ * DR_ROWS * (DR_MS + DR_NS + DR_DS + DR_HS))
#define DR_REDUCE_WARPS 32                                 // the reduction's 1024 threads
#define DR_BACKWARD_SMEM (4 * (DR_P + DR_STAGE))

static_assert(DR_SPLIT == 1 || DR_SPLIT == 2 || DR_SPLIT == 4 || DR_SPLIT == 8 || DR_SPLIT == 16 || DR_SPLIT == 32,
              "DR_SPLIT: a power of two up to 32");
static_assert(G_ >= 1 && G_ <= DR_SPLIT && DR_SPLIT % G_ == 0 && (G_ & (G_ - 1)) == 0,
              "DR_LANES: a power of two dividing DR_SPLIT");
static_assert(DR_THREADS % 32 == 0 && DR_BT % 32 == 0, "whole warps");
static_assert(DR_RPT == 1 || DR_RPT == 2, "DR_RPT: 1 or 2 rows a forward thread");
static_assert(4 * DR_P <= 48 * 1024, "diffusion_refine_forward: the parameters exceed 48 KiB of shared memory");
static_assert(DR_BACKWARD_SMEM <= 48 * 1024, "diffusion_refine_backward: over 48 KiB of shared memory");
static_assert(DR_MT <= DR_MAX_MT, "diffusion_refine_backward: too many gradient tiles per thread");

// The fast exponential and reciprocal (MUFU; a few ulp): the exact expf and division put a slow
// path behind every hidden unit. For x below -88, e^-x is inf and the reciprocal 0.
__device__ __forceinline__ float dr_sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

__device__ __forceinline__ float dr_schedule(int k) { return 1.0f - (float)k / (float)K_; }

// Tensor src ([K_, n], step after step) into step k's entries at..at + n - 1 of P, by NT threads,
// times c_k where SCHEDULED: every loop bound a compile-time constant, so each thread's loads are
// all in flight at once.
template <int NT, int N, bool SCHEDULED = false>
__device__ __forceinline__ void dr_copy(float* P, int at, const float* __restrict__ src) {
#pragma unroll
    for (int k = 0; k < K_; ++k)
#pragma unroll
        for (int i0 = 0; i0 < N; i0 += NT) {
            const int i = i0 + (int)threadIdx.x;
            if (i < N) P[k * DR_E + at + i] = SCHEDULED ? dr_schedule(k) * src[k * N + i] : src[k * N + i];
        }
}

// w2 [K_, A_, H_] into step k's entries at.. of P as W2^T (entry i A_ + j = w2[k, j, i]): read in
// order, written scattered (once per block).
template <int NT>
__device__ __forceinline__ void dr_copy_transposed(float* P, int at, const float* __restrict__ src) {
#pragma unroll
    for (int k = 0; k < K_; ++k)
#pragma unroll
        for (int e0 = 0; e0 < A_ * H_; e0 += NT) {
            const int e = e0 + (int)threadIdx.x;   // = j H_ + i
            if (e < A_ * H_) P[k * DR_E + at + (e % H_) * A_ + e / H_] = src[k * A_ * H_ + e];
        }
}

// The five tensors into the packed layout P, Ws as c_k Ws (every thread of the block calls it; one
// barrier). A
// loop over P's entries that chose each entry's tensor at run time waited for one load from L2
// after another: at small batches, where the kernels are bound by latency, most of their time.
template <int NT>
__device__ __forceinline__ void dr_load_params(float* P, const float* __restrict__ w_q,
                                               const float* __restrict__ w_sigma, const float* __restrict__ b1,
                                               const float* __restrict__ w2, const float* __restrict__ b2) {
    dr_copy<NT, H_ * A_>(P, 0, w_q);
    dr_copy<NT, H_ * A_, true>(P, H_ * A_, w_sigma);
    dr_copy<NT, H_>(P, 2 * H_ * A_, b1);
    dr_copy_transposed<NT>(P, 2 * H_ * A_ + H_, w2);
    dr_copy<NT, A_>(P, 2 * H_ * A_ + H_ + A_ * H_, b2);
    __syncthreads();
}

// A warp holds DR_RW rows, lane l taking part t = l / DR_RW of row l % DR_RW: lanes next to each
// other are of different rows and load the same weights. The hardware packs a 128-bit shared
// load's returns where every lane pair l, l ^ 1 reads one address, in two wavefronts instead of
// four (lanes of one row next to each other, the kernels were 10-30 % slower: BENCHMARKS.md). A
// row's butterfly is then over lanes DR_RW apart.
__device__ __forceinline__ int dr_lane() { return (int)(threadIdx.x % 32) / DR_RW; }
__device__ __forceinline__ int dr_row() { return (int)(threadIdx.x / 32) * DR_RW + (int)(threadIdx.x % DR_RW); }

// Whether hidden unit i exists (a compile-time true where DR_SPLIT divides H_).
__device__ __forceinline__ bool dr_has(int i) { return H_ % DR_SPLIT == 0 || i < H_; }

// Hidden unit u of the lane's part w (lane t of its row), and its slot among the lane's units.
__device__ __forceinline__ int dr_unit(int t, int w, int u) { return t * DR_W + w + u * DR_SPLIT; }
__device__ __forceinline__ constexpr int dr_slot(int w, int u) { return w * DR_U + u; }

// Row b of q and var into registers, x = Q and sig = var as loaded (zeros past the batch); then
// dr_sigma makes sig sigma. Apart, so that the loads of the forward's first rows go out before the
// parameters' and nothing waits on them until the parameters are in: at small batches, where a
// block takes its rows once or twice, one wait on memory instead of two is much of the kernel's
// time. (The backward keeps its loads in place: early ones gained nothing at 4 lanes and pass its
// 128 registers at 8.)
__device__ __forceinline__ void dr_load_row(const float* __restrict__ q, const float* __restrict__ var,
                                            long long b, int batch, float (&x)[A_], float (&sig)[A_]) {
#pragma unroll
    for (int a = 0; a < A_; ++a) {
        x[a] = b < batch ? q[b * A_ + a] : 0.0f;
        sig[a] = b < batch ? var[b * A_ + a] : 0.0f;
    }
}

// sigma = sqrt(max(var, 0)) in place.
__device__ __forceinline__ void dr_sigma(float (&sig)[A_]) {
#pragma unroll
    for (int a = 0; a < A_; ++a) sig[a] = sqrtf(fmaxf(sig[a], 0.0f));
}

// The lane's parts W0 .. W0 + N - 1 added in the tree's order, for each of its R rows; part(w, r)
// writes part w's shares.
template <int W0, int N, int R, class F>
__device__ __forceinline__ void dr_tree(const F& part, float (&r)[R][A_]) {
    if constexpr (N == 1) {
        part(W0, r);
    } else {
        float r2[R][A_];
        dr_tree<W0, N / 2>(part, r);
        dr_tree<W0 + N / 2, N / 2>(part, r2);
#pragma unroll
        for (int q = 0; q < R; ++q)
#pragma unroll
            for (int j = 0; j < A_; ++j) r[q][j] += r2[q][j];
    }
}

// Each row's sum of its DR_SPLIT parts' shares, in every one of its lanes (the same bits in each).
template <int R, class F>
__device__ __forceinline__ void dr_row_sum(const F& part, float (&r)[R][A_]) {
    dr_tree<0, DR_W>(part, r);
#pragma unroll
    for (int m = 1; m < G_; m <<= 1)
#pragma unroll
        for (int q = 0; q < R; ++q)
#pragma unroll
            for (int j = 0; j < A_; ++j) r[q][j] += __shfl_xor_sync(0xffffffffu, r[q][j], m * DR_RW);
}

// A step (parameters W, Ws scaled) of the R rows x by lane t: the pre-activations of its units into
// pre (0 for a unit past H_), the first row's h into hs[i] where hs is given, and, with UPDATE,
// x <- x + s (W2 h + b2). Each weight is loaded once for the R rows.
template <bool UPDATE, int R>
__device__ __forceinline__ void dr_step(const float* W, int t, float s, float (&x)[R][A_], const float (&sig)[R][A_],
                                        float (&pre)[R][DR_LU], float* hs) {
    const float* w2 = W + 2 * H_ * A_ + H_;
    float r[R][A_];
    auto part = [&](int w, float (&rp)[R][A_]) {
#pragma unroll
        for (int q = 0; q < R; ++q)
#pragma unroll
            for (int j = 0; j < A_; ++j) rp[q][j] = 0.0f;
#pragma unroll
        for (int u = 0; u < DR_U; ++u) {
            const int i = dr_unit(t, w, u);
#pragma unroll
            for (int q = 0; q < R; ++q) pre[q][dr_slot(w, u)] = 0.0f;
            if (dr_has(i)) {
                const float* wq = W + i * A_;
                const float* ws = W + H_ * A_ + i * A_;
                const float* w2t = w2 + i * A_;
                float a[R], h[R];
#pragma unroll
                for (int q = 0; q < R; ++q) a[q] = W[2 * H_ * A_ + i];
#pragma unroll
                for (int j = 0; j < A_; ++j) {
                    const float v = wq[j];
#pragma unroll
                    for (int q = 0; q < R; ++q) a[q] = fmaf(v, x[q][j], a[q]);
                }
#pragma unroll
                for (int j = 0; j < A_; ++j) {
                    const float v = ws[j];
#pragma unroll
                    for (int q = 0; q < R; ++q) a[q] = fmaf(v, sig[q][j], a[q]);
                }
#pragma unroll
                for (int q = 0; q < R; ++q) {
                    h[q] = a[q] * dr_sigmoid(a[q]);
                    pre[q][dr_slot(w, u)] = a[q];
                }
                if (hs != nullptr) hs[i] = h[0];
#pragma unroll
                for (int j = 0; j < A_; ++j) {
                    const float v = w2t[j];
#pragma unroll
                    for (int q = 0; q < R; ++q) rp[q][j] = fmaf(v, h[q], rp[q][j]);
                }
            }
        }
    };
    if (UPDATE) {
        const float* b2 = w2 + A_ * H_;
        dr_row_sum(part, r);
#pragma unroll
        for (int q = 0; q < R; ++q)
#pragma unroll
            for (int j = 0; j < A_; ++j) x[q][j] = fmaf(s, r[q][j] + b2[j], x[q][j]);
    } else {
        // The last step of the backward's recompute: only the pre-activations and h.
#pragma unroll
        for (int w = 0; w < DR_W; ++w) part(w, r);
    }
}

extern "C" __global__ void __launch_bounds__(DR_THREADS, DR_FORWARD_BLOCKS) diffusion_refine_forward(
    const float* __restrict__ q,     // [B, A] input Q
    const float* __restrict__ var,   // [B, A] Var[Q]
    float* __restrict__ out,         // [B, A] refined Q; must alias neither input
    int batch,
    float step_scale,
    const float* __restrict__ w_q, const float* __restrict__ w_sigma, const float* __restrict__ b1,
    const float* __restrict__ w2, const float* __restrict__ b2)
{
    __shared__ __align__(16) float P[DR_P];
    constexpr int groups = DR_THREADS / G_, rows = groups * DR_RPT;
    const int t = dr_lane();
    const long long first = (long long)blockIdx.x * rows;
    float x[DR_RPT][A_], sig[DR_RPT][A_];
#pragma unroll
    for (int r = 0; r < DR_RPT; ++r)
        dr_load_row(q, var, first + dr_row() + r * groups, batch, x[r], sig[r]);
    dr_load_params<DR_THREADS>(P, w_q, w_sigma, b1, w2, b2);
    // The loop is uniform over the block (its rows past the batch run on zeros): every lane of a
    // warp takes part in the shuffles. A thread's rows are groups apart (the warp's loads coalesce).
    for (long long b0 = first; b0 < batch; b0 += (long long)gridDim.x * rows) {
        const long long b = b0 + dr_row();
        float pre[DR_RPT][DR_LU];
#pragma unroll
        for (int r = 0; r < DR_RPT; ++r) {
            if (b0 != first) dr_load_row(q, var, b + r * groups, batch, x[r], sig[r]);
            dr_sigma(sig[r]);
        }
#pragma unroll
        for (int k = 0; k < K_; ++k) dr_step<true>(P + k * DR_E, t, step_scale, x, sig, pre, nullptr);
#pragma unroll
        for (int r = 0; r < DR_RPT; ++r)
            if (b + r * groups < batch)
#pragma unroll
                for (int a = 0; a < A_; ++a)
                    if (a % G_ == t) out[(b + r * groups) * A_ + a] = x[r][a];
    }
}

// The backward's staging in shared memory: per step k and tile row r, rows of the two outer
// products' factors.
struct DrStage {
    float* m1;   // [K_][DR_ROWS][DR_MS]  dpre_k
    float* n1;   // [K_][DR_ROWS][DR_NS]  [Q_k | sigma | 1]
    float* m2;   // [K_][DR_ROWS][DR_DS]  dQ_{k+1}
    float* n2;   // [K_][DR_ROWS][DR_HS]  [h_k | 1]
};

// Gradient tile m (< DR_TILES) of a step's products: its step, the factors' first rows and strides,
// and its first entry (row i0, column j0 of the product). first: whether it is of dpre^T [Q | sigma | 1].
struct DrTile {
    int k, i0, j0;
    bool first;
    const float* a;
    const float* b;
    int sa, sb;
};

// Tile w of a product whose second factor has cols4 groups of four columns: its first entry and its
// factors' first rows (a, b: the step's staged factors, strides sa, sb).
__device__ __forceinline__ void dr_place(DrTile& T, int w, int cols4, const float* a, int sa, const float* b, int sb) {
    T.i0 = 4 * (w / cols4);
    T.j0 = 4 * (w % cols4);
    T.a = a + T.i0, T.b = b + T.j0;
    T.sa = sa, T.sb = sb;
}

__device__ __forceinline__ DrTile dr_tile(const DrStage& S, int m) {
    DrTile T;
    T.first = m < K_ * DR_T1;
    if (T.first) {
        T.k = m / DR_T1;
        dr_place(T, m % DR_T1, DR_NS / 4, S.m1 + T.k * DR_ROWS * DR_MS, DR_MS, S.n1 + T.k * DR_ROWS * DR_NS, DR_NS);
    } else {
        const int m2 = m - K_ * DR_T1;
        T.k = m2 / DR_T2;
        dr_place(T, m2 % DR_T2, DR_HS / 4, S.m2 + T.k * DR_ROWS * DR_DS, DR_DS, S.n2 + T.k * DR_ROWS * DR_HS, DR_HS);
    }
    return T;
}

// Entry (i, j) of tile T's product as the packed step entry e and the factor it takes (c_k for Ws,
// s for W2 and b2); -1 for the padding.
__device__ __forceinline__ int dr_entry(const DrTile& T, int i, int j, float s, double* f) {
    *f = 1.0;
    if (T.first) {
        if (i >= H_ || j > 2 * A_) return -1;
        if (j < A_) return i * A_ + j;                 // Wq
        if (j == 2 * A_) return 2 * H_ * A_ + i;       // b1
        *f = (double)dr_schedule(T.k);                 // Ws
        return H_ * A_ + i * A_ + j - A_;
    }
    if (i >= A_ || j > H_) return -1;
    *f = (double)s;
    if (j < H_) return 2 * H_ * A_ + H_ + i * H_ + j;  // W2
    return 2 * H_ * A_ + H_ + A_ * H_ + i;             // b2
}

extern "C" __global__ void __launch_bounds__(DR_BT, 2) diffusion_refine_backward(
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
    __shared__ __align__(16) float stage[DR_STAGE];
    const DrStage S{stage, stage + K_ * DR_ROWS * DR_MS, stage + K_ * DR_ROWS * (DR_MS + DR_NS),
                    stage + K_ * DR_ROWS * (DR_MS + DR_NS + DR_DS)};
    // The padding columns (zeros) and the "1" columns, which phase 1 never writes.
    for (int e = threadIdx.x; e < K_ * DR_ROWS; e += DR_BT) {
        for (int c = H_; c < DR_MS; ++c) S.m1[e * DR_MS + c] = 0.0f;
        for (int c = 2 * A_; c < DR_NS; ++c) S.n1[e * DR_NS + c] = c == 2 * A_ ? 1.0f : 0.0f;
        for (int c = A_; c < DR_DS; ++c) S.m2[e * DR_DS + c] = 0.0f;
        for (int c = H_; c < DR_HS; ++c) S.n2[e * DR_HS + c] = c == H_ ? 1.0f : 0.0f;
    }
    dr_load_params<DR_BT>(P, w_q, w_sigma, b1, w2, b2);   // (its barrier covers the writes above)

    const int r = dr_row(), t = dr_lane();
    const float s = step_scale;
    float acc[DR_MT][16];
#pragma unroll
    for (int u = 0; u < DR_MT; ++u)
#pragma unroll
        for (int e = 0; e < 16; ++e) acc[u][e] = 0.0f;

    const int tiles = (batch + DR_ROWS - 1) / DR_ROWS;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {   // uniform over the block
        // Phase 1: this row's forward again, then its steps backwards.
        const long long b = (long long)tile * DR_ROWS + r;
        float x1[1][A_], sig1[1][A_], g[A_], pre[K_][1][DR_LU];
        float(&x)[A_] = x1[0];
        float(&sig)[A_] = sig1[0];
        dr_load_row(q, var, b, batch, x, sig);
        dr_sigma(sig);
#pragma unroll
        for (int a = 0; a < A_; ++a) g[a] = b < batch ? dy[b * A_ + a] : 0.0f;   // a padded row adds exact zeros
#pragma unroll
        for (int k = 0; k < K_; ++k) {
            float* n1 = S.n1 + (k * DR_ROWS + r) * DR_NS;
#pragma unroll
            for (int a = 0; a < A_; ++a)
                if (a % G_ == t) n1[a] = x[a], n1[A_ + a] = sig[a];
            float* hs = S.n2 + (k * DR_ROWS + r) * DR_HS;
            if (k + 1 < K_)
                dr_step<true>(P + k * DR_E, t, s, x1, sig1, pre[k], hs);
            else
                dr_step<false>(P + k * DR_E, t, s, x1, sig1, pre[k], hs);
        }
#pragma unroll
        for (int k = K_ - 1; k >= 0; --k) {
            const float* W = P + k * DR_E;
            const float* w2k = W + 2 * H_ * A_ + H_;
            float* m1 = S.m1 + (k * DR_ROWS + r) * DR_MS;
            float* m2 = S.m2 + (k * DR_ROWS + r) * DR_DS;
#pragma unroll
            for (int a = 0; a < A_; ++a)
                if (a % G_ == t) m2[a] = g[a];   // dQ_{k+1}
            float gn[1][A_];   // Wq^T dpre
            auto part = [&](int w, float (&rp)[1][A_]) {
#pragma unroll
                for (int j = 0; j < A_; ++j) rp[0][j] = 0.0f;
#pragma unroll
                for (int u = 0; u < DR_U; ++u) {
                    const int i = dr_unit(t, w, u);
                    if (dr_has(i)) {
                        float dh = 0.0f;   // (W2^T dQ_{k+1})_i
#pragma unroll
                        for (int j = 0; j < A_; ++j) dh = fmaf(w2k[i * A_ + j], g[j], dh);
                        const float a = pre[k][0][dr_slot(w, u)], gi = dr_sigmoid(a);
                        const float dp = s * dh * (gi * (1.0f + a * (1.0f - gi)));   // SiLU'
                        m1[i] = dp;
#pragma unroll
                        for (int j = 0; j < A_; ++j) rp[0][j] = fmaf(dp, W[i * A_ + j], rp[0][j]);
                    }
                }
            };
            dr_row_sum(part, gn);
#pragma unroll
            for (int j = 0; j < A_; ++j) g[j] += gn[0][j];   // dQ_k
        }
        if (b < batch)
#pragma unroll
            for (int a = 0; a < A_; ++a)
                if (a % G_ == t) dq[b * A_ + a] = g[a];
        __syncthreads();

        // Phase 2: this thread's gradient tiles over the tile's rows.
#pragma unroll
        for (int u = 0; u < DR_MT; ++u) {
            const int m = threadIdx.x + u * DR_BT;
            if (m < DR_TILES) {
                const DrTile T = dr_tile(S, m);
#pragma unroll 4
                for (int rr = 0; rr < DR_ROWS; ++rr) {
                    const float4 fa = *reinterpret_cast<const float4*>(T.a + rr * T.sa);
                    const float4 fb = *reinterpret_cast<const float4*>(T.b + rr * T.sb);
                    const float va[4] = {fa.x, fa.y, fa.z, fa.w}, vb[4] = {fb.x, fb.y, fb.z, fb.w};
#pragma unroll
                    for (int i = 0; i < 4; ++i)
#pragma unroll
                        for (int j = 0; j < 4; ++j) acc[u][4 * i + j] = fmaf(va[i], vb[j], acc[u][4 * i + j]);
                }
            }
        }
        __syncthreads();   // before the next tile's phase 1 writes the staging again
    }
    // The block's row of partials: each tile's entries, Ws's times c_k, W2's and b2's times s.
    double* row = partials + (long long)blockIdx.x * DR_P;
#pragma unroll
    for (int u = 0; u < DR_MT; ++u) {
        const int m = threadIdx.x + u * DR_BT;
        if (m < DR_TILES) {
            const DrTile T = dr_tile(S, m);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    double f;
                    const int e = dr_entry(T, T.i0 + i, T.j0 + j, s, &f);
                    if (e >= 0) row[T.k * DR_E + e] = (double)acc[u][4 * i + j] * f;
                }
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
    if (p < DR_P) {
        // Four rows' loads in flight at once, added in the same order as one at a time.
        int k = w;
        for (; k + 3 * DR_REDUCE_WARPS < num_partials; k += 4 * DR_REDUCE_WARPS) {
            double v[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] = partials[(long long)(k + i * DR_REDUCE_WARPS) * DR_P + p];
#pragma unroll
            for (int i = 0; i < 4; ++i) s += v[i];
        }
        for (; k < num_partials; k += DR_REDUCE_WARPS) s += partials[(long long)k * DR_P + p];
    }
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
