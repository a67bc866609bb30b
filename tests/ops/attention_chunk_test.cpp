// causal_attention over a chunk of queries (first_query > 0), what context
// parallelism's all-gather runs on each rank: the chunk's output is the
// whole sequence's rows from first_query on, and its gradient is the whole
// sequence's under an upstream gradient that is zero before the chunk.
// (op_cases.h checks its gradients against central differences, and the
// CUDA kernels against the CPU.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "triad/autograd/engine.h"
#include "triad/core/error.h"
#include "triad/ops.h"

namespace triad {
namespace {

TEST(AttentionChunk, EqualsTheWholeSequencesRowsAndGradients) {
  const int64_t B = 2, T = 70, D = 6;  // two of the CPU kernel's 64-row blocks
  const AttentionHeads heads{4, 2};
  std::vector<int64_t> starts(B * T, 0);
  for (int64_t t = 0; t < T; ++t) {
    starts[t] = std::max<int64_t>(0, t - 30);       // a window in row 0
    starts[T + t] = t < 25 ? 0 : t < 66 ? 25 : 66;  // documents in row 1
  }
  const Tensor doc_starts = from_vector(starts, {B, T}, DType::I32);
  for (const int64_t first : {0, 1, 33, 64, 69, 70}) {
    for (const bool documents : {false, true}) {
      for (const double cap : {0.0, 1.5}) {
        SCOPED_TRACE("first " + std::to_string(first) + (documents ? " documents" : "") +
                     (cap > 0 ? " softcap" : ""));
        const AttentionHeads h = heads.with_softcap(cap);
        const Tensor s = documents ? doc_starts : Tensor();
        Tensor qkv = randn({B, T, heads.fused() * D}, 11, 1, 1.5, DType::F64);
        qkv.set_requires_grad(true);
        const Tensor chunk = causal_attention(qkv, h, s, first);
        const Tensor whole = causal_attention(qkv, h, s);
        ASSERT_EQ(chunk.shape(), (Shape{B, T - first, heads.q * D}));
        const std::vector<double> got = to_double_vector(chunk);
        const std::vector<double> want =
            to_double_vector(contiguous(narrow(whole, 1, first, T - first)));
        for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << i;

        const Tensor g = randn({B, T - first, heads.q * D}, 11, 2, 1.0, DType::F64);
        autograd::backward({chunk}, {g});
        const std::vector<double> dchunk = to_double_vector(qkv.grad());
        qkv.set_grad(Tensor());
        const Tensor padded = concat({zeros({B, first, heads.q * D}, DType::F64), g}, 1);
        autograd::backward({whole}, {padded});
        const std::vector<double> dwhole = to_double_vector(qkv.grad());
        double largest = 0;
        for (size_t i = 0; i < dchunk.size(); ++i) {
          ASSERT_NEAR(dchunk[i], dwhole[i], 1e-10 * (1 + std::abs(dwhole[i]))) << i;
          largest = std::max(largest, std::abs(dwhole[i]));
        }
        if (first < T) {
          EXPECT_GT(largest, 1e-3);
        }
        // No query before the chunk: its rows' q columns get no gradient.
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t t = 0; t < first; ++t) {
            for (int64_t c = 0; c < heads.q * D; ++c) {
              ASSERT_EQ(dchunk[static_cast<size_t>((b * T + t) * heads.fused() * D + c)], 0.0);
            }
          }
        }
      }
    }
  }
}

