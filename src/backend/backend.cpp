#include "triad/backend/backend.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "backend/expert_choice.h"
#include "cpu/cpu_backend.h"
#include "cpu/half_adapter.h"
#ifdef TRIAD_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace triad {

namespace {

// A gradient buffer for parameters of dtype `param`: that dtype, or f32 for
// bf16/f16 ones.
void check_grad_buffer(const char* op, DType param, const Tensor& buffer, const Shape& shape) {
  if (buffer.shape() != shape) {
    throw ShapeError(std::string(op) + ": gradient buffer " + shape_str(buffer.shape()) +
                     ", expected " + shape_str(shape));
  }
  if (buffer.dtype() != param && !(is_half(param) && buffer.dtype() == DType::F32)) {
    throw ValueError(std::string(op) + ": " + dtype_name(buffer.dtype()) + " gradient buffer for " +
                     dtype_name(param) + " values (expected the same dtype, or f32 for bf16/f16)");
  }
}

// t in dtype d: t itself, or a converted copy (half values widen exactly).
Tensor as_dtype(Backend& be, const Tensor& t, DType d) {
  if (t.dtype() == d) return t;
  Tensor w = empty(t.shape(), d, t.device());
  be.copy(t, w);
  return w;
}

// acc = beta * acc + part.
void add_scaled_into(Backend& be, const Tensor& part, Tensor& acc, double beta) {
  if (beta == 0.0) {
    be.copy(part, acc);
    return;
  }
  if (beta != 1.0) be.affine(acc, beta, 0.0, acc);
  be.binary(BinaryOp::Add, acc, part, acc);
}

}  // namespace

void Backend::arange(Tensor& dst, int64_t start) {
  if (!dst.is_contiguous() || (dst.dtype() != DType::I64 && dst.dtype() != DType::I32)) {
    throw ValueError("arange: destination must be a contiguous i32 or i64 tensor, got " +
                     std::string(dtype_name(dst.dtype())));
  }
  Tensor host = empty(dst.shape(), DType::I64, Device::cpu());
  int64_t* p = host.data<int64_t>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = start + i;
  copy(host, dst);
}

void check_document_starts(const Tensor& ids, int64_t window, const Tensor& starts,
                           const Tensor* positions) {
  if (ids.dim() != 2 || (ids.dtype() != DType::I32 && ids.dtype() != DType::I64) ||
      !ids.is_contiguous()) {
    throw ShapeError("document_starts: ids " + shape_str(ids.shape()) + " " +
                     dtype_name(ids.dtype()) + " (expected contiguous (B, T) i32 or i64)");
  }
  if (window < 0) {
    throw ValueError("document_starts: window " + std::to_string(window) + " (expected >= 0)");
  }
  const auto check_out = [&ids](const Tensor& t, DType dtype, const char* what) {
    if (t.shape() != ids.shape() || t.dtype() != dtype || !t.is_contiguous()) {
      throw ShapeError(std::string("document_starts: ") + what + " " + shape_str(t.shape()) + " " +
                       dtype_name(t.dtype()) + " (expected contiguous " + shape_str(ids.shape()) +
                       " " + dtype_name(dtype) + ")");
    }
  };
  check_out(starts, DType::I32, "starts");
  if (positions) check_out(*positions, DType::I64, "positions");
}

void Backend::document_starts(const Tensor& ids, int64_t eod, int64_t window, Tensor& starts,
                              Tensor* positions) {
  check_document_starts(ids, window, starts, positions);
  const int64_t B = ids.size(0), T = ids.size(1);
  Tensor host = empty({B, T}, DType::I64, Device::cpu());
  copy(ids, host);  // (to the host, as i64)
  const int64_t* p = host.data<int64_t>();
  Tensor s = empty({B, T}, DType::I32, Device::cpu());
  Tensor pos = empty({B, T}, DType::I64, Device::cpu());
  int32_t* ps = s.data<int32_t>();
  int64_t* pp = pos.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t doc = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = b * T + t;
      ps[i] = static_cast<int32_t>(window > 0 ? std::max(doc, t - window + 1) : doc);
      pp[i] = t - doc;
      if (p[i] == eod) doc = t + 1;  // the next token starts a document
    }
  }
  copy(s, starts);
  if (positions) copy(pos, *positions);
}

