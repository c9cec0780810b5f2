// The machinery shared by the TF32 tensor-core GEMM kernels (glu_gemm.cu, linear_gemm.cu,
// glu_backward_gemm.cu; wgrad_gemm.cu uses its parts): TMA
// loads and stores, mbarriers, clusters, wgmma, and the ring of shared-memory stages between the
// producer warp and the two consumer warpgroups.
//
// The kernels built on it are persistent and warp-specialized, in clusters of TC_CLUSTER CTAs (one
// per SM) that take TC_CLUSTER consecutive row tiles of one column tile together; a tile is
// TC_BM = 128 rows (two consumer warpgroups of 64) x the kernel's columns (N, the wgmma width).
//   * The producer warp (warp 8): one lane streams each tile's k chunks (TC_BK = 32 of K: one
//     128-byte row of A and of the transposed weights) with TMA into a ring of TC_STAGES stages,
//     128-byte swizzled. A stage's `full` mbarrier counts its bytes in (its own rows and the
//     other CTAs' multicast ones); its `empty` mbarrier, released by the consumer warps of every
//     CTA of the cluster, is awaited before it is refilled. Each CTA loads 1 / TC_CLUSTER of the
//     tile's weight rows for all of them (TMA multicast).
//   * The consumer warpgroups (warps 0-7), 64 rows each: per chunk they wait for `full`, issue one
//     wgmma m64nNk8 per k step of 8 and release the previous chunk's stage once its products are
//     done (consume_tile). After a tile's last chunk comes the kernel's epilogue, while the
//     producer already loads the next tile.
// TMA fills the parts of a box past the matrices with zeros; the last chunk's k steps wholly past
// K are not issued (TAIL, set by the wrappers from K). Both operands are rounded to TF32 to
// nearest before the products, as cuBLAS rounds them (wgmma alone would drop the low 13 mantissa
// bits, a bias toward zero): the weights by transpose_tile, each stage's rows of A in shared memory
// by the warpgroup that reads them while its previous products run, except the chunks wholly within
// A's first `rounded_k` columns, which A's writer rounded already (rounding in shared memory costs
// the bandwidth the products need: a fifth of glu_gemm's time).
#pragma once

// TC_BM (rows per tile), TC_BK (k per stage), TC_CONSUMER_WARPS, TC_THREADS: defines.cuh
#include "defines.cuh"
#define TC_TILE_A (TC_BM * TC_BK * 4)             // 16 KiB of A per stage

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

// Round the 64 rows of A that warpgroup `wg` reads from the stage at `stage_base` to TF32, to
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
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(32 * TC_CONSUMER_WARPS) : "memory"); }

// The matrix descriptor of a K-major tile with the 128-byte swizzle starting at `addr` (a
// shared-memory address; the tile's 1024-byte swizzle atoms aligned to 1024 bytes).
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4)  // start address
           | (1ull << 16)                               // leading byte offset (unused: K fits the swizzle row)
           | ((unsigned long long)(1024 >> 4) << 32)    // stride byte offset: 8 rows x 128 bytes
           | (1ull << 62);                              // 128-byte swizzle
}

// d (m64 x nN, this thread's N / 2 floats) += A B over one k step of 8. Accumulator element 4j + e
// of a thread (warp w of its warpgroup, lane 4g + q) is row 16w + g (+ 8 for e >= 2), column
// 8j + 2q (+ 1 for odd e).
template <int N>
__device__ __forceinline__ void wgmma_tf32(float* d, unsigned long long a, unsigned long long b);

template <>
__device__ __forceinline__ void wgmma_tf32<256>(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(a), "l"(b));
}

template <>
__device__ __forceinline__ void wgmma_tf32<160>(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n160k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}, %80, %81, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
        : "l"(a), "l"(b));
}

template <>
__device__ __forceinline__ void wgmma_tf32<128>(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b));
}

