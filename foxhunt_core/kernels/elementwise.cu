// Elementwise layers of the network between its GEMMs: forward and backward.
//
// NumPy twins (foxhunt_core/net/layers.py and foxhunt_core/net/network.py):
//   glu_forward        gate = sigmoid(pre + b_gate + x_e W_e,g), val += b_val + x_e W_e,v, h = gate * val
//   glu_backward       dpre = dh * val * gate * (1 - gate), dval = dh * gate
//   glu_backward_recompute  the same from the forward's GEMM outputs (gate and val recomputed)
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

// x_extra [rows, n_extra] are the branch's input columns beyond the shared features z (the
// magnitude branch's direction Q, branch-input stages): their rank-n_extra share of the two
// pre-activations, x_extra W_extra, is added here instead of widening the GEMM's input.
// With keep == 0 (a forward whose caches are not kept) only h is written.
extern "C" __global__ void glu_forward(
    const float* pre_gate,               // [rows, cols]  z W_gate[:H]
    float* val,                          // [rows, cols]  z W_val[:H]; receives the full pre-activation when keep
    const float* gate_bias,              // [cols] or null
    const float* val_bias,               // [cols] or null
    const float* x_extra,                // [rows, n_extra] or null
    const float* w_extra_gate,           // [n_extra, cols]
    const float* w_extra_val,            // [n_extra, cols]
    int n_extra, int keep,
    float* gate,                         // [rows, cols]
    float* h,                            // [rows, cols]
    long long total, int cols)
{
    GRID_STRIDE(i, total) {
        const int c = (int)(i % cols);
        float pg = gate_bias != nullptr ? pre_gate[i] + gate_bias[c] : pre_gate[i];
        float vv = val_bias != nullptr ? val[i] + val_bias[c] : val[i];
        if (x_extra != nullptr) {
            const int r = i / cols;
            for (int e = 0; e < n_extra; ++e) {
                const float x = x_extra[r * n_extra + e];
                pg += x * w_extra_gate[e * cols + c];
                vv += x * w_extra_val[e * cols + c];
            }
        }
        const float s = stable_sigmoid(pg);
        if (keep) {
            val[i] = vv;  // the backward needs the full value pre-activation
            gate[i] = s;
        }
        h[i] = s * vv;
    }
}

