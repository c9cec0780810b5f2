// Linear layers as one TF32 tensor-core GEMM kernel (Hopper wgmma, operands brought in and results
// taken out by TMA), for up to LG_BRANCHES independent sets of operands per launch.
// foxhunt: arch-specific (compiled for sm_90a: wgmma exists there only)
//
// NumPy twin: foxhunt_core/gpu/reference.py linear_gemm.
//
//   out_b = A_b W_b (+ bias_b), then ReLU (LG_RELU) and the rounding to TF32 (LG_ROUND_OUT)
//           A_b [M, K]; W_b [K, N] read through its transpose wt_b [N, K] (TF32 wgmma reads both
//           operands K-major, rounded to TF32 by transpose_tile); bias_b [N] or null; out_b [M, N]
//   LG_DRELU (one set): a ReLU layer's backward in the epilogue, out = (A W (+ bias) (+ addend))
//           * (y > 0), y [M, N] the layer's output, addend [M, N] or null: a trunk layer's input
//           gradient from its output's (W the layer's weights transposed: wt its weights as they
//           are, rounded) without the [M, N] round trip through relu_backward.
//
// The network's advantage heads are its use: each branch's [M, 256] GLU output times its
// [256, 156] weights, N = 156 columns that cuBLAS covers with two 128-wide tiles (or one of 256);
// here one tile of LG_BN = 160 columns (the wgmma's N) covers them. With K = 256 the heads read
// more than they compute (about 50 flops a byte): the kernel is bound by memory, and keeps four
// stages of loads in flight (three ran 23-33% slower) and the weights, small and read from L2,
// unshared (clusters of 2 were 1-6% slower). Built on tc_gemm.cuh (TMA, the ring of stages, wgmma; its comment
// describes the pipeline): a tile is TC_BM = 128 rows x LG_BN columns of one set; clusters walk the
// groups (LG_CLUSTER row tiles of one column tile) cluster, + clusters, ...; each set has its own
// tensor maps, so a box never reaches into another set's columns (the weights' rows past N, the
// outputs' columns past N: TMA reads zeros there and writes nothing). The epilogue adds the bias,
// stages the tile in shared memory and stores it with TMA while the next tile's products run. A's
// first `rounded_k` columns may come rounded to TF32 by A's writer (glu_gemm with GW_ROUND_H).
//
// With LG_DUELING the sets are a network's advantage heads, set b branch branch0 + b (its block of
// the advantage row: action a's atoms at columns a N ..), and the dueling forward
// (dueling_row.cuh; NumPy twin: reference.py dueling_softmax_forward) of the tile's rows below
// duel_rows runs from the staged tile, by LG_DUELING_WARPS dueling warps beside the consumers: the
// consumers stage a tile, hand it over (tile_full) and go on to the next tile's products; the
// dueling warps read the rows back (eight lanes per row, four rows per warp at once:
// dueling_group_row), bring the value head v's rows from global memory (one pass ahead), write
// log_probs / probs / var (per segment of seg_rows rows, as seg_wants asks: dueling.cu), q and
// the direction branch's zq, and hand the buffer back (tile_empty). The distributions go out
// through the rows' own slots of the staging buffer (StagedDists), 32 consecutive floats a store.
// The advantage rows themselves reach memory only with store_out (a forward whose caller reads the
// heads): the [rows, 624] round trip between linear_gemm and dueling_softmax_forward is what the
// fusion saves. The dueling warps still set the pace at 65536 rows (the GEMM alone takes about half
// the time: benchmarks/bench_kernels.py --only dueling).
//
// Requirements (checked by the wrapper, foxhunt_core/gpu/kernels.py linear_gemm): the tensor maps
// describe A_b [M, K], wt_b [N, K] and out_b [M, N] with boxes of 32 columns x 128 rows (wt:
// LG_BN / LG_CLUSTER rows), 128-byte swizzle; N even; the biases 8-byte aligned.

