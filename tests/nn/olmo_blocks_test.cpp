// OLMo 2's blocks: query/key norms over all the heads together
// (model.qk_norm: full) and sublayers that read the residual stream itself,
// only their outputs normalised (model.pre_norms: false). The norm against
// its formula, the parameters, what sets the full norm apart from the
// per-head one, the block's wiring, and the config's checks. And OLMo's
// (the first) LayerNorms that learn nothing (model.norm_affine: false).
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

// 4 query heads over 2 key/value heads of 8, d_model 32, RMSNorm, SwiGLU.
GptConfig olmo2_config() {
  GptConfig c{
      .n_layer = 2, .n_head = 4, .n_kv_head = 2, .d_model = 32, .vocab_size = 29, .seq_len = 8};
  set_qk_norm(c, "full");
  c.pre_norms = false;
  c.post_norms = true;
  c.position_embedding = PositionEmbedding::Rotary;
  c.normalization = Normalization::RmsNorm;
  c.activation = Activation::SwiGlu;
  c.ffn_hidden_size = 40;
  c.linear_bias = false;
  c.tie_embeddings = false;
  return c;
}

double sum_of_squares(const Tensor& t) {
  double s = 0;
  for (double v : to_double_vector(t)) s += v * v;
  return s;
}

double worst_difference(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = to_double_vector(a), y = to_double_vector(b);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

// The queries' q_width features are scaled by their one root mean square and
// the weight, the keys' kv_width alike; the values are left alone.
TEST(FullQkNorm, NormalisesAllQueriesTogetherAndAllKeysTogether) {
  const int64_t B = 2, T = 3, Q = 12, KV = 6, W = Q + 2 * KV;
  const Tensor qkv = randn({B, T, W}, 5, 1, 1.0, DType::F64);
  LayerNorm q_norm(Q, 1e-6, DType::F64, true), k_norm(KV, 1e-6, DType::F64, true);
  std::vector<double> qw, kw;
  for (int64_t d = 0; d < Q; ++d) qw.push_back(0.5 + 0.1 * static_cast<double>(d));
  for (int64_t d = 0; d < KV; ++d) kw.push_back(1.5 - 0.2 * static_cast<double>(d));
  q_norm.load_state_dict({{"weight", from_vector(qw, {Q}, DType::F64)}});
  k_norm.load_state_dict({{"weight", from_vector(kw, {KV}, DType::F64)}});
  const std::vector<double> in = to_double_vector(qkv);
  const std::vector<double> got = to_double_vector(norm_query_key(qkv, Q, KV, q_norm, k_norm));
  ASSERT_EQ(got.size(), in.size());
  for (int64_t r = 0; r < B * T; ++r) {
    const size_t row = static_cast<size_t>(r * W);
    double q_ms = 0, k_ms = 0;
    for (int64_t d = 0; d < Q; ++d) q_ms += in[row + d] * in[row + d] / Q;
    for (int64_t d = 0; d < KV; ++d) k_ms += in[row + Q + d] * in[row + Q + d] / KV;
    for (int64_t d = 0; d < W; ++d) {
      const double x = in[row + d];
      const double want = d < Q        ? x / std::sqrt(q_ms + 1e-6) * qw[d]
                          : d < Q + KV ? x / std::sqrt(k_ms + 1e-6) * kw[d - Q]
                                       : x;
      ASSERT_NEAR(got[row + d], want, 1e-12) << "row " << r << " feature " << d;
    }
  }
  EXPECT_THROW(norm_query_key(randn({B, T, W + 1}, 1, 1, 1.0, DType::F64), Q, KV, q_norm, k_norm),
               ShapeError);
  EXPECT_THROW(norm_query_key(randn({T, W}, 1, 1, 1.0, DType::F64), Q, KV, q_norm, k_norm),
               ShapeError);
}

// The norms are q_width and kv_width wide; the blocks hold no ln_1 or ln_2,
// and the count says so.
TEST(Olmo2Blocks, ParametersAreTheFullNormsAndThePostNormsAlone) {
  const GptConfig c = olmo2_config();
  const Gpt m(c, 3);
  const StateDict sd = m.state_dict();
  EXPECT_EQ(sd.at("h.1.attn.q_norm.weight").shape(), (Shape{32}));
  EXPECT_EQ(sd.at("h.1.attn.k_norm.weight").shape(), (Shape{16}));
  EXPECT_EQ(sd.at("h.0.post_attn_norm.weight").shape(), (Shape{32}));
  EXPECT_EQ(sd.at("h.0.post_mlp_norm.weight").shape(), (Shape{32}));
  EXPECT_EQ(sd.count("h.0.ln_1.weight"), 0u);
  EXPECT_EQ(sd.count("h.0.ln_2.weight"), 0u);
  EXPECT_EQ(m.num_parameters(), c.num_parameters());
  // (By their text: a build need not merge equal literals into one address.)
  const std::vector<const char*> norms = block_norms(c);
  EXPECT_EQ(std::vector<std::string>(norms.begin(), norms.end()),
            (std::vector<std::string>{"post_attn_norm", "post_mlp_norm"}));
  EXPECT_EQ(gpt_parameter_shapes(c).size(), sd.size());
  // Against Qwen3-style norms (one head's width each) and pre-norms: the
  // query/key norms 32 + 16 against 8 + 8, and two norms of 32 more.
  GptConfig per_head = c;
  set_qk_norm(per_head, "true");
  per_head.pre_norms = true;
  per_head.post_norms = false;
  EXPECT_EQ(c.num_parameters() - per_head.num_parameters(), 2 * ((32 + 16) - (8 + 8)));
  for (double v : to_double_vector(sd.at("h.0.attn.q_norm.weight"))) EXPECT_EQ(v, 1.0);
}

// What sets the full norm apart: one query head's scale changes its share
// of the queries' mean square and so the other heads' outputs; per head
// each head is normalised alone and the logits do not move.
TEST(Olmo2Blocks, OneHeadsScaleMovesTheLogitsOnlyUnderTheFullNorm) {
  for (const bool full : {true, false}) {
    SCOPED_TRACE(full ? "full" : "per head");
    GptConfig c = olmo2_config();
    set_qk_norm(c, full ? "full" : "true");
    c.layer_norm_eps = 1e-12;
    Gpt m(c, 9);
    StateDict sd = m.state_dict();
    for (auto& [name, t] : sd) {
      if (name.find("norm") == std::string::npos) t = scale(t, 20.0);
    }
    m.load_state_dict(sd);
    const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 9, 7, 3}, {1, 8});
    const Tensor before = m.forward(ids, {false, 0, 0});
    const int64_t D = c.head_dim();
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string name = "h." + std::to_string(i) + ".attn.c_attn.weight";
      const Tensor w = sd.at(name);  // query head 0's rows times 10
      sd[name] = concat({scale(narrow(w, 0, 0, D), 10.0), narrow(w, 0, D, w.size(0) - D)}, 0);
    }
    m.load_state_dict(sd);
    const double moved = worst_difference(m.forward(ids, {false, 0, 0}), before);
    if (full) {
      EXPECT_GT(moved, 1e-2);
    } else {
      EXPECT_LT(moved, 1e-4);
    }
  }
}

