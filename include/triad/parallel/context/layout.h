#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::cp {

// Which tokens of a row of T a context-parallel rank holds. Contiguous (the
// heads' all-to-all): rank r of P holds [r T / P, (r + 1) T / P). Balanced
// (the keys' and values' all-gather, Llama 3's): the row is cut into 2P
// halves-of-a-chunk and rank r holds halves r and 2P - 1 - r, in that
// order, so that under the causal mask every rank's queries see as many
// keys: (2P + 1) / 2 half-chunks each on average.

// A run of a row: its first token and how many.
using Run = std::pair<int64_t, int64_t>;

// Rank r's runs of a row of T tokens (T divisible by P, by 2P balanced;
// the caller checks and names the numbers).
std::vector<Run> chunk_runs(int64_t T, int64_t r, int64_t P, bool balanced);

// x's runs along dimension dim, side by side (a contiguous copy; one run: a
// narrow view). Differentiable.
Tensor take_runs(const Tensor& x, int64_t dim, const std::vector<Run>& runs);

// Every rank's tokens gathered along dim in rank order (rank j's runs side
// by side, P equal blocks) -> the row in its own order. Differentiable.
Tensor to_sequence_order(const Tensor& gathered, int64_t dim, int64_t P, bool balanced);

}  // namespace triad::cp
