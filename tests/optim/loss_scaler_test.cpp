#include "triad/optim/loss_scaler.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "support/expect_error.h"
#include "triad/core/error.h"
#include "triad/ops.h"
#include "triad/optim/clip.h"

namespace triad::optim {
namespace {

// Why the scaler exists: a gradient of 1e-8 is zero in fp16 (its smallest
// subnormal is 6e-8; anything below half of it rounds to 0), but survives when scaled by 2^16 first
// and unscaled in fp32 afterwards.
TEST(DynamicLossScaler, ScalingKeepsSmallFp16GradientsAlive) {
  Tensor g = from_vector(std::vector<float>{1e-8f, -2e-8f, 2e-9f}, {3});
  EXPECT_EQ(to_double_vector(cast(g, DType::F16)), (std::vector<double>{0, -0.0, 0}));
  DynamicLossScaler s;
  Tensor kept = cast(cast(scale(g, s.scale()), DType::F16), DType::F32);
  auto v = to_double_vector(scale(kept, s.inv_scale()));
  auto want = to_double_vector(g);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], want[i], 1e-3 * std::abs(want[i]));
}

TEST(DynamicLossScaler, BacksOffOnOverflowAndGrowsAfterCleanSteps) {
  LossScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  DynamicLossScaler s(o);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(false));  // third clean step in a row: grow
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_EQ(s.clean_streak(), 0);
  EXPECT_TRUE(s.update(false));
  EXPECT_FALSE(s.update(true));  // overflow: skip, back off, reset the streak
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.clean_streak(), 0);
  EXPECT_EQ(s.skipped_steps(), 1);
  for (int i = 0; i < 20; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 1.0);  // clamped at min_scale
  o.init_scale = o.max_scale;
  DynamicLossScaler top(o);
  for (int i = 0; i < 9; ++i) top.update(false);
  EXPECT_EQ(top.scale(), o.max_scale);  // clamped at max_scale
}

// Megatron-LM's --hysteresis: with 3, the first two overflows since the
// scale last grew keep it; from the third on, each overflow backs it off,
// clean steps in between or not, until a growth restores the allowance.
TEST(DynamicLossScaler, HysteresisSparesTheScaleFromRareOverflows) {
  LossScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  o.hysteresis = 3;
  DynamicLossScaler s(o);
  EXPECT_EQ(s.hysteresis_left(), 2);
  EXPECT_FALSE(s.update(true));  // skipped, but the scale stays
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.hysteresis_left(), 1);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));  // clean steps do not refill the allowance
  EXPECT_EQ(s.hysteresis_left(), 1);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.clean_streak(), 0);  // an absorbed overflow still ends the streak
  EXPECT_EQ(s.hysteresis_left(), 0);
  EXPECT_FALSE(s.update(true));  // the third: back off
  EXPECT_EQ(s.scale(), 512);
  EXPECT_FALSE(s.update(true));  // and every one after it
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.skipped_steps(), 4);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 512);  // grown: the allowance is whole again
  EXPECT_EQ(s.hysteresis_left(), 2);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 512);
  // The floor is min_scale whatever the hysteresis.
  o.min_scale = 256;
  o.hysteresis = 1;
  DynamicLossScaler floor(o);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(floor.update(true));
  EXPECT_EQ(floor.scale(), 256);
  o.hysteresis = 0;
  EXPECT_THROW(DynamicLossScaler{o}, ConfigError);
}

// Overflow detection is the global gradient norm: one Inf or NaN anywhere
// makes it non-finite.
TEST(DynamicLossScaler, NonFiniteGradientsAreSeenThroughTheGlobalNorm) {
  Tensor p = zeros({4});
  p.set_requires_grad(true);
  p.set_grad(from_vector(std::vector<float>{1, 2, std::numeric_limits<float>::infinity(), 0}, {4}));
  DynamicLossScaler s;
  const double before = s.scale();
  EXPECT_FALSE(s.update(!std::isfinite(global_grad_norm({p}))));
  EXPECT_EQ(s.scale(), before / 2);
  p.set_grad(from_vector(std::vector<float>{1, 2, 3, 0}, {4}));
  EXPECT_TRUE(s.update(!std::isfinite(global_grad_norm({p}))));
}

