// Cross-branch Q attention: forward, backward and the deterministic reduction of its parameter
// gradients over the batch.
//
// NumPy twin: foxhunt_core/attention.py (forward, backward). Launch wrappers:
// foxhunt_core/gpu/qkernels.py.
//
// Per sample, token i = [q_i, emb_i] (k + 1 wide), k = ATTN_DIM:
//   qry_i = q_i Wq[0] + emb_i Wq[1:],  key_i = q_i Wk[0] + emb_i Wk[1:],  S_ij = qry_i . key_j / sqrt(k)
//   a_ij = softmax_j(S_ij),  o_i = sum_j a_ij q_j,  qc_i = q_i + g_i (o_i - q_i)
//
// Factored scores. The embedding halves Eq = emb Wq[1:] and Ek = emb Wk[1:] are the same for
// every sample, so
//   S_ij = alpha q_i q_j + q_i beta_j + q_j gamma_i + delta_ij
//   alpha = Wq[0].Wk[0] / sqrt(k),  beta_j = Wq[0].Ek_j / sqrt(k),
//   gamma_i = Eq_i.Wk[0] / sqrt(k),  delta_ij = Eq_i.Ek_j / sqrt(k).
// Each block forms these once (times log2(e): the softmax uses exp2), and a score costs two FMAs:
// S_ij = u_i q_j + (q_i beta_j + delta_ij) with u_i = alpha q_i + gamma_i.
//
// Thread mapping: ATT_SLOTS = 16 threads per sample, thread (s, i) owns token i, i.e. row i of
// the scores (slots i >= A idle). A sample lies in one half-warp: its q_j are gathered by
// shuffles and no per-sample step needs a barrier. A block (ATT_SAMPLES samples at a time) walks
// over the batch (grid-stride) with the thread's row of the constants in registers, loading the
// next samples' q one step ahead; the backward recomputes the forward (the only cache is q).
//
// Parameter gradients. With dS_ij = dloss/dS_ij = a_ij do_i (q_j - o_i), do_i = g_i dqc_i, the
// constants' gradients are sums over the batch b:
//   dalpha = T = sum_{b,i} q_i r_i    dbeta_j = C_j = sum_{b,i} q_i dS_ij
//   dgamma_i = R_i = sum_b r_i        ddelta_ij = M_ij = sum_b dS_ij
// with r_i = sum_j dS_ij q_j, formed as sum_j dS_ij (q_j - o_i) (equal: a row of dS sums to
// zero; this form has no cancellation when a row is peaked). A thread adds its samples' terms
// in float registers; at the end the block adds its threads' sums in double in a fixed order
// and maps its ATT_P = A^2 + 3 A + 1 sums [M | C | R | T | sum_b dgate] (linearly) to its share
// of the parameter gradients, in double:
//   dWq[0] = (T Wk[0] + sum_j C_j Ek_j) / sqrt(k),   dEq_i = (R_i Wk[0] + sum_j M_ij Ek_j) / sqrt(k)
//   dWk[0] = (T Wq[0] + sum_i R_i Eq_i) / sqrt(k),   dEk_j = (C_j Wq[0] + sum_i M_ij Eq_i) / sqrt(k)
//   dWq[1:] = emb^T dEq,  dWk[1:] = emb^T dEk,  demb = dEq Wq[1:]^T + dEk Wk[1:]^T
// one row of partials per block, [demb | dWq | dWk | dgate] (ATT_G entries).
// attention_grad_reduce adds the rows in a fixed order and writes the four gradients.

#include "sizes.cuh"

#define A_ NUM_ACTIONS
#define K_ ATTN_DIM
// ATT_SLOTS (threads per sample), ATT_SAMPLES (samples per group: two per warp), ATT_FORWARD_BLOCKS,
// ATT_BACKWARD_BLOCKS (blocks per SM of __launch_bounds__), ATT_REDUCE_WARPS, ATT_MAX_DIM: defines.cuh
#define ATT_THREADS (ATT_SLOTS * ATT_SAMPLES)   // the wrappers launch this many threads
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_P (A_ * A_ + 3 * A_ + 1)               // the block's sums
#define ATT_G (A_ * K_ + 2 * (K_ + 1) * K_ + A_)   // a partial row: the four gradients
#define FULL_MASK 0xffffffffu
#define LOG2E_F 1.44269504088896341f
#define LN2_F 0.693147180559945309f

