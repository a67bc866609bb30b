// Decoding's attention over a key/value cache: a block per query, its warps
// splitting the keys, each with an online softmax in f32, merged at the end.
#include <cmath>
#include <cstdint>
#include <string>

#include "cached_attention.h"
#include "device_utils.cuh"

namespace triad::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
// Elements of a head a lane holds: D / 32, rounded up.
constexpr int kPerLane = static_cast<int>(kCachedAttentionMaxHeadDim / 32);

struct Args {
  int64_t n, NH, group, D, L, width;
  int64_t kb, kh, vb, vh;
  int64_t window;
  float scale, softcap;
};

template <class T>
__global__ void __launch_bounds__(kThreads)
    cached_attention_kernel(const T* qkv, const T* keys, const T* values, T* out, Args a,
                            const int32_t* text_starts) {
  const int64_t h = blockIdx.x % a.NH, row = blockIdx.x / a.NH;  // row: b * n + i
  const int64_t b = row / a.n, p = a.L - a.n + row % a.n;
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  int64_t first = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
  if (text_starts != nullptr && p >= text_starts[b] && text_starts[b] > first)
    first = text_starts[b];
  const T* q = qkv + row * a.width + h * a.D;
  const T* k = keys + b * a.kb + h / a.group * a.kh;
  const T* v = values + b * a.vb + h / a.group * a.vh;

  float qr[kPerLane], acc[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    qr[e] = d < a.D ? load(q, d) * a.scale : 0.0f;
    acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;  // this warp's running max and sum
  for (int64_t j = first + warp; j <= p; j += kWarps) {
    const T* kj = k + j * a.D;
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t d = lane + 32 * e;
      if (d < a.D) s += qr[e] * load(kj, d);
    }
    s = warp_sum(s);
    if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
    const float mn = fmaxf(m, s), keep = expf(m - mn), w = expf(s - mn);
    l = l * keep + w;
    const T* vj = v + j * a.D;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t d = lane + 32 * e;
      acc[e] = acc[e] * keep + (d < a.D ? w * load(vj, d) : 0.0f);
    }
    m = mn;
  }

  __shared__ float part_max[kWarps];
  __shared__ float part_sum[kWarps];
  __shared__ float part_acc[kWarps * kCachedAttentionMaxHeadDim];
  if (lane == 0) {
    part_max[warp] = m;
    part_sum[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < a.D) part_acc[warp * kCachedAttentionMaxHeadDim + d] = acc[e];
  }
  __syncthreads();
  float top = -INFINITY;
  for (int w = 0; w < kWarps; ++w) top = fmaxf(top, part_max[w]);
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (part_max[w] > -INFINITY) total += part_sum[w] * expf(part_max[w] - top);
  }
  T* o = out + row * a.NH * a.D + h * a.D;
  for (int64_t d = threadIdx.x; d < a.D; d += kThreads) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      // A warp that saw no key (fewer keys than warps) adds nothing.
      if (part_max[w] > -INFINITY)
        sum += part_acc[w * kCachedAttentionMaxHeadDim + d] * expf(part_max[w] - top);
    }
    store(o, d, sum / total);
  }
}

}  // namespace

Status check_cached_attention(ScalarType type, const CachedAttentionShape& s) {
  if (!is_nn_type(type)) {
    return Status::fail(std::string("element type ") + scalar_name(type) +
                        " is not supported (f32, bf16 or f16)");
  }
  if (s.B < 1 || s.n < 1 || s.NH < 1 || s.NKV < 1 || s.D < 1) {
    return Status::fail("batch " + std::to_string(s.B) + ", new tokens " + std::to_string(s.n) +
                        ", heads " + std::to_string(s.NH) + "/" + std::to_string(s.NKV) +
                        ", head dim " + std::to_string(s.D) + " (each must be >= 1)");
  }
  if (s.NH % s.NKV != 0) {
    return Status::fail("query heads " + std::to_string(s.NH) +
                        " not divisible by key/value heads " + std::to_string(s.NKV));
  }
  if (s.D > kCachedAttentionMaxHeadDim) {
    return Status::fail("head dim " + std::to_string(s.D) + " is above the kernel's " +
                        std::to_string(kCachedAttentionMaxHeadDim));
  }
  if (s.L < s.n) {
    return Status::fail("length " + std::to_string(s.L) + " is shorter than the " +
                        std::to_string(s.n) + " new tokens it must hold");
  }
  if (s.window < 0 || !(s.softcap >= 0.0) || !std::isfinite(s.softcap)) {
    return Status::fail("window " + std::to_string(s.window) + ", softcap " +
                        std::to_string(s.softcap) + " (expected >= 0 and finite)");
  }
  if (s.B * s.n * s.NH > int64_t(0x7fffffff)) {
    return Status::fail(std::to_string(s.B * s.n * s.NH) +
                        " queries are more than one launch's blocks");
  }
  return Status::fine();
}

void cached_attention_forward(const void* qkv, const void* keys, const void* values, void* out,
                              ScalarType type, const CachedAttentionShape& s,
                              const int32_t* text_starts, cudaStream_t stream) {
  require(check_cached_attention(type, s), "cached_attention_forward");
  const Args a{s.n,
               s.NH,
               s.NH / s.NKV,
               s.D,
               s.L,
               (s.NH + 2 * s.NKV) * s.D,
               s.k_batch_stride,
               s.k_head_stride,
               s.v_batch_stride,
               s.v_head_stride,
               s.window,
               static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.D))),
               static_cast<float>(s.softcap)};
  const auto blocks = static_cast<unsigned>(s.B * s.n * s.NH);
  dispatch_nn(type, "cached_attention_forward", [&](auto t) {
    using T = decltype(t);
    cached_attention_kernel<T><<<blocks, kThreads, 0, stream>>>(
        static_cast<const T*>(qkv), static_cast<const T*>(keys), static_cast<const T*>(values),
        static_cast<T*>(out), a, text_starts);
  });
  check_launch("cached_attention_forward");
}

}  // namespace triad::kernels
