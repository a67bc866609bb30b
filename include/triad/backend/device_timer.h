#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "triad/core/device.h"

namespace triad {

// Time spent by a device on spans of the work it is given, measured where
// the work runs. On a GPU the host only queues work, so the host's clock
// around a call measures the queueing; here each end of a span is an event
// recorded on the device's compute stream, and the spans are read once the
// host has to wait for that work anyway (at the step's end). On the CPU the
// work is done when the call returns, and a mark is the host's clock.
//
// A span between two marks covers what the stream did between them: its
// kernels, and any time it stood waiting (for a communication stream it was
// ordered after, or for the host to queue more), which is the time those
// kernels cost the step.
class DeviceTimer {
 public:
  explicit DeviceTimer(Device device);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;

  const Device& device() const { return device_; }
  using Mark = size_t;
  // Where the device's work has got to: now on the CPU, the end of what is
  // queued on a GPU. Never waits.
  Mark mark();
  // Counts the time from `from` to `to` (marks of this reading, `from`
  // first) in `category`.
  void add(const std::string& category, Mark from, Mark to);
  // Seconds per category added since the last read (categories added to
  // more than once sum), then forgets the marks. On a GPU this waits until
  // the device has reached the last mark.
  std::map<std::string, double> read();
  size_t marks() const { return device_.is_cuda() ? used_ : host_.size(); }

 private:
  struct Span {
    std::string category;
    Mark from, to;
  };
  Device device_;
  std::vector<std::chrono::steady_clock::time_point> host_;
  std::vector<void*> events_;  // a GPU's events, reused from one reading to the next
  size_t used_ = 0;            // events recorded in this reading
  std::vector<Span> spans_;
};

}  // namespace triad
