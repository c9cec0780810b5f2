// The tests' tanh gate (hook_plugins.TanhGateStage) as a fragment of the core's GLU kernels
// (foxhunt_core/kernels/gate.cuh): gate = (1 + tanh(s x)) / 2 with a slope s per unit, branch
// b's slopes in array 0 (b{b}.slope [adv_h]). (1 + tanh(a)) / 2 is sigmoid(2 a): the forward
// takes the GLU's fast sigmoid, the backward the exact one, as the built-in gate does.
#pragma once
#include "activation.cuh"

#define GATE_UNIT0 1
#define GATE_UNIT1 0

__device__ __forceinline__ float gate_value(float x, const GateUnit& u) { return fast_sigmoid(2.0f * *u.p0 * x); }

__device__ __forceinline__ float gate_backward(float x, const GateUnit& u, float dh, float v, float* gate,
                                               float* terms) {
    const float s = *u.p0, g = stable_sigmoid(2.0f * s * x);
    *gate = g;
    const float da = 2.0f * (dh * v) * g * (1.0f - g);  // d loss / d (s x): d gate / d a = (1 - tanh^2) / 2
    terms[0] = da * x;
    return da * s;
}
