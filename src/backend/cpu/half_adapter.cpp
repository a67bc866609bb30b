#include "half_adapter.h"

namespace triad::detail {
namespace {

bool is_half(const Tensor& t) {
  return t.defined() && triad::is_half(t.dtype());
}

// The same elements (an output written over its input).
bool same_data(const Tensor& a, const Tensor& b) {
  return a.raw_data() == b.raw_data() && a.strides() == b.strides() && a.shape() == b.shape();
}

// Widens half tensors for one call and rounds the outputs back at finish().
class Widen {
 public:
  explicit Widen(Backend& be) : be_(be) {}
  Tensor in(const Tensor& t) {
    if (!is_half(t)) return t;
    Tensor f = empty(t.shape(), DType::F32, t.device());
    be_.copy(t, f);
    return f;
  }
  Tensor out(Tensor& t) {
    if (!is_half(t)) return t;
    Tensor f = empty(t.shape(), DType::F32, t.device());
    outputs_.emplace_back(f, t);
    return f;
  }
  Tensor inout(Tensor& t) {
    if (!is_half(t)) return t;
    Tensor f = in(t);
    outputs_.emplace_back(f, t);
    return f;
  }
  void finish() {
    for (auto& [f, original] : outputs_) be_.copy(f, original);
  }

 private:
  Backend& be_;
  std::vector<std::pair<Tensor, Tensor>> outputs_;
};

}  // namespace

void HalfAdapter::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  Widen w(inner_);
  Tensor o = w.out(out);
  inner_.binary(op, w.in(a), w.in(b), o);
  w.finish();
}

void HalfAdapter::affine(const Tensor& x, double alpha, double beta, Tensor& out) {
  Widen w(inner_);
  Tensor o = w.out(out);
  inner_.affine(w.in(x), alpha, beta, o);
  w.finish();
}

void HalfAdapter::gemm(const Tensor& a, const Tensor& b, Tensor& c, bool ta, bool tb, double alpha,
                       double beta) {
  check_gemm_dtypes(a, b, c);
  Widen w(inner_);
  Tensor o = beta != 0.0 ? w.inout(c) : w.out(c);
  inner_.gemm(w.in(a), w.in(b), o, ta, tb, alpha, beta);
  w.finish();
}

void HalfAdapter::reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner,
                         Tensor& out, Tensor* indices) {
  Widen w(inner_);
  Tensor o = w.out(out);
  inner_.reduce(op, w.in(x), outer, n, inner, o, indices);
  w.finish();
}

void HalfAdapter::gelu_forward(const Tensor& x, Tensor& y, GeluForm form) {
  Widen w(inner_);
  Tensor o = w.out(y);
  inner_.gelu_forward(w.in(x), o, form);
  w.finish();
}

void HalfAdapter::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, GeluForm form) {
  Widen w(inner_);
  Tensor o = w.out(dx);
  inner_.gelu_backward(w.in(x), w.in(dy), o, form);
  w.finish();
}

void HalfAdapter::soft_cap(const Tensor& x, double cap, Tensor& y) {
  Widen w(inner_);
  // In place (the head's logits): one widened copy serves both.
  Tensor o = same_data(x, y) ? w.inout(y) : w.out(y);
  inner_.soft_cap(same_data(x, y) ? o : w.in(x), cap, o);
  w.finish();
}

void HalfAdapter::soft_cap_backward(const Tensor& y, const Tensor& dy, double cap, Tensor& dx) {
  Widen w(inner_);
  Tensor o = w.out(dx);
  inner_.soft_cap_backward(w.in(y), w.in(dy), cap, o);
  w.finish();
}

void HalfAdapter::clamp(const Tensor& x, double lo, double hi, Tensor& y) {
  Widen w(inner_);
  Tensor o = same_data(x, y) ? w.inout(y) : w.out(y);
  inner_.clamp(same_data(x, y) ? o : w.in(x), lo, hi, o);
  w.finish();
}

void HalfAdapter::clamp_backward(const Tensor& x, const Tensor& dy, double lo, double hi,
                                 Tensor& dx) {
  Widen w(inner_);
  Tensor o = w.out(dx);
  inner_.clamp_backward(w.in(x), w.in(dy), lo, hi, o);
  w.finish();
}

void HalfAdapter::layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                     double eps, Tensor& y, Tensor& mean, Tensor& rstd,
                                     double weight_offset) {
  Widen w(inner_);
  Tensor o = w.out(y);
  inner_.layer_norm_forward(w.in(x), w.in(weight), w.in(bias), eps, o, mean, rstd, weight_offset);
  w.finish();
}

void HalfAdapter::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                      const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                      Tensor& dweight, Tensor& dbias, double weight_offset) {
  Widen w(inner_);
  Tensor a = w.out(dx), b = w.out(dweight), c = w.out(dbias);
  inner_.layer_norm_backward(w.in(dy), w.in(x), w.in(weight), mean, rstd, a, b, c, weight_offset);
  w.finish();
}

