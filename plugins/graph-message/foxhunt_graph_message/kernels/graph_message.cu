// Gated message passing over the branch graph: forward, backward and the deterministic reduction of
// the parameter gradients over the batch.
//
// NumPy twin: foxhunt_graph_message/graph.py (the equations are in its docstring). Launch wrappers:
// foxhunt_graph_message/cuda.py.
//
// Edges e = 0..3: direction(0) -> magnitude(1), direction -> order(2), magnitude -> urgency(3),
// order -> urgency. Per edge and sample, with Q_s, Q_d the source's and destination's Q-values:
//   g = sigmoid(u . Q_s + v . Q_d),  Q'_d += g (M Q_s) / c_d   (c_d: edges ending at d)
// The parameters of edge e are packed as [u (n_s) | v (n_d) | M (n_d x n_s, row-major)], edge after
// edge (GM_P floats); every thread loads all of them from the twelve tensors into its registers
// (60 for four branches of 3: copied into shared memory behind a barrier, they made the forward
// 2.3x and the backward 1.7x slower at 4096 rows, where the kernels are bound by latency).
//
// Thread mapping: a thread per sample (its row of Q and the parameters in registers), grid-stride
// over the batch.
// The backward adds its samples' parameter-gradient terms in float registers; at the end the block
// sums its threads' terms (in double, warp shuffles then the warps in order) into one row of
// partial sums, and graph_message_grad_reduce adds the rows in a fixed order: no atomics, the
// result is the same bit for bit from run to run.

#ifndef NUM_ACTIONS
#define NUM_ACTIONS 12
#endif
#ifndef NUM_BRANCHES
#define NUM_BRANCHES 4
#endif
#ifndef BRANCH_OFFSETS
#define BRANCH_OFFSETS {0, 3, 6, 9, 12}
#endif
#ifndef MAX_BRANCH_SIZE
#define MAX_BRANCH_SIZE 3
#endif
#ifndef GM_THREADS
#define GM_THREADS 128   // the wrappers launch this many threads per block
#endif

static_assert(NUM_BRANCHES == 4, "the graph's four edges join the four branches");
static_assert(GM_THREADS % 32 == 0, "whole warps");

#define GM_EDGES 4
#define GM_TENSORS (3 * GM_EDGES)
#define GM_WARPS (GM_THREADS / 32)
#define GM_REDUCE_WARPS 32   // graph_message_grad_reduce is launched with 1024 threads
#define GM_FULL_MASK 0xffffffffu

__host__ __device__ constexpr int gm_off(int b) {
    constexpr int o[NUM_BRANCHES + 1] = BRANCH_OFFSETS;
    return o[b];
}
__host__ __device__ constexpr int gm_size(int b) { return gm_off(b + 1) - gm_off(b); }
__host__ __device__ constexpr int gm_src(int e) { return e < 2 ? 0 : e - 1; }   // 0, 0, 1, 2
__host__ __device__ constexpr int gm_dst(int e) { return e < 2 ? e + 1 : 3; }   // 1, 2, 3, 3
__host__ __device__ constexpr int gm_incoming(int b) {
    int n = 0;
    for (int e = 0; e < GM_EDGES; ++e) n += gm_dst(e) == b ? 1 : 0;
    return n;
}
// Size of tensor t = 3 e + k of edge e: k = 0 u, 1 v, 2 M.
__host__ __device__ constexpr int gm_tensor_size(int t) {
    return t % 3 == 0 ? gm_size(gm_src(t / 3)) : t % 3 == 1 ? gm_size(gm_dst(t / 3))
                                                            : gm_size(gm_src(t / 3)) * gm_size(gm_dst(t / 3));
}
__host__ __device__ constexpr int gm_tensor_base(int t) {
    int n = 0;
    for (int i = 0; i < t; ++i) n += gm_tensor_size(i);
    return n;
}
#define GM_P gm_tensor_base(GM_TENSORS)

static_assert(gm_off(NUM_BRANCHES) == NUM_ACTIONS, "BRANCH_OFFSETS must end at NUM_ACTIONS");

// Entry p of the packed layout written into its tensor (the tensors' bounds compile-time constants).
template <int T = 0>
__device__ __forceinline__ void gm_store_entry(float* const (&t)[GM_TENSORS], int p, float value) {
    if constexpr (T < GM_TENSORS) {
        constexpr int base = gm_tensor_base(T), n = gm_tensor_size(T);
        if (p < base + n)
            t[T][p - base] = value;
        else
            gm_store_entry<T + 1>(t, p, value);
    }
}

// Every packed parameter into the thread's registers (P a register array: every index below is a
// compile-time constant once unrolled). The warp's addresses are the same, so each load is one
// transaction, served from L1 after the first warp.
template <int T = 0>
__device__ __forceinline__ void gm_load_tensors_regs(float (&P)[GM_P], const float* const (&t)[GM_TENSORS]) {
    if constexpr (T < GM_TENSORS) {
        constexpr int base = gm_tensor_base(T), n = gm_tensor_size(T);
#pragma unroll
        for (int i = 0; i < n; ++i) P[base + i] = __ldg(t[T] + i);
        gm_load_tensors_regs<T + 1>(P, t);
    }
}

