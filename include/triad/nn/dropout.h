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
// micro-batch's, so that they draw the whole sequences' masks. With `keys`
// the rows are a mixture's assignments of tokens to experts, in any order
// and from any rank: row r is assignment keys[r] (assignment_key), whose
// mask it draws wherever it runs.
// With `calls` (one i64 on the rows' device) the call is `call` plus the
// value there when the kernels run: a CUDA graph captured at `call` draws
// each replay's own masks from the count written before it (keyed rows,
// whose keys the host forms from the call, refuse it).
struct DropoutDraw {
  bool training = false;
  uint64_t seed = 0;
  uint64_t call = 0;
  std::shared_ptr<const SequencePieces> pieces = {};
  Tensor keys = {};  // i64 (rows) on the rows' device
  Tensor calls = {};
};

// The key of token m's (b * T + t of its micro-batch's B x T) j-th of k
// assignments to experts, the micro-batch drawing at `call`: the row it
// would be of every assignment of every micro-batch in one process's order,
// call * (B T k) + m * k + j. An assignment's row of a layer's input draws
// that row of the layer's masks (LinearBase::add_lora).
inline uint64_t assignment_key(uint64_t call, uint64_t tokens, uint64_t top_k, uint64_t token,
                               uint64_t slot) {
  return (call * tokens + token) * top_k + slot;
}

// The stream model.dropout draws at a named site of a layer ("attn.resid"
// of layer 3): one rule for the one-process model and every layout's.
uint64_t site_stream(const char* site, int64_t layer);

// Inverted dropout of x (B, held, C) — or (B * held, C) — holding `pieces`
// of the micro-batch's (B, row_length, C) activation, drawing that whole
// activation's mask at call * B * row_length * C on (seed, stream). Without
// pieces x is the whole activation. ShapeError unless x is whole rows of
// the pieces. With `calls` (DropoutDraw::calls) the call is `call` plus the
// value there.
Tensor sequence_dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t call,
                        const SequencePieces* pieces, const Tensor& calls = {});

}  // namespace triad::nn
