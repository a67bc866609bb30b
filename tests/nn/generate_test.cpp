#include "triad/nn/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "triad/autograd/grad_mode.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

GptConfig tiny() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.vocab_size = 40;
  c.seq_len = 8;
  return c;
}

TEST(Generate, SampleTokenFollowsTheSoftmaxOfTheTopK) {
  const std::vector<double> logits{0.5, 2.0, -1.0, 2.0, 1.0, 0.0};
  // Greedy: the largest, the lower id on a tie (1 and 3 tie at 2.0).
  EXPECT_EQ(sample_token(logits, 0.0, 0, 0.99), 1);
  for (double u : {0.0, 0.3, 0.999}) EXPECT_EQ(sample_token(logits, 1.0, 1, u), 1);
  // A grid of u values draws each of the top 3 (ids 1, 3, 4) in proportion
  // to exp(logit / T) and never anything else.
  const double T = 0.7;
  const int N = 10000;
  std::vector<int> count(logits.size(), 0);
  for (int i = 0; i < N; ++i) ++count[sample_token(logits, T, 3, (i + 0.5) / N)];
  const double z = 2 * std::exp(2.0 / T) + std::exp(1.0 / T);
  EXPECT_NEAR(count[1] / double(N), std::exp(2.0 / T) / z, 2.0 / N);
  EXPECT_NEAR(count[3] / double(N), std::exp(2.0 / T) / z, 2.0 / N);
  EXPECT_NEAR(count[4] / double(N), std::exp(1.0 / T) / z, 2.0 / N);
  EXPECT_EQ(count[0] + count[2] + count[5], 0);
  // Every token can be drawn without top_k.
  std::vector<int> all(logits.size(), 0);
  for (int i = 0; i < N; ++i) ++all[sample_token(logits, 1.0, 0, (i + 0.5) / N)];
  for (size_t t = 0; t < logits.size(); ++t) EXPECT_GT(all[t], 0) << t;
  EXPECT_THROW(sample_token(logits, -1.0, 0, 0.5), ValueError);
  EXPECT_THROW(sample_token(logits, 1.0, -2, 0.5), ValueError);
  EXPECT_THROW(sample_token({}, 1.0, 0, 0.5), ValueError);
}

// Weights 8x the initial ones: small random weights predict one token
// forever, which would make the comparison below vacuous.
void make_opinionated(Gpt& model) {
  autograd::NoGradGuard ng;
  for (auto& [name, p] : model.named_parameters()) {
    if (name.find("ln_") == std::string::npos) scale_(p, 8.0);
  }
}

TEST(Generate, GreedyMatchesArgmaxOfTheFullForwardOverASlidingWindow) {
  Gpt model(tiny(), 3);
  make_opinionated(model);
  const std::vector<int64_t> prompt{4, 9, 1};
  SamplingOptions o;
  o.max_new_tokens = 12;  // past seq_len 8: the window slides
  o.temperature = 0;
  const auto got = generate(model, prompt, o);
  ASSERT_EQ(got.size(), 12u);
  std::vector<int64_t> seq = prompt;
  for (int step = 0; step < 12; ++step) {
    const auto w = std::min<int64_t>(static_cast<int64_t>(seq.size()), 8);
    std::vector<int64_t> ids(seq.end() - w, seq.end());
    auto logits = to_double_vector(model.forward(from_vector(ids, {1, w}), {false, 0, 0}));
    const auto last = logits.begin() + (w - 1) * 40;
    const int64_t best = std::max_element(last, last + 40) - last;
    EXPECT_EQ(got[step], best) << "step " << step;
    seq.push_back(best);
  }
  EXPECT_GE(std::set<int64_t>(got.begin(), got.end()).size(), 3u) << "a vacuous comparison";
}

TEST(Generate, DrawsArePureFunctionsOfTheSeedAndRespectTheLimits) {
  Gpt model(tiny(), 5);
  SamplingOptions o;
  o.max_new_tokens = 20;
  o.temperature = 1.5;
  o.seed = 11;
  const auto a = generate(model, {3}, o), b = generate(model, {3}, o);
  EXPECT_EQ(a, b);
  o.seed = 12;
  EXPECT_NE(generate(model, {3}, o), a);
  o.vocab_limit = 5;
  for (int64_t t : generate(model, {3}, o)) EXPECT_LT(t, 5);
  o.vocab_limit = 0;
  o.stop_token = a[4];
  o.seed = 11;
  const auto stopped = generate(model, {3}, o);
  EXPECT_LE(stopped.size(), 5u);
  EXPECT_EQ(stopped.back(), a[4]);
  EXPECT_THROW(generate(model, {}, o), ValueError);
  EXPECT_THROW(generate(model, {40}, o), ValueError);
  o.vocab_limit = 41;
  EXPECT_THROW(generate(model, {3}, o), ValueError);
}

}  // namespace
}  // namespace triad::nn
