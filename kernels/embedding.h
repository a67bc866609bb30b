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
// Ids are checked on the host first where they can be. The kernel reads no
// row for an id outside [0, V): it writes zeros there and, with `bad`,
// lowers *bad to that position (atomicMin; the caller sets the word to all
// ones first and reads it after: a CUDA graph's check, which cannot wait
// for the device mid-capture).
void embedding_forward(const void* weight, ScalarType type, const void* ids, bool ids64, int64_t V,
                       int64_t C, int64_t N, void* out, cudaStream_t stream,
                       unsigned long long* bad = nullptr);

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
  // A plan built on the device (embedding_plan_on_device): the actual
  // counts of pieces and long segments, device memory, read by the kernels;
  // `pieces` and `longs` are then their upper bounds (the grids).
  const int64_t* counts = nullptr;
};

// The plan built on the device from device ids, in the same order as the
// host's (src/backend/embedding_order.h, so the same bits): a stable sort
// of (id, position) keys, then the pieces cut by one block. No host work
// and no wait, which is what a CUDA graph's capture needs (the grids are
// sized for the most pieces N ids can make). `workspace` holds
// embedding_device_plan_bytes(N) bytes; `partials` the f32 scratch of
// embedding_device_plan_slots(N) x C (16-byte aligned; may be null when
// that is 0). Ids outside [0, V) join no piece and lower *bad to their
// position, as embedding_forward's do. N >= 1.
size_t embedding_device_plan_bytes(int64_t N);
int64_t embedding_device_plan_slots(int64_t N);
EmbeddingPlan embedding_plan_on_device(const void* ids, bool ids64, int64_t N, int64_t V,
                                       void* workspace, float* partials, unsigned long long* bad,
                                       cudaStream_t stream);

// dweight (V, C) is overwritten, or with `accumulate` added to in the rows
// the pieces reach (and not written elsewhere). dweight is of the tensor
// type, or f32 with f32_grad (a half weight's f32 gradient).
void embedding_backward(const EmbeddingPlan& plan, const void* dout, ScalarType type, int64_t V,
                        int64_t C, void* dweight, cudaStream_t stream, bool f32_grad = false,
                        bool accumulate = false);

// A vocabulary-parallel lookup's ids (VocabParallelEmbedding, this rank's
// shard of rows [start, start + valid)): local[i] = ids[i] - start for an id
// in the shard, else 0, and keep[i] 1 there, else 0 (of keep_type: f32,
// bf16 or f16), for N ids. An id outside [0, vocab) lowers *bad to its
// position (when given; a CUDA graph's check). What a CUDA graph's capture
// needs, where the ids cannot be read on the host.
void vocab_shard_ids(const void* ids, bool ids64, int64_t N, int64_t start, int64_t valid,
                     int64_t vocab, int64_t* local, void* keep, ScalarType keep_type,
                     unsigned long long* bad, cudaStream_t stream);

}  // namespace triad::kernels
