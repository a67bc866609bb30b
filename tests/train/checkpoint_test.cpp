#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <thread>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "triad/core/allocator.h"
#include "triad/core/checksum.h"
#include "triad/data/token_dataset.h"
#include "triad/data/token_shard.h"
#include "triad/io/checkpoint.h"
#include "triad/ops.h"
#include "triad/train/checkpoint_reshard.h"
#include "triad/train/trainer.h"

namespace triad::train {
namespace {

using triad::testing::expect_error;
using triad::testing::TempDir;

Config ckpt_config(const TempDir& dir, int64_t steps, int64_t interval, const std::string& resume) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back(static_cast<uint16_t>((i * 7 + i / 13) % 31));
  data::write_token_shard(dir.file("train.bin"), tokens);
  return parse_config(
      "model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 32, seq_len: 16, dropout: 0.1}\n"
      "train: {steps: " +
      std::to_string(steps) +
      ", global_batch_size: 4, micro_batch_size: 2, lr: 1.0e-2, warmup_steps: 2}\n"
      "data: {train: " +
      dir.file("train.bin") +
      "}\n"
      "output: {dir: " +
      dir.file("out") +
      "}\n"
      "checkpoint: {dir: " +
      dir.file("ckpt") + ", interval: " + std::to_string(interval) +
      ", keep: 5, resume: " + resume + "}\n");
}

void point_latest_to(const TempDir& dir, int64_t step) {
  std::ofstream(dir.file("ckpt/latest"), std::ios::trunc) << "step_" << step << "\n";
}

// checkpoint.load_optimizer false: the run takes the checkpoint's weights,
// counters and data position, and starts AdamW afresh, bitwise the run that
// resumes the same checkpoint with its moments zeroed and its optimizer step
// count at 0 — on the same layout and, with bf16 moments (another layout of
// the optimizer's state), through the resharding path.
TEST(Checkpoint, ResumingWithoutTheOptimizerStartsItAfresh) {
  for (const std::string moments : {"fp32", "bf16"}) {
    SCOPED_TRACE("moments " + moments);
    TempDir dir;
    std::vector<StepMetrics> whole;
    {
      Trainer t(ckpt_config(dir, 6, 3, "never"));
      whole = t.run();
    }
    // The reference checkpoint: step 3's, its moments zeroed.
    const auto info = io::open_checkpoint(dir.file("ckpt/step_3"));
    io::RankState st = io::read_rank_state(info, 0);
    for (auto& [key, t] : st.tensors) {
      if (key.rfind("adam_", 0) == 0) t = zeros(t.shape(), t.dtype());
    }
    st.metadata["optimizer_step"] = "0";
    const std::string fresh = dir.file("fresh");
    io::write_rank_state(io::checkpoint_staging_dir(fresh, 3), 0, st.tensors, st.metadata);
    io::commit_checkpoint(fresh, 3, 1, info.layout, info.config, 5);
    const auto resumed = [&](const std::string& from, bool optimizer) {
      Config c = ckpt_config(dir, 6, 0, from);
      c.checkpoint.dir = dir.file("elsewhere");
      c.checkpoint.load_optimizer = optimizer;
      c.train.moment_precision = moments;
      Trainer t(parse_config(to_yaml(c)));
      return t.run();
    };
    const auto got = resumed(dir.file("ckpt/step_3"), false);
    const auto want = resumed(fresh + "/step_3", true);
    ASSERT_EQ(got.size(), 3u);
    ASSERT_EQ(want.size(), 3u);
    bool differs = false;  // (from the run that kept its moments)
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(got[k].loss, want[k].loss) << "step " << got[k].step;
      EXPECT_EQ(got[k].lr, whole[3 + k].lr) << "step " << got[k].step;  // the schedule goes on
      differs = differs || got[k].loss != whole[3 + k].loss;
    }
    EXPECT_TRUE(differs);
  }
  TempDir dir;
  EXPECT_NE(to_yaml(parse_config(to_yaml(ckpt_config(dir, 6, 3, "auto")),
                                 {"checkpoint.load_optimizer=false"}))
                .find("load_optimizer: false"),
            std::string::npos);
}

// checkpoint.save_optimizer false: the checkpoints hold the weights but no
// moments, and a run resuming one starts the optimizer afresh by itself:
// bitwise a load_optimizer false resume of a whole checkpoint.
TEST(Checkpoint, ACheckpointWithoutTheOptimizerResumesWithAFreshOne) {
  TempDir dir;
  {
    Trainer t(ckpt_config(dir, 6, 3, "never"));
    t.run();
  }
  Config lean = ckpt_config(dir, 3, 3, "never");
  lean.checkpoint.dir = dir.file("lean");
  lean.checkpoint.save_optimizer = false;
  {
    Trainer t(parse_config(to_yaml(lean)));
    t.run();
  }
  const auto whole = io::read_rank_state(io::open_checkpoint(dir.file("ckpt/step_3")), 0);
  const auto slim = io::read_rank_state(io::open_checkpoint(dir.file("lean/step_3")), 0);
  for (const auto& [key, t] : whole.tensors) {
    const bool moment = key.rfind("adam_", 0) == 0;
    EXPECT_EQ(slim.tensors.count(key), moment ? 0u : 1u) << key;
    if (!moment) {
      EXPECT_EQ(to_double_vector(slim.tensors.at(key)), to_double_vector(t)) << key;
    }
  }
  EXPECT_EQ(slim.metadata.at("optimizer_state"), "none");
  const auto resumed = [&](const std::string& from, bool load) {
    Config c = ckpt_config(dir, 6, 0, from);
    c.checkpoint.dir = dir.file("elsewhere");
    c.checkpoint.load_optimizer = load;
    Trainer t(parse_config(to_yaml(c)));
    return t.run();
  };
  const auto got = resumed(dir.file("lean/step_3"), true);
  const auto want = resumed(dir.file("ckpt/step_3"), false);
  ASSERT_EQ(got.size(), 3u);
  ASSERT_EQ(want.size(), 3u);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(got[k].loss, want[k].loss) << "step " << got[k].step;
}

TEST(Checkpoint, ResumedRunReproducesTheUninterruptedLossesBitwise) {
  TempDir dir;
  std::vector<StepMetrics> whole;
  {
    Trainer t(ckpt_config(dir, 8, 3, "never"));  // checkpoints at steps 3, 6, 8
    whole = t.run();
  }
  ASSERT_TRUE(std::filesystem::exists(dir.file("ckpt/step_3/manifest.json")));
  ASSERT_TRUE(std::filesystem::exists(dir.file("ckpt/step_6/rank_0.safetensors")));
  // As if the job had died after step 3: resume from there.
  point_latest_to(dir, 3);
  Trainer again(ckpt_config(dir, 8, 0, "auto"));
  auto rest = again.run();
  ASSERT_EQ(rest.size(), 5u);
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].step, whole[3 + i].step);
    EXPECT_EQ(rest[i].loss, whole[3 + i].loss) << "step " << rest[i].step;  // bitwise
    EXPECT_EQ(rest[i].grad_norm, whole[3 + i].grad_norm);
    EXPECT_EQ(rest[i].lr, whole[3 + i].lr);
  }
  // metrics.jsonl goes on as one history: the first run's steps 1-3 (up to
  // the checkpoint), then the resumed run's 4-8 in place of the first run's.
  std::ifstream in(dir.file("out/metrics.jsonl"));
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) {
    steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
}

// Resumed from the checkpoint of step 2 (`resumed` in auto mode), a run of
// 4 steps gives `whole`'s last two losses and norms bit for bit.
void expect_resumes_from_step_2_bitwise(const TempDir& dir, const Config& resumed,
                                        const std::vector<StepMetrics>& whole) {
  point_latest_to(dir, 2);
  Trainer again(resumed);
  const auto rest = again.run();
  ASSERT_EQ(rest.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(rest[i].loss, whole[2 + i].loss) << "step " << rest[i].step;
    EXPECT_EQ(rest[i].grad_norm, whole[2 + i].grad_norm);
  }
}

// train.weight_decay_schedule: a run whose decay falls linearly from 1 to 0
// over its first two steps (1, 0.5, then 0) is bit for bit the run that
// trains under a constant 1, is resumed from its first step's checkpoint
// under 0.5, and from that run's second under 0: the trainer gives every
// optimizer each step's decay, and the decay follows the step wherever a
// run resumes. metrics.jsonl records each step's decay.
TEST(Checkpoint, AWeightDecayScheduleIsEachStepsConstantDecay) {
  auto with_decay = [](Config c, double wd) {
    c.train.weight_decay = wd;
    return c;
  };
  std::vector<StepMetrics> scheduled;
  nn::StateDict scheduled_weights;
  {
    TempDir dir;
    Config c = ckpt_config(dir, 4, 0, "never");
    c.train.weight_decay_schedule = "linear";
    c.train.weight_decay_start = 1.0;
    c.train.weight_decay = 0.0;
    c.train.weight_decay_steps = 2;
    Trainer t(c);
    scheduled = t.run();
    scheduled_weights = t.full_state_dict();
    std::ifstream in(dir.file("out/metrics.jsonl"));
    std::vector<double> decays;
    for (std::string line; std::getline(in, line);)
      decays.push_back(nlohmann::json::parse(line).at("weight_decay").get<double>());
    EXPECT_EQ(decays, (std::vector<double>{1.0, 0.5, 0.0, 0.0}));
  }
  TempDir dir;
  std::vector<StepMetrics> pieces;
  {
    Trainer t(with_decay(ckpt_config(dir, 4, 1, "never"), 1.0));
    pieces.push_back(t.run().at(1));  // (step 2: after the first update, under 1)
  }
  point_latest_to(dir, 1);
  {
    Trainer t(with_decay(ckpt_config(dir, 4, 1, "auto"), 0.5));
    pieces.push_back(t.run().at(1));  // step 3: after the second, under 0.5
  }
  point_latest_to(dir, 2);
  Trainer last(with_decay(ckpt_config(dir, 4, 1, "auto"), 0.0));
  pieces.push_back(last.run().at(1));  // step 4
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i].step, scheduled[i + 1].step);
    EXPECT_EQ(pieces[i].loss, scheduled[i + 1].loss) << "step " << pieces[i].step;
    EXPECT_EQ(pieces[i].grad_norm, scheduled[i + 1].grad_norm) << "step " << pieces[i].step;
  }
  const nn::StateDict weights = last.full_state_dict();
  ASSERT_EQ(weights.size(), scheduled_weights.size());
  for (const auto& [name, w] : weights)
    EXPECT_EQ(to_double_vector(w), to_double_vector(scheduled_weights.at(name))) << name;
  // (And the decay matters: under a constant 0.5 the losses differ.)
  TempDir other;
  Trainer constant(with_decay(ckpt_config(other, 4, 0, "never"), 0.5));
  EXPECT_NE(constant.run().at(3).loss, scheduled[3].loss);
}

