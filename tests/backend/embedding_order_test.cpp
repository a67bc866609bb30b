// The embedding backward's fixed order (src/backend/embedding_order.h):
// positions grouped by id in token order, long ids cut into pieces; and the
// CPU reference summing in that order.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/backend/embedding_order.h"
#include "triad/autograd/engine.h"
#include "triad/core/error.h"
#include "triad/ops/creation.h"
#include "triad/ops/nn_functional.h"

namespace triad {
namespace {

using detail::cut_into_pieces;
using detail::EmbeddingPieces;
using detail::EmbeddingSegments;
using detail::group_by_id;

TEST(EmbeddingOrder, GroupsPositionsByIdInTokenOrder) {
  const int64_t ids[7] = {3, 1, 3, 0, 1, 3, 5};
  const EmbeddingSegments s = group_by_id(ids, 7, 6);
  EXPECT_EQ(s.seg_id, (std::vector<int64_t>{0, 1, 3, 5}));
  EXPECT_EQ(s.seg_start, (std::vector<int64_t>{0, 1, 3, 6, 7}));
  EXPECT_EQ(s.order, (std::vector<int64_t>{3, 1, 4, 0, 2, 5, 6}));
  const int64_t bad[3] = {0, 6, 1};
  try {
    group_by_id(bad, 3, 6);
    FAIL() << "expected an error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 6 at position 1"), std::string::npos);
  }
}

TEST(EmbeddingOrder, LongSegmentsAreCutIntoPiecesWithConsecutiveSlots) {
  // Pieces of 3: id 0 appears 7 times (pieces of 3, 3, 1), id 2 once, id 4
  // exactly 3 times (one piece), id 5 four times (3, 1).
  std::vector<int64_t> ids;
  for (int i = 0; i < 7; ++i) ids.push_back(0);
  ids.push_back(2);
  for (int i = 0; i < 3; ++i) ids.push_back(4);
  for (int i = 0; i < 4; ++i) ids.push_back(5);
  const EmbeddingSegments s = group_by_id(ids.data(), static_cast<int64_t>(ids.size()), 6);
  const EmbeddingPieces p = cut_into_pieces(s, 3);
  EXPECT_EQ(p.piece_start, (std::vector<int64_t>{0, 3, 6, 7, 8, 11, 14, 15}));
  EXPECT_EQ(p.piece_dest, (std::vector<int64_t>{-1, -2, -3, 2, 4, -4, -5}));
  EXPECT_EQ(p.long_first, (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(p.long_id, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(p.slots(), 5);
  // Short segments only: no slots, and one piece per id.
  const EmbeddingPieces whole = cut_into_pieces(s, 7);
  EXPECT_EQ(whole.piece_dest, (std::vector<int64_t>{0, 2, 4, 5}));
  EXPECT_EQ(whole.slots(), 0);
  EXPECT_THROW(cut_into_pieces(s, 0), ValueError);
  // No positions: no pieces.
  const EmbeddingPieces none = cut_into_pieces(group_by_id(nullptr, 0, 6));
  EXPECT_EQ(none.piece_start, (std::vector<int64_t>{0}));
  EXPECT_TRUE(none.piece_dest.empty());
}

TEST(EmbeddingOrder, TheCpuGradientAddsTheSumsOfPiecesOfAnId) {
  // One id at 2 * kEmbeddingPiece + 1 positions: 1e8 first, then zeros to
  // the end of the first piece, ones through the second, a zero last. Summed
  // straight through, each 1 is lost against 1e8 (f32's spacing there is 8);
  // summed in pieces, the second piece's 32 ones survive: 1e8 + 32.
  const int64_t piece = detail::kEmbeddingPiece, n = 2 * piece + 1;
  std::vector<float> g(static_cast<size_t>(n), 0.0f);
  g[0] = 1e8f;
  for (int64_t i = piece; i < 2 * piece; ++i) g[static_cast<size_t>(i)] = 1.0f;
  const Tensor dout = from_vector(g, {n, 1});
  const Tensor ids = zeros({n}, DType::I64);
  Tensor w = zeros({2, 1});
  w.set_requires_grad(true);
  autograd::backward({embedding(w, ids)}, {dout});
  const std::vector<float> grad = to_float_vector(w.grad());
  EXPECT_EQ(grad[0], 1e8f + static_cast<float>(piece));
  EXPECT_EQ(grad[1], 0.0f);
}

}  // namespace
}  // namespace triad
