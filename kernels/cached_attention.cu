// Decoding's attention over a key/value cache, split over the keys: a block
// per (query, chunk of slots) whose lanes score a key each, then a merge of
// the chunks' partial softmaxes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "cached_attention.h"
#include "device_utils.cuh"

namespace triad::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxD = static_cast<int>(kCachedAttentionMaxHeadDim);
// Elements of a head a lane holds in the output: D / 32, rounded up.
constexpr int kPerLane = kMaxD / 32;
// The fewest keys a chunk holds, and the blocks the split aims for.
constexpr int64_t kMinChunk = 128;
constexpr int64_t kTargetBlocks = 256;

struct Args {
  int64_t n, NH, group, D, L, width;
  int64_t kb, kh, vb, vh;
  int64_t window, chunk;
  float scale, softcap;
};

// The partial result of a query's chunk: its keys' running max and sum,
// then D weighted sums of values (unnormalised).
template <class F>
__device__ __forceinline__ F* partial_of(F* ws, int64_t query, int64_t chunk, int64_t splits,
                                         int64_t D) {
  return ws + (query * splits + chunk) * (D + 2);
}

// grid (B * n * NH, splits); V: the elements a key's row is read in at a
// time (16-byte packs where every row is aligned to them, else 1).
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    cached_attention_kernel(const T* qkv, const T* keys, const T* values, T* out, Args a,
                            const int32_t* text_starts, float* workspace) {
  const int64_t query = blockIdx.x, h = query % a.NH, row = query / a.NH;  // row: b * n + i
  const int64_t b = row / a.n, p = a.L - a.n + row % a.n;
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  int64_t first = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
  if (text_starts != nullptr && p >= text_starts[b] && text_starts[b] > first)
    first = text_starts[b];
  // This block's slots: its chunk's, within [first, p].
  const int64_t chunk_lo = int64_t(blockIdx.y) * a.chunk;
  const int64_t lo = chunk_lo > first ? chunk_lo : first;
  const int64_t hi = chunk_lo + a.chunk - 1 < p ? chunk_lo + a.chunk - 1 : p;
  const T* k = keys + b * a.kb + h / a.group * a.kh;
  const T* v = values + b * a.vb + h / a.group * a.vh;

  __shared__ float q_s[kMaxD];
  __shared__ float p_s[kThreads];  // each warp's 32 current weights
  for (int64_t d = threadIdx.x; d < a.D; d += kThreads)
    q_s[d] = load(qkv, row * a.width + h * a.D + d) * a.scale;
  __syncthreads();

  float acc[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) acc[e] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // this warp's running max and sum (alike in its lanes)
  // Rounds of 32 keys, the warps taking them in turn; a lane scores key j.
  for (int64_t base = lo + int64_t(warp) * 32; base <= hi; base += kThreads) {
    const int64_t j = base + lane;
    float s = -INFINITY;
    if (j <= hi) {
      const T* kj = k + j * a.D;
      float dot = 0.0f;
      for (int64_t d = 0; d < a.D; d += V) {
        compute_t<T> kv[V];
        load_n<V>(kj, d, kv);
#pragma unroll
        for (int u = 0; u < V; ++u) dot += q_s[d + u] * static_cast<float>(kv[u]);
      }
      s = a.softcap > 0.0f ? a.softcap * tanhf(dot / a.softcap) : dot;
    }
    const float mn = fmaxf(m, warp_max(s));  // finite: key `base` is in range
    const float w = j <= hi ? expf(s - mn) : 0.0f, keep = expf(m - mn);
    l = l * keep + warp_sum(w);
    p_s[threadIdx.x] = w;
    __syncwarp();
    const int64_t keys_here = hi - base + 1 < 32 ? hi - base + 1 : 32;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) acc[e] *= keep;
    for (int64_t t = 0; t < keys_here; ++t) {
      const float wt = p_s[warp * 32 + t];
      const T* vt = v + (base + t) * a.D;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int64_t d = lane + 32 * e;
        if (d < a.D) acc[e] += wt * load(vt, d);
      }
    }
    m = mn;
    __syncwarp();  // p_s is read before the next round writes it
  }

  // The block's four warps merged (a warp that had no key adds nothing).
  __shared__ float part_max[kWarps];
  __shared__ float part_sum[kWarps];
  __shared__ float part_acc[kWarps * kMaxD];
  if (lane == 0) {
    part_max[warp] = m;
    part_sum[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < a.D) part_acc[warp * kMaxD + d] = acc[e];
  }
  __syncthreads();
  float top = -INFINITY;
  for (int w = 0; w < kWarps; ++w) top = fmaxf(top, part_max[w]);
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (part_max[w] > -INFINITY) total += part_sum[w] * expf(part_max[w] - top);
  }
  const bool alone = gridDim.y == 1;
  float* mine = alone ? nullptr : partial_of(workspace, query, blockIdx.y, gridDim.y, a.D);
  if (mine != nullptr && threadIdx.x == 0) {
    mine[0] = top;  // -inf for a chunk outside the query's slots
    mine[1] = total;
  }
  for (int64_t d = threadIdx.x; d < a.D; d += kThreads) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (part_max[w] > -INFINITY) sum += part_acc[w * kMaxD + d] * expf(part_max[w] - top);
    }
    if (alone) {
      store(out, row * a.NH * a.D + h * a.D + d, sum / total);
    } else {
      mine[2 + d] = sum;
    }
  }
}

