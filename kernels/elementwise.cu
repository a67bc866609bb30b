// Elementwise kernels: grid-stride loops over contiguous or strided data,
// computing in f32 for bf16/f16 (f64 and integers in their own type).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <type_traits>

#include "device_utils.cuh"
#include "elementwise.h"
#include "triad/core/philox.h"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;

// The type a conversion goes through: double when either side could lose
// digits in f32 (f64, i32, i64), else f32.
template <class S, class D>
using wide_t = std::conditional_t<(sizeof(S) >= 4 && !std::is_same_v<S, float>) ||
                                      (sizeof(D) >= 4 && !std::is_same_v<D, float>),
                                  double, float>;

// One element from S to D: bit copy for equal types (so 64-bit integers
// stay exact), else through the wider of f32 and f64 that the pair needs.
template <class S, class D>
__device__ __forceinline__ void convert(const S* src, int64_t si, D* dst, int64_t di) {
  if constexpr (std::is_same_v<S, D>) {
    dst[di] = src[si];
  } else {
    store(dst, di, static_cast<wide_t<S, D>>(load(src, si)));
  }
}

// Element i of a strided copy, or (V > 1) the V elements of pack i: both
// views' last dimension then has stride 1 and a length V divides, so a pack
// is contiguous on both sides and its offsets cost one walk of the shape.
template <class S, class D, int V>
__global__ void copy_kernel(const S* src, StridedView sv, D* dst, StridedView dv, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n / V;
       i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (V == 1) {
      convert(src, view_offset(sv, i), dst, view_offset(dv, i));
    } else if constexpr (std::is_same_v<S, D>) {  // the bits, as convert copies them
      using Bits = PackBits<V* static_cast<int>(sizeof(S))>;
      *reinterpret_cast<Bits*>(dst + view_offset(dv, i * V)) =
          *reinterpret_cast<const Bits*>(src + view_offset(sv, i * V));
    } else {
      compute_t<S> x[V];
      wide_t<S, D> y[V];
      load_n<V>(src, view_offset(sv, i * V), x);
      for (int k = 0; k < V; ++k) y[k] = static_cast<wide_t<S, D>>(x[k]);
      store_n<V>(dst, view_offset(dv, i * V), y);
    }
  }
}

// The grid-stride loop of the contiguous kernels: body(i, pack) for each
// whole pack of V elements at i (pack true), then for each of the last
// n % V elements alone (pack false; V == 1 has no such tail).
template <int V, class F>
__device__ __forceinline__ void for_each_pack(int64_t n, F&& body) {
  const int64_t start = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const int64_t packs = n / V;
  for (int64_t p = start; p < packs; p += step) body(p * V, std::true_type{});
  if constexpr (V > 1) {
    for (int64_t i = packs * V + start; i < n; i += step) body(i, std::false_type{});
  }
}

// Blocks for a contiguous kernel over n elements in packs of V.
inline unsigned int grid_for_packs(int64_t n, int v) {
  return grid_for((n + v - 1) / v, kThreads);
}

// True when every pointer is pack-aligned (a contiguous kernel may then
// move 16 bytes per access).
template <class... Ptr>
bool packable(const Ptr*... p) {
  return (pack_aligned(p) && ...);
}

template <class S, class D, int V>
__global__ void convert_contiguous_kernel(const S* src, D* dst, int64_t n) {
  for_each_pack<V>(n, [&](int64_t i, auto pack) {
    if constexpr (std::is_same_v<S, D>) {
      for (int k = 0; k < body_count<V>(pack); ++k) dst[i + k] = src[i + k];
    } else {
      compute_t<S> x[V];
      wide_t<S, D> y[V];
      load_body<V>(src, i, x, pack);
      for (int k = 0; k < body_count<V>(pack); ++k) y[k] = static_cast<wide_t<S, D>>(x[k]);
      store_body<V>(dst, i, y, pack);
    }
  });
}

template <class S, int V>
__global__ void accumulate_kernel(const S* src, float* acc, int64_t n) {
  for_each_pack<V>(n, [&](int64_t i, auto pack) {
    float x[V], a[V];
    load_body<V>(src, i, x, pack);
    load_body<V>(acc, i, a, pack);
    for (int k = 0; k < body_count<V>(pack); ++k) a[k] += x[k];
    store_body<V>(acc, i, a, pack);
  });
}

template <class T, int V>
__global__ void fill_kernel(T* dst, int64_t n, compute_t<T> value) {
  for_each_pack<V>(n, [&](int64_t i, auto pack) {
    compute_t<T> v[V];
    for (int k = 0; k < V; ++k) v[k] = value;
    store_body<V>(dst, i, v, pack);
  });
}

template <class T>
__global__ void arange_kernel(T* dst, int64_t n, int64_t start) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = static_cast<T>(start + i);
  }
}

template <class T>
__global__ void binary_kernel(BinaryKind op, const T* a, StridedView av, const T* b, StridedView bv,
                              T* out, int64_t n) {
  using C = compute_t<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const C x = load(a, view_offset(av, i)), y = load(b, view_offset(bv, i));
    C r;
    switch (op) {
      case BinaryKind::Add:
        r = x + y;
        break;
      case BinaryKind::Sub:
        r = x - y;
        break;
      case BinaryKind::Mul:
        r = x * y;
        break;
      case BinaryKind::Div:
        r = x / y;
        break;
      default:
        r = x == y ? C(1) : C(0);
        break;
    }
    store(out, i, r);
  }
}

