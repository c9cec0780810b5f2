// The GLU layer's backward from its output's gradient, for the branches whose output feeds an
// advantage head: dh = dadv Wo^T on the TF32 tensor cores (Hopper wgmma, operands brought in by
// TMA), then the gate's backward in the GEMM's epilogue, written over the pre-activations.
// foxhunt: arch-specific (compiled for sm_90a: wgmma exists there only)
//
// NumPy twin: foxhunt_core/gpu/reference.py glu_backward_gemm (dh = dadv Wo^T, then glu_backward).
//
//   for each branch b of the launch (up to GB_SETS):
//     dh_b = dadv_b Wo_b^T     dadv_b [M, K] (the head's gradient, K = its padded width);
//                              Wo_b [H, K] (the head's weights, as the layer holds them: its rows are
//                              dh's columns, K-major as wgmma reads them; rounded to TF32 by the caller)
//     pv [M, blocks 2H]: branch b's [gate | value] pre-activations at 2 H b, replaced by
//     [dh v gate'(x) | dh gate(x)], x the gate's pre-activation, v the value, the gate gate.cuh's
//     fragment (the sigmoid: [dh v s (1 - s) | dh s], s = sigmoid(x), glu_backward's arithmetic)
//     reading branch b's parameters from gate.p[b]; with a gate of parameters (GATE_TERMS > 0),
//     gate_partial: each CTA's share of its column tile's units' parameter gradients (below)
//
// Why: the backward otherwise writes dh [M, blocks H] from cuBLAS's GEMM and glu_backward reads it
// back with pv and writes pv's gradient: dh's round trip through memory is a third of that traffic.
// Here a tile (TC_BM = 128 rows x GB_BH = 128 GLU columns of one branch) computes its dh in the
// accumulators (K = 156: five 32-column chunks, dadv's rounded to TF32 in shared memory as they
// arrive), while a loader warp brings the tile's gate and value pre-activations (8 boxes of
// 32 columns x 128 rows: 128 KiB) into a staging buffer; the epilogue turns them into their
// gradients in place there, and a storer warp sends them over pv by TMA. The buffer goes in four
// parts (a gate box and its value box), each with its barriers (loaded, gradients written, stored),
// so that the next tile's pre-activations come in while this tile's gradients go out: the kernel is
// bound by memory (pv in, its gradient out), and a single buffer (one barrier pair) would leave the
// memory idle during each epilogue (BENCHMARKS.md, "where the time goes"). Built on tc_gemm.cuh (the ring, the schedule without
// clusters, consume_tile). What it saves is dh's write and read.
//
// With GB_NQ > 0, the tiles of branch `dq_set` also take dq [M, GB_NQ] += dpv_set Wq^T (Wq [GB_NQ, 2H]:
// the weights by which the layer's input columns that carry the direction branch's Q reach this
// branch's [gate | value] pre-activations): the pre-activation gradients are in registers here, and
// a separate product would read them back from memory. Each thread adds its
// elements' share in FP32 (no TF32 rounding), the four lanes of a row's quad add theirs, and one
// lane adds the tile's sum to dq with an atomic add. With at most two column tiles per branch
// (H <= 256) and dq zeroed first, the sum is exact to the order: 0 + a + b = 0 + b + a.
//
// The gate's parameter gradients (GATE_TERMS > 0): each element's terms are summed in registers
// over the thread's two rows, then over the 8 lanes that share its columns by shuffles, half a
// part at a time (each lane keeps one column of the part's eight, with all its terms), and into
// accumulators that the lane keeps over every tile of the kernel: with a grid that is a multiple
// of the column tiles (the wrapper's), a CTA's tiles are all of one column tile. At the end every
// warp writes its sums, [CTA][warp][term][column of the tile], and gate_terms_reduce (gate_glu.cu)
// adds them up in a fixed order: the same bits on every run, no atomics.
//
// Requirements (checked by the wrapper, foxhunt_core/gpu/kernels.py glu_backward_gemm): the tensor
// maps describe dadv_b [M, K] and Wo_b [H, K] with boxes of 32 columns x 128 rows and pv
// [M, blocks 2H] with boxes of 32 columns x 128 rows, 128-byte swizzle; H a multiple of 128.

#include "activation.cuh"
#include "gate.cuh"
#include "tc_gemm.cuh"

