#include "triad/ops/nn_functional.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "op_checks.h"
#include "op_nodes.h"
#include "triad/autograd/grad_mode.h"
#include "triad/autograd/node.h"
#include "triad/backend/backend.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/shape_ops.h"

namespace triad {

using autograd::record;
using autograd::TensorList;

namespace {
// A norm's weight offset (the scale is offset + weight): any finite number.
void check_weight_offset(const char* op, double weight_offset) {
  if (!std::isfinite(weight_offset)) {
    throw ValueError(std::string(op) + ": weight offset " + std::to_string(weight_offset) +
                     " must be finite");
  }
}

// The checks layer_norm and add_layer_norm share; returns C.
int64_t check_layer_norm_args(const char* op, const Tensor& x, const Tensor& weight,
                              const Tensor& bias, double eps, double weight_offset) {
  check_weight_offset(op, weight_offset);
  detail::check_floating(x, op, "x");
  detail::check_same(x, weight, op);
  detail::check_same(x, bias, op);
  const int64_t C = x.dim() ? x.size(-1) : 0;
  if (x.dim() == 0 || weight.shape() != Shape{C} || bias.shape() != Shape{C}) {
    throw ShapeError(std::string(op) + ": x " + shape_str(x.shape()) + ", weight " +
                     shape_str(weight.shape()) + ", bias " + shape_str(bias.shape()) +
                     " (weight and bias must be [C] with C the last dim of x)");
  }
  if (!(eps > 0))
    throw ValueError(std::string(op) + ": eps " + std::to_string(eps) + " must be > 0");
  return C;
}

// A LayerNorm's weight and bias when both are leaves that require grad
// (parameters): their gradients then go straight into .grad.
std::vector<Tensor> param_leaves(const Tensor& weight, const Tensor& bias) {
  const auto leaf = [](const Tensor& t) { return t.requires_grad() && t.is_leaf(); };
  if (!leaf(weight) || !leaf(bias)) return {Tensor()};
  return {weight, bias};
}
}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                  double weight_offset) {
  const int64_t C = check_layer_norm_args("layer_norm", x, weight, bias, eps, weight_offset);
  Tensor xc = contiguous(x).detach();
  Tensor wc = contiguous(weight).detach(), bc = contiguous(bias).detach();
  const int64_t rows = C ? x.numel() / C : 0;
  Tensor y = empty_like(xc);
  Tensor mu = empty({rows}, stat_dtype(x.dtype()), x.device());
  Tensor rs = empty({rows}, stat_dtype(x.dtype()), x.device());
  backend_for(x).layer_norm_forward(xc, wc, bc, eps, y, mu, rs, weight_offset);
  const std::vector<Tensor> leaves = param_leaves(weight, bias);
  record("layer_norm", {x, weight, bias}, {y},
         [xc, wc, mu, rs, leaves, weight_offset](const TensorList& g) -> TensorList {
           Tensor dy = contiguous(g[0]);
           Tensor dx = empty_like(xc);
           // Leaf parameters take their gradients straight from the kernel.
           if (autograd::accumulate_into_leaf_grads(
                   leaves, [&](std::vector<Tensor>& acc, double beta) {
                     backend_for(xc).layer_norm_backward_into(dy, nullptr, xc, wc, mu, rs, dx,
                                                              acc[0], acc[1], beta, weight_offset);
                   })) {
             return {dx, Tensor(), Tensor()};
           }
           Tensor dw = empty_like(wc), db = empty_like(wc);
           backend_for(xc).layer_norm_backward(dy, xc, wc, mu, rs, dx, dw, db, weight_offset);
           return {dx, dw, db};
         });
  return y;
}

AddNorm add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                       const Tensor& bias, double eps, double weight_offset) {
  const int64_t C = check_layer_norm_args("add_layer_norm", x, weight, bias, eps, weight_offset);
  detail::check_same(x, residual, "add_layer_norm");
  if (residual.shape() != x.shape()) {
    throw ShapeError("add_layer_norm: residual " + shape_str(residual.shape()) +
                     " must have x's shape " + shape_str(x.shape()));
  }
  Tensor xc = contiguous(x).detach(), rc = contiguous(residual).detach();
  Tensor wc = contiguous(weight).detach(), bc = contiguous(bias).detach();
  const int64_t rows = C ? x.numel() / C : 0;
  Tensor h = empty_like(xc), y = empty_like(xc);
  Tensor mu = empty({rows}, stat_dtype(x.dtype()), x.device());
  Tensor rs = empty({rows}, stat_dtype(x.dtype()), x.device());
  backend_for(x).add_layer_norm_forward(xc, rc, wc, bc, eps, h, y, mu, rs, weight_offset);
  Tensor hd = h.detach();
  const std::vector<Tensor> leaves = param_leaves(weight, bias);
  // A residual that is a linear layer's output with a bias to train: its
  // gradient is this backward's dx, whose column sums the backend may make
  // in the same pass for that bias (detail::FusedBiasSums).
  std::shared_ptr<detail::FusedBiasSums> sums = detail::output_grad_sums_of(residual);
  record("add_layer_norm", {x, residual, weight, bias}, {h, y},
         [hd, wc, mu, rs, leaves, weight_offset, sums](const TensorList& g) -> TensorList {
           Tensor dh = contiguous(g[0]), dy = contiguous(g[1]);
           Tensor dx = empty_like(hd);
           if (autograd::accumulate_into_leaf_grads(
                   leaves, [&](std::vector<Tensor>& acc, double beta) {
                     if (!sums) {
                       backend_for(hd).layer_norm_backward_into(dy, &dh, hd, wc, mu, rs, dx, acc[0],
                                                                acc[1], beta, weight_offset);
                       return;
                     }
                     Tensor col = backend_for(hd).layer_norm_backward_into_with_dx_sums(
                         dy, &dh, hd, wc, mu, rs, dx, acc[0], acc[1], beta, weight_offset);
                     if (col.defined()) {
                       sums->grad = dx;
                       sums->sums = col;
                     }
                   })) {
             return {dx, dx, Tensor(), Tensor()};
           }
           Tensor dw = empty_like(wc), db = empty_like(wc);
           backend_for(hd).add_layer_norm_backward(dy, dh, hd, wc, mu, rs, dx, dw, db,
                                                   weight_offset);
           return {dx, dx, dw, db};
         });
  return {h, y};
}

