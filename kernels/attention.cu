// Causal flash attention, one query (forward, dq) or key (dk, dv) per row of
// a block. Tiles of the other side stream through shared memory, stored in
// f32 with rows padded so threads reading their own rows do not collide on
// banks. Head dims are rounded up to a compiled width (32, 64, 128, 256)
// and guarded at run time. Up to 128 a thread owns a row; at 256 two
// adjacent lanes share one, each holding every other dim (so a thread's
// accumulators stay 128 wide) and summing their halves of each dot product
// through a shuffle, and a block owns half the rows and streams tiles half
// as tall, so its shared memory stays within the 99 KiB that sm_86 and
// sm_89 allow.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>
#include <type_traits>

#include "attention.h"
#include "attention_layout.cuh"
#include "device_utils.cuh"

namespace triad::kernels {
namespace {

constexpr int kThreads = 64;  // threads per block

// The layout of a compiled width MAXD: the threads sharing a row (`split`),
// the dims each holds (`per_thread`: dims part, part + split, ...), the
// rows a block owns (queries for the forward and dq, keys for dk/dv), the
// streamed side's rows per shared-memory tile, and a shared-memory row's
// stride (MAXD plus `split` words: the lanes of a warp reading their own
// rows' d-th dims land on distinct banks).
template <int MAXD>
struct Width {
  static constexpr int split = MAXD > 128 ? 2 : 1;
  static constexpr int per_thread = MAXD / split;
  static constexpr int rows = kThreads / split;
  static constexpr int tile = MAXD > 128 ? 16 : 32;
  static constexpr int pad = MAXD + split;
  static_assert(per_thread <= 128 && rows * split == kThreads);
};

// This thread's row within the block and its part of the row's dims.
template <int MAXD>
__device__ __forceinline__ int own_row() {
  return static_cast<int>(threadIdx.x) / Width<MAXD>::split;
}
template <int MAXD>
__device__ __forceinline__ int own_part() {
  return static_cast<int>(threadIdx.x) % Width<MAXD>::split;
}

// Loads rows [r0, r0 + n) of the (B, T, stride) tensor at column `col`
// (D wide) into tile[n][pad] as f32; rows past T are zero.
template <class T, int MAXD>
__device__ void load_rows(float* tile, int n, const T* base, int64_t stride, int64_t r0, int64_t Tn,
                          int D) {
  for (int idx = threadIdx.x; idx < n * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    const int64_t row = r0 + r;
    tile[r * Width<MAXD>::pad + d] = row < Tn ? load(base, row * stride + d) : 0.0f;
  }
}
// A tile of the streamed side, and the block's own rows.
template <class T, int MAXD>
__device__ void load_tile(float* tile, const T* base, int64_t stride, int64_t r0, int64_t Tn,
                          int D) {
  load_rows<T, MAXD>(tile, Width<MAXD>::tile, base, stride, r0, Tn, D);
}
template <class T, int MAXD>
__device__ void load_own(float* own, const T* base, int64_t stride, int64_t r0, int64_t Tn, int D) {
  load_rows<T, MAXD>(own, Width<MAXD>::rows, base, stride, r0, Tn, D);
}

// The first column of the tile at k0 that a query whose document starts at
// `start` may see.
template <int MAXD>
__device__ __forceinline__ int first_in_tile(int64_t start, int64_t k0) {
  constexpr int kTile = Width<MAXD>::tile;
  return static_cast<int>(start <= k0 ? 0 : (start - k0 < kTile ? start - k0 : kTile));
}

// The dot product of two rows' first D dims: this thread's share of them
// (a and b point at its part's first dim; it holds n, `split` apart), then,
// where two lanes share a row, both halves summed, the same bits on both
// lanes (they run every row's loop together).
template <int MAXD>
__device__ __forceinline__ float dot_rows(const float* a, const float* b, int n) {
  using W = Width<MAXD>;
  float s = 0;
#pragma unroll
  for (int k = 0; k < W::per_thread; ++k) {
    if (k < n) s += a[k * W::split] * b[k * W::split];
  }
  if constexpr (W::split == 2) {
    s += __shfl_xor_sync(3u << (threadIdx.x & 30u), s, 1);
  }
  return s;
}

// The dims of D this thread holds (its part's: part, part + split, ...).
template <int MAXD>
__device__ __forceinline__ int own_dims(int D, int part) {
  return (D - part + Width<MAXD>::split - 1) / Width<MAXD>::split;
}

// grid attention_grid(B * NH, ceil((T - first) / rows)), the last rows
// first; dynamic shared memory: own q rows + K, V tiles.
// O: out's type (T, or f32 under halves: AttentionShape::out_f32).
template <class T, int MAXD, class O>
__global__ void __launch_bounds__(kThreads)
    attn_forward_kernel(const T* qsrc, const T* kvsrc, O* out, float* lse, const int32_t* starts,
                        int64_t Tn, QkvLayout L, float scale) {
  using W = Width<MAXD>;
  constexpr int kRows = W::rows, kTile = W::tile, kPad = W::pad, kSplit = W::split;
  extern __shared__ float smem[];
  float* q_own = smem;                    // [kRows][kPad]
  float* k_tile = q_own + kRows * kPad;   // [kTile][kPad]
  float* v_tile = k_tile + kTile * kPad;  // [kTile][kPad]
  const int D = L.D, part = own_part<MAXD>(), n = own_dims<MAXD>(D, part);
  const GridPlace at = grid_place<true>((L.qrows + kRows - 1) / kRows);
  const int bh = at.pair, b = bh / L.NH, h = bh % L.NH;
  const T* q_base = L.q_batch(qsrc, b) + L.q(h);
  const T* kv_row = L.kv_batch(kvsrc, b, Tn);
  const T* k_base = kv_row + L.k(h / L.G);
  const T* v_base = kv_row + L.v(h / L.G);
  const int64_t r0 = L.first + at.row_block * kRows;
  const int64_t i = r0 + own_row<MAXD>();            // this thread's query's position
  const int64_t Tq = L.qrows, qend = L.query_end();  // out's and lse's rows
  load_own<T, MAXD>(q_own, q_base, L.qs, r0 - L.first, L.qrows, D);
  const float* q = q_own + own_row<MAXD>() * kPad + part;
  // Packed documents: this query sees keys [si, i]; the block starts at its
  // first row's document (starts never decrease along a row).
  const int32_t* row_starts = starts ? starts + b * Tq : nullptr;
  const int64_t si = row_starts && i < qend ? row_starts[i - L.first] : 0;
  const int64_t first_key = row_starts ? row_starts[r0 - L.first] / kTile * kTile : 0;

  float acc[W::per_thread];
#pragma unroll
  for (int k = 0; k < W::per_thread; ++k) acc[k] = 0;
  float m = -INFINITY, l = 0;
  const int64_t last_key = min(Tn, r0 + kRows);  // causal: no key past the block's last query
  for (int64_t k0 = first_key; k0 < last_key; k0 += kTile) {
    __syncthreads();
    load_tile<T, MAXD>(k_tile, k_base, L.kvs, k0, Tn, D);
    load_tile<T, MAXD>(v_tile, v_base, L.kvs, k0, Tn, D);
    __syncthreads();
    if (i < qend) {
      for (int j = first_in_tile<MAXD>(si, k0); j < kTile && k0 + j <= i && k0 + j < Tn; ++j) {
        const float* kr = k_tile + j * kPad + part;
        const float* vr = v_tile + j * kPad + part;
        const float s = L.capped(dot_rows<MAXD>(q, kr, n) * scale);
        if (s > m) {
          const float corr = __expf(m - s);  // 0 on the first key (m = -inf)
          l = l * corr + 1.0f;
#pragma unroll
          for (int k = 0; k < W::per_thread; ++k) {
            if (k < n) acc[k] = acc[k] * corr + vr[k * kSplit];
          }
          m = s;
        } else {
          const float p = __expf(s - m);
          l += p;
#pragma unroll
          for (int k = 0; k < W::per_thread; ++k) {
            if (k < n) acc[k] += p * vr[k * kSplit];
          }
        }
      }
    }
  }
  if (i < qend) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // (a query that sees no key: 0, lse -inf)
    O* o = out + (b * Tq + i - L.first) * L.C + h * D;
#pragma unroll
    for (int k = 0; k < W::per_thread; ++k) {
      if (k < n) store(o, part + k * kSplit, acc[k] * inv);
    }
    if (part == 0) lse[int64_t(bh) * Tq + i - L.first] = l > 0.0f ? m + logf(l) : -INFINITY;
  }
}

// delta[bh, t] = sum_d dout[b, t, h, d] * out[b, t, h, d]; one thread per
// (bh, t), reading its head's D values in packs of V (V divides D and C,
// and both tensors are 16-byte aligned, when V > 1).
template <class T, int V>
__global__ void attn_delta_kernel(const T* out, const T* dout, float* delta, int64_t B, int64_t Tn,
                                  int64_t C, int NH, int D) {
  const int64_t total = B * NH * Tn;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx % Tn, bh = idx / Tn, b = bh / NH, h = bh % NH;
    const int64_t off = (b * Tn + t) * C + h * D;
    float s = 0;
    for (int d = 0; d < D; d += V) {
      float g[V], o[V];
      load_n<V>(dout, off + d, g);
      load_n<V>(out, off + d, o);
      for (int k = 0; k < V; ++k) s += g[k] * o[k];
    }
    delta[idx] = s;
  }
}

