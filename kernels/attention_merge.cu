// Ring attention's merge: one thread per (batch, head, query) row, which
// reads both log-sum-exps once and rescales its row's D values.
#include <cmath>
#include <string>

#include "attention_merge.h"
#include "device_utils.cuh"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void attention_merge_kernel(float* out, float* lse, const T* part, const float* part_lse,
                                       int64_t B, int64_t Tq, int64_t NH, int64_t D) {
  const int64_t rows = B * NH * Tq;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = r / (NH * Tq), h = r / Tq % NH, t = r % Tq;
    const float a = lse[r], c = part_lse[r];
    if (c == -INFINITY) continue;  // the part saw no key
    const int64_t off = (b * Tq + t) * NH * D + h * D;
    float* o = out + off;
    if (a == -INFINITY) {
      for (int64_t d = 0; d < D; ++d) o[d] = load(part, off + d);
      lse[r] = c;
      continue;
    }
    const float m = fmaxf(a, c), ea = expf(a - m), ec = expf(c - m), inv = 1.0f / (ea + ec);
    for (int64_t d = 0; d < D; ++d) o[d] = (ea * o[d] + ec * load(part, off + d)) * inv;
    lse[r] = m + logf(ea + ec);
  }
}

}  // namespace

void attention_merge(float* out, float* lse, const void* part, const float* part_lse,
                     ScalarType type, int64_t B, int64_t Tq, int64_t NH, int64_t D,
                     cudaStream_t stream) {
  if (B < 0 || Tq < 0 || NH < 0 || D < 0) {
    throw std::invalid_argument("attention_merge: negative shape (B " + std::to_string(B) +
                                ", Tq " + std::to_string(Tq) + ", NH " + std::to_string(NH) +
                                ", D " + std::to_string(D) + ")");
  }
  const int64_t rows = B * NH * Tq;
  if (rows == 0) return;
  dispatch_nn(type, "attention_merge", [&](auto t) {
    using T = decltype(t);
    attention_merge_kernel<T><<<grid_for(rows, kThreads), kThreads, 0, stream>>>(
        out, lse, static_cast<const T*>(part), part_lse, B, Tq, NH, D);
  });
  check_launch("attention_merge");
}

}  // namespace triad::kernels
