// cuda_sim's CUDA runtime API: the calls Triad makes, on host memory. One
// simulated device (sm_90, H200-like limits). Device allocations end at a
// guard page, so reading or writing past the end of one faults at once.
// Streams are queues of work that runs when the host needs it (sim.h);
// events mark a point in a stream's queue and take the host time when the
// queue runs past them. A stream in capture (cudaStreamBeginCapture) keeps
// what is issued to it as a graph instead; a graph's launch queues its
// work again. Another stream joins a capture by waiting on an event
// recorded in it (a fork) and must be waited on again before the capture
// ends (a join): the graph holds every joined stream's work in the order
// it was issued, an order every dependency between them allows.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sim.h"

namespace triad_sim {
void set_max_dynamic_shared(const void* kernel, size_t bytes);
}

namespace triad_sim {
namespace {
// A stream capture: the work issued to the stream since it began, and
// whether a call not allowed during it has spoilt it.
struct Queue;
struct Capture {
  std::vector<std::function<void()>> ops;
  std::thread::id thread;  // the thread that began it
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  bool invalidated = false;
  bool ended = false;
  // Whether it holds work that runs as the graph is launched
  // (enqueue_at_launch): each launch then runs the launching stream's queue.
  bool runs_at_launch = false;
  Queue* origin = nullptr;  // the stream that began it
  // The streams that joined it (a wait on an event it recorded): the work
  // each has captured, and how much of that a wait on one of its events
  // recorded in the capture has covered since (-1: none yet).
  struct Joined {
    int64_t pushed = 0, waited = -1;
  };
  std::map<const Queue*, Joined> joined;
};
// The calling thread's capture interaction mode
// (cudaThreadExchangeStreamCaptureMode): relaxed lets a thread with a
// capture open make the calls a capture would otherwise refuse.
thread_local cudaStreamCaptureMode g_thread_capture_mode = cudaStreamCaptureModeGlobal;
// One stream's queue: `done` of the `issued` items have run (items are
// numbered from 1 in issue order); `ops` holds the rest.
struct Queue {
  std::deque<std::function<void()>> ops;
  uint64_t issued = 0, done = 0;
  int device = 0;
  bool legacy = false;               // the device's legacy default stream
  bool blocking = false;             // created without cudaStreamNonBlocking
  std::shared_ptr<Capture> capture;  // while the stream is in capture
};
// When an event's point in its queue has run: the host time then.
struct Mark {
  std::chrono::steady_clock::time_point at{};
};
}  // namespace
}  // namespace triad_sim

struct CUstream_st {
  std::shared_ptr<triad_sim::Queue> queue;
};
struct CUgraph_st {
  std::vector<std::function<void()>> ops;
  bool runs_at_launch = false;  // (Capture::runs_at_launch)
};
struct CUgraphExec_st {
  std::shared_ptr<const std::vector<std::function<void()>>> ops;
  bool runs_at_launch = false;
};
struct CUevent_st {
  std::shared_ptr<triad_sim::Queue> queue;  // null until recorded
  uint64_t seq = 0;                         // its point in the queue
  std::shared_ptr<triad_sim::Mark> mark;
  unsigned flags = 0;
  std::thread::id recorder;  // the host thread that recorded it
  // Last recorded in a capture: that capture, the stream, and the work the
  // stream had captured by then (queue is null).
  std::shared_ptr<triad_sim::Capture> capture;
  const triad_sim::Queue* captured_on = nullptr;
  int64_t captured_upto = 0;
};

