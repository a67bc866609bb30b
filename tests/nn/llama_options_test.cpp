// LLaMA-style options of the GPT: rotary position embeddings (the op
// against its formula and the property it exists for) and the SwiGLU MLP
// of any width, and the models that use them.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "triad/autograd/engine.h"
#include "triad/autograd/grad_mode.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

// The rotate-half rule written out for one head vector at one position.
std::vector<double> rotated(const std::vector<double>& x, double position, double theta) {
  const size_t D = x.size(), half = D / 2;
  std::vector<double> y(D);
  for (size_t i = 0; i < half; ++i) {
    const double a = position * std::pow(theta, -2.0 * static_cast<double>(i) / D);
    y[i] = x[i] * std::cos(a) - x[i + half] * std::sin(a);
    y[i + half] = x[i + half] * std::cos(a) + x[i] * std::sin(a);
  }
  return y;
}

TEST(RotaryEmbedding, TurnsEachHeadsPairsOfQueriesAndKeysAndCopiesValues) {
  // B 2, T 3, 2 heads of D 6: C 12, qkv 36 wide.
  const int64_t B = 2, T = 3, H = 2, D = 6, C = H * D;
  const Tensor qkv = randn({B, T, 3 * C}, 3, 1, 1.0, DType::F64);
  const Tensor positions = from_vector(std::vector<int64_t>{0, 4, 5, 9, 0, 1}, {B, T});
  const double theta = 100.0;
  const std::vector<double> in = to_double_vector(qkv);
  for (const bool explicit_positions : {true, false}) {
    SCOPED_TRACE(explicit_positions ? "positions" : "start 7");
    const Tensor out = explicit_positions ? rotary_embedding(qkv, H, positions, 0, theta)
                                          : rotary_embedding(qkv, H, {}, 7, theta);
    const std::vector<double> got = to_double_vector(out);
    const std::vector<int64_t> pos = {0, 4, 5, 9, 0, 1};
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const double p = explicit_positions ? static_cast<double>(pos[b * T + t]) : 7.0 + t;
        const size_t row = static_cast<size_t>((b * T + t) * 3 * C);
        for (int64_t h = 0; h < 2 * H; ++h) {  // q's and k's heads
          const size_t at = row + static_cast<size_t>(h * D);
          const std::vector<double> want =
              rotated(std::vector<double>(in.begin() + at, in.begin() + at + D), p, theta);
          for (int64_t d = 0; d < D; ++d) {
            ASSERT_NEAR(got[at + d], want[d], 1e-12) << "b " << b << " t " << t << " head " << h;
          }
        }
        for (int64_t d = 2 * C; d < 3 * C; ++d) {
          ASSERT_EQ(got[row + d], in[row + d]) << "v changed";
        }
      }
    }
  }
}

// What RoPE is for: the score between a query and a key depends on how far
// apart they are, not on where they are.
TEST(RotaryEmbedding, ScoresDependOnlyOnTheDistance) {
  const int64_t H = 1, D = 8, C = H * D;
  const Tensor qkv = randn({1, 2, 3 * C}, 9, 2, 1.0, DType::F64);
  auto score = [&](int64_t query_at, int64_t key_at) {
    const Tensor r =
        rotary_embedding(qkv, H, from_vector(std::vector<int64_t>{query_at, key_at}, {1, 2}));
    const std::vector<double> v = to_double_vector(r);
    double s = 0;  // token 0's query . token 1's key
    for (int64_t d = 0; d < D; ++d) s += v[d] * v[3 * C + C + d];
    return s;
  };
  const double near = score(3, 1);
  EXPECT_NEAR(score(103, 101), near, 1e-10);
  EXPECT_NEAR(score(2, 0), near, 1e-10);
  EXPECT_GT(std::abs(score(3, 0) - near), 1e-3) << "another distance should change the score";
}

