// The KAN spline gate of one GLU unit as device functions: its value from the pre-activation and
// the unit's parameters, its derivative, and the unit's parameter-gradient terms. Two forms: the
// B-spline form at x's knot interval (kan_gate_value, kan_gate_grad + kan_accumulate), which the
// plugin's standalone kernels (kan_gate.cu) use, and the knot-power form below, which the fused
// GLU kernels' epilogues evaluate through kan_fragment.cuh (no interval looked for).
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

// ---- the knot-power form (spline.py knot_power_map; what the fused GLU kernels evaluate) ----
// A unit's KG_NUM_BASES floats p = (a0..a3, d_{m+1}..d_{G-1}, e_m..e_1) and, with u =
// (clamp(x, lo, hi) - lo) / h and s = u - (m + 1/2):
//   S = a0 + a1 s + a2 s^2 + a3 s^3 + sum_i d_i (u - i)_+^3 + sum_i e_i (i - u)_+^3.
// Every term is evaluated for every element (no interval, no data-dependent index): the unit's
// floats are loaded once, whatever x is.
#define KG_MID ((KG_INTERVALS - 1) / 2)             // m: the middle interval [m, m + 1]
#define KG_RIGHT (KG_INTERVALS - 1 - KG_MID)        // knots m + 1 .. G - 1
#define KG_LEFT KG_MID                              // knots m .. 1

// A unit's knot-power floats, through the read-only path, as float4s where the row allows it
// (its rows are KG_NUM_BASES floats: 16-byte aligned when that is a multiple of 4).
struct KanPower {
    float p[KG_NUM_BASES];
};

__device__ __forceinline__ KanPower kan_power_load(const float* c) {
    KanPower w;
#if KG_NUM_BASES % 4 == 0
#pragma unroll
    for (int j = 0; j < KG_NUM_BASES / 4; ++j) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(c) + j);
        w.p[4 * j] = v.x, w.p[4 * j + 1] = v.y, w.p[4 * j + 2] = v.z, w.p[4 * j + 3] = v.w;
    }
#else
#pragma unroll
    for (int j = 0; j < KG_NUM_BASES; ++j) w.p[j] = __ldg(c + j);
#endif
    return w;
}

// s = u - (m + 1/2), u = (clamp(x, lo, hi) - lo) / h in [0, G]: the centred argument of the
// knot-power form, in one multiply-add (a NaN input lands at lo, as in kan_locate).
__device__ __forceinline__ float kan_s(float x) {
    const float inv_step = (float)KG_INTERVALS / (KG_GRID_HI - KG_GRID_LO);
    return fmaf(fminf(fmaxf(x, KG_GRID_LO), KG_GRID_HI), inv_step,
                -KG_GRID_LO * inv_step - ((float)KG_MID + 0.5f));
}

// The truncated cubes in pairs: right knot m + 1 + i sits at s = 1/2 + i, left knot m - i at
// s = -(1/2 + i), so the pair's cube is (|s| - 1/2 - i)_+^3 times d_{m+1+i} where s > 0 and
// e_{m-i} where not (the other's is 0 there): one cube a pair, its coefficient a select. The right
// side has one knot more than the left where G is even (KG_RIGHT - KG_LEFT: 0 or 1).
#define KG_PAIRS KG_LEFT

// The spline S at s (the residual term and the clamp are the caller's).
__device__ __forceinline__ float kan_power_spline(const KanPower& w, float s) {
    float raw = fmaf(fmaf(fmaf(w.p[3], s, w.p[2]), s, w.p[1]), s, w.p[0]);
    const bool right = s > 0.0f;
#pragma unroll
    for (int i = 0; i < KG_PAIRS; ++i) {
        const float t = fmaxf(fabsf(s) - (0.5f + (float)i), 0.0f);
        raw = fmaf((right ? w.p[4 + i] : w.p[4 + KG_RIGHT + i]) * t, t * t, raw);
    }
#pragma unroll
    for (int i = KG_PAIRS; i < KG_RIGHT; ++i) {
        const float t = fmaxf(s - (0.5f + (float)i), 0.0f);
        raw = fmaf(w.p[4 + i] * t, t * t, raw);
    }
    return raw;
}

