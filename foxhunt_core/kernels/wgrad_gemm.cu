// A weight gradient over the batch as a TF32 tensor-core GEMM (Hopper wgmma, operands brought in
// by TMA), its long reduction split over the CTAs; then the splits' sum.
// foxhunt: arch-specific (compiled for sm_90a: wgmma exists there only)
//
// NumPy twin: foxhunt_core/gpu/reference.py wgrad_gemm.
//
//   out [N, M] = xt y       xt [N, K]: a layer's input x [K, N] transposed and rounded to TF32
//                           (transpose_tile); y [K, M]: the gradient of the layer's output; K the
//                           batch. Rows [zero0, zero1) of out are zero outside columns [keep0, keep1).
//
// Why this shape of kernel: TF32 wgmma reads both of its shared-memory operands K-major, and both
// of a weight gradient's operands are row-major over the batch, i.e. M- and N-major. cuBLAS runs
// such products on older mma.sync kernels (76-160 TFLOP/s on the network's shapes). Here one
// operand comes transposed (x, the narrower one, by a separate pass) and the other, y, goes to the
// tensor cores from registers (wgmma's A may come from registers, in any layout the threads load):
// the wgmma computes out's transpose, D [M, N] = y^T xt^T, m64 x (n256 + n8) per warpgroup, so
// that N up to 264 (the network's augmented z, 260 columns) is one tile; the wide variant's
// m64 x (n256 + n16) takes N up to 272.
//
// A CTA takes TC_BM = 128 columns of y (two consumer warpgroups of 64)
// over one slice of K (`k_split` rows, a multiple of TC_BK) and writes its partial D to
// part[split] ([WG_ROWS][Mp], out's layout); wgrad_reduce then sums the splits in order (the result
// does not depend on timing). The producer warp streams each 32-row chunk of the slice: y's 32 x 128
// block as four 32 x 32 boxes, and xt's 264 x 32 block as three 88-row boxes (rows past N and
// columns past K read as zeros), 128-byte swizzled, into a ring of WG_STAGES stages (tc_gemm.cuh).
// The consumers load their A fragments from y's boxes (each thread: rows m = 16 w + g and + 8 of its
// warpgroup's 64, columns k = q and q + 4 of each k step; 2-way bank conflicts at most), round them
// to TF32 to nearest in registers (cuBLAS rounds its TF32 operands so) and issue the products while
// the next chunk's fragments load.
//
// Requirements (checked by the wrapper, foxhunt_core/gpu/kernels.py wgrad_gemm): 256 < N <= WG_ROWS;
// the tensor maps describe y [K, M] with boxes of 32 x 32 and xt [N, K] with boxes of 32 x WG_BOX_ROWS,
// 128-byte swizzle; part has room for ceil(K / k_split) splits of WG_ROWS x Mp floats.

#include "tc_gemm.cuh"

// WG_N (the main wgmma's N: xt's rows 0..255), WG_NT (the tail wgmma's: rows 256..263), WG_ROWS
// (xt rows per stage), WG_BOX_ROWS (xt rows per TMA box: 11 KiB, so each box starts 1024-aligned;
// the wide variant, foxhunt_core/gpu/tc/wgrad.py WIDE: a tail of 16, 272 rows in boxes of 136),
// WG_THREADS (the producer a whole warpgroup: setmaxnreg works per warpgroup), the variant setting
// WG_STAGES, and wgrad_gemm_tx's WT_SETS and WT_STAGES: defines.cuh
static_assert(WG_ROWS == WG_N + WG_NT && WG_THREADS == TC_THREADS - 32 + 128, "wgrad_gemm's rows and warps");
#define WG_TILE_Y (TC_BK * TC_BM * 4)         // 16 KiB of y per stage: four boxes of 32 k x 32 m
#define WG_TILE_X (WG_ROWS * TC_BK * 4)       // 33 KiB of xt per stage
#define WG_STAGE (WG_TILE_Y + WG_TILE_X)
static_assert(WG_ROWS % WG_BOX_ROWS == 0 && (WG_BOX_ROWS * 128) % 1024 == 0, "xt's boxes tile the stage, aligned");
static_assert(WG_STAGES >= 3, "a chunk's stage is released only after the next chunk's products are issued");

