// Neural-network kernels of the CPU reference backend: GELU, LayerNorm,
// softmax, causal attention, embedding, cross entropy.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/embedding_order.h"
#include "cpu_backend.h"
#include "parallel_for.h"
#include "vec_math.h"

namespace triad::detail {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kSqrtHalf = 0.7071067811865476;    // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1 / sqrt(2 pi)

template <class T>
void gemm_rm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* a, int64_t lda,
             const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const auto A = ta ? CblasTrans : CblasNoTrans;
  const auto B = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, A, B, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, A, B, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

// Row kernels shared by cross entropy and its vocab-parallel variant.
template <class T>
T row_max(const T* row, int64_t n) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
  return mx;
}

template <class T>
double row_sum_exp(const T* row, int64_t n, T shift) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += exp_fast(row[j] - shift);
  return s;
}

// out[j] = exp(row[j] - shift) * scale for j < n, 0 for n <= j < width.
template <class T>
void row_scaled_exp(const T* row, int64_t n, int64_t width, T shift, T scale, T* out) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = exp_fast(row[j] - shift) * scale;
  for (int64_t j = n; j < width; ++j) out[j] = T(0);
}

// The soft cap's derivative at a capped value z: 1 - (z / cap)^2; 1 without
// a cap (cap 0).
template <class T>
T cap_slope(T z, T cap) {
  if (!(cap > T(0))) return T(1);
  const T r = z / cap;
  return T(1) - r * r;
}

// A cross entropy's gradient row over soft-capped logits z (cap > 0):
// row_scaled_exp's, times each element's cap_slope (out may be row).
template <class T>
void row_scaled_exp_capped(const T* row, int64_t n, int64_t width, T shift, T scale, T cap,
                           T* out) {
  if (!(cap > T(0))) return row_scaled_exp(row, n, width, shift, scale, out);
  for (int64_t j = 0; j < n; ++j) {
    const T z = row[j];
    out[j] = exp_fast(z - shift) * scale * cap_slope(z, cap);
  }
  for (int64_t j = n; j < width; ++j) out[j] = T(0);
}

}  // namespace

// GELU(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), written
// as x * sigmoid(2u) so that the loop needs one exp (vectorised by libmvec)
// instead of a scalar tanh call.
// The exact form: 0.5 x (1 + erf(x / sqrt 2)).
void CpuBackend::gelu_forward(const Tensor& x, Tensor& y, GeluForm form) {
  dispatch_float(x.dtype(), "gelu", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t n = x.numel();
    if (form == GeluForm::Erf) {
      const T r2 = static_cast<T>(kSqrtHalf);
      parallel_for_simd(n, n > 4096,
                        [&](int64_t i) { py[i] = T(0.5) * px[i] * (T(1) + erf_fast(px[i] * r2)); });
      return;
    }
    const T k0 = static_cast<T>(kSqrt2OverPi), k1 = T(0.044715);
    parallel_for_simd(n, n > 4096, [&](int64_t i) {
      const T v = px[i];
      const T u = k0 * (v + k1 * v * v * v);
      py[i] = v / (T(1) + exp_fast(T(-2) * u));
    });
  });
}

// The exact form's derivative: Phi(x) + x phi(x), phi the normal density.
void CpuBackend::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, GeluForm form) {
  dispatch_float(x.dtype(), "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const int64_t n = x.numel();
    if (form == GeluForm::Erf) {
      const T r2 = static_cast<T>(kSqrtHalf), density = static_cast<T>(kInvSqrt2Pi);
      parallel_for_simd(n, n > 4096, [&](int64_t i) {
        const T v = px[i];
        const T cdf = T(0.5) * (T(1) + erf_fast(v * r2));
        pdx[i] = pdy[i] * (cdf + v * density * exp_fast(T(-0.5) * v * v));
      });
      return;
    }
    const T k0 = static_cast<T>(kSqrt2OverPi), k1 = T(0.044715);
    // With s = sigmoid(2u): tanh(u) = 2s - 1 and 1 - tanh(u)^2 = 4 s (1 - s).
    parallel_for_simd(n, n > 4096, [&](int64_t i) {
      const T v = px[i];
      const T u = k0 * (v + k1 * v * v * v);
      const T s = T(1) / (T(1) + exp_fast(T(-2) * u));
      const T du = k0 * (T(1) + T(3) * k1 * v * v);
      pdx[i] = pdy[i] * (s + T(2) * v * s * (T(1) - s) * du);
    });
  });
}

void CpuBackend::soft_cap(const Tensor& x, double cap, Tensor& y) {
  dispatch_float(x.dtype(), "soft_cap", [&](auto tag) {
    using T = decltype(tag);
    // Contiguous, or (the head's padded logits) one row stride for both.
    const int64_t ld = same_row_stride(x, y, "soft_cap");
    const int64_t cols = x.dim() ? x.size(-1) : 1, rows = cols ? x.numel() / cols : 0;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const T c = static_cast<T>(cap), inv = static_cast<T>(1.0 / cap);
    parallel_for(rows, rows * cols > 4096, [&](int64_t r) {
      for (int64_t j = 0; j < cols; ++j) py[r * ld + j] = c * std::tanh(px[r * ld + j] * inv);
    });
  });
}

void CpuBackend::soft_cap_backward(const Tensor& y, const Tensor& dy, double cap, Tensor& dx) {
  dispatch_float(y.dtype(), "soft_cap_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* py = y.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const int64_t n = y.numel();
    const T c = static_cast<T>(cap);
    parallel_for_simd(n, n > 4096, [&](int64_t i) { pdx[i] = pdy[i] * cap_slope(py[i], c); });
  });
}

void CpuBackend::clamp(const Tensor& x, double lo, double hi, Tensor& y) {
  dispatch_float(x.dtype(), "clamp", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t n = x.numel();
    const T l = static_cast<T>(lo), h = static_cast<T>(hi);
    parallel_for_simd(n, n > 4096,
                      [&](int64_t i) { py[i] = px[i] < l ? l : (px[i] > h ? h : px[i]); });
  });
}

void CpuBackend::clamp_backward(const Tensor& x, const Tensor& dy, double lo, double hi,
                                Tensor& dx) {
  dispatch_float(x.dtype(), "clamp_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const int64_t n = x.numel();
    const T l = static_cast<T>(lo), h = static_cast<T>(hi);
    parallel_for_simd(n, n > 4096,
                      [&](int64_t i) { pdx[i] = px[i] >= l && px[i] <= h ? pdy[i] : T(0); });
  });
}

