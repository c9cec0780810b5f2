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
//   h = sigmoid(gate) * value, augmented per branch: [h, 0, ..., 0, 1], `width` columns
//   pv itself is written as well for the rows below pv_rows (the backward recomputes the gate
//   and the value from it); the other rows' pre-activations never leave the chip.
//
// Persistent, warp-specialized, in clusters: one block per SM; a tile is GW_BM = 128 rows x GW_BH
// = 128 GLU columns of one branch (its 128 gate and 128 value columns of W). The GW_CLUSTER CTAs of
// a cluster take consecutive row tiles of one column tile together ("a group"); clusters walk the
// groups cluster, + clusters, ..., consecutive groups the column tiles of the same rows (u's rows
// are read from L2 by all of them; the weights stay there). Each CTA loads 1 / GW_CLUSTER of the
// tile's weight rows for all of them (TMA multicast): the weights' share of the L2 traffic, two
// thirds of it without, is divided by GW_CLUSTER.
//   * Warp 8, the producer: one lane streams each tile's k chunks (32 of K: one 128-byte row of
//     u and of wt) with TMA into a ring of GW_STAGES shared-memory stages (u's 128 rows, wt's 128
//     gate and 128 value rows, 48 KiB), 128-byte swizzled. A stage's `full` mbarrier counts its
//     bytes in (its own rows and the other CTAs' multicast ones); its `empty` mbarrier, released
//     by the consumer warps of every CTA of the cluster, is awaited before it is refilled.
//   * Warps 0-7, two consumer warpgroups of 64 rows each: per chunk they wait for `full`, issue
//     one wgmma m64n256k8 per k step of 8 over the gate and the value rows of wt at once, whose
//     accumulators pair up (a gate element and its value are held by the same thread: the
//     epilogue needs no exchange), and
//     release the previous chunk's stage once its wgmmas are done. After a tile's last chunk
//     comes the epilogue, while the producer already loads the next tile.
// TMA fills the parts of a box past M rows or K columns with zeros; the last chunk's k steps wholly
// past K are not issued (GW_TAIL_STEPS, set by the wrapper from K: K = 260 runs one of the four).
// Both operands are rounded to TF32 to nearest before the products, as cuBLAS rounds them (wgmma
// alone would drop the low 13 mantissa bits, a bias toward zero): the weights by transpose_tile,
// each stage's rows of u in shared memory by the warpgroup that reads them, while its previous
// products run, except the chunks wholly within u's first `rounded_k` columns, which u's writer
// rounded already (the network's z, written rounded by vsn_forward: rounding in shared memory took
// a fifth of this kernel's time, on shared-memory bandwidth the products need).
//
// Requirements (checked by the wrapper, foxhunt_core/gpu/kernels.py glu_gemm): the tensor maps
// describe u [M, K], wt [blocks 2H, K] and h [M, blocks width] with boxes of 32 columns x 128
// rows (wt: 128 / GW_CLUSTER rows), 128-byte swizzle; H a multiple of 128; ld_h, ld_pv even; h, pv
// and bias 8-byte aligned.

// sigmoid(x) = 1 / (1 + e^-x) with the fast exponential and reciprocal (MUFU): a few instructions
// against about forty of the exact expf and division, which made the epilogue, not the tensor
// cores, this kernel's bottleneck. Relative error a few 1e-7 (|x| < 20; e^-x overflowing to inf
// gives 0, as it should).
__device__ __forceinline__ float fast_sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

#define GW_BM 128                                // rows per tile (two warpgroups of 64)
#define GW_BH 128                                // GLU columns per tile
#define GW_BK 32                                 // k per stage: one 128-byte swizzle row
#ifndef GW_STAGES
#define GW_STAGES 3
#endif
#ifndef GW_TAIL_STEPS
#define GW_TAIL_STEPS 4                          // k steps of 8 of the last chunk: (K - 1) % 32 / 8 + 1
#endif
#ifndef GW_CLUSTER
#define GW_CLUSTER 2                             // CTAs per cluster: row tiles sharing one weight load
#endif
#define GW_BR (GW_BH / GW_CLUSTER)               // gate (and value) rows of wt each CTA loads for all
#define GW_CONSUMER_WARPS 8
#define GW_THREADS (32 * GW_CONSUMER_WARPS + 32)  // + the producer warp
#define GW_TILE_A (GW_BM * GW_BK * 4)            // 16 KiB of u per stage
#define GW_TILE_B (2 * GW_BH * GW_BK * 4)        // 32 KiB of wt: the gate rows, then the value rows
#define GW_STAGE (GW_TILE_A + GW_TILE_B)
#define GW_TILE_H (GW_BM * GW_BH * 4)            // 64 KiB: the tile's h, staged for the TMA store