void Backend::inverse_target_count(const Tensor& targets, int64_t, int64_t, Tensor& inv,
                                   const char* op) {
  // (Outside a capture the loss counts its targets on the host, where it
  // checks them: cross_entropy_forward.)
  throw NotSupportedError(std::string(op) + ": counting targets on " + targets.device().str() +
                          " for " + inv.device().str() +
                          " (only a CUDA device capturing a graph counts them there)");
}

void Backend::vocab_shard_ids(const Tensor& ids, int64_t, int64_t, int64_t, Tensor& local, Tensor&,
                              const char* op) {
  throw NotSupportedError(std::string(op) + ": a vocabulary shard's ids from " +
                          ids.device().str() + " on " + local.device().str() +
                          " (only a CUDA device capturing a graph forms them there)");
}

void Backend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y,
                             Tensor* gelu_input) {
  Tensor& pre = gelu_input ? *gelu_input : y;
  double beta = 0.0;
  if (bias.defined()) {
    // Bias broadcast over the rows, then accumulated onto by the product.
    copy(make_view(bias, {pre.size(0), pre.size(1)}, {0, 1}, bias.offset()), pre);
    beta = 1.0;
  }
  gemm(x, w, pre, false, true, 1.0, beta);
  if (gelu_input) gelu_forward(pre, y, GeluForm::Tanh);
}

void Backend::cross_entropy_forward_backward(const Tensor& logits, const Tensor& targets,
                                             int64_t ignore_index, Tensor& losses, Tensor& lse,
                                             const Tensor& dlosses, Tensor& dlogits, double softcap,
                                             double z_scale) {
  cross_entropy_forward(logits, targets, ignore_index, losses, lse);
  Tensor dlse;
  if (z_scale != 0.0) {
    dlse = empty(lse.shape(), lse.dtype(), lse.device());
    binary(BinaryOp::Mul, lse, dlosses, dlse);
    affine(dlse, z_scale, 0.0, dlse);
  }
  cross_entropy_backward(logits, targets, lse, dlosses, dlse, ignore_index, dlogits, softcap);
}

void Backend::vocab_ce_shard_sums(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                  int64_t valid, Tensor& row_max, Tensor& sumexp,
                                  Tensor& target_logit) {
  vocab_ce_partial(logits, targets, vocab_start, valid, row_max, target_logit);
  vocab_ce_sumexp(logits, row_max, valid, sumexp);
}

void Backend::scale_by_ratio(const Tensor& actual, double expected, Tensor& x) {
  if (actual.numel() != 1 || actual.device() != x.device() || expected == 0.0) {
    throw ShapeError("scale_by_ratio: actual " + shape_str(actual.shape()) + " on " +
                     actual.device().str() + ", expected " + std::to_string(expected) +
                     " (one element on " + x.device().str() + ", and a nonzero expectation)");
  }
  Tensor host = actual;
  if (!actual.device().is_cpu()) {
    host = empty(actual.shape(), actual.dtype(), Device::cpu());
    copy(actual, host);
  }
  const bool f64 = host.dtype() == DType::F64;
  const double got = f64 ? host.data<double>()[0] : static_cast<double>(host.data<float>()[0]);
  const double want = f64 ? expected : static_cast<double>(static_cast<float>(expected));
  if (got == want) return;
  // Row by row: x may be a row-strided matrix whose gaps are not its own.
  const int64_t rows = x.dim() == 2 ? x.size(0) : 1, cols = x.numel() / std::max<int64_t>(rows, 1);
  const int64_t ld = x.dim() == 2 ? matrix_ld(x, "scale_by_ratio") : cols;
  for (int64_t r = 0; r < rows; ++r) {
    Tensor row = make_view(x, {cols}, {1}, x.offset() + r * ld);
    affine(row, got / want, 0.0, row);
  }
}

