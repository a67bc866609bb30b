// LayerNorm: one warp per row for the row-wise parts (statistics, y, dx);
// the weight and bias gradients are column sums done in two deterministic
// stages. Up to kFusedMaxC columns the backward is two launches: one pass
// over the rows computes dx and, in each warp's own slice of shared memory,
// the column sums of its rows (no atomics), which each block adds in warp
// order into its partial row; the second adds the blocks' partials in
// order. Wider rows take three: dx, the column sums per row chunk, the
// chunks in order.
#include "device_utils.cuh"
#include "layernorm.h"

namespace triad::kernels {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int64_t kChunks = 64;   // row chunks of the column-sum stage
// The fused backward: warps per block, blocks at most (each block's warps
// stride over the rows), and the widest row whose per-warp column sums fit
// 48 KiB of shared memory (2 floats per column per warp).
constexpr int kFusedWarps = 4;
constexpr int64_t kFusedBlocks = 256;
constexpr int64_t kFusedMaxC = 48 * 1024 / (2 * kFusedWarps * int64_t(sizeof(float)));

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

// dx for one row (a warp; dx = LayerNorm's input gradient + dsum when
// given), calling each(i, dy, xhat) for every element i the lane writes.
template <class T, class F>
__device__ __forceinline__ void ln_backward_row(const T* dy, const T* x, const T* w,
                                                const float* mean, const float* rstd, T* dx,
                                                int64_t C, const T* dsum, int64_t row, int lane,
                                                F&& each) {
  const T* xr = x + row * C;
  const T* gr = dy + row * C;
  const float mu = mean[row], rs = rstd[row];
  float mg = 0, mgx = 0;  // the row means of dy * w and dy * w * xhat
  for (int64_t i = lane; i < C; i += 32) {
    const float gw = load(gr, i) * load(w, i);
    mg += gw;
    mgx += gw * (load(xr, i) - mu) * rs;
  }
  mg = warp_sum(mg) / static_cast<float>(C);
  mgx = warp_sum(mgx) / static_cast<float>(C);
  T* out = dx + row * C;
  for (int64_t i = lane; i < C; i += 32) {
    const float g = load(gr, i);
    const float xhat = (load(xr, i) - mu) * rs;
    const float extra = dsum ? load(dsum, row * C + i) : 0.0f;
    store(out, i, rs * (g * load(w, i) - mg - xhat * mgx) + extra);
    each(i, g, xhat);
  }
}

template <class T>
__global__ void ln_backward_dx_kernel(const T* dy, const T* x, const T* w, const float* mean,
                                      const float* rstd, T* dx, int64_t N, int64_t C,
                                      const T* dsum) {
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + (threadIdx.x >> 5);
  if (row >= N) return;
  ln_backward_row(dy, x, w, mean, rstd, dx, C, dsum, row, threadIdx.x & 31,
                  [](int64_t, float, float) {});
}

// dx for rows blockIdx.x * kFusedWarps + warp, then every gridDim.x *
// kFusedWarps rows after, and part_w/part_b[blockIdx.x][c]: the column sums
// of dy * xhat and dy over the block's rows, in a fixed order.
template <class T>
__global__ void __launch_bounds__(32 * kFusedWarps)
    ln_backward_fused_kernel(const T* dy, const T* x, const T* w, const float* mean,
                             const float* rstd, T* dx, int64_t N, int64_t C, const T* dsum,
                             float* part_w, float* part_b) {
  extern __shared__ float sums[];  // [warp][2][C]: the warp's weight, then bias sums
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* sw = sums + warp * 2 * C;
  float* sb = sw + C;
  // A lane only ever touches the columns i = lane (mod 32) of its warp's
  // slice, so the slice needs no synchronisation until the block sums it.
  for (int64_t i = lane; i < C; i += 32) sw[i] = 0.0f, sb[i] = 0.0f;
  const int64_t stride = int64_t(gridDim.x) * kFusedWarps;
  for (int64_t row = blockIdx.x * int64_t(kFusedWarps) + warp; row < N; row += stride) {
    ln_backward_row(dy, x, w, mean, rstd, dx, C, dsum, row, lane,
                    [sw, sb](int64_t i, float g, float xhat) {
                      sw[i] += g * xhat;
                      sb[i] += g;
                    });
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float a = 0, b = 0;
    for (int k = 0; k < kFusedWarps; ++k) a += sums[k * 2 * C + c], b += sums[k * 2 * C + C + c];
    part_w[blockIdx.x * C + c] = a;
    part_b[blockIdx.x * C + c] = b;
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

namespace {
// Partial rows of the column sums: the fused kernel's blocks, or the
// three-launch path's row chunks.
int64_t partial_rows(int64_t N, int64_t C) {
  if (C <= kFusedMaxC) {
    return std::min<int64_t>(kFusedBlocks,
                             std::max<int64_t>((N + kFusedWarps - 1) / kFusedWarps, 1));
  }
  return std::min<int64_t>(kChunks, std::max<int64_t>(N, 1));
}
}  // namespace

size_t layer_norm_backward_workspace(int64_t N, int64_t C) {
  return static_cast<size_t>(2 * partial_rows(N, C) * C) * sizeof(float);
}

void layer_norm_backward(const void* dy, const void* x, const void* weight, const float* mean,
                         const float* rstd, void* dx, void* dweight, void* dbias, ScalarType type,
                         int64_t N, int64_t C, void* workspace, cudaStream_t stream,
                         const void* dsum, bool f32_param_grads, double beta) {
  require(check_layer_norm(type, N, C, 1.0), "layer_norm_backward");
  if (!workspace) throw std::invalid_argument("layer_norm_backward: workspace is null");
  const int64_t chunks = partial_rows(N, C);
  const int64_t rows_per_chunk = (N + chunks - 1) / chunks;
  float* part_w = static_cast<float*>(workspace);
  float* part_b = part_w + chunks * C;
  const bool fused = C <= kFusedMaxC;
  const unsigned col_blocks = static_cast<unsigned>((C + 255) / 256);
  dispatch_nn(type, "layer_norm_backward", [&](auto t) {
    using T = decltype(t);
    const T* pdy = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    if (fused) {
      // (With no rows the blocks still write their zero partial sums.)
      const size_t smem = static_cast<size_t>(2 * kFusedWarps * C) * sizeof(float);
      ln_backward_fused_kernel<T>
          <<<static_cast<unsigned>(chunks), 32 * kFusedWarps, smem, stream>>>(
              pdy, px, static_cast<const T*>(weight), mean, rstd, static_cast<T*>(dx), N, C,
              static_cast<const T*>(dsum), part_w, part_b);
    } else {
      if (N > 0) {
        const unsigned blocks = static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
        ln_backward_dx_kernel<T><<<blocks, 32 * kRowsPerBlock, 0, stream>>>(
            pdy, px, static_cast<const T*>(weight), mean, rstd, static_cast<T*>(dx), N, C,
            static_cast<const T*>(dsum));
      }
      ln_backward_partial_kernel<T>
          <<<dim3(col_blocks, static_cast<unsigned>(chunks)), 256, 0, stream>>>(
              pdy, px, mean, rstd, part_w, part_b, N, C, std::max<int64_t>(rows_per_chunk, 1));
    }
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
