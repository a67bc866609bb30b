#pragma once

// The embedding backward's order of accumulation, the same on every backend
// (so that a GPU's f32 gradient equals the CPU reference's bit for bit).
//
// An id's positions are taken in token order and cut into pieces of at most
// kEmbeddingPiece positions. Each piece is summed in order from zero; the
// pieces' sums are then added in order, from zero. An id that appears at
// most kEmbeddingPiece times is one piece: a plain sum in token order.
//
// Pieces bound the work of one sum: in real text the commonest tokens take a
// few percent of a batch (hundreds of a 16384-token batch's positions), and
// a GPU sums an id's pieces side by side instead of walking them one after
// another.
#include <cstdint>
#include <vector>

namespace triad::detail {

inline constexpr int64_t kEmbeddingPiece = 32;

// Positions grouped by id: segment s covers order[seg_start[s], seg_start[s+1])
// and belongs to row seg_id[s] (ids ascending, each once).
struct EmbeddingSegments {
  std::vector<int64_t> order;      // (N) positions, stable-sorted by id
  std::vector<int64_t> seg_start;  // (U + 1)
  std::vector<int64_t> seg_id;     // (U)
};
// Throws ValueError naming the first id outside [0, V).
EmbeddingSegments group_by_id(const int64_t* ids, int64_t N, int64_t V);

// The segments cut into pieces, as a GPU sums them. Piece p covers
// order[piece_start[p], piece_start[p+1]). A whole segment's one piece goes
// straight to its row (piece_dest[p] = the row, >= 0); a longer segment's
// pieces go to consecutive slots of a scratch of partial sums
// (piece_dest[p] = -1 - slot), and long segment l adds its slots
// [long_first[l], long_first[l+1]) in order into row long_id[l].
struct EmbeddingPieces {
  std::vector<int64_t> piece_start;  // (P + 1)
  std::vector<int64_t> piece_dest;   // (P)
  std::vector<int64_t> long_first;   // (L + 1)
  std::vector<int64_t> long_id;      // (L)
  int64_t slots() const { return long_first.back(); }
};
EmbeddingPieces cut_into_pieces(const EmbeddingSegments& s, int64_t piece = kEmbeddingPiece);

}  // namespace triad::detail