void HalfAdapter::rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                                   Tensor& rstd, double weight_offset) {
  Widen w(inner_);
  Tensor o = w.out(y);
  inner_.rms_norm_forward(w.in(x), w.in(weight), eps, o, rstd, weight_offset);
  w.finish();
}

void HalfAdapter::rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                    const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                    double weight_offset) {
  Widen w(inner_);
  Tensor a = w.out(dx), b = w.out(dweight);
  inner_.rms_norm_backward(w.in(dy), w.in(x), w.in(weight), rstd, a, b, weight_offset);
  w.finish();
}

void HalfAdapter::softmax_forward(const Tensor& x, Tensor& y) {
  Widen w(inner_);
  Tensor o = w.out(y);
  inner_.softmax_forward(w.in(x), o);
  w.finish();
}

void HalfAdapter::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  Widen w(inner_);
  Tensor o = w.out(dx);
  inner_.softmax_backward(w.in(y), w.in(dy), o);
  w.finish();
}

void HalfAdapter::attention_forward(const Tensor& qkv, const AttentionHeads& heads, Tensor& out,
                                    Tensor& lse, const Tensor& doc_starts) {
  Widen w(inner_);
  Tensor o = w.out(out);
  inner_.attention_forward(w.in(qkv), heads, o, lse, doc_starts);
  w.finish();
}

void HalfAdapter::attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                     const Tensor& dout, const AttentionHeads& heads, Tensor& dqkv,
                                     const Tensor& doc_starts) {
  Widen w(inner_);
  Tensor o = w.out(dqkv);
  inner_.attention_backward(w.in(qkv), w.in(out), lse, w.in(dout), heads, o, doc_starts);
  w.finish();
}

void HalfAdapter::attention_parts_forward(const Tensor& q, const Tensor& kv,
                                          const AttentionHeads& heads, int64_t query_start,
                                          Tensor& out, Tensor& lse, const Tensor& doc_starts) {
  Widen w(inner_);
  Tensor o = w.out(out);
  inner_.attention_parts_forward(w.in(q), w.in(kv), heads, query_start, o, lse, doc_starts);
  w.finish();
}

void HalfAdapter::attention_parts_backward(const Tensor& q, const Tensor& kv, const Tensor& out,
                                           const Tensor& lse, const Tensor& dout,
                                           const AttentionHeads& heads, int64_t query_start,
                                           Tensor& dq, Tensor& dkv, const Tensor& doc_starts) {
  Widen w(inner_);
  Tensor gq = w.out(dq);
  Tensor gkv = w.out(dkv);
  inner_.attention_parts_backward(w.in(q), w.in(kv), w.in(out), lse, w.in(dout), heads, query_start,
                                  gq, gkv, doc_starts);
  w.finish();
}

void HalfAdapter::attention_merge(Tensor& out, Tensor& lse, const Tensor& part,
                                  const Tensor& part_lse) {
  // out and lse are f32 already (the stat dtype); only the part widens.
  Widen w(inner_);
  inner_.attention_merge(out, lse, w.in(part), part_lse);
  w.finish();
}

void HalfAdapter::cached_attention_forward(const Tensor& qkv, const Tensor& keys,
                                           const Tensor& values, const AttentionHeads& heads,
                                           int64_t window, const Tensor& text_starts, Tensor& out) {
  Widen w(inner_);
  Tensor o = w.out(out);
  inner_.cached_attention_forward(w.in(qkv), w.in(keys), w.in(values), heads, window, text_starts,
                                  o);
  w.finish();
}

void HalfAdapter::embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  Widen w(inner_);
  Tensor o = w.out(out);
  inner_.embedding_forward(w.in(weight), ids, o);
  w.finish();
}

void HalfAdapter::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) {
  Widen w(inner_);
  Tensor o = w.out(dweight);
  inner_.embedding_backward(ids, w.in(dout), o);
  w.finish();
}

void HalfAdapter::cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                        int64_t ignore_index, Tensor& losses, Tensor& lse) {
  Widen w(inner_);
  inner_.cross_entropy_forward(w.in(logits), targets, ignore_index, losses, lse);
}

void HalfAdapter::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                         const Tensor& lse, const Tensor& dlosses,
                                         const Tensor& dlse, int64_t ignore_index, Tensor& dlogits,
                                         double softcap) {
  Widen w(inner_);
  // In place (the gradient over the logits): one widened copy serves both.
  Tensor o = same_data(logits, dlogits) ? w.inout(dlogits) : w.out(dlogits);
  inner_.cross_entropy_backward(same_data(logits, dlogits) ? o : w.in(logits), targets, lse,
                                dlosses, dlse, ignore_index, o, softcap);
  w.finish();
}

