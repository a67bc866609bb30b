#pragma once

// Soft-capping (soft_cap.cu), Gemma 2's bound on the head's logits and the
// attention's scores: y = cap * tanh(x / cap) for cap > 0, so no |y| exceeds
// cap while small values pass almost unchanged. Computed in f32 for bf16 and
// f16 (f64 in f64).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

// x and y are (rows, cols) matrices whose rows lie `ld` >= cols elements
// apart (the head's padded logits), or contiguous with ld == cols; y may be
// x. Types f32, f64, bf16, f16.
void soft_cap(const void* x, void* y, ScalarType type, int64_t rows, int64_t cols, int64_t ld,
              double cap, cudaStream_t stream);
// dx = dy * (1 - (y / cap)^2), n contiguous elements of each.
void soft_cap_backward(const void* y, const void* dy, void* dx, ScalarType type, int64_t n,
                       double cap, cudaStream_t stream);

}  // namespace triad::kernels