TEST(RotaryEmbedding, BadArgumentsAreNamed) {
  const Tensor qkv = randn({1, 2, 36}, 1, 1);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { rotary_embedding(qkv, 4); }).find("even head dimension"),
            std::string::npos);  // D 3
  EXPECT_NE(message([&] { rotary_embedding(qkv, 2, {}, 0, -1.0); }).find("theta"),
            std::string::npos);
  EXPECT_NE(message([&] { rotary_embedding(qkv, 2, {}, -3); }).find("start (-3)"),
            std::string::npos);
  EXPECT_NE(message([&] {
              rotary_embedding(qkv, 2, from_vector(std::vector<int64_t>{0, 1, 2}, {1, 3}));
            }).find("positions must be (1, 2), got [1, 3]"),
            std::string::npos);
  EXPECT_NE(message([&] {
              rotary_embedding(qkv, 2, from_vector(std::vector<int64_t>{0, -1}, {1, 2}));
            }).find("positions[0, 1] is -1"),
            std::string::npos);
}

GptConfig rope_config() {
  GptConfig c{.n_layer = 2, .n_head = 2, .d_model = 16, .vocab_size = 23, .seq_len = 8};
  c.position_embedding = PositionEmbedding::Rotary;
  c.rope_theta = 40.0;
  return c;
}

TEST(RotaryGpt, HasNoPositionTableAndCountsItsParameters) {
  const Gpt m(rope_config(), 1);
  const StateDict sd = m.state_dict();
  EXPECT_EQ(sd.count("wpe.weight"), 0u);
  EXPECT_EQ(sd.size(), 1u + 12u * 2 + 2u);
  EXPECT_EQ(m.num_parameters(), rope_config().num_parameters());
  GptConfig learned = rope_config();
  learned.position_embedding = PositionEmbedding::Learned;
  EXPECT_EQ(learned.num_parameters() - rope_config().num_parameters(), 8 * 16);
  // Everything else is initialised as in the learned model.
  const Gpt l(learned, 1);
  for (const auto& [name, t] : sd) {
    EXPECT_EQ(to_double_vector(t), to_double_vector(l.state_dict().at(name))) << name;
  }
}

// Order matters to the model only through the rotations: with them the
// logits depend on the order of the tokens; a rotary model given the same
// tokens learns from gradients that reach every block's c_attn.
TEST(RotaryGpt, PositionsReachTheLogitsThroughTheAttention) {
  const Gpt m(rope_config(), 3);
  const Tensor a = from_vector(std::vector<int64_t>{5, 9, 5, 9}, {1, 4});
  const Tensor b = from_vector(std::vector<int64_t>{9, 5, 5, 9}, {1, 4});
  // The last token sees the same multiset {5, 9, 5, 9} in both rows; only
  // where they stand differs.
  const std::vector<double> la = to_double_vector(narrow(m.forward(a), 1, 3, 1));
  const std::vector<double> lb = to_double_vector(narrow(m.forward(b), 1, 3, 1));
  double diff = 0;
  for (size_t i = 0; i < la.size(); ++i) diff = std::max(diff, std::abs(la[i] - lb[i]));
  EXPECT_GT(diff, 1e-4);
  Tensor loss = m.loss(a, from_vector(std::vector<int64_t>{9, 5, 9, 1}, {1, 4}));
  autograd::backward({loss});
  for (const auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
  }
}

TEST(RotaryGpt, ConfigIsChecked) {
  GptConfig c = rope_config();
  c.d_model = 18;
  c.n_head = 6;  // head dim 3
  try {
    c.validate();
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("even head dimension"), std::string::npos) << e.what();
  }
  c = rope_config();
  c.rope_theta = 0;
  EXPECT_THROW(c.validate(), ConfigError);
  EXPECT_THROW(position_embedding_from_string("alibi"), ConfigError);
  EXPECT_EQ(position_embedding_from_string("rope"), PositionEmbedding::Rotary);
}

TEST(Swiglu, IsSiluOfTheFirstHalfTimesTheSecond) {
  const Tensor x = randn({2, 3, 8}, 4, 1, 2.0, DType::F64);
  const std::vector<double> in = to_double_vector(x), out = to_double_vector(swiglu(x));
  ASSERT_EQ(swiglu(x).shape(), (Shape{2, 3, 4}));
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t j = 0; j < 4; ++j) {
      const double a = in[r * 8 + j], b = in[r * 8 + 4 + j];
      EXPECT_NEAR(out[r * 4 + j], a / (1.0 + std::exp(-a)) * b, 1e-14);
    }
  }
  EXPECT_THROW(swiglu(randn({2, 5}, 1, 1)), ShapeError);
}

