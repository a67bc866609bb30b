#pragma once

// Batch-size ramp-up (train.rampup_batch_size: [start, increment, samples]),
// Megatron-LM's --rampup-batch-size: the global batch starts at `start`
// sequences and grows by `increment` in equal steps of consumed sequences
// until it reaches train.global_batch_size after `samples` of them. With
// n = (global - start) / increment increments, a step that begins after c
// consumed sequences takes start + floor(c / (samples / n)) * increment
// sequences, at most global. A function of the consumed count only, so a
// resumed run (checkpoints record it) picks up the ramp where it was.
#include <cstdint>
#include <vector>

namespace triad::train {

class BatchSizeRamp {
 public:
  BatchSizeRamp() = default;  // no ramp: every step takes `target`
  // Errors (ConfigError) name the values: start, increment and samples
  // positive, start below target, and target - start a multiple of increment.
  BatchSizeRamp(int64_t start, int64_t increment, int64_t samples, int64_t target);
  explicit BatchSizeRamp(int64_t target) : target_(target) {}

  bool ramps() const { return increment_ > 0; }
  int64_t target() const { return target_; }
  // The global batch of a step that begins after `consumed` sequences.
  int64_t at(int64_t consumed) const;
  // Every global batch size the run takes, smallest first (the target last).
  std::vector<int64_t> sizes() const;
  // Sequences consumed when the ramp reaches the target.
  int64_t samples() const { return samples_; }

 private:
  int64_t start_ = 0, increment_ = 0, samples_ = 0, target_ = 0;
  double per_increment_ = 0;  // sequences between increments
};

}  // namespace triad::train
