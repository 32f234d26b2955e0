// A small CUDA emulation for the host C++ compiler (C++20), in the spirit of nvcc's old
// device-emulation mode. Atomics go through std::atomic_ref, blockIdx/threadIdx/blockDim/
// gridDim are thread-locals, __shared__ is a function-static (blocks of one launch run one
// after another, so one block owns it at a time; a kernel whose correctness depended on
// blocks running concurrently would not be caught here). The threads of a block are, with
// GK_EMU_THREADS, OS threads with a std::barrier for __syncthreads() (real concurrency
// between barriers, but about 1 ms per barrier on a busy 2-core machine), and otherwise
// fibers (ucontext) on the launching thread, switched round-robin at each __syncthreads():
// the same barrier semantics, deterministic, about 20 times cheaper. The tests run the
// whole matrix on fibers and a part of it on OS threads.
#pragma once
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <math.h>
#include <cstdint>
#include <cstring>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <ucontext.h>
#include <utility>
#include <vector>

#define GK_EMU 1
#define GK_KERNEL static
#define GK_DEVICE static inline
#define __shared__ static
#define __device__
#define __global__
#define __forceinline__ inline

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

struct gk_dim3 {
  u32 x = 0, y = 0, z = 0;
};

namespace gk_emu {
inline thread_local gk_dim3 tl_block_idx, tl_thread_idx, tl_block_dim, tl_grid_dim;
inline thread_local std::barrier<>* tl_barrier = nullptr;
// The lanes of the calling thread's warp vote through this block-wide board.
struct Board {
  std::vector<u32> votes;
  std::vector<u32> vals;
};
inline thread_local Board* tl_board = nullptr;
}  // namespace gk_emu

#define blockIdx (gk_emu::tl_block_idx)
#define threadIdx (gk_emu::tl_thread_idx)
#define blockDim (gk_emu::tl_block_dim)
#define gridDim (gk_emu::tl_grid_dim)

namespace gk_emu {
inline thread_local ucontext_t* tl_sched = nullptr;  // fibers: the scheduler's context
inline thread_local ucontext_t* tl_self = nullptr;   // fibers: the running fiber's
}  // namespace gk_emu

static inline void __syncthreads() {
#ifdef GK_EMU_THREADS
  gk_emu::tl_barrier->arrive_and_wait();
#else
  swapcontext(gk_emu::tl_self, gk_emu::tl_sched);
#endif
}

// Warp votes and shuffles, made block-wide collective over the same barrier (every thread
// of the block must call them together, as __syncthreads).
static inline u32 __ballot_sync(u32, int pred) {
  auto& b = *gk_emu::tl_board;
  u32 t = threadIdx.x;
  b.votes[t] = pred ? 1u : 0u;
  __syncthreads();
  u32 w0 = t & ~31u, m = 0;
  for (u32 l = 0; l < 32 && w0 + l < b.votes.size(); l++) m |= b.votes[w0 + l] << l;
  __syncthreads();
  return m;
}
static inline u32 __shfl_sync(u32, u32 v, int src) {
  auto& b = *gk_emu::tl_board;
  u32 t = threadIdx.x;
  b.vals[t] = v;
  __syncthreads();
  u32 r = b.vals[(t & ~31u) + ((u32)src & 31u)];
  __syncthreads();
  return r;
}

static inline u32 atomicAdd(u32* p, u32 v) { return std::atomic_ref<u32>(*p).fetch_add(v); }
static inline float atomicAdd(float* p, float v) {
  return std::atomic_ref<float>(*p).fetch_add(v);
}
static inline u32 __float_as_uint(float v) { return std::bit_cast<u32>(v); }
static inline float __uint_as_float(u32 v) { return std::bit_cast<float>(v); }
using ::fabsf;
using ::sqrt;

