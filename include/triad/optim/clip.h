#pragma once

#include <functional>
#include <map>
#include <string>
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

// Parameters sorted into named groups, for norms reported group by group
// (log.grad_norms). Built from every parameter name of the whole model, so
// that every rank of any layout numbers the groups alike.
class NormGroups {
 public:
  // `key` gives a parameter's group name; groups are numbered in the order
  // of their names.
  NormGroups(const std::vector<std::string>& parameters,
             const std::function<std::string(const std::string&)>& key);
  size_t size() const { return names_.size(); }
  const std::vector<std::string>& names() const { return names_; }
  // The group of a parameter; ValueError for a name it was not built from.
  size_t of(const std::string& parameter) const;

 private:
  std::vector<std::string> names_;
  std::map<std::string, size_t> of_;
};

// Each group's sum of squares (as sum_of_squares_device), in one f64
// tensor of groups.size() elements on `device`, not read back: zero for a
// group with no defined tensor; undefined when no group has one.
Tensor grouped_sum_of_squares(const std::vector<std::vector<Tensor>>& groups, Device device);

// L2 norm of all gradients together (parameters without .grad are skipped).
double global_grad_norm(const std::vector<Tensor>& params);

// L2 norm of the values of the parameters that require a gradient (those
// training updates; frozen ones are left out), all together.
double global_param_norm(const std::vector<Tensor>& params);

// Clipping's coefficient for a global gradient norm, PyTorch's
// clip_grad_norm_: min(1, max_norm / (norm + 1e-6)), and 1 when max_norm <= 0
// (no clipping). A NaN norm gives 1 and an infinite one 0, as the division
// does; callers that skip non-finite steps decide before asking. Every host
// path clips with this (the CUDA AdamW kernels' device copy gives the same
// bits: AdamWStep::clip_sum_sq).
double clip_coefficient(double norm, double max_norm);

// PyTorch's clip_grad_norm_: computes the global norm, and when
// clip_coefficient(norm, max_norm) < 1 multiplies every gradient by it.
// Returns the norm before clipping.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace triad::optim
