// Elementwise kernels: grid-stride loops over contiguous or strided data,
// computing in f32 for bf16/f16 (f64 and integers in their own type).
#include <cmath>
#include <limits>
#include <type_traits>

#include "device_utils.cuh"
#include "elementwise.h"
#include "triad/core/philox.h"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;

// The type a conversion goes through: double when either side could lose
// digits in f32 (f64, i32, i64), else f32.
template <class S, class D>
using wide_t = std::conditional_t<(sizeof(S) >= 4 && !std::is_same_v<S, float>) ||
                                      (sizeof(D) >= 4 && !std::is_same_v<D, float>),
                                  double, float>;

// One element from S to D: bit copy for equal types (so 64-bit integers
// stay exact), else through the wider of f32 and f64 that the pair needs.
template <class S, class D>
__device__ __forceinline__ void convert(const S* src, int64_t si, D* dst, int64_t di) {
  if constexpr (std::is_same_v<S, D>) {
    dst[di] = src[si];
  } else {
    store(dst, di, static_cast<wide_t<S, D>>(load(src, si)));
  }
}

template <class S, class D>
__global__ void copy_kernel(const S* src, StridedView sv, D* dst, StridedView dv, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    convert(src, view_offset(sv, i), dst, view_offset(dv, i));
  }
}

template <class S, class D>
__global__ void convert_contiguous_kernel(const S* src, D* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    convert(src, i, dst, i);
  }
}

template <class S>
__global__ void accumulate_kernel(const S* src, float* acc, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    acc[i] += static_cast<float>(load(src, i));
  }
}

template <class T>
__global__ void fill_kernel(T* dst, int64_t n, compute_t<T> value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    store(dst, i, value);
  }
}

template <class T>
__global__ void binary_kernel(BinaryKind op, const T* a, StridedView av, const T* b, StridedView bv,
                              T* out, int64_t n) {
  using C = compute_t<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const C x = load(a, view_offset(av, i)), y = load(b, view_offset(bv, i));
    C r;
    switch (op) {
      case BinaryKind::Add:
        r = x + y;
        break;
      case BinaryKind::Sub:
        r = x - y;
        break;
      case BinaryKind::Mul:
        r = x * y;
        break;
      case BinaryKind::Div:
        r = x / y;
        break;
      default:
        r = x == y ? C(1) : C(0);
        break;
    }
    store(out, i, r);
  }
}

template <class T>
__device__ __forceinline__ compute_t<T> apply(BinaryKind op, compute_t<T> x, compute_t<T> y) {
  using C = compute_t<T>;
  switch (op) {
    case BinaryKind::Add:
      return x + y;
    case BinaryKind::Sub:
      return x - y;
    case BinaryKind::Mul:
      return x * y;
    case BinaryKind::Div:
      return x / y;
    default:
      return x == y ? C(1) : C(0);
  }
}

// a contiguous; b contiguous (period n) or one row repeated (period = row).
template <class T>
__global__ void binary_periodic_kernel(BinaryKind op, const T* a, const T* b, int64_t period,
                                       T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    store(out, i, apply<T>(op, load(a, i), load(b, i % period)));
  }
}

template <class T>
__global__ void affine_kernel(const T* x, T* out, int64_t n, compute_t<T> alpha,
                              compute_t<T> beta) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    store(out, i, alpha * load(x, i) + beta);
  }
}

__device__ __forceinline__ float exp_of(float v) {
  return __expf(v);
}
__device__ __forceinline__ double exp_of(double v) {
  return exp(v);
}

template <class T>
__global__ void gelu_forward_kernel(const T* x, T* y, int64_t n) {
  using C = compute_t<T>;
  const C k0 = C(0.7978845608028654), k1 = C(0.044715);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const C v = load(x, i);
    const C u = k0 * (v + k1 * v * v * v);
    store(y, i, v / (C(1) + exp_of(C(-2) * u)));
  }
}

