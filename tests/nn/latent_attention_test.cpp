// Multi-head latent attention (model.mla; DeepSeek-V2's and -V3's): the
// shapes and counts, the layer against its definition written out element
// by element, every parameter's gradient, and the config's checks.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "support/gpt_config_checks.h"
#include "support/tiny_deepseek.h"
#include "triad/autograd/engine.h"
#include "triad/autograd/grad_mode.h"
#include "triad/core/rope_scaling.h"
#include "triad/nn/gpt.h"
#include "triad/nn/latent_attention.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

// 4 heads whose queries and keys are 6 + 4 wide (4 turned) and values 8,
// through latents of 10 (queries) and 12 (keys and values) on d_model 32.
GptConfig mla_config() {
  GptConfig c{.n_layer = 2, .n_head = 4, .d_model = 32, .vocab_size = 29, .seq_len = 8};
  c.position_embedding = PositionEmbedding::Rotary;
  c.normalization = Normalization::RmsNorm;
  c.activation = Activation::SwiGlu;
  c.ffn_hidden_size = 40;
  c.linear_bias = false;
  c.rope_theta = 50.0;
  c.layer_norm_eps = 1e-6;
  c.mla = {.kv_lora_rank = 12,
           .q_lora_rank = 10,
           .qk_nope_head_dim = 6,
           .qk_rope_head_dim = 4,
           .v_head_dim = 8};
  return c;
}

TEST(LatentAttention, ShapesAndCountsFollowTheLatents) {
  const GptConfig c = mla_config();
  c.validate();
  EXPECT_EQ(c.latent_qk_dim(), 10);
  EXPECT_EQ(c.head_dim(), 10);  // the values padded to the queries' width
  EXPECT_EQ(c.attn_out_width(), 32);
  const Gpt m(c, 3);
  const StateDict sd = m.state_dict();
  EXPECT_EQ(sd.at("h.1.attn.q_a_proj.weight").shape(), (Shape{10, 32}));
  EXPECT_EQ(sd.at("h.1.attn.q_a_norm.weight").shape(), (Shape{10}));
  EXPECT_EQ(sd.at("h.1.attn.q_b_proj.weight").shape(), (Shape{40, 10}));
  EXPECT_EQ(sd.at("h.1.attn.kv_a_proj.weight").shape(), (Shape{16, 32}));
  EXPECT_EQ(sd.at("h.1.attn.kv_a_norm.weight").shape(), (Shape{12}));
  EXPECT_EQ(sd.at("h.1.attn.kv_b_proj.weight").shape(), (Shape{56, 12}));
  EXPECT_EQ(sd.at("h.1.attn.c_proj.weight").shape(), (Shape{32, 32}));
  EXPECT_EQ(sd.count("h.1.attn.c_attn.weight"), 0u);
  EXPECT_EQ(sd.size(), gpt_parameter_shapes(c).size());
  for (const auto& [name, shape] : gpt_parameter_shapes(c)) EXPECT_EQ(sd.at(name).shape(), shape);
  EXPECT_EQ(m.num_parameters(), c.num_parameters());
  // The latents' norms start at one, as every norm does.
  for (double v : to_double_vector(sd.at("h.0.attn.kv_a_norm.weight"))) EXPECT_EQ(v, 1.0);
  // The projections: 32*10 + 10*40, 32*16 + 12*56 and c_proj's 32*32.
  EXPECT_EQ(c.attention_weights(), 32 * 10 + 10 * 40 + 32 * 16 + 12 * 56 + 32 * 32);
  // Forward FLOPs a token: 2 per projection weight and, per layer,
  // 2 * seq_len per head for the scores (10 wide) and as much for their
  // product with the values (8 wide); training three times that, beside
  // the same model's MLPs and head.
  GptConfig dense = c;
  dense.mla = {};
  dense.n_head = 4;
  const double mla_attention =
      2.0 * static_cast<double>(c.attention_weights()) + 2.0 * 8 * 4 * (10 + 8);  // s = 8
  const double dense_attention = 2.0 * (3 * 32 * 32 + 32 * 32) + 4.0 * 8 * 32;
  EXPECT_NEAR(c.training_flops(1) - dense.training_flops(1),
              8 * 3 * 2 * (mla_attention - dense_attention), 1e-6);
  // Without a query latent: q_proj straight from d_model, with a bias under
  // model.linear_bias (as kv_a_proj's and c_proj's).
  GptConfig direct = c;
  direct.mla.q_lora_rank = 0;
  direct.linear_bias = true;
  const auto shapes = gpt_parameter_shapes(direct);
  EXPECT_EQ(shapes.at("h.0.attn.q_proj.weight"), (Shape{40, 32}));
  EXPECT_EQ(shapes.at("h.0.attn.q_proj.bias"), (Shape{40}));
  EXPECT_EQ(shapes.at("h.0.attn.kv_a_proj.bias"), (Shape{16}));
  EXPECT_EQ(shapes.at("h.0.attn.c_proj.bias"), (Shape{32}));
  EXPECT_EQ(shapes.count("h.0.attn.q_a_proj.weight"), 0u);
  EXPECT_EQ(shapes.count("h.0.attn.kv_b_proj.bias"), 0u);
  int64_t total = 0;
  for (const auto& [name, shape] : shapes) total += numel(shape);
  EXPECT_EQ(direct.num_parameters(), total);
}