void Backend::gelu_linear_input_grad(const Tensor& dy, const Tensor& w, const Tensor& pre,
                                     Tensor& dpre) {
  Tensor dact = empty(dpre.shape(), dpre.dtype(), dpre.device());
  gemm(dy, w, dact, false, false, 1.0, 0.0);
  gelu_backward(pre, dact, dpre, GeluForm::Tanh);
}

Tensor Backend::gelu_linear_input_grad_with_sums(const Tensor& dy, const Tensor& w,
                                                 const Tensor& pre, Tensor& dpre) {
  gelu_linear_input_grad(dy, w, pre, dpre);
  return Tensor();
}

Tensor Backend::layer_norm_backward_into_with_dx_sums(const Tensor& dy, const Tensor* dh,
                                                      const Tensor& x, const Tensor& weight,
                                                      const Tensor& mean, const Tensor& rstd,
                                                      Tensor& dx, Tensor& dweight, Tensor& dbias,
                                                      double beta, double weight_offset) {
  layer_norm_backward_into(dy, dh, x, weight, mean, rstd, dx, dweight, dbias, beta, weight_offset);
  return Tensor();
}

int64_t matrix_ld(const Tensor& t, const char* op) {
  if (t.is_contiguous()) return t.dim() == 0 ? 1 : std::max<int64_t>(1, t.size(-1));
  if (t.dim() == 2) {
    const int64_t rows = t.size(0), cols = t.size(1);
    const Shape& st = t.strides();
    const bool adjacent = st[1] == 1 || cols <= 1;
    if (adjacent && rows <= 1) return std::max<int64_t>(1, cols);
    if (adjacent && st[0] >= std::max<int64_t>(1, cols)) return st[0];
  }
  throw ShapeError(std::string(op) + ": a " + shape_str(t.shape()) + " operand with strides " +
                   shape_str(t.strides()) +
                   " is neither contiguous nor a matrix of adjacent columns in rows at least a "
                   "row apart");
}

int64_t same_row_stride(const Tensor& t, const Tensor& grad, const char* op) {
  const int64_t ld = matrix_ld(t, op), gld = matrix_ld(grad, op);
  if (ld != gld) {
    throw ShapeError(std::string(op) + ": the gradient's row stride " + std::to_string(gld) +
                     " differs from its input's " + std::to_string(ld));
  }
  return ld;
}

void check_gemm_dtypes(const Tensor& a, const Tensor& b, const Tensor& c) {
  const bool alike = a.dtype() == c.dtype() && b.dtype() == c.dtype();
  const bool half_into_f32 =
      a.dtype() == b.dtype() && is_half(a.dtype()) && c.dtype() == DType::F32;
  if (!alike && !half_into_f32) {
    throw ValueError(std::string("gemm: operand dtypes (a ") + dtype_name(a.dtype()) + ", b " +
                     dtype_name(b.dtype()) + ", c " + dtype_name(c.dtype()) +
                     ") must be one dtype, or bf16/f16 a and b into an f32 c");
  }
}

void Backend::accumulate(const Tensor& src, Tensor& acc) {
  if (src.shape() != acc.shape()) {
    throw ShapeError("accumulate: source " + shape_str(src.shape()) + " into " +
                     shape_str(acc.shape()));
  }
  Tensor s = src;
  if (src.dtype() != acc.dtype() || src.device() != acc.device()) {
    s = empty(src.shape(), acc.dtype(), acc.device());
    copy(src, s);
  }
  binary(BinaryOp::Add, acc, s, acc);
}

void Backend::sum_rows_into(const Tensor& x, Tensor& acc, double beta) {
  if (x.dim() != 2) {
    throw ShapeError("sum_rows_into: rows of " + shape_str(x.shape()) +
                     " (expected (rows, cols) into (cols))");
  }
  check_grad_buffer("sum_rows_into", x.dtype(), acc, Shape{x.size(1)});
  Tensor sums = empty(acc.shape(), acc.dtype(), acc.device());
  reduce(ReduceOp::Sum, as_dtype(*this, x, acc.dtype()), 1, x.size(0), x.size(1), sums, nullptr);
  add_scaled_into(*this, sums, acc, beta);
}

