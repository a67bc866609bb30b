#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "support/temp_dir.h"
#include "triad/data/token_shard.h"
#include "triad/io/checkpoint.h"
#include "triad/train/trainer.h"

namespace triad::train {
namespace {

using triad::testing::TempDir;

Config config(const TempDir& dir, int64_t steps, int64_t interval, const std::string& resume) {
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

TEST(Checkpoint, ResumedRunReproducesTheUninterruptedLossesBitwise) {
  TempDir dir;
  std::vector<StepMetrics> whole;
  {
    Trainer t(config(dir, 8, 3, "never"));  // checkpoints at steps 3, 6, 8
    whole = t.run();
  }
  ASSERT_TRUE(std::filesystem::exists(dir.file("ckpt/step_3/manifest.json")));
  ASSERT_TRUE(std::filesystem::exists(dir.file("ckpt/step_6/rank_0.safetensors")));
  // As if the job had died after step 3: resume from there.
  point_latest_to(dir, 3);
  Trainer again(config(dir, 8, 0, "auto"));
  auto rest = again.run();
  ASSERT_EQ(rest.size(), 5u);
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].step, whole[3 + i].step);
    EXPECT_EQ(rest[i].loss, whole[3 + i].loss) << "step " << rest[i].step;  // bitwise
    EXPECT_EQ(rest[i].grad_norm, whole[3 + i].grad_norm);
    EXPECT_EQ(rest[i].lr, whole[3 + i].lr);
  }
}

TEST(Checkpoint, IncompleteWritesAreNeverPickedAndCorruptionIsNamed) {
  TempDir dir;
  {
    Trainer t(config(dir, 4, 2, "never"));
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
  Trainer t(config(dir, 6, 0, "auto"));
  try {
    t.run();
    FAIL() << "expected a checksum error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("corrupted"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, ALayoutMismatchNamesTheDimension) {
  TempDir dir;
  {
    Trainer t(config(dir, 2, 2, "never"));
    t.run();
  }
  Config other = config(dir, 4, 0, "auto");
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

}  // namespace
}  // namespace triad::train
