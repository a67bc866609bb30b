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

// blockIdx.x = segment, (blockIdx.y * blockDim.x + threadIdx.x) * V = the
// thread's first column (V columns per access when V > 1). With `add`, the
// segment's sum is added to its row of dw instead of stored (D: the tensor
// type, or f32 for a half weight's f32 gradient).
template <class T, class D, int V>
__global__ void embedding_backward_kernel(const int64_t* order, const int64_t* seg_start,
                                          const int64_t* seg_id, const T* dout, int64_t C, D* dw,
                                          bool add) {
  const int64_t c = (blockIdx.y * int64_t(blockDim.x) + threadIdx.x) * V;
  if (c >= C) return;
  const int64_t s = blockIdx.x;
  float acc[V] = {};
  for (int64_t k = seg_start[s]; k < seg_start[s + 1]; ++k) {
    float v[V];
    load_n<V>(dout, order[k] * C + c, v);
    for (int j = 0; j < V; ++j) acc[j] += v[j];
  }
  const int64_t at = seg_id[s] * C + c;
  if (add) {
    compute_t<D> old[V];
    load_n<V>(dw, at, old);
    for (int j = 0; j < V; ++j) acc[j] = static_cast<float>(old[j]) + acc[j];
  }
  store_n<V>(dw, at, acc);
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

void embedding_backward(const int64_t* order, const int64_t* seg_start, const int64_t* seg_id,
                        int64_t num_segments, const void* dout, ScalarType type, int64_t V,
                        int64_t C, void* dweight, cudaStream_t stream, bool f32_grad,
                        bool accumulate) {
  require(check_embedding(type, V, C, 0), "embedding_backward");
  if (num_segments > V || num_segments > 2147483647LL) {
    throw std::invalid_argument("embedding_backward: " + std::to_string(num_segments) +
                                " segments for " + std::to_string(V) + " rows");
  }
  if (!accumulate) {
    const size_t element = f32_grad ? sizeof(float) : scalar_size(type);
    check_cuda(cudaMemsetAsync(dweight, 0, static_cast<size_t>(V * C) * element, stream),
               "embedding_backward: cudaMemsetAsync");
  }
  if (num_segments == 0) return;
  const bool aligned = pack_aligned(dout) && pack_aligned(dweight);
  dispatch_nn(type, "embedding_backward", [&](auto t) {
    using T = decltype(t);
    auto launch = [&](auto d, auto v, bool add) {
      using D = decltype(d);
      constexpr int V = decltype(v)::value;
      const int64_t threads = (C / V + 31) / 32 * 32;  // a block covers the row when it can
      const int block = static_cast<int>(std::min<int64_t>(threads, kThreads));
      const dim3 grid(static_cast<unsigned>(num_segments),
                      static_cast<unsigned>((C / V + block - 1) / block));
      embedding_backward_kernel<T, D, V><<<grid, block, 0, stream>>>(
          order, seg_start, seg_id, static_cast<const T*>(dout), C, static_cast<D*>(dweight), add);
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