template <class T>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, int64_t n) {
  using C = compute_t<T>;
  const C k0 = C(0.7978845608028654), k1 = C(0.044715);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const C v = load(x, i);
    const C u = k0 * (v + k1 * v * v * v);
    const C s = C(1) / (C(1) + exp_of(C(-2) * u));
    const C du = k0 * (C(1) + C(3) * k1 * v * v);
    store(dx, i, load(dy, i) * (s + C(2) * v * s * (C(1) - s) * du));
  }
}

template <class T>
__global__ void dropout_kernel(const T* x, T* y, int64_t n, float threshold, compute_t<T> scale,
                               uint64_t seed, uint64_t rng_stream, uint64_t offset) {
  using C = compute_t<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const bool keep =
        philox::uniform(seed, rng_stream, offset + static_cast<uint64_t>(i)) >= threshold;
    store(y, i, keep ? load(x, i) * scale : C(0));
  }
}

// One block per (outer, inner) output when inner == 1 (a long contiguous
// row); otherwise one thread per output walking n with stride inner
// (neighbouring threads read neighbouring addresses).
template <class T>
__global__ void reduce_rows_kernel(ReduceKind op, const T* x, int64_t n, T* out, int64_t* indices) {
  using C = compute_t<T>;
  using Acc = std::conditional_t<std::is_same_v<C, float>, double, C>;
  __shared__ Acc scratch[32];
  __shared__ int64_t scratch_idx[32];
  const T* row = x + blockIdx.x * n;
  if (op == ReduceKind::Sum) {
    Acc s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += static_cast<Acc>(load(row, j));
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) store(out, blockIdx.x, static_cast<C>(s));
    return;
  }
  // Max with the first index among equals (matches the CPU's scan order).
  C best = std::numeric_limits<C>::lowest();
  int64_t best_j = 0;
  bool any = false;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const C v = load(row, j);
    if (!any || v > best) best = v, best_j = j, any = true;
  }
  if (!any) best_j = n;  // sentinel: this thread saw nothing
  for (int o = 16; o > 0; o >>= 1) {
    const C ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t oj = __shfl_xor_sync(0xffffffffu, best_j, o);
    if (oj < n && (best_j >= n || ov > best || (ov == best && oj < best_j))) best = ov, best_j = oj;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = static_cast<Acc>(best), scratch_idx[warp] = best_j;
  __syncthreads();
  if (threadIdx.x == 0) {
    Acc b = scratch[0];
    int64_t bj = scratch_idx[0];
    for (int w = 1; w < warps; ++w) {
      if (scratch_idx[w] >= n) continue;
      if (bj >= n || scratch[w] > b || (scratch[w] == b && scratch_idx[w] < bj))
        b = scratch[w], bj = scratch_idx[w];
    }
    store(out, blockIdx.x, static_cast<C>(b));
    if (indices) indices[blockIdx.x] = bj;
  }
}

template <class T>
__global__ void reduce_strided_kernel(ReduceKind op, const T* x, int64_t outer, int64_t n,
                                      int64_t inner, T* out, int64_t* indices) {
  using C = compute_t<T>;
  using Acc = std::conditional_t<std::is_same_v<C, float>, double, C>;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < outer * inner;
       o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t a = o / inner, c = o % inner;
    const T* p = x + a * n * inner + c;
    if (op == ReduceKind::Sum) {
      Acc s = 0;
      for (int64_t j = 0; j < n; ++j) s += static_cast<Acc>(load(p, j * inner));
      store(out, o, static_cast<C>(s));
    } else {
      C best = load(p, 0);
      int64_t best_j = 0;
      for (int64_t j = 1; j < n; ++j) {
        const C v = load(p, j * inner);
        if (v > best) best = v, best_j = j;
      }
      store(out, o, best);
      if (indices) indices[o] = best_j;
    }
  }
}

// Column sums in two deterministic stages when n is long and outputs are
// few (bias gradients: (1, N, C)): stage one sums row chunk k of every
// column into part[(a * chunks + k) * inner + c], stage two adds the chunks
// in order.
template <class T>
__global__ void reduce_columns_partial_kernel(const T* x, int64_t n, int64_t inner,
                                              int64_t rows_per_chunk, int64_t chunks,
                                              double* part) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= inner) return;
  const int64_t a = blockIdx.z, k = blockIdx.y;
  const int64_t r0 = k * rows_per_chunk, r1 = min(n, r0 + rows_per_chunk);
  const T* p = x + a * n * inner + c;
  double s = 0;
  for (int64_t j = r0; j < r1; ++j) s += static_cast<double>(load(p, j * inner));
  part[(a * chunks + k) * inner + c] = s;
}

