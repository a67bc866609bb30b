#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "triad/dist/process_group.h"
#include "triad/nn/embedding.h"
#include "triad/nn/gpt.h"
#include "triad/nn/latent_attention.h"
#include "triad/nn/layer_norm.h"
#include "triad/nn/moe.h"
#include "triad/optim/clip.h"
#include "triad/parallel/context/exchange.h"
#include "triad/parallel/context/hierarchical.h"
#include "triad/parallel/context/layout.h"
#include "triad/parallel/tensor/layers.h"

namespace triad::tp {

// Which part of the model a pipeline stage holds: a run of layers (global
// indices, ascending), the embeddings (first stage) and/or the final
// LayerNorm with the output head and the loss (last stage; it holds its own
// copy of the token embedding when the head is tied to it, else lm_head).
struct StagePlan {
  std::vector<int64_t> layers;
  bool embedding = true;
  bool head = true;
  static StagePlan whole(int64_t n_layer);
};

// GPT-2 split Megatron-style over a tensor-parallel group: attention heads
// and the MLP's hidden units split (column then row parallel; each expert's
// alike in a mixture of experts, whose router every rank holds), vocabulary
// split for the embedding, the tied head and the loss; with sequence
// parallelism, LayerNorms and residuals work on sequence shards. Parameter
// names are nn::Gpt's; each holds its shard of the full tensor (shard_specs()).
// Initialisation cuts the full layout-independent initial values, so any tp
// starts from bitwise the weights of one process.
class TensorParallelGpt : public nn::Module {
 public:
  TensorParallelGpt(const nn::GptConfig& cfg, uint64_t seed, dist::ProcessGroupPtr group,
                    bool sequence_parallel);
  // One pipeline stage of the model (parameter names stay global). With
  // `experts`, an expert-parallel group of more than one rank, a mixture's
  // experts are shared out among its ranks (ep::ExpertParallel): this rank
  // holds its block of each MoE layer's experts, and the ranks exchange
  // tokens in every forward and backward pass of those layers.
  // With `context`, a context-parallel group of P > 1 ranks holding the
  // same parameters (cp::sequence_to_heads): callers pass whole sequences
  // (B, T) of ids and targets as always, and this rank computes on its
  // chunk [r T / P, (r + 1) T / P) of them, every attention layer
  // reaching the whole sequence through the group by `exchange`
  // (cp::Exchange: heads all-to-all, keys and values all-gathered or passed
  // around a ring, or all-to-alls inside `hierarchy`'s groups and a ring
  // across them; Auto picks the all-to-all where the heads share out; the
  // rank's tokens are then the layout's, cp::layout_of). Its loss is
  // its chunk's share of the sequence's mean times P (their mean over the
  // group, which the data-parallel mean takes when the group's ranks are
  // data-parallel ranks, is the whole sequence's mean loss), its
  // gradients likewise; logits and head_logits are gathered whole. Dropout
  // draws one process's masks, each rank its tokens' elements of them
  // (site_dropout; nn::sequence_dropout).
  TensorParallelGpt(const nn::GptConfig& cfg, uint64_t seed, dist::ProcessGroupPtr group,
                    bool sequence_parallel, StagePlan plan, dist::ProcessGroupPtr experts = nullptr,
                    dist::ProcessGroupPtr context = nullptr,
                    cp::Exchange exchange = cp::Exchange::Auto, cp::Hierarchy hierarchy = {});
  // A last stage whose tied head uses `embedding`, the token embedding of
  // the first stage held by the same rank (ZB-V's V placement): one tensor,
  // whose gradient sums both uses, under one name. ValueError unless the
  // plan is a head without the embedding and the model ties them.
  TensorParallelGpt(const nn::GptConfig& cfg, uint64_t seed, dist::ProcessGroupPtr group,
                    bool sequence_parallel, StagePlan plan,
                    std::shared_ptr<VocabParallelEmbedding> embedding,
                    dist::ProcessGroupPtr experts = nullptr,
                    dist::ProcessGroupPtr context = nullptr,
                    cp::Exchange exchange = cp::Exchange::Auto, cp::Hierarchy hierarchy = {});
  const StagePlan& plan() const { return plan_; }
  const nn::GptConfig& config() const { return cfg_; }
  const dist::ProcessGroupPtr& group() const { return group_; }
  bool sequence_parallel() const { return sp_; }
  // The context-parallel group (null without context parallelism).
  const dist::ProcessGroupPtr& context_group() const { return cp_; }
  // How the attention layers reach the whole sequence under context
  // parallelism (resolved: never Auto; AllToAll without it).
  cp::Exchange context_exchange() const { return exchange_; }

