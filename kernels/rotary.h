#pragma once

// Rotary position embedding (rotary.cu): the q and k parts of a fused
// (B, T, (n_head + 2 * n_kv_head) * D) qkv turned by their tokens'
// positions, v copied. Pointers are
// device pointers; the launcher takes the stream it runs on.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"
#include "triad/core/rope_scaling.h"

namespace triad::kernels {

// out = qkv with, in each of the n_head + n_kv_head heads of q and k (head
// dim D, even), elements i and i + R/2 turned by
// sign * position * rope_frequency(i, D, theta, scaling) (theta^(-2i/R)
// unscaled), sign -1 when `inverse` (the backward pass), R the dimensions
// that turn (scaling.turned(D): the head's, or its first rotary_dim) and
// the head's others copied. Token (b, t)'s position is positions[b * T + t] (i64) or, with
// positions null, start + t. cos and sin are taken in f64 and rounded to
// the compute type (f32 for bf16/f16), as the CPU backend does. f32, f64,
// bf16, f16; qkv and out contiguous and distinct.
void rotary_embedding(const void* qkv, void* out, ScalarType type, int64_t B, int64_t T,
                      int64_t n_head, int64_t n_kv_head, int64_t head_dim, const int64_t* positions,
                      int64_t start, double theta, const RopeScaling& scaling, bool inverse,
                      cudaStream_t stream);
Status check_rotary_embedding(int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head,
                              int64_t head_dim, double theta, int64_t start);

}  // namespace triad::kernels
