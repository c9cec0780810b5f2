// The tests' tanh gate (hook_plugins.TanhGateStage) as a fragment of the core's GLU kernels
// (foxhunt_core/kernels/gate.cuh): gate = (1 + tanh(s x)) / 2 with a slope s per unit, branch
// b's slopes in array 0 (b{b}.slope [adv_h]).
#pragma once

#define GATE_UNIT0 1
#define GATE_UNIT1 0

__device__ __forceinline__ float gate_value(float x, const GateUnit& u) { return 0.5f * (1.0f + tanhf(*u.p0 * x)); }

__device__ __forceinline__ float gate_backward(float x, const GateUnit& u, float dh, float v, float* gate,
                                               float* terms) {
    const float s = *u.p0, y = tanhf(s * x);
    *gate = 0.5f * (1.0f + y);
    const float dy = 0.5f * (dh * v) * (1.0f - y * y);  // d loss / d (s x)
    terms[0] = dy * x;
    return dy * s;
}