static_assert(NUM_ACTIONS >= 1 && NUM_ACTIONS <= ATT_SLOTS, "attention kernels handle 1 to 16 actions");
static_assert(ATTN_DIM >= 1 && ATTN_DIM <= ATT_MAX_DIM, "attention kernels handle attn_dim 1 to ATT_MAX_DIM");
static_assert(ATT_SAMPLES % 2 == 0, "a warp holds two samples");

// The sample-independent constants of the scores, times log2(e) / sqrt(k).
struct AttnConsts {
    float eq[A_][K_];             // Eq = emb Wq[1:] (unscaled)
    float ek[A_][K_];             // Ek = emb Wk[1:] (unscaled)
    float delta[A_][A_];
    float beta[A_];
    float gamma[A_];
    float alpha;
};

// Shared scratch of the backward: dq's column terms in the loop (attention_backward_dq), the
// block's sums and their mapping to the gradients after it.
union AttnScratch {
    float x[ATT_SAMPLES][A_][A_ + 1];   // [sample][row][column]
    struct {
        double red[ATT_WARPS][ATT_P];  // per warp
        double tot[ATT_P];             // the block's
        double e[2][A_][K_];           // Eq, Ek
        double de[2][A_][K_];          // dEq, dEk
    } g;
};
static_assert(sizeof(AttnConsts) + sizeof(AttnScratch) <= 48 * 1024,
              "attention_backward: static shared memory over 48 KiB");

// Forms the constants from the parameters (two barriers; every thread of the block calls it).
__device__ void attention_constants(AttnConsts& c, const float* __restrict__ emb, const float* __restrict__ wq,
                                    const float* __restrict__ wk) {
    for (int t = threadIdx.x; t < 2 * A_ * K_; t += blockDim.x) {
        const int m = t / (A_ * K_), r = t % (A_ * K_), i = r / K_, col = r % K_;
        const float* w = (m == 0 ? wq : wk) + K_ + col;   // column col of W[1:]
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < K_; ++e) acc = fmaf(emb[i * K_ + e], w[e * K_], acc);
        (m == 0 ? c.eq : c.ek)[i][col] = acc;
    }
    __syncthreads();
    const float scale = LOG2E_F / sqrtf((float)K_);
    for (int t = threadIdx.x; t < A_ * A_ + 2 * A_ + 1; t += blockDim.x) {
        const float* x;   // the dot product x . y of one constant
        const float* y;
        if (t < A_ * A_) {
            x = c.eq[t / A_];
            y = c.ek[t % A_];
        } else if (t < A_ * A_ + A_) {
            x = wq;
            y = c.ek[t - A_ * A_];
        } else if (t < A_ * A_ + 2 * A_) {
            x = c.eq[t - A_ * A_ - A_];
            y = wk;
        } else {
            x = wq;
            y = wk;
        }
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < K_; ++e) acc = fmaf(x[e], y[e], acc);
        acc *= scale;
        if (t < A_ * A_)
            c.delta[t / A_][t % A_] = acc;
        else if (t < A_ * A_ + A_)
            c.beta[t - A_ * A_] = acc;
        else if (t < A_ * A_ + 2 * A_)
            c.gamma[t - A_ * A_ - A_] = acc;
        else
            c.alpha = acc;
    }
    __syncthreads();
}

// Row i of the constants (the thread's token); zeros in an idle slot.
struct AttnRow {
    float delta[A_];
    float beta[A_];
    float gamma;
    float alpha;
};

__device__ __forceinline__ void load_row(AttnRow& r, const AttnConsts& c, int i) {
    const bool slot = i < A_;
    const int ii = slot ? i : 0;
#pragma unroll
    for (int j = 0; j < A_; ++j) {
        r.delta[j] = slot ? c.delta[ii][j] : 0.0f;
        r.beta[j] = c.beta[j];
    }
    r.gamma = slot ? c.gamma[ii] : 0.0f;
    r.alpha = c.alpha;
}

