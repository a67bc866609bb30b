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

// Attention's grids are flat along x: block x takes (batch, head) pair
// x % pairs and row block x / pairs in launch order, so the blocks of one
// row-block index run side by side over every head. Neither B * heads nor
// the row blocks meet y's limit of 65535; check_attention bounds their
// product by x's, 2^31 - 1. z stays free (the tensor-core dk/dv's column
// halves).
struct GridPlace {
  int pair;           // b * heads + head
  int64_t row_block;  // its rows: [row_block * rows, ...)
};

// This block's place in a grid of `blocks` row blocks a pair, its row blocks
// in order (dk/dv: the first keys meet the most queries) or the last first
// (LastFirst: the causal forward's and dq's, whose last query rows see the
// most keys). (x and the counts are below 2^31: unsigned 32-bit division.)
template <bool LastFirst>
__device__ __forceinline__ GridPlace grid_place(int64_t blocks) {
  const unsigned x = blockIdx.x, n = static_cast<unsigned>(blocks), pairs = gridDim.x / n;
  const unsigned order = x / pairs;
  return {static_cast<int>(x - order * pairs),
          static_cast<int64_t>(LastFirst ? n - 1 - order : order)};
}

// The grid for `pairs` (batch, head) pairs of `row_blocks` blocks each, z
// `parts` deep (check_attention has kept pairs * row_blocks within
// kAttentionMaxGridX).
inline dim3 attention_grid(int64_t pairs, int64_t row_blocks, int parts = 1) {
  return dim3(static_cast<unsigned>(pairs * row_blocks), 1u, static_cast<unsigned>(parts));
}

}  // namespace triad::kernels
