// The vectorized trading environment on the device: one thread per episode.
//
// NumPy twin: foxhunt_core/env.py (`transition`, `reset_episodes`, `start_bars`, `observe`);
// launch wrappers: foxhunt_core/gpu/env.py. The rules (fills, costs, reward, the account block,
// auto-reset with truncation, final_obs) are documented once, in env.py's docstring; this file
// follows `transition` line by line and names the NumPy variable it computes.
//
// Exactness: all money arithmetic is float64, like the NumPy twin. Every product that could be
// contracted with a following add into an FMA is written __dmul_rn (NVRTC contracts by default
// and the loader passes no --fmad=false), so PnL, costs and the order book of each episode are
// bit-identical to NumPy given the same uniforms. Only pow/expm1/log1p may differ in the last
// ulp: they enter the fill probability (compared with a uniform) and the float32 holding-time
// feature.
//
// Randomness: Philox4x32-10 (Salmon et al. 2011, Random123; philox.cuh).
// counter = (step counter lo, hi, episode, stream), key = (seed lo, hi); the step counter is read
// from device memory and advanced by env_advance_counter, so a step has no host round trip and
// can be captured in a CUDA graph. Words 0,1 give the fill uniform, 2,3 the reset-start uniform
// (53 bits each). Tests pass explicit uniforms instead ([n, 2] float64: fill, reset).
//
// Observations: each block first computes its episodes' transitions, keeping in shared memory
// the bar each observation row comes from and its four account values, then the block writes
// its rows of [n, obs_dim] cooperatively (a warp per row, a lane per column). The account
// columns are kernel arguments taken from foxhunt_core.market.schema.INDEX by name.

#ifndef ENV_BLOCK
#define ENV_BLOCK 128            // threads per block (a multiple of 32); the wrapper launches this many
#endif
#ifndef ENV_UNROLL
#define ENV_UNROLL 8             // observation rows a lane loads before it stores them
#endif
#ifndef ENV_ACTION_T
#define ENV_ACTION_T long long   // dtype of the [n, 4] action array (int64 or int32)
#endif

#define ENV_STREAM_STEP 0u       // Philox stream of env_step draws
#define ENV_STREAM_RESET 1u      // Philox stream of env_reset draws
#define ENV_BAD_ACTION 1         // bit set in `flags` when an action entry is outside 0..2

#include "philox.cuh"

// A double in [0, 1) from two 32-bit words (53 random bits).
__device__ __forceinline__ double env_u01(unsigned int a, unsigned int b) {
    return ((double)(a >> 5) * 67108864.0 + (double)(b >> 6)) * (1.0 / 9007199254740992.0);
}

__device__ __forceinline__ void env_draw(unsigned long long seed, unsigned long long counter,
                                         unsigned int episode, unsigned int stream, double u[2]) {
    unsigned int c[4] = {(unsigned int)counter, (unsigned int)(counter >> 32), episode, stream};
    philox4x32_10(c, (unsigned int)seed, (unsigned int)(seed >> 32));
    u[0] = env_u01(c[0], c[1]);
    u[1] = env_u01(c[2], c[3]);
}

// start_bars: floor(u * num_starts), at most num_starts - 1
__device__ __forceinline__ int env_start_bar(double u, int num_starts) {
    const long long b = (long long)__dmul_rn(u, (double)num_starts);
    return (int)(b < num_starts - 1 ? b : num_starts - 1);
}

__device__ __forceinline__ double env_sign(double x) { return (double)((x > 0.0) - (x < 0.0)); }

// ---------------------------------------------------------------------------- observations
struct EnvObsCols {
    int dim, position, unrealized, holding, working;
};

// The account block of `observe`: position, clipped unrealized PnL, holding time, working order.
__device__ __forceinline__ void env_account(float acc[4], double position, double open_pnl_bps,
                                            int hold, bool order_active, double order_target,
                                            double unrealized_scale, double unrealized_clip,
                                            double holding_norm) {
    const double u = fmin(fmax(open_pnl_bps / unrealized_scale, -unrealized_clip), unrealized_clip);
    acc[0] = (float)position;
    acc[1] = (float)u;
    acc[2] = (float)(log1p((double)hold) / holding_norm);
    acc[3] = (float)(order_active ? order_target - position : 0.0);
}

