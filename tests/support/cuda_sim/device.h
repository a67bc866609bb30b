#pragma once

// cuda_sim's device side: what a .cu file of kernels/ needs beyond the CUDA
// headers' host declarations when it is compiled as C++ for the simulator
// (the build rewrites it first; see cu_to_cpp.cmake). Included before the
// kernel file's own code.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "sim.h"

// Function-space qualifiers mean nothing on the host. (`__shared__` never
// reaches the compiler: cu_to_cpp.cmake rewrites every declaration.)
#undef __global__
#undef __device__
#undef __host__
#define __global__
#define __device__
#define __host__

// The rewrite turns __CUDA_ARCH__ into this: device code compiles as sm_90's.
#define TRIAD_SIM_CUDA_ARCH 900

namespace triad_sim {

// The block's dynamic shared memory, aligned as declared (16 bytes unless
// __align__ says more) and deliberately no further, so a kernel that
// assumes more alignment than it declares fails here as it may on a GPU.
template <class T, size_t Align = 16>
T* dynamic_shared() {
  return reinterpret_cast<T*>(dynamic_shared_base(Align > alignof(T) ? Align : alignof(T)));
}

}  // namespace triad_sim

#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#define threadIdx (::triad_sim::builtins.threadIdx)
#define blockIdx (::triad_sim::builtins.blockIdx)
#define blockDim (::triad_sim::builtins.blockDim)
#define gridDim (::triad_sim::builtins.gridDim)

// cuda_runtime.h's typed overload (nvcc only): a kernel is its own handle.
template <class... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

inline void __syncthreads() {
  ::triad_sim::block_barrier();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::triad_sim::warp_barrier(mask, "__syncwarp");
}
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle of an 8-byte value");
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
    ::triad_sim::fail("__shfl_xor_sync: width " + std::to_string(width) +
                      " is not a power of two up to 32");
  }
  const int lane = static_cast<int>(
      (threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y) & 31);
  int src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;  // outside the segment
  T out;
  ::triad_sim::warp_exchange(mask, &value, &out, sizeof(T), src, "__shfl_xor_sync");
  return out;
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::triad_sim::warp_ballot(mask, predicate != 0, "__ballot_sync");
}
inline int __any_sync(unsigned mask, int predicate) {
  return ::triad_sim::warp_ballot(mask, predicate != 0, "__any_sync") != 0;
}
inline int __all_sync(unsigned mask, int predicate) {
  return ::triad_sim::warp_ballot(mask, predicate != 0, "__all_sync") == mask;
}
// Integer atomics. The simulator runs one CUDA thread at a time (threads
// switch only at barriers and exits), so a plain read-modify-write is atomic.
inline unsigned long long atomicMin(unsigned long long* address, unsigned long long value) {
  const unsigned long long old = *address;
  if (value < old) *address = value;
  return old;
}
inline unsigned int atomicAdd(unsigned int* address, unsigned int value) {
  const unsigned int old = *address;
  *address = old + value;
  return old;
}
// The bits of a float or double as an integer.
inline unsigned int __float_as_uint(float x) {
  unsigned int bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}
inline long long __double_as_longlong(double x) {
  long long bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}
[[noreturn]] inline void __trap() {
  ::triad_sim::fail("__trap() called");
}

// Device math the host library lacks, at full precision (the GPU's fast
// versions differ in the last bits; tests allow for that).
inline float __expf(float x) {
  return std::exp(x);
}
// A product the compiler may not fuse into a multiply-add (CUDA's
// __fmul_rn); the host build has no FMA contraction to prevent.
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
inline float max(float a, float b) {
  return std::fmax(a, b);
}
inline float min(float a, float b) {
  return std::fmin(a, b);
}
inline double max(double a, double b) {
  return std::fmax(a, b);
}
inline double min(double a, double b) {
  return std::fmin(a, b);
}
inline int max(int a, int b) {
  return a > b ? a : b;
}
inline int min(int a, int b) {
  return a < b ? a : b;
}
inline long long max(long long a, long long b) {
  return a > b ? a : b;
}
inline long long min(long long a, long long b) {
  return a < b ? a : b;
}
inline long max(long a, long b) {
  return a > b ? a : b;
}
inline long min(long a, long b) {
  return a < b ? a : b;
}
inline unsigned max(unsigned a, unsigned b) {
  return a > b ? a : b;
}
inline unsigned min(unsigned a, unsigned b) {
  return a < b ? a : b;
}

#include "wmma.h"
