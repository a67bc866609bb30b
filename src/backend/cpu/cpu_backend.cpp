#include "cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "parallel_for.h"
#include "triad/core/half.h"
#include "triad/core/rng.h"

namespace triad::detail {

void unsupported(const char* op, DType dtype) {
  throw NotSupportedError(std::string(op) + ": dtype " + dtype_name(dtype) +
                          " is not supported on device cpu");
}

CpuBackend::CpuBackend() {
  // Parallelism comes from OpenMP (see parallel_gemm); BLAS runs one thread
  // per call so the two never compete for cores.
  openblas_set_num_threads(1);
}

Allocator& CpuBackend::allocator(int device_index) {
  if (device_index != 0)
    throw ValueError("cpu device index must be 0, got " + std::to_string(device_index));
  return cpu_allocator();
}

int64_t load_index(const Tensor& ids, int64_t i) {
  return ids.dtype() == DType::I32 ? static_cast<int64_t>(ids.data<int32_t>()[i])
                                   : ids.data<int64_t>()[i];
}

namespace {

// Visits every row (all dims but the last) of two equally shaped strided
// tensors, calling f(offset_a, offset_b, row_index) in row-major order.
template <class F>
void for_each_row(const Shape& shape, const Shape& sa, const Shape& sb, F&& f) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  if (nd == 0) {
    f(int64_t{0}, int64_t{0}, int64_t{0});
    return;
  }
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < nd; ++d) rows *= shape[d];
  if (rows == 0 || shape[nd - 1] == 0) return;
  std::vector<int64_t> idx(nd, 0);
  int64_t oa = 0, ob = 0;
  for (int64_t r = 0; r < rows; ++r) {
    f(oa, ob, r);
    for (int64_t d = nd - 2; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        oa += sa[d];
        ob += sb[d];
        break;
      }
      oa -= sa[d] * (shape[d] - 1);
      ob -= sb[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

double load_scalar(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::F32:
      return static_cast<const float*>(base)[i];
    case DType::F64:
      return static_cast<const double*>(base)[i];
    case DType::BF16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::F16:
      return f16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::I32:
      return static_cast<const int32_t*>(base)[i];
    case DType::I64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
  }
  return 0;
}

void store_scalar(void* base, DType dt, int64_t i, double v) {
  switch (dt) {
    case DType::F32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      return;
    case DType::F64:
      static_cast<double*>(base)[i] = v;
      return;
    case DType::BF16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16(static_cast<float>(v));
      return;
    case DType::F16:
      static_cast<uint16_t*>(base)[i] = float_to_f16(static_cast<float>(v));
      return;
    case DType::I32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      return;
    case DType::I64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      return;
  }
}

// A strided copy that passes each element through `convert` (the identity
// for a copy within one type; for f32 <-> bf16/f16, the conversions mixed
// precision makes around every half op, without the generic path's double
// and per-element type switch: f32 to a half type rounds once either way).
// Rows whose elements are adjacent on both sides run as plain loops.
template <class S, class D, class Convert>
void convert_rows(const Tensor& src, Tensor& dst, Convert convert) {
  const int64_t nd = src.dim();
  const int64_t cols = nd ? src.shape().back() : 1;
  const int64_t ss = nd ? src.strides().back() : 0;
  const int64_t ds = nd ? dst.strides().back() : 0;
  const S* ps = static_cast<const S*>(src.raw_data());
  D* pd = static_cast<D*>(dst.raw_data());
  for_each_row(src.shape(), src.strides(), dst.strides(), [&](int64_t os, int64_t od, int64_t) {
    const S* in = ps + os;
    D* out = pd + od;
    if (ss == 1 && ds == 1) {
      for (int64_t i = 0; i < cols; ++i) out[i] = convert(in[i]);
    } else {
      for (int64_t i = 0; i < cols; ++i) out[i * ds] = convert(in[i * ss]);
    }
  });
}

// A strided copy between two views of one element type, moved as `Bits`
// (an unsigned integer of the element's size).
template <class Bits>
void copy_rows(const Tensor& src, Tensor& dst) {
  convert_rows<Bits, Bits>(src, dst, [](Bits v) { return v; });
}

// The conversions between f32 and bf16/f16 by their own loops; false for
// any other pair of types.
bool convert_half(const Tensor& src, Tensor& dst) {
  const DType st = src.dtype(), dt = dst.dtype();
  if (st == DType::F32 && dt == DType::BF16) {
    convert_rows<float, uint16_t>(src, dst, [](float v) { return float_to_bf16(v); });
  } else if (st == DType::BF16 && dt == DType::F32) {
    convert_rows<uint16_t, float>(src, dst, [](uint16_t v) { return bf16_to_float(v); });
  } else if (st == DType::F32 && dt == DType::F16) {
    convert_rows<float, uint16_t>(src, dst, [](float v) { return float_to_f16(v); });
  } else if (st == DType::F16 && dt == DType::F32) {
    convert_rows<uint16_t, float>(src, dst, [](uint16_t v) { return f16_to_float(v); });
  } else {
    return false;
  }
  return true;
}

template <class T>
void binary_row(BinaryOp op, const T* a, int64_t sa, const T* b, int64_t sb, T* out, int64_t n) {
  switch (op) {
    case BinaryOp::Add:
      for (int64_t i = 0; i < n; ++i) out[i] = a[i * sa] + b[i * sb];
      break;
    case BinaryOp::Sub:
      for (int64_t i = 0; i < n; ++i) out[i] = a[i * sa] - b[i * sb];
      break;
    case BinaryOp::Mul:
      for (int64_t i = 0; i < n; ++i) out[i] = a[i * sa] * b[i * sb];
      break;
    case BinaryOp::Div:
      for (int64_t i = 0; i < n; ++i) out[i] = a[i * sa] / b[i * sb];
      break;
    case BinaryOp::Eq:
      for (int64_t i = 0; i < n; ++i) out[i] = a[i * sa] == b[i * sb] ? T(1) : T(0);
      break;
  }
}

template <class T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  const int64_t nd = a.dim();
  if (a.is_contiguous() && b.is_contiguous()) {
    const int64_t n = out.numel();
    const int64_t chunk = 1 << 16;
    parallel_for((n + chunk - 1) / chunk, n > chunk, [&](int64_t c) {
      const int64_t s = c * chunk;
      binary_row(op, pa + s, 1, pb + s, 1, po + s, std::min(chunk, n - s));
    });
    return;
  }
  const int64_t cols = nd ? out.shape().back() : 1;
  const int64_t sa = nd ? a.strides().back() : 0;
  const int64_t sb = nd ? b.strides().back() : 0;
  for_each_row(out.shape(), a.strides(), b.strides(), [&](int64_t oa, int64_t ob, int64_t r) {
    binary_row(op, pa + oa, sa, pb + ob, sb, po + r * cols, cols);
  });
}

}  // namespace

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  if (src.shape() != dst.shape()) {
    throw ShapeError("copy: source shape " + shape_str(src.shape()) + " != destination shape " +
                     shape_str(dst.shape()));
  }
  if (!src.device().is_cpu() || !dst.device().is_cpu()) {
    throw NotSupportedError("copy: the cpu backend copies host tensors only (got " +
                            src.device().str() + " -> " + dst.device().str() + ")");
  }
  if (src.numel() == 0) return;
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes());
    return;
  }
  const int64_t nd = src.dim();
  const int64_t cols = nd ? src.shape().back() : 1;
  const int64_t ss = nd ? src.strides().back() : 0;
  const int64_t ds = nd ? dst.strides().back() : 0;
  const void* ps = src.raw_data();
  void* pd = dst.raw_data();
  const DType st = src.dtype(), dt = dst.dtype();
  if (st == dt) {
    // The same type: each element's bits, as the CUDA backend copies them
    // (a round trip through double would round 64-bit integers above 2^53).
    switch (dtype_size(st)) {
      case 2:
        copy_rows<uint16_t>(src, dst);
        return;
      case 4:
        copy_rows<uint32_t>(src, dst);
        return;
      default:
        copy_rows<uint64_t>(src, dst);
        return;
    }
  }
  if (convert_half(src, dst)) return;
  for_each_row(src.shape(), src.strides(), dst.strides(), [&](int64_t os, int64_t od, int64_t) {
    for (int64_t i = 0; i < cols; ++i) {
      store_scalar(pd, dt, od + i * ds, load_scalar(ps, st, os + i * ss));
    }
  });
}