// x[b, i] of token i of sample b = g ATT_SAMPLES + s; 0 for an idle slot or a sample past the batch.
__device__ __forceinline__ float load_token(const float* __restrict__ x, int g, int groups, int s, int i,
                                            int batch) {
    if (g >= groups || i >= A_) return 0.0f;
    const int b = g * ATT_SAMPLES + s;
    return b < batch ? x[b * A_ + i] : 0.0f;
}

// q_j of the thread's sample (its half-warp); every lane of the warp takes part.
__device__ __forceinline__ void gather_sample(float qi, float* qs) {
#pragma unroll
    for (int j = 0; j < A_; ++j) qs[j] = __shfl_sync(FULL_MASK, qi, j, ATT_SLOTS);
}

// 2^x, flushing results below 2^-126 to zero (there a softmax term is negligible next to the row's
// largest, which is 1): one MUFU.EX2, without exp2f's rescaling of tiny results.
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Unnormalised softmax row i: e_j = 2^(S'_ij - max_j S'_ij), S' = log2(e) S, with u = alpha' q_i +
// gamma'_i. Returns sum_j e_j and sets eq = sum_j e_j q_j.
__device__ __forceinline__ float softmax_row(const AttnRow& r, float u, float qi, const float* qs, float* e,
                                             float& eq) {
    float mx = __int_as_float(0xff800000);
#pragma unroll
    for (int j = 0; j < A_; ++j) {
        e[j] = fmaf(u, qs[j], fmaf(qi, r.beta[j], r.delta[j]));
        mx = fmaxf(mx, e[j]);
    }
    float sum = 0.0f, acc = 0.0f;
#pragma unroll
    for (int j = 0; j < A_; ++j) {
        e[j] = exp2_ftz(e[j] - mx);
        sum += e[j];
        acc = fmaf(e[j], qs[j], acc);
    }
    eq = acc;
    return sum;
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS, ATT_FORWARD_BLOCKS) attention_forward(
    const float* __restrict__ q,          // [B, A]
    const float* __restrict__ emb,        // [A, k]
    const float* __restrict__ wq,         // [k + 1, k]
    const float* __restrict__ wk,         // [k + 1, k]
    const float* __restrict__ gate,       // [A]
    float* __restrict__ qc,               // [B, A]
    float* __restrict__ attn,             // [B, A, A] or null
    int batch)                            // (B + ATT_SAMPLES) A < 2^31 (the wrapper checks)
{
    __shared__ AttnConsts C;
    const int s = threadIdx.x / ATT_SLOTS;
    const int i = threadIdx.x % ATT_SLOTS;
    const int groups = (batch + ATT_SAMPLES - 1) / ATT_SAMPLES;
    // The first group's q is loaded before the constants are formed, the next one a group ahead.
    float q_next = load_token(q, blockIdx.x, groups, s, i, batch);
    attention_constants(C, emb, wq, wk);
    AttnRow r;
    load_row(r, C, i);
    const float g_i = i < A_ ? gate[i] : 0.0f;
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        const int b = g * ATT_SAMPLES + s;
        const float qi = q_next;
        q_next = load_token(q, g + gridDim.x, groups, s, i, batch);
        float qs[A_], e[A_], eq;
        gather_sample(qi, qs);
        const float sum = softmax_row(r, fmaf(r.alpha, qi, r.gamma), qi, qs, e, eq);
        const float rs = __frcp_rn(sum);
        if (i < A_ && b < batch) {
            qc[b * A_ + i] = fmaf(g_i, fmaf(eq, rs, -qi), qi);
            if (attn != nullptr) {
                float* row = attn + ((long long)b * A_ + i) * A_;
#pragma unroll
                for (int j = 0; j < A_; ++j) row[j] = e[j] * rs;
            }
        }
    }
}