// GB_BH (GLU columns per tile: the wgmma's N), GB_SETS (branches per launch), GB_PARTS (the
// staging buffer's parts: a gate box and its value box), GB_THREADS (the consumers and a whole
// warpgroup: the ring's loader, pv's loader, its storer and an idle warp; setmaxnreg works per
// warpgroup), GB_NQ_MAX, and the variant settings GB_STAGES, GB_NQ (dq's columns, 0:
// no dq), GB_TAIL_STEPS: defines.cuh
#define GB_STAGE (TC_TILE_A + GB_BH * TC_BK * 4) // 16 KiB of dadv and 16 KiB of Wo per stage
#define GB_BOX (TC_BM * 128)                     // 16 KiB: 32 columns x 128 rows
#define GB_TILE_PV (2 * GB_PARTS * GB_BOX)       // 128 KiB (+ 3 stages: 224 KiB of the 227 a block may have)
static_assert(GB_PARTS == GB_BH / 32 && GB_THREADS == TC_THREADS - 32 + 128, "glu_backward_gemm's parts and warps");
static_assert(GB_NQ >= 0 && GB_NQ <= GB_NQ_MAX, "dq takes up to GB_NQ_MAX columns");
static_assert(GATE_TERMS <= GB_GATE_TERMS_MAX, "the gate's parameter-gradient sums take up to GB_GATE_TERMS_MAX terms");
static_assert(GB_STAGES >= 3, "consume_tile awaits the next stage before it releases the previous one");

#if GATE_TERMS > 0
// Half a part's terms (4 columns: k = 2 (jj - 2 h) + c, GLU column 8 jj + 2 q + c of the part)
// summed over the 8 lanes of this q (lane bits 4, 3, 2 are g's bits 2, 1, 0): a reduce-scatter
// over bits 2 and 1 leaves lane g column k = 2 (g >> 2 & 1) + (g >> 1 & 1) of the 4, the last
// step (bit 0) sums that column over the lane pair, and the lane with g % 2 == h keeps it: lane g
// owns column 8 (2 (g % 2) + (g >> 2 & 1)) + 2 q + (g >> 1 & 1) of every part (gate_own_column).
__device__ __forceinline__ void gate_terms_scatter(const float (&pt)[4][GATE_TERMS], float (&own)[GATE_TERMS], int g,
                                                   int h) {
    const int hi = (g >> 2) & 1, mid = (g >> 1) & 1;
    float r2[2][GATE_TERMS];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int t = 0; t < GATE_TERMS; ++t) {
            const float keep = hi ? pt[2 + i][t] : pt[i][t], give = hi ? pt[i][t] : pt[2 + i][t];
            r2[i][t] = keep + __shfl_xor_sync(0xffffffffu, give, 16);
        }
#pragma unroll
    for (int t = 0; t < GATE_TERMS; ++t) {
        const float keep = mid ? r2[1][t] : r2[0][t], give = mid ? r2[0][t] : r2[1][t];
        const float mine = keep + __shfl_xor_sync(0xffffffffu, give, 8);
        const float pair = mine + __shfl_xor_sync(0xffffffffu, mine, 4);
        if ((g & 1) == h) own[t] += pair;
    }
}

// The column of each part whose sums lane g of quad q owns (gate_terms_scatter).
__device__ __forceinline__ int gate_own_column(int g, int q) {
    return 8 * (2 * (g & 1) + ((g >> 2) & 1)) + 2 * q + ((g >> 1) & 1);
}
#endif

#if GATE_LONG
// a[i] = a[(i + S) % N], in registers (every index a constant).
template <int N, int S>
__device__ __forceinline__ void rotate_down(float* a) {
    float first[S];
#pragma unroll
    for (int i = 0; i < S; ++i) first[i] = a[i];
#pragma unroll
    for (int i = 0; i < N - S; ++i) a[i] = a[i + S];
#pragma unroll
    for (int i = 0; i < S; ++i) a[N - S + i] = first[i];
}
#endif

// Every branch's tensor maps and pv's, passed by value (__grid_constant__): a captured graph keeps
// its own copy.
struct __align__(64) GluBackArgs {
    TensorMap dadv[GB_SETS], wo[GB_SETS], pv;
};

// The pv columns of part x (0..GB_PARTS-1: gate boxes; GB_PARTS..: value boxes) of a tile.
__device__ __forceinline__ int part_col(int x, int b, int j0, int H) {
    return 2 * H * b + (x < GB_PARTS ? 0 : H) + j0 + 32 * (x % GB_PARTS);
}

