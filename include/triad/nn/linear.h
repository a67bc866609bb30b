#pragma once

#include <cstdint>

#include "triad/nn/module.h"
#include "triad/ops/linalg.h"

namespace triad::nn {

// What every linear layer (Linear, and the tensor-parallel ones in
// parallel/tensor/layers.h) holds: a weight (out, in) — its shard under
// tensor parallelism — a bias, and LoRA's adapters, registered on the
// layer so that they are named after it (<layer>.lora_a, .lora_b).
class LinearBase : public Module {
 public:
  // Adds adapters lora_a (rank, in) and lora_b (out, rank) of the weight's
  // shape, zeros until the model initialises them; the layer then adds
  // scale * lora_b @ lora_a @ x (add_lora). Call after the weight exists.
  void enable_lora(int64_t rank, double scale);
  bool has_lora() const { return lora_a_.defined(); }

 protected:
  // y + scale * B (A x); y itself without adapters.
  Tensor add_lora(const Tensor& y, const Tensor& x) const;

  Tensor weight_;
  Tensor bias_;

 private:
  Tensor lora_a_, lora_b_;
  double lora_scale_ = 0;
};

// y = x @ weight^T + bias with weight (out_features, in_features).
class Linear : public LinearBase {
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
};

}  // namespace triad::nn