// The backward; with WITH_DQ also dq.
template <bool WITH_DQ>
__device__ __forceinline__ void attention_backward_body(
    const float* __restrict__ q, const float* __restrict__ dqc, const float* __restrict__ emb,
    const float* __restrict__ wq, const float* __restrict__ wk, const float* __restrict__ gate,
    float* __restrict__ dq, double* __restrict__ partials, int batch)
{
    __shared__ AttnConsts C;
    __shared__ AttnScratch S;
    const int s = threadIdx.x / ATT_SLOTS;
    const int i = threadIdx.x % ATT_SLOTS;
    const int lane = threadIdx.x % 32;
    const int w = threadIdx.x / 32;
    const int groups = (batch + ATT_SAMPLES - 1) / ATT_SAMPLES;
    float q_next = load_token(q, blockIdx.x, groups, s, i, batch);
    float dqc_next = load_token(dqc, blockIdx.x, groups, s, i, batch);
    attention_constants(C, emb, wq, wk);
    AttnRow r;
    load_row(r, C, i);
    const float g_i = i < A_ ? gate[i] : 0.0f;

    // The thread's sums: M_i. and its samples' terms of C, R_i, T and dgate_i. A padded sample
    // or an idle slot has dqc = 0 and adds exact zeros.
    float m_acc[A_], c_acc[A_], r_acc = 0.0f, t_acc = 0.0f, g_acc = 0.0f;
#pragma unroll
    for (int j = 0; j < A_; ++j) m_acc[j] = c_acc[j] = 0.0f;

    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        const int b = g * ATT_SAMPLES + s;
        const float qi = q_next, dqc_i = dqc_next;
        q_next = load_token(q, g + gridDim.x, groups, s, i, batch);
        dqc_next = load_token(dqc, g + gridDim.x, groups, s, i, batch);
        float qs[A_], e[A_], eq;
        gather_sample(qi, qs);
        const float u = fmaf(r.alpha, qi, r.gamma);
        const float sum = softmax_row(r, u, qi, qs, e, eq);
        const float rs = __frcp_rn(sum);
        const float o = eq * rs;
        const float p = dqc_i * g_i * rs;   // dS_ij = p e_j (q_j - o_i)
        const float pq = p * qi;
        const float ul = u * LN2_F;         // alpha q_i + gamma_i
        float rr = 0.0f, dq_row = 0.0f;
#pragma unroll
        for (int j = 0; j < A_; ++j) {
            const float d = qs[j] - o;
            const float ed = e[j] * d;
            m_acc[j] = fmaf(p, ed, m_acc[j]);
            c_acc[j] = fmaf(pq, ed, c_acc[j]);
            rr = fmaf(ed, d, rr);
            if (WITH_DQ) {
                // d S_ij / d q_i = alpha q_j + beta_j (times log2(e) here)
                dq_row = fmaf(ed, fmaf(r.alpha, qs[j], r.beta[j]), dq_row);
                // row i's terms of dq_j: a_ij do_i (d o_i / d q_j) + dS_ij (alpha q_i + gamma_i)
                e[j] = p * fmaf(ul, ed, e[j]);
            }
        }
        const float ri = p * rr;
        r_acc += ri;
        t_acc = fmaf(qi, ri, t_acc);
        g_acc = fmaf(dqc_i, o - qi, g_acc);
        if (WITH_DQ) {
            // dq_i = dqc_i (1 - g_i) + sum_j dS_ij (alpha q_j + beta_j) + sum_j (row j's term of dq_i)
            if (i < A_) {
#pragma unroll
                for (int j = 0; j < A_; ++j) S.x[s][i][j] = e[j];
            }
            __syncwarp();
            if (i < A_ && b < batch) {
                float d = fmaf(p * LN2_F, dq_row, dqc_i * (1.0f - g_i));
#pragma unroll
                for (int j = 0; j < A_; ++j) d += S.x[s][j][i];
                dq[b * A_ + i] = d;
            }
            __syncwarp();
        }
    }
    if (WITH_DQ) __syncthreads();   // S.x is reused below

    // The block's sums in double: the warp's two samples (lanes i and i + 16; C and T over all
    // lanes by a butterfly, which leaves the same value in every lane), then the warps in order.
    constexpr int kC = A_ * A_, kR = kC + A_, kT = kR + A_, kG = kT + 1;