TEST(DynamicLossScaler, StateRoundTripsAndBadStateIsRejected) {
  LossScalerOptions o;
  o.growth_interval = 5;
  DynamicLossScaler a(o);
  a.update(true);
  a.update(false);
  a.update(false);
  DynamicLossScaler b(o);
  b.load_state(nlohmann::json::parse(a.state().dump()));
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.clean_streak(), 2);
  EXPECT_EQ(b.skipped_steps(), 1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.update(false), b.update(false));
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_THROW(b.load_state({{"scale", 8.0}}), IoError);
  EXPECT_THROW(b.load_state({{"scale", 0.5}, {"clean_streak", 0}, {"skipped_steps", 0}}), IoError);
  EXPECT_THROW(b.load_state({{"scale", 8.0}, {"clean_streak", 5}, {"skipped_steps", 0}}), IoError);
  // Counts are integers: 1.5 once read as 1, and 1e300 (found by fuzzing)
  // was undefined behaviour.
  triad::testing::expect_error(
      [&] {
        b.load_state({{"scale", 8.0}, {"clean_streak", 1.5}, {"skipped_steps", 0}});
      },
      {"loss scaler state: clean_streak is 1.5, expected an integer"});
  triad::testing::expect_error(
      [&] {
        b.load_state({{"scale", 8.0}, {"clean_streak", 1}, {"skipped_steps", 1e300}});
      },
      {"skipped_steps is 1e+300, expected an integer"});
  EXPECT_EQ(b.scale(), a.scale());  // a rejected state changes nothing
}

TEST(DynamicLossScaler, HysteresisStateRoundTripsAndOlderStatesStartWhole) {
  LossScalerOptions o;
  o.hysteresis = 4;
  DynamicLossScaler a(o);
  a.update(true);
  a.update(true);
  DynamicLossScaler b(o);
  b.load_state(nlohmann::json::parse(a.state().dump()));
  EXPECT_EQ(b.hysteresis_left(), 1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.update(true), b.update(true));
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.scale(), o.init_scale / 4);
  // A state written before hysteresis existed has the whole allowance.
  DynamicLossScaler c(o);
  c.load_state({{"scale", 8.0}, {"clean_streak", 0}, {"skipped_steps", 0}});
  EXPECT_EQ(c.hysteresis_left(), 3);
  // A resumed run with a smaller hysteresis keeps at most its own.
  LossScalerOptions small = o;
  small.hysteresis = 2;
  DynamicLossScaler d(small);
  d.load_state(DynamicLossScaler(o).state());
  EXPECT_EQ(d.hysteresis_left(), 1);
  EXPECT_THROW(
      d.load_state(
          {{"scale", 8.0}, {"clean_streak", 0}, {"skipped_steps", 0}, {"hysteresis_left", 0}}),
      IoError);
  EXPECT_THROW(
      d.load_state(
          {{"scale", 8.0}, {"clean_streak", 0}, {"skipped_steps", 0}, {"hysteresis_left", "two"}}),
      IoError);
  EXPECT_EQ(d.hysteresis_left(), 1);
}

TEST(DynamicLossScaler, OptionsAreValidated) {
  LossScalerOptions o;
  o.growth_factor = 1.0;
  EXPECT_THROW(DynamicLossScaler{o}, ConfigError);
  o = {};
  o.backoff_factor = 1.5;
  EXPECT_THROW(DynamicLossScaler{o}, ConfigError);
  o = {};
  o.growth_interval = 0;
  EXPECT_THROW(DynamicLossScaler{o}, ConfigError);
  o = {};
  o.init_scale = 1e9;
  try {
    DynamicLossScaler s(o);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("init_scale (1000000000)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace triad::optim
