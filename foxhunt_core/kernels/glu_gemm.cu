// The GLU layer as one kernel: a TF32 tensor-core GEMM (Hopper wgmma, operands brought in by TMA)
// with the gate applied in its epilogue.
// foxhunt: arch-specific (compiled for sm_90a: wgmma exists there only)
//
// NumPy twin: foxhunt_core/gpu/reference.py glu_gemm (pv = u W + bias, then glu_forward).
//
//   pv = u W (+ bias)   u [M, K]; W [K, blocks 2H]: branch b's gate columns at 2Hb, its value
//                       columns at 2Hb + H (the fused network's [W_gate | W_val] blocks side by
//                       side), read through its transpose wt [blocks 2H, K] (TF32 wgmma reads both
//                       operands K-major); bias [blocks 2H] or null
//   h = gate(pre) * value, augmented per branch: [h, 0, ..., 0, 1], `width` columns (with
//                       GW_ROUND_H rounded to TF32: its readers, TF32 GEMMs, take it as it is);
//                       the gate is gate.cuh's fragment (the sigmoid unless the launch names
//                       another), branch b's unit j reading its parameters from gate.p[b]
//   pv itself is written as well for the rows below pv_rows (the backward recomputes the gate
//   and the value from it); the other rows' pre-activations never leave the chip.
//
// Built on tc_gemm.cuh (TMA, the ring of stages, wgmma; its comment describes the pipeline): a
// tile is TC_BM = 128 rows x GW_BH = 128 GLU columns of one branch, whose 128 gate and 128 value
// rows of wt make up the wgmma's N = 256, so that a gate accumulator and its value's are held by
// the same thread (the epilogue needs no exchange). Clusters walk the groups (GW_CLUSTER row tiles
// of one column tile) cluster, + clusters, ..., consecutive groups the column tiles of the same
// rows (u's rows are read from L2 by all of them; the weights stay there). Without the weights'
// multicast the main loop was bound by L2 traffic. u's first `rounded_k` columns may come rounded
// to TF32 by u's writer (the network's z, written so by vsn_forward).
//
// Four stages in the ring: a consumer releases a stage only after it has issued the next chunk's
// products, so of GW_STAGES stages GW_STAGES - 2 are being loaded while the tensor cores work; with
// three the main loop waited for its loads (a tile is only eight or nine chunks deep). A fourth
// stage (48 KiB) fits beside a staging buffer of two of h's four boxes, used in turn, one box per
// hand-off to the TMA unit. pv can leave through the staging buffer by TMA too (GW_PV_TMA) rather
// than from the registers; benchmarks/glu_gemm_variants.py times the variants, and the wrapper
// (foxhunt_core/gpu/tc/glu.py, GluConfig.pv_tma) picks it where pv's pitch and address allow.
//
// Requirements (checked by the wrapper, foxhunt_core/gpu/kernels.py glu_gemm): the tensor maps
// describe u [M, K], wt [blocks 2H, K], h [M, blocks width] and, with GW_PV_TMA, pv [pv_rows,
// blocks 2H] with boxes of 32 columns x 128 rows (wt: 128 / GW_CLUSTER rows), 128-byte swizzle;
// H a multiple of 128; ld_h, ld_pv even; h, pv and bias 8-byte aligned.

#include "activation.cuh"
#include "gate.cuh"
#include "tc_gemm.cuh"

// GW_BH (GLU columns per tile) and the variant settings GW_STAGES, GW_TAIL_STEPS, GW_ROUND_H (h
// written rounded to TF32), GW_CLUSTER (CTAs sharing one weight load), GW_STAGED_BOXES (boxes of
// h the staging buffer holds), GW_STORE_BOXES (boxes per hand-off to the TMA unit), GW_PV_TMA (pv
// out through the staging buffer by TMA; the wrapper sets it per call): defines.cuh
#define GW_BR (GW_BH / GW_CLUSTER)               // gate (and value) rows of wt each CTA loads for all
#define GW_TILE_B (2 * GW_BH * TC_BK * 4)        // 32 KiB of wt: the gate rows, then the value rows
#define GW_STAGE (TC_TILE_A + GW_TILE_B)
#define GW_BOXES (GW_BH / 32)                    // boxes of h per tile
#define GW_TILE_H (GW_STAGED_BOXES * TC_BM * 128) // the staging buffer: all of a tile's h (64 KiB) or part, in turn
static_assert(GW_STAGES >= 3, "consume_tile awaits the next stage before it releases the previous one");
static_assert(GW_STAGED_BOXES % GW_STORE_BOXES == 0 && GW_BOXES % GW_STAGED_BOXES == 0,
              "the staging buffer takes whole hand-offs, the tile whole buffers");