// Write rows base .. base+rows-1 of `out` ([n, cols.dim]) from the feature rows in `bar` with
// the account values in `acc`; all threads of the block take part. A warp writes whole rows
// (lane = column, coalesced), so each lane knows once whether its column is an account column;
// it loads ENV_UNROLL rows before it stores them, so that many loads are in flight at once.
__device__ void env_write_rows(float* __restrict__ out, const float* __restrict__ features,
                               const int* bar, const float (*acc)[4], int base, int rows,
                               EnvObsCols cols) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int c = lane; c - lane < cols.dim; c += 32) {
        const bool in = c < cols.dim;
        const int slot = c == cols.position ? 0 : c == cols.unrealized ? 1
                       : c == cols.holding ? 2 : c == cols.working ? 3 : -1;
        for (int r0 = warp; r0 < rows; r0 += ENV_UNROLL * warps) {
            float v[ENV_UNROLL];
#pragma unroll
            for (int u = 0; u < ENV_UNROLL; ++u) {
                const int r = r0 + u * warps;
                v[u] = 0.0f;
                if (in && r < rows)
                    v[u] = slot >= 0 ? acc[r][slot] : features[(long long)bar[r] * cols.dim + c];
            }
#pragma unroll
            for (int u = 0; u < ENV_UNROLL; ++u) {
                const int r = r0 + u * warps;
                if (in && r < rows) out[(long long)(base + r) * cols.dim + c] = v[u];
            }
        }
    }
}

