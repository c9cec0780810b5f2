/*
 * Quantile Q-select: out[r] = (1 - alpha) Q(tau_hi) + alpha Q(tau_lo) of distribution r,
 * alpha = clip(*readiness, 0, 1), for the R = B * A atom distributions probs[r, 0..N-1] that the
 * network's forward already wrote (no softmax here).
 *
 * A quantile is read off the CDF by cell interpolation (NumPy twin and the equations:
 * foxhunt_quantile_select/quantile.py): with T the distribution's total mass and t = tau T,
 *   j = first atom with F_j >= t,   Q(tau) = z_0 + dz (j + clip((t - F_{j-1}) / p_j, 0, 1) - 1/2).
 *
 * One thread per distribution, QS_TILE distributions per block. The block's QS_TILE * N
 * probabilities are contiguous in memory: they are loaded coalesced into shared memory (each
 * row at an odd stride, so the per-thread walks that follow are free of bank conflicts), then
 * each thread sums its row and walks its CDF once for both levels. Every probability is read
 * from global memory once.
 *
 * readiness is read through a pointer when it is given (a device scalar: a replayed CUDA graph
 * sees the value the trainer last wrote), else readiness_value is used.
 */
#ifndef NUM_ATOMS
#define NUM_ATOMS 51
#endif
#ifndef QS_TILE
#define QS_TILE 128
#endif

#define QS_STRIDE (NUM_ATOMS | 1)

extern "C" __global__ void quantile_select(
    const float* __restrict__ probs,      /* [rows, NUM_ATOMS] atom probabilities */
    const float* __restrict__ support,    /* [NUM_ATOMS] uniform atoms z_0 .. z_{N-1} */
    const float* __restrict__ readiness,  /* [] iqn_readiness on the device, or null */
    float readiness_value,                /* used when readiness is null */
    double tau_lo,                        /* pessimistic level, weight alpha */
    double tau_hi,                        /* optimistic level, weight 1 - alpha */
    float* __restrict__ out,              /* [rows] */
    long long rows)
{
    __shared__ float tile[QS_TILE * QS_STRIDE];
    const long long first = (long long)blockIdx.x * QS_TILE;
    const int count = (int)min((long long)QS_TILE, rows - first);
    if (count <= 0) {
        return;
    }
    const float* src = probs + first * NUM_ATOMS;
    for (int i = threadIdx.x; i < count * NUM_ATOMS; i += QS_TILE) {
        const int r = i / NUM_ATOMS;
        tile[r * QS_STRIDE + (i - r * NUM_ATOMS)] = src[i];
    }
    __syncthreads();
    if (threadIdx.x >= count) {
        return;
    }

    /* The CDF is summed in double: the fraction (t - F_{j-1}) / p_j divides rounding of F by p_j,
     * which is small where the level falls in a sparse cell of a peaked distribution. */
    const float* p = tile + threadIdx.x * QS_STRIDE;
    double total = 0.0;
#pragma unroll 17
    for (int j = 0; j < NUM_ATOMS; ++j) {
        total += (double)p[j];
    }
    const double t_lo = tau_lo * total;
    const double t_hi = tau_hi * total;
    /* positions in units of dz above z_0 - dz/2; the top of the last cell unless a level is met */
    double pos_lo = (double)NUM_ATOMS, pos_hi = (double)NUM_ATOMS;
    bool lo_open = true, hi_open = true;
    double cdf = 0.0;  /* F_{j-1} */
#pragma unroll 17
    for (int j = 0; j < NUM_ATOMS; ++j) {
        const double pj = (double)p[j];
        const double next = cdf + pj;  /* F_j, summed in the same order as total */
        if (lo_open && next >= t_lo) {
            pos_lo = (double)j + (pj > 0.0 ? fmin(fmax((t_lo - cdf) / pj, 0.0), 1.0) : 1.0);
            lo_open = false;
        }
        if (hi_open && next >= t_hi) {
            pos_hi = (double)j + (pj > 0.0 ? fmin(fmax((t_hi - cdf) / pj, 0.0), 1.0) : 1.0);
            hi_open = false;
        }
        cdf = next;
    }

    const float r = readiness != nullptr ? *readiness : readiness_value;
    const double alpha = (double)fminf(fmaxf(r, 0.0f), 1.0f);
    const double z0 = (double)support[0];
    const double dz = ((double)support[NUM_ATOMS - 1] - z0) / (double)(NUM_ATOMS - 1);
    const double pos = (1.0 - alpha) * pos_hi + alpha * pos_lo;
    out[first + threadIdx.x] = (float)(z0 + dz * (pos - 0.5));
}