GptConfig swiglu_config(int64_t ffn) {
  GptConfig c{.n_layer = 2, .n_head = 2, .d_model = 16, .vocab_size = 23, .seq_len = 8};
  c.activation = Activation::SwiGlu;
  c.ffn_hidden_size = ffn;
  return c;
}

TEST(SwigluGpt, CFcHoldsGateAndValueAndTheCountsFollowTheWidth) {
  const Gpt m(swiglu_config(24), 1);
  const StateDict sd = m.state_dict();
  EXPECT_EQ(sd.at("h.0.mlp.c_fc.weight").shape(), (Shape{48, 16}));
  EXPECT_EQ(sd.at("h.0.mlp.c_fc.bias").shape(), (Shape{48}));
  EXPECT_EQ(sd.at("h.1.mlp.c_proj.weight").shape(), (Shape{16, 24}));
  EXPECT_EQ(m.num_parameters(), swiglu_config(24).num_parameters());
  // GELU with another width, and the default 4C.
  GptConfig gelu = swiglu_config(40);
  gelu.activation = Activation::Gelu;
  const Gpt g(gelu, 1);
  EXPECT_EQ(g.state_dict().at("h.0.mlp.c_fc.weight").shape(), (Shape{40, 16}));
  EXPECT_EQ(g.num_parameters(), gelu.num_parameters());
  EXPECT_EQ(swiglu_config(0).ffn(), 64);
  // Loss and gradients flow through the gate and the value.
  Tensor loss = m.loss(from_vector(std::vector<int64_t>{1, 2, 3, 4}, {1, 4}),
                       from_vector(std::vector<int64_t>{2, 3, 4, 5}, {1, 4}));
  autograd::backward({loss});
  const std::vector<double> gfc = to_double_vector(m.state_dict().at("h.0.mlp.c_fc.weight").grad());
  double gate = 0, value = 0;
  for (size_t i = 0; i < gfc.size(); ++i) (i < gfc.size() / 2 ? gate : value) += std::abs(gfc[i]);
  EXPECT_GT(gate, 0.0);
  EXPECT_GT(value, 0.0);
}

TEST(RmsNorm, ScalesEachRowByItsRootMeanSquare) {
  const Tensor x = randn({3, 5}, 8, 1, 2.0, DType::F64), w = randn({5}, 8, 2, 1.0, DType::F64);
  const std::vector<double> in = to_double_vector(x), wv = to_double_vector(w),
                            out = to_double_vector(rms_norm(x, w, 1e-3));
  for (int64_t r = 0; r < 3; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < 5; ++i) ss += in[r * 5 + i] * in[r * 5 + i];
    const double rs = 1.0 / std::sqrt(ss / 5 + 1e-3);
    for (int64_t i = 0; i < 5; ++i) EXPECT_NEAR(out[r * 5 + i], in[r * 5 + i] * rs * wv[i], 1e-13);
  }
  // A weight that is not a leaf gets the gradient a leaf gets.
  Tensor leaf = randn({5}, 8, 3, 1.0, DType::F64).detach();
  leaf.set_requires_grad(true);
  Tensor a = leaf.detach();
  a.set_requires_grad(true);
  const Tensor dy = randn({3, 5}, 8, 4, 1.0, DType::F64);
  autograd::backward({sum(mul(rms_norm(x, leaf), dy))});
  autograd::backward({sum(mul(rms_norm(x, affine(a, 1.0)), dy))});
  const std::vector<double> g1 = to_double_vector(leaf.grad()), g2 = to_double_vector(a.grad());
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_NEAR(g1[i], g2[i], 1e-13);
  EXPECT_THROW(rms_norm(x, randn({4}, 1, 1, 1.0, DType::F64)), ShapeError);
}