// A gated linear unit: y = act(a) * b with a, b the two halves of each row
// of x. Both gates are a * s for a sigmoid s: silu's s = sigmoid(a), GELU's
// (tanh approximation) s = sigmoid(2u) with u = k0 (a + k1 a^3).
void CpuBackend::glu_forward(const Tensor& x, Tensor& y, GluGate gate) {
  dispatch_float(x.dtype(), "glu", [&](auto tag) {
    using T = decltype(tag);
    const int64_t F = y.size(-1), rows = F ? y.numel() / F : 0;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const bool gelu = gate == GluGate::GeluTanh;
    const T k0 = static_cast<T>(kSqrt2OverPi), k1 = T(0.044715);
    parallel_for(rows, rows * F > 4096, [&](int64_t r) {
      const T* a = px + r * 2 * F;
      const T* b = a + F;
      T* out = py + r * F;
      if (gelu) {
#pragma omp simd
        for (int64_t j = 0; j < F; ++j) {
          const T u = k0 * (a[j] + k1 * a[j] * a[j] * a[j]);
          out[j] = a[j] / (T(1) + exp_fast(T(-2) * u)) * b[j];
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < F; ++j) out[j] = a[j] / (T(1) + exp_fast(-a[j])) * b[j];
      }
    });
  });
}

// silu'(a) = s (1 + a (1 - s)) with s = sigmoid(a); GELU's, as in
// gelu_backward, s + 2 a s (1 - s) du with s = sigmoid(2u).
void CpuBackend::glu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, GluGate gate) {
  dispatch_float(x.dtype(), "glu_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t F = dy.size(-1), rows = F ? dy.numel() / F : 0;
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const bool gelu = gate == GluGate::GeluTanh;
    const T k0 = static_cast<T>(kSqrt2OverPi), k1 = T(0.044715);
    parallel_for(rows, rows * F > 4096, [&](int64_t r) {
      const T* a = px + r * 2 * F;
      const T* b = a + F;
      const T* g = pdy + r * F;
      T* da = pdx + r * 2 * F;
      T* db = da + F;
      if (gelu) {
#pragma omp simd
        for (int64_t j = 0; j < F; ++j) {
          const T u = k0 * (a[j] + k1 * a[j] * a[j] * a[j]);
          const T s = T(1) / (T(1) + exp_fast(T(-2) * u));
          const T du = k0 * (T(1) + T(3) * k1 * a[j] * a[j]);
          da[j] = g[j] * b[j] * (s + T(2) * a[j] * s * (T(1) - s) * du);
          db[j] = g[j] * a[j] * s;
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < F; ++j) {
          const T s = T(1) / (T(1) + exp_fast(-a[j]));
          da[j] = g[j] * b[j] * s * (T(1) + a[j] * (T(1) - s));
          db[j] = g[j] * a[j] * s;
        }
      }
    });
  });
}

namespace {
// LayerNorm and RMSNorm share these (RMSNorm: no mean, taken as 0, and no
// bias; mean, bias and dbias null), in f64, each row's sums and the
// columns' sums in order.
void norm_forward(const char* name, const Tensor& x, const Tensor& weight, const Tensor* bias,
                  double eps, Tensor& y, Tensor* mean, Tensor& rstd, double weight_offset) {
  dispatch_float(x.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
    const T* px = x.data<T>();
    const T* w = weight.data<T>();
    const T* b = bias ? bias->data<T>() : nullptr;
    T* py = y.data<T>();
    T* pm = mean ? mean->data<T>() : nullptr;
    T* pr = rstd.data<T>();
    const T off = static_cast<T>(weight_offset);
    parallel_for(N, N * C > 4096, [&](int64_t r) {
      const T* row = px + r * C;
      double mu = 0;
      if (pm) {
        double s = 0;
        for (int64_t i = 0; i < C; ++i) s += row[i];
        mu = s / C;
        pm[r] = static_cast<T>(mu);
      }
      double v = 0;
      for (int64_t i = 0; i < C; ++i) v += (row[i] - mu) * (row[i] - mu);
      const double rs = 1.0 / std::sqrt(v / C + eps);
      pr[r] = static_cast<T>(rs);
      T* out = py + r * C;
      for (int64_t i = 0; i < C; ++i) {
        const T scaled = static_cast<T>((row[i] - mu) * rs) * (off + w[i]);
        out[i] = b ? scaled + b[i] : scaled;
      }
    });
  });
}

// dx = rstd * (dy * w - mean(dy * w) - xhat * mean(dy * w * xhat)), without
// the mean(dy * w) term for RMSNorm; dweight = column sums of dy * xhat,
// dbias of dy.
void norm_backward(const char* name, const Tensor& dy, const Tensor& x, const Tensor& weight,
                   const Tensor* mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                   Tensor* dbias, double weight_offset) {
  dispatch_float(x.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    const T* w = weight.data<T>();
    const T* pm = mean ? mean->data<T>() : nullptr;
    const T* pr = rstd.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(N, N * C > 4096, [&](int64_t r) {
      const T* row = px + r * C;
      const T* g = pdy + r * C;
      const double mu = pm ? static_cast<double>(pm[r]) : 0.0, rs = pr[r];
      double mean_g = 0, mean_gx = 0;
      for (int64_t i = 0; i < C; ++i) {
        const double gw = static_cast<double>(g[i]) * (weight_offset + w[i]);
        mean_g += gw;
        mean_gx += gw * ((row[i] - mu) * rs);
      }
      mean_g = pm ? mean_g / C : 0.0;
      mean_gx /= C;
      T* out = pdx + r * C;
      for (int64_t i = 0; i < C; ++i) {
        const double xhat = (row[i] - mu) * rs;
        out[i] = static_cast<T>(
            rs * (static_cast<double>(g[i]) * (weight_offset + w[i]) - mean_g - xhat * mean_gx));
      }
    });
    std::vector<double> dw(C, 0.0), db(dbias ? C : 0, 0.0);
    for (int64_t r = 0; r < N; ++r) {
      const T* row = px + r * C;
      const T* g = pdy + r * C;
      const double mu = pm ? static_cast<double>(pm[r]) : 0.0, rs = pr[r];
      for (int64_t i = 0; i < C; ++i) {
        dw[i] += static_cast<double>(g[i]) * ((row[i] - mu) * rs);
        if (dbias) db[i] += g[i];
      }
    }
    T* pdw = dweight.data<T>();
    for (int64_t i = 0; i < C; ++i) pdw[i] = static_cast<T>(dw[i]);
    if (dbias) {
      T* pdb = dbias->data<T>();
      for (int64_t i = 0; i < C; ++i) pdb[i] = static_cast<T>(db[i]);
    }
  });
}
}  // namespace

