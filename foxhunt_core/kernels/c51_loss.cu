// C51 target projection (Bellemare et al. 2017, Eq. 7) fused with the loss CE - beta * H
// and its gradient with respect to the logits of the taken actions.
//
// NumPy twins: foxhunt_core/c51.py (project, loss_and_grad) and the scaling by 1 / (B * D) in
// foxhunt_core/agent.py (Agent.loss_and_grads). Launch wrapper: foxhunt_core/gpu/kernels.py.
//
// The projection, Eq. 7 written per shifted atom j:
//   b_j = clip((clip(r + gamma_b z_j, v_min, v_max) - v_min) / dz, 0, N - 1),  k_j = floor(b_j)
//   m_i = sum_j p_j max(0, 1 - |b_j - i|)
//       = sum_{j: k_j = i} p_j (1 - (b_j - k_j)) + sum_{j: k_j = i - 1} p_j (b_j - k_j)
// For fractional b_j the mass splits between k_j and k_j + 1; when b_j lands exactly on an atom
// the whole mass goes to it (weight 1 - 0) and nothing to the next -- the case the scatter form
// must special-case. b_j is monotone in j (an affine map of z_j, clipped; IEEE rounding keeps it
// monotone), so the atoms with one key k form a contiguous run: the two sums of each run, L_k
// and U_k, are taken by a segmented reduction over the warp (no atomics, deterministic), written
// to slot k of two shared arrays (U one slot up), and m_i = L_i + U_{i-1}.
//
// The bootstrap distribution from the target network's heads (``heads`` form, the update's): the
// warp forms p_next of row (b, d) itself from the target's value row v[b] and branch d's
// advantages adv[b, d] (padded layout, as dueling.cu's), exactly as dueling_softmax_forward does
// for the action next_action[b, d]:
//   l_j = (v_j + adv_{a*, j}) - mean_{a in d} adv_{a, j},  p = exp(l - logsumexp(l))
// so the target forward writes no probabilities and runs no dueling kernel for them.
//
// Thread mapping: one warp per row (b, d) at a time, lane l holds the APL consecutive atoms
// APL l .. APL l + APL - 1 (consecutive, so that a lane sums the part of a run it holds in
// registers and the warp only joins the parts across lanes). Rows are walked with a grid stride;
// the inputs of the next row and the action indices of the row after it are loaded while a row
// is worked on.

#include "sizes.cuh"

#define C51_APL ((NUM_ATOMS + 31) / 32)  // atoms per lane
#define C51_LANES ((NUM_ATOMS + C51_APL - 1) / C51_APL)  // lanes that hold atoms
#define C51_SLOTS (32 * C51_APL)
#define C51_WARPS (BLOCK_THREADS / 32)  // warps per block: the wrapper launches BLOCK_THREADS
// Blocks per SM that __launch_bounds__ guarantees (the wrapper launches 4 per SM): 64 registers;
// past 64 atoms 80, which the longer per-lane arrays need to stay out of local memory.
#define C51_BLOCKS_PER_SM (C51_APL <= 2 ? 4 : 3)
#define FULL_MASK 0xffffffffu

// Branch boundaries and the advantage row's branch blocks, read only with dlogits_full or the
// heads form (the wrapper then compiles with the layout).
__constant__ int kC51BranchOffsets[NUM_BRANCHES + 1] = BRANCH_OFFSETS;
__constant__ int kC51AdvColumns[NUM_BRANCHES + 1] = ADV_COLUMNS;

// A row's place: its index in [B * D], its sample b and its branch d.
struct C51Pos {
    unsigned row, b, d;
};

// What a row reads, loaded one row ahead of its turn.
struct C51Inputs {
    float lp[C51_APL];  // log-probabilities of the taken action
    float pn[C51_APL];  // target probabilities of the bootstrap action (heads form: its raw logit)
    float am[C51_APL];  // heads form: the branch's mean advantage
    float r, g;         // reward, discount
};

