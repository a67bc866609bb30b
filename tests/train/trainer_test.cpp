#include "triad/train/trainer.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "triad/backend/cuda.h"
#include "triad/data/fill_in_the_middle.h"
#include "triad/data/indexed_dataset.h"
#include "triad/data/last_word.h"
#include "triad/data/loss_mask.h"
#include "triad/data/multiple_choice.h"
#include "triad/data/token_dataset.h"
#include "triad/data/token_shard.h"
#include "triad/io/checkpoint.h"
#include "triad/io/gpt2_weights.h"
#include "triad/io/peft_adapter.h"
#include "triad/io/safetensors.h"
#include "triad/nn/evaluate.h"
#include "triad/nn/generate.h"
#include "triad/ops.h"

namespace triad::train {
namespace {

using triad::testing::TempDir;

Config small_config(const TempDir& dir, int64_t micro) {
  // A periodic stream a model can learn quickly.
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back(static_cast<uint16_t>((i * 7 + i / 13) % 31));
  data::write_token_shard(dir.file("train.bin"), tokens);
  const std::string yaml =
      "model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 32, seq_len: 16}\n"
      "train: {steps: 3, global_batch_size: 4, micro_batch_size: " +
      std::to_string(micro) +
      ", lr: 1.0e-2, warmup_steps: 1, weight_decay: 0.1, grad_clip: 1.0}\n"
      "data: {train: " +
      dir.file("train.bin") +
      "}\n"
      "output: {dir: " +
      dir.file("out") + "}\n";
  return parse_config(yaml);
}

TEST(Trainer, CudaDeviceWithoutAGpuIsAClearError) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  TempDir dir;
  Config c = small_config(dir, 2);
  c.device = "cuda";
  try {
    Trainer t(c);
    FAIL() << "expected NotSupportedError";
  } catch (const NotSupportedError& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("no CUDA device is visible") != std::string::npos ||
                msg.find("no CUDA backend") != std::string::npos)
        << msg;
  }
}

// train.spike_sigma: a batch unlike every one before it (a token the
// periodic stream never holds) is a spike. Its update is skipped
// (the weights stay as they were and the schedule does not advance), every
// other step goes as without the filter, and a run resumed from a
// checkpoint before the spike judges it the same: the window of losses and
// norms is in the checkpoint (an empty one would not judge it yet).
TEST(Trainer, SkipsASpikeAndResumesItsWindowFromCheckpoints) {
  TempDir dir;
  const int64_t spike = 11;  // the 0-based step whose batch is noise
  // Step `spike` reads tokens [64s, 64s + 65): there, token 31, which the
  // stream never holds.
  std::vector<uint16_t> tokens;
  for (int64_t i = 0; i < 4000; ++i) {
    const bool noise = i >= 64 * spike && i < 64 * (spike + 1);
    tokens.push_back(static_cast<uint16_t>(noise ? 31 : (i * 7 + i / 13) % 31));
  }
  data::write_token_shard(dir.file("train.bin"), tokens);
  auto config = [&](double sigma, int64_t interval, const std::string& resume) {
    return parse_config(
        "model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 32, seq_len: 16}\n"
        "train: {steps: 16, global_batch_size: 4, micro_batch_size: 2, lr: 1.0e-2, "
        "warmup_steps: 2, spike_window: 8, spike_sigma: " +
        std::to_string(sigma) +
        "}\n"
        "data: {train: " +
        dir.file("train.bin") + "}\noutput: {dir: " + dir.file("out") +
        "}\ncheckpoint: {dir: " + dir.file("ckpt") + ", interval: " + std::to_string(interval) +
        ", keep: 5, resume: " + resume + "}\n");
  };
  std::vector<StepMetrics> plain, filtered;
  {
    Trainer t(parse_config(to_yaml(config(0, 0, "never")), {"checkpoint.dir=''"}));
    for (int64_t k = 0; k < 16; ++k) plain.push_back(t.step(k));
  }
  // (Its gradient norm is about six times the steps' before it.)
  ASSERT_GT(plain[spike].grad_norm, 4 * plain[spike - 1].grad_norm) << "the noise is no spike";
  ASSERT_GT(plain[spike].loss, plain[spike - 1].loss);
  {
    Trainer t(parse_config(to_yaml(config(4, 0, "never")), {"checkpoint.dir=''"}));
    nn::StateDict before;
    for (int64_t k = 0; k < 16; ++k) {
      if (k == spike) before = t.full_state_dict();
      filtered.push_back(t.step(k));
      if (k == spike) {
        for (const auto& [name, w] : t.full_state_dict())
          EXPECT_EQ(to_double_vector(w), to_double_vector(before.at(name))) << name;
      }
    }
  }
  for (int64_t k = 0; k < 16; ++k) {
    SCOPED_TRACE("step " + std::to_string(k + 1));
    EXPECT_EQ(filtered[k].skipped, k == spike);
    EXPECT_EQ(filtered[k].spike, k == spike);
    // The same as without the filter up to the spike (its loss included).
    if (k <= spike) {
      EXPECT_EQ(filtered[k].loss, plain[k].loss);
    }
  }
  EXPECT_FALSE(plain[spike].skipped);
  EXPECT_EQ(filtered[spike + 1].lr, filtered[spike].lr);  // the schedule waited
  EXPECT_NE(plain[spike + 1].lr, plain[spike].lr);
  // Checkpoints at steps 4, 8, 12 and 16; resumed after step 8 (three steps
  // before the spike), the run goes on bit for bit and still skips it.
  std::vector<StepMetrics> whole;
  {
    Trainer t(config(4, 4, "never"));
    whole = t.run();
  }
  ASSERT_EQ(whole.size(), 16u);
  EXPECT_EQ(whole[spike].loss, filtered[spike].loss);
  EXPECT_TRUE(whole[spike].spike);
  std::ofstream(dir.file("ckpt/latest"), std::ios::trunc) << "step_8\n";
  Trainer again(config(4, 0, "auto"));
  const auto rest = again.run();
  ASSERT_EQ(rest.size(), 8u);
  for (size_t i = 0; i < rest.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(rest[i].step));
    EXPECT_EQ(rest[i].loss, whole[8 + i].loss);  // bitwise
    EXPECT_EQ(rest[i].grad_norm, whole[8 + i].grad_norm);
    EXPECT_EQ(rest[i].spike, whole[8 + i].spike);
  }
  // The spike in metrics.jsonl.
  std::ifstream in(dir.file("out/metrics.jsonl"));
  int spikes = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("spike", false)) {
      EXPECT_EQ(j.at("step").get<int64_t>(), spike + 1);
      EXPECT_TRUE(j.at("skipped").get<bool>());
      ++spikes;
    }
  }
  EXPECT_EQ(spikes, 1);
}

// triad-train --check: the step a run would take first — the first one, or
// the one after the checkpoint it would resume — taken as run() takes it,
// with nothing written: no output.dir, no checkpoint.
TEST(Trainer, CheckTakesTheRunsFirstStepAndWritesNothing) {
  TempDir dir;
  Config c = small_config(dir, 2);
  double first_loss = 0;
  {
    Trainer t(c);
    first_loss = t.step(0).loss;
  }
  {
    Trainer t(c);
    const StepMetrics m = t.check();
    EXPECT_EQ(m.step, 1);
    EXPECT_EQ(m.loss, first_loss);
    EXPECT_GT(m.peak_memory_bytes, 0);
    ASSERT_TRUE(m.rank_peak_memory.has_value());  // (every rank's, for a mesh)
    EXPECT_EQ(m.rank_peak_memory->max_bytes, m.peak_memory_bytes);
  }
  EXPECT_FALSE(std::filesystem::exists(c.output_dir));
  // With checkpoints: the step after the newest one, and no checkpoint more.
  Config ckpt = parse_config(to_yaml(c), {"checkpoint.dir=" + dir.file("ckpt"),
                                          "checkpoint.interval=2", "checkpoint.resume=auto"});
  std::vector<StepMetrics> whole;
  {
    Trainer t(ckpt);
    whole = t.run();  // steps 1-3, checkpoints after 2 and 3
  }
  std::ofstream(dir.file("ckpt/latest"), std::ios::trunc) << "step_2\n";
  std::filesystem::remove_all(dir.file("ckpt/step_3"));
  std::filesystem::remove_all(c.output_dir);
  Trainer again(ckpt);
  const StepMetrics m = again.check();
  EXPECT_EQ(m.step, 3);
  EXPECT_EQ(m.loss, whole[2].loss);  // bitwise
  EXPECT_FALSE(std::filesystem::exists(dir.file("ckpt/step_3")));
  EXPECT_FALSE(std::filesystem::exists(c.output_dir));
}

TEST(SpikeFilter, JudgesAgainstTheWindowOnceHalfOfItIsKnown) {
  SpikeFilter off;
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.spike(1e9, 1e9), "");
  SpikeFilter f(2.0, 6);
  // Judged from the fourth step on (half the window is three).
  f.record(1.0, 10.0);
  f.record(1.2, 11.0);
  EXPECT_EQ(f.spike(100.0, 10.0), "") << "two steps are not half the window";
  f.record(1.1, 12.0);
  // Losses 1, 1.2, 1.1: mean 1.1, std 0.1; norms 10, 11, 12: mean 11, std 1.
  EXPECT_EQ(f.spike(1.29, 12.9), "");
  EXPECT_NE(f.spike(1.31, 11.0).find("loss 1.31 > 1.1 + 2 x 0.1"), std::string::npos)
      << f.spike(1.31, 11.0);
  EXPECT_NE(f.spike(1.0, 13.1).find("gradient norm 13.1 > 11 + 2 x 1"), std::string::npos)
      << f.spike(1.0, 13.1);
  EXPECT_EQ(f.spike(std::nan(""), 13.1), "") << "non-finite steps are the other rule's";
  // Non-finite values never join; the window keeps the last six.
  f.record(std::nan(""), 1.0);
  EXPECT_EQ(f.known(), 3);
  for (int i = 0; i < 10; ++i) f.record(5.0 + i, 1.0);
  EXPECT_EQ(f.known(), 6);
  // Its state round-trips exactly, and bad text is named.
  SpikeFilter g(2.0, 6);
  g.load(f.state());
  EXPECT_EQ(g.state(), f.state());
  EXPECT_EQ(g.spike(20.0, 1.0), f.spike(20.0, 1.0));
  EXPECT_THROW(g.load("{\"losses\": [1, 2]}"), IoError);
  EXPECT_THROW(g.load("{\"losses\": [1, 2], \"grad_norms\": [1]}"), IoError);
  EXPECT_THROW(SpikeFilter(0.0, 8), ConfigError);
  EXPECT_THROW(SpikeFilter(3.0, 1), ConfigError);
}

TEST(Trainer, GradientAccumulationEqualsOneLargeBatch) {
  TempDir dir;
  std::vector<std::vector<StepMetrics>> runs;
  std::vector<nn::StateDict> finals;
  for (int64_t micro : {4, 2, 1}) {
    Trainer t(small_config(dir, micro));
    std::vector<StepMetrics> m;
    for (int k = 0; k < 3; ++k) m.push_back(t.step(k));
    runs.push_back(m);
    finals.push_back(t.full_state_dict());
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_NEAR(runs[r][k].loss, runs[0][k].loss, 1e-5 * std::abs(runs[0][k].loss))
          << "run " << r << " step " << k;
      EXPECT_NEAR(runs[r][k].grad_norm, runs[0][k].grad_norm, 1e-4 * runs[0][k].grad_norm);
    }
    for (auto& [name, t] : finals[0]) {
      auto a = to_double_vector(t), b = to_double_vector(finals[r].at(name));
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_NEAR(a[i], b[i], 2e-5) << name << "[" << i << "]";
    }
  }
}

