// The gate of the GLU (h = gate(pre) * value) as the GLU kernels compile it in: the contract a
// gate's CUDA fragment meets. glu_gemm's epilogue, glu_backward_gemm's and the elementwise GLU
// kernels of gate_glu.cu include this header, which includes the fragment named by GATE_HEADER
// (the launch wrapper's define; the built-in sigmoid, gate_sigmoid.cuh, when none is given).
//
// A fragment defines, for one GLU unit (a column of one branch):
//   GATE_UNIT0, GATE_UNIT1   floats per unit of the gate's (up to) two parameter arrays per branch
//                            (0: the array is not read); unit j's are at p0 + j GATE_UNIT0 and
//                            p1 + j GATE_UNIT1 (each array row-major [units, GATE_UNITk], contiguous)
//   float gate_value(float x, const GateUnit& u)
//                            the gate at pre-activation x
//   float gate_backward(float x, const GateUnit& u, float dh, float v, float* gate, float* terms)
//                            d loss / d x, given dh (d loss / d h) and the value v, with d loss /
//                            d gate = dh v; the gate at x in *gate; and the element's terms of the
//                            unit's parameter gradients in terms[0 .. GATE_TERMS - 1]: array 0's
//                            GATE_UNIT0 floats, then array 1's (terms must be 0 where dh is 0)
// and may define
//   GATE_LONG 1              its per-element code is long (kan_gate's spline): the GEMM epilogues,
//                            which inline it once per accumulator element, then loop over their
//                            parts of a tile instead of unrolling them, to stay within the
//                            instruction cache (default 0)
//   GATE_TERMS_MAP 1         its terms are a linear image of the gradients, not the gradients
//                            themselves (kan_gate's: in the spline's knot-power basis, which needs
//                            no knot interval), with
//   void gate_terms_to_grads(float (&t)[GATE_TERMS])
//                            a unit's summed terms, in place, as its parameters' gradients (the
//                            same order as the terms). The kernels apply it to each of their
//                            partial sums before it leaves them: the map being linear, the sum of
//                            the mapped partials is the gradient (default 0: the terms are the
//                            gradients)
// The parameters that gate_backward reads may be other arrays than the gradients it forms (the
// GateFragment's backward_arrays, Python side): kan_gate's backward reads the knot-power form too.
// The kernels sum the terms over the batch themselves (per tile in registers and shuffles, the
// tiles' sums in a fixed order: no atomics, the same bits on every run).
#pragma once
#include "defines.cuh"  // GATE_MAX_SETS

#ifndef GATE_HEADER
#define GATE_HEADER "gate_sigmoid.cuh"
#endif

// A unit's parameters: where its floats of each array start.
struct GateUnit {
    const float* p0;
    const float* p1;
};

// Every branch's parameter arrays (p) and, for the backward, where their gradients go (g), by
// value: a captured graph keeps its own copy of the pointers.
struct __align__(8) GateArgs {
    const float* p[GATE_MAX_SETS][2];
    float* g[GATE_MAX_SETS][2];
};

#include GATE_HEADER

#ifndef GATE_LONG
#define GATE_LONG 0
#endif
#ifndef GATE_TERMS_MAP
#define GATE_TERMS_MAP 0
#endif
#define GATE_TERMS (GATE_UNIT0 + GATE_UNIT1)
// The launch's parameter arrays as the fragment reads them (the wrapper's GATE_EXPECT_UNIT*: the
// fragment's Python description).
#ifdef GATE_EXPECT_UNIT0
static_assert(GATE_UNIT0 == GATE_EXPECT_UNIT0 && GATE_UNIT1 == GATE_EXPECT_UNIT1,
              "the gate fragment's GATE_UNIT0/1 differ from its GateFragment's unit_floats");
#endif
#define GATE_TERM_SLOTS (GATE_TERMS > 0 ? GATE_TERMS : 1)  // (arrays of GATE_TERMS floats, never empty)

__device__ __forceinline__ GateUnit gate_unit(const GateArgs& a, int set, int j) {
    GateUnit u;
    u.p0 = a.p[set][0] + (long long)j * GATE_UNIT0;
    u.p1 = a.p[set][1] + (long long)j * GATE_UNIT1;
    return u;
}

// The gradient of branch `set`'s unit j's parameter term t, written where the launch wants it.
__device__ __forceinline__ void gate_store_grad(const GateArgs& a, int set, int j, int t, float value) {
    if (t < GATE_UNIT0) {
        a.g[set][0][(long long)j * GATE_UNIT0 + t] = value;
    } else {
        a.g[set][1][(long long)j * GATE_UNIT1 + (t - GATE_UNIT0)] = value;
    }
}

// A unit's partial sums of its terms as its parameters' partial gradients, in place (the
// fragment's gate_terms_to_grads where it has one; otherwise they are already).
__device__ __forceinline__ void gate_terms_grads(float (&t)[GATE_TERM_SLOTS]) {
#if GATE_TERMS_MAP && GATE_TERMS > 0
    gate_terms_to_grads(t);
#else
    (void)t;
#endif
}
