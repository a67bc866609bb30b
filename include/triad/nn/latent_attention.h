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
  // x (B, T, d_model) -> qkv (B, T, 3 * heads * D) as causal_attention
  // reads it, D = cfg.head_dim(): query head h is [q_rope | q_nope] times
  // cfg.latent_query_factor(), key head h [k_rope | k_nope] (k_rope the
  // same for every head), value head h its v; each zero-padded to D. Not
  // yet rotated: rotary_embedding with rotary_dim qk_rope turns the first
  // qk_rope dimensions of each query and key head.
  Tensor qkv(const Tensor& x, const DropoutDraw& draw = {}) const;
  // The attention's output (B, T, heads * D) -> (B, T, heads * v_head_dim),
  // each head's padding dropped.
  Tensor values(const Tensor& y) const;

 private:
  std::shared_ptr<Linear> q_a_proj_, q_b_proj_, q_proj_, kv_a_proj_, kv_b_proj_;
  std::shared_ptr<LayerNorm> q_a_norm_, kv_a_norm_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> layers_;
  int64_t heads_, nope_, rope_, v_, rank_, D_;
  double query_factor_;
};

}  // namespace triad::nn
