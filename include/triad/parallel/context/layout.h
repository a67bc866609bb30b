#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::cp {

// Which tokens of a row of T a context-parallel rank holds. The P ranks
// form `ring` consecutive groups of P / ring ranks; the row is cut into 2
// ring half-chunks and group g holds halves g and 2 ring - 1 - g, in that
// order, cut contiguously over its ranks (rank r is group r / (P / ring)'s
// (r % (P / ring))-th). So:
//  - contiguous (ring 1; the heads' all-to-all): rank r of P holds
//    [r T / P, (r + 1) T / P);
//  - balanced (ring P; the keys' and values' all-gather, Llama 3's, and the
//    ring): rank r holds half-chunks r and 2P - 1 - r, so that under the
//    causal mask every rank's queries see as many keys, (2P + 1) / 2
//    half-chunks each on average;
//  - hierarchical (between; the all-to-all inside each group, the ring
//    across them): each group's two half-chunks, which its all-to-all
//    gathers whole on every rank of the group for a share of the heads.
struct Layout {
  int64_t ranks = 1;  // P
  int64_t ring = 1;   // groups: 1 contiguous, P balanced

  static Layout contiguous(int64_t P) { return {P, 1}; }
  static Layout balanced(int64_t P) { return {P, P}; }
  // All-to-alls over `a2a` consecutive ranks, a ring of P / a2a of them.
  static Layout hierarchical(int64_t P, int64_t a2a) { return {P, P / a2a}; }

  // What a row's length must be a multiple of: P, and 2 ring for the
  // half-chunks when ring > 1.
  int64_t row_multiple() const;
};

// A run of a row: its first token and how many.
using Run = std::pair<int64_t, int64_t>;

// Rank r's runs of a row of T tokens under `layout` (T a multiple of
// layout.row_multiple(); the caller checks and names the numbers), in the
// order the rank holds them: a piece of each half-chunk it holds, even
// where two are adjacent (the balanced layout's middle rank holds two
// runs, as the ring's blocks expect).
std::vector<Run> chunk_runs(int64_t T, int64_t r, const Layout& layout);

// x's runs along dimension dim, side by side (a contiguous copy; one run: a
// narrow view). Differentiable.
Tensor take_runs(const Tensor& x, int64_t dim, const std::vector<Run>& runs);

// Every rank's tokens gathered along dim in rank order (rank j's runs side
// by side, P equal blocks) -> the row in its own order. Differentiable.
Tensor to_sequence_order(const Tensor& gathered, int64_t dim, const Layout& layout);

}  // namespace triad::cp