// A block per query: the chunks' partial results merged, in chunk order.
template <class T>
__global__ void __launch_bounds__(kThreads)
    cached_attention_merge_kernel(const float* workspace, T* out, int64_t NH, int64_t D,
                                  int64_t splits) {
  const int64_t query = blockIdx.x, h = query % NH, row = query / NH;
  float top = -INFINITY;
  for (int64_t c = 0; c < splits; ++c)
    top = fmaxf(top, partial_of(workspace, query, c, splits, D)[0]);
  float total = 0.0f;
  for (int64_t c = 0; c < splits; ++c) {
    const float* part = partial_of(workspace, query, c, splits, D);
    if (part[0] > -INFINITY) total += part[1] * expf(part[0] - top);
  }
  for (int64_t d = threadIdx.x; d < D; d += kThreads) {
    float sum = 0.0f;
    for (int64_t c = 0; c < splits; ++c) {
      const float* part = partial_of(workspace, query, c, splits, D);
      if (part[0] > -INFINITY) sum += part[2 + d] * expf(part[0] - top);
    }
    store(out, row * NH * D + h * D + d, sum / total);
  }
}

// One thread per element of the new keys and values: (b, t, h, d) of k,
// then of v.
template <class T>
__global__ void write_kv_cache_kernel(const T* qkv, T* keys, T* values, int64_t n, int64_t KV,
                                      int64_t D, int64_t C, int64_t width, int64_t start,
                                      int64_t kb, int64_t kh, int64_t vb, int64_t vh,
                                      int64_t total) {
  const int64_t half = total / 2;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const bool value = i >= half;
    const int64_t e = value ? i - half : i;
    const int64_t d = e % D, h = e / D % KV, t = e / (D * KV) % n, b = e / (D * KV * n);
    const T x = qkv[(b * n + t) * width + C + (value ? KV * D : 0) + h * D + d];
    if (value) {
      values[b * vb + h * vh + (start + t) * D + d] = x;
    } else {
      keys[b * kb + h * kh + (start + t) * D + d] = x;
    }
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

int64_t cached_attention_splits(const CachedAttentionShape& s) {
  const int64_t queries = std::max<int64_t>(1, s.B * s.n * s.NH);
  const int64_t most = std::max<int64_t>(1, (s.L + kMinChunk - 1) / kMinChunk);
  const int64_t wanted = (kTargetBlocks + queries - 1) / queries;
  return std::clamp<int64_t>(wanted, 1, std::min<int64_t>(most, 65535));
}

size_t cached_attention_workspace(const CachedAttentionShape& s) {
  const int64_t splits = cached_attention_splits(s);
  if (splits == 1) return 0;
  return static_cast<size_t>(s.B * s.n * s.NH * splits * (s.D + 2)) * sizeof(float);
}

void write_kv_cache(const void* qkv, void* keys, void* values, ScalarType type,
                    const CachedAttentionShape& s, int64_t start, cudaStream_t stream) {
  CachedAttentionShape shape = s;
  shape.L = s.n;  // (only the new tokens are read)
  require(check_cached_attention(type, shape), "write_kv_cache");
  if (start < 0) {
    throw std::invalid_argument("write_kv_cache: start " + std::to_string(start) + " must be >= 0");
  }
  const int64_t total = 2 * s.B * s.n * s.NKV * s.D;
  dispatch_nn(type, "write_kv_cache", [&](auto t) {
    using T = decltype(t);
    write_kv_cache_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(qkv), static_cast<T*>(keys), static_cast<T*>(values), s.n, s.NKV, s.D,
        s.NH * s.D, (s.NH + 2 * s.NKV) * s.D, start, s.k_batch_stride, s.k_head_stride,
        s.v_batch_stride, s.v_head_stride, total);
  });
  check_launch("write_kv_cache");
}

void cached_attention_forward(const void* qkv, const void* keys, const void* values, void* out,
                              ScalarType type, const CachedAttentionShape& s,
                              const int32_t* text_starts, void* workspace, cudaStream_t stream) {
  require(check_cached_attention(type, s), "cached_attention_forward");
  const int64_t splits = cached_attention_splits(s);
  if (splits > 1 && workspace == nullptr) {
    throw std::invalid_argument("cached_attention_forward: " + std::to_string(splits) +
                                " chunks per query need a workspace of " +
                                std::to_string(cached_attention_workspace(s)) + " bytes");
  }
  // Chunks of whole rounds of 32 keys.
  const int64_t chunk = ((s.L + splits - 1) / splits + 31) / 32 * 32;
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
               chunk,
               static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.D))),
               static_cast<float>(s.softcap)};
  const auto queries = static_cast<unsigned>(s.B * s.n * s.NH);
  const dim3 grid(queries, static_cast<unsigned>(splits));
  float* ws = static_cast<float*>(workspace);
  dispatch_nn(type, "cached_attention_forward", [&](auto t) {
    using T = decltype(t);
    constexpr int P = kPack<T>;
    // Packs when every key row starts on a 16-byte boundary.
    const bool packs =
        pack_aligned(keys) && s.D % P == 0 && s.k_batch_stride % P == 0 && s.k_head_stride % P == 0;
    const T* pq = static_cast<const T*>(qkv);
    const T* pk = static_cast<const T*>(keys);
    const T* pv = static_cast<const T*>(values);
    T* po = static_cast<T*>(out);
    if (packs) {
      cached_attention_kernel<T, P>
          <<<grid, kThreads, 0, stream>>>(pq, pk, pv, po, a, text_starts, ws);
    } else {
      cached_attention_kernel<T, 1>
          <<<grid, kThreads, 0, stream>>>(pq, pk, pv, po, a, text_starts, ws);
    }
    check_launch("cached_attention_forward");
    if (splits > 1) {
      cached_attention_merge_kernel<T><<<queries, kThreads, 0, stream>>>(ws, po, s.NH, s.D, splits);
      check_launch("cached_attention_forward (merge)");
    }
  });
}

}  // namespace triad::kernels