  // Called with each part's parameters just before a forward pass first
  // reads them — the embeddings, each block, the final norm and the head —
  // e.g. to wait for their ZeRO-1 all-gather
  // (dp::GradientReducer::wait_gathered) so the gathers of later layers
  // overlap the earlier layers' work. None by default.
  using ParameterFence = std::function<void(const nn::Module&)>;
  void set_parameter_fence(ParameterFence fence) { fence_ = std::move(fence); }

  // ctx with the packed-document tensors of ids (nn::with_documents) under
  // this model's settings, on its device: computed once per micro-batch and
  // passed to embed and every block (loss and logits do it themselves).
  // Under context parallelism: the whole sequences' first keys, this
  // rank's chunk's positions, and a dropout call of the rank's own.
  nn::ForwardContext with_documents(const Tensor& ids, const nn::ForwardContext& ctx) const;
  // A context made for the whole sequences of ids (nn::with_one_document's,
  // say) as this rank's chunk reads it: with_documents' last part (ctx
  // unchanged without context parallelism).
  nn::ForwardContext chunked(const Tensor& ids, const nn::ForwardContext& whole) const;
  // ids (B, T) -> hidden (B, T, C), or (B, T/tp, C) with sequence parallelism.
  Tensor embed(const Tensor& ids, const nn::ForwardContext& ctx) const;
  Tensor block(int64_t i, const Tensor& x, const nn::ForwardContext& ctx) const;
  // The blocks `layers` (this stage's, in order) from x, the values of
  // block() run one after another; but each MLP's residual add runs inside
  // the next block's ln_1 (nn::Block::Stream), so no add of its own runs
  // between them, forward or backward. Only the last block's add runs
  // apart (the stage's output is one tensor).
  Tensor blocks(const std::vector<int64_t>& layers, const Tensor& x,
                const nn::ForwardContext& ctx) const;
  // hidden -> mean loss against targets (B, T).
  Tensor head_loss(const Tensor& hidden, const Tensor& targets) const;
  // With model.mtp_layers or model.z_loss_coef, while training, the
  // multi-token-prediction modules' losses and the z-loss join the gradient
  // as nn::Gpt::loss's do.
  Tensor loss(const Tensor& ids, const Tensor& targets, const nn::ForwardContext& ctx = {}) const;
  // The last stage's loss: head_loss of hidden (the last block's output)
  // against targets, while training carrying the prediction modules' losses
  // and the z-loss as loss() does; ids (B, T) are the micro-batch's inputs
  // and ctx its with_documents'.
  Tensor head_objective(const Tensor& hidden, const Tensor& ids, const Tensor& targets,
                        const nn::ForwardContext& ctx) const;
  // Multi-token prediction's loss at each depth (nn::Gpt::mtp_losses) for
  // hidden, the last block's output, on ids under ctx (with_documents').
  std::vector<Tensor> mtp_losses(const Tensor& hidden, const Tensor& ids, const Tensor& targets,
                                 const nn::ForwardContext& ctx) const;
  // Logits gathered over the vocabulary (B, T, V): for tests and inference.
  Tensor logits(const Tensor& ids, const nn::ForwardContext& ctx = {}) const;
  // hidden (B, T, C), or its shard (B, T/tp, C) with sequence parallelism ->
  // the logits gathered over the vocabulary (B, length, V) of positions
  // [start, start + length) of the whole sequence (length -1: to its end).
  // Collective over the group: every rank asks for the same positions.
  Tensor head_logits(const Tensor& hidden, int64_t start = 0, int64_t length = -1) const;

