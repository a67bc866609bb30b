// Non-finite steps and settings the world cannot satisfy, in one process:
// a step whose loss or gradient norm is not finite is skipped (weights,
// optimizer state and learning-rate schedule untouched), more than
// train.max_skipped_steps of them in a row stop the run with an error.
#include <gtest/gtest.h>

#include "support/temp_dir.h"
#include "triad/data/token_shard.h"
#include "triad/ops.h"
#include "triad/train/trainer.h"

namespace triad::train {
namespace {

using triad::testing::TempDir;

Config nonfinite_config(const TempDir& dir, int64_t max_skipped) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back(static_cast<uint16_t>((i * 7 + i / 13) % 31));
  data::write_token_shard(dir.file("train.bin"), tokens);
  return parse_config(
      "model: {n_layer: 1, n_head: 2, d_model: 16, vocab_size: 32, seq_len: 16}\n"
      "train: {steps: 8, global_batch_size: 4, micro_batch_size: 2, lr: 1.0e-2, "
      "warmup_steps: 2, max_skipped_steps: " +
      std::to_string(max_skipped) + "}\ndata: {train: " + dir.file("train.bin") +
      "}\noutput: {dir: " + dir.file("out") + "}\n");
}

TEST(NonFiniteSteps, SkippedStepsChangeNothingAndTooManyInARowStop) {
  TempDir dir;
  Trainer clean(nonfinite_config(dir, 2));
  std::vector<StepMetrics> want;
  for (int64_t k = 0; k < 4; ++k) want.push_back(clean.step(k));

  // Steps 1 and 2 poisoned (two in a row, allowed): skipped, and the run
  // continues as if they had not been there: step 3 applies the update that
  // step 1 would have, at the learning rate step 1 would have had.
  Trainer t(nonfinite_config(dir, 2));
  t.inject_nan_at(1, 2);
  const StepMetrics first = t.step(0);
  EXPECT_EQ(first.loss, want[0].loss);
  auto weights = t.full_state_dict();
  std::map<std::string, std::vector<double>> before;
  for (auto& [name, p] : weights) before[name] = to_double_vector(p);
  for (int64_t k = 1; k <= 2; ++k) {
    const StepMetrics m = t.step(k);
    EXPECT_TRUE(m.skipped) << "step " << k;
    for (auto& [name, p] : t.full_state_dict())
      ASSERT_EQ(to_double_vector(p), before.at(name)) << name << " changed at step " << k;
  }
  const StepMetrics after = t.step(3);
  EXPECT_FALSE(after.skipped);
  EXPECT_EQ(after.lr, want[1].lr);  // the schedule did not advance while skipping

  // Three in a row with max_skipped_steps 2: the third stops the run, and
  // the error says why.
  Trainer stop(nonfinite_config(dir, 2));
  stop.inject_nan_at(0, 3);
  EXPECT_TRUE(stop.step(0).skipped);
  EXPECT_TRUE(stop.step(1).skipped);
  try {
    stop.step(2);
    FAIL() << "the third non-finite step in a row should stop the run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stopping: 3 consecutive steps with non-finite "
                                         "gradients (train.max_skipped_steps is 2)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Trainer, ZeroWithOneDataParallelRankIsAConfigError) {
  TempDir dir;
  Config c = nonfinite_config(dir, 2);
  c.parallel.zero = 1;
  try {
    Trainer t(c);
    FAIL() << "ZeRO-1 needs dp > 1";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.zero = 1 shards the optimizer over "
                                         "data-parallel ranks and needs dp > 1 (dp is 1)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace triad::train
