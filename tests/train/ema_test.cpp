// train.ema_decay: an exponential moving average of the trainable weights,
// folded in after every applied step, checkpointed, evaluated beside the
// weights and written as model_ema.safetensors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "triad/core/error.h"
#include "triad/data/token_shard.h"
#include "triad/io/checkpoint.h"
#include "triad/ops.h"
#include "triad/train/trainer.h"

namespace triad::train {
namespace {

using triad::testing::TempDir;

std::string write_data(const TempDir& dir) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back(static_cast<uint16_t>((i * 7 + i / 13) % 31));
  data::write_token_shard(dir.file("train.bin"), tokens);
  return dir.file("train.bin");
}

// The tiny model; `train` and `rest` add to the train section and the file.
Config ema_config(const TempDir& dir, const std::string& train, const std::string& rest = "") {
  const std::string data = write_data(dir);
  return parse_config(
      "model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 32, seq_len: 16}\n"
      "train: {steps: 6, global_batch_size: 4, micro_batch_size: 2, lr: 3.0e-2, "
      "warmup_steps: 1" +
      train + "}\ndata: {train: " + data + ", val: " + data +
      "}\neval: {batches: 2, interval: 3}\noutput: {dir: " + dir.file("out") + "}\n" + rest);
}

std::map<std::string, std::vector<double>> as_doubles(const nn::StateDict& weights) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, w] : weights) out[name] = to_double_vector(w);
  return out;
}

// What the averages must be: e_0 = w_0, then e <- d e + (1 - d) w after
// each applied step (a skipped one changes nothing), in doubles.
TEST(Ema, AveragesTheWeightsOfEveryAppliedStep) {
  TempDir dir;
  const double d = 0.8;
  Trainer t(ema_config(dir, ", ema_decay: 0.8, max_skipped_steps: 2"));
  t.inject_nan_at(2);  // the third step is skipped
  auto expected = as_doubles(t.full_state_dict());
  for (int64_t k = 0; k < 6; ++k) {
    const StepMetrics m = t.step(k);
    EXPECT_EQ(m.skipped, k == 2);
    if (m.skipped) continue;
    for (auto& [name, w] : as_doubles(t.full_state_dict())) {
      std::vector<double>& e = expected.at(name);
      for (size_t i = 0; i < e.size(); ++i) e[i] = d * e[i] + (1 - d) * w[i];
    }
  }
  const auto averages = t.ema_parameters();
  ASSERT_EQ(averages.size(), expected.size());
  double moved = 0;  // how far the averages are from the last weights
  const auto last = as_doubles(t.full_state_dict());
  for (const auto& [name, average] : averages) {
    SCOPED_TRACE(name);
    EXPECT_EQ(average.dtype(), DType::F32);
    const std::vector<double> got = to_double_vector(average);
    const std::vector<double>& want = expected.at(name);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << "element " << i;
      moved = std::max(moved, std::abs(got[i] - last.at(name)[i]));
    }
  }
  EXPECT_GT(moved, 1e-3);  // (an average that merely copied the weights would fail)
}

