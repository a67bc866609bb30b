#pragma once

#include <cstdint>

#include "triad/nn/module.h"
#include "triad/ops/linalg.h"

namespace triad::nn {

// y = x @ weight^T + bias with weight (out_features, in_features).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, DType dtype = DType::F32);
  Tensor forward(const Tensor& x) const;
  // gelu(forward(x)) with its pre-activation (ops linear_gelu_parts), and a
  // layer taking such an activation, its input gradient going to the
  // pre-activation with GELU's derivative fused in (ops linear_after_gelu):
  // an MLP is c_proj.forward_after_gelu(c_fc.forward_gelu(x)).
  LinearGelu forward_gelu(const Tensor& x) const;
  Tensor forward_after_gelu(const LinearGelu& in) const;
  Tensor& weight() { return weight_; }
  Tensor& bias() { return bias_; }

 private:
  Tensor weight_;
  Tensor bias_;
};

}  // namespace triad::nn