// d (m64 x n256: 128 floats) += A B over one k step, A (m64 x k8) from this thread's four registers.
__device__ __forceinline__ void wgmma_rs_256(float* d, const unsigned* a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// The tail: d (m64 x n WG_NT: WG_NT / 2 floats) += A B over one k step, A from registers; n8 for
// inputs of up to 264 columns (the default trunk's z is 260), n16 for the wide variant (up to 272:
// z with branch-input columns of the observation, tlob_inject's 268).
__device__ __forceinline__ void wgmma_rs_tail(float* d, const unsigned* a, unsigned long long b) {
#if WG_NT == 8
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
#elif WG_NT == 16
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, "
        "%12, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
#else
#error "WG_NT: the tail wgmma is n8 or n16"
#endif
}

__device__ __forceinline__ unsigned ld_tf32(unsigned at) {
    unsigned v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(at));
    asm("cvt.rna.tf32.f32 %0, %0;\n" : "+r"(v));
    return v;
}

// A chunk's A fragments: its four k steps', loaded (and rounded) from the stage's y boxes at `sy`
// (this thread's offsets o0..o3 in each k step's 1024 bytes).
__device__ __forceinline__ void load_frags(unsigned (&a)[4 * TC_BK / 8], unsigned sy, unsigned o0, unsigned o1,
                                           unsigned o2, unsigned o3) {
#pragma unroll
    for (int s = 0; s < TC_BK / 8; ++s) {
        a[4 * s] = ld_tf32(sy + 1024 * s + o0);
        a[4 * s + 1] = ld_tf32(sy + 1024 * s + o1);
        a[4 * s + 2] = ld_tf32(sy + 1024 * s + o2);
        a[4 * s + 3] = ld_tf32(sy + 1024 * s + o3);
    }
}

// A chunk's products over xt's rows at `sx` (K-major, 128-byte swizzled), committed as one group.
__device__ __forceinline__ void issue_products(float* acc, const unsigned (&a)[4 * TC_BK / 8], unsigned sx) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int s = 0; s < TC_BK / 8; ++s) {
        wgmma_rs_256(acc, a + 4 * s, sw128_desc(sx + 32 * s));
        wgmma_rs_tail(acc + WG_N / 2, a + 4 * s, sw128_desc(sx + WG_N * 128 + 32 * s));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// One chunk: its fragments, then its products.
__device__ __forceinline__ void chunk_rs(float* acc, unsigned (&a)[4 * TC_BK / 8], unsigned sy, unsigned sx,
                                         unsigned o0, unsigned o1, unsigned o2, unsigned o3) {
    load_frags(a, sy, o0, o1, o2, o3);
    issue_products(acc, a, sx);
}

// This thread's four fragment offsets in a k step's 1024 bytes of y's boxes: y's element (k row r,
// column m) of a stage lies in box m / 32, at r 128 + ((m % 32 / 4) ^ (r % 8)) 16 + (m % 4) 4 (the
// 128-byte swizzle). The fragment registers: (m, q), (m + 8, q), (m, q + 4), (m + 8, q + 4).
struct FragOffsets {
    unsigned o0, o1, o2, o3;
    __device__ __forceinline__ FragOffsets(int m, int q) {
        const int c4 = (m & 31) >> 2;
        const unsigned base = (m >> 5) * 4096 + (m & 3) * 4;
        o0 = base + q * 128 + ((c4 ^ q) << 4);
        o1 = base + q * 128 + (((c4 + 2) ^ q) << 4);
        o2 = base + (q + 4) * 128 + ((c4 ^ (q + 4)) << 4);
        o3 = base + (q + 4) * 128 + (((c4 + 2) ^ (q + 4)) << 4);
    }
};

// The consumers' start in both kernels: their registers taken (232 each, what the producer
// warpgroup gave up), this thread's D rows in the tile (m and m + 8: warpgroup wg takes y's columns
// 64 wg .. + 63), q (its lane's column pair in each 8), its fragment offsets, its accumulators zeroed.
__device__ __forceinline__ FragOffsets consumer_start(int warp, int lane, float* acc, int& m, int& q) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    q = lane & 3;
    m = 64 * (warp >> 2) + 16 * (warp & 3) + (lane >> 2);
#pragma unroll
    for (int i = 0; i < WG_N / 2 + WG_NT / 2; ++i) acc[i] = 0.0f;
    return FragOffsets(m, q);
}