// y = x W^T + b over `rows` rows.
std::vector<double> linear_rows(const std::vector<double>& x, int64_t rows, int64_t in,
                                const std::vector<double>& w, int64_t out,
                                const std::vector<double>& b = {}) {
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[static_cast<size_t>(o)];
      for (int64_t i = 0; i < in; ++i)
        s += x[static_cast<size_t>(r * in + i)] * w[static_cast<size_t>(o * in + i)];
      y[static_cast<size_t>(r * out + o)] = s;
    }
  }
  return y;
}

// RMSNorm of each row's `width` features starting at `from` (rows `stride` apart).
std::vector<double> rms_rows(const std::vector<double>& x, int64_t rows, int64_t stride,
                             int64_t from, int64_t width, const std::vector<double>& w,
                             double eps) {
  std::vector<double> y(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < width; ++i) {
      const double v = x[static_cast<size_t>(r * stride + from + i)];
      ss += v * v;
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(width) + eps);
    for (int64_t i = 0; i < width; ++i) {
      y[static_cast<size_t>(r * width + i)] =
          x[static_cast<size_t>(r * stride + from + i)] * inv * w[static_cast<size_t>(i)];
    }
  }
  return y;
}

// Rotate-half RoPE of `r` features at position `pos`, at the frequencies of
// an r-wide head.
std::vector<double> turn(std::vector<double> v, int64_t pos, const GptConfig& c) {
  const int64_t r = static_cast<int64_t>(v.size()), half = r / 2;
  RopeScaling s = c.rope_scaling;
  s.rotary_dim = r;
  const double amp = rope_amplitude(s);
  std::vector<double> out(v.size());
  for (int64_t i = 0; i < half; ++i) {
    const double a = static_cast<double>(pos) * rope_frequency(i, r, c.rope_theta, s);
    const double x0 = v[static_cast<size_t>(i)], x1 = v[static_cast<size_t>(i + half)];
    out[static_cast<size_t>(i)] = amp * (x0 * std::cos(a) - x1 * std::sin(a));
    out[static_cast<size_t>(i + half)] = amp * (x1 * std::cos(a) + x0 * std::sin(a));
  }
  return out;
}

