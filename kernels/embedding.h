#pragma once

// Token embedding (embedding.cu): weight (V, C), ids (N) i32/i64, out (N, C).
// The backward is deterministic without float atomics: the caller groups
// token positions by id (stable, so in token order) and cuts each id's into
// pieces; one thread per (piece, column) sums its rows in that fixed order,
// and a second launch adds a long segment's pieces in order: the CPU
// reference's order (src/backend/embedding_order.h).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

Status check_embedding(ScalarType type, int64_t V, int64_t C, int64_t N);
// Ids must already be known to lie in [0, V).
void embedding_forward(const void* weight, ScalarType type, const void* ids, bool ids64, int64_t V,
                       int64_t C, int64_t N, void* out, cudaStream_t stream);

// The backward's work (src/backend/embedding_order.h, as device arrays):
// piece p sums dout's rows order[piece_start[p], piece_start[p+1]) in order,
// into row piece_dest[p] of dweight (>= 0) or into slot -1 - piece_dest[p]
// of `partials` (f32, slots x C, 16-byte aligned); long segment l then adds
// its slots [long_first[l], long_first[l+1]) in order into row long_id[l].
struct EmbeddingPlan {
  const int64_t* order = nullptr;
  const int64_t* piece_start = nullptr;
  const int64_t* piece_dest = nullptr;
  int64_t pieces = 0;
  const int64_t* long_first = nullptr;
  const int64_t* long_id = nullptr;
  int64_t longs = 0;
  float* partials = nullptr;  // needed when longs > 0
};

// dweight (V, C) is overwritten, or with `accumulate` added to in the rows
// the pieces reach (and not written elsewhere). dweight is of the tensor
// type, or f32 with f32_grad (a half weight's f32 gradient).
void embedding_backward(const EmbeddingPlan& plan, const void* dout, ScalarType type, int64_t V,
                        int64_t C, void* dweight, cudaStream_t stream, bool f32_grad = false,
                        bool accumulate = false);

}  // namespace triad::kernels
