// metrics.jsonl: one JSON object per step, one history across resumes.
#include "triad/train/metrics.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace triad::train
