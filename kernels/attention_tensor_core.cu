// Causal flash attention on tensor cores (bf16/f16, head dims a multiple of
// 16 up to 256 where the device's shared memory takes them; sm_80+), the
// fast path behind attention.h. The algorithm is
// the SIMT kernels' (online softmax forward; backward recomputing
// probabilities from the log-sum-exp, one pass for dq and one for dk/dv,
// no atomics), but every product runs as 16x16x16 WMMA tiles with f32
// accumulation. A block of 4 warps owns 64 rows (queries, or keys for
// dk/dv); each warp owns 16 of them and streams the other side in tiles of
// 64 through shared memory. Scores are per-warp tiles in shared memory;
// the probabilities (and dS) are rounded to the input type for the second
// product, as FlashAttention does, and written over the scores they come
// from (over_scores), so they take no shared memory of their own. Each lane
// reads its half of a score row in 16-byte loads and writes its
// probabilities in 16-byte stores. Only the tiles on a warp's diagonal, at
// the end of the keys or across a document start or a window's edge
// compare each score's key and query; the tiles wholly inside every row's
// visible keys (most of a long sequence's) take a copy of the loop without
// the comparisons, and give the same bits. dq fetches its next key/value
// tile into registers while it multiplies the current one (RowFetch).
#include <mma.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <type_traits>

#include "attention.h"
#include "attention_layout.cuh"
#include "device_utils.cuh"

namespace triad::kernels {
namespace {

using namespace nvcuda;

constexpr int kWarps = 4;
constexpr int kRows = 16 * kWarps;  // rows a block owns
constexpr int kTile = 64;           // rows of the streamed side per tile
constexpr unsigned kFull = 0xffffffffu;

template <int MAXD>
struct Layout {
  static constexpr int ld_h = MAXD + 8;   // 16-bit rows (ldm multiple of 8, 32-byte aligned tiles)
  static constexpr int ld_s = kTile + 4;  // f32 score rows
  // P and dS as 16-bit rows over the f32 scores they come from (over_scores)
  static constexpr int ld_ps = 2 * ld_s;
};

constexpr size_t align128(size_t n) {
  return (n + 127) / 128 * 128;
}

// Carves consecutive 128-byte aligned arrays out of dynamic shared memory.
class Carver {
 public:
  __device__ explicit Carver(unsigned char* base) : at_(base) {}
  template <class U>
  __device__ U* take(size_t count) {
    U* p = reinterpret_cast<U*>(at_);
    at_ += align128(count * sizeof(U));
    return p;
  }

