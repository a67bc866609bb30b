#pragma once

#include <cstdint>
#include <string>

#include "triad/core/tensor.h"

namespace triad::nn {

// How a parameter starts: N(0, std^2), or a constant.
struct InitRule {
  enum class Kind { Normal, Constant } kind = Kind::Normal;
  double value = 0.02;  // std for Normal, the constant otherwise

  static InitRule normal(double stddev) { return {Kind::Normal, stddev}; }
  static InitRule constant(double v) { return {Kind::Constant, v}; }
};

// Layout-independent initialisation: element i (row-major index in the full,
// unsharded tensor of shape full_shape) of parameter `name` is
// std * philox_normal(seed, stable_hash(name), i). A shard is cut from that:
// `rows` [row_begin, row_begin + rows) of dim 0 when sharding along dim 0.
// Returns a host tensor of shape full_shape (or the row shard).
Tensor init_parameter(const std::string& name, const Shape& full_shape, const InitRule& rule,
                      uint64_t seed, DType dtype = DType::F32);

// GPT-2's rule for a parameter name: LayerNorm weights 1 (0 under
// norm_weight_offset), biases 0, residual projections (attn.c_proj.weight,
// mlp.c_proj.weight) std / sqrt(2 * n_layer), every other weight `std`
// (GPT-2's 0.02 by default; model.init_std).
InitRule gpt2_init_rule(const std::string& name, int64_t n_layer, bool norm_weight_offset = false,
                        double std = 0.02);

}  // namespace triad::nn
