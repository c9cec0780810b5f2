// C51 target projection (Bellemare et al. 2017, Eq. 7) fused with the loss CE - beta * H
// and its gradient with respect to the logits of the taken actions.
//
// NumPy twins: foxhunt_core/c51.py (project, loss_and_grad) and the scaling by 1 / (B * D) in
// foxhunt_core/agent.py (Agent.loss_and_grads). Launch wrapper: foxhunt_core/gpu/kernels.py.
//
// Thread mapping: one warp per row (b, d) at a time, lane l holds atoms l, l + 32, ...
// The projection is written as a gather rather than a scatter, which is the same Eq. 7:
//   b_j = clip((clip(r + gamma_b z_j, v_min, v_max) - v_min) / dz, 0, N - 1)
//   m_i = sum_j p_j * max(0, 1 - |b_j - i|)
// For fractional b_j this gives (up - b_j) to low = floor(b_j) and (b_j - low) to up = low + 1;
// when b_j lands exactly on an atom (low == up) the whole mass goes to that atom -- the case
// the scatter form must special-case. The gather needs no atomics and is deterministic.
// b_j is monotone in j (an affine map of z_j, clipped; IEEE rounding keeps it monotone), so the
// atoms j with |b_j - i| < 1 are one contiguous run: each target atom finds the start of its run
// by binary search and sums only the run (the terms it skips are exactly zero).

#include "sizes.cuh"

#define ATOMS_PER_LANE ((NUM_ATOMS + 31) / 32)
#define C51_WARPS 8   // warps per block: the wrapper launches 256 threads
#define FULL_MASK 0xffffffffu

// Branch boundaries, read only when dlogits_full (the wrapper then compiles with the layout).
__constant__ int kC51BranchOffsets[NUM_BRANCHES + 1] = BRANCH_OFFSETS;

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(FULL_MASK, x, o);
    return x;
}