 private:
  unsigned char* at_;
};

template <class T>
__device__ __forceinline__ T to_half(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 to_half(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half to_half(float v) {
  return __float2half_rn(v);
}

// True when every row of a (T, stride) matrix at `base` starts on a 16-byte
// boundary (then its D columns, a multiple of 16, are whole packs).
template <class T>
__device__ __forceinline__ bool rows_packed(const T* base, int64_t stride) {
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && stride % kPack<T> == 0;
}

// rows [r0, r0 + kRows) of a (T, stride) matrix at `base`, D columns, into
// tile[kRows][ld]; rows past Tn are zero. 16 bytes per access when the rows
// allow it (the tile's rows always do: ld * sizeof(T) is a multiple of 16).
template <class T>
__device__ void load_rows(T* tile, int ld, const T* base, int64_t stride, int64_t r0, int64_t Tn,
                          int D) {
  if (rows_packed(base, stride)) {
    constexpr int V = kPack<T>;
    const int packs = D / V;
    for (int idx = threadIdx.x; idx < kRows * packs; idx += blockDim.x) {
      const int r = idx / packs, d = (idx - r * packs) * V;
      const int64_t row = r0 + r;
      int4 bits = make_int4(0, 0, 0, 0);  // zero is all-zero bits in bf16 and f16
      if (row < Tn) bits = *reinterpret_cast<const int4*>(base + row * stride + d);
      *reinterpret_cast<int4*>(tile + r * ld + d) = bits;
    }
    return;
  }
  for (int idx = threadIdx.x; idx < kRows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    const int64_t row = r0 + r;
    tile[r * ld + d] = row < Tn ? base[row * stride + d] : to_half<T>(0.0f);
  }
}

// The blocks dk/dv's columns are split over (grid z): two above head dim
// 128, each holding half of dk and dv.
template <int MAXD>
constexpr int kv_column_parts() {
  return MAXD > 128 ? 2 : 1;
}

// The next tile of kRows rows (D columns) of a (Tn, stride) matrix,
// fetched into the block's registers by fetch() and written into a shared
// tile by put(): a loop fetches its next tile as soon as it has put the
// current one, so those loads are in flight while the warps multiply. Rows
// past Tn are zero; rows not on 16-byte boundaries are not held (put()
// copies them then, as load_rows does).
//
// A tile takes kRows * MAXD / 512 int4 registers a thread; above head dim
// 128 nothing is held (dq's accumulators take those registers) and put()
// loads the rows itself. Only dq holds
// its tiles: its shared memory caps it at 4, 3 and 2 blocks a
// multiprocessor at MAXD 32, 64 and 128, which its registers holding K and
// V (ptxas, sm_90: 128, 168 and 255) still allow. The forward (4 blocks at
// MAXD 64 by its 126 registers; 168 holding) and dk/dv (about 250 registers
// at MAXD 128 already) would each lose a block.
template <class T, int MAXD>
class RowFetch {
 public:
  __device__ RowFetch(const T* base, int64_t stride, int64_t Tn, int D)
      : base_(base), stride_(stride), Tn_(Tn), D_(D), held_(kHold && rows_packed(base, stride)) {}

  __device__ void fetch(int64_t r0) {
    r0_ = r0;
    if (!held_) return;
    const int packs = D_ / V;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int idx = threadIdx.x + i * kThreads, r = idx / packs, d = (idx - r * packs) * V;
      bits_[i] = make_int4(0, 0, 0, 0);  // zero is all-zero bits in bf16 and f16
      if (idx < kRows * packs && r0 + r < Tn_) {
        bits_[i] = *reinterpret_cast<const int4*>(base_ + (r0 + r) * stride_ + d);
      }
    }
  }

  __device__ void put(T* tile, int ld) const {
    if (!held_) {
      load_rows(tile, ld, base_, stride_, r0_, Tn_, D_);
      return;
    }
    const int packs = D_ / V;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int idx = threadIdx.x + i * kThreads, r = idx / packs, d = (idx - r * packs) * V;
      if (idx < kRows * packs) *reinterpret_cast<int4*>(tile + r * ld + d) = bits_[i];
    }
  }

 private:
  static constexpr int V = kPack<T>, kThreads = 32 * kWarps;
  static constexpr bool kHold = MAXD <= 128;
  static constexpr int kPer = kHold ? (kRows * MAXD / V + kThreads - 1) / kThreads : 1;
  const T* base_;
  int64_t stride_, Tn_, r0_ = 0;
  int D_;
  bool held_;
  int4 bits_[kPer] = {};
};

// n consecutive values (a multiple of 8) times `factor` from f32 `src` to
// `dst`, 16 bytes per store when `packed`.
template <class T>
__device__ __forceinline__ void store_scaled(T* dst, const float* src, int n, float factor,
                                             bool packed) {
  if (packed) {
    constexpr int V = kPack<T>;
    for (int c = 0; c < n; c += V) {
      float v[V];
      for (int k = 0; k < V; ++k) v[k] = src[c + k] * factor;
      store_n<V>(dst, c, v);
    }
    return;
  }
  for (int c = 0; c < n; ++c) store(dst, c, src[c] * factor);
}

// A lane takes a row's scores in runs: n consecutive f32 (n a multiple of
// 4) from 16-byte aligned shared memory, 4 per load, and n values rounded
// to T (as to_half rounds) into 16-byte aligned 16-bit slots, 8 per store.
// Every warp's rows and each lane's half of a row start on 16 bytes.
constexpr int kRun = 8;  // the columns of one 16-byte store of T
template <int N>
__device__ __forceinline__ void load_run(const float* src, float (&v)[N]) {
  static_assert(N % 4 == 0, "runs of whole 16-byte loads");
#pragma unroll
  for (int j = 0; j < N; j += 4) {
    float f[4];
    load_n<4>(src, j, f);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[j + k] = f[k];
  }
}
template <class T, int N>
__device__ __forceinline__ void store_run(T* dst, const float (&v)[N]) {
  static_assert(N % kRun == 0 && kPack<T> == kRun, "runs of whole 16-byte stores");
#pragma unroll
  for (int j = 0; j < N; j += kRun) {
    float f[kRun];
#pragma unroll
    for (int k = 0; k < kRun; ++k) f[k] = v[j + k];
    store_n<kRun>(dst, j, f);
  }
}

// Calls body(std::false_type) for a tile no mask touches (`whole`), else
// body(std::true_type): one copy of the per-score loop without the
// comparisons, which most tiles of a long sequence take, and one with them.
template <class F>
__device__ __forceinline__ void masked_or_whole(bool whole, F&& body) {
  if (whole) {
    body(std::false_type{});
  } else {
    body(std::true_type{});
  }
}

template <class T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// out[16][kTile] (f32, ld_s) = A[16 rows of a][D] . B[kTile rows of b][D]^T.
// k outermost: each 16-column slice of the warp's rows is loaded once and
// meets the four key tiles in turn (four accumulators live), instead of once
// per key tile; each output still sums its k slices in order.
template <class T, int MAXD>
__device__ void scores(float* out, const T* a, const T* b, int D) {
  constexpr int ld = Layout<MAXD>::ld_h;
  constexpr int N = kTile / 16;
  FragC c[N];
#pragma unroll
  for (int n = 0; n < N; ++n) wmma::fill_fragment(c[n], 0.0f);
  for (int kk = 0; kk < D / 16; ++kk) {
    FragA<T> fa;
    wmma::load_matrix_sync(fa, a + kk * 16, ld);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      FragBCol<T> fb;
      wmma::load_matrix_sync(fb, b + (n * 16) * ld + kk * 16, ld);
      wmma::mma_sync(c[n], fa, fb, c[n]);
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    wmma::store_matrix_sync(out + n * 16, c[n], Layout<MAXD>::ld_s, wmma::mem_row_major);
  }
}

// Where a warp's P (or dS) goes: over the scores it comes from, so neither
// needs shared memory of its own. Lane (r, half) writes its 32 16-bit values
// over the first 64 of the 128 bytes its 32 f32 scores took: bytes no other
// lane reads, and, a run of 8 at a time, only scores it has already read.
// Row r then holds columns 0-31 at 16-bit index r * ld_ps and columns 32-63
// 64 after (p_slice).
template <class T>
__device__ __forceinline__ T* over_scores(float* tile, int ld_s, int r, int col) {
  const int half = col / 32;
  return reinterpret_cast<T*>(tile + r * ld_s + half * 32) + (col - half * 32);
}
// The 16-column slice kk of such a tile.
template <class T>
__device__ __forceinline__ const T* p_slice(const float* tile, int kk) {
  return reinterpret_cast<const T*>(tile) + (kk / 2) * 64 + (kk % 2) * 16;
}

// acc[dn] += P[16][kTile] . M[kTile][dn*16 : dn*16+16] for every dn < D/16
// (N of them at most: MAXD / 16, or a half of them, M then from its column),
// P written over the scores at `p` (over_scores): each 16-key slice of P is
// loaded once for all dn (kk outermost); each accumulator still takes its
// kk slices in order.
template <class T, int MAXD, int N>
__device__ void accumulate(FragC (&acc)[N], const float* p, const T* m, int D) {
  constexpr int ld = Layout<MAXD>::ld_h;
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    FragA<T> fa;
    wmma::load_matrix_sync(fa, p_slice<T>(p, kk), Layout<MAXD>::ld_ps);
#pragma unroll
    for (int dn = 0; dn < N; ++dn) {
      if (dn >= D / 16) break;
      FragBRow<T> fb;
      wmma::load_matrix_sync(fb, m + (kk * 16) * ld + dn * 16, ld);
      wmma::mma_sync(acc[dn], fa, fb, acc[dn]);
    }
  }
}

// Writes the warp's accumulators (16 rows) to global rows, each times its
// lane's `factor` (lanes 2r and 2r+1 hold row r's): row r goes to
// dst + (first_row + r) * stride, columns dn*16 .. dn*16+15.
template <class T, int MAXD, int N>
__device__ void write_rows(FragC (&acc)[N], float* stage, T* dst, int64_t stride, int64_t first_row,
                           int64_t Tn, int D, float factor) {
  const int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
  const bool packed = rows_packed(dst, stride);
#pragma unroll
  for (int dn = 0; dn < N; ++dn) {
    if (dn >= D / 16) break;
    wmma::store_matrix_sync(stage, acc[dn], Layout<MAXD>::ld_s, wmma::mem_row_major);
    __syncwarp();
    const int64_t row = first_row + r;
    if (row < Tn) {
      store_scaled(dst + row * stride + dn * 16 + half * 8,
                   stage + r * Layout<MAXD>::ld_s + half * 8, 8, factor, packed);
    }
    __syncwarp();
  }
}

// Each row's softmax is taken relative to a reference maximum `m` that moves
// only when a tile's scores exceed it by more than kSlack (natural log), so
// the probabilities stay below e^kSlack (about 3000: no overflow in f32 or,
// rounded for the product, f16) and the output accumulators stay in
// registers across tiles: they pass through shared memory to be rescaled
// only on the tiles where some row of the warp moves its maximum (the first
// tile and, after that, rarely). The result is exact whatever the reference:
// output and log-sum-exp are both taken relative to the same `m`.
constexpr float kSlack = 8.0f;

// acc[dn] (16 rows) times this lane's row factor `corr`, through `stage`
// (16 x 16 f32 at ld_s): lane (r, half) scales row r's columns half*8 ..
// half*8+7 of each 16-column slice.
template <int MAXD>
__device__ void scale_rows(FragC (&acc)[MAXD / 16], float* stage, int D, float corr) {
  const int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
#pragma unroll
  for (int dn = 0; dn < MAXD / 16; ++dn) {
    if (dn >= D / 16) break;
    wmma::store_matrix_sync(stage, acc[dn], Layout<MAXD>::ld_s, wmma::mem_row_major);
    __syncwarp();
    float* row = stage + r * Layout<MAXD>::ld_s + half * 8;
#pragma unroll
    for (int c = 0; c < 8; ++c) row[c] *= corr;
    __syncwarp();
    wmma::load_matrix_sync(acc[dn], stage, Layout<MAXD>::ld_s, wmma::mem_row_major);
    __syncwarp();
  }
}

// Packed documents (null `starts`: one per query row) for a block of
// queries from position q0, a warp's from warp_q0 and a lane's query q: the
// first key tile the block needs (starts never decrease along a row), the
// start of the warp's first row (tiles wholly before it are skipped) and the
// query's own. Tn: the keys.
struct DocWindow {
  int64_t block_first_key = 0, warp_first_start = 0, warp_last_start = 0, start = 0;
  __device__ DocWindow(const int32_t* starts, int b, const QkvLayout& lay, int64_t Tn, int64_t q0,
                       int64_t warp_q0, int64_t q) {
    if (!starts) return;
    const int32_t* row = starts + b * lay.qrows;  // position t at row t - first
    const int64_t f = lay.first, end = lay.query_end();
    block_first_key = row[q0 - f] / kTile * kTile;
    warp_first_start = warp_q0 < end ? row[warp_q0 - f] : Tn;
    // (the latest start of the warp's rows: its last row before the end)
    warp_last_start = warp_q0 < end ? row[min(warp_q0 + 15, end - 1) - f] : 0;
    start = q < end ? row[q - f] : 0;
  }
  // Whether every key of [k0, k0 + kTile) is visible to every row of a
  // warp whose first query is warp_q0: none in its future, none past Tn,
  // none before its rows' document starts.
  __device__ bool whole_tile(int64_t k0, int64_t warp_q0, int64_t Tn) const {
    return k0 + kTile <= warp_q0 + 1 && k0 + kTile <= Tn && k0 >= warp_last_start;
  }
};

// O: out's type (T, or f32: AttentionShape::out_f32).
template <class T, int MAXD, class O>
__global__ void __launch_bounds__(32 * kWarps)
    attn_forward_tc(const T* qsrc, const T* kvsrc, O* out, float* lse, const int32_t* starts,
                    int64_t Tn, QkvLayout lay, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = Layout<MAXD>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carver carve(smem);
  T* Qs = carve.take<T>(kRows * L::ld_h);
  T* Ks = carve.take<T>(kTile * L::ld_h);
  T* Vs = carve.take<T>(kTile * L::ld_h);
  float* Ss = carve.take<float>(kWarps * 16 * L::ld_s);  // scores, then P over them
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
  const int D = lay.D;
  const GridPlace at = grid_place<true>((lay.qrows + kRows - 1) / kRows);
  const int bh = at.pair, b = bh / lay.NH, h = bh % lay.NH;
  const T* kv_row = lay.kv_batch(kvsrc, b, Tn);
  const T* k_base = kv_row + lay.k(h / lay.G);
  const T* v_base = kv_row + lay.v(h / lay.G);
  // The last query rows see the most keys: their blocks go first.
  const int64_t q0 = lay.first + at.row_block * kRows;
  // out's and lse's rows (from position first)
  const int64_t Tq = lay.qrows, qend = lay.query_end();
  load_rows(Qs, L::ld_h, lay.q_batch(qsrc, b) + lay.q(h), lay.qs, q0 - lay.first, lay.qrows, D);
  float* Sw = Ss + warp * 16 * L::ld_s;
  const T* Qw = Qs + warp * 16 * L::ld_h;
  const int64_t q = q0 + warp * 16 + r;
  const int64_t warp_last = q0 + warp * 16 + 15;
  const DocWindow docs(starts, b, lay, Tn, q0, q0 + warp * 16, q);
  FragC o[MAXD / 16];
#pragma unroll
  for (int dn = 0; dn < MAXD / 16; ++dn) wmma::fill_fragment(o[dn], 0.0f);
  float m = -INFINITY, l = 0.0f;
  const int64_t end = min(Tn, q0 + kRows);
  for (int64_t k0 = docs.block_first_key; k0 < end; k0 += kTile) {
    __syncthreads();
    load_rows(Ks, L::ld_h, k_base, lay.kvs, k0, Tn, D);
    load_rows(Vs, L::ld_h, v_base, lay.kvs, k0, Tn, D);
    __syncthreads();
    if (k0 > warp_last) continue;  // every key of this tile is in the warp's future
    if (k0 + kTile <= docs.warp_first_start) continue;  // or in its rows' earlier documents
    scores<T, MAXD>(Sw, Qw, Ks, D);
    __syncwarp();
    float s[32];
    load_run(Sw + r * L::ld_s + half * 32, s);
    float sum = 0.0f, corr = 1.0f;
    masked_or_whole(docs.whole_tile(k0, q0 + warp * 16, Tn), [&](auto masked) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int64_t key = k0 + half * 32 + j;
        if constexpr (masked) {
          s[j] = (key <= q && key < Tn && key >= docs.start) ? lay.capped(s[j] * scale) : -INFINITY;
        } else {
          s[j] = lay.capped(s[j] * scale);
        }
        tile_max = fmaxf(tile_max, s[j]);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFull, tile_max, 1));
      // (A row with no key here, or none yet, has tile_max -inf and stays.)
      const bool move = tile_max > m + kSlack;
      const float m_new = move ? tile_max : m;
      corr = move && m != -INFINITY ? __expf(m - m_new) : 1.0f;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        // (A whole tile's scores are finite, and so is its maximum.)
        s[j] = masked && s[j] == -INFINITY ? 0.0f : __expf(s[j] - m_new);
        sum += s[j];
      }
      m = m_new;
    });
    sum += __shfl_xor_sync(kFull, sum, 1);
    l = l * corr + sum;
    __syncwarp();  // (every lane has read its scores out of Sw)
    // (rescaling stages through Sw: before P goes there)
    if (__any_sync(kFull, corr != 1.0f)) scale_rows<MAXD>(o, Sw, D, corr);
    store_run(over_scores<T>(Sw, L::ld_s, r, half * 32), s);
    __syncwarp();
    accumulate<T, MAXD>(o, Sw, Vs, D);
    __syncwarp();
  }
  // (A query that sees no key: out 0, lse -inf.)
  write_rows<O, MAXD>(o, Sw, out + b * Tq * lay.C + h * D, lay.C, q0 - lay.first + warp * 16, Tq, D,
                      l > 0.0f ? 1.0f / l : 0.0f);
  if (q < qend && half == 0) {
    lse[int64_t(bh) * Tq + q - lay.first] = l > 0.0f ? m + logf(l) : -INFINITY;
  }
