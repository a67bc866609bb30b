#include "triad/optim/lr_schedule.h"

#include <cmath>
#include <string>

#include "triad/core/error.h"

namespace triad::optim {

LrDecay lr_decay_from_string(const std::string& name) {
  if (name == "cosine") return LrDecay::Cosine;
  if (name == "linear") return LrDecay::Linear;
  if (name == "constant") return LrDecay::Constant;
  if (name == "wsd") return LrDecay::Wsd;
  if (name == "inverse_sqrt") return LrDecay::InverseSqrt;
  throw ValueError("learning-rate decay '" + name +
                   "' must be cosine, linear, constant, wsd or inverse_sqrt");
}

const char* lr_decay_name(LrDecay decay) {
  switch (decay) {
    case LrDecay::Cosine:
      return "cosine";
    case LrDecay::Linear:
      return "linear";
    case LrDecay::Constant:
      return "constant";
    case LrDecay::Wsd:
      return "wsd";
    case LrDecay::InverseSqrt:
      return "inverse_sqrt";
  }
  return "unknown";
}

CooldownShape cooldown_shape_from_string(const std::string& name) {
  if (name == "linear") return CooldownShape::Linear;
  if (name == "cosine") return CooldownShape::Cosine;
  if (name == "1-sqrt") return CooldownShape::OneMinusSqrt;
  throw ValueError("cool-down shape '" + name + "' must be linear, cosine or 1-sqrt");
}

const char* cooldown_shape_name(CooldownShape shape) {
  switch (shape) {
    case CooldownShape::Linear:
      return "linear";
    case CooldownShape::Cosine:
      return "cosine";
    case CooldownShape::OneMinusSqrt:
      return "1-sqrt";
  }
  return "unknown";
}

LrSchedule::LrSchedule(const LrScheduleOptions& o) : o_(o) {
  if (o.warmup_steps < 0)
    throw ValueError("warmup_steps (" + std::to_string(o.warmup_steps) + ") must be >= 0");
  if (!(o.warmup_init >= 0 && o.warmup_init <= o.lr)) {
    throw ValueError("warmup_init (" + std::to_string(o.warmup_init) + ") must be in [0, lr (" +
                     std::to_string(o.lr) + ")]");
  }
  if (o.decay_steps < 0)
    throw ValueError("decay_steps (" + std::to_string(o.decay_steps) + ") must be >= 0");
  if (o.min_lr > o.lr && o.decay != LrDecay::Constant) {
    throw ValueError("min_lr (" + std::to_string(o.min_lr) + ") must not exceed lr (" +
                     std::to_string(o.lr) + ")");
  }
  if (o.decay == LrDecay::Wsd) {
    const int64_t span = o.decay_steps - o.warmup_steps;
    if (o.cooldown_steps < 1 || o.cooldown_steps > span) {
      throw ValueError("cooldown_steps (" + std::to_string(o.cooldown_steps) +
                       ") must be between 1 and decay_steps - warmup_steps (" +
                       std::to_string(o.decay_steps) + " - " + std::to_string(o.warmup_steps) +
                       " = " + std::to_string(span) + ")");
    }
  } else if (o.cooldown_steps != 0 || o.cooldown_shape != CooldownShape::Linear) {
    throw ValueError(
        std::string(o.cooldown_steps != 0
                        ? "cooldown_steps (" + std::to_string(o.cooldown_steps) + ")"
                        : std::string("cooldown_shape ") + cooldown_shape_name(o.cooldown_shape)) +
        " applies to the wsd decay only, not " + lr_decay_name(o.decay));
  }
}

double LrSchedule::at(double step) const {
  const auto& o = o_;
  // Step s ends (s + 1) / warmup_steps of the warm-up (a fractional step
  // past its end is already at lr).
  if (step + 1.0 < static_cast<double>(o.warmup_steps)) {
    return o.warmup_init +
           (o.lr - o.warmup_init) * (step + 1.0) / static_cast<double>(o.warmup_steps);
  }
  if (o.decay == LrDecay::Constant) return o.lr;
  if (step >= static_cast<double>(o.decay_steps)) return o.min_lr;
  if (o.decay == LrDecay::InverseSqrt) {
    // (Warm-up's last step, step + 1 = warmup_steps, is at lr: continuous.)
    const double from = static_cast<double>(std::max<int64_t>(o.warmup_steps, 1));
    return std::max(o.min_lr, o.lr * std::sqrt(from / (step + 1.0)));
  }
  // The decay's own start: after warm-up, or (wsd) where the cool-down begins.
  const int64_t from = o.decay == LrDecay::Wsd ? o.decay_steps - o.cooldown_steps : o.warmup_steps;
  if (step < static_cast<double>(from)) return o.lr;  // wsd's stable phase
  const double progress =
      (step - static_cast<double>(from)) / static_cast<double>(o.decay_steps - from);
  if (o.decay == LrDecay::Cosine) {
    return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
  }
  double fallen = progress;  // linear, and wsd's cool-down by its shape
  if (o.decay == LrDecay::Wsd && o.cooldown_shape == CooldownShape::Cosine) {
    fallen = 0.5 * (1.0 - std::cos(M_PI * progress));
  } else if (o.decay == LrDecay::Wsd && o.cooldown_shape == CooldownShape::OneMinusSqrt) {
    fallen = std::sqrt(progress);
  }
  return o.lr - (o.lr - o.min_lr) * fallen;
}

}  // namespace triad::optim
