#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::nn {

// Where dropout masks are drawn, so that every layout draws one process's.
// A micro-batch's (B, T, C) activation at a site takes draws call * BTC + i
// of the site's stream (element i flat, row-major); a rank holding pieces of
// the sequences (context parallelism's chunks, sequence parallelism's
// slices of them) draws those pieces' elements of that whole mask.

// The tokens a rank holds of each sequence: runs (first token, count) of
// every row of `row_length` tokens, in the order the rank holds them.
struct SequencePieces {
  int64_t row_length = 0;
  std::vector<std::pair<int64_t, int64_t>> runs;
  // The tokens held in all (the runs' counts summed).
  int64_t held() const;
  // Held tokens [first, first + count) of these, as pieces of the rows
  // (a sequence-parallel rank's slice of a context-parallel chunk).
  SequencePieces slice(int64_t first, int64_t count) const;
};

// Where a forward pass draws its dropout masks (nn::ForwardContext's seed
// and call); none when not training. With `pieces`, a layer's input rows
// are those pieces of the micro-batch's sequences and `call` is the whole
// micro-batch's, so that they draw the whole sequences' masks.
struct DropoutDraw {
  bool training = false;
  uint64_t seed = 0;
  uint64_t call = 0;
  std::shared_ptr<const SequencePieces> pieces = {};
};

// The stream model.dropout draws at a named site of a layer ("attn.resid"
// of layer 3): one rule for the one-process model and every layout's.
uint64_t site_stream(const char* site, int64_t layer);

// Inverted dropout of x (B, held, C) — or (B * held, C) — holding `pieces`
// of the micro-batch's (B, row_length, C) activation, drawing that whole
// activation's mask at call * B * row_length * C on (seed, stream). Without
// pieces x is the whole activation. ShapeError unless x is whole rows of
// the pieces.
Tensor sequence_dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t call,
                        const SequencePieces* pieces);

}  // namespace triad::nn
