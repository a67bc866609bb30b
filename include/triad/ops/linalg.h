#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "triad/core/tensor.h"

namespace triad {

// a (..., M, K) @ b (K, N) or b (..., K, N) with the same leading dims.
Tensor matmul(const Tensor& a, const Tensor& b);

// y = x @ weight^T + bias. x (..., in); weight (out, in); bias (out) or
// undefined. Supports split backward: the input gradient can be computed now
// and the weight/bias gradients deferred (autograd::BackwardOptions).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// A mixture's experts' linear layers in one op: x (M, in) holds the
// experts' rows one group after another, rows[e] of them for weights[e]
// (out, in), and the result (M, out) holds x_e @ weights[e]^T in the same
// place, each product written where concat would put it (no split of x, no
// concat of the products). Equals concat(linear(split(x, rows)[e],
// weights[e])) in values and gradients; every weight's gradient is
// deferrable (zero-bubble W) as linear's, and a group of no rows gives its
// weight a zero gradient. Throws ShapeError unless the weights share one
// shape, x's last dimension is their `in` and rows (one per weight, each
// >= 0) add up to M.
Tensor grouped_linear(const Tensor& x, const std::vector<Tensor>& weights,
                      const std::vector<int64_t>& rows);
// The same with the groups given where the rows are, not on the host (a
// dropless mixture's experts inside a CUDA graph, whose group sizes the
// host never reads): offsets (E + 1, i64, contiguous, on x's device), the
// rows of weights[e] [offsets[e], offsets[e + 1]), 0 = offsets[0] <= ... <=
// offsets[E] <= M; rows past offsets[E] give zeros and take no gradient.
// Values and gradients as the row counts' version (Backend::
// grouped_gemm_rows and grouped_gemm_sums; a backend that reads the
// offsets refuses them out of order). Throws ShapeError as that version
// does, and for offsets of another shape, dtype or device.
Tensor grouped_linear(const Tensor& x, const std::vector<Tensor>& weights, const Tensor& offsets);

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
// split backward. Where the backend sums pre's gradient in that same call
// (the CUDA backend under GemmSettings::dgelu_bias_grad_epilogue), the first
// layer's bias gradient comes from those sums, not from a pass of its own.
struct LinearGelu {
  Tensor pre;  // the first layer's output, GELU's input
  Tensor act;  // gelu(pre)
};
LinearGelu linear_gelu_parts(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
Tensor linear_after_gelu(const LinearGelu& in, const Tensor& weight, const Tensor& bias = Tensor());

// Communication a layer's input gradient goes through before it leaves the
// layer's node, overlapped with the layer's weight gradient: tensor
// parallelism's all-reduce of a column-parallel layer's input gradient, or
// its reduce-scatter under sequence parallelism (Megatron-LM's asynchronous
// tensor-parallel all-reduce). The layer computes on `x` and returns the
// gradient of `source` (x itself, or what x was all-gathered from).
// start(dx) begins the collective on dx (and may overwrite it); the
// function it returns waits and gives source's gradient. The unsplit
// backward runs the input-gradient GEMM, start, the weight-gradient GEMMs,
// then the wait; a split backward (zero-bubble B) starts and waits at once,
// its weight gradients coming later. An empty start: no communication, x
// is source.
//
// With `regather`, the layer does not keep x for its weight gradient (under
// sequence parallelism x is the all-gather of a shard it would hold t
// times over): regather() begins gathering it again from what the closure
// keeps and returns a function that waits and gives it. The unsplit
// backward starts it before the input-gradient GEMM and waits before
// starting the input gradient's collective (Megatron-LM's order); a
// deferred weight half gathers when it runs.
struct InputGradComm {
  Tensor source;
  std::function<std::function<Tensor()>(const Tensor& dx)> start;
  std::function<std::function<Tensor()>()> regather;
};
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const InputGradComm& comm);
LinearGelu linear_gelu_parts(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const InputGradComm& comm);

}  // namespace triad