void Backend::linear_weight_bias_grad(const Tensor& dy, const Tensor& x, Tensor& gw, Tensor& gb,
                                      double beta) {
  if (dy.dim() != 2 || x.dim() != 2 || dy.size(0) != x.size(0)) {
    throw ShapeError("linear_weight_bias_grad: output gradient " + shape_str(dy.shape()) +
                     " and input " + shape_str(x.shape()) +
                     " (expected (rows, out) and (rows, in))");
  }
  gemm(dy, x, gw, true, false, 1.0, beta);
  sum_rows_into(dy, gb, beta);
}

void check_clip_sum_sq(const Tensor& sum_sq, Device device) {
  if (sum_sq.dtype() != DType::F64 || sum_sq.numel() != 1 || sum_sq.device() != device) {
    throw ShapeError("adamw: clipping's sum of squares " + std::string(dtype_name(sum_sq.dtype())) +
                     " " + shape_str(sum_sq.shape()) + " on " + sum_sq.device().str() +
                     " (expected one f64 element on " + device.str() + ", the parameters' device)");
  }
}

namespace {

// Clipping's coefficient from AdamWStep::clip_sum_sq, read to the host
// through `backend`: min(1, max_norm / (sqrt(sum) + 1e-6)), or nothing when
// the sum is not finite (the kernels' arithmetic, so the same bits).
std::optional<double> clip_coefficient(Backend& backend, const Tensor& sum_sq, double max_norm,
                                       Device device) {
  check_clip_sum_sq(sum_sq, device);
  Tensor host = sum_sq;
  if (!sum_sq.device().is_cpu()) {
    host = empty({1}, DType::F64, Device::cpu());
    backend.copy(sum_sq, host);
  }
  const double sum = host.data<double>()[0];
  if (!std::isfinite(sum)) return std::nullopt;
  return std::fmin(1.0, max_norm / (std::sqrt(sum) + 1e-6));
}

// An entry's grad_scale times the coefficient, rounded as the kernels round
// it (their f32 scale times the coefficient, to f32).
double clipped_grad_scale(double grad_scale, double coef) {
  return static_cast<float>(static_cast<double>(static_cast<float>(grad_scale)) * coef);
}

}  // namespace

void Backend::adamw_many(std::vector<AdamWEntry>& entries, const AdamWStep& hp) {
  // Clipping's coefficient from the sum of squares, read here, in the
  // kernels' arithmetic (the same bits as the CUDA backend's).
  std::optional<double> coef;
  if (hp.clip_sum_sq.defined()) {
    coef = clip_coefficient(*this, hp.clip_sum_sq, hp.clip_max_norm,
                            entries.empty() ? hp.clip_sum_sq.device() : entries[0].param.device());
    if (!coef) return;  // not finite: every entry as it is
  }
  for (AdamWEntry& e : entries) {
    AdamWStep h = hp;
    h.clip_sum_sq = Tensor();
    h.weight_decay = e.weight_decay;
    h.grad_scale = coef ? clipped_grad_scale(e.grad_scale, *coef) : e.grad_scale;
    if (!e.master.defined()) {
      adamw(e.param, e.grad, e.m, e.v, h);
      continue;
    }
    adamw(e.master, e.grad, e.m, e.v, h);
    copy(e.master, e.param);
  }
}

void Backend::sum_of_squares(const std::vector<Tensor>& tensors, Tensor& out) {
  fill(out, 0.0);
  for (const Tensor& given : tensors) {
    if (given.numel() == 0) continue;
    // Half tensors are squared in f32 (exactly: a bf16 or f16 square fits).
    Tensor t = given;
    if (is_half(given.dtype())) {
      t = empty(given.shape(), DType::F32, given.device());
      copy(given, t);
    }
    Tensor sq = empty(t.shape(), t.dtype(), t.device());
    binary(BinaryOp::Mul, t, t, sq);
    Tensor s = empty({1}, t.dtype(), t.device());
    reduce(ReduceOp::Sum, sq, 1, sq.numel(), 1, s, nullptr);
    Tensor s64 = empty({1}, DType::F64, t.device());
    copy(s, s64);
    binary(BinaryOp::Add, out, s64, out);
  }
}