#include "activation.cuh"
#include "tc_gemm.cuh"
// The variant settings LG_DUELING (the dueling forward in the epilogue), LG_BN (columns per tile:
// the wgmma's N), LG_STAGES, LG_TAIL_STEPS, LG_CLUSTER (CTAs sharing one weight load), LG_RELU,
// LG_ROUND_OUT (out written rounded to TF32), LG_DRELU (the ReLU's backward in the epilogue: set
// 0's y, addend), and LG_BRANCHES (operand sets per launch), LG_DUELING_WARPS, LG_DUELING_THREADS:
// defines.cuh
#if LG_DUELING
#include "dueling_row.cuh"
#endif

#if LG_DRELU && (LG_RELU || LG_DUELING)
#error "linear_gemm: LG_DRELU goes with neither LG_RELU nor LG_DUELING"
#endif
// (LG_DRELU's epilogue reads its tile's y from the staging buffer and its addend from the accumulators.)
static_assert(!LG_DRELU || LG_BN <= 128, "linear_gemm: LG_DRELU takes tiles of at most 128 columns");

#if LG_DRELU
// LG_DRELU's operands of a tile, on their way while the tile's products run, without registers
// held for them (a tile's y and addend in registers beside the accumulators spill: ptxas gives a
// warpgroup kernel 168 at most): this thread's elements of y [M, N] (ld_y apart), at its
// accumulators' positions (wgmma_tf32: rows r0, r0 + 8; columns 8 j + 2 q, + 1), copied
// (cp.async, zeros past M or N) to where its epilogue stages them in obuf, so that each thread
// reads back only what it copied; and its elements of addend (or zeros) as the accumulators'
// starting values, the products accumulated onto them.
__device__ __forceinline__ void drelu_start(float* acc, unsigned obuf, const float* __restrict__ y, int ld_y,
                                            const float* __restrict__ addend, int ld_addend, int m0, int r0, int n0,
                                            int q, int M, int N) {
#pragma unroll
    for (int j = 0; j < LG_BN / 8; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = r0 + 8 * half, col = 8 * j + 2 * q, row = m0 + r;
            const bool in = row < M && n0 + col < N;  // (N even: col + 1 < N too)
            const float* src = y + (in ? (size_t)row * ld_y + n0 + col : 0);
            asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(staged_at(obuf, r, col)), "l"(src),
                         "r"(in ? 8 : 0) : "memory");
            float2 a = make_float2(0.0f, 0.0f);
            if (in && addend != nullptr) a = __ldg(reinterpret_cast<const float2*>(addend + (size_t)row * ld_addend + n0 + col));
            acc[4 * j + 2 * half] = a.x, acc[4 * j + 2 * half + 1] = a.y;
        }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
#endif
#if LG_DUELING
// The consumer warps, the producer warp and the dueling warps: 512 threads, 128 registers each
// (the consumers' products need 106; with 8 dueling warps ptxas allots 96). setmaxnreg would not
// help: ptxas allots every warp's code the launch's count.
// 1: the distributions out through the staging buffer (StagedDists; 393.6 against 440.6 us for
// the online pair's heads at 65536), where its registers fit (24 values per lane spill).
#ifndef LG_DUELING_STAGED
#define LG_DUELING_STAGED (MAX_BRANCH_SIZE * DG_ATOMS <= 21)
#endif
static_assert(DG_FITS, "heads_dueling: a branch's logits take more than DG_BUDGET values per lane");
#define LG_THREADS LG_DUELING_THREADS
static_assert(LG_DUELING_THREADS == TC_THREADS + 32 * LG_DUELING_WARPS, "the dueling warps beside the others");
#else
#define LG_THREADS TC_THREADS
#endif
#define LG_BR (LG_BN / LG_CLUSTER)               // rows of wt each CTA loads for all
#define LG_TILE_B (LG_BN * TC_BK * 4)            // 20 KiB of wt per stage
#define LG_STAGE (TC_TILE_A + LG_TILE_B)
#define LG_BOXES ((LG_BN + 31) / 32)             // output boxes of 32 columns per tile
#define LG_TILE_OUT (LG_BOXES * TC_BM * 128)     // 80 KiB: the tile, staged for the TMA stores (+ 4 stages:
                                                 // 224 KiB of the 227 a block may have)

