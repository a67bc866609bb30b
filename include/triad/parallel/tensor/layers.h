#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "triad/dist/process_group.h"
#include "triad/nn/linear.h"
#include "triad/nn/module.h"
#include "triad/ops/linalg.h"
#include "triad/parallel/tensor/shard.h"

namespace triad::tp {

// Y = X A^T + b with A split by output rows across the TP group: every rank
// computes its slice of the output features. Input replicated (x: (B, T,
// in)) or, with sequence parallelism, sharded along T and all-gathered first.
// Output (B, T, out/tp) stays split. `groups` > 1 splits each of that many
// equal output blocks separately (fused QKV); `blocks` lists output blocks
// of different sizes, each split separately (grouped-query QKV: q, k, v),
// at whole `units` (heads; a block of fewer heads than ranks is shared, see
// ShardSpec::units). `bias` false: no b.
class ColumnParallelLinear : public nn::LinearBase {
 public:
  ColumnParallelLinear(int64_t in, int64_t out, dist::ProcessGroupPtr group, bool sequence_parallel,
                       int groups = 1, bool bias = true);
  ColumnParallelLinear(int64_t in, const std::vector<int64_t>& blocks, dist::ProcessGroupPtr group,
                       bool sequence_parallel, bool bias = true,
                       const std::vector<int64_t>& units = {});
  // draw: where the adapters' dropout masks come from (none by default).
  Tensor forward(const Tensor& x, const nn::DropoutDraw& draw = {}) const;
  // gelu(forward(x)) with its pre-activation, the GELU fused into the GEMM
  // where the backend can (for RowParallelLinear::forward_after_gelu).
  LinearGelu forward_gelu(const Tensor& x, const nn::DropoutDraw& draw = {}) const;
  const ShardSpec& weight_spec() const { return weight_spec_; }
  const ShardSpec& bias_spec() const { return bias_spec_; }
  // LoRA's adapters (enable_lora): lora_a (rank, in) whole on every rank,
  // its gradient a partial sum over the group (each rank's output rows
  // contribute); lora_b (out, rank) split as the weight's rows.
  static ShardSpec lora_a_spec() { return ShardSpec::replicated(true); }
  const ShardSpec& lora_b_spec() const { return weight_spec_; }

 private:
  dist::ProcessGroupPtr group_;
  bool sp_;
  ShardSpec weight_spec_, bias_spec_;
};

// Y = X A^T + b with A split by input columns: the input arrives split
// (B, T, in/tp); partial products are all-reduced (or reduce-scattered along
// T with sequence parallelism), then the replicated bias (if `bias`) is added.
class RowParallelLinear : public nn::LinearBase {
 public:
  RowParallelLinear(int64_t in, int64_t out, dist::ProcessGroupPtr group, bool sequence_parallel,
                    bool bias = true);
  Tensor forward(const Tensor& x, const nn::DropoutDraw& draw = {}) const;
  // forward(in.act) with the input gradient taken to in.pre through GELU's
  // derivative in one backend call (ops linear_after_gelu).
  Tensor forward_after_gelu(const LinearGelu& in, const nn::DropoutDraw& draw = {}) const;
  // forward = reduce(partial(x)): this rank's share of the output (its
  // input columns' product, LoRA's part included) before the group sums
  // it; then the sum over the group (reduce-scattered along T under
  // sequence parallelism) plus the bias. `partial` may add another
  // row-parallel layer's share of the same output shape, `other`, whose
  // bias is then added too: GPT-NeoX's parallel residual sums the
  // attention's and the MLP's shares and reduces once.
  Tensor partial(const Tensor& x, const nn::DropoutDraw& draw = {}) const;
  Tensor partial_after_gelu(const LinearGelu& in, const nn::DropoutDraw& draw = {}) const;
  Tensor reduce(const Tensor& partial, const RowParallelLinear* other = nullptr) const;
  const ShardSpec& weight_spec() const { return weight_spec_; }
  const ShardSpec& bias_spec() const { return bias_spec_; }
  // LoRA's adapters (enable_lora): lora_a (rank, in) split as the
  // weight's columns, so each rank's B A x is a partial sum that joins the
  // layer's own before the group sums it (no collective of their own);
  // lora_b (out, rank) whole on every rank, its gradient a partial sum over
  // the group. Dropout on their input draws this rank's slice of the
  // unsharded layer's masks.
  const ShardSpec& lora_a_spec() const { return weight_spec_; }
  static ShardSpec lora_b_spec() { return ShardSpec::replicated(true); }