// Row b of x [B, A] into registers (zeros past the batch); as float4s where a row is whole ones.
__device__ __forceinline__ void gm_load_row(float* r, const float* __restrict__ x, long long b, int batch) {
    if constexpr (NUM_ACTIONS % 4 == 0) {
#pragma unroll
        for (int a = 0; a < NUM_ACTIONS; a += 4) {
            const float4 v = b < batch ? __ldg(reinterpret_cast<const float4*>(x + b * NUM_ACTIONS + a))
                                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            r[a] = v.x, r[a + 1] = v.y, r[a + 2] = v.z, r[a + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int a = 0; a < NUM_ACTIONS; ++a) r[a] = b < batch ? x[b * NUM_ACTIONS + a] : 0.0f;
    }
}

// The row r into row b of y [B, A] (b inside the batch).
__device__ __forceinline__ void gm_store_row(float* __restrict__ y, const float* r, long long b) {
    if constexpr (NUM_ACTIONS % 4 == 0) {
#pragma unroll
        for (int a = 0; a < NUM_ACTIONS; a += 4)
            *reinterpret_cast<float4*>(y + b * NUM_ACTIONS + a) = make_float4(r[a], r[a + 1], r[a + 2], r[a + 3]);
    } else {
#pragma unroll
        for (int a = 0; a < NUM_ACTIONS; ++a) y[b * NUM_ACTIONS + a] = r[a];
    }
}

// The gate pre-activation and M Q_s of edge E for the row x.
template <int E>
__device__ __forceinline__ float gm_edge(const float* P, const float* x, float* m) {
    constexpr int s = gm_src(E), d = gm_dst(E), os = gm_off(s), od = gm_off(d);
    constexpr int ns = gm_size(s), nd = gm_size(d);
    const float* u = P + gm_tensor_base(3 * E);
    const float* v = u + ns;
    const float* M = v + nd;
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < ns; ++j) a = fmaf(u[j], x[os + j], a);
#pragma unroll
    for (int j = 0; j < nd; ++j) a = fmaf(v[j], x[od + j], a);
#pragma unroll
    for (int i = 0; i < nd; ++i) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < ns; ++j) acc = fmaf(M[i * ns + j], x[os + j], acc);
        m[i] = acc;
    }
    return a;
}

__device__ __forceinline__ float gm_sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

template <int E>
__device__ __forceinline__ void gm_forward_edge(const float* P, const float* x, float* y) {
    constexpr int d = gm_dst(E), od = gm_off(d), nd = gm_size(d);
    float m[nd];
    const float g = gm_sigmoid(gm_edge<E>(P, x, m)) * (1.0f / (float)gm_incoming(d));
#pragma unroll
    for (int i = 0; i < nd; ++i) y[od + i] = fmaf(g, m[i], y[od + i]);
}

extern "C" __global__ void __launch_bounds__(GM_THREADS) graph_message_forward(
    const float* __restrict__ q,   // [B, A] input Q
    float* __restrict__ out,       // [B, A] Q', must not alias q
    int batch,
    const float* u0, const float* v0, const float* m0,   // edge 0 (direction -> magnitude)
    const float* u1, const float* v1, const float* m1,   // edge 1 (direction -> order)
    const float* u2, const float* v2, const float* m2,   // edge 2 (magnitude -> urgency)
    const float* u3, const float* v3, const float* m3)   // edge 3 (order -> urgency)
{
    const float* tensors[GM_TENSORS] = {u0, v0, m0, u1, v1, m1, u2, v2, m2, u3, v3, m3};
    const long long stride = (long long)gridDim.x * GM_THREADS;
    long long b = (long long)blockIdx.x * GM_THREADS + threadIdx.x;
    // The first row's loads and the parameters' together: one wait on memory, no barrier.
    float x[NUM_ACTIONS], P[GM_P];
    gm_load_row(x, q, b, batch);
    gm_load_tensors_regs(P, tensors);
    for (; b < batch; b += stride) {
        float y[NUM_ACTIONS];
        if (b != (long long)blockIdx.x * GM_THREADS + threadIdx.x) gm_load_row(x, q, b, batch);
#pragma unroll
        for (int a = 0; a < NUM_ACTIONS; ++a) y[a] = x[a];
        gm_forward_edge<0>(P, x, y);
        gm_forward_edge<1>(P, x, y);
        gm_forward_edge<2>(P, x, y);
        gm_forward_edge<3>(P, x, y);
        gm_store_row(out, y, b);
    }
}

