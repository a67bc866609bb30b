#pragma once

#include "triad/nn/module.h"

namespace triad::nn {

// y = x @ weight^T + bias with weight (out_features, in_features).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, DType dtype = DType::F32);
  Tensor forward(const Tensor& x) const;
  // gelu(forward(x)), fused where the backend can (ops linear_gelu).
  Tensor forward_gelu(const Tensor& x) const;
  Tensor& weight() { return weight_; }
  Tensor& bias() { return bias_; }

 private:
  Tensor weight_;
  Tensor bias_;
};

}  // namespace triad::nn