extern "C" __global__ void __launch_bounds__(GB_THREADS, 1) __cluster_dims__(1, 1, 1)
glu_backward_gemm(const __grid_constant__ GluBackArgs args, int M, int K, int H, int blocks,
                  float* __restrict__ dq, int ld_dq, const float* __restrict__ wq, int ld_wq, int dq_set,
                  const __grid_constant__ GateArgs gate, float* __restrict__ gate_partial)
{
    extern __shared__ unsigned char smem_raw[];
    unsigned stg;  // the tile's pre-activations, then their gradients: part x's gate box at x, value box at x + GB_PARTS
    Ring ring = ring_layout(smem_raw, GB_STAGES, GB_STAGE, GB_TILE_PV, stg);
    // Per part: loaded (`full`), its gradients written (`ready`), stored (`empty`).
    const unsigned full = ring.empty + 8 * GB_STAGES, ready = full + 8 * GB_PARTS, empty = ready + 8 * GB_PARTS;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int per_branch = H / GB_BH;
    const Schedule<1> sched(M, K, blocks * per_branch);
    if (tid == 0)
        for (int x = 0; x < GB_PARTS; ++x) {
            mbar_init(full + 8 * x, 1);                   // the loader's arrival (and the boxes' bytes)
            mbar_init(ready + 8 * x, TC_CONSUMER_WARPS);  // every consumer warp's
            mbar_init(empty + 8 * x, 1);                  // the storer's, once the stores have read the part
        }
    ring_init(ring, 1, tid);  // (its fence and barrier cover the inits above)

    if (warp >= TC_CONSUMER_WARPS) {
        // The producer warpgroup gives its registers up to the consumers (40 each; the consumers
        // take 232: the 384 threads' 168 each as launched, 64512 of the SM's 65536 in all): with a
        // gate of parameters the epilogue keeps its terms' sums beside the accumulators, which
        // spilled at 168. Three of its warps work, a lane each (the fourth idles): dadv's and Wo's
        // chunks into the ring; each tile's gate and value pre-activations into the staging
        // buffer, part by part as the previous tile's gradients have left it (a fresh barrier
        // passes parity 1); those gradients out by TMA stores.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (lane == 0) {
            unsigned phase = 0;
            for (int p = sched.cluster; p < sched.groups; p += sched.clusters, phase ^= 1) {
                const int ct = sched.col_tile(p), m0 = sched.row0(p);
                const int b = ct / per_branch, j0 = (ct % per_branch) * GB_BH;
                if (warp == TC_CONSUMER_WARPS) {
                    for (int kc = 0; kc < sched.chunks; ++kc, ring.advance()) {
                        const unsigned bar = ring_acquire(ring), sa = ring.at();
                        tma_load(sa, &args.dadv[b], bar, kc * TC_BK, m0);
                        tma_load(sa + TC_TILE_A, &args.wo[b], bar, kc * TC_BK, j0);
                    }
                } else if (warp == TC_CONSUMER_WARPS + 1) {
                    for (int x = 0; x < GB_PARTS; ++x) {
                        mbar_wait(empty + 8 * x, phase ^ 1);
                        mbar_expect_bytes(full + 8 * x, 2 * GB_BOX);
                        tma_load(stg + x * GB_BOX, &args.pv, full + 8 * x, part_col(x, b, j0, H), m0);
                        tma_load(stg + (x + GB_PARTS) * GB_BOX, &args.pv, full + 8 * x,
                                 part_col(x + GB_PARTS, b, j0, H), m0);
                    }
                } else if (warp == TC_CONSUMER_WARPS + 2) {
                    for (int x = 0; x < GB_PARTS; ++x) {
                        mbar_wait(ready + 8 * x, phase);
                        tma_store(&args.pv, stg + x * GB_BOX, part_col(x, b, j0, H), m0);
                        tma_store(&args.pv, stg + (x + GB_PARTS) * GB_BOX, part_col(x + GB_PARTS, b, j0, H), m0);
                        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                        asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
                        mbar_arrive_cluster(empty + 8 * x, 0);
                    }
                }
            }
            if (warp == TC_CONSUMER_WARPS + 2) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
        }
        __syncwarp();
        cluster_sync();
        return;
    }

    // The consumers.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int wg = warp >> 2;  // this warpgroup's 64 rows of the tile
    const int g = lane >> 2, q = lane & 3;
    unsigned phase = 0;
    float acc[GB_BH / 2];
#if GATE_TERMS > 0
    // The gate's parameter-gradient sums this lane keeps: part x's column gate_own_column(g, q).
    float own[GB_PARTS][GATE_TERMS];
#pragma unroll
    for (int x = 0; x < GB_PARTS; ++x)
#pragma unroll
        for (int t = 0; t < GATE_TERMS; ++t) own[x][t] = 0.0f;