template <class T>
__device__ __forceinline__ compute_t<T> apply(BinaryKind op, compute_t<T> x, compute_t<T> y) {
  using C = compute_t<T>;
  switch (op) {
    case BinaryKind::Add:
      return x + y;
    case BinaryKind::Sub:
      return x - y;
    case BinaryKind::Mul:
      return x * y;
    case BinaryKind::Div:
      return x / y;
    default:
      return x == y ? C(1) : C(0);
  }
}

// a contiguous; b contiguous (period n) or one row of `period` elements
// repeated (period < n, a multiple of V).
template <class T, int V>
__global__ void binary_periodic_kernel(BinaryKind op, const T* a, const T* b, int64_t period,
                                       T* out, int64_t n) {
  using C = compute_t<T>;
  const bool rows = period < n;
  for_each_pack<V>(n, [&](int64_t i, auto pack) {
    C x[V], y[V];
    load_body<V>(a, i, x, pack);
    load_body<V>(b, rows ? i % period : i, y, pack);
    for (int k = 0; k < body_count<V>(pack); ++k) x[k] = apply<T>(op, x[k], y[k]);
    store_body<V>(out, i, x, pack);
  });
}

template <class T, int V>
__global__ void affine_kernel(const T* x, T* out, int64_t n, compute_t<T> alpha,
                              compute_t<T> beta) {
  for_each_pack<V>(n, [&](int64_t i, auto pack) {
    compute_t<T> v[V];
    load_body<V>(x, i, v, pack);
    for (int k = 0; k < body_count<V>(pack); ++k) v[k] = alpha * v[k] + beta;
    store_body<V>(out, i, v, pack);
  });
}

__device__ __forceinline__ float exp_of(float v) {
  return __expf(v);
}
__device__ __forceinline__ double exp_of(double v) {
  return exp(v);
}

__device__ __forceinline__ float erf_of(float v) {
  return erff(v);
}
__device__ __forceinline__ double erf_of(double v) {
  return erf(v);
}

// GELU's forms (the tanh one as x * sigmoid(2u)); `erf` is uniform over a
// launch, so the branch never diverges.
template <class T, int V>
__global__ void gelu_forward_kernel(const T* x, T* y, int64_t n, bool erf) {
  using C = compute_t<T>;
  const C k0 = C(0.7978845608028654), k1 = C(0.044715), r2 = C(0.7071067811865476);
  for_each_pack<V>(n, [&](int64_t i, auto pack) {
    C v[V];
    load_body<V>(x, i, v, pack);
    for (int k = 0; k < body_count<V>(pack); ++k) {
      if (erf) {
        v[k] = C(0.5) * v[k] * (C(1) + erf_of(v[k] * r2));
      } else {
        const C u = k0 * (v[k] + k1 * v[k] * v[k] * v[k]);
        v[k] = v[k] / (C(1) + exp_of(C(-2) * u));
      }
    }
    store_body<V>(y, i, v, pack);
  });
}

// Exact: d/dx x Phi(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
template <class T, int V>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, int64_t n, bool erf) {
  using C = compute_t<T>;
  const C k0 = C(0.7978845608028654), k1 = C(0.044715), r2 = C(0.7071067811865476),
          r2pi = C(0.3989422804014327);
  for_each_pack<V>(n, [&](int64_t i, auto pack) {
    C v[V], g[V];
    load_body<V>(x, i, v, pack);
    load_body<V>(dy, i, g, pack);
    for (int k = 0; k < body_count<V>(pack); ++k) {
      if (erf) {
        const C cdf = C(0.5) * (C(1) + erf_of(v[k] * r2));
        g[k] = g[k] * (cdf + v[k] * r2pi * exp_of(C(-0.5) * v[k] * v[k]));
      } else {
        const C u = k0 * (v[k] + k1 * v[k] * v[k] * v[k]);
        const C s = C(1) / (C(1) + exp_of(C(-2) * u));
        const C du = k0 * (C(1) + C(3) * k1 * v[k] * v[k]);
        g[k] = g[k] * (s + C(2) * v[k] * s * (C(1) - s) * du);
      }
    }
    store_body<V>(dx, i, g, pack);
  });
}

// SwiGLU, one output element per thread: a and b lie F apart in x's row.
// SwiGLU: a thread per V consecutive outputs of a row (V = 16 bytes of
// elements when F is a multiple of it and the tensors are pack-aligned, so
// every gate, value and output pack is aligned too; else 1).
// The gate's sigmoid s (act(a) = a s): sigmoid(a) for silu, sigmoid(2u)
// with u = k0 (a + k1 a^3) for GELU's tanh approximation.
template <bool Gelu, class C>
__device__ __forceinline__ C gate_sigmoid(C a) {
  if constexpr (Gelu) {
    const C u = C(0.7978845608028654) * (a + C(0.044715) * a * a * a);
    return C(1) / (C(1) + exp_of(C(-2) * u));
  } else {
    return C(1) / (C(1) + exp_of(-a));
  }
}

