#pragma once

#include <cstdint>
#include <string>

namespace triad::optim {

// How weight decay moves from its start value to its end value over a run
// (Megatron-LM's --weight-decay-incr-style): p = min(step / steps, 1) and
//   constant: end throughout
//   linear:   start + (end - start) p
//   cosine:   start + (end - start) (1 - cos(pi p)) / 2
enum class WeightDecayShape { Constant, Linear, Cosine };
WeightDecayShape weight_decay_shape_from_string(
    const std::string& name);  // constant | linear | cosine
const char* weight_decay_shape_name(WeightDecayShape shape);

struct WeightDecayScheduleOptions {
  double start = 0;   // at step 0 (linear, cosine)
  double end = 0;     // from `steps` on; constant's throughout
  int64_t steps = 0;  // where it reaches `end` (>= 1 unless constant)
  WeightDecayShape shape = WeightDecayShape::Constant;
};

// Bad options (a negative or non-finite decay, a changing schedule without
// steps) raise a ValueError naming the values.
class WeightDecaySchedule {
 public:
  explicit WeightDecaySchedule(const WeightDecayScheduleOptions& options);
  // The decay for 0-based step `step`, which may be fractional (a batch-size
  // ramp counts its small early steps as fractions of one, as the learning
  // rate's schedule does).
  double at(double step) const;
  // Whether the decay changes over the run.
  bool changes() const { return o_.shape != WeightDecayShape::Constant; }
  const WeightDecayScheduleOptions& options() const { return o_; }

 private:
  WeightDecayScheduleOptions o_;
};

}  // namespace triad::optim