namespace {
// A soft cap: a finite number >= 0 (0: none).
void check_softcap(const char* op, double cap) {
  if (!(cap >= 0.0) || !std::isfinite(cap)) {
    throw ValueError(std::string(op) + ": softcap " + std::to_string(cap) +
                     " must be a finite number >= 0 (0: no soft-capping)");
  }
}

int64_t check_rms_norm_args(const char* op, const Tensor& x, const Tensor& weight, double eps,
                            double weight_offset) {
  check_weight_offset(op, weight_offset);
  detail::check_floating(x, op, "x");
  detail::check_same(x, weight, op);
  const int64_t C = x.dim() ? x.size(-1) : 0;
  if (x.dim() == 0 || weight.shape() != Shape{C}) {
    throw ShapeError(std::string(op) + ": x " + shape_str(x.shape()) + ", weight " +
                     shape_str(weight.shape()) + " (weight must be [C] with C the last dim of x)");
  }
  if (!(eps > 0))
    throw ValueError(std::string(op) + ": eps " + std::to_string(eps) + " must be > 0");
  return C;
}

// RMSNorm's backward node for x (the norm's input: h under the fused add),
// with dh (the gradient h gets from its other uses) added into dx when
// `fused`. A leaf weight's gradient goes straight into .grad (f32 for a
// half weight); otherwise it is formed in the weight's dtype.
autograd::BackwardFn rms_norm_backward_fn(const Tensor& xc, const Tensor& wc, const Tensor& rs,
                                          const Tensor& weight, bool fused, double offset) {
  const Tensor leaf = weight.requires_grad() && weight.is_leaf() ? weight : Tensor();
  return [xc, wc, rs, leaf, fused, offset](const TensorList& g) -> TensorList {
    Tensor dy = contiguous(g[fused ? 1 : 0]);
    Tensor dh = fused ? contiguous(g[0]) : Tensor();
    Tensor dx = empty_like(xc);
    Backend& be = backend_for(xc);
    auto run = [&](Tensor& dw, double beta) {
      be.rms_norm_backward_into(dy, fused ? &dh : nullptr, xc, wc, rs, dx, dw, beta, offset);
    };
    Tensor dw;
    if (!autograd::accumulate_into_leaf_grad(leaf, run)) {
      dw = empty_like(wc);
      run(dw, 0.0);
    }
    if (fused) return {dx, dx, dw};
    return {dx, dw};
  };
}
}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps, double weight_offset) {
  const int64_t C = check_rms_norm_args("rms_norm", x, weight, eps, weight_offset);
  Tensor xc = contiguous(x).detach(), wc = contiguous(weight).detach();
  const int64_t rows = C ? x.numel() / C : 0;
  Tensor y = empty_like(xc);
  Tensor rs = empty({rows}, stat_dtype(x.dtype()), x.device());
  backend_for(x).rms_norm_forward(xc, wc, eps, y, rs, weight_offset);
  record("rms_norm", {x, weight}, {y},
         rms_norm_backward_fn(xc, wc, rs, weight, false, weight_offset));
  return y;
}

AddNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                     double weight_offset) {
  const int64_t C = check_rms_norm_args("add_rms_norm", x, weight, eps, weight_offset);
  detail::check_same(x, residual, "add_rms_norm");
  if (residual.shape() != x.shape()) {
    throw ShapeError("add_rms_norm: residual " + shape_str(residual.shape()) +
                     " must have x's shape " + shape_str(x.shape()));
  }
  Tensor xc = contiguous(x).detach(), rc = contiguous(residual).detach();
  Tensor wc = contiguous(weight).detach();
  const int64_t rows = C ? x.numel() / C : 0;
  Tensor h = empty_like(xc), y = empty_like(xc);
  Tensor rs = empty({rows}, stat_dtype(x.dtype()), x.device());
  backend_for(x).add_rms_norm_forward(xc, rc, wc, eps, h, y, rs, weight_offset);
  record("add_rms_norm", {x, residual, weight}, {h, y},
         rms_norm_backward_fn(h.detach(), wc, rs, weight, true, weight_offset));
  return {h, y};
}

Tensor soft_cap(const Tensor& x, double cap) {
  detail::check_floating(x, "soft_cap", "x");
  check_softcap("soft_cap", cap);
  if (!(cap > 0)) throw ValueError("soft_cap: cap 0 caps nothing (expected a number > 0)");
  Tensor xc = contiguous(x);
  Tensor y = empty_like(xc);
  backend_for(x).soft_cap(xc, cap, y);
  Tensor yd = y.detach();
  record("soft_cap", {x}, {y}, [yd, cap](const TensorList& g) -> TensorList {
    Tensor dy = contiguous(g[0]);
    Tensor dx = empty_like(yd);
    backend_for(yd).soft_cap_backward(yd, dy, cap, dx);
    return {dx};
  });
  return y;
}

Tensor clamp(const Tensor& x, double lo, double hi) {
  detail::check_floating(x, "clamp", "x");
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi) {
    throw ValueError("clamp: bounds [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "] must be finite numbers with lo <= hi");
  }
  Tensor xc = contiguous(x).detach();
  Tensor y = empty_like(xc);
  backend_for(x).clamp(xc, lo, hi, y);
  record("clamp", {x}, {y}, [xc, lo, hi](const TensorList& g) -> TensorList {
    Tensor dy = contiguous(g[0]);
    Tensor dx = empty_like(xc);
    backend_for(xc).clamp_backward(xc, dy, lo, hi, dx);
    return {dx};
  });
  return y;
}

Tensor relu2(const Tensor& x) {
  detail::check_floating(x, "relu2", "x");
  // (The clamp's top is finite, and past every half and float.)
  constexpr double kTop = std::numeric_limits<float>::max();
  Tensor xc = contiguous(x).detach();
  Tensor y = empty_like(xc);
  Backend& b = backend_for(xc);
  b.clamp(xc, 0.0, kTop, y);
  b.binary(BinaryOp::Mul, y, y, y);
  record("relu2", {x}, {y}, [xc](const TensorList& g) -> TensorList {
    Tensor dy = contiguous(g[0]);
    Tensor dx = empty_like(xc);
    Backend& be = backend_for(xc);
    be.clamp(xc, 0.0, kTop, dx);
    be.binary(BinaryOp::Mul, dx, dy, dx);
    be.affine(dx, 2.0, 0.0, dx);
    return {dx};
  });
  return y;
}

Tensor softmax(const Tensor& x) {
  detail::check_floating(x, "softmax", "x");
  if (x.dim() == 0) throw ShapeError("softmax: needs at least one dimension");
  Tensor xc = contiguous(x);
  Tensor y = empty_like(xc);
  backend_for(x).softmax_forward(xc, y);
  Tensor yd = y.detach();
  record("softmax", {x}, {y}, [yd](const TensorList& g) -> TensorList {
    Tensor dy = contiguous(g[0]);
    Tensor dx = empty_like(yd);
    backend_for(yd).softmax_backward(yd, dy, dx);
    return {dx};
  });
  return y;
}

