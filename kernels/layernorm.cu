// LayerNorm and RMSNorm: one warp per row for the row-wise parts
// (statistics, y, dx); the weight and bias gradients are column sums done in
// two deterministic stages. RMSNorm is LayerNorm with the mean taken as 0 and
// no bias: the same kernels take it when `mean` is null (and bias, dbias,
// the bias partials with it), a branch the whole warp takes alike. Up to kFusedMaxC columns the
// backward is two launches: one pass over the rows computes dx and, in each warp's own slice of
// shared memory, the column sums of its rows (no atomics), which each block adds in warp order into
// its partial row; the second adds the blocks' partials in order. Wider rows take three: dx, the
// column sums per row chunk, the chunks in order.
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "device_utils.cuh"
#include "layernorm.h"

namespace triad::kernels {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int64_t kChunks = 64;   // row chunks of the column-sum stage
// The fused backward: warps per block (each block's warps stride over the
// rows), and the widest row whose per-warp column sums fit 48 KiB of shared
// memory (2 floats per column per warp). Its blocks: as many as the device
// holds at once (fused_blocks), at most one per 16 rows (partial_rows);
// kFusedBlocks where the device cannot be asked.
constexpr int kFusedWarps = 4;
constexpr int64_t kFusedBlocks = 512;
constexpr int64_t kFusedMaxC = 48 * 1024 / (2 * kFusedWarps * int64_t(sizeof(float)));
// The widest row whose dx column sums (a third slice) fit as well.
constexpr int64_t kDxSumsMaxC = 48 * 1024 / (3 * kFusedWarps * int64_t(sizeof(float)));

// Each lane of a row's warp takes the packs of V columns at lane * V, then
// every 32 * V columns after (V divides C; the launcher checks alignment).
//
// Rows of up to kRowPacks * 32 * V columns (1024 in bf16/f16 packs, 512 in
// f32's) are held: a lane issues every load of its part of the row at once
// and keeps the bits in registers for the passes that follow (the forward's
// mean, variance and output; the backward's two). The row then costs one
// wait on memory, where the loop over packs waits once per pack and pass
// (on the H200 the fused backward ran at 40% of the bandwidth that way).
// Wider or unpacked rows take the loop. The sums are taken in the same order
// either way, so both give the same bits.
constexpr int kRowPacks = 4;

template <class T, int V>
constexpr bool holds_row(int64_t C) {
  return V == kPack<T> && C <= int64_t(kRowPacks) * 32 * V;
}

// The per-pack arithmetic both ways of walking a row share.
// y = (x - mu) * rs * (w + woff) + b, into xv.
template <int V>
__device__ __forceinline__ void normalize_pack(float (&xv)[V], const float (&wv)[V],
                                               const float (&bv)[V], float mu, float rs,
                                               float woff) {
  for (int k = 0; k < V; ++k) xv[k] = (xv[k] - mu) * rs * (wv[k] + woff) + bv[k];
}
// The backward's first pass: mg += dy * w', mgx += dy * w' * xhat.
template <int V>
__device__ __forceinline__ void add_row_means(const float (&g)[V], const float (&xv)[V],
                                              const float (&wv)[V], float mu, float rs, float woff,
                                              float& mg, float& mgx) {
  for (int k = 0; k < V; ++k) {
    const float gw = g[k] * (wv[k] + woff);
    mg += gw;
    mgx += gw * (xv[k] - mu) * rs;
  }
}
// The backward's second pass: dx (into xv) + extra, calling
// each(slot + k, dy, xhat, dx) for each element.
template <int V, class F>
__device__ __forceinline__ void dx_pack(const float (&g)[V], float (&xv)[V], const float (&wv)[V],
                                        const float (&extra)[V], float mu, float rs, float mg,
                                        float mgx, float woff, int64_t slot, F&& each) {
  for (int k = 0; k < V; ++k) {
    const float xhat = (xv[k] - mu) * rs;
    xv[k] = rs * (g[k] * (wv[k] + woff) - mg - xhat * mgx) + extra[k];
    each(slot + k, g[k], xhat, xv[k]);
  }
}

template <int V, class T>
__device__ __forceinline__ void ln_forward_row(const T* xr, const T* w, const T* b, T* yr,
                                               float* mean, float* rstd, int64_t C, float eps,
                                               const T* rr, T* hr, float woff, int64_t row,
                                               int lane) {
  const bool rms = mean == nullptr;
  if (rr) {
    // The fused residual add: each lane writes its elements of the sum and
    // reads back only those, so the row needs no synchronisation.
    for (int64_t i = lane * V; i < C; i += 32 * V) {
      float xv[V], rv[V];
      load_n<V>(xr, i, xv);
      load_n<V>(rr, i, rv);
      for (int k = 0; k < V; ++k) xv[k] += rv[k];
      store_n<V>(hr, i, xv);
    }
    xr = hr;
  }
  float mu = 0;
  if (!rms) {
    float s = 0;
    for (int64_t i = lane * V; i < C; i += 32 * V) {
      float xv[V];
      load_n<V>(xr, i, xv);
      for (int k = 0; k < V; ++k) s += xv[k];
    }
    mu = warp_sum(s) / static_cast<float>(C);
  }
  float v = 0;
  for (int64_t i = lane * V; i < C; i += 32 * V) {
    float xv[V];
    load_n<V>(xr, i, xv);
    for (int k = 0; k < V; ++k) v += (xv[k] - mu) * (xv[k] - mu);
  }
  const float rs = rsqrtf(warp_sum(v) / static_cast<float>(C) + eps);
  for (int64_t i = lane * V; i < C; i += 32 * V) {
    float xv[V], wv[V], bv[V] = {};
    load_n<V>(xr, i, xv);
    load_n<V>(w, i, wv);
    if (!rms) load_n<V>(b, i, bv);
    normalize_pack(xv, wv, bv, mu, rs, woff);
    store_n<V>(yr, i, xv);
  }
  if (lane == 0) {
    if (!rms) mean[row] = mu;
    rstd[row] = rs;
  }
}

// The forward of a held row: x (and the residual) loaded at once; the sum,
// rounded to T as it is stored, is what the statistics see, as in the loop.
template <int V, class T>
__device__ __forceinline__ void ln_forward_row_held(const T* xr, const T* w, const T* b, T* yr,
                                                    float* mean, float* rstd, int64_t C, float eps,
                                                    const T* rr, T* hr, float woff, int64_t row,
                                                    int lane) {
  const bool rms = mean == nullptr;
  Pack<V, T> xb[kRowPacks] = {}, rb[kRowPacks] = {};
#pragma unroll
  for (int p = 0; p < kRowPacks; ++p) {
    const int64_t i = (int64_t(p) * 32 + lane) * V;
    if (i < C) {
      xb[p] = load_bits<V>(xr, i);
      if (rr) rb[p] = load_bits<V>(rr, i);
    }
  }
  if (rr) {
#pragma unroll
    for (int p = 0; p < kRowPacks; ++p) {
      const int64_t i = (int64_t(p) * 32 + lane) * V;
      if (i < C) {
        float xv[V], rv[V];
        unpack_n<V, T>(xb[p], xv);
        unpack_n<V, T>(rb[p], rv);
        for (int k = 0; k < V; ++k) xv[k] += rv[k];
        xb[p] = pack_n<V, T>(xv);
        *reinterpret_cast<Pack<V, T>*>(hr + i) = xb[p];
      }
    }
  }
  float mu = 0;
  if (!rms) {
    float s = 0;
#pragma unroll
    for (int p = 0; p < kRowPacks; ++p) {
      if ((int64_t(p) * 32 + lane) * V < C) {
        float xv[V];
        unpack_n<V, T>(xb[p], xv);
        for (int k = 0; k < V; ++k) s += xv[k];
      }
    }
    mu = warp_sum(s) / static_cast<float>(C);
  }
  float v = 0;
#pragma unroll
  for (int p = 0; p < kRowPacks; ++p) {
    if ((int64_t(p) * 32 + lane) * V < C) {
      float xv[V];
      unpack_n<V, T>(xb[p], xv);
      for (int k = 0; k < V; ++k) v += (xv[k] - mu) * (xv[k] - mu);
    }
  }
  const float rs = rsqrtf(warp_sum(v) / static_cast<float>(C) + eps);
#pragma unroll
  for (int p = 0; p < kRowPacks; ++p) {
    const int64_t i = (int64_t(p) * 32 + lane) * V;
    if (i < C) {
      float xv[V], wv[V], bv[V] = {};
      unpack_n<V, T>(xb[p], xv);
      load_n<V>(w, i, wv);
      if (!rms) load_n<V>(b, i, bv);
      normalize_pack(xv, wv, bv, mu, rs, woff);
      store_n<V>(yr, i, xv);
    }
  }
  if (lane == 0) {
    if (!rms) mean[row] = mu;
    rstd[row] = rs;
  }
}

template <class T, int V, bool Held>
__global__ void ln_forward_kernel(const T* x, const T* w, const T* b, T* y, float* mean,
                                  float* rstd, int64_t N, int64_t C, float eps, const T* residual,
                                  T* sum, float woff) {
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* rr = residual ? residual + row * C : nullptr;
  T* hr = residual ? sum + row * C : nullptr;
  if constexpr (Held) {
    ln_forward_row_held<V>(x + row * C, w, b, y + row * C, mean, rstd, C, eps, rr, hr, woff, row,
                           lane);
  } else {
    ln_forward_row<V>(x + row * C, w, b, y + row * C, mean, rstd, C, eps, rr, hr, woff, row, lane);
  }
}

// The lane's elements of a row are its "slots": slot j * V + k is column
// (j * 32 + lane) * V + k. The fused backward keeps a warp's column sums
// slot-major ([slot][lane]), so the 32 lanes touch 32 consecutive floats.
__host__ __device__ __forceinline__ int64_t slots_per_lane(int64_t C, int v) {
  return (C + 32 * v - 1) / (32 * v) * v;
}
__device__ __forceinline__ int64_t slot_index(int64_t c, int v) {
  return ((c / (32 * v)) * v + c % v) * 32 + (c / v) % 32;
}

// dx for one row (a warp; dx = the norm's input gradient + dsum when
// given), calling each(slot, dy, xhat) for every element the lane writes.
// RMSNorm (mean null): mu = 0 and no mean(dy * w) term.
template <int V, class T, class F>
__device__ __forceinline__ void ln_backward_row(const T* dy, const T* x, const T* w,
                                                const float* mean, const float* rstd, T* dx,
                                                int64_t C, const T* dsum, int64_t row, int lane,
                                                float woff, F&& each) {
  const T* xr = x + row * C;
  const T* gr = dy + row * C;
  const float mu = mean ? mean[row] : 0.0f, rs = rstd[row];
  float mg = 0, mgx = 0;  // the row means of dy * w and dy * w * xhat
  for (int64_t i = lane * V; i < C; i += 32 * V) {
    float g[V], xv[V], wv[V];
    load_n<V>(gr, i, g);
    load_n<V>(xr, i, xv);
    load_n<V>(w, i, wv);
    add_row_means(g, xv, wv, mu, rs, woff, mg, mgx);
  }
  mg = mean ? warp_sum(mg) / static_cast<float>(C) : 0.0f;
  mgx = warp_sum(mgx) / static_cast<float>(C);
  T* out = dx + row * C;
  int64_t slot = 0;
  for (int64_t i = lane * V; i < C; i += 32 * V, slot += V) {
    float g[V], xv[V], wv[V], extra[V] = {};
    load_n<V>(gr, i, g);
    load_n<V>(xr, i, xv);
    load_n<V>(w, i, wv);
    if (dsum) load_n<V>(dsum + row * C, i, extra);
    dx_pack(g, xv, wv, extra, mu, rs, mg, mgx, woff, slot, each);
    store_n<V>(out, i, xv);
  }
}

// ln_backward_row for a held row: dy, x (and dsum) loaded at once, both
// passes over the held bits, each(slot, ...) in the same slot order.
template <int V, class T, class F>
__device__ __forceinline__ void ln_backward_row_held(const T* dy, const T* x, const T* w,
                                                     const float* mean, const float* rstd, T* dx,
                                                     int64_t C, const T* dsum, int64_t row,
                                                     int lane, float woff, F&& each) {
  const int64_t at = row * C;
  Pack<V, T> gb[kRowPacks] = {}, xb[kRowPacks] = {}, sb[kRowPacks] = {};
#pragma unroll
  for (int p = 0; p < kRowPacks; ++p) {
    const int64_t i = (int64_t(p) * 32 + lane) * V;
    if (i < C) {
      gb[p] = load_bits<V>(dy + at, i);
      xb[p] = load_bits<V>(x + at, i);
      if (dsum) sb[p] = load_bits<V>(dsum + at, i);
    }
  }
  const float mu = mean ? mean[row] : 0.0f, rs = rstd[row];
  float mg = 0, mgx = 0;  // the row means of dy * w and dy * w * xhat
#pragma unroll
  for (int p = 0; p < kRowPacks; ++p) {
    const int64_t i = (int64_t(p) * 32 + lane) * V;
    if (i < C) {
      float g[V], xv[V], wv[V];
      unpack_n<V, T>(gb[p], g);
      unpack_n<V, T>(xb[p], xv);
      load_n<V>(w, i, wv);
      add_row_means(g, xv, wv, mu, rs, woff, mg, mgx);
    }
  }
  mg = mean ? warp_sum(mg) / static_cast<float>(C) : 0.0f;
  mgx = warp_sum(mgx) / static_cast<float>(C);
  T* out = dx + at;
#pragma unroll
  for (int p = 0; p < kRowPacks; ++p) {
    const int64_t i = (int64_t(p) * 32 + lane) * V;
    if (i < C) {
      float g[V], xv[V], wv[V], extra[V] = {};
      unpack_n<V, T>(gb[p], g);
      unpack_n<V, T>(xb[p], xv);
      load_n<V>(w, i, wv);
      if (dsum) unpack_n<V, T>(sb[p], extra);
      dx_pack(g, xv, wv, extra, mu, rs, mg, mgx, woff, int64_t(p) * V, each);
      store_n<V>(out, i, xv);
    }
  }
}

template <class T, int V>
__global__ void ln_backward_dx_kernel(const T* dy, const T* x, const T* w, const float* mean,
                                      const float* rstd, T* dx, int64_t N, int64_t C, const T* dsum,
                                      float woff) {
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + (threadIdx.x >> 5);
  if (row >= N) return;
  ln_backward_row<V>(dy, x, w, mean, rstd, dx, C, dsum, row, threadIdx.x & 31, woff,
                     [](int64_t, float, float, float) {});
}

// The block's partial rows of the column sums (part_w/part_b/part_d
// [blockIdx.x][c]) from its warps' slices of shared memory
// ([warp][slice][slot][lane], the weight's, the bias's if any, dx's if
// SumDx), the warps added in order. Every thread of the block calls, after
// the barrier that ends the slices' writes.
template <int V, bool SumDx>
__device__ __forceinline__ void write_block_partials(const float* sums, int64_t slice, int64_t C,
                                                     float* part_w, float* part_b, float* part_d) {
  const int d_slice = part_b ? 2 : 1, per_warp = d_slice + (SumDx ? 1 : 0);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const int64_t at = slot_index(c, V);
    float a = 0, b = 0, d = 0;
    for (int k = 0; k < kFusedWarps; ++k) {
      a += sums[k * per_warp * slice + at];
      if (part_b) b += sums[(k * per_warp + 1) * slice + at];
      if constexpr (SumDx) d += sums[(k * per_warp + d_slice) * slice + at];
    }
    part_w[blockIdx.x * C + c] = a;
    if (part_b) part_b[blockIdx.x * C + c] = b;
    if constexpr (SumDx) part_d[blockIdx.x * C + c] = d;
  }
}