 private:
  dist::ProcessGroupPtr group_;
  bool sp_;
  ShardSpec weight_spec_, bias_spec_;
};

// Token embedding with the (padded) vocabulary split by rows: each rank looks
// up the ids in its range, zeros elsewhere, then the partial results are
// all-reduced (or reduce-scattered along T with sequence parallelism).
class VocabParallelEmbedding : public nn::Module {
 public:
  // bias: a (vocab) bias split as the rows are, for the table used as an
  // output head with biased logits (model.head_bias); lookups ignore it.
  VocabParallelEmbedding(int64_t vocab_size, int64_t dim, dist::ProcessGroupPtr group,
                         bool sequence_parallel, bool bias = false);
  Tensor forward(const Tensor& ids) const;
  Tensor& weight() { return weight_; }
  const Tensor& weight() const { return weight_; }
  // Undefined without one.
  const Tensor& bias() const { return bias_; }
  const ShardSpec& spec() const { return spec_; }
  int64_t vocab_start() const { return start_; }
  // Real (unpadded) rows of this rank's shard.
  int64_t valid_rows() const { return valid_; }

 private:
  dist::ProcessGroupPtr group_;
  bool sp_;
  ShardSpec spec_;
  Tensor weight_, bias_;
  int64_t vocab_ = 0;  // the whole vocabulary's rows (unpadded)
  int64_t start_ = 0, valid_ = 0;
};

// Mean cross entropy from vocabulary-split logits (..., V_local) without
// ever gathering them: three all-reduces over the group (row max, target
// logit, sum of exponentials). Columns past `valid` are padding. Targets are
// on the logits' device or the host (read there once: host targets never
// make the host wait); a target of -100 is ignored, as by cross_entropy:
// the mean is over the other rows. The loss is computed on the logits'
// device (nothing is read back). z_loss: as for cross_entropy (the same on
// every rank of the group).
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                    int64_t vocab_start, int64_t valid,
                                    const dist::ProcessGroupPtr& group, Tensor* z_loss = nullptr);
// The head and that loss in one op (linear_head_loss): this rank's logits
// x @ weight^T (weight its vocabulary shard) in padded rows, overwritten by
// their gradient in backward — what the GPT's last stage runs. softcap > 0
// soft-caps the logits first (linear_cross_entropy's softcap); the padding
// columns past `valid` are capped too and stay out of the loss. `comm`
// (enter_region's) takes x's gradient back through the TP collective while
// the head's weight gradient computes.
// bias: this rank's shard of the head's bias (model.head_bias), or
// undefined. z_loss and z_loss_coef: as for linear_cross_entropy (with
// z_loss_coef > 0 the z-loss joins the loss's gradient).
// A group of one rank (no tensor parallelism) holds the whole vocabulary:
// the loss is then linear_cross_entropy's, over the first `valid` columns,
// and expected_grad is as for linear_cross_entropy (the logits' gradient
// written with the loss, in one pass over them); a larger group ignores it
// (its collectives come between the passes).
Tensor vocab_parallel_linear_cross_entropy(const Tensor& x, const Tensor& weight,
                                           const Tensor& targets, int64_t vocab_start,
                                           int64_t valid, const dist::ProcessGroupPtr& group,
                                           double softcap = 0.0, const InputGradComm& comm = {},
                                           const Tensor& bias = {}, Tensor* z_loss = nullptr,
                                           double expected_grad = 0.0, double z_loss_coef = 0.0);

}  // namespace triad::tp