namespace {
// doc_starts for T queries at positions [first, first + T) of each of B
// rows (causal_attention's: every row's, from 0): checked for `op` (shape,
// dtype and, read on the host where they are, the values) and moved to
// `device`.
Tensor checked_doc_starts(const Tensor& doc_starts, int64_t B, int64_t T, const Device& device,
                          const char* op = "causal_attention", int64_t first = 0) {
  if (!doc_starts.defined()) return {};
  if (doc_starts.dtype() != DType::I32 || doc_starts.dim() != 2 || doc_starts.size(0) != B ||
      doc_starts.size(1) != T) {
    throw ShapeError(std::string(op) + ": doc_starts must be i32 (" + std::to_string(B) + ", " +
                     std::to_string(T) + "), one per query, got " + dtype_name(doc_starts.dtype()) +
                     " " + shape_str(doc_starts.shape()));
  }
  Tensor c = contiguous(doc_starts).detach();
  if (c.device().is_cpu()) {
    const int32_t* p = c.data<int32_t>();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < T; ++i) {
        const int64_t s = p[b * T + i], t = first + i;
        // The first key the query at position t sees: never past t, never
        // before the previous query's (documents and sliding windows both
        // move forward).
        const int64_t lo = i == 0 ? 0 : p[b * T + i - 1];
        if (s < lo || s > t) {
          throw ValueError(std::string(op) + ": doc_starts[" + std::to_string(b) + ", " +
                           std::to_string(i) + "] is " + std::to_string(s) + "; expected " +
                           (t == 0 ? std::string("0")
                                   : "a first key in [" + std::to_string(lo) + ", " +
                                         std::to_string(t) +
                                         "] (the previous query's, up to the query's position)"));
        }
      }
    }
  }
  return c.device() == device ? c : to_device(c, device).detach();
}

// A fused (B, T, (q + 2 kv) D) qkv of `heads`, checked for `op`: returns D.
int64_t checked_head_dim(const Tensor& qkv, const AttentionHeads& heads, const char* op) {
  detail::check_floating(qkv, op, "qkv");
  detail::check_dim(qkv, 3, op, "qkv");
  return heads.head_dim(qkv.size(2), op);
}

// heads.window's promise checked where the first keys are on the host:
// each query's is exactly its window's (AttentionHeads::with_window).
void check_window_starts(const Tensor& starts, int64_t window, const char* op) {
  if (window <= 0 || !starts.defined() || !starts.device().is_cpu()) return;
  const int64_t B = starts.size(0), T = starts.size(1);
  const int32_t* p = starts.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t want = std::max<int64_t>(0, t - window + 1);
      if (p[b * T + t] != want) {
        throw ValueError(std::string(op) + ": heads promise a sliding window of " +
                         std::to_string(window) + " keys alone, but doc_starts[" +
                         std::to_string(b) + ", " + std::to_string(t) + "] is " +
                         std::to_string(p[b * T + t]) + ", not " + std::to_string(want));
      }
    }
  }
}
}  // namespace

Tensor causal_attention(const Tensor& qkv, AttentionHeads heads, const Tensor& doc_starts) {
  const int64_t C = heads.q * checked_head_dim(qkv, heads, "causal_attention");
  const int64_t B = qkv.size(0), T = qkv.size(1);
  const Tensor starts = checked_doc_starts(doc_starts, B, T, qkv.device());
  if (heads.window > 0 && doc_starts.defined() && doc_starts.device().is_cpu())
    check_window_starts(contiguous(doc_starts), heads.window, "causal_attention");
  Tensor qc = contiguous(qkv).detach();
  Tensor out = empty({B, T, C}, qkv.dtype(), qkv.device());
  Tensor lse = empty({B, heads.q, T}, stat_dtype(qkv.dtype()), qkv.device());
  backend_for(qkv).attention_forward(qc, heads, out, lse, starts);
  Tensor od = out.detach();
  record("causal_attention", {qkv}, {out},
         [qc, od, lse, heads, starts](const TensorList& g) -> TensorList {
           Tensor dout = contiguous(g[0]);
           Tensor dqkv = empty_like(qc);
           backend_for(qc).attention_backward(qc, od, lse, dout, heads, dqkv, starts);
           return {dqkv};
         });
  return out;
}

Tensor chunk_attention(const Tensor& q, const Tensor& kv, AttentionHeads heads,
                       const Tensor& doc_starts, int64_t query_start) {
  const char* op = "chunk_attention";
  detail::check_floating(q, op, "q");
  detail::check_dim(q, 3, op, "q");
  detail::check_dim(kv, 3, op, "kv");
  if (kv.dtype() != q.dtype() || kv.device() != q.device()) {
    throw ValueError(std::string(op) + ": q is " + dtype_name(q.dtype()) + " on " +
                     q.device().str() + ", kv " + dtype_name(kv.dtype()) + " on " +
                     kv.device().str() + " (expected the same)");
  }
  if (q.size(2) % std::max<int64_t>(heads.q, 1) != 0) {
    throw ShapeError(std::string(op) + ": q " + shape_str(q.shape()) + " does not hold " +
                     std::to_string(heads.q) + " whole query heads");
  }
  const int64_t D = heads.head_dim(heads.fused() * (q.size(2) / heads.q), op);
  const int64_t B = kv.size(0), T = kv.size(1), Tq = q.size(1);
  if (query_start < -1) {
    throw ValueError(std::string(op) + ": query_start " + std::to_string(query_start) +
                     " (expected the first query's position, >= 0, or -1: the last Tq of T)");
  }
  if (q.size(0) != B || kv.size(2) != 2 * heads.kv * D || (query_start < 0 && Tq > T)) {
    throw ShapeError(std::string(op) + ": q " + shape_str(q.shape()) + " and kv " +
                     shape_str(kv.shape()) + " (expected q (B, Tq, " + std::to_string(heads.q * D) +
                     ") and kv (B, T, " + std::to_string(2 * heads.kv * D) + ")" +
                     (query_start < 0 ? " with Tq <= T" : "") + ")");
  }
  const int64_t first = query_start < 0 ? T - Tq : query_start;
  const Tensor starts = checked_doc_starts(doc_starts, B, Tq, q.device(), op, first);
  Tensor qc = contiguous(q).detach();
  Tensor kvc = contiguous(kv).detach();
  Tensor out = empty({B, Tq, heads.q * D}, q.dtype(), q.device());
  Tensor lse = empty({B, heads.q, Tq}, stat_dtype(q.dtype()), q.device());
  backend_for(q).attention_parts_forward(qc, kvc, heads, first, out, lse, starts);
  Tensor od = out.detach();
  record(op, {q, kv}, {out},
         [qc, kvc, od, lse, heads, starts, first](const TensorList& g) -> TensorList {
           Tensor dout = contiguous(g[0]);
           Tensor dq = empty_like(qc);
           Tensor dkv = empty_like(kvc);
           backend_for(qc).attention_parts_backward(qc, kvc, od, lse, dout, heads, first, dq, dkv,
                                                    starts);
           return {dq, dkv};
         });
  return out;
}

