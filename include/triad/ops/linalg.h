#pragma once

#include "triad/core/tensor.h"

namespace triad {

// a (..., M, K) @ b (K, N) or b (..., K, N) with the same leading dims.
Tensor matmul(const Tensor& a, const Tensor& b);

// y = x @ weight^T + bias. x (..., in); weight (out, in); bias (out) or
// undefined. Supports split backward: the input gradient can be computed now
// and the weight/bias gradients deferred (autograd::BackwardOptions).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace triad
