// LLaMA 3.1's RoPE scaling (model.rope_scaling: llama3): the frequencies in
// each of the three wavelength regions, the op turning heads by them, and
// the config.
#include "triad/core/rope_scaling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "triad/autograd/engine.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

RopeScaling llama3(double factor, double low, double high, double original) {
  RopeScaling s;
  s.kind = RopeScaling::Kind::Llama3;
  s.factor = factor;
  s.low_freq_factor = low;
  s.high_freq_factor = high;
  s.original_seq_len = original;
  return s;
}

// Head dim 8, theta 30: frequencies 1, 0.427, 0.183, 0.078 (wavelengths 6.3,
// 14.7, 34.4, 80.6). With an original context of 32, low 1 and high 4, a
// wavelength under 8 keeps its speed, one over 32 turns 4 times slower, and
// 14.7 lies between: smooth = (32 / 14.7 - 1) / 3.
TEST(RopeScaling, Llama3SlowsTheLowFrequenciesAndInterpolatesBetween) {
  const RopeScaling s = llama3(4.0, 1.0, 4.0, 32.0);
  const RopeScaling none;
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(rope_frequency(i, 8, 30.0, none), std::pow(30.0, -2.0 * i / 8.0)) << i;
  }
  const double f1 = std::pow(30.0, -0.25), w1 = 2 * M_PI / f1;
  const double smooth = (32.0 / w1 - 1.0) / 3.0;
  ASSERT_GT(smooth, 0.0);
  ASSERT_LT(smooth, 1.0);
  EXPECT_DOUBLE_EQ(rope_frequency(0, 8, 30.0, s), 1.0);
  EXPECT_DOUBLE_EQ(rope_frequency(1, 8, 30.0, s), (1 - smooth) * f1 / 4.0 + smooth * f1);
  EXPECT_DOUBLE_EQ(rope_frequency(2, 8, 30.0, s), std::pow(30.0, -0.5) / 4.0);
  EXPECT_DOUBLE_EQ(rope_frequency(3, 8, 30.0, s), std::pow(30.0, -0.75) / 4.0);
  // LLaMA 3.1 8B's: head dim 128, theta 500000, factor 8 over 8192 tokens.
  const RopeScaling l31 = llama3(8.0, 1.0, 4.0, 8192.0);
  EXPECT_DOUBLE_EQ(rope_frequency(0, 128, 500000.0, l31), 1.0);
  EXPECT_DOUBLE_EQ(rope_frequency(63, 128, 500000.0, l31),
                   std::pow(500000.0, -126.0 / 128.0) / 8.0);
}

// The op turns each pair by position * its scaled frequency, in q's and k's
// heads; v is copied. Without scaling the result is the unscaled op's, bit
// for bit.
TEST(RopeScaling, TheOpTurnsByTheScaledFrequencies) {
  const int64_t T = 3, H = 2, D = 8, C = H * D;
  const Tensor qkv = randn({1, T, 3 * C}, 6, 1, 1.0, DType::F64);
  const RopeScaling s = llama3(4.0, 1.0, 4.0, 32.0);
  EXPECT_EQ(to_double_vector(rotary_embedding(qkv, H, {}, 5, 30.0, RopeScaling{})),
            to_double_vector(rotary_embedding(qkv, H, {}, 5, 30.0)));
  const std::vector<double> in = to_double_vector(qkv);
  const std::vector<double> got = to_double_vector(rotary_embedding(qkv, H, {}, 5, 30.0, s));
  for (int64_t t = 0; t < T; ++t) {
    const double p = 5.0 + t;
    const size_t row = static_cast<size_t>(t * 3 * C);
    for (int64_t h = 0; h < 2 * H; ++h) {
      for (int64_t i = 0; i < D / 2; ++i) {
        const double a = p * rope_frequency(i, D, 30.0, s);
        const size_t x1 = row + h * D + i, x2 = x1 + D / 2;
        ASSERT_NEAR(got[x1], in[x1] * std::cos(a) - in[x2] * std::sin(a), 1e-12);
        ASSERT_NEAR(got[x2], in[x2] * std::cos(a) + in[x1] * std::sin(a), 1e-12);
      }
    }
    for (int64_t d = 2 * C; d < 3 * C; ++d) ASSERT_EQ(got[row + d], in[row + d]);
  }
  // Scaling changes the low frequencies only: the first pair is unchanged.
  const std::vector<double> plain = to_double_vector(rotary_embedding(qkv, H, {}, 5, 30.0));
  EXPECT_EQ(got[0], plain[0]);
  EXPECT_NE(got[3], plain[3]);
  EXPECT_THROW(rotary_embedding(qkv, H, {}, 0, 30.0, llama3(0.5, 1.0, 4.0, 32.0)), ValueError);
  EXPECT_THROW(rotary_embedding(qkv, H, {}, 0, 30.0, llama3(8.0, 4.0, 4.0, 32.0)), ValueError);
}

