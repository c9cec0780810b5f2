// Activations (and a rounding) shared by several kernel sources.
#pragma once

__device__ __forceinline__ float stable_sigmoid(float x) {
    // Split by sign so that expf never overflows (as layers.sigmoid does).
    const float e = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

// x rounded to TF32 (10 mantissa bits), to nearest with ties away from zero: as cuBLAS's TF32
// GEMMs and glu_gemm round their operands, so an operand written so is read unchanged by them.
__device__ __forceinline__ float tf32_nearest(float x) {
    unsigned v = __float_as_uint(x);
    asm("cvt.rna.tf32.f32 %0, %0;\n" : "+r"(v));
    return __uint_as_float(v);
}
