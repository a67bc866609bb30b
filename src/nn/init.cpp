#include "triad/nn/init.h"

#include <cmath>

#include "triad/core/rng.h"
#include "triad/ops/creation.h"

namespace triad::nn {

Tensor init_parameter(const std::string& name, const Shape& full_shape, const InitRule& rule,
                      uint64_t seed, DType dtype) {
  if (rule.kind == InitRule::Kind::Constant) return full(full_shape, rule.value, dtype);
  return randn(full_shape, seed, stable_hash(name), rule.value, dtype);
}

InitRule gpt2_init_rule(const std::string& name, int64_t n_layer, bool norm_weight_offset,
                        double std) {
  // Norms' weights start at one (zero when they scale by 1 + weight): the
  // blocks' ln_1 and ln_2, ln_f, and the query/key norms (attn.q_norm,
  // attn.k_norm).
  const bool is_ln = name.find("ln_") != std::string::npos || name.ends_with("_norm.weight");
  if (name.ends_with(".bias")) return InitRule::constant(0.0);
  if (is_ln) return InitRule::constant(norm_weight_offset ? 0.0 : 1.0);
  if (name.ends_with("c_proj.weight")) {
    return InitRule::normal(std / std::sqrt(2.0 * static_cast<double>(n_layer)));
  }
  return InitRule::normal(std);
}

}  // namespace triad::nn
