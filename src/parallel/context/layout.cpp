#include "triad/parallel/context/layout.h"

#include "triad/core/error.h"
#include "triad/ops.h"

namespace triad::cp {

std::vector<Run> chunk_runs(int64_t T, int64_t r, int64_t P, bool balanced) {
  if (!balanced) return {{r * (T / P), T / P}};
  const int64_t half = T / (2 * P);
  return {{r * half, half}, {(2 * P - 1 - r) * half, half}};
}

Tensor take_runs(const Tensor& x, int64_t dim, const std::vector<Run>& runs) {
  if (runs.size() == 1) return narrow(x, dim, runs[0].first, runs[0].second);
  std::vector<Tensor> parts;
  parts.reserve(runs.size());
  for (const auto& [first, count] : runs) parts.push_back(narrow(x, dim, first, count));
  return concat(parts, dim);
}

Tensor to_sequence_order(const Tensor& gathered, int64_t dim, int64_t P, bool balanced) {
  if (!balanced || P == 1) return gathered;
  const int64_t d = dim < 0 ? dim + gathered.dim() : dim;
  const int64_t T = gathered.size(d);
  if (T % (2 * P) != 0) {
    throw ShapeError("context parallelism: " + std::to_string(T) +
                     " gathered tokens do not cut into " + std::to_string(2 * P) +
                     " half-chunks (two a rank)");
  }
  const int64_t half = T / (2 * P);
  // Half-chunk i of the row: rank i's first (i < P), else rank 2P - 1 - i's
  // second.
  std::vector<Tensor> parts;
  parts.reserve(static_cast<size_t>(2 * P));
  for (int64_t i = 0; i < 2 * P; ++i) {
    const int64_t j = i < P ? i : 2 * P - 1 - i;
    parts.push_back(narrow(gathered, d, (2 * j + (i < P ? 0 : 1)) * half, half));
  }
  return concat(parts, d);
}

}  // namespace triad::cp