// dx for rows blockIdx.x * kFusedWarps + warp, then every gridDim.x *
// kFusedWarps rows after, and part_w/part_b[blockIdx.x][c]: the column sums
// of dy * xhat and dy over the block's rows, in a fixed order (part_b null
// for RMSNorm, whose warps then keep one sum per column).
template <class T, int V, bool Held, bool SumDx>
__global__ void __launch_bounds__(32 * kFusedWarps)
    ln_backward_fused_kernel(const T* dy, const T* x, const T* w, const float* mean,
                             const float* rstd, T* dx, int64_t N, int64_t C, const T* dsum,
                             float* part_w, float* part_b, float* part_d, float woff) {
  // [warp][slice][slot][lane]: the weight's sums, then the bias's, then dx's.
  extern __shared__ float sums[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t slice = slots_per_lane(C, V) * 32;
  const int d_slice = part_b ? 2 : 1, per_warp = d_slice + (SumDx ? 1 : 0);
  float* sw = sums + warp * per_warp * slice;
  float* sb = part_b ? sw + slice : nullptr;
  float* sd = sw + d_slice * slice;  // (SumDx)
  // A lane only ever touches its own column [slot][lane] of its warp's
  // slice, so the slice needs no synchronisation until the block sums it.
  for (int64_t i = lane; i < per_warp * slice; i += 32) sw[i] = 0.0f;
  const int64_t stride = int64_t(gridDim.x) * kFusedWarps;
  for (int64_t row = blockIdx.x * int64_t(kFusedWarps) + warp; row < N; row += stride) {
    auto each = [sw, sb, sd, lane](int64_t slot, float g, float xhat, float dxv) {
      sw[slot * 32 + lane] += g * xhat;
      if (sb) sb[slot * 32 + lane] += g;
      if constexpr (SumDx) sd[slot * 32 + lane] += dxv;
    };
    if constexpr (Held) {
      ln_backward_row_held<V>(dy, x, w, mean, rstd, dx, C, dsum, row, lane, woff, each);
    } else {
      ln_backward_row<V>(dy, x, w, mean, rstd, dx, C, dsum, row, lane, woff, each);
    }
  }
  __syncthreads();
  write_block_partials<V, SumDx>(sums, slice, C, part_w, part_b, part_d);
}

// ln_backward_fused_kernel for held rows, with each lane's column sums
// over its rows in registers instead of its warp's slice of shared memory:
// no shared-memory read and write per element and row, for more registers
// (and so fewer blocks a multiprocessor). The warps' sums meet in shared
// memory only at the end, laid out as the fused kernel's slices, and are
// added in the same order: with the same grid, the same bits
// (norm_backward's register_sums).
template <class T, int V, bool SumDx>
__global__ void __launch_bounds__(32 * kFusedWarps)
    ln_backward_register_sums_kernel(const T* dy, const T* x, const T* w, const float* mean,
                                     const float* rstd, T* dx, int64_t N, int64_t C, const T* dsum,
                                     float* part_w, float* part_b, float* part_d, float woff) {
  constexpr int kSlots = kRowPacks * V;  // a held row's elements a lane takes
  extern __shared__ float sums[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t slice = slots_per_lane(C, V) * 32;
  const int d_slice = part_b ? 2 : 1, per_warp = d_slice + (SumDx ? 1 : 0);
  float aw[kSlots] = {}, ab[kSlots] = {}, ad[SumDx ? kSlots : 1] = {};
  const bool bias = part_b != nullptr;
  const int64_t stride = int64_t(gridDim.x) * kFusedWarps;
  for (int64_t row = blockIdx.x * int64_t(kFusedWarps) + warp; row < N; row += stride) {
    // (The held row's loops are unrolled: every slot is a constant, and
    // the sums stay in registers.)
    ln_backward_row_held<V>(dy, x, w, mean, rstd, dx, C, dsum, row, lane, woff,
                            [&](int64_t slot, float g, float xhat, float dxv) {
                              aw[slot] += g * xhat;
                              if (bias) ab[slot] += g;
                              if constexpr (SumDx) ad[slot] += dxv;
                            });
  }
  float* sw = sums + warp * per_warp * slice;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    if (k < slice / 32) {
      sw[k * 32 + lane] = aw[k];
      if (bias) sw[slice + k * 32 + lane] = ab[k];
      if constexpr (SumDx) sw[d_slice * slice + k * 32 + lane] = ad[k];
    }
  }
  __syncthreads();
  write_block_partials<V, SumDx>(sums, slice, C, part_w, part_b, part_d);
}

// partial[chunk][c] sums over rows of that chunk (blockIdx.y = chunk) for
// rows too wide for the fused kernel: tiles of packed columns by row groups
// (device_utils.cuh: add_row_groups).
template <class T, int V>
__global__ void __launch_bounds__(kTilePacks* kRowGroups)
    ln_backward_partial_kernel(const T* dy, const T* x, const float* mean, const float* rstd,
                               float* part_w, float* part_b, int64_t N, int64_t C,
                               int64_t rows_per_chunk) {
  __shared__ float tile_w[kRowGroups * kTilePacks * V], tile_b[kRowGroups * kTilePacks * V];
  const int tx = threadIdx.x % kTilePacks, ty = threadIdx.x / kTilePacks;
  const int64_t tile = blockIdx.x * int64_t(kTilePacks) * V, c0 = tile + int64_t(tx) * V;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = min(N, r0 + rows_per_chunk);
  float sw[V] = {}, sb[V] = {};
  if (c0 < C) {
    for (int64_t r = r0 + ty; r < r1; r += kRowGroups) {
      float g[V], xv[V];
      load_n<V>(dy, r * C + c0, g);
      load_n<V>(x, r * C + c0, xv);
      const float mu = mean ? mean[r] : 0.0f, rs = rstd[r];
      for (int k = 0; k < V; ++k) {
        sw[k] += g[k] * (xv[k] - mu) * rs;
        sb[k] += g[k];
      }
    }
  }
  float* out_w = part_w + blockIdx.y * C + tile;
  add_row_groups(sw, tile_w, [&](int t, float total) {
    if (tile + t < C) out_w[t] = total;
  });
  if (!part_b) return;  // RMSNorm: no bias (the whole block returns here)
  float* out_b = part_b + blockIdx.y * C + tile;
  add_row_groups(sb, tile_b, [&](int t, float total) {
    if (tile + t < C) out_b[t] = total;
  });
}

// dw = beta * dw + the partial rows' sum (beta 0: dw's contents are not
// read), the partials added in a fixed order (add_slices); D is the tensor
// type, or f32 for the f32 gradients of half parameters. part_b and db are
// null for RMSNorm.
template <class D>
__global__ void __launch_bounds__(kFinishCols* kFinishSlices)
    ln_backward_finish_kernel(const float* part_w, const float* part_b, const float* part_d, D* dw,
                              D* db, float* dx_sums, int64_t C, int64_t chunks, float beta) {
  __shared__ float sw_all[kFinishSlices * kFinishCols], sb_all[kFinishSlices * kFinishCols];
  __shared__ float sd_all[kFinishSlices * kFinishCols];
  const int col = threadIdx.x % kFinishCols, slice = threadIdx.x / kFinishCols;
  const int64_t c = blockIdx.x * int64_t(kFinishCols) + col;
  float sw = 0, sb = 0, sd = 0;
  if (c < C) {
#pragma unroll kFinishUnroll
    for (int64_t k = slice; k < chunks; k += kFinishSlices) {
      sw += part_w[k * C + c];
      if (part_b) sb += part_b[k * C + c];
      if (part_d) sd += part_d[k * C + c];
    }
  }
  sw = add_slices(sw, sw_all);
  if (part_b) sb = add_slices(sb, sb_all);
  if (part_d) sd = add_slices(sd, sd_all);
  if (slice != 0 || c >= C) return;
  if (part_d) dx_sums[c] = sd;  // (this backward's own sums: stored, never added)
  if (beta != 0.0f) {
    sw = beta * static_cast<float>(load(dw, c)) + sw;
    if (db) sb = beta * static_cast<float>(load(db, c)) + sb;
  }
  store(dw, c, sw);
  if (db) store(db, c, sb);
}

}  // namespace

