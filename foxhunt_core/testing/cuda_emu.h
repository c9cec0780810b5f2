// A host emulation of the CUDA execution model, enough to run a plain kernel's source on the CPU
// (foxhunt_core/testing/cuda_emu.py compiles a kernel file with this header force-included).
//
// What it models: a grid of blocks run one after another; the threads of a block as cooperative
// fibers (ucontext) on one host thread, switched only at barriers, so __syncthreads is a real
// barrier over the block (a thread that returns drops out of it, as on the device); warps of 32
// consecutive threads with __syncwarp and the __shfl_*_sync exchanges (every lane of the warp must
// take part, as with a full mask); __shared__ variables as function statics, one copy that the
// block's threads share (blocks never run at once). A barrier no thread can pass (a divergent
// __syncthreads) stops the program with a message. What it does not model: timing, memory ordering
// beyond the barriers, atomics, dynamic shared memory, inline PTX, textures. It is a check of a
// kernel's indexing, barriers and arithmetic, not of its speed.
#pragma once

#include <math.h>
#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {

enum State { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };

struct Fiber {
    ucontext_t ctx;
    State state = RUNNABLE;
    int tid = 0;
};

inline dim3 thread_idx, block_idx, block_dim, grid_dim;
inline std::vector<Fiber> fibers;
inline std::vector<uint64_t> slots;   // one shuffle slot per thread of the block
inline ucontext_t scheduler;
inline Fiber* cur = nullptr;
inline const std::function<void()>* body = nullptr;
constexpr size_t kStack = 256 * 1024;

inline int lane() { return cur->tid % 32; }

inline void wait(State s) {
    cur->state = s;
    swapcontext(&cur->ctx, &scheduler);
}

inline void entry() {
    (*body)();
    cur->state = DONE;   // returns to the scheduler through uc_link
}

inline void run_block(int n) {
    for (;;) {
        bool ran = false;
        for (int t = 0; t < n; ++t) {
            Fiber& f = fibers[t];
            if (f.state != RUNNABLE) continue;
            cur = &f;
            thread_idx = dim3(t % block_dim.x, t / block_dim.x % block_dim.y, t / (block_dim.x * block_dim.y));
            swapcontext(&scheduler, &f.ctx);
            ran = true;
        }
        if (ran) continue;
        bool live = false, all_block = true, released = false;
        for (int t = 0; t < n; ++t) {
            if (fibers[t].state == DONE) continue;
            live = true;
            all_block = all_block && fibers[t].state == AT_BLOCK_BARRIER;
        }
        if (!live) return;
        if (all_block) {
            for (int t = 0; t < n; ++t)
                if (fibers[t].state == AT_BLOCK_BARRIER) fibers[t].state = RUNNABLE;
            continue;
        }
        for (int w = 0; w < (n + 31) / 32; ++w) {
            bool any = false, all = true;
            for (int t = 32 * w; t < n && t < 32 * w + 32; ++t) {
                if (fibers[t].state == DONE) continue;
                any = true;
                all = all && fibers[t].state == AT_WARP_BARRIER;
            }
            if (any && all) {
                for (int t = 32 * w; t < n && t < 32 * w + 32; ++t)
                    if (fibers[t].state == AT_WARP_BARRIER) fibers[t].state = RUNNABLE;
                released = true;
            }
        }
        if (!released) {
            std::fprintf(stderr, "cuda_emu: block (%u, %u, %u) deadlocks: some threads wait at __syncthreads, "
                                 "others at a warp barrier\n", block_idx.x, block_idx.y, block_idx.z);
            std::exit(4);
        }
    }
}

template <class T>
inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}

template <class T>
inline T from_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}

// Every lane publishes v, then reads the lane ``src`` of its warp (its own where out of range).
template <class T>
inline T exchange(T v, int src) {
    const int me = cur->tid, base = me / 32 * 32;
    slots[me] = to_bits(v);
    wait(AT_WARP_BARRIER);
    const uint64_t got = (src >= 0 && src < 32 && base + src < (int)fibers.size()) ? slots[base + src] : slots[me];
    wait(AT_WARP_BARRIER);
    return from_bits<T>(got);
}

// Runs ``fn`` (the kernel call) for every thread of every block of ``grid``.
inline void launch(dim3 grid, dim3 blk, const std::function<void()>& fn) {
    const int n = (int)(blk.x * blk.y * blk.z);
    block_dim = blk;
    grid_dim = grid;
    body = &fn;
    std::vector<char*> stacks(n);
    for (auto& st : stacks) st = static_cast<char*>(std::malloc(kStack));
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                block_idx = dim3(bx, by, bz);
                fibers.assign(n, Fiber());
                slots.assign(n, 0);
                for (int t = 0; t < n; ++t) {
                    Fiber& f = fibers[t];
                    f.tid = t;
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = stacks[t];
                    f.ctx.uc_stack.ss_size = kStack;
                    f.ctx.uc_link = &scheduler;
                    makecontext(&f.ctx, entry, 0);
                }
                run_block(n);
            }
    for (auto* st : stacks) std::free(st);
}

}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

inline void __syncthreads() { emu::wait(emu::AT_BLOCK_BARRIER); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::wait(emu::AT_WARP_BARRIER); }

template <class T>
inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    const int base = emu::lane() / width * width;
    return emu::exchange(v, base + ((src % width) + width) % width);
}
template <class T>
inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    const int me = emu::lane(), seg = me % width;
    return emu::exchange(v, seg + (int)delta < width ? me + (int)delta : me);
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
    const int me = emu::lane(), seg = me % width;
    return emu::exchange(v, seg - (int)delta >= 0 ? me - (int)delta : me);
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    const int me = emu::lane(), other = me ^ mask;
    return emu::exchange(v, other / width == me / width ? other : me);
}

// CUDA's float4 (aligned as on the device, where a float4 load is one 16-byte access)
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

template <class T>
inline T __ldg(const T* p) { return *p; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x > 0.0f ? (x > 1.0f ? 1.0f : x) : 0.0f; }  // (NaN: 0, as CUDA's)
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __int_as_float(int i) { return emu::from_bits<float>((uint32_t)i); }
inline int __float_as_int(float f) { return (int)(uint32_t)emu::to_bits(f); }