// glu_forward on four consecutive columns per thread (float4 loads and stores): the same
// arithmetic, for rows whose width is a multiple of 4 and arrays aligned to 16 bytes (the
// wrapper checks both and otherwise launches glu_forward). `total` and `cols` count floats.
__device__ __forceinline__ float4 ld4(const float* p, int i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ __forceinline__ void st4(float* p, int i, float4 v) { reinterpret_cast<float4*>(p)[i] = v; }

extern "C" __global__ void glu_forward_vec4(
    const float* pre_gate, float* val, const float* gate_bias, const float* val_bias,
    const float* x_extra, const float* w_extra_gate, const float* w_extra_val,
    int n_extra, int keep, float* gate, float* h, long long total, int cols)
{
    const int cols4 = cols >> 2;
    GRID_STRIDE(t, total >> 2) {
        const int c4 = t % cols4;
        float4 pg = ld4(pre_gate, t);
        float4 vv = ld4(val, t);
        if (gate_bias != nullptr) {
            const float4 b = ld4(gate_bias, c4);
            pg.x += b.x; pg.y += b.y; pg.z += b.z; pg.w += b.w;
        }
        if (val_bias != nullptr) {
            const float4 b = ld4(val_bias, c4);
            vv.x += b.x; vv.y += b.y; vv.z += b.z; vv.w += b.w;
        }
        if (x_extra != nullptr) {
            const int r = t / cols4;
            for (int e = 0; e < n_extra; ++e) {
                const float x = x_extra[r * n_extra + e];
                const float4 wg = ld4(w_extra_gate + e * cols, c4);
                const float4 wv = ld4(w_extra_val + e * cols, c4);
                pg.x += x * wg.x; pg.y += x * wg.y; pg.z += x * wg.z; pg.w += x * wg.w;
                vv.x += x * wv.x; vv.y += x * wv.y; vv.z += x * wv.z; vv.w += x * wv.w;
            }
        }
        const float4 sg = make_float4(stable_sigmoid(pg.x), stable_sigmoid(pg.y),
                                      stable_sigmoid(pg.z), stable_sigmoid(pg.w));
        if (keep) {
            st4(val, t, vv);
            st4(gate, t, sg);
        }
        st4(h, t, make_float4(sg.x * vv.x, sg.y * vv.y, sg.z * vv.z, sg.w * vv.w));
    }
}

extern "C" __global__ void glu_backward(
    const float* dh, const float* gate, const float* val,   // [total]
    float* dpre_gate, float* dval,                          // [total]
    long long total)
{
    GRID_STRIDE(i, total) {
        const float g = gate[i];
        const float d = dh[i];
        const float dgate = d * val[i];
        dpre_gate[i] = dgate * g * (1.0f - g);
        dval[i] = d * g;
    }
}

// The GLU backward from the forward's GEMM outputs instead of its cached gate and value: both
// are recomputed exactly as glu_forward forms them (biases, the extra columns' share), so the
// forward of an update writes only h -- two [rows, cols] arrays fewer through memory each way.
// dpre_gate / dval may alias pre_gate / val (the update writes them in place).
__device__ __forceinline__ float glu_pre(const float* x_extra, const float* w_extra, int n_extra, int r, int c,
                                         int cols, float acc) {
    for (int e = 0; e < n_extra; ++e) acc += x_extra[r * n_extra + e] * w_extra[e * cols + c];
    return acc;
}

extern "C" __global__ void glu_backward_recompute(
    const float* dh, const float* pre_gate, const float* val,   // [rows, cols]
    const float* gate_bias, const float* val_bias,               // [cols] or null
    const float* x_extra, const float* w_extra_gate, const float* w_extra_val, int n_extra,
    float* dpre_gate, float* dval,                               // [rows, cols]
    long long total, int cols)
{
    GRID_STRIDE(i, total) {
        const int c = (int)(i % cols);
        float pg = gate_bias != nullptr ? pre_gate[i] + gate_bias[c] : pre_gate[i];
        float vv = val_bias != nullptr ? val[i] + val_bias[c] : val[i];
        if (x_extra != nullptr) {
            const int r = i / cols;
            pg = glu_pre(x_extra, w_extra_gate, n_extra, r, c, cols, pg);
            vv = glu_pre(x_extra, w_extra_val, n_extra, r, c, cols, vv);
        }
        const float g = stable_sigmoid(pg);
        const float d = dh[i];
        dpre_gate[i] = d * vv * g * (1.0f - g);
        dval[i] = d * g;
    }
}

// glu_backward_recompute on four consecutive columns per thread (as glu_forward_vec4).
extern "C" __global__ void glu_backward_recompute_vec4(
    const float* dh, const float* pre_gate, const float* val, const float* gate_bias, const float* val_bias,
    const float* x_extra, const float* w_extra_gate, const float* w_extra_val, int n_extra,
    float* dpre_gate, float* dval, long long total, int cols)
{
    const int cols4 = cols >> 2;
    GRID_STRIDE(t, total >> 2) {
        const int c4 = t % cols4;
        float4 pg = ld4(pre_gate, t);
        float4 vv = ld4(val, t);
        if (gate_bias != nullptr) {
            const float4 b = ld4(gate_bias, c4);
            pg.x += b.x; pg.y += b.y; pg.z += b.z; pg.w += b.w;
        }
        if (val_bias != nullptr) {
            const float4 b = ld4(val_bias, c4);
            vv.x += b.x; vv.y += b.y; vv.z += b.z; vv.w += b.w;
        }
        if (x_extra != nullptr) {
            const int r = t / cols4;
            for (int e = 0; e < n_extra; ++e) {
                const float x = x_extra[r * n_extra + e];
                const float4 wg = ld4(w_extra_gate + e * cols, c4);
                const float4 wv = ld4(w_extra_val + e * cols, c4);
                pg.x += x * wg.x; pg.y += x * wg.y; pg.z += x * wg.z; pg.w += x * wg.w;
                vv.x += x * wv.x; vv.y += x * wv.y; vv.z += x * wv.z; vv.w += x * wv.w;
            }
        }
        const float4 d = ld4(dh, t);
        const float4 g = make_float4(stable_sigmoid(pg.x), stable_sigmoid(pg.y),
                                     stable_sigmoid(pg.z), stable_sigmoid(pg.w));
        st4(dpre_gate, t, make_float4(d.x * vv.x * g.x * (1.0f - g.x), d.y * vv.y * g.y * (1.0f - g.y),
                                      d.z * vv.z * g.z * (1.0f - g.z), d.w * vv.w * g.w * (1.0f - g.w)));
        st4(dval, t, make_float4(d.x * g.x, d.y * g.y, d.z * g.z, d.w * g.w));
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