// The averages are evaluated beside the weights (val_ema_loss), written as
// model_ema.safetensors (a model like model.safetensors), and change
// nothing of the training itself.
TEST(Ema, IsEvaluatedAndWrittenWithoutChangingTheRun) {
  TempDir dir;
  std::vector<StepMetrics> plain, averaged;
  {
    TempDir other;
    Trainer t(ema_config(other, ""));
    plain = t.run();
  }
  Trainer t(ema_config(dir, ", ema_decay: 0.7"));
  averaged = t.run();
  ASSERT_EQ(plain.size(), averaged.size());
  for (size_t k = 0; k < plain.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k + 1));
    EXPECT_EQ(averaged[k].loss, plain[k].loss);
    EXPECT_EQ(averaged[k].val_loss, plain[k].val_loss);
    EXPECT_FALSE(plain[k].val_ema_loss);
    EXPECT_EQ(averaged[k].val_ema_loss.has_value(), averaged[k].val_loss.has_value());
  }
  ASSERT_TRUE(averaged.back().val_ema_loss);
  EXPECT_NE(*averaged.back().val_ema_loss, *averaged.back().val_loss);
  // The file's weights are the averages, and a model started from them
  // measures the loss the run reported for them.
  const std::string file = dir.file("out/model_ema.safetensors");
  ASSERT_TRUE(std::filesystem::exists(file));
  Trainer from(parse_config(to_yaml(ema_config(dir, "")), {"init.from=" + file}));
  const nn::StateDict loaded = from.full_state_dict();
  for (const auto& [name, average] : t.ema_parameters()) {
    SCOPED_TRACE(name);
    EXPECT_EQ(to_double_vector(loaded.at(name)), to_double_vector(average));
  }
  EXPECT_NEAR(from.evaluate(), *averaged.back().val_ema_loss, 1e-6);
  // metrics.jsonl carries it.
  std::ifstream in(dir.file("out/metrics.jsonl"));
  std::string line, last;
  while (std::getline(in, line)) last = line;
  const auto j = nlohmann::json::parse(last);
  ASSERT_TRUE(j.contains("val_ema_loss")) << last;
  EXPECT_DOUBLE_EQ(j.at("val_ema_loss").get<double>(), *averaged.back().val_ema_loss);
}

// eval.choices and eval.lambada are scored under the averages too, at the
// same evaluations, as a run started from model_ema.safetensors scores them;
// and not at all without train.ema_decay.
TEST(Ema, ScoresChoicesAndLambadaUnderTheAverages) {
  TempDir dir;
  const std::string fixtures = std::string(TRIAD_SOURCE_DIR) + "/tests/data/fixtures/";
  const std::vector<std::string> evals = {
      "model.vocab_size=256", "model.seq_len=64",
      "eval.choices=" + fixtures + "short_choice_questions.jsonl",
      "eval.lambada=" + fixtures + "lambada_texts.jsonl"};
  Trainer t(parse_config(to_yaml(ema_config(dir, ", ema_decay: 0.7")), evals));
  const std::vector<StepMetrics> m = t.run();
  ASSERT_EQ(m.size(), 6u);
  for (size_t k = 0; k < m.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k + 1));
    EXPECT_EQ(m[k].choices.has_value(), k == 2 || k == 5);
    EXPECT_EQ(m[k].choices_ema.has_value(), m[k].choices.has_value());
    EXPECT_EQ(m[k].lambada_ema.has_value(), m[k].lambada.has_value());
  }
  const StepMetrics& last = m.back();
  ASSERT_TRUE(last.choices_ema && last.lambada_ema);
  EXPECT_NE(last.choices_ema->answer_loss, last.choices->answer_loss);
  EXPECT_NE(last.lambada_ema->loss, last.lambada->loss);
  std::vector<std::string> from_average = evals;
  from_average.push_back("init.from=" + dir.file("out/model_ema.safetensors"));
  from_average.push_back("output.dir=" + dir.file("from_average"));
  Trainer from(parse_config(to_yaml(ema_config(dir, "")), from_average));
  const StepMetrics::ChoiceScores c = from.evaluate_choices();
  EXPECT_EQ(c.questions, last.choices_ema->questions);
  EXPECT_EQ(c.acc, last.choices_ema->acc);
  EXPECT_EQ(c.acc_norm, last.choices_ema->acc_norm);
  EXPECT_NEAR(c.answer_loss, last.choices_ema->answer_loss, 1e-9);
  const StepMetrics::LambadaScores l = from.evaluate_lambada();
  EXPECT_EQ(l.texts, last.lambada_ema->texts);
  EXPECT_EQ(l.acc, last.lambada_ema->acc);
  EXPECT_NEAR(l.loss, last.lambada_ema->loss, 1e-9);
  // metrics.jsonl carries them.
  std::ifstream in(dir.file("out/metrics.jsonl"));
  std::string line, final_line;
  while (std::getline(in, line)) final_line = line;
  const auto j = nlohmann::json::parse(final_line);
  ASSERT_TRUE(j.contains("choices_ema") && j.contains("lambada_ema")) << final_line;
  EXPECT_DOUBLE_EQ(j.at("choices_ema").at("answer_loss").get<double>(),
                   last.choices_ema->answer_loss);
  EXPECT_DOUBLE_EQ(j.at("lambada_ema").at("loss").get<double>(), last.lambada_ema->loss);
  // Without the averages there is nothing to score.
  TempDir other;
  Trainer plain(parse_config(to_yaml(ema_config(other, "")), evals));
  for (const StepMetrics& s : plain.run()) EXPECT_FALSE(s.choices_ema || s.lambada_ema);
}