// data.eod_token with reset_attention_mask, reset_position_ids and
// eod_mask_loss: the first step's loss is the model's loss over its packed
// documents with the token after each end left out, from the same weights.
TEST(Trainer, TrainsOnPackedDocumentsWithTheEndTokenLossMask) {
  TempDir dir;
  Config c = small_config(dir, 4);
  auto packed =
      parse_config(to_yaml(c), {"data.eod_token=3", "data.reset_attention_mask=true",
                                "data.reset_position_ids=true", "data.eod_mask_loss=true"});
  Trainer t(packed);
  nn::Gpt ref(packed.model, 0);
  ref.load_state_dict(t.full_state_dict());
  std::vector<int64_t> in, target;
  int64_t ends = 0;
  for (int64_t i = 0; i < 4 * 16; ++i) {
    const int64_t q = i / 16, j = i % 16;  // sequence q is tokens [16q, 16q + 17)
    auto token = [](int64_t k) { return (k * 7 + k / 13) % 31; };
    in.push_back(token(16 * q + j));
    target.push_back(token(16 * q + j + 1));
    ends += in.back() == 3;
  }
  ASSERT_GT(ends, 1) << "the stream should hold end tokens";
  const data::Batch b =
      data::mask_loss_after_eod({from_vector(in, {4, 16}), from_vector(target, {4, 16})}, 3);
  const double want = item(ref.loss(b.inputs, b.targets));
  EXPECT_NEAR(t.step(0).loss, want, 1e-6 * want);
  // Without the settings the same weights score the same tokens otherwise.
  nn::GptConfig plain = packed.model;
  plain.reset_attention_mask = plain.reset_position_ids = false;
  nn::Gpt unpacked(plain, 0);
  unpacked.load_state_dict(ref.state_dict());
  EXPECT_GT(
      std::abs(item(unpacked.loss(from_vector(in, {4, 16}), from_vector(target, {4, 16}))) - want),
      1e-4);
}

// Supervised fine-tuning data: a loss mask beside the tokens (what
// triad-tokenize --prompt-key writes) leaves its cleared tokens out of the
// loss. The first step's loss is the model's loss over the same batch with
// those targets ignored by hand, from the same weights, and differs from
// the loss over every target.
TEST(Trainer, FineTunesOnTheTokensItsLossMaskScores) {
  TempDir dir;
  auto token = [](int64_t k) { return (k * 7 + k / 13) % 31; };
  auto scored = [](int64_t k) { return (k / 5) % 3 != 0; };  // runs of 5 unscored, 10 scored
  std::vector<std::vector<int64_t>> docs(40);
  std::vector<uint8_t> keep;
  for (int64_t k = 0; k < 4000; ++k) {
    docs[static_cast<size_t>(k / 100)].push_back(token(k));
    keep.push_back(scored(k));
  }
  data::write_indexed_dataset(dir.file("sft"), docs, data::IndexedDType::U16);
  data::write_loss_mask(data::loss_mask_path(dir.file("sft")), keep);
  const Config c = parse_config(to_yaml(small_config(dir, 2)),
                                {"data.train=" + dir.file("sft"), "train.loss_average=tokens"});
  Trainer t(c);
  nn::Gpt ref(c.model, 0);
  ref.load_state_dict(t.full_state_dict());
  std::vector<int64_t> in, target, masked;
  for (int64_t i = 0; i < 4 * 16; ++i) {
    const int64_t k = 16 * (i / 16) + i % 16;  // sequence q is tokens [16q, 16q + 17)
    in.push_back(token(k));
    target.push_back(token(k + 1));
    masked.push_back(scored(k + 1) ? token(k + 1) : -100);
  }
  const double want = item(ref.loss(from_vector(in, {4, 16}), from_vector(masked, {4, 16})));
  const double every = item(ref.loss(from_vector(in, {4, 16}), from_vector(target, {4, 16})));
  EXPECT_NEAR(t.step(0).loss, want, 1e-6 * want);
  // Far apart next to that tolerance, even from untrained weights.
  EXPECT_GT(std::abs(every - want), 1e-4);
}

// data.fim_rate: the first step trains on its sequences rearranged as
// data::fill_in_the_middle rearranges global sequences 0..3 (each row one
// document: no end token), and that is not the loss of the rows as they
// were; data with a loss mask is refused by name.
TEST(Trainer, FillInTheMiddleTrainsOnTheRearrangedSequences) {
  TempDir dir;
  const Config c = parse_config(to_yaml(small_config(dir, 2)),
                                {"model.vocab_size=40", "data.fim_rate=1", "data.fim_spm_rate=0.5",
                                 "data.fim_tokens=[33, 34, 35]"});
  Trainer t(c);
  nn::Gpt ref(c.model, 0);
  ref.load_state_dict(t.full_state_dict());
  const data::FimOptions o = c.fim_options();
  ASSERT_EQ(o.rate, 1.0);
  ASSERT_EQ(o.suffix_token, 35);
  auto token = [](int64_t k) { return (k * 7 + k / 13) % 31; };
  double want = 0, plain = 0;
  for (int64_t micro = 0; micro < 2; ++micro) {
    std::vector<int64_t> in, target, in0, target0;
    for (int64_t q = 2 * micro; q < 2 * micro + 2; ++q) {
      std::vector<int64_t> row;
      for (int64_t k = 16 * q; k < 16 * q + 17; ++k) row.push_back(token(k));
      in0.insert(in0.end(), row.begin(), row.end() - 1);
      target0.insert(target0.end(), row.begin() + 1, row.end());
      data::fill_in_the_middle(row.data(), 17, q, o);
      in.insert(in.end(), row.begin(), row.end() - 1);
      target.insert(target.end(), row.begin() + 1, row.end());
    }
    want += item(ref.loss(from_vector(in, {2, 16}), from_vector(target, {2, 16}))) / 2;
    plain += item(ref.loss(from_vector(in0, {2, 16}), from_vector(target0, {2, 16}))) / 2;
  }
  EXPECT_NEAR(t.step(0).loss, want, 1e-6 * want);
  EXPECT_GT(std::abs(plain - want), 1e-4);
  // A fine-tuning set's loss mask: refused before training.
  std::vector<std::vector<int64_t>> docs(40);
  for (int64_t k = 0; k < 4000; ++k) docs[static_cast<size_t>(k / 100)].push_back(token(k));
  data::write_indexed_dataset(dir.file("sft"), docs, data::IndexedDType::U16);
  data::write_loss_mask(data::loss_mask_path(dir.file("sft")), std::vector<uint8_t>(4000, 1));
  try {
    Trainer masked(parse_config(to_yaml(c), {"data.train=" + dir.file("sft")}));
    FAIL() << "fill-in-the-middle took data with a loss mask";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("has a loss mask"), std::string::npos) << e.what();
  }
}

// train.epochs: two passes over the 249 sequences of the data take 125
// steps of 4, and the run is exactly the run given those steps.
TEST(Trainer, EpochsRunTheStepsThatPassOverTheDataThatOften) {
  TempDir dir;
  std::string yaml = to_yaml(small_config(dir, 2));
  const size_t at = yaml.find("steps: 3");
  ASSERT_NE(at, std::string::npos) << yaml;
  yaml.replace(at, 8, "epochs: 2");
  Trainer by_epochs(parse_config(yaml, {"train.lr_decay=wsd"}));
  EXPECT_EQ(by_epochs.config().train.steps, 125);
  Trainer by_steps(
      parse_config(to_yaml(small_config(dir, 2)), {"train.steps=125", "train.lr_decay=wsd"}));
  const auto a = by_epochs.run(), b = by_steps.run();
  ASSERT_EQ(a.size(), 125u);
  ASSERT_EQ(b.size(), 125u);
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].lr, b[k].lr) << "step " << k;
    EXPECT_EQ(a[k].loss, b[k].loss) << "step " << k;
  }
  EXPECT_LT(a.back().lr, a[100].lr) << "the schedule decays over the resolved steps";
}

// train.loss_average: tokens. With the end token's loss mask the
// microbatches hold different numbers of targets; the per-token loss is the
// mean over all of them, so splitting the batch into microbatches changes
// neither the losses nor the updates (the mean of microbatch means does),
// in training and in evaluation.
TEST(Trainer, PerTokenLossIsTheMeanOverEveryUnmaskedTargetOfTheStep) {
  TempDir dir;
  auto config = [&](int64_t micro, const std::string& average) {
    return parse_config(
        to_yaml(small_config(dir, micro)),
        {"data.eod_token=3", "data.eod_mask_loss=true", "train.loss_average=" + average,
         "data.val=" + dir.file("train.bin"), "eval.batches=2"});
  };
  std::vector<std::vector<StepMetrics>> runs;
  std::vector<double> evals;
  std::vector<nn::StateDict> finals;
  for (const auto& [micro, average] : std::vector<std::pair<int64_t, std::string>>{
           {4, "tokens"}, {1, "tokens"}, {2, "tokens"}, {1, "microbatches"}}) {
    Trainer t(config(micro, average));
    std::vector<StepMetrics> m;
    for (int k = 0; k < 3; ++k) m.push_back(t.step(k));
    runs.push_back(m);
    evals.push_back(t.evaluate());
    finals.push_back(t.full_state_dict());
  }
  // One microbatch of 4 (its mean is the mean over every target) against
  // four of 1 and two of 2, per token.
  for (size_t r = 1; r < 3; ++r) {
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_NEAR(runs[r][k].loss, runs[0][k].loss, 1e-6 * runs[0][k].loss) << r << " " << k;
      EXPECT_NEAR(runs[r][k].grad_norm, runs[0][k].grad_norm, 1e-5 * runs[0][k].grad_norm);
    }
    EXPECT_NEAR(evals[r], evals[0], 1e-6 * evals[0]);
    for (auto& [name, w] : finals[0]) {
      auto a = to_double_vector(w), b = to_double_vector(finals[r].at(name));
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_NEAR(a[i], b[i], 2e-5) << name << "[" << i << "]";
    }
  }
  // The mean of four microbatch means weighs their tokens unequally (by far
  // more than the float rounding above).
  EXPECT_GT(std::abs(runs[3][0].loss - runs[0][0].loss), 1e-5 * runs[0][0].loss);
  EXPECT_GT(std::abs(evals[3] - evals[0]), 1e-5 * evals[0]);
}

// train.freeze: frozen parameters keep their starting values through the
// step, weight decay and all; the others take exactly the step they take
// when nothing is frozen (without clipping, whose global norm sees only the
// trained gradients, a parameter's first AdamW step depends on its own
// gradient alone, and freezing others changes no gradient). The optimizer
// keeps state for the trained parameters only.
TEST(Trainer, FrozenParametersStayPutAndTheOthersStepAsUnfrozen) {
  TempDir dir;
  Config c = small_config(dir, 2);
  c.train.grad_clip = 0;
  c.train.warmup_steps = 0;
  // (Values copied out: one process's state dict shares the live weights.)
  auto values = [](const nn::StateDict& state) {
    std::map<std::string, std::vector<double>> out;
    for (const auto& [name, t] : state) out[name] = to_double_vector(t);
    return out;
  };
  Trainer whole(c);
  const auto start = values(whole.full_state_dict());
  whole.step(0);
  const auto stepped = values(whole.full_state_dict());
  // The whole first block, the token embedding (tied: the head too) and
  // one weight of the last block; its bias and every norm still train.
  c.train.freeze = {"wte.weight", "h.[0-0].*", "h.1.mlp.c_fc.weight"};
  const std::set<std::string> frozen = c.frozen_parameters();
  Trainer part(c);
  int64_t trained = 0;
  for (const auto& [name, v] : start) {
    if (!frozen.count(name)) trained += static_cast<int64_t>(v.size());
  }
  EXPECT_EQ(part.optimizer_state_elements(), trained);
  part.step(0);
  const auto after = values(part.full_state_dict());
  size_t moved = 0;
  for (const auto& [name, got] : after) {
    if (frozen.count(name)) {
      EXPECT_EQ(got, start.at(name)) << name << " moved";
      continue;
    }
    const auto& want = stepped.at(name);
    const auto& before = start.at(name);
    bool changed = false;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-6) << name << "[" << i << "]";
      changed = changed || got[i] != before[i];
    }
    moved += changed;
  }
  EXPECT_EQ(moved, after.size() - frozen.size());
}