namespace {
// The checks write_kv_cache and cached_attention share: qkv (B, n, fused D)
// and caches (B, kv, capacity, D) alike in dtype and device, no graph.
// Returns D.
int64_t check_cache_args(const char* op, const Tensor& qkv, const Tensor& k_cache,
                         const Tensor& v_cache, const AttentionHeads& heads) {
  const int64_t D = checked_head_dim(qkv, heads, op);
  detail::check_same(qkv, k_cache, op);
  detail::check_same(qkv, v_cache, op);
  detail::check_dim(k_cache, 4, op, "k_cache");
  const Shape cache{qkv.size(0), heads.kv, k_cache.size(2), D};
  if (k_cache.shape() != cache || v_cache.shape() != cache) {
    throw ShapeError(std::string(op) + ": k_cache " + shape_str(k_cache.shape()) + " and v_cache " +
                     shape_str(v_cache.shape()) + " must both be " + shape_str(cache) +
                     " (batch, key/value heads, capacity, head dim) for qkv " +
                     shape_str(qkv.shape()));
  }
  if (autograd::grad_enabled() &&
      (qkv.requires_grad() || k_cache.requires_grad() || v_cache.requires_grad())) {
    throw NotSupportedError(std::string(op) +
                            ": forward only (decoding) and has no backward; call it under "
                            "autograd::NoGradGuard or InferenceGuard");
  }
  return D;
}
}  // namespace

void write_kv_cache(const Tensor& qkv, AttentionHeads heads, int64_t start, Tensor& k_cache,
                    Tensor& v_cache) {
  const char* op = "write_kv_cache";
  const int64_t D = check_cache_args(op, qkv, k_cache, v_cache, heads);
  const int64_t n = qkv.size(1), capacity = k_cache.size(2);
  if (start < 0 || start + n > capacity) {
    throw ValueError(std::string(op) + ": slots [" + std::to_string(start) + ", " +
                     std::to_string(start + n) + ") for " + std::to_string(n) +
                     " new tokens are not in the cache's [0, " + std::to_string(capacity) + ")");
  }
  for (const Tensor* c : {&k_cache, &v_cache}) {
    if (c->strides()[3] != 1 || c->strides()[2] != D) {
      throw ShapeError(std::string(op) +
                       ": a cache's slots must each hold their D elements together, D apart "
                       "(got strides " +
                       shape_str(c->strides()) + ")");
    }
  }
  backend_for(qkv).write_kv_cache(contiguous(qkv).detach(), heads, start, k_cache, v_cache);
}

Tensor cached_attention(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                        int64_t length, AttentionHeads heads, int64_t window,
                        const Tensor& text_starts) {
  const char* op = "cached_attention";
  const int64_t D = check_cache_args(op, qkv, k_cache, v_cache, heads);
  const int64_t B = qkv.size(0), n = qkv.size(1), capacity = k_cache.size(2);
  if (n < 1 || length < n || length > capacity) {
    throw ValueError(std::string(op) + ": length " + std::to_string(length) + " for " +
                     std::to_string(n) + " new tokens in a cache of " + std::to_string(capacity) +
                     " slots (expected " + std::to_string(std::max<int64_t>(n, 1)) +
                     " <= length <= capacity)");
  }
  if (window < 0) {
    throw ValueError(std::string(op) + ": window " + std::to_string(window) +
                     " must be >= 0 (0: none)");
  }
  Tensor starts;
  if (text_starts.defined()) {
    detail::check_index(text_starts, op, "text_starts");
    if (text_starts.shape() != Shape{B}) {
      throw ShapeError(std::string(op) + ": text_starts must be (" + std::to_string(B) + "), got " +
                       shape_str(text_starts.shape()));
    }
    starts = contiguous(cast(text_starts, DType::I32)).detach();
    if (starts.device().is_cpu()) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t t = starts.data<int32_t>()[b];
        if (t < 0 || t > length) {
          throw ValueError(std::string(op) + ": text_starts[" + std::to_string(b) + "] is " +
                           std::to_string(t) + "; expected a slot in [0, " +
                           std::to_string(length) + "]");
        }
      }
    }
    if (!(starts.device() == qkv.device())) starts = to_device(starts, qkv.device()).detach();
  }
  // The slots attended over, read in place when each slot's D elements lie
  // together (a cache as KvCache allocates it).
  auto slots = [&](const Tensor& c) {
    Tensor s = narrow(c, 2, 0, length).detach();
    return s.strides()[3] == 1 && s.strides()[2] == D ? s : contiguous(s).detach();
  };
  Tensor out = empty({B, n, heads.q * D}, qkv.dtype(), qkv.device());
  backend_for(qkv).cached_attention_forward(contiguous(qkv).detach(), slots(k_cache),
                                            slots(v_cache), heads, window, starts, out);
  return out;
}

