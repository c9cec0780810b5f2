// The dueling forward of one row (a sample's branch): by one warp (dueling_row: dueling.cu's
// dueling_softmax_forward) or by a group of eight lanes (dueling_group_row: linear_gemm.cu's
// dueling warps, the advantage heads' GEMM with the softmax over atoms in the same kernel), with
// the warp reductions and fast math they use.
//
// NumPy twin: foxhunt_core/gpu/reference.py dueling_softmax_forward. Compile-time sizes: sizes.cuh.
#pragma once

#include "sizes.cuh"

#define ATOMS_PER_LANE ((NUM_ATOMS + 31) / 32)
#define FULL_MASK 0xffffffffu
// Actions whose softmax sums one warp_spread reduces at once (three sums each, at most 32 values).
#define SPREAD_ACTIONS (MAX_BRANCH_SIZE < 10 ? MAX_BRANCH_SIZE : 10)
#define LOG2E 1.44269504f
#define LN2 0.693147181f

__constant__ int kBranchOffsets[NUM_BRANCHES + 1] = BRANCH_OFFSETS;

// Whether every branch has MAX_BRANCH_SIZE actions (the default layout): then the row kernels
// know a branch's size at compile time and test no action against it.
__host__ __device__ constexpr bool uniform_branches() {
    constexpr int offsets[NUM_BRANCHES + 1] = BRANCH_OFFSETS;
    for (int d = 0; d < NUM_BRANCHES; ++d)
        if (offsets[d + 1] - offsets[d] != MAX_BRANCH_SIZE) return false;
    return true;
}
__device__ __forceinline__ int branch_size(int d) {
    return uniform_branches() ? MAX_BRANCH_SIZE : kBranchOffsets[d + 1] - kBranchOffsets[d];
}

// The SFU's approximations, one instruction each (the .ftz forms need no fix-up around them for
// denormals, which libm's exp2f / log2f / 1/x add): 2^x and 1/x to a few ulp, log2 x to about
// 2^-22 absolute. Here 2^x takes arguments <= 0 (a result below 2^-126 becomes 0), log2 and 1/x
// a sum of exps in [1, N].
__device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float lg2_approx(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float rcp_approx(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct AddOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// Warp reduction of M values per lane at once by recursive halving: at each step (lane offsets
// 16, 8, ..., 1) a lane keeps half of its values -- the upper half where its offset bit is set,
// padded with `pad` -- combines them with its partner's copy of that half and sends the partner
// the other half, one shuffle per kept value; once a single value is left the steps are plain
// butterflies. 9 values take 12 shuffles this way instead of 45. Afterwards each lane holds the
// total of one value (spread_index), returned; value i is in lane spread_lane<M>(i), among others.
template <int M, class Op>
__device__ __forceinline__ float warp_spread(float (&x)[M], float pad, Op op) {
    static_assert(M >= 1 && M <= 32, "warp_spread: one value per lane at the end");
    const int lane = threadIdx.x & 31;
    int m = M;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        if (m == 1) {
            x[0] = op(x[0], __shfl_xor_sync(FULL_MASK, x[0], o));
            continue;
        }
        const int h = (m + 1) >> 1;
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int t = 0; t < (M + 1) / 2; ++t) {
            if (t < h) {
                const float lo = x[t];
                const float hi = t + h < m ? x[t + h] : pad;
                x[t] = op(up ? hi : lo, __shfl_xor_sync(FULL_MASK, up ? lo : hi, o));
            }
        }
        m = h;
    }
    return x[0];
}

// The value whose total lane `lane` holds after warp_spread<M>, or -1 (a padding value).
template <int M>
__device__ __forceinline__ int spread_index(int lane) {
    int m = M, first = 0, count = M;  // the lane's values so far: [first, first + count)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        if (m > 1) {
            const int h = (m + 1) >> 1;
            if (lane & o) {
                first += h;
                count -= h;
            } else {
                count = min(count, h);
            }
            m = h;
        }
    }
    return count > 0 ? first : -1;
}

// The lowest lane that holds the total of value i after warp_spread<M>.
template <int M>
__device__ __forceinline__ int spread_lane(int i) {
    int m = M, lane = 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        if (m > 1) {
            const int h = (m + 1) >> 1;
            if (i >= h) {
                lane |= o;
                i -= h;
            }
            m = h;
        }
    }
    return lane;
}

// What a forward row reads, loaded one row ahead of its turn. The padding atoms are not loaded.
struct DuelingInputs {
    float v[ATOMS_PER_LANE];
    float adv[MAX_BRANCH_SIZE][ATOMS_PER_LANE];
};