// log.param_norm: after the step's update, the L2 norm of the weights the
// step trains (a frozen tensor left out), and nothing without it.
TEST(Trainer, ParamNormIsTheNormOfTheTrainedWeightsAfterTheUpdate) {
  TempDir dir;
  Config c = small_config(dir, 2);
  auto norm_of = [](const nn::StateDict& state, const std::set<std::string>& skip) {
    double sq = 0;
    for (const auto& [name, t] : state) {
      if (skip.count(name)) continue;
      for (double v : to_double_vector(t)) sq += v * v;
    }
    return std::sqrt(sq);
  };
  {
    Trainer plain(c);
    EXPECT_LT(plain.step(0).param_norm, 0);
  }
  c.log_param_norm = true;
  Trainer whole(c);
  const double before = norm_of(whole.full_state_dict(), {});
  const StepMetrics m = whole.step(0);
  const double after = norm_of(whole.full_state_dict(), {});
  // (The backend sums f32 squares in f32 blocks: within 1e-7.)
  EXPECT_NEAR(m.param_norm, after, 1e-7 * after);
  EXPECT_GT(std::abs(after - before), 1e-5 * after);  // the update moved it
  c.train.freeze = {"wte.weight"};
  Trainer part(c);
  const StepMetrics frozen = part.step(0);
  EXPECT_NEAR(frozen.param_norm, norm_of(part.full_state_dict(), {"wte.weight"}), 1e-7 * after);
}

// Each log.interval step (and the last) has each rank's time by category,
// ms per step since the last such step: one rank's forward, backward and
// optimizer add up to its compute, which (on the CPU, which does the work
// as it is asked) is most of the step and no more than all of it.
TEST(Trainer, RankTimingAtLogIntervalStepsSumsThePassesAndTheOptimizer) {
  TempDir dir;
  Config c = small_config(dir, 1);
  c.train.steps = 5;
  c.log_interval = 2;
  Trainer t(c);
  const std::vector<StepMetrics> steps = t.run();
  ASSERT_EQ(steps.size(), 5u);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(steps[k].rank_timing.empty(), k == 0 || k == 2) << "step " << k + 1;
    EXPECT_EQ(steps[k].rank_peak_memory.has_value(), k != 0 && k != 2) << "step " << k + 1;
    // Seconds since the run began (metrics.jsonl's elapsed_s): each step's
    // period, from the line before it to its own, holds the step's call.
    const double before = k == 0 ? 0.0 : steps[k - 1].elapsed_s;
    EXPECT_GE(steps[k].elapsed_s - before, steps[k].step_ms / 1e3) << "step " << k + 1;
  }
  EXPECT_LT(steps[4].elapsed_s, 60.0);  // (seconds, not milliseconds)
  EXPECT_LT(t.step(5).elapsed_s, 0.0);  // (a step taken alone is not timed)
  // Steps 1-2, 3-4, and 5 alone (the last).
  for (auto [k, from] : {std::pair<size_t, size_t>{1, 0}, {3, 2}, {4, 4}}) {
    std::map<std::string, StepMetrics::RankTiming> by;
    for (const auto& r : steps[k].rank_timing) by[r.category] = r;
    ASSERT_EQ(by.size(), 7u);
    for (const char* zero : {"weight-grad", "p2p", "dp"})
      EXPECT_EQ(by.at(zero).max_ms, 0.0) << zero;  // (no pipeline, no data parallelism)
    const double compute = by.at("compute").mean_ms;
    EXPECT_DOUBLE_EQ(
        compute, by.at("forward").mean_ms + by.at("backward").mean_ms + by.at("optimizer").mean_ms);
    EXPECT_GT(by.at("optimizer").mean_ms, 0.0);
    double step_ms = 0;
    for (size_t i = from; i <= k; ++i)
      step_ms += steps[i].step_ms / static_cast<double>(k + 1 - from);
    EXPECT_GT(compute, 0.5 * step_ms) << "step " << k + 1;
    EXPECT_LE(compute, step_ms) << "step " << k + 1;
    // The rank's peak memory over the same steps: the largest step's.
    ASSERT_TRUE(steps[k].rank_peak_memory.has_value());
    int64_t peak = 0;
    for (size_t i = from; i <= k; ++i) peak = std::max(peak, steps[i].peak_memory_bytes);
    EXPECT_EQ(steps[k].rank_peak_memory->max_bytes, peak);
    EXPECT_EQ(steps[k].rank_peak_memory->min_bytes, peak);  // (one rank)
    EXPECT_EQ(steps[k].rank_peak_memory->largest_rank, 0);
  }
}

// train.skip_steps: a step it names passes its batch over: the weights and
// the schedule stay, and the next step trains as a run that never read
// that batch trains (bit for bit: step(0), then step(2) directly). The
// metrics line says so and has no loss.
TEST(Trainer, SkipStepsPassTheirBatchesOverAndTrainOnAfter) {
  TempDir dir;
  Config c = small_config(dir, 2);
  std::vector<StepMetrics> direct;
  nn::StateDict direct_weights;
  {
    Trainer t(c);
    direct.push_back(t.step(0));
    direct.push_back(t.step(2));
    for (const auto& [name, w] : t.full_state_dict()) direct_weights[name] = clone(w);
  }
  c.train.skip_steps = {{2, 2}};
  Trainer t(c);
  const std::vector<StepMetrics> run = t.run();
  ASSERT_EQ(run.size(), 3u);
  EXPECT_FALSE(run[0].skipped);
  EXPECT_TRUE(run[1].skipped && run[1].passed_over);
  EXPECT_EQ(run[1].consumed_sequences, 8);  // (its 4 sequences gone by)
  EXPECT_EQ(run[1].lr, run[2].lr);          // the schedule waited
  EXPECT_EQ(run[0].loss, direct[0].loss);
  EXPECT_EQ(run[2].loss, direct[1].loss);
  EXPECT_EQ(run[2].grad_norm, direct[1].grad_norm);
  for (const auto& [name, w] : t.full_state_dict())
    EXPECT_EQ(to_double_vector(w), to_double_vector(direct_weights.at(name))) << name;
  std::ifstream in(dir.file("out/metrics.jsonl"));
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_TRUE(lines[1].value("passed_over", false));
  EXPECT_TRUE(lines[1].value("skipped", false));
  EXPECT_FALSE(lines[1].contains("loss"));
  EXPECT_EQ(lines[1]["consumed_sequences"], 8);
  EXPECT_TRUE(lines[2].contains("loss"));
  EXPECT_FALSE(lines[2].contains("passed_over"));
}

// checkpoint.keep_best: with a checkpoint and an evaluation every step and
// only the newest kept, the checkpoint of the lowest validation loss stays
// beside it, the `best` marker names it, and it holds that step's loss.
TEST(Trainer, KeepBestKeepsTheCheckpointOfTheLowestValidationLoss) {
  TempDir dir;
  Config c = small_config(dir, 2);
  c.train.steps = 6;
  c.train.lr = 0.05;  // (a rate that overshoots: the loss does not just fall)
  c = parse_config(
      to_yaml(c), {"data.val=" + dir.file("train.bin"), "eval.interval=1", "eval.batches=1",
                   "checkpoint.dir=" + dir.file("ck"), "checkpoint.interval=1", "checkpoint.keep=1",
                   "checkpoint.keep_best=true"});
  Trainer t(c);
  const std::vector<StepMetrics> run = t.run();
  ASSERT_EQ(run.size(), 6u);
  size_t lowest = 0;
  for (size_t k = 0; k < run.size(); ++k) {
    ASSERT_TRUE(run[k].val_loss);
    if (*run[k].val_loss < *run[lowest].val_loss) lowest = k;
  }
  const io::CheckpointInfo best = io::open_checkpoint(dir.file("ck/best"));
  EXPECT_EQ(best.step, run[lowest].step);
  EXPECT_EQ(best.val_loss, run[lowest].val_loss);
  std::vector<int64_t> kept{6};
  if (run[lowest].step != 6) kept.push_back(run[lowest].step);
  EXPECT_EQ(io::checkpoint_steps(dir.file("ck")), kept);
  // Written in the background, the checkpoints carry their losses to the
  // commit all the same.
  c = parse_config(to_yaml(c), {"checkpoint.async=true", "checkpoint.dir=" + dir.file("ck2")});
  Trainer background(c);
  background.run();
  EXPECT_EQ(io::open_checkpoint(dir.file("ck2/best")).step, run[lowest].step);
  EXPECT_EQ(io::checkpoint_steps(dir.file("ck2")), kept);
}

// eval.early_stop_patience: with every fall of the validation loss under
// early_stop_delta (100: all of them), the first evaluation sets the best
// and the run ends after `patience` more, checkpointed, its model written.
// A resume from a checkpoint in between counts on from where it stopped.
TEST(Trainer, EarlyStoppingEndsTheRunWhenTheValidationLossStalls) {
  TempDir dir;
  Config c = small_config(dir, 2);
  c.train.steps = 10;
  c = parse_config(to_yaml(c), {"data.val=" + dir.file("train.bin"), "eval.interval=1",
                                "eval.batches=1", "eval.early_stop_patience=2",
                                "eval.early_stop_delta=100", "checkpoint.dir=" + dir.file("ck"),
                                "checkpoint.interval=1", "checkpoint.keep=10"});
  std::vector<StepMetrics> run;
  {
    Trainer t(c);
    run = t.run();
  }
  ASSERT_EQ(run.size(), 3u);
  EXPECT_TRUE(std::filesystem::exists(dir.file("out/model.safetensors")));
  EXPECT_EQ(io::find_latest_checkpoint(dir.file("ck"))->step, 3);
  // From step 2's checkpoint (one stale evaluation counted): one more.
  std::ofstream(dir.file("ck/latest"), std::ios::trunc) << "step_2\n";
  c.checkpoint.resume = "auto";
  Trainer resumed(c);
  const std::vector<StepMetrics> rest = resumed.run();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].step, 3);
  EXPECT_EQ(rest[0].val_loss, run[2].val_loss);
  // Without the delta the loss keeps falling on this data: no early end.
  c = parse_config(to_yaml(c), {"eval.early_stop_delta=0", "checkpoint.resume=never",
                                "checkpoint.dir=" + dir.file("ck2")});
  Trainer falling(c);
  EXPECT_EQ(falling.run().size(), 10u);
}

