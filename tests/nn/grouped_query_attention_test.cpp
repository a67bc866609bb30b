// Grouped-query attention (model.n_kv_head): the ops against multi-head
// attention with each key/value head repeated for its group, the model's
// shapes and counts, and the config's checks.
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

// A grouped qkv (B, T, (H + 2 KV) D) as the multi-head qkv (B, T, 3 H D)
// whose query head h reads a copy of key/value head h / (H / KV): built from
// differentiable views, so its backward sums each copy's gradient into the
// shared head.
Tensor repeat_key_value_heads(const Tensor& qkv, const AttentionHeads& heads, int64_t D) {
  const int64_t C = heads.q * D, KV = heads.kv * D;
  std::vector<Tensor> parts = {narrow(qkv, 2, 0, C)};
  for (int64_t at : {C, C + KV}) {  // k's heads, then v's
    for (int64_t h = 0; h < heads.q; ++h)
      parts.push_back(narrow(qkv, 2, at + h / heads.group() * D, D));
  }
  return concat(parts, 2);
}

struct Layout {
  int64_t H, KV, D;
};

// Each query head sees its group's key/value head: outputs equal the
// repeated multi-head computation, and each shared head's gradient is the
// sum over its group (f64; the kernel's sum runs in a fixed order, so
// rounding differs only in the last bits).
TEST(GroupedQueryAttention, EqualsMultiHeadAttentionWithRepeatedKeysAndValues) {
  const int64_t B = 2, T = 70;  // two of the CPU kernel's 64-row blocks
  std::vector<int64_t> starts(B * T, 0);
  for (int64_t t = 0; t < T; ++t) starts[T + t] = t < 25 ? 0 : t < 66 ? 25 : 66;
  const Tensor doc_starts = from_vector(starts, {B, T}, DType::I32);
  for (const Layout& l : {Layout{4, 2, 6}, Layout{6, 1, 4}, Layout{6, 3, 2}, Layout{3, 3, 4}}) {
    for (const bool rope : {false, true}) {
      for (const bool documents : {false, true}) {
        SCOPED_TRACE("H " + std::to_string(l.H) + " KV " + std::to_string(l.KV) +
                     (rope ? " rope" : "") + (documents ? " documents" : ""));
        const AttentionHeads heads{l.H, l.KV};
        const Tensor starts_or_none = documents ? doc_starts : Tensor();
        Tensor grouped = randn({B, T, (l.H + 2 * l.KV) * l.D}, 5, 1, 1.0, DType::F64);
        grouped.set_requires_grad(true);
        const Tensor weights = randn({B, T, l.H * l.D}, 5, 2, 1.0, DType::F64);
        // Rotary turns each head on its own, before or after the copies
        // (each path its own graph).
        auto turned = [&] {
          return rope ? rotary_embedding(grouped, heads, {}, 3, 100.0) : grouped;
        };
        const Tensor g_in = turned();
        const Tensor want_in = repeat_key_value_heads(turned(), heads, l.D);
        const Tensor out = causal_attention(g_in, heads, starts_or_none);
        const Tensor want = causal_attention(want_in, l.H, starts_or_none);
        const std::vector<double> a = to_double_vector(out), b = to_double_vector(want);
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-12) << i;
        // d(sum(out * w)) / d(grouped) through either path.
        autograd::backward({sum(mul(out, weights))});
        const std::vector<double> got = to_double_vector(grouped.grad());
        grouped.set_grad(Tensor());
        autograd::backward({sum(mul(want, weights))});
        const std::vector<double> ref = to_double_vector(grouped.grad());
        double largest = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_NEAR(got[i], ref[i], 1e-10 * (1 + std::abs(ref[i]))) << i;
          largest = std::max(largest, std::abs(ref[i]));
        }
        EXPECT_GT(largest, 1e-3);
      }
    }
  }
}

TEST(GroupedQueryAttention, BadHeadCountsAreNamed) {
  const Tensor qkv = randn({1, 4, 32}, 1, 1, 1.0, DType::F32);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const ShapeError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              causal_attention(qkv, AttentionHeads{4, 3});
            }).find("3 key/value heads for 4 query heads"),
            std::string::npos);
  EXPECT_NE(message([&] {
              causal_attention(qkv, AttentionHeads{4, 0});
            }).find("divides"),
            std::string::npos);
  // 32 is not (6 + 2 * 3) * D for any D.
  EXPECT_NE(message([&] {
              causal_attention(qkv, AttentionHeads{6, 3});
            }).find("(n_head + 2 * n_kv_head) * head_dim = 12 * head_dim"),
            std::string::npos);
  EXPECT_NE(message([&] {
              rotary_embedding(randn({1, 4, 24}, 1, 1, 1.0, DType::F32), AttentionHeads{4, 2});
            }).find("even head dimension"),
            std::string::npos);  // D = 3
}

GptConfig grouped_config() {
  GptConfig c{
      .n_layer = 2, .n_head = 4, .n_kv_head = 2, .d_model = 32, .vocab_size = 29, .seq_len = 8};
  c.position_embedding = PositionEmbedding::Rotary;
  c.normalization = Normalization::RmsNorm;
  c.activation = Activation::SwiGlu;
  c.ffn_hidden_size = 40;
  return c;
}

// c_attn makes C + 2 * n_kv_head * head_dim outputs; the counts and FLOPs
// follow, and the model trains (its loss moves and every weight gets a
// gradient).
TEST(GroupedQueryAttention, GptShapesCountsAndGradients) {
  const GptConfig c = grouped_config();
  EXPECT_EQ(c.qkv_width(), 32 + 2 * 2 * 8);
  const Gpt m(c, 4);
  const StateDict sd = m.state_dict();
  EXPECT_EQ(sd.at("h.1.attn.c_attn.weight").shape(), (Shape{64, 32}));
  EXPECT_EQ(m.num_parameters(), c.num_parameters());
  GptConfig mha = c;
  mha.n_kv_head = 0;
  // c_attn 96 tall instead of 64, weight and bias, in each of 2 layers.
  EXPECT_EQ(mha.num_parameters() - c.num_parameters(), 2 * (96 - 64) * (32 + 1));
  // Forward FLOPs a token: 2 per weight of c_attn's product less.
  EXPECT_NEAR(mha.training_flops(1) - c.training_flops(1), 8 * 3 * 2 * 2 * (96 - 64) * 32, 1e-6);
  triad::testing::expect_every_parameter_gets_a_gradient(m);
}

TEST(GroupedQueryAttention, ConfigIsChecked) {
  GptConfig c = grouped_config();
  c.n_kv_head = 3;
  triad::testing::expect_invalid(c, "model.n_kv_head (3) must divide model.n_head (4)");
  c.n_kv_head = -1;
  triad::testing::expect_invalid(c, "model.n_kv_head (-1)");
  c.n_kv_head = 4;  // one per query head: multi-head attention
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.qkv_width(), 3 * c.d_model);
}

}  // namespace
}  // namespace triad::nn