// The support's atoms this lane holds (zz: lane + 32 k; 0 past N) and their squares.
__device__ __forceinline__ void dueling_support(const float* __restrict__ z, int lane, float (&zz)[ATOMS_PER_LANE],
                                                float (&zz2)[ATOMS_PER_LANE]) {
#pragma unroll
    for (int k = 0; k < ATOMS_PER_LANE; ++k) {
        const int j = lane + 32 * k;
        zz[k] = j < NUM_ATOMS ? z[j] : 0.0f;
        zz2[k] = zz[k] * zz[k];
    }
}

// The sums of a group of G actions go into warp_spread as [S_0 .., sum e z .., sum e z^2 ..]
// (the last G only where var is written). The lane holding action t's sum e z writes its
// outputs; it fetches S_t and sum e z^2 from the lanes holding them. Per layout, 5-bit fields
// (registers are scarce in the row loops): t + 1 (0: the lane holds no sum e z) and the lanes.
__device__ __forceinline__ unsigned dueling_spread_lanes(int lane) {
    constexpr int G = SPREAD_ACTIONS;
    const int t2 = spread_index<2 * G>(lane) - G, t3 = spread_index<3 * G>(lane) - G;
    const bool own2 = t2 >= 0 && t2 < G, own3 = t3 >= 0 && t3 < G;
    unsigned lanes = (own2 ? t2 + 1 : 0) | (own3 ? t3 + 1 : 0) << 5
        | spread_lane<2 * G>(own2 ? t2 : 0) << 10 | spread_lane<3 * G>(own3 ? t3 : 0) << 15
        | spread_lane<3 * G>(2 * G + (own3 ? t3 : 0)) << 20;
    asm volatile("" : "+r"(lanes));  // computed once, not again in the loops
    return lanes;
}

// Where one row's outputs go: log_probs, probs [rows, A, N], q, var [rows, A] (log_probs, probs and
// var may be null: not written), zq [rows, zq_pitch] (null: not written) the direction branch's
// (branch 0's) Q times zq_scale.
struct DuelingOutputs {
    float *log_probs, *probs, *q, *var, *zq;
    int zq_pitch;
    float zq_scale;
};

// Row b's branch d (the warp's 32 lanes, `in` their atoms with the biases added), writing only
// what bits 0 / 1 / 2 of `wants` ask of log_probs / probs / var (q always):
//   logits[b, a, :] = v[b, :] + adv[b, a, :] - mean_{a' in branch(a)} adv[b, a', :]
//   log_probs = log_softmax(logits) over atoms, probs = exp(log_probs),
//   q = sum_j p_j z_j, var = max(sum_j p_j z_j^2 - q^2, 0).
// Per action, with y the logits in units of log2 less their maximum: e_j = 2^y_j, S = sum_j e_j,
// p_j = e_j / S, log p_j = y_j ln 2 - ln S, q = sum_j e_j z_j / S, E[z^2] = sum_j e_j z_j^2 / S:
// one exp per atom, and the sums of all the branch's actions reduced over the warp at once
// (warp_spread), as are the maxima. The lanes that end up holding an action's sum e z write its
// q, var and zq. zz, zz2, spread_lanes: dueling_support, dueling_spread_lanes.
__device__ __forceinline__ void dueling_row(DuelingInputs& in, int lane, unsigned b, int d, int wants,
                                            const float (&zz)[ATOMS_PER_LANE], const float (&zz2)[ATOMS_PER_LANE],
                                            unsigned spread_lanes, const DuelingOutputs& out) {
    constexpr int M = MAX_BRANCH_SIZE;
    constexpr int G = SPREAD_ACTIONS;
    const float neg_inf = __int_as_float(0xff800000);
    float* const log_probs = out.log_probs;
    float* const probs = out.probs;
    float* const q = out.q;
    float* const var = out.var;
    float* const zq = out.zq;
    const int a0 = kBranchOffsets[d];
    const int n = branch_size(d);
    const bool want_lp = log_probs != nullptr && (wants & 1);
    const bool want_p = probs != nullptr && (wants & 2);
    const bool want_var = var != nullptr && (wants & 4);
    const size_t out_row = (size_t)b * NUM_ACTIONS + a0;  // the branch's first action's row

    // y: the logits in units of log2 (-inf at padding atoms and absent actions), later less
    // their maximum: e = 2^y, log p = y ln 2 - ln S.
    const float scale = LOG2E * rcp_approx((float)n);  // log2(e) / n
    float y[M][ATOMS_PER_LANE];
#pragma unroll
    for (int k = 0; k < ATOMS_PER_LANE; ++k) {
        const int j = lane + 32 * k;
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < M; ++i) {
            if (i < n) sum = i == 0 ? in.adv[0][k] : sum + in.adv[i][k];
        }
        const float mean = sum * scale;  // the advantages' mean times log2(e)
#pragma unroll
        for (int i = 0; i < M; ++i)
            y[i][k] = i < n && j < NUM_ATOMS ? fmaf(in.v[k] + in.adv[i][k], LOG2E, -mean) : neg_inf;
    }