// dq: grid attention_grid(B * NH, ceil((T - first) / rows)), the last rows
// first, a query per row; K, V tiles stream.
template <class T, int MAXD>
__global__ void __launch_bounds__(kThreads)
    attn_dq_kernel(const T* qsrc, const T* kvsrc, const T* dout, const float* lse,
                   const float* delta, const int32_t* starts, T* dq_out, int64_t Tn, QkvLayout L,
                   float scale) {
  using W = Width<MAXD>;
  constexpr int kRows = W::rows, kTile = W::tile, kPad = W::pad, kSplit = W::split;
  extern __shared__ float smem[];
  float* q_own = smem;
  float* do_own = q_own + kRows * kPad;
  float* k_tile = do_own + kRows * kPad;
  float* v_tile = k_tile + kTile * kPad;
  const int D = L.D, part = own_part<MAXD>(), n = own_dims<MAXD>(D, part);
  const GridPlace at = grid_place<true>((L.qrows + kRows - 1) / kRows);
  const int bh = at.pair, b = bh / L.NH, h = bh % L.NH;
  const T* q_base = L.q_batch(qsrc, b) + L.q(h);
  const T* kv_row = L.kv_batch(kvsrc, b, Tn);
  const T* k_base = kv_row + L.k(h / L.G);
  const T* v_base = kv_row + L.v(h / L.G);
  const int64_t r0 = L.first + at.row_block * kRows;
  const int64_t i = r0 + own_row<MAXD>();
  // dout's, lse's and delta's rows (from position first)
  const int64_t Tq = L.qrows, qend = L.query_end();
  load_own<T, MAXD>(q_own, q_base, L.qs, r0 - L.first, L.qrows, D);
  load_own<T, MAXD>(do_own, dout + b * Tq * L.C + h * D, L.C, r0 - L.first, Tq, D);
  const float* q = q_own + own_row<MAXD>() * kPad + part;
  const float* go = do_own + own_row<MAXD>() * kPad + part;
  const float li = i < qend ? lse[int64_t(bh) * Tq + i - L.first] : 0.0f;
  const float di = i < qend ? delta[int64_t(bh) * Tq + i - L.first] : 0.0f;
  const int32_t* row_starts = starts ? starts + b * Tq : nullptr;  // as in the forward
  const int64_t si = row_starts && i < qend ? row_starts[i - L.first] : 0;
  const int64_t first_key = row_starts ? row_starts[r0 - L.first] / kTile * kTile : 0;

  float dq[W::per_thread];
#pragma unroll
  for (int k = 0; k < W::per_thread; ++k) dq[k] = 0;
  const int64_t last_key = min(Tn, r0 + kRows);
  for (int64_t k0 = first_key; k0 < last_key; k0 += kTile) {
    __syncthreads();
    load_tile<T, MAXD>(k_tile, k_base, L.kvs, k0, Tn, D);
    load_tile<T, MAXD>(v_tile, v_base, L.kvs, k0, Tn, D);
    __syncthreads();
    if (i < qend) {
      for (int j = first_in_tile<MAXD>(si, k0); j < kTile && k0 + j <= i && k0 + j < Tn; ++j) {
        const float* kr = k_tile + j * kPad + part;
        const float* vr = v_tile + j * kPad + part;
        const float z = L.capped(dot_rows<MAXD>(q, kr, n) * scale);
        const float p = __expf(z - li);
        const float ds = p * (dot_rows<MAXD>(go, vr, n) - di) * L.cap_slope(z);
#pragma unroll
        for (int k = 0; k < W::per_thread; ++k) {
          if (k < n) dq[k] += ds * kr[k * kSplit];
        }
      }
    }
  }
  if (i < qend) {
    T* o = dq_out + (b * L.qrows + i - L.first) * L.qs + L.q(h);
#pragma unroll
    for (int k = 0; k < W::per_thread; ++k) {
      if (k < n) store(o, part + k * kSplit, dq[k] * scale);
    }
  }
}

