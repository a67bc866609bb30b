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
struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24: beyond it fp16 gradients overflow anyway
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

  // Saved in checkpoints so a resumed fp16 run continues with the same scale.
  nlohmann::json state() const;
  // Throws IoError naming the field when the state is malformed.
  void load_state(const nlohmann::json& state);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t streak_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace triad::optim