#else
  __trap();  // dispatched only on sm_80 and newer
#endif
}

template <class T, int MAXD>
__global__ void __launch_bounds__(32 * kWarps)
    attn_dq_tc(const T* qsrc, const T* kvsrc, const T* dout, const float* lse, const float* delta,
               const int32_t* starts, T* dq_out, int64_t Tn, QkvLayout lay, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = Layout<MAXD>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carver carve(smem);
  T* Qs = carve.take<T>(kRows * L::ld_h);
  T* dOs = carve.take<T>(kRows * L::ld_h);
  T* Ks = carve.take<T>(kTile * L::ld_h);
  T* Vs = carve.take<T>(kTile * L::ld_h);
  float* Ss = carve.take<float>(kWarps * 16 * L::ld_s);
  float* dPs = carve.take<float>(kWarps * 16 * L::ld_s);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
  const int D = lay.D;
  const GridPlace at = grid_place<true>((lay.qrows + kRows - 1) / kRows);
  const int bh = at.pair, b = bh / lay.NH, h = bh % lay.NH;
  const T* kv_row = lay.kv_batch(kvsrc, b, Tn);
  const T* k_base = kv_row + lay.k(h / lay.G);
  const T* v_base = kv_row + lay.v(h / lay.G);
  // The last query rows see the most keys: their blocks go first.
  const int64_t q0 = lay.first + at.row_block * kRows;
  // dout's, lse's and delta's rows (from position first)
  const int64_t Tq = lay.qrows, qend = lay.query_end();
  load_rows(Qs, L::ld_h, lay.q_batch(qsrc, b) + lay.q(h), lay.qs, q0 - lay.first, lay.qrows, D);
  load_rows(dOs, L::ld_h, dout + b * Tq * lay.C + h * D, lay.C, q0 - lay.first, Tq, D);
  float* Sw = Ss + warp * 16 * L::ld_s;
  float* dPw = dPs + warp * 16 * L::ld_s;
  const int64_t q = q0 + warp * 16 + r;
  const float lq = q < qend ? lse[int64_t(bh) * Tq + q - lay.first] : 0.0f;
  const float dq_delta = q < qend ? delta[int64_t(bh) * Tq + q - lay.first] : 0.0f;
  const int64_t warp_last = q0 + warp * 16 + 15;
  const DocWindow docs(starts, b, lay, Tn, q0, q0 + warp * 16, q);
  FragC acc[MAXD / 16];
#pragma unroll
  for (int dn = 0; dn < MAXD / 16; ++dn) wmma::fill_fragment(acc[dn], 0.0f);
  const int64_t end = min(Tn, q0 + kRows);
  // (the next tile's loads in flight under this one's work: RowFetch)
  RowFetch<T, MAXD> kf(k_base, lay.kvs, Tn, D), vf(v_base, lay.kvs, Tn, D);
  kf.fetch(docs.block_first_key);
  vf.fetch(docs.block_first_key);
  for (int64_t k0 = docs.block_first_key; k0 < end; k0 += kTile) {
    __syncthreads();
    kf.put(Ks, L::ld_h);
    vf.put(Vs, L::ld_h);
    __syncthreads();
    if (k0 + kTile < end) {
      kf.fetch(k0 + kTile);
      vf.fetch(k0 + kTile);
    }
    if (k0 > warp_last) continue;
    if (k0 + kTile <= docs.warp_first_start) continue;
    scores<T, MAXD>(Sw, Qs + warp * 16 * L::ld_h, Ks, D);
    scores<T, MAXD>(dPw, dOs + warp * 16 * L::ld_h, Vs, D);
    __syncwarp();
    // (A whole tile's rows are all queries before the end as well.)
    const bool whole = docs.whole_tile(k0, q0 + warp * 16, Tn) && warp_last < qend;
    masked_or_whole(whole, [&](auto masked) {
      // In runs of 8 columns (16 bytes of dS), few registers held.
      for (int c0 = half * 32; c0 < half * 32 + 32; c0 += kRun) {
        float z[kRun], dp[kRun];
        load_run(Sw + r * L::ld_s + c0, z);
        load_run(dPw + r * L::ld_s + c0, dp);
#pragma unroll
        for (int j = 0; j < kRun; ++j) {
          const int64_t key = k0 + c0 + j;
          const float zj = lay.capped(z[j] * scale);
          float p = __expf(zj - lq);
          if constexpr (masked) {
            if (!(key <= q && key < Tn && q < qend && key >= docs.start)) p = 0.0f;
          }
          z[j] = p * (dp[j] - dq_delta) * lay.cap_slope(zj);  // dS
        }
        store_run(over_scores<T>(Sw, L::ld_s, r, c0), z);  // dS over the scores
      }
    });
    __syncwarp();
    accumulate<T, MAXD>(acc, Sw, Ks, D);
  }
  __syncwarp();  // (the last dS read before Sw stages the output)
  write_rows<T, MAXD>(acc, Sw, dq_out + b * lay.qrows * lay.qs + lay.q(h), lay.qs,
                      q0 - lay.first + warp * 16, lay.qrows, D, scale);
#else
  __trap();
#endif
}