// dk, dv: grid attention_grid(B * NKV, ceil(T / rows)), a key per row; for each query
// head of the key's group in turn, Q, dO tiles (with their lse and delta)
// stream over the queries at or after the block's first key (and the first
// query row), up to the first query of a later document.
template <class T, int MAXD>
__global__ void __launch_bounds__(kThreads)
    attn_dkdv_kernel(const T* qsrc, const T* kvsrc, const T* dout, const float* lse,
                     const float* delta, const int32_t* starts, T* dkv_out, int64_t Tn, QkvLayout L,
                     float scale) {
  using W = Width<MAXD>;
  constexpr int kRows = W::rows, kTile = W::tile, kPad = W::pad, kSplit = W::split;
  extern __shared__ float smem[];
  float* k_own = smem;
  float* v_own = k_own + kRows * kPad;
  float* q_tile = v_own + kRows * kPad;
  float* do_tile = q_tile + kTile * kPad;
  float* l_tile = do_tile + kTile * kPad;                // [kTile]
  float* d_tile = l_tile + kTile;                        // [kTile]
  int* s_tile = reinterpret_cast<int*>(d_tile + kTile);  // [kTile] document starts
  const int D = L.D, part = own_part<MAXD>(), n = own_dims<MAXD>(D, part);
  const GridPlace at = grid_place<false>((Tn + kRows - 1) / kRows);
  const int bkv = at.pair, b = bkv / L.NKV, kvh = bkv % L.NKV;
  const T* kv_row = L.kv_batch(kvsrc, b, Tn);
  const T* q_batch = L.q_batch(qsrc, b);
  const int64_t r0 = at.row_block * kRows;
  const int64_t j = r0 + own_row<MAXD>();  // this thread's key
  load_own<T, MAXD>(k_own, kv_row + L.k(kvh), L.kvs, r0, Tn, D);
  load_own<T, MAXD>(v_own, kv_row + L.v(kvh), L.kvs, r0, Tn, D);
  const float* kr = k_own + own_row<MAXD>() * kPad + part;
  const float* vr = v_own + own_row<MAXD>() * kPad + part;

  float dk[W::per_thread], dv[W::per_thread];
#pragma unroll
  for (int k = 0; k < W::per_thread; ++k) dk[k] = 0, dv[k] = 0;
  // dout's, lse's, delta's and doc_starts' rows (from position first)
  const int64_t Tq = L.qrows, qend = L.query_end();
  const int32_t* row_starts = starts ? starts + b * Tq : nullptr;
  const int64_t block_last_key = min(Tn, r0 + kRows) - 1;
  for (int h = kvh * L.G; h < (kvh + 1) * L.G; ++h) {
    const int64_t bh = int64_t(b) * L.NH + h;
    const T* q_base = q_batch + L.q(h);
    const T* do_base = dout + b * Tq * L.C + h * D;
    for (int64_t q0 = max((r0 / kTile) * kTile, L.first); q0 < qend; q0 += kTile) {
      // Queries from here on belong to documents after every key of the block.
      if (row_starts && row_starts[q0 - L.first] > block_last_key) break;
      __syncthreads();
      load_tile<T, MAXD>(q_tile, q_base, L.qs, q0 - L.first, L.qrows, D);
      load_tile<T, MAXD>(do_tile, do_base, L.C, q0 - L.first, Tq, D);
      for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
        const int64_t qi = q0 + r;
        l_tile[r] = qi < qend ? lse[bh * Tq + qi - L.first] : 0.0f;
        d_tile[r] = qi < qend ? delta[bh * Tq + qi - L.first] : 0.0f;
        s_tile[r] = row_starts && qi < qend ? row_starts[qi - L.first] : 0;
      }
      __syncthreads();
      if (j < Tn) {
        for (int r = 0; r < kTile; ++r) {
          const int64_t qi = q0 + r;
          if (qi < j) continue;                    // causal: only queries at or after this key
          if (qi >= qend || s_tile[r] > j) break;  // past the end, or in a later document
          const float* qr = q_tile + r * kPad + part;
          const float* gr = do_tile + r * kPad + part;
          const float z = L.capped(dot_rows<MAXD>(qr, kr, n) * scale);
          const float p = __expf(z - l_tile[r]);
          const float ds = p * (dot_rows<MAXD>(gr, vr, n) - d_tile[r]) * L.cap_slope(z);
#pragma unroll
          for (int k = 0; k < W::per_thread; ++k) {
            if (k < n) {
              dv[k] += p * gr[k * kSplit];
              dk[k] += ds * qr[k * kSplit];
            }
          }
        }
      }
    }
  }
  if (j < Tn) {
    T* o = dkv_out + (b * Tn + j) * L.kvs;
#pragma unroll
    for (int k = 0; k < W::per_thread; ++k) {
      if (k < n) {
        store(o + L.k(kvh), part + k * kSplit, dk[k] * scale);
        store(o + L.v(kvh), part + k * kSplit, dv[k]);
      }
    }
  }
}

