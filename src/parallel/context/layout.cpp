#include "triad/parallel/context/layout.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <tuple>

#include "triad/core/error.h"
#include "triad/ops.h"

namespace triad::cp {

int64_t Layout::row_multiple() const {
  return ring > 1 ? std::lcm(ranks, 2 * ring) : ranks;
}

std::vector<Run> chunk_runs(int64_t T, int64_t r, const Layout& layout) {
  const int64_t P = layout.ranks, ring = layout.ring;
  if (P < 1 || ring < 1 || P % ring != 0 || r < 0 || r >= P) {
    throw ValueError("context parallelism: rank " + std::to_string(r) + " of " + std::to_string(P) +
                     " in " + std::to_string(ring) +
                     " ring groups (the groups must divide the ranks)");
  }
  const int64_t per_group = P / ring, g = r / per_group, i = r % per_group;
  // The group's runs, then this rank's contiguous share of them.
  std::vector<Run> group;
  if (ring == 1) {
    group = {{0, T}};
  } else {
    const int64_t half = T / (2 * ring);
    group = {{g * half, half}, {(2 * ring - 1 - g) * half, half}};
  }
  const int64_t share = T / P;
  int64_t skip = i * share, left = share;
  std::vector<Run> out;
  for (const auto& [first, count] : group) {
    if (left == 0) break;
    if (skip >= count) {
      skip -= count;
      continue;
    }
    const int64_t take = std::min(count - skip, left);
    out.emplace_back(first + skip, take);
    left -= take;
    skip = 0;
  }
  return out;
}

Tensor take_runs(const Tensor& x, int64_t dim, const std::vector<Run>& runs) {
  if (runs.size() == 1) return narrow(x, dim, runs[0].first, runs[0].second);
  std::vector<Tensor> parts;
  parts.reserve(runs.size());
  for (const auto& [first, count] : runs) parts.push_back(narrow(x, dim, first, count));
  return concat(parts, dim);
}

Tensor to_sequence_order(const Tensor& gathered, int64_t dim, const Layout& layout) {
  if (layout.ring == 1 || layout.ranks == 1) return gathered;
  const int64_t d = dim < 0 ? dim + gathered.dim() : dim;
  const int64_t T = gathered.size(d);
  if (T % layout.row_multiple() != 0) {
    throw ShapeError("context parallelism: " + std::to_string(T) +
                     " gathered tokens do not cut into " + std::to_string(layout.ranks) +
                     " ranks' runs of " + std::to_string(2 * layout.ring) + " half-chunks");
  }
  // Every run: (its first position in the row, where it lies gathered, its
  // length), in the row's order.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> pieces;
  for (int64_t j = 0; j < layout.ranks; ++j) {
    int64_t at = j * (T / layout.ranks);
    for (const auto& [first, count] : chunk_runs(T, j, layout)) {
      pieces.emplace_back(first, at, count);
      at += count;
    }
  }
  std::sort(pieces.begin(), pieces.end());
  std::vector<Tensor> parts;
  parts.reserve(pieces.size());
  for (const auto& [first, at, count] : pieces) parts.push_back(narrow(gathered, d, at, count));
  return concat(parts, d);
}

}  // namespace triad::cp
