// cached_attention (decoding's attention over a key/value cache) against a
// direct computation in double of what it promises: each new query's
// softmax over the slots it may see (causal, a sliding window, a row's text
// start), in f32 and bf16, with grouped heads, soft-capping, several new
// tokens and a cache longer than the slots attended over. The GPU suite
// checks the CUDA kernel against this CPU path, and the KvCache tests the
// decoding that uses it against full forward passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "triad/autograd/grad_mode.h"
#include "triad/core/error.h"
#include "triad/ops.h"

namespace triad {
namespace {

struct Case {
  int64_t B, n, NH, NKV, D, capacity, length, window;
  std::vector<int64_t> text;  // empty: no padding
  double softcap;
};

// out (B, n, NH * D) by the definition: scores of every allowed slot, their
// softmax, the weighted values; in double from the tensors' own values.
std::vector<double> reference(const Case& c, const Tensor& qkv, const Tensor& kc,
                              const Tensor& vc) {
  const std::vector<double> q = to_double_vector(qkv), k = to_double_vector(kc),
                            v = to_double_vector(vc);
  const int64_t W = (c.NH + 2 * c.NKV) * c.D, G = c.NH / c.NKV;
  std::vector<double> out(static_cast<size_t>(c.B * c.n * c.NH * c.D), 0.0);
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t i = 0; i < c.n; ++i) {
      const int64_t p = c.length - c.n + i;
      for (int64_t h = 0; h < c.NH; ++h) {
        const int64_t kvh = h / G;
        std::vector<double> s(static_cast<size_t>(p + 1));
        std::vector<bool> seen(static_cast<size_t>(p + 1), true);
        const int64_t text = c.text.empty() ? 0 : c.text[static_cast<size_t>(b)];
        double top = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= p; ++j) {
          if (c.window > 0 && j <= p - c.window) seen[static_cast<size_t>(j)] = false;
          if (p >= text && j < text) seen[static_cast<size_t>(j)] = false;
          double dot = 0;
          for (int64_t d = 0; d < c.D; ++d) {
            dot += q[static_cast<size_t>((b * c.n + i) * W + h * c.D + d)] *
                   k[static_cast<size_t>(((b * c.NKV + kvh) * c.capacity + j) * c.D + d)];
          }
          dot /= std::sqrt(static_cast<double>(c.D));
          if (c.softcap > 0) dot = c.softcap * std::tanh(dot / c.softcap);
          s[static_cast<size_t>(j)] = dot;
          if (seen[static_cast<size_t>(j)]) top = std::max(top, dot);
        }
        double sum = 0;
        for (int64_t j = 0; j <= p; ++j) {
          s[static_cast<size_t>(j)] =
              seen[static_cast<size_t>(j)] ? std::exp(s[static_cast<size_t>(j)] - top) : 0.0;
          sum += s[static_cast<size_t>(j)];
        }
        for (int64_t d = 0; d < c.D; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= p; ++j) {
            o += s[static_cast<size_t>(j)] *
                 v[static_cast<size_t>(((b * c.NKV + kvh) * c.capacity + j) * c.D + d)];
          }
          out[static_cast<size_t>(((b * c.n + i) * c.NH + h) * c.D + d)] = o / sum;
        }
      }
    }
  }
  return out;
}

TEST(CachedAttention, GivesEachQueryTheSoftmaxOverTheSlotsItMaySee) {
  const std::vector<Case> cases = {
      {2, 1, 4, 4, 16, 40, 33, 0, {}, 0.0},
      {3, 2, 4, 2, 8, 24, 20, 0, {0, 6, 19}, 0.0},  // row 2: query 0 sits in padding
      {2, 3, 2, 1, 12, 30, 30, 5, {}, 0.0},         // window, multi-query
      {2, 1, 6, 3, 8, 16, 11, 4, {2, 0}, 2.0},      // window over padding, soft-capped
      {1, 1, 2, 2, 20, 8, 1, 0, {}, 0.5},           // the first slot alone
      // Eight or more new tokens take the GEMM path, a block of 64 queries
      // at a time: two blocks, a window, padding, a cache just filled.
      {2, 70, 4, 2, 16, 96, 90, 0, {0, 25}, 0.0},
      {2, 12, 6, 2, 8, 40, 37, 9, {4, 30}, 1.5},  // row 1: the first queries in padding
      {3, 9, 2, 2, 12, 9, 9, 0, {0, 3, 8}, 0.0},
      {1, 65, 2, 1, 8, 80, 80, 30, {}, 0.0},
  };
  autograd::NoGradGuard no_grad;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (size_t at = 0; at < cases.size(); ++at) {
      const Case& c = cases[at];
      SCOPED_TRACE("case " + std::to_string(at) + " " + dtype_name(dtype));
      const Tensor qkv = randn({c.B, c.n, (c.NH + 2 * c.NKV) * c.D}, 3 + at, 1, 1.5, dtype);
      const Tensor kc = randn({c.B, c.NKV, c.capacity, c.D}, 4 + at, 1, 1.0, dtype);
      const Tensor vc = randn({c.B, c.NKV, c.capacity, c.D}, 5 + at, 1, 1.0, dtype);
      const Tensor text = c.text.empty() ? Tensor() : from_vector(c.text, {c.B}, DType::I64);
      const Tensor got =
          cached_attention(qkv, kc, vc, c.length,
                           AttentionHeads{c.NH, c.NKV}.with_softcap(c.softcap), c.window, text);
      ASSERT_EQ(got.shape(), (Shape{c.B, c.n, c.NH * c.D}));
      EXPECT_EQ(got.dtype(), dtype);
      const std::vector<double> want = reference(c, qkv, kc, vc), out = to_double_vector(got);
      // f32 computes in f32; bf16 rounds the output (8 bits) once.
      const double tol = dtype == DType::F32 ? 1e-5 : 1e-2;
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(out[i], want[i], tol * (1 + std::abs(want[i]))) << "element " << i;
    }
  }
}

