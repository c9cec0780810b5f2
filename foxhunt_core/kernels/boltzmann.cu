// Per-branch Boltzmann action selection with a counter-based RNG (Philox4x32-10).
//
// NumPy twins: foxhunt_core/explore.py (boltzmann_select: softmax(values_d / T_d), inverse CDF)
// and foxhunt_core/gpu/philox.py (the same Philox4x32-10, vectorized, for exact parity).
// Launch wrapper: foxhunt_core/gpu/qkernels.py.
//
// Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"; the
// constants of Random123): ten rounds of
//   (c0, c1, c2, c3) <- (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0))
// with the key bumped by the Weyl constants (W0, W1) between rounds.
//
// Keying: key = (seed_lo, seed_hi), counter = (sample, counter_lo, counter_hi, group); output
// word w of group g is branch d = 4 g + w. Uniform in [0, 1): (x >> 8) * 2^-24 (exact in
// float). Thread mapping: one thread per sample, looping over the branches.

#include "sizes.cuh"

#include "philox.cuh"

__constant__ int kBranchOffsets[NUM_BRANCHES + 1] = BRANCH_OFFSETS;

// Known-answer check of the generator: out[4] = philox4x32_10(ctr, key) (one thread).
extern "C" __global__ void philox4x32_10_kat(const unsigned int* ctr, const unsigned int* key,
                                            unsigned int* out) {
    unsigned int c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    philox4x32_10(c, key[0], key[1]);
    for (int w = 0; w < 4; ++w) out[w] = c[w];
}

// actions[b, d] = number of CDF entries of softmax(values[b, branch d] / temps[d]) below u_bd,
// capped at n_d - 1 (as explore.boltzmann_select). The counter comes from counter_device[0]
// when that pointer is given (so a replayed CUDA graph draws fresh numbers after
// counter_advance), otherwise from counter_host.
extern "C" __global__ void boltzmann_select(
    const float* __restrict__ values,     // [B, A]
    const float* __restrict__ temps,      // [D]
    unsigned int seed_lo, unsigned int seed_hi,
    const unsigned long long* __restrict__ counter_device,   // [1] or null
    unsigned long long counter_host,
    int* __restrict__ actions,            // [B, D]
    int batch)
{
    const unsigned long long ctr = counter_device != nullptr ? counter_device[0] : counter_host;
    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < batch;
         b += (long long)gridDim.x * blockDim.x) {
        const float* row = values + b * NUM_ACTIONS;
        unsigned int bits[4];
#pragma unroll
        for (int d = 0; d < NUM_BRANCHES; ++d) {
            if (d % 4 == 0) {
                bits[0] = (unsigned int)b;
                bits[1] = (unsigned int)(ctr & 0xffffffffull);
                bits[2] = (unsigned int)(ctr >> 32);
                bits[3] = (unsigned int)(d / 4);
                philox4x32_10(bits, seed_lo, seed_hi);
            }
            const float u = (float)(bits[d % 4] >> 8) * 5.9604644775390625e-08f;  // 2^-24
            const int a0 = kBranchOffsets[d];
            const int n = kBranchOffsets[d + 1] - a0;
            const float t = temps[d];
            float x[MAX_BRANCH_SIZE];
            float mx = __int_as_float(0xff800000);
#pragma unroll
            for (int i = 0; i < MAX_BRANCH_SIZE; ++i) {
                x[i] = i < n ? row[a0 + i] / t : 0.0f;
                if (i < n) mx = fmaxf(mx, x[i]);
            }
            float total = 0.0f;
#pragma unroll
            for (int i = 0; i < MAX_BRANCH_SIZE; ++i) {
                x[i] = i < n ? expf(x[i] - mx) : 0.0f;
                total += x[i];
            }
            int count = 0;
            float cdf = 0.0f;
#pragma unroll
            for (int i = 0; i < MAX_BRANCH_SIZE; ++i) {
                if (i < n) {
                    cdf += x[i];
                    count += (cdf / total < u) ? 1 : 0;
                }
            }
            actions[b * NUM_BRANCHES + d] = count < n - 1 ? count : n - 1;
        }
    }
}

// counter[0] += by (one thread): launched after boltzmann_select inside a captured graph.
extern "C" __global__ void counter_advance(unsigned long long* counter, unsigned long long by) {
    counter[0] += by;
}
