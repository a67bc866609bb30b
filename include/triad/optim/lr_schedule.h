#pragma once

#include <cstdint>
#include <string>

namespace triad::optim {

// How the learning rate falls after warm-up.
enum class LrDecay {
  Cosine,       // half a cosine from lr to min_lr at decay_steps
  Linear,       // a straight line from lr to min_lr at decay_steps
  Constant,     // lr throughout (min_lr unused)
  Wsd,          // warm-up, stable at lr, then a cool-down to min_lr over the last
                // cooldown_steps before decay_steps, of cooldown_shape
  InverseSqrt,  // lr * sqrt(max(warmup_steps, 1) / (step + 1)), not below min_lr
                // (the Transformer's rule; Megatron-LM's inverse-square-root)
};
// cosine | linear | constant | wsd | inverse_sqrt
LrDecay lr_decay_from_string(const std::string& name);
const char* lr_decay_name(LrDecay decay);

// The curve of wsd's cool-down, from lr (progress p = 0) to min_lr (p = 1):
// lr - (lr - min_lr) * f(p).
enum class CooldownShape {
  Linear,        // f = p
  Cosine,        // f = (1 - cos(pi p)) / 2
  OneMinusSqrt,  // f = sqrt(p): "1-sqrt" (Hägele et al. 2024: a lower final
                 // loss than a linear cool-down of the same length;
                 // Megatron-LM's minus_sqrt)
};
CooldownShape cooldown_shape_from_string(const std::string& name);  // linear | cosine | 1-sqrt
const char* cooldown_shape_name(CooldownShape shape);

struct LrScheduleOptions {
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // where the decay reaches min_lr (min_lr after it)
  LrDecay decay = LrDecay::Cosine;
  int64_t cooldown_steps = 0;  // wsd only: >= 1 and at most decay_steps - warmup_steps
  CooldownShape cooldown_shape = CooldownShape::Linear;  // wsd only
  // Where the warm-up starts from (in [0, lr]): step k of it uses
  // warmup_init + (lr - warmup_init) * (k + 1) / warmup_steps.
  double warmup_init = 0;
};

// Linear warm-up from warmup_init to lr over warmup_steps (its first step at
// warmup_init + (lr - warmup_init) / warmup_steps), then the chosen decay. Bad options raise a
// ValueError naming the values.
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
