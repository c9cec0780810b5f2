// The built-in gate, sigmoid(x), as a fragment of gate.cuh (no parameters). Its forward takes the
// fast exponential and reciprocal (fast_sigmoid: a few instructions; the GEMM epilogues were bound
// by the exact expf and division), its backward the exact, overflow-free form, as glu_backward's.
// NumPy twin: foxhunt_core/net/network.py SigmoidGate.
#pragma once
#include "activation.cuh"

#define GATE_UNIT0 0
#define GATE_UNIT1 0

__device__ __forceinline__ float gate_value(float x, const GateUnit&) { return fast_sigmoid(x); }

__device__ __forceinline__ float gate_backward(float x, const GateUnit&, float dh, float v, float* gate, float*) {
    const float s = stable_sigmoid(x);
    *gate = s;
    return dh * s * v * (1.0f - s);
}
