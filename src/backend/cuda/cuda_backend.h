#pragma once

// The CUDA backend: adapts the hand-written kernels of kernels/ and cuBLASLt
// GEMMs to the Backend interface. One caching allocator, one compute stream
// and one GEMM context per device; host<->device copies go through pinned,
// double-buffered staging buffers. f32/bf16/f16 for the neural-network
// kernels; f64 and integers for copies, fills, elementwise, reductions and
// (f64) GEMMs.
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "triad/backend/backend.h"
#include "triad/backend/caching_allocator.h"

namespace triad::detail {

class CublasLtGemm;
class PinnedStaging;

// What a CUDA graph's capture leaves its replays to check: indices on the
// device (token ids, targets) that the capture could not bring to the host.
// The kernels that read them lower a word to the first position out of
// range (kernels/embedding.h); cuda::Graph::check reads the words.
struct CaptureChecks {
  struct Check {
    std::string what;  // e.g. "embedding: token id"
    Tensor indices;    // on the device, kept for the message
    int64_t bound = 0;
    Tensor word;  // one i64, set to all ones (-1) in each replay before its kernel
  };
  int device = -1;
  std::vector<Check> checks;
};
// The capture open on this thread for `device` (cuda::capture), or null.
CaptureChecks* open_capture(int device);
// Where this thread's kernels leave their index checks for `device`: the
// open capture's, else an open cuda::DeviceChecks', else null (the host
// reads the indices).
CaptureChecks* open_checks(int device);

class CudaBackend final : public Backend {
 public:
  CudaBackend();
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  Allocator& allocator(int device_index) override;
  void synchronize() override;

  void copy(const Tensor& src, Tensor& dst) override;
  void arange(Tensor& dst, int64_t start) override;
  void document_starts(const Tensor& ids, int64_t eod, int64_t window, Tensor& starts,
                       Tensor* positions) override;
  bool capturing(const Device& device) const override;
  bool checks_indices_on_device(const Device& device) const override;
  void inverse_target_count(const Tensor& targets, int64_t ignore_index, int64_t classes,
                            Tensor& inv, const char* op) override;
  void vocab_shard_ids(const Tensor& ids, int64_t start, int64_t valid, int64_t vocab,
                       Tensor& local, Tensor& keep, const char* op) override;
  void fill(Tensor& dst, double value) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override;
  void accumulate(const Tensor& src, Tensor& acc) override;
  void sum_rows_into(const Tensor& x, Tensor& acc, double beta) override;
  void linear_weight_bias_grad(const Tensor& dy, const Tensor& x, Tensor& gw, Tensor& gb,
                               double beta) override;
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
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y,
                      Tensor* gelu_input) override;
  void gelu_linear_input_grad(const Tensor& dy, const Tensor& w, const Tensor& pre,
                              Tensor& dpre) override;
  Tensor gelu_linear_input_grad_with_sums(const Tensor& dy, const Tensor& w, const Tensor& pre,
                                          Tensor& dpre) override;
  Tensor layer_norm_backward_into_with_dx_sums(const Tensor& dy, const Tensor* dh, const Tensor& x,
                                               const Tensor& weight, const Tensor& mean,
                                               const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                               Tensor& dbias, double beta,
                                               double weight_offset) override;
  void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                          Tensor& y, Tensor& mean, Tensor& rstd, double weight_offset) override;
  void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                           Tensor& dbias, double weight_offset) override;
  void add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                              const Tensor& bias, double eps, Tensor& h, Tensor& y, Tensor& mean,
                              Tensor& rstd, double weight_offset) override;
  void add_layer_norm_backward(const Tensor& dy, const Tensor& dh, const Tensor& h,
                               const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                               Tensor& dx, Tensor& dweight, Tensor& dbias,
                               double weight_offset) override;
  void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd,
                        double weight_offset) override;
  void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                         const Tensor& rstd, Tensor& dx, Tensor& dweight,
                         double weight_offset) override;
  void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                            double eps, Tensor& h, Tensor& y, Tensor& rstd,
                            double weight_offset) override;
  void rms_norm_backward_into(const Tensor& dy, const Tensor* dh, const Tensor& x,
                              const Tensor& weight, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                              double beta, double weight_offset) override;
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
  void write_kv_cache(const Tensor& qkv, const AttentionHeads& heads, int64_t start,
                      Tensor& k_cache, Tensor& v_cache) override;
  void cached_attention_forward(const Tensor& qkv, const Tensor& keys, const Tensor& values,
                                const AttentionHeads& heads, int64_t window,
                                const Tensor& text_starts, Tensor& out) override;
  void rotary_embedding(const Tensor& qkv, const AttentionHeads& heads, const Tensor& positions,
                        int64_t start, double theta, const RopeScaling& scaling, bool inverse,
                        Tensor& out) override;
  void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) override;
  void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) override;
  void embedding_backward_into(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                               double beta) override;
  void layer_norm_backward_into(const Tensor& dy, const Tensor* dh, const Tensor& x,
                                const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                Tensor& dx, Tensor& dweight, Tensor& dbias, double beta,
                                double weight_offset) override;
  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             Tensor& losses, Tensor& lse) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              const Tensor& dlosses, const Tensor& dlse, int64_t ignore_index,
                              Tensor& dlogits, double softcap) override;
  void cross_entropy_forward_backward(const Tensor& logits, const Tensor& targets,
                                      int64_t ignore_index, Tensor& losses, Tensor& lse,
                                      const Tensor& dlosses, Tensor& dlogits, double softcap,
                                      double z_scale) override;
  void scale_by_ratio(const Tensor& actual, double expected, Tensor& x) override;
  void vocab_ce_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                        int64_t valid, Tensor& row_max, Tensor& target_logit) override;
  void vocab_ce_shard_sums(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid, Tensor& row_max, Tensor& sumexp,
                           Tensor& target_logit) override;
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
  void adamw_many(std::vector<AdamWEntry>& entries, const AdamWStep& hp) override;
  void sum_of_squares(const std::vector<Tensor>& tensors, Tensor& out) override;
  void route_top_k(const Tensor& scores, const Tensor& bias, int64_t groups, int64_t top_groups,
                   int64_t group_best, Tensor& choice, Tensor* chosen = nullptr) override;
  void capacity_slots(const Tensor& choice, const Tensor& scores, int64_t experts, int64_t capacity,
                      int64_t group, Tensor& slot_token, Tensor& slot_assignment, Tensor& picked,
                      Tensor& counts) override;
  void dropless_rows(const Tensor& choice, int64_t experts, int64_t group, Tensor& row_token,
                     Tensor& row_assignment, Tensor& offsets, Tensor& picked,
                     Tensor& counts) override;
  void grouped_gemm_rows(const Tensor& a, const std::vector<Tensor>& b, const Tensor& offsets,
                         bool trans_b, Tensor& c) override;
  void grouped_gemm_sums(const Tensor& a, const Tensor& b, const Tensor& offsets,
                         std::vector<Tensor>& c, double beta) override;

  // Per-device state, created on first use of the device.
  struct DeviceState;
  DeviceState& state(int device);

 private:
  PinnedStaging& staging();
  // dweight overwritten, or added to in the rows the ids touch.
  void run_embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                              bool accumulate);
  static constexpr int kMaxDevices = 16;
  std::mutex mutex_;
  std::array<std::unique_ptr<DeviceState>, kMaxDevices> devices_;
  std::unique_ptr<PinnedStaging> staging_;
};

// The process-wide instance registered for DeviceType::CUDA.
CudaBackend& cuda_backend();

}  // namespace triad::detail
