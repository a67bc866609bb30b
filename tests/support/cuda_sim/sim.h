#pragma once

// cuda_sim: runs Triad's CUDA kernels on the CPU, so the kernels and the
// CUDA backend are tested on machines without a GPU (see README.md here).
//
// This header is the simulator's control surface and the launch machinery
// the rewritten `kernel<<<grid, block, smem, stream>>>(args)` expressions
// call. Each CUDA thread of a block is a fiber with its own stack; blocks
// run one after another. __syncthreads, __syncwarp, the warp shuffles and
// the WMMA collectives are barriers the scheduler enforces exactly (a
// barrier some threads never reach is reported, not hung on), so code that
// is only correct by lock-step luck fails here too.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace triad_sim {

// Order in which the scheduler runs the blocks of a grid and resumes the
// threads of a block between barriers. A kernel whose result depends on it
// has a race.
enum class Order { Forward, Reverse };
void set_order(Order order);
Order order();

// The runtime as it is while a process exits, after the CUDA runtime has
// begun to unload (static objects destroyed after it): cudaGetDevice,
// cudaSetDevice, cudaFree, cudaFreeHost, cudaStreamDestroy and
// cudaEventDestroy answer cudaErrorCudartUnloading and do nothing, as the
// real runtime's do then. Code run from destructors must not throw on it.
void set_runtime_unloading(bool unloading);
bool runtime_unloading();

// The shared memory a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin,
// and the most cudaFuncSetAttribute takes): an H100's or H200's 227 KiB
// unless a test plays another GPU's (sm_86's and sm_89's 99 KiB).
void set_shared_per_block(size_t bytes);
size_t shared_per_block();

// The most blocks a grid's y and z take (65535 on every GPU); a test plays a
// smaller one to show a kernel's grid keeps its large counts along x.
void set_grid_yz_limit(unsigned blocks);
unsigned grid_yz_limit();

struct Counters {
  int64_t launches = 0;
  int64_t blocks = 0;
  int64_t threads = 0;
  int64_t barriers = 0;  // block and warp barriers completed
  // Times the host blocked on queued work (a stream, event or device
  // synchronisation, or a copy to pageable memory, that found work still
  // queued; event queries do not block): on a GPU, each one drains the
  // queue of launches the GPU would otherwise run ahead on.
  int64_t host_waits = 0;
  // Event queries that found the event's work not yet run: a host that
  // polls a query until it succeeds waits for the GPU as surely as one that
  // synchronises (each such loop counts once).
  int64_t not_ready_queries = 0;
  // cudaEventCreate calls: on a GPU each is a driver call the host waits
  // for, so code issuing work in a loop should reuse its events.
  int64_t events_created = 0;
  // cudaProfilerStart / cudaProfilerStop calls, and the launches issued
  // between a start and the stop after it (what a profiler capturing
  // that range would record).
  int64_t profiler_starts = 0;
  int64_t profiler_stops = 0;
  int64_t profiled_launches = 0;
};
Counters counters();
void note_host_wait();
void note_not_ready_query();
void note_event_created();
void note_profiler(bool started);

// Where a launch was written, for error messages.
struct Site {
  const char* file;
  int line;
};

struct LaunchConfig {
  dim3 grid, block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
  Site site{};
};

// Validates a launch as a GPU does when it is issued (throwing
// std::runtime_error naming the launch site when the configuration is
// invalid) and queues it on its stream; when the stream runs it, `body`
// runs once per thread of every block, and a thread that throws or threads
// that deadlock on a barrier are reported (std::runtime_error naming the
// launch site, block and thread) by the call that ran the queue. `kernel`
// identifies the function (for cudaFuncSetAttribute).
void launch_grid(const LaunchConfig& config, const void* kernel, std::function<void()> body);