// This thread's partial D, transposed into out's layout at p (row n of out at p + n Mp): rows m and
// m + 8 of D (p and p + 8), columns 8 j + 2 q (+ 1) and the tail's WG_N + 8 j + 2 q (+ 1).
__device__ __forceinline__ void store_partial(float* p, const float* acc, int q, int Mp) {
#pragma unroll
    for (int j = 0; j < WG_N / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) p[(size_t)(8 * j + 2 * q + (e & 1)) * Mp + 8 * (e >> 1)] = acc[4 * j + e];
#pragma unroll
    for (int j = 0; j < WG_NT / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            p[(size_t)(WG_N + 8 * j + 2 * q + (e & 1)) * Mp + 8 * (e >> 1)] = acc[WG_N / 2 + 4 * j + e];
}

// The producer warpgroup of both kernels: it gives its registers up to the consumers (40 each; the
// consumers take 232: the 384 threads' 168 each as launched, 64512 of the SM's 65536 in all), and
// its first lane streams the slice's chunks: y's 32 x 128 block as four boxes, then x's by
// `load_x(sx, bar, k)`.
template <class LoadX>
__device__ __forceinline__ void wgrad_produce(Ring& ring, int warp, int lane, int chunks, int k0, int m0,
                                              const TensorMap* map_y, LoadX load_x) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (warp == TC_CONSUMER_WARPS && lane == 0)
        for (int kc = 0; kc < chunks; ++kc, ring.advance()) {
            const unsigned bar = ring_acquire(ring), sy = ring.at();
            const int k = k0 + kc * TC_BK;
#pragma unroll
            for (int b = 0; b < TC_BM / 32; ++b) tma_load(sy + b * 4096, map_y, bar, m0 + 32 * b, k);
            load_x(sy + WG_TILE_Y, bar, k);
        }
    __syncwarp();
    cluster_sync();
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
wgrad_gemm(const __grid_constant__ TensorMap map_y, const __grid_constant__ TensorMap map_xt,
           float* __restrict__ part, int K, int M, int k_split, int m_tiles)
{
    extern __shared__ unsigned char smem_raw[];
    unsigned no_staging;
    Ring ring = ring_layout(smem_raw, WG_STAGES, WG_STAGE, 0, no_staging);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int mt = blockIdx.x % m_tiles, split = blockIdx.x / m_tiles;
    const int m0 = mt * TC_BM, k0 = split * k_split;
    const int chunks = (min(K, k0 + k_split) - k0 + TC_BK - 1) / TC_BK;
    ring_init(ring, 1, tid);

    if (warp >= TC_CONSUMER_WARPS) {  // the producer warpgroup
        wgrad_produce(ring, warp, lane, chunks, k0, m0, &map_y, [&](unsigned sx, unsigned bar, int k) {
#pragma unroll
            for (int b = 0; b < WG_ROWS / WG_BOX_ROWS; ++b)
                tma_load(sx + b * WG_BOX_ROWS * 128, &map_xt, bar, k, b * WG_BOX_ROWS);
        });
        return;
    }

    // The consumers.
    float acc[WG_N / 2 + WG_NT / 2];
    int m, q;
    const FragOffsets fo = consumer_start(warp, lane, acc, m, q);
    // Two sets of fragment registers: a chunk's in flight while the next one's load. After chunk
    // kc's products are issued the previous chunk's are done: its stage goes back to the producer.
    unsigned a0[4 * TC_BK / 8], a1[4 * TC_BK / 8];
    int prev = -1;  // the previous chunk's stage
#define WG_STEP(A)                                                                   \
    {                                                                                \
        mbar_wait(ring.full + 8 * ring.stage, ring.phase);                          \
        chunk_rs(acc, A, ring.at(), ring.at() + WG_TILE_Y, fo.o0, fo.o1, fo.o2, fo.o3); \
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");           \
        if (prev >= 0 && lane == 0) mbar_arrive_cluster(ring.empty + 8 * prev, 0);  \
        prev = ring.stage;                                                           \
        ring.advance();                                                              \
    }
    int kc = 0;
    for (; kc + 1 < chunks; kc += 2) {
        WG_STEP(a0)
        WG_STEP(a1)
    }
    if (kc < chunks) WG_STEP(a0)
#undef WG_STEP
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

    // The partial D, transposed into out's layout: part[split][n][m0 + m].
    const int Mp = m_tiles * TC_BM;
    store_partial(part + (size_t)split * WG_ROWS * Mp + m0 + m, acc, q, Mp);
    cluster_sync();
}

// ---------------------------------------------------------------------------------------------
// wgrad_gemm_tx: the same product for up to WT_SETS sets of operands at once, x given as it is
// ([K, N], batch-major: the advantage heads' input h, which no pass transposes), transposed in
// shared memory by the consumers. Per 32-row chunk the producer brings y's 32 x 128 block (as
// above) and x's 32 x WG_ROWS block (WT_RAW_BOXES boxes of 32 columns, 128-byte swizzled; columns
// past N read as zeros); the consumers write x's block transposed (K-major, 128-byte swizzled,
// rounded to TF32 to nearest) into one of two buffers, and the chunk's stage goes back to the
// producer: the products read only those buffers and the fragment registers, so the next chunk's
// transpose runs while they do. A thread transposes 4 k x 1 column at a time (four 4-byte loads,
// one 16-byte store): within a warp, 32 consecutive columns of one row read and 32 rows written,
// free of bank conflicts. CTAs: sets x m tiles x slices of the batch; part[set][split][n][m].

#define WT_RAW_BOXES ((WG_ROWS + 31) / 32)              // x's boxes per chunk: 9
#define WT_TILE_RAW (WT_RAW_BOXES * TC_BK * 128)        // 36 KiB
#define WT_STAGE (WG_TILE_Y + WT_TILE_RAW)              // 52 KiB
#define WT_ITEMS (WG_ROWS * TC_BK / 4)                  // a chunk's transpose: (column, 4 k) items
// 3 stages and the two transposed buffers: 222 KiB of the 227 a block may have

struct __align__(64) WgradSets {
    TensorMap y[WT_SETS], x[WT_SETS];
};

// x's chunk at `raw` (boxes of 32 columns x 32 k rows) transposed into `bt` (WG_ROWS rows of 32 k,
// K-major, 128-byte swizzled) and rounded to TF32, by consumer thread `ct` of 256.
__device__ __forceinline__ void transpose_chunk(unsigned raw, unsigned bt, int ct) {
#pragma unroll
    for (int i = 0; i < (WT_ITEMS + 255) / 256; ++i) {
        const int item = ct + 256 * i;
        if (item < WT_ITEMS) {
            const int kq = item / WG_ROWS, n = item - kq * WG_ROWS;
            const unsigned col = raw + (n >> 5) * 4096 + (n & 3) * 4;
            const int c4 = (n & 31) >> 2;
            unsigned v[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int k = 4 * kq + e;
                v[e] = ld_tf32(col + k * 128 + ((c4 ^ (k & 7)) << 4));
            }
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n"
                         ::"r"(bt + n * 128 + ((kq ^ (n & 7)) << 4)), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                         : "memory");
        }
    }
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
wgrad_gemm_tx(const __grid_constant__ WgradSets args, float* __restrict__ part, int K, int M, int k_split,
              int m_tiles, int splits)
{
    extern __shared__ unsigned char smem_raw[];
    unsigned bt;  // the two transposed buffers
    Ring ring = ring_layout(smem_raw, WT_STAGES, WT_STAGE, 2 * WG_TILE_X, bt);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int per_set = m_tiles * splits;
    const int set = blockIdx.x / per_set, mt = blockIdx.x % per_set % m_tiles, split = blockIdx.x % per_set / m_tiles;
    const int m0 = mt * TC_BM, k0 = split * k_split;
    const int chunks = (min(K, k0 + k_split) - k0 + TC_BK - 1) / TC_BK;
    ring_init(ring, 1, tid);

    if (warp >= TC_CONSUMER_WARPS) {  // the producer warpgroup
        wgrad_produce(ring, warp, lane, chunks, k0, m0, &args.y[set], [&](unsigned sx, unsigned bar, int k) {
#pragma unroll
            for (int b = 0; b < WT_RAW_BOXES; ++b) tma_load(sx + b * 4096, &args.x[set], bar, 32 * b, k);
        });
        return;
    }

    float acc[WG_N / 2 + WG_NT / 2];
    int m, q;
    const FragOffsets fo = consumer_start(warp, lane, acc, m, q);
    // Per chunk, k step by k step: the step's four fragment registers loaded (two sets, alternating:
    // a step's in flight while the next one's load), its products issued; after the first step's,
    // the next chunk's stage awaited and transposed into the other buffer (the previous chunk's
    // products, which read it, are done by then). After the last step the chunk's stage goes back
    // to the producer, and every consumer's transpose is made visible to the tensor cores.
    unsigned ae[4], ao[4];
    const unsigned ct = tid;  // (consumer threads 0..255)
    mbar_wait(ring.full + 8 * ring.stage, ring.phase);
    transpose_chunk(ring.at() + WG_TILE_Y, bt, ct);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    consumers_sync();
    for (int kc = 0; kc < chunks; ++kc) {
        const unsigned sy = ring.at(), sx = bt + (kc & 1) * WG_TILE_X;
        const int stage = ring.stage;
#pragma unroll
        for (int s = 0; s < TC_BK / 8; ++s) {
            unsigned* a = (s & 1) ? ao : ae;
            const unsigned at = sy + 1024 * s;
            a[0] = ld_tf32(at + fo.o0), a[1] = ld_tf32(at + fo.o1), a[2] = ld_tf32(at + fo.o2), a[3] = ld_tf32(at + fo.o3);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
            wgmma_rs_256(acc, a, sw128_desc(sx + 32 * s));
            wgmma_rs_tail(acc + WG_N / 2, a, sw128_desc(sx + WG_N * 128 + 32 * s));
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            if (s == 0 && kc + 1 < chunks) {
                ring.advance();
                mbar_wait(ring.full + 8 * ring.stage, ring.phase);
                transpose_chunk(ring.at() + WG_TILE_Y, bt + ((kc + 1) & 1) * WG_TILE_X, ct);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive_cluster(ring.empty + 8 * stage, 0);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        consumers_sync();
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

    const int Mp = m_tiles * TC_BM;
    store_partial(part + ((size_t)set * splits + split) * WG_ROWS * Mp + m0 + m, acc, q, Mp);
    cluster_sync();
}

// The output pointers of wgrad_reduce's sets (one row pitch for all), passed by value.
struct OutSets {
    float* out[WT_SETS];
};

// out_s [N, M] (row pitch ld_out) = the sum over `splits` of part[s][split][n][m] (each WG_ROWS x Mp),
// in order, for each set s; rows [zero0, zero1) zero outside columns [keep0, keep1). A thread per
// element, M fastest.
extern "C" __global__ void wgrad_reduce(const float* __restrict__ part, int sets, int splits, int Mp,
                                        const OutSets outs, int ld_out, int N, int M,
                                        int zero0, int zero1, int keep0, int keep1)
{
    const long long per_set = (long long)N * M, total = per_set * sets;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int st = (int)(i / per_set);
        const long long e = i - st * per_set;
        const int n = (int)(e / M), mm = (int)(e - (long long)n * M);
        const float* p = part + (size_t)st * splits * WG_ROWS * Mp + (size_t)n * Mp + mm;
        float s = 0.0f;
        if (n < zero0 || n >= zero1 || (mm >= keep0 && mm < keep1))
            for (int k = 0; k < splits; ++k) s += p[(size_t)k * WG_ROWS * Mp];
        float* const o = st == 0 ? outs.out[0] : st == 1 ? outs.out[1] : st == 2 ? outs.out[2] : outs.out[3];
        o[(size_t)n * ld_out + mm] = s;
    }
}