// A slot the query may not see changes nothing; one it may see does.
TEST(CachedAttention, ReadsOnlyTheSlotsItMaySee) {
  autograd::NoGradGuard no_grad;
  const Tensor qkv = randn({1, 1, 3 * 8}, 1, 1, 1.0);
  Tensor kc = randn({1, 1, 12, 8}, 2, 1, 1.0), vc = randn({1, 1, 12, 8}, 3, 1, 1.0);
  const Tensor text = from_vector(std::vector<int64_t>{3}, {1}, DType::I32);
  const auto run = [&] { return to_double_vector(cached_attention(qkv, kc, vc, 9, 1, 4, text)); };
  const std::vector<double> before = run();
  for (int64_t slot : {0, 4, 9, 11}) {  // before the window, after the length
    Tensor k = narrow(kc, 2, slot, 1), v = narrow(vc, 2, slot, 1);
    fill_(k, 100.0);
    fill_(v, -50.0);
  }
  EXPECT_EQ(run(), before);
  Tensor seen = narrow(vc, 2, 7, 1);
  fill_(seen, 3.0);
  EXPECT_NE(run(), before);
}

// write_kv_cache puts each new token's key and value heads in its slots and
// touches no other slot.
TEST(CachedAttention, WriteKvCacheFillsTheNewSlotsAlone) {
  autograd::NoGradGuard no_grad;
  const int64_t B = 2, n = 3, NH = 4, KV = 2, D = 5, cap = 9, start = 4;
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor qkv = randn({B, n, (NH + 2 * KV) * D}, 7, 1, 1.0, dtype);
    Tensor kc = randn({B, KV, cap, D}, 8, 1, 1.0, dtype),
           vc = randn({B, KV, cap, D}, 9, 1, 1.0, dtype);
    const std::vector<double> k0 = to_double_vector(kc), v0 = to_double_vector(vc);
    write_kv_cache(qkv, AttentionHeads{NH, KV}, start, kc, vc);
    const std::vector<double> q = to_double_vector(qkv), k = to_double_vector(kc),
                              v = to_double_vector(vc);
    const int64_t W = (NH + 2 * KV) * D;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < KV; ++h) {
        for (int64_t slot = 0; slot < cap; ++slot) {
          for (int64_t d = 0; d < D; ++d) {
            const auto at = static_cast<size_t>(((b * KV + h) * cap + slot) * D + d);
            const int64_t t = slot - start;
            if (t >= 0 && t < n) {
              const auto from = static_cast<size_t>((b * n + t) * W + NH * D + h * D + d);
              EXPECT_EQ(k[at], q[from]);
              EXPECT_EQ(v[at], q[from + static_cast<size_t>(KV * D)]);
            } else {
              EXPECT_EQ(k[at], k0[at]);
              EXPECT_EQ(v[at], v0[at]);
            }
          }
        }
      }
    }
  }
  Tensor kc = zeros({2, 2, 9, 5}), vc = zeros({2, 2, 9, 5});
  const Tensor qkv = randn({2, 3, 8 * 5}, 1, 1, 1.0);
  EXPECT_THROW(write_kv_cache(qkv, AttentionHeads{4, 2}, 7, kc, vc), ValueError);  // past the end
  EXPECT_THROW(write_kv_cache(qkv, AttentionHeads{4, 2}, -1, kc, vc), ValueError);
  Tensor wrong = zeros({2, 1, 9, 5});
  EXPECT_THROW(write_kv_cache(qkv, AttentionHeads{4, 2}, 0, wrong, vc), ShapeError);
}

TEST(CachedAttention, RefusesWhatItCannotDo) {
  const Tensor qkv = randn({2, 1, 3 * 8}, 1, 1, 1.0);
  const Tensor kc = randn({2, 1, 10, 8}, 2, 1, 1.0), vc = randn({2, 1, 10, 8}, 3, 1, 1.0);
  {
    autograd::NoGradGuard no_grad;
    EXPECT_THROW(cached_attention(qkv, kc, vc, 11, 1), ValueError);  // past the capacity
    EXPECT_THROW(cached_attention(qkv, kc, vc, 0, 1), ValueError);   // fewer slots than tokens
    EXPECT_THROW(cached_attention(qkv, kc, vc, 5, 1, -1), ValueError);
    EXPECT_THROW(cached_attention(qkv, narrow(kc, 1, 0, 1), narrow(vc, 3, 0, 4), 5, 1), ShapeError);
    EXPECT_THROW(cached_attention(qkv, kc, vc, 5, 2), ShapeError);  // 2 heads need 2 cache heads
    EXPECT_THROW(cached_attention(qkv, kc, cast(vc, DType::BF16), 5, 1), ValueError);
    EXPECT_THROW(
        cached_attention(qkv, kc, vc, 5, 1, 0, from_vector(std::vector<int64_t>{0, 6}, {2})),
        ValueError);  // a text start past the length
    EXPECT_THROW(cached_attention(qkv, kc, vc, 5, 1, 0, from_vector(std::vector<int64_t>{0}, {1})),
                 ShapeError);
  }
  Tensor leaf = qkv.detach();
  leaf.set_requires_grad(true);
  try {
    cached_attention(leaf, kc, vc, 5, 1);
    ADD_FAILURE() << "a graph through cached_attention was recorded";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("forward only"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace triad
