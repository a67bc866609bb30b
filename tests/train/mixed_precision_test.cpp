// train.precision: bf16 and fp16 keep half parameters and activations with
// f32 masters, gradients and optimizer state; fp16 adds dynamic loss scaling
// whose state survives checkpoints.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "triad/data/token_shard.h"
#include "triad/io/checkpoint.h"
#include "triad/ops.h"
#include "triad/train/trainer.h"

namespace triad::train {
namespace {

using triad::testing::TempDir;

Config mp_config(const TempDir& dir, const std::string& precision, int64_t steps,
                 const std::string& extra = "") {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back(static_cast<uint16_t>((i * 7 + i / 13) % 31));
  data::write_token_shard(dir.file("train.bin"), tokens);
  return parse_config(
      "model: {n_layer: 2, n_head: 2, d_model: 32, vocab_size: 32, seq_len: 16}\n"
      "train: {steps: " +
      std::to_string(steps) +
      ", global_batch_size: 4, micro_batch_size: 2, lr: 1.0e-2, warmup_steps: 2, precision: " +
      precision + extra +
      "}\n"
      "data: {train: " +
      dir.file("train.bin") +
      "}\n"
      "output: {dir: " +
      dir.file("out_" + precision) + "}\n");
}

std::vector<StepMetrics> run_steps(Trainer& t, int64_t n) {
  std::vector<StepMetrics> m;
  for (int64_t k = 0; k < n; ++k) m.push_back(t.step(k));
  return m;
}

TEST(MixedPrecision, Bf16AndFp16TrackFp32Over20Steps) {
  TempDir dir;
  Trainer ref(mp_config(dir, "fp32", 20));
  const auto fp32 = run_steps(ref, 20);
  for (const std::string precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    Trainer t(mp_config(dir, precision, 20));
    const DType half = precision == "bf16" ? DType::BF16 : DType::F16;
    for (auto& [name, p] : t.full_state_dict()) ASSERT_EQ(p.dtype(), half) << name;
    const auto got = run_steps(t, 20);
    // Stated tolerance: every step's loss within 2% (bf16) / 1% (fp16) of
    // fp32's, and the same learning (the loss falls by the same amount).
    const double tol = precision == "bf16" ? 0.02 : 0.01;
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_FALSE(got[k].skipped) << "step " << k;
      EXPECT_NEAR(got[k].loss, fp32[k].loss, tol * fp32[k].loss) << "step " << k;
      EXPECT_NEAR(got[k].grad_norm, fp32[k].grad_norm, 0.1 * fp32[k].grad_norm) << "step " << k;
    }
    EXPECT_LT(got.back().loss, 0.7 * got.front().loss);
    if (precision == "fp16") {
      EXPECT_EQ(got.front().loss_scale, 65536.0);
      ASSERT_NE(t.loss_scaler(), nullptr);
    } else {
      EXPECT_EQ(t.loss_scaler(), nullptr);
    }
  }
}

// train.grad_precision bf16 (Megatron-LM's default without
// --accumulate-allreduce-grads-in-fp32): the bf16 parameters accumulate
// their gradients in bf16, which the run's peak memory shows, and the run
// tracks the one with f32 gradients closely, under AdamW and Muon. Other
// precisions refuse it by name.
TEST(MixedPrecision, Bf16GradientsTrackF32GradientsInHalfTheirMemory) {
  TempDir dir;
  // AdamW, and Muon (its update terms held in the bf16 gradients).
  for (const std::string optimizer : {"", ", optimizer: muon"}) {
    SCOPED_TRACE(optimizer);
    std::vector<StepMetrics> f32, got;
    int64_t params = 0;
    {  // (one trainer at a time: each one's peak memory its own)
      Trainer wide(mp_config(dir, "bf16", 20, optimizer));
      f32 = run_steps(wide, 20);
    }
    {
      Trainer narrow(mp_config(dir, "bf16", 20, ", grad_precision: bf16" + optimizer));
      got = run_steps(narrow, 20);
      for (auto& [name, p] : narrow.full_state_dict()) params += p.numel();
    }
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_FALSE(got[k].skipped) << "step " << k;
      EXPECT_NEAR(got[k].loss, f32[k].loss, 0.01 * f32[k].loss) << "step " << k;
      EXPECT_NEAR(got[k].grad_norm, f32[k].grad_norm, 0.05 * f32[k].grad_norm) << "step " << k;
    }
    EXPECT_NE(got.back().loss, f32.back().loss);
    EXPECT_LT(got.back().loss, 0.7 * got.front().loss);
    // The gradients in 2 bytes a parameter, not 4.
    EXPECT_LT(got.back().peak_memory_bytes, f32.back().peak_memory_bytes)
        << params << " parameters";
  }
  for (const auto& [precision, extra, message] :
       {std::tuple{"fp32", ", grad_precision: bf16",
                   "train.grad_precision 'bf16' needs train.precision 'bf16' (it is 'fp32')"},
        {"fp16", ", grad_precision: bf16",
         "train.grad_precision 'bf16' needs train.precision 'bf16' (it is 'fp16')"},
        {"bf16", ", grad_precision: fp16", "train.grad_precision 'fp16' must be fp32 or bf16"}}) {
    try {
      mp_config(dir, precision, 1, extra);
      FAIL() << precision << extra;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  const Config c = parse_config(to_yaml(mp_config(dir, "bf16", 1, ", grad_precision: bf16")));
  EXPECT_EQ(c.train.grad_dtype(), DType::BF16);
  EXPECT_EQ(mp_config(dir, "bf16", 1).train.grad_dtype(), DType::F32);
}

TEST(MixedPrecision, Fp16OverflowBacksOffAndSkipsWithoutStoppingTheRun) {
  TempDir dir;
  // A scale of 2^24 overflows fp16 logits gradients; the scaler halves it
  // each overflowing step until updates go through. max_skipped_steps (1)
  // counts failures, not overflows, so the run continues.
  Trainer t(mp_config(dir, "fp16", 12, ", loss_scale_init: 16777216, max_skipped_steps: 1"));
  const auto m = run_steps(t, 12);
  ASSERT_TRUE(m.front().skipped);
  EXPECT_EQ(m.front().loss_scale, 16777216.0);
  int skipped = 0;
  for (const auto& s : m) skipped += s.skipped;
  EXPECT_GE(skipped, 1);
  EXPECT_LT(skipped, 12);
  EXPECT_FALSE(m.back().skipped);
  EXPECT_LT(m.back().loss_scale, 16777216.0);
  EXPECT_EQ(t.loss_scaler()->skipped_steps(), skipped);
  // Skipped steps do not advance the learning-rate schedule.
  int first_applied = 0;
  while (m[first_applied].skipped) ++first_applied;
  EXPECT_EQ(m[first_applied].lr, m.front().lr);
}

// train.loss_scale_hysteresis: with 3, the first two overflowing steps keep
// the scale (and are skipped); the third halves it. train.loss_scale_min is
// the floor the scale backs off to; overflows there are failures.
TEST(MixedPrecision, Fp16HysteresisKeepsTheScaleThroughTheFirstOverflows) {
  TempDir dir;
  Trainer t(mp_config(dir, "fp16", 6, ", loss_scale_init: 16777216, loss_scale_hysteresis: 3"));
  const auto m = run_steps(t, 4);
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE(m[k].skipped) << "step " << k + 1;
    EXPECT_EQ(m[k].loss_scale, 16777216.0) << "step " << k + 1;
  }
  EXPECT_EQ(m[3].loss_scale, 8388608.0);
  EXPECT_EQ(t.loss_scaler()->skipped_steps(), 3 + (m[3].skipped ? 1 : 0));

  // At the floor an overflow cannot back off: it counts as a failed step,
  // and more than max_skipped_steps in a row stop the run.
  Trainer floor(mp_config(dir, "fp16", 12,
                          ", loss_scale_init: 16777216, loss_scale_min: 8388608, "
                          "max_skipped_steps: 2"));
  std::vector<StepMetrics> f;
  testing::expect_error(
      [&] {
        for (int64_t k = 0; k < 12; ++k) f.push_back(floor.step(k));
      },
      {"3 consecutive steps whose fp16 gradients overflow even at train.loss_scale_min "
       "(train.max_skipped_steps is 2)"});
  ASSERT_EQ(f.size(), 3u);  // the back-off, then two overflows at the floor
  EXPECT_EQ(f[0].loss_scale, 16777216.0);
  for (size_t k = 1; k < f.size(); ++k) EXPECT_EQ(f[k].loss_scale, 8388608.0);
  EXPECT_EQ(floor.loss_scaler()->scale(), 8388608.0);
}

TEST(MixedPrecision, ResumedFp16AndBf16RunsReproduceTheLossesBitwise) {
  for (const std::string precision : {"fp16", "bf16"}) {
    SCOPED_TRACE(precision);
    TempDir dir;
    const std::string ck = ", loss_scale_window: 2}\ncheckpoint: {dir: " + dir.file("ckpt") +
                           ", interval: 3, keep: 5, resume: auto";
    // The scale grows every 2 clean steps, so the resumed run must restore it.
    std::vector<StepMetrics> whole;
    {
      Trainer t(mp_config(dir, precision, 6, ck));
      whole = t.run();
    }
    std::filesystem::remove_all(dir.file("ckpt/step_6"));
    std::ofstream(dir.file("ckpt/latest"), std::ios::trunc) << "step_3\n";
    Trainer resumed(mp_config(dir, precision, 6, ck));
    const auto tail = resumed.run();
    ASSERT_EQ(tail.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(tail[k].loss, whole[3 + k].loss) << "step " << 4 + k;
      EXPECT_EQ(tail[k].loss_scale, whole[3 + k].loss_scale) << "step " << 4 + k;
    }
  }
}

// What a run of `precision` would have checkpointed with the f32 weights and
// optimizer state of `from`: the weights are the masters (the parameters in
// an fp32 checkpoint), half parameters are rounded from them, the AdamW
// moments and counters are copied, and an fp16 run gets the loss scaler a
// new run starts with (none when `scaler` is false).
void write_as(const io::CheckpointInfo& from, const std::string& dir, const Config& c,
              bool scaler = true) {
  const std::string& precision = c.train.precision;
  io::RankState st = io::read_rank_state(from, 0);
  std::map<std::string, Tensor> tensors;
  for (const auto& [key, t] : st.tensors) {
    if (key.rfind("adam_", 0) == 0) tensors[key] = t;
    if (key.rfind("param/", 0) != 0) continue;
    const std::string name = key.substr(6);
    auto master = st.tensors.find("master/" + name);
    const Tensor w = master != st.tensors.end() ? master->second : t;
    ASSERT_EQ(w.dtype(), DType::F32) << name;
    if (precision == "fp32") {
      tensors[key] = w;
    } else {
      tensors[key] = cast(w, c.train.param_dtype());
      tensors["master/" + name] = w;
    }
  }
  st.metadata.erase("loss_scaler");
  if (precision == "fp16" && scaler) {
    optim::LossScalerOptions so;
    so.init_scale = c.train.loss_scale_init;
    so.growth_interval = c.train.loss_scale_window;
    st.metadata["loss_scaler"] = optim::DynamicLossScaler(so).state().dump();
  }
  auto layout = from.layout;
  layout["precision"] = precision;
  io::write_rank_state(io::checkpoint_staging_dir(dir, from.step), 0, tensors, st.metadata);
  io::commit_checkpoint(dir, from.step, 1, layout, to_yaml(c), 5);
}

std::string checkpointing(const std::string& dir) {
  return ", loss_scale_window: 2}\ncheckpoint: {dir: " + dir +
         ", interval: 3, keep: 5, resume: auto";
}

// A checkpoint resumes under another precision from its f32 weights (the
// masters of a half-precision run) and its AdamW state: bitwise the run that
// resumes the same state written under its own precision.
TEST(MixedPrecision, ACheckpointResumesUnderAnotherPrecisionFromItsF32Weights) {
  const std::vector<std::pair<std::string, std::string>> changes{
      {"bf16", "fp32"}, {"bf16", "fp16"}, {"fp32", "bf16"}, {"fp16", "bf16"}, {"fp16", "fp32"}};
  for (const auto& [written, resumed] : changes) {
    SCOPED_TRACE(written + " -> " + resumed);
    TempDir dir;
    {
      Trainer t(mp_config(dir, written, 3, checkpointing(dir.file("ckpt"))));
      t.run();
    }
    const auto info = io::find_latest_checkpoint(dir.file("ckpt"));
    ASSERT_TRUE(info.has_value());
    ASSERT_EQ(info->layout.at("precision"), written);
    write_as(*info, dir.file("same"), mp_config(dir, resumed, 6, checkpointing(dir.file("same"))));
    Trainer changed(mp_config(dir, resumed, 6, checkpointing(dir.file("ckpt"))));
    const auto got = changed.run();
    Trainer same(mp_config(dir, resumed, 6, checkpointing(dir.file("same"))));
    const auto want = same.run();
    ASSERT_EQ(got.size(), 3u);
    ASSERT_EQ(want.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(got[k].step, 4 + static_cast<int64_t>(k));
      EXPECT_EQ(got[k].loss, want[k].loss) << "step " << got[k].step;
      EXPECT_EQ(got[k].grad_norm, want[k].grad_norm) << "step " << got[k].step;
      EXPECT_EQ(got[k].lr, want[k].lr) << "step " << got[k].step;
      EXPECT_EQ(got[k].loss_scale, want[k].loss_scale) << "step " << got[k].step;
    }
    for (auto& [name, p] : changed.full_state_dict())
      EXPECT_EQ(p.dtype(), mp_config(dir, resumed, 6).train.param_dtype()) << name;
    if (resumed == "fp16") {
      EXPECT_EQ(got.front().loss_scale, 65536.0);
    }
  }
}

// An fp16 checkpoint without its loss scale is damaged, not a precision
// change: resuming it in fp16 is an error that says so.
TEST(MixedPrecision, AnFp16CheckpointWithoutItsLossScaleIsRefused) {
  TempDir dir;
  {
    Trainer t(mp_config(dir, "fp16", 3, checkpointing(dir.file("ckpt"))));
    t.run();
  }
  const auto info = io::find_latest_checkpoint(dir.file("ckpt"));
  ASSERT_TRUE(info.has_value());
  write_as(*info, dir.file("damaged"), mp_config(dir, "fp16", 6), /*scaler=*/false);
  Trainer t(mp_config(dir, "fp16", 6, checkpointing(dir.file("damaged"))));
  try {
    t.run();
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("written by an fp16 run but holds no loss-scaler state"),
              std::string::npos)
        << e.what();
  }
}