// A plain 4-step run checkpointed at step 2, then resumed from there with
// `change` made to its config: the whole run's metrics and the resumed
// steps'.
struct Resumed {
  std::vector<StepMetrics> whole, rest;
};
Resumed resume_plain_run_changed(const TempDir& dir, const std::function<void(Config&)>& change) {
  Resumed r;
  {
    Trainer t(ckpt_config(dir, 4, 2, "never"));
    r.whole = t.run();
  }
  point_latest_to(dir, 2);
  Config c = ckpt_config(dir, 4, 0, "auto");
  change(c);
  Trainer t(c);
  r.rest = t.run();
  return r;
}

// train.freeze: a run with frozen parameters resumes bit for bit; resumed
// with them unfrozen, it starts from the same weights (the same loss) and
// trains them from zero moments (their checkpoint holds no optimizer state).
TEST(Checkpoint, AFrozenRunResumesBitwiseAndCanBeUnfrozen) {
  TempDir dir;
  const std::vector<std::string> freeze{"wte.weight", "h.[0-0].*"};
  auto frozen_config = [&](int64_t steps, int64_t interval, const std::string& resume) {
    Config c = ckpt_config(dir, steps, interval, resume);
    c.train.freeze = freeze;
    return c;
  };
  std::vector<StepMetrics> whole;
  std::map<std::string, std::vector<double>> end;
  {
    Trainer t(frozen_config(4, 2, "never"));
    whole = t.run();
    for (const auto& [name, v] : t.full_state_dict()) end[name] = to_double_vector(v);
  }
  expect_resumes_from_step_2_bitwise(dir, frozen_config(4, 0, "auto"), whole);
  point_latest_to(dir, 2);
  Trainer unfrozen(ckpt_config(dir, 4, 0, "auto"));
  const auto rest = unfrozen.run();
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].loss, whole[2].loss);            // the checkpoint's weights
  EXPECT_GT(rest[0].grad_norm, whole[2].grad_norm);  // more gradients in the norm
  for (const auto& [name, v] : unfrozen.full_state_dict()) {
    const bool was_frozen = name == "wte.weight" || name.rfind("h.0.", 0) == 0;
    if (!was_frozen) continue;
    EXPECT_NE(to_double_vector(v), end.at(name)) << name << " did not train";
  }
}

// train.optimizer muon: a run resumes bit for bit (the momentum of its
// matrices in the checkpoint), in fp32 and through bf16's masters; resumed
// under AdamW (or an AdamW run under Muon) it starts from the checkpoint's
// weights, the new optimizer's state from zero.
TEST(Checkpoint, AMuonRunResumesBitwiseAndCanChangeOptimizer) {
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    TempDir dir;
    auto with = [&](const std::string& optimizer, int64_t interval, const std::string& resume) {
      Config c = ckpt_config(dir, 4, interval, resume);
      c.train.optimizer = optimizer;
      c.train.precision = precision;
      return c;
    };
    std::vector<StepMetrics> whole;
    {
      Trainer t(with("muon", 2, "never"));
      whole = t.run();
    }
    expect_resumes_from_step_2_bitwise(dir, with("muon", 0, "auto"), whole);
    // Without the momentum the resumed steps differ: the checkpoint's is used.
    point_latest_to(dir, 2);
    Trainer adamw(with("adamw", 0, "auto"));
    const auto rest = adamw.run();
    ASSERT_EQ(rest.size(), 2u);
    EXPECT_EQ(rest[0].loss, whole[2].loss);  // the checkpoint's weights
    EXPECT_NE(rest[1].loss, whole[3].loss);  // AdamW's step, not Muon's
  }
  // An AdamW checkpoint resumed under Muon.
  TempDir dir;
  const auto [whole, rest] =
      resume_plain_run_changed(dir, [](Config& c) { c.train.optimizer = "muon"; });
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].loss, whole[2].loss);
  EXPECT_NE(rest[1].loss, whole[3].loss);
}

// train.moment_precision bf16: the checkpoint holds the moments (AdamW's,
// Muon's momentum) as bf16, the run resumes bit for bit, and a checkpoint
// written with either storage resumes under the other (its moments cast).
TEST(Checkpoint, Bf16MomentsResumeBitwiseAndCarryOverToF32Moments) {
  for (const std::string optimizer : {"adamw", "muon"}) {
    for (const std::string precision : {"fp32", "bf16"}) {
      SCOPED_TRACE(optimizer + " " + precision);
      TempDir dir;
      auto with = [&](const std::string& moments, int64_t interval, const std::string& resume) {
        Config c = ckpt_config(dir, 5, interval, resume);
        c.train.optimizer = optimizer;
        c.train.precision = precision;
        c.train.moment_precision = moments;
        return c;
      };
      std::vector<StepMetrics> whole;
      {
        Trainer t(with("bf16", 2, "never"));
        whole = t.run();
      }
      const io::CheckpointInfo info = io::open_checkpoint(dir.file("ckpt/step_2"));
      EXPECT_EQ(info.layout.at("moments"), "bf16");
      const io::RankState st = io::read_rank_state(info, 0);
      int moments = 0;
      for (const auto& [key, t] : st.tensors) {
        if (key.rfind("adam_m/", 0) == 0 || key.rfind("adam_v/", 0) == 0 ||
            key.rfind("muon_momentum/", 0) == 0) {
          EXPECT_EQ(t.dtype(), DType::BF16) << key;
          ++moments;
        } else if (key.rfind("master/", 0) == 0) {
          EXPECT_EQ(t.dtype(), DType::F32) << key;
        }
      }
      EXPECT_GT(moments, 0);
      EXPECT_TRUE(st.tensors.count(optimizer == "muon" ? "muon_momentum/h.0.attn.c_proj.weight"
                                                       : "adam_m/h.0.attn.c_proj.weight"));
      point_latest_to(dir, 2);
      {
        Trainer again(with("bf16", 0, "auto"));
        const auto rest = again.run();
        ASSERT_EQ(rest.size(), 3u);
        for (size_t i = 0; i < rest.size(); ++i) {
          EXPECT_EQ(rest[i].loss, whole[2 + i].loss) << "step " << rest[i].step;  // bitwise
          EXPECT_EQ(rest[i].grad_norm, whole[2 + i].grad_norm);
        }
      }
      // Under f32 moments: the checkpoint's moments widened exactly, so the
      // first step's update is the bf16 run's (which updates with its
      // moments unrounded) and so is the next loss; after it the moments
      // are no longer rounded, and the runs part.
      point_latest_to(dir, 2);
      Trainer wide(with("fp32", 0, "auto"));
      const auto rest = wide.run();
      ASSERT_EQ(rest.size(), 3u);
      EXPECT_EQ(rest[0].loss, whole[2].loss);
      EXPECT_EQ(rest[1].loss, whole[3].loss);
      EXPECT_EQ(rest[1].grad_norm, whole[3].grad_norm);
      EXPECT_NE(rest[2].loss, whole[4].loss);
      EXPECT_NEAR(rest[2].loss, whole[4].loss, 1e-3 * whole[4].loss);
    }
  }
  // An f32-moment checkpoint resumed with bf16 moments: the moments round
  // once, and the run goes on near the f32 one.
  TempDir dir;
  const auto [whole, rest] =
      resume_plain_run_changed(dir, [](Config& c) { c.train.moment_precision = "bf16"; });
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].loss, whole[2].loss);
  EXPECT_NE(rest[1].loss, whole[3].loss);
  EXPECT_NEAR(rest[1].loss, whole[3].loss, 1e-3 * whole[3].loss);
}

// model.lora: a run resumes bit for bit (the checkpoint keeps the adapters
// apart), and a run without adapters started from that checkpoint
// (init.from) starts from its weights with the adapters merged in.
TEST(Checkpoint, ALoraRunResumesBitwiseAndItsCheckpointLoadsMerged) {
  TempDir dir;
  auto lora_config = [&](int64_t steps, int64_t interval, const std::string& resume) {
    Config c = ckpt_config(dir, steps, interval, resume);
    c.model.lora = {.rank = 2, .alpha = 3, .targets = {"attn.c_attn", "attn.c_proj"}};
    c.train.lr = 3e-2;
    return c;
  };
  std::vector<StepMetrics> whole;
  nn::StateDict at_two;
  {
    Trainer t(lora_config(4, 2, "never"));
    for (int64_t k = 0; k < 2; ++k) t.step(k);
    for (const auto& [name, v] : t.full_state_dict()) at_two[name] = clone(v);
  }
  std::filesystem::remove_all(dir.file("ckpt"));
  std::filesystem::remove_all(dir.file("out"));
  {
    Trainer t(lora_config(4, 2, "never"));
    whole = t.run();
  }
  expect_resumes_from_step_2_bitwise(dir, lora_config(4, 0, "auto"), whole);
  // Resumed without them (or with others), the weights would lose what the
  // adapters learnt: refused, naming both and the way out.
  point_latest_to(dir, 2);
  try {
    Trainer(ckpt_config(dir, 4, 0, "auto")).run();
    FAIL() << "expected an IoError";
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("was written with LoRA adapters rank=2 scale=1.5"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("this run has none"), std::string::npos) << msg;
    EXPECT_NE(msg.find("init.from"), std::string::npos) << msg;
  }
  Config plain = ckpt_config(dir, 1, 0, "never");
  plain.init_from = dir.file("ckpt/step_2");
  plain.checkpoint.dir.clear();
  Trainer from(plain);
  const nn::StateDict got = from.full_state_dict();
  EXPECT_EQ(got.size(), nn::gpt_parameter_shapes(plain.model).size());
  for (const auto& [name, t] : got) {
    const std::string stem = name.substr(0, name.size() - std::string("weight").size());
    const bool adapted = at_two.count(stem + "lora_a") > 0;
    const Tensor want = adapted ? nn::merge_lora(at_two.at(name), at_two.at(stem + "lora_a"),
                                                 at_two.at(stem + "lora_b"), 1.5)
                                : at_two.at(name);
    const auto a = to_double_vector(t), b = to_double_vector(want);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-7) << name << "[" << i << "]";
    if (adapted) {
      EXPECT_NE(a, to_double_vector(at_two.at(name))) << name;
    }
  }
}

