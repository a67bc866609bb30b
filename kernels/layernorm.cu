// LayerNorm: one warp per row for the row-wise parts (statistics, y, dx);
// the weight and bias gradients are column sums done in two deterministic
// stages: per row chunk, then over chunks in order.
#include "device_utils.cuh"
#include "layernorm.h"

namespace triad::kernels {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int64_t kChunks = 64;   // row chunks of the column-sum stage

template <class T>
__global__ void ln_forward_kernel(const T* x, const T* w, const T* b, T* y, float* mean,
                                  float* rstd, int64_t N, int64_t C, float eps, const T* residual,
                                  T* sum) {
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* xr = x + row * C;
  if (residual) {
    // The fused residual add: each lane writes its elements of the sum and
    // reads back only those, so the row needs no synchronisation.
    const T* rr = residual + row * C;
    T* hr = sum + row * C;
    for (int64_t i = lane; i < C; i += 32) store(hr, i, load(xr, i) + load(rr, i));
    xr = hr;
  }
  float s = 0;
  for (int64_t i = lane; i < C; i += 32) s += load(xr, i);
  const float mu = warp_sum(s) / static_cast<float>(C);
  float v = 0;
  for (int64_t i = lane; i < C; i += 32) {
    const float d = load(xr, i) - mu;
    v += d * d;
  }
  const float rs = rsqrtf(warp_sum(v) / static_cast<float>(C) + eps);
  T* yr = y + row * C;
  for (int64_t i = lane; i < C; i += 32) {
    store(yr, i, (load(xr, i) - mu) * rs * load(w, i) + load(b, i));
  }
  if (lane == 0) mean[row] = mu, rstd[row] = rs;
}

template <class T>
__global__ void ln_backward_dx_kernel(const T* dy, const T* x, const T* w, const float* mean,
                                      const float* rstd, T* dx, int64_t N, int64_t C,
                                      const T* dsum) {
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* xr = x + row * C;
  const T* gr = dy + row * C;
  const float mu = mean[row], rs = rstd[row];
  float mg = 0, mgx = 0;
  for (int64_t i = lane; i < C; i += 32) {
    const float gw = load(gr, i) * load(w, i);
    mg += gw;
    mgx += gw * (load(xr, i) - mu) * rs;
  }
  mg = warp_sum(mg) / static_cast<float>(C);
  mgx = warp_sum(mgx) / static_cast<float>(C);
  T* out = dx + row * C;
  for (int64_t i = lane; i < C; i += 32) {
    const float xhat = (load(xr, i) - mu) * rs;
    const float extra = dsum ? load(dsum, row * C + i) : 0.0f;
    store(out, i, rs * (load(gr, i) * load(w, i) - mg - xhat * mgx) + extra);
  }
}

// partial[chunk][c] sums over rows of that chunk (blockIdx.y = chunk).
template <class T>
__global__ void ln_backward_partial_kernel(const T* dy, const T* x, const float* mean,
                                           const float* rstd, float* part_w, float* part_b,
                                           int64_t N, int64_t C, int64_t rows_per_chunk) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = min(N, r0 + rows_per_chunk);
  float sw = 0, sb = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const float g = load(dy, r * C + c);
    sw += g * (load(x, r * C + c) - mean[r]) * rstd[r];
    sb += g;
  }
  part_w[blockIdx.y * C + c] = sw;
  part_b[blockIdx.y * C + c] = sb;
}

// dw = beta * dw + the chunks' sum (beta 0: dw's contents are not read);
// D is the tensor type, or f32 for the f32 gradients of half parameters.
template <class D>
__global__ void ln_backward_finish_kernel(const float* part_w, const float* part_b, D* dw, D* db,
                                          int64_t C, int64_t chunks, float beta) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float sw = 0, sb = 0;
  for (int64_t k = 0; k < chunks; ++k) sw += part_w[k * C + c], sb += part_b[k * C + c];
  if (beta != 0.0f) {
    sw = beta * static_cast<float>(load(dw, c)) + sw;
    sb = beta * static_cast<float>(load(db, c)) + sb;
  }
  store(dw, c, sw);
  store(db, c, sb);
}

}  // namespace

