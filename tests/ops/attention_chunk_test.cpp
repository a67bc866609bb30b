// chunk_attention, a chunk of queries apart from every row's keys and
// values, what context parallelism's all-gather runs on each rank: its
// output is the whole sequence's rows from the chunk's first on, and its
// gradient is the whole sequence's under an upstream gradient that is zero
// before the chunk. (op_cases.h checks its gradients against central
// differences, and the CUDA kernels against the CPU.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "triad/autograd/engine.h"
#include "triad/backend/backend.h"
#include "triad/core/error.h"
#include "triad/ops.h"
#include "triad/parallel/context/layout.h"

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
        const Tensor chunk = chunk_attention(
            queries, keys_values, h,
            documents ? contiguous(narrow(doc_starts, 1, first, T - first)) : Tensor());
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

// Ring attention's arithmetic on one process: a run of queries attends
// over three blocks of keys apart — two wholly earlier (more queries than
// keys: query_start past every key), one its own run causally — and the
// blocks folded by their log-sum-exps (Backend::attention_merge, in any
// order) are the whole sequence's rows. Each block's backward under the
// folded output and log-sum-exp gives its share of the gradient: their sum
// is the whole one's. Packed documents leave a block unseen by some rows
// (out 0, lse -inf: the merge skips them).
TEST(AttentionChunk, BlocksOfKeysFoldIntoTheWholeAttention) {
  const int64_t B = 2, T = 70, D = 6, first = 40, Tq = T - first;
  const AttentionHeads heads{4, 2};
  const int64_t q = heads.q * D, kv = heads.kv * D;
  std::vector<int64_t> starts(B * T, 0);
  for (int64_t t = 0; t < T; ++t) {
    starts[t] = std::max<int64_t>(0, t - 45);       // a window in row 0
    starts[T + t] = t < 25 ? 0 : t < 66 ? 25 : 66;  // documents in row 1
  }
  Backend& be = backend_for(DeviceType::CPU);
  const std::vector<cp::Run> key_runs{{0, 20}, {20, 20}, {40, 30}};
  for (const bool documents : {false, true}) {
    for (const double cap : {0.0, 1.5}) {
      SCOPED_TRACE(std::string(documents ? "documents" : "causal") + (cap > 0 ? ", soft cap" : ""));
      const AttentionHeads h = heads.with_softcap(cap);
      const Tensor doc_starts = documents ? from_vector(starts, {B, T}, DType::I32) : Tensor();
      Tensor qkv = randn({B, T, heads.fused() * D}, 12, 1, 1.5, DType::F64);
      const Tensor queries = contiguous(narrow(narrow(qkv, 2, 0, q), 1, first, Tq));
      const Tensor keys_values = contiguous(narrow(qkv, 2, q, 2 * kv));
      // Each block's keys, query position and the queries' first keys in its frame.
      struct Part {
        Tensor kv, starts;
        int64_t query_start;
      };
      std::vector<Part> parts;
      for (const auto& [k0, n] : key_runs) {
        Part part{contiguous(narrow(keys_values, 1, k0, n)), Tensor(), k0 == first ? 0 : n};
        if (documents) {
          std::vector<int64_t> rel(B * Tq);
          for (int64_t b = 0; b < B; ++b) {
            for (int64_t i = 0; i < Tq; ++i)
              rel[b * Tq + i] = std::clamp<int64_t>(starts[b * T + first + i] - k0, 0, n);
          }
          part.starts = from_vector(rel, {B, Tq}, DType::I32);
        }
        parts.push_back(part);
      }
      Tensor out = zeros({B, Tq, q}, DType::F64);
      Tensor lse = full({B, heads.q, Tq}, -std::numeric_limits<double>::infinity(), DType::F64);
      int unseen = 0;  // rows some block gives nothing
      for (const size_t i : {size_t{0}, size_t{2}, size_t{1}}) {
        Tensor part = empty({B, Tq, q}, DType::F64), part_lse = empty({B, heads.q, Tq}, DType::F64);
        be.attention_parts_forward(queries, parts[i].kv, h, parts[i].query_start, part, part_lse,
                                   parts[i].starts);
        for (const double l : to_double_vector(part_lse)) unseen += std::isinf(l) ? 1 : 0;
        be.attention_merge(out, lse, part, part_lse);
      }
      EXPECT_EQ(unseen > 0, documents);
      const Tensor whole = causal_attention(qkv, h, doc_starts);
      const std::vector<double> got = to_double_vector(out);
      const std::vector<double> want = to_double_vector(contiguous(narrow(whole, 1, first, Tq)));
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << i;

      const Tensor g = randn({B, Tq, q}, 12, 2, 1.0, DType::F64);
      Tensor dq = zeros({B, Tq, q}, DType::F64), dkv = zeros({B, T, 2 * kv}, DType::F64);
      for (size_t i = 0; i < parts.size(); ++i) {
        Tensor gq = empty({B, Tq, q}, DType::F64);
        Tensor gkv = empty(parts[i].kv.shape(), DType::F64);
        be.attention_parts_backward(queries, parts[i].kv, out, lse, g, h, parts[i].query_start, gq,
                                    gkv, parts[i].starts);
        be.accumulate(gq, dq);
        Tensor rows = narrow(dkv, 1, key_runs[i].first, key_runs[i].second);
        copy_(rows, add(rows, gkv));
      }
      qkv.set_requires_grad(true);
      autograd::backward({causal_attention(qkv, h, doc_starts)},
                         {concat({zeros({B, first, q}, DType::F64), g}, 1)});
      const Tensor dwhole = qkv.grad();
      const std::vector<double> want_dq =
          to_double_vector(contiguous(narrow(narrow(dwhole, 2, 0, q), 1, first, Tq)));
      const std::vector<double> want_dkv =
          to_double_vector(contiguous(narrow(dwhole, 2, q, 2 * kv)));
      const std::vector<double> got_dq = to_double_vector(dq), got_dkv = to_double_vector(dkv);
      for (size_t i = 0; i < got_dq.size(); ++i)
        ASSERT_NEAR(got_dq[i], want_dq[i], 1e-10 * (1 + std::abs(want_dq[i]))) << i;
      for (size_t i = 0; i < got_dkv.size(); ++i)
        ASSERT_NEAR(got_dkv[i], want_dkv[i], 1e-10 * (1 + std::abs(want_dkv[i]))) << i;
    }
  }
}