// A run resumed from a checkpoint continues the averages bit for bit; one
// whose checkpoint holds none (written without train.ema_decay) starts them
// from the checkpoint's weights.
TEST(Ema, ResumesFromCheckpointsBitwise) {
  TempDir dir;
  std::vector<std::pair<std::string, Tensor>> whole;
  {
    Trainer t(ema_config(dir, ", ema_decay: 0.9",
                         "checkpoint: {dir: " + dir.file("ckpt") + ", interval: 3}\n"));
    t.run();  // checkpoints at steps 3 and 6
    whole = t.ema_parameters();
  }
  // What triad-export/-generate/-eval --checkpoint --ema read: the averages.
  nn::StateDict read;
  const Config c = ema_config(dir, "");
  read_checkpoint_weights(io::open_checkpoint(dir.file("ckpt")), c.model,
                          [&](nn::StateDict&& part) { read.merge(part); }, {.ema = true});
  ASSERT_EQ(read.size(), whole.size());
  for (const auto& [name, average] : whole)
    EXPECT_EQ(to_double_vector(read.at(name)), to_double_vector(average)) << name;
  Trainer resumed(ema_config(
      dir, ", ema_decay: 0.9",
      "checkpoint: {dir: " + dir.file("ckpt2") + ", resume: " + dir.file("ckpt/step_3") + "}\n"));
  EXPECT_EQ(resumed.run().size(), 3u);  // steps 4-6
  const auto got = resumed.ema_parameters();
  ASSERT_EQ(got.size(), whole.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(got[i].first);
    EXPECT_EQ(to_double_vector(got[i].second), to_double_vector(whole[i].second));
  }
}

TEST(Ema, ACheckpointWithoutAveragesStartsThemFromItsWeights) {
  TempDir dir;
  {
    Trainer t(ema_config(dir, "", "checkpoint: {dir: " + dir.file("ckpt") + "}\n"));
    t.run();
  }
  Trainer t(ema_config(dir, ", ema_decay: 0.9",
                       "checkpoint: {dir: " + dir.file("ckpt") + ", resume: auto}\n"));
  EXPECT_EQ(t.run().size(), 0u);  // (all 6 steps were done)
  const nn::StateDict weights = t.full_state_dict();
  for (const auto& [name, average] : t.ema_parameters())
    EXPECT_EQ(to_double_vector(average), to_double_vector(weights.at(name))) << name;
  // Asked for its averages, such a checkpoint says it has none.
  testing::expect_error<IoError>(
      [&] {
        read_checkpoint_weights(io::open_checkpoint(dir.file("ckpt")), t.config().model,
                                [](nn::StateDict&&) {}, {.ema = true});
      },
      {"holds no averaged weights: it was written without train.ema_decay"});
}

TEST(Ema, ConfigNamesABadDecay) {
  TempDir dir;
  for (const char* bad : {"1", "-0.1", "1.5"}) {
    SCOPED_TRACE(bad);
    testing::expect_error<ConfigError>([&] { ema_config(dir, std::string(", ema_decay: ") + bad); },
                                       {"train.ema_decay", "must be in [0, 1)"});
  }
  testing::expect_error<ConfigError>([&] { ema_config(dir, ", ema_decay: 0.9, ema_device: gpu"); },
                                     {"train.ema_device 'gpu' must be device or cpu"});
  const Config host = parse_config(to_yaml(ema_config(dir, ", ema_decay: 0.9, ema_device: cpu")));
  EXPECT_EQ(host.train.ema_device, "cpu");
  const Config c = parse_config(to_yaml(ema_config(dir, ", ema_decay: 0.999")));
  EXPECT_EQ(c.train.ema_decay, 0.999);
  EXPECT_EQ(to_yaml(ema_config(dir, "")).find("ema_decay"), std::string::npos);
}

}  // namespace
}  // namespace triad::train
