#pragma once

// Where one (batch, query head)'s vectors sit in attention's tensors, for
// the SIMT and tensor-core kernels alike: qkv rows W = C + 2 * NKV * D wide
// ([q | k | v]), out/dout rows C = NH * D wide, and query head h reading
// key/value head h / G (G = NH / NKV query heads per key/value head; 1 for
// multi-head attention).
#include <cstdint>

#include "attention.h"

namespace triad::kernels {

struct QkvLayout {
  int64_t C = 0;  // out's row: NH * D
  int64_t W = 0;  // qkv's row
  int NH = 0, NKV = 0, G = 1, D = 0;

  static QkvLayout of(const AttentionShape& s) {
    QkvLayout l;
    l.C = s.C;
    l.W = s.qkv_width();
    l.NH = static_cast<int>(s.NH);
    l.NKV = static_cast<int>(s.kv_heads());
    l.G = l.NH / l.NKV;
    l.D = static_cast<int>(s.head_dim());
    return l;
  }
  // Column offsets within a qkv row: query head h's q, and the k and v of
  // key/value head kv.
  __host__ __device__ int64_t q(int h) const { return int64_t(h) * D; }
  __host__ __device__ int64_t k(int kv) const { return C + int64_t(kv) * D; }
  __host__ __device__ int64_t v(int kv) const { return C + int64_t(NKV + kv) * D; }
};

}  // namespace triad::kernels
