// Activations (and a rounding) shared by several kernel sources.
#pragma once

__device__ __forceinline__ float stable_sigmoid(float x) {
    // Split by sign so that expf never overflows (as layers.sigmoid does).
    const float e = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

// sigmoid(x) = 1 / (1 + e^-x) with the fast exponential and reciprocal (MUFU): a few instructions
// against about forty of the exact expf and division, which made the epilogue, not the tensor
// cores, glu_gemm's bottleneck. Relative error a few 1e-7 (|x| < 20; e^-x overflowing to inf
// gives 0, as it should).
__device__ __forceinline__ float fast_sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

// x rounded to TF32 (10 mantissa bits), to nearest with ties away from zero: as cuBLAS's TF32
// GEMMs and glu_gemm round their operands, so an operand written so is read unchanged by them.
__device__ __forceinline__ float tf32_nearest(float x) {
    unsigned v = __float_as_uint(x);
    asm("cvt.rna.tf32.f32 %0, %0;\n" : "+r"(v));
    return __uint_as_float(v);
}