namespace gk_emu {
// Calls a kernel with its parameters given as cuLaunchKernel takes them: an array of
// pointers to each argument's value.
template <class... A, std::size_t... I>
static void call_impl(void (*f)(A...), void** p, std::index_sequence<I...>) {
  f(*static_cast<std::remove_reference_t<A>*>(p[I])...);
}
template <class... A>
static void call(void (*f)(A...), void** p) {
  call_impl(f, p, std::index_sequence_for<A...>{});
}

inline std::mutex launch_lock;

#ifdef GK_EMU_THREADS
// The block's threads: created once and kept (never destroyed, so no thread outlives a
// destructor at exit). A launch is two barrier phases of the pool's threads and the
// launching thread: "go" (the job is set) and "done".
struct Pool {
  u32 n;
  std::barrier<> gate;
  std::function<void(u32)> job;
  explicit Pool(u32 threads) : n(threads), gate(threads + 1) {
    for (u32 t = 0; t < n; t++) {
      std::thread([this, t] {
        for (;;) {
          gate.arrive_and_wait();
          job(t);
          gate.arrive_and_wait();
        }
      }).detach();
    }
  }
  void run(std::function<void(u32)> j) {
    job = std::move(j);
    gate.arrive_and_wait();
    gate.arrive_and_wait();
  }
};

inline Pool& pool(u32 block) {
  static Pool* p = new Pool(block);
  if (p->n != block) std::abort();
  return *p;
}

// Runs `grid` blocks of `block` threads: one pool thread per thread of a block, the blocks
// in turn (a barrier between blocks).
template <class F>
static void launch(F f, u32 grid, u32 block, void** params) {
  std::lock_guard<std::mutex> g(launch_lock);
  std::barrier<> bar(block);
  Board board{std::vector<u32>(block), std::vector<u32>(block)};
  pool(block).run([&](u32 t) {
    tl_barrier = &bar;
    tl_board = &board;
    tl_thread_idx = {t, 0, 0};
    tl_block_dim = {block, 1, 1};
    tl_grid_dim = {grid, 1, 1};
    for (u32 b = 0; b < grid; b++) {
      tl_block_idx = {b, 0, 0};
      call(f, params);
      bar.arrive_and_wait();
    }
  });
}
#else
// Fibers: each thread of a block a ucontext with its own stack; the scheduler resumes them
// in thread order, each running to its next __syncthreads() (or its end), until all end.
inline constexpr std::size_t kStack = 64 * 1024;
inline thread_local std::function<void()>* tl_job = nullptr;
inline thread_local u32 tl_left = 0;

inline void fiber_main() {
  (*tl_job)();
  tl_left--;
  // Returning resumes uc_link, the scheduler.
}

template <class F>
static void launch(F f, u32 grid, u32 block, void** params) {
  std::lock_guard<std::mutex> g(launch_lock);
  static thread_local std::vector<char> stacks;
  stacks.resize(block * kStack);
  std::vector<ucontext_t> fib(block);
  std::vector<char> ended(block);
  ucontext_t sched;
  Board board{std::vector<u32>(block), std::vector<u32>(block)};
  std::function<void()> job = [&] { call(f, params); };
  tl_job = &job;
  tl_board = &board;
  tl_sched = &sched;
  tl_block_dim = {block, 1, 1};
  tl_grid_dim = {grid, 1, 1};
  for (u32 b = 0; b < grid; b++) {
    tl_block_idx = {b, 0, 0};
    for (u32 t = 0; t < block; t++) {
      getcontext(&fib[t]);
      fib[t].uc_stack.ss_sp = stacks.data() + t * kStack;
      fib[t].uc_stack.ss_size = kStack;
      fib[t].uc_link = &sched;
      makecontext(&fib[t], fiber_main, 0);
      ended[t] = 0;
    }
    tl_left = block;
    while (tl_left > 0) {
      for (u32 t = 0; t < block; t++) {
        if (ended[t]) continue;
        u32 before = tl_left;
        tl_thread_idx = {t, 0, 0};
        tl_self = &fib[t];
        swapcontext(&sched, &fib[t]);
        if (tl_left != before) ended[t] = 1;
      }
    }
  }
}
#endif
}  // namespace gk_emu