// act'(a) given s = gate_sigmoid(a): s (1 + a (1 - s)) for silu, s + 2 a s
// (1 - s) du for GELU (du = k0 (1 + 3 k1 a^2)).
template <bool Gelu, class C>
__device__ __forceinline__ C gate_slope(C a, C s) {
  if constexpr (Gelu) {
    const C du = C(0.7978845608028654) * (C(1) + C(3) * C(0.044715) * a * a);
    return s + C(2) * a * s * (C(1) - s) * du;
  } else {
    return s * (C(1) + a * (C(1) - s));
  }
}

template <class T, int V, bool Gelu>
__global__ void glu_forward_kernel(const T* x, T* y, int64_t rows, int64_t F) {
  using C = compute_t<T>;
  const int64_t per_row = F / V, n = rows * per_row;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < n;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = p / per_row, j = (p - r * per_row) * V;
    C a[V], b[V];
    load_n<V>(x, r * 2 * F + j, a);
    load_n<V>(x, r * 2 * F + F + j, b);
    for (int k = 0; k < V; ++k) a[k] = a[k] * gate_sigmoid<Gelu>(a[k]) * b[k];
    store_n<V>(y, r * F + j, a);
  }
}

template <class T, int V, bool Gelu>
__global__ void glu_backward_kernel(const T* x, const T* dy, T* dx, int64_t rows, int64_t F) {
  using C = compute_t<T>;
  const int64_t per_row = F / V, n = rows * per_row;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < n;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = p / per_row, j = (p - r * per_row) * V;
    C a[V], b[V], g[V], da[V], db[V];
    load_n<V>(x, r * 2 * F + j, a);
    load_n<V>(x, r * 2 * F + F + j, b);
    load_n<V>(dy, r * F + j, g);
    for (int k = 0; k < V; ++k) {
      const C s = gate_sigmoid<Gelu>(a[k]);
      da[k] = g[k] * b[k] * gate_slope<Gelu>(a[k], s);
      db[k] = g[k] * a[k] * s;
    }
    store_n<V>(dx, r * 2 * F + j, da);
    store_n<V>(dx, r * 2 * F + F + j, db);
  }
}

// Element i's draw d is word d % 4 of Philox counter d / 4 (the CPU's
// rule), d = offset + i within a row of `len` elements, the rows
// `row_stride` draws apart. A thread takes one counter of a row, so one
// Philox block serves up to four elements instead of one (ten rounds of it
// per element made dropout bound by integer arithmetic, not memory); a row
// spans at most len / 4 + 2 counters (one row: the whole tensor).
template <class T>
__global__ void dropout_kernel(const T* x, T* y, int64_t rows, int64_t len, float threshold,
                               compute_t<T> scale, uint64_t seed, uint64_t rng_stream,
                               uint64_t offset, uint64_t row_stride, const int64_t* keys,
                               const int64_t* calls, uint64_t per_call) {
  using C = compute_t<T>;
  if (calls) offset += static_cast<uint64_t>(*calls) * per_call;  // (philox::Counters::after_calls)
  const uint64_t n = static_cast<uint64_t>(len), per_row = n / 4 + 2;
  const uint64_t total = static_cast<uint64_t>(rows) * per_row;
  for (uint64_t t = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; t < total;
       t += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = t / per_row;
    const uint64_t start = offset + (keys ? static_cast<uint64_t>(keys[r]) : r) * row_stride;
    const uint64_t q = start / 4 + (t - r * per_row);
    if (q >= (start + n + 3) / 4) continue;
    const philox::Words w = philox::block(seed, rng_stream, q);
    for (int k = 0; k < 4; ++k) {
      const uint64_t g = q * 4 + k;
      if (g < start || g >= start + n) continue;
      const int64_t i = static_cast<int64_t>(r * n + (g - start));
      const bool keep = philox::unit_float(w.w[k]) >= threshold;
      store(y, i, keep ? load(x, i) * scale : C(0));
    }
  }
}

// One block per (outer, inner) output when inner == 1 and the row is long
// (more than kShortRow); otherwise one thread per output walking n with
// stride inner (neighbouring threads read neighbouring addresses).
template <class T>
__global__ void reduce_rows_kernel(ReduceKind op, const T* x, int64_t n, T* out, int64_t* indices) {
  using C = compute_t<T>;
  using Acc = std::conditional_t<std::is_same_v<C, float>, double, C>;
  __shared__ Acc scratch[32];
  __shared__ int64_t scratch_idx[32];
  const T* row = x + blockIdx.x * n;
  if (op == ReduceKind::Sum) {
    Acc s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += static_cast<Acc>(load(row, j));
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) store(out, blockIdx.x, static_cast<C>(s));
    return;
  }
  // Max with the first index among equals (matches the CPU's scan order).
  C best = std::numeric_limits<C>::lowest();
  int64_t best_j = 0;
  bool any = false;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const C v = load(row, j);
    if (!any || v > best) best = v, best_j = j, any = true;
  }
  if (!any) best_j = n;  // sentinel: this thread saw nothing
  for (int o = 16; o > 0; o >>= 1) {
    const C ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t oj = __shfl_xor_sync(0xffffffffu, best_j, o);
    if (oj < n && (best_j >= n || ov > best || (ov == best && oj < best_j))) best = ov, best_j = oj;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = static_cast<Acc>(best), scratch_idx[warp] = best_j;
  __syncthreads();
  if (threadIdx.x == 0) {
    Acc b = scratch[0];
    int64_t bj = scratch_idx[0];
    for (int w = 1; w < warps; ++w) {
      if (scratch_idx[w] >= n) continue;
      if (bj >= n || scratch[w] > b || (scratch[w] == b && scratch_idx[w] < bj))
        b = scratch[w], bj = scratch_idx[w];
    }
    store(out, blockIdx.x, static_cast<C>(b));
    if (indices) indices[blockIdx.x] = bj;
  }
}