RopeScaling yarn(double factor, double original) {
  RopeScaling s;
  s.kind = RopeScaling::Kind::Yarn;
  s.factor = factor;
  s.original_seq_len = original;
  return s;
}

// Linear (position interpolation): every frequency `factor` times slower.
TEST(RopeScaling, LinearSlowsEveryFrequency) {
  RopeScaling s;
  s.kind = RopeScaling::Kind::Linear;
  s.factor = 2.5;
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_DOUBLE_EQ(rope_frequency(i, 8, 30.0, s), std::pow(30.0, -2.0 * i / 8.0) / 2.5) << i;
  EXPECT_EQ(rope_amplitude(s), 1.0);
}

// YaRN at head dim 8, theta 30, an original context of 32: pair i turns
// 32 f_i / (2 pi) times over it. beta_fast 32 puts the ramp's start at
// floor(8 ln(32 / (32 * 2 pi)) / (2 ln 30)) = -3, so 0; beta_slow 1 its end
// at ceil(8 ln(32 / (2 pi)) / (2 ln 30)) = 2. So pair 0 keeps its speed,
// pair 1 is halfway down the ramp, pairs 2 and 3 turn `factor` times
// slower; q and k are scaled by 0.1 ln(factor) + 1.
TEST(RopeScaling, YarnRampsFromKeptToSlowedFrequenciesAndScalesTheLogits) {
  const RopeScaling s = yarn(4.0, 32.0);
  const double f1 = std::pow(30.0, -0.25);
  EXPECT_DOUBLE_EQ(rope_frequency(0, 8, 30.0, s), 1.0);
  EXPECT_DOUBLE_EQ(rope_frequency(1, 8, 30.0, s), 0.5 * f1 / 4.0 + 0.5 * f1);
  EXPECT_DOUBLE_EQ(rope_frequency(2, 8, 30.0, s), std::pow(30.0, -0.5) / 4.0);
  EXPECT_DOUBLE_EQ(rope_frequency(3, 8, 30.0, s), std::pow(30.0, -0.75) / 4.0);
  EXPECT_DOUBLE_EQ(rope_amplitude(s), 0.1 * std::log(4.0) + 1.0);
  RopeScaling given = s;
  given.attention_factor = 1.7;
  EXPECT_EQ(rope_amplitude(given), 1.7);
  // Qwen2.5 7B's long context: head dim 128, theta 1e6, factor 4 over
  // 32768 positions: the fastest pair kept, the slowest slowed.
  const RopeScaling q = yarn(4.0, 32768.0);
  EXPECT_DOUBLE_EQ(rope_frequency(0, 128, 1e6, q), 1.0);
  EXPECT_DOUBLE_EQ(rope_frequency(63, 128, 1e6, q), std::pow(1e6, -126.0 / 128.0) / 4.0);
  // The op: q's and k's pairs turned by the frequencies and scaled by the
  // amplitude (so each q.k logit by its square); v copied.
  const int64_t T = 3, D = 8;
  const AttentionHeads heads{2, 1};
  const Tensor qkv = randn({1, T, 4 * D}, 7, 1, 1.0, DType::F64);
  const std::vector<double> in = to_double_vector(qkv);
  const std::vector<double> got = to_double_vector(rotary_embedding(qkv, heads, {}, 4, 30.0, s));
  const double m = rope_amplitude(s);
  for (int64_t t = 0; t < T; ++t) {
    const size_t row = static_cast<size_t>(t * 4 * D);
    for (int64_t h = 0; h < 3; ++h) {
      for (int64_t i = 0; i < D / 2; ++i) {
        const double a = (4.0 + t) * rope_frequency(i, D, 30.0, s);
        const size_t x1 = row + h * D + i, x2 = x1 + D / 2;
        ASSERT_NEAR(got[x1], m * (in[x1] * std::cos(a) - in[x2] * std::sin(a)), 1e-12);
        ASSERT_NEAR(got[x2], m * (in[x2] * std::cos(a) + in[x1] * std::sin(a)), 1e-12);
      }
    }
    for (int64_t d = 3 * D; d < 4 * D; ++d) ASSERT_EQ(got[row + d], in[row + d]);
  }
  RopeScaling bad = s;
  bad.beta_slow = 64.0;
  EXPECT_THROW(rotary_embedding(qkv, heads, {}, 0, 30.0, bad), ValueError);
}

