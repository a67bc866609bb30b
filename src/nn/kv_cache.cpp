#include "triad/nn/kv_cache.h"

#include <string>

#include "triad/nn/gpt.h"
#include "triad/ops/creation.h"

namespace triad::nn {

KvCache::KvCache(const GptConfig& cfg, int64_t batch, DType dtype, Device device) {
  if (batch <= 0) throw ValueError("KvCache: batch (" + std::to_string(batch) + ") must be > 0");
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    k.push_back(empty({batch, cfg.kv_heads(), cfg.seq_len, cfg.head_dim()}, dtype, device));
    v.push_back(empty({batch, cfg.kv_heads(), cfg.seq_len, cfg.head_dim()}, dtype, device));
  }
}

}  // namespace triad::nn
