#pragma once

#include <cstdint>

#include "triad/nn/module.h"
#include "triad/ops/nn_functional.h"

namespace triad::nn {

// LayerNorm over the last dimension with a learned scale and shift.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t features, double eps = 1e-5, DType dtype = DType::F32);
  Tensor forward(const Tensor& x) const;
  // {x + residual, forward(x + residual)} in one op (ops add_layer_norm).
  AddLayerNorm forward_add(const Tensor& x, const Tensor& residual) const;

 private:
  Tensor weight_;
  Tensor bias_;
  double eps_;
};

}  // namespace triad::nn