// One chunk's products, STEPS k steps of 8 (a compile-time count: wgmma under a run-time condition
// would be serialized), committed as one group.
template <int N, int STEPS>
__device__ __forceinline__ void chunk_products(float* acc, unsigned sa, unsigned sb) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int s = 0; s < STEPS; ++s) wgmma_tf32<N>(acc, sw128_desc(sa + 32 * s), sw128_desc(sb + 32 * s));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// A ring of `stages` shared-memory stages of `bytes` each from `base` (1024-byte aligned), with
// their `full` and `empty` mbarriers; `stage`, `phase` (and for a consumer `last`, the stage of the
// previous chunk) walk it.
struct Ring {
    unsigned base, full, empty, bytes;
    int stages, stage, last;
    unsigned phase;

    __device__ __forceinline__ unsigned at() const { return base + stage * bytes; }
    __device__ __forceinline__ void advance() {
        last = stage;
        if (++stage == stages) {
            stage = 0;
            phase ^= 1;
        }
    }
};

// The dynamic shared memory's layout: `stages` stages of `stage_bytes` (1024-byte aligned, as the
// swizzle atoms must be), then a staging buffer of `staging_bytes` for the outputs' TMA stores
// (its address into `staging`; 1024-byte aligned too), then the stages' mbarriers.
__device__ __forceinline__ Ring ring_layout(const void* smem, int stages, unsigned stage_bytes,
                                            unsigned staging_bytes, unsigned& staging) {
    const unsigned base = (smem_addr(smem) + 1023u) & ~1023u;
    staging = base + stages * stage_bytes;
    const unsigned full = staging + staging_bytes;
    return Ring{base, full, full + 8 * stages, stage_bytes, stages, 0, 0, 0u};
}

