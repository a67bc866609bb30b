// metrics.jsonl: one JSON object per step, one history across resumes.
#include "triad/train/metrics.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "support/temp_dir.h"

namespace triad::train {
namespace {

std::vector<int64_t> steps_in(const std::string& path) {
  std::ifstream in(path);
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) {
    steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  }
  return steps;
}

// metrics.jsonl across a resume: the lines up to the checkpoint's step stay,
// later ones (and anything after a line cut short) go, the resumed steps
// follow; a new run starts the file afresh.
TEST(Metrics, AResumedRunGoesOnWithTheHistoryUpToItsCheckpoint) {
  testing::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  StepMetrics m;
  {
    MetricsWriter w(path);
    for (int64_t s = 1; s <= 5; ++s) {
      m.step = s;
      w.write(m);
    }
  }
  std::ofstream(path, std::ios::app) << "{\"step\": 6, \"lo";  // a write cut short
  {
    MetricsWriter w(path, 3);  // resumed from the checkpoint of step 3
    EXPECT_EQ(steps_in(path), (std::vector<int64_t>{1, 2, 3}));
    m.step = 4;
    w.write(m);
  }
  EXPECT_EQ(steps_in(path), (std::vector<int64_t>{1, 2, 3, 4}));
  {
    MetricsWriter w(path, 9);  // a checkpoint past every line: all stay
  }
  EXPECT_EQ(steps_in(path), (std::vector<int64_t>{1, 2, 3, 4}));
  {
    MetricsWriter w(path);  // a new run
  }
  EXPECT_TRUE(steps_in(path).empty());
}

// Evaluation scores (named sets by name, the averaged weights' beside the
// weights'), the GPU's reserved bytes and the time since the run began:
// written where a step has them, left out where it has none.
TEST(Metrics, ScoresByNameAndReservedMemoryWhereTheStepHasThem) {
  testing::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  {
    MetricsWriter w(path);
    StepMetrics m;
    m.step = 1;
    m.peak_memory_bytes = 1000;
    m.reserved_memory_bytes = 4096;
    m.choices = StepMetrics::ChoiceScores{100, 0.25, 0.5, 0.375, 2.5, std::nullopt};
    m.choice_sets = {{"hella", *m.choices}, {"arc", {50, 0.75, 0.625, 0.125, 1.5, 0.5}}};
    m.choices_ema = StepMetrics::ChoiceScores{100, 0.5, 0.625, 0.25, 2.25, std::nullopt};
    m.choice_ema_sets = {{"hella", *m.choices_ema},
                         {"arc", {50, 0.5, 0.5, 0.5, 1.25, std::nullopt}}};
    m.lambada = StepMetrics::LambadaScores{10, 0.5, 3.5, 33.0};
    m.lambada_sets = {{"en", *m.lambada}};
    m.lambada_ema = StepMetrics::LambadaScores{10, 0.625, 3.25, 25.5};
    m.lambada_ema_sets = {{"en", *m.lambada_ema}};
    m.rank_timing = {{"forward", 10.5, 11.25, 12.0, 3}, {"compute", 20.0, 21.5, 24.0, 1}};
    m.stragglers = {{1, 0, 24.0, 20.5, 4}};
    m.rank_peak_memory = StepMetrics::RankMemory{1000, 1500, 2500, 2};
    m.elapsed_s = 12.5;
    w.write(m);
    StepMetrics plain;  // (the CPU, no evaluation)
    plain.step = 2;
    w.write(plain);
  }
  std::ifstream in(path);
  std::string first, second;
  std::getline(in, first);
  std::getline(in, second);
  const auto a = nlohmann::json::parse(first), b = nlohmann::json::parse(second);
  EXPECT_EQ(a.at("reserved_memory_bytes"), 4096);
  EXPECT_EQ(a.at("choice_sets").at("arc").at("acc"), 0.75);
  EXPECT_EQ(a.at("choice_sets").at("arc").at("mc2"), 0.5);  // (a set with TruthfulQA's MC2)
  EXPECT_FALSE(a.at("choice_sets").at("hella").contains("mc2"));
  EXPECT_EQ(a.at("choices_ema").at("answer_loss"), 2.25);
  EXPECT_EQ(a.at("choice_ema_sets").at("arc").at("answer_loss"), 1.25);
  EXPECT_EQ(a.at("choice_ema_sets").at("hella").at("acc_norm"), 0.625);
  EXPECT_EQ(a.at("lambada_sets").at("en").at("perplexity"), 33.0);
  EXPECT_EQ(a.at("lambada_ema").at("loss"), 3.25);
  EXPECT_EQ(a.at("lambada_ema_sets").at("en").at("acc"), 0.625);
  EXPECT_EQ(a.at("rank_timing").at("forward").at("min_ms"), 10.5);
  EXPECT_EQ(a.at("rank_timing").at("forward").at("mean_ms"), 11.25);
  EXPECT_EQ(a.at("rank_timing").at("compute").at("max_ms"), 24.0);
  EXPECT_EQ(a.at("rank_timing").at("compute").at("slowest_rank"), 1);
  EXPECT_EQ(a.at("stragglers").size(), 1u);
  EXPECT_EQ(a.at("stragglers").at(0).at("rank"), 1);
  EXPECT_EQ(a.at("stragglers").at(0).at("median_ms"), 20.5);
  EXPECT_EQ(a.at("stragglers").at(0).at("peers"), 4);
  EXPECT_EQ(a.at("rank_peak_memory").at("min_bytes"), 1000);
  EXPECT_EQ(a.at("rank_peak_memory").at("mean_bytes"), 1500);
  EXPECT_EQ(a.at("rank_peak_memory").at("max_bytes"), 2500);
  EXPECT_EQ(a.at("rank_peak_memory").at("largest_rank"), 2);
  EXPECT_EQ(a.at("elapsed_s"), 12.5);
  for (const char* key :
       {"reserved_memory_bytes", "choices", "choice_sets", "choices_ema", "choice_ema_sets",
        "lambada", "lambada_sets", "lambada_ema", "lambada_ema_sets", "rank_timing", "stragglers",
        "rank_peak_memory", "elapsed_s"}) {
    EXPECT_FALSE(b.contains(key)) << key << ": " << second;
  }
}

// Stage 0: four ranks, one of them 28% over their median; stage 1: two
// ranks, one 9.5% over theirs; stage 2: one rank, slow but with no peers.
TEST(Metrics, StragglersAreSlowerThanTheMedianOfTheirStageByTheFactor) {
  const std::vector<double> ms = {100, 102, 130, 101, 100, 121, 500};
  const std::vector<int> stage = {0, 0, 0, 0, 1, 1, 2};
  std::vector<StepMetrics::Straggler> s = find_stragglers(ms, stage, 1.2);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 2);
  EXPECT_EQ(s[0].stage, 0);
  EXPECT_EQ(s[0].compute_ms, 130.0);
  EXPECT_EQ(s[0].median_ms, 101.5);  // (an even count: the mean of the middle two)
  EXPECT_EQ(s[0].peers, 4);
  s = find_stragglers(ms, stage, 1.09);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[1].rank, 5);
  EXPECT_EQ(s[1].median_ms, 110.5);
  EXPECT_TRUE(find_stragglers(ms, stage, 1.3).empty());
  // Odd counts take the middle one.
  s = find_stragglers({10, 30, 12}, {0, 0, 0}, 2.0);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].median_ms, 12.0);
  testing::expect_error<ValueError>(
      [] {
        find_stragglers({1, 2}, {0}, 1.5);
      },
      {"2 ranks' times but 1 stages"});
}

TEST(Metrics, RankTimingSummaryNamesEachCategorysSpreadAndSlowestRank) {
  EXPECT_EQ(rank_timing_summary({{"forward", 10.04, 10.4, 12.96, 37}, {"p2p", 0, 1.3, 2.5, 0}}, 64),
            "ms/step over 64 ranks, min/mean/max (slowest): forward 10.0/10.4/13.0 (rank 37) | p2p "
            "0.0/1.3/2.5 (rank 0)");
}

}  // namespace
}  // namespace triad::train
