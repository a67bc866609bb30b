#pragma once

#include <cstdint>

#include "triad/core/tensor.h"
#include "triad/dist/process_group.h"
#include "triad/ops/linalg.h"

namespace triad::tp {

// The conjugate communication operators of Megatron-style tensor
// parallelism, as differentiable ops over a tensor-parallel group. The
// sequence dimension of (B, T, C) activations is dim 1.

// f: identity forward, all-reduce of the gradient backward (enters a TP region).
Tensor copy_to_region(const Tensor& x, const dist::ProcessGroupPtr& group);
// g: all-reduce forward, identity backward (leaves a TP region).
Tensor reduce_from_region(const Tensor& x, const dist::ProcessGroupPtr& group);
// This rank's slice of the last dimension forward; all-gather backward.
Tensor scatter_to_region(const Tensor& x, const dist::ProcessGroupPtr& group);
// All-gather of the last dimension forward; this rank's slice backward.
Tensor gather_from_region(const Tensor& x, const dist::ProcessGroupPtr& group);
// Sequence parallelism: all-gather along the sequence forward, reduce-scatter
// of the gradient backward (before a column-parallel layer).
Tensor gather_from_sequence_region(const Tensor& x, const dist::ProcessGroupPtr& group);
// All-gather along the sequence forward, this rank's slice of the gradient
// backward: for a tensor that every rank then uses alike, so that its
// gradient is whole and the same on each (an MoE router's probabilities
// under sequence parallelism, taken on each rank's tokens).
Tensor gather_from_sequence_region_replicated(const Tensor& x, const dist::ProcessGroupPtr& group);
// Reduce-scatter along the sequence forward, all-gather backward (after a
// row-parallel layer).
Tensor reduce_scatter_to_sequence_region(const Tensor& x, const dist::ProcessGroupPtr& group);
// This rank's slice of the sequence forward, all-gather backward (enter SP
// without communication, e.g. from a replicated tensor).
Tensor scatter_to_sequence_region(const Tensor& x, const dist::ProcessGroupPtr& group);

// A column-parallel layer's way into a TP region inside its own autograd
// node (copy_to_region or gather_from_sequence_region fused into the
// layer): `input` is what the layer computes on (x, or x all-gathered along
// the sequence with sequence parallelism) and `comm` takes the gradient
// back to x (all-reduce, or reduce-scatter along the sequence) while the
// layer computes its weight gradient. With sequence parallelism the layer
// keeps x's shard for that, not the gathered input: backward gathers it
// again during the input-gradient GEMM. A group of one: x, no comm.
struct RegionInput {
  Tensor input;
  InputGradComm comm;
};
RegionInput enter_region(const Tensor& x, const dist::ProcessGroupPtr& group,
                         bool sequence_parallel);

// Non-differentiable building blocks (exposed for tests and the layers).
Tensor all_gather_along(const Tensor& x, int64_t dim, const dist::ProcessGroupPtr& group);
Tensor reduce_scatter_along(const Tensor& x, int64_t dim, const dist::ProcessGroupPtr& group);
Tensor slice_along(const Tensor& x, int64_t dim, const dist::ProcessGroupPtr& group);

}  // namespace triad::tp
