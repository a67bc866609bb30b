#pragma once

#include <cstdint>

#include "triad/core/attention_heads.h"
#include "triad/core/tensor.h"
#include "triad/dist/process_group.h"
#include "triad/nn/gpt.h"
#include "triad/parallel/context/exchange.h"

namespace triad::cp {

// Context parallelism, DeepSpeed-Ulysses' way (Exchange::AllToAll): the P
// ranks of a context-parallel group each hold a contiguous chunk of every sequence
// (T / P tokens) for everything but the attention, and before it exchange
// their queries, keys and values all-to-all so that each rank holds the
// whole sequence for a P-th of the heads. The attention kernel runs as it
// does in one process (packed documents, windows, soft caps, every kernel
// choice), then a second all-to-all brings each rank its chunk of every
// head's output back. Activation memory per rank falls by P for every
// token-wise layer; each attention layer moves its q, k, v and output once
// each way (a P-th of them stays put).

// All-to-all of equal pieces along dim 0: piece j of x (x.size(0) / P rows)
// goes to rank j, and piece i of the result came from rank i. Its own
// transpose: backward sends the gradient's pieces back the same way. A
// group of one: x.
Tensor all_to_all_rows(const Tensor& x, const dist::ProcessGroupPtr& group);

// The heads this rank keeps of `heads` (a rank's share of the model's,
// after tensor parallelism) once the sequence is whole: q / P query heads
// and kv / P key/value heads, or, with fewer key/value heads than ranks
// (P a multiple of kv), the one head its queries read. Throws ShapeError
// naming the numbers when q is not a multiple of P, or kv is neither a
// multiple nor a divisor of P.
AttentionHeads heads_kept(const AttentionHeads& heads, int64_t ranks);
inline AttentionHeads heads_kept(const AttentionHeads& heads, const dist::ProcessGroupPtr& group) {
  return heads_kept(heads, group->size());
}

// qkv (B, T / P, (q + 2 kv) D) for this rank's chunk of the sequence, all
// of `heads` -> (B, T, (q' + 2 kv') D) for the whole sequence, the heads
// heads_kept() names (rank j the j-th P-th of the query heads and the key
// and value heads they read), in the same fused layout. Key/value heads
// fewer than the ranks are gathered whole and each rank keeps its own;
// their gradient is summed over the ranks sharing them. Differentiable.
Tensor sequence_to_heads(const Tensor& qkv, const AttentionHeads& heads,
                         const dist::ProcessGroupPtr& group);

// The attention's output (B, T, q' D) for the whole sequence and this
// rank's query heads -> (B, T / P, q D) for its chunk and every head (rank
// i's heads at block i). Differentiable (its backward is the forward
// exchange).
Tensor heads_to_sequence(const Tensor& y, int64_t head_dim, const dist::ProcessGroupPtr& group);

}  // namespace triad::cp