// Gemma's and Nemotron's 1 + weight (an RMSNorm's, a LayerNorm1P's) is
// formed inside the norm, in f32, as Hugging Face's Gemma forms it (1.0 +
// weight.float()) and Megatron-LM's zero-centred gamma does in Transformer
// Engine's kernels: bf16 weights near 0 (below 2^-8, where 1 + w rounds to
// 1 in bf16) still scale. Rounding 1 + w to bf16 first would shrink every
// output by about the mean weight, a bias the output's own rounding does
// not have. The module (nn::LayerNorm with unit_offset) goes the same way.
TEST(NormWeightOffset, IsAddedInF32NotInTheWeightsDtype) {
  const int64_t R = 64, C = 256;
  const Tensor x = randn({R, C}, 9, 1, 1.0, DType::BF16);
  const Tensor w = rand_uniform({C}, 9, 2, 0.001, 0.0035, DType::BF16);
  const Tensor b = zeros({C}, DType::BF16);
  const std::vector<double> xv = to_double_vector(x), wv = to_double_vector(w);
  for (bool rms : {true, false}) {
    SCOPED_TRACE(rms ? "rms_norm" : "layer_norm");
    // The mean of (got - exact) / exact over every element.
    auto bias = [&](const Tensor& y) {
      const std::vector<double> got = to_double_vector(y);
      double total = 0;
      for (int64_t r = 0; r < R; ++r) {
        double mu = 0, ss = 0;
        if (!rms) {
          for (int64_t i = 0; i < C; ++i) mu += xv[r * C + i];
          mu /= C;
        }
        for (int64_t i = 0; i < C; ++i) ss += (xv[r * C + i] - mu) * (xv[r * C + i] - mu);
        const double rs = 1.0 / std::sqrt(ss / C + 1e-6);
        for (int64_t i = 0; i < C; ++i) {
          const double exact = (xv[r * C + i] - mu) * rs * (1.0 + wv[i]);
          total += (got[r * C + i] - exact) / exact;
        }
      }
      return total / static_cast<double>(R * C);
    };
    auto norm = [&](const Tensor& in, const Tensor& weight, double offset) {
      return rms ? rms_norm(in, weight, 1e-6, offset) : layer_norm(in, weight, b, 1e-6, offset);
    };
    auto add_norm = [&](const Tensor& in, const Tensor& weight, double offset) {
      const Tensor zero = zeros_like(in);
      return rms ? add_rms_norm(zero, in, weight, 1e-6, offset).norm
                 : add_layer_norm(zero, in, weight, b, 1e-6, offset).norm;
    };
    EXPECT_LT(std::abs(bias(norm(x, w, 1.0))), 3e-4);
    EXPECT_LT(std::abs(bias(add_norm(x, w, 1.0))), 3e-4);
    LayerNorm module(C, 1e-6, DType::BF16, rms, /*unit_offset=*/true, /*affine=*/true,
                     /*bias=*/false);
    Tensor weight = module.named_parameters().at(0).second;
    copy_(weight, w);
    EXPECT_LT(std::abs(bias(module.forward(x))), 3e-4);
    EXPECT_LT(std::abs(bias(module.forward_add(zeros_like(x), x).norm)), 3e-4);
    EXPECT_LT(bias(norm(x, affine(w, 1.0, 1.0), 0.0)), -1.5e-3) << "a vacuous comparison";
    EXPECT_THROW(norm(x, w, std::nan("")), ValueError);
    EXPECT_THROW(add_norm(x, w, INFINITY), ValueError);
  }
}

TEST(RmsNormGpt, NormsHaveAWeightAndNoBias) {
  GptConfig c = swiglu_config(0);
  c.activation = Activation::Gelu;
  c.normalization = Normalization::RmsNorm;
  const Gpt m(c, 1);
  const StateDict sd = m.state_dict();
  for (const char* n : {"ln_f.weight", "h.0.ln_1.weight", "h.1.ln_2.weight"}) {
    EXPECT_TRUE(sd.count(n)) << n;
  }
  for (const char* n : {"ln_f.bias", "h.0.ln_1.bias", "h.1.ln_2.bias"}) {
    EXPECT_FALSE(sd.count(n)) << n;
  }
  EXPECT_EQ(m.num_parameters(), c.num_parameters());
  EXPECT_EQ(sd.size(), 2u + 10u * 2 + 1u);
  EXPECT_THROW(normalization_from_string("batchnorm"), ConfigError);
}

