#include "triad/autograd/node.h"

#include "triad/autograd/grad_mode.h"
#include "triad/backend/backend.h"

namespace triad::autograd {

TensorList Node::apply_split(const TensorList& grad_outputs, BackwardFn& deferred) {
  deferred = nullptr;
  return apply(grad_outputs);
}

TensorList FunctionNode::apply(const TensorList& grad_outputs) {
  if (backward_) return backward_(grad_outputs);
  if (backward_input_ && backward_weight_) {
    TensorList grads = backward_input_(grad_outputs);
    TensorList weight_grads = backward_weight_(grad_outputs);
    for (int i : deferrable_) grads[i] = weight_grads[i];
    return grads;
  }
  throw Error("backward through '" + name_ +
              "' a second time: its saved tensors were freed (use retain_graph)");
}

TensorList FunctionNode::apply_split(const TensorList& grad_outputs, BackwardFn& deferred) {
  if (!backward_input_ || !backward_weight_) {
    throw Error("split backward through '" + name_ + "' after its saved tensors were freed");
  }
  deferred = backward_weight_;
  return backward_input_(grad_outputs);
}

void FunctionNode::release_saved() {
  backward_ = nullptr;
  backward_input_ = nullptr;
  backward_weight_ = nullptr;
}

void FunctionNode::set_split(std::vector<int> deferrable, BackwardFn backward_input,
                             BackwardFn backward_weight) {
  deferrable_ = std::move(deferrable);
  backward_input_ = std::move(backward_input);
  backward_weight_ = std::move(backward_weight);
}

TensorList AccumulateGrad::apply(const TensorList& grad_outputs) {
  const Tensor& g = grad_outputs.at(0);
  if (!g.defined()) return {};
  NoGradGuard no_grad;
  Tensor param(leaf_);
  if (g.shape() != param.shape()) {
    throw ShapeError("gradient of shape " + shape_str(g.shape()) + " for a leaf of shape " +
                     shape_str(param.shape()));
  }
  Backend& backend = backend_for(param);
  // bf16/f16 leaves (mixed-precision parameters) accumulate in f32: the
  // optimizer's f32 master weights take f32 gradients, and sums over
  // microbatches do not lose digits; those marked set_half_grad
  // (train.grad_precision bf16) in their own type.
  const DType grad_dtype = param.grad_dtype();
  if (!leaf_->grad && g.dtype() == grad_dtype && g.device() == param.device() &&
      g.is_contiguous() && g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 &&
      g.storage()->nbytes() == static_cast<size_t>(g.numel()) * dtype_size(g.dtype())) {
    // Nothing else holds this gradient (the engine handed over its only
    // handle, and no other tensor shares its memory, which it fills
    // exactly): it becomes the leaf's gradient as it is, as PyTorch's
    // AccumulateGrad steals it, instead of a copy (on a GPU, a launch and
    // a pass over memory per parameter per step).
    leaf_->grad = g.detach().impl_ptr();
  } else if (!leaf_->grad) {
    Tensor fresh = empty(param.shape(), grad_dtype, param.device());
    backend.copy(g, fresh);
    leaf_->grad = fresh.impl_ptr();
  } else {
    Tensor acc(leaf_->grad);
    backend.accumulate(g, acc);
  }
  Tensor grad(leaf_->grad);
  for (auto& hook : leaf_->post_accumulate_hooks) hook(grad);
  return {};
}

bool accumulate_into_leaf_grads(
    const std::vector<Tensor>& leaves,
    const std::function<void(std::vector<Tensor>& grads, double beta)>& add) {
  size_t fresh = 0;
  for (const Tensor& t : leaves) {
    if (!t.defined() || !t.requires_grad() || t.impl().grad_fn) return false;
    if (!t.impl().grad) {
      ++fresh;
      continue;
    }
    const Tensor grad(t.impl().grad);
    if (grad.dtype() != t.grad_dtype() || grad.shape() != t.shape() ||
        grad.device() != t.device() || !grad.is_contiguous()) {
      return false;
    }
  }
  NoGradGuard no_grad;
  const double beta = fresh == leaves.size() ? 0.0 : 1.0;
  std::vector<Tensor> grads;
  for (const Tensor& t : leaves) {
    TensorImpl& leaf = t.impl();
    if (!leaf.grad) {
      Tensor buffer = empty(t.shape(), t.grad_dtype(), t.device());
      if (beta != 0.0) backend_for(buffer).fill(buffer, 0.0);
      leaf.grad = buffer.impl_ptr();
    }
    grads.emplace_back(leaf.grad);
  }
  add(grads, beta);
  for (size_t i = 0; i < leaves.size(); ++i) {
    for (auto& hook : leaves[i].impl().post_accumulate_hooks) hook(grads[i]);
  }
  return true;
}

bool accumulate_into_leaf_grad(const Tensor& t,
                               const std::function<void(Tensor& grad, double beta)>& add) {
  return accumulate_into_leaf_grads(
      {t}, [&](std::vector<Tensor>& grads, double beta) { add(grads[0], beta); });
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  auto& impl = t.impl();
  if (impl.grad_fn) return {impl.grad_fn, impl.output_nr};
  std::shared_ptr<Node> acc = impl.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    impl.grad_accumulator = acc;
  }
  return {acc, 0};
}

bool any_requires_grad(const TensorList& inputs) {
  if (!grad_enabled()) return false;
  for (const auto& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

std::shared_ptr<FunctionNode> record(const std::string& name, const TensorList& inputs,
                                     const TensorList& outputs, BackwardFn backward) {
  if (!any_requires_grad(inputs)) return nullptr;
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  node->next_edges.reserve(inputs.size());
  for (const auto& t : inputs) node->next_edges.push_back(gradient_edge(t));
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto& impl = outputs[i].impl();
    node->outputs.push_back({impl.shape, impl.dtype, outputs[i].device()});
    impl.grad_fn = node;
    impl.output_nr = static_cast<int>(i);
    impl.requires_grad = true;
  }
  return node;
}

}  // namespace triad::autograd