Status check_layer_norm(ScalarType type, int64_t N, int64_t C, double eps) {
  if (!is_nn_type(type)) {
    return Status::fail(std::string("element type ") + scalar_name(type) +
                        " is not supported (f32, bf16 or f16)");
  }
  if (N < 0 || C <= 0) {
    return Status::fail("shape (N " + std::to_string(N) + ", C " + std::to_string(C) +
                        ") needs N >= 0 and C > 0");
  }
  if (!(eps > 0)) return Status::fail("eps " + std::to_string(eps) + " must be positive");
  return Status::fine();
}

void layer_norm_forward(const void* x, const void* weight, const void* bias, void* y, float* mean,
                        float* rstd, ScalarType type, int64_t N, int64_t C, double eps,
                        cudaStream_t stream, const void* residual, void* sum) {
  require(check_layer_norm(type, N, C, eps), "layer_norm_forward");
  if (residual && !sum)
    throw std::invalid_argument("layer_norm_forward: a residual needs a sum output");
  if (N == 0) return;
  dispatch_nn(type, "layer_norm_forward", [&](auto t) {
    using T = decltype(t);
    const unsigned blocks = static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
    ln_forward_kernel<T><<<blocks, 32 * kRowsPerBlock, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias),
        static_cast<T*>(y), mean, rstd, N, C, static_cast<float>(eps),
        static_cast<const T*>(residual), static_cast<T*>(sum));
  });
  check_launch("layer_norm_forward");
}

size_t layer_norm_backward_workspace(int64_t N, int64_t C) {
  const int64_t chunks = std::min<int64_t>(kChunks, std::max<int64_t>(N, 1));
  return static_cast<size_t>(2 * chunks * C) * sizeof(float);
}

void layer_norm_backward(const void* dy, const void* x, const void* weight, const float* mean,
                         const float* rstd, void* dx, void* dweight, void* dbias, ScalarType type,
                         int64_t N, int64_t C, void* workspace, cudaStream_t stream,
                         const void* dsum, bool f32_param_grads, double beta) {
  require(check_layer_norm(type, N, C, 1.0), "layer_norm_backward");
  if (!workspace) throw std::invalid_argument("layer_norm_backward: workspace is null");
  const int64_t chunks = std::min<int64_t>(kChunks, std::max<int64_t>(N, 1));
  const int64_t rows_per_chunk = (N + chunks - 1) / chunks;
  float* part_w = static_cast<float*>(workspace);
  float* part_b = part_w + chunks * C;
  dispatch_nn(type, "layer_norm_backward", [&](auto t) {
    using T = decltype(t);
    const T* pdy = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    if (N > 0) {
      const unsigned blocks = static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
      ln_backward_dx_kernel<T><<<blocks, 32 * kRowsPerBlock, 0, stream>>>(
          pdy, px, static_cast<const T*>(weight), mean, rstd, static_cast<T*>(dx), N, C,
          static_cast<const T*>(dsum));
    }
    const unsigned col_blocks = static_cast<unsigned>((C + 255) / 256);
    ln_backward_partial_kernel<T>
        <<<dim3(col_blocks, static_cast<unsigned>(chunks)), 256, 0, stream>>>(
            pdy, px, mean, rstd, part_w, part_b, N, C, std::max<int64_t>(rows_per_chunk, 1));
    if (f32_param_grads) {
      ln_backward_finish_kernel<float><<<col_blocks, 256, 0, stream>>>(
          part_w, part_b, static_cast<float*>(dweight), static_cast<float*>(dbias), C, chunks,
          static_cast<float>(beta));
    } else {
      ln_backward_finish_kernel<T><<<col_blocks, 256, 0, stream>>>(
          part_w, part_b, static_cast<T*>(dweight), static_cast<T*>(dbias), C, chunks,
          static_cast<float>(beta));
    }
  });
  check_launch("layer_norm_backward");
}

}  // namespace triad::kernels
