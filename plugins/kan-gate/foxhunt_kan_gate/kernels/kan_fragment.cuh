// kan_gate as a fragment of the core's GLU kernels (foxhunt_core/kernels/gate.cuh): compiled
// into glu_gemm's epilogue (the gate of every output element) and glu_backward_gemm's (its
// backward and the unit's parameter-gradient terms), and into the elementwise GLU kernels.
//
// Branch b's arrays read: b{b}.power [adv_h, KG_NUM_BASES] (array 0: the unit's spline in the
// knot-power form, which the stage derives from b{b}.coeff before each forward, kan_power in
// kan_gate.cu) and b{b}.residual [adv_h] (array 1). The gradients go to b{b}.coeff and
// b{b}.residual (the same floats a unit): the terms are the B-spline bases' values, d raw / d coeff.
//
// The forward evaluates every knot term of the unit, whatever x: its floats are read at addresses
// that do not depend on x, once per unit for the rows a thread holds. Reading the four B-spline
// coefficients at x's interval instead (kan_gate.cuh's kan_raw, what the plugin's own kernels
// run) cost glu_gemm 1.41x the sigmoid's time at 131072 rows against 1.28x
// (benchmarks/bench_gate_epilogue.py, 2026-12-03): four loads an element whose addresses wait on
// x, in an epilogue with few registers to spare for hiding them.
#pragma once
#include "kan_gate.cuh"

#define GATE_UNIT0 KG_NUM_BASES
#define GATE_UNIT1 1
#define GATE_LONG 1  // (about 110 instructions an element: the epilogues keep one part's copy)

__device__ __forceinline__ float gate_value(float x, const GateUnit& u) {
    const KanPower w = kan_power_load(u.p0);
    return kan_clamp01(fmaf(__ldg(u.p1), x, kan_power_spline(w, kan_u(x))));
}

__device__ __forceinline__ float gate_backward(float x, const GateUnit& u, float dh, float v, float* gate,
                                               float* terms) {
    const float r = __ldg(u.p1);
    const KanPower w = kan_power_load(u.p0);
    float dsdu;
    const float raw = fmaf(r, x, kan_power_spline_slope(w, kan_u(x), &dsdu));
    *gate = kan_clamp01(raw);
    const float md = (raw > 0.0f && raw < 1.0f) ? dh * v : 0.0f;  // d loss / d gate through the clamp
    // d spline / d x: 0 where x was clamped (the spline is constant there)
    const float inv_step = (float)KG_INTERVALS / (KG_GRID_HI - KG_GRID_LO);
    const float slope = (x >= KG_GRID_LO && x <= KG_GRID_HI) ? dsdu * inv_step : 0.0f;
    // the bases' values at x for the coefficients' terms (only the interval's four are nonzero)
    const KanPoint p = kan_locate(x);
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