template <class T, int MAXD>
__global__ void __launch_bounds__(32 * kWarps)
    attn_dkdv_tc(const T* qsrc, const T* kvsrc, const T* dout, const float* lse, const float* delta,
                 const int32_t* starts, T* dkv_out, int64_t Tn, QkvLayout lay, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = Layout<MAXD>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carver carve(smem);
  T* Ks = carve.take<T>(kRows * L::ld_h);
  T* Vs = carve.take<T>(kRows * L::ld_h);
  T* Qs = carve.take<T>(kTile * L::ld_h);
  T* dOs = carve.take<T>(kTile * L::ld_h);
  float* Lq = carve.take<float>(kTile);
  float* Dq = carve.take<float>(kTile);
  int* Sq = carve.take<int>(kTile);  // the queries' document starts
  float* Sts = carve.take<float>(kWarps * 16 * L::ld_s);
  float* dPts = carve.take<float>(kWarps * 16 * L::ld_s);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
  const int D = lay.D;
  const GridPlace at = grid_place<false>((Tn + kRows - 1) / kRows);
  const int bkv = at.pair, b = bkv / lay.NKV, kvh = bkv % lay.NKV;
  const T* kv_row = lay.kv_batch(kvsrc, b, Tn);
  const T* q_batch = lay.q_batch(qsrc, b);
  // The first key rows meet the most queries: their blocks go first.
  const int64_t k0 = at.row_block * kRows;
  load_rows(Ks, L::ld_h, kv_row + lay.k(kvh), lay.kvs, k0, Tn, D);
  load_rows(Vs, L::ld_h, kv_row + lay.v(kvh), lay.kvs, k0, Tn, D);
  float* Stw = Sts + warp * 16 * L::ld_s;
  float* dPtw = dPts + warp * 16 * L::ld_s;
  const int64_t key = k0 + warp * 16 + r;
  // Above 128 the block sums one half of dk's and dv's columns (blockIdx.z),
  // so its accumulators take the registers a head of 128 takes; both halves
  // compute every score.
  constexpr int kParts = kv_column_parts<MAXD>(), N = MAXD / 16 / kParts;
  const int col0 = static_cast<int>(blockIdx.z) * (MAXD / kParts);
  FragC dk[N], dv[N];
#pragma unroll
  for (int dn = 0; dn < N; ++dn) {
    wmma::fill_fragment(dk[dn], 0.0f);
    wmma::fill_fragment(dv[dn], 0.0f);
  }
  // dout's, lse's, delta's and doc_starts' rows (from position first)
  const int64_t Tq = lay.qrows, qend = lay.query_end();
  const int32_t* row_starts = starts ? starts + b * Tq : nullptr;
  const int64_t block_last_key = min(Tn, k0 + kRows) - 1;
  // The query heads of this key/value head's group, one after another.
  for (int h = kvh * lay.G; h < (kvh + 1) * lay.G; ++h) {
    const int64_t bh = int64_t(b) * lay.NH + h;
    const T* qbase = q_batch + lay.q(h);
    const T* dbase = dout + b * Tq * lay.C + h * D;
    for (int64_t q0 = max(k0, lay.first); q0 < qend; q0 += kTile) {
      // Queries from here on belong to documents after every key of the block.
      if (row_starts && row_starts[q0 - lay.first] > block_last_key) break;
      __syncthreads();
      load_rows(Qs, L::ld_h, qbase, lay.qs, q0 - lay.first, lay.qrows, D);
      load_rows(dOs, L::ld_h, dbase, lay.C, q0 - lay.first, Tq, D);
      for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
        const int64_t qi = q0 + i;
        Lq[i] = qi < qend ? lse[bh * Tq + qi - lay.first] : 0.0f;
        Dq[i] = qi < qend ? delta[bh * Tq + qi - lay.first] : 0.0f;
        Sq[i] = row_starts && qi < qend ? row_starts[qi - lay.first] : 0;
      }
      __syncthreads();
      scores<T, MAXD>(Stw, Ks + warp * 16 * L::ld_h, Qs, D);
      scores<T, MAXD>(dPtw, Vs + warp * 16 * L::ld_h, dOs, D);
      __syncwarp();
      // Whole: every query of the tile after the warp's last key and before
      // the end, every key before Tn, and the tile's last (latest) document
      // start at or before the warp's first key.
      const int64_t warp_k0 = k0 + warp * 16;
      const bool whole = q0 >= warp_k0 + 15 && q0 + kTile <= qend && warp_k0 + 16 <= Tn &&
                         Sq[kTile - 1] <= warp_k0;
      masked_or_whole(whole, [&](auto masked) {
        // In runs of 8 columns (16 bytes of P and of dS), few registers held.
        for (int c0 = half * 32; c0 < half * 32 + 32; c0 += kRun) {
          float z[kRun], dp[kRun], lq[kRun], dq[kRun];
          load_run(Stw + r * L::ld_s + c0, z);
          load_run(dPtw + r * L::ld_s + c0, dp);
          load_run(Lq + c0, lq);
          load_run(Dq + c0, dq);
#pragma unroll
          for (int j = 0; j < kRun; ++j) {
            const float zj = lay.capped(z[j] * scale);
            float p = __expf(zj - lq[j]);
            if constexpr (masked) {
              const int64_t qi = q0 + c0 + j;
              if (!(qi >= key && qi < qend && key < Tn && Sq[c0 + j] <= key)) p = 0.0f;
            }
            z[j] = p;
            dp[j] = p * (dp[j] - dq[j]) * lay.cap_slope(zj);  // dS
          }
          store_run(over_scores<T>(Stw, L::ld_s, r, c0), z);    // P over S^T
          store_run(over_scores<T>(dPtw, L::ld_s, r, c0), dp);  // dS over dP^T
        }
      });
      __syncwarp();
      accumulate<T, MAXD>(dv, Stw, dOs + col0, D - col0);
      accumulate<T, MAXD>(dk, dPtw, Qs + col0, D - col0);
    }
  }
  __syncwarp();  // (the last P read before Stw stages the output)
  T* dst = dkv_out + b * Tn * lay.kvs;
  write_rows<T, MAXD>(dk, Stw, dst + lay.k(kvh) + col0, lay.kvs, k0 + warp * 16, Tn, D - col0,
                      scale);
  write_rows<T, MAXD>(dv, Stw, dst + lay.v(kvh) + col0, lay.kvs, k0 + warp * 16, Tn, D - col0,
                      1.0f);
