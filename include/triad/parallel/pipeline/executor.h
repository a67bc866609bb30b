#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "triad/autograd/weight_grad_store.h"
#include "triad/backend/device_timer.h"
#include "triad/data/token_dataset.h"
#include "triad/dist/process_group.h"
#include "triad/parallel/pipeline/schedule.h"
#include "triad/parallel/tensor/gpt.h"

namespace triad::pipeline {

// The groups a pipeline rank works with.
struct PipelineGroups {
  dist::ProcessGroupPtr tp;         // tensor-parallel group (size 1 without TP)
  dist::ProcessGroupPtr pp;         // this rank's pipeline, group rank = stage rank
  dist::ProcessGroupPtr embedding;  // first and last stage (null elsewhere)
  // Expert parallelism's group (model.moe's experts shared out among its
  // ranks); null or one rank: none.
  dist::ProcessGroupPtr ep = nullptr;
  // Context parallelism's group (each rank a chunk of every sequence, so a
  // stage sends T / cp positions on); null or one rank: none.
  dist::ProcessGroupPtr cp = nullptr;
  // How its attention layers reach the whole sequence (parallel.cp_comm).
  cp::Exchange cp_exchange = cp::Exchange::Auto;
  // Its all-to-all and ring groups under cp::Exchange::AllToAllRing.
  cp::Hierarchy cp_hierarchy = {};
};

// Layers of each of the p*v model stages: an even split, or an error naming
// the numbers (n_layer must be divisible by pp*vpp, pp <= n_layer).
std::vector<std::vector<int64_t>> split_layers(int64_t n_layer, int pp, int vpp);
// An explicit split: counts[s] layers on stage s (p*v entries, each >= 1,
// adding up to n_layer); errors name the numbers.
std::vector<std::vector<int64_t>> split_layers(int64_t n_layer, int pp, int vpp,
                                               const std::vector<int64_t>& counts);

// This rank's part of a pipeline-parallel GPT: chunk c holds model stage
// stage_at(placement, p, r, c) (r = pipeline rank; c*p + r in the loop
// placement), built from TensorParallelGpt so pipeline and tensor
// parallelism compose. Stage 0 holds the embeddings, stage S-1 the final
// LayerNorm, the head (a copy of the token embedding on another rank, the
// same module when the V placement puts both stages on rank 0, or an untied
// lm_head) and the loss. Initialisation is layout-independent, as
// everywhere.
class PipelineModel {
 public:
  PipelineModel(const nn::GptConfig& cfg, uint64_t seed, PipelineGroups groups,
                bool sequence_parallel, int vpp, std::vector<int64_t> stage_layers = {},
                Placement placement = Placement::Loop);
  int p() const { return p_; }
  int v() const { return v_; }
  int rank() const { return rank_; }
  int num_stages() const { return p_ * v_; }
  Placement placement() const { return placement_; }
  int stage_of(int chunk) const { return stage_at(placement_, p_, rank_, chunk); }
  tp::TensorParallelGpt& chunk(int c) const { return *chunks_.at(c); }
  const PipelineGroups& groups() const { return groups_; }
  const nn::GptConfig& config() const { return cfg_; }
  // Every parameter of this rank's chunks, each once (names are global; a
  // token embedding two chunks share appears once).
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  void zero_grad() const;
  // The parameters' dtype (activations travel in it); to() converts every
  // chunk (mixed precision: bf16/f16 parameters, f32 masters in the optimizer).
  DType dtype() const;
  // A tensor of the model's in the dtype its owner holds it: dtype(), but
  // an MoE layer's expert biases (state, f32 under any precision).
  DType tensor_dtype(const std::string& name) const;
  Device device() const;
  void to(DType dtype);
  void to(Device device);
  // Sums the token-embedding gradients of the first and last stage (tied
  // weights) so both copies take the same step. Nothing to do when one rank
  // holds both stages (the V placement): they share the tensor.
  void reduce_tied_embedding_grads() const;
  // Whether `chunk` is the last stage on the V placement's first rank,
  // whose head (or prediction modules) reads the first stage's token
  // embedding, the same tensor. Its gradient for that tensor adds up in a
  // buffer of its own: the executor swaps it in around the chunk's
  // backward passes (swap_head_grad, twice) and joins it to the
  // embedding's at the end of the step (join_head_grad). Each part adds up
  // in microbatch order, so the sum is the same whatever order a schedule
  // interleaves the two stages' passes in (zb-v's comes from measured
  // times): bit-identical from run to run.
  bool head_shares_token_embedding(int chunk) const;
  void swap_head_grad() const;
  void join_head_grad() const;
  // Whether the first and last stage's ranks each hold a copy of the token
  // embedding (the head or prediction modules read it, and no one rank
  // holds both stages): the embedding group's replicas. The same on every
  // rank.
  bool ties_embedding_across_ranks() const;
  // Pipeline-wide global-norm clipping; the tied embedding is counted once.
  double clip_grad_norm(double max_norm) const;
  // The same norm without clipping (identical on every rank of the pipeline).
  double grad_norm() const;
  // Its square on the model's device, not read (one f64 value, the same on
  // every rank of the pipeline): a caller reads it with other values in one
  // copy (items), the host waiting for the device once.
  Tensor grad_norm_squared() const;
  // The global L2 norm of the parameters training updates, the tied
  // embedding counted once (log.param_norm; identical on every rank).
  double param_norm() const;
  // The squares of the gradient norm (or, `of_grads` false, of the
  // parameters' norm), the tied embedding counted once, on the model's
  // device, not read: one element, or with `groups` group by group
  // (log.grad_norms, log.param_norms). The same on every rank; collective
  // over the pipeline.
  Tensor norm_squares(bool of_grads, const optim::NormGroups* groups) const;
  // Full tensors of every parameter of the whole model on every rank (TP
  // shards gathered, pipeline stages broadcast). Collective.
  nn::StateDict full_state_dict() const;
  // The same on the first pipeline rank only, as host tensors, for saving.
  // When `group_saves` (the same on every rank of a tensor-parallel group)
  // a rank joins its chunks' shards on the host (collective over the TP
  // group); when `pipeline_saves` too (the same on every rank of this
  // pipeline) it sends them to pipeline rank 0, one tensor at a time
  // through the device. Other ranks get an empty dict; no rank holds more
  // of the model on its device than one tensor beyond its own shards.
  nn::StateDict gather_state_dict(bool group_saves, bool pipeline_saves) const;
  // The same one tensor at a time: on pipeline rank 0, `take` gets each
  // tensor (on the host) in gather_order() before the next is joined, so a
  // writer holds one tensor, not the model. Other ranks only take part. An
  // error of `take` is rethrown once the other ranks' sends are received.
  void gather_each(bool group_saves, bool pipeline_saves,
                   const std::function<void(const std::string&, const Tensor&)>& take) const;
  // Every parameter's name and full shape, stage by stage (the tied wte
  // once, the first stage's): the order gather_each hands them over.
  std::vector<std::pair<std::string, Shape>> gather_order() const;
  // Takes this rank's parameters from `full` (the others may be absent).
  void load_full_state_dict(const nn::StateDict& full);
  // The same for the tensors of `part` that this rank holds (a reader's
  // part: one block); the rest of `part` is ignored, and the parameters it
  // does not name keep their values.
  void load_full_tensors(const nn::StateDict& part);
  // The blocks this rank's chunks hold (what it reads of a full state dict).
  std::set<int64_t> local_layers() const;

