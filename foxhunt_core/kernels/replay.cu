// The replay ring buffer on the device: batched add and uniform sampling without host sync.
//
// NumPy twin: foxhunt_core/replay.py (ReplayBuffer); launch wrappers: foxhunt_core/gpu/replay.py.
// Storage (same dtypes and layout as the NumPy buffer, so checkpoints are interchangeable):
//   obs, next_obs float32 [capacity, obs_dim]; action int64 [capacity, branches];
//   reward, terminal float32 [capacity].
// cursor: int64 [2] = (write position, fill level), kept on the device. An add writes rows
// (pos + r) % capacity and replay_commit then advances the cursor; a sample reads the fill level
// from the device, so neither needs the host.
//
// Sampling: index_b = floor(u_b * size) with u_b from Philox4x32-10 (philox.cuh) on
// counter = (draw counter lo, hi, b, stream) and key = (seed lo, hi); the
// draw counter lives on the device and replay_advance_counter moves it on after each sample.
// A sample from an empty buffer reads row 0 (no host check is possible without a sync).

#ifndef REPLAY_ACTION_T
#define REPLAY_ACTION_T long long   // dtype of the incoming actions (int64 or int32)
#endif
#ifndef REPLAY_TERMINAL_T
#define REPLAY_TERMINAL_T bool      // dtype of the incoming terminal flags (bool or float)
#endif

#define REPLAY_STREAM_SAMPLE 2u     // Philox stream of sample draws (env_step uses 0 and 1)

#include "philox.cuh"

// ---------------------------------------------------------------------------- add
// One thread per element of the incoming [n, obs_dim] observations; the first `branches`
// columns of a row also copy its actions, column 0 its reward and terminal flag.
extern "C" __global__ void replay_add(
    float* obs, float* next_obs, long long* action, float* reward, float* terminal,
    const long long* __restrict__ cursor,
    const float* __restrict__ in_obs, const REPLAY_ACTION_T* __restrict__ in_action,
    const float* __restrict__ in_reward, const float* __restrict__ in_next_obs,
    const REPLAY_TERMINAL_T* __restrict__ in_terminal,
    int n, int obs_dim, int branches, long long capacity)
{
    const int total = n * obs_dim;      // < 2^31 (checked by the wrapper)
    const long long pos = cursor[0];    // < capacity, and n <= capacity: one wrap at most
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        const int r = e / obs_dim;
        const int c = e - r * obs_dim;
        long long dst = pos + r;
        if (dst >= capacity) dst -= capacity;
        obs[dst * obs_dim + c] = in_obs[e];
        next_obs[dst * obs_dim + c] = in_next_obs[e];
        if (c < branches) action[dst * branches + c] = (long long)in_action[r * branches + c];
        if (c == 0) {
            reward[dst] = in_reward[r];
            terminal[dst] = (float)in_terminal[r];
        }
    }
}

// pos <- (pos + n) % capacity, size <- min(size + n, capacity): after replay_add.
extern "C" __global__ void replay_commit(long long* cursor, long long n, long long capacity) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        cursor[0] = (cursor[0] + n) % capacity;
        const long long s = cursor[1] + n;
        cursor[1] = s < capacity ? s : capacity;
    }
}

// ---------------------------------------------------------------------------- sample
// One warp per sampled transition: lane 0 draws the index, the warp copies the row.
extern "C" __global__ void replay_sample(
    const float* __restrict__ obs, const float* __restrict__ next_obs,
    const long long* __restrict__ action, const float* __restrict__ reward,
    const float* __restrict__ terminal, const long long* __restrict__ cursor,
    unsigned long long seed, const unsigned long long* __restrict__ counter,
    const long long* __restrict__ indices,           // [batch] or null: Philox
    long long* out_index, float* out_obs, long long* out_action, float* out_reward,
    float* out_next_obs, float* out_terminal,
    int batch, int obs_dim, int branches)
{
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (warp >= batch) return;
    const int b = (int)warp;
    long long idx = 0;
    if (lane == 0) {
        if (indices != nullptr) {
            idx = indices[b];
        } else {
            const unsigned long long ctr = counter[0];
            unsigned int c[4] = {(unsigned int)ctr, (unsigned int)(ctr >> 32), (unsigned int)b,
                                 REPLAY_STREAM_SAMPLE};
            philox4x32_10(c, (unsigned int)seed, (unsigned int)(seed >> 32));
            const double u = ((double)(c[0] >> 5) * 67108864.0 + (double)(c[1] >> 6))
                             * (1.0 / 9007199254740992.0);
            const long long size = cursor[1];
            idx = (long long)__dmul_rn(u, (double)size);
            if (idx > size - 1) idx = size - 1;
            if (idx < 0) idx = 0;  // empty buffer
        }
        out_index[b] = idx;
    }
    idx = __shfl_sync(0xffffffffu, idx, 0);
    for (int c = lane; c < obs_dim; c += 32) {
        out_obs[(long long)b * obs_dim + c] = obs[idx * obs_dim + c];
        out_next_obs[(long long)b * obs_dim + c] = next_obs[idx * obs_dim + c];
    }
    if (lane < branches) out_action[(long long)b * branches + lane] = action[idx * branches + lane];
    if (lane == 0) {
        out_reward[b] = reward[idx];
        out_terminal[b] = terminal[idx];
    }
}

extern "C" __global__ void replay_advance_counter(unsigned long long* counter) {
    if (blockIdx.x == 0 && threadIdx.x == 0) counter[0] += 1ULL;
}

// Philox4x32-10 on explicit counters and keys, for the known-answer test.
extern "C" __global__ void replay_philox_kat(const unsigned int* ctr, const unsigned int* key,
                                             unsigned int* out, int m) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m) return;
    unsigned int c[4] = {ctr[4 * i], ctr[4 * i + 1], ctr[4 * i + 2], ctr[4 * i + 3]};
    philox4x32_10(c, key[2 * i], key[2 * i + 1]);
    for (int w = 0; w < 4; ++w) out[4 * i + w] = c[w];
}
