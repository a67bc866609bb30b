#include "triad/data/fewshot_sampler.h"

#include <gtest/gtest.h>

#include <set>

#include "support/expect_error.h"

namespace triad::data {
namespace {

using testing::expect_error;

// The expected values are CPython 3.11's (random.Random(seed)...), which
// parity.fewshot_draws checks far more widely.
TEST(PythonRandom, SeedsAndDrawsAsCPython) {
  PythonRandom r(1234);
  EXPECT_EQ(r.next_u32(), 4150886329u);
  EXPECT_EQ(r.next_u32(), 3342196574u);
  EXPECT_EQ(r.getrandbits(32), 1892932127u);
  PythonRandom zero(0);
  EXPECT_EQ(zero.next_u32(), 3626764237u);
  EXPECT_EQ(zero.next_u32(), 1654615998u);
  // A seed past 32 bits is two key words; getrandbits(64) takes two words,
  // the first the low half; getrandbits(7) one word's top bits;
  // randrange(1000) is _randbelow(1000).
  PythonRandom wide((uint64_t{1} << 40) + 5);
  EXPECT_EQ(wide.next_u32(), 2166296868u);
  EXPECT_EQ(wide.next_u32(), 2220160828u);
  EXPECT_EQ(wide.getrandbits(64), 12244916861145399977ull);
  EXPECT_EQ(wide.getrandbits(7), 118u);
  EXPECT_EQ(wide.randbelow(1000), 28u);
}

TEST(PythonRandom, SamplesAsCPython) {
  // random.Random(1234): sample(range(7473), 5) (a set of picks), then
  // sample(range(10), 4) (a shrinking copy of the population), then
  // sample(range(39905), 6), whose set threshold is larger.
  PythonRandom r(1234);
  EXPECT_EQ(r.sample(7473, 5), (std::vector<size_t>{6374, 3610, 957, 61, 742}));
  EXPECT_EQ(r.sample(10, 4), (std::vector<size_t>{9, 0, 1, 8}));
  EXPECT_EQ(r.sample(39905, 6), (std::vector<size_t>{23241, 15519, 1142, 2019, 1038, 22681}));
}

TEST(PythonRandom, SamplesAreDistinctAndCoverThePopulation) {
  PythonRandom r(7);
  for (const size_t n : {1u, 2u, 21u, 22u, 100u}) {
    const auto all = r.sample(n, n);
    EXPECT_EQ(std::set<size_t>(all.begin(), all.end()).size(), n);
    for (const size_t i : all) EXPECT_LT(i, n);
  }
  EXPECT_TRUE(r.sample(5, 0).empty());
  expect_error([&] { r.sample(3, 4); }, {"sample of 4", "population of 3"});
  expect_error([&] { r.getrandbits(65); }, {"getrandbits(65)"});
  expect_error([&] { r.randbelow(0); }, {"randbelow(0)"});
}

TEST(FewshotDraw, EachQuestionDrawsInTurnAndDropsItself) {
  // Two questions of a 7473-item pool, 5 shots each, the same generator
  // running on: the second question's examples are the next sample's.
  FewshotDraw draw(1234, 7473, "train.jsonl");
  const auto never = [](size_t) { return false; };
  EXPECT_EQ(draw.next(5, false, never), (std::vector<size_t>{6374, 3610, 957, 61, 742}));
  PythonRandom same(1234);
  same.sample(7473, 5);
  EXPECT_EQ(draw.next(5, false, never), same.sample(7473, 5));
  // One more drawn: a draw that is the question goes and the spare fills
  // in; without it nothing is dropped.
  FewshotDraw spare(1234, 7473, "own");
  EXPECT_EQ(spare.next(5, true, [](size_t k) { return k == 957; }),
            (std::vector<size_t>{6374, 3610, 61, 742, 7462}));
  FewshotDraw no_spare(1234, 7473, "own");
  EXPECT_EQ(no_spare.next(5, false, [](size_t k) { return k == 957; }),
            (std::vector<size_t>{6374, 3610, 61, 742}));
  // Zero shots draw nothing (the generator does not move).
  FewshotDraw zero(1234, 7473, "z");
  EXPECT_TRUE(zero.next(0, true, never).empty());
  EXPECT_EQ(zero.next(5, false, never), (std::vector<size_t>{6374, 3610, 957, 61, 742}));
}

TEST(FewshotDraw, TooSmallAPoolIsAnError) {
  FewshotDraw draw(1, 5, "dev.jsonl");
  EXPECT_EQ(draw.next(5, false, [](size_t) { return false; }).size(), 5u);
  expect_error([&] { draw.next(5, true, [](size_t) { return false; }); },
               {"dev.jsonl", "question 2", "draws 6", "5 and one to spare", "from 5"});
  expect_error([&] { draw.next(-1, false, [](size_t) { return false; }); }, {"-1", ">= 0"});
}

}  // namespace
}  // namespace triad::data