// model.moe.expert_bias: each applied step moves every bias by the rate (up,
// down, or not at all for an expert at the mean load); the biases stay f32
// in a bf16 run; they change the routing, and so the losses; and a run
// resumes bit for bit with them (they are in the checkpoint).
TEST(Checkpoint, ExpertBiasesMoveStayF32AndResumeBitwise) {
  TempDir dir;
  const double rate = 0.125;  // (a binary fraction: its sums are exact in f32)
  auto biased = [&](int64_t steps, int64_t interval, const std::string& resume, double r) {
    Config c = ckpt_config(dir, steps, interval, resume);
    auto& m = c.model.moe;
    m.experts = 4;
    m.top_k = 2;
    m.ffn_hidden_size = 16;
    m.aux_loss_coef = 0;
    m.score = nn::GptConfig::Moe::Score::Sigmoid;
    m.expert_bias = true;
    m.bias_update_rate = r;
    c.train.precision = "bf16";
    return c;
  };
  {
    // After one step each bias is -rate, 0 or +rate.
    Trainer t(biased(4, 2, "never", rate));
    t.step(0);
    const nn::StateDict state = t.full_state_dict();
    for (const char* name : {"h.0.mlp.expert_bias", "h.1.mlp.expert_bias"}) {
      const Tensor& b = state.at(name);
      EXPECT_EQ(b.dtype(), DType::F32) << name;
      EXPECT_EQ(state.at("h.0.mlp.router.weight").dtype(), DType::BF16);
      bool moved = false;
      for (const double v : to_double_vector(b)) {
        EXPECT_EQ(v / rate, std::round(v / rate)) << name << ": " << v;
        EXPECT_LE(std::abs(v), rate) << name;
        moved = moved || v != 0;
      }
      EXPECT_TRUE(moved) << name << " never moved";
    }
  }
  std::vector<StepMetrics> whole;
  {
    Trainer t(biased(4, 2, "never", rate));
    whole = t.run();
  }
  expect_resumes_from_step_2_bitwise(dir, biased(4, 0, "auto", rate), whole);
  std::filesystem::remove_all(dir.file("ckpt"));
  Trainer fixed(biased(4, 0, "never", 0.0));
  const auto unbiased = fixed.run();
  for (const auto& [name, t] : fixed.full_state_dict()) {
    if (name.find("expert_bias") != std::string::npos) {
      EXPECT_EQ(to_double_vector(t), std::vector<double>(4, 0.0)) << name;
    }
  }
  EXPECT_EQ(unbiased[0].loss, whole[0].loss);  // (the biases start at zero)
  EXPECT_NE(unbiased[3].loss, whole[3].loss);
}

// train.exit_after_minutes: a run past its time checkpoints after the step
// it is in and ends; resumed, it goes on where it stopped, its metrics one
// history. (A limit of a microsecond: the first step is past it.)
TEST(Checkpoint, ARunPastItsTimeLimitCheckpointsAndEnds) {
  TempDir dir;
  Config c = ckpt_config(dir, 4, 0, "auto");
  c.train.exit_after_minutes = 1e-8;
  const std::vector<StepMetrics> first = Trainer(c).run();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(dir.file("ckpt/step_1/manifest.json")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("out/model.safetensors")));
  c.train.exit_after_minutes = 0;
  const std::vector<StepMetrics> rest = Trainer(c).run();
  ASSERT_EQ(rest.size(), 3u);
  EXPECT_EQ(rest.front().step, 2);
  const std::vector<StepMetrics> whole = Trainer(ckpt_config(dir, 4, 0, "never")).run();
  EXPECT_EQ(rest.back().loss, whole.back().loss);  // bitwise the uninterrupted run's
}

// checkpoint.keep_every: besides the newest `keep`, the checkpoints of its
// multiples stay for good (milestones to evaluate or branch from later).
TEST(Checkpoint, RotationKeepsTheNewestAndEveryMilestone) {
  TempDir dir;
  Config c = ckpt_config(dir, 8, 1, "never");
  c.checkpoint.keep = 2;
  c.checkpoint.keep_every = 3;
  Trainer(c).run();
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("ckpt"))) {
    if (e.is_directory()) left.push_back(e.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step_3", "step_6", "step_7", "step_8"}));
}

// Averaged checkpoints (--average): the last three of a run's, up to a
// step directory or the dir's latest, parameter by parameter the mean of
// each one's weights as read_checkpoint_weights gives them, handed over in
// its parts (outside the blocks, then each block); more than the dir holds
// up to that step is named with the steps it does hold.
TEST(Checkpoint, AveragedCheckpointsAreTheMeanOfTheirWeights) {
  TempDir dir;
  const Config c = ckpt_config(dir, 6, 1, "never");
  Trainer(c).run();  // step_2 .. step_6 kept (keep 5)
  const std::vector<io::CheckpointInfo> infos = io::recent_checkpoints(dir.file("ckpt/step_5"), 3);
  ASSERT_EQ(infos.size(), 3u);
  EXPECT_EQ(infos[0].step, 5);
  EXPECT_EQ(infos[2].step, 3);
  EXPECT_EQ(io::recent_checkpoints(dir.file("ckpt"), 1)[0].step, 6);
  EXPECT_EQ(io::recent_checkpoints(dir.file("ckpt/step_4/"), 2)[1].step, 3);
  auto whole = [&](const io::CheckpointInfo& info) {
    nn::StateDict all;
    read_checkpoint_weights(info, c.model, [&](nn::StateDict&& part) { all.merge(part); });
    return all;
  };
  const nn::StateDict a = whole(infos[0]), b = whole(infos[1]), d = whole(infos[2]);
  nn::StateDict mean;
  std::vector<size_t> parts;
  read_averaged_checkpoint_weights(infos, c.model, [&](nn::StateDict&& part) {
    parts.push_back(part.size());
    mean.merge(part);
  });
  EXPECT_EQ(parts.size(), 3u);  // outside the blocks, block 0, block 1
  ASSERT_EQ(mean.size(), a.size());
  double apart = 0;
  for (const auto& [name, t] : mean) {
    const std::vector<double> x = to_double_vector(a.at(name)), y = to_double_vector(b.at(name)),
                              z = to_double_vector(d.at(name)), got = to_double_vector(t);
    EXPECT_EQ(t.dtype(), a.at(name).dtype()) << name;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], (x[i] + y[i] + z[i]) / 3, 1e-6 * (1 + std::abs(x[i]))) << name;
      apart += std::abs(x[i] - z[i]);
    }
  }
  EXPECT_GT(apart, 1e-3);  // (the checkpoints differ)
  try {
    io::recent_checkpoints(dir.file("ckpt/step_3"), 3);
    FAIL() << "three checkpoints up to step 3 were found";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 2 checkpoint(s) up to step 3 (3, 2), not the 3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(read_averaged_checkpoint_weights({}, c.model, [](nn::StateDict&&) {}), ValueError);
}

TEST(Checkpoint, IncompleteWritesAreNeverPickedAndCorruptionIsNamed) {
  TempDir dir;
  {
    Trainer t(ckpt_config(dir, 4, 2, "never"));
    t.run();
  }
  // A write that died before its rename, and a directory the marker never
  // reached: both ignored, the marker's checkpoint is used.
  std::filesystem::create_directories(dir.file("ckpt/step_9.tmp"));
  std::ofstream(dir.file("ckpt/step_9.tmp/rank_0.safetensors")) << "junk";
  std::filesystem::copy(dir.file("ckpt/step_4"), dir.file("ckpt/step_7"),
                        std::filesystem::copy_options::recursive);
  auto info = io::find_latest_checkpoint(dir.file("ckpt"));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->step, 4);
  // keep: 5 kept both step_2 and step_4; flip one byte of the latest.
  const std::string file = dir.file("ckpt/step_4/rank_0.safetensors");
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    char c;
    f.read(&c, 1);
    f.seekp(200);
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  Trainer t(ckpt_config(dir, 6, 0, "auto"));
  try {
    t.run();
    FAIL() << "expected a checksum error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("corrupted"), std::string::npos) << e.what();
  }
}