// Edge E's share of the backward for one row: input gradients into dx, parameter terms into acc
// (packed like P).
template <int E>
__device__ __forceinline__ void gm_backward_edge(const float* P, const float* x, const float* dy, float* dx,
                                                 float* acc) {
    constexpr int s = gm_src(E), d = gm_dst(E), os = gm_off(s), od = gm_off(d);
    constexpr int ns = gm_size(s), nd = gm_size(d), base = gm_tensor_base(3 * E);
    const float* u = P + base;
    const float* v = u + ns;
    const float* M = v + nd;
    float m[nd];
    const float g = gm_sigmoid(gm_edge<E>(P, x, m));
    constexpr float inv_c = 1.0f / (float)gm_incoming(d);
    float gd[nd];   // g delta: dloss / d(M Q_s)
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < nd; ++i) {
        const float delta = dy[od + i] * inv_c;
        dot = fmaf(delta, m[i], dot);
        gd[i] = g * delta;
    }
    const float a = g * (1.0f - g) * dot;   // dloss / d gate pre-activation
#pragma unroll
    for (int j = 0; j < ns; ++j) {
        acc[base + j] = fmaf(a, x[os + j], acc[base + j]);
        float t = a * u[j];
#pragma unroll
        for (int i = 0; i < nd; ++i) {
            acc[base + ns + nd + i * ns + j] = fmaf(gd[i], x[os + j], acc[base + ns + nd + i * ns + j]);
            t = fmaf(gd[i], M[i * ns + j], t);
        }
        dx[os + j] += t;
    }
#pragma unroll
    for (int j = 0; j < nd; ++j) {
        acc[base + ns + j] = fmaf(a, x[od + j], acc[base + ns + j]);
        dx[od + j] = fmaf(a, v[j], dx[od + j]);
    }
}

extern "C" __global__ void __launch_bounds__(GM_THREADS) graph_message_backward(
    const float* __restrict__ q,     // [B, A] the forward's input
    const float* __restrict__ dy,    // [B, A] dloss / dQ'
    float* __restrict__ dq,          // [B, A] dloss / dQ
    double* __restrict__ partials,   // [gridDim.x, GM_P] the blocks' parameter-gradient sums
    int batch,
    const float* u0, const float* v0, const float* m0,
    const float* u1, const float* v1, const float* m1,
    const float* u2, const float* v2, const float* m2,
    const float* u3, const float* v3, const float* m3)
{
    __shared__ double red[GM_WARPS][GM_P];
    const float* tensors[GM_TENSORS] = {u0, v0, m0, u1, v1, m1, u2, v2, m2, u3, v3, m3};
    const long long stride = (long long)gridDim.x * GM_THREADS;
    const long long first = (long long)blockIdx.x * GM_THREADS + threadIdx.x;
    float P[GM_P];
    gm_load_tensors_regs(P, tensors);
    float acc[GM_P];
#pragma unroll
    for (int p = 0; p < GM_P; ++p) acc[p] = 0.0f;
    for (long long b = first; b < batch; b += stride) {
        float x[NUM_ACTIONS], g[NUM_ACTIONS], dx[NUM_ACTIONS];
        gm_load_row(x, q, b, batch);
        gm_load_row(g, dy, b, batch);
#pragma unroll
        for (int a = 0; a < NUM_ACTIONS; ++a) dx[a] = g[a];
        gm_backward_edge<0>(P, x, g, dx, acc);
        gm_backward_edge<1>(P, x, g, dx, acc);
        gm_backward_edge<2>(P, x, g, dx, acc);
        gm_backward_edge<3>(P, x, g, dx, acc);
        gm_store_row(dq, dx, b);
    }
    // The block's sums in double: within each warp by shuffles, then the warps in order.
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
#pragma unroll
    for (int p = 0; p < GM_P; ++p) {
        double s = (double)acc[p];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(GM_FULL_MASK, s, off);
        if (lane == 0) red[w][p] = s;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < GM_P; p += GM_THREADS) {
        double s = 0.0;
#pragma unroll
        for (int ww = 0; ww < GM_WARPS; ++ww) s += red[ww][p];
        partials[(long long)blockIdx.x * GM_P + p] = s;
    }
}

// Entry p of the packed gradient = sum_k partials[k, p] in a fixed order: a block of 32 warps takes
// 32 entries (lane = entry), warp w adds the rows w, w + 32, ..., then warp 0 adds the 32 sums and
// writes the entry into its tensor.
extern "C" __global__ void __launch_bounds__(32 * GM_REDUCE_WARPS) graph_message_grad_reduce(
    const double* __restrict__ partials,   // [num_partials, GM_P]
    int num_partials,
    float* du0, float* dv0, float* dm0,
    float* du1, float* dv1, float* dm1,
    float* du2, float* dv2, float* dm2,
    float* du3, float* dv3, float* dm3)
{
    __shared__ double sums[GM_REDUCE_WARPS][32];
    float* tensors[GM_TENSORS] = {du0, dv0, dm0, du1, dv1, dm1, du2, dv2, dm2, du3, dv3, dm3};
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    const int p = blockIdx.x * 32 + lane;
    double s = 0.0;
    if (p < GM_P)
        for (int k = w; k < num_partials; k += GM_REDUCE_WARPS) s += partials[(long long)k * GM_P + p];
    sums[w][lane] = s;
    __syncthreads();
    if (w == 0 && p < GM_P) {
        double t = 0.0;
        for (int r = 0; r < GM_REDUCE_WARPS; ++r) t += sums[r][lane];
        gm_store_entry(tensors, p, (float)t);
    }
}