TEST(NoBiasGpt, LinearLayersHaveNoBiasesAndNormsKeepTheirs) {
  GptConfig c = swiglu_config(24);
  c.linear_bias = false;
  const Gpt m(c, 1);
  const StateDict sd = m.state_dict();
  for (const char* n : {"h.0.attn.c_attn.bias", "h.0.attn.c_proj.bias", "h.1.mlp.c_fc.bias",
                        "h.1.mlp.c_proj.bias"}) {
    EXPECT_FALSE(sd.count(n)) << n;
  }
  EXPECT_TRUE(sd.count("h.0.ln_1.bias"));
  EXPECT_EQ(m.num_parameters(), c.num_parameters());
  EXPECT_EQ(swiglu_config(24).num_parameters() - c.num_parameters(), 2 * (4 * 16 + 48 + 16));
  Tensor loss = m.loss(from_vector(std::vector<int64_t>{1, 2, 3, 4}, {1, 4}),
                       from_vector(std::vector<int64_t>{2, 3, 4, 5}, {1, 4}));
  autograd::backward({loss});
  for (const auto& [name, p] : m.named_parameters()) ASSERT_TRUE(p.grad().defined()) << name;
}

// An untied head is a (V, C) weight of its own: the model with its head set
// to wte's values computes the tied model's loss, and the tied wte's
// gradient is the sum of the untied wte's (the lookup) and lm_head's (the
// head).
TEST(UntiedHead, IsItsOwnWeightAndSplitsTheTiedGradient) {
  GptConfig c = swiglu_config(24);
  GptConfig u = c;
  u.tie_embeddings = false;
  const Gpt tied(c, 3), untied(u, 3);
  const StateDict sd = untied.state_dict();
  ASSERT_TRUE(sd.count("lm_head.weight"));
  EXPECT_EQ(sd.at("lm_head.weight").shape(), (Shape{c.vocab_size, c.d_model}));
  EXPECT_EQ(untied.num_parameters(), u.num_parameters());
  EXPECT_EQ(u.num_parameters() - c.num_parameters(), c.vocab_size * c.d_model);
  EXPECT_FALSE(tied.state_dict().count("lm_head.weight"));
  // Initialised apart from wte (its own name in the layout-independent rule).
  EXPECT_NE(to_double_vector(sd.at("lm_head.weight")), to_double_vector(sd.at("wte.weight")));
  StateDict same = sd;
  same["lm_head.weight"] = clone(sd.at("wte.weight"));
  Gpt copy(u, 3);
  copy.load_state_dict(same);
  const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 9, 7}, {2, 3});
  const Tensor targets = from_vector(std::vector<int64_t>{2, 3, 4, 0, 8, 6}, {2, 3});
  const Tensor lt = tied.loss(ids, targets), lu = copy.loss(ids, targets);
  EXPECT_NEAR(item(lt), item(lu), 1e-6);
  autograd::backward({lt});
  autograd::backward({lu});
  const StateDict gt = tied.state_dict(), gu = copy.state_dict();
  const std::vector<double> want = to_double_vector(gt.at("wte.weight").grad());
  const std::vector<double> a = to_double_vector(gu.at("wte.weight").grad()),
                            b = to_double_vector(gu.at("lm_head.weight").grad());
  double head = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(a[i] + b[i], want[i], 1e-6) << i;
    head += std::abs(b[i]);
  }
  EXPECT_GT(head, 0.0);
  // Logits come from lm_head: changing it changes them, wte held fixed.
  same["lm_head.weight"] = affine(sd.at("wte.weight"), 2.0);
  copy.load_state_dict(same);
  EXPECT_GT(std::abs(item(copy.loss(ids, targets)) - item(lt)), 1e-4);
}