// Rows this short (a mixture's scores per token over its experts) are
// reduced a thread per row by reduce_strided_kernel: a block per row would
// leave all but n of its kThreads threads idle and pay a block's barriers.
constexpr int64_t kShortRow = 32;

template <class T>
__global__ void reduce_strided_kernel(ReduceKind op, const T* x, int64_t outer, int64_t n,
                                      int64_t inner, T* out, int64_t* indices) {
  using C = compute_t<T>;
  using Acc = std::conditional_t<std::is_same_v<C, float>, double, C>;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < outer * inner;
       o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t a = o / inner, c = o % inner;
    const T* p = x + a * n * inner + c;
    if (op == ReduceKind::Sum) {
      Acc s = 0;
      for (int64_t j = 0; j < n; ++j) s += static_cast<Acc>(load(p, j * inner));
      store(out, o, static_cast<C>(s));
    } else {
      C best = load(p, 0);
      int64_t best_j = 0;
      for (int64_t j = 1; j < n; ++j) {
        const C v = load(p, j * inner);
        if (v > best) best = v, best_j = j;
      }
      store(out, o, best);
      if (indices) indices[o] = best_j;
    }
  }
}

// Column sums in two deterministic stages when n is long and outputs are
// few (bias gradients: (1, N, C)). Stage one: block (tile, chunk k, batch
// a) sums rows chunk k of a tile of kTileCols columns into
// part[(a * chunks + k) * inner + c]; its threads are kTilePacks packs of V
// columns across by kRowGroups down, each walking every kRowGroups-th row of
// the chunk, and the row groups are added in order. Stage two adds the
// chunks in order. Each thread reading 16 bytes of a row per access across
// some thousand blocks keeps enough bytes in flight for the device's memory,
// where a thread per column walking its rows one element at a time did not.
constexpr int64_t kTileCols = 256;       // columns of a tile in the chunk count (packs of 8)
constexpr int64_t kChunkRows = 64;       // rows of a chunk at least
constexpr int64_t kColumnBlocks = 1024;  // stage one's blocks where the device cannot be asked

template <class T, int V>
__global__ void __launch_bounds__(kTilePacks* kRowGroups)
    reduce_columns_partial_kernel(const T* x, int64_t n, int64_t inner, int64_t rows_per_chunk,
                                  int64_t chunks, double* part) {
  __shared__ double sums[kRowGroups * kTilePacks * V];
  const int tx = threadIdx.x % kTilePacks, ty = threadIdx.x / kTilePacks;
  const int64_t a = blockIdx.z, k = blockIdx.y;
  const int64_t tile = blockIdx.x * int64_t(kTilePacks) * V;
  const int64_t c0 = tile + int64_t(tx) * V;  // the thread's first column (V divides inner)
  const int64_t r0 = k * rows_per_chunk, r1 = min(n, r0 + rows_per_chunk);
  double acc[V] = {};
  if (c0 < inner) {
    const T* base = x + a * n * inner + c0;
    for (int64_t r = r0 + ty; r < r1; r += kRowGroups) {
      compute_t<T> v[V];
      load_n<V>(base, r * inner, v);
      for (int j = 0; j < V; ++j) acc[j] += static_cast<double>(v[j]);
    }
  }
  add_row_groups(acc, sums, [&](int t, double total) {
    if (tile + t < inner) part[(a * chunks + k) * inner + tile + t] = total;
  });
}

// Stage two: output (a, c) is the chunks' partial sums added in order of
// chunk (add_slices). Writes out[a * inner + c] (T), or acc[c] = beta *
// acc[c] + sum when acc is given (f32 gradients; beta 0 reads nothing).
template <class T>
__global__ void __launch_bounds__(kFinishCols* kFinishSlices)
    reduce_columns_finish_kernel(const double* part, int64_t inner, int64_t chunks, T* out,
                                 float* acc, float beta) {
  __shared__ double slices[kFinishSlices * kFinishCols];
  const int col = threadIdx.x % kFinishCols, slice = threadIdx.x / kFinishCols;
  const int64_t a = blockIdx.y, c = blockIdx.x * int64_t(kFinishCols) + col;
  double s = 0;
  if (c < inner) {
#pragma unroll kFinishUnroll
    for (int64_t k = slice; k < chunks; k += kFinishSlices) s += part[(a * chunks + k) * inner + c];
  }
  s = add_slices(s, slices);
  if (slice != 0 || c >= inner) return;
  if (acc) {
    const float sum = static_cast<float>(s);
    acc[c] = beta != 0.0f ? beta * acc[c] + sum : sum;
  } else {
    store(out, a * inner + c, static_cast<compute_t<T>>(s));
  }
}

// The column sum added into an f32 accumulator in one pass over few rows.
template <class T>
__global__ void column_sum_into_kernel(const T* x, int64_t n, int64_t inner, float* acc,
                                       float beta) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= inner) return;
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += static_cast<double>(load(x, j * inner + c));
  const float sum = static_cast<float>(s);
  acc[c] = beta != 0.0f ? beta * acc[c] + sum : sum;
}

