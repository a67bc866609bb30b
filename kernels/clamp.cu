// Clamping: grid-stride loops over contiguous elements, moving 16-byte packs
// where the pointers allow (the fused qkv of every token, forward and back).
#include <cmath>
#include <cstdint>
#include <string>

#include "clamp.h"
#include "device_utils.cuh"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;

template <class C>
__device__ __forceinline__ C clamped(C v, C lo, C hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// Packs of V elements (x and y both 16-byte aligned when V > 1), then the
// last n % V one at a time.
template <class T, int V>
__global__ void clamp_kernel(const T* x, T* y, int64_t n, compute_t<T> lo, compute_t<T> hi) {
  using C = compute_t<T>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, packs = n / V;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += stride) {
    C v[V];
    load_n<V>(x, i * V, v);
    for (int k = 0; k < V; ++k) v[k] = clamped(v[k], lo, hi);
    store_n<V>(y, i * V, v);
  }
  for (int64_t i = packs * V + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
    store(y, i, clamped(load(x, i), lo, hi));
  }
}

template <class T>
__global__ void clamp_backward_kernel(const T* x, const T* dy, T* dx, int64_t n, compute_t<T> lo,
                                      compute_t<T> hi) {
  using C = compute_t<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const C v = load(x, i);
    store(dx, i, v >= lo && v <= hi ? load(dy, i) : C(0));
  }
}

// f(T{}) for the four floating types.
template <class F>
void dispatch_floating(ScalarType type, const char* kernel, F&& f) {
  if (type == ScalarType::F64) return f(double{});
  dispatch_nn(type, kernel, f);
}

void check_bounds(double lo, double hi, const char* kernel) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi) {
    throw std::invalid_argument(std::string(kernel) + ": bounds [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "] must be finite with lo <= hi");
  }
}

}  // namespace

void clamp(const void* x, void* y, ScalarType type, int64_t n, double lo, double hi,
           cudaStream_t stream) {
  check_bounds(lo, hi, "clamp");
  if (n <= 0) return;
  dispatch_floating(type, "clamp", [&](auto t) {
    using T = decltype(t);
    using C = compute_t<T>;
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    const C l = static_cast<C>(lo), h = static_cast<C>(hi);
    if (pack_aligned(px) && pack_aligned(py)) {
      clamp_kernel<T, kPack<T>>
          <<<grid_for(n / kPack<T> + 1, kThreads), kThreads, 0, stream>>>(px, py, n, l, h);
    } else {
      clamp_kernel<T, 1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(px, py, n, l, h);
    }
  });
  check_launch("clamp");
}

void clamp_backward(const void* x, const void* dy, void* dx, ScalarType type, int64_t n, double lo,
                    double hi, cudaStream_t stream) {
  check_bounds(lo, hi, "clamp_backward");
  if (n <= 0) return;
  dispatch_floating(type, "clamp_backward", [&](auto t) {
    using T = decltype(t);
    using C = compute_t<T>;
    clamp_backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n,
        static_cast<C>(lo), static_cast<C>(hi));
  });
  check_launch("clamp_backward");
}

}  // namespace triad::kernels