// eval.at_start: the starting weights' validation loss as step 0 (the
// loss evaluate() gives before any step), a metrics line of its own without
// training's fields; early stopping counts from it.
TEST(Trainer, EvaluationAtTheStartIsStepZero) {
  TempDir dir;
  Config c = small_config(dir, 2);
  c = parse_config(to_yaml(c), {"data.val=" + dir.file("train.bin"), "eval.batches=1",
                                "eval.interval=1", "eval.at_start=true"});
  double before = 0;
  {
    Trainer fresh(c);
    before = fresh.evaluate();
  }
  {
    Trainer t(c);
    EXPECT_EQ(t.run().size(), 3u);
  }
  std::ifstream in(dir.file("out/metrics.jsonl"));
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["step"], 0);
  EXPECT_EQ(lines[0]["val_loss"].get<double>(), before);
  EXPECT_FALSE(lines[0].contains("loss"));
  EXPECT_EQ(lines[1]["step"], 1);
  EXPECT_TRUE(lines[1].contains("loss"));
  // No fall of 100 comes: one evaluation after step 0's ends the run.
  c = parse_config(to_yaml(c), {"eval.early_stop_patience=1", "eval.early_stop_delta=100"});
  Trainer stopping(c);
  EXPECT_EQ(stopping.run().size(), 1u);
}

// checkpoint.resume naming a checkpoint: a step_<N> of checkpoint.dir goes
// on from there bit for bit (as auto from the latest does), and a path to
// another run's checkpoint branches a new run from it, writing into its own
// dir. One that is not there is an error naming it.
TEST(Trainer, ResumeFromANamedCheckpointGoesOnFromThere) {
  TempDir dir;
  Config c = small_config(dir, 2);
  c.train.steps = 4;
  c = parse_config(to_yaml(c), {"checkpoint.dir=" + dir.file("ck"), "checkpoint.interval=1",
                                "checkpoint.keep=10"});
  std::vector<StepMetrics> whole;
  {
    Trainer t(c);
    whole = t.run();
  }
  ASSERT_EQ(whole.size(), 4u);
  for (const std::string& resume : {std::string("step_2"), dir.file("ck/step_2")}) {
    SCOPED_TRACE(resume);
    Config from = c;
    from.checkpoint.resume = resume;
    if (resume.find('/') != std::string::npos) from.checkpoint.dir = dir.file("branch");
    Trainer t(from);
    const std::vector<StepMetrics> rest = t.run();
    ASSERT_EQ(rest.size(), 2u);
    EXPECT_EQ(rest[0].step, 3);
    EXPECT_EQ(rest[0].loss, whole[2].loss);
    EXPECT_EQ(rest[1].loss, whole[3].loss);
  }
  EXPECT_EQ(io::find_latest_checkpoint(dir.file("branch"))->step, 4);
  c.checkpoint.resume = "step_9";
  try {
    Trainer t(c);
    t.run();
    FAIL() << "resumed from a checkpoint that is not there";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint.resume 'step_9'"), std::string::npos)
        << e.what();
  }
}

// log.moe_per_layer: every MoE layer (not the dense first one) reports its
// busiest and idlest expert over the step, around the balanced 1; the
// busiest over the step is no busier than the busiest of any one
// micro-batch (moe_max_load, the largest over the records, all of one
// size).
TEST(Trainer, MoePerLayerLoadsBracketTheBalancedShare) {
  TempDir dir;
  Config c = small_config(dir, 2);
  c = parse_config(to_yaml(c), {"model.moe={experts: 4, top_k: 2, ffn_hidden_size: 16, "
                                "dense_layers: [0]}",
                                "log.moe_per_layer=true"});
  Trainer t(c);
  const StepMetrics m = t.step(0);
  ASSERT_EQ(m.moe_layers.size(), 1u);
  EXPECT_EQ(m.moe_layers[0].layer, "h.1");
  EXPECT_GE(m.moe_layers[0].max_load, 1.0);
  EXPECT_LE(m.moe_layers[0].min_load, 1.0);
  EXPECT_GE(m.moe_layers[0].min_load, 0.0);
  EXPECT_LE(m.moe_layers[0].max_load, m.moe_max_load + 1e-12);
  EXPECT_GT(m.moe_layers[0].max_load, m.moe_layers[0].min_load);  // (4 experts, 64 tokens)
}

// log.grad_norms: layers reports the embeddings, each block and the final
// norm, parameters each parameter; both add up (in squares) to the
// clipping norm, each layer's to its parameters'. log.param_norms groups
// the weights' norm alike. A group that does not
// train is left out; none reports nothing. (PyTorch's own per-layer norms:
// parity.gpt2; every layout's: the mpi.train_* comparisons.)
TEST(Trainer, GradNormsByGroupAddUpToTheGlobalNorm) {
  TempDir dir;
  Config c = small_config(dir, 2);
  {
    Trainer plain(c);
    EXPECT_TRUE(plain.step(0).grad_norms.empty());
  }
  auto square_sum = [](const std::vector<std::pair<std::string, double>>& groups,
                       const std::string& prefix) {
    double s = 0;
    for (const auto& [name, norm] : groups)
      if (name.rfind(prefix, 0) == 0) s += norm * norm;
    return s;
  };
  c.log_grad_norms = "layers";
  Trainer layers(c);
  const StepMetrics by_layer = layers.step(0);
  std::vector<std::string> names;
  for (const auto& [name, norm] : by_layer.grad_norms) {
    names.push_back(name);
    EXPECT_GT(norm, 0) << name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"h.0", "h.1", "ln_f", "wpe", "wte"}));
  const double total = by_layer.grad_norm * by_layer.grad_norm;
  EXPECT_NEAR(square_sum(by_layer.grad_norms, ""), total, 1e-5 * total);
  c.log_grad_norms = "parameters";
  Trainer params(c);
  const StepMetrics by_parameter = params.step(0);
  EXPECT_EQ(by_parameter.grad_norm, by_layer.grad_norm);  // (the same step, bit for bit)
  EXPECT_EQ(by_parameter.grad_norms.size(), nn::gpt_parameter_shapes(c.model).size());
  EXPECT_NEAR(square_sum(by_parameter.grad_norms, ""), total, 1e-5 * total);
  for (const auto& [layer, norm] : by_layer.grad_norms) {
    const double in_layer = square_sum(by_parameter.grad_norms, layer + ".");
    EXPECT_NEAR(in_layer, norm * norm, 1e-5 * norm * norm) << layer;
  }
  // A whole block frozen: no group for it.
  c.log_grad_norms = "layers";
  c.train.freeze = {"h.0.*"};
  Trainer part(c);
  names.clear();
  for (const auto& [name, norm] : part.step(0).grad_norms) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"h.1", "ln_f", "wpe", "wte"}));
  // log.param_norms: the updated weights' norms in the same groups, adding
  // up to log.param_norm's.
  c.train.freeze.clear();
  c.log_param_norm = true;
  c.log_param_norms = "layers";
  Trainer weights(c);
  const StepMetrics w = weights.step(0);
  ASSERT_EQ(w.param_norms.size(), 5u);
  EXPECT_EQ(w.param_norms[0].first, "h.0");
  const double all = w.param_norm * w.param_norm;
  EXPECT_NEAR(square_sum(w.param_norms, ""), all, 1e-6 * all);
}

// model.z_loss_coef: the step's loss is the cross entropy still (the first
// step's bitwise that of a run without it), the z-loss is reported beside
// it, and the update differs (the second step's loss).
TEST(Trainer, ZLossIsReportedBesideTheLossItLeavesAlone) {
  TempDir dir;
  Config c = small_config(dir, 2);
  Trainer plain(c);
  const StepMetrics p0 = plain.step(0), p1 = plain.step(1);
  EXPECT_LT(p0.z_loss, 0);
  c.model.z_loss_coef = 0.05;
  Trainer with_z(c);
  const StepMetrics z0 = with_z.step(0), z1 = with_z.step(1);
  EXPECT_EQ(z0.loss, p0.loss);
  // log(32) is about 3.47 for uniform logits at the start: lse^2 about 12.
  EXPECT_GT(z0.z_loss, 10.0);
  EXPECT_LT(z0.z_loss, 15.0);
  EXPECT_GT(std::abs(z1.loss - p1.loss), 1e-6);
  EXPECT_LT(z1.z_loss, z0.z_loss);  // the z-loss pulls lse toward 0
}

// model.lora: only the adapters train (their optimizer state is all there
// is), the base weights stay bit for bit, and model.safetensors holds the
// model with the adapters merged in under the model's own names.
TEST(Trainer, LoraTrainsTheAdaptersAloneAndWritesTheMergedModel) {
  TempDir dir;
  Config c = small_config(dir, 2);
  c.train.steps = 6;
  c.train.lr = 3e-2;
  c.model.lora = {.rank = 2, .alpha = 4, .targets = {"attn.c_attn", "mlp.c_fc", "mlp.c_proj"}};
  std::map<std::string, std::vector<double>> start;
  {
    Trainer base(small_config(dir, 2));
    for (const auto& [name, t] : base.full_state_dict()) start[name] = to_double_vector(t);
  }
  Trainer t(c);
  int64_t adapters = 0;
  for (const auto& [name, shape] : nn::gpt_parameter_shapes(c.model)) {
    if (nn::is_lora_adapter(name)) adapters += numel(shape);
  }
  EXPECT_EQ(t.optimizer_state_elements(), adapters);
  const auto steps = t.run();
  ASSERT_EQ(steps.size(), 6u);
  EXPECT_LT(steps.back().loss, steps.front().loss);
  const nn::StateDict end = t.full_state_dict();
  for (const auto& [name, v] : start) {
    EXPECT_EQ(to_double_vector(end.at(name)), v) << name << " moved";
  }
  EXPECT_NE(to_double_vector(end.at("h.1.mlp.c_fc.lora_b")),
            std::vector<double>(static_cast<size_t>(end.at("h.1.mlp.c_fc.lora_b").numel()), 0.0));
  const auto file = io::load_safetensors(dir.file("out/model.safetensors"));
  size_t held = 0;
  for (const auto& [name, tensor] : file.tensors) {
    (void)tensor;
    EXPECT_FALSE(nn::is_lora_adapter(name)) << name;
    ++held;
  }
  EXPECT_EQ(held, start.size());
  // GPT-2's file stores linear weights [in, out]: transposed back.
  const Tensor merged = nn::merge_lora(end.at("h.1.mlp.c_fc.weight"), end.at("h.1.mlp.c_fc.lora_a"),
                                       end.at("h.1.mlp.c_fc.lora_b"), 2.0);
  const auto got =
      to_double_vector(contiguous(transpose(file.tensors.at("h.1.mlp.c_fc.weight"), 0, 1)));
  const auto want = to_double_vector(merged);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-7) << i;
  EXPECT_NE(want, start.at("h.1.mlp.c_fc.weight"));
  EXPECT_EQ(to_double_vector(file.tensors.at("h.0.attn.c_proj.weight")),
            to_double_vector(contiguous(transpose(end.at("h.0.attn.c_proj.weight"), 0, 1))));
  // And the adapters apart, in PEFT's format (GPT-2's modules).
  const auto adapter = io::load_safetensors(dir.file("out/adapter/adapter_model.safetensors"));
  EXPECT_EQ(adapter.tensors.size(), 2u * 3 * 2);  // 2 blocks, 3 layers, A and B
  EXPECT_EQ(to_double_vector(
                adapter.tensors.at("base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight")),
            to_double_vector(end.at("h.1.mlp.c_fc.lora_b")));
  std::ifstream config(dir.file("out/adapter/adapter_config.json"));
  const std::string text((std::istreambuf_iterator<char>(config)),
                         std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"lora_alpha\": 4.0"), std::string::npos) << text;
  EXPECT_NE(text.find("\"r\": 2"), std::string::npos) << text;
}

