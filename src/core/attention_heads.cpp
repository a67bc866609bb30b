#include "triad/core/attention_heads.h"

#include <cmath>
#include <string>

#include "triad/core/error.h"

namespace triad {

int64_t AttentionHeads::head_dim(int64_t width, const char* op) const {
  if (q < 1 || kv < 1 || q % kv != 0) {
    throw ShapeError(std::string(op) + ": " + std::to_string(kv) + " key/value heads for " +
                     std::to_string(q) +
                     " query heads; expected a count >= 1 that divides the query heads");
  }
  if (width % fused() != 0) {
    throw ShapeError(std::string(op) + ": last dim of qkv (" + std::to_string(width) +
                     ") must be (n_head + 2 * n_kv_head) * head_dim = " + std::to_string(fused()) +
                     " * head_dim (n_head " + std::to_string(q) + ", n_kv_head " +
                     std::to_string(kv) + ")");
  }
  if (!(softcap >= 0.0) || !std::isfinite(softcap)) {
    throw ValueError(std::string(op) + ": logit softcap " + std::to_string(softcap) +
                     " must be a finite number >= 0 (0: no soft-capping)");
  }
  if (window < 0) {
    throw ValueError(std::string(op) + ": sliding window " + std::to_string(window) +
                     " must be >= 0 (0: none)");
  }
  return width / fused();
}

}  // namespace triad