// GW_WIDE (the wrapper's choice: GluGemmConfig.wide): the producer is a whole warpgroup that gives
// its registers up to the consumers (setmaxnreg, which works per warpgroup: 40 for the producers,
// 232 for the consumers, of the 384 threads' 168 each as launched). The consumers' 128
// accumulators left a gate of parameters 40 registers, too few to overlap its per-element work
// (benchmarks/bench_gate_epilogue.py: kan_gate's glu_gemm 1.28x the sigmoid's time at 131072 rows
// with 168 registers, 1.25x with 232); the sigmoid keeps the single producer warp.
#ifndef GW_WIDE
#define GW_WIDE 0
#endif
#define GW_THREADS (GW_WIDE ? TC_THREADS - 32 + 128 : TC_THREADS)

extern "C" __global__ void __launch_bounds__(GW_THREADS, 1) __cluster_dims__(GW_CLUSTER, 1, 1)
glu_gemm(const __grid_constant__ TensorMap map_u, const __grid_constant__ TensorMap map_wt,
         const __grid_constant__ TensorMap map_h, const __grid_constant__ TensorMap map_pv,
         const float* __restrict__ bias, const __grid_constant__ GateArgs gate,
         float* __restrict__ h, int ld_h,
         float* __restrict__ pv, int ld_pv, int pv_rows,
         int M, int K, int H, int width, int blocks, int rounded_k)
{
    extern __shared__ unsigned char smem_raw[];
    unsigned hbuf;  // the tile's h on its way out
    Ring ring = ring_layout(smem_raw, GW_STAGES, GW_STAGE, GW_TILE_H, hbuf);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int per_branch = H / GW_BH;
    const Schedule<GW_CLUSTER> sched(M, K, blocks * per_branch);
    ring_init(ring, GW_CLUSTER, tid);

#if GW_WIDE
    if (warp >= TC_CONSUMER_WARPS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (warp > TC_CONSUMER_WARPS) {  // (the warpgroup's other three warps idle)
            cluster_sync();
            return;
        }
    }
#endif
    if (warp == TC_CONSUMER_WARPS) {  // the producer
        const int rank = sched.rank;
        produce(ring, sched, lane, [&](int p, int kc, unsigned bar, unsigned sa, unsigned sb) {
            const int ct = sched.col_tile(p);
            const int gate0 = (ct / per_branch) * 2 * H + (ct % per_branch) * GW_BH;
            tma_load(sa, &map_u, bar, kc * TC_BK, sched.row0(p));
#if GW_CLUSTER > 1
            const unsigned short all = (unsigned short)((1u << GW_CLUSTER) - 1);
            tma_load_multicast(sb + rank * GW_BR * 128, &map_wt, bar, kc * TC_BK, gate0 + rank * GW_BR, all);
            tma_load_multicast(sb + (GW_BH + rank * GW_BR) * 128, &map_wt, bar, kc * TC_BK, gate0 + H + rank * GW_BR,
                               all);
#else
            (void)rank;
            tma_load(sb, &map_wt, bar, kc * TC_BK, gate0);
            tma_load(sb + GW_BH * 128, &map_wt, bar, kc * TC_BK, gate0 + H);
#endif
        });
        return;
    }

    // The consumers.
#if GW_WIDE
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
#endif
    const int wg = warp >> 2;  // this warpgroup's 64 rows of the tile
    const int g = lane >> 2, q = lane & 3;
    // Accumulators: element 4j + e is column 8j + .. of the 256 (gate columns, then value columns),
    // so a gate element and its value element (same row, same GLU column) are GW_BH / 2 apart.
    float acc[GW_BH];
    float* const ag = acc;
    float* const av = acc + GW_BH / 2;
    int handoffs = 0;  // to the TMA unit so far: the staging buffer's slots take them in turn
    for (int p = sched.cluster; p < sched.groups; p += sched.clusters) {
        const int ct = sched.col_tile(p), m0 = sched.row0(p);
        const int branch = ct / per_branch, j0 = (ct % per_branch) * GW_BH;
        consume_tile<2 * GW_BH, GW_TAIL_STEPS, GW_CLUSTER>(acc, ring, sched.chunks, rounded_k, wg, lane, tid & 127);

        // Epilogue (the accumulators' layout: wgmma_tf32). h goes through shared memory (hbuf:
        // boxes of 32 columns x 128 rows, staged_at) and leaves by TMA stores, which proceed while
        // the rest of the epilogue and the next tile's products run. The buffer holds
        // GW_STAGED_BOXES boxes: the whole tile's (one hand-off), or fewer used in turn
        // (GW_STORE_BOXES at a time), so that the shared memory the whole tile's would take can
        // hold a fourth stage of the ring: then a hand-off waits only for the stores of the one
        // before the last (they read the place it writes). pv, for the rows that keep it, goes the
        // same way, its gate box and value box before each box of h (GW_PV_TMA), or from the
        // registers.
        const int r0 = wg * 64 + (warp & 3) * 16 + g;  // rows in the tile (and r0 + 8)
        const int pcol = branch * 2 * H + j0;  // the tile's first gate column in pv (and bias)
        // Boxes b0.. (GW_STORE_BOXES of them) of value(j, half), the float2 at accumulator step j,
        // row r0 + 8 half, into the next slot, then stored at (c0, m0) of `map`.
        auto hand_off = [&](int b0, const TensorMap* map, int c0, auto value) {
            staging_acquire<GW_STAGED_BOXES / GW_STORE_BOXES - 1>(tid);
            const unsigned slot =
                hbuf + (handoffs % (GW_STAGED_BOXES / GW_STORE_BOXES)) * (GW_STORE_BOXES * TC_BM * 128);
#pragma unroll
            for (int j = 4 * b0; j < 4 * (b0 + GW_STORE_BOXES); ++j)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const float2 v = value(j, half);
                    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n"
                                 ::"r"(staged_at(slot, r0 + 8 * half, 8 * j + 2 * q - 32 * b0)), "f"(v.x), "f"(v.y)
                                 : "memory");
                }
            staging_release();
            if (tid == 0) {
#pragma unroll
                for (int b = 0; b < GW_STORE_BOXES; ++b) tma_store(map, slot + b * (TC_BM * 128), c0 + 32 * b, m0);
                asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
            }
            ++handoffs;
        };
