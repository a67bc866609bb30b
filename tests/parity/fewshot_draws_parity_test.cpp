// Few-shot draws against CPython's random and lm-evaluation-harness's
// sampler (CTest label "parity"): fewshot_draws_reference.py, run by CTest
// as a fixture before this, writes getrandbits, randrange and sample runs
// for many seeds, and the examples the harness's ContextSampler picks for
// each question of random pools. PythonRandom and FewshotDraw must give the
// same numbers and the same examples, case by case.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "triad/data/fewshot_sampler.h"

namespace triad::data {
namespace {

nlohmann::json reference() {
  const char* file = std::getenv("TRIAD_FEWSHOT_REFERENCE");
  if (file == nullptr) throw std::runtime_error("TRIAD_FEWSHOT_REFERENCE is not set");
  std::ifstream in(file);
  if (!in) throw std::runtime_error(std::string("missing ") + file + " (the fixture did not run)");
  return nlohmann::json::parse(in);
}

class FewshotDrawsParity : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* why = std::getenv("TRIAD_FEWSHOT_UNAVAILABLE"); why && *why)
      GTEST_SKIP() << why;
    ref_ = reference();
  }
  nlohmann::json ref_;
};

TEST_F(FewshotDrawsParity, GetrandbitsAndRandrangeAreCPythons) {
  size_t checked = 0;
  for (const auto& c : ref_.at("getrandbits")) {
    PythonRandom r(c.at("seed").get<uint64_t>());
    const auto& ks = c.at("k");
    for (size_t i = 0; i < ks.size(); ++i, ++checked) {
      ASSERT_EQ(r.getrandbits(ks[i].get<int>()), c.at("bits")[i].get<uint64_t>())
          << "seed " << c.at("seed") << ", draw " << i << ": getrandbits(" << ks[i] << ")";
    }
  }
  for (const auto& c : ref_.at("randbelow")) {
    PythonRandom r(c.at("seed").get<uint64_t>());
    const auto& ns = c.at("n");
    for (size_t i = 0; i < ns.size(); ++i, ++checked) {
      ASSERT_EQ(r.randbelow(ns[i].get<uint64_t>()), c.at("values")[i].get<uint64_t>())
          << "seed " << c.at("seed") << ", draw " << i << ": randrange(" << ns[i] << ")";
    }
  }
  EXPECT_GT(checked, 1500u);
}

TEST_F(FewshotDrawsParity, SamplesAreCPythons) {
  size_t both_ways[2] = {0, 0};  // copied population, re-drawn picks
  for (const auto& c : ref_.at("sample")) {
    PythonRandom r(c.at("seed").get<uint64_t>());
    for (const auto& call : c.at("calls")) {
      const auto n = call.at("n").get<size_t>(), k = call.at("k").get<size_t>();
      ASSERT_EQ(r.sample(n, k), call.at("picks").get<std::vector<size_t>>())
          << "seed " << c.at("seed") << ": sample(range(" << n << "), " << k << ")";
      both_ways[n > 21 + (k > 5 ? 64 : 0) ? 1 : 0] += 1;
    }
  }
  EXPECT_GT(both_ways[0], 20u);
  EXPECT_GT(both_ways[1], 20u);
}

TEST_F(FewshotDrawsParity, ExamplesAreTheHarnesss) {
  size_t questions = 0, dropped = 0;
  for (const auto& c : ref_.at("draws")) {
    const auto pool = c.at("pool").get<std::vector<std::string>>();
    const auto asked = c.at("questions").get<std::vector<std::string>>();
    const auto shots = c.at("shots").get<int64_t>();
    const bool one_more = c.at("one_more").get<bool>();
    FewshotDraw draw(c.at("seed").get<uint64_t>(), pool.size(), "pool");
    for (size_t q = 0; q < asked.size(); ++q, ++questions) {
      std::vector<std::string> mine;
      for (const size_t k :
           draw.next(shots, one_more, [&](size_t k) { return pool[k] == asked[q]; }))
        mine.push_back(pool[k]);
      const auto want = c.at("chosen")[q].get<std::vector<std::string>>();
      ASSERT_EQ(mine, want) << "seed " << c.at("seed") << ", pool of " << pool.size()
                            << ", question " << q << " (" << asked[q] << "), " << shots
                            << " shots, one more: " << one_more;
      dropped += static_cast<int64_t>(want.size()) < shots;
    }
  }
  EXPECT_GT(questions, 500u);
  // Some questions lost an example to the drop and had no spare.
  EXPECT_GT(dropped, 0u);
}

}  // namespace
}  // namespace triad::data