void CpuBackend::layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    double eps, Tensor& y, Tensor& mean, Tensor& rstd,
                                    double weight_offset) {
  norm_forward("layer_norm", x, weight, &bias, eps, y, &mean, rstd, weight_offset);
}

void CpuBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                     Tensor& dweight, Tensor& dbias, double weight_offset) {
  norm_backward("layer_norm_backward", dy, x, weight, &mean, rstd, dx, dweight, &dbias,
                weight_offset);
}

// RMSNorm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), w the
// weight plus its offset; backward with xhat = x * rstd and g = dy * w:
// dx = rstd * (g - xhat * mean(g * xhat)).
void CpuBackend::rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                                  Tensor& rstd, double weight_offset) {
  norm_forward("rms_norm", x, weight, nullptr, eps, y, nullptr, rstd, weight_offset);
}

void CpuBackend::rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                   double weight_offset) {
  norm_backward("rms_norm_backward", dy, x, weight, nullptr, rstd, dx, dweight, nullptr,
                weight_offset);
}

void CpuBackend::softmax_forward(const Tensor& x, Tensor& y) {
  dispatch_float(x.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(N, N * C > 4096, [&](int64_t r) {
      const T* row = px + r * C;
      T* out = py + r * C;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < C; ++i) mx = std::max(mx, row[i]);
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < C; ++i) {
        out[i] = exp_fast(row[i] - mx);
        s += out[i];
      }
      const T inv = static_cast<T>(1.0 / s);
      for (int64_t i = 0; i < C; ++i) out[i] *= inv;
    });
  });
}

void CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  dispatch_float(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t C = y.size(-1), N = y.numel() / std::max<int64_t>(C, 1);
    const T* py = y.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(N, N * C > 4096, [&](int64_t r) {
      double dot = 0;
      for (int64_t i = 0; i < C; ++i) dot += static_cast<double>(py[r * C + i]) * pdy[r * C + i];
      for (int64_t i = 0; i < C; ++i) {
        pdx[r * C + i] = static_cast<T>(py[r * C + i] * (pdy[r * C + i] - dot));
      }
    });
  });
}

// Causal attention per (batch, head), in blocks of kAttnBlock query rows:
// block [r0, r1) only needs keys [kb, min(r1, Tk)), kb the document start of
// its first row (0 without documents; starts never decrease along a row), so
// the GEMMs skip (almost all of) the masked upper triangle and, in packed
// rows, the earlier documents. Queries apart (the parts) sit at positions
// [q0, q0 + Tq) of the keys' frame: a chunk at the end of the keys, or a
// block after all of them; out's, lse's and dout's rows count from q0.
constexpr int64_t kAttnBlock = 64;

namespace {
// Where the kernels read the queries and the keys and values: one fused
// qkv (B, T, C3) — query row t and key/value row t both its row t, C3
// apart, k from column C — or the parts: q (B, Tq, C) holding the queries
// of positions [q0, q0 + Tq) and kv (B, Tn, 2 KV) with k from column 0.
struct AttnOperands {
  const Tensor& q;
  const Tensor& kv;
  int64_t B, Tn, hd;      // Tn: key rows
  int64_t qs, qrows, q0;  // q's row stride, rows per batch, and the position its row 0 holds
  int64_t kvs, kc;        // kv's row stride and k's first column
  // Batch b's rows of query head h (position t at (t - q0) * qs) and of
  // key/value head g's keys.
  template <class T>
  const T* q_head(int64_t b, int64_t h) const {
    return q.data<T>() + b * qrows * qs + h * hd;
  }
  template <class T>
  const T* k_head(int64_t b, int64_t g) const {
    return kv.data<T>() + b * Tn * kvs + kc + g * hd;
  }
  static AttnOperands fused(const Tensor& qkv, const AttentionHeads& heads) {
    const int64_t C3 = qkv.size(2), hd = C3 / heads.fused();
    return {qkv, qkv, qkv.size(0), qkv.size(1), hd, C3, qkv.size(1), 0, C3, heads.q * hd};
  }
  static AttnOperands parts(const Tensor& q, const Tensor& kv, const AttentionHeads& heads,
                            int64_t query_start) {
    const int64_t hd = q.size(2) / heads.q;
    return {q, kv, kv.size(0), kv.size(1), hd, q.size(2), q.size(1), query_start, kv.size(2), 0};
  }
};

// The first key the query at position t of row b sees: its doc_starts
// entry (one per query row), or 0.
struct DocStarts {
  const int32_t* p = nullptr;
  int64_t rows = 0, q0 = 0;
  DocStarts(const Tensor& starts, const AttnOperands& a)
      : p(starts.defined() ? starts.data<int32_t>() : nullptr), rows(a.qrows), q0(a.q0) {}
  int64_t operator()(int64_t b, int64_t t) const { return p ? p[b * rows + t - q0] : 0; }
};

void attention_forward_rows(const AttnOperands& a, const AttentionHeads& heads, Tensor& out,
                            Tensor& lse, const Tensor& doc_starts) {
  dispatch_float(a.q.dtype(), "attention", [&](auto tag) {
    using T = decltype(tag);
    // qs, kvs: the query and key/value rows' strides; C: out's, n_head hd.
    const int64_t B = a.B, Tn = a.Tn, n_head = heads.q, hd = a.hd, qs = a.qs, kvs = a.kvs;
    const int64_t F = a.q0, Tq = a.qrows, E = F + Tq;  // the queries' positions [F, E)
    const int64_t C = n_head * hd, KV = heads.kv * hd;
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
    const T cap = static_cast<T>(heads.softcap);  // scores cap * tanh(s / cap), when > 0
    T* po = out.data<T>();
    T* pl = lse.data<T>();
    const DocStarts start_of(doc_starts, a);
    on_team(true, [&] {
      std::vector<T> S(static_cast<size_t>(kAttnBlock * std::max<int64_t>(Tn, 1)));
#pragma omp for schedule(dynamic)
      for (int64_t bh = 0; bh < B * n_head; ++bh) {
        const int64_t b = bh / n_head, h = bh % n_head;
        const T* q = a.q_head<T>(b, h);  // position t at (t - F) * qs
        const T* k = a.k_head<T>(b, h / heads.group());
        const T* v = k + KV;
        for (int64_t r0 = F; r0 < E; r0 += kAttnBlock) {
          const int64_t r1 = std::min(E, r0 + kAttnBlock), rows = r1 - r0;
          const int64_t ke = std::min(r1, Tn), kb = std::min(start_of(b, r0), ke);
          const int64_t w = ke - kb;  // keys [kb, ke)
          T* o = po + (b * Tq + r0 - F) * C + h * hd;
          if (w == 0) {  // no query of the block sees a key
            for (int64_t i = 0; i < rows; ++i) {
              std::fill_n(o + i * C, hd, T(0));
              pl[bh * Tq + r0 - F + i] = -std::numeric_limits<T>::infinity();
            }
            continue;
          }
          // S (rows, w) = scale * Q[r0:r1] K[kb:ke]^T
          gemm_rm<T>(false, true, rows, w, hd, scale, q + (r0 - F) * qs, qs, k + kb * kvs, kvs,
                     T(0), S.data(), w);
          for (int64_t i = 0; i < rows; ++i) {
            const int64_t t = r0 + i, lo = start_of(b, t) - kb, hi = std::min(t, Tn - 1) - kb;
            T* row = S.data() + i * w;
            if (lo > hi) {  // this query sees no key
              std::fill(row, row + w, T(0));
              pl[bh * Tq + t - F] = -std::numeric_limits<T>::infinity();
              continue;
            }
            if (cap > 0) {
              for (int64_t j = lo; j <= hi; ++j) row[j] = cap * std::tanh(row[j] / cap);
            }
            T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
            for (int64_t j = lo; j <= hi; ++j) mx = std::max(mx, row[j]);
            double sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = lo; j <= hi; ++j) {
              row[j] = exp_fast(row[j] - mx);
              sum += row[j];
            }
            const T inv = static_cast<T>(1.0 / sum);
            for (int64_t j = lo; j <= hi; ++j) row[j] *= inv;
            std::fill(row, row + lo, T(0));
            std::fill(row + hi + 1, row + w, T(0));
            pl[bh * Tq + t - F] = static_cast<T>(mx + std::log(sum));
          }
          // O[r0:r1] = P V[kb:ke]
          gemm_rm<T>(false, false, rows, hd, w, T(1), S.data(), w, v + kb * kvs, kvs, T(0), o, C);
        }
      }
    });
  });
}
}  // namespace

