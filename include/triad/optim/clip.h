#pragma once

#include <vector>

#include "triad/core/tensor.h"

namespace triad::optim {

// Sum of the squares of a tensor's elements, read back (as
// sum_of_squares_device of one tensor).
double sum_of_squares(const Tensor& t);

// Adds the sum of squares of each tensor into one f64 tensor of one element
// on their device without reading it back: one host synchronisation for a
// whole model instead of one per tensor (what matters on a GPU), and one
// backend call (Backend::sum_of_squares: a few launches on the GPU) per
// device. Undefined tensors are skipped; an empty list gives an undefined
// result.
Tensor sum_of_squares_device(const std::vector<Tensor>& tensors);

// L2 norm of all gradients together (parameters without .grad are skipped).
double global_grad_norm(const std::vector<Tensor>& params);

// L2 norm of the values of the parameters that require a gradient (those
// training updates; frozen ones are left out), all together.
double global_param_norm(const std::vector<Tensor>& params);

// PyTorch's clip_grad_norm_: computes the global norm, and when max_norm > 0
// and coef = max_norm / (norm + 1e-6) < 1 multiplies every gradient by coef.
// Returns the norm before clipping.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace triad::optim
