#pragma once

#include "triad/core/attention_heads.h"
#include "triad/core/tensor.h"
#include "triad/dist/process_group.h"

namespace triad::cp {

// Context parallelism's attention by all-gather (Llama 3's way; exchange.h):
// qkv (B, T / P, (q + 2 kv) D) is this rank's tokens of the sequence, all
// of `heads`: its chunk r, or, `balanced` (layout.h), its half-chunks r and
// 2P - 1 - r side by side. The keys and values are gathered along the
// sequence from the group (and put in the sequence's order), and each run
// of this rank's queries attends over those up to its own positions
// (chunk_attention: nothing is kept for the rows before a run) -> (B, T / P,
// q D), this rank's tokens' output for every head; nothing comes back. `starts` (B, T) is the whole
// sequence's first keys (packed documents, windows), or undefined.
// Differentiable: the keys' and values' gradients are reduce-scattered
// back, each rank's summing what every later query gave them. Any head
// count works. Contiguous, rank r's queries read (r + 1) chunks of keys;
// balanced, every rank's read P + 1/2 chunks' worth.
Tensor all_gather_attention(const Tensor& qkv, const AttentionHeads& heads, const Tensor& starts,
                            const dist::ProcessGroupPtr& group, bool balanced = false);

}  // namespace triad::cp