template <class T>
__global__ void reduce_columns_finish_kernel(const double* part, int64_t outer, int64_t inner,
                                             int64_t chunks, T* out) {
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < outer * inner;
       o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t a = o / inner, c = o % inner;
    double s = 0;
    for (int64_t k = 0; k < chunks; ++k) s += part[(a * chunks + k) * inner + c];
    store(out, o, static_cast<compute_t<T>>(s));
  }
}

// The column sum added into an f32 accumulator: one pass over the rows, or
// the second stage over the first's chunk sums (x null, part set).
template <class T>
__global__ void column_sum_into_kernel(const T* x, const double* part, int64_t n, int64_t inner,
                                       int64_t chunks, float* acc, float beta) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= inner) return;
  double s = 0;
  if (part) {
    for (int64_t k = 0; k < chunks; ++k) s += part[k * inner + c];
  } else {
    for (int64_t j = 0; j < n; ++j) s += static_cast<double>(load(x, j * inner + c));
  }
  const float sum = static_cast<float>(s);
  acc[c] = beta != 0.0f ? beta * acc[c] + sum : sum;
}

// Chunks of the two-stage column sum (0: the one-pass kernel is used).
int64_t column_chunks(ReduceKind op, ScalarType type, int64_t outer, int64_t n, int64_t inner) {
  const bool floating = type == ScalarType::F32 || type == ScalarType::F64 || is_half(type);
  if (op != ReduceKind::Sum || !floating || inner == 1 || n < 256 || outer > 65535) return 0;
  return std::min<int64_t>(64, n / 128);
}

}  // namespace

size_t reduce_workspace(ReduceKind op, ScalarType type, int64_t outer, int64_t n, int64_t inner) {
  const int64_t chunks = column_chunks(op, type, outer, n, inner);
  return static_cast<size_t>(chunks * outer * inner) * sizeof(double);
}

size_t column_sum_workspace(int64_t n, int64_t inner) {
  return reduce_workspace(ReduceKind::Sum, ScalarType::F32, 1, n, inner);
}

void column_sum_into(const void* x, ScalarType type, int64_t n, int64_t inner, float* acc,
                     double beta, void* workspace, cudaStream_t stream) {
  if (n < 0 || inner < 0) {
    throw std::invalid_argument("column_sum_into: negative extent (n " + std::to_string(n) +
                                ", inner " + std::to_string(inner) + ")");
  }
  if (inner == 0) return;
  const int64_t chunks = column_chunks(ReduceKind::Sum, ScalarType::F32, 1, n, inner);
  if (chunks > 0 && !workspace) {
    throw std::invalid_argument("column_sum_into: a column sum of " + std::to_string(n) +
                                " rows needs column_sum_workspace() bytes of workspace");
  }
  const unsigned blocks = static_cast<unsigned>((inner + kThreads - 1) / kThreads);
  dispatch_nn(type, "column_sum_into", [&](auto t) {
    using T = decltype(t);
    if (chunks > 0) {
      double* part = static_cast<double*>(workspace);
      const int64_t rows_per_chunk = (n + chunks - 1) / chunks;
      const dim3 grid(blocks, static_cast<unsigned>(chunks), 1);
      reduce_columns_partial_kernel<T><<<grid, kThreads, 0, stream>>>(
          static_cast<const T*>(x), n, inner, rows_per_chunk, chunks, part);
      column_sum_into_kernel<T><<<blocks, kThreads, 0, stream>>>(nullptr, part, n, inner, chunks,
                                                                 acc, static_cast<float>(beta));
    } else {
      column_sum_into_kernel<T><<<blocks, kThreads, 0, stream>>>(
          static_cast<const T*>(x), nullptr, n, inner, 0, acc, static_cast<float>(beta));
    }
  });
  check_launch("column_sum_into");
}