// Dynamic shared memory (bytes) of each kernel: at most 99 KiB at every
// width (dq and dk/dv at 128 and 256 come closest).
template <int MAXD>
constexpr size_t forward_smem() {
  using W = Width<MAXD>;
  return sizeof(float) * (W::rows + 2 * W::tile) * W::pad;
}
template <int MAXD>
constexpr size_t dq_smem() {
  using W = Width<MAXD>;
  return sizeof(float) * (2 * W::rows + 2 * W::tile) * W::pad;
}
template <int MAXD>
constexpr size_t dkdv_smem() {
  using W = Width<MAXD>;
  return sizeof(float) * ((2 * W::rows + 2 * W::tile) * W::pad + 2 * W::tile) +
         sizeof(int) * W::tile;
}
static_assert(dkdv_smem<128>() <= 99 * 1024 && dkdv_smem<256>() <= 99 * 1024 &&
              dq_smem<256>() <= 99 * 1024 && forward_smem<256>() <= 99 * 1024);

// Calls f(std::integral_constant<int, MAXD>) for the narrowest compiled width.
template <class F>
void dispatch_head_dim(int64_t D, F&& f) {
  if (D <= 32) return f(std::integral_constant<int, 32>{});
  if (D <= 64) return f(std::integral_constant<int, 64>{});
  if (D <= 128) return f(std::integral_constant<int, 128>{});
  return f(std::integral_constant<int, 256>{});
}

