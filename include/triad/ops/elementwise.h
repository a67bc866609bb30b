#pragma once

#include <cstdint>

#include "triad/core/philox.h"
#include "triad/core/tensor.h"

namespace triad {

// Broadcasting arithmetic (NumPy rules), differentiable.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
// alpha * x + beta.
Tensor affine(const Tensor& x, double alpha, double beta = 0.0);
inline Tensor scale(const Tensor& x, double alpha) {
  return affine(x, alpha, 0.0);
}

// GELU with the tanh approximation (GPT-2's; Hugging Face's gelu_new).
Tensor gelu(const Tensor& x);
// GELU exactly, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (GPT-NeoX's and
// BERT's; Hugging Face's "gelu").
Tensor gelu_erf(const Tensor& x);
// SwiGLU (Shazeer 2020; LLaMA's MLP): x (..., 2F) = [a | b] -> (..., F) =
// silu(a) * b, silu(a) = a * sigmoid(a). The last dimension must be even.
Tensor swiglu(const Tensor& x);
// GeGLU (Shazeer 2020; Gemma's and T5 v1.1's MLP): the same with GELU's
// tanh approximation on the gate half, gelu(a) * b.
Tensor geglu(const Tensor& x);

// Inverted dropout: keeps element i when philox_uniform(seed, stream,
// offset + i) >= p and scales kept values by 1/(1-p). Identity when p == 0.
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset);
// The same with element i (flat, row-major) drawing at.at(i): rows of
// at.row_length draws, at.row_stride apart (philox::Counters), so that x may
// be a piece of a larger tensor and take that tensor's mask. The rows must
// divide x's elements and, when there are several, not overlap.
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream,
               const philox::Counters& at);
// The same with rows in any order: row r of x's rows of at.row_length
// elements (at least that many draws apart) draws as row keys[r] of a larger
// tensor would, element c at.keyed(keys[r], c) — a mixture's experts' rows,
// each an assignment of the micro-batch's tokens, drawing that assignment's
// mask. keys: i64 (rows) on x's device, non-negative (checked on the CPU).
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream,
               const philox::Counters& at, const Tensor& keys);
// The same with the call count in memory: `calls` (one i64 on x's device, or
// undefined for none) moves every draw by its value times at.per_call
// (philox::Counters::after_calls), read where the kernel runs. Inside a CUDA
// graph's capture dropout needs it: the value written before each replay
// then picks that replay's mask, where counters alone would draw the
// capture's at every replay (NotSupportedError without one, unless the
// rows are keyed: keys read from device memory, formed there with each
// replay's call in them).
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream,
               const philox::Counters& at, const Tensor& keys, const Tensor& calls);

// Differentiable dtype conversion; the gradient is converted back.
Tensor cast(const Tensor& x, DType dtype);
// A contiguous tensor with x's values (x itself when already contiguous).
Tensor contiguous(const Tensor& x);
// A copy with its own storage (differentiable).
Tensor clone(const Tensor& x);
// Copies to another device (differentiable).
Tensor to_device(const Tensor& x, Device device);

// In-place updates outside autograd (optimizers, gradient buffers).
void copy_(Tensor& dst, const Tensor& src);
void fill_(Tensor& dst, double value);
void add_(Tensor& dst, const Tensor& src);  // dst += src
void scale_(Tensor& dst, double alpha);     // dst *= alpha

}  // namespace triad