// Without pre-norms the attention reads the residual stream as it is: a
// model whose embeddings are scaled up sees different attention logits,
// while with ln_1 before it (the same weights otherwise) the block's
// attention input is the same and only the residual carries the scale.
// The post-norms bound each sublayer's output whatever its input's size.
TEST(Olmo2Blocks, TheSublayersReadTheStreamAndTheirOutputsAreNormalised) {
  const GptConfig c = olmo2_config();
  Gpt m(c, 4);
  const Tensor x = randn({2, 5, 32}, 6, 1, 1.0);
  const Block& b = m.block(0);
  // h = x + post_attn_norm(attn(x)); out = h + post_mlp_norm(mlp(h)): with
  // unit norm weights and RMSNorm, each added part has a root mean square
  // of one per token (up to eps), whatever x's size.
  for (const double size : {1.0, 100.0}) {
    const Tensor in = scale(x, size);
    const std::vector<double> got = to_double_vector(sub(b.forward(in, {false, 0, 0}), in));
    // The two normalised parts summed: their mean square per token lies in
    // [0, 4] (at most (1 + 1)^2), and is not the input's.
    for (int64_t r = 0; r < 10; ++r) {
      double ms = 0;
      for (int64_t d = 0; d < 32; ++d) ms += got[r * 32 + d] * got[r * 32 + d] / 32;
      EXPECT_LE(ms, 4.0 + 1e-4) << "size " << size << " token " << r;
      EXPECT_GT(ms, 1e-3) << "size " << size << " token " << r;
    }
  }
}

// Every weight, the full query/key norms and both post-norms included,
// gets a gradient.
TEST(Olmo2Blocks, EveryParameterGetsAGradient) {
  triad::testing::expect_every_parameter_gets_a_gradient(Gpt(olmo2_config(), 4));
}