void CpuBackend::fill(Tensor& dst, double value) {
  const int64_t n = dst.numel();
  if (!dst.is_contiguous()) throw ShapeError("fill: destination must be contiguous");
  switch (dst.dtype()) {
    case DType::F32:
      std::fill_n(dst.data<float>(), n, static_cast<float>(value));
      return;
    case DType::F64:
      std::fill_n(dst.data<double>(), n, value);
      return;
    case DType::I32:
      std::fill_n(dst.data<int32_t>(), n, static_cast<int32_t>(value));
      return;
    case DType::I64:
      std::fill_n(dst.data<int64_t>(), n, static_cast<int64_t>(value));
      return;
    case DType::BF16:
      std::fill_n(dst.data<uint16_t>(), n, float_to_bf16(static_cast<float>(value)));
      return;
    case DType::F16:
      std::fill_n(dst.data<uint16_t>(), n, float_to_f16(static_cast<float>(value)));
      return;
  }
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  switch (out.dtype()) {
    case DType::F32:
      binary_typed<float>(op, a, b, out);
      return;
    case DType::F64:
      binary_typed<double>(op, a, b, out);
      return;
    case DType::I32:
      binary_typed<int32_t>(op, a, b, out);
      return;
    case DType::I64:
      binary_typed<int64_t>(op, a, b, out);
      return;
    default:
      unsupported("binary", out.dtype());
  }
}