void Backend::add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                     const Tensor& bias, double eps, Tensor& h, Tensor& y,
                                     Tensor& mean, Tensor& rstd, double weight_offset) {
  binary(BinaryOp::Add, x, residual, h);
  layer_norm_forward(h, weight, bias, eps, y, mean, rstd, weight_offset);
}

void Backend::add_layer_norm_backward(const Tensor& dy, const Tensor& dh, const Tensor& h,
                                      const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                      Tensor& dx, Tensor& dweight, Tensor& dbias,
                                      double weight_offset) {
  layer_norm_backward(dy, h, weight, mean, rstd, dx, dweight, dbias, weight_offset);
  binary(BinaryOp::Add, dx, dh, dx);
}

namespace {
// The default *_norm_backward_into: `backward(dy, x, weight, dx, grads)` in
// the buffers' dtype (half values widened exactly) into fresh parameter
// gradients, dx rounded to its dtype and then dh added (as the unfused
// add's backward does), each gradient added into its buffer.
void norm_backward_into_widened(
    Backend& be, const Tensor& dy, const Tensor* dh, const Tensor& x, const Tensor& weight,
    Tensor& dx, const std::vector<Tensor*>& buffers, double beta,
    const std::function<void(const Tensor&, const Tensor&, const Tensor&, Tensor&,
                             std::vector<Tensor>&)>& backward) {
  const DType d = buffers[0]->dtype();
  Tensor dxw = dx.dtype() == d ? dx : empty(dx.shape(), d, dx.device());
  std::vector<Tensor> grads;
  for (size_t i = 0; i < buffers.size(); ++i)
    grads.push_back(empty(weight.shape(), d, weight.device()));
  backward(as_dtype(be, dy, d), as_dtype(be, x, d), as_dtype(be, weight, d), dxw, grads);
  if (!dxw.same(dx)) be.copy(dxw, dx);
  if (dh) be.binary(BinaryOp::Add, dx, *dh, dx);
  for (size_t i = 0; i < buffers.size(); ++i) add_scaled_into(be, grads[i], *buffers[i], beta);
}
}  // namespace

void Backend::layer_norm_backward_into(const Tensor& dy, const Tensor* dh, const Tensor& x,
                                       const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                       Tensor& dx, Tensor& dweight, Tensor& dbias, double beta,
                                       double weight_offset) {
  check_grad_buffer("layer_norm_backward_into", x.dtype(), dweight, weight.shape());
  check_grad_buffer("layer_norm_backward_into", x.dtype(), dbias, weight.shape());
  norm_backward_into_widened(*this, dy, dh, x, weight, dx, {&dweight, &dbias}, beta,
                             [&](const Tensor& g, const Tensor& xw, const Tensor& w, Tensor& dxw,
                                 std::vector<Tensor>& grads) {
                               layer_norm_backward(g, xw, w, mean, rstd, dxw, grads[0], grads[1],
                                                   weight_offset);
                             });
}

void Backend::add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                   double eps, Tensor& h, Tensor& y, Tensor& rstd,
                                   double weight_offset) {
  binary(BinaryOp::Add, x, residual, h);
  rms_norm_forward(h, weight, eps, y, rstd, weight_offset);
}

void Backend::write_kv_cache(const Tensor& qkv, const AttentionHeads& heads, int64_t start,
                             Tensor& k_cache, Tensor& v_cache) {
  const int64_t B = qkv.size(0), n = qkv.size(1), W = qkv.size(2);
  const int64_t D = W / heads.fused(), KV = heads.kv, C = heads.q * D;
  for (auto [cache, at] : {std::pair<Tensor*, int64_t>{&k_cache, C}, {&v_cache, C + KV * D}}) {
    // qkv's part as (B, kv, n, D), and the cache's slots [start, start + n).
    const Tensor from = make_view(qkv, {B, KV, n, D}, {n * W, D, W, 1}, qkv.offset() + at);
    const Shape& st = cache->strides();
    Tensor to = make_view(*cache, {B, KV, n, D}, {st[0], st[1], st[2], st[3]},
                          cache->offset() + start * st[2]);
    copy(from, to);
  }
}

