// Parameter patterns (train.freeze): '*' spans dots, '[a-b]' takes a whole
// run of digits, every other character is itself, and the whole name must
// match; malformed patterns and patterns that pick nothing are named.
#include "triad/nn/parameter_pattern.h"

#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "triad/nn/gpt.h"

namespace triad::nn {
namespace {

using triad::testing::expect_error;

TEST(ParameterPattern, StarsRangesAndLiteralsMatchWholeNames) {
  const ParameterPattern exact("wte.weight");
  EXPECT_TRUE(exact.matches("wte.weight"));
  EXPECT_FALSE(exact.matches("wte.weight2"));
  EXPECT_FALSE(exact.matches("xwte.weight"));

  const ParameterPattern attn("h.*.attn.*");
  EXPECT_TRUE(attn.matches("h.0.attn.c_attn.weight"));
  EXPECT_TRUE(attn.matches("h.11.attn.c_proj.bias"));
  EXPECT_FALSE(attn.matches("h.0.mlp.c_fc.weight"));

  const ParameterPattern bias("*.bias");
  EXPECT_TRUE(bias.matches("ln_f.bias"));
  EXPECT_TRUE(bias.matches("h.3.mlp.c_proj.bias"));
  EXPECT_FALSE(bias.matches("h.3.mlp.c_proj.weight"));

  const ParameterPattern first("h.[0-5].*");
  EXPECT_TRUE(first.matches("h.0.ln_1.weight"));
  EXPECT_TRUE(first.matches("h.5.attn.c_attn.weight"));
  EXPECT_FALSE(first.matches("h.6.ln_1.weight"));
  // The number is the whole run of digits: 10, 15 and 50 lie outside 0-5.
  EXPECT_FALSE(first.matches("h.10.ln_1.weight"));
  EXPECT_FALSE(first.matches("h.15.ln_1.weight"));
  EXPECT_FALSE(first.matches("h.50.ln_1.weight"));
  EXPECT_FALSE(first.matches("h.x.ln_1.weight"));

  const ParameterPattern late("h.[10-23].mlp.*");
  EXPECT_TRUE(late.matches("h.10.mlp.c_fc.weight"));
  EXPECT_TRUE(late.matches("h.23.mlp.c_proj.bias"));
  EXPECT_FALSE(late.matches("h.9.mlp.c_fc.weight"));
  EXPECT_FALSE(late.matches("h.24.mlp.c_fc.weight"));

  // Stars backtrack: the last ".weight" of the name can end it.
  EXPECT_TRUE(ParameterPattern("*.weight").matches("h.0.weight.x.weight"));
  EXPECT_TRUE(ParameterPattern("*").matches("anything.at.all"));
  EXPECT_TRUE(ParameterPattern("h.[2-2]*").matches("h.2.ln_2.bias"));
}

TEST(ParameterPattern, MalformedPatternsAreNamed) {
  expect_error([] { ParameterPattern("h.[0-5.*"); }, {"'h.[0-5.*'", "has no ']'"});
  expect_error([] { ParameterPattern("h.0-5].*"); }, {"closes no '['"});
  expect_error([] { ParameterPattern("h.[a-b].*"); }, {"'[a-b]' is not a range of integers"});
  expect_error([] { ParameterPattern("h.[5].*"); }, {"'[5]' is not a range"});
  expect_error([] { ParameterPattern("h.[5-2].*"); }, {"[5-2] is empty"});
  expect_error([] { ParameterPattern(""); }, {"is empty"});
  expect_error([] { ParameterPattern("h.0 h.1"); }, {"whitespace"});
}

TEST(ParameterPattern, MatchingParametersOfAModel) {
  GptConfig cfg;
  cfg.n_layer = 3;
  cfg.n_head = 2;
  cfg.d_model = 8;
  cfg.vocab_size = 16;
  cfg.seq_len = 8;
  std::vector<std::string> names;
  for (const auto& [name, shape] : gpt_parameter_shapes(cfg)) names.push_back(name);
  const auto picked = matching_parameters({"wte.weight", "h.[0-1].attn.*"}, names, "train.freeze");
  std::set<std::string> expected{"wte.weight"};
  for (const std::string& name : names) {
    if (name.rfind("h.0.attn.", 0) == 0 || name.rfind("h.1.attn.", 0) == 0) expected.insert(name);
  }
  EXPECT_GT(expected.size(), 4u);
  EXPECT_EQ(picked, expected);
  // A pattern that picks nothing names its place, itself and some names.
  expect_error(
      [&] {
        matching_parameters({"wte.weight", "h.*.atn.*"}, names, "train.freeze");
      },
      {"train.freeze[1]", "'h.*.atn.*' matches no parameter", "such as h.0."});
  expect_error([&] { matching_parameters({"h.[3-9].*"}, names, "train.freeze"); },
               {"train.freeze[0]", "matches no parameter"});
  expect_error([&] { matching_parameters({"h.[3-.*"}, names, "train.freeze"); },
               {"train.freeze[0]", "has no ']'"});
}

}  // namespace
}  // namespace triad::nn
