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
    KanPoint p;
    float md;
    const float dx = kan_gate_grad(x, u.p0, r, dh * v, &p, &md);
    *gate = kan_clamp01(kan_raw(x, u.p0, r, p));
    // md B_k for the coefficients (nonzero at span .. span + 3), then md x for the residual weight
    float acc[KG_TERMS];
#pragma unroll
    for (int k = 0; k < KG_TERMS; ++k) acc[k] = 0.0f;
    kan_accumulate(acc, p, md, x);
#pragma unroll
    for (int k = 0; k < KG_TERMS; ++k) terms[k] = acc[k];
    return dx;
}