// Stage one's blocks the current device runs at once: its multiprocessors
// times the blocks of the packed kernel for T each holds (by its registers
// and shared memory). A grid of one such wave has no tail: on the H200 the
// fixed 1024 blocks were 1.3 waves of the bf16 kernel (6 a multiprocessor),
// the last 232 blocks running alone. kColumnBlocks where the device cannot
// be asked.
// (Asked once per device and type: every bias gradient sizes its chunks,
// twice.)
template <class T>
int64_t column_wave() {
  static std::mutex mutex;
  static std::map<int, int64_t> waves;  // by device
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return kColumnBlocks;
  }
  std::lock_guard<std::mutex> lock(mutex);
  auto known = waves.find(device);
  if (known != waves.end()) return known->second;
  const auto kernel = reduce_columns_partial_kernel<T, kPack<T>>;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kTilePacks * kRowGroups, 0) !=
          cudaSuccess ||
      sms <= 0 || per_sm <= 0) {
    cudaGetLastError();
    return kColumnBlocks;
  }
  return waves[device] = int64_t(sms) * per_sm;
}

// Chunks of the two-stage column sum (0: one pass): about one wave of
// stage one's blocks. The count depends on the device and the shape only,
// so the workspace can be sized before the pointers are known, and the sums
// are the same bits every run on the same device.
int64_t column_chunks(ReduceKind op, ScalarType type, int64_t outer, int64_t n, int64_t inner) {
  const bool floating = type == ScalarType::F32 || type == ScalarType::F64 || is_half(type);
  if (op != ReduceKind::Sum || !floating || inner == 1 || n < 256 || outer > 65535) return 0;
  int64_t wave = kColumnBlocks;
  dispatch_all(type, "column_chunks", [&](auto t) { wave = column_wave<decltype(t)>(); });
  const int64_t tiles = (inner + kTileCols - 1) / kTileCols;
  const int64_t wanted = std::max<int64_t>(1, wave / (tiles * outer));
  return std::clamp<int64_t>(wanted, 1, std::min<int64_t>(n / kChunkRows, 65535));
}

// Launches stage one: packs of kPack<T> columns when every row of x starts
// on a 16-byte boundary, else one column per thread.
template <class T>
void launch_column_partials(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t chunks,
                            double* part, cudaStream_t stream) {
  const int64_t rows_per_chunk = (n + chunks - 1) / chunks;
  auto launch = [&](auto v) {
    constexpr int V = decltype(v)::value;
    const dim3 grid(static_cast<unsigned>((inner + kTilePacks * V - 1) / (kTilePacks * V)),
                    static_cast<unsigned>(chunks), static_cast<unsigned>(outer));
    reduce_columns_partial_kernel<T, V>
        <<<grid, kTilePacks * kRowGroups, 0, stream>>>(x, n, inner, rows_per_chunk, chunks, part);
  };
  if (inner % kPack<T> == 0 && pack_aligned(x)) {
    launch(std::integral_constant<int, kPack<T>>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
}

template <class T>
void launch_column_finish(const double* part, int64_t outer, int64_t inner, int64_t chunks, T* out,
                          float* acc, float beta, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((inner + kFinishCols - 1) / kFinishCols),
                  static_cast<unsigned>(outer));
  reduce_columns_finish_kernel<T>
      <<<grid, kFinishCols * kFinishSlices, 0, stream>>>(part, inner, chunks, out, acc, beta);
}

}  // namespace

size_t reduce_workspace(ReduceKind op, ScalarType type, int64_t outer, int64_t n, int64_t inner) {
  const int64_t chunks = column_chunks(op, type, outer, n, inner);
  return static_cast<size_t>(chunks * outer * inner) * sizeof(double);
}

size_t column_sum_workspace(ScalarType type, int64_t n, int64_t inner) {
  return reduce_workspace(ReduceKind::Sum, type, 1, n, inner);
}

