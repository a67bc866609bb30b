#include "triad/backend/device_timer.h"

#include <utility>

#include "triad/backend/cuda.h"
#include "triad/core/error.h"

namespace triad {

DeviceTimer::DeviceTimer(Device device) : device_(device) {}

DeviceTimer::~DeviceTimer() {
  for (void* e : events_) cuda::destroy_timing_event(e);
  cuda::destroy_timing_event(ref_);
  cuda::destroy_timing_event(anchor_);
}

DeviceTimer::Mark DeviceTimer::mark() {
  if (!device_.is_cuda()) {
    host_.push_back(Clock::now());
    return host_.size() - 1;
  }
  if (used_ == events_.size()) events_.push_back(cuda::create_timing_event(device_.index));
  cuda::record_timing_event(device_.index, events_[used_]);
  return used_++;
}

void DeviceTimer::check_span(const std::string& what, Mark from, Mark to) const {
  if (from > to || to >= marks()) {
    throw ValueError("DeviceTimer::" + what + ": marks " + std::to_string(from) + " to " +
                     std::to_string(to) + " are not a span of this reading's " +
                     std::to_string(marks()) + " marks (the first no later than the second)");
  }
}

void DeviceTimer::add(const std::string& category, Mark from, Mark to) {
  check_span("add('" + category + "')", from, to);
  spans_.push_back({category, from, to});
}

void DeviceTimer::trace(const std::string& name, const std::string& category, Mark from, Mark to) {
  if (!tracing_) return;
  check_span("trace('" + name + "')", from, to);
  named_.push_back({name, category, from, to});
}

void DeviceTimer::place_pending() {
  if (!anchored_) return;
  // The anchor's time after the reading's last mark (this waits only if the
  // device has not reached the anchor yet).
  const double anchor_ms = cuda::elapsed_ms(ref_, anchor_);
  auto at = [&](double ms) {
    return anchor_host_ - std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double, std::milli>(anchor_ms - ms));
  };
  for (const Pending& p : pending_)
    placed_.push_back({p.name, p.category, at(p.from_ms), at(p.to_ms)});
  pending_.clear();
  anchored_ = false;
}

std::map<std::string, double> DeviceTimer::read() {
  const bool gpu = device_.is_cuda();
  // One wait, for the last mark: every earlier one has been reached then.
  if (gpu && used_ > 0) cuda::elapsed_ms(events_[0], events_[used_ - 1]);
  // The last reading's anchor came before this reading's marks: reached.
  if (gpu) place_pending();
  std::map<std::string, double> out;
  for (const Span& s : spans_) {
    const double seconds = gpu ? cuda::elapsed_ms(events_[s.from], events_[s.to]) / 1e3
                               : std::chrono::duration<double>(host_[s.to] - host_[s.from]).count();
    out[s.category] += seconds;
  }
  if (!named_.empty() && !gpu) {
    for (const NamedSpan& n : named_)
      placed_.push_back({n.name, n.category, host_[n.from], host_[n.to]});
  } else if (!named_.empty()) {
    // Each end's place before the last mark, which then stays recorded
    // (swapped out of the pool) until the anchor after it is placed.
    const Mark last = used_ - 1;
    for (const NamedSpan& n : named_) {
      pending_.push_back({n.name, n.category, -cuda::elapsed_ms(events_[n.from], events_[last]),
                          -cuda::elapsed_ms(events_[n.to], events_[last])});
    }
    if (ref_ == nullptr) ref_ = cuda::create_timing_event(device_.index);
    if (anchor_ == nullptr) anchor_ = cuda::create_timing_event(device_.index);
    std::swap(ref_, events_[last]);
    // On an idle stream the anchor is reached as it is recorded: its time on
    // the device is the host's clock then. (A query lets a device that runs
    // its queue lazily, the simulator, run it now, as a GPU's idle stream
    // does by itself. The clock is read after it: if anything, the spans
    // are placed late, never before the host queued their work.)
    if (!cuda::stream_idle(device_.index)) cuda::synchronize(device_.index);
    cuda::record_timing_event(device_.index, anchor_);
    cuda::timing_event_reached(anchor_);
    anchor_host_ = Clock::now();
    anchored_ = true;
  }
  named_.clear();
  spans_.clear();
  host_.clear();
  used_ = 0;
  return out;
}

std::vector<DeviceTimer::Traced> DeviceTimer::take_traced(bool wait) {
  if (wait) place_pending();
  return std::exchange(placed_, {});
}

}  // namespace triad