// The one list of parameter names and shapes every layout builds from is
// the model's own, whatever the options.
TEST(GptParameterShapes, AreTheModelsForEveryOption) {
  for (int mask = 0; mask < 128; ++mask) {
    GptConfig c = swiglu_config(24);
    c.n_kv_head = mask & 32 ? 1 : 0;  // multi-query attention, or a key/value head per query head
    c.post_norms = (mask & 64) != 0;  // Gemma 2's and 3's
    c.activation = mask & 1 ? Activation::SwiGlu : Activation::Gelu;
    c.position_embedding = mask & 2 ? PositionEmbedding::Rotary : PositionEmbedding::Learned;
    c.normalization = mask & 4 ? Normalization::RmsNorm : Normalization::LayerNorm;
    c.linear_bias = (mask & 8) == 0;
    c.tie_embeddings = (mask & 16) == 0;
    SCOPED_TRACE(mask);
    std::map<std::string, Shape> want;
    for (const auto& [name, p] : Gpt(c, 1).named_parameters()) want[name] = p.shape();
    EXPECT_EQ(gpt_parameter_shapes(c, {0, 1}, true, true, true), want);
  }
}

// Post-norms (Gemma 2's and 3's) normalise each sublayer's output before
// the residual add: they count as two norms a block, and a block's output
// no longer depends on the scale of its sublayers' outputs (c_proj's
// weights 100 times larger change nothing), which it does without them.
TEST(PostNorms, NormaliseEachSublayersOutputBeforeTheResidualAdd) {
  GptConfig c = swiglu_config(24);
  c.normalization = Normalization::RmsNorm;
  c.layer_norm_eps = 1e-12;  // so that only the scale-free part of a norm is seen
  GptConfig sandwich = c;
  sandwich.post_norms = true;
  EXPECT_EQ(sandwich.num_parameters() - c.num_parameters(), 2 * c.n_layer * c.d_model);
  const Tensor x = randn({1, 4, c.d_model}, 3);
  for (const GptConfig& cfg : {c, sandwich}) {
    SCOPED_TRACE(cfg.post_norms ? "post-norms" : "pre-norms only");
    Gpt model(cfg, 5);
    EXPECT_EQ(model.num_parameters(), cfg.num_parameters());
    const ForwardContext eval{false, 0, 0};
    const auto before = to_double_vector(model.block(0).forward(x, eval));
    {
      autograd::NoGradGuard no_grad;
      for (auto& [name, p] : model.named_parameters()) {
        if (name == "h.0.attn.c_proj.weight" || name == "h.0.mlp.c_proj.weight") scale_(p, 100.0);
      }
    }
    const auto after = to_double_vector(model.block(0).forward(x, eval));
    double diff = 0, size = 0;
    for (size_t i = 0; i < before.size(); ++i) {
      diff = std::max(diff, std::abs(after[i] - before[i]));
      size = std::max(size, std::abs(before[i]));
    }
    if (cfg.post_norms) {
      EXPECT_LT(diff, 1e-4 * size);
    } else {
      EXPECT_GT(diff, 0.1 * size);
    }
  }
}

