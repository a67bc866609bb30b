#pragma once

#include <cstdint>

namespace triad::optim {

// Linear warm-up from lr/warmup_steps to lr over warmup_steps, then cosine
// decay from lr to min_lr at total_steps (and min_lr after). warmup_steps 0
// with min_lr == lr gives a constant rate.
class CosineSchedule {
 public:
  CosineSchedule(double lr, double min_lr, int64_t warmup_steps, int64_t total_steps);
  // Learning rate for 0-based step `step`.
  double at(int64_t step) const;

 private:
  double lr_, min_lr_;
  int64_t warmup_, total_;
};

}  // namespace triad::optim