Status check_layer_norm(ScalarType type, int64_t N, int64_t C, double eps) {
  if (!is_nn_type(type)) {
    return Status::fail(std::string("element type ") + scalar_name(type) +
                        " is not supported (f32, bf16 or f16)");
  }
  if (N < 0 || C <= 0) {
    return Status::fail("shape (N " + std::to_string(N) + ", C " + std::to_string(C) +
                        ") needs N >= 0 and C > 0");
  }
  if (!(eps > 0)) return Status::fail("eps " + std::to_string(eps) + " must be positive");
  return Status::fine();
}

namespace {
// Both norms' forward (RMSNorm: mean and bias null); `name` for errors.
void norm_forward(const char* name, const void* x, const void* weight, const void* bias, void* y,
                  float* mean, float* rstd, ScalarType type, int64_t N, int64_t C, double eps,
                  cudaStream_t stream, const void* residual, void* sum, double weight_offset) {
  require(check_layer_norm(type, N, C, eps), name);
  if (residual && !sum)
    throw std::invalid_argument(std::string(name) + ": a residual needs a sum output");
  if (N == 0) return;
  dispatch_nn(type, name, [&](auto t) {
    using T = decltype(t);
    const unsigned blocks = static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
    auto launch = [&](auto v) {
      constexpr int V = decltype(v)::value;
      auto run = [&](auto kernel) {
        kernel<<<blocks, 32 * kRowsPerBlock, 0, stream>>>(
            static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias),
            static_cast<T*>(y), mean, rstd, N, C, static_cast<float>(eps),
            static_cast<const T*>(residual), static_cast<T*>(sum),
            static_cast<float>(weight_offset));
      };
      if constexpr (V == kPack<T>) {
        if (holds_row<T, V>(C)) return run(ln_forward_kernel<T, V, true>);
      }
      run(ln_forward_kernel<T, V, false>);
    };
    if (C % kPack<T> == 0 && pack_aligned(x) && pack_aligned(weight) && pack_aligned(bias) &&
        pack_aligned(y) && pack_aligned(residual) && pack_aligned(sum)) {
      launch(std::integral_constant<int, kPack<T>>{});
    } else {
      launch(std::integral_constant<int, 1>{});
    }
  });
  check_launch(name);
}

