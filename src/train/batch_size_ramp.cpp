#include "triad/train/batch_size_ramp.h"

#include <cmath>
#include <string>

#include "triad/core/error.h"

namespace triad::train {

BatchSizeRamp::BatchSizeRamp(int64_t start, int64_t increment, int64_t samples, int64_t target)
    : start_(start), increment_(increment), samples_(samples), target_(target) {
  const std::string values = "train.rampup_batch_size [" + std::to_string(start) + ", " +
                             std::to_string(increment) + ", " + std::to_string(samples) + "]";
  if (start <= 0 || increment <= 0 || samples <= 0) {
    throw ConfigError(values + ": start, increment and samples must be positive");
  }
  if (start >= target) {
    throw ConfigError(values + ": the start must be below train.global_batch_size (" +
                      std::to_string(target) + ")");
  }
  if ((target - start) % increment != 0) {
    throw ConfigError(values + ": train.global_batch_size - start (" + std::to_string(target) +
                      " - " + std::to_string(start) + ") must be a multiple of the increment");
  }
  // (Every size is checked against the layout, one by one: a ramp of
  // billions of sizes, such as a global batch given with extra zeros, would
  // list them all before a step.)
  constexpr int64_t kMostSizes = int64_t{1} << 20;
  if ((target - start) / increment >= kMostSizes) {
    throw ConfigError(values + ": " + std::to_string((target - start) / increment) +
                      " increases to train.global_batch_size (" + std::to_string(target) +
                      "); at most " + std::to_string(kMostSizes - 1) + " are supported");
  }
  per_increment_ = static_cast<double>(samples) / static_cast<double>((target - start) / increment);
}

int64_t BatchSizeRamp::at(int64_t consumed) const {
  if (!ramps() || consumed >= samples_) return target_;
  const auto steps =
      static_cast<int64_t>(std::floor(static_cast<double>(consumed) / per_increment_));
  const int64_t size = start_ + steps * increment_;
  return size < target_ ? size : target_;
}

std::vector<int64_t> BatchSizeRamp::sizes() const {
  if (!ramps()) return {target_};
  std::vector<int64_t> out;
  for (int64_t s = start_; s <= target_; s += increment_) out.push_back(s);
  return out;
}

}  // namespace triad::train
