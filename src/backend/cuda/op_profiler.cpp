#include "op_profiler.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "triad/backend/cuda.h"
#include "triad/core/error.h"

namespace triad::detail {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw Error(std::string("cuda op profiler: ") + what + ": " + cudaGetErrorName(err) + " (" +
                cudaGetErrorString(err) + ")");
  }
}

// The intervals recorded since the last read, per device, and the events
// they return to once read (creating two events per call would cost more
// than the call).
class OpProfiler {
 public:
  static OpProfiler& get() {
    static OpProfiler p;
    return p;
  }

  bool on() const { return on_.load(std::memory_order_relaxed); }
  void set(bool on) { on_.store(on, std::memory_order_relaxed); }

  cudaEvent_t take(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<cudaEvent_t>& pool = pool_[device];
    if (!pool.empty()) {
      cudaEvent_t e = pool.back();
      pool.pop_back();
      return e;
    }
    // (An event belongs to the device current when it is made.)
    int current = 0;
    check(cudaGetDevice(&current), "cudaGetDevice");
    if (current != device) check(cudaSetDevice(device), "cudaSetDevice");
    cudaEvent_t e = nullptr;
    const cudaError_t made = cudaEventCreate(&e);
    if (current != device) cudaSetDevice(current);
    check(made, "cudaEventCreate");
    return e;
  }

  void give_back(int device, cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mutex_);
    pool_[device].push_back(e);
  }

  void add(int device, const char* op, cudaEvent_t start, cudaEvent_t end) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_[device].push_back({op, start, end});
  }

  std::vector<cuda::OpTime> read(int device) {
    std::vector<Interval> intervals;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      intervals.swap(pending_[device]);
    }
    std::map<std::string, cuda::OpTime> by_op;
    for (const Interval& i : intervals) {
      check(cudaEventSynchronize(i.end), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, i.start, i.end), "cudaEventElapsedTime");
      cuda::OpTime& t = by_op[i.op];
      t.op = i.op;
      t.calls += 1;
      t.ms += ms;
      give_back(device, i.start);
      give_back(device, i.end);
    }
    std::vector<cuda::OpTime> out;
    for (auto& [name, t] : by_op) out.push_back(t);
    std::sort(out.begin(), out.end(), [](const cuda::OpTime& a, const cuda::OpTime& b) {
      return a.ms != b.ms ? a.ms > b.ms : a.op < b.op;
    });
    return out;
  }

 private:
  struct Interval {
    const char* op;
    cudaEvent_t start, end;
  };
  std::atomic<bool> on_{false};
  std::mutex mutex_;
  std::map<int, std::vector<Interval>> pending_;
  std::map<int, std::vector<cudaEvent_t>> pool_;
};

thread_local int t_depth = 0;  // backend calls in progress on this thread

}  // namespace

OpTimer::OpTimer(int device, cudaStream_t stream, const char* op)
    : device_(device), stream_(stream), op_(op) {
  if (t_depth++ > 0 || !OpProfiler::get().on()) return;
  OpProfiler& p = OpProfiler::get();
  try {
    start_ = p.take(device);
    end_ = p.take(device);
    check(cudaEventRecord(start_, stream), "cudaEventRecord");
  } catch (...) {
    --t_depth;  // no destructor runs after a throwing constructor
    if (start_) p.give_back(device, start_);
    if (end_) p.give_back(device, end_);
    throw;
  }
  active_ = true;
}

OpTimer::~OpTimer() {
  --t_depth;
  if (!active_) return;
  OpProfiler& p = OpProfiler::get();
  if (cudaEventRecord(end_, stream_) == cudaSuccess) {
    p.add(device_, op_, start_, end_);
  } else {
    p.give_back(device_, start_);
    p.give_back(device_, end_);
  }
}

}  // namespace triad::detail

namespace triad::cuda {

void set_op_profiling(bool on) {
  detail::OpProfiler::get().set(on);
}

bool op_profiling() {
  return detail::OpProfiler::get().on();
}

std::vector<OpTime> op_profile(int device) {
  if (device < 0 || device >= device_count()) {
    throw ValueError("cuda::op_profile: device " + std::to_string(device) + " is not one of the " +
                     std::to_string(device_count()) + " visible");
  }
  return detail::OpProfiler::get().read(device);
}

}  // namespace triad::cuda