// One latent attention layer, element by element as DeepSeek-V3's
// reference computes it, from `p` (its parameters by name) on x (T, C),
// one sequence: -> (T, C).
std::vector<double> latent_attention_by_hand(const GptConfig& c,
                                             std::map<std::string, std::vector<double>>& p,
                                             const std::vector<double>& x, int64_t T,
                                             double score_factor) {
  const int64_t C = c.d_model, H = c.n_head, n = c.mla.qk_nope_head_dim, r = c.mla.qk_rope_head_dim,
                v = c.mla.v_head_dim, rank = c.mla.kv_lora_rank, qr = c.mla.q_lora_rank;
  auto bias = [&](const std::string& name) {
    return p.count(name) ? p.at(name) : std::vector<double>{};
  };
  std::vector<double> q;  // (T, H * (n + r)), each head [nope | rope]
  if (qr > 0) {
    const auto a = linear_rows(x, T, C, p.at("q_a_proj.weight"), qr, bias("q_a_proj.bias"));
    q = linear_rows(rms_rows(a, T, qr, 0, qr, p.at("q_a_norm.weight"), c.layer_norm_eps), T, qr,
                    p.at("q_b_proj.weight"), H * (n + r));
  } else {
    q = linear_rows(x, T, C, p.at("q_proj.weight"), H * (n + r), bias("q_proj.bias"));
  }
  const auto compressed =
      linear_rows(x, T, C, p.at("kv_a_proj.weight"), rank + r, bias("kv_a_proj.bias"));
  const auto latent =
      rms_rows(compressed, T, rank + r, 0, rank, p.at("kv_a_norm.weight"), c.layer_norm_eps);
  const auto kv = linear_rows(latent, T, rank, p.at("kv_b_proj.weight"), H * (n + v));
  const double scale = score_factor / std::sqrt(static_cast<double>(n + r));
  std::vector<double> heads(static_cast<size_t>(T * H * v), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < T; ++i) {
      const size_t qi = static_cast<size_t>(i * H * (n + r) + h * (n + r));
      const auto q_rope =
          turn(std::vector<double>(q.begin() + static_cast<std::ptrdiff_t>(qi + n),
                                   q.begin() + static_cast<std::ptrdiff_t>(qi + n + r)),
               i, c);
      std::vector<double> scores;
      double top = -1e300;
      for (int64_t j = 0; j <= i; ++j) {
        const size_t kj = static_cast<size_t>(j * H * (n + v) + h * (n + v));
        const size_t cj = static_cast<size_t>(j * (rank + r) + rank);
        const auto k_rope =
            turn(std::vector<double>(compressed.begin() + static_cast<std::ptrdiff_t>(cj),
                                     compressed.begin() + static_cast<std::ptrdiff_t>(cj + r)),
                 j, c);
        double s = 0;
        for (int64_t d = 0; d < n; ++d)
          s += q[qi + static_cast<size_t>(d)] * kv[kj + static_cast<size_t>(d)];
        for (int64_t d = 0; d < r; ++d)
          s += q_rope[static_cast<size_t>(d)] * k_rope[static_cast<size_t>(d)];
        scores.push_back(s * scale);
        top = std::max(top, s * scale);
      }
      double z = 0;
      for (double& s : scores) z += (s = std::exp(s - top));
      for (int64_t j = 0; j <= i; ++j) {
        const size_t vj = static_cast<size_t>(j * H * (n + v) + h * (n + v) + n);
        for (int64_t d = 0; d < v; ++d) {
          heads[static_cast<size_t>(i * H * v + h * v + d)] +=
              scores[static_cast<size_t>(j)] / z * kv[vj + static_cast<size_t>(d)];
        }
      }
    }
  }
  return linear_rows(heads, T, H * v, p.at("c_proj.weight"), C, bias("c_proj.bias"));
}

void expect_matches_definition(const GptConfig& c, double score_factor) {
  c.validate();
  CausalSelfAttention attn(c, 0);
  attn.to(DType::F64);
  std::map<std::string, std::vector<double>> values;
  {
    autograd::NoGradGuard no_grad;
    uint64_t stream = 1;
    for (auto& [name, t] : attn.named_parameters()) {
      const bool norm = name.find("_norm") != std::string::npos;
      Tensor value = randn(t.shape(), 11, stream++, norm ? 0.2 : 0.3, DType::F64);
      if (norm) value = affine(value, 1.0, 1.0);
      copy_(t, value);
      values[name] = to_double_vector(t);
    }
  }
  const int64_t T = 6;
  const Tensor x = randn({2, T, c.d_model}, 5, 99, 1.0, DType::F64);
  const auto got = to_double_vector(attn.forward(x, {false, 0, 0}));
  const auto all = to_double_vector(x);
  for (int64_t b = 0; b < 2; ++b) {
    const std::vector<double> row(all.begin() + b * T * c.d_model,
                                  all.begin() + (b + 1) * T * c.d_model);
    const auto want = latent_attention_by_hand(c, values, row, T, score_factor);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[static_cast<size_t>(b * T * c.d_model) + i], want[i],
                  1e-10 * (1 + std::abs(want[i])))
          << "sequence " << b << " element " << i;
    }
  }
}