void HalfAdapter::cross_entropy_forward_backward(const Tensor& logits, const Tensor& targets,
                                                 int64_t ignore_index, Tensor& losses, Tensor& lse,
                                                 const Tensor& dlosses, Tensor& dlogits,
                                                 double softcap, double z_scale) {
  Widen w(inner_);
  // In place (the gradient over the logits): one widened copy, read for the
  // loss and written with the gradient, where the two calls widen twice.
  Tensor o = same_data(logits, dlogits) ? w.inout(dlogits) : w.out(dlogits);
  inner_.cross_entropy_forward_backward(same_data(logits, dlogits) ? o : w.in(logits), targets,
                                        ignore_index, losses, lse, dlosses, o, softcap, z_scale);
  w.finish();
}

void HalfAdapter::vocab_ce_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                   int64_t valid, Tensor& row_max, Tensor& target_logit) {
  Widen w(inner_);
  inner_.vocab_ce_partial(w.in(logits), targets, vocab_start, valid, row_max, target_logit);
}

void HalfAdapter::vocab_ce_sumexp(const Tensor& logits, const Tensor& global_max, int64_t valid,
                                  Tensor& sumexp) {
  Widen w(inner_);
  inner_.vocab_ce_sumexp(w.in(logits), global_max, valid, sumexp);
}

void HalfAdapter::vocab_ce_loss(const Tensor& global_max, const Tensor& target_logit,
                                const Tensor& sumexp, Tensor& losses) {
  inner_.vocab_ce_loss(global_max, target_logit, sumexp, losses);  // statistics: f32 already
}

void HalfAdapter::vocab_ce_backward(const Tensor& logits, const Tensor& targets,
                                    int64_t vocab_start, int64_t valid, const Tensor& global_max,
                                    const Tensor& sumexp, const Tensor& dloss, const Tensor& dlse,
                                    Tensor& dlogits, double softcap) {
  Widen w(inner_);
  Tensor o = same_data(logits, dlogits) ? w.inout(dlogits) : w.out(dlogits);
  inner_.vocab_ce_backward(same_data(logits, dlogits) ? o : w.in(logits), targets, vocab_start,
                           valid, global_max, sumexp, dloss, dlse, o, softcap);
  w.finish();
}

void HalfAdapter::rotary_embedding(const Tensor& qkv, const AttentionHeads& heads,
                                   const Tensor& positions, int64_t start, double theta,
                                   const RopeScaling& scaling, bool inverse, Tensor& out) {
  Widen w(inner_);
  Tensor o = w.out(out);
  inner_.rotary_embedding(w.in(qkv), heads, positions, start, theta, scaling, inverse, o);
  w.finish();
}

void HalfAdapter::glu_forward(const Tensor& x, Tensor& y, GluGate gate) {
  Widen w(inner_);
  Tensor o = w.out(y);
  inner_.glu_forward(w.in(x), o, gate);
  w.finish();
}

void HalfAdapter::glu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, GluGate gate) {
  Widen w(inner_);
  Tensor o = w.out(dx);
  inner_.glu_backward(w.in(x), w.in(dy), o, gate);
  w.finish();
}

void HalfAdapter::dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream,
                          const philox::Counters& at, const Tensor& keys, const Tensor& calls,
                          Tensor& y) {
  Widen w(inner_);
  Tensor o = w.out(y);
  inner_.dropout(w.in(x), p, seed, stream, at, keys, calls, o);
  w.finish();
}

void HalfAdapter::adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                        const AdamWStep& hp) {
  // Half-precision parameters keep f32 masters in the mixed-precision
  // optimizer; updating half values in place would lose the small steps.
  // The moments may be bf16 (train.moment_precision: bf16): read into f32,
  // updated and used as f32 moments, then stored rounded.
  const bool bf16_moments = m.dtype() == DType::BF16 && v.dtype() == DType::BF16;
  if (is_half(param) || ((is_half(m) || is_half(v)) && !bf16_moments)) {
    throw NotSupportedError(std::string("adamw: dtype ") +
                            dtype_name(is_half(param) ? param.dtype() : m.dtype()) +
                            (is_half(param) ? "" : " moments") +
                            " is not supported on device cpu (keep f32 master weights; moments "
                            "f32, or bf16 both)");
  }
  if (is_half(grad) && hp.grad_scale != 1.0) {
    // The scaled gradient rounded to its own type first, as scaling it would.
    Tensor scaled = empty(grad.shape(), grad.dtype(), grad.device());
    affine(grad, hp.grad_scale, 0.0, scaled);
    AdamWStep unscaled = hp;
    unscaled.grad_scale = 1.0;
    adamw(param, scaled, m, v, unscaled);
    return;
  }
  Widen w(inner_);
  Tensor m32 = w.inout(m), v32 = w.inout(v);
  inner_.adamw(param, w.in(grad), m32, v32, hp);
  w.finish();
}

}  // namespace triad::detail
