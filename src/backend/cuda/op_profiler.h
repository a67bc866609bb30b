#pragma once

// GPU time per backend op (cuda::set_op_profiling): where a training step's
// time goes, on a machine whose hardware counters cannot be read. While
// profiling is on, each backend call that queues work on a device's compute
// stream is bracketed by two events; cuda::op_profile() adds up the time
// between them per op.
#include <cuda_runtime_api.h>

namespace triad::detail {

// Brackets one backend call of `op` with the profiler's events on `stream`
// (a stream of `device`). When one call makes others (a composed op),
// only the outermost is timed, under its own name. Does nothing while
// profiling is off.
class OpTimer {
 public:
  OpTimer(int device, cudaStream_t stream, const char* op);
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  int device_;
  cudaStream_t stream_;
  const char* op_;
  cudaEvent_t start_ = nullptr, end_ = nullptr;
  bool active_ = false;
};

}  // namespace triad::detail
