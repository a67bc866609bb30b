#pragma once

#include <chrono>
#include <memory>

namespace triad::dist {

// Handle to an asynchronous communication call. wait() blocks until the
// operation has completed (and its result is in place) or the group's
// timeout expires, in which case it throws TimeoutError naming the group, the
// operation, the peers and the sizes. A timed-out Work may be waited on again.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  // wait() with another time limit than the group's.
  virtual void wait_for(std::chrono::milliseconds timeout) = 0;
  virtual bool is_completed() = 0;
};

using WorkPtr = std::shared_ptr<Work>;

// A Work that is already complete (local shortcuts, size-1 groups).
WorkPtr completed_work();

}  // namespace triad::dist