static_assert(LG_BN % 16 == 0 && LG_BN <= 256, "LG_BN: a wgmma N");
static_assert(LG_STAGES >= 3, "consume_tile awaits the next stage before it releases the previous one");
static_assert(LG_BR % 8 == 0, "each CTA's share of the weight rows must be whole 8-row swizzle atoms");

// Every set's tensor maps and bias (null: none), passed by value (__grid_constant__): a captured
// graph keeps its own copy.
struct __align__(64) LinearArgs {
    TensorMap a[LG_BRANCHES], wt[LG_BRANCHES], out[LG_BRANCHES];
    const float* bias[LG_BRANCHES];
};

#if LG_DUELING
// The dueling epilogue's arguments (see the top), passed by value.
struct DuelingArgs {
    const float* v;  // [rows, N (padded)], rows v_pitch apart
    const float* z;  // [N]
    DuelingOutputs out;
    int v_pitch, branch0, duel_rows, seg_rows, seg_wants, store_out;
};

// dueling_group_row's distributions through the staging buffer: each of a pass's S rows (tile rows
// r0 .., rows b0 .. of the outputs) writes its values into its own row of the buffer (read already,
// 160 columns: room for a branch's n N), then the whole warp copies one row at a time out, 32
// consecutive floats per store (straight from the lanes, a store reaches S rows' scattered 8-float
// runs). One distribution at a time (a row holds one).
struct StagedDists {
    float *log_probs, *probs;
    unsigned obuf;
    int r0;
    unsigned b0;
    int lane;
    template <int K>
    __device__ __forceinline__ void operator()(bool lp, bool p, unsigned, int a0, int n, int l,
                                               const float (&y)[MAX_BRANCH_SIZE][K], const float (&e)[MAX_BRANCH_SIZE][K],
                                               const float (&sums)[3 * MAX_BRANCH_SIZE]) const {
        float at[MAX_BRANCH_SIZE];  // ln S, then 1 / S
#pragma unroll
        for (int a = 0; a < MAX_BRANCH_SIZE; ++a) at[a] = lp && a < n ? lg2_approx(sums[a]) * LN2 : 0.0f;
        put<K>(lp, a0, n, l, log_probs, [&](int a, int k) { return fmaf(y[a][k], LN2, -at[a]); });
#pragma unroll
        for (int a = 0; a < MAX_BRANCH_SIZE; ++a) at[a] = p && a < n ? rcp_approx(sums[a]) : 0.0f;
        put<K>(p, a0, n, l, probs, [&](int a, int k) { return e[a][k] * at[a]; });
    }
    template <int K, class F>
    __device__ __forceinline__ void put(bool want, int a0, int n, int l, float* dst, F value) const {
        constexpr int L = DG_LANES, S = 32 / L;
        const unsigned rows_wanting = __ballot_sync(FULL_MASK, want);
        if (rows_wanting == 0) return;
        if (want) {
            const int r = r0 + lane / L;
            const unsigned rb = obuf + r * 128, rho = (r & 7) << 4;
#pragma unroll
            for (int a = 0; a < MAX_BRANCH_SIZE; ++a)
#pragma unroll
                for (int k = 0; k < K; ++k) {
                    const int c = a * NUM_ATOMS + l + L * k;
                    if (a < n && l + L * k < NUM_ATOMS)
                        asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(rb + ((((c >> 5) * (TC_BM * 128)) + (c & 31) * 4) ^ rho)),
                                     "f"(value(a, k)) : "memory");
                }
        }
        __syncwarp();
#pragma unroll
        for (int u = 0; u < S; ++u) {
            if (!((rows_wanting >> (u * L)) & 1u)) continue;
            const int r = r0 + u;
            const unsigned at = obuf + r * 128 + ((lane * 4) ^ ((r & 7) << 4));
            float* const row = dst + ((size_t)(b0 + u) * NUM_ACTIONS + a0) * NUM_ATOMS + lane;
#pragma unroll
            for (int c0 = 0; c0 < MAX_BRANCH_SIZE * NUM_ATOMS; c0 += 32) {
                if (c0 + lane >= n * NUM_ATOMS) break;
                float x;
                asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x) : "r"(at + (c0 >> 5) * (TC_BM * 128)) : "memory");
                row[c0] = x;
            }
        }
        __syncwarp();
    }
};

