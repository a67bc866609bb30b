// Rotary position embedding: one thread per (token, pair i), which takes
// the pair's cos and sin once (f64) and turns pair i of all 2 * n_head
// heads of q and k with them, then copies pair i of v's heads. Neighbouring
// threads take neighbouring i, so a warp reads and writes runs of
// consecutive elements of each head.
#include <cmath>
#include <string>

#include "device_utils.cuh"
#include "rotary.h"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void rotary_kernel(const T* x, T* y, int64_t rows, int64_t T_len, int64_t n_head,
                              int64_t D, const int64_t* positions, int64_t start, double theta,
                              double sign) {
  using Cp = compute_t<T>;
  const int64_t half = D / 2, C = n_head * D, n = rows * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / half, i = idx - r * half;
    const int64_t pos = positions ? positions[r] : start + r % T_len;
    const double angle = static_cast<double>(pos) * pow(theta, -2.0 * double(i) / double(D));
    const Cp c = static_cast<Cp>(cos(angle)), s = static_cast<Cp>(sign * sin(angle));
    const T* xr = x + r * 3 * C;
    T* yr = y + r * 3 * C;
    for (int64_t h = 0; h < 2 * n_head; ++h) {
      const int64_t a = h * D + i, b = a + half;
      const Cp x1 = load(xr, a), x2 = load(xr, b);
      store(yr, a, x1 * c - x2 * s);
      store(yr, b, x2 * c + x1 * s);
    }
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t a = 2 * C + h * D + i;
      yr[a] = xr[a];
      yr[a + half] = xr[a + half];
    }
  }
}

}  // namespace

Status check_rotary_embedding(int64_t B, int64_t T, int64_t n_head, int64_t head_dim, double theta,
                              int64_t start) {
  if (B < 0 || T < 0 || n_head <= 0) {
    return Status::fail("B " + std::to_string(B) + ", T " + std::to_string(T) + ", n_head " +
                        std::to_string(n_head) + ": need B, T >= 0 and n_head > 0");
  }
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return Status::fail("head dimension " + std::to_string(head_dim) +
                        " must be even and positive");
  }
  if (!(theta > 0.0) || !std::isfinite(theta)) {
    return Status::fail("theta " + std::to_string(theta) + " must be a positive number");
  }
  if (start < 0) return Status::fail("start " + std::to_string(start) + " must be >= 0");
  return Status::fine();
}

void rotary_embedding(const void* qkv, void* out, ScalarType type, int64_t B, int64_t T,
                      int64_t n_head, int64_t head_dim, const int64_t* positions, int64_t start,
                      double theta, bool inverse, cudaStream_t stream) {
  require(check_rotary_embedding(B, T, n_head, head_dim, theta, start), "rotary_embedding");
  const int64_t rows = B * T, n = rows * (head_dim / 2);
  if (n == 0) return;
  auto launch = [&](auto tag) {
    using E = decltype(tag);
    rotary_kernel<E><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const E*>(qkv), static_cast<E*>(out), rows, T, n_head, head_dim, positions,
        start, theta, inverse ? -1.0 : 1.0);
  };
  if (type == ScalarType::F64) {
    launch(double{});
  } else {
    dispatch_nn(type, "rotary_embedding", launch);
  }
  check_launch("rotary_embedding");
}

}  // namespace triad::kernels