#pragma unroll
    for (int j = 0; j < A_; ++j) {
        double v = (double)m_acc[j];
        v += __shfl_down_sync(FULL_MASK, v, 16);
        if (lane < A_) S.g.red[w][lane * A_ + j] = v;
        v = (double)c_acc[j];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
        if (lane == 0) S.g.red[w][kC + j] = v;
    }
    double v = (double)r_acc;
    v += __shfl_down_sync(FULL_MASK, v, 16);
    if (lane < A_) S.g.red[w][kR + lane] = v;
    v = (double)g_acc;
    v += __shfl_down_sync(FULL_MASK, v, 16);
    if (lane < A_) S.g.red[w][kG + lane] = v;
    v = (double)t_acc;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    if (lane == 0) S.g.red[w][kT] = v;
    __syncthreads();
    // The sums over the warps, and Eq, Ek in double.
    for (int t = threadIdx.x; t < ATT_P + 2 * A_ * K_; t += ATT_THREADS) {
        if (t < ATT_P) {
            double a = 0.0;
#pragma unroll
            for (int ww = 0; ww < ATT_WARPS; ++ww) a += S.g.red[ww][t];
            S.g.tot[t] = a;
        } else {
            const int u = t - ATT_P, m = u / (A_ * K_), n = u % (A_ * K_) / K_, c = u % K_;
            const float* wm = (m == 0 ? wq : wk) + K_ + c;   // column c of W[1:]
            double a = 0.0;
#pragma unroll
            for (int e = 0; e < K_; ++e) a = fma((double)emb[n * K_ + e], (double)wm[e * K_], a);
            S.g.e[m][n][c] = a;
        }
    }
    __syncthreads();
    // dEq, dEk; row 0 of dWq and dWk.
    const double* M = S.g.tot;
    const double* Cs = M + kC;
    const double* R = M + kR;
    const double T = M[kT];
    const double inv_sqrt_k = 1.0 / sqrt((double)K_);
    double* row = partials + blockIdx.x * ATT_G;
    double* gwq = row + A_ * K_;
    double* gwk = gwq + (K_ + 1) * K_;
    for (int t = threadIdx.x; t < 2 * A_ * K_ + K_; t += ATT_THREADS) {
        if (t < 2 * A_ * K_) {
            const int m = t / (A_ * K_), n = t % (A_ * K_) / K_, c = t % K_;
            double a;
            if (m == 0) {   // dEq_n
                a = R[n] * wk[c];
#pragma unroll
                for (int j = 0; j < A_; ++j) a = fma(M[n * A_ + j], S.g.e[1][j][c], a);
            } else {        // dEk_n
                a = Cs[n] * wq[c];
#pragma unroll
                for (int j = 0; j < A_; ++j) a = fma(M[j * A_ + n], S.g.e[0][j][c], a);
            }
            S.g.de[m][n][c] = a * inv_sqrt_k;
        } else {
            const int c = t - 2 * A_ * K_;
            double aq = T * wk[c], ak = T * wq[c];
#pragma unroll
            for (int j = 0; j < A_; ++j) {
                aq = fma(Cs[j], S.g.e[1][j][c], aq);
                ak = fma(R[j], S.g.e[0][j][c], ak);
            }
            gwq[c] = aq * inv_sqrt_k;
            gwk[c] = ak * inv_sqrt_k;
        }
    }
    __syncthreads();
    // demb; rows 1.. of dWq and dWk; dgate.
    for (int t = threadIdx.x; t < A_ * K_ + 2 * K_ * K_ + A_; t += ATT_THREADS) {
        if (t < A_ * K_) {
            const int n = t / K_, e = t % K_;
            double a = 0.0;
#pragma unroll
            for (int c = 0; c < K_; ++c) {
                a = fma(S.g.de[0][n][c], (double)wq[(1 + e) * K_ + c], a);
                a = fma(S.g.de[1][n][c], (double)wk[(1 + e) * K_ + c], a);
            }
            row[t] = a;
        } else if (t < A_ * K_ + 2 * K_ * K_) {
            const int u = t - A_ * K_, m = u / (K_ * K_), e = u % (K_ * K_) / K_, c = u % K_;
            double a = 0.0;
#pragma unroll
            for (int n = 0; n < A_; ++n) a = fma((double)emb[n * K_ + e], S.g.de[m][n][c], a);
            (m == 0 ? gwq : gwk)[K_ + e * K_ + c] = a;
        } else {
            const int n = t - A_ * K_ - 2 * K_ * K_;
            row[ATT_G - A_ + n] = M[kG + n];
        }
    }
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS, ATT_BACKWARD_BLOCKS) attention_backward(
    const float* __restrict__ q,          // [B, A]
    const float* __restrict__ dqc,        // [B, A] dloss / d coordinated Q
    const float* __restrict__ emb,        // [A, k]
    const float* __restrict__ wq,         // [k + 1, k]
    const float* __restrict__ wk,         // [k + 1, k]
    const float* __restrict__ gate,       // [A]
    double* __restrict__ partials,        // [gridDim.x, ATT_G]
    int batch)                            // (B + ATT_SAMPLES) A < 2^31 (the wrapper checks)
{
    attention_backward_body<false>(q, dqc, emb, wq, wk, gate, nullptr, partials, batch);
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS, ATT_BACKWARD_BLOCKS) attention_backward_dq(
    const float* __restrict__ q,          // [B, A]
    const float* __restrict__ dqc,        // [B, A] dloss / d coordinated Q
    const float* __restrict__ emb,        // [A, k]
    const float* __restrict__ wq,         // [k + 1, k]
    const float* __restrict__ wk,         // [k + 1, k]
    const float* __restrict__ gate,       // [A]
    float* __restrict__ dq,               // [B, A]
    double* __restrict__ partials,        // [gridDim.x, ATT_G]
    int batch)                            // (B + ATT_SAMPLES) A < 2^31 (the wrapper checks)
{
    attention_backward_body<true>(q, dqc, emb, wq, wk, gate, dq, partials, batch);
}

