#include "triad/parallel/context/ulysses.h"

#include <string>
#include <vector>

#include "triad/autograd/grad_mode.h"
#include "triad/autograd/node.h"
#include "triad/core/error.h"
#include "triad/ops.h"
#include "triad/parallel/tensor/mappings.h"

namespace triad::cp {

using autograd::record;
using autograd::TensorList;

namespace {

// The exchange itself, outside the graph.
Tensor exchanged(const Tensor& x, const dist::ProcessGroupPtr& g) {
  autograd::NoGradGuard ng;
  const int P = g->size();
  if (x.dim() < 1 || x.size(0) % P != 0) {
    throw ShapeError("all_to_all_rows: " + shape_str(x.shape()) +
                     " must have a first dimension divisible by the group's " + std::to_string(P) +
                     " ranks");
  }
  Tensor in = contiguous(x).detach();
  Tensor out = empty(in.shape(), in.dtype(), in.device());
  const std::vector<int64_t> counts(static_cast<size_t>(P), in.size(0) / P);
  g->all_to_all(in, counts, out, counts)->wait();
  return out.detach();
}

int64_t chunks_of(const Tensor& x, const dist::ProcessGroupPtr& g, const char* op) {
  if (x.dim() != 3) {
    throw ShapeError(std::string(op) + ": expected (B, T, width), got " + shape_str(x.shape()));
  }
  return g->size();
}

// x (B, Tc, P, w) -> (B, P * Tc, w): piece j (x[:, :, j]) to rank j, the
// pieces received laid out along the sequence in rank order.
Tensor pieces_to_sequence(const Tensor& x, const dist::ProcessGroupPtr& g) {
  const int64_t B = x.size(0), Tc = x.size(1), P = x.size(2), w = x.size(3);
  // (P, B, Tc, w): one row block per destination.
  const Tensor slabs = contiguous(permute(x, {2, 0, 1, 3}));
  const Tensor got = all_to_all_rows(slabs, g);  // block i: rank i's chunk
  return reshape(contiguous(permute(got, {1, 0, 2, 3})), {B, P * Tc, w});
}

}  // namespace

Tensor all_to_all_rows(const Tensor& x, const dist::ProcessGroupPtr& group) {
  if (group->size() == 1) return x;
  Tensor y = exchanged(x, group);
  record("cp_all_to_all", {x}, {y},
         [group](const TensorList& g) -> TensorList { return {exchanged(g[0], group)}; });
  return y;
}

AttentionHeads heads_kept(const AttentionHeads& heads, int64_t P) {
  AttentionHeads kept = heads;
  if (!heads_share_out(heads, P)) {
    throw ShapeError("context parallelism: " + std::to_string(heads.q) + " query and " +
                     std::to_string(heads.kv) +
                     " key/value heads per tensor-parallel rank cannot be shared out over " +
                     std::to_string(P) +
                     " context-parallel ranks (the query heads must be a multiple of cp, the "
                     "key/value heads a multiple or a divisor of it)");
  }
  kept.q = heads.q / P;
  kept.kv = heads.kv % P == 0 ? heads.kv / P : 1;
  return kept;
}

Tensor sequence_to_heads(const Tensor& qkv, const AttentionHeads& heads,
                         const dist::ProcessGroupPtr& group) {
  const int64_t P = chunks_of(qkv, group, "sequence_to_heads");
  if (P == 1) return qkv;
  const int64_t D = heads.head_dim(qkv.size(2), "sequence_to_heads");
  (void)heads_kept(heads, group);  // (checks the heads share out)
  const int64_t B = qkv.size(0), Tc = qkv.size(1);
  const int64_t q = heads.q * D, kv = heads.kv * D;
  // Each destination's query heads, side by side: (B, Tc, P, q / P).
  const Tensor queries = reshape(narrow(qkv, 2, 0, q), {B, Tc, P, q / P});
  if (heads.kv % P == 0) {
    // One exchange: destination j gets [its queries | its keys | its
    // values], the fused layout of the heads it keeps.
    const Tensor keys = reshape(narrow(qkv, 2, q, kv), {B, Tc, P, kv / P});
    const Tensor values = reshape(narrow(qkv, 2, q + kv, kv), {B, Tc, P, kv / P});
    return pieces_to_sequence(concat({queries, keys, values}, 3), group);
  }
  // Fewer key/value heads than ranks: every rank gathers them whole along
  // the sequence (their gradient reduce-scattered back, summing the ranks
  // that share a head) and keeps the one its queries read.
  const Tensor both = tp::gather_from_sequence_region(narrow(qkv, 2, q, 2 * kv), group);
  const int64_t h = group->rank() / (P / heads.kv);
  return concat({pieces_to_sequence(queries, group), narrow(both, 2, h * D, D),
                 narrow(both, 2, kv + h * D, D)},
                2);
}

Tensor heads_to_sequence(const Tensor& y, int64_t head_dim, const dist::ProcessGroupPtr& group) {
  const int64_t P = chunks_of(y, group, "heads_to_sequence");
  if (P == 1) return y;
  const int64_t B = y.size(0), T = y.size(1), w = y.size(2);
  if (T % P != 0 || w % head_dim != 0) {
    throw ShapeError("heads_to_sequence: " + shape_str(y.shape()) +
                     " must hold a sequence divisible by the group's " + std::to_string(P) +
                     " ranks and whole heads of " + std::to_string(head_dim));
  }
  const int64_t Tc = T / P;
  // (P, B, Tc, w): block i is rank i's chunk of the sequence.
  const Tensor slabs = contiguous(permute(reshape(y, {B, P, Tc, w}), {1, 0, 2, 3}));
  const Tensor got = all_to_all_rows(slabs, group);  // block i: rank i's heads
  return reshape(contiguous(permute(got, {1, 2, 0, 3})), {B, Tc, P * w});
}

}  // namespace triad::cp