// m = project(p_next, reward, discount); loss = CE(m, p) - beta H(p);
// dlogits = grad_scale * ((p - m) + beta p (log p + H)), p = exp(log_probs).
//
// Indexed form (the update's): with next_action / action given, p_next and log_probs are the
// whole [B, A, N] outputs of the target and online networks and row (b, d) reads action
// next_action[b, d] / action[b, d] (absolute indices); without, they are [B, D, N] already
// gathered. With dlogits_full, the gradient is written over all A actions of [B, A, N]: the
// taken action's row, zeros for the branch's other actions (no separate scatter).
extern "C" __global__ void c51_target_loss(
    const float* __restrict__ p_next,     // [B, D, N], or [B, A, N] with next_action
    const long long* __restrict__ next_action,  // [B, D] or null
    const float* __restrict__ reward,     // [B]
    const float* __restrict__ discount,   // [B] gamma * (1 - terminal)
    const float* __restrict__ log_probs,  // [B, D, N], or [B, A, N] with action
    const long long* __restrict__ action, // [B, D] or null
    const float* __restrict__ z,          // [N] support
    const float* __restrict__ entropy_coeff_ptr,  // [1] read on the device (graph replays see updates)
    float grad_scale,
    float* __restrict__ m,                // [B, D, N] or null
    float* __restrict__ dlogits,          // [B, D, N], or [B, A, N] when dlogits_full
    float* __restrict__ loss,             // [B, D]
    float* __restrict__ entropy,          // [B, D]
    float* __restrict__ m_mean,           // [B, D] E[m] = sum_i m_i z_i, or null
    int batch, int num_branches, int num_actions, int dlogits_full)
{
    __shared__ float s_b[C51_WARPS][NUM_ATOMS];
    __shared__ float s_p[C51_WARPS][NUM_ATOMS];
    const int lane = threadIdx.x & 31;
    const int w = threadIdx.x >> 5;
    const float entropy_coeff = *entropy_coeff_ptr;
    const float v_min = z[0];
    const float v_max = z[NUM_ATOMS - 1];
    const float dz = (v_max - v_min) / (float)(NUM_ATOMS - 1);
    const long long rows = (long long)batch * num_branches;

    // Each warp walks rows with a grid stride and loads the next row's probabilities before
    // working on this one (their latency overlaps the projection).
    const long long stride = (long long)gridDim.x * C51_WARPS;
    long long row = (long long)blockIdx.x * C51_WARPS + w;
    float lp_next[ATOMS_PER_LANE], pn_next[ATOMS_PER_LANE];
    auto fetch = [&](long long r) {
        const long long b = r / num_branches;
        const long long lb = action != nullptr ? (b * num_actions + action[r]) * NUM_ATOMS : r * NUM_ATOMS;
        const long long pb = next_action != nullptr ? (b * num_actions + next_action[r]) * NUM_ATOMS : r * NUM_ATOMS;
#pragma unroll
        for (int k = 0; k < ATOMS_PER_LANE; ++k) {
            const int i = lane + 32 * k;
            lp_next[k] = i < NUM_ATOMS ? log_probs[lb + i] : 0.0f;
            pn_next[k] = i < NUM_ATOMS ? p_next[pb + i] : 0.0f;
        }
    };
    if (row < rows) fetch(row);
    for (; row < rows; row += stride) {
        const long long b = row / num_branches;
        const float r = reward[b];
        const float g = discount[b];
        const long long base = row * NUM_ATOMS;
        float lp[ATOMS_PER_LANE], pn[ATOMS_PER_LANE];
#pragma unroll
        for (int k = 0; k < ATOMS_PER_LANE; ++k) {
            lp[k] = lp_next[k];
            pn[k] = pn_next[k];
        }
        if (row + stride < rows) fetch(row + stride);  // in flight while this row is worked on
#pragma unroll
        for (int k = 0; k < ATOMS_PER_LANE; ++k) {
            const int j = lane + 32 * k;
            if (j < NUM_ATOMS) {
                const float tz = fminf(fmaxf(r + g * z[j], v_min), v_max);
                // Clip the fractional index too: (v_max - v_min) / dz can round a hair above N - 1.
                s_b[w][j] = fminf(fmaxf((tz - v_min) / dz, 0.0f), (float)(NUM_ATOMS - 1));
                s_p[w][j] = pn[k];
            }
        }
        __syncwarp();
        const bool ascending = s_b[w][NUM_ATOMS - 1] >= s_b[w][0];

        float mm[ATOMS_PER_LANE], pp[ATOMS_PER_LANE];
        float ce = 0.0f, ent = 0.0f, em = 0.0f;
#pragma unroll
        for (int k = 0; k < ATOMS_PER_LANE; ++k) {
            const int i = lane + 32 * k;
            float acc = 0.0f;
            mm[k] = 0.0f;
            pp[k] = 0.0f;
            if (i < NUM_ATOMS) {
                const float fi = (float)i;
                // Index jj -> atom j such that b is non-decreasing in jj (reverse when gamma < 0).
                int lo = 0, hi = NUM_ATOMS;  // first jj with b > i - 1
                while (lo < hi) {
                    const int mid = (lo + hi) >> 1;
                    if (s_b[w][ascending ? mid : NUM_ATOMS - 1 - mid] > fi - 1.0f) hi = mid;
                    else lo = mid + 1;
                }
                for (int jj = lo; jj < NUM_ATOMS; ++jj) {
                    const int j = ascending ? jj : NUM_ATOMS - 1 - jj;
                    const float bj = s_b[w][j];
                    if (bj >= fi + 1.0f) break;
                    acc += s_p[w][j] * fmaxf(0.0f, 1.0f - fabsf(bj - fi));
                }
                mm[k] = acc;
                em += acc * z[i];
                pp[k] = expf(lp[k]);
                ce -= acc * lp[k];
                ent -= pp[k] * lp[k];
            }
        }
        ce = warp_sum(ce);
        ent = warp_sum(ent);
        if (m_mean != nullptr) em = warp_sum(em);
        long long dl_base = base;
        if (dlogits_full) {  // zero the branch's other actions; the taken one gets the gradient
            const int d = (int)(row - b * num_branches);
            const int a_taken = (int)action[row];
            dl_base = (b * num_actions + a_taken) * NUM_ATOMS;
            for (int a = kC51BranchOffsets[d]; a < kC51BranchOffsets[d + 1]; ++a) {
                if (a == a_taken) continue;
                for (int i = lane; i < NUM_ATOMS; i += 32) dlogits[(b * num_actions + a) * NUM_ATOMS + i] = 0.0f;
            }
        }
#pragma unroll
        for (int k = 0; k < ATOMS_PER_LANE; ++k) {
            const int i = lane + 32 * k;
            if (i < NUM_ATOMS) {
                if (m != nullptr) m[base + i] = mm[k];
                dlogits[dl_base + i] =
                    grad_scale * ((pp[k] - mm[k]) + entropy_coeff * pp[k] * (lp[k] + ent));
            }
        }
        if (lane == 0) {
            loss[row] = ce - entropy_coeff * ent;
            entropy[row] = ent;
            if (m_mean != nullptr) m_mean[row] = em;
        }
        __syncwarp();  // the next row overwrites this warp's shared slots
    }
}
