// GSM8K's answers against lm-evaluation-harness's regular expressions run
// in Python (CTest label "parity"): gsm8k_answers_reference.py, run by
// CTest as a fixture before this, extracts the strict and flexible answers
// of 20,000 random replies and normalises each reply as exact match does.
// Triad's hand-written matchers must give the same strings, case by case.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "triad/data/math_problems.h"

namespace triad::data {
namespace {

TEST(Gsm8kAnswersParity, ExtractionsAndNormalisationArePythonsRe) {
  if (const char* why = std::getenv("TRIAD_GSM8K_UNAVAILABLE"); why && *why) GTEST_SKIP() << why;
  const char* file = std::getenv("TRIAD_GSM8K_REFERENCE");
  ASSERT_NE(file, nullptr) << "TRIAD_GSM8K_REFERENCE is not set";
  std::ifstream in(file);
  ASSERT_TRUE(in) << "missing " << file << " (the reference fixture did not run)";
  const auto cases = nlohmann::json::parse(in);
  ASSERT_EQ(cases.size(), 20000u);
  size_t strict_found = 0, flexible_found = 0, wrong = 0;
  for (const auto& c : cases) {
    const std::string reply = c.at("reply");
    const std::string strict = strict_answer(reply), flexible = flexible_answer(reply);
    strict_found += strict != kInvalidAnswer;
    flexible_found += flexible != kInvalidAnswer;
    if (strict != c.at("strict") || flexible != c.at("flexible") ||
        normalize_answer(reply) != c.at("normalized")) {
      if (++wrong <= 10)
        ADD_FAILURE() << "reply " << c.at("reply").dump() << ": Triad strict '" << strict
                      << "', flexible '" << flexible << "'; Python " << c.dump();
    }
  }
  EXPECT_EQ(wrong, 0u);
  // The replies reach both patterns' matches and misses.
  EXPECT_GT(strict_found, 1000u);
  EXPECT_GT(flexible_found, 10000u);
  EXPECT_LT(flexible_found, cases.size());
}

}  // namespace
}  // namespace triad::data
