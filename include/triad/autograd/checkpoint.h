#pragma once

#include <functional>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::autograd {

// Activation recomputation ("gradient checkpointing"): runs fn(x) without
// recording its graph, so none of its intermediate activations stay alive;
// backward runs fn again on the saved input with the graph recorded and
// backpropagates through it. `params` are the parameters fn uses: their
// gradients accumulate during that inner backward. fn must be deterministic
// (Triad's dropout is: masks are a pure function of seed and offsets), so
// the gradients equal those without recomputation.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x,
                  const std::vector<Tensor>& params);
// Whether this thread is running a checkpointed function again in backward
// (its recomputation): what a forward pass does once per step besides
// computing (counting statistics) is skipped then.
bool recomputing();

}  // namespace triad::autograd
