#include "triad/backend/device_timer.h"

#include "triad/backend/cuda.h"
#include "triad/core/error.h"

namespace triad {

DeviceTimer::DeviceTimer(Device device) : device_(device) {}

DeviceTimer::~DeviceTimer() {
  for (void* e : events_) cuda::destroy_timing_event(e);
}

DeviceTimer::Mark DeviceTimer::mark() {
  if (!device_.is_cuda()) {
    host_.push_back(std::chrono::steady_clock::now());
    return host_.size() - 1;
  }
  if (used_ == events_.size()) events_.push_back(cuda::create_timing_event(device_.index));
  cuda::record_timing_event(device_.index, events_[used_]);
  return used_++;
}

void DeviceTimer::add(const std::string& category, Mark from, Mark to) {
  if (from > to || to >= marks()) {
    throw ValueError("DeviceTimer::add('" + category + "'): marks " + std::to_string(from) +
                     " to " + std::to_string(to) + " are not a span of this reading's " +
                     std::to_string(marks()) + " marks (the first no later than the second)");
  }
  spans_.push_back({category, from, to});
}

std::map<std::string, double> DeviceTimer::read() {
  // One wait, for the last mark: every earlier one has been reached then.
  if (device_.is_cuda() && used_ > 0) cuda::elapsed_ms(events_[0], events_[used_ - 1]);
  std::map<std::string, double> out;
  for (const Span& s : spans_) {
    const double seconds = device_.is_cuda()
                               ? cuda::elapsed_ms(events_[s.from], events_[s.to]) / 1e3
                               : std::chrono::duration<double>(host_[s.to] - host_[s.from]).count();
    out[s.category] += seconds;
  }
  spans_.clear();
  host_.clear();
  used_ = 0;
  return out;
}

}  // namespace triad