template <class K>
void allow_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes)),
               "attention: cudaFuncSetAttribute");
  }
}

// Blocks covering `rows` rows at the width of head dim D.
unsigned row_blocks(int64_t rows, int64_t D) {
  unsigned n = 0;
  dispatch_head_dim(D, [&](auto width) {
    constexpr int per = Width<decltype(width)::value>::rows;
    n = static_cast<unsigned>((rows + per - 1) / per);
  });
  return n;
}

}  // namespace

Status check_attention(ScalarType type, const AttentionShape& s) {
  if (!is_nn_type(type)) {
    return Status::fail(std::string("element type ") + scalar_name(type) +
                        " is not supported (f32, bf16 or f16)");
  }
  if (s.B < 0 || s.T < 0 || s.C <= 0 || s.NH <= 0) {
    return Status::fail("shape (B " + std::to_string(s.B) + ", T " + std::to_string(s.T) + ", C " +
                        std::to_string(s.C) + ", NH " + std::to_string(s.NH) +
                        ") needs B, T >= 0 and C, NH > 0");
  }
  if (s.C % s.NH != 0) {
    return Status::fail("C (" + std::to_string(s.C) + ") must be divisible by NH (" +
                        std::to_string(s.NH) + ")");
  }
  if (s.NKV < 0 || s.NH % s.kv_heads() != 0) {
    return Status::fail("NKV (" + std::to_string(s.NKV) + ") must divide NH (" +
                        std::to_string(s.NH) + ")");
  }
  if (s.head_dim() > kAttentionMaxHeadDim) {
    return Status::fail("head dim " + std::to_string(s.head_dim()) + " exceeds " +
                        std::to_string(kAttentionMaxHeadDim));
  }
  if (s.Q0 < 0 || (s.QT < 0 && s.Q0 > s.T)) {
    return Status::fail("first query position Q0 (" + std::to_string(s.Q0) +
                        ") must be >= 0 and, without a query count QT, at most T (" +
                        std::to_string(s.T) + ")");
  }
  if (!s.separate && (s.Q0 > 0 || (s.QT >= 0 && s.QT != s.T))) {
    return Status::fail("a block of queries (Q0 " + std::to_string(s.Q0) + ", QT " +
                        std::to_string(s.QT) +
                        ") needs them apart from the keys and values (separate: the _parts "
                        "functions)");
  }
  // The grids are flat along x (attention_grid): B * NH pairs of row
  // blocks of at least 32 rows (the SIMT kernels' above 128) must fit in it.
  const int64_t rows = std::max(s.T, s.query_rows());
  if (s.B * s.NH > kAttentionMaxGridX / std::max<int64_t>(1, (rows + 31) / 32)) {
    return Status::fail("B * NH (" + std::to_string(s.B * s.NH) + ") heads of " +
                        std::to_string(rows) + " rows at 32 rows a block exceed a grid's " +
                        std::to_string(kAttentionMaxGridX) + " blocks");
  }
  if (s.out_f32 && !s.separate) {
    return Status::fail(
        "an f32 output under half inputs (out_f32) needs the queries apart "
        "(the _parts functions)");
  }
  if (!(s.softcap >= 0.0) || !std::isfinite(s.softcap)) {
    return Status::fail("softcap " + std::to_string(s.softcap) +
                        " must be a finite number >= 0 (0: none)");
  }
  return Status::fine();
}