// A CUtensorMap (the driver's opaque 128-byte TMA descriptor), passed by value.
struct __align__(64) TensorMap { unsigned long long opaque[16]; };

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Wait until the phase of parity `parity` of the mbarrier at `bar` has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(bar), "r"(parity) : "memory");
}

// Arrive on the mbarrier at `bar` (a shared-memory address of this CTA) in the cluster's CTA `rank`.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned rank) {
    asm volatile(
        "{\n"
        ".reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
        "}\n" ::"r"(bar), "r"(rank) : "memory");
}

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

// Every thread of every CTA of the cluster.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_expect_bytes(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// The box at (column c0, row c1) of the tensor `map` into shared memory at `dst`; its bytes
// complete on the mbarrier `bar`.
__device__ __forceinline__ void tma_load(unsigned dst, const TensorMap* map, unsigned bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
        ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1) : "memory");
}

// The same box into shared memory at `dst` of every CTA in `mask` (and their mbarriers at `bar`).
__device__ __forceinline__ void tma_load_multicast(unsigned dst, const TensorMap* map, unsigned bar, int c0, int c1,
                                                   unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%4, %5}], [%2], %3;\n"
        ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "h"(mask), "r"(c0), "r"(c1)
        : "memory");
}

// The box at (column c0, row c1) of the tensor `map` from shared memory at `src` (parts past the
// tensor are not written), in the thread's current bulk group.
__device__ __forceinline__ void tma_store(const TensorMap* map, unsigned src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
                 ::"l"(reinterpret_cast<unsigned long long>(map)), "r"(src), "r"(c0), "r"(c1) : "memory");
}

// Round the 64 rows of u that warpgroup `wg` reads from the stage at `stage_base` to TF32, to
// nearest (cvt.rna), in place: the tensor cores would drop the low 13 mantissa bits, a bias
// toward zero that cuBLAS's TF32 GEMMs do not have. The weights come rounded (transpose_tile).
// Then the async proxy (wgmma) may read them once the warpgroup has passed its barrier.
__device__ __forceinline__ void round_rows_tf32(unsigned stage_base, int wg, int lt) {
    const unsigned rows = stage_base + wg * 64 * 128;  // 8 KiB: 512 16-byte chunks, 4 per thread
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned at = rows + (lt + 128 * i) * 16;
        unsigned a, b, c, d;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(at));
        asm("cvt.rna.tf32.f32 %0, %0;\n" : "+r"(a));
        asm("cvt.rna.tf32.f32 %0, %0;\n" : "+r"(b));
        asm("cvt.rna.tf32.f32 %0, %0;\n" : "+r"(c));
        asm("cvt.rna.tf32.f32 %0, %0;\n" : "+r"(d));
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The 128 threads of consumer warpgroup `wg` (named barrier 2 + wg).
__device__ __forceinline__ void warpgroup_sync(int wg) { asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory"); }

// The 256 consumer threads (named barrier 1).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(32 * GW_CONSUMER_WARPS) : "memory"); }

// The matrix descriptor of a K-major tile with the 128-byte swizzle starting at `addr` (a
// shared-memory address; the tile's 1024-byte swizzle atoms aligned to 1024 bytes).
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4)  // start address
           | (1ull << 16)                               // leading byte offset (unused: K fits the swizzle row)
           | ((unsigned long long)(1024 >> 4) << 32)    // stride byte offset: 8 rows x 128 bytes
           | (1ull << 62);                              // 128-byte swizzle
}

// d (m64 x n256, this thread's 128 floats) += A B over one k step of 8: B's 256 rows are the tile's
// 128 gate rows of wt, then its 128 value rows (one A read for both).
__device__ __forceinline__ void wgmma_m64n256k8(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(a), "l"(b));
}

// One chunk's products, STEPS k steps of 8 (a compile-time count: wgmma under a run-time condition
// would be serialized), committed as one group.
template <int STEPS>
__device__ __forceinline__ void chunk_products(float* acc, unsigned sa, unsigned sb) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int s = 0; s < STEPS; ++s) wgmma_m64n256k8(acc, sw128_desc(sa + 32 * s), sw128_desc(sb + 32 * s));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