void column_sum_into(const void* x, ScalarType type, int64_t n, int64_t inner, float* acc,
                     double beta, void* workspace, cudaStream_t stream) {
  if (n < 0 || inner < 0) {
    throw std::invalid_argument("column_sum_into: negative extent (n " + std::to_string(n) +
                                ", inner " + std::to_string(inner) + ")");
  }
  if (inner == 0) return;
  const int64_t chunks = column_chunks(ReduceKind::Sum, type, 1, n, inner);
  if (chunks > 0 && !workspace) {
    throw std::invalid_argument("column_sum_into: a column sum of " + std::to_string(n) +
                                " rows needs column_sum_workspace() bytes of workspace");
  }
  dispatch_nn(type, "column_sum_into", [&](auto t) {
    using T = decltype(t);
    const T* px = static_cast<const T*>(x);
    if (chunks > 0) {
      double* part = static_cast<double*>(workspace);
      launch_column_partials(px, 1, n, inner, chunks, part, stream);
      launch_column_finish<T>(part, 1, inner, chunks, nullptr, acc, static_cast<float>(beta),
                              stream);
    } else {
      column_sum_into_kernel<T>
          <<<static_cast<unsigned>((inner + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
              px, n, inner, acc, static_cast<float>(beta));
    }
  });
  check_launch("column_sum_into");
}

void copy(const void* src, ScalarType src_type, StridedView src_view, void* dst,
          ScalarType dst_type, StridedView dst_view, cudaStream_t stream) {
  if (src_view.ndim != dst_view.ndim) {
    throw std::invalid_argument("copy: source has " + std::to_string(src_view.ndim) +
                                " dimensions, destination " + std::to_string(dst_view.ndim));
  }
  int64_t n = 1;
  for (int d = 0; d < src_view.ndim; ++d) {
    if (src_view.shape[d] != dst_view.shape[d]) {
      throw std::invalid_argument("copy: shapes differ in dimension " + std::to_string(d));
    }
    n *= src_view.shape[d];
  }
  if (n == 0) return;
  coalesce(src_view, dst_view);
  const bool contiguous = is_contiguous(src_view) && is_contiguous(dst_view);
  if (contiguous && src_type == dst_type) {
    check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * scalar_size(src_type),
                               cudaMemcpyDeviceToDevice, stream),
               "copy: cudaMemcpyAsync");
    return;
  }
  dispatch_all(src_type, "copy", [&](auto s) {
    using S = decltype(s);
    dispatch_all(dst_type, "copy", [&](auto d) {
      using D = decltype(d);
      // Packs of the wider type (conversions between the network's types).
      constexpr int kV = 16 / static_cast<int>(std::max(sizeof(S), sizeof(D)));
      constexpr bool kNn = sizeof(S) <= 4 && sizeof(D) <= 4 &&
                           std::is_floating_point_v<compute_t<S>> &&
                           std::is_floating_point_v<compute_t<D>>;
      if constexpr (kNn) {
        if (contiguous && packable(src, dst)) {
          convert_contiguous_kernel<S, D, kV><<<grid_for_packs(n, kV), kThreads, 0, stream>>>(
              static_cast<const S*>(src), static_cast<D*>(dst), n);
          return;
        }
      }
      if (contiguous) {
        convert_contiguous_kernel<S, D, 1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
            static_cast<const S*>(src), static_cast<D*>(dst), n);
      } else {
        // Strided: packs along the last dimension when it is contiguous on
        // both sides (a permute that keeps rows, a gather of shards).
        const int last = src_view.ndim - 1;
        if constexpr (kNn || std::is_same_v<S, D>) {
          constexpr int kSame = 16 / static_cast<int>(sizeof(S));
          constexpr int kP = std::is_same_v<S, D> ? kSame : kV;
          bool rows_aligned = last >= 0 && src_view.stride[last] == 1 &&
                              dst_view.stride[last] == 1 && src_view.shape[last] % kP == 0 &&
                              packable(src, dst);
          for (int d = 0; d < last && rows_aligned; ++d) {
            rows_aligned = src_view.stride[d] % kP == 0 && dst_view.stride[d] % kP == 0;
          }
          if (rows_aligned) {
            copy_kernel<S, D, kP><<<grid_for_packs(n, kP), kThreads, 0, stream>>>(
                static_cast<const S*>(src), src_view, static_cast<D*>(dst), dst_view, n);
            return;
          }
        }
        copy_kernel<S, D, 1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
            static_cast<const S*>(src), src_view, static_cast<D*>(dst), dst_view, n);
      }
    });
  });
  check_launch("copy");
}

void fill(void* dst, ScalarType type, int64_t n, double value, cudaStream_t stream) {
  if (n < 0) throw std::invalid_argument("fill: negative element count " + std::to_string(n));
  if (n == 0) return;
  dispatch_all(type, "fill", [&](auto t) {
    using T = decltype(t);
    const auto v = static_cast<compute_t<T>>(value);
    if (packable(dst)) {
      fill_kernel<T, kPack<T>>
          <<<grid_for_packs(n, kPack<T>), kThreads, 0, stream>>>(static_cast<T*>(dst), n, v);
    } else {
      fill_kernel<T, 1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<T*>(dst), n, v);
    }
  });
  check_launch("fill");
}

void arange(void* dst, ScalarType type, int64_t n, int64_t start, cudaStream_t stream) {
  if (n < 0) throw std::invalid_argument("arange: negative element count " + std::to_string(n));
  if (n == 0) return;
  if (type == ScalarType::I64) {
    arange_kernel<int64_t>
        <<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<int64_t*>(dst), n, start);
  } else if (type == ScalarType::I32) {
    arange_kernel<int32_t>
        <<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<int32_t*>(dst), n, start);
  } else {
    throw std::invalid_argument(std::string("arange: element type ") + scalar_name(type) +
                                " is not supported (i32 or i64)");
  }
  check_launch("arange");
}