AttentionDevice AttentionDevice::current() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "attention: cudaGetDevice");
  return of(device);
}

AttentionDevice AttentionDevice::of(int device) {
  int major = 0, shared = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
             "attention: compute capability");
  check_cuda(cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "attention: shared memory a block");
  return {major, shared};
}

Status check_attention_tensor_core(ScalarType type, const AttentionShape& s,
                                   AttentionDevice device) {
  Status base = check_attention(type, s);
  if (!base.ok) return base;
  if (!is_half(type)) {
    return Status::fail(std::string("tensor cores take bf16 or f16, not ") + scalar_name(type));
  }
  if (s.head_dim() % 16 != 0) {
    return Status::fail("head dim " + std::to_string(s.head_dim()) + " is not a multiple of 16");
  }
  if (device.sm_major < 8) {
    return Status::fail("compute capability " + std::to_string(device.sm_major) +
                        ".x has no bf16 tensor cores (needs 8.0 or newer)");
  }
  const size_t need = attention_tensor_core_shared_bytes(s.head_dim());
  if (static_cast<int64_t>(need) > device.shared_bytes) {
    return Status::fail("head dim " + std::to_string(s.head_dim()) + " takes " +
                        std::to_string(need) + " bytes of shared memory a block on tensor cores, " +
                        "and the device allows " + std::to_string(device.shared_bytes) +
                        " (the SIMT kernels take it)");
  }
  return Status::fine();
}