// The barriers of `ring`, initialized by thread 0: `full` awaits the producer's arrival (and the
// bytes), `empty` every consumer warp of the cluster; then every thread of the cluster waits, so
// that each CTA's barriers are ready before any multicast reaches them.
__device__ __forceinline__ void ring_init(const Ring& ring, int cluster, int tid) {
    if (tid == 0) {
        for (int s = 0; s < ring.stages; ++s) {
            mbar_init(ring.full + 8 * s, 1);
            mbar_init(ring.empty + 8 * s, TC_CONSUMER_WARPS * cluster);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    cluster_sync();
}

// The producer's next stage: awaited free in every CTA of the cluster (this CTA's weight rows go to
// all of them), armed for `bytes`; returns its `full` barrier (the stage is ring.at()).
__device__ __forceinline__ unsigned ring_acquire(const Ring& ring) {
    mbar_wait(ring.empty + 8 * ring.stage, ring.phase ^ 1);  // (a fresh barrier passes parity 1)
    const unsigned bar = ring.full + 8 * ring.stage;
    mbar_expect_bytes(bar, ring.bytes);
    return bar;
}

// One tile's products over `chunks` chunks into `acc` (N / 2 floats per thread, zeroed here, or
// with ZERO false accumulated onto the caller's values) by
// consumer warpgroup `wg` (rows wg * 64.. of each stage's A, whose weights follow at TC_TILE_A);
// the stages released to the producers of the cluster (`lane` r < cluster arrives in CTA r). The
// ring needs three stages at least: the next chunk's stage is awaited before the previous one is
// released.
template <int N, int TAIL, int CLUSTER, bool ZERO = true>
__device__ __forceinline__ void consume_tile(float* acc, Ring& ring, int chunks, int rounded_k, int wg, int lane,
                                             int lt) {
    if (ZERO) {
#pragma unroll
        for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
    }
    // Each chunk's rows of A are rounded (unless A's writer did) while the previous chunk's
    // products run.
    mbar_wait(ring.full + 8 * ring.stage, ring.phase);
    if (TC_BK > rounded_k) {
        round_rows_tf32(ring.at(), wg, lt);
        warpgroup_sync(wg);
    }
    // After chunk kc's products are issued: the next chunk's stage awaited (and rounded), the
    // previous chunk's stage released once its products are done.
    auto next = [&](int kc) {
        if (kc + 1 < chunks) {
            const int s = ring.stage + 1 == ring.stages ? 0 : ring.stage + 1;
            mbar_wait(ring.full + 8 * s, s == 0 ? ring.phase ^ 1 : ring.phase);
            if ((kc + 2) * TC_BK > rounded_k) {
                round_rows_tf32(ring.base + s * ring.bytes, wg, lt);
                warpgroup_sync(wg);
            }
        }
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // the previous chunk's are done
        if (kc > 0 && lane < CLUSTER) mbar_arrive_cluster(ring.empty + 8 * ring.last, lane);
        ring.advance();
    };
    const unsigned rows = wg * 64 * 128;  // this warpgroup's rows of A in a stage
    int kc = 0;
    for (; kc + 1 < chunks; ++kc) {
        chunk_products<N, TC_BK / 8>(acc, ring.at() + rows, ring.at() + TC_TILE_A);
        next(kc);
    }
    chunk_products<N, TAIL>(acc, ring.at() + rows, ring.at() + TC_TILE_A);
    next(kc);
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    if (lane < CLUSTER) mbar_arrive_cluster(ring.empty + 8 * ring.last, lane);  // (in every CTA: lane r in CTA r)
}

// The persistent schedule: `groups` of CLUSTER consecutive row tiles of one of `col_tiles` column
// tiles; the cluster takes groups cluster, + clusters, ..., consecutive groups the column tiles of
// the same rows (their A rows are read from L2 by all of them).
template <int CLUSTER>
struct Schedule {
    int col_tiles, groups, cluster, clusters, rank, chunks;

    __device__ __forceinline__ Schedule(int M, int K, int col_tiles_)
        : col_tiles(col_tiles_),
          groups(col_tiles_ * ((M + TC_BM * CLUSTER - 1) / (TC_BM * CLUSTER))),
          cluster(blockIdx.x / CLUSTER), clusters(gridDim.x / CLUSTER), rank((int)cluster_rank()),
          chunks((K + TC_BK - 1) / TC_BK) {}
    __device__ __forceinline__ int col_tile(int p) const { return p % col_tiles; }
    __device__ __forceinline__ int row0(int p) const { return ((p / col_tiles) * CLUSTER + rank) * TC_BM; }
};

// The producer warp: lane 0 walks this cluster's groups and their chunks, acquires each stage and
// has `load(p, kc, bar, sa, sb)` issue its TMA loads (A's rows into sa, the weights' into sb,
// completing on bar); then the warp waits for the cluster (no CTA may leave while another can still
// write into it).
template <int CLUSTER, class Load>
__device__ __forceinline__ void produce(Ring& ring, const Schedule<CLUSTER>& s, int lane, Load load) {
    if (lane == 0)
        for (int p = s.cluster; p < s.groups; p += s.clusters)
            for (int kc = 0; kc < s.chunks; ++kc, ring.advance()) {
                const unsigned bar = ring_acquire(ring), sa = ring.at();
                load(p, kc, bar, sa, sa + TC_TILE_A);
            }
    __syncwarp();
    cluster_sync();
}

// A tile's epilogue writes its staging buffer only once the previous tile's TMA stores have read
// it (thread 0 issued them; with PENDING > 0, all but the PENDING bulk groups committed last,
// whose parts of a buffer used in turn the writes to come leave alone), ...
template <int PENDING = 0>
__device__ __forceinline__ void staging_acquire(int tid) {
    if (tid == 0) asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(PENDING) : "memory");
    consumers_sync();
}

// ... and hands it to the TMA unit once every consumer's writes are visible to it (thread 0 then
// issues the stores and commits them as one bulk group).
__device__ __forceinline__ void staging_release() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    consumers_sync();
}

// The consumers' end: the last stores done (thread 0's bulk groups), then the cluster's barrier.
__device__ __forceinline__ void consumers_finish(int tid) {
    if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    cluster_sync();
}

// The address in a staging buffer of boxes of 32 columns x TC_BM rows, 128-byte swizzled as the
// output's tensor map says (what a TMA store reads), of row r and column c (of the tile).
__device__ __forceinline__ unsigned staged_at(unsigned buf, int r, int c) {
    return buf + (c >> 5) * (TC_BM * 128) + r * 128 + ((((c & 31) >> 2) ^ (r & 7)) << 4) + (c & 3) * 4;
}
