#pragma once

// Row softmax over the last dimension (softmax.cu): x, y, dy, dx (N, C) in
// f32, bf16 or f16, computed in f32.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

Status check_softmax(ScalarType type, int64_t N, int64_t C);
void softmax_forward(const void* x, void* y, ScalarType type, int64_t N, int64_t C,
                     cudaStream_t stream);
// dx = y * (dy - sum(y * dy)) per row.
void softmax_backward(const void* y, const void* dy, void* dx, ScalarType type, int64_t N,
                      int64_t C, cudaStream_t stream);

}  // namespace triad::kernels