Tensor rotary_embedding(const Tensor& qkv, AttentionHeads heads, const Tensor& positions,
                        int64_t start, double theta, const RopeScaling& requested) {
  const int64_t D = checked_head_dim(qkv, heads, "rotary_embedding");
  const int64_t B = qkv.size(0), T = qkv.size(1);
  if (D % 2 != 0) {
    throw ShapeError("rotary_embedding: the head dimension (" + std::to_string(D) +
                     ", qkv's last dim " + std::to_string(qkv.size(2)) + " over " +
                     std::to_string(heads.fused()) + " heads) must be an even head dimension");
  }
  if (!(theta > 0.0) || !std::isfinite(theta)) {
    throw ValueError("rotary_embedding: theta (" + std::to_string(theta) +
                     ") must be a positive number");
  }
  if (requested.rotary_dim != 0 &&
      (requested.rotary_dim < 2 || requested.rotary_dim > D || requested.rotary_dim % 2 != 0)) {
    throw ValueError("rotary_embedding: rotary_dim (" + std::to_string(requested.rotary_dim) +
                     ") must be an even number of the head's " + std::to_string(D) +
                     " dimensions (0: all)");
  }
  if (const std::string why = rope_scaling_problem(requested, D); !why.empty())
    throw ValueError("rotary_embedding: " + why);
  // longrope's factors are the pass's: long ones when its last position,
  // start + T - 1 (the longest row's under left padding; a bound under
  // document resets), is past the original context.
  const RopeScaling scaling = requested.with_positions_up_to(start + T);
  if (start < 0) {
    throw ValueError("rotary_embedding: start (" + std::to_string(start) + ") must be >= 0");
  }
  Tensor pos;
  if (positions.defined()) {
    detail::check_index(positions, "rotary_embedding", "positions");
    if (positions.dim() != 2 || positions.size(0) != B || positions.size(1) != T) {
      throw ShapeError("rotary_embedding: positions must be (" + std::to_string(B) + ", " +
                       std::to_string(T) + "), got " + shape_str(positions.shape()));
    }
    pos = contiguous(cast(positions, DType::I64)).detach();
    if (pos.device().is_cpu()) {
      const int64_t* p = pos.data<int64_t>();
      for (int64_t i = 0; i < pos.numel(); ++i) {
        if (p[i] < 0) {
          throw ValueError("rotary_embedding: positions[" + std::to_string(i / T) + ", " +
                           std::to_string(i % T) + "] is " + std::to_string(p[i]) +
                           "; expected >= 0");
        }
      }
    }
    if (!(pos.device() == qkv.device())) pos = to_device(pos, qkv.device()).detach();
  }
  Tensor qc = contiguous(qkv);
  Tensor out = empty_like(qc);
  backend_for(qc).rotary_embedding(qc, heads, pos, start, theta, scaling, false, out);
  record("rotary_embedding", {qkv}, {out},
         [pos, heads, start, theta, scaling](const TensorList& g) -> TensorList {
           Tensor dout = contiguous(g[0]);
           Tensor dqkv = empty_like(dout);
           backend_for(dout).rotary_embedding(dout, heads, pos, start, theta, scaling, true, dqkv);
           return {dqkv};
         });
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  detail::check_floating(weight, "embedding", "weight");
  detail::check_index(ids, "embedding", "ids");
  detail::check_dim(weight, 2, "embedding", "weight");
  // Ids may also stay on the host with the weight on a GPU: the backend then
  // checks them (and, in backward, groups them) without a copy back from the
  // device, which would make the host wait for all the queued work.
  if (!(ids.device() == weight.device()) && !ids.device().is_cpu()) {
    throw ValueError("embedding: ids on " + ids.device().str() + ", weight on " +
                     weight.device().str() + " (ids go on the weight's device or the host)");
  }
  const int64_t C = weight.size(1);
  Tensor ic = contiguous(ids).detach();
  Tensor wc = contiguous(weight);
  Shape out_shape = ids.shape();
  out_shape.push_back(C);
  Tensor out = empty(out_shape, weight.dtype(), weight.device());
  backend_for(weight).embedding_forward(wc, ic, out);
  const Shape ws = weight.shape();
  const DType dt = weight.dtype();
  const Device dev = weight.device();
  const Tensor leaf = weight.requires_grad() && weight.is_leaf() ? weight : Tensor();
  // The weight's gradient is the whole backward (the ids take none): a
  // split backward (zero-bubble W) defers it with a linear layer's, so a
  // pipeline adds a stage's embedding gradients in its W passes, in
  // microbatch order, wherever its B passes fall.
  detail::record_layer(
      "embedding", {weight}, {out}, {0}, [](const TensorList&) -> TensorList { return {Tensor()}; },
      [ws, dt, dev, C, leaf](const Tensor& ids, const TensorList& g) -> TensorList {
        Tensor dout = contiguous(g[0]);
        const Tensor rows = make_view(dout, {ids.numel(), C}, {C, 1}, dout.offset());
        // A leaf weight's gradient takes the rows the ids touch, added in place
        // (no dense gradient of the whole table, no add after).
        if (autograd::accumulate_into_leaf_grad(leaf, [&](Tensor& acc, double beta) {
              backend_for(acc).embedding_backward_into(ids, rows, acc, beta);
            })) {
          return {Tensor()};
        }
        Tensor dw = empty(ws, dt, dev);
        backend_for(dw).embedding_backward(ids, rows, dw);
        return {dw};
      },
      ic, nullptr);
  return out;
}

Tensor index_add_rows(const Tensor& src, const Tensor& index, int64_t rows) {
  detail::check_floating(src, "index_add_rows", "src");
  detail::check_index(index, "index_add_rows", "index");
  detail::check_dim(src, 2, "index_add_rows", "src");
  if (index.dim() != 1 || index.size(0) != src.size(0)) {
    throw ShapeError("index_add_rows: index " + shape_str(index.shape()) + " for src " +
                     shape_str(src.shape()) + " (expected one index per row of src)");
  }
  if (rows < 0)
    throw ValueError("index_add_rows: rows (" + std::to_string(rows) + ") must be >= 0");
  if (!(index.device() == src.device()) && !index.device().is_cpu()) {
    throw ValueError("index_add_rows: index on " + index.device().str() + ", src on " +
                     src.device().str() + " (the index goes on src's device or the host)");
  }
  if (!(index.device() == src.device() && !index.device().is_cpu() &&
        backend_for(src).checks_indices_on_device(src.device()))) {
    // The backends add row by row through the index: one outside the
    // output would write past it. (Inside a capture, or a
    // cuda::DeviceChecks, the device's index is checked by the backend, and
    // a bad one reported by cuda::Graph::check or DeviceChecks::check.)
    const Tensor host = contiguous(cast(to_device(index, Device::cpu()), DType::I64));
    const int64_t* p = host.data<int64_t>();
    for (int64_t i = 0; i < host.numel(); ++i) {
      if (p[i] < 0 || p[i] >= rows) {
        throw ValueError("index_add_rows: index " + std::to_string(p[i]) + " at position " +
                         std::to_string(i) + " is outside [0, " + std::to_string(rows) + ")");
      }
    }
  }
  const int64_t M = src.size(0), C = src.size(1);
  Tensor ic = contiguous(index).detach();
  Tensor sc = contiguous(src);
  Tensor out = empty({rows, C}, src.dtype(), src.device());
  if (M == 0) {
    backend_for(out).fill(out, 0.0);
  } else {
    backend_for(out).embedding_backward(ic, sc, out);  // dweight's sums, rows in index order
  }
  record("index_add_rows", {src}, {out}, [ic, M, C](const TensorList& g) -> TensorList {
    Tensor dout = contiguous(g[0]);
    Tensor dsrc = empty({M, C}, dout.dtype(), dout.device());
    if (M > 0) backend_for(dout).embedding_forward(dout, ic, dsrc);
    return {dsrc};
  });
  return out;
}

Tensor attach_loss(const Tensor& x, const Tensor& loss, double grad) {
  detail::check_defined(x, "attach_loss", "x");
  detail::check_floating(loss, "attach_loss", "loss");
  if (loss.numel() != 1) {
    throw ShapeError("attach_loss: loss " + shape_str(loss.shape()) +
                     " must hold one element (a scalar loss)");
  }
  Tensor y = make_view(x, x.shape(), x.strides(), x.offset());
  const Shape shape = loss.shape();
  const DType dtype = loss.dtype();
  const Device device = loss.device();
  record("attach_loss", {x, loss}, {y}, [shape, dtype, device, grad](const TensorList& g) {
    return TensorList{g[0], full(shape, grad, dtype, device)};
  });
  return y;
}

Tensor attach_loss(const Tensor& x, const Tensor& loss, const Tensor& grad) {
  detail::check_defined(x, "attach_loss", "x");
  detail::check_floating(loss, "attach_loss", "loss");
  if (loss.numel() != 1 || grad.numel() != 1 || grad.dtype() != loss.dtype() ||
      grad.device() != loss.device()) {
    throw ShapeError("attach_loss: loss " + shape_str(loss.shape()) + " " +
                     dtype_name(loss.dtype()) + " on " + loss.device().str() + " and its weight " +
                     shape_str(grad.shape()) + " " + dtype_name(grad.dtype()) + " on " +
                     grad.device().str() +
                     " (expected one element each, of one dtype on one device)");
  }
  Tensor y = make_view(x, x.shape(), x.strides(), x.offset());
  const Tensor weight = reshape(grad.detach(), loss.shape()).detach();
  record("attach_loss", {x, loss}, {y}, [weight](const TensorList& g) {
    return TensorList{g[0], clone(weight)};
  });
  return y;
}