void CpuBackend::attention_forward(const Tensor& qkv, const AttentionHeads& heads, Tensor& out,
                                   Tensor& lse, const Tensor& doc_starts) {
  attention_forward_rows(AttnOperands::fused(qkv, heads), heads, out, lse, doc_starts);
}

void CpuBackend::attention_parts_forward(const Tensor& q, const Tensor& kv,
                                         const AttentionHeads& heads, int64_t query_start,
                                         Tensor& out, Tensor& lse, const Tensor& doc_starts) {
  // (The half-precision adapter widens bf16/f16 queries and an output of
  // theirs; an f32 output under them comes through as it is.)
  if (out.dtype() != q.dtype()) {
    throw ValueError(std::string("attention: the output is ") + dtype_name(out.dtype()) + " for " +
                     dtype_name(q.dtype()) + " queries (expected the same)");
  }
  attention_forward_rows(AttnOperands::parts(q, kv, heads, query_start), heads, out, lse,
                         doc_starts);
}

void CpuBackend::attention_merge(Tensor& out, Tensor& lse, const Tensor& part,
                                 const Tensor& part_lse) {
  if (part.dtype() != out.dtype() || lse.dtype() != out.dtype() ||
      part_lse.dtype() != out.dtype()) {
    throw ValueError(std::string("attention_merge: the part (") + dtype_name(part.dtype()) +
                     "), both log-sum-exps (" + dtype_name(lse.dtype()) + ", " +
                     dtype_name(part_lse.dtype()) + ") and the accumulated output (" +
                     dtype_name(out.dtype()) + ") must share a dtype on the CPU");
  }
  dispatch_float(out.dtype(), "attention_merge", [&](auto tag) {
    using T = decltype(tag);
    // out (B, Tq, H D), lse (B, H, Tq).
    const int64_t B = lse.size(0), H = lse.size(1), Tq = lse.size(2), D = out.size(2) / H;
    T* po = out.data<T>();
    T* pl = lse.data<T>();
    const T* pp = part.data<T>();
    const T* ppl = part_lse.data<T>();
    parallel_for(B * H * Tq, B * H * Tq * D > 16384, [&](int64_t r) {
      const int64_t b = r / (H * Tq), h = r / Tq % H, t = r % Tq;
      const T a = pl[r], c = ppl[r];
      if (c == -std::numeric_limits<T>::infinity()) return;  // the part saw no key
      T* o = po + (b * Tq + t) * H * D + h * D;
      const T* p = pp + (b * Tq + t) * H * D + h * D;
      if (a == -std::numeric_limits<T>::infinity()) {
        std::copy(p, p + D, o);
        pl[r] = c;
        return;
      }
      const T m = std::max(a, c);
      const T ea = std::exp(a - m), ec = std::exp(c - m), inv = T(1) / (ea + ec);
      for (int64_t d = 0; d < D; ++d) o[d] = (ea * o[d] + ec * p[d]) * inv;
      pl[r] = m + std::log(ea + ec);
    });
  });
}

// Decoding's attention over the cache where it lies. A step of one or a few
// new tokens per row goes a query at a time: its scores over the keys it
// sees, their softmax, the weighted sum of the values. Many new tokens (a
// session's next turn, a run of continuations being scored) go a block of
// kAttnBlock queries at a time through two GEMMs, as attention_forward does:
// S = scale Q K^T over the keys the block's queries see together, each row's
// masked softmax, then O = P V.
constexpr int64_t kCachedGemmQueries = 8;

