// The KAN spline gate of one GLU unit as device functions: its value from the pre-activation and
// the unit's parameters, its derivative, and the unit's parameter-gradient terms. Included by the
// plugin's standalone kernels (kan_gate.cu) and meant for a GEMM epilogue, which calls
// kan_gate_value per output element in the forward and kan_gate_grad + kan_accumulate in the
// backward (reducing the accumulators over its rows itself, without per-element atomics).
//
// Per unit: coefficients c[0 .. KG_NUM_BASES - 1] of uniform cubic B-splines whose
// KG_NUM_BASES - 3 knot intervals cover [KG_GRID_LO, KG_GRID_HI], and a residual weight r:
//   raw = sum_k c[k] B_k(clamp(x, lo, hi)) + r x,   gate = clamp(raw, 0, 1).
// The NumPy twin and the equations are foxhunt_kan_gate/gate.py and spline.py.
#pragma once

#ifndef KG_NUM_BASES
#define KG_NUM_BASES 8
#endif
#ifndef KG_GRID_LO
#define KG_GRID_LO (-4.0f)
#endif
#ifndef KG_GRID_HI
#define KG_GRID_HI (4.0f)
#endif

#define KG_INTERVALS (KG_NUM_BASES - 3)
// A unit's parameter gradients: its KG_NUM_BASES coefficients, then its residual weight.
#define KG_TERMS (KG_NUM_BASES + 1)

static_assert(KG_NUM_BASES >= 4, "a cubic spline needs at least four bases");

// Where x falls on the grid: the first of the four nonzero bases, their values, and their slopes
// d/dx (0 outside [lo, hi], where the clamped input makes the spline constant).
struct KanPoint {
    int span;
    float b[4];
    float s[4];
};

__device__ __forceinline__ KanPoint kan_locate(float x) {
    const float inv_step = (float)KG_INTERVALS / (KG_GRID_HI - KG_GRID_LO);
    // fmaxf/fminf return the other operand for NaN: a NaN input lands at lo (its value still
    // reaches raw through the residual term, so the gate stays NaN).
    const float u = (fminf(fmaxf(x, KG_GRID_LO), KG_GRID_HI) - KG_GRID_LO) * inv_step;
    // x == hi belongs to the last interval at t = 1, not to an interval past the end
    const int span = min(max((int)floorf(u), 0), KG_INTERVALS - 1);
    const float t = u - (float)span, t2 = t * t, t3 = t2 * t, w = 1.0f - t;
    KanPoint p;
    p.span = span;
    p.b[0] = w * w * w * (1.0f / 6.0f);
    p.b[1] = (3.0f * t3 - 6.0f * t2 + 4.0f) * (1.0f / 6.0f);
    p.b[2] = (-3.0f * t3 + 3.0f * t2 + 3.0f * t + 1.0f) * (1.0f / 6.0f);
    p.b[3] = t3 * (1.0f / 6.0f);
    const float k = (x >= KG_GRID_LO && x <= KG_GRID_HI) ? inv_step : 0.0f;
    p.s[0] = -w * w * 0.5f * k;
    p.s[1] = (3.0f * t2 - 4.0f * t) * 0.5f * k;
    p.s[2] = (-3.0f * t2 + 2.0f * t + 1.0f) * 0.5f * k;  // dB2/dt = (-3t^2 + 2t + 1) / 2
    p.s[3] = t2 * 0.5f * k;
    return p;
}

// raw = r x + sum of the four nonzero c[k] B_k (in the twin's order); c: the unit's coefficients.
__device__ __forceinline__ float kan_raw(float x, const float* c, float r, const KanPoint& p) {
    float raw = r * x;
#pragma unroll
    for (int j = 0; j < 4; ++j) raw += c[p.span + j] * p.b[j];
    return raw;
}

// The unit's four coefficients c[span .. span + 3] that x's point needs, as the GEMM epilogues
// read them: through the read-only data path (the coefficients do not change during a kernel).
// Reading the unit's KG_NUM_BASES coefficients as whole float4s (addresses independent of x) and
// picking the window by selects was slower in both GLU kernels (benchmarks/bench_gate_epilogue.py,
// 2026-12-02: glu_gemm 1.75x the sigmoid's time against 1.40x, glu_backward_gemm 5.7x against 5.1x
// at 65536 rows): more live registers, for loads that hit L1 either way.
__device__ __forceinline__ void kan_window(const float* c, int span, float (&w)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = __ldg(c + span + j);
}

// kan_raw with the window of kan_window: the same sum in the same order.
__device__ __forceinline__ float kan_raw_window(float x, const float (&w)[4], float r, const KanPoint& p) {
    float raw = r * x;
#pragma unroll
    for (int j = 0; j < 4; ++j) raw += w[j] * p.b[j];
    return raw;
}

// clamp(raw, 0, 1) that lets NaN through (fminf/fmaxf would turn it into 0 or 1)
__device__ __forceinline__ float kan_clamp01(float raw) {
    return raw < 0.0f ? 0.0f : (raw > 1.0f ? 1.0f : raw);
}

// The gate of one element.
__device__ __forceinline__ float kan_gate_value(float x, const float* c, float r) {
    return kan_clamp01(kan_raw(x, c, r, kan_locate(x)));
}

// The backward of one element, given d loss / d gate: returns d loss / d x, and leaves in *p the
// grid point and in *md the gradient that passes the output clamp (dgate where 0 < raw < 1, else
// 0), from which kan_accumulate forms the unit's parameter-gradient terms.
__device__ __forceinline__ float kan_gate_grad(float x, const float* c, float r, float dgate, KanPoint* p,
                                               float* md) {
    *p = kan_locate(x);
    const float raw = kan_raw(x, c, r, *p);
    const float m = (raw > 0.0f && raw < 1.0f) ? dgate : 0.0f;
    float slope = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) slope += c[p->span + j] * p->s[j];
    *md = m;
    return m * (slope + r);
}

// Adds one element's parameter-gradient terms to the unit's accumulators acc[KG_TERMS]:
// acc[k] += md B_k (nonzero for k = span .. span + 3 only) and acc[KG_NUM_BASES] += md x, the
// residual weight's own element. Indices are compile-time constants, so acc stays in registers.
__device__ __forceinline__ void kan_accumulate(float (&acc)[KG_TERMS], const KanPoint& p, float md, float x) {
#pragma unroll
    for (int k = 0; k < KG_NUM_BASES; ++k) {
        const int j = k - p.span;
        const float b = j == 0 ? p.b[0] : j == 1 ? p.b[1] : j == 2 ? p.b[2] : j == 3 ? p.b[3] : 0.0f;
        acc[k] += md * b;
    }
    acc[KG_NUM_BASES] += md * x;
}