void copy(const void* src, ScalarType src_type, StridedView src_view, void* dst,
          ScalarType dst_type, StridedView dst_view, cudaStream_t stream) {
  if (src_view.ndim != dst_view.ndim) {
    throw std::invalid_argument("copy: source has " + std::to_string(src_view.ndim) +
                                " dimensions, destination " + std::to_string(dst_view.ndim));
  }
  int64_t n = 1;
  for (int d = 0; d < src_view.ndim; ++d) {
    if (src_view.shape[d] != dst_view.shape[d]) {
      throw std::invalid_argument("copy: shapes differ in dimension " + std::to_string(d));
    }
    n *= src_view.shape[d];
  }
  if (n == 0) return;
  coalesce(src_view, dst_view);
  const bool contiguous = is_contiguous(src_view) && is_contiguous(dst_view);
  if (contiguous && src_type == dst_type) {
    check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * scalar_size(src_type),
                               cudaMemcpyDeviceToDevice, stream),
               "copy: cudaMemcpyAsync");
    return;
  }
  dispatch_all(src_type, "copy", [&](auto s) {
    using S = decltype(s);
    dispatch_all(dst_type, "copy", [&](auto d) {
      using D = decltype(d);
      if (contiguous) {
        convert_contiguous_kernel<S, D><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
            static_cast<const S*>(src), static_cast<D*>(dst), n);
      } else {
        copy_kernel<S, D><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
            static_cast<const S*>(src), src_view, static_cast<D*>(dst), dst_view, n);
      }
    });
  });
  check_launch("copy");
}

void fill(void* dst, ScalarType type, int64_t n, double value, cudaStream_t stream) {
  if (n < 0) throw std::invalid_argument("fill: negative element count " + std::to_string(n));
  if (n == 0) return;
  dispatch_all(type, "fill", [&](auto t) {
    using T = decltype(t);
    fill_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(dst), n, static_cast<compute_t<T>>(value));
  });
  check_launch("fill");
}

void binary(BinaryKind op, const void* a, StridedView a_view, const void* b, StridedView b_view,
            void* out, ScalarType type, cudaStream_t stream) {
  if (a_view.ndim != b_view.ndim) {
    throw std::invalid_argument("binary: operand views differ in rank");
  }
  int64_t n = 1;
  for (int d = 0; d < a_view.ndim; ++d) n *= a_view.shape[d];
  if (n == 0) return;
  // Merged dimensions index faster; the two common layouts (both operands
  // contiguous, or b one row repeated: a bias) need no stride arithmetic.
  coalesce(a_view, b_view);
  const bool a_flat = is_contiguous(a_view);
  int64_t b_period = 0;  // b[i % period] covers b
  if (a_flat && is_contiguous(b_view)) {
    b_period = n;
  } else if (a_flat && b_view.ndim == 2 && b_view.stride[0] == 0 && b_view.stride[1] == 1) {
    b_period = b_view.shape[1];
  }
  dispatch_all(type, "binary", [&](auto t) {
    using T = decltype(t);
    if (b_period > 0) {
      binary_periodic_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          op, static_cast<const T*>(a), static_cast<const T*>(b), b_period, static_cast<T*>(out),
          n);
    } else {
      binary_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          op, static_cast<const T*>(a), a_view, static_cast<const T*>(b), b_view,
          static_cast<T*>(out), n);
    }
  });
  check_launch("binary");
}

void accumulate(const void* src, ScalarType src_type, float* acc, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_nn(src_type, "accumulate", [&](auto s) {
    using S = decltype(s);
    accumulate_kernel<S>
        <<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<const S*>(src), acc, n);
  });
  check_launch("accumulate");
}

void affine(const void* x, void* out, ScalarType type, int64_t n, double alpha, double beta,
            cudaStream_t stream) {
  if (n == 0) return;
  dispatch_all(type, "affine", [&](auto t) {
    using T = decltype(t);
    using C = compute_t<T>;
    affine_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(out), n, static_cast<C>(alpha),
        static_cast<C>(beta));
  });
  check_launch("affine");
}

