// Soft-capping: grid-stride loops over contiguous elements, or a block per
// row of a row-strided matrix (forward, in place on the head's padded
// logits), moving 16-byte packs where the pointers allow.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "device_utils.cuh"
#include "soft_cap.h"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float tanh_of(float v) {
  return tanhf(v);
}
__device__ __forceinline__ double tanh_of(double v) {
  return tanh(v);
}

// A capped value, computed in C (f32 for halves).
template <class C>
__device__ __forceinline__ C capped(C v, C cap, C inv) {
  return cap * tanh_of(v * inv);
}

// Contiguous x and y: packs of V elements (both 16-byte aligned when V > 1),
// then the last n % V one at a time.
template <class T, int V>
__global__ void soft_cap_flat_kernel(const T* x, T* y, int64_t n, compute_t<T> cap) {
  using C = compute_t<T>;
  const C inv = C(1) / cap;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, packs = n / V;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += stride) {
    C v[V];
    load_n<V>(x, i * V, v);
    for (int k = 0; k < V; ++k) v[k] = capped(v[k], cap, inv);
    store_n<V>(y, i * V, v);
  }
  for (int64_t i = packs * V + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
    store(y, i, capped(load(x, i), cap, inv));
  }
}

// Row-strided x and y (the head's padded logits): a block per row, in packs
// of V from the row's first 16-byte boundary (x and y equally aligned).
template <class T, int V>
__global__ void soft_cap_rows_kernel(const T* x, T* y, int64_t rows, int64_t cols, int64_t ld,
                                     compute_t<T> cap) {
  using C = compute_t<T>;
  const C inv = C(1) / cap;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * ld;
    T* yr = y + r * ld;
    block_row_packs<V>(xr, cols, [&](int64_t j, auto pack) {
      C v[V];
      load_body<V>(xr, j, v, pack);
      for (int k = 0; k < body_count<V>(pack); ++k) v[k] = capped(v[k], cap, inv);
      store_body<V>(yr, j, v, pack);
    });
  }
}

template <class T>
__global__ void soft_cap_backward_kernel(const T* y, const T* dy, T* dx, int64_t n,
                                         compute_t<T> cap) {
  using C = compute_t<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const C r = load(y, i) / cap;
    store(dx, i, load(dy, i) * (C(1) - r * r));
  }
}

// f(T{}) for the four floating types.
template <class F>
void dispatch_floating(ScalarType type, const char* kernel, F&& f) {
  if (type == ScalarType::F64) return f(double{});
  dispatch_nn(type, kernel, f);
}

void check_cap(double cap, const char* kernel) {
  if (!(cap > 0.0) || !std::isfinite(cap)) {
    throw std::invalid_argument(std::string(kernel) + ": cap " + std::to_string(cap) +
                                " must be a finite number > 0");
  }
}

}  // namespace

void soft_cap(const void* x, void* y, ScalarType type, int64_t rows, int64_t cols, int64_t ld,
              double cap, cudaStream_t stream) {
  check_cap(cap, "soft_cap");
  if (rows < 0 || cols < 0 || ld < cols) {
    throw std::invalid_argument("soft_cap: rows " + std::to_string(rows) + ", cols " +
                                std::to_string(cols) + ", row stride " + std::to_string(ld) +
                                " (needs rows, cols >= 0 and a stride >= cols)");
  }
  const int64_t n = rows * cols;
  if (n == 0) return;
  dispatch_floating(type, "soft_cap", [&](auto t) {
    using T = decltype(t);
    using C = compute_t<T>;
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    const C c = static_cast<C>(cap);
    if (ld == cols || rows == 1) {
      if (pack_aligned(px) && pack_aligned(py)) {
        soft_cap_flat_kernel<T, kPack<T>>
            <<<grid_for(n / kPack<T> + 1, kThreads), kThreads, 0, stream>>>(px, py, n, c);
      } else {
        soft_cap_flat_kernel<T, 1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(px, py, n, c);
      }
    } else {
      const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, 65535LL * 8));
      if ((reinterpret_cast<uintptr_t>(px) - reinterpret_cast<uintptr_t>(py)) % 16 == 0) {
        soft_cap_rows_kernel<T, kPack<T>>
            <<<blocks, kThreads, 0, stream>>>(px, py, rows, cols, ld, c);
      } else {
        soft_cap_rows_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(px, py, rows, cols, ld, c);
      }
    }
  });
  check_launch("soft_cap");
}

void soft_cap_backward(const void* y, const void* dy, void* dx, ScalarType type, int64_t n,
                       double cap, cudaStream_t stream) {
  check_cap(cap, "soft_cap_backward");
  if (n <= 0) return;
  dispatch_floating(type, "soft_cap_backward", [&](auto t) {
    using T = decltype(t);
    soft_cap_backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), n,
        static_cast<compute_t<T>>(cap));
  });
  check_launch("soft_cap_backward");
}

}  // namespace triad::kernels
