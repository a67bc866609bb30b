#include <gtest/gtest.h>

#include <cmath>

#include "support/expect_error.h"
#include "triad/core/error.h"
#include "triad/optim/weight_decay_schedule.h"

namespace triad::optim {
namespace {

using testing::expect_error;

WeightDecaySchedule wd_schedule(WeightDecayShape shape, double start, double end, int64_t steps) {
  WeightDecayScheduleOptions o;
  o.shape = shape;
  o.start = start;
  o.end = end;
  o.steps = steps;
  return WeightDecaySchedule(o);
}

// Megatron-LM's get_wd, written out as it is there: the increment's
// coefficient over the fraction of its steps done.
double megatron_wd(const std::string& style, double start, double end, double step, double steps) {
  if (style == "constant" || step > steps) return end;
  const double ratio = step / steps;
  const double coeff = style == "linear" ? ratio : 0.5 * (std::cos(M_PI * (1 - ratio)) + 1.0);
  return start + coeff * (end - start);
}

TEST(WeightDecaySchedule, LinearAndCosineMoveFromStartToEndAsMegatronLmDoes) {
  for (const char* style : {"linear", "cosine"}) {
    const auto s = wd_schedule(weight_decay_shape_from_string(style), 0.01, 0.1, 100);
    EXPECT_TRUE(s.changes());
    EXPECT_NEAR(s.at(0), 0.01, 1e-15) << style;
    EXPECT_NEAR(s.at(50), 0.055, 1e-15) << style;  // half way either way
    EXPECT_NEAR(s.at(100), 0.1, 1e-15) << style;
    EXPECT_NEAR(s.at(250), 0.1, 1e-15) << style;  // it stays at the end
    for (double step : {1.0, 7.0, 25.0, 33.5, 71.25, 99.0}) {
      EXPECT_NEAR(s.at(step), megatron_wd(style, 0.01, 0.1, step, 100), 1e-15)
          << style << " step " << step;
    }
    for (int k = 1; k <= 100; ++k) EXPECT_GT(s.at(k), s.at(k - 1)) << style << " step " << k;
  }
  const auto linear = wd_schedule(WeightDecayShape::Linear, 0.01, 0.1, 100);
  const auto cosine = wd_schedule(WeightDecayShape::Cosine, 0.01, 0.1, 100);
  EXPECT_NEAR(linear.at(25), 0.0325, 1e-15);
  EXPECT_NEAR(cosine.at(25), 0.01 + 0.09 * (1 - std::cos(M_PI / 4)) / 2, 1e-15);
  EXPECT_LT(cosine.at(25), linear.at(25));  // the cosine starts slowly
  // Downwards too.
  const auto falling = wd_schedule(WeightDecayShape::Linear, 0.2, 0.0, 10);
  EXPECT_NEAR(falling.at(4), 0.12, 1e-15);
  EXPECT_EQ(falling.at(10), 0.0);
}

TEST(WeightDecaySchedule, ConstantIsTheEndValueThroughout) {
  const auto s = wd_schedule(WeightDecayShape::Constant, 0.5, 0.1, 0);
  EXPECT_FALSE(s.changes());
  for (double step : {0.0, 3.5, 1e6}) EXPECT_EQ(s.at(step), 0.1);
}

TEST(WeightDecaySchedule, ShapesByName) {
  for (auto shape :
       {WeightDecayShape::Constant, WeightDecayShape::Linear, WeightDecayShape::Cosine})
    EXPECT_EQ(weight_decay_shape_from_string(weight_decay_shape_name(shape)), shape);
  expect_error<ValueError>([] { weight_decay_shape_from_string("exponential"); },
                           {"'exponential'", "constant, linear or cosine"});
}

TEST(WeightDecaySchedule, RejectsBadOptions) {
  expect_error<ValueError>([] { wd_schedule(WeightDecayShape::Linear, -0.1, 0.1, 10); },
                           {"start", "-0.1", ">= 0"});
  expect_error<ValueError>([] { wd_schedule(WeightDecayShape::Constant, 0, NAN, 10); },
                           {"end", "nan", "finite"});
  expect_error<ValueError>([] { wd_schedule(WeightDecayShape::Cosine, 0, 0.1, 0); },
                           {"cosine", "steps >= 1", "got 0"});
}

}  // namespace
}  // namespace triad::optim