#endif
#if GB_NQ > 0
    // Wq's weights at this tile's columns, spread over the lanes: the 16 (part, jj) steps of the
    // epilogue each need 4 GB_NQ weights (gate and value, two columns, per dq column), the same for
    // the lanes of one q; lane (g, q) holds those of steps 2 g and 2 g + 1 and the others take them
    // by shuffles. Loaded when the tile's column tile changes (with a grid that is a multiple of the
    // column tiles, once): loads from global memory in the epilogue would wait behind the kernel's
    // own traffic.
    float wl[8 * GB_NQ];
    int w_tile = -1;
#endif
    for (int p = sched.cluster; p < sched.groups; p += sched.clusters, phase ^= 1) {
        const int ct = sched.col_tile(p), m0 = sched.row0(p);
        const int b = ct / per_branch, j0 = (ct % per_branch) * GB_BH;
#if GB_NQ > 0
        const bool with_q = b == dq_set;
        if (with_q && ct != w_tile) {
            w_tile = ct;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int step = 2 * g + h, col = j0 + 32 * (step / 4) + 8 * (step % 4) + 2 * q;
#pragma unroll
                for (int i = 0; i < GB_NQ; ++i) {
                    const float* w = wq + (size_t)i * ld_wq + col;
                    float* o = wl + 4 * GB_NQ * h + 4 * i;
                    o[0] = __ldg(w), o[1] = __ldg(w + 1), o[2] = __ldg(w + H), o[3] = __ldg(w + H + 1);
                }
            }
        }
        float dqs[2][GB_NQ];  // this thread's share of dq at rows r0 and r0 + 8
#pragma unroll
        for (int i = 0; i < 2 * GB_NQ; ++i) dqs[i / GB_NQ][i % GB_NQ] = 0.0f;
#endif
        consume_tile<GB_BH, GB_TAIL_STEPS, 1>(acc, ring, sched.chunks, 0, wg, lane, tid & 127);

        // Epilogue (the accumulators' layout: wgmma_tf32): element 4 j + e is dh at row r0 (+ 8 for
        // e >= 2), GLU column 8 j + 2 q (+ 1 for odd e) of the tile, in part j / 4; its gate and
        // value wait in that part's boxes (staged_at), where their gradients go.
        const int r0 = wg * 64 + (warp & 3) * 16 + g;
        // With a long gate (GATE_LONG, gate.cuh) the loop over the parts stays a loop: the part's
        // accumulators and sums are rotated into acc[0 ..] and own[0] instead (xs, a constant), so
        // that the kernel's code holds one part's epilogue, not four (kan_gate's four unrolled
        // took 170 KiB and the warps waited on instruction fetches for 42 % of their time).
#if GATE_LONG
#pragma unroll 1
#else
#pragma unroll
#endif
        for (int x = 0; x < GB_PARTS; ++x) {
            const int xs = GATE_LONG ? 0 : x;  // the part's place in acc (4 xs + jj) and own
            mbar_wait(full + 8 * x, phase);
            const unsigned gates = stg + x * GB_BOX, values = stg + (x + GB_PARTS) * GB_BOX;
#if GB_NQ > 0
            float dvk[4][2][2];  // the part's value gradients, kept for dq (its gate gradients go over dh in acc)
#endif
#if GATE_TERMS > 0
            float pt[4][GATE_TERMS];  // parameter-gradient terms of half the part: column 8 (jj0 + k / 2) + 2 q + k % 2
#endif
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int j = 4 * xs + jj, col = 8 * jj + 2 * q;  // (col within the part's boxes)
#if GATE_TERMS > 0
                if (jj % 2 == 0)
#pragma unroll
                    for (int k = 0; k < 4; ++k)
#pragma unroll
                        for (int t = 0; t < GATE_TERMS; ++t) pt[k][t] = 0.0f;
#endif
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const unsigned ag = staged_at(gates, r0 + 8 * half, col);
                    const unsigned av = staged_at(values, r0 + 8 * half, col);
                    float g0, g1, v0, v1;
                    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(g0), "=f"(g1) : "r"(ag));
                    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v0), "=f"(v1) : "r"(av));
                    const float dh0 = acc[4 * j + 2 * half], dh1 = acc[4 * j + 2 * half + 1];
                    const int unit = j0 + 32 * x + col;
                    float s0, s1, t0[GATE_TERM_SLOTS], t1[GATE_TERM_SLOTS];
                    const float dg0 = gate_backward(g0, gate_unit(gate, b, unit), dh0, v0, &s0, t0);
                    const float dg1 = gate_backward(g1, gate_unit(gate, b, unit + 1), dh1, v1, &s1, t1);
                    const float dv0 = dh0 * s0, dv1 = dh1 * s1;