// The fused backward's blocks on the current device for rows of C: one
// wave, as many as its multiprocessors hold at once by the kernel's
// registers and shared memory (the column sums of the widest pack layout,
// which bounds every type's), asked of the runtime for the bf16 kernel a
// training step runs (80 registers a thread when it holds the row, 40 when
// it loops; the f32 kernels use no more). On the H200 at C 1024 that is 6
// blocks of 4 warps on each multiprocessor; the fixed 512 the kernel once
// had left them 3.9. The count, and so the order the partial sums are added
// in, depends on the device and the shape only. Asked once per device, width
// and number of sums (`dx_sums`: dx's column sums as well, a third slice of
// shared memory) and kernel (`register_sums`: the register-sums kernel's
// own occupancy where the bf16 row is held; a type whose row is not held
// then runs the shared-memory kernel on that grid): every backward sizes
// its workspace and its grid by it.
int64_t fused_blocks(int64_t C, bool dx_sums, bool register_sums) {
  static std::mutex mutex;
  // by (device, C, dx_sums, register_sums)
  static std::map<std::tuple<int, int64_t, bool, bool>, int64_t> known;
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return kFusedBlocks;
  }
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = known.find({device, C, dx_sums, register_sums});
  if (it != known.end()) return it->second;
  const int64_t slots =
      std::max({slots_per_lane(C, 1), slots_per_lane(C, 4), slots_per_lane(C, 8)});
  const size_t smem =
      static_cast<size_t>((dx_sums ? 3 : 2) * kFusedWarps * slots * 32) * sizeof(float);
  using B = __nv_bfloat16;
  constexpr int V = kPack<B>;
  const bool held = holds_row<B, V>(C);
  auto kernel = dx_sums ? (held ? ln_backward_fused_kernel<B, V, true, true>
                                : ln_backward_fused_kernel<B, V, false, true>)
                        : (held ? ln_backward_fused_kernel<B, V, true, false>
                                : ln_backward_fused_kernel<B, V, false, false>);
  if (register_sums && held) {
    kernel = dx_sums ? ln_backward_register_sums_kernel<B, V, true>
                     : ln_backward_register_sums_kernel<B, V, false>;
  }
  // (Beyond 48 KiB a launch would need the attribute set; kFusedMaxC keeps
  // the sums below it.)
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * kFusedWarps, smem) !=
          cudaSuccess ||
      sms <= 0 || per_sm <= 0) {
    cudaGetLastError();
    return kFusedBlocks;
  }
  return known[{device, C, dx_sums, register_sums}] = int64_t(sms) * per_sm;
}

