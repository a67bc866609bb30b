// Qwen3's attention options: heads of their own width (model.head_dim) and
// RMSNorm over each query head and each key head (model.qk_norm). The
// shapes, counts and FLOPs, the norm against its formula, the property it
// exists for, and the config's checks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/gpt_config_checks.h"
#include "triad/autograd/engine.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

// 4 query heads of 12 over 2 key/value heads, d_model 32: the heads are 48
// wide together, not 32.
GptConfig qwen3_config() {
  GptConfig c{
      .n_layer = 2, .n_head = 4, .n_kv_head = 2, .d_model = 32, .vocab_size = 29, .seq_len = 8};
  c.head_size = 12;
  c.qk_norm = true;
  c.position_embedding = PositionEmbedding::Rotary;
  c.normalization = Normalization::RmsNorm;
  c.activation = Activation::SwiGlu;
  c.ffn_hidden_size = 40;
  c.linear_bias = false;
  return c;
}

TEST(HeadDim, ShapesCountsAndFlopsFollowTheHeadsWidth) {
  const GptConfig c = qwen3_config();
  EXPECT_EQ(c.head_dim(), 12);
  EXPECT_EQ(c.q_width(), 48);
  EXPECT_EQ(c.qkv_width(), 48 + 2 * 2 * 12);
  EXPECT_TRUE(c.heads_apart());
  const Gpt m(c, 3);
  const StateDict sd = m.state_dict();
  EXPECT_EQ(sd.at("h.1.attn.c_attn.weight").shape(), (Shape{96, 32}));
  EXPECT_EQ(sd.at("h.1.attn.c_proj.weight").shape(), (Shape{32, 48}));
  EXPECT_EQ(sd.at("h.1.attn.q_norm.weight").shape(), (Shape{12}));
  EXPECT_EQ(sd.at("h.1.attn.k_norm.weight").shape(), (Shape{12}));
  EXPECT_EQ(m.num_parameters(), c.num_parameters());
  // The head norms start at one, as every norm does.
  for (double v : to_double_vector(sd.at("h.0.attn.q_norm.weight"))) EXPECT_EQ(v, 1.0);
  // Against heads d_model / n_head wide: c_attn 64 tall instead of 96 and
  // c_proj 32 wide instead of 48, both (32 wide and tall) in each of 2
  // layers, and no head norms.
  GptConfig narrow_heads = c;
  narrow_heads.head_size = 0;
  narrow_heads.qk_norm = false;
  EXPECT_FALSE(narrow_heads.heads_apart());
  EXPECT_EQ(c.num_parameters() - narrow_heads.num_parameters(),
            2 * ((96 - 64) * 32 + 32 * (48 - 32) + 2 * 12));
  // Forward FLOPs a token: 2 per weight more, and 4 * seq_len per unit of
  // the wider query heads (scores and their product with V), per layer;
  // training three times that.
  EXPECT_NEAR(c.training_flops(1) - narrow_heads.training_flops(1),
              8 * 3 * 2 * (2 * ((96 - 64) * 32 + 32 * (48 - 32)) + 4 * 8 * (48 - 32)), 1e-6);
  // head_dim equal to d_model / n_head is no different from its absence.
  GptConfig same = narrow_heads;
  same.head_size = 8;
  EXPECT_FALSE(same.heads_apart());
  EXPECT_EQ(same.num_parameters(), narrow_heads.num_parameters());
}

