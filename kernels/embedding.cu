// Embedding gather and its deterministic segmented backward.
#include <algorithm>
#include <type_traits>

#include "device_utils.cuh"
#include "embedding.h"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;

// Packs of V elements of a row (V divides C; V > 1 when the table and the
// output are 16-byte aligned): one division per pack.
template <class T, int V>
__global__ void embedding_forward_kernel(const T* w, const void* ids, bool ids64, int64_t C,
                                         int64_t N, T* out) {
  const int64_t row_packs = C / V, total = N * row_packs;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < total;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = p / row_packs, c = (p % row_packs) * V;
    compute_t<T> v[V];
    load_n<V>(w, load_id(ids, ids64, row) * C + c, v);
    store_n<V>(out, row * C + c, v);
  }
}

// V f32 values at p + i (aligned to their size), as accesses of at most 16
// bytes (a bf16 pack's 8 sums are two).
template <int V>
__device__ __forceinline__ void store_f32(float* p, int64_t i, const float (&in)[V]) {
  constexpr int W = V < 4 ? V : 4;
#pragma unroll
  for (int q = 0; q < V / W; ++q) {
    float part[W];
#pragma unroll
    for (int j = 0; j < W; ++j) part[j] = in[q * W + j];
    store_n<W>(p, i + q * W, part);
  }
}
template <int V>
__device__ __forceinline__ void load_f32(const float* p, int64_t i, float (&out)[V]) {
  constexpr int W = V < 4 ? V : 4;
#pragma unroll
  for (int q = 0; q < V / W; ++q) {
    float part[W];
    load_n<W>(p, i + q * W, part);
#pragma unroll
    for (int j = 0; j < W; ++j) out[q * W + j] = part[j];
  }
}

// acc stored to dw[at, at + V), or with `add` added to what is there.
template <class D, int V>
__device__ __forceinline__ void finish_row(D* dw, int64_t at, float (&acc)[V], bool add) {
  if (add) {
    compute_t<D> old[V];
    load_n<V>(dw, at, old);
    for (int j = 0; j < V; ++j) acc[j] = static_cast<float>(old[j]) + acc[j];
  }
  store_n<V>(dw, at, acc);
}

// blockIdx.x = piece, (blockIdx.y * blockDim.x + threadIdx.x) * V = the
// thread's first column (V columns per access when V > 1). A piece sums its
// positions in order; a whole segment's piece finishes its row of dw (with
// `add`, adds to it; D: the tensor type, or f32 for a half weight's f32
// gradient), a long segment's piece stores its sum to its slot of partials.
template <class T, class D, int V>
__global__ void embedding_backward_kernel(const int64_t* order, const int64_t* piece_start,
                                          const int64_t* piece_dest, const T* dout, int64_t C,
                                          D* dw, float* partials, bool add) {
  const int64_t c = (blockIdx.y * int64_t(blockDim.x) + threadIdx.x) * V;
  if (c >= C) return;
  const int64_t p = blockIdx.x, end = piece_start[p + 1];
  float acc[V] = {};
  // Unrolled so that several rows' loads are in flight; the adds keep their order.
#pragma unroll 4
  for (int64_t k = piece_start[p]; k < end; ++k) {
    float v[V];
    load_n<V>(dout, order[k] * C + c, v);
    for (int j = 0; j < V; ++j) acc[j] += v[j];
  }
  const int64_t dest = piece_dest[p];
  if (dest < 0) {
    store_f32<V>(partials, (-1 - dest) * C + c, acc);
  } else {
    finish_row<D, V>(dw, dest * C + c, acc, add);
  }
}

// blockIdx.x = long segment, columns as above: its pieces' sums added in
// order, then its row finished.
template <class D, int V>
__global__ void embedding_pieces_kernel(const int64_t* long_first, const int64_t* long_id,
                                        const float* partials, int64_t C, D* dw, bool add) {
  const int64_t c = (blockIdx.y * int64_t(blockDim.x) + threadIdx.x) * V;
  if (c >= C) return;
  const int64_t l = blockIdx.x, end = long_first[l + 1];
  float acc[V] = {};
#pragma unroll 4
  for (int64_t s = long_first[l]; s < end; ++s) {
    float v[V];
    load_f32<V>(partials, s * C + c, v);
    for (int j = 0; j < V; ++j) acc[j] += v[j];
  }
  finish_row<D, V>(dw, long_id[l] * C + c, acc, add);
}

}  // namespace