// ---------------------------------------------------------------------------- the step
extern "C" __global__ void __launch_bounds__(ENV_BLOCK) env_step(
    // market (split): feature matrix [T, obs_dim] float32 and float64 [T] columns
    const float* __restrict__ features,
    const double* __restrict__ mid, const double* __restrict__ bid, const double* __restrict__ ask,
    const double* __restrict__ half_spread, const double* __restrict__ ret,
    // count_rel and the pressures are already over their causal means (env.py MarketArrays)
    const double* __restrict__ count_rel, const double* __restrict__ buy_pressure,
    const double* __restrict__ sell_pressure,
    double tick,
    // EnvParams and the module constants of env.py
    const double* __restrict__ sizes, const int* __restrict__ urgency,   // [3] each
    double taker, double maker, double lam0, double reward_scale_bps, int episode_len,
    int num_starts, double passive_decay, double pressure_cap, double unrealized_scale,
    double unrealized_clip, double holding_norm,
    int obs_dim, int col_position, int col_unrealized, int col_holding, int col_working,
    // per-episode state, read and written in place
    int* cursor, int* start, int* steps, double* position, double* open_pnl_bps, int* hold,
    bool* order_active, double* order_target, double* order_price, int* order_kind,
    int* order_ttl,
    // inputs
    const ENV_ACTION_T* __restrict__ actions,         // [n, 4]
    const double* __restrict__ uniforms,              // [n, 2] (fill, reset) or null: Philox
    unsigned long long seed, const unsigned long long* __restrict__ counter,
    // outputs
    float* obs, float* prev_obs, float* final_obs,    // [n, obs_dim]; prev_obs may be null
    float* reward, bool* terminated, bool* truncated,
    double* pnl_bps_out, double* cost_bps_out, double* turnover_out, double* position_out,
    int* flags, int n)
{
    __shared__ int bar_prev[ENV_BLOCK], bar_final[ENV_BLOCK], bar_obs[ENV_BLOCK];
    __shared__ float acc_prev[ENV_BLOCK][4], acc_final[ENV_BLOCK][4], acc_obs[ENV_BLOCK][4];
    const int base = blockIdx.x * ENV_BLOCK;
    const int rows = min(ENV_BLOCK, n - base);
    const int r = threadIdx.x;
    const int i = base + r;

    if (r < rows) {
        const int t = cursor[i];
        const int j = t + 1;
        const double p_old = position[i];
        const bool old_active = order_active[i];
        const double old_target = order_target[i];
        bar_prev[r] = t;
        env_account(acc_prev[r], p_old, open_pnl_bps[i], hold[i], old_active, old_target,
                    unrealized_scale, unrealized_clip, holding_norm);

        long long act[4];
        for (int b = 0; b < 4; ++b) {
            act[b] = (long long)actions[(long long)i * 4 + b];
            if (act[b] < 0 || act[b] > 2) {
                atomicOr(flags, ENV_BAD_ACTION);
                act[b] = act[b] < 0 ? 0 : 2;  // keep memory safe; env.check() reports it
            }
        }
        double u_fill, u_reset;
        if (uniforms != nullptr) {
            u_fill = uniforms[2LL * i];
            u_reset = uniforms[2LL * i + 1];
        } else {
            double u[2];
            env_draw(seed, counter[0], (unsigned int)i, ENV_STREAM_STEP, u);
            u_fill = u[0];
            u_reset = u[1];
        }

        const double target = __dmul_rn((double)(act[0] - 1), sizes[act[1]]);
        const double delta = target - p_old;
        const bool moving = fabs(delta) > 1e-12;
        const bool market_order = act[2] == 0;

        // market orders: fill now at the touch, cancel any working order
        const bool mkt = market_order && moving;
        const double mkt_cost = mkt ? __dmul_rn(fabs(delta), half_spread[t] + taker) : 0.0;
        double turnover = mkt ? fabs(delta) : 0.0;
        double pos = mkt ? target : p_old;
        // limit orders: a new one replaces the working order; the same one keeps its place
        const int kind = (int)act[2];
        const bool lim = !market_order && moving;
        const bool keep = lim && old_active && old_target == target && order_kind[i] == kind;
        const bool is_new = lim && !keep;
        const bool buy = delta > 0.0;
        const double touch = buy ? bid[t] : ask[t];
        const double behind = kind == 2 ? (buy ? -tick : tick) : 0.0;
        const double o_target = lim ? target : 0.0;
        const int o_kind = lim ? kind : 0;
        const double o_price = is_new ? touch + behind : (keep ? order_price[i] : 0.0);
        const int o_ttl = is_new ? urgency[act[3]] : (keep ? order_ttl[i] : 0);

        // mark to market over bar t -> t+1 with the position held after the market fill
        const double mtm = __dmul_rn(pos, ret[t]);

        // working orders at the close of bar j
        const double o_delta = o_target - pos;
        const bool o_buy = o_delta > 0.0;
        const double bid_j = bid[j], ask_j = ask[j];
        const double half_tick = __dmul_rn(0.5, tick);
        const bool through = o_buy ? bid_j < o_price - half_tick : ask_j > o_price + half_tick;
        const double k = fmax(rint((o_buy ? bid_j - o_price : o_price - ask_j) / tick), 0.0);
        const double press = o_buy ? sell_pressure[j] : buy_pressure[j];
        const double rate = __dmul_rn(sqrt(count_rel[j]), sqrt(fmin(press, pressure_cap)));
        const double lam = __dmul_rn(__dmul_rn(lam0, rate), pow(passive_decay, k));
        const double prob = isnan(lam) ? 0.0 : -expm1(-lam);  // inf * 0 when the rate is 1 and no trades
        const bool filled = lim && (through || u_fill < prob);
        const double mid_j = mid[j];
        const double fill_fee = filled ? __dmul_rn(fabs(o_delta), maker) : 0.0;
        const double fill_edge = filled ? __dmul_rn(o_delta, mid_j - o_price) / mid_j : 0.0;
        turnover = turnover + (filled ? fabs(o_delta) : 0.0);
        pos = filled ? o_target : pos;
        const int ttl = (lim && !filled) ? o_ttl - 1 : 0;
        const bool still = lim && !filled && ttl > 0;

        const double cost = mkt_cost + fill_fee;
        const double pnl_bps = __dmul_rn(1e4, mtm - cost + fill_edge);
        // account bookkeeping
        const bool same = env_sign(pos) == env_sign(p_old) && pos != 0.0;
        const double new_open = pos == 0.0 ? 0.0 : (same ? open_pnl_bps[i] + pnl_bps : pnl_bps);
        const int new_hold = pos == 0.0 ? 0 : (same ? hold[i] + 1 : 1);
        const double new_target = still ? o_target : 0.0;
        const int new_steps = steps[i] + 1;
        const bool trunc = new_steps >= episode_len;

        bar_final[r] = j;
        env_account(acc_final[r], pos, new_open, new_hold, still, new_target,
                    unrealized_scale, unrealized_clip, holding_norm);
        reward[i] = (float)(pnl_bps / reward_scale_bps);
        terminated[i] = false;
        truncated[i] = trunc;
        pnl_bps_out[i] = pnl_bps;
        cost_bps_out[i] = __dmul_rn(1e4, cost);
        turnover_out[i] = turnover;
        position_out[i] = pos;

        if (trunc) {  // auto-reset: flat, no order, a fresh start bar
            const int s = env_start_bar(u_reset, num_starts);
            start[i] = s;
            cursor[i] = s;
            steps[i] = 0;
            position[i] = 0.0;
            open_pnl_bps[i] = 0.0;
            hold[i] = 0;
            order_active[i] = false;
            order_target[i] = 0.0;
            order_price[i] = 0.0;
            order_kind[i] = 0;
            order_ttl[i] = 0;
            bar_obs[r] = s;
            for (int c = 0; c < 4; ++c) acc_obs[r][c] = 0.0f;
        } else {
            cursor[i] = j;
            steps[i] = new_steps;
            position[i] = pos;
            open_pnl_bps[i] = new_open;
            hold[i] = new_hold;
            order_active[i] = still;
            order_target[i] = new_target;
            order_price[i] = still ? o_price : 0.0;
            order_kind[i] = still ? o_kind : 0;
            order_ttl[i] = still ? ttl : 0;
            bar_obs[r] = j;
            for (int c = 0; c < 4; ++c) acc_obs[r][c] = acc_final[r][c];
        }
    }
    __syncthreads();
    if (rows <= 0) return;
    const EnvObsCols cols = {obs_dim, col_position, col_unrealized, col_holding, col_working};
    if (prev_obs != nullptr) env_write_rows(prev_obs, features, bar_prev, acc_prev, base, rows, cols);
    env_write_rows(final_obs, features, bar_final, acc_final, base, rows, cols);
    env_write_rows(obs, features, bar_obs, acc_obs, base, rows, cols);
}