// Warp-wide max / sum.
__device__ __forceinline__ float c51_warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, o));
    return x;
}
__device__ __forceinline__ float c51_warp_sum(float x) {
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
// Heads form: v_next (rows v_pitch apart) and adv_next (rows adv_pitch apart) given, p_next null,
// next_action given (absolute indices).
// Indices are 32-bit up to the element offsets (B * max(A, D) < 2^32).
extern "C" __global__ void __launch_bounds__(C51_WARPS * 32, C51_BLOCKS_PER_SM) c51_target_loss(
    const float* __restrict__ p_next,     // [B, D, N], or [B, A, N] with next_action; null in the heads form
    const float* __restrict__ v_next,     // heads form: [B, >= N] the target's value head, else null
    int v_pitch,
    const float* __restrict__ adv_next,   // heads form: [B, c_D] the target's advantage row, else null
    int adv_pitch,
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
    // L_k at slot k, U_k at slot k + 1, zero where no run has that key (each reader clears its
    // slots after use); slot C51_SLOTS + lane takes the stores of a lane that has nothing to write.
    __shared__ __align__(16) float s_low[C51_WARPS][C51_SLOTS + 32];
    __shared__ __align__(16) float s_up[C51_WARPS][C51_SLOTS + 32];
    const int lane = threadIdx.x & 31;
    const int w = threadIdx.x >> 5;
    const int e0 = C51_APL * lane;  // this lane's first atom
    const float entropy_coeff = *entropy_coeff_ptr;
    const float v_min = z[0];
    const float v_max = z[NUM_ATOMS - 1];
    const float dz = (v_max - v_min) / (float)(NUM_ATOMS - 1);
    const float inv_dz = 1.0f / dz;
    // Atoms past N - 1 (padding) repeat the last one with no mass: their key is the last atom's,
    // they never start a run and add nothing.
    float zl[C51_APL];
#pragma unroll
    for (int t = 0; t < C51_APL; ++t) {
        zl[t] = e0 + t < NUM_ATOMS ? z[e0 + t] : v_max;
        s_low[w][e0 + t] = 0.0f;
        s_up[w][e0 + t] = 0.0f;
    }
    __syncwarp();

    // After the warp sums lane 0 writes H, lane 8 E[m] and lane 16 the loss CE - beta H.
    float* const out = lane == 0 ? entropy : lane == 8 ? m_mean : lane == 16 ? loss : nullptr;
    const float out_beta = lane == 16 ? entropy_coeff : 0.0f;

    const unsigned D = (unsigned)num_branches;
    const unsigned rows = (unsigned)batch * D;
    const unsigned stride = gridDim.x * C51_WARPS;
    const unsigned stride_b = stride / D, stride_d = stride % D;
    auto advance = [&](C51Pos p) {
        p.row += stride;
        p.b += stride_b;
        p.d += stride_d;
        if (p.d >= D) {
            p.d -= D;
            ++p.b;
        }
        return p;
    };
    auto load_index = [&](const long long* idx, const C51Pos& p) {
        return idx != nullptr && p.row < rows ? (int)idx[p.row] : 0;
    };
    auto load_inputs = [&](const C51Pos& p, int a_taken, int a_next, C51Inputs& in) {
        // Past the last row it reads row 0 (indices 0, see load_index), which is never used.
        const bool live = p.row < rows;
        const unsigned b = live ? p.b : 0u, row = live ? p.row : 0u;
        const unsigned lrow = action != nullptr ? b * num_actions + a_taken : row;
        const unsigned prow = next_action != nullptr ? b * num_actions + a_next : row;
        const float* lps = log_probs + (size_t)lrow * NUM_ATOMS;
        in.r = reward[b];
        in.g = discount[b];
        if (v_next != nullptr) {  // the raw logit of the bootstrap action and the branch's mean
            const unsigned d = live ? p.d : 0u;
            const int a0 = kC51BranchOffsets[d], n = kC51BranchOffsets[d + 1] - a0;
            const int i_next = live ? a_next - a0 : 0;
            const float* vs = v_next + (size_t)b * v_pitch;
            const float* as = adv_next + (size_t)b * adv_pitch + kC51AdvColumns[d];
#pragma unroll
            for (int t = 0; t < C51_APL; ++t) {
                const int e = min(e0 + t, NUM_ATOMS - 1);
                const bool pad = e0 + t >= NUM_ATOMS;
                float sum = 0.0f, own = 0.0f;
#pragma unroll
                for (int k = 0; k < MAX_BRANCH_SIZE; ++k) {
                    if (k < n) {
                        const float x = as[k * NUM_ATOMS + e];
                        sum += x;
                        if (k == i_next) own = x;
                    }
                }
                const float lp = lps[e], vv = vs[e];
                in.lp[t] = pad ? 0.0f : lp;
                in.pn[t] = vv + own;
                in.am[t] = sum / (float)n;
            }
            return;
        }
        const float* pns = p_next + (size_t)prow * NUM_ATOMS;
#pragma unroll
        for (int t = 0; t < C51_APL; ++t) {
            const int e = min(e0 + t, NUM_ATOMS - 1);  // padding reads the last atom and drops it
            const bool pad = e0 + t >= NUM_ATOMS;
            const float lp = lps[e], pn = pns[e];
            in.lp[t] = pad ? 0.0f : lp;
            in.pn[t] = pad ? 0.0f : pn;
        }
    };

    // Three rows in the pipeline: this one (inputs loaded), the next (its action indices loaded,
    // its inputs loaded during this row) and the one after (its indices loaded during this row).
    C51Pos pos;
    pos.row = blockIdx.x * C51_WARPS + w;
    pos.b = pos.row / D;
    pos.d = pos.row - pos.b * D;
    C51Pos pos1 = advance(pos);
    int taken = load_index(action, pos);
    C51Inputs in;
    load_inputs(pos, taken, load_index(next_action, pos), in);
    int taken1 = load_index(action, pos1), next1 = load_index(next_action, pos1);

    while (pos.row < rows) {
        C51Inputs in1;
        load_inputs(pos1, taken1, next1, in1);
        const C51Pos pos2 = advance(pos1);
        const int taken2 = load_index(action, pos2), next2 = load_index(next_action, pos2);
        if (v_next != nullptr) {
            // The bootstrap action's log-softmax over atoms (as dueling_softmax_forward: the max
            // subtracted first, then log of the sum of exponentials), then its probabilities.
            float mx = __int_as_float(0xff800000);
#pragma unroll
            for (int t = 0; t < C51_APL; ++t) {
                in.pn[t] = e0 + t < NUM_ATOMS ? in.pn[t] - in.am[t] : __int_as_float(0xff800000);
                mx = fmaxf(mx, in.pn[t]);
            }
            mx = c51_warp_max(mx);
            float se = 0.0f;
#pragma unroll
            for (int t = 0; t < C51_APL; ++t) {
                in.pn[t] -= mx;  // padding stays at -inf: exp gives 0
                se += expf(in.pn[t]);
            }
            const float lse = logf(c51_warp_sum(se));
#pragma unroll
            for (int t = 0; t < C51_APL; ++t) in.pn[t] = expf(in.pn[t] - lse);
        }

        // Fractional index b, key floor(b) (as a float) and the two shares of each atom this lane holds.
        float key[C51_APL], wl[C51_APL], wu[C51_APL];
        int slot[C51_APL];
#pragma unroll
        for (int t = 0; t < C51_APL; ++t) {
            const float tz = fminf(fmaxf(in.r + in.g * zl[t], v_min), v_max);
            // (tz - v_min) / dz rounded as the division rounds: x * (1 / dz) is within an ulp and
            // one remainder step corrects it (Markstein; x is 0 or at least an ulp of v_min), so a
            // shift that lands on an atom gives exactly its index.
            const float x = tz - v_min;
            const float q0 = x * inv_dz;
            const float q = fmaf(fmaf(-q0, dz, x), inv_dz, q0);
            // Clip the fractional index too: (v_max - v_min) / dz can round a hair above N - 1.
            const float b = fminf(q, (float)(NUM_ATOMS - 1));  // q >= 0 as x >= 0
            // floor(b) for 0 <= b < 2^22: rounding b + 1.5 * 2^23 down leaves floor(b) in the low bits.
            const float shifted = __fadd_rd(b, 12582912.0f);
            key[t] = shifted - 12582912.0f;
            slot[t] = __float_as_int(shifted) - __float_as_int(12582912.0f);
            const float f = b - key[t];
            wl[t] = in.pn[t] * (1.0f - f);
            wu[t] = in.pn[t] * f;
        }

        // Segmented suffix sums across lanes of each lane's head run (its leading atoms that share
        // the first key): afterwards h = the sum from this lane's first atom to the end of its run.
        // A run spans lanes l .. l + o only if lane l + o starts with lane l's key (monotone keys),
        // so the doubling stops as soon as no lane's run reaches o lanes further.
        const float kh = key[0];
        float hl = wl[0], hu = wu[0];
#pragma unroll
        for (int t = 1; t < C51_APL; ++t) {
            if (key[t] == kh) {
                hl += wl[t];
                hu += wu[t];
            }
        }
        const float kn = __shfl_down_sync(FULL_MASK, kh, 1);  // the next lane's first key
        float ko = kn;
        for (int o = 1;;) {
            const bool join = lane + o < C51_LANES && ko == kh;
            if (!__any_sync(FULL_MASK, join)) break;
            const float al = __shfl_down_sync(FULL_MASK, hl, o);
            const float au = __shfl_down_sync(FULL_MASK, hu, o);
            if (join) {
                hl += al;
                hu += au;
            }
            o <<= 1;
            if (o == 32) break;
            ko = __shfl_down_sync(FULL_MASK, kh, o);
        }
        const float nl = __shfl_down_sync(FULL_MASK, hl, 1);
        const float nu = __shfl_down_sync(FULL_MASK, hu, 1);
        const float kp = __shfl_up_sync(FULL_MASK, key[C51_APL - 1], 1);  // the previous lane's last key

        // Each run's sums, stored where it starts: the suffix of the run inside this lane, plus the
        // next lane's head run when this lane's last run goes on into it.
        __syncwarp();  // every lane has read the previous row's slots
        {
            const bool cont = lane + 1 < C51_LANES && kn == key[C51_APL - 1];
            float sl = 0.0f, su = 0.0f;
#pragma unroll
            for (int t = C51_APL - 1; t >= 0; --t) {
                const bool same = t == C51_APL - 1 ? cont : key[t + 1] == key[t];
                sl = wl[t] + (same ? (t == C51_APL - 1 ? nl : sl) : 0.0f);
                su = wu[t] + (same ? (t == C51_APL - 1 ? nu : su) : 0.0f);
                const bool starts = t == 0 ? lane == 0 || kp != key[0] : key[t - 1] != key[t];
                // U of key N - 1 is zero (b = N - 1 exactly) and lands in slot N, which only a
                // padding atom or the spare slots read.
                s_low[w][starts ? slot[t] : C51_SLOTS + lane] = sl;
                s_up[w][starts ? slot[t] + 1 : C51_SLOTS + lane] = su;
            }
        }
        __syncwarp();
        float mm[C51_APL];
#pragma unroll
        for (int t = 0; t < C51_APL; ++t) {
            mm[t] = s_low[w][e0 + t] + s_up[w][e0 + t];
            s_low[w][e0 + t] = 0.0f;
            s_up[w][e0 + t] = 0.0f;
        }

        // Padding atoms: log p = 0 and m = 0, so they add nothing to the sums.
        float pp[C51_APL];
        float ce = 0.0f, ent = 0.0f, em = 0.0f;
#pragma unroll
        for (int t = 0; t < C51_APL; ++t) {
            pp[t] = exp2f(in.lp[t] * 1.44269504f);  // log2(e)
            ce -= mm[t] * in.lp[t];
            ent -= pp[t] * in.lp[t];
            em += mm[t] * zl[t];
        }
        // The three warp sums in six shuffles: the first two steps halve the values each lane
        // carries (ent, ce, em, 0 -> two -> one), the last three finish the sums. Then lanes 0-7
        // hold H, 8-15 E[m], 16-23 CE.
        const bool hi16 = (lane & 16) != 0, hi8 = (lane & 8) != 0;
        const float x = (hi16 ? ce : ent) + __shfl_xor_sync(FULL_MASK, hi16 ? ent : ce, 16);
        const float y = (hi16 ? 0.0f : em) + __shfl_xor_sync(FULL_MASK, hi16 ? em : 0.0f, 16);
        float s = (hi8 ? y : x) + __shfl_xor_sync(FULL_MASK, hi8 ? x : y, 8);
        s += __shfl_xor_sync(FULL_MASK, s, 4);
        s += __shfl_xor_sync(FULL_MASK, s, 2);
        s += __shfl_xor_sync(FULL_MASK, s, 1);
        const float h = __shfl_sync(FULL_MASK, s, 0);

        float* dl = dlogits + (size_t)pos.row * NUM_ATOMS;
        if (dlogits_full) {  // zero the branch's other actions; the taken one gets the gradient
            float* sample = dlogits + (size_t)(pos.b * num_actions) * NUM_ATOMS;
            dl = sample + taken * NUM_ATOMS;
            const int a0 = kC51BranchOffsets[pos.d], a1 = kC51BranchOffsets[pos.d + 1];
#pragma unroll
            for (int k = 0; k < MAX_BRANCH_SIZE; ++k) {
                const int a = a0 + k;
#pragma unroll
                for (int t = 0; t < C51_APL; ++t) {  // lane-interleaved: each store one contiguous span
                    const int i = lane + 32 * t;
                    if (a < a1 && a != taken && i < NUM_ATOMS) sample[a * NUM_ATOMS + i] = 0.0f;
                }
            }
        }
#pragma unroll
        for (int t = 0; t < C51_APL; ++t) {
            if (e0 + t < NUM_ATOMS) {
                if (m != nullptr) m[(size_t)pos.row * NUM_ATOMS + e0 + t] = mm[t];
                dl[e0 + t] = grad_scale * ((pp[t] - mm[t]) + entropy_coeff * pp[t] * (in.lp[t] + h));
            }
        }
        if (out != nullptr) out[pos.row] = s - out_beta * h;

        pos = pos1;
        pos1 = pos2;
        in = in1;
        taken = taken1;
        taken1 = taken2;
        next1 = next2;
    }
}
