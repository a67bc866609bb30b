// Ring attention's merge: one warp per (batch, head, query) row, its lanes
// over the row's D values (consecutive lanes, consecutive addresses); every
// lane reads both log-sum-exps, and lane 0 writes the new one once all have.
#include <cmath>
#include <string>

#include "attention_merge.h"
#include "device_utils.cuh"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256, kRowsPerBlock = kThreads / 32;

template <class T>
__global__ void attention_merge_kernel(float* out, float* lse, const T* part, const float* part_lse,
                                       int64_t B, int64_t Tq, int64_t NH, int64_t D) {
  const int lane = threadIdx.x & 31;
  const int64_t rows = B * NH * Tq;
  for (int64_t r = blockIdx.x * int64_t(kRowsPerBlock) + (threadIdx.x >> 5); r < rows;
       r += int64_t(gridDim.x) * kRowsPerBlock) {
    const int64_t b = r / (NH * Tq), h = r / Tq % NH, t = r % Tq;
    const float a = lse[r], c = part_lse[r];
    __syncwarp();                  // (every lane has read lse[r] before lane 0 rewrites it)
    if (c == -INFINITY) continue;  // the part saw no key
    const int64_t off = (b * Tq + t) * NH * D + h * D;
    float* o = out + off;
    if (a == -INFINITY) {
      for (int64_t d = lane; d < D; d += 32) o[d] = load(part, off + d);
      if (lane == 0) lse[r] = c;
      continue;
    }
    const float m = fmaxf(a, c), ea = expf(a - m), ec = expf(c - m), inv = 1.0f / (ea + ec);
    for (int64_t d = lane; d < D; d += 32) o[d] = (ea * o[d] + ec * load(part, off + d)) * inv;
    if (lane == 0) lse[r] = m + logf(ea + ec);
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
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    attention_merge_kernel<T><<<grid_for(blocks * kThreads, kThreads), kThreads, 0, stream>>>(
        out, lse, static_cast<const T*>(part), part_lse, B, Tq, NH, D);
  });
  check_launch("attention_merge");
}

}  // namespace triad::kernels
