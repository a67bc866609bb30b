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

// An MLP's two layers with the GELU between them fused on both sides:
// linear_gelu_parts gives linear_gelu's output and the pre-activation, and
// linear_after_gelu(parts, w2, b2) = linear(parts.act, w2, b2) whose input
// gradient goes straight to parts.pre with GELU's derivative applied in the
// same backend call (on CUDA, cuBLASLt's DGELU epilogue), so GELU's own
// backward pass disappears. parts.act must feed nothing else. Values and
// gradients equal linear(gelu(linear(...))); the second layer keeps the
// split backward.
struct LinearGelu {
  Tensor pre;  // the first layer's output, GELU's input
  Tensor act;  // gelu(pre)
};
LinearGelu linear_gelu_parts(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
Tensor linear_after_gelu(const LinearGelu& in, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace triad