// Each query head's and key head's D features are scaled by their root mean
// square and the weight; the values are left alone.
TEST(QkNorm, NormalisesEachQueryAndKeyHeadAndCopiesTheValues) {
  const int64_t B = 2, T = 3, H = 4, KV = 2, D = 6, W = (H + 2 * KV) * D;
  const Tensor qkv = randn({B, T, W}, 5, 1, 1.0, DType::F64);
  LayerNorm q_norm(D, 1e-6, DType::F64, true), k_norm(D, 1e-6, DType::F64, true);
  std::vector<double> qw, kw;
  for (int64_t d = 0; d < D; ++d) {
    qw.push_back(0.5 + 0.1 * static_cast<double>(d));
    kw.push_back(1.5 - 0.2 * static_cast<double>(d));
  }
  q_norm.load_state_dict({{"weight", from_vector(qw, {D}, DType::F64)}});
  k_norm.load_state_dict({{"weight", from_vector(kw, {D}, DType::F64)}});
  const std::vector<double> in = to_double_vector(qkv);
  const std::vector<double> got =
      to_double_vector(norm_query_key_heads(qkv, AttentionHeads{H, KV}, q_norm, k_norm));
  ASSERT_EQ(got.size(), in.size());
  for (int64_t r = 0; r < B * T; ++r) {
    for (int64_t h = 0; h < H + 2 * KV; ++h) {
      const size_t at = static_cast<size_t>(r * W + h * D);
      double ms = 0;
      for (int64_t d = 0; d < D; ++d) ms += in[at + d] * in[at + d] / D;
      for (int64_t d = 0; d < D; ++d) {
        const double x = in[at + d];
        const double want = h < H        ? x / std::sqrt(ms + 1e-6) * qw[d]
                            : h < H + KV ? x / std::sqrt(ms + 1e-6) * kw[d]
                                         : x;
        ASSERT_NEAR(got[at + d], want, 1e-12) << "row " << r << " head " << h << " d " << d;
      }
    }
  }
  EXPECT_THROW(norm_query_key_heads(randn({B, T, W + 1}, 1, 1, 1.0, DType::F64),
                                    AttentionHeads{H, KV}, q_norm, k_norm),
               ShapeError);
  EXPECT_THROW(norm_query_key_heads(randn({T, W}, 1, 1, 1.0, DType::F64), AttentionHeads{H, KV},
                                    q_norm, k_norm),
               ShapeError);
}

// Command R+'s norms (model.qk_norm: head_layernorm): each head's mean
// removed and its variance divided out, then each feature of each head
// scaled by that head's own weight (one vector, head h's at h * D); the
// values copied. Its gradient reaches every head's weights and each head's
// weights only that head.
TEST(QkNorm, HeadLayerNormsWeighEachHeadByItsOwn) {
  const int64_t B = 2, T = 3, H = 4, KV = 2, D = 6, W = (H + 2 * KV) * D;
  const double eps = 1e-6;
  const Tensor qkv = randn({B, T, W}, 5, 1, 1.0, DType::F64);
  HeadLayerNorm q_norm(H, D, eps, DType::F64), k_norm(KV, D, eps, DType::F64);
  EXPECT_EQ(q_norm.state_dict().at("weight").shape(), (Shape{H * D}));
  for (double v : to_double_vector(q_norm.state_dict().at("weight"))) EXPECT_EQ(v, 1.0);
  std::vector<double> qw, kw;
  for (int64_t i = 0; i < H * D; ++i) qw.push_back(0.5 + 0.03 * static_cast<double>(i));
  for (int64_t i = 0; i < KV * D; ++i) kw.push_back(1.5 - 0.05 * static_cast<double>(i));
  q_norm.load_state_dict({{"weight", from_vector(qw, {H * D}, DType::F64)}});
  k_norm.load_state_dict({{"weight", from_vector(kw, {KV * D}, DType::F64)}});
  const std::vector<double> in = to_double_vector(qkv);
  const Tensor out = norm_query_key_heads(qkv, AttentionHeads{H, KV}, q_norm, k_norm);
  const std::vector<double> got = to_double_vector(out);
  ASSERT_EQ(got.size(), in.size());
  for (int64_t r = 0; r < B * T; ++r) {
    for (int64_t h = 0; h < H + 2 * KV; ++h) {
      const size_t at = static_cast<size_t>(r * W + h * D);
      double mean = 0, var = 0;
      for (int64_t d = 0; d < D; ++d) mean += in[at + d] / D;
      for (int64_t d = 0; d < D; ++d) var += (in[at + d] - mean) * (in[at + d] - mean) / D;
      for (int64_t d = 0; d < D; ++d) {
        const double x = in[at + d], n = (x - mean) / std::sqrt(var + eps);
        const double want = h < H        ? n * qw[static_cast<size_t>(h * D + d)]
                            : h < H + KV ? n * kw[static_cast<size_t>((h - H) * D + d)]
                                         : x;
        ASSERT_NEAR(got[at + d], want, 1e-12) << "row " << r << " head " << h << " d " << d;
      }
    }
  }
  // A loss on query head 1 alone: only head 1's weights get a gradient.
  const Tensor head1 = narrow(reshape(out, {B, T, H + 2 * KV, D}), 2, 1, 1);
  autograd::backward({sum(mul(head1, head1))});
  const std::vector<double> g = to_double_vector(q_norm.named_parameters().at(0).second.grad());
  for (int64_t i = 0; i < H * D; ++i) {
    if (i / D == 1) {
      EXPECT_NE(g[static_cast<size_t>(i)], 0.0) << i;
    } else {
      EXPECT_EQ(g[static_cast<size_t>(i)], 0.0) << i;
    }
  }
  EXPECT_THROW(norm_query_key_heads(qkv, AttentionHeads{H + 2, KV - 1}, q_norm, k_norm),
               ShapeError);
  EXPECT_THROW(HeadLayerNorm(0, D), ValueError);
}