// longrope (Phi-3's): pair i turns short_factor[i] times slower while a
// pass stays within the original context, long_factor[i] times once it
// goes past it (one past its last position, start + T, above the
// original), and q and k are scaled by sqrt(1 + ln(factor) / ln(original))
// either way. The op, its backward (the inverse turn) and a model take the
// factors of the pass they are in.
TEST(RopeScaling, LongRopeTakesThePassesFactorsAndScalesTheLogits) {
  RopeScaling s;
  s.kind = RopeScaling::Kind::LongRope;
  s.factor = 4.0;
  s.original_seq_len = 6.0;
  ASSERT_EQ(set_rope_factors(s, {1.0, 1.5, 2.0, 4.0}, {1.25, 3.0, 6.0, 16.0}), "");
  const double m = std::sqrt(1.0 + std::log(4.0) / std::log(6.0));
  EXPECT_DOUBLE_EQ(rope_amplitude(s), m);
  for (int64_t i = 0; i < 4; ++i) {
    const double f = std::pow(30.0, -2.0 * i / 8.0);
    EXPECT_DOUBLE_EQ(rope_frequency(i, 8, 30.0, s.with_positions_up_to(6)),
                     f / rope_factors(s, false)[i]);
    EXPECT_DOUBLE_EQ(rope_frequency(i, 8, 30.0, s.with_positions_up_to(7)),
                     f / rope_factors(s, true)[i]);
  }
  RopeScaling unscaled = s;
  unscaled.factor = 1.0;
  EXPECT_EQ(rope_amplitude(unscaled), 1.0);
  unscaled.attention_factor = 1.3;
  EXPECT_EQ(rope_amplitude(unscaled), 1.3);
  EXPECT_NE(rope_scaling_problem(s, 10), "");  // 5 pairs, 4 factors
  EXPECT_EQ(rope_scaling_problem(s, 8), "");
  // The op: positions 2..4 (ending at 5 <= 6) take the short factors, 4..6
  // (ending at 7) the long ones for every token of the pass.
  const int64_t D = 8;
  const AttentionHeads heads{2, 1};
  for (const int64_t start : {2, 4}) {
    const int64_t T = 3;
    const Tensor qkv = randn({1, T, 4 * D}, 9, 1, 1.0, DType::F64);
    const std::vector<double> in = to_double_vector(qkv);
    const std::vector<double> got =
        to_double_vector(rotary_embedding(qkv, heads, {}, start, 30.0, s));
    const std::vector<double> factors = rope_factors(s, start + T > 6);
    for (int64_t t = 0; t < T; ++t) {
      const size_t row = static_cast<size_t>(t * 4 * D);
      for (int64_t h = 0; h < 3; ++h) {
        for (int64_t i = 0; i < D / 2; ++i) {
          const double a = static_cast<double>(start + t) * std::pow(30.0, -2.0 * i / 8.0) /
                           factors[static_cast<size_t>(i)];
          const size_t x1 = row + h * D + i, x2 = x1 + D / 2;
          ASSERT_NEAR(got[x1], m * (in[x1] * std::cos(a) - in[x2] * std::sin(a)), 1e-12);
          ASSERT_NEAR(got[x2], m * (in[x2] * std::cos(a) + in[x1] * std::sin(a)), 1e-12);
        }
      }
    }
    // Backward: the inverse turn of the same pass's factors, scaled again
    // (the transpose of m times a rotation).
    Tensor x = randn({1, T, 4 * D}, 10, 1, 1.0, DType::F64);
    x.set_requires_grad(true);
    Tensor y = rotary_embedding(x, heads, {}, start, 30.0, s);
    const Tensor g = randn({1, T, 4 * D}, 11, 1, 1.0, DType::F64);
    autograd::backward({y}, {g});
    const std::vector<double> gin = to_double_vector(g), dx = to_double_vector(x.grad());
    for (int64_t t = 0; t < T; ++t) {
      const size_t row = static_cast<size_t>(t * 4 * D);
      for (int64_t i = 0; i < D / 2; ++i) {
        const double a = static_cast<double>(start + t) * std::pow(30.0, -2.0 * i / 8.0) /
                         factors[static_cast<size_t>(i)];
        const size_t x1 = row + i, x2 = x1 + D / 2;
        ASSERT_NEAR(dx[x1], m * (gin[x1] * std::cos(a) + gin[x2] * std::sin(a)), 1e-12);
        ASSERT_NEAR(dx[x2], m * (gin[x2] * std::cos(a) - gin[x1] * std::sin(a)), 1e-12);
      }
    }
  }
}

