#pragma once

#include "triad/core/tensor.h"

namespace triad {

// a (..., M, K) @ b (K, N) or b (..., K, N) with the same leading dims.
Tensor matmul(const Tensor& a, const Tensor& b);

// y = x @ weight^T + bias. x (..., in); weight (out, in); bias (out) or
// undefined. Supports split backward: the input gradient can be computed now
// and the weight/bias gradients deferred (autograd::BackwardOptions).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// gelu(linear(x, weight, bias)) in one backend call (on CUDA, a cuBLASLt
// GEMM with a bias-and-GELU epilogue instead of three passes). Same values,
// the same two autograd nodes (linear with its split backward, then gelu)
// and the same saved tensors as the unfused pair.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace triad