#pragma unroll
        for (int b0 = 0; b0 < GW_BOXES; b0 += GW_STORE_BOXES) {
            if (bias != nullptr)  // the bias, in place
#pragma unroll
                for (int j = 4 * b0; j < 4 * (b0 + GW_STORE_BOXES); ++j) {
                    const int col = 8 * j + 2 * q;
                    const float2 bg = *reinterpret_cast<const float2*>(bias + pcol + col);
                    const float2 bv = *reinterpret_cast<const float2*>(bias + pcol + H + col);
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        ag[4 * j + 2 * half] += bg.x, ag[4 * j + 2 * half + 1] += bg.y;
                        av[4 * j + 2 * half] += bv.x, av[4 * j + 2 * half + 1] += bv.y;
                    }
                }
#if GW_PV_TMA
            if (m0 < pv_rows) {  // (the tensor map ends at pv_rows: TMA leaves the rows past it alone)
                hand_off(b0, &map_pv, pcol + 32 * b0, [&](int j, int half) {
                    return make_float2(ag[4 * j + 2 * half], ag[4 * j + 2 * half + 1]);
                });
                hand_off(b0, &map_pv, pcol + H + 32 * b0, [&](int j, int half) {
                    return make_float2(av[4 * j + 2 * half], av[4 * j + 2 * half + 1]);
                });
            }
#endif
            hand_off(b0, &map_h, branch * width + j0 + 32 * b0, [&](int j, int half) {
                const float g0 = ag[4 * j + 2 * half], g1 = ag[4 * j + 2 * half + 1];
                const float v0 = av[4 * j + 2 * half], v1 = av[4 * j + 2 * half + 1];
#if !GW_PV_TMA
                const int row = m0 + r0 + 8 * half;
                if (row < pv_rows) {
                    float* p = pv + (long long)row * ld_pv + pcol + 8 * j + 2 * q;
                    *reinterpret_cast<float2*>(p) = make_float2(g0, g1);
                    *reinterpret_cast<float2*>(p + H) = make_float2(v0, v1);
                }
#endif
                const int unit = j0 + 8 * j + 2 * q;
                float h0 = gate_value(g0, gate_unit(gate, branch, unit)) * v0;
                float h1 = gate_value(g1, gate_unit(gate, branch, unit + 1)) * v1;
#if GW_ROUND_H
                h0 = tf32_nearest(h0), h1 = tf32_nearest(h1);
#endif
                return make_float2(h0, h1);
            });
        }
        // The branch's augmented tail [0, ..., 0, 1], by the tiles of its last column tile.
        if (j0 + GW_BH == H && tid < TC_BM && m0 + tid < M) {
            float* p = h + (long long)(m0 + tid) * ld_h + branch * width;
            for (int c = H; c < width; ++c) p[c] = c == width - 1 ? 1.0f : 0.0f;
        }
    }
    consumers_finish(tid);
}

// wt [N, K] (row pitch ld_wt) = w [K, N] (row pitch ld_w) transposed and rounded to TF32 (to
// nearest): the GLU weights as glu_gemm reads them. 32 x 32 tiles through shared memory; blocks
// of 32 x 8 threads.
extern "C" __global__ void transpose_tile(const float* __restrict__ w, int ld_w, float* __restrict__ wt, int ld_wt,
                                          int K, int N)
{
    __shared__ float tile[32][33];
    const int k0 = blockIdx.y * 32, n0 = blockIdx.x * 32;
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int k = k0 + i, n = n0 + threadIdx.x;
        tile[i][threadIdx.x] = k < K && n < N ? w[(long long)k * ld_w + n] : 0.0f;
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int n = n0 + i, k = k0 + threadIdx.x;
        if (n < N && k < K) {
            unsigned v = __float_as_uint(tile[threadIdx.x][i]);
            asm("cvt.rna.tf32.f32 %0, %0;\n" : "+r"(v));
            wt[(long long)n * ld_wt + k] = __uint_as_float(v);
        }
    }
}
