// The GLU's elementwise forward and backward for a gate compiled from its fragment (gate.cuh),
// and the sums of the gate's parameter gradients; the built-in sigmoid's own elementwise kernels
// are elementwise.cu's glu_forward and glu_backward.
//   gate_glu_forward    h = gate(pre) * value over the joint layout, augmented as glu_forward
//   gate_glu_backward   [dpre | dval] = [dh v gate'(pre) | dh gate(pre)] (over pv in place or
//                       not) and, per block, its units' parameter-gradient terms summed over the
//                       block's rows: partial [chunks, blocks H, GATE_TERMS]
//   gate_glu_reduce     the gradients: the partials summed over the chunks in chunk order
//   gate_terms_reduce   the gradients from glu_backward_gemm's partials (a fixed order over its
//                       CTAs and their warps)
// NumPy twins: foxhunt_core/gpu/reference.py gate_glu_forward, gate_glu_backward (the gate's
// own forward and backward: the stage's array operations). Launch wrappers: foxhunt_core/gpu/gate.py.
//
// Layout, as elementwise.cu's GLU: branch b's [gate | value] pre-activations at column 2 H b of a
// pv row, its h at column b width of h, its dh at column b H of dh; every array a row-major view
// with its own row pitch. Unit j of branch b reads gate.p[b] (gate_unit) and its gradients go to
// gate.g[b] (gate_store_grad).
#include "gate.cuh"


// GG_UNIT_TILE x GG_ROW_THREADS (gate_glu_backward's block): defines.cuh
extern "C" __global__ void gate_glu_forward(const float* __restrict__ pv, int ld_pv, float* __restrict__ h, int ld_h,
                                            int rows, int H, int width, int blocks,
                                            const __grid_constant__ GateArgs gate) {
    const long long row_len = (long long)blocks * width, total = rows * row_len;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int r = (int)(i / row_len), c = (int)(i - r * row_len);
        const int b = c / width, j = c - b * width;
        const float* p = pv + (long long)r * ld_pv + 2LL * H * b;
        h[(long long)r * ld_h + c] =
            j < H ? gate_value(p[j], gate_unit(gate, b, j)) * p[H + j] : (j == width - 1 ? 1.0f : 0.0f);
    }
}

// Block (x, y): units x GG_UNIT_TILE .. + GG_UNIT_TILE - 1 of the blocks H, rows
// y rows_per_chunk .. min(rows, (y + 1) rows_per_chunk) - 1, thread row ty taking every
// GG_ROW_THREADS-th of them. A thread loads GG_ROW_BATCH rows' x, v and dh before it computes and
// stores any: dpv may be pv (in place), so the compiler cannot move the next row's loads above this
// row's stores, and one row at a time left every iteration waiting on a load (30 us at 4096 rows
// of one branch against glu_backward_vec4's 6).
extern "C" __global__ void gate_glu_backward(const float* __restrict__ dh, int ld_dh, const float* pv, int ld_pv,
                                             float* dpv, int ld_dpv, int rows, int H, int blocks,
                                             const __grid_constant__ GateArgs gate, float* __restrict__ partial,
                                             int rows_per_chunk) {
    const int u = blockIdx.x * GG_UNIT_TILE + threadIdx.x;  // of blocks H
    const int b = u / H, j = u - b * H;
    const int r0 = blockIdx.y * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
    float acc[GATE_TERM_SLOTS];
#pragma unroll
    for (int t = 0; t < GATE_TERM_SLOTS; ++t) acc[t] = 0.0f;
    if (u < blocks * H) {
        const GateUnit unit = gate_unit(gate, b, j);
        for (int rb = r0 + threadIdx.y; rb < r1; rb += GG_ROW_THREADS * GG_ROW_BATCH) {
            float x[GG_ROW_BATCH], v[GG_ROW_BATCH], d[GG_ROW_BATCH];
#pragma unroll
            for (int i = 0; i < GG_ROW_BATCH; ++i) {
                const int r = rb + i * GG_ROW_THREADS;
                if (r < r1) {
                    const float* p = pv + (long long)r * ld_pv + 2LL * H * b;
                    x[i] = p[j], v[i] = p[H + j], d[i] = dh[(long long)r * ld_dh + u];
                }
            }
#pragma unroll
            for (int i = 0; i < GG_ROW_BATCH; ++i) {
                const int r = rb + i * GG_ROW_THREADS;
                if (r < r1) {
                    float g, terms[GATE_TERM_SLOTS];
                    const float dx = gate_backward(x[i], unit, d[i], v[i], &g, terms);
                    float* q = dpv + (long long)r * ld_dpv + 2LL * H * b;  // (may be pv: x and v are read above)
                    q[j] = dx;
                    q[H + j] = d[i] * g;
#pragma unroll
                    for (int t = 0; t < GATE_TERMS; ++t) acc[t] += terms[t];
                }
            }
        }
    }
#if GATE_TERMS > 0
    __shared__ float red[GG_ROW_THREADS][GATE_TERMS][GG_UNIT_TILE];
    gate_terms_grads(acc);  // (the fragment's terms as gradients, where they are in another basis)
#pragma unroll
    for (int t = 0; t < GATE_TERMS; ++t) red[threadIdx.y][t][threadIdx.x] = acc[t];
    __syncthreads();
    for (int t = threadIdx.y; t < GATE_TERMS; t += GG_ROW_THREADS) {  // the block's row threads in order
        float s = 0.0f;
#pragma unroll
        for (int y = 0; y < GG_ROW_THREADS; ++y) s += red[y][t][threadIdx.x];
        if (u < blocks * H) partial[((long long)blockIdx.y * blocks * H + u) * GATE_TERMS + t] = s;
    }
#endif
}