#else
  __trap();
#endif
}

// attention_grid: every head's blocks of one causal length run side by
// side, the longest first, so the short ones fill the last wave instead of
// the longest starting last. The forward and dq passes take the query rows,
// the dk/dv pass every row (`rows` = T) and `heads` = the key/value heads.
dim3 tc_grid(const AttentionShape& s, int64_t heads, int64_t rows, int parts = 1) {
  return attention_grid(s.B * heads, (rows + kRows - 1) / kRows, parts);
}

template <int MAXD, class T>
constexpr size_t forward_bytes() {
  using L = Layout<MAXD>;
  return align128(kRows * L::ld_h * sizeof(T)) + 2 * align128(kTile * L::ld_h * sizeof(T)) +
         align128(kWarps * 16 * L::ld_s * sizeof(float));
}
template <int MAXD, class T>
constexpr size_t dq_bytes() {
  using L = Layout<MAXD>;
  return 2 * align128(kRows * L::ld_h * sizeof(T)) + 2 * align128(kTile * L::ld_h * sizeof(T)) +
         2 * align128(kWarps * 16 * L::ld_s * sizeof(float));
}
template <int MAXD, class T>
constexpr size_t dkdv_bytes() {
  using L = Layout<MAXD>;
  return 2 * align128(kRows * L::ld_h * sizeof(T)) + 2 * align128(kTile * L::ld_h * sizeof(T)) +
         2 * align128(kTile * sizeof(float)) + align128(kTile * sizeof(int)) +
         2 * align128(kWarps * 16 * L::ld_s * sizeof(float));
}