void CpuBackend::cached_attention_forward(const Tensor& qkv, const Tensor& keys,
                                          const Tensor& values, const AttentionHeads& heads,
                                          int64_t window, const Tensor& text_starts, Tensor& out) {
  dispatch_float(qkv.dtype(), "cached_attention", [&](auto tag) {
    using T = decltype(tag);
    const int64_t B = qkv.size(0), n = qkv.size(1), W = qkv.size(2), H = heads.q;
    const int64_t G = heads.group(), L = keys.size(2), D = keys.size(3);
    const int64_t kb = keys.strides()[0], kh = keys.strides()[1];
    const int64_t vb = values.strides()[0], vh = values.strides()[1];
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
    const T cap = static_cast<T>(heads.softcap);
    const T* pq = qkv.data<T>();
    const T* pk = keys.data<T>();
    const T* pv = values.data<T>();
    const int32_t* text = text_starts.defined() ? text_starts.data<int32_t>() : nullptr;
    T* po = out.data<T>();
    // The first slot that the query at slot p of row b sees (it sees up to p).
    const auto first_slot = [&](int64_t b, int64_t p) {
      int64_t first = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
      if (text != nullptr && p >= text[b]) first = std::max<int64_t>(first, text[b]);
      return first;
    };
    // Softmax of s[first..p] in place (soft-capped first); returns 1 / sum.
    const auto softmax = [&](T* s, int64_t first, int64_t p) {
      if (cap > 0) {
        for (int64_t j = first; j <= p; ++j) s[j] = cap * std::tanh(s[j] / cap);
      }
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = first; j <= p; ++j) mx = std::max(mx, s[j]);
      double sum = 0;
      for (int64_t j = first; j <= p; ++j) {
        s[j] = exp_fast(s[j] - mx);
        sum += s[j];
      }
      return static_cast<T>(1.0 / sum);
    };
    if (n >= kCachedGemmQueries) {
      const int64_t blocks = (n + kAttnBlock - 1) / kAttnBlock;
      on_team(true, [&] {
        std::vector<T> S(static_cast<size_t>(kAttnBlock * L));
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < B * H * blocks; ++task) {
          const int64_t b = task / (H * blocks), h = task / blocks % H;
          const int64_t i0 = task % blocks * kAttnBlock, rows = std::min(kAttnBlock, n - i0);
          const int64_t p0 = L - n + i0, p1 = p0 + rows - 1;  // the block's query slots
          int64_t lo = p1;  // the first slot any of its queries sees
          for (int64_t p = p0; p <= p1; ++p) lo = std::min(lo, first_slot(b, p));
          const int64_t w = p1 - lo + 1;
          const T* k = pk + b * kb + h / G * kh + lo * D;
          const T* v = pv + b * vb + h / G * vh + lo * D;
          gemm_rm<T>(false, true, rows, w, D, scale, pq + (b * n + i0) * W + h * D, W, k, D, T(0),
                     S.data(), w);
          for (int64_t i = 0; i < rows; ++i) {
            const int64_t p = p0 + i, first = first_slot(b, p) - lo, last = p - lo;
            T* row = S.data() + i * w;
            const T inv = softmax(row, first, last);
            for (int64_t j = first; j <= last; ++j) row[j] *= inv;
            std::fill(row, row + first, T(0));
            std::fill(row + last + 1, row + w, T(0));
          }
          gemm_rm<T>(false, false, rows, D, w, T(1), S.data(), w, v, D, T(0),
                     po + (b * n + i0) * H * D + h * D, H * D);
        }
      });
      return;
    }
    on_team(B * n * H * L * D > 32768, [&] {
      std::vector<T> s(static_cast<size_t>(L));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < B * n * H; ++r) {
        const int64_t h = r % H, row = r / H, b = row / n, p = L - n + row % n;
        const int64_t first = first_slot(b, p);
        const T* q = pq + row * W + h * D;
        const T* k = pk + b * kb + h / G * kh;
        const T* v = pv + b * vb + h / G * vh;
        for (int64_t j = first; j <= p; ++j) {
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += q[d] * k[j * D + d];
          s[static_cast<size_t>(j)] = dot * scale;
        }
        const T inv = softmax(s.data(), first, p);
        T* o = po + row * H * D + h * D;
        std::fill(o, o + D, T(0));
        for (int64_t j = first; j <= p; ++j) {
          const T w = s[static_cast<size_t>(j)];
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) o[d] += w * v[j * D + d];
        }
        for (int64_t d = 0; d < D; ++d) o[d] *= inv;
      }
    });
  });
}

