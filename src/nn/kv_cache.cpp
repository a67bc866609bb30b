#include "triad/nn/kv_cache.h"

#include <string>

#include "triad/nn/gpt.h"
#include "triad/ops.h"

namespace triad::nn {

KvCache::KvCache(const GptConfig& cfg, int64_t batch, DType dtype, Device device) {
  if (batch <= 0) throw ValueError("KvCache: batch (" + std::to_string(batch) + ") must be > 0");
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    if (cfg.latent_attention()) {  // DeepSeek's latents and rope keys
      k.push_back(empty({batch, 1, cfg.seq_len, cfg.mla.kv_lora_rank}, dtype, device));
      v.push_back(empty({batch, 1, cfg.seq_len, cfg.mla.qk_rope_head_dim}, dtype, device));
      continue;
    }
    k.push_back(empty({batch, cfg.kv_heads(), cfg.seq_len, cfg.head_dim()}, dtype, device));
    v.push_back(empty({batch, cfg.kv_heads(), cfg.seq_len, cfg.head_dim()}, dtype, device));
  }
}

void KvCache::keep_rows(const std::vector<int64_t>& rows, int64_t shift) {
  const int64_t B = batch();
  if (rows.empty()) throw ValueError("KvCache::keep_rows: no rows to keep");
  if (shift < 0 || shift > length) {
    throw ValueError("KvCache::keep_rows: shift " + std::to_string(shift) + " is not in [0, " +
                     std::to_string(length) + "] (the slots filled)");
  }
  for (const int64_t r : rows) {
    if (r < 0 || r >= B) {
      throw ValueError("KvCache::keep_rows: row " + std::to_string(r) + " is not in [0, " +
                       std::to_string(B) + ")");
    }
    if (start_of(r) < shift) {
      throw ValueError("KvCache::keep_rows: row " + std::to_string(r) + " starts at slot " +
                       std::to_string(start_of(r)) + ", so its first " + std::to_string(shift) +
                       " slots are not all padding");
    }
  }
  const auto R = static_cast<int64_t>(rows.size());
  const int64_t kept = length - shift;
  for (auto* list : {&k, &v}) {
    for (Tensor& t : *list) {
      Tensor moved = empty({R, t.size(1), t.size(2), t.size(3)}, t.dtype(), t.device());
      if (kept > 0) {
        for (int64_t i = 0; i < R; ++i) {
          Tensor to = narrow(narrow(moved, 0, i, 1), 2, 0, kept);
          copy_(to, narrow(narrow(t, 0, rows[i], 1), 2, shift, kept));
        }
      }
      t = moved;
    }
  }
  std::vector<int64_t> starts(rows.size());
  for (int64_t i = 0; i < R; ++i) starts[i] = start_of(rows[i]) - shift;
  row_start = std::move(starts);
  length = kept;
}

}  // namespace triad::nn
