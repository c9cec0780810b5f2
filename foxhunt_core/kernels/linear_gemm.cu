// Linear layers as one TF32 tensor-core GEMM kernel (Hopper wgmma, operands brought in and results
// taken out by TMA), for up to LG_BRANCHES independent sets of operands per launch.
// foxhunt: arch-specific (compiled for sm_90a: wgmma exists there only)
//
// NumPy twin: foxhunt_core/gpu/reference.py linear_gemm.
//
//   out_b = A_b W_b (+ bias_b), then ReLU (LG_RELU) and the rounding to TF32 (LG_ROUND_OUT)
//           A_b [M, K]; W_b [K, N] read through its transpose wt_b [N, K] (TF32 wgmma reads both
//           operands K-major, rounded to TF32 by transpose_tile); bias_b [N] or null; out_b [M, N]
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
// Requirements (checked by the wrapper, foxhunt_core/gpu/kernels.py linear_gemm): the tensor maps
// describe A_b [M, K], wt_b [N, K] and out_b [M, N] with boxes of 32 columns x 128 rows (wt:
// LG_BN / LG_CLUSTER rows), 128-byte swizzle; N even; the biases 8-byte aligned.

#include "activation.cuh"
#include "tc_gemm.cuh"

#ifndef LG_BN
#define LG_BN 160                                // columns per tile: the wgmma's N
#endif
#ifndef LG_STAGES
#define LG_STAGES 4                              // (memory-bound tiles of 8 chunks: 3 stages ran 23-33% slower)
#endif
#ifndef LG_TAIL_STEPS
#define LG_TAIL_STEPS 4                          // k steps of 8 of the last chunk: (K - 1) % 32 / 8 + 1
#endif
#ifndef LG_CLUSTER
#define LG_CLUSTER 1                             // CTAs per cluster: row tiles sharing one weight load
#endif
#ifndef LG_RELU
#define LG_RELU 0
#endif
#ifndef LG_ROUND_OUT
#define LG_ROUND_OUT 0                           // 1: out written rounded to TF32 (for TF32 GEMMs to read as it is)
#endif
#define LG_BRANCHES 4                            // operand sets per launch, at most
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

extern "C" __global__ void __launch_bounds__(TC_THREADS, 1) __cluster_dims__(LG_CLUSTER, 1, 1)
linear_gemm(const __grid_constant__ LinearArgs args, int M, int K, int N, int branches, int rounded_k)
{
    extern __shared__ unsigned char smem_raw[];
    unsigned obuf;  // the tile on its way out
    Ring ring = ring_layout(smem_raw, LG_STAGES, LG_STAGE, LG_TILE_OUT, obuf);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int per_set = (N + LG_BN - 1) / LG_BN;
    const Schedule<LG_CLUSTER> sched(M, K, branches * per_set);
    ring_init(ring, LG_CLUSTER, tid);

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
    const int wg = warp >> 2;  // this warpgroup's 64 rows of the tile
    const int g = lane >> 2, q = lane & 3;
    float acc[LG_BN / 2];
    for (int p = sched.cluster; p < sched.groups; p += sched.clusters) {
        const int ct = sched.col_tile(p), m0 = sched.row0(p);
        const int b = ct / per_set, n0 = (ct % per_set) * LG_BN;
        consume_tile<LG_BN, LG_TAIL_STEPS, LG_CLUSTER>(acc, ring, sched.chunks, rounded_k, wg, lane, tid & 127);

        // Epilogue (the accumulators' layout: wgmma_tf32): the tile through shared memory (obuf:
        // LG_BOXES boxes of 32 columns x 128 rows, staged_at), out by TMA stores.
        const int r0 = wg * 64 + (warp & 3) * 16 + g;  // rows in the tile (and r0 + 8)
        const float* const bias = args.bias[b];
        staging_acquire(tid);
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
        staging_release();
        if (tid == 0) {
#pragma unroll
            for (int x = 0; x < LG_BOXES; ++x)
                if (n0 + 32 * x < N) tma_store(&args.out[b], obuf + x * (TC_BM * 128), n0 + 32 * x, m0);
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
    }
    consumers_finish(tid);
}
