// Elementwise layers of the network between its GEMMs: forward and backward.
//
// NumPy twins (foxhunt_core/net/layers.py and foxhunt_core/net/network.py):
//   glu_forward        gate = sigmoid(pre + b_gate), val += b_val, h = gate * val   (GLU of a branch)
//   glu_backward       dpre = dh * val * gate * (1 - gate), dval = dh * gate
//   bias_relu_forward  y = relu(x + b)                                               (trunk layers)
//   relu_backward      dx = (dy + addend) * (y > 0)                                  (addend optional)
//   vsn_forward        m = sigmoid(mpre + b), z = h2 * m                             (variable selection)
//   vsn_backward       dh2 = dz * m, dmpre = dz * h2 * m * (1 - m)
// Launch wrappers: foxhunt_core/gpu/kernels.py.
//
// Thread mapping: one thread per element, grid-stride loop; `cols` is the width of the
// row-major [rows, cols] arrays (the bias index is the column). Every output may alias the
// input it replaces (same index read before written), so all of them can run in place.

__device__ __forceinline__ float stable_sigmoid(float x) {
    // Split by sign so that expf never overflows (as layers.sigmoid does).
    const float e = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

extern "C" __global__ void glu_forward(
    const float* pre_gate,               // [rows, cols]
    float* val,                          // [rows, cols]; receives val + val_bias when it is given
    const float* gate_bias,              // [cols] or null
    const float* val_bias,               // [cols] or null
    float* gate,                         // [rows, cols]
    float* h,                            // [rows, cols]
    long long total, int cols)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(i % cols);
        const float pg = gate_bias != nullptr ? pre_gate[i] + gate_bias[c] : pre_gate[i];
        float vv = val[i];
        if (val_bias != nullptr) {
            vv += val_bias[c];
            val[i] = vv;  // the backward needs the biased value
        }
        const float s = stable_sigmoid(pg);
        gate[i] = s;
        h[i] = s * vv;
    }
}

extern "C" __global__ void glu_backward(
    const float* dh, const float* gate, const float* val,   // [total]
    float* dpre_gate, float* dval,                          // [total]
    long long total)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = gate[i];
        const float d = dh[i];
        const float dgate = d * val[i];
        dpre_gate[i] = dgate * g * (1.0f - g);
        dval[i] = d * g;
    }
}

extern "C" __global__ void bias_relu_forward(
    const float* x,                      // [rows, cols]
    const float* bias,                   // [cols]
    float* y,                            // [rows, cols]
    long long total, int cols)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
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
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = addend != nullptr ? dy[i] + addend[i] : dy[i];
        dx[i] = y[i] > 0.0f ? g : 0.0f;
    }
}

extern "C" __global__ void vsn_forward(
    const float* h2,                     // [rows, cols]
    const float* mpre,                   // [rows, cols] h2 @ W_vsn
    const float* bias,                   // [cols] or null
    float* m,                            // [rows, cols]
    float* z,                            // [rows, cols]
    long long total, int cols)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const float pre = bias != nullptr ? mpre[i] + bias[(int)(i % cols)] : mpre[i];
        const float s = stable_sigmoid(pre);
        m[i] = s;
        z[i] = h2[i] * s;
    }
}

extern "C" __global__ void vsn_backward(
    const float* dz, const float* h2, const float* m,       // [total]
    float* dh2, float* dmpre,                               // [total]
    long long total)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const float d = dz[i];
        const float s = m[i];
        const float dm = d * h2[i];
        dh2[i] = d * s;
        dmpre[i] = dm * s * (1.0f - s);
    }
}
