// Elementwise layers of the network between its GEMMs: forward and backward.
//
// NumPy twins (foxhunt_core/net/layers.py and foxhunt_core/net/network.py):
//   glu_forward        gate = sigmoid(pre), h = gate * val                           (pv = [pre | val])
//   glu_backward       dpre = dh * val * gate * (1 - gate), dval = dh * gate  (gate, val recomputed)
//   bias_relu_forward  y = relu(x + b)                                               (trunk layers)
//   relu_backward      dx = (dy + addend) * (y > 0)                                  (addend optional)
//   vsn_forward        m = sigmoid(mpre), z = h2 * m                                 (variable selection)
//   vsn_backward       dh2 = dz * m, dmpre = dz * h2 * m * (1 - m) (optionally rounded to TF32)
//   pack_rows          [x, 0, ..., 0, 1] rows from up to three sources                (network input)
// Launch wrappers: foxhunt_core/gpu/kernels.py.
//
// Thread mapping: one thread per element, grid-stride loop; `cols` is the width of the
// row-major [rows, cols] arrays (the bias index is the column). Every output may alias the
// input it replaces (same index read before written), so all of them can run in place.
//
// Augmented outputs: the GPU network keeps each layer's bias in the last row of its weight
// block, so the input of such a GEMM carries a column of ones. glu_forward, vsn_forward and
// pack_rows write an output whose row pitch `ld` may exceed the layer's width `cols`: the extra
// columns then hold zeros and, in the last one, a one ([x, 0, ..., 0, 1]).

// 32-bit indices: the wrappers refuse arrays of 2^30 elements or more, so i + stride cannot
// overflow, and the column index costs a 32-bit division instead of a 64-bit one.
#define GRID_STRIDE(i, total) \
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (int)(total); i += gridDim.x * blockDim.x)

#include "activation.cuh"

// The tail of an augmented row: zeros, then a one in the row's last column.
__device__ __forceinline__ float tail_value(int c, int ld) { return c == ld - 1 ? 1.0f : 0.0f; }

// The GLU works on the joint layout of a branch's GEMM output: pv holds the gate pre-activation
// in `cols` columns and the value in the next `cols` (one GEMM with the gate and value weights
// side by side, their biases in the weight block's last row). `blocks` branches may sit side by
// side in a row (one GEMM for several branches): branch b's [gate | value] at column 2 b cols of
// pv, its h at column b width of h, its dh at column b cols of dh. Every array is a row-major
// view with its own row pitch (ld_*). The forward writes only h; the backward recomputes gate
// and value from pv (so the update keeps no caches of them) and may write its gradient over pv.
extern "C" __global__ void glu_forward(
    const float* pv, int ld_pv,          // [rows, blocks * 2 cols]  [u W_gate | u W_val] ...
    float* h, int ld_h,                  // [rows, blocks * width]
    long long total, int cols, int width, int blocks)   // total = rows * blocks * width
{
    const int row_len = blocks * width;
    GRID_STRIDE(i, total) {
        const int r = i / row_len, c = i - r * row_len;
        const int b = c / width, cc = c - b * width;
        const float* p = pv + (long long)r * ld_pv + b * 2 * cols;
        h[(long long)r * ld_h + c] = cc < cols ? stable_sigmoid(p[cc]) * p[cols + cc] : tail_value(cc, width);
    }
}

extern "C" __global__ void glu_backward(
    const float* dh, int ld_dh,          // [rows, blocks * cols]
    const float* pv, int ld_pv,          // [rows, blocks * 2 cols] the forward's input
    float* dpv, int ld_dpv,              // [rows, blocks * 2 cols] [d pre_gate | d val] ...; may be pv
    long long total, int cols, int blocks)   // total = rows * blocks * cols
{
    const int row_len = blocks * cols;
    GRID_STRIDE(i, total) {
        const int r = i / row_len, c = i - r * row_len;
        const int b = c / cols, cc = c - b * cols;
        const float* p = pv + (long long)r * ld_pv + b * 2 * cols;
        const float pg = p[cc], vv = p[cols + cc];
        const float g = stable_sigmoid(pg);
        const float d = dh[(long long)r * ld_dh + c];
        float* q = dpv + (long long)r * ld_dpv + b * 2 * cols;
        q[cc] = d * vv * g * (1.0f - g);
        q[cols + cc] = d * g;
    }
}

