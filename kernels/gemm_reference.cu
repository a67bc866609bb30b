// The reference product behind cuda::GemmSettings::verify: one thread per
// output element, 16 x 16 tiles of both operands through shared memory,
// each element summed in f32 in order over k. Then a one-block comparison
// of a product's output against it.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "device_utils.cuh"
#include "gemm_reference.h"

namespace triad::kernels {
namespace {

constexpr int kTileDim = 16;
constexpr int kTileLd = kTileDim + 1;  // padded rows: no bank conflicts
constexpr int kCompareThreads = 1024;

// Element (row, col) of op(mat) in batch b.
template <class T>
__device__ __forceinline__ float op_element(const T* p, const RefMatrix& mat, int64_t b,
                                            int64_t row, int64_t col) {
  const int64_t at = mat.transpose ? col + row * mat.ld : row + col * mat.ld;
  return static_cast<float>(load(p, b * mat.batch_stride + at));
}

// GELU (tanh form, as cuBLASLt's epilogue and Triad's kernels) and its
// derivative.
__device__ __forceinline__ float gelu(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  const float t = tanhf(k0 * (x + k1 * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k0 * (1.0f + 3.0f * k1 * x * x);
}

template <class T, class O>
__global__ void __launch_bounds__(kTileDim* kTileDim)
    gemm_reference_kernel(RefGemm g, float* ref, float* pre) {
  __shared__ float as[kTileDim * kTileLd];
  __shared__ float bs[kTileDim * kTileLd];
  const int tx = threadIdx.x % kTileDim, ty = threadIdx.x / kTileDim;
  const int64_t b = blockIdx.z;
  const int64_t i = int64_t(blockIdx.x) * kTileDim + tx;
  const int64_t j = int64_t(blockIdx.y) * kTileDim + ty;
  const T* first = static_cast<const T*>(g.first.data);
  const T* second = static_cast<const T*>(g.second.data);
  float acc = 0.0f;
  for (int64_t p0 = 0; p0 < g.k; p0 += kTileDim) {
    // as[q][x] = op(first)(row x of the tile, p0 + q); bs[y][q] =
    // op(second)(p0 + q, column y of the tile); zero past the edges.
    const int64_t pa = p0 + ty, pb = p0 + tx;
    as[ty * kTileLd + tx] = i < g.m && pa < g.k ? op_element(first, g.first, b, i, pa) : 0.0f;
    bs[ty * kTileLd + tx] = j < g.n && pb < g.k ? op_element(second, g.second, b, pb, j) : 0.0f;
    __syncthreads();
    for (int q = 0; q < kTileDim; ++q) acc += as[q * kTileLd + tx] * bs[ty * kTileLd + q];
    __syncthreads();
  }
  if (i >= g.m || j >= g.n) return;
  const int64_t c_at = b * g.c.batch_stride + i + j * g.c.ld;
  float v = static_cast<float>(g.alpha) * acc;
  if (g.beta != 0) v += static_cast<float>(g.beta) * load(static_cast<const O*>(g.c.data), c_at);
  const int64_t at = (b * g.n + j) * g.m + i;
  switch (g.epilogue) {
    case RefGemm::Epilogue::Bias:
      v += load(static_cast<const O*>(g.bias), i);
      break;
    case RefGemm::Epilogue::BiasGelu:
      v += load(static_cast<const O*>(g.bias), i);
      pre[at] = v;
      v = gelu(v);
      break;
    case RefGemm::Epilogue::Gelu:
      pre[at] = v;
      v = gelu(v);
      break;
    case RefGemm::Epilogue::DGelu:
      v *= gelu_grad(load(static_cast<const O*>(g.aux), c_at));
      break;
    default:
      break;
  }
  ref[at] = v;
}

__device__ __forceinline__ bool finite(double v) {
  return fabs(v) <= DBL_MAX;  // false for NaN and infinities
}

// The largest finite value of an output type: a product past it overflows
// in that type, as it should (fp16 overflows that the loss scaler sees).
template <class O>
__device__ __forceinline__ double largest();
template <>
__device__ __forceinline__ double largest<float>() {
  return FLT_MAX;
}
template <>
__device__ __forceinline__ double largest<__nv_bfloat16>() {
  return 3.3895313892515355e38;
}
template <>
__device__ __forceinline__ double largest<__half>() {
  return 65504.0;
}

template <class O>
__global__ void __launch_bounds__(kCompareThreads)
    gemm_compare_kernel(const O* out, int64_t ld, int64_t batch_stride, int64_t m, int64_t n,
                        int64_t batch, const float* ref, GemmDiff* diff) {
  __shared__ double scratch[32];
  double error_sq = 0, reference_sq = 0, max_error = 0, max_reference = 0, nonfinite = 0;
  // A warp per column (of every batch), its lanes down the column.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t col = warp; col < n * batch; col += warps) {
    const int64_t b = col / n, j = col - b * n;
    const O* column = out + b * batch_stride + j * ld;
    const float* want = ref + col * m;
    for (int64_t i = lane; i < m; i += 32) {
      const double x = want[i];
      if (!finite(x)) continue;
      const double o = static_cast<double>(load(column, i));
      reference_sq += x * x;
      max_reference = fmax(max_reference, fabs(x));
      // A value past the output type's range is right as an infinity of
      // its sign or as the largest finite value (a saturating conversion).
      if (fabs(x) > largest<O>() &&
          (o == copysign(double(INFINITY), x) || o == copysign(largest<O>(), x))) {
        continue;
      }
      if (!finite(o)) {
        nonfinite += 1;
        continue;
      }
      error_sq += (o - x) * (o - x);
      max_error = fmax(max_error, fabs(o - x));
    }
  }
  error_sq = block_sum(error_sq, scratch);
  reference_sq = block_sum(reference_sq, scratch);
  nonfinite = block_sum(nonfinite, scratch);
  max_error = block_max(max_error, scratch, 0.0);
  max_reference = block_max(max_reference, scratch, 0.0);
  if (threadIdx.x == 0) {
    diff->error_sq = error_sq;
    diff->reference_sq = reference_sq;
    diff->max_error = max_error;
    diff->max_reference = max_reference;
    diff->nonfinite = nonfinite;
  }
}

}  // namespace

Status check_gemm_reference(const RefGemm& g) {
  if (!is_nn_type(g.inputs)) {
    return Status::fail(std::string("inputs of ") + scalar_name(g.inputs) +
                        " are not supported (f32, bf16 or f16)");
  }
  const bool widened = is_half(g.inputs) && g.output == ScalarType::F32;
  if (g.output != g.inputs && !widened) {
    return Status::fail(std::string(scalar_name(g.inputs)) + " inputs into " +
                        scalar_name(g.output) + " are not supported");
  }
  if (widened && g.epilogue != RefGemm::Epilogue::None)
    return Status::fail("an epilogue needs the output in the inputs' type");
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 1 || g.batch > 65535)
    return Status::fail("sizes m " + std::to_string(g.m) + ", n " + std::to_string(g.n) + ", k " +
                        std::to_string(g.k) + ", batch " + std::to_string(g.batch) +
                        " are not valid");
  if (g.k > 0 && (!g.first.data || !g.second.data)) return Status::fail("a null operand");
  if (g.beta != 0 && !g.c.data) return Status::fail("beta is not zero but C is null");
  if ((g.epilogue == RefGemm::Epilogue::Bias || g.epilogue == RefGemm::Epilogue::BiasGelu) &&
      !g.bias)
    return Status::fail("the bias epilogue has no bias");
  if (g.epilogue == RefGemm::Epilogue::DGelu && !g.aux)
    return Status::fail("the GELU-derivative epilogue has no GELU input");
  const int64_t tiles = (std::max<int64_t>(g.n, 1) + kTileDim - 1) / kTileDim;
  if (tiles > 65535) return Status::fail("n " + std::to_string(g.n) + " is too large");
  return Status::fine();
}

void gemm_reference(const RefGemm& g, float* ref, float* pre, cudaStream_t stream) {
  require(check_gemm_reference(g), "gemm_reference");
  if (g.m == 0 || g.n == 0) return;
  if ((g.epilogue == RefGemm::Epilogue::BiasGelu || g.epilogue == RefGemm::Epilogue::Gelu) && !pre)
    require(Status::fail("a GELU epilogue needs the pre-activation buffer"), "gemm_reference");
  const dim3 grid(static_cast<unsigned>((g.m + kTileDim - 1) / kTileDim),
                  static_cast<unsigned>((g.n + kTileDim - 1) / kTileDim),
                  static_cast<unsigned>(g.batch));
  dispatch_nn(g.inputs, "gemm_reference", [&](auto in) {
    using T = decltype(in);
    if (g.output == g.inputs) {
      gemm_reference_kernel<T, T><<<grid, kTileDim * kTileDim, 0, stream>>>(g, ref, pre);
    } else {
      gemm_reference_kernel<T, float><<<grid, kTileDim * kTileDim, 0, stream>>>(g, ref, pre);
    }
  });
  check_launch("gemm_reference");
}

void gemm_compare(ScalarType type, const void* out, int64_t ld, int64_t batch_stride, int64_t m,
                  int64_t n, int64_t batch, const float* ref, GemmDiff* diff, cudaStream_t stream) {
  dispatch_nn(type, "gemm_compare", [&](auto tag) {
    using O = decltype(tag);
    gemm_compare_kernel<O><<<1, kCompareThreads, 0, stream>>>(static_cast<const O*>(out), ld,
                                                              batch_stride, m, n, batch, ref, diff);
  });
  check_launch("gemm_compare");
}

}  // namespace triad::kernels
