#include "triad/parallel/context/ring.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "triad/autograd/node.h"
#include "triad/backend/backend.h"
#include "triad/core/error.h"
#include "triad/ops.h"
#include "triad/parallel/context/layout.h"

namespace triad::cp {

using autograd::record;
using autograd::TensorList;

namespace {

// One step's block for one run of this rank's queries: the prefix of the
// source's runs it sees (its first `keys` rows: the runs wholly before the
// queries', and the queries' own run causally), the queries' position in
// that prefix's frame, and each query's first key in it.
struct Block {
  int64_t keys = 0;  // 0: the queries see none of the source's keys
  int64_t query_start = 0;
  Tensor starts;  // (B, run) i32 on the tensors' device, or undefined
};

// `starts` (B, T): the whole sequence's first keys (undefined: none),
// where they are.
Block block_of(const Run& queries, const std::vector<Run>& source, const Tensor& starts) {
  Block block;
  std::vector<Run> seen;
  bool diagonal = false;
  for (const Run& run : source) {
    if (run.first + run.second <= queries.first) {
      seen.push_back(run);
    } else if (run == queries) {
      seen.push_back(run);
      diagonal = true;
    } else if (run.first < queries.first + queries.second) {
      throw ShapeError("ring_attention: key run [" + std::to_string(run.first) + ", " +
                       std::to_string(run.first + run.second) + ") straddles query run [" +
                       std::to_string(queries.first) + ", " +
                       std::to_string(queries.first + queries.second) + ")");
    }
  }
  for (const Run& run : seen) block.keys += run.second;
  if (block.keys == 0) return block;
  block.query_start = diagonal ? block.keys - queries.second : block.keys;
  if (!starts.defined()) return block;
  // A key position s in the block's frame: the seen keys before it, the sum
  // over the seen runs of clamp(s - first, 0, count). Worked out where the
  // starts are (no copy to the host and back), in f32, exact for positions
  // below 2^24.
  const Tensor s = cast(narrow(starts, 1, queries.first, queries.second), DType::F32).detach();
  Tensor rel;
  for (const Run& run : seen) {
    const Tensor before = clamp(affine(s, 1.0, -static_cast<double>(run.first)), 0.0,
                                static_cast<double>(run.second));
    rel = rel.defined() ? add(rel, before) : before;
  }
  block.starts = contiguous(cast(rel, DType::I32)).detach();
  return block;
}

// The blocks of every step (source rank r - s) for each of this rank's runs.
std::vector<std::vector<Block>> ring_blocks(const Tensor& starts, int64_t T, int64_t r, int64_t P) {
  if (starts.defined() && T >= (int64_t{1} << 24)) {
    throw NotSupportedError("ring_attention: packed documents' or windows' first keys over " +
                            std::to_string(T) +
                            " positions (the ring translates them in f32, exact below 2^24)");
  }
  const std::vector<Run> mine = chunk_runs(T, r, Layout::balanced(P));
  std::vector<std::vector<Block>> blocks(static_cast<size_t>(P));
  for (int64_t s = 0; s < P; ++s) {
    const std::vector<Run> source = chunk_runs(T, (r - s + P) % P, Layout::balanced(P));
    for (const Run& run : mine) blocks[s].push_back(block_of(run, source, starts));
  }
  return blocks;
}

// The rows of a step's keys and values (kv, the source's two half-chunks)
// that `block` sees: all of them, or the first.
Tensor seen_keys(const Tensor& kv, const Block& block) {
  return block.keys == kv.size(1) ? kv : contiguous(narrow(kv, 1, 0, block.keys));
}

// Sends `out` to the next rank and receives `in` from the previous, under
// `tag` (the keys and values 0, their gradients 1: both may be in flight).
dist::WorkPtr pass_on(const dist::ProcessGroupPtr& group, const Tensor& out, Tensor& in,
                      int tag = 0) {
  const int P = group->size(), r = group->rank();
  return group->batch_isend_irecv(
      {{true, out, (r + 1) % P, tag}, {false, in, (r - 1 + P) % P, tag}});
}

}  // namespace

Tensor ring_attention(const Tensor& qkv, const AttentionHeads& heads, const Tensor& starts,
                      const dist::ProcessGroupPtr& group) {
  if (qkv.dim() != 3) {
    throw ShapeError("ring_attention: expected qkv (B, T / P, width), got " +
                     shape_str(qkv.shape()));
  }
  const int64_t D = heads.head_dim(qkv.size(2), "ring_attention");
  const int64_t P = group->size(), r = group->rank();
  const int64_t B = qkv.size(0), Tc = qkv.size(1), T = Tc * P, half = Tc / 2;
  if (starts.defined() && (starts.dim() != 2 || starts.size(1) != T)) {
    throw ShapeError("ring_attention: first keys " + shape_str(starts.shape()) +
                     " must cover the whole sequence of " + std::to_string(T) + " (" +
                     std::to_string(P) + " chunks of " + std::to_string(Tc) + ")");
  }
  if (P == 1) return causal_attention(qkv, heads, starts);
  if (Tc % 2 != 0) {
    throw ShapeError("ring_attention: a rank's " + std::to_string(Tc) +
                     " tokens do not halve into the balanced layout's two half-chunks");
  }
  const int64_t qw = heads.q * D, kvw = 2 * heads.kv * D;
  const DType dtype = qkv.dtype(), stat = stat_dtype(dtype);
  const Device device = qkv.device();
  Backend& be = backend_for(qkv);
  const Tensor x = contiguous(qkv).detach();
  const Tensor own_kv = contiguous(narrow(x, 2, qw, kvw));
  std::vector<Tensor> q(2);
  for (int64_t i = 0; i < 2; ++i) q[i] = contiguous(narrow(narrow(x, 2, 0, qw), 1, i * half, half));
  const Tensor first_keys =
      starts.defined() && starts.device() != device ? to_device(starts, device).detach() : starts;
  const auto blocks = ring_blocks(first_keys, T, r, P);

  std::vector<Tensor> acc(2), lse(2);
  for (int64_t i = 0; i < 2; ++i) {
    acc[i] = zeros({B, half, qw}, stat, device);
    lse[i] = full({B, heads.q, half}, -std::numeric_limits<double>::infinity(), stat, device);
  }
  Tensor kv = own_kv;
  for (int64_t s = 0; s < P; ++s) {
    Tensor next;
    dist::WorkPtr passing;
    if (s + 1 < P) {  // the next step's keys and values travel while this step computes
      next = empty(kv.shape(), dtype, device);
      passing = pass_on(group, kv, next);
    }
    for (int64_t i = 0; i < 2; ++i) {
      const Block& blk = blocks[s][i];
      if (blk.keys == 0) continue;
      const Tensor keys = seen_keys(kv, blk);
      Tensor part = empty({B, half, qw}, stat, device);  // (f32 under halves: no rounding)
      Tensor part_lse = empty({B, heads.q, half}, stat, device);
      be.attention_parts_forward(q[i], keys, heads, blk.query_start, part, part_lse, blk.starts);
      be.attention_merge(acc[i], lse[i], part, part_lse);
    }
    if (passing) {
      passing->wait();
      kv = next;
    }
  }
  Tensor out = cast(concat(acc, 1), dtype);
  const Tensor od = out.detach();
  record("ring_attention", {qkv}, {out},
         [q, own_kv, od, lse, heads, blocks, group, B, Tc, half, qw,
          kvw](const TensorList& g) -> TensorList {
           const int64_t P = group->size();
           const DType dtype = od.dtype(), stat = stat_dtype(dtype);
           const Device device = od.device();
           Backend& be = backend_for(od);
           const Tensor dout = contiguous(g[0]);
           std::vector<Tensor> o(2), gout(2), dq(2);
           for (int64_t i = 0; i < 2; ++i) {
             o[i] = contiguous(narrow(od, 1, i * half, half));
             gout[i] = contiguous(narrow(dout, 1, i * half, half));
             dq[i] = zeros({B, half, qw}, stat, device);
           }
           // The gradient of the keys and values a step holds: this rank's
           // own at step 0; after that the one the previous rank passed on,
           // which travels while the step computes and is waited for only
           // to add the step's share.
           Tensor kv = own_kv;
           Tensor dkv = zeros({B, Tc, kvw}, stat, device), dkv_sent, dkv_in;
           dist::WorkPtr dkv_passing;
           for (int64_t s = 0; s < P; ++s) {
             Tensor next;
             dist::WorkPtr passing;
             if (s + 1 < P) {
               next = empty(kv.shape(), dtype, device);
               passing = pass_on(group, kv, next);
             }
             std::vector<Tensor> shares;  // the step's blocks' key/value gradients
             for (int64_t i = 0; i < 2; ++i) {
               const Block& blk = blocks[s][i];
               if (blk.keys == 0) continue;
               const Tensor keys = seen_keys(kv, blk);
               Tensor gq = empty({B, half, qw}, dtype, device);
               Tensor gkv = empty({B, blk.keys, kvw}, dtype, device);
               be.attention_parts_backward(q[i], keys, o[i], lse[i], gout[i], heads,
                                           blk.query_start, gq, gkv, blk.starts);
               be.accumulate(gq, dq[i]);
               if (blk.keys < Tc)
                 gkv = concat({gkv, zeros({B, Tc - blk.keys, kvw}, dtype, device)}, 1);
               shares.push_back(gkv);
             }
             if (dkv_passing) {
               dkv_passing->wait();
               dkv = dkv_in;
             }
             for (const Tensor& share : shares) be.accumulate(share, dkv);
             // The gradient follows its keys and values to the next rank;
             // after the last step's hop it is back with its owner.
             dkv_sent = dkv;
             dkv_in = empty(dkv.shape(), stat, device);
             dkv_passing = pass_on(group, dkv_sent, dkv_in, 1);
             if (passing) {
               passing->wait();
               kv = next;
             }
           }
           dkv_passing->wait();
           dkv = dkv_in;
           return {concat({cast(concat(dq, 1), dtype), cast(dkv, dtype)}, 2)};
         });
  return out;
}

}  // namespace triad::cp
