// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the
// counter-based generator every foxhunt kernel draws from: action selection (boltzmann.cu),
// limit fills and episode starts (env_step.cu), replay sampling (replay.cu). Each caller keys it
// with its own (seed, counter, index, stream). NumPy twin for exact parity:
// foxhunt_core/gpu/philox.py (tested against the Random123 known-answer vectors).
#pragma once

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

// Ten rounds on the counter c[4] with the key (k0, k1); c is replaced by the output block.
__device__ __forceinline__ void philox4x32_10(unsigned int c[4], unsigned int k0, unsigned int k1) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        const unsigned int hi0 = __umulhi(PHILOX_M0, c[0]);
        const unsigned int lo0 = PHILOX_M0 * c[0];
        const unsigned int hi1 = __umulhi(PHILOX_M1, c[2]);
        const unsigned int lo1 = PHILOX_M1 * c[2];
        const unsigned int n0 = hi1 ^ c[1] ^ k0;
        const unsigned int n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = lo1;
        c[2] = n2;
        c[3] = lo0;
    }
}
