#pragma once

// Multi-head latent attention (GptConfig::mla; DeepSeek-V2's and -V3's):
// the layers that turn a block's input into the queries, keys and values
// of the fused attention (ops causal_attention), and its output back into
// the values' width for c_proj. The one process model (nn::Gpt) and the
// tensor-parallel one (tp::TensorParallelGpt, whose ranks each hold a share
// of the heads) build their blocks from these.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "triad/core/rope_scaling.h"
#include "triad/nn/layer_norm.h"
#include "triad/nn/linear.h"

namespace triad::nn {

struct GptConfig;

// The shapes of one block's latent-attention parameters (c_proj aside), by
// their names inside the block's attn, for `heads` query heads (n_head, or
// a tensor-parallel rank's share: q_b_proj's or q_proj's and kv_b_proj's
// rows are whole heads, the rest the same for any share):
//   q_a_proj (q_lora_rank, d_model), q_a_norm (q_lora_rank),
//   q_b_proj (heads * (qk_nope + qk_rope), q_lora_rank);
//   or, with q_lora_rank 0, q_proj (heads * (qk_nope + qk_rope), d_model);
//   kv_a_proj (kv_lora_rank + qk_rope, d_model), kv_a_norm (kv_lora_rank),
//   kv_b_proj (heads * (qk_nope + v_head_dim), kv_lora_rank);
// and with model.linear_bias the biases of q_a_proj (or q_proj) and
// kv_a_proj. Each head's rows of q_b_proj are [nope | rope], of kv_b_proj
// [k_nope | v] (Hugging Face's order; its rope rows in halves, as Triad
// turns them), and kv_a_proj's last qk_rope rows make the one rotated key.
std::vector<std::pair<std::string, Shape>> latent_attention_shapes(const GptConfig& cfg,
                                                                   int64_t heads);

// One block's (block `layer`'s) latent-attention layers for `heads` query
// heads, with LoRA's adapters on those model.lora targets (each split with
// its layer: whole heads of the up-projections' B).
class LatentProjections {
 public:
  LatentProjections(const GptConfig& cfg, int64_t heads, int64_t layer);
  // Each layer by its name inside attn, for the owner to register (the
  // names of latent_attention_shapes).
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& layers() const {
    return layers_;
  }
  // What x (B, T, d_model) projects to: the queries (B, T, heads, qk_nope
  // + qk_rope), each head [nope | rope] as q_b_proj's rows are, neither
  // scaled nor rotated; the key/value latent (B, T, kv_lora_rank),
  // normalised; and the one rope key (B, T, qk_rope), not yet rotated.
  struct Parts {
    Tensor q, latent, k_rope;
  };
  Parts parts(const Tensor& x, const DropoutDraw& draw = {}) const;
  // x (B, T, d_model) -> qkv (B, T, 3 * heads * D) as causal_attention
  // reads it, D = cfg.head_dim(): query head h is [q_rope | q_nope] times
  // cfg.latent_query_factor(), key head h [k_rope | k_nope] (k_rope the
  // same for every head), value head h its v; each zero-padded to D. Not
  // yet rotated: rotary_embedding with rotary_dim qk_rope turns the first
  // qk_rope dimensions of each query and key head.
  Tensor qkv(const Tensor& x, const DropoutDraw& draw = {}) const {
    return qkv(parts(x, draw), draw);
  }
  Tensor qkv(const Parts& p, const DropoutDraw& draw = {}) const;
  // The attention's output (B, T, heads * D) -> (B, T, heads * v_head_dim),
  // each head's padding dropped.
  Tensor values(const Tensor& y) const;

  // Decoding from a cache of latents (DeepSeek's absorbed attention): per
  // token kv_lora_rank + qk_rope numbers instead of heads * 2 * D (for
  // DeepSeek-V3 576 against 49152). `latents` (B, 1, capacity,
  // kv_lora_rank) and `rope_keys` (B, 1, capacity, qk_rope) hold slots [0,
  // start); store() writes the n new tokens' (p, B by n) into slots [start,
  // start + n), their rope keys turned at `positions` (or start + t; as
  // rotary_embedding takes them) by theta and `scaling`.
  void store(const Parts& p, Tensor& latents, Tensor& rope_keys, int64_t start,
             const Tensor& positions, double theta, const RopeScaling& scaling) const;
  // store(), then the attention of the n new tokens over slots [0, start +
  // n): (B, n, heads * v_head_dim), what values(causal_attention(...)) gives
  // for them over the same keys. Each head's k_nope part of kv_b_proj is
  // folded into its query (q_nope W_uk scores the latent) and its v part
  // applied to the latents' weighted sum, so no key or value head is ever
  // made. Query i of row b (slot start + i) sees the slots up to its own,
  // within the last `window` (0: all), never those of the row's left
  // padding before row_start[b] (empty: none) unless it is padding itself;
  // softcap > 0 caps the scores as causal_attention does. Forward only.
  Tensor decode(const Parts& p, Tensor& latents, Tensor& rope_keys, int64_t start,
                const Tensor& positions, double theta, const RopeScaling& scaling,
                int64_t window = 0, const std::vector<int64_t>& row_start = {},
                double softcap = 0.0) const;

 private:
  // The new tokens' rope queries (B, n, heads, qk_rope) and rope key (B, n,
  // qk_rope), turned.
  std::pair<Tensor, Tensor> turned(const Parts& p, int64_t start, const Tensor& positions,
                                   double theta, const RopeScaling& scaling) const;
  void write(const Parts& p, const Tensor& key, Tensor& latents, Tensor& rope_keys,
             int64_t start) const;

  std::shared_ptr<Linear> q_a_proj_, q_b_proj_, q_proj_, kv_a_proj_, kv_b_proj_;
  std::shared_ptr<LayerNorm> q_a_norm_, kv_a_norm_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> layers_;
  int64_t heads_, nope_, rope_, v_, rank_, D_;
  double query_factor_;
  double lora_scale_ = 0;  // kv_b_proj's adapters' (decode merges them), 0: none
};

}  // namespace triad::nn