#pragma unroll
    for (int g0 = 0; g0 < M; g0 += G) {  // one group of G actions (the whole branch up to 10)
        float mx[G];
#pragma unroll
        for (int t = 0; t < G; ++t) {
            mx[t] = neg_inf;
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k)
                if (g0 + t < M) mx[t] = k == 0 ? y[g0 + t][0] : fmaxf(mx[t], y[g0 + t][k]);
        }
        const float mx_held = warp_spread(mx, neg_inf, MaxOp());
        // e and this lane's part of the sums S and sum e z (padding atoms have e = 0 and z = 0).
        float e[G][ATOMS_PER_LANE], s[2 * G];
#pragma unroll
        for (int t = 0; t < G; ++t) {
            const int i = g0 + t;
            const float mt = __shfl_sync(FULL_MASK, mx_held, spread_lane<G>(t));
#pragma unroll
            for (int k = 0; k < ATOMS_PER_LANE; ++k) {
                e[t][k] = 0.0f;
                if (i < M && i < n) {
                    y[i][k] -= mt;  // padding atoms stay at -inf and get e = 0
                    e[t][k] = ex2_approx(y[i][k]);
                }
                s[t] = k == 0 ? e[t][0] : s[t] + e[t][k];
                s[G + t] = k == 0 ? e[t][0] * zz[0] : fmaf(e[t][k], zz[k], s[G + t]);
            }
        }
        float held;  // after the warp sums: the total this lane holds
        if (want_var) {
            float s3[3 * G];
#pragma unroll
            for (int t = 0; t < G; ++t) {
                s3[t] = s[t];
                s3[G + t] = s[G + t];
#pragma unroll
                for (int k = 0; k < ATOMS_PER_LANE; ++k)
                    s3[2 * G + t] = k == 0 ? e[t][0] * zz2[0] : fmaf(e[t][k], zz2[k], s3[2 * G + t]);
            }
            held = warp_spread(s3, 0.0f, AddOp());
        } else {
            held = warp_spread(s, 0.0f, AddOp());
        }

        if (want_lp || want_p) {
            float lse[G], rs[G];
#pragma unroll
            for (int t = 0; t < G; ++t) {
                const int from = want_var ? spread_lane<3 * G>(t) : spread_lane<2 * G>(t);
                const float st = __shfl_sync(FULL_MASK, held, from);  // S of action g0 + t
                lse[t] = lg2_approx(st) * LN2;  // ln S
                rs[t] = rcp_approx(st);
            }
            const size_t o = (out_row + g0) * NUM_ATOMS + lane;  // atom `lane` of the group's first
            if (want_lp) {
#pragma unroll
                for (int t = 0; t < G; ++t)
#pragma unroll
                    for (int k = 0; k < ATOMS_PER_LANE; ++k)
                        if (g0 + t < M && g0 + t < n && lane + 32 * k < NUM_ATOMS)
                            log_probs[o + t * NUM_ATOMS + 32 * k] = fmaf(y[g0 + t][k], LN2, -lse[t]);
            }
            if (want_p) {
#pragma unroll
                for (int t = 0; t < G; ++t)
#pragma unroll
                    for (int k = 0; k < ATOMS_PER_LANE; ++k)
                        if (g0 + t < M && g0 + t < n && lane + 32 * k < NUM_ATOMS)
                            probs[o + t * NUM_ATOMS + 32 * k] = e[t][k] * rs[t];
            }
        }
        // E[Q], var and zq of the action whose sum e z this lane holds.
        const unsigned lanes = want_var ? spread_lanes >> 5 : spread_lanes;
        const int own = (int)(lanes & 31u) - 1;
        const float s_own = __shfl_sync(FULL_MASK, held, (lanes >> 10) & 31u);
        const float s2_own = want_var ? __shfl_sync(FULL_MASK, held, spread_lanes >> 20) : 0.0f;
        if (own >= 0 && g0 + own < n) {
            const int a = a0 + g0 + own;
            const float rs = rcp_approx(s_own);
            const float qa = held * rs;
            q[(size_t)b * NUM_ACTIONS + a] = qa;
            if (want_var) var[(size_t)b * NUM_ACTIONS + a] = fmaxf(s2_own * rs - qa * qa, 0.0f);
            if (zq != nullptr && d == 0) zq[(size_t)b * (unsigned)out.zq_pitch + g0 + own] = qa * out.zq_scale;
        }
    }

}

