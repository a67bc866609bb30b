#pragma once

// Loss-spike skipping (train.spike_sigma, train.spike_window): a step whose
// loss or gradient norm lies more than `sigma` standard deviations above the
// mean of the previous `window` steps' is a spike, and the trainer skips its
// update on every rank (as it skips a non-finite one), so one bad batch
// cannot throw the weights off (OLMo 2's and Levanter's skip-step rule).
// Nothing is judged until half the window (at least two steps) is known.
// Every finite step's values join the window, spikes included: a lasting
// change of level becomes the new normal instead of stopping the run.
#include <cstdint>
#include <deque>
#include <string>

namespace triad::train {

class SpikeFilter {
 public:
  SpikeFilter() = default;  // off: nothing is a spike
  // sigma > 0 and window >= 2 (ConfigError otherwise, naming the values).
  SpikeFilter(double sigma, int64_t window);

  bool enabled() const { return sigma_ > 0; }
  // Why a step with this loss and gradient norm is a spike against the
  // window so far ("loss 9.1 > 3.2 + 6 x 0.05 (mean + sigma x std of the
  // last 128 steps)"), or "" when it is not (or the filter is off, the
  // window too short, or a value not finite).
  std::string spike(double loss, double grad_norm) const;
  // Adds a step's values (finite ones only), dropping the oldest past the
  // window.
  void record(double loss, double grad_norm);
  int64_t known() const { return static_cast<int64_t>(losses_.size()); }

  // The window as text (a checkpoint's metadata), every value exact; and
  // back. load() refuses text that is not a window (IoError naming it).
  std::string state() const;
  void load(const std::string& text);

 private:
  double sigma_ = 0;
  int64_t window_ = 0;
  std::deque<double> losses_, norms_;
};

}  // namespace triad::train