// A thread per (unit of blocks H, term).
extern "C" __global__ void gate_glu_reduce(const float* __restrict__ partial, int chunks, int H, int blocks,
                                           const __grid_constant__ GateArgs gate) {
#if GATE_TERMS > 0
    const int i = blockIdx.x * blockDim.x + threadIdx.x, units = blocks * H;
    if (i >= units * GATE_TERMS) return;
    const int u = i / GATE_TERMS, t = i - u * GATE_TERMS;
    double s = 0.0;
    for (int c = 0; c < chunks; ++c) s += (double)partial[((long long)c * units + u) * GATE_TERMS + t];
    gate_store_grad(gate, u / H, u % H, t, (float)s);
#endif
}

// glu_backward_gemm's partial [ctas][warps][GATE_TERMS][tile_cols] summed: CTA c holds column
// tile c % col_tiles (the grid a multiple of the column tiles). Block (x, t): units x GG_UNIT_TILE
// .. + GG_UNIT_TILE - 1 (within one column tile), term t. Its GT_ROW_THREADS rows of threads split
// the tile's (CTA, warp) pairs: row y takes warp y % warps of every (GT_ROW_THREADS / warps)-th
// CTA from CTA y / warps on (warps dividing GT_ROW_THREADS: the wrapper checks), and the rows'
// sums are added in row order: a fixed order. A warp's loads are one term of 32 consecutive units
// (128 contiguous bytes), GT_IN_FLIGHT of them issued before their sums, at addresses a pointer
// step apart. With 8 rows of threads, the units' terms 36 bytes apart, a division for every
// pair's CTA and each load awaited before the next, the two launches of an update took 17 us at
// 16384 rows; a thread per (unit, term) walking all the pairs took 70-150 us at 65536 rows.
__device__ __forceinline__ void terms_reduce(const float* __restrict__ partial, int ctas, int warps, int tile_cols,
                                             int H, int blocks, const GateArgs& gate) {
#if GATE_TERMS > 0
    __shared__ double red[GT_ROW_THREADS][GG_UNIT_TILE];
    const int u = blockIdx.x * GG_UNIT_TILE + threadIdx.x, t = blockIdx.y, units = blocks * H;
    const int per_branch = H / tile_cols, col_tiles = blocks * per_branch;
    const int u0 = blockIdx.x * GG_UNIT_TILE;  // (the block's column tile: its first unit's; the grid covers the units)
    const int ct = (u0 / H) * per_branch + (u0 % H) / tile_cols;
    const int n = (ctas - ct + col_tiles - 1) / col_tiles;  // the tile's CTAs: ct, ct + col_tiles, ...
    const int w = threadIdx.y % warps, stride = GT_ROW_THREADS / warps;
    double s = 0.0;
    if (u < units) {
        const long long pitch = (long long)GATE_TERMS * tile_cols;  // one (CTA, warp) pair's sums to the next
        const long long step = (long long)stride * col_tiles * warps * pitch;  // this row's CTA to its next
        const float* at = partial + ((long long)(ct + (int)threadIdx.y / warps * col_tiles) * warps + w) * pitch
                          + (long long)t * tile_cols + (u % H) % tile_cols;
        for (int j0 = threadIdx.y / warps; j0 < n; j0 += GT_IN_FLIGHT * stride, at += GT_IN_FLIGHT * step) {
            float v[GT_IN_FLIGHT];
#pragma unroll
            for (int k = 0; k < GT_IN_FLIGHT; ++k) v[k] = j0 + k * stride < n ? __ldg(at + k * step) : 0.0f;
#pragma unroll
            for (int k = 0; k < GT_IN_FLIGHT; ++k)
                if (j0 + k * stride < n) s += (double)v[k];
        }
    }
    red[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && u < units) {
        double total = 0.0;
        for (int y = 0; y < GT_ROW_THREADS; ++y) total += red[y][threadIdx.x];
        gate_store_grad(gate, u / H, u % H, t, (float)total);
    }
#endif
}

extern "C" __global__ void gate_terms_reduce(const float* __restrict__ partial, int ctas, int warps, int tile_cols,
                                             int H, int blocks, const __grid_constant__ GateArgs gate) {
    terms_reduce(partial, ctas, warps, tile_cols, H, blocks, gate);
}
