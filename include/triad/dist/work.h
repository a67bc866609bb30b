#pragma once

#include <chrono>
#include <memory>

namespace triad::dist {

// Handle to an asynchronous communication call. After wait(), the result is
// in place for everything issued afterwards. For host tensors (the MPI group)
// wait() blocks until the operation has completed or the group's timeout
// expires, in which case it throws TimeoutError naming the group, the
// operation, the peers and the sizes; a timed-out Work may be waited on
// again. For CUDA tensors (the NCCL group) wait() orders the device's
// compute stream after the call and returns; the group's watchdog enforces
// the timeout (dist/nccl.h).
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  // Blocks the host until the call has completed, with another time limit
  // than the group's.
  virtual void wait_for(std::chrono::milliseconds timeout) = 0;
  // Whether the call has completed, seen from the host; never blocks.
  virtual bool is_completed() = 0;
};

using WorkPtr = std::shared_ptr<Work>;

// A Work that is already complete (local shortcuts, size-1 groups).
WorkPtr completed_work();

}  // namespace triad::dist