// A block's shared memory at a compiled width: its largest pass's (dk/dv).
template <int MAXD>
constexpr size_t shared_bytes() {
  static_assert(sizeof(__nv_bfloat16) == sizeof(__half));
  return std::max({forward_bytes<MAXD, __nv_bfloat16>(), dq_bytes<MAXD, __nv_bfloat16>(),
                   dkdv_bytes<MAXD, __nv_bfloat16>()});
}
// What attention.h promises: 64 within sm_86's 99 KiB, 128 within sm_80's
// 163 KiB, 256 within sm_90's 227 KiB.
static_assert(shared_bytes<64>() <= 99 * 1024 && shared_bytes<128>() <= 163 * 1024 &&
              shared_bytes<256>() <= 227 * 1024);

template <class K>
void allow(K kernel, size_t bytes) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)),
             "attention (tensor cores): cudaFuncSetAttribute");
}

template <class F>
void dispatch_tc(ScalarType type, int64_t D, F&& f) {
  auto width = [&](auto t) {
    if (D <= 32) return f(t, std::integral_constant<int, 32>{});
    if (D <= 64) return f(t, std::integral_constant<int, 64>{});
    if (D <= 128) return f(t, std::integral_constant<int, 128>{});
    return f(t, std::integral_constant<int, 256>{});
  };
  if (type == ScalarType::BF16) return width(__nv_bfloat16{});
  return width(__half{});
}

}  // namespace