// The lane-group form: a row (a sample's branch) by DG_LANES = 8 lanes of a warp, four rows at
// once, for linear_gemm.cu's dueling warps (seven warps beside the GEMM's, with no other warps to
// hide their latency behind). Lane l of a group holds atoms l, l + 8, .. (DG_ATOMS of them) of
// every action, so a row's reductions over its atoms are three butterfly steps (every lane ends
// with every action's sums: no spreading, no selects, no broadcasts) and one shuffle serves four
// rows. A row of the default layout (3 actions of 51 atoms, E[Q] alone) takes about 115
// instructions, against 243 with a warp per row three rows at once (ncu's counts). Where no row of
// the warp wants var, the sums of e z^2 are skipped. DG_FITS: a branch's logits and
// exponentials within DG_BUDGET values per lane each (in registers beside the GEMM's consumers);
// the wrapper refuses other layouts (foxhunt_core/gpu/kernels.py heads_dueling_supported, the twin:
// branches of 13 or more actions with 9 to 12 atoms, or of 25 or more).
// DG_LANES, DG_BUDGET: defines.cuh (through sizes.cuh)
#define DG_ATOMS ((NUM_ATOMS + DG_LANES - 1) / DG_LANES)
#define DG_FITS (MAX_BRANCH_SIZE * DG_ATOMS <= DG_BUDGET)

// Sums over the L lanes of a group (aligned groups: xor offsets below L stay within it), every
// lane getting each total.
template <int L, int M, class Op>
__device__ __forceinline__ void group_allreduce(float (&x)[M], Op op) {
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < M; ++i) x[i] = op(x[i], __shfl_xor_sync(FULL_MASK, x[i], o));
}

// dueling_group_row's exponentials and sums: y less each action's maximum mx (in place), e = 2^y
// (0 for absent actions), s = [S .., sum e z .., sum e z^2 ..] over the group's lanes (the last M
// only with V, else 0).
template <bool V, int L, int K>
__device__ __forceinline__ void group_sums(float (&y)[MAX_BRANCH_SIZE][K], const float (&mx)[MAX_BRANCH_SIZE], int n,
                                           const float (&zz)[K], const float (&zz2)[K],
                                           float (&e)[MAX_BRANCH_SIZE][K], float (&s)[3 * MAX_BRANCH_SIZE]) {
    constexpr int M = MAX_BRANCH_SIZE;
#pragma unroll
    for (int a = 0; a < M; ++a) {
        const bool live = a < n;
#pragma unroll
        for (int k = 0; k < K; ++k) {
            y[a][k] -= mx[a];  // padding atoms stay at -inf and get e = 0
            e[a][k] = live ? ex2_approx(y[a][k]) : 0.0f;
            s[a] = k == 0 ? e[a][0] : s[a] + e[a][k];
            s[M + a] = k == 0 ? e[a][0] * zz[0] : fmaf(e[a][k], zz[k], s[M + a]);
            s[2 * M + a] = !V ? 0.0f : k == 0 ? e[a][0] * zz2[0] : fmaf(e[a][k], zz2[k], s[2 * M + a]);
        }
    }
    if (V) {
        group_allreduce<L>(s, AddOp());
    } else {
        group_allreduce<L>(reinterpret_cast<float(&)[2 * M]>(s), AddOp());
    }
}