namespace {

// What the backward of a cross entropy over logits (N, V) needs (never the
// loss itself: a backward closure holding its own output would keep the
// graph alive in a cycle).
struct CrossEntropyParts {
  Tensor targets;  // (N) on the logits' device
  Tensor lse;      // (N) log-sum-exp per row, stat dtype
  int64_t count = 0;
  // Inside a CUDA graph's capture: 1 / count on the device (one element of
  // the stat dtype), which `count` then does not hold.
  Tensor inv_count;
  // Nonzero: the forward pass already wrote the logits' gradient for a
  // loss gradient of this value (cross_entropy_forward's expected_grad).
  double ahead = 0.0;
  // Nonzero: a z-loss's gradient comes with the loss's, each row's dlse
  // (lse * dloss) * z_scale (twice its coefficient); 0: from the z-loss
  // output's own gradient, when it has one.
  double z_scale = 0.0;
};

// Each row's loss gradient (N, stat dtype) from the mean loss's gradient g
// (a scalar): g / count, formed on g's device in one way for a gradient
// that came and one expected ahead, so that both give the same bits.
// With the count on the device (ce.inv_count), g times that inverse: the
// same product, the same bits.
Tensor row_grads(const Tensor& g, int64_t N, const CrossEntropyParts& ce, DType sd) {
  Tensor gl = cast(g, sd);
  Tensor dl = empty({N}, sd, gl.device());
  backend_for(gl).copy(make_view(gl, {N}, {0}, gl.offset()), dl);
  if (ce.inv_count.defined()) {
    const Tensor inv = ce.inv_count;
    backend_for(dl).binary(BinaryOp::Mul, dl, make_view(inv, {N}, {0}, inv.offset()), dl);
    return dl;
  }
  const double mean = ce.count ? 1.0 / static_cast<double>(ce.count) : 0.0;
  backend_for(dl).affine(dl, mean, 0.0, dl);
  return dl;
}

// The mean loss over the rows not ignored of logits (N, V) — contiguous, or
// rows padded further apart — against targets (N), into *loss, and (when
// z_loss is not null) the mean of their squared log-sum-exp into *z_loss.
// z_coef > 0 (with z_loss): the z-loss joins the loss's gradient with that
// weight (backward differentiates loss + z_coef * z-loss); 0: it has a
// gradient of its own. expected_grad nonzero (and no z-loss of its own):
// the gradient the loss will get in backward, with which the logits'
// gradient is written over them now, in the same backend call
// (Backend::cross_entropy_forward_backward, softcap as for the backward);
// cross_entropy_backward then only checks it.
CrossEntropyParts cross_entropy_forward(const char* op, const Tensor& lc, const Tensor& tc,
                                        int64_t ignore_index, Tensor* loss,
                                        Tensor* z_loss = nullptr, double expected_grad = 0.0,
                                        double softcap = 0.0, double z_coef = 0.0) {
  const int64_t N = lc.size(0), V = lc.size(1);
  CrossEntropyParts r;
  std::vector<double> keep;  // with a z-loss: 1 for the rows counted, 0 for the others
  const DType sd = stat_dtype(lc.dtype());
  Backend& be = backend_for(lc);
  const bool capturing = be.capturing(lc.device());
  if (capturing) {
    // A CUDA graph's capture cannot read the targets: they are counted and
    // checked on the device (a bad one is reported by cuda::Graph::check).
    if (tc.device() != lc.device()) {
      throw NotSupportedError(std::string(op) + ": targets on " + tc.device().str() +
                              " inside a CUDA graph's capture (expected them on the logits' " +
                              "device " + lc.device().str() + ", refilled before each replay)");
    }
    r.inv_count = empty({}, sd, lc.device());
    be.inverse_target_count(tc, ignore_index, V, r.inv_count, op);
  } else {
    Tensor th = cast(to_device(tc, Device::cpu()), DType::I64);
    const int64_t* p = th.data<int64_t>();
    if (z_loss) keep.assign(static_cast<size_t>(N), 0.0);
    for (int64_t i = 0; i < N; ++i) {
      if (p[i] == ignore_index) continue;
      if (p[i] < 0 || p[i] >= V) {
        throw ValueError(std::string(op) + ": target " + std::to_string(p[i]) + " at row " +
                         std::to_string(i) + " is outside [0, " + std::to_string(V) + ")");
      }
      ++r.count;
      if (z_loss) keep[static_cast<size_t>(i)] = 1.0;
    }
  }
  r.targets = tc.device() == lc.device() ? tc : to_device(tc, lc.device()).detach();
  Tensor losses = empty({N}, sd, lc.device());
  r.lse = empty({N}, sd, lc.device());
  if (z_loss && z_coef > 0) r.z_scale = 2.0 * z_coef;
  if (expected_grad != 0.0 && (!z_loss || r.z_scale != 0.0)) {
    const Tensor dl = row_grads(full({}, expected_grad, sd, lc.device()), N, r, sd);
    Tensor dlogits = lc;  // (the logits, overwritten)
    be.cross_entropy_forward_backward(lc, r.targets, ignore_index, losses, r.lse, dl, dlogits,
                                      softcap, r.z_scale);
    r.ahead = expected_grad;
  } else {
    be.cross_entropy_forward(lc, r.targets, ignore_index, losses, r.lse);
  }
  Tensor total = empty({}, sd, lc.device());
  be.reduce(ReduceOp::Sum, losses, 1, N, 1, total, nullptr);
  const double mean = r.count ? 1.0 / static_cast<double>(r.count) : 0.0;
  *loss = r.inv_count.defined() ? mul(total, r.inv_count).detach()
                                : cast(scale(total, mean), sd).detach();  // f32 for half logits
  if (z_loss) {
    // The mean of the counted rows' squared log-sum-exp: their sum (the
    // ignored rows' squares times 0) times 1 / count, formed as the loss's.
    // Inside a capture the rows' marks come from the targets on the device.
    Tensor counted;  // 1 for the rows counted, 0 for the others; undefined: all
    if (capturing) {
      Tensor ignored = empty({N}, sd, lc.device());
      be.binary(BinaryOp::Eq, cast(r.targets, sd),
                full({N}, static_cast<double>(ignore_index), sd, lc.device()), ignored);
      be.affine(ignored, -1.0, 1.0, ignored);
      counted = ignored;
    } else if (r.count < N) {
      counted = from_vector(keep, {N}, sd, lc.device());
    }
    Tensor squares = mul(r.lse, r.lse);
    if (counted.defined()) squares = mul(squares, counted);
    Tensor z = empty({}, sd, lc.device());
    be.reduce(ReduceOp::Sum, squares, 1, N, 1, z, nullptr);
    *z_loss = (r.inv_count.defined() ? mul(z, r.inv_count) : cast(scale(z, mean), sd)).detach();
  }
  return r;
}

// dlogits (lc's layout; may be lc itself) from the gradients g of the mean
// loss and (g[1], when there) of the z-loss. softcap > 0: lc holds
// soft-capped logits, and dlogits is with respect to the uncapped ones.
// (A gradient written ahead is lc's, in place: dlogits must be lc; the
// gradient that came rescales it on the device when it is not the one
// expected.)
void cross_entropy_backward(const Tensor& lc, const CrossEntropyParts& ce, int64_t ignore_index,
                            const TensorList& g, Tensor& dlogits, double softcap = 0.0) {
  const int64_t N = lc.size(0);
  const DType sd = stat_dtype(lc.dtype());
  if (ce.ahead != 0.0) {
    if (dlogits.raw_data() != lc.raw_data() || dlogits.strides() != lc.strides()) {
      throw NotSupportedError(
          "cross_entropy: a gradient written in the forward pass lies over "
          "the logits; backward must write there too");
    }
    backend_for(lc).scale_by_ratio(cast(g[0], sd), ce.ahead, dlogits);
    return;
  }
  const Tensor dl = row_grads(g[0], N, ce, sd);
  // (The backend gives ignored rows no gradient: dlse needs no mask.) The
  // z-loss's own gradient: grad_z * 2 * lse_i / count, its count the
  // loss's (the device's inside a capture).
  Tensor dlse;
  if (ce.z_scale != 0.0) {
    dlse = joined_z_loss_dlse(ce.lse, dl, ce.z_scale);
  } else if (g.size() > 1 && g[1].defined()) {
    dlse = mul(row_grads(g[1], N, ce, sd), ce.lse);
    backend_for(dlse).affine(dlse, 2.0, 0.0, dlse);
  }
  backend_for(lc).cross_entropy_backward(lc, ce.targets, ce.lse, dl, dlse, ignore_index, dlogits,
                                         softcap);
}

// targets must be the leading dims of a (..., last) tensor, on its device
// or the host.
void check_targets(const char* op, const Tensor& targets, const Tensor& input, const Shape& lead) {
  if (targets.shape() != lead) {
    throw ShapeError(std::string(op) + ": targets of shape " + shape_str(targets.shape()) +
                     " do not match " + shape_str(input.shape()) + " (expected " + shape_str(lead) +
                     ")");
  }
  if (!(targets.device() == input.device()) && !targets.device().is_cpu()) {
    throw ValueError(std::string(op) + ": targets on " + targets.device().str() + ", input on " +
                     input.device().str() + " (targets go on its device or the host)");
  }
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                     Tensor* z_loss) {
  detail::check_floating(logits, "cross_entropy", "logits");
  detail::check_index(targets, "cross_entropy", "targets");
  if (logits.dim() < 1) throw ShapeError("cross_entropy: logits must have a vocab dimension");
  const Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  // Targets may also stay on the host with the logits on a GPU (their check
  // then needs no copy back from the device).
  check_targets("cross_entropy", targets, logits, lead);
  const int64_t V = logits.size(-1), N = numel(lead);
  Tensor lc = reshape(contiguous(logits).detach(), {N, V}).detach();
  Tensor tc = reshape(contiguous(targets).detach(), {N}).detach();
  Tensor loss;
  const CrossEntropyParts ce =
      cross_entropy_forward("cross_entropy", lc, tc, ignore_index, &loss, z_loss);
  const Shape ls = logits.shape();
  TensorList outputs{loss};
  if (z_loss) outputs.push_back(*z_loss);
  record("cross_entropy", {logits}, outputs,
         [lc, ce, ignore_index, ls](const TensorList& g) -> TensorList {
           Tensor dlogits = empty_like(lc);
           cross_entropy_backward(lc, ce, ignore_index, g, dlogits);
           return {reshape(dlogits, ls)};
         });
  if (z_loss) *z_loss = outputs[1];
  return outputs[0];
}

int64_t padded_logits_row(int64_t classes) {
  constexpr int64_t kRow = 64;  // elements: 128 bytes of bf16, 256 of f32
  return (classes + kRow - 1) / kRow * kRow;
}

Tensor joined_z_loss_dlse(const Tensor& lse, const Tensor& dloss, double z_scale) {
  Tensor d = empty(lse.shape(), lse.dtype(), lse.device());
  backend_for(lse).binary(BinaryOp::Mul, lse, dloss, d);
  backend_for(d).affine(d, z_scale, 0.0, d);
  return d;
}

std::vector<Tensor> linear_head_loss(const char* op, const Tensor& x, const Tensor& weight,
                                     const Tensor& bias,
                                     const std::function<HeadLoss(const Tensor& logits)>& loss_of,
                                     double softcap, const InputGradComm& comm) {
  check_softcap(op, softcap);
  detail::check_floating(x, op, "x");
  detail::check_same(x, weight, op);
  const InputGradComm* through = detail::checked_comm(op, x, comm);
  if (x.dim() < 1 || weight.dim() != 2 || weight.size(1) != x.size(-1) || weight.size(0) == 0 ||
      weight.size(1) == 0) {
    throw ShapeError(std::string(op) + ": x " + shape_str(x.shape()) + " and weight " +
                     shape_str(weight.shape()) +
                     " (weight must be [classes, C], classes and C > 0, C the last dim of x)");
  }
  const bool has_bias = bias.defined();
  if (has_bias) {
    detail::check_same(weight, bias, op);
    if (bias.dim() != 1 || bias.size(0) != weight.size(0)) {
      throw ShapeError(std::string(op) + ": bias " + shape_str(bias.shape()) + " for weight " +
                       shape_str(weight.shape()) + " (expected [classes], one per weight row)");
    }
  }
  const int64_t C = x.size(-1), N = x.numel() / C, V = weight.size(0), ld = padded_logits_row(V);
  Tensor x2 = reshape(contiguous(x).detach(), {N, C}).detach();
  Tensor w = contiguous(weight).detach();
  // The logits' rows `ld` apart: every GEMM here has aligned leading
  // dimensions whatever V is. Only this op and its loss ever see them.
  // With a bias, the padding columns start at zero: the bias's gradient
  // sums whole rows of the buffer, padding included, and drops the padding.
  Tensor rows = has_bias && ld != V ? zeros({N, ld}, x.dtype(), x.device())
                                    : empty({N, ld}, x.dtype(), x.device());
  Tensor logits = make_view(rows, {N, V}, {ld, 1}, 0);
  if (has_bias) backend_for(x).copy(expand(bias.detach(), {N, V}), logits);
  // A vocabulary that is not a multiple of the row (GPT-2's 50257): the
  // forward and input-gradient GEMMs run over whole rows against a copy of
  // the weight padded with zero rows, so that neither has an odd extent (on
  // the H200 cuBLASLt took those two 8 times longer: 19 ms of a 50 ms GPT-2
  // 124M step). The padding columns of the logits are then exactly zero, as
  // they stay through the loss's backward, and add nothing to the input's
  // gradient. The weight's gradient keeps V rows.
  Tensor w_rows = w;
  if (ld != V) {
    w_rows = empty({ld, C}, w.dtype(), w.device());
    Tensor kept = narrow(w_rows, 0, 0, V), padding = narrow(w_rows, 0, V, ld - V);
    backend_for(x).copy(w, kept);
    backend_for(x).fill(padding, 0.0);
  }
  backend_for(x).gemm(x2, w_rows, rows, false, true, 1.0, has_bias ? 1.0 : 0.0);
  if (softcap > 0) backend_for(x).soft_cap(logits, softcap, logits);  // in place
  HeadLoss head = loss_of(logits);

  // Backward overwrites the logits with their gradient (no second buffer of
  // that size); the weight's half (deferrable, as a linear layer's) reads
  // it after. The graph can therefore be walked once.
  auto consumed = std::make_shared<bool>(false);
  auto input_grad = [logits, rows, w_rows, consumed, backward = std::move(head.backward),
                     name = std::string(op),
                     need_x = (comm.start ? comm.source : x).requires_grad(),
                     xs = x.shape()](const TensorList& g) -> TensorList {
    if (*consumed) {
      throw NotSupportedError(name +
                              ": backward through it a second time (retain_graph): its logits "
                              "were overwritten by their gradient the first time");
    }
    Tensor dlogits = logits;
    backward(g, dlogits);
    *consumed = true;
    if (!need_x) return {Tensor(), Tensor(), Tensor()};
    Tensor gx = empty({rows.size(0), w_rows.size(1)}, rows.dtype(), rows.device());
    backend_for(rows).gemm(rows, w_rows, gx, false, false, 1.0, 0.0);
    return {reshape(gx, xs), Tensor(), Tensor()};
  };
  const Tensor leaf_weight = weight.requires_grad() && weight.is_leaf() ? weight : Tensor();
  const Tensor leaf_bias = has_bias && bias.requires_grad() && bias.is_leaf() ? bias : Tensor();
  auto weight_grad = [logits, rows, leaf_weight, leaf_bias, need_w = weight.requires_grad(),
                      need_b = has_bias && bias.requires_grad()](const Tensor& x2,
                                                                 const TensorList&) -> TensorList {
    // (logits hold their gradient by now: input_grad always runs first.)
    Tensor gw, gb;
    const bool added =
        !need_w || autograd::accumulate_into_leaf_grad(leaf_weight, [&](Tensor& acc, double beta) {
          backend_for(logits).gemm(logits, x2, acc, true, false, 1.0, beta);
        });
    if (!added) {
      gw = empty({logits.size(1), x2.size(1)}, logits.dtype(), logits.device());
      backend_for(logits).gemm(logits, x2, gw, true, false, 1.0, 0.0);
    }
    // The bias's: column sums of the padded rows (their padding zero), the
    // classes' kept. Summed in the gradient buffer's dtype (f32 under half
    // logits), then added to it.
    const int64_t V = logits.size(1);
    auto column_sums = [&](DType dtype) {
      Tensor sums = empty({rows.size(1)}, dtype, rows.device());
      backend_for(rows).sum_rows_into(rows, sums, 0.0);
      return narrow(sums, 0, 0, V);
    };
    const bool bias_added =
        !need_b || autograd::accumulate_into_leaf_grad(leaf_bias, [&](Tensor& acc, double beta) {
          const Tensor sums = column_sums(acc.dtype());
          if (beta == 0.0) {
            backend_for(acc).copy(sums, acc);
          } else {
            backend_for(acc).accumulate(sums, acc);
          }
        });
    if (!bias_added) gb = contiguous(column_sums(logits.dtype()));
    return {Tensor(), gw, gb};
  };
  TensorList inputs{x, weight};
  std::vector<int> deferrable{1};
  if (has_bias) {
    inputs.push_back(bias);
    deferrable.push_back(2);
  }
  TensorList outputs{head.loss};
  if (head.z_loss.defined()) outputs.push_back(head.z_loss);
  detail::record_layer(op, inputs, outputs, deferrable, input_grad, weight_grad, x2, through);
  return outputs;
}

Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets,
                            int64_t ignore_index, double softcap, const Tensor& bias,
                            Tensor* z_loss, double expected_grad, double z_loss_coef) {
  const char* op = "linear_cross_entropy";
  detail::check_index(targets, op, "targets");
  check_z_loss_coef(op, z_loss_coef);
  if (x.dim() < 1) throw ShapeError(std::string(op) + ": x must have a feature dimension");
  const Shape lead(x.shape().begin(), x.shape().end() - 1);
  check_targets(op, targets, x, lead);
  Tensor tc = reshape(contiguous(targets).detach(), {numel(lead)}).detach();
  const double ahead = head_grad_ahead(x, weight, bias, expected_grad);
  const TensorList out = linear_head_loss(
      op, x, weight, bias,
      [&](const Tensor& logits) {
        return cross_entropy_head(op, logits, tc, ignore_index, softcap, z_loss, ahead,
                                  z_loss_coef);
      },
      softcap);
  if (z_loss && z_loss_coef == 0.0) *z_loss = out[1];
  return out[0];
}

