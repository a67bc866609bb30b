#pragma once

// Device-side helpers every kernel file uses: loads and stores that widen
// bf16/f16 to f32, warp and block reductions, strided indexing, type
// dispatch, and the launch check. Included by .cu files only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>

#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common.h"

namespace triad::kernels {

// Throws std::runtime_error naming `what` when a CUDA call failed.
inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ")");
  }
}
// Checks the launch just made (configuration errors surface here; faults
// inside the kernel surface at the next synchronisation).
inline void check_launch(const char* kernel) {
  check_cuda(cudaGetLastError(), kernel);
}

// Blocks needed to cover n items with `threads` each, capped for grid-stride loops.
inline unsigned int grid_for(int64_t n, int threads, int64_t cap = 65535LL * 8) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > cap) blocks = cap;
  return static_cast<unsigned int>(blocks);
}

// ---- element conversion: the compute type of T (f32 for halves) -----------
template <class T>
struct Compute {
  using type = T;
};
template <>
struct Compute<__nv_bfloat16> {
  using type = float;
};
template <>
struct Compute<__half> {
  using type = float;
};
template <class T>
using compute_t = typename Compute<T>::type;

template <class T>
__device__ __forceinline__ compute_t<T> load(const T* p, int64_t i) {
  return static_cast<compute_t<T>>(p[i]);
}
template <>
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
template <>
__device__ __forceinline__ float load(const __half* p, int64_t i) {
  return __half2float(p[i]);
}

template <class T, class V>
__device__ __forceinline__ void store(T* p, int64_t i, V v) {
  p[i] = static_cast<T>(v);
}
template <>
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ void store(__half* p, int64_t i, float v) {
  p[i] = __float2half_rn(v);
}
template <>
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, double v) {
  p[i] = __double2bfloat16(v);
}
template <>
__device__ __forceinline__ void store(__half* p, int64_t i, double v) {
  p[i] = __double2half(v);
}

// ---- packs: 16 bytes per access ---------------------------------------------
// A memory-bound kernel reaches the device's bandwidth only with enough bytes
// in flight per thread; one 2-byte load per thread leaves most of it idle. So
// the hot ones read and write V elements per access: kPack<T> (16 bytes)
// where the launcher found every pointer pack-aligned (pack_aligned), else 1.
template <class T>
constexpr int kPack = 16 / static_cast<int>(sizeof(T));

// The integer type of `bytes` bytes (16, 8, 4 or 2) a pack moves as one access.
template <int bytes>
using PackBits = std::conditional_t<
    bytes == 16, int4,
    std::conditional_t<bytes == 8, int2, std::conditional_t<bytes == 4, int, short>>>;

// The bits of V elements of T, moved as one access.
template <int V, class T>
using Pack = PackBits<V* static_cast<int>(sizeof(T))>;

// p[i, i + V) as its bits, one access (p + i aligned to V * sizeof(T)); and
// such bits as compute_t<T>. A kernel that holds a row between passes keeps
// the bits (half the registers of the widened values for bf16/f16) and
// widens them where it uses them.
template <int V, class T>
__device__ __forceinline__ Pack<V, T> load_bits(const T* p, int64_t i) {
  return *reinterpret_cast<const Pack<V, T>*>(p + i);
}
template <int V, class T>
__device__ __forceinline__ void unpack_n(const Pack<V, T>& bits, compute_t<T> (&out)[V]) {
  T raw[V];
  memcpy(static_cast<void*>(raw), &bits, sizeof(bits));
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = load(raw, k);
}

// p[i, i + V) as compute_t<T>; one access of V * sizeof(T) bytes when V > 1
// (p + i must be aligned to that).
template <int V, class T>
__device__ __forceinline__ void load_n(const T* p, int64_t i, compute_t<T> (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = load(p, i);
  } else {
    unpack_n<V, T>(load_bits<V>(p, i), out);
  }
}