  const std::map<std::string, ShardSpec>& shard_specs() const { return specs_; }
  // The full shapes of the parameters this rank holds (its shards').
  const std::map<std::string, Shape>& full_shapes() const { return full_shapes_; }
  // The experts of this part of the model that other ranks of the
  // expert-parallel group hold (empty without expert parallelism).
  const std::map<std::string, Shape>& others_experts() const { return others_experts_; }
  // Whether `name` is a mixture's expert weight (held here or not).
  static bool is_expert(const std::string& name);
  // The expert-parallel group (null without expert parallelism).
  const dist::ProcessGroupPtr& expert_group() const { return expert_group_; }
  // Loads full (unsharded) tensors, each rank cutting its shard.
  void load_full_state_dict(const nn::StateDict& full);
  // The same for some of the parameters (a reader's part: one block); the
  // others keep their values, and experts another rank holds are passed
  // over. A name that is not a parameter is an error.
  void load_full_tensors(const nn::StateDict& part);
  // Gathers every shard into the full tensors (collective over the group,
  // and for a mixture's experts under expert parallelism over the
  // expert-parallel group too: every expert of this part of the model
  // reaches every rank), on the parameters' device, or on the host
  // (`on_host`: each tensor leaves the device as soon as it is joined, so
  // the device never holds more than one full tensor at a time).
  nn::StateDict full_state_dict(bool on_host = false) const;
  // One parameter of it, held here or by another expert-parallel rank
  // (collective as full_state_dict: every rank names the same parameters in
  // the same order), for a writer that takes the model one tensor at a
  // time.
  Tensor full_tensor(const std::string& name, bool on_host = false) const;
  // All-reduce the partial gradients of replicated parameters over the
  // group (ShardSpec::partial_grad: under sequence parallelism LayerNorms
  // and row-parallel biases; the query/key norms always), and sum each
  // shared key/value head's gradient over the ranks sharing it.
  void reduce_partial_grads() const;
  // Whether reduce_partial_grads changes the parameter's gradient (the data-
  // parallel reduction takes such gradients last): the partial sums above,
  // and the key/value heads that several ranks share (ShardSpec::units);
  // never in a group of one.
  bool reduces_after_backward(const std::string& name) const;
  // The elements of a parameter's shard that another rank of the group
  // holds too (a shared key/value head, on all but the first rank holding
  // it), as [begin, end) ranges: a norm counts them once.
  std::vector<std::pair<int64_t, int64_t>> repeated_elements(const std::string& name) const;
  // PyTorch's global-norm clipping over the whole model: split parameters'
  // squares summed over the group, replicated ones counted once. Returns the
  // norm before clipping (identical on every rank).
  double clip_grad_norm(double max_norm) const;
  // The same norm without clipping (a trainer folds the coefficient into
  // the optimizer step instead).
  double grad_norm() const;
  // This stage's share of the global squared gradient norm (split
  // parameters summed over the group); without the token embedding when
  // `count_embedding` is false (its tied copy is counted elsewhere). An f64
  // tensor of one element on the parameters' device: the caller adds other
  // shares there and reads the total once (each read makes the host wait
  // for the GPU). Collective over the TP group.
  Tensor grad_norm_squared(bool count_embedding = true) const;
  // The same share group by group (log.grad_norms), or of the parameters'
  // values (log.param_norms; `of_grads` false): an f64 tensor of
  // groups.size() elements. Collective over the TP group.
  Tensor norm_squares(const optim::NormGroups& groups, bool of_grads,
                      bool count_embedding = true) const;
  // The same over the values of the parameters training updates (those
  // that require a gradient): the model's global L2 norm (log.param_norm).
  Tensor param_norm_squared(bool count_embedding = true) const;
  double param_norm() const;
  void scale_grads(double coef) const;
  const Tensor& token_embedding() const { return wte_->weight(); }
  const std::shared_ptr<VocabParallelEmbedding>& token_embedding_module() const { return wte_; }
  // Whether this stage holds the token embedding (first stage, or the last
  // one's tied copy).
  bool holds_token_embedding() const { return wte_ != nullptr; }