namespace {
// dq and dkv laid out as a's q and kv (one fused dqkv for a fused qkv).
void attention_backward_rows(const AttnOperands& a, const Tensor& out, const Tensor& lse,
                             const Tensor& dout, const AttentionHeads& heads, Tensor& dq_out,
                             Tensor& dkv_out, const Tensor& doc_starts) {
  dispatch_float(a.q.dtype(), "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t B = a.B, Tn = a.Tn, n_head = heads.q, hd = a.hd, qs = a.qs, kvs = a.kvs;
    const int64_t F = a.q0, Tq = a.qrows, E = F + Tq;  // the queries' positions [F, E)
    const int64_t C = n_head * hd, KV = heads.kv * hd;
    const int64_t G = heads.group();
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
    const T cap = static_cast<T>(heads.softcap);
    const T* po = out.data<T>();
    const T* pdo = dout.data<T>();
    const T* pl = lse.data<T>();
    // The gradients' rows, laid out as the inputs' (query position t at
    // (t - q0) * qs, key/value row t at t * kvs).
    const AttnOperands d{dq_out, dkv_out, B, Tn, hd, qs, a.qrows, a.q0, kvs, a.kc};
    const DocStarts start_of(doc_starts, a);
    const size_t block = static_cast<size_t>(kAttnBlock * std::max<int64_t>(Tn, 1));
    on_team(true, [&] {
      std::vector<T> P(block), dP(block);
      // Soft-capped scores z: the cap's derivative 1 - (z / cap)^2 per score.
      std::vector<T> dcap(cap > 0 ? block : 0);
      // One task per key/value head: its dK and dV accumulate over the
      // query blocks of each query head in its group, in a fixed order.
#pragma omp for schedule(dynamic)
      for (int64_t bkv = 0; bkv < B * heads.kv; ++bkv) {
        const int64_t b = bkv / heads.kv, kvh = bkv % heads.kv;
        const T* k = a.k_head<T>(b, kvh);
        const T* v = k + KV;
        T* dk = const_cast<T*>(d.k_head<T>(b, kvh));
        T* dv = dk + KV;
        for (int64_t t = 0; t < Tn; ++t) {
          std::fill_n(dk + t * kvs, hd, T(0));
          std::fill_n(dv + t * kvs, hd, T(0));
        }
        for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
          const int64_t bh = b * n_head + h;
          const T* q = a.q_head<T>(b, h);  // position t at (t - F) * qs, as dq's
          // Position t's output and its gradient: o[(t - F) * C], dO[(t - F) * C].
          const T* o = po + b * Tq * C + h * hd;
          const T* dO = pdo + b * Tq * C + h * hd;
          T* dq = const_cast<T*>(d.q_head<T>(b, h));
          for (int64_t r0 = F; r0 < E; r0 += kAttnBlock) {
            const int64_t r1 = std::min(E, r0 + kAttnBlock), rows = r1 - r0;
            const int64_t ke = std::min(r1, Tn), kb = std::min(start_of(b, r0), ke);
            const int64_t w = ke - kb;  // keys [kb, ke)
            if (w == 0) {               // no query of the block sees a key
              for (int64_t i = 0; i < rows; ++i) std::fill_n(dq + (r0 - F + i) * qs, hd, T(0));
              continue;
            }
            const T* kk = k + kb * kvs;
            const T* vk = v + kb * kvs;
            const T* qr = q + (r0 - F) * qs;
            // Recompute probabilities from the saved log-sum-exp.
            gemm_rm<T>(false, true, rows, w, hd, scale, qr, qs, kk, kvs, T(0), P.data(), w);
            for (int64_t i = 0; i < rows; ++i) {
              const int64_t t = r0 + i, lo = start_of(b, t) - kb, hi = std::min(t, Tn - 1) - kb;
              T* row = P.data() + i * w;
              if (lo > hi) {  // this query sees no key
                std::fill(row, row + w, T(0));
                continue;
              }
              const T l = pl[bh * Tq + t - F];
              if (cap > 0) {
                T* drow = dcap.data() + i * w;
                for (int64_t j = lo; j <= hi; ++j) {
                  const T z = std::tanh(row[j] / cap);
                  row[j] = cap * z;
                  drow[j] = T(1) - z * z;
                }
              }
#pragma omp simd
              for (int64_t j = lo; j <= hi; ++j) row[j] = exp_fast(row[j] - l);
              std::fill(row, row + lo, T(0));
              std::fill(row + hi + 1, row + w, T(0));
            }
            // dV[kb:ke] += P^T dO[r0:r1] ; dP = dO[r0:r1] V[kb:ke]^T
            gemm_rm<T>(true, false, w, hd, rows, T(1), P.data(), w, dO + (r0 - F) * C, C, T(1),
                       dv + kb * kvs, kvs);
            gemm_rm<T>(false, true, rows, w, hd, T(1), dO + (r0 - F) * C, C, vk, kvs, T(0),
                       dP.data(), w);
            // dS = P * (dP - rowsum(dO * O)), scaled for the QK^T product.
            for (int64_t i = 0; i < rows; ++i) {
              const int64_t t = r0 + i, lo = start_of(b, t) - kb, hi = std::min(t, Tn - 1) - kb;
              T* drow = dP.data() + i * w;
              if (lo > hi) {
                std::fill(drow, drow + w, T(0));
                continue;
              }
              double D = 0;
              for (int64_t e = 0; e < hd; ++e)
                D += static_cast<double>(dO[(t - F) * C + e]) * o[(t - F) * C + e];
              const T* prow = P.data() + i * w;
              const T Dt = static_cast<T>(D);
#pragma omp simd
              for (int64_t j = lo; j <= hi; ++j) drow[j] = prow[j] * (drow[j] - Dt) * scale;
              if (cap > 0) {
                const T* crow = dcap.data() + i * w;
#pragma omp simd
                for (int64_t j = lo; j <= hi; ++j) drow[j] *= crow[j];
              }
              std::fill(drow, drow + lo, T(0));
              std::fill(drow + hi + 1, drow + w, T(0));
            }
            // dQ[r0:r1] = dS K[kb:ke] ; dK[kb:ke] += dS^T Q[r0:r1]
            gemm_rm<T>(false, false, rows, hd, w, T(1), dP.data(), w, kk, kvs, T(0),
                       dq + (r0 - F) * qs, qs);
            gemm_rm<T>(true, false, w, hd, rows, T(1), dP.data(), w, qr, qs, T(1), dk + kb * kvs,
                       kvs);
          }
        }
      }
    });
  });
}
}  // namespace

void CpuBackend::attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                    const Tensor& dout, const AttentionHeads& heads, Tensor& dqkv,
                                    const Tensor& doc_starts) {
  attention_backward_rows(AttnOperands::fused(qkv, heads), out, lse, dout, heads, dqkv, dqkv,
                          doc_starts);
}

void CpuBackend::attention_parts_backward(const Tensor& q, const Tensor& kv, const Tensor& out,
                                          const Tensor& lse, const Tensor& dout,
                                          const AttentionHeads& heads, int64_t query_start,
                                          Tensor& dq, Tensor& dkv, const Tensor& doc_starts) {
  attention_backward_rows(AttnOperands::parts(q, kv, heads, query_start), out, lse, dout, heads, dq,
                          dkv, doc_starts);
}

