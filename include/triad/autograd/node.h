#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::detail {
struct FusedBiasSums;  // (ops/op_nodes.h)
}  // namespace triad::detail

namespace triad::autograd {

class Node;

// Where a gradient flows: input `input_nr` of `node`.
struct Edge {
  std::shared_ptr<Node> node;
  int input_nr = 0;
  bool valid() const { return node != nullptr; }
};

// Shape and dtype of one output, so the engine can materialise zeros for an
// output whose gradient never arrived.
struct OutputMeta {
  Shape shape;
  DType dtype = DType::F32;
  Device device;
};

using TensorList = std::vector<Tensor>;
// Maps the gradients of a node's outputs to the gradients of its inputs
// (an undefined Tensor for an input that needs none).
using BackwardFn = std::function<TensorList(const TensorList& grad_outputs)>;

// One recorded operation of the dynamic tape. `next_edges[i]` is where the
// gradient for input i goes.
class Node {
 public:
  virtual ~Node() = default;
  virtual std::string name() const = 0;
  virtual TensorList apply(const TensorList& grad_outputs) = 0;
  // Drops tensors saved for backward (after the node ran, unless retained).
  virtual void release_saved() {}
  // Split backward (zero-bubble B/W): inputs whose gradient this node can
  // compute later, separately from the others.
  virtual std::vector<int> deferrable_inputs() const { return {}; }
  // Computes gradients of the non-deferrable inputs now (deferrable ones are
  // left undefined) and returns a function that computes the deferrable ones.
  virtual TensorList apply_split(const TensorList& grad_outputs, BackwardFn& deferred);
  virtual bool is_accumulate_grad() const { return false; }

  std::vector<Edge> next_edges;
  std::vector<OutputMeta> outputs;
  // A linear layer with a bias to train (ops/linalg.cpp): where the op that
  // consumes its output may leave the column sums of that output's
  // gradient, made in its own backward pass, for this node's backward to
  // take as the bias's gradient. Null for every other node.
  std::shared_ptr<detail::FusedBiasSums> output_grad_sums;
};

// A node backed by closures: `backward` computes every input gradient;
// optionally `deferrable` lists inputs that `backward_input` skips and
// `backward_weight` computes (used by linear/matmul layers). Saved tensors
// live in the closures' captures and are freed by release_saved().
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}
  std::string name() const override { return name_; }
  TensorList apply(const TensorList& grad_outputs) override;
  void release_saved() override;
  std::vector<int> deferrable_inputs() const override { return deferrable_; }
  TensorList apply_split(const TensorList& grad_outputs, BackwardFn& deferred) override;

  // backward_input returns grads for all inputs with deferrable ones
  // undefined; backward_weight returns grads for all inputs with only the
  // deferrable ones defined. An unsplit backward given to record() stays
  // what apply() runs (it may interleave the two halves, say to overlap
  // communication of the input gradients with the weight half); without
  // one, apply() runs backward_input, then backward_weight.
  void set_split(std::vector<int> deferrable, BackwardFn backward_input,
                 BackwardFn backward_weight);

 private:
  std::string name_;
  BackwardFn backward_;
  std::vector<int> deferrable_;
  BackwardFn backward_input_;
  BackwardFn backward_weight_;
};

// Sink for a leaf tensor: adds the incoming gradient into leaf.grad and runs
// the leaf's post-accumulate ("gradient ready") hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::string name() const override { return "AccumulateGrad"; }
  TensorList apply(const TensorList& grad_outputs) override;
  bool is_accumulate_grad() const override { return true; }
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// For a backward function that can add its gradient for the leaf `t` into
// t's gradient buffer itself (a GEMM with beta 1) instead of returning it:
// runs add(grad, beta), which must leave grad = beta * grad + (the
// gradient), with beta 0 when the buffer was just created (then it holds
// garbage) and 1 otherwise, then t's post-accumulate hooks, as
// AccumulateGrad does; the caller returns no gradient for t. Returns false,
// doing nothing, unless t is a leaf that requires grad and its buffer (if
// any) is contiguous, of t's shape, device and gradient dtype (f32 for
// bf16/f16 leaves). Mixed-precision weights take their f32 gradients
// straight from the weight-gradient GEMM this way (Megatron's
// gradient-accumulation fusion): no half-precision temporary, no separate
// add, and no rounding of each micro-batch's gradient to bf16.
bool accumulate_into_leaf_grad(const Tensor& t,
                               const std::function<void(Tensor& grad, double beta)>& add);
// The same for several leaves whose gradients one kernel produces together
// (a LayerNorm's weight and bias): all or none. One beta for all: when
// some buffers exist and others are new, the new ones are zeroed and beta
// is 1. Hooks run in the leaves' order.
bool accumulate_into_leaf_grads(
    const std::vector<Tensor>& leaves,
    const std::function<void(std::vector<Tensor>& grads, double beta)>& add);

// The edge a gradient for `t` must flow into (its producer, or its leaf
// accumulator), or an invalid edge if `t` does not require grad.
Edge gradient_edge(const Tensor& t);

// True when grad mode is on and any input requires grad.
bool any_requires_grad(const TensorList& inputs);

// Records an op on the tape: a FunctionNode with edges to `inputs` becomes the
// grad_fn of every output (outputs then require grad). Returns the node so a
// caller can configure split backward. Returns null when nothing needs grad.
// Capture only detached tensors in `backward` (no reference cycles).
std::shared_ptr<FunctionNode> record(const std::string& name, const TensorList& inputs,
                                     const TensorList& outputs, BackwardFn backward);

}  // namespace triad::autograd
