#pragma once

#include <cstdint>
#include <string>

namespace triad::optim {

// How the learning rate falls after warm-up.
enum class LrDecay {
  Cosine,    // half a cosine from lr to min_lr at decay_steps
  Linear,    // a straight line from lr to min_lr at decay_steps
  Constant,  // lr throughout (min_lr unused)
  Wsd,       // warm-up, stable at lr, then a linear cool-down to min_lr over the
             // last cooldown_steps before decay_steps
};
LrDecay lr_decay_from_string(const std::string& name);  // cosine | linear | constant | wsd
const char* lr_decay_name(LrDecay decay);

struct LrScheduleOptions {
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // where the decay reaches min_lr (min_lr after it)
  LrDecay decay = LrDecay::Cosine;
  int64_t cooldown_steps = 0;  // wsd only: >= 1 and at most decay_steps - warmup_steps
};

// Linear warm-up from lr/warmup_steps to lr over warmup_steps, then the
// chosen decay. Bad options raise a ValueError naming the values.
class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleOptions& options);
  // Learning rate for 0-based step `step`, which may be fractional (a
  // batch-size ramp counts its small early steps as fractions of one).
  double at(double step) const;
  const LrScheduleOptions& options() const { return o_; }

 private:
  LrScheduleOptions o_;
};

}  // namespace triad::optim