// The dueling warps: groups of DG_LANES lanes take a row each (dueling_group_row), so a warp takes
// S = 32 / DG_LANES rows of a tile at once (a pass: rows t S .. t S + S - 1), warp w the passes w,
// w + LG_DUELING_WARPS, .. of each tile the consumers stage (tile_full). A lane brings its row's v
// from global memory one pass ahead (the tile's first while it waits), reads the staged advantages
// at its atoms, and the warp hands the staging buffer back (tile_empty) after its last pass of the
// tile: with the distributions through the buffer (StagedDists) once that pass is done, otherwise
// once its reads are (the consumers stage the next tile while its math runs). The arguments read
// in the loop are copied into registers first, and a row's segment found by walking the
// boundaries (no division per row).
__device__ __forceinline__ void dueling_warp(const DuelingArgs& du, const Schedule<LG_CLUSTER>& sched, int per_set,
                                             int M, unsigned obuf, unsigned tile_full, unsigned tile_empty, int w,
                                             int lane) {
    constexpr int L = DG_LANES, K = DG_ATOMS, S = 32 / L, W = LG_DUELING_WARPS;
    constexpr int PASSES = TC_BM / S;  // of a tile
    constexpr int PERIOD = 32 / L;     // atoms k and k + PERIOD: the same column one 32-column box on
    const DuelingOutputs outs = du.out;
    const float* const v = du.v;
    const unsigned v_pitch = (unsigned)du.v_pitch;
    const int seg_rows = du.seg_rows, seg_wants = du.seg_wants, branch0 = du.branch0;
    const int g = lane / L, l = lane % L;  // this lane's row of a pass, its atoms l + L k
    float zz[K], zz2[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
        zz[k] = l + L * k < NUM_ATOMS ? du.z[l + L * k] : 0.0f;
        zz2[k] = zz[k] * zz[k];
    }
    const int rows = min(du.duel_rows, M);
    auto load_v = [&](int row, float (&vr)[K]) {  // row's v at the lane's atoms (nothing past the rows)
        if (row >= rows) return;
        const float* src = v + (size_t)row * v_pitch + l;
#pragma unroll
        for (int k = 0; k < K; ++k)
            if (l + L * k < NUM_ATOMS) vr[k] = src[L * k];
    };
    unsigned phase = 0;
    for (int p = sched.cluster; p < sched.groups; p += sched.clusters, phase ^= 1) {
        const int m0 = sched.row0(p);
        const int d = branch0 + sched.col_tile(p) / per_set, n = branch_size(d);
        // The segment of the tile's first row and where the next begins (a lane's rows only grow).
        int seg_end = (m0 / seg_rows + 1) * seg_rows, seg_bits = seg_wants >> (3 * (m0 / seg_rows));
        float vn[K];
#pragma unroll
        for (int k = 0; k < K; ++k) vn[k] = 0.0f;
        load_v(m0 + w * S + g, vn);
        mbar_wait(tile_full, phase);
        bool released = false;
        for (int t = w; t < PASSES && m0 + t * S < rows; t += W) {
            const int r = t * S + g, row = m0 + r;
            const bool valid = row < rows;
            // The staged advantages at the lane's atoms: staged_at's swizzle, the lane's part of the
            // address fixed per atom (the compiler keeps or remakes it), the row's added.
            const unsigned rb = obuf + r * 128, rho = (r & 7) << 4;
            float y[MAX_BRANCH_SIZE][K];
#pragma unroll
            for (int a = 0; a < MAX_BRANCH_SIZE; ++a)
#pragma unroll
                for (int k = 0; k < K; ++k) {
                    y[a][k] = 0.0f;
                    const int c = a * NUM_ATOMS + l + L * (k % PERIOD);
                    const unsigned at = rb + (((c >> 5) * (TC_BM * 128) + (c & 31) * 4) ^ rho) + (k / PERIOD) * (TC_BM * 128);
                    if (valid && a < n && l + L * k < NUM_ATOMS)
                        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(y[a][k]) : "r"(at));
                }
            const bool last = t + W >= PASSES || m0 + (t + W) * S >= rows;
            if (last && !LG_DUELING_STAGED)  // every read of this warp's done: the buffer back to the consumers
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(tile_empty) : "memory");
            released |= last;
            float vc[K];
#pragma unroll
            for (int k = 0; k < K; ++k) vc[k] = vn[k];
            if (!last) load_v(row + W * S, vn);
            while (valid && row >= seg_end) {
                seg_end += seg_rows;
                seg_bits >>= 3;
            }
#if LG_DUELING_STAGED
            const StagedDists dists{outs.log_probs, outs.probs, obuf, t * S, (unsigned)(m0 + t * S), lane};
#else
            const GroupDists<L> dists{outs.log_probs, outs.probs};
#endif
            dueling_group_row<L, K>(y, vc, l, (unsigned)row, valid, d, valid ? seg_bits & 7 : 0, zz, zz2, outs, dists);
            if (last && LG_DUELING_STAGED) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(tile_empty) : "memory");
        }
        if (!released) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(tile_empty) : "memory");
    }
}
#endif

