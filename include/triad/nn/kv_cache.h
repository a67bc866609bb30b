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
// slots [0, length) hold data. Under latent attention (GptConfig::mla) k
// holds each token's latent (batch, 1, seq_len, kv_lora_rank) and v its
// rope key (batch, 1, seq_len, qk_rope_head_dim), from which the heads'
// keys and values are never made (LatentProjections::decode): DeepSeek-V3's
// 576 numbers a token and layer instead of 128 heads' 2 x 192.
//
// Sequences of different lengths share a cache left-padded: row b's text
// starts at slot row_start[b] (its token at slot s sits at position
// s - row_start[b]), and its queries never see the padding slots before it.
// Empty row_start: every row starts at slot 0.
struct KvCache {
  KvCache(const GptConfig& cfg, int64_t batch, DType dtype, Device device);
  int64_t capacity() const { return k.empty() ? 0 : k.front().size(2); }
  int64_t batch() const { return k.empty() ? 0 : k.front().size(0); }
  // Where row b's text starts (0 without padding).
  int64_t start_of(int64_t b) const { return row_start.empty() ? 0 : row_start.at(b); }
  // Keeps only `rows` (in that order) and drops the first `shift` slots of
  // each, which must be padding in every kept row (shift <= their
  // row_start): the batch shrinks to rows.size() and length by shift.
  void keep_rows(const std::vector<int64_t>& rows, int64_t shift);
  std::vector<Tensor> k, v;
  int64_t length = 0;
  std::vector<int64_t> row_start;
};

}  // namespace triad::nn
