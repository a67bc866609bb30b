// TensorBoard event files: TFRecord frames with masked CRC-32C checksums
// around Event messages, read back here field by field.
#include "triad/train/tensorboard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "src/data/protobuf_wire.h"
#include "support/temp_dir.h"
#include "triad/core/error.h"

namespace triad::train {
namespace {

namespace pb = data::protobuf;

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  int64_t session_status = 0;  // SessionLog's status (1: START)
  std::vector<std::pair<std::string, float>> values;
};

uint64_t little_endian(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(s[at + static_cast<size_t>(i)])) << (8 * i);
  return v;
}

// Every record of the file, each frame's checksums checked.
std::vector<Event> read_events(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<Event> out;
  size_t at = 0;
  while (at < data.size()) {
    EXPECT_LE(at + 12, data.size());
    const uint64_t n = little_endian(data, at, 8);
    EXPECT_EQ(little_endian(data, at + 8, 4), masked_crc32c(std::string_view(data).substr(at, 8)));
    const std::string_view body = std::string_view(data).substr(at + 12, n);
    EXPECT_EQ(little_endian(data, at + 12 + n, 4), masked_crc32c(body));
    at += 12 + n + 4;
    Event e;
    pb::Reader r(body, "event");
    pb::Field field;
    while (r.next(field)) {
      if (field.number == 1) {
        std::memcpy(&e.wall_time, &field.varint, sizeof e.wall_time);
      } else if (field.number == 2) {
        e.step = static_cast<int64_t>(field.varint);
      } else if (field.number == 3) {
        e.file_version = std::string(field.bytes);
      } else if (field.number == 6) {
        pb::Reader log(field.bytes, "session log");
        pb::Field status;
        while (log.next(status)) {
          if (status.number == 1) e.session_status = static_cast<int64_t>(status.varint);
        }
      } else if (field.number == 5) {
        pb::Reader summary(field.bytes, "summary");
        pb::Field value;
        while (summary.next(value)) {
          EXPECT_EQ(value.number, 1u);
          pb::Reader v(value.bytes, "value");
          pb::Field part;
          std::pair<std::string, float> tv;
          while (v.next(part)) {
            if (part.number == 1) tv.first = std::string(part.bytes);
            if (part.number == 2) tv.second = part.as_float();
          }
          e.values.push_back(tv);
        }
      }
    }
    out.push_back(e);
  }
  return out;
}