// What the norm is for: the attention no longer depends on how large the
// query and key projections grow. Scaling c_attn's q and k rows by 10
// leaves the logits (almost: eps) unchanged with qk_norm and moves them
// without.
TEST(QkNorm, LogitsIgnoreTheScaleOfTheQueryAndKeyProjections) {
  for (const std::string mode : {"true", "head_layernorm", "false"}) {
    SCOPED_TRACE("model.qk_norm: " + mode);
    GptConfig c = qwen3_config();
    set_qk_norm(c, mode);
    const bool qk_norm = c.qk_norm;
    c.layer_norm_eps = 1e-12;
    Gpt m(c, 9);
    // Large enough weights that the attention is not uniform.
    StateDict sd = m.state_dict();
    for (auto& [name, t] : sd) {
      if (name.find("norm") == std::string::npos && name.find("ln_") == std::string::npos)
        t = scale(t, 20.0);
    }
    m.load_state_dict(sd);
    const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 9, 7, 3}, {1, 8});
    const std::vector<double> before = to_double_vector(m.forward(ids, {false, 0, 0}));
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string name = "h." + std::to_string(i) + ".attn.c_attn.weight";
      const Tensor w = sd.at(name);
      const int64_t qk = c.q_width() + c.kv_heads() * c.head_dim();  // q's and k's rows
      sd[name] = concat({scale(narrow(w, 0, 0, qk), 10.0), narrow(w, 0, qk, w.size(0) - qk)}, 0);
    }
    m.load_state_dict(sd);
    const std::vector<double> after = to_double_vector(m.forward(ids, {false, 0, 0}));
    double worst = 0, largest = 0;
    for (size_t i = 0; i < before.size(); ++i) {
      worst = std::max(worst, std::abs(after[i] - before[i]));
      largest = std::max(largest, std::abs(before[i]));
    }
    if (qk_norm) {
      EXPECT_LT(worst, 1e-5 * (1 + largest));
    } else {
      EXPECT_GT(worst, 1e-2);
    }
  }
}

// Every weight, the head norms included, gets a gradient (Command R+'s
// too, n_head * D and kv_heads * D wide).
TEST(QkNorm, EveryParameterGetsAGradient) {
  for (const std::string mode : {"true", "head_layernorm"}) {
    SCOPED_TRACE("model.qk_norm: " + mode);
    GptConfig c = qwen3_config();
    set_qk_norm(c, mode);
    Gpt m(c, 4);
    EXPECT_EQ(m.state_dict().at("h.0.attn.k_norm.weight").shape(),
              (Shape{mode == "true" ? c.head_dim() : c.kv_heads() * c.head_dim()}));
    EXPECT_EQ(m.num_parameters(), c.num_parameters());
    triad::testing::expect_every_parameter_gets_a_gradient(m);
  }
}

TEST(HeadDim, ConfigIsChecked) {
  GptConfig c = qwen3_config();
  c.head_size = -4;
  triad::testing::expect_invalid(c, "model.head_dim (-4) must be positive");
  c.head_size = 7;  // rotary embeddings turn pairs of features
  triad::testing::expect_invalid(c, "rope needs an even head dimension; model.head_dim is 7");
  // d_model not divisible by n_head needs the heads' width set.
  c.head_size = 0;
  c.d_model = 30;
  triad::testing::expect_invalid(
      c, "model.d_model (30) must be divisible by model.n_head (4), or model.head_dim");
  c.head_size = 8;
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.q_width(), 32);
  EXPECT_TRUE(c.heads_apart());
  EXPECT_NO_THROW(Gpt(c, 1));
}

}  // namespace
}  // namespace triad::nn