// A partial rotation: each head's first rotary_dim dimensions turn as a
// head of that width would (pairs (i, i + R/2), frequencies theta^(-2i/R),
// scaled by the amplitude), the others pass through untouched; a rotary_dim
// that is odd or wider than the head is refused.
TEST(RopeScaling, APartialRotationTurnsTheHeadsFirstDimensionsOnly) {
  const int64_t T = 3, D = 8, R = 4;
  const AttentionHeads heads{2, 1};
  RopeScaling s;
  s.kind = RopeScaling::Kind::Yarn;
  s.factor = 4.0;
  s.original_seq_len = 4.0;
  s.rotary_dim = R;
  RopeScaling whole = s;
  whole.rotary_dim = 0;
  EXPECT_EQ(rope_frequency(1, D, 30.0, s), rope_frequency(1, R, 30.0, whole));
  const Tensor qkv = randn({1, T, 4 * D}, 12, 1, 1.0, DType::F64);
  const std::vector<double> in = to_double_vector(qkv);
  const std::vector<double> got = to_double_vector(rotary_embedding(qkv, heads, {}, 2, 30.0, s));
  const double m = rope_amplitude(s);
  for (int64_t t = 0; t < T; ++t) {
    const size_t row = static_cast<size_t>(t * 4 * D);
    for (int64_t h = 0; h < 3; ++h) {
      for (int64_t i = 0; i < R / 2; ++i) {
        const double a = static_cast<double>(2 + t) * rope_frequency(i, R, 30.0, whole);
        const size_t x1 = row + h * D + i, x2 = x1 + R / 2;
        ASSERT_NEAR(got[x1], m * (in[x1] * std::cos(a) - in[x2] * std::sin(a)), 1e-12);
        ASSERT_NEAR(got[x2], m * (in[x2] * std::cos(a) + in[x1] * std::sin(a)), 1e-12);
      }
      for (int64_t d = R; d < D; ++d) ASSERT_EQ(got[row + h * D + d], in[row + h * D + d]);
    }
    for (int64_t d = 3 * D; d < 4 * D; ++d) ASSERT_EQ(got[row + d], in[row + d]);
  }
  for (const int64_t bad : {3, 10, -2}) {
    RopeScaling b = s;
    b.rotary_dim = bad;
    try {
      rotary_embedding(qkv, heads, {}, 0, 30.0, b);
      FAIL() << "rotary_dim " << bad << " accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("rotary_dim (" + std::to_string(bad) +
                                           ") must be an even number of the head's 8 dimensions"),
                std::string::npos)
          << e.what();
    }
  }
  // A model of rope_dim: its layers turn that much of each head; an odd,
  // too wide or unrotated one is named.
  GptConfig cfg;
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.d_model = 16;
  cfg.vocab_size = 11;
  cfg.seq_len = 8;
  cfg.position_embedding = PositionEmbedding::Rotary;
  cfg.rope_dim = 4;
  cfg.validate();
  EXPECT_EQ(cfg.rope_of(0).scaling.rotary_dim, 4);
  for (const int64_t bad : {5, 10}) {
    GptConfig b = cfg;
    b.rope_dim = bad;
    EXPECT_THROW(b.validate(), ConfigError) << bad;
  }
  GptConfig learned = cfg;
  learned.position_embedding = PositionEmbedding::Learned;
  EXPECT_THROW(learned.validate(), ConfigError);
}

TEST(RopeScaling, ModelConfigIsChecked) {
  GptConfig c{.n_layer = 1, .n_head = 2, .d_model = 16, .vocab_size = 11, .seq_len = 8};
  c.position_embedding = PositionEmbedding::Rotary;
  c.rope_scaling = llama3(8.0, 2.0, 1.0, 8192.0);
  try {
    c.validate();
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.rope_scaling: llama3 scaling needs"),
              std::string::npos)
        << e.what();
  }
  c.rope_scaling = llama3(8.0, 1.0, 4.0, 8192.0);
  EXPECT_NO_THROW(c.validate());
  c.rope_theta = 30.0;  // frequencies in all three regions of a 32-token original context
  c.rope_scaling = llama3(4.0, 1.0, 4.0, 32.0);
  // The model turns its heads by the scaled frequencies: other logits.
  GptConfig plain = c;
  plain.rope_scaling = {};
  const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {1, 8});
  const auto a = to_double_vector(Gpt(c, 2).forward(ids)),
             b = to_double_vector(Gpt(plain, 2).forward(ids));
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
  EXPECT_GT(diff, 1e-6);
}

}  // namespace
}  // namespace triad::nn
