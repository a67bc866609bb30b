#include "triad/parallel/context/all_gather.h"

#include <string>
#include <vector>

#include "triad/core/error.h"
#include "triad/ops.h"
#include "triad/parallel/context/layout.h"
#include "triad/parallel/tensor/mappings.h"

namespace triad::cp {

Tensor all_gather_attention(const Tensor& qkv, const AttentionHeads& heads, const Tensor& starts,
                            const dist::ProcessGroupPtr& group, bool balanced) {
  if (qkv.dim() != 3) {
    throw ShapeError("all_gather_attention: expected qkv (B, T / P, width), got " +
                     shape_str(qkv.shape()));
  }
  const int64_t D = heads.head_dim(qkv.size(2), "all_gather_attention");
  const int64_t P = group->size(), r = group->rank();
  const int64_t Tc = qkv.size(1), T = Tc * P;
  if (starts.defined() && (starts.dim() != 2 || starts.size(1) != T)) {
    throw ShapeError("all_gather_attention: first keys " + shape_str(starts.shape()) +
                     " must cover the whole sequence of " + std::to_string(T) + " (" +
                     std::to_string(P) + " chunks of " + std::to_string(Tc) + ")");
  }
  if (P == 1) return causal_attention(qkv, heads, starts);
  if (balanced && Tc % 2 != 0) {
    throw ShapeError("all_gather_attention: a rank's " + std::to_string(Tc) +
                     " tokens do not halve into the balanced layout's two half-chunks");
  }
  const int64_t q = heads.q * D, kv = heads.kv * D;
  const Layout layout = balanced ? Layout::balanced(P) : Layout::contiguous(P);
  // Every rank's keys and values, in the sequence's order.
  const Tensor keys_values = to_sequence_order(
      tp::gather_from_sequence_region(narrow(qkv, 2, q, 2 * kv), group), 1, layout);
  const Tensor queries = narrow(qkv, 2, 0, q);
  std::vector<Tensor> out;
  int64_t at = 0;  // the run's first row in qkv
  for (const auto& [first, count] : chunk_runs(T, r, layout)) {
    // The run's queries read the keys up to its last position.
    const int64_t Tk = first + count;
    const Tensor first_keys =
        starts.defined() ? contiguous(narrow(starts, 1, first, count)) : Tensor();
    out.push_back(chunk_attention(narrow(queries, 1, at, count), narrow(keys_values, 1, 0, Tk),
                                  heads, first_keys));
    at += count;
  }
  return out.size() == 1 ? out[0] : concat(out, 1);
}

}  // namespace triad::cp