// The gradients: entry p of [demb | dWq | dWk | dgate] = sum_k partials[k, p] in a fixed order. A
// block of 32 warps takes 32 entries: lane = entry (coalesced loads), warp w adds the rows
// k = w, w + 32, ..., then warp 0 adds the 32 sums.
// (ATT_REDUCE_WARPS: the wrapper launches 32 ATT_REDUCE_WARPS threads)
extern "C" __global__ void __launch_bounds__(32 * ATT_REDUCE_WARPS) attention_grad_reduce(
    const double* __restrict__ partials,  // [num_partials, ATT_G]
    int num_partials,
    float* __restrict__ demb,             // [A, k]
    float* __restrict__ dwq,              // [k + 1, k]
    float* __restrict__ dwk,              // [k + 1, k]
    float* __restrict__ dgate)            // [A]
{
    __shared__ double s_sum[ATT_REDUCE_WARPS][32];
    const int lane = threadIdx.x & 31;
    const int w = threadIdx.x >> 5;
    const int p = blockIdx.x * 32 + lane;
    double sum = 0.0;
    if (p < ATT_G)
        for (int k = w; k < num_partials; k += ATT_REDUCE_WARPS) sum += partials[k * ATT_G + p];
    s_sum[w][lane] = sum;
    __syncthreads();
    if (w == 0 && p < ATT_G) {
        double t = 0.0;
        for (int r = 0; r < ATT_REDUCE_WARPS; ++r) t += s_sum[r][lane];
        constexpr int kWq = A_ * K_, kWk = kWq + (K_ + 1) * K_, kGate = kWk + (K_ + 1) * K_;
        if (p < kWq)
            demb[p] = (float)t;
        else if (p < kWk)
            dwq[p - kWq] = (float)t;
        else if (p < kGate)
            dwk[p - kWk] = (float)t;
        else
            dgate[p - kGate] = (float)t;
    }
}