// What a checkpoint directory holds that Triad did not write is named, not
// misread: a manifest of another form (the JSON library's type_error
// escaped), a marker naming no step_<N>, a step number past int64 (the
// directory is no checkpoint: std::stoll's out_of_range escaped), and rank
// metadata that is no number (std::stoll's invalid_argument escaped).
TEST(Checkpoint, WhatTriadDidNotWriteIsNamed) {
  TempDir dir;
  {
    Trainer t(ckpt_config(dir, 4, 2, "never"));
    t.run();
  }
  const std::string ckpt = dir.file("ckpt");
  std::filesystem::create_directories(dir.file("ckpt/step_99999999999999999999"));
  EXPECT_EQ(io::checkpoint_steps(ckpt), (std::vector<int64_t>{4, 2}));
  std::ofstream(dir.file("ckpt/latest"), std::ios::trunc) << "step_4/../step_2\n";
  expect_error<IoError>([&] { io::find_latest_checkpoint(ckpt); },
                        {"points to 'step_4/../step_2'"});
  point_latest_to(dir, 4);
  const std::string manifest = dir.file("ckpt/step_2/manifest.json");
  std::ifstream in(manifest);
  const nlohmann::json kept = nlohmann::json::parse(in);
  in.close();
  for (const std::string text : {"[1, 2]", R"({"format": 1})", "7"}) {
    std::ofstream(manifest, std::ios::trunc) << text;
    expect_error<IoError>([&] { io::read_checkpoint(dir.file("ckpt/step_2")); },
                          {"unknown format"});
  }
  std::ofstream(manifest, std::ios::trunc) << kept.dump();
  EXPECT_EQ(io::read_checkpoint(dir.file("ckpt/step_2")).step, 2);
  // Rank 0's next_step rewritten (its checksum with it): the resume names it.
  const std::string file = dir.file("ckpt/step_4/rank_0.safetensors");
  io::Safetensors rank = io::load_safetensors(file);
  rank.metadata.at("next_step") = "4x";
  io::save_safetensors(file, rank.tensors, rank.metadata);
  const std::string manifest4 = dir.file("ckpt/step_4/manifest.json");
  std::ifstream in4(manifest4);
  nlohmann::json m = nlohmann::json::parse(in4);
  in4.close();
  m["checksums"]["rank_0.safetensors"] =
      std::to_string(io::file_checksum(file, m.value("checksum", io::kChecksumFnv1a64)));
  std::ofstream(manifest4, std::ios::trunc) << m.dump();
  Trainer t(ckpt_config(dir, 6, 0, "auto"));
  expect_error<IoError>([&] { t.run(); }, {"metadata 'next_step' is '4x', expected an integer"});
}

// words64: any one flipped bit, anywhere (the four lanes, the zero-padded
// tail), and one more zero byte change it; fnv1a64 is still computed for
// older manifests; an unknown kind is named.
TEST(Checkpoint, TheChecksumSeesEveryBitAndTheLength) {
  TempDir dir;
  const std::string path = dir.file("f.bin");
  std::vector<uint8_t> bytes(1000 + 13);  // whole 32-byte groups and a tail
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
  testing::write_bytes(path, bytes);
  const uint64_t base = io::file_checksum(path);
  EXPECT_EQ(io::file_checksum(path, io::kChecksumWords64), base);
  EXPECT_EQ(words64_checksum(bytes.data(), bytes.size()), base);  // (the file's bytes')
  EXPECT_NE(io::file_checksum(path, io::kChecksumFnv1a64), base);
  std::set<uint64_t> seen{base};
  for (size_t at : {size_t{0}, size_t{9}, size_t{17}, size_t{31}, size_t{500}, size_t{1000},
                    size_t{1005}, bytes.size() - 1}) {
    for (int bit : {0, 7}) {
      std::vector<uint8_t> changed = bytes;
      changed[at] = static_cast<uint8_t>(changed[at] ^ (1u << bit));
      testing::write_bytes(path, changed);
      EXPECT_TRUE(seen.insert(io::file_checksum(path)).second) << "byte " << at << " bit " << bit;
    }
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  testing::write_bytes(path, longer);
  EXPECT_TRUE(seen.insert(io::file_checksum(path)).second) << "a zero byte more";
  EXPECT_THROW(io::file_checksum(path, "crc32"), IoError);
}

// keep_best: beside the newest `keep`, the checkpoint whose manifest has
// the lowest val_loss stays (the earliest of equals), named by the `best`
// marker, which opens as a checkpoint; a checkpoint without a validation
// loss is never the best. Without keep_best nothing of it happens.
TEST(Checkpoint, KeepBestKeepsTheLowestValidationLossAndMarksIt) {
  TempDir dir;
  const std::string root = dir.file("ck");
  auto commit = [&](int64_t step, std::optional<double> loss, bool keep_best) {
    io::write_rank_state(io::checkpoint_staging_dir(root, step), 0,
                         {{"t", randn({8}, static_cast<uint64_t>(step))}},
                         {{"next_step", std::to_string(step)}});
    return io::commit_checkpoint(root, step, 1, {}, "", 1, 0, loss, keep_best);
  };
  EXPECT_EQ(commit(1, 3.0, true), std::optional<int64_t>(1));
  EXPECT_EQ(commit(2, 2.5, true), std::optional<int64_t>(2));
  EXPECT_EQ(commit(3, std::nullopt, true), std::optional<int64_t>(2));  // (a signal's checkpoint)
  EXPECT_EQ(commit(4, 2.5, true), std::optional<int64_t>(2));
  EXPECT_EQ(commit(5, 2.75, true), std::optional<int64_t>(2));
  EXPECT_EQ(io::checkpoint_steps(root), (std::vector<int64_t>{5, 2}));
  const io::CheckpointInfo best = io::open_checkpoint(root + "/best");
  EXPECT_EQ(best.step, 2);
  EXPECT_EQ(best.val_loss, std::optional<double>(2.5));
  EXPECT_TRUE(io::is_checkpoint(root + "/best"));
  EXPECT_EQ(io::open_checkpoint(root + "/latest").step, 5);
  EXPECT_EQ(commit(6, 2.0, true), std::optional<int64_t>(6));
  EXPECT_EQ(io::checkpoint_steps(root), (std::vector<int64_t>{6}));
  // Without keep_best: the loss is kept in the manifest, the rest as before.
  EXPECT_EQ(commit(7, 1.0, false), std::nullopt);
  EXPECT_EQ(io::checkpoint_steps(root), (std::vector<int64_t>{7}));
  EXPECT_EQ(io::read_checkpoint(root + "/step_7").val_loss, std::optional<double>(1.0));
  // (The marker went with the checkpoint it named.)
  EXPECT_FALSE(std::filesystem::exists(root + "/best"));
}

// A run resumed from an earlier checkpoint commits below later ones (of the
// future it abandoned): retention counts and removes only this run's own,
// never the one just written, and leaves the later ones until the run
// replaces each at its step.
TEST(Checkpoint, RetentionAfterGoingBackKeepsTheNewRunsCheckpoints) {
  TempDir dir;
  const std::string root = dir.file("ck");
  auto commit = [&](int64_t step) {
    io::write_rank_state(io::checkpoint_staging_dir(root, step), 0,
                         {{"t", randn({8}, static_cast<uint64_t>(step))}},
                         {{"next_step", std::to_string(step)}});
    io::commit_checkpoint(root, step, 1, {}, "", 1);
  };
  for (int64_t step : {1, 2, 3, 4}) commit(step);
  EXPECT_EQ(io::checkpoint_steps(root), (std::vector<int64_t>{4}));
  // Back before step 2: its checkpoint stays beside the abandoned 4 (which
  // keep 1 counting 4 would have removed it for, `latest` naming nothing).
  commit(2);
  EXPECT_EQ(io::checkpoint_steps(root), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(io::find_latest_checkpoint(root)->step, 2);
  commit(3);
  EXPECT_EQ(io::checkpoint_steps(root), (std::vector<int64_t>{4, 3}));
  commit(4);  // (replaces the abandoned one)
  EXPECT_EQ(io::checkpoint_steps(root), (std::vector<int64_t>{4}));
  EXPECT_EQ(io::find_latest_checkpoint(root)->step, 4);
}

// Every rank hashes its own file as it writes it (rank_<r>.safetensors
// .checksum), and the commit takes that line instead of reading the file:
// a wrong line makes the checkpoint read as corrupted, a missing one is
// hashed at the commit. The lines do not stay in the checkpoint. A manifest
// from before words64 (no "checksum", FNV-1a values) still verifies.
TEST(Checkpoint, RanksHashTheirOwnFilesAndOldManifestsStillVerify) {
  TempDir dir;
  const std::string root = dir.file("ck");
  auto write = [&](int64_t step) {
    const std::string staging = io::checkpoint_staging_dir(root, step);
    for (int r = 0; r < 2; ++r) {
      io::write_rank_state(staging, r, {{"t", randn({64}, static_cast<uint64_t>(r + step))}},
                           {{"next_step", std::to_string(step)}});
    }
    return staging;
  };
  const std::string staging = write(1);
  EXPECT_TRUE(std::filesystem::exists(io::checkpoint_rank_file(staging, 1) + ".checksum"));
  io::commit_checkpoint(root, 1, 2, {}, "", 3);
  io::CheckpointInfo info = *io::find_latest_checkpoint(root);
  EXPECT_EQ(info.checksum, io::kChecksumWords64);
  for (const auto& e : std::filesystem::directory_iterator(info.step_dir))
    EXPECT_NE(e.path().extension(), ".checksum") << e.path();
  EXPECT_EQ(io::read_rank_state(info, 1).tensors.size(), 1u);
  // Rank 1's line is wrong; rank 0's is missing.
  const std::string staging2 = write(2);
  std::ofstream(io::checkpoint_rank_file(staging2, 1) + ".checksum") << "words64 12345\n";
  std::filesystem::remove(io::checkpoint_rank_file(staging2, 0) + ".checksum");
  io::commit_checkpoint(root, 2, 2, {}, "", 3);
  info = *io::find_latest_checkpoint(root);
  EXPECT_EQ(info.checksums.at(1), 12345u);
  EXPECT_EQ(io::read_rank_state(info, 0).tensors.size(), 1u);
  try {
    io::read_rank_state(info, 1);
    FAIL() << "the rank's wrong checksum was not used";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("corrupted"), std::string::npos) << e.what();
  }
  // An older manifest: no "checksum", FNV-1a over each file.
  const std::string manifest = info.step_dir + "/manifest.json";
  nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest));
  m.erase("checksum");
  for (int r = 0; r < 2; ++r) {
    m["checksums"]["rank_" + std::to_string(r) + ".safetensors"] = std::to_string(
        io::file_checksum(io::checkpoint_rank_file(info.step_dir, r), io::kChecksumFnv1a64));
  }
  std::ofstream(manifest) << m.dump();
  info = *io::find_latest_checkpoint(root);
  EXPECT_EQ(info.checksum, io::kChecksumFnv1a64);
  EXPECT_EQ(io::read_rank_state(info, 1).tensors.size(), 1u);
  m["checksum"] = "md5";
  std::ofstream(manifest) << m.dump();
  EXPECT_THROW(io::find_latest_checkpoint(root), IoError);
}