TEST(Olmo2Blocks, ConfigIsChecked) {
  GptConfig c = olmo2_config();
  c.post_norms = false;
  triad::testing::expect_invalid(c,
                                 "model.pre_norms: false (OLMo 2's blocks) needs "
                                 "model.post_norms: true");
  c.post_norms = true;
  c.parallel_residual = true;
  triad::testing::expect_invalid(c, "needs no model.parallel_residual");
  c = olmo2_config();
  c.qk_norm = false;  // full without the norms themselves
  triad::testing::expect_invalid(c, "model.qk_norm_full");
  // Under the full norm, as under any other, tensor parallelism holds whole
  // key/value heads on each rank or shares each over tp / n_kv_head ranks
  // (2 heads over 4 ranks); 2 heads over 3 ranks fit neither way.
  c = olmo2_config();
  EXPECT_TRUE(c.kv_heads_fit(2));
  EXPECT_TRUE(c.kv_heads_fit(4));
  EXPECT_FALSE(c.kv_heads_fit(3));
  EXPECT_NE(c.kv_heads_rule(3, "parallel.tp").find("divisible by parallel.tp (3)"),
            std::string::npos);
  set_qk_norm(c, "head");
  EXPECT_TRUE(c.kv_heads_fit(4));
  EXPECT_THROW(set_qk_norm(c, "partial"), ConfigError);
  EXPECT_STREQ(qk_norm_string(c), "true");
  set_qk_norm(c, "full");
  EXPECT_STREQ(qk_norm_string(c), "full");
  set_qk_norm(c, "none");
  EXPECT_STREQ(qk_norm_string(c), "false");
}

// OLMo's blocks: LLaMA's with LayerNorms that have no weight or bias.
GptConfig olmo_config() {
  GptConfig c{
      .n_layer = 2, .n_head = 4, .n_kv_head = 2, .d_model = 32, .vocab_size = 29, .seq_len = 8};
  c.position_embedding = PositionEmbedding::Rotary;
  c.activation = Activation::SwiGlu;
  c.ffn_hidden_size = 40;
  c.linear_bias = false;
  c.tie_embeddings = false;
  c.norm_affine = false;
  return c;
}

// No norm holds a parameter, and the count, the shapes every layout builds
// its names from and the module agree; the query/key norms keep theirs.
TEST(NonAffineNorms, HoldNoParameters) {
  GptConfig c = olmo_config();
  const Gpt m(c, 3);
  const StateDict sd = m.state_dict();
  for (const auto& [name, t] : sd) {
    EXPECT_EQ(name.find("ln_"), std::string::npos) << name;
    EXPECT_EQ(name.find("norm"), std::string::npos) << name;
  }
  EXPECT_EQ(m.num_parameters(), c.num_parameters());
  EXPECT_EQ(gpt_parameter_shapes(c).size(), sd.size());
  GptConfig affine = c;
  affine.norm_affine = true;  // 2 LayerNorms a block and ln_f, weight and bias each
  EXPECT_EQ(affine.num_parameters() - c.num_parameters(), (2 * 2 + 1) * 2 * 32);
  EXPECT_EQ(gpt_parameter_shapes(affine).size() - sd.size(), 10u);
  set_qk_norm(c, "true");
  const StateDict with_qk = Gpt(c, 3).state_dict();
  EXPECT_EQ(with_qk.count("h.0.attn.q_norm.weight"), 1u);
  EXPECT_EQ(with_qk.count("h.0.ln_1.weight"), 0u);
  EXPECT_EQ(Gpt(c, 3).num_parameters(), c.num_parameters());
}

