// kan_gate as a fragment of the core's GLU kernels (foxhunt_core/kernels/gate.cuh): compiled
// into glu_gemm's epilogue (the gate of every output element) and glu_backward_gemm's (its
// backward and the unit's parameter-gradient terms), and into the elementwise GLU kernels.
//
// The forward and the backward read different forms of the spline (GateFragment.forward_arrays):
//   forward  (gate_value):    b{b}.power [adv_h, KG_NUM_BASES], the unit's spline in the knot-power
//                             form (kan_gate.cuh), which the stage derives from b{b}.coeff before
//                             each forward (kan_power in kan_gate.cu), and b{b}.residual [adv_h];
//   backward (gate_backward): b{b}.coeff [adv_h, KG_NUM_BASES] and b{b}.residual, whose gradients
//                             it forms.
// The forward evaluates every knot term of the unit whatever x is: the unit's floats are read at
// addresses that do not depend on x. Reading the four coefficients at x's knot interval (what the
// backward does) cost glu_gemm 1.42x the sigmoid's time at 131072 rows, against 1.28x (both with
// 168 registers; docs/benchmark-history.md, 2026-12-03): loads whose addresses wait on x, in an
// epilogue with few registers to spare for hiding them. In the backward the knot-power form gained nothing
// (its terms are the bases' values at x's interval either way).
#pragma once
#include "kan_gate.cuh"

#define GATE_UNIT0 KG_NUM_BASES
#define GATE_UNIT1 1
#define GATE_LONG 1  // (the backward: about 110 instructions an element; the epilogues keep one part's copy)

__device__ __forceinline__ float gate_value(float x, const GateUnit& u) {
    const KanPower w = kan_power_load(u.p0);
    return kan_clamp01(fmaf(__ldg(u.p1), x, kan_power_spline(w, kan_u(x))));
}

__device__ __forceinline__ float gate_backward(float x, const GateUnit& u, float dh, float v, float* gate,
                                               float* terms) {
    const float r = __ldg(u.p1);
    const KanPoint p = kan_locate(x);
    float w[4];
    kan_window(u.p0, p.span, w);
    const float raw = kan_raw_window(x, w, r, p);
    *gate = kan_clamp01(raw);
    const float md = (raw > 0.0f && raw < 1.0f) ? dh * v : 0.0f;  // d loss / d gate through the clamp
    float slope = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) slope += w[j] * p.s[j];
    // md B_k for every k: the four nonzero values shifted to span .. span + 3 in binary steps
    // (by 1, 2, 4, ... where span has the bit), a layer of selects each. Every index is a
    // compile-time constant, so terms stays in registers: stores into terms[span + j] put the
    // array in local memory (most of the kernel's time), and a chain of selects per basis took
    // ptxas a minute to schedule.
#pragma unroll
    for (int k = 0; k < KG_NUM_BASES; ++k) terms[k] = k < 4 ? md * p.b[k] : 0.0f;
#pragma unroll
    for (int step = 1; step < KG_INTERVALS; step *= 2) {
        const bool on = (p.span & step) != 0;
#pragma unroll
        for (int k = KG_NUM_BASES - 1; k >= 0; --k) terms[k] = on ? (k >= step ? terms[k - step] : 0.0f) : terms[k];
    }
    terms[KG_NUM_BASES] = md * x;
    return md * (slope + r);
}