void CpuBackend::rotary_embedding(const Tensor& qkv, const AttentionHeads& heads,
                                  const Tensor& positions, int64_t start, double theta,
                                  const RopeScaling& scaling, bool inverse, Tensor& out) {
  dispatch_float(qkv.dtype(), "rotary_embedding", [&](auto tag) {
    using T = decltype(tag);
    const int64_t B = qkv.size(0), Tn = qkv.size(1), C3 = qkv.size(2);
    // Pairs (i, i + half) of each head's first `turned` dimensions turn; the
    // rest of the head passes through.
    const int64_t D = C3 / heads.fused(), turned = scaling.turned(D), half = turned / 2,
                  rotated = heads.q + heads.kv;
    const int64_t* pos = positions.defined() ? positions.data<int64_t>() : nullptr;
    auto position = [&](int64_t b, int64_t t) { return pos ? pos[b * Tn + t] : start + t; };
    // cos and sin of every (position, pair) the batch uses, in f64 and then
    // in T, shared by the q + kv rotations of a token.
    int64_t npos = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < Tn; ++t) npos = std::max(npos, position(b, t) + 1);
    }
    std::vector<T> cs(static_cast<size_t>(npos * half)), sn(cs.size());
    // The amplitude (yarn's) scales the rotation both ways: the inverse is
    // the transpose, the gradient of the scaled rotation.
    const double amplitude = rope_amplitude(scaling), sign = inverse ? -1.0 : 1.0;
    for (int64_t i = 0; i < half; ++i) {
      const double freq = rope_frequency(i, D, theta, scaling);
      for (int64_t p = 0; p < npos; ++p) {
        const double angle = static_cast<double>(p) * freq;
        cs[static_cast<size_t>(p * half + i)] = static_cast<T>(amplitude * std::cos(angle));
        sn[static_cast<size_t>(p * half + i)] = static_cast<T>(amplitude * sign * std::sin(angle));
      }
    }
    const T* in = qkv.data<T>();
    T* o = out.data<T>();
    parallel_for(B * Tn, B * Tn * C3 > 16384, [&](int64_t r) {
      const T* c = cs.data() + position(r / Tn, r % Tn) * half;
      const T* s = sn.data() + position(r / Tn, r % Tn) * half;
      const T* x = in + r * C3;
      T* y = o + r * C3;
      for (int64_t h = 0; h < rotated; ++h) {  // q's heads, then k's
        const T* xh = x + h * D;
        T* yh = y + h * D;
        for (int64_t i = 0; i < half; ++i) {
          const T x1 = xh[i], x2 = xh[i + half];
          yh[i] = x1 * c[i] - x2 * s[i];
          yh[i + half] = x2 * c[i] + x1 * s[i];
        }
        std::copy(xh + turned, xh + D, yh + turned);
      }
      std::copy(x + rotated * D, x + C3, y + rotated * D);  // v
    });
  });
}

void CpuBackend::embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  dispatch_float(weight.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    const int64_t V = weight.size(0), C = weight.size(1), N = ids.numel();
    for (int64_t i = 0; i < N; ++i) {
      const int64_t id = load_index(ids, i);
      if (id < 0 || id >= V) {
        throw ValueError("embedding: token id " + std::to_string(id) + " at position " +
                         std::to_string(i) + " is outside [0, " + std::to_string(V) + ")");
      }
    }
    const T* w = weight.data<T>();
    T* o = out.data<T>();
    parallel_for(N, N * C > 4096, [&](int64_t i) {
      const T* src = w + load_index(ids, i) * C;
      std::copy(src, src + C, o + i * C);
    });
  });
}

void CpuBackend::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) {
  const int64_t V = dweight.size(0), C = dweight.size(1), N = ids.numel();
  std::vector<int64_t> host(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) host[static_cast<size_t>(i)] = load_index(ids, i);
  const detail::EmbeddingSegments seg = detail::group_by_id(host.data(), N, V);
  const int64_t U = static_cast<int64_t>(seg.seg_id.size());
  dispatch_float(dout.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    T* dw = dweight.data<T>();
    const T* g = dout.data<T>();
    std::fill_n(dw, dweight.numel(), T(0));
    // The fixed order (embedding_order.h): each id's positions in pieces summed
    // in token order, the pieces' sums added in order. Ids own their rows.
    parallel_for(U, N * C > 4096, [&](int64_t u) {
      const int64_t begin = seg.seg_start[u], end = seg.seg_start[u + 1];
      T* row = dw + seg.seg_id[u] * C;
      auto add_rows = [&](int64_t from, int64_t to, T* into) {
        for (int64_t k = from; k < to; ++k) {
          const T* src = g + seg.order[k] * C;
          for (int64_t c = 0; c < C; ++c) into[c] += src[c];
        }
      };
      if (end - begin <= detail::kEmbeddingPiece) {
        add_rows(begin, end, row);
        return;
      }
      std::vector<T> piece(static_cast<size_t>(C));
      for (int64_t k = begin; k < end; k += detail::kEmbeddingPiece) {
        std::fill(piece.begin(), piece.end(), T(0));
        add_rows(k, std::min(end, k + detail::kEmbeddingPiece), piece.data());
        for (int64_t c = 0; c < C; ++c) row[c] += piece[c];
      }
    });
  });
}

namespace {

// The targets of a cross entropy over V classes: each in [0, V) or ignored.
void check_ce_targets(const Tensor& targets, int64_t N, int64_t V, int64_t ignore_index) {
  for (int64_t i = 0; i < N; ++i) {
    const int64_t t = load_index(targets, i);
    if (t != ignore_index && (t < 0 || t >= V)) {
      throw ValueError("cross_entropy: target " + std::to_string(t) + " at row " +
                       std::to_string(i) + " is outside [0, " + std::to_string(V) + ")");
    }
  }
}

// A row's log-sum-exp into *lse and its loss against target t into *loss.
template <class T>
void ce_row_forward(const T* row, int64_t V, int64_t t, int64_t ignore_index, T* loss, T* lse) {
  const T mx = row_max(row, V);
  const double l = mx + std::log(row_sum_exp(row, V, mx));
  *lse = static_cast<T>(l);
  *loss = t == ignore_index ? T(0) : static_cast<T>(l - row[t]);
}

// A row's gradient (softmax - one-hot) * dloss, plus softmax * dlse, into out
// (which may be row itself), from its stored log-sum-exp; softcap > 0: with
// respect to the uncapped logits.
template <class T>
void ce_row_backward(const T* row, int64_t V, int64_t t, int64_t ignore_index, T lse, T dloss,
                     T dlse, T cap, T* out) {
  // Ignored rows: no gradient at all.
  const T g = t == ignore_index ? T(0) : dloss;
  const T gs = t == ignore_index ? T(0) : g + dlse;  // softmax's weight
  // (The target's slope is read before the row is overwritten.)
  const T gt = t == ignore_index ? T(0) : g * cap_slope(row[t], cap);
  row_scaled_exp_capped(row, V, V, lse, gs, cap, out);
  if (t != ignore_index) out[t] -= gt;
}

}  // namespace