namespace {

// TRIAD_SIM_DEVICES=n shows n devices (default 1), e.g. one per rank of an
// mpirun on one machine; they share the host's memory.
int device_count() {
  static const int n = [] {
    const char* e = std::getenv("TRIAD_SIM_DEVICES");
    const int v = e != nullptr ? std::atoi(e) : 1;
    return v >= 1 && v <= 64 ? v : 1;
  }();
  return n;
}

struct Mapping {
  void* base;
  size_t bytes;
};
// The runtime's state is never destroyed: Triad's backend releases its
// streams and memory during static destruction, in any order with this
// file's statics.
struct Memory {
  std::mutex mutex;
  std::map<const void*, Mapping> device;  // user pointer -> mapping
  std::map<const char*, size_t> pinned;   // cudaHostAlloc: start -> bytes
};
Memory& memory() {
  static Memory* m = new Memory;
  return *m;
}
thread_local int g_current_device = 0;
thread_local cudaError_t g_last_error = cudaSuccess;

cudaError_t set(cudaError_t e) {
  if (e != cudaSuccess) g_last_error = e;
  return e;
}

size_t page() {
  return static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

bool is_pinned(const void* p) {
  std::lock_guard<std::mutex> lock(memory().mutex);
  const char* c = static_cast<const char*>(p);
  auto it = memory().pinned.upper_bound(c);
  if (it == memory().pinned.begin()) return false;
  --it;
  return c < it->first + it->second;
}

bool is_device(const void* p) {
  std::lock_guard<std::mutex> lock(memory().mutex);
  auto it = memory().device.upper_bound(p);
  if (it == memory().device.begin()) return false;
  --it;
  const auto* c = static_cast<const unsigned char*>(p);
  const auto* base = static_cast<const unsigned char*>(it->second.base);
  return c >= base && c < base + it->second.bytes;
}

}  // namespace

// ---- streams ------------------------------------------------------------------
namespace triad_sim {
namespace {

Streams initial_mode() {
  const char* e = std::getenv("TRIAD_SIM_STREAMS");
  return e != nullptr && std::string(e) == "eager" ? Streams::Eager : Streams::Deferred;
}
Streams g_mode = initial_mode();

// Queues run under one lock, taken again by the work they run (a wait runs
// another queue; a library call's work may query the runtime).
struct StreamState {
  std::recursive_mutex mutex;
  std::set<std::shared_ptr<Queue>> created;  // streams not yet destroyed
  std::shared_ptr<Queue> legacy[64];
};
StreamState& state() {
  static StreamState* s = new StreamState;  // never destroyed, as memory()
  return *s;
}

std::shared_ptr<Queue> legacy(int device) {
  auto& q = state().legacy[device];
  if (!q) {
    q = std::make_shared<Queue>();
    q->device = device;
    q->legacy = true;
  }
  return q;
}

std::shared_ptr<Queue> queue_of(cudaStream_t s) {
  // 0, cudaStreamLegacy (1) and cudaStreamPerThread (2) all serve as the
  // legacy stream here.
  if (reinterpret_cast<uintptr_t>(s) <= 2) return legacy(g_current_device);
  return s->queue;
}

// Runs `q` up to and including item `upto` (the items it waits for first).
void run_until(Queue& q, uint64_t upto) {
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  while (q.done < upto && !q.ops.empty()) {
    std::function<void()> op = std::move(q.ops.front());
    q.ops.pop_front();
    ++q.done;
    op();
  }
}

void run_all(Queue& q) {
  run_until(q, q.issued);
}

// The host waiting for `q` up to item `upto`.
void host_wait(Queue& q, uint64_t upto) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  if (q.done < upto) note_host_wait();
  run_until(q, upto);
}

void run_every_queue() {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  if (pending_work() > 0) note_host_wait();
  for (bool more = true; more;) {
    more = false;
    std::vector<std::shared_ptr<Queue>> all(state().created.begin(), state().created.end());
    for (auto& q : state().legacy)
      if (q) all.push_back(q);
    for (auto& q : all) {
      if (q->done < q->issued) {
        run_all(*q);
        more = true;
      }
    }
  }
}

// The captures open on any stream.
std::vector<std::shared_ptr<Capture>> open_captures() {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  std::vector<std::shared_ptr<Capture>> all;
  for (auto& q : state().created)
    if (q->capture) all.push_back(q->capture);
  return all;
}

// A call CUDA does not allow during a capture: made on the capturing stream
// (`q`, when not null), or one that would synchronise the device made by a
// thread that has a capture open (`device_wide`). It spoils the capture, as
// on a GPU (cudaStreamEndCapture then fails), and the call fails.
bool spoils_capture(Queue* q, bool device_wide) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  bool spoilt = false;
  if (q != nullptr && q->capture) {
    q->capture->invalidated = true;
    spoilt = true;
  }
  if (device_wide && g_thread_capture_mode != cudaStreamCaptureModeRelaxed) {
    for (auto& c : open_captures()) {
      if (c->thread != std::this_thread::get_id() || c->mode == cudaStreamCaptureModeRelaxed)
        continue;
      c->invalidated = true;
      spoilt = true;
    }
  }
  return spoilt;
}

// Appends an item that waits until `other` has run its first `upto` items.
void push_wait(Queue& q, std::shared_ptr<Queue> other, uint64_t upto) {
  q.ops.push_back([other = std::move(other), upto] { run_until(*other, upto); });
  ++q.issued;
}

// Appends `work` to `q` (with the implicit waits of the legacy stream) and
// returns its number.
uint64_t push(Queue& q, std::function<void()> work) {
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  if (q.capture) {  // kept for the graph, not run
    q.capture->ops.push_back(std::move(work));
    if (&q != q.capture->origin) ++q.capture->joined[&q].pushed;
    return q.issued;
  }
  if (q.legacy) {
    // The legacy stream waits for all earlier work of the device's blocking streams...
    for (auto& other : state().created)
      if (other->blocking && other->device == q.device && other->done < other->issued)
        push_wait(q, other, other->issued);
  } else if (q.blocking) {
    // ...and they wait for all earlier work on it.
    auto l = legacy(q.device);
    if (l->done < l->issued) push_wait(q, l, l->issued);
  }
  q.ops.push_back(std::move(work));
  const uint64_t seq = ++q.issued;
  if (g_mode == Streams::Eager) run_all(q);
  return seq;
}

}  // namespace