// Partial rows of the column sums: the fused kernel's blocks, or the
// three-launch path's row chunks. The fused kernel takes one wave of blocks
// (fused_blocks), but no more than leave each warp kFusedMinRows rows: every
// block writes a partial row of C floats per sum that the second launch reads
// back, so thinner blocks trade the device's occupancy for that traffic. On
// the H200 a wave (792 blocks at C 1024) ran the 350M norm's 16384 rows
// faster than 512 blocks did (66.7 us against 69.4, 5.2 rows a warp), while
// at 8192 rows of 768 the same wave (2.6 rows a warp) ran at 1.69 TB/s
// against 512 blocks' 2.01.
constexpr int64_t kFusedMinRows = 4;
int64_t partial_rows(int64_t N, int64_t C, bool dx_sums, bool register_sums) {
  if (C <= kFusedMaxC) {
    constexpr int64_t rows_per_block = kFusedWarps * kFusedMinRows;
    return std::min<int64_t>(fused_blocks(C, dx_sums, register_sums),
                             std::max<int64_t>((N + rows_per_block - 1) / rows_per_block, 1));
  }
  return std::min<int64_t>(kChunks, std::max<int64_t>(N, 1));
}

// Both norms' backward (RMSNorm: mean, dbias null; its bias partials too).
void norm_backward(const char* name, const void* dy, const void* x, const void* weight,
                   const float* mean, const float* rstd, void* dx, void* dweight, void* dbias,
                   ScalarType type, int64_t N, int64_t C, void* workspace, cudaStream_t stream,
                   const void* dsum, bool f32_param_grads, double beta, double weight_offset,
                   float* dx_sums, bool register_sums) {
  require(check_layer_norm(type, N, C, 1.0), name);
  if (!workspace) throw std::invalid_argument(std::string(name) + ": workspace is null");
  if (dx_sums && C > kDxSumsMaxC) {
    throw std::invalid_argument(std::string(name) + ": dx's column sums of rows of " +
                                std::to_string(C) + " (at most " + std::to_string(kDxSumsMaxC) +
                                " columns)");
  }
  const int64_t chunks = partial_rows(N, C, dx_sums != nullptr, register_sums);
  const int64_t rows_per_chunk = (N + chunks - 1) / chunks;
  float* part_w = static_cast<float*>(workspace);
  float* part_b = mean ? part_w + chunks * C : nullptr;
  float* part_d = dx_sums ? part_w + 2 * chunks * C : nullptr;
  const bool fused = C <= kFusedMaxC;
  dispatch_nn(type, name, [&](auto t) {
    using T = decltype(t);
    const T* pdy = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    const T* pw = static_cast<const T*>(weight);
    const T* pds = static_cast<const T*>(dsum);
    T* pdx = static_cast<T*>(dx);
    auto launch_rows = [&](auto v) {
      constexpr int V = decltype(v)::value;
      if (fused) {
        // (With no rows the blocks still write their zero partial sums.)
        const int slices = (part_b ? 2 : 1) + (part_d ? 1 : 0);
        const size_t smem =
            static_cast<size_t>(slices * kFusedWarps * slots_per_lane(C, V) * 32) * sizeof(float);
        auto run = [&](auto kernel) {
          kernel<<<static_cast<unsigned>(chunks), 32 * kFusedWarps, smem, stream>>>(
              pdy, px, pw, mean, rstd, pdx, N, C, pds, part_w, part_b, part_d,
              static_cast<float>(weight_offset));
        };
        auto run_held = [&](auto sum_dx) {
          constexpr bool D = decltype(sum_dx)::value;
          if constexpr (V == kPack<T>) {
            if (holds_row<T, V>(C)) {
              if (register_sums) return run(ln_backward_register_sums_kernel<T, V, D>);
              return run(ln_backward_fused_kernel<T, V, true, D>);
            }
          }
          run(ln_backward_fused_kernel<T, V, false, D>);
        };
        if (part_d) {
          run_held(std::true_type{});
        } else {
          run_held(std::false_type{});
        }
      } else if (N > 0) {
        const unsigned blocks = static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
        ln_backward_dx_kernel<T, V><<<blocks, 32 * kRowsPerBlock, 0, stream>>>(
            pdy, px, pw, mean, rstd, pdx, N, C, pds, static_cast<float>(weight_offset));
      }
    };
    auto launch_partials = [&](auto v) {
      constexpr int V = decltype(v)::value;
      const dim3 grid(static_cast<unsigned>((C + kTilePacks * V - 1) / (kTilePacks * V)),
                      static_cast<unsigned>(chunks));
      ln_backward_partial_kernel<T, V><<<grid, kTilePacks * kRowGroups, 0, stream>>>(
          pdy, px, mean, rstd, part_w, part_b, N, C, std::max<int64_t>(rows_per_chunk, 1));
    };
    const bool packed = C % kPack<T> == 0 && pack_aligned(dy) && pack_aligned(x);
    if (packed && pack_aligned(weight) && pack_aligned(dx) && pack_aligned(dsum)) {
      launch_rows(std::integral_constant<int, kPack<T>>{});
    } else {
      launch_rows(std::integral_constant<int, 1>{});
    }
    if (!fused && packed) {
      launch_partials(std::integral_constant<int, kPack<T>>{});
    } else if (!fused) {
      launch_partials(std::integral_constant<int, 1>{});
    }
    const unsigned col_blocks = static_cast<unsigned>((C + kFinishCols - 1) / kFinishCols);
    if (f32_param_grads) {
      ln_backward_finish_kernel<float><<<col_blocks, kFinishCols * kFinishSlices, 0, stream>>>(
          part_w, part_b, part_d, static_cast<float*>(dweight), static_cast<float*>(dbias), dx_sums,
          C, chunks, static_cast<float>(beta));
    } else {
      ln_backward_finish_kernel<T><<<col_blocks, kFinishCols * kFinishSlices, 0, stream>>>(
          part_w, part_b, part_d, static_cast<T*>(dweight), static_cast<T*>(dbias), dx_sums, C,
          chunks, static_cast<float>(beta));
    }
  });
  check_launch(name);
}
}  // namespace

