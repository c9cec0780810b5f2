// Cross-branch Q attention: forward, backward and the deterministic reduction of its parameter
// gradients over the batch.
//
// NumPy twin: foxhunt_core/attention.py (forward, backward). Launch wrappers:
// foxhunt_core/gpu/qkernels.py.
//
// Per sample, token i = [q_i, emb_i] (k + 1 wide), k = ATTN_DIM:
//   qry_i = q_i Wq[0] + emb_i Wq[1:],  key_i = q_i Wk[0] + emb_i Wk[1:]
//   a_ij = softmax_j(qry_i . key_j / sqrt(k)),  o_i = sum_j a_ij q_j,  qc_i = q_i + g_i (o_i - q_i)
//
// Thread mapping: a block works on groups of ATT_SAMPLES samples, ATT_SLOTS threads per sample,
// thread (s, i) owns token i of sample s (slots i >= A idle); the parameters sit in shared
// memory. The backward recomputes the forward (the only cache is q itself).
//
// Parameter gradients. emb enters every sample identically, so
//   dWq[0]   = sum_{b,i} q_bi dqry_bi         dWq[1+e] = sum_i emb_ie (sum_b dqry_bi)
//   demb_ie  = sum_c (sum_b dqry_bic) Wq[1+e, c] + (sum_b dkey_bic) Wk[1+e, c]
// and each block only accumulates, in double, the P = 2 A k + 2 k + A sums
//   [sum_b dqry (A k) | sum_b dkey (A k) | sum q dqry (k) | sum q dkey (k) | sum_b dgate (A)]
// over its samples (grid-stride over groups). attention_grad_reduce adds the per-block rows
// (in a fixed order) and attention_grad_assemble forms the four gradients.

#include "sizes.cuh"
#ifndef ATTN_DIM
#define ATTN_DIM 8
#endif

#define A_ NUM_ACTIONS
#define K_ ATTN_DIM
#ifndef ATT_SAMPLES
#define ATT_SAMPLES 8   // samples per group; the wrappers pick 4 when A * k > 192 (shared memory)
#endif
#define ATT_SLOTS 16
#define ATT_THREADS (ATT_SLOTS * ATT_SAMPLES)   // the wrappers launch this many threads
#define ATT_P (2 * A_ * K_ + 2 * K_ + A_)
#define ATT_P_SLOTS ((ATT_P + ATT_THREADS - 1) / ATT_THREADS)
#define FULL_MASK 0xffffffffu

static_assert(NUM_ACTIONS <= ATT_SLOTS, "attention kernels handle at most 16 actions");
static_assert(ATTN_DIM <= 16, "attention kernels handle attn_dim <= 16");
// attention_backward's static shared memory must stay under 48 KiB.
static_assert(4 * (A_ * K_ + 2 * (K_ + 1) * K_ + A_ + ATT_SAMPLES * (3 * A_ + 4 * A_ * K_ + 2 * A_ * (A_ + 1)))
                  <= 48 * 1024,
              "attention_backward: too much shared memory, lower ATT_SAMPLES");

struct AttnParams {
    float emb[A_][K_];
    float wq[K_ + 1][K_];
    float wk[K_ + 1][K_];
    float gate[A_];
};

__device__ void load_params(AttnParams& s, const float* emb, const float* wq, const float* wk,
                            const float* gate) {
    for (int t = threadIdx.x; t < A_ * K_; t += blockDim.x) (&s.emb[0][0])[t] = emb[t];
    for (int t = threadIdx.x; t < (K_ + 1) * K_; t += blockDim.x) {
        (&s.wq[0][0])[t] = wq[t];
        (&s.wk[0][0])[t] = wk[t];
    }
    for (int t = threadIdx.x; t < A_; t += blockDim.x) s.gate[t] = gate[t];
}

// out = q_i W[0] + emb_i W[1:]
__device__ __forceinline__ void project_token(const AttnParams& s, const float (*w)[K_], int i,
                                              float qi, float* out) {
#pragma unroll
    for (int c = 0; c < K_; ++c) {
        float acc = qi * w[0][c];
#pragma unroll
        for (int e = 0; e < K_; ++e) acc += s.emb[i][e] * w[1 + e][c];
        out[c] = acc;
    }
}

