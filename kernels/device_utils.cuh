#pragma once

// Device-side helpers every kernel file uses: loads and stores that widen
// bf16/f16 to f32, warp and block reductions, strided indexing, type
// dispatch, and the launch check. Included by .cu files only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

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
