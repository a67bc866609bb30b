// Embedding gather and its deterministic segmented backward.
#include "device_utils.cuh"
#include "embedding.h"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void embedding_forward_kernel(const T* w, const void* ids, bool ids64, int64_t C,
                                         int64_t N, T* out) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / C, c = i % C;
    out[i] = w[load_id(ids, ids64, row) * C + c];
  }
}

// blockIdx.x = segment, blockIdx.y * blockDim.x + threadIdx.x = column.
// With `add`, the segment's sum is added to its row of dw instead of
// stored (D: the tensor type, or f32 for a half weight's f32 gradient).
template <class T, class D>
__global__ void embedding_backward_kernel(const int64_t* order, const int64_t* seg_start,
                                          const int64_t* seg_id, const T* dout, int64_t C, D* dw,
                                          bool add) {
  const int64_t c = blockIdx.y * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t s = blockIdx.x;
  float acc = 0;
  for (int64_t k = seg_start[s]; k < seg_start[s + 1]; ++k) acc += load(dout, order[k] * C + c);
  const int64_t at = seg_id[s] * C + c;
  if (add) acc = static_cast<float>(load(dw, at)) + acc;
  store(dw, at, acc);
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
    embedding_forward_kernel<T><<<grid_for(N * C, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(weight), ids, ids64, C, N, static_cast<T*>(out));
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
  dispatch_nn(type, "embedding_backward", [&](auto t) {
    using T = decltype(t);
    const dim3 grid(static_cast<unsigned>(num_segments),
                    static_cast<unsigned>((C + kThreads - 1) / kThreads));
    if (f32_grad) {
      embedding_backward_kernel<T, float>
          <<<grid, kThreads, 0, stream>>>(order, seg_start, seg_id, static_cast<const T*>(dout), C,
                                          static_cast<float*>(dweight), true);
    } else {
      embedding_backward_kernel<T, T>
          <<<grid, kThreads, 0, stream>>>(order, seg_start, seg_id, static_cast<const T*>(dout), C,
                                          static_cast<T*>(dweight), accumulate);
    }
  });
  check_launch("embedding_backward");
}

}  // namespace triad::kernels
