// chunk_attention, a chunk of queries apart from every row's keys and
// values, what context parallelism's all-gather runs on each rank: its
// output is the whole sequence's rows from the chunk's first on, and its
// gradient is the whole sequence's under an upstream gradient that is zero
// before the chunk. (op_cases.h checks its gradients against central
// differences, and the CUDA kernels against the CPU.)
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
  const int64_t q = heads.q * D, kv = heads.kv * D;
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
        // The chunk's queries and every row's keys and values, cut from the
        // fused qkv (so that its gradient gathers both parts').
        const Tensor queries = contiguous(narrow(narrow(qkv, 2, 0, q), 1, first, T - first));
        const Tensor keys_values = contiguous(narrow(qkv, 2, q, 2 * kv));
        const Tensor chunk = chunk_attention(queries, keys_values, h, s);
        const Tensor whole = causal_attention(qkv, h, s);
        ASSERT_EQ(chunk.shape(), (Shape{B, T - first, q}));
        const std::vector<double> got = to_double_vector(chunk);
        const std::vector<double> want =
            to_double_vector(contiguous(narrow(whole, 1, first, T - first)));
        for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << i;

        const Tensor g = randn({B, T - first, q}, 11, 2, 1.0, DType::F64);
        autograd::backward({chunk}, {g});
        const std::vector<double> dchunk = to_double_vector(qkv.grad());
        qkv.set_grad(Tensor());
        const Tensor padded = concat({zeros({B, first, q}, DType::F64), g}, 1);
        autograd::backward({whole}, {padded});
        const std::vector<double> dwhole = to_double_vector(qkv.grad());
        ASSERT_EQ(dchunk.size(), dwhole.size());
        double largest = 0;
        for (size_t i = 0; i < dchunk.size(); ++i) {
          ASSERT_NEAR(dchunk[i], dwhole[i], 1e-10 * (1 + std::abs(dwhole[i]))) << i;
          largest = std::max(largest, std::abs(dwhole[i]));
        }
        if (first < T) {
          EXPECT_GT(largest, 1e-3);
        }
      }
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

}  // namespace
}  // namespace triad
