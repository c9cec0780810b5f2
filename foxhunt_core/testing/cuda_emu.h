// A host emulation of the CUDA execution model, enough to run a plain kernel's source on the CPU
// (foxhunt_core/testing/cuda_emu.py compiles a kernel file with this header force-included).
//
// What it models: a grid of blocks run one after another; the threads of a block as host
// threads, so __syncthreads is a real barrier over them (a thread that returns drops out of it,
// as on the device); warps of 32 consecutive threads with __syncwarp and the __shfl_*_sync
// exchanges (every lane of the warp must take part, as with a full mask); __shared__ variables
// as function statics, one copy that the block's threads share (blocks never run at once).
// What it does not: timing, memory ordering beyond the barriers, atomics, dynamic shared memory,
// inline PTX, textures. It is a check of a kernel's indexing and arithmetic, not of its speed.
#pragma once

#include <math.h>

#include <barrier>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {

struct Warp {
    explicit Warp(int n) : bar(n), slot(32) {}
    std::barrier<> bar;
    std::vector<uint64_t> slot;
};

struct Block {
    explicit Block(int n) : bar(n) {}
    std::barrier<> bar;
    std::vector<std::unique_ptr<Warp>> warps;
};

inline thread_local dim3 thread_idx;
inline thread_local dim3 block_idx;
inline thread_local Block* block = nullptr;
inline dim3 block_dim;
inline dim3 grid_dim;

inline int linear_thread() { return (int)(thread_idx.x + block_dim.x * (thread_idx.y + block_dim.y * thread_idx.z)); }
inline Warp& warp() { return *block->warps[linear_thread() / 32]; }
inline int lane() { return linear_thread() % 32; }

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

// Every lane publishes v, then reads the lane ``src`` (its own where src is out of range).
template <class T>
inline T exchange(T v, int src) {
    Warp& w = warp();
    const int me = lane();
    w.slot[me] = to_bits(v);
    w.bar.arrive_and_wait();
    const uint64_t got = (src >= 0 && src < 32) ? w.slot[src] : w.slot[me];
    w.bar.arrive_and_wait();
    return from_bits<T>(got);
}

// Runs ``body`` (the kernel call) for every thread of every block of ``grid``.
inline void launch(dim3 grid, dim3 blk, const std::function<void()>& body) {
    const int n = (int)(blk.x * blk.y * blk.z);
    block_dim = blk;
    grid_dim = grid;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                Block b(n);
                for (int w = 0; w < (n + 31) / 32; ++w) b.warps.emplace_back(new Warp(n - 32 * w < 32 ? n - 32 * w : 32));
                std::vector<std::thread> threads;
                threads.reserve(n);
                for (int t = 0; t < n; ++t) {
                    threads.emplace_back([&, t, bx, by, bz] {
                        thread_idx = dim3(t % blk.x, t / blk.x % blk.y, t / (blk.x * blk.y));
                        block_idx = dim3(bx, by, bz);
                        block = &b;
                        body();
                        b.warps[t / 32]->bar.arrive_and_drop();
                        b.bar.arrive_and_drop();
                    });
                }
                for (auto& th : threads) th.join();
            }
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

inline void __syncthreads() { emu::block->bar.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp().bar.arrive_and_wait(); }

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

template <class T>
inline T __ldg(const T* p) { return *p; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __int_as_float(int i) { return emu::from_bits<float>((uint32_t)i); }
inline int __float_as_int(float f) { return (int)(uint32_t)emu::to_bits(f); }
