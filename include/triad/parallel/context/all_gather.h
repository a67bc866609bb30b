#pragma once

#include "triad/core/attention_heads.h"
#include "triad/core/tensor.h"
#include "triad/dist/process_group.h"

namespace triad::cp {

// Context parallelism's attention by all-gather (Llama 3's way; exchange.h):
// qkv (B, T / P, (q + 2 kv) D) is this rank's chunk r of the sequence, all
// of `heads`. The keys and values are gathered along the sequence from the
// group, and the chunk's queries attend over those up to their own
// positions (causal_attention's first_query) -> (B, T / P, q D), this
// chunk's output for every head; nothing comes back. `starts` (B, T) is the
// whole sequence's first keys (packed documents, windows), or undefined.
// Differentiable: the keys' and values' gradients are reduce-scattered
// back, each rank's chunk summing what every later chunk's queries gave it.
// Any head count works; the gathered keys and values are T / P times the
// chunk's, and rank r's queries read (r + 1) chunks of them.
Tensor all_gather_attention(const Tensor& qkv, const AttentionHeads& heads, const Tensor& starts,
                            const dist::ProcessGroupPtr& group);

}  // namespace triad::cp
