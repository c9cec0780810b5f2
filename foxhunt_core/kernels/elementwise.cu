// Elementwise layers of the network between its GEMMs: forward and backward.
//
// NumPy twins (foxhunt_core/net/layers.py and foxhunt_core/net/network.py):
//   glu_forward        gate = sigmoid(pre + b_gate + x_e W_e,g), val = v + b_val + x_e W_e,v, h = gate * val
//   glu_backward       dpre = dh * val * gate * (1 - gate), dval = dh * gate  (gate, val recomputed)
//   bias_relu_forward  y = relu(x + b)                                               (trunk layers)
//   relu_backward      dx = (dy + addend) * (y > 0)                                  (addend optional)
//   vsn_forward        m = sigmoid(mpre + b), z = h2 * m                             (variable selection)
//   vsn_backward       dh2 = dz * m, dmpre = dz * h2 * m * (1 - m)
// Launch wrappers: foxhunt_core/gpu/kernels.py.
//
// Thread mapping: one thread per element, grid-stride loop; `cols` is the width of the
// row-major [rows, cols] arrays (the bias index is the column). Every output may alias the
// input it replaces (same index read before written), so all of them can run in place.

// 32-bit indices: the wrappers refuse arrays of 2^30 elements or more, so i + stride cannot
// overflow, and the column index costs a 32-bit division instead of a 64-bit one.
#define GRID_STRIDE(i, total) \
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (int)(total); i += gridDim.x * blockDim.x)