// ---------------------------------------------------------------------------- resets
// Every episode starts afresh (flat, no order) at start_bars(u): `reset_episodes` on all.
extern "C" __global__ void __launch_bounds__(ENV_BLOCK) env_reset(
    const float* __restrict__ features, int num_starts,
    int obs_dim, int col_position, int col_unrealized, int col_holding, int col_working,
    int* cursor, int* start, int* steps, double* position, double* open_pnl_bps, int* hold,
    bool* order_active, double* order_target, double* order_price, int* order_kind,
    int* order_ttl,
    const double* __restrict__ uniforms,              // [n] or null: Philox
    unsigned long long seed, const unsigned long long* __restrict__ counter,
    float* obs, int n)
{
    __shared__ int bar[ENV_BLOCK];
    __shared__ float acc[ENV_BLOCK][4];
    const int base = blockIdx.x * ENV_BLOCK;
    const int rows = min(ENV_BLOCK, n - base);
    const int r = threadIdx.x;
    const int i = base + r;
    if (r < rows) {
        double u;
        if (uniforms != nullptr) {
            u = uniforms[i];
        } else {
            double d[2];
            env_draw(seed, counter[0], (unsigned int)i, ENV_STREAM_RESET, d);
            u = d[0];
        }
        const int s = env_start_bar(u, num_starts);
        start[i] = s;
        cursor[i] = s;
        steps[i] = 0;
        position[i] = 0.0;
        open_pnl_bps[i] = 0.0;
        hold[i] = 0;
        order_active[i] = false;
        order_target[i] = 0.0;
        order_price[i] = 0.0;
        order_kind[i] = 0;
        order_ttl[i] = 0;
        bar[r] = s;
        for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
    }
    __syncthreads();
    if (rows <= 0) return;
    const EnvObsCols cols = {obs_dim, col_position, col_unrealized, col_holding, col_working};
    env_write_rows(obs, features, bar, acc, base, rows, cols);
}

// The step counter advances after each env_step / env_reset (a separate launch, so that no
// thread of the step can read a counter another thread already advanced).
extern "C" __global__ void env_advance_counter(unsigned long long* counter) {
    if (blockIdx.x == 0 && threadIdx.x == 0) counter[0] += 1ULL;
}

// Philox4x32-10 on explicit counters and keys, for the known-answer test.
extern "C" __global__ void env_philox_kat(const unsigned int* ctr, const unsigned int* key,
                                          unsigned int* out, int m) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m) return;
    unsigned int c[4] = {ctr[4 * i], ctr[4 * i + 1], ctr[4 * i + 2], ctr[4 * i + 3]};
    philox4x32_10(c, key[2 * i], key[2 * i + 1]);
    for (int w = 0; w < 4; ++w) out[4 * i + w] = c[w];
}

// obs = observe(state): the observation of each episode's current bar and account (after a
// state is loaded from a checkpoint).
extern "C" __global__ void __launch_bounds__(ENV_BLOCK) env_observe(
    const float* __restrict__ features,
    int obs_dim, int col_position, int col_unrealized, int col_holding, int col_working,
    const int* cursor, const int* start, const int* steps, const double* position,
    const double* open_pnl_bps, const int* hold, const bool* order_active,
    const double* order_target, const double* order_price, const int* order_kind,
    const int* order_ttl,
    double unrealized_scale, double unrealized_clip, double holding_norm, float* obs, int n)
{
    __shared__ int bar[ENV_BLOCK];
    __shared__ float acc[ENV_BLOCK][4];
    const int base = blockIdx.x * ENV_BLOCK;
    const int rows = min(ENV_BLOCK, n - base);
    const int r = threadIdx.x;
    const int i = base + r;
    if (r < rows) {
        bar[r] = cursor[i];
        env_account(acc[r], position[i], open_pnl_bps[i], hold[i], order_active[i],
                    order_target[i], unrealized_scale, unrealized_clip, holding_norm);
    }
    __syncthreads();
    if (rows <= 0) return;
    const EnvObsCols cols = {obs_dim, col_position, col_unrealized, col_holding, col_working};
    env_write_rows(obs, features, bar, acc, base, rows, cols);
}