TEST(LatentAttention, MatchesItsDefinition) {
  expect_matches_definition(mla_config(), 1.0);
}

// Queries straight from x, with biases (model.linear_bias) on q_proj,
// kv_a_proj and c_proj; no nope part at all.
TEST(LatentAttention, MatchesItsDefinitionWithoutAQueryLatent) {
  GptConfig c = mla_config();
  c.mla.q_lora_rank = 0;
  c.mla.qk_nope_head_dim = 0;
  c.linear_bias = true;
  expect_matches_definition(c, 1.0);
}

// Values wider than the queries and keys (these padded instead), and yarn's
// scaling: the frequencies stretched, and the scores times
// (0.1 mscale_all_dim ln(factor) + 1)^2.
TEST(LatentAttention, MatchesItsDefinitionWithWideValuesUnderYarn) {
  GptConfig c = mla_config();
  c.mla.v_head_dim = 14;
  testing::use_deepseek_yarn(c);
  EXPECT_EQ(c.head_dim(), 14);
  const double m = 0.1 * 0.7 * std::log(4.0) + 1.0;
  EXPECT_DOUBLE_EQ(c.latent_query_factor(), std::sqrt(14.0 / 10.0) * m * m);
  expect_matches_definition(c, m * m);
}

TEST(LatentAttention, EveryParameterGetsAGradient) {
  GptConfig c = mla_config();
  c.vocab_size = 10;
  testing::expect_every_parameter_gets_a_gradient(Gpt(c, 5));
}

