#pragma once

// Autograd nodes that more than one op records (ops/*.cpp only).
#include "triad/core/tensor.h"

namespace triad::detail {

// GELU's node from `x` to `y` = gelu(x); `saved` is x, contiguous, kept for
// the backward (gelu() and linear_gelu() record the same node).
void record_gelu(const Tensor& x, const Tensor& saved, const Tensor& y);

}  // namespace triad::detail