// Softmax row a_i. over the sample's keys; returns o_i = sum_j a_ij q_j.
__device__ __forceinline__ float attention_row(const float* qry, const float (*keys)[K_],
                                               const float* qs, float* a) {
    const float inv_sqrt_k = rsqrtf((float)K_);
    float mx = __int_as_float(0xff800000);
#pragma unroll
    for (int j = 0; j < A_; ++j) {
        float dot = 0.0f;
#pragma unroll
        for (int c = 0; c < K_; ++c) dot += qry[c] * keys[j][c];
        a[j] = dot * inv_sqrt_k;
        mx = fmaxf(mx, a[j]);
    }
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < A_; ++j) {
        a[j] = expf(a[j] - mx);
        sum += a[j];
    }
    float o = 0.0f;
#pragma unroll
    for (int j = 0; j < A_; ++j) {
        a[j] /= sum;
        o += a[j] * qs[j];
    }
    return o;
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_forward(
    const float* __restrict__ q,          // [B, A]
    const float* __restrict__ emb,        // [A, k]
    const float* __restrict__ wq,         // [k + 1, k]
    const float* __restrict__ wk,         // [k + 1, k]
    const float* __restrict__ gate,       // [A]
    float* __restrict__ qc,               // [B, A]
    float* __restrict__ attn,             // [B, A, A] or null
    int batch)
{
    __shared__ AttnParams P;
    __shared__ float s_q[ATT_SAMPLES][A_];
    __shared__ float s_key[ATT_SAMPLES][A_][K_];
    load_params(P, emb, wq, wk, gate);
    __syncthreads();
    const int s = threadIdx.x / ATT_SLOTS;
    const int i = threadIdx.x % ATT_SLOTS;
    const int groups = (batch + ATT_SAMPLES - 1) / ATT_SAMPLES;
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        const long long b = (long long)g * ATT_SAMPLES + s;
        const bool active = i < A_ && b < batch;
        float qi = 0.0f, qry[K_], key[K_];
        if (active) {
            qi = q[b * A_ + i];
            project_token(P, P.wq, i, qi, qry);
            project_token(P, P.wk, i, qi, key);
            s_q[s][i] = qi;
#pragma unroll
            for (int c = 0; c < K_; ++c) s_key[s][i][c] = key[c];
        }
        __syncthreads();
        if (active) {
            float a[A_];
            const float o = attention_row(qry, s_key[s], s_q[s], a);
            qc[b * A_ + i] = qi + P.gate[i] * (o - qi);
            if (attn != nullptr) {
#pragma unroll
                for (int j = 0; j < A_; ++j) attn[(b * A_ + i) * A_ + j] = a[j];
            }
        }
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_backward(
    const float* __restrict__ q,          // [B, A]
    const float* __restrict__ dqc,        // [B, A] dloss / d coordinated Q
    const float* __restrict__ emb,        // [A, k]
    const float* __restrict__ wq,         // [k + 1, k]
    const float* __restrict__ wk,         // [k + 1, k]
    const float* __restrict__ gate,       // [A]
    float* __restrict__ dq,               // [B, A] or null
    double* __restrict__ partials,        // [gridDim.x, ATT_P]
    int batch)
{
    __shared__ AttnParams P;
    __shared__ float s_q[ATT_SAMPLES][A_];
    __shared__ float s_do[ATT_SAMPLES][A_];
    __shared__ float s_dgate[ATT_SAMPLES][A_];
    __shared__ float s_qry[ATT_SAMPLES][A_][K_];
    __shared__ float s_key[ATT_SAMPLES][A_][K_];
    __shared__ float s_dqry[ATT_SAMPLES][A_][K_];
    __shared__ float s_dkey[ATT_SAMPLES][A_][K_];
    __shared__ float s_a[ATT_SAMPLES][A_][A_ + 1];
    __shared__ float s_ds[ATT_SAMPLES][A_][A_ + 1];
    load_params(P, emb, wq, wk, gate);
    __syncthreads();

    const int s = threadIdx.x / ATT_SLOTS;
    const int i = threadIdx.x % ATT_SLOTS;
    const float inv_sqrt_k = rsqrtf((float)K_);
    const int groups = (batch + ATT_SAMPLES - 1) / ATT_SAMPLES;
    double acc[ATT_P_SLOTS];
#pragma unroll
    for (int t = 0; t < ATT_P_SLOTS; ++t) acc[t] = 0.0;

    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        const long long b = (long long)g * ATT_SAMPLES + s;
        const bool slot = i < A_;
        const bool active = slot && b < batch;
        // Phase 1: recompute the forward; padded samples contribute zeros everywhere.
        float qi = 0.0f, g_i = 0.0f, dqc_i = 0.0f, qry[K_];
        if (active) {
            qi = q[b * A_ + i];
            g_i = P.gate[i];
            dqc_i = dqc[b * A_ + i];
            float key[K_];
            project_token(P, P.wq, i, qi, qry);
            project_token(P, P.wk, i, qi, key);
#pragma unroll
            for (int c = 0; c < K_; ++c) {
                s_qry[s][i][c] = qry[c];
                s_key[s][i][c] = key[c];
            }
        }
        if (slot) s_q[s][i] = qi;
        __syncthreads();
        // Phase 2: the row of i: a_i., o_i, ds_i. and dqry_i.
        if (active) {
            float a[A_];
            const float o = attention_row(qry, s_key[s], s_q[s], a);
            const float do_i = dqc_i * g_i;
            s_do[s][i] = do_i;
            s_dgate[s][i] = dqc_i * (o - qi);
#pragma unroll
            for (int j = 0; j < A_; ++j) {
                s_a[s][i][j] = a[j];
                // softmax backward of da_ij = do_i q_j, using sum_j a_ij q_j = o_i
                s_ds[s][i][j] = a[j] * do_i * (s_q[s][j] - o) * inv_sqrt_k;
            }
            for (int c = 0; c < K_; ++c) {
                float acc_c = 0.0f;
#pragma unroll
                for (int j = 0; j < A_; ++j) acc_c += s_ds[s][i][j] * s_key[s][j][c];
                s_dqry[s][i][c] = acc_c;
            }
        } else if (slot) {
            s_do[s][i] = 0.0f;
            s_dgate[s][i] = 0.0f;
            for (int j = 0; j < A_; ++j) {
                s_a[s][i][j] = 0.0f;
                s_ds[s][i][j] = 0.0f;
            }
            for (int c = 0; c < K_; ++c) s_dqry[s][i][c] = 0.0f;
        }
        __syncthreads();
        // Phase 3: column i: dkey_i = sum_j ds_ji qry_j; dq_i.
        if (active) {
            float d = dqc_i * (1.0f - g_i);
            for (int c = 0; c < K_; ++c) {
                float acc_c = 0.0f;
#pragma unroll
                for (int j = 0; j < A_; ++j) acc_c += s_ds[s][j][i] * s_qry[s][j][c];
                s_dkey[s][i][c] = acc_c;
                d += s_dqry[s][i][c] * P.wq[0][c] + acc_c * P.wk[0][c];  // d t_i[0] / d q_i
            }
            if (dq != nullptr) {
#pragma unroll
                for (int j = 0; j < A_; ++j) d += s_a[s][j][i] * s_do[s][j];  // d o_j / d q_i
                dq[b * A_ + i] = d;
            }
        } else if (slot) {
            for (int c = 0; c < K_; ++c) s_dkey[s][i][c] = 0.0f;
        }
        __syncthreads();
        // Phase 4: this group's share of the P parameter sums.
#pragma unroll
        for (int t = 0; t < ATT_P_SLOTS; ++t) {
            const int p = threadIdx.x + t * ATT_THREADS;
            if (p >= ATT_P) break;
            float sum = 0.0f;
            if (p < 2 * A_ * K_) {
                const int r = p % (A_ * K_);
                const float (*src)[A_][K_] = p < A_ * K_ ? s_dqry : s_dkey;
                for (int ss = 0; ss < ATT_SAMPLES; ++ss) sum += src[ss][r / K_][r % K_];
            } else if (p < 2 * A_ * K_ + 2 * K_) {
                const int r = p - 2 * A_ * K_;
                const float (*src)[A_][K_] = r < K_ ? s_dqry : s_dkey;
                const int c = r % K_;
                for (int ss = 0; ss < ATT_SAMPLES; ++ss)
                    for (int j = 0; j < A_; ++j) sum += s_q[ss][j] * src[ss][j][c];
            } else {
                const int j = p - 2 * A_ * K_ - 2 * K_;
                for (int ss = 0; ss < ATT_SAMPLES; ++ss) sum += s_dgate[ss][j];
            }
            acc[t] += (double)sum;
        }
        __syncthreads();
    }
#pragma unroll
    for (int t = 0; t < ATT_P_SLOTS; ++t) {
        const int p = threadIdx.x + t * ATT_THREADS;
        if (p < ATT_P) partials[(long long)blockIdx.x * ATT_P + p] = acc[t];
    }
}

