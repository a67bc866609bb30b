// Row softmax: max then sum of exponentials (f32); a warp per row up to
// kWarpRow columns (a mixture's router over its experts: no block barriers,
// eight rows a block), a block per row beyond.
#include <cfloat>

#include "device_utils.cuh"
#include "softmax.h"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;
constexpr int64_t kWarpRow = 1024;

// Warp w of block b takes row b * kRowsPerBlock + w; a warp past the last
// row leaves whole (no lane is left at a shuffle).
template <class T>
__global__ void softmax_forward_warp_kernel(const T* x, T* y, int64_t N, int64_t C) {
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= N) return;
  const int lane = threadIdx.x & 31;
  const T* row = x + r * C;
  T* out = y + r * C;
  float mx = -FLT_MAX;
  for (int64_t i = lane; i < C; i += 32) mx = fmaxf(mx, load(row, i));
  mx = warp_max(mx);
  float s = 0;
  for (int64_t i = lane; i < C; i += 32) s += __expf(load(row, i) - mx);
  const float inv = 1.0f / warp_sum(s);
  for (int64_t i = lane; i < C; i += 32) store(out, i, __expf(load(row, i) - mx) * inv);
}

template <class T>
__global__ void softmax_backward_warp_kernel(const T* y, const T* dy, T* dx, int64_t N, int64_t C) {
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= N) return;
  const int lane = threadIdx.x & 31;
  const int64_t base = r * C;
  float dot = 0;
  for (int64_t i = lane; i < C; i += 32) dot += load(y, base + i) * load(dy, base + i);
  dot = warp_sum(dot);
  for (int64_t i = lane; i < C; i += 32) {
    store(dx, base + i, load(y, base + i) * (load(dy, base + i) - dot));
  }
}

unsigned warp_row_blocks(int64_t N) {
  return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
}

template <class T>
__global__ void softmax_forward_kernel(const T* x, T* y, int64_t C) {
  __shared__ float scratch[32];
  const T* row = x + blockIdx.x * C;
  T* out = y + blockIdx.x * C;
  float mx = -FLT_MAX;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) mx = fmaxf(mx, load(row, i));
  mx = block_max(mx, scratch, -FLT_MAX);
  float s = 0;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) s += __expf(load(row, i) - mx);
  const float inv = 1.0f / block_sum(s, scratch);
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
    store(out, i, __expf(load(row, i) - mx) * inv);
}

template <class T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t C) {
  __shared__ float scratch[32];
  const int64_t base = blockIdx.x * C;
  float dot = 0;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
    dot += load(y, base + i) * load(dy, base + i);
  dot = block_sum(dot, scratch);
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    store(dx, base + i, load(y, base + i) * (load(dy, base + i) - dot));
  }
}

}  // namespace

Status check_softmax(ScalarType type, int64_t N, int64_t C) {
  if (!is_nn_type(type)) {
    return Status::fail(std::string("element type ") + scalar_name(type) +
                        " is not supported (f32, bf16 or f16)");
  }
  if (N < 0 || C <= 0 || N > 2147483647LL) {
    return Status::fail("shape (N " + std::to_string(N) + ", C " + std::to_string(C) +
                        ") needs 0 <= N < 2^31 and C > 0");
  }
  return Status::fine();
}

void softmax_forward(const void* x, void* y, ScalarType type, int64_t N, int64_t C,
                     cudaStream_t stream) {
  require(check_softmax(type, N, C), "softmax_forward");
  if (N == 0) return;
  dispatch_nn(type, "softmax_forward", [&](auto t) {
    using T = decltype(t);
    if (C <= kWarpRow) {
      softmax_forward_warp_kernel<T><<<warp_row_blocks(N), kThreads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<T*>(y), N, C);
      return;
    }
    softmax_forward_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), C);
  });
  check_launch("softmax_forward");
}

void softmax_backward(const void* y, const void* dy, void* dx, ScalarType type, int64_t N,
                      int64_t C, cudaStream_t stream) {
  require(check_softmax(type, N, C), "softmax_backward");
  if (N == 0) return;
  dispatch_nn(type, "softmax_backward", [&](auto t) {
    using T = decltype(t);
    if (C <= kWarpRow) {
      softmax_backward_warp_kernel<T><<<warp_row_blocks(N), kThreads, 0, stream>>>(
          static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), N, C);
      return;
    }
    softmax_backward_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), C);
  });
  check_launch("softmax_backward");
}

}  // namespace triad::kernels