void CpuBackend::affine(const Tensor& x, double alpha, double beta, Tensor& out) {
  dispatch_float(x.dtype(), "affine", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    const T a = static_cast<T>(alpha), b = static_cast<T>(beta);
    const int64_t n = x.numel();
    parallel_for(n, n > (1 << 16), [&](int64_t i) { po[i] = a * px[i] + b; });
  });
}

namespace {

// Row-major GEMM of one (M, N) output, its rows split across the OpenMP
// threads, each calling single-threaded BLAS: one thread pool for the whole
// backend instead of OpenBLAS's and OpenMP's competing for the cores.
template <class T>
void parallel_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* a,
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const auto A = ta ? CblasTrans : CblasNoTrans;
  const auto B = tb ? CblasTrans : CblasNoTrans;
  auto call = [&](int64_t m0, int64_t m) {
    const T* ap = ta ? a + m0 : a + m0 * lda;
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, A, B, m, N, K, alpha, ap, lda, b, ldb, beta, c + m0 * ldc, ldc);
    } else {
      cblas_dgemm(CblasRowMajor, A, B, m, N, K, alpha, ap, lda, b, ldb, beta, c + m0 * ldc, ldc);
    }
  };
  auto call_cols = [&](int64_t n0, int64_t n) {
    const T* bp = tb ? b + n0 * ldb : b + n0;
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, A, B, M, n, K, alpha, a, lda, bp, ldb, beta, c + n0, ldc);
    } else {
      cblas_dgemm(CblasRowMajor, A, B, M, n, K, alpha, a, lda, bp, ldb, beta, c + n0, ldc);
    }
  };
  const double flops = 2.0 * static_cast<double>(M) * N * K;
  const int threads = omp_get_max_threads();
  if (threads <= 1 || flops < 2e6 || std::min(M, N) < 16 * threads || omp_in_parallel()) {
    call(0, M);
    return;
  }
  // Split the output by columns when it is wide or the reduction is long
  // (each thread then packs only its own slice of B); by rows otherwise.
  // Measured on the GPT layer shapes in benchmarks/gemm_bench.cpp.
  const bool split_cols = N >= M || K > N;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    // Row blocks rounded to 8 so each thread's slice stays vector-aligned.
    const int64_t per = ((M + nt - 1) / nt + 7) / 8 * 8;
    const int64_t m0 = std::min<int64_t>(M, t * per), m1 = std::min<int64_t>(M, m0 + per);
    if (split_cols) {
      const int64_t pn = ((N + nt - 1) / nt + 15) / 16 * 16;
      const int64_t n0 = std::min<int64_t>(N, t * pn), n1 = std::min<int64_t>(N, n0 + pn);
      if (n1 > n0) call_cols(n0, n1 - n0);
    } else if (m1 > m0) {
      call(m0, m1 - m0);
    }
  }
}

}  // namespace

void CpuBackend::gemm(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b,
                      double alpha, double beta) {
  const int64_t batch = c.dim() == 3 ? c.size(0) : 1;
  const int64_t M = c.size(-2), N = c.size(-1);
  const int64_t K = trans_a ? a.size(-2) : a.size(-1);
  const int64_t a_stride = a.dim() == 3 ? M * K : 0;
  const int64_t b_stride = b.dim() == 3 ? K * N : 0;
  // 2-D operands may be row-strided (their leading dimension).
  const int64_t lda = matrix_ld(a, "gemm"), ldb = matrix_ld(b, "gemm"), ldc = matrix_ld(c, "gemm");
  if (M == 0 || N == 0) return;
  dispatch_float(c.dtype(), "gemm", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* pc = c.data<T>();
    const T al = static_cast<T>(alpha), be = static_cast<T>(beta);
    // A shared right operand lets the batch fold into M: one large GEMM.
    if (!trans_a && b_stride == 0 && a_stride != 0) {
      parallel_gemm<T>(false, trans_b, batch * M, N, K, al, pa, lda, pb, ldb, be, pc, ldc);
      return;
    }
    for (int64_t i = 0; i < batch; ++i) {
      parallel_gemm<T>(trans_a, trans_b, M, N, K, al, pa + i * a_stride, lda, pb + i * b_stride,
                       ldb, be, pc + i * M * N, ldc);
    }
  });
}

