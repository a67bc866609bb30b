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

}  // namespace triad::testing
