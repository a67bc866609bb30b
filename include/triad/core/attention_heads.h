#pragma once

#include <cstdint>

namespace triad {

// The heads of a fused attention projection qkv (B, T, (q + 2 kv) * D):
// q query heads, then kv key heads, then kv value heads, each D wide.
// Query head h reads key/value head h / (q / kv): multi-head attention has
// kv == q, grouped-query attention (GQA) 1 <= kv < q with kv dividing q,
// multi-query attention kv == 1. The output (B, T, q * D) has the query
// heads' width.
//
// It also carries the one score transform every attention path must apply
// alike, Gemma 2's logit soft-capping: with softcap > 0 each scaled score s
// becomes softcap * tanh(s / softcap) before the softmax (0: none).
//
// And, as a promise about the call's first keys, a sliding window: with
// window > 0 the doc_starts the attention is given are exactly each query's
// window, max(0, t - window + 1) for the query at position t, with no
// document boundaries in them; an implementation may then mask by the
// window instead of reading them (cuDNN's fused attention does). 0 (the
// default): the first keys are whatever doc_starts says.
struct AttentionHeads {
  int64_t q = 0;
  int64_t kv = 0;
  double softcap = 0.0;
  int64_t window = 0;

  // Multi-head attention: one key/value head per query head. Implicit, so
  // that a plain head count reads as what it always meant.
  AttentionHeads(int64_t n_head) : q(n_head), kv(n_head) {}  // NOLINT(google-explicit-constructor)
  AttentionHeads(int64_t q_heads, int64_t kv_heads) : q(q_heads), kv(kv_heads) {}

  // Query heads per key/value head.
  int64_t group() const { return q / kv; }
  // Heads across qkv's last dimension.
  int64_t fused() const { return q + 2 * kv; }
  bool grouped() const { return kv != q; }
  bool capped() const { return softcap > 0.0; }
  // These heads with the scores soft-capped at `cap`.
  AttentionHeads with_softcap(double cap) const {
    AttentionHeads h = *this;
    h.softcap = cap;
    return h;
  }
  // These heads with the promise that the first keys are a sliding window
  // of `w` keys alone (above); 0: no such promise.
  AttentionHeads with_window(int64_t w) const {
    AttentionHeads h = *this;
    h.window = w;
    return h;
  }

  // The head dimension D of a qkv whose last dimension is `width`, checked
  // for `op`: throws ShapeError naming the numbers when the heads are not
  // valid (q, kv >= 1, kv dividing q) or do not divide `width`, and
  // ValueError when softcap is negative or not finite or window negative.
  int64_t head_dim(int64_t width, const char* op) const;
};

}  // namespace triad