// totals[p] = sum_k partials[k, p] in a fixed order. A block of 8 warps takes 32 entries: lane =
// entry (coalesced loads), warp w adds the rows k = w, w + 8, ..., then warp 0 adds the 8 sums.
#define ATT_REDUCE_WARPS 8   // the wrapper launches 256 threads
extern "C" __global__ void attention_grad_reduce(
    const double* __restrict__ partials,  // [num_partials, ATT_P]
    int num_partials,
    double* __restrict__ totals)          // [ATT_P]
{
    __shared__ double s_sum[ATT_REDUCE_WARPS][32];
    const int lane = threadIdx.x & 31;
    const int w = threadIdx.x >> 5;
    const int p = blockIdx.x * 32 + lane;
    double sum = 0.0;
    if (p < ATT_P)
        for (int k = w; k < num_partials; k += ATT_REDUCE_WARPS) sum += partials[(long long)k * ATT_P + p];
    s_sum[w][lane] = sum;
    __syncthreads();
    if (w == 0 && p < ATT_P) {
        double t = 0.0;
        for (int r = 0; r < ATT_REDUCE_WARPS; ++r) t += s_sum[r][lane];
        totals[p] = t;
    }
}

// The four parameter gradients from the ATT_P totals (one block).
extern "C" __global__ void attention_grad_assemble(
    const double* __restrict__ totals,    // [ATT_P]
    const float* __restrict__ emb,        // [A, k]
    const float* __restrict__ wq,         // [k + 1, k]
    const float* __restrict__ wk,         // [k + 1, k]
    float* __restrict__ demb,             // [A, k]
    float* __restrict__ dwq,              // [k + 1, k]
    float* __restrict__ dwk,              // [k + 1, k]
    float* __restrict__ dgate)            // [A]
{
    const double* sq = totals;                      // sum_b dqry   [A, k]
    const double* sk = totals + A_ * K_;            // sum_b dkey   [A, k]
    const double* q0 = totals + 2 * A_ * K_;        // sum q dqry   [k]
    const double* k0 = q0 + K_;                     // sum q dkey   [k]
    const double* sg = k0 + K_;                     // sum dgate    [A]
    for (int t = threadIdx.x; t < (K_ + 1) * K_; t += blockDim.x) {
        const int r = t / K_, c = t % K_;
        if (r == 0) {
            dwq[t] = (float)q0[c];
            dwk[t] = (float)k0[c];
        } else {
            double aq = 0.0, ak = 0.0;
            for (int i = 0; i < A_; ++i) {
                aq += (double)emb[i * K_ + r - 1] * sq[i * K_ + c];
                ak += (double)emb[i * K_ + r - 1] * sk[i * K_ + c];
            }
            dwq[t] = (float)aq;
            dwk[t] = (float)ak;
        }
    }
    for (int t = threadIdx.x; t < A_ * K_; t += blockDim.x) {
        const int i = t / K_, e = t % K_;
        double acc = 0.0;
        for (int c = 0; c < K_; ++c)
            acc += sq[i * K_ + c] * (double)wq[(1 + e) * K_ + c] + sk[i * K_ + c] * (double)wk[(1 + e) * K_ + c];
        demb[t] = (float)acc;
    }
    for (int t = threadIdx.x; t < A_; t += blockDim.x) dgate[t] = (float)sg[t];
}
