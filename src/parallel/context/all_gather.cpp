#include "triad/parallel/context/all_gather.h"

#include <string>

#include "triad/core/error.h"
#include "triad/ops.h"
#include "triad/parallel/tensor/mappings.h"

namespace triad::cp {

Tensor all_gather_attention(const Tensor& qkv, const AttentionHeads& heads, const Tensor& starts,
                            const dist::ProcessGroupPtr& group) {
  if (qkv.dim() != 3) {
    throw ShapeError("all_gather_attention: expected qkv (B, T / P, width), got " +
                     shape_str(qkv.shape()));
  }
  const int64_t D = heads.head_dim(qkv.size(2), "all_gather_attention");
  const int64_t P = group->size(), r = group->rank();
  const int64_t B = qkv.size(0), Tc = qkv.size(1), T = Tc * P;
  if (starts.defined() && (starts.dim() != 2 || starts.size(1) != T)) {
    throw ShapeError("all_gather_attention: first keys " + shape_str(starts.shape()) +
                     " must cover the whole sequence of " + std::to_string(T) + " (" +
                     std::to_string(P) + " chunks of " + std::to_string(Tc) + ")");
  }
  if (P == 1) return causal_attention(qkv, heads, starts);
  const int64_t q = heads.q * D, kv = heads.kv * D;
  // Every chunk's keys and values in the sequence's order; this chunk's
  // queries read those up to its last position, (r + 1) Tc of them.
  const int64_t Tk = (r + 1) * Tc;
  const Tensor keys =
      narrow(tp::gather_from_sequence_region(narrow(qkv, 2, q, 2 * kv), group), 1, 0, Tk);
  // The fused layout causal_attention reads: the queries of rows before the
  // chunk are never read (first_query), so they stay zero.
  Tensor queries = narrow(qkv, 2, 0, q);
  if (r > 0) queries = concat({zeros({B, r * Tc, q}, qkv.dtype(), qkv.device()), queries}, 1);
  const Tensor first_keys = starts.defined() ? contiguous(narrow(starts, 1, 0, Tk)) : Tensor();
  return causal_attention(concat({queries, keys}, 2), heads, first_keys, r * Tc);
}

}  // namespace triad::cp