// Gemma 2's soft caps: every logit within the final cap (which the
// uncapped model's exceed), and the fused head + loss, which caps the
// logits in place, giving the loss and gradients of the plain cross entropy
// over the capped forward.
TEST(SoftCapping, BoundsTheLogitsAndTheFusedLossAgreesWithTheCappedForward) {
  GptConfig c = swiglu_config(24);
  c.position_embedding = PositionEmbedding::Rotary;
  const Tensor ids = from_vector(std::vector<int64_t>{3, 9, 1, 22, 5, 7, 0, 14}, {2, 4});
  const Tensor targets = from_vector(std::vector<int64_t>{9, 1, 22, 5, 7, 0, 14, 2}, {2, 4});
  auto max_logit = [&](const Gpt& m) {
    double most = 0;
    for (double v : to_double_vector(m.forward(ids, {false, 0, 0})))
      most = std::max(most, std::abs(v));
    return most;
  };
  auto opinionated = [](Gpt& m) {
    autograd::NoGradGuard ng;
    for (auto& [name, p] : m.named_parameters()) {
      if (name.find("ln_") == std::string::npos) scale_(p, 8.0);
    }
  };
  Gpt plain(c, 4);
  opinionated(plain);
  EXPECT_GT(max_logit(plain), 2.0) << "a vacuous cap";
  c.attn_logit_softcap = 0.5;
  c.final_logit_softcap = 1.5;
  Gpt capped(c, 4);
  opinionated(capped);
  EXPECT_LT(max_logit(capped), 1.5);

  const ForwardContext eval{false, 0, 0};
  const Tensor fused = capped.loss(ids, targets, eval);
  autograd::backward({fused});
  std::map<std::string, std::vector<double>> want;
  for (auto& [name, p] : capped.named_parameters()) want[name] = to_double_vector(p.grad());
  capped.zero_grad();
  const Tensor plain_loss = cross_entropy(capped.forward(ids, eval), targets);
  autograd::backward({plain_loss});
  EXPECT_NEAR(item(fused), item(plain_loss), 1e-5);
  for (auto& [name, p] : capped.named_parameters()) {
    const std::vector<double> got = to_double_vector(p.grad());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[name][i], 1e-4 * (1 + std::abs(want[name][i])))
          << name << " [" << i << "]";
    }
  }

  GptConfig bad = c;
  bad.final_logit_softcap = -30.0;
  try {
    bad.validate();
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.final_logit_softcap (-30"), std::string::npos)
        << e.what();
  }
}

// Gemma's embedding multiplier is applied in the activations' type, as its
// reference implementations do (Hugging Face's multiplies by a tensor of the
// embeddings' dtype): sqrt(3072) = 55.43 is 55.5 in bf16.
TEST(EmbeddingMultiplier, IsRoundedToTheActivationsType) {
  GptConfig c = swiglu_config(24);
  c.embedding_multiplier = std::sqrt(3072.0);
  const Tensor ones32 = full({2}, 1.0, DType::F32);
  EXPECT_FLOAT_EQ(static_cast<float>(to_double_vector(scale_token_embeddings(c, ones32))[0]),
                  static_cast<float>(std::sqrt(3072.0)));
  EXPECT_EQ(to_double_vector(scale_token_embeddings(c, full({2}, 1.0, DType::BF16)))[0], 55.5);
  EXPECT_EQ(to_double_vector(scale_token_embeddings(c, full({2}, 1.0, DType::F16)))[0], 55.4375);
}

// The model FLOPs generalise the PTD-P formula: equal to it for GPT-2's MLP,
// and counting each product of another MLP.
TEST(GptFlops, GeneraliseThePtdpFormula) {
  GptConfig c{.n_layer = 3, .n_head = 2, .d_model = 16, .vocab_size = 50, .seq_len = 8};
  const double B = 5, s = 8, l = 3, h = 16, V = 50;
  EXPECT_NEAR(c.training_flops(B), 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)),
              1e-6);
  EXPECT_NEAR(c.training_flops(B, true),
              96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)), 1e-6);
  // SwiGLU at F 24: c_fc h -> 48, c_proj 24 -> h; 2 FLOPs a weight a token,
  // times 3 for forward and backward.
  const GptConfig g = swiglu_config(24);
  const double layer = 2 * (4 * 16 * 16 + 16 * 48 + 24 * 16) + 4 * 8 * 16;
  EXPECT_NEAR(g.training_flops(1), 8 * 3 * (2 * layer + 2 * 16 * 23), 1e-6);
  // A window of 3 keys on layers 0 and 2 (layer 1 global): their queries
  // count 3 keys, not s = 8; a window as long as the context changes nothing.
  GptConfig windowed = c;
  windowed.sliding_window = 3;
  windowed.full_attention_layers = {1};
  EXPECT_NEAR(c.training_flops(B) - windowed.training_flops(B), 3 * B * s * 2 * 4 * (8 - 3) * h,
              1e-6);
  EXPECT_NEAR(c.training_flops(B, true) - windowed.training_flops(B, true),
              4 * B * s * 2 * 4 * (8 - 3) * h, 1e-6);
  windowed.sliding_window = 8;
  EXPECT_NEAR(windowed.training_flops(B), c.training_flops(B), 1e-6);
}

}  // namespace
}  // namespace triad::nn