TEST(TensorBoard, Crc32cIsCastagnolis) {
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);            // the CRC-32C check value
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720's 32 zero bytes
  const uint32_t c = crc32c("a");
  EXPECT_EQ(masked_crc32c("a"), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST(TensorBoard, EventFilesHoldTheVersionThenEachStepsScalars) {
  testing::TempDir dir;
  std::string path;
  {
    TensorBoardWriter w(dir.file("run"));
    path = w.path();
    w.scalar("custom", 7, 0.25, 1000.5);
    StepMetrics m;
    m.step = 3;
    m.loss = 2.5;
    m.lr = 3e-4;
    m.grad_norm = 1.5;
    m.peak_memory_bytes = 2'000'000'000;
    m.reserved_memory_bytes = 3'000'000'000;
    m.rank_timing = {{"compute", 20.5, 21.0, 24.25, 1}};
    m.rank_peak_memory = StepMetrics::RankMemory{1'500'000'000, 2'000'000'000, 2'500'000'000, 0};
    m.val_loss = 2.75;
    m.val_losses = {{"web", 2.75}, {"code", 1.25}};
    m.choices = StepMetrics::ChoiceScores{100, 0.25, 0.5, 0.375, 2.5, std::nullopt};
    m.choice_sets = {{"hella", *m.choices}, {"arc", {50, 0.75, 0.625, 0.125, 1.5, 0.5}}};
    m.lambada = StepMetrics::LambadaScores{5153, 0.375, 3.5, 33.125};
    m.lambada_sets = {{"en", *m.lambada}, {"de", {5000, 0.25, 4.5, 90.0}}};
    m.choices_ema =
        StepMetrics::ChoiceScores{100, 0.5, 0.625, 0.25, 2.25, std::nullopt};  // (train.ema_decay)
    m.choice_ema_sets = {{"arc", {50, 0.5, 0.5, 0.5, 1.25, std::nullopt}}};
    m.lambada_ema = StepMetrics::LambadaScores{5153, 0.5, 3.25, 25.5};
    m.lambada_ema_sets = {{"de", {5000, 0.375, 4.25, 70.0}}};
    m.z_loss = 20.5;  // (model.z_loss_coef's)
    w.write(m);
    m.step = 4;
    m.val_loss.reset();
    m.val_losses.clear();
    m.choices.reset();
    m.choice_sets.clear();
    m.lambada.reset();
    m.lambada_sets.clear();
    m.choices_ema.reset();
    m.choice_ema_sets.clear();
    m.lambada_ema.reset();
    m.lambada_ema_sets.clear();
    m.reserved_memory_bytes = -1;  // (the CPU)
    m.rank_timing.clear();         // (not a log.interval step)
    m.rank_peak_memory.reset();
    m.mfu = 0.5;
    m.z_loss = -1;
    m.skipped = m.spike = true;  // (train.spike_sigma's)
    w.write(m);
    w.restart(9);  // a resumed run's first step
  }
  EXPECT_NE(std::filesystem::path(path).filename().string().find("tfevents"), std::string::npos);
  const std::vector<Event> events = read_events(path);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_GT(events[0].wall_time, 1.7e9);  // seconds since the epoch, now
  EXPECT_EQ(events[1].step, 7);
  EXPECT_EQ(events[1].wall_time, 1000.5);
  ASSERT_EQ(events[1].values.size(), 1u);
  EXPECT_EQ(events[1].values[0].first, "custom");
  EXPECT_EQ(events[1].values[0].second, 0.25f);
  std::map<int64_t, std::map<std::string, float>> by_step;
  for (size_t i = 2; i < events.size(); ++i) {
    for (const auto& [tag, v] : events[i].values) by_step[events[i].step][tag] = v;
  }
  EXPECT_EQ(by_step[3].at("train/loss"), 2.5f);
  EXPECT_EQ(by_step[3].at("train/lr"), 3e-4f);
  EXPECT_EQ(by_step[3].at("train/grad_norm"), 1.5f);
  EXPECT_EQ(by_step[3].at("train/peak_memory_gb"), 2.0f);
  EXPECT_EQ(by_step[3].at("val/loss"), 2.75f);
  EXPECT_EQ(by_step[3].at("val/web/loss"), 2.75f);
  EXPECT_EQ(by_step[3].at("val/code/loss"), 1.25f);
  EXPECT_EQ(by_step[4].count("val/code/loss"), 0u);
  EXPECT_EQ(by_step[3].at("eval/acc"), 0.25f);
  EXPECT_EQ(by_step[3].at("eval/acc_norm"), 0.5f);
  EXPECT_EQ(by_step[3].at("eval/acc_per_token"), 0.375f);
  EXPECT_EQ(by_step[3].at("eval/answer_loss"), 2.5f);
  EXPECT_EQ(by_step[3].at("eval/hella/acc_norm"), 0.5f);
  EXPECT_EQ(by_step[3].at("eval/arc/acc"), 0.75f);
  EXPECT_EQ(by_step[3].at("eval/arc/answer_loss"), 1.5f);
  EXPECT_EQ(by_step[3].at("eval/arc/mc2"), 0.5f);  // (a set with TruthfulQA's MC2)
  EXPECT_EQ(by_step[3].count("eval/hella/mc2"), 0u);
  EXPECT_EQ(by_step[4].count("eval/acc_norm"), 0u);
  EXPECT_EQ(by_step[3].at("lambada/acc"), 0.375f);
  EXPECT_EQ(by_step[3].at("lambada/loss"), 3.5f);
  EXPECT_EQ(by_step[3].at("lambada/perplexity"), 33.125f);
  EXPECT_EQ(by_step[3].at("lambada/de/perplexity"), 90.0f);
  EXPECT_EQ(by_step[3].at("lambada/en/acc"), 0.375f);
  EXPECT_EQ(by_step[4].count("lambada/acc"), 0u);
  EXPECT_EQ(by_step[3].at("eval_ema/acc"), 0.5f);
  EXPECT_EQ(by_step[3].at("eval_ema/answer_loss"), 2.25f);
  EXPECT_EQ(by_step[3].at("eval_ema/arc/answer_loss"), 1.25f);
  EXPECT_EQ(by_step[3].at("lambada_ema/perplexity"), 25.5f);
  EXPECT_EQ(by_step[3].at("lambada_ema/de/loss"), 4.25f);
  EXPECT_EQ(by_step[4].count("eval_ema/acc"), 0u);
  EXPECT_EQ(by_step[4].count("lambada_ema/loss"), 0u);
  EXPECT_EQ(by_step[3].at("train/reserved_memory_gb"), 3.0f);
  EXPECT_EQ(by_step[4].count("train/reserved_memory_gb"), 0u);
  EXPECT_EQ(by_step[3].at("timing/compute_min_ms"), 20.5f);
  EXPECT_EQ(by_step[3].at("timing/compute_max_ms"), 24.25f);
  EXPECT_EQ(by_step[4].count("timing/compute_max_ms"), 0u);
  EXPECT_EQ(by_step[3].at("memory/rank_peak_min_gb"), 1.5f);
  EXPECT_EQ(by_step[3].at("memory/rank_peak_max_gb"), 2.5f);
  EXPECT_EQ(by_step[4].count("memory/rank_peak_max_gb"), 0u);
  EXPECT_EQ(by_step[3].count("train/mfu"), 0u);  // no peak configured
  EXPECT_EQ(by_step[4].count("val/loss"), 0u);   // not evaluated
  EXPECT_EQ(by_step[4].at("train/mfu"), 0.5f);
  EXPECT_EQ(by_step[3].at("train/z_loss"), 20.5f);
  EXPECT_EQ(by_step[4].count("train/z_loss"), 0u);
  EXPECT_EQ(by_step[3].count("train/skipped"), 0u);
  EXPECT_EQ(by_step[4].at("train/skipped"), 1.0f);
  EXPECT_EQ(by_step[4].at("train/spike"), 1.0f);
  EXPECT_EQ(events.back().step, 9);
  EXPECT_EQ(events.back().session_status, 1);
  EXPECT_TRUE(events.back().values.empty());
}

TEST(TensorBoard, AnUnwritableDirectoryIsNamed) {
  testing::TempDir dir;
  std::ofstream(dir.file("file")) << "x";
  try {
    TensorBoardWriter w(dir.file("file") + "/run");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("file/run"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace triad::train