void CpuBackend::cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                       int64_t ignore_index, Tensor& losses, Tensor& lse) {
  dispatch_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = logits.size(0), V = logits.size(1);
    const int64_t ld = matrix_ld(logits, "cross_entropy");
    check_ce_targets(targets, N, V, ignore_index);
    const T* px = logits.data<T>();
    T* pl = losses.data<T>();
    T* ps = lse.data<T>();
    parallel_for(N, N * V > 4096, [&](int64_t i) {
      ce_row_forward(px + i * ld, V, load_index(targets, i), ignore_index, pl + i, ps + i);
    });
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                        const Tensor& lse, const Tensor& dlosses,
                                        const Tensor& dlse, int64_t ignore_index, Tensor& dlogits,
                                        double softcap) {
  dispatch_float(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = logits.size(0), V = logits.size(1);
    // Row-strided logits and dlogits (one stride); dlogits may be logits.
    const int64_t ld = same_row_stride(logits, dlogits, "cross_entropy_backward");
    const T* px = logits.data<T>();
    const T* ps = lse.data<T>();
    const T* pg = dlosses.data<T>();
    const T* pz = dlse.defined() ? dlse.data<T>() : nullptr;
    T* pd = dlogits.data<T>();
    const T cap = static_cast<T>(softcap);
    parallel_for(N, N * V > 4096, [&](int64_t i) {
      ce_row_backward(px + i * ld, V, load_index(targets, i), ignore_index, ps[i], pg[i],
                      pz ? pz[i] : T(0), cap, pd + i * ld);
    });
  });
}

// Both passes row by row: a row's second read (its gradient) comes from the
// cache its first (the log-sum-exp) filled, instead of from memory after
// every other row. Each row's arithmetic is the two calls', so the bits are
// theirs.
void CpuBackend::cross_entropy_forward_backward(const Tensor& logits, const Tensor& targets,
                                                int64_t ignore_index, Tensor& losses, Tensor& lse,
                                                const Tensor& dlosses, Tensor& dlogits,
                                                double softcap, double z_scale) {
  dispatch_float(logits.dtype(), "cross_entropy_forward_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = logits.size(0), V = logits.size(1);
    const int64_t ld = same_row_stride(logits, dlogits, "cross_entropy_forward_backward");
    check_ce_targets(targets, N, V, ignore_index);
    const T* px = logits.data<T>();
    T* pl = losses.data<T>();
    T* ps = lse.data<T>();
    const T* pg = dlosses.data<T>();
    T* pd = dlogits.data<T>();
    const T cap = static_cast<T>(softcap), zs = static_cast<T>(z_scale);
    parallel_for(N, N * V > 4096, [&](int64_t i) {
      const int64_t t = load_index(targets, i);
      ce_row_forward(px + i * ld, V, t, ignore_index, pl + i, ps + i);
      // (The default's dlse: the product, then the scale, each rounded.)
      const T dlse = zs != T(0) ? zs * static_cast<T>(ps[i] * pg[i]) : T(0);
      ce_row_backward(px + i * ld, V, t, ignore_index, ps[i], pg[i], dlse, cap, pd + i * ld);
    });
  });
}

void CpuBackend::vocab_ce_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                  int64_t valid, Tensor& row_max_out, Tensor& target_logit) {
  dispatch_float(logits.dtype(), "vocab_ce_partial", [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = logits.size(0);
    const T* px = logits.data<T>();
    T* pm = row_max_out.data<T>();
    T* pt = target_logit.data<T>();
    const int64_t ld = matrix_ld(logits, "vocab_ce_partial");
    parallel_for(N, N * valid > 4096, [&](int64_t i) {
      const T* row = px + i * ld;
      pm[i] = row_max(row, valid);
      const int64_t t = load_index(targets, i) - vocab_start;
      pt[i] = (t >= 0 && t < valid) ? row[t] : T(0);
    });
  });
}

void CpuBackend::vocab_ce_sumexp(const Tensor& logits, const Tensor& global_max, int64_t valid,
                                 Tensor& sumexp) {
  dispatch_float(logits.dtype(), "vocab_ce_sumexp", [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = logits.size(0), ld = matrix_ld(logits, "vocab_ce_sumexp");
    const T* px = logits.data<T>();
    const T* pm = global_max.data<T>();
    T* ps = sumexp.data<T>();
    parallel_for(N, N * valid > 4096, [&](int64_t i) {
      ps[i] = static_cast<T>(row_sum_exp(px + i * ld, valid, pm[i]));
    });
  });
}

void CpuBackend::vocab_ce_loss(const Tensor& global_max, const Tensor& target_logit,
                               const Tensor& sumexp, Tensor& losses) {
  dispatch_float(losses.dtype(), "vocab_ce_loss", [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = losses.numel();
    const T* pm = global_max.data<T>();
    const T* pt = target_logit.data<T>();
    const T* ps = sumexp.data<T>();
    T* pl = losses.data<T>();
    for (int64_t i = 0; i < N; ++i) {
      pl[i] = static_cast<T>(std::log(static_cast<double>(ps[i])) + static_cast<double>(pm[i]) -
                             static_cast<double>(pt[i]));
    }
  });
}

void CpuBackend::vocab_ce_backward(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                   int64_t valid, const Tensor& global_max, const Tensor& sumexp,
                                   const Tensor& dloss, const Tensor& dlse, Tensor& dlogits,
                                   double softcap) {
  dispatch_float(logits.dtype(), "vocab_ce_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = logits.size(0), V = logits.size(1);
    const int64_t ld = same_row_stride(logits, dlogits, "vocab_ce_backward");
    const T* px = logits.data<T>();
    const T* pm = global_max.data<T>();
    const T* ps = sumexp.data<T>();
    const T* pg = dloss.data<T>();
    const T* pz = dlse.defined() ? dlse.data<T>() : nullptr;
    T* pd = dlogits.data<T>();
    parallel_for(N, N * V > 4096, [&](int64_t i) {
      const int64_t t = load_index(targets, i) - vocab_start;
      const bool here = t >= 0 && t < valid;
      const T cap = static_cast<T>(softcap);
      const T gt = here ? pg[i] * cap_slope(px[i * ld + t], cap) : T(0);
      const T gs = pg[i] + (pz ? pz[i] : T(0));  // softmax's weight
      row_scaled_exp_capped(px + i * ld, valid, V, pm[i], gs / ps[i], cap, pd + i * ld);
      if (here) pd[i * ld + t] -= gt;
    });
  });
}

}  // namespace triad::detail