TEST(MixedPrecision, ConfigNamesABadPrecision) {
  TempDir dir;
  try {
    mp_config(dir, "fp8", 1);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.precision 'fp8' must be one of fp32, bf16, fp16"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(mp_config(dir, "fp16", 1, ", loss_scale_init: 0.5"), ConfigError);
  EXPECT_THROW(mp_config(dir, "fp16", 1, ", loss_scale_window: 0"), ConfigError);
  EXPECT_THROW(mp_config(dir, "fp16", 1, ", loss_scale_hysteresis: 0"), ConfigError);
  EXPECT_THROW(mp_config(dir, "fp16", 1, ", loss_scale_min: 0"), ConfigError);
  testing::expect_error<ConfigError>(
      [&] { mp_config(dir, "fp16", 1, ", loss_scale_init: 1024, loss_scale_min: 2048"); },
      {"train.loss_scale_min (2048) must not exceed train.loss_scale_init (1024)"});
  const Config h = parse_config(
      to_yaml(mp_config(dir, "fp16", 1, ", loss_scale_hysteresis: 2, loss_scale_min: 128")));
  EXPECT_EQ(h.train.loss_scale_hysteresis, 2);
  EXPECT_EQ(h.train.loss_scale_min, 128.0);
  const Config c = mp_config(dir, "bf16", 1);
  EXPECT_EQ(c.train.param_dtype(), DType::BF16);
  EXPECT_NE(to_yaml(c).find("precision: bf16"), std::string::npos);
}

}  // namespace
}  // namespace triad::train