void Backend::rms_norm_backward_into(const Tensor& dy, const Tensor* dh, const Tensor& x,
                                     const Tensor& weight, const Tensor& rstd, Tensor& dx,
                                     Tensor& dweight, double beta, double weight_offset) {
  check_grad_buffer("rms_norm_backward_into", x.dtype(), dweight, weight.shape());
  norm_backward_into_widened(*this, dy, dh, x, weight, dx, {&dweight}, beta,
                             [&](const Tensor& g, const Tensor& xw, const Tensor& w, Tensor& dxw,
                                 std::vector<Tensor>& grads) {
                               rms_norm_backward(g, xw, w, rstd, dxw, grads[0], weight_offset);
                             });
}

void Backend::embedding_backward_into(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                                      double beta) {
  check_grad_buffer("embedding_backward_into", dout.dtype(), dweight, dweight.shape());
  Tensor dense = empty(dweight.shape(), dweight.dtype(), dweight.device());
  embedding_backward(ids, as_dtype(*this, dout, dweight.dtype()), dense);
  add_scaled_into(*this, dense, dweight, beta);
}

namespace {

struct Registry {
  std::mutex mutex;
  std::array<Backend*, 2> backends{};
};

Registry& registry() {
  static Registry r;
  static detail::CpuBackend cpu;
  static detail::HalfAdapter cpu_with_half(cpu);
  static const bool init = [] {
    r.backends[static_cast<size_t>(DeviceType::CPU)] = &cpu_with_half;
#ifdef TRIAD_WITH_CUDA
    // Registered in every CUDA build; it touches the driver only when a CUDA
    // tensor is first created, so machines without a GPU are unaffected.
    r.backends[static_cast<size_t>(DeviceType::CUDA)] = &detail::cuda_backend();
#endif
    return true;
  }();
  (void)init;
  return r;
}

}  // namespace

Backend& backend_for(DeviceType type) {
  Registry& r = registry();
  Backend* b = r.backends[static_cast<size_t>(type)];
  if (!b) {
    throw NotSupportedError(std::string("no backend for device type ") +
                            (type == DeviceType::CUDA ? "cuda" : "cpu") +
                            " in this build (configure with TRIAD_WITH_CUDA=ON and run on a GPU)");
  }
  return *b;
}

void register_backend(DeviceType type, Backend* backend) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.backends[static_cast<size_t>(type)] = backend;
}

void Backend::route_top_k(const Tensor& scores, const Tensor& bias, int64_t groups,
                          int64_t top_groups, int64_t group_best, Tensor& choice, Tensor* chosen) {
  detail::ExpertRule rule =
      detail::route_top_k_rule(scores, bias, groups, top_groups, group_best, choice, chosen);
  // f64 copies on the host (f32 widens exactly), then the choice back.
  const auto on_host = [this](const Tensor& t) {
    Tensor h = empty(t.shape(), DType::F64, Device::cpu());
    if (t.device().type == DeviceType::CPU) {
      backend_for(h).copy(t, h);
    } else {
      Tensor staged = empty(t.shape(), t.dtype(), Device::cpu());
      copy(t, staged);
      backend_for(h).copy(staged, h);
    }
    return h;
  };
  const Tensor s = on_host(scores);
  Tensor b;
  if (bias.defined()) {
    b = on_host(bias);
    rule.bias = b.data<double>();
    if (const std::string problem = detail::expert_rule_problem(rule); !problem.empty())
      throw ValueError("route_top_k: " + problem);
  }
  const bool here = choice.device().type == DeviceType::CPU;
  Tensor out = here ? choice : empty(choice.shape(), DType::I64, Device::cpu());
  detail::choose_experts(s.data<double>(), scores.size(0), rule, out.data<int64_t>());
  if (!here) copy(out, choice);
  if (!chosen) return;
  // Each choice's own score, in f64 here, then in the scores' dtype where
  // they are (exact: the scores' own values).
  const int64_t N = scores.size(0), E = rule.experts, K = rule.top_k;
  Tensor values = empty(choice.shape(), DType::F64, Device::cpu());
  double* v = values.data<double>();
  const int64_t* c = out.data<int64_t>();
  for (int64_t a = 0; a < N * K; ++a) v[a] = c[a] < 0 ? 0.0 : s.data<double>()[(a / K) * E + c[a]];
  if (chosen->device().type == DeviceType::CPU) {
    backend_for(values).copy(values, *chosen);
  } else {
    Tensor staged = empty(chosen->shape(), chosen->dtype(), Device::cpu());
    backend_for(values).copy(values, staged);
    copy(staged, *chosen);
  }
}