void set_streams(Streams mode) {
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  if (mode == Streams::Eager) run_every_queue();
  g_mode = mode;
}
Streams streams() {
  return g_mode;
}

void enqueue(cudaStream_t stream, std::function<void()> work) {
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  push(*queue_of(stream), std::move(work));
}

bool enqueue_at_launch(cudaStream_t stream, std::function<void()> work) {
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  Queue& q = *queue_of(stream);
  if (!q.capture) return false;
  q.capture->runs_at_launch = true;
  push(q, std::move(work));
  return true;
}

void run_stream(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  run_all(*queue_of(stream));
}

int64_t pending_work() {
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  int64_t n = 0;
  for (auto& q : state().created) n += static_cast<int64_t>(q->issued - q->done);
  for (auto& q : state().legacy)
    if (q) n += static_cast<int64_t>(q->issued - q->done);
  return n;
}

}  // namespace triad_sim

extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return set(cudaErrorInvalidValue);
  // (Not stream work: refused from a capturing thread unless relaxed, as by
  // CUDA 13.)
  if (triad_sim::spoils_capture(nullptr, true)) return set(cudaErrorStreamCaptureUnsupported);
  if (bytes == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  // [mapping ... user bytes | guard page]; the user block starts 256-byte
  // aligned (as cudaMalloc's) as close to the guard as that allows.
  const size_t pg = page();
  const size_t data = (bytes + 255) / 256 * 256;
  const size_t body = (data + pg - 1) / pg * pg;
  void* base = mmap(nullptr, body + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return set(cudaErrorMemoryAllocation);
  unsigned char* guard = static_cast<unsigned char*>(base) + body;
  mprotect(guard, pg, PROT_NONE);
  unsigned char* user = guard - data;
  // Fresh device memory is not zero on a GPU either.
  std::memset(user, 0xFF, data);  // NaN in every float type
  std::lock_guard<std::mutex> lock(memory().mutex);
  memory().device[user] = {base, body + pg};
  *p = user;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (triad_sim::runtime_unloading()) return set(cudaErrorCudartUnloading);
  if (p == nullptr) return cudaSuccess;
  if (triad_sim::spoils_capture(nullptr, true)) return set(cudaErrorStreamCaptureUnsupported);
  triad_sim::run_every_queue();  // cudaFree synchronises the device
  std::lock_guard<std::mutex> lock(memory().mutex);
  auto it = memory().device.find(p);
  if (it == memory().device.end()) return set(cudaErrorInvalidValue);
  munmap(it->second.base, it->second.bytes);
  memory().device.erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  if (p == nullptr) return set(cudaErrorInvalidValue);
  *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096 + 4096);
  if (*p == nullptr) return set(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(memory().mutex);
  memory().pinned[static_cast<const char*>(*p)] = bytes;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  if (triad_sim::runtime_unloading()) return set(cudaErrorCudartUnloading);
  if (p == nullptr) return cudaSuccess;
  if (triad_sim::spoils_capture(nullptr, true)) return set(cudaErrorStreamCaptureUnsupported);
  triad_sim::run_every_queue();  // as cudaFree
  {
    std::lock_guard<std::mutex> lock(memory().mutex);
    if (memory().pinned.erase(static_cast<const char*>(p)) == 0) return set(cudaErrorInvalidValue);
  }
  std::free(p);
  return cudaSuccess;
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorCudartUnloading:
      return "driver shutting down";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched:
      return "the capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined:
      return "capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    default:
      return "cuda_sim error";
  }
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorCudartUnloading:
      return "cudaErrorCudartUnloading";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched:
      return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined:
      return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation:
      return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit:
      return "cudaErrorStreamCaptureImplicit";
    default:
      return "cudaErrorUnknown";
  }
}
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) {
  return g_last_error;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return set(cudaErrorInvalidValue);
  *count = device_count();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (triad_sim::runtime_unloading()) return set(cudaErrorCudartUnloading);
  if (device < 0 || device >= device_count()) return set(cudaErrorInvalidDevice);
  g_current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (triad_sim::runtime_unloading()) return set(cudaErrorCudartUnloading);
  if (device == nullptr) return set(cudaErrorInvalidValue);
  *device = g_current_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  if (triad_sim::spoils_capture(nullptr, true)) return set(cudaErrorStreamCaptureUnsupported);
  triad_sim::run_every_queue();
  return cudaSuccess;
}
// The profiler's capture range: counted (sim.h's Counters), nothing to
// capture.
cudaError_t cudaProfilerStart(void) {
  triad_sim::note_profiler(true);
  return cudaSuccess;
}
cudaError_t cudaProfilerStop(void) {
  triad_sim::note_profiler(false);
  return cudaSuccess;
}
// An H100's 80 GiB per simulated device (what is really allocated comes
// from the host's memory, and a "free" figure would be made up: both say
// the total).
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (free == nullptr || total == nullptr) return set(cudaErrorInvalidValue);
  *free = *total = size_t{80} << 30;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (value == nullptr) return set(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return set(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = 32;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(triad_sim::shared_per_block());
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *value = 228 * 1024;
      return cudaSuccess;
    default:
      return set(cudaErrorInvalidValue);
  }
}
// Blocks of `block_size` threads an H100/H200 multiprocessor holds by its
// 2048 threads, 32 blocks and 228 KiB of shared memory (1 KiB reserved per
// block). The simulator cannot know a kernel's registers or static shared
// memory, so this is the upper bound a GPU's answer stays within.
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* func,
                                                          int block_size, size_t dynamic_smem) {
  if (blocks == nullptr || func == nullptr) return set(cudaErrorInvalidValue);
  if (block_size <= 0 || block_size > 1024) return set(cudaErrorInvalidValue);
  int n = std::min(32, 2048 / block_size);
  n = std::min<int>(n, static_cast<int>((228u << 10) / (dynamic_smem + 1024)));
  *blocks = n;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, const void* func,
                                                                   int block_size,
                                                                   size_t dynamic_smem,
                                                                   unsigned int) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, func, block_size, dynamic_smem);
}
cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  if (func == nullptr) return set(cudaErrorInvalidDeviceFunction);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return set(cudaErrorInvalidValue);
  if (value < 0 || static_cast<size_t>(value) > triad_sim::shared_per_block())
    return set(cudaErrorInvalidValue);
  triad_sim::set_max_dynamic_shared(func, static_cast<size_t>(value));
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  if (s == nullptr) return set(cudaErrorInvalidValue);
  auto q = std::make_shared<triad_sim::Queue>();
  q->device = g_current_device;
  q->blocking = (flags & cudaStreamNonBlocking) == 0;
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  triad_sim::state().created.insert(q);
  *s = new CUstream_st{q};
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (triad_sim::runtime_unloading()) return set(cudaErrorCudartUnloading);
  if (reinterpret_cast<uintptr_t>(s) <= 2) return set(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  // Work queued before the destruction still runs (now, here).
  triad_sim::run_all(*s->queue);
  triad_sim::state().created.erase(s->queue);
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  auto q = triad_sim::queue_of(s);
  if (triad_sim::spoils_capture(q.get(), q->legacy)) return set(cudaErrorStreamCaptureUnsupported);
  triad_sim::host_wait(*q, q->issued);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  auto q = triad_sim::queue_of(s);
  if (triad_sim::spoils_capture(q.get(), false)) return set(cudaErrorStreamCaptureUnsupported);
  if (q->done >= q->issued) return cudaSuccess;
  // As cudaEventQuery: a not-ready query, which lets the stream progress.
  triad_sim::note_not_ready_query();
  triad_sim::run_until(*q, q->issued);
  return cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  if (e == nullptr) return set(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  auto q = triad_sim::queue_of(s);
  if (e->capture) {
    // Recorded in a capture: the waiting stream joins it (a fork), or, in
    // it already, the capture has waited on the event's stream up to there
    // (a join). A capture that has ended, or another capture, cannot be
    // waited on.
    const std::shared_ptr<triad_sim::Capture> c = e->capture;
    if (c->ended) return set(cudaErrorStreamCaptureIsolation);
    if (q->capture && q->capture != c) {
      q->capture->invalidated = c->invalidated = true;
      return set(cudaErrorStreamCaptureIsolation);
    }
    if (!q->capture) {
      if (q->legacy) {
        c->invalidated = true;
        return set(cudaErrorStreamCaptureImplicit);
      }
      q->capture = c;
      c->joined[q.get()];
    }
    if (e->captured_on != q.get() && e->captured_on != c->origin) {
      auto& j = c->joined[e->captured_on];
      j.waited = std::max(j.waited, e->captured_upto);
    }
    return cudaSuccess;
  }
  // A capture cannot wait on work outside it.
  if (triad_sim::spoils_capture(q.get(), false)) return set(cudaErrorStreamCaptureUnsupported);
  // Waits for the event's last record; one never recorded is no wait.
  if (!e->queue) return cudaSuccess;
  if (e->queue->done < e->seq) {
    triad_sim::push(*q, [other = e->queue, upto = e->seq] { triad_sim::run_until(*other, upto); });
  }
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  if (e == nullptr) return set(cudaErrorInvalidValue);
  *e = new CUevent_st{};
  (*e)->flags = flags;
  triad_sim::note_event_created();
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  return cudaEventCreateWithFlags(e, cudaEventDefault);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (triad_sim::runtime_unloading()) return set(cudaErrorCudartUnloading);
  delete e;  // a record still queued keeps its mark
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (e == nullptr) return set(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  auto q = triad_sim::queue_of(s);
  if (q->capture) {
    // A point in the capture, for streams to wait on (no time is taken).
    e->capture = q->capture;
    e->captured_on = q.get();
    e->captured_upto = q.get() == q->capture->origin ? 0 : q->capture->joined[q.get()].pushed;
    e->queue.reset();
    e->mark.reset();
    e->seq = 0;
    e->recorder = std::this_thread::get_id();
    return cudaSuccess;
  }
  auto mark = std::make_shared<triad_sim::Mark>();
  e->capture.reset();
  e->queue = q;
  e->mark = mark;
  e->recorder = std::this_thread::get_id();
  e->seq = triad_sim::push(*q, [mark] { mark->at = std::chrono::steady_clock::now(); });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e == nullptr) return set(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  // A captured event stands for no work that runs: asking spoils its capture.
  if (e->capture) {
    e->capture->invalidated = true;
    return set(cudaErrorStreamCaptureUnsupported);
  }
  if (!e->queue || e->queue->done >= e->seq) return cudaSuccess;
  // Not reached yet: say so, and let the stream progress so that a later
  // query finds it done (a poll loop ends). A query never blocks on a GPU,
  // so this is not counted as a host wait, but as a not-ready query. Only
  // the thread that recorded the event makes it progress: another thread
  // watching it (a communication watchdog) sees the work run when the
  // program's own thread needs it, so what runs when does not depend on
  // how the threads interleave.
  if (std::this_thread::get_id() != e->recorder) return cudaErrorNotReady;
  triad_sim::note_not_ready_query();
  triad_sim::run_until(*e->queue, e->seq);
  return cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e == nullptr) return set(cudaErrorInvalidResourceHandle);
  if (e->capture) {
    e->capture->invalidated = true;
    return set(cudaErrorStreamCaptureUnsupported);
  }
  if (e->queue) triad_sim::host_wait(*e->queue, e->seq);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return set(cudaErrorInvalidValue);
  if ((start->flags | end->flags) & cudaEventDisableTiming)
    return set(cudaErrorInvalidResourceHandle);
  if (!start->queue || !end->queue) return set(cudaErrorInvalidResourceHandle);
  if (start->queue->done < start->seq || end->queue->done < end->seq) return set(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(end->mark->at - start->mark->at).count();
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (count != 0 && (dst == nullptr || src == nullptr)) return set(cudaErrorInvalidValue);
  if (count == 0) return cudaSuccess;
  if (kind == cudaMemcpyDefault) {
    const bool from_device = is_device(src), to_device = is_device(dst);
    kind = from_device ? (to_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                       : (to_device ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  }
  const bool host_src = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost;
  const bool host_dst = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost;
  auto q = triad_sim::queue_of(stream);
  // A graph cannot hold a copy from or to pageable memory.
  if (((host_src && !is_pinned(src)) || (host_dst && !is_pinned(dst))) &&
      triad_sim::spoils_capture(q.get(), false)) {
    return set(cudaErrorStreamCaptureUnsupported);
  }
  if (host_src && !is_pinned(src)) {
    // From pageable memory the source is staged before the call returns.
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + count);
    triad_sim::push(*q, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  } else {
    triad_sim::push(*q, [dst, src, count] { std::memmove(dst, src, count); });
  }
  // Into pageable memory the call returns once the copy is done.
  if (host_dst && !is_pinned(dst)) triad_sim::host_wait(*q, q->issued);
  return cudaSuccess;
}
cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device,
                                size_t count, cudaStream_t stream) {
  if (dst_device < 0 || dst_device >= device_count() || src_device < 0 ||
      src_device >= device_count()) {
    return set(cudaErrorInvalidDevice);
  }
  return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t stream) {
  if (count != 0 && p == nullptr) return set(cudaErrorInvalidValue);
  if (count != 0) triad_sim::enqueue(stream, [p, value, count] { std::memset(p, value, count); });
  return cudaSuccess;
}

// ---- graphs ---------------------------------------------------------------------
// A capture holds its streams' work, in issue order; what a graph launch
// queues runs it again, in that order.
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  if (reinterpret_cast<uintptr_t>(s) <= 2) return set(cudaErrorStreamCaptureUnsupported);
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  if (s->queue->capture) return set(cudaErrorIllegalState);
  s->queue->capture = std::make_shared<triad_sim::Capture>();
  s->queue->capture->thread = std::this_thread::get_id();
  s->queue->capture->mode = mode;
  s->queue->capture->origin = s->queue.get();
  return cudaSuccess;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  if (mode == nullptr) return set(cudaErrorInvalidValue);
  std::swap(*mode, triad_sim::g_thread_capture_mode);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  if (graph == nullptr) return set(cudaErrorInvalidValue);
  *graph = nullptr;
  if (reinterpret_cast<uintptr_t>(s) <= 2) return set(cudaErrorIllegalState);
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  const std::shared_ptr<triad_sim::Capture> c = s->queue->capture;
  if (!c) return set(cudaErrorIllegalState);
  // Only the stream that began it ends it.
  if (c->origin != s->queue.get()) return set(cudaErrorStreamCaptureUnmatched);
  // Every stream leaves the capture, which ends.
  s->queue->capture.reset();
  for (auto& q : triad_sim::state().created)
    if (q->capture == c) q->capture.reset();
  c->ended = true;
  if (c->thread != std::this_thread::get_id()) return set(cudaErrorStreamCaptureWrongThread);
  if (c->invalidated) return set(cudaErrorStreamCaptureInvalidated);
  // A joined stream's work must have been waited on since (joined back).
  for (const auto& [q, j] : c->joined)
    if (j.waited < j.pushed) return set(cudaErrorStreamCaptureUnjoined);
  *graph = new CUgraph_st{std::move(c->ops), c->runs_at_launch};
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus* status) {
  if (status == nullptr) return set(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lock(triad_sim::state().mutex);
  const auto& c = triad_sim::queue_of(s)->capture;
  *status = !c               ? cudaStreamCaptureStatusNone
            : c->invalidated ? cudaStreamCaptureStatusInvalidated
                             : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (exec == nullptr || graph == nullptr) return set(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{std::make_shared<const std::vector<std::function<void()>>>(graph->ops),
                             graph->runs_at_launch};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (exec == nullptr) return set(cudaErrorInvalidValue);
  auto q = triad_sim::queue_of(s);
  if (triad_sim::spoils_capture(q.get(), false)) return set(cudaErrorStreamCaptureUnsupported);
  triad_sim::push(*q, [ops = exec->ops] {
    for (const auto& op : *ops) op();
  });
  // (Work that runs as the graph is launched: sim.h, enqueue_at_launch.)
  if (exec->runs_at_launch) triad_sim::run_stream(s);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;  // a launch still queued keeps its work
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

}  // extern "C"
