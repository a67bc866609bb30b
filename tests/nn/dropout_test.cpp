#include "triad/nn/dropout.h"

#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "triad/autograd/engine.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

using Runs = std::vector<std::pair<int64_t, int64_t>>;

Tensor take(const Tensor& t, const Runs& runs) {
  std::vector<Tensor> parts;
  for (const auto& [first, n] : runs) parts.push_back(narrow(t, 1, first, n));
  return concat(parts, 1);
}

// A slice of the held tokens is the pieces of the rows those tokens are:
// within a run, across runs, and the whole.
TEST(SequencePieces, ASliceOfTheHeldTokensIsTheirPiecesOfTheRows) {
  const SequencePieces s{16, {{0, 2}, {12, 4}}};
  EXPECT_EQ(s.held(), 6);
  EXPECT_EQ(s.slice(0, 3).runs, (Runs{{0, 2}, {12, 1}}));
  EXPECT_EQ(s.slice(3, 3).runs, (Runs{{13, 3}}));
  EXPECT_EQ(s.slice(1, 1).runs, (Runs{{1, 1}}));
  EXPECT_EQ(s.slice(0, 6).runs, s.runs);
  EXPECT_EQ(s.slice(2, 0).runs, Runs{});
  EXPECT_EQ(s.slice(3, 3).row_length, 16);
  EXPECT_THROW(s.slice(4, 3), ShapeError);
  EXPECT_THROW(s.slice(-1, 2), ShapeError);
}

// Context parallelism's chunks (one run, the ring's two half-chunks) and
// sequence parallelism's slices of them draw their elements of the whole
// micro-batch's mask, forward and backward; without pieces the whole draws
// the plain op's mask at call * numel.
TEST(SequenceDropout, PiecesOfTheSequencesDrawTheirElementsOfTheWholeMask) {
  const int64_t B = 2, T = 8, C = 6;
  const double p = 0.4;
  Tensor x = randn({B, T, C}, 3, 7);
  x.set_requires_grad(true);
  const Tensor whole = sequence_dropout(x, p, 9, 21, 5, nullptr);
  const auto plain = to_double_vector(dropout(x.detach(), p, 9, 21, 5 * B * T * C));
  const auto w = to_double_vector(whole);
  ASSERT_EQ(w, plain);
  size_t zeros = 0;
  for (double v : w) zeros += v == 0.0;
  EXPECT_GT(zeros, w.size() / 5);  // (a mask that drops, not the identity)
  EXPECT_LT(zeros, w.size() * 3 / 5);
  autograd::backward({sum(mul(whole, whole))}, {});
  for (const Runs& runs : {Runs{{2, 4}}, Runs{{0, 2}, {6, 2}}, Runs{{1, 2}, {4, 3}}}) {
    SCOPED_TRACE("runs from " + std::to_string(runs[0].first));
    const SequencePieces pieces{T, runs};
    Tensor chunk = contiguous(take(x.detach(), runs));
    chunk.set_requires_grad(true);
    const Tensor got = sequence_dropout(chunk, p, 9, 21, 5, &pieces);
    ASSERT_EQ(to_double_vector(got), to_double_vector(take(whole.detach(), runs)));
    autograd::backward({sum(mul(got, got))}, {});
    ASSERT_EQ(to_double_vector(chunk.grad()), to_double_vector(take(x.grad(), runs)));
    // A sequence-parallel rank's slice of the chunk.
    const int64_t held = pieces.held();
    const SequencePieces half = pieces.slice(held / 2, held - held / 2);
    const Tensor tail = narrow(chunk.detach(), 1, held / 2, held - held / 2);
    EXPECT_EQ(to_double_vector(sequence_dropout(tail, p, 9, 21, 5, &half)),
              to_double_vector(take(whole.detach(), half.runs)));
    // (rows, C) rows of the pieces draw the same; others are refused.
    EXPECT_EQ(to_double_vector(
                  sequence_dropout(reshape(chunk.detach(), {B * held, C}), p, 9, 21, 5, &pieces)),
              to_double_vector(got));
    EXPECT_THROW(sequence_dropout(randn({held + 1, C}, 3, 8), p, 9, 21, 5, &pieces), ShapeError);
  }
  // Another call draws another mask.
  EXPECT_NE(to_double_vector(sequence_dropout(x.detach(), p, 9, 21, 6, nullptr)), w);
}

}  // namespace
}  // namespace triad::nn
