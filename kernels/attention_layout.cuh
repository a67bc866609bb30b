#pragma once

// Where one (batch, query head)'s vectors sit in attention's tensors, for
// the SIMT and tensor-core kernels alike: qkv rows W = C + 2 * NKV * D wide
// ([q | k | v]), or the queries (C wide, from row `first` on) and the keys and
// values (2 NKV D wide) in tensors of their own (AttentionShape::separate);
// out/dout rows C = NH * D wide, and query head h reading key/value head
// h / G (G = NH / NKV query heads per key/value head; 1 for multi-head
// attention).
#include <cstdint>

#include "attention.h"

namespace triad::kernels {

struct QkvLayout {
  int64_t C = 0;  // out's row: NH * D
  int64_t W = 0;  // qkv's row
  int NH = 0, NKV = 0, G = 1, D = 0;
  float cap = 0.0f;  // the scores' soft cap (0: none)
  // The first query's position (AttentionShape::Q0; 0 in a fused qkv): the
  // query at position t is out's, lse's, dout's and doc_starts' row t - first.
  int64_t first = 0;
  // The queries' tensor: position t at row t - first of qrows per batch, qs
  // apart (the fused qkv: qrows T, qs W). The keys' and values': row t at
  // row t, kvs apart, k from column kc (fused: W apart, from C).
  int64_t qs = 0, qrows = 0, kvs = 0, kc = 0;
  // One past the last query's position.
  __host__ __device__ int64_t query_end() const { return first + qrows; }

  static QkvLayout of(const AttentionShape& s) {
    QkvLayout l;
    l.C = s.C;
    l.W = s.qkv_width();
    l.NH = static_cast<int>(s.NH);
    l.NKV = static_cast<int>(s.kv_heads());
    l.G = l.NH / l.NKV;
    l.D = static_cast<int>(s.head_dim());
    l.cap = static_cast<float>(s.softcap);
    l.first = s.Q0;
    if (s.separate) {
      l.qs = l.C;
      l.qrows = s.query_rows();
      l.kvs = 2 * int64_t(l.NKV) * l.D;
      l.kc = 0;
    } else {
      l.qs = l.W;
      l.qrows = s.T;
      l.kvs = l.W;
      l.kc = l.C;
    }
    return l;
  }
  // A scaled score soft-capped: cap * tanh(s / cap), or s without a cap.
  __device__ __forceinline__ float capped(float s) const {
    return cap > 0.0f ? cap * tanhf(s / cap) : s;
  }
  // The cap's derivative at a capped score z: 1 - (z / cap)^2, or 1.
  __device__ __forceinline__ float cap_slope(float z) const {
    if (cap <= 0.0f) return 1.0f;
    const float r = z / cap;
    return 1.0f - r * r;
  }
  // Column offsets: query head h's q within a query row, and the k and v of
  // key/value head kv within a key/value row.
  __host__ __device__ int64_t q(int h) const { return int64_t(h) * D; }
  __host__ __device__ int64_t k(int kv) const { return kc + int64_t(kv) * D; }
  __host__ __device__ int64_t v(int kv) const { return kc + int64_t(NKV + kv) * D; }
  // Batch b's first query row and first key/value row.
  template <class T>
  __host__ __device__ const T* q_batch(const T* q, int b) const {
    return q + int64_t(b) * qrows * qs;
  }
  template <class T>
  __host__ __device__ const T* kv_batch(const T* kv, int b, int64_t Tn) const {
    return kv + int64_t(b) * Tn * kvs;
  }
};

}  // namespace triad::kernels
