// Cohere's LayerNorms: a learned scale and no shift (model.norm_bias:
// false). The same model as LayerNorms whose bias stays zero, bit for bit,
// with fewer parameters; and the config's checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "support/gpt_config_checks.h"
#include "triad/autograd/engine.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

// Cohere's blocks: LLaMA's sublayers in parallel on one LayerNorm without a
// bias, 4 query heads over 2 key/value heads.
GptConfig cohere_config() {
  GptConfig c{
      .n_layer = 2, .n_head = 4, .n_kv_head = 2, .d_model = 32, .vocab_size = 29, .seq_len = 8};
  c.position_embedding = PositionEmbedding::Rotary;
  c.activation = Activation::SwiGlu;
  c.ffn_hidden_size = 40;
  c.linear_bias = false;
  c.parallel_residual = c.shared_norm = true;
  c.norm_bias = false;
  return c;
}

// The norms hold weights and no biases (the final one too), and the count,
// the shapes every layout builds its names from and the module agree.
TEST(NormBias, LayerNormsWithoutABiasHoldTheirWeightsAlone) {
  const GptConfig c = cohere_config();
  const Gpt m(c, 3);
  const StateDict sd = m.state_dict();
  EXPECT_TRUE(sd.count("h.0.ln_1.weight"));
  EXPECT_TRUE(sd.count("ln_f.weight"));
  for (const auto& [name, t] : sd) EXPECT_EQ(name.find(".bias"), std::string::npos) << name;
  const auto shapes = gpt_parameter_shapes(c);
  EXPECT_EQ(shapes.size(), sd.size());
  GptConfig biased = c;
  biased.norm_bias = true;
  // One norm a block (shared) and the final one, d_model each.
  EXPECT_EQ(biased.num_parameters() - c.num_parameters(), (2 + 1) * 32);
  int64_t counted = 0;
  for (const auto& [name, t] : sd) counted += t.numel();
  EXPECT_EQ(counted, c.num_parameters());
}

// A LayerNorm without a bias is one whose bias is zero: the same logits and
// weight gradients, bit for bit, in f32; in bf16 the same logits, and
// gradients that agree to bf16's rounding.
TEST(NormBias, EqualsLayerNormsOfZeroBias) {
  const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 9, 7, 3}, {2, 4});
  const Tensor targets = from_vector(std::vector<int64_t>{2, 3, 4, 5, 9, 7, 3, 1}, {2, 4});
  for (const DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const GptConfig c = cohere_config();
    GptConfig biased = c;
    biased.norm_bias = true;
    Gpt plain(c, 5, dtype), zero(biased, 5, dtype);
    StateDict weights = plain.state_dict();
    for (const auto& [name, t] : zero.state_dict()) {
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0)
        weights.emplace(name, zeros(t.shape(), t.dtype()));
    }
    zero.load_state_dict(weights);
    EXPECT_EQ(to_double_vector(plain.forward(ids, {false, 0, 0})),
              to_double_vector(zero.forward(ids, {false, 0, 0})));
    autograd::backward({plain.loss(ids, targets)});
    autograd::backward({zero.loss(ids, targets)});
    std::map<std::string, Tensor> zero_params;
    for (const auto& [name, p] : zero.named_parameters()) zero_params.emplace(name, p);
    for (const auto& [name, p] : plain.named_parameters()) {
      const std::vector<double> a = to_double_vector(p.grad()),
                                b = to_double_vector(zero_params.at(name).grad());
      if (dtype == DType::F32) {
        EXPECT_EQ(a, b) << name;
        continue;
      }
      double scale = 0;
      for (double v : b) scale = std::max(scale, std::abs(v));
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-2 * scale) << name;
    }
  }
}

TEST(NormBias, ConfigIsChecked) {
  GptConfig c = cohere_config();
  c.validate();
  c.normalization = Normalization::RmsNorm;
  triad::testing::expect_invalid(c,
                                 "model.norm_bias: false drops a LayerNorm's learned shift, "
                                 "but model.normalization is rmsnorm");
  c = cohere_config();
  c.norm_affine = false;
  triad::testing::expect_invalid(c, "model.norm_affine: false norms learn nothing");
}

}  // namespace
}  // namespace triad::nn
