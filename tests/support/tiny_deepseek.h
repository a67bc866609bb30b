#pragma once

// DeepSeek-V3's parts at test size, for the tests that read, export and
// adapt them alike.

#include "triad/nn/gpt.h"

namespace triad::testing {

// Its mixture: a dense first layer, then 4 SwiGLU experts of 6 in 2 groups
// (each token's top 2 within the best group), sigmoid scores chosen with
// expert biases, the gates renormalised and times 2.5, and an ungated shared
// expert two experts wide; no load-balancing loss.
inline nn::GptConfig::Moe tiny_deepseek_mixture() {
  return {.experts = 4,
          .top_k = 2,
          .ffn_hidden_size = 6,
          .aux_loss_coef = 0,
          .dense_layers = {0},
          .shared_ffn_hidden_size = 12,
          .score = nn::GptConfig::Moe::Score::Sigmoid,
          .routed_scaling_factor = 2.5,
          .groups = 2,
          .top_groups = 1,
          .expert_bias = true};
}

// Its latent attention: keys and values through a latent of 6, queries
// through one of 5, queries and keys 4 + 4 wide, values 6.
inline nn::GptConfig::Mla tiny_latent_attention() {
  return {.kv_lora_rank = 6,
          .q_lora_rank = 5,
          .qk_nope_head_dim = 4,
          .qk_rope_head_dim = 4,
          .v_head_dim = 6};
}

// DeepSeek's yarn at test size: the frequencies stretched 4 times from an
// original context of 4, and the scores times (0.1 mscale_all_dim
// ln(factor) + 1)^2 with mscale_all_dim 0.7.
inline void use_deepseek_yarn(nn::GptConfig& c) {
  c.mla.mscale_all_dim = 0.7;
  c.rope_scaling.kind = RopeScaling::Kind::Yarn;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_seq_len = 4.0;
  c.rope_scaling.attention_factor = 1.0;
}

}  // namespace triad::testing
