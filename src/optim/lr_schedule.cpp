#include "triad/optim/lr_schedule.h"

#include <cmath>
#include <string>

#include "triad/core/error.h"

namespace triad::optim {

CosineSchedule::CosineSchedule(double lr, double min_lr, int64_t warmup_steps, int64_t total_steps)
    : lr_(lr), min_lr_(min_lr), warmup_(warmup_steps), total_(total_steps) {
  if (warmup_steps < 0)
    throw ValueError("warmup_steps (" + std::to_string(warmup_steps) + ") must be >= 0");
  if (min_lr > lr) {
    throw ValueError("min_lr (" + std::to_string(min_lr) + ") must not exceed lr (" +
                     std::to_string(lr) + ")");
  }
}

double CosineSchedule::at(int64_t step) const {
  if (step < warmup_) return lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  if (step >= total_ || total_ <= warmup_) return min_lr_;
  const double progress =
      static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
  return min_lr_ + 0.5 * (lr_ - min_lr_) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace triad::optim