// The spline at s with what its backward needs: the value S (kan_power_spline's arithmetic, bit
// for bit), its slope dS/du, and the knot-power basis phi_j (spline.knot_terms' order: 1, s, s^2,
// s^3, the right cubes, the left cubes), whose sums against d loss / d S are the knot-power
// floats' gradients (the coefficients': through the map's transpose, kan_terms_to_grads).
struct KanPowerPoint {
    float value, slope;
    float phi[KG_NUM_BASES];
};

__device__ __forceinline__ KanPowerPoint kan_power_point(const KanPower& w, float s) {
    KanPowerPoint q;
    const float s2 = s * s;
    float raw = fmaf(fmaf(fmaf(w.p[3], s, w.p[2]), s, w.p[1]), s, w.p[0]);
    const float poly = fmaf(fmaf(3.0f * w.p[3], s, 2.0f * w.p[2]), s, w.p[1]);  // its slope
    const bool right = s > 0.0f;
    float pairs = 0.0f, extra = 0.0f;  // the cubes' slopes / 3: sum c t^2 (a left cube's falls), the extra knots'
    q.phi[0] = 1.0f, q.phi[1] = s, q.phi[2] = s2, q.phi[3] = s2 * s;
#pragma unroll
    for (int i = 0; i < KG_PAIRS; ++i) {
        const float t = fmaxf(fabsf(s) - (0.5f + (float)i), 0.0f), t2 = t * t, c = right ? w.p[4 + i] : w.p[4 + KG_RIGHT + i];
        raw = fmaf(c * t, t2, raw);
        pairs = fmaf(c, t2, pairs);
        const float cube = t2 * t;
        q.phi[4 + i] = right ? cube : 0.0f;
        q.phi[4 + KG_RIGHT + i] = right ? 0.0f : cube;
    }
#pragma unroll
    for (int i = KG_PAIRS; i < KG_RIGHT; ++i) {
        const float t = fmaxf(s - (0.5f + (float)i), 0.0f), t2 = t * t;
        raw = fmaf(w.p[4 + i] * t, t2, raw);
        extra = fmaf(w.p[4 + i], t2, extra);
        q.phi[4 + i] = t2 * t;
    }
    q.value = raw;
    q.slope = fmaf(3.0f, (right ? pairs : -pairs) + extra, poly);
    return q;
}

#ifdef KG_POWER_MAP
// A unit's sums of md phi_j (the knot-power floats' gradients) as its coefficients' gradients, in
// place: p = c M (spline.knot_power_map, compiled in as KG_POWER_MAP), so d/dc = M d/dp. In float32:
// the map's entries are at most 1, so the sums' float32 error passes through it about as it is
// (tests/test_kan_fragment_emu.py bounds the mapped terms per element against the B-spline's).
__device__ __forceinline__ void kan_terms_to_grads(float* t) {
    constexpr double m[KG_NUM_BASES * KG_NUM_BASES] = KG_POWER_MAP;
    float p[KG_NUM_BASES];
#pragma unroll
    for (int j = 0; j < KG_NUM_BASES; ++j) p[j] = t[j];
#pragma unroll
    for (int k = 0; k < KG_NUM_BASES; ++k) {
        float g = 0.0f;
#pragma unroll
        for (int j = 0; j < KG_NUM_BASES; ++j) {
            const double e = m[k * KG_NUM_BASES + j];  // (the map's zeros come out of its solve as 1e-14 or so)
            if (e > 1e-9 || e < -1e-9) g = fmaf((float)e, p[j], g);
        }
        t[k] = g;
    }
}
#endif

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