// LoRA on Phi-4-mini's kind of model (half of each head turned): the run
// ends by writing the adapters under Phi-3's fused modules, whole, the
// only Hugging Face class that holds the model.
TEST(Trainer, LoraOnAPartialRotationWritesPhi3Adapters) {
  TempDir dir;
  Config c = small_config(dir, 2);
  c.train.steps = 2;
  auto& m = c.model;
  m.position_embedding = nn::PositionEmbedding::Rotary;
  m.activation = nn::Activation::SwiGlu;
  m.normalization = nn::Normalization::RmsNorm;
  m.linear_bias = false;
  m.rope_dim = 4;  // of heads of 8
  m.lora = {.rank = 2, .alpha = 4, .targets = {"attn.c_attn", "mlp.c_fc"}};
  Trainer t(c);
  t.run();
  const nn::StateDict end = t.full_state_dict();
  const auto adapter = io::load_safetensors(dir.file("out/adapter/adapter_model.safetensors"));
  EXPECT_EQ(adapter.tensors.size(), 2u * 2 * 2);  // 2 blocks, 2 layers, A and B
  EXPECT_EQ(to_double_vector(adapter.tensors.at(
                "base_model.model.model.layers.1.self_attn.qkv_proj.lora_B.weight")),
            to_double_vector(end.at("h.1.attn.c_attn.lora_b")));
  EXPECT_EQ(to_double_vector(adapter.tensors.at(
                "base_model.model.model.layers.0.mlp.gate_up_proj.lora_A.weight")),
            to_double_vector(end.at("h.0.mlp.c_fc.lora_a")));
  std::ifstream config(dir.file("out/adapter/adapter_config.json"));
  const std::string text((std::istreambuf_iterator<char>(config)),
                         std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"qkv_proj\""), std::string::npos) << text;
}

// LoRA on the experts of a mixture no Hugging Face class holds (GPT-2's
// blocks with experts): the run trains the experts' adapters and writes the
// merged model, and no PEFT adapter (it has no modules to name them by),
// where it used to fail at the end after training.
TEST(Trainer, LoraOnAClasslessMixtureWritesTheMergedModelAlone) {
  TempDir dir;
  Config c = small_config(dir, 2);
  c.train.steps = 2;
  auto& m = c.model;
  m.moe = {.experts = 2, .top_k = 1, .ffn_hidden_size = 8};
  m.lora = {.rank = 2, .alpha = 4, .targets = {"mlp.c_fc", "mlp.c_proj"}};
  ASSERT_NE(io::peft_adapter_unsupported(m), "");
  Trainer t(c);
  t.run();
  const nn::StateDict end = t.full_state_dict();
  double moved = 0;  // B starts at 0
  for (double v : to_double_vector(end.at("h.1.mlp.experts.1.c_proj.lora_b")))
    moved = std::max(moved, std::abs(v));
  EXPECT_GT(moved, 0.0);
  EXPECT_TRUE(std::filesystem::exists(dir.file("out/model.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("out/adapter")));
}

// init.adapter: a run's PEFT adapter merged into the base it was trained on
// as init.from reads it gives the weights that run wrote with its adapters
// merged in (GPT-2's Conv1D modules: the deltas transposed).
TEST(Trainer, InitAdapterMergesAPeftAdapterIntoTheBase) {
  TempDir dir;
  Config base = small_config(dir, 2);
  base.train.steps = 1;
  Trainer(base).run();  // out/model.safetensors: the base
  Config tuned = small_config(dir, 2);
  tuned.train.steps = 2;
  tuned.init_from = dir.file("out/model.safetensors");
  tuned.output_dir = dir.file("tuned");
  tuned.model.lora = {.rank = 2, .alpha = 4, .targets = {"attn.c_attn", "mlp.c_fc"}};
  Trainer(tuned).run();  // tuned/model.safetensors merged, tuned/adapter apart
  Config adapted = small_config(dir, 2);
  adapted.init_from = dir.file("out/model.safetensors");
  adapted.init_adapter = dir.file("tuned/adapter");
  adapted.output_dir = dir.file("adapted");
  const nn::StateDict got = Trainer(adapted).full_state_dict();
  const auto want = io::load_safetensors(dir.file("tuned/model.safetensors")).tensors;
  const auto plain = io::load_safetensors(dir.file("out/model.safetensors")).tensors;
  size_t changed = 0;
  for (const auto& [name, t] : got) {
    // (The file's Conv1D weights are stored transposed.)
    const std::string& file = name;
    ASSERT_TRUE(want.count(file)) << file;
    const bool conv = io::is_gpt2_conv1d_weight(file);
    const auto w = to_double_vector(conv ? transpose(want.at(file), 0, 1) : want.at(file));
    const auto g = to_double_vector(t);
    ASSERT_EQ(g.size(), w.size()) << name;
    for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], w[i], 1e-5) << name << " " << i;
    changed += to_double_vector(conv ? transpose(plain.at(file), 0, 1) : plain.at(file)) != w;
  }
  EXPECT_EQ(changed, 4u);  // 2 blocks' c_attn and c_fc
}

// LoRA under bf16: the frozen weights stay the bf16 values they were
// rounded to once (no f32 master for them), while the adapters step from
// f32 masters and the loss falls.
TEST(Trainer, LoraInBf16KeepsTheRoundedBaseAndTrainsTheAdapters) {
  TempDir dir;
  Config c = small_config(dir, 2);
  c.train.steps = 8;
  c.train.lr = 3e-2;
  c.train.precision = "bf16";
  c.model.lora = {.rank = 4, .alpha = 8, .targets = nn::GptConfig::lora_layers()};
  Trainer t(c);
  std::map<std::string, std::vector<double>> start;
  for (const auto& [name, v] : t.full_state_dict()) {
    EXPECT_EQ(v.dtype(), DType::BF16) << name;
    start[name] = to_double_vector(v);
  }
  std::vector<StepMetrics> steps;
  for (int64_t k = 0; k < 8; ++k) steps.push_back(t.step(k));
  EXPECT_LT(steps.back().loss, steps.front().loss);
  for (const auto& [name, v] : t.full_state_dict()) {
    if (nn::is_lora_adapter(name) && name.back() == 'b') {
      EXPECT_NE(to_double_vector(v), start.at(name)) << name;
    } else if (!nn::is_lora_adapter(name)) {
      EXPECT_EQ(to_double_vector(v), start.at(name)) << name << " moved";
    }
  }
}

TEST(Trainer, RunLearnsAndWritesMetricsAndWeights) {
  TempDir dir;
  Config c = small_config(dir, 2);
  c.train.steps = 40;
  c.train.lr = 1e-2;
  c.train.min_lr = 1e-3;
  Trainer t(c);
  auto m = t.run();
  ASSERT_EQ(m.size(), 40u);
  EXPECT_LT(m.back().loss, 0.7 * m.front().loss);
  EXPECT_NEAR(m.front().loss, std::log(32.0), 0.3);  // starts near uniform
  std::ifstream in(dir.file("out/metrics.jsonl"));
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    for (const char* key : {"\"step\"", "\"loss\"", "\"lr\"", "\"grad_norm\"", "\"tokens_per_s\"",
                            "\"step_ms\"", "\"peak_memory_bytes\""}) {
      EXPECT_NE(line.find(key), std::string::npos) << line;
    }
  }
  EXPECT_EQ(lines, 40);
  // The step's peak holds at least the f32 weights, their gradients and
  // AdamW's two moments; a model this small stays far below a gigabyte.
  const double f32_weights = 4.0 * static_cast<double>(nn::Gpt(c.model, 0).num_parameters());
  for (const auto& step : m) {
    EXPECT_GE(static_cast<double>(step.peak_memory_bytes), 4 * f32_weights) << "step " << step.step;
    EXPECT_LT(step.peak_memory_bytes, int64_t{1} << 30) << "step " << step.step;
  }
  auto weights = io::load_safetensors(dir.file("out/model.safetensors"));
  EXPECT_EQ(weights.tensors.at("h.0.attn.c_attn.weight").shape(), (Shape{16, 48}));
  EXPECT_TRUE(std::filesystem::exists(dir.file("out/config.yaml")));
  std::ifstream trace(dir.file("out/trace.json"));
  std::string text((std::istreambuf_iterator<char>(trace)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(text.find("\"cat\":\"forward\""), std::string::npos);
  EXPECT_NE(text.find("\"cat\":\"optimizer\""), std::string::npos);
}

// log.trace_steps: trace.json records the steps asked for; by default the
// first 20 the run trains, which for a run resumed past step 20 are the 20
// after its checkpoint (not none). Each traced step has one optimizer event.
TEST(Trainer, TracesTheStepsAskedFor) {
  TempDir dir;
  const auto optimizer_events = [&](const std::string& run) {
    std::ifstream trace(dir.file(run + "/trace.json"));
    const std::string text((std::istreambuf_iterator<char>(trace)),
                           std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("\"traceEvents\""), std::string::npos) << run;
    int n = 0;
    for (size_t at = text.find("\"cat\":\"optimizer\""); at != std::string::npos;
         at = text.find("\"cat\":\"optimizer\"", at + 1))
      ++n;
    return n;
  };
  const auto run = [&](const std::string& out, int64_t steps, const std::vector<std::string>& set) {
    std::vector<std::string> all{"output.dir=" + dir.file(out),
                                 "train.steps=" + std::to_string(steps),
                                 "checkpoint.dir=" + dir.file("ck")};
    all.insert(all.end(), set.begin(), set.end());
    Trainer t(parse_config(to_yaml(small_config(dir, 2)), all));
    t.run();
  };
  run("whole", 24, {});
  EXPECT_EQ(optimizer_events("whole"), 20);
  {
    // (Its first step's console line too, as a new run's first step has.)
    std::ostringstream log;
    const auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
    spdlog::default_logger()->sinks().push_back(sink);
    run("resumed", 27, {"checkpoint.resume=auto"});  // steps 25-27, after step_24
    spdlog::default_logger()->sinks().pop_back();
    EXPECT_NE(log.str().find("step    25/27 | loss"), std::string::npos) << log.str();
  }
  EXPECT_EQ(optimizer_events("resumed"), 3);
  run("window", 24, {"log.trace_steps=[5, 7]", "checkpoint.dir="});
  EXPECT_EQ(optimizer_events("window"), 3);
  run("none", 4, {"log.trace_steps=none", "checkpoint.dir="});
  EXPECT_EQ(optimizer_events("none"), 0);
  const Config c = parse_config(to_yaml(small_config(dir, 2)), {"log.trace_steps=[100, 105]"});
  EXPECT_EQ(c.log_trace_first, 100);
  EXPECT_EQ(c.log_trace_last, 105);
  EXPECT_EQ(parse_config(to_yaml(c)).log_trace_last, 105);
  // A traced step's evaluation and checkpoint are in the trace too, after
  // its optimizer and before the next step's passes (only the traced
  // steps': here steps 2 and 3 of 4, each evaluating and checkpointing).
  run("phases", 4,
      {"log.trace_steps=[2, 3]", "data.val=" + dir.file("train.bin"), "eval.interval=1",
       "eval.batches=1", "checkpoint.interval=1", "checkpoint.dir=" + dir.file("ck_phases")});
  {
    std::ifstream in(dir.file("phases/trace.json"));
    const nlohmann::json trace = nlohmann::json::parse(in);
    std::vector<std::pair<double, std::string>> events;
    for (const auto& e : trace["traceEvents"])
      if (e["ph"] == "X") events.push_back({e["ts"].get<double>(), e["name"]});
    std::sort(events.begin(), events.end());
    std::vector<std::string> names;
    for (const auto& [ts, name] : events) names.push_back(name);
    const std::vector<std::string> step{"F0",        "B0",         "F1",        "B1",
                                        "optimizer", "evaluation", "checkpoint"};
    std::vector<std::string> want(step);
    want.insert(want.end(), step.begin(), step.end());
    EXPECT_EQ(names, want);
  }
  for (const char* bad : {"[0, 3]", "[5, 4]", "[3]", "7"}) {
    SCOPED_TRACE(bad);
    testing::expect_error<ConfigError>(
        [&] {
          parse_config(to_yaml(small_config(dir, 2)), {std::string("log.trace_steps=") + bad});
        },
        {"log.trace_steps", "must be [first, last]"});
  }
}

// A validation shard: the training stream's rule continued past its end
// (tokens the model never trains on), 37 sequences of 17 tokens.
std::vector<uint16_t> validation_tokens() {
  std::vector<uint16_t> v;
  for (int i = 4000; i < 4600; ++i) v.push_back(static_cast<uint16_t>((i * 7 + i / 13) % 31));
  return v;
}

TEST(Trainer, EvaluatesTheValidationLossWithoutChangingTraining) {
  TempDir dir;
  Config plain = small_config(dir, 2);
  plain.train.steps = 5;
  plain.model.dropout = 0.1;  // evaluation runs without it and leaves training's streams alone
  data::write_token_shard(dir.file("val.bin"), validation_tokens());
  Config with_val = plain;
  with_val.data_val = {{"", dir.file("val.bin")}};
  with_val.eval.interval = 2;
  with_val.eval.batches = 3;
  with_val.output_dir = dir.file("out_val");
  const auto without = Trainer(plain).run();
  Trainer t(with_val);
  EXPECT_EQ(t.eval_batches(), 3);
  const auto with = t.run();
  ASSERT_EQ(with.size(), 5u);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(with[k].loss, without[k].loss) << "step " << k + 1;  // bit for bit
    EXPECT_EQ(with[k].grad_norm, without[k].grad_norm) << "step " << k + 1;
    // Steps 2 and 4 (the interval) and 5 (the last) evaluated.
    EXPECT_EQ(with[k].val_loss.has_value(), k == 1 || k == 3 || k == 4) << "step " << k + 1;
  }
  EXPECT_FALSE(without.back().val_loss.has_value());
  EXPECT_LT(*with[4].val_loss, *with[1].val_loss);  // what it learns carries over
  // The same number from a plain model holding the final weights, over the
  // first 3 global batches of 4 sequences taken whole, without dropout.
  nn::Gpt model(with_val.model, 7);
  model.load_state_dict(t.full_state_dict());
  const auto val = validation_tokens();
  const int64_t T = with_val.model.seq_len;
  double sum = 0;
  for (int64_t k = 0; k < 3; ++k) {
    std::vector<int64_t> in, tg;
    for (int64_t q = 4 * k; q < 4 * k + 4; ++q) {
      for (int64_t i = 0; i < T; ++i) {
        in.push_back(val[q * T + i]);
        tg.push_back(val[q * T + i + 1]);
      }
    }
    sum += item(model.loss(from_vector(in, {4, T}), from_vector(tg, {4, T}), {false, 0, 0}));
  }
  EXPECT_NEAR(*with[4].val_loss, sum / 3, 1e-5 * sum / 3);
  // Repeatable, and written to metrics.jsonl on the steps that evaluated.
  EXPECT_EQ(t.evaluate(), *with[4].val_loss);
  std::ifstream in(dir.file("out_val/metrics.jsonl"));
  int with_key = 0;
  for (std::string line; std::getline(in, line);)
    with_key += line.find("\"val_loss\"") != line.npos;
  EXPECT_EQ(with_key, 3);
}

// data.val as named sets: each evaluated on the steps that evaluate,
// reported by name in the config's order (the first also as val_loss), each
// the loss that set alone gives, and written to metrics.jsonl.
TEST(Trainer, NamedValidationSetsAreEachEvaluatedAndReported) {
  TempDir dir;
  Config c = small_config(dir, 2);
  c.train.steps = 4;
  c.eval.interval = 2;
  c.eval.batches = 2;
  data::write_token_shard(dir.file("val.bin"), validation_tokens());
  c.data_val = {{"held", dir.file("val.bin")}, {"seen", dir.file("train.bin")}};
  c.output_dir = dir.file("out_sets");
  Trainer t(c);
  const auto m = t.run();
  ASSERT_EQ(m.size(), 4u);
  ASSERT_EQ(m[1].val_losses.size(), 2u);
  EXPECT_EQ(m[1].val_losses[0].first, "held");
  EXPECT_EQ(m[1].val_losses[1].first, "seen");
  EXPECT_EQ(*m[1].val_loss, m[1].val_losses[0].second);
  EXPECT_TRUE(m[2].val_losses.empty());
  EXPECT_NE(m[3].val_losses[0].second, m[3].val_losses[1].second);
  // Each set's loss is the one that set alone gives the same weights.
  Config alone = c;
  alone.data_val = {{"", dir.file("train.bin")}};
  alone.output_dir = dir.file("out_alone");
  Trainer one(alone);
  one.run();
  EXPECT_EQ(one.evaluate(), m[3].val_losses[1].second);
  EXPECT_EQ(t.evaluate(1), m[3].val_losses[1].second);
  EXPECT_THROW(t.evaluate(2), ValueError);
  std::ifstream in(dir.file("out_sets/metrics.jsonl"));
  int with_sets = 0;
  for (std::string line; std::getline(in, line);)
    with_sets += line.find("\"val_losses\":{\"held\":") != line.npos;
  EXPECT_EQ(with_sets, 2);
}

TEST(Trainer, TrainsOnAWeightedMixture) {
  TempDir dir;
  Config c = small_config(dir, 2);
  data::write_token_shard(dir.file("val.bin"), validation_tokens());
  Config mix = c;
  mix.data_train = {{dir.file("train.bin"), 3.0}, {dir.file("val.bin"), 1.0}};
  mix.train.steps = 4;
  const auto m = Trainer(mix).run();
  ASSERT_EQ(m.size(), 4u);
  for (const auto& s : m) EXPECT_TRUE(std::isfinite(s.loss));
  // A mixture of one part is that part: the same losses as the plain path.
  Config one = c, plain = c;
  one.data_train = {{dir.file("train.bin"), 0.25}};
  one.output_dir = dir.file("out_one");
  const auto a = Trainer(one).run(), b = Trainer(plain).run();
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k].loss, b[k].loss) << k;
  Config tiny = c;
  tiny.data_train = {{dir.file("train.bin"), 1.0}, {dir.file("val.bin"), 1e-6}};
  EXPECT_THROW(Trainer{tiny}, ConfigError);
}

