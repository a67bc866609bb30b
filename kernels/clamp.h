#pragma once

// Clamping (clamp.cu), OLMo's clip_qkv: y = min(max(x, lo), hi), and its
// backward, which passes dy where lo <= x <= hi (the bounds included, as
// PyTorch's clamp) and 0 elsewhere. Elementwise over n contiguous elements;
// f32, f64, bf16 and f16 (halves compared in f32, which holds them exactly).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

// y may be x. Needs lo <= hi, both finite.
void clamp(const void* x, void* y, ScalarType type, int64_t n, double lo, double hi,
           cudaStream_t stream);
// dx = dy where lo <= x <= hi, else 0.
void clamp_backward(const void* x, const void* dy, void* dx, ScalarType type, int64_t n, double lo,
                    double hi, cudaStream_t stream);

}  // namespace triad::kernels