void binary(BinaryKind op, const void* a, StridedView a_view, const void* b, StridedView b_view,
            void* out, ScalarType type, cudaStream_t stream) {
  if (a_view.ndim != b_view.ndim) {
    throw std::invalid_argument("binary: operand views differ in rank");
  }
  int64_t n = 1;
  for (int d = 0; d < a_view.ndim; ++d) n *= a_view.shape[d];
  if (n == 0) return;
  // Merged dimensions index faster; the two common layouts (both operands
  // contiguous, or b one row repeated: a bias) need no stride arithmetic.
  coalesce(a_view, b_view);
  const bool a_flat = is_contiguous(a_view);
  int64_t b_period = 0;  // b[i % period] covers b
  if (a_flat && is_contiguous(b_view)) {
    b_period = n;
  } else if (a_flat && b_view.ndim == 2 && b_view.stride[0] == 0 && b_view.stride[1] == 1) {
    b_period = b_view.shape[1];
  }
  dispatch_all(type, "binary", [&](auto t) {
    using T = decltype(t);
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    if (b_period > 0 && b_period % kPack<T> == 0 && packable(a, b, out)) {
      binary_periodic_kernel<T, kPack<T>><<<grid_for_packs(n, kPack<T>), kThreads, 0, stream>>>(
          op, pa, pb, b_period, static_cast<T*>(out), n);
    } else if (b_period > 0) {
      binary_periodic_kernel<T, 1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          op, pa, pb, b_period, static_cast<T*>(out), n);
    } else {
      binary_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          op, static_cast<const T*>(a), a_view, static_cast<const T*>(b), b_view,
          static_cast<T*>(out), n);
    }
  });
  check_launch("binary");
}

void accumulate(const void* src, ScalarType src_type, float* acc, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_nn(src_type, "accumulate", [&](auto s) {
    using S = decltype(s);
    const S* ps = static_cast<const S*>(src);
    if (packable(src, acc)) {
      accumulate_kernel<S, 4><<<grid_for_packs(n, 4), kThreads, 0, stream>>>(ps, acc, n);
    } else {
      accumulate_kernel<S, 1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(ps, acc, n);
    }
  });
  check_launch("accumulate");
}

void affine(const void* x, void* out, ScalarType type, int64_t n, double alpha, double beta,
            cudaStream_t stream) {
  if (n == 0) return;
  dispatch_all(type, "affine", [&](auto t) {
    using T = decltype(t);
    using C = compute_t<T>;
    const T* px = static_cast<const T*>(x);
    if (packable(x, out)) {
      affine_kernel<T, kPack<T>><<<grid_for_packs(n, kPack<T>), kThreads, 0, stream>>>(
          px, static_cast<T*>(out), n, static_cast<C>(alpha), static_cast<C>(beta));
    } else {
      affine_kernel<T, 1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          px, static_cast<T*>(out), n, static_cast<C>(alpha), static_cast<C>(beta));
    }
  });
  check_launch("affine");
}

void gelu_forward(const void* x, void* y, ScalarType type, int64_t n, bool erf,
                  cudaStream_t stream) {
  if (n == 0) return;
  if (type != ScalarType::F64) {
    dispatch_nn(type, "gelu_forward", [&](auto t) {
      using T = decltype(t);
      const T* px = static_cast<const T*>(x);
      if (packable(x, y)) {
        gelu_forward_kernel<T, kPack<T>>
            <<<grid_for_packs(n, kPack<T>), kThreads, 0, stream>>>(px, static_cast<T*>(y), n, erf);
      } else {
        gelu_forward_kernel<T, 1>
            <<<grid_for(n, kThreads), kThreads, 0, stream>>>(px, static_cast<T*>(y), n, erf);
      }
    });
  } else {
    gelu_forward_kernel<double, 1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const double*>(x), static_cast<double*>(y), n, erf);
  }
  check_launch("gelu_forward");
}

void gelu_backward(const void* x, const void* dy, void* dx, ScalarType type, int64_t n, bool erf,
                   cudaStream_t stream) {
  if (n == 0) return;
  if (type != ScalarType::F64) {
    dispatch_nn(type, "gelu_backward", [&](auto t) {
      using T = decltype(t);
      const T* px = static_cast<const T*>(x);
      const T* pdy = static_cast<const T*>(dy);
      if (packable(x, dy, dx)) {
        gelu_backward_kernel<T, kPack<T>><<<grid_for_packs(n, kPack<T>), kThreads, 0, stream>>>(
            px, pdy, static_cast<T*>(dx), n, erf);
      } else {
        gelu_backward_kernel<T, 1>
            <<<grid_for(n, kThreads), kThreads, 0, stream>>>(px, pdy, static_cast<T*>(dx), n, erf);
      }
    });
  } else {
    gelu_backward_kernel<double, 1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const double*>(x), static_cast<const double*>(dy), static_cast<double*>(dx), n,
        erf);
  }
  check_launch("gelu_backward");
}

// SwiGLU over rows * F / V packs: V = kPack<T> when F is a multiple of it
// and every pointer is pack-aligned, else 1 (f64: always 1).
void glu_forward(const void* x, void* y, ScalarType type, int64_t rows, int64_t F, bool gelu,
                 cudaStream_t stream) {
  if (rows * F == 0) return;
  auto run = [&](auto t, auto v) {
    using T = decltype(t);
    constexpr int V = decltype(v)::value;
    if (gelu) {
      glu_forward_kernel<T, V, true><<<grid_for(rows * F / V, kThreads), kThreads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<T*>(y), rows, F);
    } else {
      glu_forward_kernel<T, V, false><<<grid_for(rows * F / V, kThreads), kThreads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<T*>(y), rows, F);
    }
  };
  if (type == ScalarType::F64) {
    run(double{}, std::integral_constant<int, 1>{});
  } else {
    dispatch_nn(type, "glu_forward", [&](auto t) {
      using T = decltype(t);
      if (F % kPack<T> == 0 && pack_aligned(x) && pack_aligned(y)) {
        run(t, std::integral_constant<int, kPack<T>>{});
      } else {
        run(t, std::integral_constant<int, 1>{});
      }
    });
  }
  check_launch(gelu ? "geglu_forward" : "swiglu_forward");
}