// in, rounded to T, as the bits of a pack.
template <int V, class T, class C>
__device__ __forceinline__ Pack<V, T> pack_n(const C (&in)[V]) {
  T raw[V];
#pragma unroll
  for (int k = 0; k < V; ++k) store(raw, k, in[k]);
  Pack<V, T> bits;
  memcpy(&bits, raw, sizeof(bits));
  return bits;
}

// p[i, i + V) = in, rounded to T; one access when V > 1.
template <int V, class T, class C>
__device__ __forceinline__ void store_n(T* p, int64_t i, const C (&in)[V]) {
  if constexpr (V == 1) {
    store(p, i, in[0]);
  } else {
    *reinterpret_cast<Pack<V, T>*>(p + i) = pack_n<V, T>(in);
  }
}

// The loads and stores of a pack loop's body (`pack` std::true_type for a
// whole pack of V elements at i, std::false_type for the one element i).
template <int V, class T, class P>
__device__ __forceinline__ void load_body(const T* p, int64_t i, compute_t<T> (&out)[V], P) {
  if constexpr (P::value) {
    load_n<V>(p, i, out);
  } else {
    out[0] = load(p, i);
  }
}
template <int V, class T, class C, class P>
__device__ __forceinline__ void store_body(T* p, int64_t i, const C (&in)[V], P) {
  if constexpr (P::value) {
    store_n<V>(p, i, in);
  } else {
    store(p, i, in[0]);
  }
}
// Elements a body handles: V for a whole pack, else 1.
template <int V, class P>
__host__ __device__ constexpr int body_count(P) {
  return P::value ? V : 1;
}

// A block's walk over the n elements of a row at p: body(j, pack) for the
// elements before p's first 16-byte boundary one at a time, then for each
// whole pack of V, then for the rest one at a time; the block's threads
// share each part. V == 1 is a plain loop.
template <int V, class T, class F>
__device__ __forceinline__ void block_row_packs(const T* p, int64_t n, F&& body) {
  int64_t head = 0;
  if constexpr (V > 1) {
    head = static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16 / sizeof(T));
    if (head > n) head = n;
  }
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) body(j, std::false_type{});
  const int64_t packs = (n - head) / V;
  for (int64_t q = threadIdx.x; q < packs; q += blockDim.x) body(head + q * V, std::true_type{});
  for (int64_t j = head + packs * V + threadIdx.x; j < n; j += blockDim.x) {
    body(j, std::false_type{});
  }
}

// ---- reductions -------------------------------------------------------------
template <class V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class V>
__device__ __forceinline__ V warp_max(V v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. `scratch` holds 32 values.
template <class V>
__device__ V block_sum(V v, V* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : V(0);
  return warp_sum(v);
}
template <class V>
__device__ V block_max(V v, V* scratch, V lowest) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : lowest;
  return warp_max(v);
}

// ---- column sums in a fixed order -------------------------------------------
// Stage one of a column sum over a chunk of rows: a block of kTilePacks x
// kRowGroups threads takes a tile of kTilePacks packs of V columns; thread
// (tx, ty) holds the sums of its pack over rows ty, ty + kRowGroups, ... of
// the chunk, enough threads with 16 bytes each in flight for the device's
// memory. add_row_groups then adds the row groups of each column in order.
constexpr int kTilePacks = 32, kRowGroups = 8;

// Calls out(t, total) for each column t of the tile, total = the row groups'
// acc of that column added in order. `smem` holds kRowGroups * kTilePacks * V
// values; every thread of the block must call.
template <int V, class A, class F>
__device__ void add_row_groups(const A (&acc)[V], A* smem, F&& out) {
  const int tx = threadIdx.x % kTilePacks, ty = threadIdx.x / kTilePacks;
  for (int k = 0; k < V; ++k) smem[(ty * kTilePacks + tx) * V + k] = acc[k];
  __syncthreads();
  for (int t = threadIdx.x; t < kTilePacks * V; t += blockDim.x) {
    A total = 0;
    for (int g = 0; g < kRowGroups; ++g) total += smem[g * kTilePacks * V + t];
    out(t, total);
  }
}

