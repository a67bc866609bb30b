#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "triad/nn/dropout.h"
#include "triad/nn/module.h"
#include "triad/ops/linalg.h"

namespace triad::nn {

// How LoRA's adapters drop their input out (PEFT's lora_dropout).
struct LoraDropout {
  double p = 0;         // the probability of zeroing an element while training
  uint64_t stream = 0;  // where the layer's masks are drawn
  // Masks drawn feature-major (LinearBase::add_lora): what a layer whose
  // input tensor parallelism splits by features needs — a row-parallel one
  // (which always draws so), and the unsharded layer that must match it.
  bool by_feature = false;
};

// What every linear layer (Linear, and the tensor-parallel ones in
// parallel/tensor/layers.h) holds: a weight (out, in) — its shard under
// tensor parallelism — a bias, and LoRA's adapters, registered on the
// layer so that they are named after it (<layer>.lora_a, .lora_b).
class LinearBase : public Module {
 public:
  // Adds adapters lora_a (rank, in) and lora_b (out, rank) of the weight's
  // shape, zeros until the model initialises them; the layer then adds
  // scale * lora_b @ lora_a @ dropout(x) (add_lora). Call after the weight
  // exists.
  void enable_lora(int64_t rank, double scale, const LoraDropout& dropout = {});
  bool has_lora() const { return lora_a_.defined(); }
  // This rank's input features are [offset, offset + local) of `full`
  // (a row-parallel layer's shard; its adapters' masks are then drawn by
  // feature); by default the whole input. Call before enable_lora.
  void set_lora_input_shard(int64_t offset, int64_t full) {
    lora_in_offset_ = offset;
    lora_in_full_ = full;
  }
  // The adapters (undefined without), their scale and the probability of
  // their input's dropout: for a caller that runs many layers' adapters in
  // grouped products (a dropless mixture's experts on the device).
  const Tensor& lora_a() const { return lora_a_; }
  const Tensor& lora_b() const { return lora_b_; }
  double lora_scale() const { return lora_scale_; }
  double lora_dropout_p() const { return lora_dropout_.p; }

 protected:
  // y + scale * B (A dropout(x)); y itself without adapters. The mask
  // depends on each element's place in the whole input (M rows by `in`
  // features, the features of every tensor-parallel shard together): of the
  // layer's stream, element (m, f) takes counter call * M * in + m * in + f,
  // or by feature call * M * in + f * M + m, so that a shard holding
  // features [f0, f0 + in / tp) draws its slice of the unsharded layer's
  // masks (set_lora_input_shard). The second costs two transposing copies
  // of the input. With draw.pieces, x's rows are a context-parallel rank's
  // pieces of B sequences, and row m of the whole is b * T + t (t the
  // token's place in its sequence of T): each piece draws its rows of the
  // whole micro-batch's masks. With draw.keys, row r of x is row keys[r] of
  // the whole input (a mixture's assignments: nn::assignment_key), whose
  // element (keys[r], f) takes keys[r] * in + f, by row whether sharded or
  // not (the rows being gathered in any order, there is no run to keep).
  Tensor add_lora(const Tensor& y, const Tensor& x, const DropoutDraw& draw) const;

  Tensor weight_;
  Tensor bias_;

 private:
  Tensor lora_a_, lora_b_;
  double lora_scale_ = 0;
  LoraDropout lora_dropout_;
  int64_t lora_in_offset_ = 0, lora_in_full_ = 0;  // full 0: the weight's own

  // add_lora's dropout of x held as draw.pieces.
  Tensor lora_dropout_pieces(const Tensor& x, const DropoutDraw& draw) const;
};

// y = x @ weight^T + bias with weight (out_features, in_features).
class Linear : public LinearBase {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, DType dtype = DType::F32);
  // draw: where the adapters' dropout masks come from (none by default).
  Tensor forward(const Tensor& x, const DropoutDraw& draw = {}) const;
  // gelu(forward(x)) with its pre-activation (ops linear_gelu_parts), and a
  // layer taking such an activation, its input gradient going to the
  // pre-activation with GELU's derivative fused in (ops linear_after_gelu):
  // an MLP is c_proj.forward_after_gelu(c_fc.forward_gelu(x)).
  LinearGelu forward_gelu(const Tensor& x, const DropoutDraw& draw = {}) const;
  Tensor forward_after_gelu(const LinearGelu& in, const DropoutDraw& draw = {}) const;
  Tensor& weight() { return weight_; }
  Tensor& bias() { return bias_; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
};

}  // namespace triad::nn
