#pragma once

// Token embedding (embedding.cu): weight (V, C), ids (N) i32/i64, out (N, C).
// The backward is deterministic without float atomics: the caller groups
// token positions by id (stable, so in token order) into segments, and one
// thread per (segment, column) sums its rows in that fixed order, the same
// order as the CPU reference.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "common.h"

namespace triad::kernels {

Status check_embedding(ScalarType type, int64_t V, int64_t C, int64_t N);
// Ids must already be known to lie in [0, V).
void embedding_forward(const void* weight, ScalarType type, const void* ids, bool ids64, int64_t V,
                       int64_t C, int64_t N, void* out, cudaStream_t stream);

// Positions grouped by id: segment s covers order[seg_start[s], seg_start[s+1])
// and belongs to row seg_id[s]. Built on the host from the ids.
struct EmbeddingSegments {
  std::vector<int64_t> order;      // (N) positions, stable-sorted by id
  std::vector<int64_t> seg_start;  // (U + 1)
  std::vector<int64_t> seg_id;     // (U)
};
// Throws std::invalid_argument naming the first id outside [0, V).
EmbeddingSegments group_by_id(const int64_t* ids, int64_t N, int64_t V);

// dweight (V, C) is overwritten, or with `accumulate` added to in the rows
// the segments touch (and not written elsewhere). dweight is of the tensor
// type, or f32 with f32_grad (a half weight's f32 gradient). `segments`
// points to device copies of the three arrays of an EmbeddingSegments
// (order, seg_start, seg_id).
void embedding_backward(const int64_t* order, const int64_t* seg_start, const int64_t* seg_id,
                        int64_t num_segments, const void* dout, ScalarType type, int64_t V,
                        int64_t C, void* dweight, cudaStream_t stream, bool f32_grad = false,
                        bool accumulate = false);

}  // namespace triad::kernels