extern "C" __global__ void __launch_bounds__(GW_THREADS, 1) __cluster_dims__(GW_CLUSTER, 1, 1)
glu_gemm(const __grid_constant__ TensorMap map_u, const __grid_constant__ TensorMap map_wt,
         const __grid_constant__ TensorMap map_h, const float* __restrict__ bias,
         float* __restrict__ h, int ld_h,
         float* __restrict__ pv, int ld_pv, int pv_rows,
         int M, int K, int H, int width, int blocks, int rounded_k)
{
    extern __shared__ unsigned char smem_raw[];
    const unsigned base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms 1024-byte aligned
    const unsigned hbuf = base + GW_STAGES * GW_STAGE;  // 1024-byte aligned too
    const unsigned full = hbuf + GW_TILE_H, empty = full + 8 * GW_STAGES;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int per_branch = H / GW_BH, col_tiles = blocks * per_branch;
    // A cluster takes GW_CLUSTER consecutive row tiles of one column tile at a time ("a group").
    const int groups = col_tiles * ((M + GW_BM * GW_CLUSTER - 1) / (GW_BM * GW_CLUSTER));
    const int cluster = blockIdx.x / GW_CLUSTER, clusters = gridDim.x / GW_CLUSTER;
    const int rank = (int)cluster_rank();
    const int chunks = (K + GW_BK - 1) / GW_BK;

    if (tid == 0) {
        for (int s = 0; s < GW_STAGES; ++s) {
            mbar_init(full + 8 * s, 1);  // the producer's arrival (+ the bytes)
            mbar_init(empty + 8 * s, GW_CONSUMER_WARPS * GW_CLUSTER);  // every consumer warp of the cluster
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    cluster_sync();  // every CTA's barriers are ready before any multicast reaches them

    if (warp == GW_CONSUMER_WARPS) {  // the producer
        if (lane == 0) {
            int stage = 0;
            unsigned phase = 0;
            for (int p = cluster; p < groups; p += clusters) {
                const int ct = p % col_tiles, m0 = ((p / col_tiles) * GW_CLUSTER + rank) * GW_BM;
                const int gate0 = (ct / per_branch) * 2 * H + (ct % per_branch) * GW_BH;
                for (int kc = 0; kc < chunks; ++kc) {
                    // Free in every CTA of the cluster (this CTA's rows of wt go to all of them).
                    mbar_wait(empty + 8 * stage, phase ^ 1);  // (a fresh barrier passes parity 1)
                    const unsigned sa = base + stage * GW_STAGE, sb = sa + GW_TILE_A, bar = full + 8 * stage;
                    mbar_expect_bytes(bar, GW_STAGE);
                    tma_load(sa, &map_u, bar, kc * GW_BK, m0);
#if GW_CLUSTER > 1
                    const unsigned short all = (unsigned short)((1u << GW_CLUSTER) - 1);
                    tma_load_multicast(sb + rank * GW_BR * 128, &map_wt, bar, kc * GW_BK, gate0 + rank * GW_BR, all);
                    tma_load_multicast(sb + (GW_BH + rank * GW_BR) * 128, &map_wt, bar, kc * GW_BK,
                                       gate0 + H + rank * GW_BR, all);
#else
                    tma_load(sb, &map_wt, bar, kc * GW_BK, gate0);
                    tma_load(sb + GW_BH * 128, &map_wt, bar, kc * GW_BK, gate0 + H);
#endif
                    if (++stage == GW_STAGES) {
                        stage = 0;
                        phase ^= 1;
                    }
                }
            }
        }
        __syncwarp();
        cluster_sync();  // no CTA leaves while another may still write into it
        return;
    }

    // The consumers.
    const int wg = warp >> 2;  // this warpgroup's 64 rows of the tile
    const int g = lane >> 2, q = lane & 3;
    int stage = 0, last = 0;
    unsigned phase = 0;
    // Accumulators: element 4j + e is column 8j + .. of the 256 (gate columns, then value columns),
    // so a gate element and its value element (same row, same GLU column) are GW_BH / 2 apart.
    float acc[GW_BH];
    float* const ag = acc;
    float* const av = acc + GW_BH / 2;
    for (int p = cluster; p < groups; p += clusters) {
        const int ct = p % col_tiles, m0 = ((p / col_tiles) * GW_CLUSTER + rank) * GW_BM;
        const int branch = ct / per_branch, j0 = (ct % per_branch) * GW_BH;
#pragma unroll
        for (int i = 0; i < GW_BH; ++i) acc[i] = 0.0f;
        // Each chunk's rows of u are rounded (unless u's writer did) while the previous chunk's
        // products run.
        mbar_wait(full + 8 * stage, phase);
        if (GW_BK > rounded_k) {
            round_rows_tf32(base + stage * GW_STAGE, wg, tid & 127);
            warpgroup_sync(wg);
        }
        // After chunk kc's products are issued: the next chunk's stage awaited (and rounded), the
        // previous chunk's stage released once its products are done.
        auto advance = [&](int kc) {
            if (kc + 1 < chunks) {
                const int next = stage + 1 == GW_STAGES ? 0 : stage + 1;
                mbar_wait(full + 8 * next, next == 0 ? phase ^ 1 : phase);
                if ((kc + 2) * GW_BK > rounded_k) {
                    round_rows_tf32(base + next * GW_STAGE, wg, tid & 127);
                    warpgroup_sync(wg);
                }
            }
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // the previous chunk's are done
            if (kc > 0 && lane < GW_CLUSTER) mbar_arrive_cluster(empty + 8 * last, lane);
            last = stage;
            if (++stage == GW_STAGES) {
                stage = 0;
                phase ^= 1;
            }
        };
        const unsigned rows_u = wg * 64 * 128;  // this warpgroup's rows of u in a stage
        int kc = 0;
        for (; kc + 1 < chunks; ++kc) {
            chunk_products<GW_BK / 8>(acc, base + stage * GW_STAGE + rows_u, base + stage * GW_STAGE + GW_TILE_A);
            advance(kc);
        }
        chunk_products<GW_TAIL_STEPS>(acc, base + stage * GW_STAGE + rows_u, base + stage * GW_STAGE + GW_TILE_A);
        advance(kc);
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (lane < GW_CLUSTER) mbar_arrive_cluster(empty + 8 * last, lane);  // (in every CTA: lane r in CTA r)

        // Epilogue. Accumulator element 4j + e of a thread (warp w of its warpgroup, lane 4g + q):
        // row 16w + g (+ 8 for e >= 2), column 8j + 2q (+ 1 for odd e).
        // h goes through shared memory (hbuf: four boxes of 32 columns x 128 rows, 128-byte swizzled
        // as the tensor map says) and leaves by TMA stores, which proceed while the next tile's
        // products run; pv, for the rows that keep it, is stored from the registers.
        const int r0 = wg * 64 + (warp & 3) * 16 + g;  // rows in the tile (and r0 + 8)
        const int pcol = branch * 2 * H + j0;  // the tile's first gate column in pv (and bias)
        if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // hbuf read out
        consumers_sync();
#pragma unroll
        for (int j = 0; j < GW_BH / 8; ++j) {
            const int col = 8 * j + 2 * q;
            float2 bg = make_float2(0.0f, 0.0f), bv = bg;
            if (bias != nullptr) {
                bg = *reinterpret_cast<const float2*>(bias + pcol + col);
                bv = *reinterpret_cast<const float2*>(bias + pcol + H + col);
            }
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = r0 + 8 * half, row = m0 + r;
                const float g0 = ag[4 * j + 2 * half] + bg.x, g1 = ag[4 * j + 2 * half + 1] + bg.y;
                const float v0 = av[4 * j + 2 * half] + bv.x, v1 = av[4 * j + 2 * half + 1] + bv.y;
                if (row < pv_rows) {
                    float* p = pv + (long long)row * ld_pv + pcol + col;
                    *reinterpret_cast<float2*>(p) = make_float2(g0, g1);
                    *reinterpret_cast<float2*>(p + H) = make_float2(v0, v1);
                }
                const unsigned at = hbuf + (col >> 5) * (GW_BM * 128) + r * 128 + ((((col & 31) >> 2) ^ (r & 7)) << 4)
                                    + (col & 3) * 4;
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(fast_sigmoid(g0) * v0),
                             "f"(fast_sigmoid(g1) * v1) : "memory");
            }
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the writes, seen by the TMA unit
        consumers_sync();
        if (tid == 0) {
#pragma unroll
            for (int b = 0; b < GW_BH / 32; ++b) tma_store(&map_h, hbuf + b * (GW_BM * 128), branch * width + j0 + 32 * b, m0);
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
        // The branch's augmented tail [0, ..., 0, 1], by the tiles of its last column tile.
        if (j0 + GW_BH == H && tid < GW_BM && m0 + tid < M) {
            float* p = h + (long long)(m0 + tid) * ld_h + branch * width;
            for (int c = H; c < width; ++c) p[c] = c == width - 1 ? 1.0f : 0.0f;
        }
    }
    if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the last stores done
    cluster_sync();
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