// The same function as learned LayerNorms at their start (weight 1, bias
// 0): logits, loss and every shared parameter's gradient equal bit for bit,
// with the fused add + norm too (recompute none) and the norms' own
// gradients simply absent.
TEST(NonAffineNorms, EqualLayerNormsAtUnitWeightAndZeroBias) {
  const GptConfig c = olmo_config();
  GptConfig affine = c;
  affine.norm_affine = true;
  for (const DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Gpt plain(c, 5), learned(affine, 5);
    StateDict sd = plain.state_dict();
    for (const auto& [name, t] : learned.state_dict()) {
      if (sd.count(name) == 0) {
        ASSERT_NE(name.find("ln_"), std::string::npos) << name;
        for (double v : to_double_vector(t)) ASSERT_EQ(v, name.ends_with(".weight") ? 1.0 : 0.0);
      }
    }
    StateDict learned_sd = learned.state_dict();
    for (const auto& [name, t] : sd) learned_sd[name] = t;
    learned.load_state_dict(learned_sd);
    plain.to(dtype);
    learned.to(dtype);
    const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 9, 7, 3}, {2, 4});
    const Tensor targets = from_vector(std::vector<int64_t>{2, 3, 4, 5, 9, 7, 3, 1}, {2, 4});
    EXPECT_EQ(
        worst_difference(plain.forward(ids, {false, 0, 0}), learned.forward(ids, {false, 0, 0})),
        0.0);
    const Tensor a = plain.loss(ids, targets), b = learned.loss(ids, targets);
    EXPECT_EQ(to_double_vector(a), to_double_vector(b));
    autograd::backward({a});
    autograd::backward({b});
    const auto theirs = learned.named_parameters();
    for (const auto& [name, p] : plain.named_parameters()) {
      const auto it = std::find_if(theirs.begin(), theirs.end(),
                                   [&](const auto& q) { return q.first == name; });
      ASSERT_NE(it, theirs.end()) << name;
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_GT(sum_of_squares(p.grad()), 0.0) << name;
      EXPECT_EQ(worst_difference(p.grad(), it->second.grad()), 0.0) << name;
    }
  }
}

// Each token's normalised features have mean 0 and variance 1 (up to eps),
// whatever the input's scale and shift.
TEST(NonAffineNorms, NormaliseEachTokenToZeroMeanAndUnitVariance) {
  const LayerNorm norm(16, 1e-5, DType::F64, false, false, false);
  EXPECT_TRUE(norm.named_parameters().empty());
  const Tensor x = affine(randn({3, 16}, 2, 1, 1.0, DType::F64), 40.0, 7.0);
  const std::vector<double> y = to_double_vector(norm.forward(x));
  for (int64_t r = 0; r < 3; ++r) {
    double mean = 0, var = 0;
    for (int64_t d = 0; d < 16; ++d) mean += y[r * 16 + d] / 16;
    for (int64_t d = 0; d < 16; ++d) var += (y[r * 16 + d] - mean) * (y[r * 16 + d] - mean) / 16;
    EXPECT_NEAR(mean, 0.0, 1e-12) << r;
    EXPECT_NEAR(var, 1.0, 1e-6) << r;
  }
  EXPECT_THROW(LayerNorm(16, 1e-5, DType::F32, true, true, false), ValueError);
}

// model.clip_qkv clamps c_attn's outputs: a bound above every value leaves
// the model as it was, bit for bit; a bound inside their spread changes the
// logits and stops the gradient of every clamped value (c_attn's weight
// gradient shrinks); the bound must be a finite number >= 0.
TEST(ClipQkv, ClampsTheProjectionsAndStopsTheirGradients) {
  const GptConfig c = olmo_config();
  const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 9, 7, 3}, {2, 4});
  const Tensor targets = from_vector(std::vector<int64_t>{2, 3, 4, 5, 9, 7, 3, 1}, {2, 4});
  auto run = [&](double clip) {
    GptConfig k = c;
    k.clip_qkv = clip;
    Gpt m(k, 5);
    const Tensor logits = m.forward(ids, {false, 0, 0});
    autograd::backward({m.loss(ids, targets)});
    double g = 0;
    for (const auto& [name, p] : m.named_parameters()) {
      if (name.find("c_attn") != std::string::npos) g += sum_of_squares(p.grad());
    }
    return std::pair{logits, g};
  };
  const auto [plain, plain_grad] = run(0.0);
  const auto [loose, loose_grad] = run(1e6);
  const auto [tight, tight_grad] = run(0.02);
  EXPECT_EQ(worst_difference(plain, loose), 0.0);
  EXPECT_EQ(plain_grad, loose_grad);
  EXPECT_GT(worst_difference(plain, tight), 1e-4);
  EXPECT_LT(tight_grad, plain_grad);
  GptConfig bad = c;
  bad.clip_qkv = -1.0;
  triad::testing::expect_invalid(bad, "model.clip_qkv (-1.000000) must be a finite number >= 0");
}

TEST(NonAffineNorms, ConfigIsChecked) {
  GptConfig c = olmo_config();
  c.validate();
  c.norm_weight_offset = true;
  triad::testing::expect_invalid(c, "model.norm_affine: false norms have no weight");
}

}  // namespace
}  // namespace triad::nn