 private:
  // grad_norm_squared (of_grads) or param_norm_squared; by group when
  // `groups` is given (else one element).
  Tensor norm_squared(bool count_embedding, bool of_grads,
                      const optim::NormGroups* groups = nullptr) const;
  // Block i on the stream `in` (its pending add run first, in ln_1 where
  // the block has one); the MLP's add left pending in the sequential
  // pre-norm block, none pending after the others.
  nn::Block::Stream block_stream(int64_t i, const nn::Block::Stream& in,
                                 const nn::ForwardContext& ctx) const;
  // Whether block i recomputes in backward (model.recompute).
  bool recomputed(int64_t i) const;
  // head_loss with `norm` in ln_f's place (a prediction module's ln_out);
  // z_loss, when not null, receives the cross entropy's z-loss beside it,
  // which joins the loss's gradient with weight model.z_loss_coef.
  // expected_grad: the gradient the loss will get in backward, or 0
  // (vocab_parallel_linear_cross_entropy's).
  Tensor head_loss_after(const nn::LayerNorm& norm, const Tensor& hidden, const Tensor& targets,
                         Tensor* z_loss = nullptr, double expected_grad = 0.0) const;
  // embed() on this rank's chunk of the ids (all of them without context
  // parallelism).
  Tensor embed_chunk(const Tensor& ids, const nn::ForwardContext& ctx) const;
  // model.dropout at a named site (identity when not training): one
  // process's mask for the tokens this rank holds, in every layout.
  Tensor site_dropout(const Tensor& x, const nn::ForwardContext& ctx, int64_t layer,
                      const char* site) const;
  // Parameter `p`'s full tensor, joined from the group's shards.
  Tensor join(const std::string& name, const Tensor& p, bool on_host) const;
  Tensor parameter(const std::string& name, const char* caller) const;
  struct Layer {
    std::shared_ptr<nn::Module> module;  // the block's parameters, for recomputation
    std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
    std::shared_ptr<nn::LayerNorm> q_norm, k_norm;                 // model.qk_norm: true, full
    std::shared_ptr<nn::HeadLayerNorm> q_head_norm, k_head_norm;   // model.qk_norm: head_layernorm
    std::shared_ptr<nn::LayerNorm> post_attn_norm, post_mlp_norm;  // model.post_norms only
    std::shared_ptr<ColumnParallelLinear> c_attn, c_fc;            // c_fc: dense layers only
    std::shared_ptr<RowParallelLinear> attn_proj, mlp_proj;
    std::shared_ptr<nn::MoeMlp> moe;  // model.moe's layers: each expert split like the MLP
    // model.mla's layers (no c_attn then): the queries' and the keys' and
    // values' up-projections split at whole heads, the rest on every rank.
    std::shared_ptr<nn::LatentProjections> latent;
  };
  // x (this rank's tokens under sequence parallelism) as every rank's
  // layers that make heads read it: the whole sequence, its gradient summed
  // over the group in backward (copy_to_region, or
  // gather_from_sequence_region).
  Tensor enter_heads(const Tensor& x) const;
  // model.qk_norm: full on this rank's fused qkv (its `heads`).
  Tensor full_query_key_norm(const Layer& L, const Tensor& qkv, const AttentionHeads& heads) const;
  // A mixture-of-experts layer's share of its output for `in` (ln_2's):
  // this rank's partial sum over the whole sequence, before the group
  // reduces it.
  Tensor moe_share(const Layer& L, const Tensor& in, const nn::ForwardContext& ctx) const;
  nn::GptConfig cfg_;
  dist::ProcessGroupPtr group_;
  bool sp_;
  dist::ProcessGroupPtr cp_;                    // more than one rank, or null
  cp::Exchange exchange_ = cp::Exchange::Auto;  // as asked; build() resolves it
  cp::Hierarchy hierarchy_;                     // under Exchange::AllToAllRing
  // Under context parallelism the sequence of T tokens each rank computes
  // on its chunk of: {first, count}; {0, T} without.
  // This rank's runs of a row of T tokens under context parallelism
  // (cp::chunk_runs; the whole row without it), T checked for `what`.
  std::vector<cp::Run> chunk_runs(int64_t T, const char* what) const;
  // This rank's layout of a row (cp::layout_of the resolved exchange; one
  // rank without context parallelism).
  cp::Layout layout() const;
  // ValueError unless ctx holds this rank's chunk's positions (B, chunk),
  // as with_documents gives them under context parallelism.
  void require_chunk_positions(const nn::ForwardContext& ctx, int64_t B, int64_t chunk) const;
  // The attention of this rank's heads over qkv (under context parallelism
  // exchanged for the whole sequence and back).
  Tensor attention(const Tensor& qkv, const AttentionHeads& heads, const Tensor& starts) const;
  void build(uint64_t seed, std::shared_ptr<VocabParallelEmbedding> embedding = nullptr);
  dist::ProcessGroupPtr expert_group_;  // more than one rank, or null
  std::shared_ptr<const nn::ExpertPlacement> experts_;
  std::map<std::string, Shape> others_experts_;
  void require(bool held, const char* what) const;
  std::shared_ptr<VocabParallelEmbedding> wte_;
  // The output head's vocabulary shard: wte_ when tied, else its own
  // lm_head (split like wte; only its weight is used).
  std::shared_ptr<VocabParallelEmbedding> head_;
  std::shared_ptr<nn::Embedding> wpe_;
  StagePlan plan_;
  std::map<int64_t, Layer> layers_;  // (prediction modules' blocks from n_layer on)
  // A multi-token-prediction module (model.mtp_layers; last stage): its
  // block is layers_[layer].
  struct Mtp {
    std::shared_ptr<nn::LayerNorm> ln_embed, ln_hidden, ln_out;
    std::shared_ptr<nn::Linear> eh_proj;
    int64_t layer = 0;
  };
  std::vector<Mtp> mtp_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
  std::map<std::string, ShardSpec> specs_;
  std::map<std::string, Shape> full_shapes_;  // every parameter's unsharded shape
  ParameterFence fence_;
  void fence(const nn::Module* m) const {
    if (fence_ && m) fence_(*m);
  }
};

}  // namespace triad::tp
