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

  // Tracing: spans kept by name for a timeline (the trainer's trace.json),
  // placed on the host's clock so that they line up with the host's own
  // events and across ranks.
  using Clock = std::chrono::steady_clock;
  void set_tracing(bool on) { tracing_ = on; }
  bool tracing() const { return tracing_; }
  // While tracing, keeps the span from `from` to `to` (marks of this reading,
  // checked as add's) as an event `name` in `category`; otherwise does
  // nothing. Not counted in read()'s sums (add() does that).
  void trace(const std::string& name, const std::string& category, Mark from, Mark to);
  struct Traced {
    std::string name, category;
    Clock::time_point start, end;
  };
  // The traced spans placed so far, in the order they were traced; taking
  // them forgets them. read() places its reading's spans: on the CPU at once
  // (a mark is the host's clock); on a GPU by an anchor, an event recorded
  // at the end of read() once the compute stream has nothing queued (read
  // waits for the stream if it has) and stamped with the host's clock then.
  // The anchor's time on the device is known once the device has passed
  // it, which the next reading's wait assures, so a GPU's spans come out of
  // the reading after theirs — or now, with `wait`, which waits for the
  // anchor if the device has not reached it.
  std::vector<Traced> take_traced(bool wait = false);

 private:
  struct Span {
    std::string category;
    Mark from, to;
  };
  struct NamedSpan {
    std::string name, category;
    Mark from, to;
  };
  // A GPU reading's traced spans waiting for their anchor: their ends in
  // ms from the reading's last mark (ref_, before the anchor, so <= 0).
  struct Pending {
    std::string name, category;
    double from_ms, to_ms;
  };
  void check_span(const std::string& what, Mark from, Mark to) const;
  void place_pending();
  Device device_;
  std::vector<Clock::time_point> host_;
  std::vector<void*> events_;  // a GPU's events, reused from one reading to the next
  size_t used_ = 0;            // events recorded in this reading
  std::vector<Span> spans_;
  bool tracing_ = false;
  std::vector<NamedSpan> named_;  // this reading's traced spans
  std::vector<Pending> pending_;  // the last reading's, on a GPU
  bool anchored_ = false;         // pending_ has its anchor (even if it is empty)
  void* ref_ = nullptr;           // the last reading's last mark, kept out of events_
  void* anchor_ = nullptr;        // recorded after it on the idle stream, at anchor_host_
  Clock::time_point anchor_host_;
  std::vector<Traced> placed_;
};

}  // namespace triad