size_t attention_tensor_core_shared_bytes(int64_t head_dim) {
  if (head_dim <= 32) return shared_bytes<32>();
  if (head_dim <= 64) return shared_bytes<64>();
  if (head_dim <= 128) return shared_bytes<128>();
  return shared_bytes<256>();
}

void attention_forward_tensor_core(const void* q, const void* kv, void* out, float* lse,
                                   ScalarType type, const AttentionShape& s, cudaStream_t stream,
                                   const int32_t* doc_starts) {
  require(check_attention_tensor_core(type, s, AttentionDevice::current()),
          "attention_forward (tensor cores)");
  if (s.B * s.query_rows() == 0) return;
  const int D = static_cast<int>(s.head_dim());
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const dim3 grid = tc_grid(s, s.NH, s.query_rows());
  dispatch_tc(type, D, [&](auto t, auto width) {
    using T = decltype(t);
    constexpr int MAXD = decltype(width)::value;
    const size_t bytes = forward_bytes<MAXD, T>();
    const auto run = [&](auto* o) {
      using O = std::remove_pointer_t<decltype(o)>;
      allow(attn_forward_tc<T, MAXD, O>, bytes);
      attn_forward_tc<T, MAXD, O><<<grid, 32 * kWarps, bytes, stream>>>(
          static_cast<const T*>(q), static_cast<const T*>(kv), o, lse, doc_starts, s.T,
          QkvLayout::of(s), scale);
    };
    if (s.out_f32) {
      run(static_cast<float*>(out));
    } else {
      run(static_cast<T*>(out));
    }
  });
  check_launch("attention_forward (tensor cores)");
}

