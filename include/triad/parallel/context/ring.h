#pragma once

#include "triad/core/attention_heads.h"
#include "triad/core/tensor.h"
#include "triad/dist/process_group.h"

namespace triad::cp {

// Context parallelism's attention by a ring of point-to-point exchanges
// (Exchange::Ring; ring attention, Megatron-LM's default): qkv (B, T / P,
// (q + 2 kv) D) is this rank's half-chunks r and 2P - 1 - r of the
// sequence (layout.h's balanced layout), all of `heads`. In P steps the
// ranks pass their keys and values along the ring (rank r to r + 1), each
// step's exchange posted before the step's attention so the two overlap:
// step s attends this rank's queries over the keys of rank r - s that they
// see (chunk_attention's blocks: all of an earlier half-chunk, causally
// their own), and folds the block into the running output by its
// log-sum-exp (Backend::attention_merge; the blocks written and folded in
// the stat dtype, f32 under bf16/f16: no rounding before the end) -> (B, T / P,
// q D). Nothing but this rank's own qkv, output and log-sum-exp is kept:
// backward passes the keys and values around again with their gradients
// (in the stat dtype), each rank adding its queries' share, so that after P
// exchanges every rank holds its own. `starts` (B, T) is the whole
// sequence's first keys (packed documents, windows), or undefined. Any
// head count; (P - 1)/P of the keys and values moved each way, and of
// their gradients backward. Differentiable.
Tensor ring_attention(const Tensor& qkv, const AttentionHeads& heads, const Tensor& starts,
                      const dist::ProcessGroupPtr& group);

}  // namespace triad::cp