size_t layer_norm_backward_workspace(int64_t N, int64_t C, bool dx_sums, bool register_sums) {
  return static_cast<size_t>((dx_sums ? 3 : 2) * partial_rows(N, C, dx_sums, register_sums) * C) *
         sizeof(float);
}

bool layer_norm_backward_sums_dx(int64_t C) {
  return C > 0 && C <= kDxSumsMaxC;
}

void layer_norm_forward(const void* x, const void* weight, const void* bias, void* y, float* mean,
                        float* rstd, ScalarType type, int64_t N, int64_t C, double eps,
                        cudaStream_t stream, const void* residual, void* sum,
                        double weight_offset) {
  if (!mean || !bias) throw std::invalid_argument("layer_norm_forward: mean and bias are null");
  norm_forward("layer_norm_forward", x, weight, bias, y, mean, rstd, type, N, C, eps, stream,
               residual, sum, weight_offset);
}

void layer_norm_backward(const void* dy, const void* x, const void* weight, const float* mean,
                         const float* rstd, void* dx, void* dweight, void* dbias, ScalarType type,
                         int64_t N, int64_t C, void* workspace, cudaStream_t stream,
                         const void* dsum, bool f32_param_grads, double beta, double weight_offset,
                         float* dx_sums, bool register_sums) {
  if (!mean || !dbias) throw std::invalid_argument("layer_norm_backward: mean and dbias are null");
  norm_backward("layer_norm_backward", dy, x, weight, mean, rstd, dx, dweight, dbias, type, N, C,
                workspace, stream, dsum, f32_param_grads, beta, weight_offset, dx_sums,
                register_sums);
}

void rms_norm_forward(const void* x, const void* weight, void* y, float* rstd, ScalarType type,
                      int64_t N, int64_t C, double eps, cudaStream_t stream, const void* residual,
                      void* sum, double weight_offset) {
  norm_forward("rms_norm_forward", x, weight, nullptr, y, nullptr, rstd, type, N, C, eps, stream,
               residual, sum, weight_offset);
}

void rms_norm_backward(const void* dy, const void* x, const void* weight, const float* rstd,
                       void* dx, void* dweight, ScalarType type, int64_t N, int64_t C,
                       void* workspace, cudaStream_t stream, const void* dsum, bool f32_param_grads,
                       double beta, double weight_offset, bool register_sums) {
  norm_backward("rms_norm_backward", dy, x, weight, nullptr, rstd, dx, dweight, nullptr, type, N, C,
                workspace, stream, dsum, f32_param_grads, beta, weight_offset, nullptr,
                register_sums);
}

}  // namespace triad::kernels