void check_z_loss_coef(const char* op, double z_loss_coef) {
  if (!(z_loss_coef >= 0.0) || !std::isfinite(z_loss_coef)) {
    throw ValueError(std::string(op) + ": z_loss_coef " + std::to_string(z_loss_coef) +
                     " (expected a finite value >= 0)");
  }
}

double head_grad_ahead(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       double expected_grad) {
  const bool grads = autograd::grad_enabled() && (x.requires_grad() || weight.requires_grad() ||
                                                  (bias.defined() && bias.requires_grad()));
  return grads ? expected_grad : 0.0;
}

HeadLoss cross_entropy_head(const char* op, const Tensor& logits, const Tensor& targets,
                            int64_t ignore_index, double softcap, Tensor* z_loss,
                            double expected_grad, double z_loss_coef) {
  if (logits.dim() != 2 || targets.numel() != logits.size(0)) {
    throw ShapeError(std::string(op) + ": " + std::to_string(targets.numel()) +
                     " targets for logits " + shape_str(logits.shape()) +
                     " (expected (N, classes) and N targets)");
  }
  const Tensor tc = reshape(contiguous(targets).detach(), {logits.size(0)}).detach();
  Tensor loss, z;
  CrossEntropyParts ce =
      cross_entropy_forward(op, logits, tc, ignore_index, &loss, z_loss ? &z : nullptr,
                            expected_grad, softcap, z_loss_coef);
  // A z-loss joining the loss's gradient is a value beside it; one with a
  // gradient of its own, the op's second output.
  if (z_loss && z_loss_coef > 0) {
    *z_loss = z;
    z = Tensor();
  }
  return HeadLoss{
      loss, z, [ce = std::move(ce), ignore_index, softcap](const TensorList& g, Tensor& dlogits) {
        cross_entropy_backward(dlogits, ce, ignore_index, g, dlogits, softcap);
      }};
}

}  // namespace triad