TEST(Trainer, EvaluateOnlyScoresTheStartingWeights) {
  TempDir dir;
  data::write_token_shard(dir.file("val.bin"), validation_tokens());
  Config c = small_config(dir, 2);
  c.train.steps = 4;
  c.data_val = {{"", dir.file("val.bin")}};
  c.eval.batches = 2;
  c.checkpoint.dir = dir.file("ck");
  const auto trained = Trainer(c).run();
  ASSERT_TRUE(trained.back().val_loss.has_value());
  // From the written weights, and from the newest checkpoint.
  Config from_weights = c;
  from_weights.checkpoint.dir.clear();
  from_weights.init_from = dir.file("out/model.safetensors");
  EXPECT_NEAR(*Trainer(from_weights).evaluate_only().val_loss, *trained.back().val_loss, 1e-12);
  Config from_checkpoint = c;
  from_checkpoint.checkpoint.resume = "auto";
  EXPECT_NEAR(*Trainer(from_checkpoint).evaluate_only().val_loss, *trained.back().val_loss, 1e-12);
  // A model with other key/value heads cannot resume it, and is told why.
  Config grouped = from_checkpoint;
  grouped.model.n_kv_head = 1;
  try {
    Trainer{grouped}.evaluate_only();
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("this run has model = 2x16x2 kv 1 vocab 32 seq 16"),
              std::string::npos)
        << e.what();
  }
  // Fresh weights score near uniform guessing (ln 32).
  Config fresh = c;
  fresh.checkpoint.dir.clear();
  EXPECT_NEAR(*Trainer(fresh).evaluate_only().val_loss, std::log(32.0), 0.3);
  Config no_val = fresh;
  no_val.data_val.clear();
  no_val.eval.batches = 0;
  EXPECT_THROW(Trainer(no_val).evaluate_only(), ConfigError);
}

// eval.lambada: texts whose last word is asked for, scored at the steps that
// evaluate, leaving training alone, with triad-eval's numbers
// (nn::score_continuations with greedy) for the trained weights. The model
// learns a repeated sentence, so the texts cut from it have words greedy
// decoding writes and the others words it does not.
TEST(Trainer, ScoresLambadaAsTriadEvalDoes) {
  TempDir dir;
  const std::string sentence = "the cat sat on the mat and the dog ran. ";
  {
    std::vector<uint16_t> bytes;
    for (int i = 0; i < 200; ++i)
      for (const char ch : sentence) bytes.push_back(static_cast<uint8_t>(ch));
    data::write_token_shard(dir.file("train.bin"), bytes);
  }
  Config plain = parse_config(
      "model: {n_layer: 2, n_head: 2, d_model: 32, vocab_size: 256, seq_len: 32}\n"
      "train: {steps: 60, global_batch_size: 8, micro_batch_size: 4, lr: 1.0e-2, "
      "warmup_steps: 5}\n"
      "data: {train: " +
      dir.file("train.bin") + "}\noutput: {dir: " + dir.file("out") + "}\n");
  {
    std::ofstream l(dir.file("l.jsonl"));
    for (const char* text :
         {"the cat sat on the mat", "the cat sat", "the cat sat on the hat", "the cat",
          "sat on the mat and the dog", "a dog ran to the xq", "the cat sat on the mat and the"}) {
      l << nlohmann::json{{"text", text}}.dump() << "\n";
    }
  }
  Config with = plain;
  with.eval.lambada = {{"", dir.file("l.jsonl")}};
  with.eval.interval = 30;
  with.output_dir = dir.file("out_lambada");
  const auto without = Trainer(plain).run();
  Trainer t(with);
  const auto scored = t.run();
  ASSERT_EQ(scored.size(), 60u);
  for (size_t k = 0; k < scored.size(); ++k) {
    EXPECT_EQ(scored[k].loss, without[k].loss) << "step " << k + 1;  // bit for bit
    EXPECT_EQ(scored[k].lambada.has_value(), k == 29 || k == 59) << "step " << k + 1;
  }
  // triad-eval's way, on a plain model holding the final weights.
  nn::Gpt model(with.model, 7);
  model.load_state_dict(t.full_state_dict());
  const data::ByteTokenizer bytes;
  std::vector<nn::ContinuationRequest> requests;  // (each text where training saw it: the
                                                  // sentence's start, or 8 bytes in)
  for (const auto& text : data::read_last_word_texts(dir.file("l.jsonl"))) {
    auto [ctx, word] = data::encode_context_and_continuation(bytes, text.context, text.target);
    requests.push_back({std::vector<int64_t>(ctx.begin(), ctx.end()),
                        std::vector<int64_t>(word.begin(), word.end())});
  }
  const auto s = nn::score_continuations(model, requests, 3, /*greedy=*/true);
  double right = 0, nll = 0;
  for (const auto& x : s) {
    right += x.greedy;
    nll += x.nll;
  }
  const auto& got = *scored.back().lambada;
  EXPECT_EQ(got.texts, 7);
  EXPECT_DOUBLE_EQ(got.acc, right / 7);
  EXPECT_NEAR(got.loss, nll / 7, 1e-6 * got.loss);
  EXPECT_NEAR(got.perplexity, std::exp(nll / 7), 1e-5 * got.perplexity);
  // Some words are right and some wrong: the greedy check decides.
  EXPECT_GT(right, 0);
  EXPECT_LT(right, 7);
  // Repeatable, and in metrics.jsonl on the steps that evaluated.
  EXPECT_EQ(t.evaluate_lambada().perplexity, got.perplexity);
  std::ifstream in(dir.file("out_lambada/metrics.jsonl"));
  int with_key = 0;
  for (std::string line; std::getline(in, line);)
    with_key += line.find("\"lambada\":{\"acc\"") != line.npos;
  EXPECT_EQ(with_key, 2);
  // --eval-only, by name and limited.
  Config named = with;
  named.init_from = dir.file("out_lambada/model.safetensors");
  named.eval.lambada = {{"first", dir.file("l.jsonl")}, {"again", dir.file("l.jsonl")}};
  named.eval.lambada_limit = 3;
  const StepMetrics once = Trainer(named).evaluate_only();
  ASSERT_EQ(once.lambada_sets.size(), 2u);
  EXPECT_EQ(once.lambada_sets[0].first, "first");
  EXPECT_EQ(once.lambada_sets[0].second.texts, 3);
  ASSERT_TRUE(once.lambada.has_value());
  EXPECT_EQ(once.lambada->perplexity, once.lambada_sets[1].second.perplexity);
  double nll3 = 0;
  for (size_t i = 0; i < 3; ++i) nll3 += s[i].nll;
  EXPECT_NEAR(once.lambada->perplexity, std::exp(nll3 / 3), 1e-5 * once.lambada->perplexity);
  // A word longer than the window is refused by name.
  Config narrow = with;
  narrow.model.seq_len = 2;
  try {
    Trainer{narrow};
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("eval.lambada '" + dir.file("l.jsonl") +
                                         "': text 1 ends in a word of 4 tokens, more than "
                                         "model.seq_len 2"),
              std::string::npos)
        << e.what();
  }
}