// LoRA on latent attention's layers: each adapted layer gains A and B of
// its shape; the model starts as it was (B zero); the adapters alone train;
// and with the adapters grown, the model is its merged weights' (W + s B A).
TEST(LatentAttention, LoraAdaptsItsLayers) {
  GptConfig c = mla_config();
  c.vocab_size = 10;
  c.lora = {.rank = 3,
            .alpha = 6,
            .targets = {"attn.q_a_proj", "attn.q_b_proj", "attn.kv_a_proj", "attn.kv_b_proj",
                        "attn.c_proj"}};
  c.validate();
  const auto shapes = gpt_parameter_shapes(c);
  EXPECT_EQ(shapes.at("h.1.attn.q_b_proj.lora_a"), (Shape{3, 10}));
  EXPECT_EQ(shapes.at("h.1.attn.q_b_proj.lora_b"), (Shape{40, 3}));
  EXPECT_EQ(shapes.at("h.0.attn.kv_a_proj.lora_a"), (Shape{3, 32}));
  EXPECT_EQ(shapes.at("h.0.attn.kv_a_proj.lora_b"), (Shape{16, 3}));
  EXPECT_EQ(shapes.count("h.0.attn.q_proj.lora_a"), 0u);
  Gpt model(c, 5);
  const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 9, 7, 3}, {2, 4});
  const Tensor targets = from_vector(std::vector<int64_t>{2, 3, 4, 5, 9, 7, 3, 1}, {2, 4});
  // B is zero: the adapted model is the base model.
  GptConfig plain = c.without_lora();
  Gpt base(plain, 5);
  {
    StateDict weights;
    for (const auto& [name, t] : model.state_dict())
      if (!is_lora_adapter(name)) weights[name] = t;
    base.load_state_dict(weights);
  }
  const std::vector<double> before = to_double_vector(model.forward(ids, {false, 0, 0}));
  EXPECT_EQ(before, to_double_vector(base.forward(ids, {false, 0, 0})));
  // Every adapter is in the graph: B's gradient is not zero (A's is, while
  // B is).
  autograd::backward({model.loss(ids, targets, {false, 0, 0})});
  int adapters = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!is_lora_adapter(name) || name.find("lora_b") == std::string::npos) continue;
    ASSERT_TRUE(p.grad().defined()) << name;
    double squares = 0;
    for (double g : to_double_vector(p.grad())) squares += g * g;
    EXPECT_GT(squares, 0.0) << name;
    ++adapters;
  }
  EXPECT_EQ(adapters, 2 * 5);
  // Grown adapters: the same logits as the merged weights.
  StateDict grown = model.state_dict(), merged;
  {
    autograd::NoGradGuard no_grad;
    uint64_t stream = 7;
    for (auto& [name, t] : grown) {
      if (!is_lora_adapter(name)) continue;
      Tensor v = randn(t.shape(), 3, stream++, 0.2);
      copy_(t, v);
    }
  }
  for (const auto& [name, t] : grown) {
    if (is_lora_adapter(name)) continue;
    const std::string stem = name.substr(0, name.size() - std::string("weight").size());
    merged[name] = grown.count(stem + "lora_a")
                       ? merge_lora(t, grown.at(stem + "lora_a"), grown.at(stem + "lora_b"), 2.0)
                       : t;
  }
  base.load_state_dict(merged);
  const auto a = to_double_vector(model.forward(ids, {false, 0, 0})),
             b = to_double_vector(base.forward(ids, {false, 0, 0}));
  double moved = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], 1e-4 * (1 + std::abs(b[i]))) << i;
    moved = std::max(moved, std::abs(a[i] - before[i]));
  }
  EXPECT_GT(moved, 1e-3);
  // Layers the model lacks are named.
  GptConfig direct = c;
  direct.mla.q_lora_rank = 0;
  testing::expect_invalid(direct,
                          "'attn.q_a_proj' belongs to a query latent, but "
                          "model.mla.q_lora_rank is 0");
  GptConfig latent = c;
  latent.lora.targets = {"attn.q_proj"};
  testing::expect_invalid(latent, "'attn.q_proj' reads the input straight");
  GptConfig dense = c;
  dense.mla = {};
  dense.n_head = 4;
  testing::expect_invalid(dense,
                          "is a layer of model.mla's latent attention, which the model "
                          "has not");
}

TEST(LatentAttention, ConfigChecksNameWhatClashes) {
  using testing::expect_invalid;
  GptConfig c = mla_config();
  c.mla.kv_lora_rank = 0;
  expect_invalid(c, "kv_lora_rank must be positive");
  c = mla_config();
  c.mla.qk_rope_head_dim = 3;
  expect_invalid(c, "an even qk_rope_head_dim >= 2");
  c = mla_config();
  c.mla.v_head_dim = 0;
  expect_invalid(c, "v_head_dim >= 1");
  c = mla_config();
  c.mla.mscale_all_dim = -1;
  expect_invalid(c, "model.mla.mscale_all_dim (-1.000000) must be a finite number >= 0");
  c = mla_config();
  c.position_embedding = PositionEmbedding::Learned;
  expect_invalid(c, "model.mla does not go with model.position_embedding learned");
  c = mla_config();
  c.n_kv_head = 2;
  expect_invalid(c, "model.mla does not go with model.n_kv_head 2");
  c = mla_config();
  c.n_kv_head = 4;  // (as many as the heads: the same as none)
  c.validate();
  c = mla_config();
  c.head_size = 8;
  expect_invalid(c, "model.mla does not go with model.head_dim");
  c = mla_config();
  c.rope_dim = 4;
  expect_invalid(c, "model.mla does not go with model.rope_dim");
  c = mla_config();
  c.qk_norm = true;
  expect_invalid(c, "model.mla does not go with model.qk_norm");
  c = mla_config();
  c.clip_qkv = 1;
  expect_invalid(c, "model.mla does not go with model.clip_qkv");
  // d_model need not split into the heads: their widths are model.mla's.
  c = mla_config();
  c.d_model = 30;
  c.validate();
}

}  // namespace
}  // namespace triad::nn
