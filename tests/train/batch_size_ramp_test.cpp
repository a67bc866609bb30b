#include "triad/train/batch_size_ramp.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "triad/core/error.h"

namespace triad::train {
namespace {

// Megatron-LM's rule: (8 - 2) / 2 = 3 increments over 12 sequences, one
// every 4 consumed.
TEST(BatchSizeRamp, GrowsByTheIncrementEverySamplesOverIncrements) {
  const BatchSizeRamp r(2, 2, 12, 8);
  EXPECT_TRUE(r.ramps());
  const std::vector<std::pair<int64_t, int64_t>> at = {{0, 2}, {3, 2},  {4, 4},  {7, 4},
                                                       {8, 6}, {11, 6}, {12, 8}, {1000, 8}};
  for (const auto& [consumed, size] : at) EXPECT_EQ(r.at(consumed), size) << consumed;
  EXPECT_EQ(r.sizes(), (std::vector<int64_t>{2, 4, 6, 8}));
  // Steps walk it: 0 -> 2 -> 4 -> 8 -> 14 -> 22 consumed.
  std::vector<int64_t> steps;
  for (int64_t c = 0; c < 22; c += r.at(c)) steps.push_back(r.at(c));
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 2, 4, 6, 8}));
  // Increments a fractional number of sequences apart: 10 / 2 = 5.
  const BatchSizeRamp f(4, 4, 10, 12);
  EXPECT_EQ(f.at(4), 4);
  EXPECT_EQ(f.at(5), 8);
  EXPECT_EQ(f.at(9), 8);
  EXPECT_EQ(f.at(10), 12);
  const BatchSizeRamp none(16);
  EXPECT_FALSE(none.ramps());
  EXPECT_EQ(none.at(0), 16);
  EXPECT_EQ(none.sizes(), std::vector<int64_t>{16});
}

TEST(BatchSizeRamp, ImpossibleRampsNameTheirValues) {
  auto error = [](int64_t start, int64_t inc, int64_t samples, int64_t target) {
    try {
      BatchSizeRamp(start, inc, samples, target);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(0, 2, 10, 8)
                .find("train.rampup_batch_size [0, 2, 10]: start, increment and "
                      "samples must be positive"),
            std::string::npos);
  EXPECT_NE(error(8, 2, 10, 8).find("the start must be below train.global_batch_size (8)"),
            std::string::npos);
  EXPECT_NE(error(2, 4, 10, 8).find("(8 - 2) must be a multiple of the increment"),
            std::string::npos);
  // A ramp of ten billion sizes (a global batch with extra zeros) is named,
  // not listed (80 GB) size by size.
  EXPECT_NE(error(1, 1, 10, 10000000001)
                .find("10000000000 increases to train.global_batch_size (10000000001); at most "
                      "1048575 are supported"),
            std::string::npos);
}

}  // namespace
}  // namespace triad::train
