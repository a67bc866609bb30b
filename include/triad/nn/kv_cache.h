#pragma once

#include <cstdint>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::nn {

struct GptConfig;

// The keys and values a GPT's attention layers computed for the positions
// decoded so far, so that each new token costs one position's work instead
// of a forward pass over the whole context (Gpt::decode). Per layer, k and
// v are (batch, key/value heads, seq_len, head_dim) in the model's dtype on
// its device (grouped-query attention keeps n_kv_head heads, not n_head);
// positions [0, length) hold data.
struct KvCache {
  KvCache(const GptConfig& cfg, int64_t batch, DType dtype, Device device);
  int64_t capacity() const { return k.empty() ? 0 : k.front().size(2); }
  int64_t batch() const { return k.empty() ? 0 : k.front().size(0); }
  std::vector<Tensor> k, v;
  int64_t length = 0;
};

}  // namespace triad::nn
