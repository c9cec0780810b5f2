// kan_gate as a fragment of the core's GLU kernels (foxhunt_core/kernels/gate.cuh): compiled
// into glu_gemm's epilogue (the gate of every output element) and glu_backward_gemm's (its
// backward and the unit's parameter-gradient terms), and into the elementwise GLU kernels.
//
// Both read the spline in its knot-power form (GateFragment.forward_arrays and backward_arrays):
//   b{b}.power [adv_h, KG_NUM_BASES], the unit's spline in the knot-power form (kan_gate.cuh),
//   which the stage derives from b{b}.coeff before each forward (kan_power in kan_gate.cu; the
//   fused backward takes its forward's), and b{b}.residual [adv_h].
// Every knot term of the unit is evaluated whatever x is: the unit's floats are read at addresses
// that do not depend on x, and no knot interval is looked for. Reading the four coefficients at
// x's knot interval cost glu_gemm 1.42x the sigmoid's time at 131072 rows, against 1.28x (both
// with 168 registers; docs/benchmark-history.md, 2026-12-03): loads whose addresses wait on x, in
// an epilogue with few registers to spare for hiding them.
//
// The backward's terms are the knot-power basis at x times d loss / d raw (GATE_TERMS_MAP):
// shifting the B-spline bases' four values to x's interval took a layer of selects per bit of the
// interval and most of the epilogue's instructions; the kernels map each unit's sums back to the
// coefficients' gradients (kan_terms_to_grads) before they leave them.
#pragma once
#include "kan_gate.cuh"

#define GATE_UNIT0 KG_NUM_BASES
#define GATE_UNIT1 1
#define GATE_LONG 1  // (the backward: about 60 instructions an element; the epilogues keep one part's copy)
#define GATE_TERMS_MAP 1

__device__ __forceinline__ float gate_value(float x, const GateUnit& u) {
    const KanPower w = kan_power_load(u.p0);
    return kan_clamp01(fmaf(__ldg(u.p1), x, kan_power_spline(w, kan_s(x))));
}

__device__ __forceinline__ float gate_backward(float x, const GateUnit& u, float dh, float v, float* gate,
                                               float* terms) {
    const float r = __ldg(u.p1);
    const KanPowerPoint q = kan_power_point(kan_power_load(u.p0), kan_s(x));
    const float raw = fmaf(r, x, q.value);  // (gate_value's, bit for bit)
    *gate = kan_clamp01(raw);
    const float md = (raw > 0.0f && raw < 1.0f) ? dh * v : 0.0f;  // d loss / d raw through the clamp
    // d raw / d x: the spline's slope inside the grid (0 where the input is clamped) and r
    const float inv_step = (float)KG_INTERVALS / (KG_GRID_HI - KG_GRID_LO);
    const float k = (x >= KG_GRID_LO && x <= KG_GRID_HI) ? inv_step : 0.0f;
#pragma unroll
    for (int j = 0; j < KG_NUM_BASES; ++j) terms[j] = md * q.phi[j];
    terms[KG_NUM_BASES] = md * x;
    return md * fmaf(q.slope, k, r);
}

// The knot-power floats' gradients as the coefficients' (the residual's term is its gradient).
__device__ __forceinline__ void gate_terms_to_grads(float (&t)[KG_TERMS]) { kan_terms_to_grads(t); }
