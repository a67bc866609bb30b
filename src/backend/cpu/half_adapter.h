#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "triad/backend/backend.h"

namespace triad::detail {

// Gives a backend that computes in f32/f64 half-precision entry points: bf16
// and f16 tensors are widened to f32, the f32 kernel runs, results are
// rounded back once — what GPU kernels do (f32 accumulation), so the CPU
// stays the reference for half-precision CUDA kernels. Everything else is
// forwarded untouched.
class HalfAdapter final : public Backend {
 public:
  explicit HalfAdapter(Backend& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  Allocator& allocator(int device_index) override { return inner_.allocator(device_index); }
  void synchronize() override { inner_.synchronize(); }
  void copy(const Tensor& src, Tensor& dst) override { inner_.copy(src, dst); }
  void fill(Tensor& dst, double value) override { inner_.fill(dst, value); }

  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override;
  void affine(const Tensor& x, double alpha, double beta, Tensor& out) override;
  void gemm(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, double alpha,
            double beta) override;
  void reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out,
              Tensor* indices) override;
  void gelu_forward(const Tensor& x, Tensor& y, GeluForm form) override;
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, GeluForm form) override;
  void soft_cap(const Tensor& x, double cap, Tensor& y) override;
  void soft_cap_backward(const Tensor& y, const Tensor& dy, double cap, Tensor& dx) override;
  void clamp(const Tensor& x, double lo, double hi, Tensor& y) override;
  void clamp_backward(const Tensor& x, const Tensor& dy, double lo, double hi, Tensor& dx) override;
  void glu_forward(const Tensor& x, Tensor& y, GluGate gate) override;
  void glu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, GluGate gate) override;
  void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                          Tensor& y, Tensor& mean, Tensor& rstd, double weight_offset) override;
  void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                           Tensor& dbias, double weight_offset) override;
  void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd,
                        double weight_offset) override;
  void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                         const Tensor& rstd, Tensor& dx, Tensor& dweight,
                         double weight_offset) override;
  void softmax_forward(const Tensor& x, Tensor& y) override;
  void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override;
  void attention_forward(const Tensor& qkv, const AttentionHeads& heads, Tensor& out, Tensor& lse,
                         const Tensor& doc_starts) override;
  void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, const AttentionHeads& heads, Tensor& dqkv,
                          const Tensor& doc_starts) override;
  void attention_parts_forward(const Tensor& q, const Tensor& kv, const AttentionHeads& heads,
                               int64_t query_start, Tensor& out, Tensor& lse,
                               const Tensor& doc_starts) override;
  void attention_parts_backward(const Tensor& q, const Tensor& kv, const Tensor& out,
                                const Tensor& lse, const Tensor& dout, const AttentionHeads& heads,
                                int64_t query_start, Tensor& dq, Tensor& dkv,
                                const Tensor& doc_starts) override;
  void attention_merge(Tensor& out, Tensor& lse, const Tensor& part,
                       const Tensor& part_lse) override;
  void cached_attention_forward(const Tensor& qkv, const Tensor& keys, const Tensor& values,
                                const AttentionHeads& heads, int64_t window,
                                const Tensor& text_starts, Tensor& out) override;
  void rotary_embedding(const Tensor& qkv, const AttentionHeads& heads, const Tensor& positions,
                        int64_t start, double theta, const RopeScaling& scaling, bool inverse,
                        Tensor& out) override;
  void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) override;
  void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) override;
  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             Tensor& losses, Tensor& lse) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              const Tensor& dlosses, const Tensor& dlse, int64_t ignore_index,
                              Tensor& dlogits, double softcap) override;
  void cross_entropy_forward_backward(const Tensor& logits, const Tensor& targets,
                                      int64_t ignore_index, Tensor& losses, Tensor& lse,
                                      const Tensor& dlosses, Tensor& dlogits, double softcap,
                                      double z_scale) override;
  void vocab_ce_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                        int64_t valid, Tensor& row_max, Tensor& target_logit) override;
  void vocab_ce_sumexp(const Tensor& logits, const Tensor& global_max, int64_t valid,
                       Tensor& sumexp) override;
  void vocab_ce_loss(const Tensor& global_max, const Tensor& target_logit, const Tensor& sumexp,
                     Tensor& losses) override;
  void vocab_ce_backward(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                         int64_t valid, const Tensor& global_max, const Tensor& sumexp,
                         const Tensor& dloss, const Tensor& dlse, Tensor& dlogits,
                         double softcap) override;
  void dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream,
               const philox::Counters& at, const Tensor& keys, const Tensor& calls,
               Tensor& y) override;
  void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& hp) override;

 private:
  Backend& inner_;
};

}  // namespace triad::detail