extern "C" __global__ void __launch_bounds__(LG_THREADS, 1) __cluster_dims__(LG_CLUSTER, 1, 1)
linear_gemm(const __grid_constant__ LinearArgs args, int M, int K, int N, int branches, int rounded_k
#if LG_DUELING
            , const __grid_constant__ DuelingArgs du
#endif
#if LG_DRELU
            , const float* __restrict__ relu_y, int ld_y, const float* __restrict__ addend, int ld_addend
#endif
)
{
    extern __shared__ unsigned char smem_raw[];
    unsigned obuf;  // the tile on its way out
    Ring ring = ring_layout(smem_raw, LG_STAGES, LG_STAGE, LG_TILE_OUT, obuf);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int per_set = (N + LG_BN - 1) / LG_BN;
    const Schedule<LG_CLUSTER> sched(M, K, branches * per_set);
#if LG_DUELING
    // The staged tile's two mbarriers, behind the ring's: full (every consumer thread arrives once
    // it is staged), empty (every dueling thread, once its rows are read).
    const unsigned tile_full = ring.empty + 8 * LG_STAGES, tile_empty = tile_full + 8;
    if (tid == 0) {
        mbar_init(tile_full, 32 * TC_CONSUMER_WARPS);
        mbar_init(tile_empty, 32 * LG_DUELING_WARPS);
    }
#endif
    ring_init(ring, LG_CLUSTER, tid);

#if LG_DUELING
    if (warp > TC_CONSUMER_WARPS) {  // the dueling warps
        dueling_warp(du, sched, per_set, M, obuf, tile_full, tile_empty, warp - TC_CONSUMER_WARPS - 1, lane);
        cluster_sync();
        return;
    }
#endif
    if (warp == TC_CONSUMER_WARPS) {  // the producer
        const int rank = sched.rank;
        produce(ring, sched, lane, [&](int p, int kc, unsigned bar, unsigned sa, unsigned sb) {
            const int ct = sched.col_tile(p), b = ct / per_set, n0 = (ct % per_set) * LG_BN;
            tma_load(sa, &args.a[b], bar, kc * TC_BK, sched.row0(p));
#if LG_CLUSTER > 1
            const unsigned short all = (unsigned short)((1u << LG_CLUSTER) - 1);
            tma_load_multicast(sb + rank * LG_BR * 128, &args.wt[b], bar, kc * TC_BK, n0 + rank * LG_BR, all);
#else
            (void)rank;
            tma_load(sb, &args.wt[b], bar, kc * TC_BK, n0);
#endif
        });
        return;
    }

    // The consumers.
#if LG_DUELING
    const bool store = du.store_out != 0;
    unsigned phase = 0;  // the staged tile's
#else
    constexpr bool store = true;
#endif
    const int wg = warp >> 2;  // this warpgroup's 64 rows of the tile
    const int g = lane >> 2, q = lane & 3;
    float acc[LG_BN / 2];
    for (int p = sched.cluster; p < sched.groups; p += sched.clusters) {
        const int ct = sched.col_tile(p), m0 = sched.row0(p);
        const int b = ct / per_set, n0 = (ct % per_set) * LG_BN;
        const int r0 = wg * 64 + (warp & 3) * 16 + g;  // rows in the tile (and r0 + 8)
#if LG_DRELU
        staging_acquire(tid);  // (y comes into the staging buffer: the previous tile's stores have read it)
        drelu_start(acc, obuf, relu_y, ld_y, addend, ld_addend, m0, r0, n0, q, M, N);
        consume_tile<LG_BN, LG_TAIL_STEPS, LG_CLUSTER, false>(acc, ring, sched.chunks, rounded_k, wg, lane, tid & 127);
#else
        consume_tile<LG_BN, LG_TAIL_STEPS, LG_CLUSTER>(acc, ring, sched.chunks, rounded_k, wg, lane, tid & 127);
#endif

        // Epilogue (the accumulators' layout: wgmma_tf32): the tile through shared memory (obuf:
        // LG_BOXES boxes of 32 columns x 128 rows, staged_at), out by TMA stores; with LG_DUELING
        // on to the dueling warps, once they have read the previous tile.
        const float* const bias = args.bias[b];
#if LG_DUELING
        mbar_wait(tile_empty, phase ^ 1);  // (a fresh barrier passes parity 1)
#endif
#if LG_DRELU
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // this thread's copies of y
#pragma unroll
        for (int j = 0; j < LG_BN / 8; ++j) {
            const int col = 8 * j + 2 * q;
            float2 bj = make_float2(0.0f, 0.0f);
            if (bias != nullptr && n0 + col < N) bj = *reinterpret_cast<const float2*>(bias + n0 + col);
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const unsigned at = staged_at(obuf, r0 + 8 * half, col);
                float y0, y1;
                asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(y0), "=f"(y1) : "r"(at) : "memory");
                float x0 = y0 > 0.0f ? acc[4 * j + 2 * half] + bj.x : 0.0f;
                float x1 = y1 > 0.0f ? acc[4 * j + 2 * half + 1] + bj.y : 0.0f;
#if LG_ROUND_OUT
                x0 = tf32_nearest(x0), x1 = tf32_nearest(x1);
#endif
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(x0), "f"(x1) : "memory");
            }
        }
