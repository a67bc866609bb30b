// Granite's scalars: each sublayer's output times model.residual_multiplier
// before it joins the residual stream, and the head's logits times
// model.logit_scale. Identities that hold whatever the weights (the
// stream's norms cancel a common factor; the head is linear), what each
// scalar changes, and the config's checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "support/gpt_config_checks.h"
#include "triad/autograd/engine.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

// LLaMA's blocks (RMSNorm, SwiGLU, rope, no biases), 4 query heads over 2
// key/value heads, a tied head; an eps far below the stream's mean square,
// so that scaling the stream leaves every norm's output as it was.
GptConfig granite_config() {
  GptConfig c{
      .n_layer = 2, .n_head = 4, .n_kv_head = 2, .d_model = 32, .vocab_size = 29, .seq_len = 8};
  c.position_embedding = PositionEmbedding::Rotary;
  c.normalization = Normalization::RmsNorm;
  c.activation = Activation::SwiGlu;
  c.ffn_hidden_size = 40;
  c.linear_bias = false;
  c.layer_norm_eps = 1e-12;
  return c;
}

double relative_difference(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = to_double_vector(a), y = to_double_vector(b);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return worst / scale;
}

const Tensor kIds = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 9, 7, 3}, {2, 4});
const Tensor kTargets = from_vector(std::vector<int64_t>{2, 3, 4, 5, 9, 7, 3, 1}, {2, 4});

struct Outputs {
  Tensor logits, loss;
  StateDict grads;
};

// `c`'s logits, loss and gradients from the weights of seed 5.
Outputs run_granite(const GptConfig& c) {
  Gpt m(c, 5);
  Outputs r{m.forward(kIds, {false, 0, 0}), m.loss(kIds, kTargets), {}};
  autograd::backward({r.loss});
  for (const auto& [name, p] : m.named_parameters()) r.grads.emplace(name, p.grad());
  return r;
}

// Embeddings and every sublayer's output times the same factor make the
// whole residual stream that factor times the plain model's; every norm
// (each sublayer's input's, ln_f) divides it out again. So the model is
// the same function of its weights: the same logits, loss and gradients.
// The residual multiplier alone, on either sublayer, is not.
TEST(GraniteScalars, AStreamScaledThroughoutIsNormalisedBackToThePlainModel) {
  const GptConfig plain = granite_config();
  GptConfig scaled = plain;
  scaled.embedding_multiplier = scaled.residual_multiplier = 6.0;
  const Outputs a = run_granite(plain), b = run_granite(scaled);
  EXPECT_LT(relative_difference(b.logits, a.logits), 1e-5);
  EXPECT_NEAR(item(b.loss), item(a.loss), 1e-6);
  for (const auto& [name, g] : a.grads) {
    SCOPED_TRACE(name);
    EXPECT_LT(relative_difference(b.grads.at(name), g), 1e-4);
  }
  GptConfig residual_only = plain;
  residual_only.residual_multiplier = 6.0;
  EXPECT_GT(relative_difference(run_granite(residual_only).logits, a.logits), 1e-2);
  // Sequential blocks and GPT-NeoX's parallel ones alike.
  GptConfig parallel = plain, parallel_scaled = plain;
  parallel.parallel_residual = parallel_scaled.parallel_residual = true;
  parallel_scaled.embedding_multiplier = parallel_scaled.residual_multiplier = 0.25;
  EXPECT_LT(relative_difference(run_granite(parallel_scaled).logits, run_granite(parallel).logits),
            1e-5);
}

// The logits are the plain model's times logit_scale, and the loss is the
// cross entropy of those scaled logits (log-softmax in double here).
TEST(GraniteScalars, LogitScaleMultipliesTheLogitsTheLossReads) {
  const GptConfig plain = granite_config();
  GptConfig scaled = plain;
  scaled.logit_scale = 0.125;
  const Outputs a = run_granite(plain), b = run_granite(scaled);
  const std::vector<double> x = to_double_vector(a.logits), y = to_double_vector(b.logits);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], 0.125 * x[i], 1e-6 * std::abs(x[i]));
  const int64_t V = plain.vocab_size;
  const std::vector<double> t = to_double_vector(kTargets);
  double loss = 0;
  for (size_t row = 0; row < t.size(); ++row) {
    const double* z = y.data() + row * static_cast<size_t>(V);
    const double top = *std::max_element(z, z + V);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(z[v] - top);
    loss += top + std::log(sum) - z[static_cast<size_t>(t[row])];
  }
  EXPECT_NEAR(item(b.loss), loss / static_cast<double>(t.size()), 1e-5);
  EXPECT_GT(std::abs(item(b.loss) - item(a.loss)), 1e-3);
}

// The scalars add no parameters; they must be positive and finite, and the
// logit scale, applied to ln_f's output, needs a head without a bias.
TEST(GraniteScalars, AddNoParametersAndAreChecked) {
  GptConfig c = granite_config();
  const int64_t count = c.num_parameters();
  c.residual_multiplier = 0.22;
  c.logit_scale = 1.0 / 16;
  EXPECT_EQ(c.num_parameters(), count);
  EXPECT_EQ(Gpt(c, 1).named_parameters().size(),
            Gpt(granite_config(), 1).named_parameters().size());
  GptConfig bad = c;
  bad.residual_multiplier = 0.0;
  triad::testing::expect_invalid(bad, "model.residual_multiplier (0.000000) must be a positive");
  bad = c;
  bad.logit_scale = std::nan("");
  triad::testing::expect_invalid(bad, "model.logit_scale (nan) must be a positive");
  bad = c;
  bad.tie_embeddings = false;
  bad.head_bias = true;
  triad::testing::expect_invalid(bad, "model.head_bias is true");
}

}  // namespace
}  // namespace triad::nn