// ---- streams ------------------------------------------------------------------
// Each stream is a queue. By default (TRIAD_SIM_STREAMS=deferred) queued
// work runs only when the host needs it: a stream, event or device
// synchronisation, an event query, a copy to pageable host memory, a free,
// or a stream waiting on an event whose stream must run first. So work on
// one stream that reads another stream's results without an event wait
// between them reads stale memory, as it may on a GPU. The legacy default
// stream (0) is ordered against blocking streams as CUDA orders it.
// TRIAD_SIM_STREAMS=eager runs all work when it is issued.
enum class Streams { Deferred, Eager };
void set_streams(Streams mode);
Streams streams();
// Queues `work` on `stream` (0: the current device's legacy stream).
void enqueue(cudaStream_t stream, std::function<void()> work);
// On a stream in capture: queues `work` into the capture, as enqueue, and
// marks the graph so that each launch of it runs the launching stream's
// queue at once (the host runs the graph as it launches it), and returns
// true; on a stream not in capture, does nothing and returns false. For a
// stand-in whose uncaptured call does its work as it is issued (mock NCCL's
// exchanges between ranks): captured, that work runs at each launch, where
// the uncaptured call would have run.
bool enqueue_at_launch(cudaStream_t stream, std::function<void()> work);
// Runs what is queued on `stream` so far (and what it waits for) without
// counting a host wait: for a stand-in whose library call reads its inputs
// when issued, where the real library's kernels would run in stream order.
void run_stream(cudaStream_t stream);
// Work queued but not yet run, over every stream.
int64_t pending_work();

// ---- the state device code reads ------------------------------------------
// The built-in index variables of the thread the scheduler is running.
struct Builtins {
  uint3 threadIdx{}, blockIdx{};
  dim3 blockDim, gridDim;
};
// constinit: device code reads these directly, without the call a
// thread_local with dynamic initialisation costs at every access.
extern constinit thread_local Builtins builtins;

struct ThreadState;
ThreadState* current();
// The block's dynamic shared memory at an address aligned to `align` (a
// power of two up to 512) but not to twice that.
unsigned char* dynamic_shared_base(size_t align);

// A kernel declared __launch_bounds__(max_threads, ...) launched with a
// larger block: an error, as the launch is on a GPU.
void check_launch_bounds(unsigned max_threads, unsigned min_blocks = 0, unsigned max_cluster = 0);

// Fills a static __shared__ array with NaN bytes the first time the running
// block reaches its declaration (later threads of the block see what was
// written since).
void fresh_shared(void* array, size_t bytes);
// The running thread's lane in its warp.
int lane_id();

// Warp collectives: the calling thread waits until every lane in `mask`
// has arrived; a lane that exited or waits elsewhere is an error.
void warp_barrier(unsigned mask, const char* what);
void block_barrier();
// Shuffle exchange: deposits `bytes` of the caller's value, meets the
// lanes of `mask`, and copies lane `src`'s value into `out`.
void warp_exchange(unsigned mask, const void* value, void* out, size_t bytes, int src_lane,
                   const char* what);
// Vote: deposits the caller's predicate, meets the lanes of `mask`, and
// returns the bits of the lanes of `mask` whose predicate is true.
unsigned warp_ballot(unsigned mask, bool predicate, const char* what);
[[noreturn]] void fail(const std::string& what);

// ---- the launch expression --------------------------------------------------
// `k<<<g, b, s, st>>>(a...)` is rewritten to
// `k | ::triad_sim::Config(Site, g, b, s, st)(a...)`.
template <class... A>
struct Pending {
  LaunchConfig config;
  std::tuple<std::decay_t<A>...> args;
};

struct Config {
  LaunchConfig config;
  Config(Site site, dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = nullptr)
      : config{grid, block, smem, stream, site} {}
  template <class... A>
  Pending<A...> operator()(A&&... args) const {
    return Pending<A...>{config, std::tuple<std::decay_t<A>...>(std::forward<A>(args)...)};
  }
};

template <class... P, class... A>
void operator|(void (*kernel)(P...), Pending<A...>&& pending) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong argument count");
  // Kernel parameters are converted once, as the launch does, and every
  // thread receives its own copy.
  auto params = std::make_shared<std::tuple<std::decay_t<P>...>>(
      std::apply([](auto&&... a) { return std::tuple<std::decay_t<P>...>(a...); }, pending.args));
  launch_grid(pending.config, reinterpret_cast<const void*>(kernel), [kernel, params] {
    std::tuple<std::decay_t<P>...> mine = *params;
    std::apply(kernel, mine);
  });
}

}  // namespace triad_sim