// The same four consecutive columns per thread (float4 loads and stores), for widths and row
// pitches that are multiples of 4 and arrays aligned to 16 bytes (the wrappers check and
// otherwise launch the kernels above). Every size below counts floats.
__device__ __forceinline__ float4 ld4(const float* p, long long i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ __forceinline__ void st4(float* p, long long i, float4 v) { reinterpret_cast<float4*>(p)[i] = v; }
__device__ __forceinline__ float4 tail4(int c4, int ld) {
    return make_float4(tail_value(4 * c4, ld), tail_value(4 * c4 + 1, ld), tail_value(4 * c4 + 2, ld),
                       tail_value(4 * c4 + 3, ld));
}

extern "C" __global__ void glu_forward_vec4(const float* pv, int ld_pv, float* h, int ld_h,
                                            long long total, int cols, int width, int blocks)
{
    const int cols4 = cols >> 2, width4 = width >> 2, row4 = blocks * width4;
    GRID_STRIDE(t, total >> 2) {
        const int r = t / row4, c4 = t - r * row4;
        const int b = c4 / width4, cc4 = c4 - b * width4;
        const long long out = ((long long)r * ld_h >> 2) + c4;
        if (cc4 >= cols4) {
            st4(h, out, tail4(cc4, width));
            continue;
        }
        const long long in = ((long long)r * ld_pv >> 2) + b * 2 * cols4 + cc4;
        const float4 pg = ld4(pv, in), vv = ld4(pv, in + cols4);
        st4(h, out, make_float4(stable_sigmoid(pg.x) * vv.x, stable_sigmoid(pg.y) * vv.y,
                                stable_sigmoid(pg.z) * vv.z, stable_sigmoid(pg.w) * vv.w));
    }
}

extern "C" __global__ void glu_backward_vec4(const float* dh, int ld_dh, const float* pv, int ld_pv,
                                             float* dpv, int ld_dpv, long long total, int cols, int blocks)
{
    const int cols4 = cols >> 2, row4 = blocks * cols4;
    GRID_STRIDE(t, total >> 2) {
        const int r = t / row4, c4 = t - r * row4;
        const int b = c4 / cols4, cc4 = c4 - b * cols4;
        const long long in = ((long long)r * ld_pv >> 2) + b * 2 * cols4 + cc4;
        const long long out = ((long long)r * ld_dpv >> 2) + b * 2 * cols4 + cc4;
        const float4 pg = ld4(pv, in), vv = ld4(pv, in + cols4);
        const float4 d = ld4(dh, ((long long)r * ld_dh >> 2) + c4);
        const float4 g = make_float4(stable_sigmoid(pg.x), stable_sigmoid(pg.y),
                                     stable_sigmoid(pg.z), stable_sigmoid(pg.w));
        st4(dpv, out, make_float4(d.x * vv.x * g.x * (1.0f - g.x), d.y * vv.y * g.y * (1.0f - g.y),
                                  d.z * vv.z * g.z * (1.0f - g.z), d.w * vv.w * g.w * (1.0f - g.w)));
        st4(dpv, out + cols4, make_float4(d.x * g.x, d.y * g.y, d.z * g.z, d.w * g.w));
    }
}

extern "C" __global__ void bias_relu_forward(
    const float* x,                      // [rows, cols]
    const float* bias,                   // [cols]
    float* y,                            // [rows, cols]
    long long total, int cols)
{
    GRID_STRIDE(i, total) {
        const float t = x[i] + bias[(int)(i % cols)];
        y[i] = t > 0.0f ? t : 0.0f;
    }
}

extern "C" __global__ void relu_backward(
    const float* dy,                     // [total]
    const float* y,                      // [total] ReLU output
    const float* addend,                 // [total] or null
    float* dx,                           // [total]
    long long total)
{
    GRID_STRIDE(i, total) {
        const float g = addend != nullptr ? dy[i] + addend[i] : dy[i];
        dx[i] = y[i] > 0.0f ? g : 0.0f;
    }
}

// z [rows, ld] (augmented when ld > cols); m [keep_rows, cols] is written for the first
// keep_rows rows only (the rows a backward will read; 0: none). With tf32 z is written rounded to
// TF32 (tf32_nearest): where every reader of z is a TF32 GEMM, which rounds its operands so
// anyway, glu_gemm need not round it again in shared memory.
extern "C" __global__ void vsn_forward(
    const float* h2,                     // [rows, cols]
    const float* mpre,                   // [rows, cols] h2 @ W_vsn + b_vsn
    float* m,                            // [keep_rows, cols] or null
    float* z,                            // [rows, ld]
    long long total, int cols, int ld, int keep_rows, int tf32)   // total = rows * ld
{
    GRID_STRIDE(i, total) {
        const int r = i / ld, c = i - r * ld;
        if (c >= cols) {
            z[i] = tail_value(c, ld);
            continue;
        }
        const float s = stable_sigmoid(mpre[r * cols + c]);
        if (r < keep_rows) m[r * cols + c] = s;
        const float zi = h2[r * cols + c] * s;
        z[i] = tf32 ? tf32_nearest(zi) : zi;
    }
}

// vsn_forward on four consecutive columns per thread (as glu_forward_vec4).
extern "C" __global__ void vsn_forward_vec4(
    const float* h2, const float* mpre, float* m, float* z, long long total, int cols, int ld, int keep_rows,
    int tf32)
{
    const int cols4 = cols >> 2, ld4_ = ld >> 2;
    GRID_STRIDE(t, total >> 2) {
        const int r = t / ld4_, c4 = t - r * ld4_;
        if (c4 >= cols4) {
            st4(z, t, tail4(c4, ld));
            continue;
        }
        const int i4 = r * cols4 + c4;
        const float4 p = ld4(mpre, i4);
        const float4 s = make_float4(stable_sigmoid(p.x), stable_sigmoid(p.y), stable_sigmoid(p.z), stable_sigmoid(p.w));
        if (r < keep_rows) st4(m, i4, s);
        const float4 h = ld4(h2, i4);
        float4 zi = make_float4(h.x * s.x, h.y * s.y, h.z * s.z, h.w * s.w);
        if (tf32) zi = make_float4(tf32_nearest(zi.x), tf32_nearest(zi.y), tf32_nearest(zi.z), tf32_nearest(zi.w));
        st4(z, t, zi);
    }
}

// dz has row pitch ld_dz >= cols (a column block of the wider input gradient of z's GEMMs).
// With tf32, dmpre is written rounded to TF32 (tf32_nearest): where its readers are TF32 GEMMs
// (the VSN's weight gradient, the trunk's input gradient through linear_gemm's LG_DRELU, which
// then need not round it in shared memory) and the bias gradient's column sums.
extern "C" __global__ void vsn_backward(
    const float* dz,                                        // [rows, ld_dz]
    const float* h2, const float* m,                        // [rows, cols]
    float* dh2, float* dmpre,                               // [rows, cols]
    long long total, int cols, int ld_dz, int tf32)         // total = rows * cols
{
    GRID_STRIDE(i, total) {
        const int r = i / cols, c = i - r * cols;
        const float d = dz[r * ld_dz + c];
        const float s = m[i];
        const float dm = d * h2[i];
        dh2[i] = d * s;
        const float dp = dm * s * (1.0f - s);
        dmpre[i] = tf32 ? tf32_nearest(dp) : dp;
    }
}

// out [rows, ld] = [x, 0, ..., 0, 1] (augmented when ld > cols), row r taken from x0 for
// r < r1, from x1 for r1 <= r < r2 and from x2 after that (each source [its rows, cols]).
extern "C" __global__ void pack_rows(
    const float* x0, const float* x1, const float* x2, int r1, int r2,
    float* out, long long total, int cols, int ld)           // total = rows * ld
{
    GRID_STRIDE(i, total) {
        const int r = i / ld, c = i - r * ld;
        if (c >= cols) {
            out[i] = tail_value(c, ld);
            continue;
        }
        out[i] = r < r1 ? x0[r * cols + c] : r < r2 ? x1[(r - r1) * cols + c] : x2[(r - r2) * cols + c];
    }
}

// dst = src, four floats per thread (a whole flat parameter buffer: the update's online twin and
// the target network's sync). A kernel rather than cudaMemcpy: the copy engine measured ~4x
// slower for buffers of a few MB.
extern "C" __global__ void copy_vec4(const float* src, float* dst, long long n4)
{
    GRID_STRIDE(t, n4) st4(dst, t, ld4(src, t));
}
