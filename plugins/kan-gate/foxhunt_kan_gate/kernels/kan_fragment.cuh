// kan_gate as a fragment of the core's GLU kernels (foxhunt_core/kernels/gate.cuh): compiled
// into glu_gemm's epilogue (the gate of every output element) and glu_backward_gemm's (its
// backward and the unit's parameter-gradient terms), and into the elementwise GLU kernels.
// Branch b's arrays: b{b}.coeff [adv_h, KG_NUM_BASES] (array 0) and b{b}.residual [adv_h]
// (array 1). The arithmetic is kan_gate.cuh's, as the plugin's own kernels run it.
#pragma once
#include "kan_gate.cuh"

#define GATE_UNIT0 KG_NUM_BASES
#define GATE_UNIT1 1

__device__ __forceinline__ float gate_value(float x, const GateUnit& u) { return kan_gate_value(x, u.p0, *u.p1); }

__device__ __forceinline__ float gate_backward(float x, const GateUnit& u, float dh, float v, float* gate,
                                               float* terms) {
    const float r = *u.p1;
    const KanPoint p = kan_locate(x);
    const float raw = kan_raw(x, u.p0, r, p);
    *gate = kan_clamp01(raw);
    const float md = (raw > 0.0f && raw < 1.0f) ? dh * v : 0.0f;  // d loss / d gate through the clamp
    float slope = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) slope += u.p0[p.span + j] * p.s[j];
    // md B_k at k = span .. span + 3 (kan_accumulate's terms, here as one predicated block per span,
    // lighter for the GEMM epilogue that inlines this per element), then md x for the residual
#pragma unroll
    for (int k = 0; k < KG_NUM_BASES; ++k) terms[k] = 0.0f;
#pragma unroll
    for (int s = 0; s < KG_INTERVALS; ++s)
        if (p.span == s)
#pragma unroll
            for (int j = 0; j < 4; ++j) terms[s + j] = md * p.b[j];
    terms[KG_NUM_BASES] = md * x;
    return md * (slope + r);
}