// eval.choices: multiple-choice questions scored at the steps that evaluate,
// without validation data, leaving training alone, with the numbers
// triad-eval's scoring (nn::score_continuations, nn::pick_choice) gives the
// trained weights; micro-batches of 3 rows leave the last one short.
TEST(Trainer, ScoresMultipleChoiceQuestionsAsTriadEvalDoes) {
  TempDir dir;
  Config plain = small_config(dir, 1);
  plain.model.vocab_size = 256;  // byte tokens
  plain.train.global_batch_size = 3;
  plain.train.micro_batch_size = 3;
  plain.train.steps = 4;
  {
    std::ofstream q(dir.file("q.jsonl"));
    q << R"({"context": "abcabcab", "choices": ["c", "a", "b"], "answer": 0})"
      << "\n"
      << R"({"ctx": "the quick brown fox jumps over", "endings": ["it", "a dog!"], "label": 1})"
      << "\n\n"
      << R"({"context": "x  ", "choices": ["x y", "zz"], "answer": "1"})"
      << "\n"
      << R"({"context": "0123456789012345678901234567890123", "choices": ["4", "x"], "answer": 0})"
      << "\n"
      // WinoGrande's: each option in the blank, the rest scored after it.
      << R"({"sentence": "abc _ cab cab", "option1": "abc", "option2": "ab", "answer": "2"})"
      << "\n";
  }
  Config with = plain;
  with.eval.choices = {{"", dir.file("q.jsonl")}};
  with.eval.interval = 2;
  with.output_dir = dir.file("out_choices");
  const auto without = Trainer(plain).run();
  Trainer t(with);
  const auto scored = t.run();
  ASSERT_EQ(scored.size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(scored[k].loss, without[k].loss) << "step " << k + 1;  // bit for bit
    EXPECT_EQ(scored[k].choices.has_value(), k == 1 || k == 3) << "step " << k + 1;
    EXPECT_FALSE(scored[k].val_loss.has_value());
  }
  // triad-eval's way, on a plain model holding the final weights.
  nn::Gpt model(with.model, 7);
  model.load_state_dict(t.full_state_dict());
  const data::ByteTokenizer bytes;
  double right[3] = {0, 0, 0}, nll = 0, tokens = 0;
  const auto questions = data::read_choice_questions(with.eval.choices.front().path);
  ASSERT_EQ(questions.size(), 5u);
  for (const auto& q : questions) {
    std::vector<nn::ContinuationRequest> requests;
    std::vector<int64_t> chars;
    for (size_t i = 0; i < q.choices.size(); ++i) {
      const std::string& c = q.choices[i];
      auto [ctx, cont] = data::encode_context_and_continuation(bytes, q.context_of(i), " " + c);
      requests.push_back({std::vector<int64_t>(ctx.begin(), ctx.end()),
                          std::vector<int64_t>(cont.begin(), cont.end())});
      chars.push_back(data::utf8_characters(c));
    }
    const auto s = nn::score_continuations(model, requests, 2);
    const nn::ChoicePicks p = nn::pick_choice(s, chars);
    right[0] += p.total == q.answer;
    right[1] += p.per_char == q.answer;
    right[2] += p.per_token == q.answer;
    nll += s[static_cast<size_t>(q.answer)].nll;
    tokens += static_cast<double>(s[static_cast<size_t>(q.answer)].tokens);
  }
  const auto& got = *scored.back().choices;
  EXPECT_EQ(got.questions, 5);
  EXPECT_DOUBLE_EQ(got.acc, right[0] / 5);
  EXPECT_DOUBLE_EQ(got.acc_norm, right[1] / 5);
  EXPECT_DOUBLE_EQ(got.acc_per_token, right[2] / 5);
  EXPECT_NEAR(got.answer_loss, nll / tokens, 1e-5 * nll / tokens);
  // Repeatable, and in metrics.jsonl on the steps that evaluated.
  const auto again = t.evaluate_choices();
  EXPECT_EQ(again.acc_norm, got.acc_norm);
  EXPECT_EQ(again.answer_loss, got.answer_loss);
  std::ifstream in(dir.file("out_choices/metrics.jsonl"));
  int with_key = 0;
  for (std::string line; std::getline(in, line);)
    with_key += line.find("\"acc_norm\"") != line.npos;
  EXPECT_EQ(with_key, 2);
  // --eval-only scores them too.
  Config from_weights = with;
  from_weights.init_from = dir.file("out_choices/model.safetensors");
  const StepMetrics once = Trainer(from_weights).evaluate_only();
  ASSERT_TRUE(once.choices.has_value());
  EXPECT_FALSE(once.val_loss.has_value());
  EXPECT_NEAR(once.choices->answer_loss, got.answer_loss, 1e-6 * got.answer_loss);
  // Named sets: each reported by its name, in order, the first also as choices.
  Config named = from_weights;
  named.eval.choices = {{"hella", with.eval.choices.front().path},
                        {"again", with.eval.choices.front().path}};
  named.eval.choices_limit = 3;
  const StepMetrics both = Trainer(named).evaluate_only();
  ASSERT_EQ(both.choice_sets.size(), 2u);
  EXPECT_EQ(both.choice_sets[0].first, "hella");
  EXPECT_EQ(both.choice_sets[1].first, "again");
  EXPECT_EQ(both.choice_sets[0].second.questions, 3);
  EXPECT_EQ(both.choice_sets[1].second.answer_loss, both.choice_sets[0].second.answer_loss);
  ASSERT_TRUE(both.choices.has_value());
  EXPECT_EQ(both.choices->answer_loss, both.choice_sets[0].second.answer_loss);
}

// TruthfulQA's lines: MC1 as acc and MC2 (the true answers' share of the
// mc2 set's probability) as triad-eval computes them for the same weights;
// a set without mc2 answers reports none, and metrics.jsonl carries it.
TEST(Trainer, ScoresTruthfulQasMc2AsTriadEvalDoes) {
  TempDir dir;
  Config c = small_config(dir, 1);
  c.model.vocab_size = 256;  // byte tokens
  c.train.global_batch_size = 3;
  c.train.micro_batch_size = 3;
  c.train.steps = 2;
  {
    std::ofstream q(dir.file("tqa.jsonl"));
    q << R"({"question": "Can fish fly?", "mc1_targets": {"choices": ["No.", "Yes."], "labels":)"
      << R"( [1, 0]}, "mc2_targets": {"choices": ["No.", "Not far.", "Yes.", "Always."],)"
      << R"( "labels": [1, 1, 0, 0]}})"
      << "\n"
      << R"({"question": "Is ice cold?", "mc1_targets": {"choices": ["Yes.", "No.", "Hot."],)"
      << R"( "labels": [1, 0, 0]}, "mc2_targets": {"choices": ["Yes.", "No."], "labels": [1, 0]}})"
      << "\n";
  }
  c.eval.choices = {{"tqa", dir.file("tqa.jsonl")}, {"plain", dir.file("plain.jsonl")}};
  std::ofstream(dir.file("plain.jsonl"))
      << R"({"context": "ab", "choices": ["c", "d"], "answer": 0})"
      << "\n";
  c.eval.interval = 2;
  c.output_dir = dir.file("out_tqa");
  Trainer t(c);
  const auto steps = t.run();
  ASSERT_EQ(steps.back().choice_sets.size(), 2u);
  const auto& got = steps.back().choice_sets[0].second;
  ASSERT_TRUE(got.mc2.has_value());
  EXPECT_FALSE(steps.back().choice_sets[1].second.mc2.has_value());
  nn::Gpt model(c.model, 7);
  model.load_state_dict(t.full_state_dict());
  const data::ByteTokenizer bytes;
  double mc2 = 0, right = 0;
  const auto questions = data::read_choice_questions(dir.file("tqa.jsonl"));
  for (const auto& q : questions) {
    const auto score = [&](const std::vector<std::string>& choices) {
      std::vector<nn::ContinuationRequest> requests;
      for (const std::string& choice : choices) {
        auto [ctx, cont] = data::encode_context_and_continuation(bytes, q.context, " " + choice);
        requests.push_back({std::vector<int64_t>(ctx.begin(), ctx.end()),
                            std::vector<int64_t>(cont.begin(), cont.end())});
      }
      return nn::score_continuations(model, requests, 2);
    };
    const auto mc1 = score(q.choices);
    // (acc picks by the total: the character counts do not matter to it.)
    right += nn::pick_choice(mc1, std::vector<int64_t>(mc1.size(), 1)).total == q.answer;
    mc2 += nn::true_probability_share(score(q.mc2_choices), q.mc2_true);
  }
  EXPECT_DOUBLE_EQ(got.acc, right / 2);
  EXPECT_NEAR(*got.mc2, mc2 / 2, 1e-6);
  std::ifstream in(dir.file("out_tqa/metrics.jsonl"));
  int with_mc2 = 0;
  for (std::string line; std::getline(in, line);) with_mc2 += line.find("\"mc2\"") != line.npos;
  EXPECT_EQ(with_mc2, 1);
}