void Backend::capacity_slots(const Tensor& choice, const Tensor& scores, int64_t experts,
                             int64_t capacity, int64_t group, Tensor& slot_token,
                             Tensor& slot_assignment, Tensor& picked, Tensor& counts) {
  detail::check_capacity_slots(choice, scores, experts, capacity, group, slot_token,
                               slot_assignment, picked, counts);
  const bool here = choice.device().type == DeviceType::CPU;
  Tensor c = choice;
  if (!here) {
    c = empty(choice.shape(), DType::I64, Device::cpu());
    copy(choice, c);
  }
  // The scores in f64 on the host (f32 widens exactly).
  Tensor ranks;
  if (scores.defined()) {
    Tensor staged = scores;
    if (!here) {
      staged = empty(scores.shape(), scores.dtype(), Device::cpu());
      copy(scores, staged);
    }
    ranks = empty(scores.shape(), DType::F64, Device::cpu());
    backend_for(ranks).copy(staged, ranks);
  }
  const auto staged = [here](Tensor& t) {
    return here ? t : empty(t.shape(), DType::I64, Device::cpu());
  };
  Tensor token = staged(slot_token), assignment = staged(slot_assignment), p = staged(picked),
         n = staged(counts);
  detail::fill_capacity_slots(c.data<int64_t>(), ranks.defined() ? ranks.data<double>() : nullptr,
                              choice.size(0), choice.size(1), experts, capacity, group,
                              token.data<int64_t>(), assignment.data<int64_t>(), p.data<int64_t>(),
                              n.data<int64_t>());
  if (here) return;
  copy(token, slot_token);
  copy(assignment, slot_assignment);
  copy(p, picked);
  copy(n, counts);
}

void Backend::dropless_rows(const Tensor& choice, int64_t experts, int64_t group, Tensor& row_token,
                            Tensor& row_assignment, Tensor& offsets, Tensor& picked,
                            Tensor& counts) {
  detail::check_dropless_rows(choice, experts, group, row_token, row_assignment, offsets, picked,
                              counts);
  const bool here = choice.device().type == DeviceType::CPU;
  Tensor c = choice;
  if (!here) {
    c = empty(choice.shape(), DType::I64, Device::cpu());
    copy(choice, c);
  }
  const auto staged = [here](Tensor& t) {
    return here ? t : empty(t.shape(), DType::I64, Device::cpu());
  };
  Tensor token = staged(row_token), assignment = staged(row_assignment), at = staged(offsets),
         p = staged(picked), n = staged(counts);
  detail::fill_dropless_rows(c.data<int64_t>(), choice.size(0), choice.size(1), experts, group,
                             token.data<int64_t>(), assignment.data<int64_t>(), at.data<int64_t>(),
                             p.data<int64_t>(), n.data<int64_t>());
  if (here) return;
  copy(token, row_token);
  copy(assignment, row_assignment);
  copy(at, offsets);
  copy(p, picked);
  copy(n, counts);
}

}  // namespace triad