// chunk_attention takes the chunk's queries apart from every row's keys
// and values: the fused call's output and, for the same upstream gradient,
// its gradients of the chunk's queries and of the keys and values.
TEST(AttentionChunk, QueriesApartMatchTheFusedCall) {
  const int64_t B = 2, T = 70, D = 6;
  const AttentionHeads heads = AttentionHeads{4, 2}.with_softcap(1.5);
  const int64_t q = heads.q * D, kv = heads.kv * D;
  std::vector<int64_t> starts(B * T, 0);
  for (int64_t t = 0; t < T; ++t) starts[T + t] = t < 25 ? 0 : t < 66 ? 25 : 66;
  const Tensor doc_starts = from_vector(starts, {B, T}, DType::I32);
  for (const int64_t first : {0, 33, 69, 70}) {
    SCOPED_TRACE("first " + std::to_string(first));
    Tensor qkv = randn({B, T, heads.fused() * D}, 12, 1, 1.0, DType::F64);
    qkv.set_requires_grad(true);
    Tensor qs = contiguous(narrow(narrow(qkv, 2, 0, q), 1, first, T - first)).detach();
    Tensor kvs = contiguous(narrow(qkv, 2, q, 2 * kv)).detach();
    qs.set_requires_grad(true);
    kvs.set_requires_grad(true);
    const Tensor apart = chunk_attention(qs, kvs, heads, doc_starts);
    const Tensor fused = causal_attention(qkv, heads, doc_starts, first);
    ASSERT_EQ(apart.shape(), fused.shape());
    const std::vector<double> a = to_double_vector(apart), f = to_double_vector(fused);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], f[i], 1e-12) << i;
    const Tensor g = randn(fused.shape(), 12, 2, 1.0, DType::F64);
    autograd::backward({apart}, {g});
    autograd::backward({fused}, {g});
    const Tensor want_q = narrow(narrow(qkv.grad(), 2, 0, q), 1, first, T - first);
    const Tensor want_kv = narrow(qkv.grad(), 2, q, 2 * kv);
    const std::vector<double> gq = to_double_vector(qs.grad()), wq = to_double_vector(want_q);
    const std::vector<double> gkv = to_double_vector(kvs.grad()), wkv = to_double_vector(want_kv);
    ASSERT_EQ(gq.size(), wq.size());
    ASSERT_EQ(gkv.size(), wkv.size());
    for (size_t i = 0; i < gq.size(); ++i) ASSERT_NEAR(gq[i], wq[i], 1e-10 * (1 + std::abs(wq[i])));
    double largest = 0;
    for (size_t i = 0; i < gkv.size(); ++i) {
      ASSERT_NEAR(gkv[i], wkv[i], 1e-10 * (1 + std::abs(wkv[i])));
      largest = std::max(largest, std::abs(wkv[i]));
    }
    if (first < T) {
      EXPECT_GT(largest, 1e-3);
    }
  }
}

TEST(AttentionChunk, PartsOfTheWrongShapesAreNamed) {
  const Tensor q = randn({1, 4, 8}, 3, 1, 1.0, DType::F32);   // 2 query heads of 4
  const Tensor kv = randn({1, 6, 8}, 3, 2, 1.0, DType::F32);  // 1 key/value head of 4
  EXPECT_EQ(chunk_attention(q, kv, AttentionHeads{2, 1}).shape(), (Shape{1, 4, 8}));
  auto error_of = [](const Tensor& a, const Tensor& b) -> std::string {
    try {
      (void)chunk_attention(a, b, AttentionHeads{2, 1});
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  // More queries than keys, a kv of the wrong width, another dtype.
  EXPECT_NE(error_of(randn({1, 7, 8}, 3, 1), kv).find("with Tq <= T"), std::string::npos);
  EXPECT_NE(error_of(q, randn({1, 6, 12}, 3, 1)).find("kv (B, T, 8)"), std::string::npos);
  EXPECT_NE(error_of(q, cast(kv, DType::F64)).find("expected the same"), std::string::npos);
}

TEST(AttentionChunk, AFirstQueryOutsideTheRowsIsNamed) {
  const Tensor qkv = randn({1, 8, 12}, 3, 1, 1.0, DType::F32);
  for (const int64_t first : {-1, 9}) {
    try {
      (void)causal_attention(qkv, 2, {}, first);
      FAIL() << "first_query " << first << " was taken";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("first_query " + std::to_string(first)),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("[0, 8]"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace triad