// Stage two, the chunks' partial sums of each column: a block of
// kFinishCols x kFinishSlices threads takes kFinishCols columns, thread
// (col, slice) adding chunks slice, slice + kFinishSlices, ...; add_slices
// returns the slices added in a fixed order (to slice 0's threads; 0 to the
// others): runs of kFinishRun slices in order, then the runs in order.
// `smem` holds kFinishSlices * kFinishCols values; every thread must call.
// The stage adds partial rows that the first stage wrote from a wave of
// blocks (a LayerNorm backward's 792 on an H200, 6.5 MB at C 1024) and is
// bound by the loads in flight, not by the bandwidth: 8 columns a block
// (a 32-byte sector of f32 partials, two of f64) across 128 slices spread
// it over C / 8 blocks, where 32 columns took only C / 32 multiprocessors
// (32 of the H200's 132 at C 1024), each thread then loading about 6
// partials of a wave at once instead of about 25 in turn.
constexpr int kFinishCols = 8, kFinishSlices = 128, kFinishUnroll = 8, kFinishRun = 8;
static_assert(kFinishSlices % kFinishRun == 0 && kFinishCols * kFinishSlices <= 1024,
              "the finishing stage's slices come in whole runs, in one block");
template <class A>
__device__ A add_slices(A s, A* smem) {
  const int col = threadIdx.x % kFinishCols, slice = threadIdx.x / kFinishCols;
  smem[slice * kFinishCols + col] = s;
  __syncthreads();
  // Each run's sum goes where its first slice was: only its own thread
  // reads the run, so no other thread sees the write before the barrier.
  constexpr int kRuns = kFinishSlices / kFinishRun;
  if (slice < kRuns) {
    A run = 0;
    for (int k = 0; k < kFinishRun; ++k) run += smem[(slice * kFinishRun + k) * kFinishCols + col];
    smem[slice * kFinishRun * kFinishCols + col] = run;
  }
  __syncthreads();
  if (slice != 0) return A(0);
  A total = 0;
  for (int r = 0; r < kRuns; ++r) total += smem[r * kFinishRun * kFinishCols + col];
  return total;
}

// ---- strided indexing -------------------------------------------------------
// Element offset of row-major linear index i in view v.
__device__ __forceinline__ int64_t view_offset(const StridedView& v, int64_t i) {
  int64_t off = 0;
  for (int d = v.ndim - 1; d >= 0; --d) {
    const int64_t s = v.shape[d];
    off += (i % s) * v.stride[d];
    i /= s;
  }
  return off;
}

// ---- type dispatch ----------------------------------------------------------
// Calls f(T{}) for the storage type of `t`; NN kernels pass nn_only.
template <class F>
void dispatch_all(ScalarType t, const char* kernel, F&& f) {
  switch (t) {
    case ScalarType::F32:
      return f(float{});
    case ScalarType::F64:
      return f(double{});
    case ScalarType::BF16:
      return f(__nv_bfloat16{});
    case ScalarType::F16:
      return f(__half{});
    case ScalarType::I32:
      return f(int32_t{});
    case ScalarType::I64:
      return f(int64_t{});
  }
  throw std::invalid_argument(std::string(kernel) + ": unknown element type");
}
template <class F>
void dispatch_nn(ScalarType t, const char* kernel, F&& f) {
  switch (t) {
    case ScalarType::F32:
      return f(float{});
    case ScalarType::BF16:
      return f(__nv_bfloat16{});
    case ScalarType::F16:
      return f(__half{});
    default:
      throw std::invalid_argument(std::string(kernel) + ": element type " + scalar_name(t) +
                                  " is not supported (f32, bf16 or f16)");
  }
}

// Reads token ids stored as i32 or i64.
__device__ __forceinline__ int64_t load_id(const void* ids, bool ids64, int64_t i) {
  return ids64 ? static_cast<const int64_t*>(ids)[i]
               : static_cast<int64_t>(static_cast<const int32_t*>(ids)[i]);
}

}  // namespace triad::kernels
