#include "triad/data/fill_in_the_middle.h"

#include <algorithm>
#include <string>
#include <vector>

#include "triad/core/error.h"
#include "triad/core/rng.h"
#include "triad/ops.h"

namespace triad::data {

namespace {

// Rearranges doc[0, n) (one document, no end token in it) by the draws of
// stream `sequence` at `at`, at + 1, at + 2, at + 3.
void rearrange(int64_t* doc, int64_t n, int64_t sequence, uint64_t at, const FimOptions& o) {
  const auto draw = [&](uint64_t k) {
    return static_cast<double>(philox_uniform(o.seed, static_cast<uint64_t>(sequence), at + k));
  };
  if (n == 0 || draw(0) >= o.rate) return;
  // Two cuts, each anywhere in [0, n]: prefix [0, a), middle [a, b),
  // suffix [b, n).
  int64_t a = std::min<int64_t>(n, static_cast<int64_t>(draw(1) * static_cast<double>(n + 1)));
  int64_t b = std::min<int64_t>(n, static_cast<int64_t>(draw(2) * static_cast<double>(n + 1)));
  if (a > b) std::swap(a, b);
  if (n - b <= 3) return;  // the sentinels would take the whole suffix
  const std::vector<int64_t> prefix(doc, doc + a), middle(doc + a, doc + b),
      suffix(doc + b, doc + n - 3);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n));
  if (draw(3) < o.spm_rate) {
    out.push_back(o.prefix_token);
    out.push_back(o.suffix_token);
    out.insert(out.end(), suffix.begin(), suffix.end());
    out.push_back(o.middle_token);
    out.insert(out.end(), prefix.begin(), prefix.end());
    out.insert(out.end(), middle.begin(), middle.end());
  } else {
    out.push_back(o.prefix_token);
    out.insert(out.end(), prefix.begin(), prefix.end());
    out.push_back(o.suffix_token);
    out.insert(out.end(), suffix.begin(), suffix.end());
    out.push_back(o.middle_token);
    out.insert(out.end(), middle.begin(), middle.end());
  }
  std::copy(out.begin(), out.end(), doc);
}

}  // namespace

void fill_in_the_middle(int64_t* tokens, int64_t n, int64_t sequence, const FimOptions& o) {
  if (o.rate <= 0) return;
  // The documents between end tokens (the first and last may be parts of
  // documents the row cuts), each with its own four draws.
  int64_t start = 0;
  uint64_t document = 0;
  for (int64_t i = 0; i <= n; ++i) {
    if (i < n && tokens[i] != o.eod_token) continue;
    rearrange(tokens + start, i - start, sequence, 4 * document++, o);
    start = i + 1;
  }
}

Batch fill_in_the_middle(const Batch& batch, int64_t first, const FimOptions& o) {
  if (o.rate <= 0) return batch;
  const Tensor inputs = contiguous(cast(batch.inputs, DType::I64));
  const Tensor targets = contiguous(cast(batch.targets, DType::I64));
  const int64_t B = inputs.size(0), T = inputs.size(1);
  const int64_t* pi = inputs.data<int64_t>();
  const int64_t* pt = targets.data<int64_t>();
  std::vector<int64_t> in(static_cast<size_t>(B * T)), out(static_cast<size_t>(B * T));
  std::vector<int64_t> row(static_cast<size_t>(T + 1));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      if (pt[b * T + t] == -100) {
        throw ValueError("fill-in-the-middle: sequence " + std::to_string(first + b) +
                         " has a target without loss (-100) at " + std::to_string(t) +
                         "; it rearranges whole documents and needs every token (no loss mask)");
      }
    }
    std::copy(pi + b * T, pi + (b + 1) * T, row.begin());
    row[static_cast<size_t>(T)] = pt[b * T + T - 1];
    fill_in_the_middle(row.data(), T + 1, first + b, o);
    std::copy(row.begin(), row.end() - 1, in.begin() + b * T);
    std::copy(row.begin() + 1, row.end(), out.begin() + b * T);
  }
  Batch r = batch;
  r.inputs = from_vector(in, {B, T}, batch.inputs.dtype());
  r.targets = from_vector(out, {B, T}, batch.targets.dtype());
  return r;
}

}  // namespace triad::data