void glu_backward(const void* x, const void* dy, void* dx, ScalarType type, int64_t rows, int64_t F,
                  bool gelu, cudaStream_t stream) {
  if (rows * F == 0) return;
  auto run = [&](auto t, auto v) {
    using T = decltype(t);
    constexpr int V = decltype(v)::value;
    const auto* px = static_cast<const T*>(x);
    const auto* pdy = static_cast<const T*>(dy);
    auto* pdx = static_cast<T*>(dx);
    if (gelu) {
      glu_backward_kernel<T, V, true>
          <<<grid_for(rows * F / V, kThreads), kThreads, 0, stream>>>(px, pdy, pdx, rows, F);
    } else {
      glu_backward_kernel<T, V, false>
          <<<grid_for(rows * F / V, kThreads), kThreads, 0, stream>>>(px, pdy, pdx, rows, F);
    }
  };
  if (type == ScalarType::F64) {
    run(double{}, std::integral_constant<int, 1>{});
  } else {
    dispatch_nn(type, "glu_backward", [&](auto t) {
      using T = decltype(t);
      if (F % kPack<T> == 0 && pack_aligned(x) && pack_aligned(dy) && pack_aligned(dx)) {
        run(t, std::integral_constant<int, kPack<T>>{});
      } else {
        run(t, std::integral_constant<int, 1>{});
      }
    });
  }
  check_launch(gelu ? "geglu_backward" : "swiglu_backward");
}

Status check_dropout(double p, int64_t n, const philox::Counters& at, bool keyed) {
  if (!(p >= 0.0 && p < 1.0)) {
    return Status::fail("probability " + std::to_string(p) + " must be in [0, 1)");
  }
  if (n < 0) return Status::fail("element count " + std::to_string(n) + " < 0");
  if (keyed && at.row_length == 0) return Status::fail("keyed rows need a row length");
  if (at.row_length > 0 && static_cast<uint64_t>(n) % at.row_length != 0) {
    return Status::fail("rows of " + std::to_string(at.row_length) + " draws do not divide " +
                        std::to_string(n) + " elements");
  }
  return Status::fine();
}

void dropout(const void* x, void* y, ScalarType type, int64_t n, double p, uint64_t seed,
             uint64_t rng_stream, const philox::Counters& at, const int64_t* keys,
             cudaStream_t stream, const int64_t* calls) {
  require(check_dropout(p, n, at, keys != nullptr), "dropout");
  if (n == 0) return;
  const int64_t len = at.row_length > 0 ? static_cast<int64_t>(at.row_length) : n;
  const int64_t rows = n / len;
  auto launch = [&](auto t) {
    using T = decltype(t);
    using C = compute_t<T>;
    dropout_kernel<T><<<grid_for(rows * (len / 4 + 2), kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), rows, len, static_cast<float>(p),
        static_cast<C>(1.0 / (1.0 - p)), seed, rng_stream, at.offset, at.row_stride, keys, calls,
        at.per_call);
  };
  if (type == ScalarType::F64) {
    launch(double{});
  } else {
    dispatch_nn(type, "dropout", launch);
  }
  check_launch("dropout");
}

Status check_reduce(ReduceKind op, int64_t outer, int64_t n, int64_t inner,
                    const int64_t* indices) {
  if (outer < 0 || n < 0 || inner < 0) {
    return Status::fail("negative extent (outer " + std::to_string(outer) + ", n " +
                        std::to_string(n) + ", inner " + std::to_string(inner) + ")");
  }
  if (op == ReduceKind::Max && n == 0 && outer * inner > 0) {
    return Status::fail("max over an empty dimension has no value");
  }
  (void)indices;
  return Status::fine();
}

void reduce(ReduceKind op, const void* x, ScalarType type, int64_t outer, int64_t n, int64_t inner,
            void* out, int64_t* indices, void* workspace, cudaStream_t stream) {
  require(check_reduce(op, outer, n, inner, indices), "reduce");
  if (outer * inner == 0) return;
  const int64_t chunks = column_chunks(op, type, outer, n, inner);
  if (chunks > 0 && !workspace) {
    throw std::invalid_argument("reduce: a column sum of " + std::to_string(n) +
                                " rows needs reduce_workspace() bytes of workspace");
  }
  dispatch_all(type, "reduce", [&](auto t) {
    using T = decltype(t);
    if (chunks > 0) {
      double* part = static_cast<double*>(workspace);
      launch_column_partials(static_cast<const T*>(x), outer, n, inner, chunks, part, stream);
      launch_column_finish<T>(part, outer, inner, chunks, static_cast<T*>(out), nullptr, 0.0f,
                              stream);
    } else if (inner == 1 && n > kShortRow && outer <= 2147483647LL) {
      reduce_rows_kernel<T><<<static_cast<unsigned>(outer), kThreads, 0, stream>>>(
          op, static_cast<const T*>(x), n, static_cast<T*>(out), indices);
    } else {
      reduce_strided_kernel<T><<<grid_for(outer * inner, kThreads), kThreads, 0, stream>>>(
          op, static_cast<const T*>(x), outer, n, inner, static_cast<T*>(out), indices);
    }
  });
  check_launch("reduce");
}

}  // namespace triad::kernels