// chunk_attention's queries after every key: all of them seen, from each
// query's first key on; a query whose first key is past them sees none and
// gets zeros (and gives the keys nothing).
TEST(AttentionChunk, QueriesAfterEveryKeySeeThemAll) {
  const int64_t B = 1, Tk = 5, Tq = 3, D = 4;
  const AttentionHeads h{1, 1};
  Tensor q = randn({B, Tq, D}, 7, 1, 1.0, DType::F64);
  Tensor kv = randn({B, Tk, 2 * D}, 7, 2, 1.0, DType::F64);
  q.set_requires_grad(true);
  kv.set_requires_grad(true);
  // Query 0 sees every key, query 1 keys [2, 5), query 2 none.
  const Tensor starts = from_vector(std::vector<int64_t>{0, 2, 5}, {B, Tq}, DType::I32);
  const Tensor out = chunk_attention(q, kv, h, starts, Tk);
  const std::vector<double> o = to_double_vector(out);
  const std::vector<double> qs = to_double_vector(q), kvs = to_double_vector(kv);
  for (int64_t i = 0; i < Tq; ++i) {
    const int64_t from = std::vector<int64_t>{0, 2, 5}[i];
    std::vector<double> w;
    double top = -1e300;
    for (int64_t j = from; j < Tk; ++j) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += qs[i * D + d] * kvs[j * 2 * D + d];
      w.push_back(s / std::sqrt(static_cast<double>(D)));
      top = std::max(top, w.back());
    }
    double sum = 0;
    for (double& x : w) sum += (x = std::exp(x - top));
    for (int64_t d = 0; d < D; ++d) {
      double want = 0;
      for (int64_t j = from; j < Tk; ++j) want += w[j - from] / sum * kvs[j * 2 * D + D + d];
      EXPECT_NEAR(o[i * D + d], want, 1e-12) << "query " << i << " dim " << d;
    }
  }
  autograd::backward({out}, {full({B, Tq, D}, 1.0, DType::F64)});
  const std::vector<double> dq = to_double_vector(q.grad());
  for (int64_t d = 0; d < D; ++d) EXPECT_EQ(dq[2 * D + d], 0.0);  // the query that saw none
  EXPECT_GT(std::abs(dq[0]) + std::abs(dq[D]), 0.0);
  // A negative position, and a first key past its query's, are refused by name.
  try {
    (void)chunk_attention(q, kv, h, starts, -3);
    ADD_FAILURE() << "query_start -3 was taken";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("query_start -3"), std::string::npos) << e.what();
  }
  try {
    (void)chunk_attention(q, kv, h, from_vector(std::vector<int64_t>{0, 2, 8}, {B, Tq}, DType::I32),
                          Tk);
    ADD_FAILURE() << "a first key past the query was taken";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("doc_starts[0, 2] is 8"), std::string::npos) << e.what();
  }
}

// The CPU's fold takes one dtype throughout (the half-precision adapter
// widens a bf16 part first); another is named, not misread.
TEST(AttentionChunk, AMergeOfMixedDtypesIsNamed) {
  Tensor out = zeros({1, 2, 4}, DType::F64), lse = zeros({1, 1, 2}, DType::F64);
  try {
    backend_for(DeviceType::CPU)
        .attention_merge(out, lse, zeros({1, 2, 4}, DType::F32), zeros({1, 1, 2}, DType::F64));
    ADD_FAILURE() << "an f32 part was folded into f64";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("the part (f32)"), std::string::npos) << e.what();
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