void CpuBackend::reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner,
                        Tensor& out, Tensor* indices) {
  dispatch_float(x.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    int64_t* pi = indices ? indices->data<int64_t>() : nullptr;
    if (op == ReduceOp::Sum && inner == 1) {
      // Contiguous runs: vectorised double accumulation, split across threads
      // by output when there are several, else across the run itself.
      if (outer >= 8) {
        parallel_for(outer, outer * n > 32768, [&](int64_t o) {
          const T* row = px + o * n;
          double acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int64_t k = 0; k < n; ++k) acc += row[k];
          po[o] = static_cast<T>(acc);
        });
      } else {
        for (int64_t o = 0; o < outer; ++o) {
          const T* row = px + o * n;
          double acc = 0;
          if (worth_a_team(n > 32768)) {
#pragma omp parallel for simd schedule(static) reduction(+ : acc)
            for (int64_t k = 0; k < n; ++k) acc += row[k];
          } else {
#pragma omp simd reduction(+ : acc)
            for (int64_t k = 0; k < n; ++k) acc += row[k];
          }
          po[o] = static_cast<T>(acc);
        }
      }
      return;
    }
    if (op == ReduceOp::Sum) {
      // Walk each (n, inner) slab row by row (contiguous), accumulating in
      // double; the inner dimension is split across threads.
      const int64_t block = 256;
      const int64_t blocks = (inner + block - 1) / block;
      parallel_for(outer * blocks, outer * n * inner > 32768, [&](int64_t ob) {
        const int64_t o = ob / blocks, bj = ob % blocks;
        const int64_t j0 = bj * block, j1 = std::min(inner, j0 + block);
        double acc[256];
        for (int64_t j = j0; j < j1; ++j) acc[j - j0] = 0.0;
        const T* base = px + o * n * inner;
        for (int64_t k = 0; k < n; ++k) {
          const T* row = base + k * inner;
          for (int64_t j = j0; j < j1; ++j) acc[j - j0] += row[j];
        }
        for (int64_t j = j0; j < j1; ++j) po[o * inner + j] = static_cast<T>(acc[j - j0]);
      });
      return;
    }
    parallel_for(outer, outer * inner > 4096, [&](int64_t o) {
      for (int64_t j = 0; j < inner; ++j) {
        const T* base = px + o * n * inner + j;
        T best = -std::numeric_limits<T>::infinity();
        int64_t arg = 0;
        for (int64_t k = 0; k < n; ++k) {
          const T v = base[k * inner];
          if (v > best || std::isnan(v)) {
            best = v;
            arg = k;
            if (std::isnan(v)) break;
          }
        }
        po[o * inner + j] = best;
        if (pi) pi[o * inner + j] = arg;
      }
    });
  });
}

void CpuBackend::dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream,
                         const philox::Counters& counters, const Tensor& keys, const Tensor& calls,
                         Tensor& y) {
  const int64_t* pk = keys.defined() ? keys.data<int64_t>() : nullptr;
  const philox::Counters at =
      calls.defined() ? counters.after_calls(static_cast<uint64_t>(calls.data<int64_t>()[0]))
                      : counters;
  const auto len = static_cast<uint64_t>(at.row_length);
  dispatch_float(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const float threshold = static_cast<float>(p);
    const int64_t n = x.numel();
    parallel_for(n, n > 4096, [&](int64_t i) {
      const auto u = static_cast<uint64_t>(i);
      const uint64_t draw = pk ? at.keyed(static_cast<uint64_t>(pk[u / len]), u % len) : at.at(u);
      py[i] = philox_uniform(seed, stream, draw) >= threshold ? px[i] * scale : T(0);
    });
  });
}

void CpuBackend::adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                       const AdamWStep& hp) {
  dispatch_float(param.dtype(), "adamw", [&](auto tag) {
    using T = decltype(tag);
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* pm = m.data<T>();
    T* pv = v.data<T>();
    // Same sequence of roundings as torch.optim.AdamW (foreach=False).
    const T decay = static_cast<T>(1.0 - hp.lr * hp.weight_decay);
    const T b1 = static_cast<T>(hp.beta1), b2 = static_cast<T>(hp.beta2);
    const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
    const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
    const T step_size = static_cast<T>(hp.lr / bc1);
    const T bc2_sqrt = static_cast<T>(std::sqrt(bc2));
    const T eps = static_cast<T>(hp.eps);
    const T gscale = static_cast<T>(hp.grad_scale);
    const int64_t n = param.numel();
    parallel_for(n, n > (1 << 15), [&](int64_t i) {
      const T gi = gscale * g[i];  // what scaling the gradient first would store
      p[i] *= decay;
      pm[i] += (gi - pm[i]) * (T(1) - b1);
      pv[i] = pv[i] * b2 + (T(1) - b2) * gi * gi;
      const T denom = std::sqrt(pv[i]) / bc2_sqrt + eps;
      p[i] -= step_size * (pm[i] / denom);
    });
  });
}

}  // namespace triad::detail