TEST(Checkpoint, ALayoutMismatchNamesTheDimension) {
  TempDir dir;
  {
    Trainer t(ckpt_config(dir, 2, 2, "never"));
    t.run();
  }
  Config other = ckpt_config(dir, 4, 0, "auto");
  other.model.n_layer = 3;
  Trainer t(other);
  try {
    t.run();
    FAIL();
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model = 2x16x2"), std::string::npos) << m;
    EXPECT_NE(m.find("model = 3x16x2"), std::string::npos) << m;
  }
}

// Directories that cannot be written fail the run before its first step,
// with the key and the path named (as root, too: a path under a plain file
// can never be a directory).
TEST(Checkpoint, UnwritableDirectoriesFailBeforeTheFirstStep) {
  TempDir dir;
  std::ofstream(dir.file("plain")) << "not a directory";
  Config c = ckpt_config(dir, 4, 2, "never");
  c.checkpoint.dir = dir.file("plain/ckpt");
  try {
    Trainer t(c);
    t.run();
    FAIL() << "expected an IoError";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("checkpoint.dir '" + dir.file("plain/ckpt") + "'"), std::string::npos) << m;
  }
  // No step ran, and metrics.jsonl is opened only once the run knows where
  // it starts (an earlier run's file would be left as it was).
  EXPECT_FALSE(std::filesystem::exists(dir.file("out/metrics.jsonl")));

  Config o = ckpt_config(dir, 4, 2, "never");
  o.output_dir = dir.file("plain/out");
  try {
    Trainer t(o);
    t.run();
    FAIL() << "expected an IoError";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("output.dir '" + dir.file("plain/out") + "' cannot be created"),
              std::string::npos)
        << m;
  }
}

// A manifest whose fields are missing or malformed is named, never a crash.
TEST(Checkpoint, AMalformedManifestIsNamed) {
  TempDir dir;
  {
    Trainer t(ckpt_config(dir, 2, 2, "never"));
    t.run();
  }
  const std::string path = dir.file("ckpt/step_2/manifest.json");
  std::string good;
  {
    std::ifstream in(path);
    good.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    std::ofstream(path, std::ios::trunc) << text;
  };
  const std::vector<std::tuple<std::string, std::string, std::string>> cases{
      {"\"step\":", "\"stop\":", "lacks or misstates step, layout or checksums"},
      {"rank_0.safetensors", "rank_x.safetensors", "lists 'rank_x.safetensors'"},
      {"\"rank_0.safetensors\": \"", "\"rank_0.safetensors\": \"-", "expected a decimal number"},
      {"rank_0.safetensors", "rank_99999999999.safetensors", "out of range"}};
  for (const auto& [from, to, expected] : cases) {
    SCOPED_TRACE(to);
    edit(from, to);
    try {
      io::find_latest_checkpoint(dir.file("ckpt"));
      ADD_FAILURE() << "expected an IoError";
    } catch (const IoError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << m;
      EXPECT_NE(m.find(expected), std::string::npos) << m;
    }
  }
}

// The data position is the count of sequences consumed, saved with the
// checkpoint: a run resumed with another global batch size reads on from
// there (with the step as the position it would skip or repeat data).
TEST(Checkpoint, AResumeWithAnotherGlobalBatchSizeContinuesTheData) {
  TempDir dir;
  std::vector<StepMetrics> first;
  {
    Trainer t(ckpt_config(dir, 2, 2, "never"));  // G 4: steps 1-2 read sequences 0-7
    first = t.run();
  }
  ASSERT_EQ(first.back().consumed_sequences, 8);
  Config bigger = ckpt_config(dir, 4, 0, "auto");
  bigger.train.global_batch_size = 8;  // 4 micro-batches of 2
  Trainer t(bigger);
  const auto rest = t.run();
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].consumed_sequences, 16);
  EXPECT_EQ(rest[1].consumed_sequences, 24);
  // Step 3's loss is that of sequences 8-15 under the checkpoint's weights,
  // with their dropout masks (seed, global micro-batch 8 / 2 + i: streams
  // follow the data, whatever the batch size).
  nn::Gpt model(bigger.model, 0);
  {
    // The weights after step 2: a fresh G-4 run from the same seed, two steps.
    Trainer again(ckpt_config(dir, 2, 0, "never"));
    for (int64_t k = 0; k < 2; ++k) again.step(k);
    model.load_state_dict(again.full_state_dict());
  }
  data::TokenDataset data({dir.file("train.bin")}, bigger.model.seq_len, bigger.model.vocab_size);
  auto loss_of = [&](int64_t first_sequence) {
    double sum = 0;
    for (int64_t i = 0; i < 4; ++i) {
      const data::Batch b = data.sequences(first_sequence + 2 * i, 2);
      const nn::ForwardContext ctx{true, static_cast<uint64_t>(bigger.train.seed),
                                   static_cast<uint64_t>(8 / 2 + i)};
      sum += item(model.loss(b.inputs, b.targets, ctx));
    }
    return sum / 4;
  };
  EXPECT_NEAR(rest[0].loss, loss_of(8), 1e-6 * rest[0].loss);
  // Sequences 16-23 (step 2 · G) would be another loss: the check can tell.
  EXPECT_GT(std::abs(loss_of(16) - loss_of(8)), 1e-4);
}

// A batch-size ramp is a run whose global batch changes where the ramp
// says: bitwise the run at the small batch resumed from a checkpoint with
// the large one (same data, dropout streams and updates; a constant lr
// keeps the schedules, which count differently, out of it).
TEST(Checkpoint, ARampedBatchEqualsASmallBatchRunResumedWithTheLargeOne) {
  const std::vector<std::string> constant = {"train.lr_decay=constant", "train.warmup_steps=0"};
  auto with = [](const Config& c, std::vector<std::string> overrides) {
    return parse_config(to_yaml(c), overrides);
  };
  std::vector<StepMetrics> ramped;
  {
    TempDir dir;
    // [2, 2, 8] up to G 4: 8 sequences at 2 a step, then 4.
    std::vector<std::string> o = constant;
    o.push_back("train.rampup_batch_size=[2, 2, 8]");
    Trainer t(with(ckpt_config(dir, 6, 0, "never"), o));
    ramped = t.run();
  }
  ASSERT_EQ(ramped.size(), 6u);
  std::vector<int64_t> sizes, consumed;
  for (const auto& m : ramped) {
    sizes.push_back(m.global_batch_size);
    consumed.push_back(m.consumed_sequences);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 2, 2, 2, 4, 4}));
  EXPECT_EQ(consumed, (std::vector<int64_t>{2, 4, 6, 8, 12, 16}));
  TempDir dir;
  std::vector<std::string> small = constant;
  small.push_back("train.global_batch_size=2");
  std::vector<StepMetrics> pieced;
  {
    Trainer t(with(ckpt_config(dir, 4, 4, "never"), small));
    pieced = t.run();
  }
  Trainer t(with(ckpt_config(dir, 6, 0, "auto"), constant));
  for (const auto& m : t.run()) pieced.push_back(m);
  ASSERT_EQ(pieced.size(), 6u);
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_EQ(pieced[k].loss, ramped[k].loss) << "step " << k + 1;
    EXPECT_EQ(pieced[k].grad_norm, ramped[k].grad_norm) << "step " << k + 1;
  }
}