__device__ __forceinline__ float stable_sigmoid(float x) {
    // Split by sign so that expf never overflows (as layers.sigmoid does).
    const float e = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

// The GLU works on the joint layout of a branch's two GEMM outputs: pv [rows, 2 cols] holds the
// gate pre-activation in its first `cols` columns and the value in the last `cols` (one GEMM with
// the gate and value weights side by side); the biases are one [2 cols] vector and the extra
// columns' weights one [n_extra, 2 cols] matrix the same way.
// x_extra [rows, n_extra] are the branch's input columns beyond the shared features z (the
// magnitude branch's direction Q, branch-input stages): their rank-n_extra share of the two
// pre-activations, x_extra W_extra, is added here instead of widening the GEMM's input.
// The forward writes only h; the backward recomputes gate and value the same way from pv (so
// the update keeps no [rows, cols] caches of them) and may write its gradient over pv.
__device__ __forceinline__ void glu_inputs(const float* pv, const float* bias, const float* x_extra,
                                           const float* w_extra, int n_extra, int r, int c, int cols,
                                           float& pg, float& vv) {
    const int w2 = 2 * cols;
    pg = pv[r * w2 + c];
    vv = pv[r * w2 + cols + c];
    if (bias != nullptr) {
        pg += bias[c];
        vv += bias[cols + c];
    }
    for (int e = 0; e < n_extra; ++e) {
        const float x = x_extra[r * n_extra + e];
        pg += x * w_extra[e * w2 + c];
        vv += x * w_extra[e * w2 + cols + c];
    }
}

extern "C" __global__ void glu_forward(
    const float* pv,                     // [rows, 2 cols]  [z W_gate | z W_val]
    const float* bias,                   // [2 cols] [b_gate | b_val] or null
    const float* x_extra,                // [rows, n_extra] or null (then n_extra = 0)
    const float* w_extra,                // [n_extra, 2 cols]
    int n_extra,
    float* h,                            // [rows, cols]
    long long total, int cols)
{
    GRID_STRIDE(i, total) {
        const int r = i / cols, c = i - r * cols;
        float pg, vv;
        glu_inputs(pv, bias, x_extra, w_extra, n_extra, r, c, cols, pg, vv);
        h[i] = stable_sigmoid(pg) * vv;
    }
}

extern "C" __global__ void glu_backward(
    const float* dh,                     // [rows, cols]
    const float* pv,                     // [rows, 2 cols] the forward's input
    const float* bias, const float* x_extra, const float* w_extra, int n_extra,   // as glu_forward
    float* dpv,                          // [rows, 2 cols] [d pre_gate | d val]; may be pv
    long long total, int cols)
{
    GRID_STRIDE(i, total) {
        const int r = i / cols, c = i - r * cols;
        float pg, vv;
        glu_inputs(pv, bias, x_extra, w_extra, n_extra, r, c, cols, pg, vv);
        const float g = stable_sigmoid(pg);
        const float d = dh[i];
        dpv[r * 2 * cols + c] = d * vv * g * (1.0f - g);
        dpv[r * 2 * cols + cols + c] = d * g;
    }
}

// The same four consecutive columns per thread (float4 loads and stores), for rows whose width
// is a multiple of 4 and arrays aligned to 16 bytes (the wrappers check both and otherwise
// launch the kernels above). `total` and `cols` count floats.
__device__ __forceinline__ float4 ld4(const float* p, int i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ __forceinline__ void st4(float* p, int i, float4 v) { reinterpret_cast<float4*>(p)[i] = v; }
__device__ __forceinline__ void add4(float4& a, float4 b) { a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w; }
__device__ __forceinline__ void fma4(float4& a, float x, float4 b) {
    a.x += x * b.x; a.y += x * b.y; a.z += x * b.z; a.w += x * b.w;
}

__device__ __forceinline__ void glu_inputs4(const float* pv, const float* bias, const float* x_extra,
                                            const float* w_extra, int n_extra, int r, int c4, int cols4,
                                            float4& pg, float4& vv) {
    const int w4 = 2 * cols4;
    pg = ld4(pv, r * w4 + c4);
    vv = ld4(pv, r * w4 + cols4 + c4);
    if (bias != nullptr) {
        add4(pg, ld4(bias, c4));
        add4(vv, ld4(bias, cols4 + c4));
    }
    for (int e = 0; e < n_extra; ++e) {
        const float x = x_extra[r * n_extra + e];
        fma4(pg, x, ld4(w_extra, e * w4 + c4));
        fma4(vv, x, ld4(w_extra, e * w4 + cols4 + c4));
    }
}

extern "C" __global__ void glu_forward_vec4(
    const float* pv, const float* bias, const float* x_extra, const float* w_extra, int n_extra,
    float* h, long long total, int cols)
{
    const int cols4 = cols >> 2;
    GRID_STRIDE(t, total >> 2) {
        const int r = t / cols4, c4 = t - r * cols4;
        float4 pg, vv;
        glu_inputs4(pv, bias, x_extra, w_extra, n_extra, r, c4, cols4, pg, vv);
        st4(h, t, make_float4(stable_sigmoid(pg.x) * vv.x, stable_sigmoid(pg.y) * vv.y,
                              stable_sigmoid(pg.z) * vv.z, stable_sigmoid(pg.w) * vv.w));
    }
}

extern "C" __global__ void glu_backward_vec4(
    const float* dh, const float* pv, const float* bias, const float* x_extra, const float* w_extra,
    int n_extra, float* dpv, long long total, int cols)
{
    const int cols4 = cols >> 2;
    GRID_STRIDE(t, total >> 2) {
        const int r = t / cols4, c4 = t - r * cols4;
        float4 pg, vv;
        glu_inputs4(pv, bias, x_extra, w_extra, n_extra, r, c4, cols4, pg, vv);
        const float4 d = ld4(dh, t);
        const float4 g = make_float4(stable_sigmoid(pg.x), stable_sigmoid(pg.y),
                                     stable_sigmoid(pg.z), stable_sigmoid(pg.w));
        st4(dpv, r * 2 * cols4 + c4, make_float4(d.x * vv.x * g.x * (1.0f - g.x), d.y * vv.y * g.y * (1.0f - g.y),
                                                 d.z * vv.z * g.z * (1.0f - g.z), d.w * vv.w * g.w * (1.0f - g.w)));
        st4(dpv, r * 2 * cols4 + cols4 + c4, make_float4(d.x * g.x, d.y * g.y, d.z * g.z, d.w * g.w));
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

// m may be null (a forward whose caches are not kept writes only z).
extern "C" __global__ void vsn_forward(
    const float* h2,                     // [rows, cols]
    const float* mpre,                   // [rows, cols] h2 @ W_vsn
    const float* bias,                   // [cols] or null
    float* m,                            // [rows, cols] or null
    float* z,                            // [rows, cols]
    long long total, int cols)
{
    GRID_STRIDE(i, total) {
        const float pre = bias != nullptr ? mpre[i] + bias[(int)(i % cols)] : mpre[i];
        const float s = stable_sigmoid(pre);
        if (m != nullptr) m[i] = s;
        z[i] = h2[i] * s;
    }
}

// vsn_forward on four consecutive columns per thread (as glu_forward_vec4).
extern "C" __global__ void vsn_forward_vec4(
    const float* h2, const float* mpre, const float* bias, float* m, float* z, long long total, int cols)
{
    const int cols4 = cols >> 2;
    GRID_STRIDE(t, total >> 2) {
        float4 p = ld4(mpre, t);
        if (bias != nullptr) {
            const float4 b = ld4(bias, t % cols4);
            p.x += b.x; p.y += b.y; p.z += b.z; p.w += b.w;
        }
        const float4 s = make_float4(stable_sigmoid(p.x), stable_sigmoid(p.y), stable_sigmoid(p.z), stable_sigmoid(p.w));
        if (m != nullptr) st4(m, t, s);
        const float4 h = ld4(h2, t);
        st4(z, t, make_float4(h.x * s.x, h.y * s.y, h.z * s.z, h.w * s.w));
    }
}

extern "C" __global__ void vsn_backward(
    const float* dz, const float* h2, const float* m,       // [total]
    float* dh2, float* dmpre,                               // [total]
    long long total)
{
    GRID_STRIDE(i, total) {
        const float d = dz[i];
        const float s = m[i];
        const float dm = d * h2[i];
        dh2[i] = d * s;
        dmpre[i] = dm * s * (1.0f - s);
    }
}