#else
        if (store) staging_acquire(tid);
#pragma unroll
        for (int j = 0; j < LG_BN / 8; ++j) {
            const int col = 8 * j + 2 * q;
            float2 bj = make_float2(0.0f, 0.0f);
            if (bias != nullptr && n0 + col < N) bj = *reinterpret_cast<const float2*>(bias + n0 + col);  // (N even)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                float x0 = acc[4 * j + 2 * half] + bj.x, x1 = acc[4 * j + 2 * half + 1] + bj.y;
#if LG_RELU
                x0 = fmaxf(x0, 0.0f), x1 = fmaxf(x1, 0.0f);
#endif
#if LG_ROUND_OUT
                x0 = tf32_nearest(x0), x1 = tf32_nearest(x1);
#endif
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(staged_at(obuf, r0 + 8 * half, col)), "f"(x0),
                             "f"(x1) : "memory");
            }
        }
#endif
        if (store) {
            staging_release();
            if (tid == 0) {
#pragma unroll
                for (int x = 0; x < LG_BOXES; ++x)
                    if (n0 + 32 * x < N) tma_store(&args.out[b], obuf + x * (TC_BM * 128), n0 + 32 * x, m0);
                asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#if LG_DUELING && LG_DUELING_STAGED
                // The dueling warps write their distributions over the staged rows: the stores
                // must have read them first (thread 0 arrives at tile_full after this).
                asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
            }
        }
#if LG_DUELING
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(tile_full) : "memory");
        phase ^= 1;
#endif
    }
    consumers_finish(tid);
}