// The learning-rate schedule counts a ramp's steps in sequences (Megatron's
// rule): with target 4 and a 2-step warm-up, steps of 2 sequences end at
// 0.5, 1, 1.5 and 2 target steps: lr/4, lr/2, 3lr/4, lr.
TEST(Checkpoint, ARampMovesTheScheduleBySequences) {
  TempDir dir;
  const Config c = parse_config(to_yaml(ckpt_config(dir, 5, 0, "never")),
                                {"train.lr_decay=constant", "train.rampup_batch_size=[2, 2, 8]"});
  Trainer t(c);
  const auto m = t.run();
  ASSERT_EQ(m.size(), 5u);
  const double lr = c.train.lr;
  const std::vector<double> want = {lr / 4, lr / 2, 3 * lr / 4, lr, lr};
  for (size_t k = 0; k < 5; ++k) EXPECT_NEAR(m[k].lr, want[k], 1e-15) << "step " << k + 1;
  // A warm-up from train.warmup_init = lr/2 covers the other half the same way,
  // and trains otherwise: its first step moves the weights twice as far.
  const Config from_half =
      parse_config(to_yaml(c), {"train.warmup_init=" + std::to_string(lr / 2)});
  const auto h = Trainer(from_half).run();
  ASSERT_EQ(h.size(), 5u);
  for (size_t k = 0; k < 5; ++k)
    EXPECT_NEAR(h[k].lr, lr / 2 + want[k] / 2, 1e-15) << "step " << k + 1;
  EXPECT_EQ(h[0].loss, m[0].loss);
  EXPECT_NE(h[1].loss, m[1].loss);
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// checkpoint.async writes a snapshot on a thread while training goes on:
// the files are byte for byte the synchronous run's. Each write first waits
// 300 ms, so the next steps have long updated the parameters and moments
// when it writes: a snapshot that shared their memory would hold those.
TEST(Checkpoint, AsyncCheckpointsAreTheSynchronousFilesWhileTrainingGoesOn) {
  TempDir sync_dir, async_dir;
  {
    Trainer t(ckpt_config(sync_dir, 6, 2, "never"));
    t.run();
  }
  Config c = ckpt_config(async_dir, 6, 2, "never");
  c.checkpoint.async = true;
  Trainer t(c);
  int writes = 0;
  t.before_checkpoint_write([&writes] {
    ++writes;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  });
  t.run();
  EXPECT_EQ(writes, 3);
  for (int step : {2, 4, 6}) {
    const std::string file = "ckpt/step_" + std::to_string(step) + "/rank_0.safetensors";
    const std::string want = file_bytes(sync_dir.file(file)),
                      got = file_bytes(async_dir.file(file));
    ASSERT_FALSE(want.empty()) << file;
    EXPECT_TRUE(got == want) << file << " differs from the synchronous run's";
  }
  EXPECT_EQ(file_bytes(async_dir.file("ckpt/latest")), "step_6\n");
}

// A write that fails stops the run with its error, and nothing is committed.
TEST(Checkpoint, AFailedAsyncWriteStopsTheRunWithItsError) {
  TempDir dir;
  Config c = ckpt_config(dir, 4, 2, "never");
  c.checkpoint.async = true;
  Trainer t(c);
  t.before_checkpoint_write([] { throw IoError("disk full (test)"); });
  try {
    t.run();
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("disk full (test)"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("ckpt/latest")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("ckpt/step_2")));
}

// Blocks of unequal heights (grouped-query attention's q, k, v) are each
// split over the ranks; assembling the shards gives the tensor back.
TEST(ShardSpec, UnequalBlocksAreEachSplitOverTheRanks) {
  std::vector<double> rows(16);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<double>(i);
  const Tensor full = from_vector(rows, {8, 2}, DType::F64);  // row r holds 2r, 2r + 1
  const tp::ShardSpec spec = tp::ShardSpec::along_blocks(0, {4, 2, 2});
  const Tensor r0 = spec.cut(full, 0, 2), r1 = spec.cut(full, 1, 2);
  // Rank 0: q rows 0-1, k row 4, v row 6; rank 1: q rows 2-3, k row 5, v row 7.
  EXPECT_EQ(to_double_vector(r0), (std::vector<double>{0, 1, 2, 3, 8, 9, 12, 13}));
  EXPECT_EQ(to_double_vector(r1), (std::vector<double>{4, 5, 6, 7, 10, 11, 14, 15}));
  EXPECT_EQ(spec.shard_shape({8, 2}, 2), (Shape{4, 2}));
  EXPECT_EQ(to_double_vector(spec.assemble({r0, r1}, {8, 2})), rows);
  // Equal blocks written as a list cut as `groups` does.
  EXPECT_EQ(to_double_vector(tp::ShardSpec::along_blocks(0, {4, 4}).cut(full, 1, 2)),
            to_double_vector(tp::ShardSpec::along(0, 2).cut(full, 1, 2)));
  try {
    spec.cut(full, 0, 4);  // 2-row blocks over 4 ranks
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("blocks of [4, 2, 2] over 4 ranks"), std::string::npos)
        << e.what();
  }
}

// Blocks of whole pieces (heads): a block of fewer pieces than ranks is
// shared, each piece held by size / pieces consecutive ranks (multi-query
// attention's one key/value head on every rank, grouped-query attention's
// two over four ranks); the shards assemble back, and the shared pieces are
// listed for the gradient sum and, on all but their first holder, for norms.
TEST(ShardSpec, BlocksOfFewerHeadsThanRanksAreShared) {
  std::vector<double> rows(16);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<double>(i);
  const Tensor full = from_vector(rows, {8, 2}, DType::F64);  // row r holds 2r, 2r + 1
  // q: 4 heads of one row; k, v: 2 heads of one row each.
  const tp::ShardSpec spec = tp::ShardSpec::along_blocks(0, {4, 2, 2}, {1, 1, 1});
  std::vector<Tensor> shards;
  for (int r = 0; r < 4; ++r) shards.push_back(spec.cut(full, r, 4));
  // Rank r: q row r; ranks 0, 1 share k row 4 and v row 6; ranks 2, 3 k row
  // 5 and v row 7.
  EXPECT_EQ(to_double_vector(shards[0]), (std::vector<double>{0, 1, 8, 9, 12, 13}));
  EXPECT_EQ(to_double_vector(shards[1]), (std::vector<double>{2, 3, 8, 9, 12, 13}));
  EXPECT_EQ(to_double_vector(shards[3]), (std::vector<double>{6, 7, 10, 11, 14, 15}));
  EXPECT_EQ(spec.shard_shape({8, 2}, 4), (Shape{3, 2}));
  EXPECT_EQ(to_double_vector(spec.assemble(shards, {8, 2})), rows);
  EXPECT_TRUE(spec.shares_blocks(4));
  EXPECT_FALSE(spec.shares_blocks(2));  // two heads over two ranks: split as before
  EXPECT_EQ(to_double_vector(spec.cut(full, 1, 2)),
            to_double_vector(tp::ShardSpec::along_blocks(0, {4, 2, 2}).cut(full, 1, 2)));
  // Rank 3's k and v rows sit at rows 1 and 2 of its shard, and at rows 1
  // and 3 of the shared blocks [k0, k1, v0, v1].
  int64_t shared_rows = 0;
  const auto pieces = spec.shared_pieces(3, 4, &shared_rows);
  EXPECT_EQ(shared_rows, 4);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].shard_at, 1);
  EXPECT_EQ(pieces[0].shared_at, 1);
  EXPECT_EQ(pieces[1].shard_at, 2);
  EXPECT_EQ(pieces[1].shared_at, 3);
  EXPECT_TRUE(spec.repeated_elements({8, 2}, 2, 4).empty());  // the first holder of k1, v1
  EXPECT_EQ(spec.repeated_elements({8, 2}, 3, 4),
            (std::vector<std::pair<int64_t, int64_t>>{{2, 4}, {4, 6}}));
  EXPECT_TRUE(spec.shared_pieces(1, 2).empty());
  // One head shared by all four ranks (multi-query).
  const tp::ShardSpec mqa = tp::ShardSpec::along_blocks(0, {4, 1, 1}, {1, 1, 1});
  const Tensor small = narrow(full, 0, 0, 6);
  EXPECT_EQ(to_double_vector(mqa.cut(small, 2, 4)), (std::vector<double>{4, 5, 8, 9, 10, 11}));
  // Heads that neither split evenly nor share evenly.
  try {
    tp::ShardSpec::along_blocks(0, {6, 3, 3}, {1, 1, 1})
        .cut(from_vector(std::vector<double>(24, 1.0), {12, 2}, DType::F64), 0, 2);
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("in whole pieces of [1, 1, 1] over 2 ranks"),
              std::string::npos)
        << e.what();
  } catch (const Error& e) {
    FAIL() << e.what();
  }
}

TEST(Checkpoint, PlacementsRoundTripAndNonsenseIsRefused) {
  RankPlacement p;
  p.tp_rank = 1;
  p.tp_size = 2;
  p.pp_rank = 3;
  p.dp_rank = 4;
  p.params["wte.weight"] = {tp::ShardSpec::along(0, 1, 512), {300, 16}};
  p.params["h.0.attn.c_attn.weight"] = {tp::ShardSpec::along(0, 3), {48, 16}};
  p.params["h.0.ln_1.weight"] = {tp::ShardSpec::replicated(true), {16}};
  // Grouped-query attention's c_attn: q, k, v blocks of unequal heights.
  p.params["h.1.attn.c_attn.weight"] = {tp::ShardSpec::along_blocks(0, {16, 8, 8}), {32, 16}};
  // Multi-query attention's one key/value head, shared by both ranks.
  p.params["h.2.attn.c_attn.weight"] = {tp::ShardSpec::along_blocks(0, {16, 4, 4}, {4, 4, 4}),
                                        {24, 16}};
  p.zero_segments = {{"wte.weight", 128, 1000}, {"h.0.ln_1.weight", 0, 16}};
  const RankPlacement q = placement_from_json(placement_to_json(p));
  EXPECT_EQ(q.tp_rank, 1);
  EXPECT_EQ(q.tp_size, 2);
  EXPECT_EQ(q.pp_rank, 3);
  EXPECT_EQ(q.dp_rank, 4);
  ASSERT_EQ(q.params.size(), 5u);
  EXPECT_EQ(q.params.at("h.2.attn.c_attn.weight").spec.units, (std::vector<int64_t>{4, 4, 4}));
  EXPECT_TRUE(q.params.at("h.1.attn.c_attn.weight").spec.units.empty());
  // Heads that do not cut over the writing run's ranks.
  EXPECT_THROW(placement_from_json(R"({"tp_rank": 0, "tp_size": 2, "pp_rank": 0, "dp_rank": 0,
      "params": {"x": {"split": true, "dim": 0, "groups": 3, "padded": 0, "shape": [24, 4],
                       "blocks": [12, 6, 6], "units": [4, 4, 4]}},
      "zero_segments": []})"),
               ValueError);
  const auto& wte = q.params.at("wte.weight");
  EXPECT_TRUE(wte.spec.split);
  EXPECT_EQ(wte.spec.padded, 512);
  EXPECT_EQ(wte.full_shape, (Shape{300, 16}));
  EXPECT_EQ(q.params.at("h.0.attn.c_attn.weight").spec.groups, 3);
  EXPECT_TRUE(q.params.at("h.0.attn.c_attn.weight").spec.blocks.empty());
  EXPECT_EQ(q.params.at("h.1.attn.c_attn.weight").spec.blocks, (std::vector<int64_t>{16, 8, 8}));
  EXPECT_EQ(q.params.at("h.1.attn.c_attn.weight").spec.groups, 3);
  // Blocks that do not add up to the split dimension.
  EXPECT_THROW(placement_from_json(R"({"tp_rank": 0, "tp_size": 1, "pp_rank": 0, "dp_rank": 0,
      "params": {"x": {"split": true, "dim": 0, "groups": 3, "padded": 0, "shape": [32, 4],
                       "blocks": [16, 8, 4]}},
      "zero_segments": []})"),
               ValueError);
  EXPECT_FALSE(q.params.at("h.0.ln_1.weight").spec.split);
  ASSERT_EQ(q.zero_segments.size(), 2u);
  EXPECT_EQ(q.zero_segments[0].name, "wte.weight");
  EXPECT_EQ(q.zero_segments[0].param_offset, 128);
  EXPECT_EQ(q.zero_segments[0].length, 1000);
  EXPECT_THROW(placement_from_json("{"), ValueError);
  EXPECT_THROW(placement_from_json(R"({"tp_rank": 2, "tp_size": 2, "pp_rank": 0, "dp_rank": 0,
                                       "params": {}, "zero_segments": []})"),
               ValueError);
  EXPECT_THROW(placement_from_json(R"({"tp_rank": 0, "tp_size": 1, "pp_rank": 0, "dp_rank": 0,
      "params": {"x": {"split": true, "dim": 2, "groups": 1, "padded": 0, "shape": [4, 4]}},
      "zero_segments": []})"),
               ValueError);
  // Numbers of a damaged file: blocks whose sum passes int64 (a signed
  // overflow before), and more groups than rows (a list of 2^31 groups).
  triad::testing::expect_error(
      [] {
        placement_from_json(R"({"tp_rank": 0, "tp_size": 1, "pp_rank": 0, "dp_rank": 0,
      "params": {"x": {"split": true, "dim": 0, "groups": 2, "padded": 0, "shape": [4, 4],
                       "blocks": [9000000000000000000, 9000000000000000000]}},
      "zero_segments": []})");
      },
      {"parameter 'x': split dim 0 in groups of 2 does not fit its shape [4, 4]"});
  triad::testing::expect_error(
      [] {
        placement_from_json(R"({"tp_rank": 0, "tp_size": 1, "pp_rank": 0, "dp_rank": 0,
      "params": {"x": {"split": true, "dim": 0, "groups": 2147483647, "padded": 0,
                       "shape": [4, 4]}}, "zero_segments": []})");
      },
      {"parameter 'x': shard: dim 0 of [4, 4] (padded to 4) cannot be cut into 2147483647 groups"});
  triad::testing::expect_error(
      [] {
        placement_from_json(R"({"tp_rank": 0, "tp_size": 1, "pp_rank": 0, "dp_rank": 0,
      "params": {}, "zero_segments": [["x", 9000000000000000000, 9000000000000000000]]})");
      },
      {"the optimizer piece of 'x' at 9000000000000000000, +9000000000000000000 is no range"});
  // Integers are integers: a float once read truncated (1e300: undefined).
  triad::testing::expect_error(
      [] {
        placement_from_json(R"({"tp_rank": 0, "tp_size": 1e300, "pp_rank": 0, "dp_rank": 0,
                               "params": {}, "zero_segments": []})");
      },
      {"tp_size is 1e+300, expected an integer"});
  triad::testing::expect_error(
      [] {
        placement_from_json(R"({"tp_rank": 0, "tp_size": 1, "pp_rank": 0, "dp_rank": 0,
      "params": {"x": {"split": false, "dim": 0, "groups": 1, "padded": 0, "shape": [4.5, 4]}},
      "zero_segments": []})");
      },
      {"parameter 'x': shape[0] is 4.5, expected an integer"});
}