AttentionKernel resolve_attention_kernel(AttentionKernel requested, ScalarType type,
                                         const AttentionShape& s, AttentionDevice device) {
  if (requested == AttentionKernel::Simt) return AttentionKernel::Simt;
  const Status tc = check_attention_tensor_core(type, s, device);
  if (requested == AttentionKernel::TensorCore) {
    require(tc, "attention (tensor cores requested)");
    return AttentionKernel::TensorCore;
  }
  return tc.ok ? AttentionKernel::TensorCore : AttentionKernel::Simt;
}

namespace {

void forward_impl(const void* q, const void* kv, void* out, float* lse, ScalarType type,
                  const AttentionShape& s, cudaStream_t stream, AttentionKernel kernel,
                  const int32_t* doc_starts) {
  if (s.B * s.query_rows() == 0) return;
  if (resolve_attention_kernel(kernel, type, s, AttentionDevice::current()) ==
      AttentionKernel::TensorCore) {
    attention_forward_tensor_core(q, kv, out, lse, type, s, stream, doc_starts);
    return;
  }
  const int D = static_cast<int>(s.head_dim());
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const dim3 grid = attention_grid(s.B * s.NH, row_blocks(s.query_rows(), D));
  dispatch_nn(type, "attention_forward", [&](auto t) {
    using T = decltype(t);
    dispatch_head_dim(D, [&](auto width) {
      constexpr int MAXD = decltype(width)::value;
      const auto run = [&](auto* o) {
        using O = std::remove_pointer_t<decltype(o)>;
        auto kernel = attn_forward_kernel<T, MAXD, O>;
        allow_smem(kernel, forward_smem<MAXD>());
        kernel<<<grid, kThreads, forward_smem<MAXD>(), stream>>>(
            static_cast<const T*>(q), static_cast<const T*>(kv), o, lse, doc_starts, s.T,
            QkvLayout::of(s), scale);
      };
      if constexpr (std::is_same_v<T, float>) {
        run(static_cast<float*>(out));
      } else {
        if (s.out_f32) {
          run(static_cast<float*>(out));
        } else {
          run(static_cast<T*>(out));
        }
      }
    });
  });
  check_launch("attention_forward");
}

// dq and dkv may be one fused dqkv (q and kv then one qkv); the caller has
// zeroed what no query writes.
void backward_impl(const void* q, const void* kv, const void* out, const float* lse,
                   const void* dout, void* dq, void* dkv, ScalarType type, const AttentionShape& s,
                   void* workspace, cudaStream_t stream, AttentionKernel kernel,
                   const int32_t* doc_starts) {
  const int64_t Tq = s.query_rows();
  if (s.B * Tq == 0) return;  // (and no query reads a key)
  const int D = static_cast<int>(s.head_dim());
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const dim3 grid = attention_grid(s.B * s.NH, row_blocks(Tq, D));
  float* delta = static_cast<float*>(workspace);
  const bool tensor_cores = resolve_attention_kernel(kernel, type, s, AttentionDevice::current()) ==
                            AttentionKernel::TensorCore;
  dispatch_nn(type, "attention_backward", [&](auto t) {
    using T = decltype(t);
    const T* pq = static_cast<const T*>(q);
    const T* pkv = static_cast<const T*>(kv);
    const T* pdo = static_cast<const T*>(dout);
    if (D % kPack<T> == 0 && s.C % kPack<T> == 0 && pack_aligned(out) && pack_aligned(pdo)) {
      attn_delta_kernel<T, kPack<T>><<<grid_for(s.B * s.NH * Tq, 256), 256, 0, stream>>>(
          static_cast<const T*>(out), pdo, delta, s.B, Tq, s.C, static_cast<int>(s.NH), D);
    } else {
      attn_delta_kernel<T, 1><<<grid_for(s.B * s.NH * Tq, 256), 256, 0, stream>>>(
          static_cast<const T*>(out), pdo, delta, s.B, Tq, s.C, static_cast<int>(s.NH), D);
    }
    if (tensor_cores) {
      check_launch("attention_backward (delta)");
      attention_backward_tensor_core(q, kv, dout, lse, delta, dq, dkv, type, s, stream, doc_starts);
      return;
    }
    dispatch_head_dim(D, [&](auto width) {
      constexpr int MAXD = decltype(width)::value;
      auto dq_kernel = attn_dq_kernel<T, MAXD>;
      allow_smem(dq_kernel, dq_smem<MAXD>());
      dq_kernel<<<grid, kThreads, dq_smem<MAXD>(), stream>>>(
          pq, pkv, pdo, lse, delta, doc_starts, static_cast<T*>(dq), s.T, QkvLayout::of(s), scale);
      auto dkdv = attn_dkdv_kernel<T, MAXD>;
      allow_smem(dkdv, dkdv_smem<MAXD>());
      const dim3 kv_grid = attention_grid(s.B * s.kv_heads(), row_blocks(s.T, D));
      dkdv<<<kv_grid, kThreads, dkdv_smem<MAXD>(), stream>>>(
          pq, pkv, pdo, lse, delta, doc_starts, static_cast<T*>(dkv), s.T, QkvLayout::of(s), scale);
    });
  });
  check_launch("attention_backward");
}

void require_layout(const AttentionShape& s, bool separate, const char* op) {
  if (s.separate != separate) {
    throw std::invalid_argument(std::string(op) + ": the shape says the queries are " +
                                (s.separate ? "apart (call the _parts function)"
                                            : "in the fused qkv (call the fused function)"));
  }
}

}  // namespace