void attention_backward_tensor_core(const void* q, const void* kv, const void* dout,
                                    const float* lse, const float* delta, void* dq, void* dkv,
                                    ScalarType type, const AttentionShape& s, cudaStream_t stream,
                                    const int32_t* doc_starts) {
  require(check_attention_tensor_core(type, s, AttentionDevice::current()),
          "attention_backward (tensor cores)");
  if (s.B * s.query_rows() == 0) return;  // (attention_backward has zeroed dqkv)
  const int D = static_cast<int>(s.head_dim());
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const dim3 grid = tc_grid(s, s.NH, s.query_rows());
  const QkvLayout lay = QkvLayout::of(s);
  dispatch_tc(type, D, [&](auto t, auto width) {
    using T = decltype(t);
    constexpr int MAXD = decltype(width)::value;
    const T* pq = static_cast<const T*>(q);
    const T* pkv = static_cast<const T*>(kv);
    const T* pdo = static_cast<const T*>(dout);
    const size_t dq_smem = dq_bytes<MAXD, T>(), dkdv_smem = dkdv_bytes<MAXD, T>();
    allow(attn_dq_tc<T, MAXD>, dq_smem);
    allow(attn_dkdv_tc<T, MAXD>, dkdv_smem);
    attn_dq_tc<T, MAXD><<<grid, 32 * kWarps, dq_smem, stream>>>(
        pq, pkv, pdo, lse, delta, doc_starts, static_cast<T*>(dq), s.T, lay, scale);
    const dim3 kv_grid = tc_grid(s, s.kv_heads(), s.T, kv_column_parts<MAXD>());
    attn_dkdv_tc<T, MAXD><<<kv_grid, 32 * kWarps, dkdv_smem, stream>>>(
        pq, pkv, pdo, lse, delta, doc_starts, static_cast<T*>(dkv), s.T, lay, scale);
  });
  check_launch("attention_backward (tensor cores)");
}

}  // namespace triad::kernels