TEST(Checkpoint, AnotherLayoutNeedsPlacementsAndNamesWhatIsMissing) {
  TempDir dir;
  // A checkpoint whose rank file has no placement (as before Triad saved them).
  const std::string staging = io::checkpoint_staging_dir(dir.file("ck"), 3);
  io::write_rank_state(staging, 0, {{"param/x", zeros({4})}}, {{"next_step", "3"}});
  io::commit_checkpoint(dir.file("ck"), 3, 1, {{"tp", "1"}}, "", 2);
  auto info = io::find_latest_checkpoint(dir.file("ck"));
  ASSERT_TRUE(info.has_value());
  try {
    gather_full_state(*info, {"x"});
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("predates layout-free resume): resume it with the layout "
                                         "it was written with"),
              std::string::npos)
        << e.what();
  }
  // With a placement: a parameter nobody holds, and a shard of the wrong shape.
  RankPlacement p;
  p.params["x"] = {tp::ShardSpec::replicated(), {4}};
  const std::string staging2 = io::checkpoint_staging_dir(dir.file("ck"), 4);
  io::write_rank_state(staging2, 0, {{"param/x", zeros({5})}},
                       {{"next_step", "4"}, {"placement", placement_to_json(p)}});
  io::commit_checkpoint(dir.file("ck"), 4, 1, {{"tp", "1"}}, "", 2);
  info = io::find_latest_checkpoint(dir.file("ck"));
  try {
    gather_full_state(*info, {"y"});
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no parameter 'y'"), std::string::npos) << e.what();
  }
  try {
    gather_full_state(*info, {"x"});
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'param/x' is [5], its placement says [4]"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, FullStateJoinsTensorParallelShardsAndZeroPieces) {
  TempDir dir;
  // Two tensor-parallel ranks (no data parallelism): w (6, 2) split along
  // dim 0 and padded to 8 rows, b replicated. Rank 0 keeps per-parameter
  // state; the test then writes the same state as ZeRO-1 pieces of two
  // data-parallel ranks of one tensor-parallel rank.
  auto full_w = from_vector(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {6, 2});
  const tp::ShardSpec split = tp::ShardSpec::along(0, 1, 8);
  const std::string staging = io::checkpoint_staging_dir(dir.file("ck"), 1);
  for (int r = 0; r < 2; ++r) {
    RankPlacement p;
    p.tp_rank = r;
    p.tp_size = 2;
    p.params["w"] = {split, {6, 2}};
    p.params["b"] = {tp::ShardSpec::replicated(), {2}};
    Tensor w = split.cut(full_w, r, 2);
    io::write_rank_state(staging, r,
                         {{"param/w", w},
                          {"adam_m/w", scale(w, 2.0)},
                          {"adam_v/w", scale(w, 3.0)},
                          {"param/b", from_vector(std::vector<float>{7, 8}, {2})},
                          {"adam_m/b", zeros({2})},
                          {"adam_v/b", zeros({2})}},
                         {{"next_step", "1"}, {"placement", placement_to_json(p)}});
  }
  io::commit_checkpoint(dir.file("ck"), 1, 2, {{"tp", "2"}}, "", 2);
  FullState fs = gather_full_state(*io::find_latest_checkpoint(dir.file("ck")), {"w", "b"});
  EXPECT_EQ(to_double_vector(fs.tensors.at("param/w")), to_double_vector(full_w));
  EXPECT_EQ(to_double_vector(fs.tensors.at("adam_m/w")), to_double_vector(scale(full_w, 2.0)));
  EXPECT_EQ(to_double_vector(fs.tensors.at("adam_v/w")), to_double_vector(scale(full_w, 3.0)));
  EXPECT_EQ(to_double_vector(fs.tensors.at("param/b")), (std::vector<double>{7, 8}));
  EXPECT_EQ(fs.metadata.at("next_step"), "1");
  // ZeRO-1 over two data-parallel ranks (tp 1): rank 0 holds w[0:5) and
  // rank 1 w[5:12) and b, as flat pieces.
  const std::string staging2 = io::checkpoint_staging_dir(dir.file("ck"), 2);
  auto flat_m = to_double_vector(scale(full_w, 2.0));
  for (int r = 0; r < 2; ++r) {
    RankPlacement p;
    p.dp_rank = r;
    p.params["w"] = {tp::ShardSpec::replicated(), {6, 2}};
    p.params["b"] = {tp::ShardSpec::replicated(), {2}};
    std::vector<float> m;
    if (r == 0) {
      p.zero_segments = {{"w", 0, 5}};
      for (int i = 0; i < 5; ++i) m.push_back(static_cast<float>(flat_m[i]));
    } else {
      p.zero_segments = {{"w", 5, 7}, {"b", 0, 2}};
      for (int i = 5; i < 12; ++i) m.push_back(static_cast<float>(flat_m[i]));
      m.push_back(-1);
      m.push_back(-2);
    }
    const auto n = static_cast<int64_t>(m.size());
    io::write_rank_state(staging2, r,
                         {{"param/w", full_w},
                          {"param/b", zeros({2})},
                          {"zero/m", from_vector(m, {n})},
                          {"zero/v", from_vector(m, {n})}},
                         {{"next_step", "2"}, {"placement", placement_to_json(p)}});
  }
  io::commit_checkpoint(dir.file("ck"), 2, 2, {{"tp", "1"}}, "", 2);
  fs = gather_full_state(*io::find_latest_checkpoint(dir.file("ck")), {"w", "b"});
  EXPECT_EQ(to_double_vector(fs.tensors.at("adam_m/w")), flat_m);
  EXPECT_EQ(fs.tensors.at("adam_m/w").shape(), (Shape{6, 2}));
  EXPECT_EQ(to_double_vector(fs.tensors.at("adam_v/b")), (std::vector<double>{-1, -2}));
  EXPECT_EQ(fs.tensors.count("master/w"), 0u);
}