// dueling_group_row's distributions straight to global memory: log_probs = y ln 2 - ln S,
// probs = e / S at row b's actions a0 .., the lane's atoms l + L k.
template <int L>
struct GroupDists {
    float *log_probs, *probs;
    template <int K>
    __device__ __forceinline__ void operator()(bool lp, bool p, unsigned b, int a0, int n, int l,
                                               const float (&y)[MAX_BRANCH_SIZE][K], const float (&e)[MAX_BRANCH_SIZE][K],
                                               const float (&sums)[3 * MAX_BRANCH_SIZE]) const {
        const size_t o = ((size_t)b * NUM_ACTIONS + a0) * NUM_ATOMS + l;  // atom l of the branch's first action
#pragma unroll
        for (int a = 0; a < MAX_BRANCH_SIZE; ++a) {
            if (a >= n) continue;
            if (lp) {
                const float lse = lg2_approx(sums[a]) * LN2;  // ln S
#pragma unroll
                for (int k = 0; k < K; ++k)
                    if (l + L * k < NUM_ATOMS) log_probs[o + a * NUM_ATOMS + L * k] = fmaf(y[a][k], LN2, -lse);
            }
            if (p) {
                const float rs = rcp_approx(sums[a]);
#pragma unroll
                for (int k = 0; k < K; ++k)
                    if (l + L * k < NUM_ATOMS) probs[o + a * NUM_ATOMS + L * k] = e[a][k] * rs;
            }
        }
    }
};

// Row b's branch d by the L lanes of this lane's group, lane l of them (dueling_row's outputs and
// math): y comes in as the row's advantages (atoms l + L k of each action, 0 where absent) and v
// its value head's, and is turned in place into the logits in units of log2 less their maximum.
// Writes only where `valid`, what bits 0 / 1 / 2 of `wants` ask of log_probs / probs / var (q
// always); lane a % L writes action a's q, var and zq. zz, zz2: the support at the lane's atoms
// and its squares (0 past N). The distributions go out through `dists` (GroupDists: straight to
// global memory): dists(lp, p, b, a0, n, l, y, e, s) with lp / p whether this row writes
// log_probs / probs, y and e the logits (log2 units, less the maximum) and 2^y, s[a] = S_a the
// action's sum of e (log p = y ln 2 - ln S, p = e / S); it is called by every lane of the warp
// (it may synchronize it).
template <int L, int K, class Dists>
__device__ __forceinline__ void dueling_group_row(float (&y)[MAX_BRANCH_SIZE][K], const float (&v)[K], int l,
                                                  unsigned b, bool valid, int d, int wants, const float (&zz)[K],
                                                  const float (&zz2)[K], const DuelingOutputs& out, const Dists& dists) {
    constexpr int M = MAX_BRANCH_SIZE;
    const float neg_inf = __int_as_float(0xff800000);
    const int a0 = kBranchOffsets[d];
    const int n = branch_size(d);
    const float scale = LOG2E * rcp_approx((float)n);  // log2(e) / n
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const bool atom = l + L * k < NUM_ATOMS;
        float sum = 0.0f;
#pragma unroll
        for (int a = 0; a < M; ++a)
            if (a < n) sum = a == 0 ? y[0][k] : sum + y[a][k];
        const float c = fmaf(v[k], LOG2E, -sum * scale);  // (v - mean adv) log2(e)
#pragma unroll
        for (int a = 0; a < M; ++a) y[a][k] = a < n && atom ? fmaf(y[a][k], LOG2E, c) : neg_inf;
    }
    float mx[M];
#pragma unroll
    for (int a = 0; a < M; ++a) {
        mx[a] = y[a][0];
#pragma unroll
        for (int k = 1; k < K; ++k) mx[a] = fmaxf(mx[a], y[a][k]);
    }
    group_allreduce<L>(mx, MaxOp());
    // e and the sums S, sum e z and (where a row of the warp's wants var) sum e z^2 (padding atoms
    // have e = 0 and z = 0; absent actions e = 0).
    const bool lp = valid && out.log_probs != nullptr && (wants & 1);
    const bool p = valid && out.probs != nullptr && (wants & 2);
    const bool vr = valid && out.var != nullptr && (wants & 4);
    float e[M][K], s[3 * M];
    if (__any_sync(FULL_MASK, vr)) {  // (one branch for the warp: the rows without var skip a third of the sums)
        group_sums<true, L>(y, mx, n, zz, zz2, e, s);
    } else {
        group_sums<false, L>(y, mx, n, zz, zz2, e, s);
    }

    dists(lp, p, b, a0, n, l, y, e, s);
#pragma unroll
    for (int a = 0; a < M; ++a) {
        if (a >= n) continue;
        if (valid && l == a % L) {
            const size_t qa_at = (size_t)b * NUM_ACTIONS + a0 + a;
            const float rs = rcp_approx(s[a]);
            const float qa = s[M + a] * rs;
            out.q[qa_at] = qa;
            if (vr) out.var[qa_at] = fmaxf(s[2 * M + a] * rs - qa * qa, 0.0f);
            if (out.zq != nullptr && d == 0) out.zq[(size_t)b * (unsigned)out.zq_pitch + a] = qa * out.zq_scale;
        }
    }
}