void gelu_forward(const void* x, void* y, ScalarType type, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (type != ScalarType::F64) {
    dispatch_nn(type, "gelu_forward", [&](auto t) {
      using T = decltype(t);
      gelu_forward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<T*>(y), n);
    });
  } else {
    gelu_forward_kernel<double><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const double*>(x), static_cast<double*>(y), n);
  }
  check_launch("gelu_forward");
}

void gelu_backward(const void* x, const void* dy, void* dx, ScalarType type, int64_t n,
                   cudaStream_t stream) {
  if (n == 0) return;
  if (type != ScalarType::F64) {
    dispatch_nn(type, "gelu_backward", [&](auto t) {
      using T = decltype(t);
      gelu_backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n);
    });
  } else {
    gelu_backward_kernel<double><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const double*>(x), static_cast<const double*>(dy), static_cast<double*>(dx), n);
  }
  check_launch("gelu_backward");
}

Status check_dropout(double p) {
  if (!(p >= 0.0 && p < 1.0)) {
    return Status::fail("probability " + std::to_string(p) + " must be in [0, 1)");
  }
  return Status::fine();
}

void dropout(const void* x, void* y, ScalarType type, int64_t n, double p, uint64_t seed,
             uint64_t rng_stream, uint64_t offset, cudaStream_t stream) {
  require(check_dropout(p), "dropout");
  if (n == 0) return;
  auto launch = [&](auto t) {
    using T = decltype(t);
    using C = compute_t<T>;
    dropout_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), n, static_cast<float>(p),
        static_cast<C>(1.0 / (1.0 - p)), seed, rng_stream, offset);
  };
  if (type == ScalarType::F64) {
    launch(double{});
  } else {
    dispatch_nn(type, "dropout", launch);
  }
  check_launch("dropout");
}

Status check_reduce(ReduceKind op, int64_t outer, int64_t n, int64_t inner,
                    const int64_t* indices) {
  if (outer < 0 || n < 0 || inner < 0) {
    return Status::fail("negative extent (outer " + std::to_string(outer) + ", n " +
                        std::to_string(n) + ", inner " + std::to_string(inner) + ")");
  }
  if (op == ReduceKind::Max && n == 0 && outer * inner > 0) {
    return Status::fail("max over an empty dimension has no value");
  }
  (void)indices;
  return Status::fine();
}

void reduce(ReduceKind op, const void* x, ScalarType type, int64_t outer, int64_t n, int64_t inner,
            void* out, int64_t* indices, void* workspace, cudaStream_t stream) {
  require(check_reduce(op, outer, n, inner, indices), "reduce");
  if (outer * inner == 0) return;
  const int64_t chunks = column_chunks(op, type, outer, n, inner);
  if (chunks > 0 && !workspace) {
    throw std::invalid_argument("reduce: a column sum of " + std::to_string(n) +
                                " rows needs reduce_workspace() bytes of workspace");
  }
  dispatch_all(type, "reduce", [&](auto t) {
    using T = decltype(t);
    if (chunks > 0) {
      double* part = static_cast<double*>(workspace);
      const int64_t rows_per_chunk = (n + chunks - 1) / chunks;
      const dim3 grid(static_cast<unsigned>((inner + kThreads - 1) / kThreads),
                      static_cast<unsigned>(chunks), static_cast<unsigned>(outer));
      reduce_columns_partial_kernel<T><<<grid, kThreads, 0, stream>>>(
          static_cast<const T*>(x), n, inner, rows_per_chunk, chunks, part);
      reduce_columns_finish_kernel<T><<<grid_for(outer * inner, kThreads), kThreads, 0, stream>>>(
          part, outer, inner, chunks, static_cast<T*>(out));
    } else if (inner == 1 && outer <= 2147483647LL) {
      reduce_rows_kernel<T><<<static_cast<unsigned>(outer), kThreads, 0, stream>>>(
          op, static_cast<const T*>(x), n, static_cast<T*>(out), indices);
    } else {
      reduce_strided_kernel<T><<<grid_for(outer * inner, kThreads), kThreads, 0, stream>>>(
          op, static_cast<const T*>(x), outer, n, inner, static_cast<T*>(out), indices);
    }
  });
  check_launch("reduce");
}

}  // namespace triad::kernels