 private:
  double norm(bool of_grads) const;  // grad_norm or param_norm
  nn::GptConfig cfg_;
  PipelineGroups groups_;
  int p_, v_, rank_;
  Placement placement_;
  std::vector<std::vector<int64_t>> layers_;  // per stage
  std::vector<std::shared_ptr<tp::TensorParallelGpt>> chunks_;
  // The head's part of the shared token embedding's gradient between
  // swap_head_grad and join_head_grad (null otherwise).
  mutable std::shared_ptr<TensorImpl> head_grad_;
};

// What a step measured on this rank.
struct PipelineStepResult {
  // The microbatches' losses summed (the step's loss times m) on the
  // model's device, one f64 value, the same on every rank of the pipeline:
  // the last stage's sum, all-reduced over the pipeline from the others'
  // zeros (on a GPU ordered on the stream, no wait for the host).
  Tensor loss_sum;
  // The step's loss, loss_sum / m, read on the host (the same on every
  // rank); NaN when the executor does not read it (set_read_loss).
  double loss = 0;
  int peak_live_outputs = 0;   // most (chunk, microbatch) stage outputs held at once
  int64_t p2p_bytes_sent = 0;  // activations and gradients this rank sent to other stages
  // Time in F, B and W on this rank by the host's clock (on a GPU, the
  // time to queue them; the executor's timer has the device's).
  double compute_seconds = 0;
  // The same time by kind: forwards, backwards (B, or full backwards in
  // unsplit schedules) and weight-gradient passes, with their counts.
  double forward_seconds = 0, backward_seconds = 0, weight_seconds = 0;
  int forwards = 0, backwards = 0, weight_passes = 0;
  // The same per chunk of this rank (v entries). (zb-auto prices each stage
  // by the counts and the timer's chunk categories: set_chunk_timing.)
  struct ChunkTimes {
    double forward_seconds = 0, backward_seconds = 0, weight_seconds = 0;
    int forwards = 0, backwards = 0, weight_passes = 0;
  };
  std::vector<ChunkTimes> chunks;
};

// The timer category of a compute action of `kind` on model chunk `chunk`
// (PipelineExecutor::set_chunk_timing): "forward c0", "backward c1" (a whole
// backward or its input half), "weight-grad c1".
std::string chunk_category(ComputeKind kind, int chunk);

// Runs one step's forward and backward by executing this rank's action
// list of a schedule: activations forward and gradients backward through
// batched point-to-point calls on the pipeline group, split backward (B then
// W) for zero-bubble schedules, a stage output's data released as soon as it
// has been sent. Gradients accumulate into the parameters; the tied
// embedding is reduced at the end.
class PipelineExecutor {
 public:
  PipelineExecutor(PipelineModel& model, Schedule schedule);
  const Schedule& schedule() const { return schedule_; }
  // Receives a timed event for every compute action ("F3", "B3", "W3"; category
  // forward, backward, weight-grad) and every point-to-point batch ("p2p"
  // posting it, "wait F3" waiting for the payload F3 needs; category p2p),
  // as it is done on the host, with the host's clock (on a GPU that is when
  // the work was queued; the timer's traced spans below are the device's).
  using Clock = std::chrono::steady_clock;
  using EventSink = std::function<void(const std::string& name, const std::string& category,
                                       Clock::time_point start, Clock::time_point end)>;
  void set_event_sink(EventSink sink) { sink_ = std::move(sink); }
  // Also times the same work where it runs (on a GPU, events on the compute
  // stream; DeviceTimer): each compute action in its category (forward,
  // backward, weight-grad), and the point-to-point posting and waits as
  // "p2p" (on a GPU, how long the compute stream stood waiting for a
  // transfer). While the timer traces, each action is also traced under its
  // name as the sink's events are ("F3 c1"; "p2p" posting, "wait F3 c1" for
  // a peer). The timer, not owned, is read by its owner.
  void set_timer(DeviceTimer* timer) { timer_ = timer; }
  // Also times each compute action by model chunk, in the timer's category
  // chunk_category(kind, chunk) (what zb-auto measures its costs by). Adds
  // no wait.
  void set_chunk_timing(bool on) { chunk_timing_ = on; }
  // PTD-P's scatter-gather (Narayanan et al. 2021, section 4.1; on by
  // default): without sequence parallelism the t ranks of a stage's TP
  // group hold the same activation and the same gradient of it, so each
  // sends only its 1/t and the receiving stage's TP ranks all-gather the
  // pieces: one copy crosses between the stages (over the network when
  // they are on different nodes) instead of t. Values are unchanged.
  void set_scatter_gather(bool on) { scatter_gather_ = on; }
  // Whether run() reads the loss into PipelineStepResult::loss (on by
  // default; on a GPU that makes the host wait for the last stage's
  // device). A trainer that reads loss_sum with the gradient norm turns it
  // off, so a step waits for the device once.
  void set_read_loss(bool on) { read_loss_ = on; }
  // microbatches.size() must equal the schedule's m; each batch (b, T).
  // Microbatch i runs with ctx.call + i (dropout streams). Backward starts
  // from loss * loss_scale (fp16 loss scaling) over m, or times the
  // batch's loss_weight, which is microbatch i's ctx.loss_grad; the
  // reported loss is unscaled. ctx.moe_stats collects this rank's MoE
  // layers' routing.
  //
  // With `weights` (a CUDA graph's capture, train.cuda_graph), microbatch
  // i's loss weight comes from device scalars refilled before each replay
  // instead of the batch's loss_weight: its backward starts from
  // weights->seeds[i] (the loss's dtype: loss_scale times its weight; also
  // ctx.loss_grad_seed, ctx.loss_grad 0), and its loss joins loss_sum
  // times weights->factors[i] (f64). The batches' ids and targets may then
  // be device tensors, which the passes read there.
  struct DeviceLossWeights {
    std::vector<Tensor> seeds, factors;
  };
  PipelineStepResult run(const std::vector<data::Batch>& microbatches,
                         const nn::ForwardContext& ctx, double loss_scale = 1.0,
                         const DeviceLossWeights* weights = nullptr);
  // Forward only (evaluation): no autograd graph, no dropout, any number of
  // microbatches. Each rank runs its stages in (microbatch, stage) order,
  // receiving activations from the previous stage and sending them on, so
  // the transfers pair up without a schedule. Returns the mean of the
  // microbatches' mean losses, the same on every rank of the pipeline.
  double evaluate(const std::vector<data::Batch>& microbatches);
  // Forward only as evaluate, each row of each microbatch scored alone:
  // its mean loss over the targets it does not ignore (0 for a row without
  // any), in order, the same on every rank of the pipeline. Each row is read
  // as one document whatever the model's document resets, as
  // nn::score_continuations reads a request (multiple-choice evaluation).
  // With `greedy`, also whether each row's targets are what greedy decoding
  // writes (nn::rows_argmax_match; LAMBADA's accuracy), the same everywhere.
  std::vector<double> row_losses(const std::vector<data::Batch>& microbatches,
                                 std::vector<bool>* greedy = nullptr);

 private:
  // The forward-only pass evaluate and row_losses share: every
  // microbatch through this rank's stages in order, under the context
  // `ctx_of` gives it; at the last stage, `at_head` takes the head's input
  // (the final hidden states) with the batch.
  void forward_only(const std::vector<data::Batch>& microbatches,
                    const std::function<nn::ForwardContext(const data::Batch&)>& ctx_of,
                    const std::function<void(tp::TensorParallelGpt&, const Tensor&,
                                             const data::Batch&)>& at_head);
  // The last stage's loss sum (undefined elsewhere) summed over the
  // pipeline with the other ranks' zeros on the model's device: the sum on
  // every rank, one f64 value.
  Tensor summed_over_pipeline(const Tensor& last_stage_sum) const;

  PipelineModel& model_;
  Schedule schedule_;
  EventSink sink_;
  DeviceTimer* timer_ = nullptr;
  bool chunk_timing_ = false;
  bool scatter_gather_ = true;
  bool read_loss_ = true;
};

}  // namespace triad::pipeline
