#include "triad/parallel/context/hierarchical.h"

#include <string>

#include "triad/core/error.h"
#include "triad/parallel/context/ring.h"
#include "triad/parallel/context/ulysses.h"

namespace triad::cp {

Tensor hierarchical_attention(const Tensor& qkv, const AttentionHeads& heads, const Tensor& starts,
                              const Hierarchy& groups) {
  if (!groups.defined()) {
    throw ValueError("hierarchical_attention: needs the all-to-all's and the ring's groups");
  }
  if (qkv.dim() != 3) {
    throw ShapeError("hierarchical_attention: expected qkv (B, T / P, width), got " +
                     shape_str(qkv.shape()));
  }
  const int64_t D = heads.head_dim(qkv.size(2), "hierarchical_attention");
  // The group's two half-chunks whole, an a2a-th of the heads; the ring
  // over them; this rank's share of the sequence back for every head.
  const Tensor group_tokens = sequence_to_heads(qkv, heads, groups.a2a);
  const Tensor y = ring_attention(group_tokens, heads_kept(heads, groups.a2a), starts, groups.ring);
  return heads_to_sequence(y, D, groups.a2a);
}

}  // namespace triad::cp
