#pragma once

// Folding one block's attention into an accumulated one (attention_merge.cu;
// ring attention's steps): out (B, Tq, NH * D) f32 and lse (B, NH, Tq) f32
// over some keys, part (B, Tq, NH * D) of `type` (f32, bf16, f16) and
// part_lse (B, NH, Tq) f32 over others, become the attention over both:
// lse = log(e^lse + e^part_lse), out = (e^(old lse) out + e^part_lse part) /
// e^lse. A part_lse of -inf (no key seen) leaves the row; an lse of -inf
// takes the part's.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

void attention_merge(float* out, float* lse, const void* part, const float* part_lse,
                     ScalarType type, int64_t B, int64_t Tq, int64_t NH, int64_t D,
                     cudaStream_t stream);

}  // namespace triad::kernels