// A longrope model's questions: each request takes the factors Hugging
// Face's rule gives it read alone (the long ones only when it reaches past
// the original context of 20). One process scores them with triad-eval's
// scorer: a set whose every pass stays within 20 as usual (each context
// once), a set that reaches past it as rows of their own, those within it
// batched apart. (The layouts' rows: ChoiceBatches.RowsWithinTheOriginal-
// ContextAreBatchedApart, mpi.train_qwen3_options_match_one_process.)
TEST(Trainer, LongRopeQuestionsTakeTheFactorsOfEachRequestReadAlone) {
  TempDir dir;
  Config c = small_config(dir, 2);
  c.model.vocab_size = 256;  // byte tokens
  c.model.seq_len = 64;
  c.model.position_embedding = nn::PositionEmbedding::Rotary;
  RopeScaling& rope = c.model.rope_scaling;
  rope.kind = RopeScaling::Kind::LongRope;
  rope.original_seq_len = 20;
  rope.factor = 3.2;  // (seq_len 64 over 20)
  ASSERT_EQ(set_rope_factors(rope, {1.0, 1.5, 2.0, 3.0}, {2.0, 5.0, 11.0, 23.0}), "");
  {
    std::ofstream s(dir.file("short.jsonl")), m(dir.file("mixed.jsonl"));
    for (auto* f : {&s, &m}) {
      *f << R"({"context": "abcab", "choices": ["c", "ca b"], "answer": 1})"
         << "\n"
         << R"({"context": "xyz x", "choices": ["y", "z", "zz"], "answer": 1})"
         << "\n";
    }
    m << R"({"context": "the quick brown fox jumps over the lazy dog", "choices": ["a", "b", "c"],)"
      << R"( "answer": 0})"
      << "\n"
      // 21 inputs: its context alone would stay within the original 20.
      << R"({"context": "abcdefghijklmnopq", "choices": ["rstu", "xy"], "answer": 0})"
      << "\n";
  }
  c.eval.choices = {{"short", dir.file("short.jsonl")}, {"mixed", dir.file("mixed.jsonl")}};
  // Trained until its attention leans on positions, so the factors show.
  c.train.steps = 60;
  c.train.lr = 3e-2;
  Trainer t(c);
  t.run();
  nn::Gpt model(c.model, 7);
  model.load_state_dict(t.full_state_dict());
  const data::ByteTokenizer bytes;
  for (size_t set = 0; set < 2; ++set) {
    SCOPED_TRACE(c.eval.choices[set].name);
    // Each request as one row of its own length, and (to show that the
    // factors matter) padded to the window, which takes the long ones.
    double right = 0, nll = 0, tokens = 0, padded_nll = 0;
    const auto questions = data::read_choice_questions(c.eval.choices[set].path);
    for (const auto& q : questions) {
      std::vector<nn::ContinuationScore> scores;
      std::vector<int64_t> chars;
      for (size_t i = 0; i < q.choices.size(); ++i) {
        auto [ctx, cont] =
            data::encode_context_and_continuation(bytes, q.context_of(i), " " + q.choices[i]);
        const nn::RequestRow row = nn::request_row({std::vector<int64_t>(ctx.begin(), ctx.end()),
                                                    std::vector<int64_t>(cont.begin(), cont.end())},
                                                   c.model.seq_len);
        std::vector<int64_t> targets = row.targets;
        std::fill(targets.begin(), targets.end() - static_cast<std::ptrdiff_t>(cont.size()), -100);
        const auto n = static_cast<int64_t>(row.inputs.size());
        const double mean = item(model.loss(from_vector(row.inputs, {1, n}, DType::I64),
                                            from_vector(targets, {1, n}, DType::I64)));
        std::vector<int64_t> wide_in = row.inputs, wide_tg = targets;
        wide_in.resize(64, 0);
        wide_tg.resize(64, -100);
        const double wide = item(model.loss(from_vector(wide_in, {1, 64}, DType::I64),
                                            from_vector(wide_tg, {1, 64}, DType::I64)));
        const auto k = static_cast<int64_t>(cont.size());
        scores.push_back({mean * static_cast<double>(k), k});
        if (static_cast<int>(i) == q.answer) padded_nll += wide * static_cast<double>(k);
        chars.push_back(data::utf8_characters(q.choices[i]));
      }
      right += nn::pick_choice(scores, chars).total == q.answer;
      nll += scores[static_cast<size_t>(q.answer)].nll;
      tokens += static_cast<double>(scores[static_cast<size_t>(q.answer)].tokens);
    }
    const StepMetrics::ChoiceScores got = t.evaluate_choices(set);
    EXPECT_EQ(got.questions, static_cast<int64_t>(questions.size()));
    EXPECT_DOUBLE_EQ(got.acc, right / static_cast<double>(questions.size()));
    EXPECT_NEAR(got.answer_loss, nll / tokens, 1e-6 * nll / tokens);
    EXPECT_GT(std::abs(padded_nll - nll) / tokens, 1e-3);  // (1.8e-3 and 1.2e-3 here)
  }
}

TEST(Trainer, ContinuesTheSamplePromptsAtEveryEvaluation) {
  TempDir dir;
  Config plain = small_config(dir, 2);
  plain.model.vocab_size = 256;  // byte tokens
  plain.model.eod_token = 3;     // a byte the samples may stop at
  plain.train.steps = 4;
  Config with = plain;
  with.eval.samples = {"\x05\x0c\x13", "\x1a"};
  with.eval.sample_tokens = 12;
  with.eval.sample_temperature = 1.5;
  with.eval.sample_top_k = 8;
  with.eval.interval = 2;
  with.output_dir = dir.file("out_samples");
  const auto without = Trainer(plain).run();
  Trainer t(with);
  const auto sampled = t.run();
  ASSERT_EQ(sampled.size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(sampled[k].loss, without[k].loss) << "step " << k + 1;  // sampling changes nothing
    EXPECT_EQ(sampled[k].samples.size(), k == 1 || k == 3 ? 2u : 0u) << "step " << k + 1;
  }
  // Each is what generate() continues its prompt with on the final weights
  // (eval.sample_*, drawn with train.seed, up to the end-of-document byte,
  // which is not shown).
  nn::Gpt model(with.model, 7);
  model.load_state_dict(t.full_state_dict());
  nn::SamplingOptions o;
  o.max_new_tokens = 12;
  o.temperature = 1.5;
  o.top_k = 8;
  o.seed = with.train.seed;
  o.vocab_limit = 256;
  o.stop_tokens = {3};
  for (size_t i = 0; i < 2; ++i) {
    const std::string& prompt = with.eval.samples[i];
    EXPECT_EQ(sampled.back().samples[i].first, prompt);
    std::vector<int64_t> ids(prompt.begin(), prompt.end());
    std::vector<int64_t> out = nn::generate(model, ids, o);
    if (!out.empty() && out.back() == 3) out.pop_back();
    EXPECT_EQ(sampled.back().samples[i].second, std::string(out.begin(), out.end())) << i;
  }
  // Drawn, not all alike.
  const std::string& text = sampled.back().samples[0].second;
  EXPECT_GE(std::set<char>(text.begin(), text.end()).size(), 2u) << text;
  // In metrics.jsonl on the steps that evaluated, and --eval-only samples too.
  std::ifstream in(dir.file("out_samples/metrics.jsonl"));
  int with_key = 0;
  for (std::string line; std::getline(in, line);) with_key += line.find("\"samples\"") != line.npos;
  EXPECT_EQ(with_key, 2);
  Config from_weights = with;
  from_weights.init_from = dir.file("out_samples/model.safetensors");
  const StepMetrics once = Trainer(from_weights).evaluate_only();
  EXPECT_EQ(once.samples, sampled.back().samples);
  // A prompt the tokenizer makes nothing of, or a tokenizer larger than the
  // model, is a ConfigError naming it.
  Config bad = with;
  bad.model.vocab_size = 200;
  try {
    Trainer{bad};
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("eval.samples: the tokenizer has 256 tokens"),
              std::string::npos)
        << e.what();
  }
}

TEST(Trainer, ValidationDataErrorsNameTheNumbers) {
  TempDir dir;
  Config c = small_config(dir, 2);
  EXPECT_THROW(Trainer(c).evaluate(), ValueError);  // no data.val
  // 3 tokens: no whole sequence.
  data::write_token_shard(dir.file("tiny.bin"), {1, 2, 3});
  c.data_val = {{"", dir.file("tiny.bin")}};
  EXPECT_THROW(Trainer{c}, IoError);
  // 3 sequences: fewer than one global batch of 4.
  data::write_token_shard(dir.file("short.bin"), std::vector<uint16_t>(3 * 16 + 1, 5));
  c.data_val = {{"", dir.file("short.bin")}};
  try {
    Trainer t(c);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 3 sequences of model.seq_len + 1 tokens, fewer "
                                         "than one global batch (train.global_batch_size = 4)"),
              std::string::npos)
        << e.what();
  }
  // 37 sequences: 9 whole global batches by default, 10 are too many.
  data::write_token_shard(dir.file("val.bin"), validation_tokens());
  c.data_val = {{"", dir.file("val.bin")}};
  EXPECT_EQ(Trainer(c).eval_batches(), 9);
  c.eval.batches = 10;
  try {
    Trainer t(c);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("eval.batches (10) global batches of 4 sequences need 40 "
                                         "validation sequences, but data.val"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("holds 37"), std::string::npos) << e.what();
  }
}

TEST(Trainer, TrainsOnAMegatronDatasetAsOnTheSameTokensInAShard) {
  TempDir dir;
  Config shard = small_config(dir, 2);
  // The same 4000 tokens as train.bin, as a Megatron dataset of int32
  // tokens in documents of 7 to 150 tokens.
  std::vector<std::vector<int64_t>> docs;
  for (int i = 0, n = 7; i < 4000; n = 7 + (n * 13) % 144) {
    docs.emplace_back();
    for (int k = 0; k < n && i < 4000; ++k, ++i) docs.back().push_back((i * 7 + i / 13) % 31);
  }
  data::write_indexed_dataset(dir.file("mega"), docs, data::IndexedDType::I32);
  Config mega = shard;
  mega.data_train = {{dir.file("mega")}};
  mega.data_val = {{"", dir.file("mega.bin")}};  // the prefix or either file names it
  mega.output_dir = dir.file("out_mega");
  const auto a = Trainer(shard).run();
  const auto b = Trainer(mega).run();
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k].loss, b[k].loss) << "step " << k + 1;
  ASSERT_TRUE(b.back().val_loss.has_value());
}

TEST(Trainer, StartsFromSafetensorsAndRejectsMissingData) {
  TempDir dir;
  Config c = small_config(dir, 4);
  c.train.steps = 1;
  Trainer a(c);
  a.run();
  Config from = c;
  from.init_from = dir.file("out/model.safetensors");
  from.train.seed = 999;  // different random init, overwritten by the file
  Trainer b(from);
  for (auto& [name, t] : a.full_state_dict()) {
    EXPECT_EQ(to_double_vector(t), to_double_vector(b.full_state_dict().at(name))) << name;
  }
  Config missing = c;
  missing.data_train = {{dir.file("nope_*.bin")}};
  EXPECT_THROW(Trainer{missing}, IoError);
  Config cuda = c;
  cuda.device = "cuda";
  EXPECT_THROW(Trainer{cuda}, NotSupportedError);
  // A layout that does not match the world is refused before any communicator.
  Config wide = c;
  wide.parallel.tp = 2;
  try {
    Trainer t(wide);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("world size (1) must be divisible by tp*pp = 2*1 = 2"),
              std::string::npos)
        << e.what();
  }
  Config fixed = c;
  fixed.parallel.dp = 2;  // given explicitly: must match the world
  try {
    Trainer t(fixed);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("world size (1) must equal tp*pp*dp = 1*1*2 = 2"),
              std::string::npos)
        << e.what();
  }
  // Context parallelism's ranks count in the world too.
  Config chunked = c;
  chunked.parallel.cp = 2;
  try {
    Trainer t(chunked);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(
        std::string(e.what()).find("world size (1) must be divisible by tp*pp*cp = 1*1*2 = 2"),
        std::string::npos)
        << e.what();
  }
  chunked.parallel.dp = 3;
  try {
    Trainer t(chunked);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("world size (1) must equal tp*pp*dp*cp = 1*1*3*2 = 6"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace triad::train