// A rank resuming under another layout takes the state one parameter at a
// time: each name's full tensors (all four kinds it holds) are handed over
// together, and the host holds one parameter's, not the model's (eight
// parameters split over two tensor-parallel ranks and kept as ZeRO-1
// pieces of two data-parallel ranks each).
TEST(Checkpoint, FullStateIsAssembledOneParameterAtATime) {
  TempDir dir;
  const std::string root = dir.file("ck");
  const std::string staging = io::checkpoint_staging_dir(root, 1);
  const tp::ShardSpec split = tp::ShardSpec::along(0, 1, 64);
  const int kParams = 8;
  auto full_of = [](int i) { return randn({64, 64}, static_cast<uint64_t>(i) + 1); };
  for (int tp = 0; tp < 2; ++tp) {
    for (int dp = 0; dp < 2; ++dp) {
      RankPlacement p;
      p.tp_rank = tp;
      p.tp_size = 2;
      p.dp_rank = dp;
      std::map<std::string, Tensor> tensors;
      std::vector<Tensor> m;
      for (int i = 0; i < kParams; ++i) {
        const std::string name = "w" + std::to_string(i);
        p.params[name] = {split, {64, 64}};
        const Tensor shard = split.cut(full_of(i), tp, 2);
        tensors["param/" + name] = shard;
        // Data-parallel rank dp keeps half of the shard's moments.
        p.zero_segments.push_back({name, dp * 1024, 1024});
        m.push_back(narrow(reshape(contiguous(shard), {2048}), 0, dp * 1024, 1024));
      }
      tensors["zero/m"] = concat(m, 0);
      tensors["zero/v"] = scale(tensors["zero/m"], 2.0);
      io::write_rank_state(staging, 2 * tp + dp, tensors,
                           {{"next_step", "1"}, {"placement", placement_to_json(p)}});
    }
  }
  io::commit_checkpoint(root, 1, 4, {{"tp", "2"}}, "", 3);
  const io::CheckpointInfo info = *io::find_latest_checkpoint(root);
  std::set<std::string> names;
  for (int i = 0; i < kParams; ++i) names.insert("w" + std::to_string(i));
  std::vector<std::string> order;
  Allocator& host = cpu_allocator();
  const int64_t before = host.stats().allocated;
  host.reset_peak();
  for_each_full_state(info, names,
                      [&](const std::string& name, std::map<std::string, Tensor>& full) {
                        order.push_back(name);
                        EXPECT_EQ(full.size(), 3u) << name;  // param, adam_m, adam_v
                        EXPECT_EQ(full.at("adam_m/" + name).shape(), (Shape{64, 64})) << name;
                      });
  const int64_t peak = host.stats().peak_allocated - before;
  const int64_t one_param = 3 * 64 * 64 * 4;  // its three full tensors
  EXPECT_EQ(order, std::vector<std::string>(names.begin(), names.end()));
  EXPECT_LT(peak, 3 * one_param) << "of " << kParams << " parameters";
  // The values: as gather_full_state collects them.
  const FullState all = gather_full_state(info, names);
  for (int i = 0; i < kParams; ++i) {
    const std::string name = "w" + std::to_string(i);
    EXPECT_EQ(to_double_vector(all.tensors.at("param/" + name)), to_double_vector(full_of(i)));
    EXPECT_EQ(to_double_vector(all.tensors.at("adam_v/" + name)),
              to_double_vector(scale(full_of(i), 2.0)));
  }
}

// Resuming under another layout reads a rank file only for what no file
// before it gave: a data-parallel replica of shards already read, and a
// file holding none of the names asked for, stay unread (a damaged byte in
// one is not even seen), while a file that is needed is checked as before.
TEST(Checkpoint, FullStateReadsOnlyTheFilesItNeeds) {
  TempDir dir;
  const std::string root = dir.file("ck");
  const std::string staging = io::checkpoint_staging_dir(root, 1);
  // Ranks 0 and 1: data-parallel replicas holding w; rank 2 holds b alone
  // (another pipeline stage).
  const Tensor w = from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  for (int r = 0; r < 3; ++r) {
    RankPlacement p;
    p.dp_rank = r == 1 ? 1 : 0;
    p.pp_rank = r == 2 ? 1 : 0;
    std::map<std::string, Tensor> tensors;
    if (r < 2) {
      p.params["w"] = {tp::ShardSpec::replicated(), {2, 2}};
      tensors = {{"param/w", w}, {"adam_m/w", scale(w, 2.0)}, {"adam_v/w", scale(w, 3.0)}};
    } else {
      p.params["b"] = {tp::ShardSpec::replicated(), {2}};
      tensors = {{"param/b", from_vector(std::vector<float>{7, 8}, {2})},
                 {"adam_m/b", zeros({2})},
                 {"adam_v/b", zeros({2})}};
    }
    io::write_rank_state(staging, r, tensors,
                         {{"next_step", "1"}, {"placement", placement_to_json(p)}});
  }
  io::commit_checkpoint(root, 1, 3, {{"tp", "1"}}, "", 3);
  const io::CheckpointInfo info = *io::find_latest_checkpoint(root);
  // The last byte of a file is tensor data: the header still reads.
  auto damage = [&](int rank) {
    const std::string path = io::checkpoint_rank_file(info.step_dir, rank);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char c = static_cast<char>(f.get());
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x5a));
  };
  damage(1);
  damage(2);
  const FullState fs = gather_full_state(info, {"w"});
  EXPECT_EQ(to_double_vector(fs.tensors.at("param/w")), to_double_vector(w));
  EXPECT_EQ(to_double_vector(fs.tensors.at("adam_v/w")), to_double_vector(scale(w, 3.0)));
  EXPECT_EQ(fs.tensors.count("param/b"), 0u);
  // b is needed from rank 2's damaged file: its checksum says so.
  try {
    gather_full_state(info, {"w", "b"});
    FAIL() << "a damaged file that is needed was read";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("is corrupted"), std::string::npos) << e.what();
  }
  // Another data-parallel rank reads w from its own replica: rank 1's
  // damaged file (replica 1), rank 0's again for replica 2 (of 2).
  auto w_from = [&](int replica) {
    for_each_full_state(info, std::vector<std::string>{"w"},
                        [](const std::string&, std::map<std::string, Tensor>&) {},
                        {.replica = replica});
  };
  EXPECT_THROW(w_from(1), IoError);
  EXPECT_NO_THROW(w_from(2));
  // Unless the reader says it has just verified the files (an export's
  // second pass): then nothing checks them.
  int taken = 0;
  for_each_full_state(info, std::vector<std::string>{"w", "b"},
                      [&](const std::string&, std::map<std::string, Tensor>&) { ++taken; },
                      {.verify = false});
  EXPECT_EQ(taken, 2);
}

// An export reads the weights alone, in its own order; a checkpoint is
// opened by its step directory or its checkpoint.dir, never by a staging
// directory whose writing did not finish.
TEST(Checkpoint, OneKindOfStateInTheCallersOrderAndCheckpointsOpenedByPath) {
  TempDir dir;
  const std::string root = dir.file("ck");
  const std::string staging = io::checkpoint_staging_dir(root, 4);
  for (int r = 0; r < 2; ++r) {
    RankPlacement p;
    p.pp_rank = r;
    const std::string name = r == 0 ? "w" : "b";
    p.params[name] = {tp::ShardSpec::replicated(), {2}};
    const Tensor t = from_vector(std::vector<float>{1.0f + static_cast<float>(r), 5}, {2});
    io::write_rank_state(staging, r,
                         {{"param/" + name, t}, {"adam_m/" + name, t}, {"adam_v/" + name, t}},
                         {{"next_step", "4"}, {"placement", placement_to_json(p)}});
  }
  io::commit_checkpoint(root, 4, 2, {{"tp", "1"}}, "model: {}", 3);
  const io::CheckpointInfo info = io::open_checkpoint(root);
  EXPECT_EQ(info.step, 4);
  EXPECT_EQ(info.config, "model: {}");
  EXPECT_EQ(io::open_checkpoint(info.step_dir).step_dir, info.step_dir);
  std::vector<std::string> order;
  for_each_full_state(info, std::vector<std::string>{"w", "b"},
                      [&](const std::string& name, std::map<std::string, Tensor>& full) {
                        order.push_back(name);
                        ASSERT_EQ(full.size(), 1u) << name;
                        EXPECT_EQ(to_double_vector(full.at("param/" + name)),
                                  (std::vector<double>{name == "w" ? 1.0 : 2.0, 5.0}));
                      },
                      {.kinds = {"param/"}});
  EXPECT_EQ(order, (std::vector<std::string>{"w", "b"}));
  // The headers read once and handed over (as a trainer broadcasts them)
  // give the same; a rank left out of them is named.
  const auto headers = rank_headers_from_json(rank_headers_to_json(read_rank_headers(info)));
  ASSERT_EQ(headers.size(), 2u);
  EXPECT_EQ(headers.at(1).shapes.at("param/b"), (Shape{2}));
  EXPECT_EQ(headers.at(0).metadata.at("next_step"), "4");
  std::map<std::string, std::string> metadata;
  order.clear();
  for_each_full_state(
      info, std::vector<std::string>{"b"},
      [&](const std::string& name, std::map<std::string, Tensor>& full) {
        order.push_back(name);
        EXPECT_EQ(to_double_vector(full.at("adam_m/b")), (std::vector<double>{2.0, 5.0}));
      },
      {.metadata = &metadata, .headers = &headers});
  EXPECT_EQ(order, std::vector<std::string>{"b"});
  EXPECT_EQ(metadata.at("next_step"), "4");
  std::map<int, io::RankHeader> partial = headers;
  partial.erase(1);
  try {
    for_each_full_state(info, std::vector<std::string>{"b"},
                        [](const std::string&, std::map<std::string, Tensor>&) {},
                        {.headers = &partial});
    FAIL() << "a missing header went unnoticed";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("no header was given for rank 1"), std::string::npos)
        << e.what();
  }
  for (const char* bad : {"[1, 2]", "{\"x\": {}}", "{\"0\": {\"metadata\": 3}}", "not json"})
    EXPECT_THROW(rank_headers_from_json(bad), IoError) << bad;
  EXPECT_THROW(for_each_full_state(info, std::vector<std::string>{"w", "w"},
                                   [](const std::string&, std::map<std::string, Tensor>&) {}, {}),
               ValueError);
  auto refused = [](const std::string& path, const std::string& why) {
    try {
      io::open_checkpoint(path);
      ADD_FAILURE() << path << " opened";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(dir.file("nothing"), "neither a checkpoint (a step_<N> directory");
  const std::string unfinished = root + "/step_8.tmp";
  std::filesystem::create_directories(unfinished);
  std::filesystem::copy_file(info.step_dir + "/manifest.json", unfinished + "/manifest.json");
  refused(unfinished, "a staging directory");
  refused(unfinished + "/", "a staging directory");
}

}  // namespace
}  // namespace triad::train