void attention_forward(const void* qkv, void* out, float* lse, ScalarType type,
                       const AttentionShape& s, cudaStream_t stream, AttentionKernel kernel,
                       const int32_t* doc_starts) {
  require(check_attention(type, s), "attention_forward");
  require_layout(s, false, "attention_forward");
  forward_impl(qkv, qkv, out, lse, type, s, stream, kernel, doc_starts);
}

void attention_forward_parts(const void* q, const void* kv, void* out, float* lse, ScalarType type,
                             const AttentionShape& s, cudaStream_t stream, AttentionKernel kernel,
                             const int32_t* doc_starts) {
  require(check_attention(type, s), "attention_forward_parts");
  require_layout(s, true, "attention_forward_parts");
  forward_impl(q, kv, out, lse, type, s, stream, kernel, doc_starts);
}

size_t attention_backward_workspace(const AttentionShape& s) {
  return static_cast<size_t>(std::max<int64_t>(s.B * s.NH * s.query_rows(), 1)) * sizeof(float);
}

void attention_backward(const void* qkv, const void* out, const float* lse, const void* dout,
                        void* dqkv, ScalarType type, const AttentionShape& s, void* workspace,
                        cudaStream_t stream, AttentionKernel kernel, const int32_t* doc_starts) {
  require(check_attention(type, s), "attention_backward");
  require_layout(s, false, "attention_backward");
  if (!workspace) throw std::invalid_argument("attention_backward: workspace is null");
  if (s.B * s.T == 0) return;
  backward_impl(qkv, qkv, out, lse, dout, dqkv, dqkv, type, s, workspace, stream, kernel,
                doc_starts);
}

void attention_backward_parts(const void* q, const void* kv, const void* out, const float* lse,
                              const void* dout, void* dq, void* dkv, ScalarType type,
                              const AttentionShape& s, void* workspace, cudaStream_t stream,
                              AttentionKernel kernel, const int32_t* doc_starts) {
  require(check_attention(type, s), "attention_backward_parts");
  require_layout(s, true, "attention_backward_parts");
  if (!workspace) throw std::invalid_argument("attention_backward_parts: workspace is null");
  if (s.B == 0) return;
  if (s.T == 0) {  // no key: every query's gradient is zero
    check_cuda(
        cudaMemsetAsync(dq, 0, static_cast<size_t>(s.B * s.query_rows() * s.C) * scalar_size(type),
                        stream),
        "attention_backward_parts: cudaMemsetAsync");
    return;
  }
  if (s.query_rows() == 0) {  // no query: every key's and value's gradient is zero
    check_cuda(cudaMemsetAsync(dkv, 0,
                               static_cast<size_t>(s.B * s.T * 2 * s.kv_heads() * s.head_dim()) *
                                   scalar_size(type),
                               stream),
               "attention_backward_parts: cudaMemsetAsync");
    return;
  }
  backward_impl(q, kv, out, lse, dout, dq, dkv, type, s, workspace, stream, kernel, doc_starts);
}

}  // namespace triad::kernels
