#pragma once

#include <cstdint>

#include <nlohmann/json_fwd.hpp>

namespace triad::optim {

// Dynamic loss scaling for fp16 training (Micikevicius et al., 2018). The
// loss is multiplied by scale() before backward so that small gradients do
// not flush to zero in fp16; gradients are divided by it again before the
// optimizer. A step whose gradients hold an Inf or NaN (the global norm is
// not finite, which every rank agrees on after the norm's reduction) is
// skipped and the scale backs off; after `growth_interval` clean steps in a
// row the scale grows.
//
// `hysteresis` (Megatron-LM's --hysteresis; 1 is PyTorch's GradScaler): the
// scale backs off only at the hysteresis-th overflow since it last grew (or
// since the start), and then at every overflow until it grows again, which
// also restores the allowance. Skipped steps are skipped either way; what
// hysteresis spares is the scale, which a rare overflow would otherwise
// halve for the next growth_interval steps.
struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24: beyond it fp16 gradients overflow anyway
  int64_t hysteresis = 1;
};

class DynamicLossScaler {
 public:
  // Throws ConfigError naming the bad option (factors must move the scale
  // the right way, the interval must be positive, min <= init <= max).
  explicit DynamicLossScaler(const LossScalerOptions& options = {});

  double scale() const { return scale_; }
  double inv_scale() const { return 1.0 / scale_; }
  // Records one step's outcome; returns true when the optimizer step should
  // be applied (gradients were finite) and false when it must be skipped.
  bool update(bool found_non_finite);

  int64_t clean_streak() const { return streak_; }
  int64_t skipped_steps() const { return skipped_; }
  // Overflows still allowed before the scale backs off (0: the next one does).
  int64_t hysteresis_left() const { return hysteresis_left_ - 1; }

  // Saved in checkpoints so a resumed fp16 run continues with the same scale.
  nlohmann::json state() const;
  // Throws IoError naming the field when the state is malformed. A state
  // without `hysteresis_left` (written before it existed) starts with the
  // whole allowance; one above this scaler's hysteresis is cut to it.
  void load_state(const nlohmann::json& state);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t streak_ = 0;
  int64_t skipped_ = 0;
  int64_t hysteresis_left_;  // overflows until a back-off, this one included
};

}  // namespace triad::optim
