#include "triad/nn/dropout.h"

#include <string>

#include "triad/core/philox.h"
#include "triad/core/rng.h"
#include "triad/ops.h"

namespace triad::nn {

uint64_t site_stream(const char* site, int64_t layer) {
  return stable_hash(std::string(site) + "." + std::to_string(layer));
}

int64_t SequencePieces::held() const {
  int64_t n = 0;
  for (const auto& run : runs) n += run.second;
  return n;
}

SequencePieces SequencePieces::slice(int64_t first, int64_t count) const {
  const int64_t total = held();
  if (first < 0 || count < 0 || first + count > total) {
    throw ShapeError("SequencePieces: tokens [" + std::to_string(first) + ", " +
                     std::to_string(first + count) + ") of the " + std::to_string(total) + " held");
  }
  SequencePieces out{row_length, {}};
  int64_t at = 0;  // the held tokens before each run
  for (const auto& [start, n] : runs) {
    const int64_t lo = std::max(first, at), hi = std::min(first + count, at + n);
    if (lo < hi) out.runs.emplace_back(start + (lo - at), hi - lo);
    at += n;
  }
  return out;
}

Tensor sequence_dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t call,
                        const SequencePieces* pieces, const Tensor& calls) {
  if (!pieces) {
    const auto n = static_cast<uint64_t>(x.numel());
    return dropout(x, p, seed, stream, philox::Counters{call * n, 0, 0, n}, Tensor{}, calls);
  }
  const int64_t held = pieces->held();
  if (x.dim() < 1) throw ShapeError("dropout: a scalar is not rows of a sequence's tokens");
  const int64_t features = x.size(-1), rows = features > 0 ? x.numel() / features : 0;
  if (held <= 0 || held > pieces->row_length || rows % held != 0) {
    throw ShapeError("dropout: an input " + shape_str(x.shape()) + " is not whole rows of the " +
                     std::to_string(held) + " tokens held of each sequence of " +
                     std::to_string(pieces->row_length));
  }
  if (p == 0.0) return x;
  const auto B = static_cast<uint64_t>(rows / held), T = static_cast<uint64_t>(pieces->row_length);
  const auto C = static_cast<uint64_t>(features);
  const uint64_t base = call * B * T * C;
  const Tensor whole = reshape(x, {static_cast<int64_t>(B), held, features});
  std::vector<int64_t> counts;
  for (const auto& run : pieces->runs) counts.push_back(run.second);
  std::vector<Tensor> parts = split(whole, counts, 1);
  for (size_t r = 0; r < parts.size(); ++r) {
    // Element (b, j, c) is whole element (b * T + first + j) * C + c: rows
    // of count tokens' features, one a sequence, T * C draws apart.
    const auto [first, count] = pieces->runs[r];
    parts[r] = dropout(parts[r], p, seed, stream,
                       philox::Counters{base + static_cast<uint64_t>(first) * C,
                                        static_cast<uint64_t>(count) * C, T * C, B * T * C},
                       Tensor{}, calls);
  }
  return reshape(parts.size() == 1 ? parts[0] : concat(parts, 1), x.shape());
}

}  // namespace triad::nn