Status check_embedding(ScalarType type, int64_t V, int64_t C, int64_t N) {
  if (!is_nn_type(type)) {
    return Status::fail(std::string("weight type ") + scalar_name(type) +
                        " is not supported (f32, bf16 or f16)");
  }
  if (V <= 0 || C <= 0 || N < 0) {
    return Status::fail("shape (V " + std::to_string(V) + ", C " + std::to_string(C) + ", N " +
                        std::to_string(N) + ") needs V > 0, C > 0, N >= 0");
  }
  return Status::fine();
}

void embedding_forward(const void* weight, ScalarType type, const void* ids, bool ids64, int64_t V,
                       int64_t C, int64_t N, void* out, cudaStream_t stream) {
  require(check_embedding(type, V, C, N), "embedding_forward");
  if (N == 0) return;
  dispatch_nn(type, "embedding_forward", [&](auto t) {
    using T = decltype(t);
    const T* w = static_cast<const T*>(weight);
    if (C % kPack<T> == 0 && pack_aligned(weight) && pack_aligned(out)) {
      embedding_forward_kernel<T, kPack<T>>
          <<<grid_for(N * C / kPack<T>, kThreads), kThreads, 0, stream>>>(w, ids, ids64, C, N,
                                                                          static_cast<T*>(out));
    } else {
      embedding_forward_kernel<T, 1><<<grid_for(N * C, kThreads), kThreads, 0, stream>>>(
          w, ids, ids64, C, N, static_cast<T*>(out));
    }
  });
  check_launch("embedding_forward");
}

void embedding_backward(const EmbeddingPlan& plan, const void* dout, ScalarType type, int64_t V,
                        int64_t C, void* dweight, cudaStream_t stream, bool f32_grad,
                        bool accumulate) {
  require(check_embedding(type, V, C, 0), "embedding_backward");
  if (plan.pieces < 0 || plan.pieces > 2147483647LL || plan.longs < 0 || plan.longs > V ||
      plan.longs > plan.pieces) {
    throw std::invalid_argument("embedding_backward: " + std::to_string(plan.pieces) +
                                " pieces and " + std::to_string(plan.longs) +
                                " long segments for " + std::to_string(V) + " rows");
  }
  if (plan.longs > 0 && plan.partials == nullptr) {
    throw std::invalid_argument("embedding_backward: " + std::to_string(plan.longs) +
                                " long segments need a scratch of partial sums (null)");
  }
  if (!accumulate) {
    const size_t element = f32_grad ? sizeof(float) : scalar_size(type);
    check_cuda(cudaMemsetAsync(dweight, 0, static_cast<size_t>(V * C) * element, stream),
               "embedding_backward: cudaMemsetAsync");
  }
  if (plan.pieces == 0) return;
  const bool aligned = pack_aligned(dout) && pack_aligned(dweight);
  dispatch_nn(type, "embedding_backward", [&](auto t) {
    using T = decltype(t);
    auto launch = [&](auto d, auto v, bool add) {
      using D = decltype(d);
      constexpr int W = decltype(v)::value;
      const int64_t threads = (C / W + 31) / 32 * 32;  // a block covers the row when it can
      const int block = static_cast<int>(std::min<int64_t>(threads, kThreads));
      const unsigned column_blocks = static_cast<unsigned>((C / W + block - 1) / block);
      D* dw = static_cast<D*>(dweight);
      embedding_backward_kernel<T, D, W>
          <<<dim3(static_cast<unsigned>(plan.pieces), column_blocks), block, 0, stream>>>(
              plan.order, plan.piece_start, plan.piece_dest, static_cast<const T*>(dout), C, dw,
              plan.partials, add);
      if (plan.longs > 0) {
        embedding_pieces_kernel<D, W>
            <<<dim3(static_cast<unsigned>(plan.longs), column_blocks), block, 0, stream>>>(
                plan.long_first, plan.long_id, plan.partials, C, dw, add);
      }
    };
    // Packs of the wider of the two types (4 for f32 gradients).
    if (f32_grad) {
      if (aligned && C % 4 == 0) {
        launch(float{}, std::integral_constant<int, 4>{}, true);
      } else {
        launch(float{}, std::integral_constant<int, 1>{}, true);
      }
    } else if (aligned && C % kPack<T> == 0) {
      launch(T{}, std::integral_constant<int, kPack<T>>{}, accumulate);
    } else {
      launch(T{}, std::integral_constant<int, 1>{}, accumulate);
    }
  });
  check_launch("embedding_backward");
}

}  // namespace triad::kernels