#if GATE_TERMS > 0
                    // Rows past M (TMA's zero fill: dh, x and v all 0) add terms of 0 (gate.cuh: terms
                    // are 0 where dh is), so the sums take every row without a branch, which would
                    // keep the compiler from fusing a fragment's products into these additions.
#pragma unroll
                    for (int t = 0; t < GATE_TERMS; ++t)
                        pt[2 * (jj % 2)][t] += t0[t], pt[2 * (jj % 2) + 1][t] += t1[t];
#endif
                    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(ag), "f"(dg0), "f"(dg1) : "memory");
                    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(av), "f"(dv0), "f"(dv1) : "memory");
#if GB_NQ > 0
                    acc[4 * j + 2 * half] = dg0, acc[4 * j + 2 * half + 1] = dg1;
                    dvk[jj][half][0] = dv0, dvk[jj][half][1] = dv1;
#endif
                }
#if GATE_TERMS > 0
                if (jj % 2 == 1) gate_terms_scatter(pt, own[xs], g, jj / 2);
#endif
            }
            // The part's gradients visible to the TMA unit, then the warp's arrival for the storer.
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncwarp();
            if (lane == 0) mbar_arrive_cluster(ready + 8 * x, 0);
#if GB_NQ > 0
            // The part's share of dq once its gradients are on their way out: the kernel is bound by
            // each part's round of load, epilogue and store, and dq's arithmetic inside the epilogue
            // would lengthen that round; here it overlaps the store.
            if (with_q)
#pragma unroll
                for (int jj = 0; jj < 4; ++jj) {
                    const int j = 4 * xs + jj, step = 4 * x + jj;
                    float w[4 * GB_NQ];  // Wq's weights at this thread's two GLU columns of the step, from lane (step / 2, q)
#pragma unroll
                    for (int k = 0; k < 4 * GB_NQ; ++k)
                        w[k] = __shfl_sync(0xffffffffu, wl[4 * GB_NQ * (step % 2) + k], 4 * (step / 2) + q);
#pragma unroll
                    for (int half = 0; half < 2; ++half)
#pragma unroll
                        for (int i = 0; i < GB_NQ; ++i)
                            dqs[half][i] += acc[4 * j + 2 * half] * w[4 * i] + acc[4 * j + 2 * half + 1] * w[4 * i + 1]
                                            + dvk[jj][half][0] * w[4 * i + 2] + dvk[jj][half][1] * w[4 * i + 3];
                }
#endif
#if GATE_LONG
            // the next part's accumulators into acc[0 .. 15], its sums into own[0] (four turns:
            // both as they were, for the next tile)
            rotate_down<GB_BH / 2, 16>(acc);
#if GATE_TERMS > 0
            rotate_down<GB_PARTS * GATE_TERMS, GATE_TERMS>(&own[0][0]);
#endif
#endif
        }
#if GB_NQ > 0
        if (with_q)  // (uniform over the warp: the quads' shuffles may run)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = m0 + r0 + 8 * half;
#pragma unroll
                for (int i = 0; i < GB_NQ; ++i) {
                    float v = dqs[half][i];
                    v += __shfl_xor_sync(0xffffffffu, v, 1);
                    v += __shfl_xor_sync(0xffffffffu, v, 2);
                    if (q == 0 && row < M) atomicAdd(dq + (size_t)row * ld_dq + i, v);
                }
            }
#endif
    }
#if GATE_TERMS > 0
    // This warp's sums over the CTA's tiles: [CTA][warp][term][column of the tile] (for each part
    // and term the warp's lanes own the part's 32 columns: one 128-byte store).
    // The fragment's terms mapped to gradients first where they are in another basis (gate.cuh).
    float* o = gate_partial + ((long long)blockIdx.x * TC_CONSUMER_WARPS + warp) * GATE_TERMS * GB_BH;
#pragma unroll
    for (int x = 0; x < GB_PARTS; ++x) {
        gate_terms_grads(own[x]);
#pragma unroll
        for (int t = 0; t < GATE_TERMS; ++t) o[t * GB_BH + 32 * x + gate_own_column(g, q)] = own[x][t];
    }
#endif
    cluster_sync();
}

// out [rows, cols] (row pitch ld_out) = x (row pitch ld_x) rounded to TF32, to nearest: the heads'
// weights as glu_backward_gemm reads them. A thread per element.
extern "C" __global__ void round_tf32(const float* __restrict__ x, int ld_x, float* __restrict__ out, int ld_out,
                                     int rows, int cols)
{
    const long long total = (long long)rows * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int r = (int)(i / cols), c = (int)(i - (long long)r * cols);
        out[(size_t)r * ld_out + c] = tf32_nearest(x[(size_t)r * ld_x + c]);
    }
}
