#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "triad/backend/device_timer.h"
#include "triad/data/blended_dataset.h"
#include "triad/data/fill_in_the_middle.h"
#include "triad/data/token_dataset.h"
#include "triad/dist/mesh.h"
#include "triad/nn/gpt.h"
#include "triad/optim/adamw.h"
#include "triad/optim/loss_scaler.h"
#include "triad/optim/lr_schedule.h"
#include "triad/optim/muon.h"
#include "triad/optim/weight_decay_schedule.h"
#include "triad/parallel/context/exchange.h"
#include "triad/parallel/data/grad_reducer.h"
#include "triad/parallel/pipeline/executor.h"
#include "triad/parallel/pipeline/simulator.h"
#include "triad/parallel/tensor/gpt.h"
#include "triad/train/checkpoint_reshard.h"
#include "triad/train/choice_eval.h"
#include "triad/train/config.h"
#include "triad/train/eval_text.h"
#include "triad/train/lambada_eval.h"
#include "triad/train/metrics.h"
#include "triad/train/spike_filter.h"
#include "triad/train/trace.h"

namespace triad::train {

// The training loop: gradient accumulation over micro-batches, global-norm
// clipping, AdamW with warm-up + cosine LR, console lines and metrics.jsonl
// (rank 0), final GPT-2 safetensors (gathered, written by rank 0). The world
// is laid out as a (tp, pp, dp) mesh, checked against the world size before
// any other communicator: tensor parallelism splits the model in each stage,
// a pipeline (pp > 1) runs the configured schedule, and data-parallel ranks
// each take their contiguous share of every global batch and average their
// gradients.
//
// Its code, by concept, in src/train/: trainer.cpp (the step and the loop),
// trainer_setup.cpp (the mesh, model, optimizers and data; --check),
// trainer_checkpoint.cpp (checkpoints written and resumed, the final
// weights), trainer_eval.cpp (validation loss, scores, samples),
// trainer_timing.cpp (the step's phases, traces, rank timings) and
// captured_step.cpp (train.cuda_graph).
class Trainer {
 public:
  // `world` defaults to a world of one process.
  explicit Trainer(Config config, dist::ProcessGroupPtr world = nullptr);
  // Closes a profiling window (log.profile_steps) a run left open.
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  // Runs config.train.steps steps (from the newest checkpoint with
  // checkpoint.resume: auto) and writes output_dir/model.safetensors. On
  // SIGTERM/SIGINT it finishes the current step, checkpoints (when
  // checkpoint.dir is set) and returns normally.
  std::vector<StepMetrics> run();
  // triad-train --check: what run() sets up (the summary it logs, the
  // checkpoint directory tried for writing, the checkpoint it would
  // resume), then one step from there (the first one's one-time costs
  // included), writing nothing else: no output.dir, no checkpoint. Returns
  // that step's metrics (its time and peak memory: what the run needs;
  // rank_peak_memory: every rank's).
  StepMetrics check();
  // One optimizer step (0-based index); exposed for tests.
  // A step train.skip_steps names passes its batch over (pass_over).
  StepMetrics step(int64_t index);
  // The mean loss over the validation tokens of set `set` of data.val (the
  // first eval.batches global batches, split over the layout as training
  // batches are), forward only and without dropout. Collective; the same
  // on every rank. An error when the config has no such set.
  double evaluate(size_t set = 0);
  // Accuracy on the questions of set `set` of eval.choices, as triad-eval
  // scores them: one process through triad-eval's scorer
  // (nn::score_continuations, micro_batch_size rows at a time: shared
  // contexts and few-shot beginnings read once); a parallel layout with
  // every choice a row, micro_batch_size rows at a time longest first,
  // each data-parallel rank scoring its share. Forward only. Collective;
  // the same on every rank. An error when the config has no such set.
  StepMetrics::ChoiceScores evaluate_choices(size_t set = 0);
  // LAMBADA on set `set` of eval.lambada (each data-parallel rank scores
  // its share; every text a row, read as eval.choices' are), as triad-eval
  // --lambada scores it. Collective; the same on every rank. An error when
  // the config has no such set.
  StepMetrics::LambadaScores evaluate_lambada(size_t set = 0);
  // triad-train --eval-only: the validation loss (and eval.choices' and
  // eval.lambada's scores) of the weights this trainer starts from (init.from, or the
  // newest checkpoint with checkpoint.resume: auto), logged and returned;
  // nothing is written. Collective. An error with nothing to evaluate.
  StepMetrics evaluate_only();
  // Global batches one evaluation covers (0 without data.val).
  int64_t eval_batches() const { return val_.empty() ? 0 : val_.front().batches; }
  // Test hook: runs on the writing thread of every asynchronous checkpoint
  // (checkpoint.async) before it writes; an exception it throws is the
  // write's error.
  void before_checkpoint_write(std::function<void()> hook) {
    before_checkpoint_write_ = std::move(hook);
  }
  // Test hook: this rank's loss (and so its gradients) becomes NaN at the
  // `count` (0-based) steps from `index` on (layouts without a pipeline).
  void inject_nan_at(int64_t index, int64_t count = 1) {
    nan_step_ = index;
    nan_steps_ = count;
  }
  // Test hook: after step `index`'s update (0-based), just before its
  // replica check (parallel.check_replicas_interval), this rank flips the
  // lowest bit of the first byte of its copy of parameter `name` — what
  // silent data corruption would do. A name this rank does not hold is a
  // ValueError here.
  void flip_parameter_bit_at(int64_t index, const std::string& name);
  const dp::GradientReducer* reducer() const { return reducer_.get(); }
  // The fp16 loss scaler (null for fp32 and bf16).
  const optim::DynamicLossScaler* loss_scaler() const { return scaler_.get(); }
  // Elements of AdamW moment state this rank keeps (per moment).
  int64_t optimizer_state_elements() const;
  // train.ema_decay: this rank's running averages of its trainable weights
  // (f32, its own pieces of them, by parameter name), every applied step
  // folded in; empty without it.
  std::vector<std::pair<std::string, Tensor>> ema_parameters();
  // The model's parameters as full (unsharded) tensors; collective.
  nn::StateDict full_state_dict() const;
  bool is_logging_rank() const { return !world_ || world_->rank() == 0; }
  const Config& config() const { return config_; }

 private:
  std::vector<std::pair<std::string, Tensor>> parameters() const;
  // train.ema_decay: the trainable weights' running averages (f32, on the
  // device), in trainable_parameters() order.
  std::vector<std::pair<std::string, Tensor>> ema_;
  // An applied step whose weights the averages do not hold yet: with
  // ZeRO-1's overlapped all-gathers they arrive under the next forward, so
  // they are folded in before the next update (or whatever reads them).
  // The steps (0-based, [from, to)) whose events trace.json records
  // (log.trace_steps; by default the first kTracedSteps the run trains).
  int64_t trace_from_ = 0, trace_to_ = 0;
  // Sets them for a run whose first step is `first` (0-based).
  void trace_steps_from(int64_t first);
  // trace.json's rows on one clock: after a barrier each node's first rank
  // reads its clock, and every rank of that node takes the reading as its
  // trace's time 0 (the ranks of a node share the clock itself, so their
  // rows line up exactly; nodes line up within the barrier's exit skew).
  // Collective; before the first step.
  void align_trace_clock();
  // log.nvtx, log.profile_steps, log.profile_ranks: whether this rank
  // profiles, and whether it has started the CUDA profiler.
  bool profiling_rank_ = true;
  bool profiler_started_ = false;
  // Before step `index` (0-based): NVTX ranges on when the step is in the
  // window, and the CUDA profiler started on its first step or stopped
  // after its last.
  void enter_profile_window(int64_t index);
  // NVTX ranges off and the profiler stopped (the run's end).
  void leave_profile_window();
  bool ema_pending_ = false;
  // Whether the averages hold any step (or a checkpoint's): evaluations
  // score them only then. The same on every rank.
  bool ema_folded_ = false;
  // The averages restart from the weights as they stand.
  void reset_ema();
  // After a resume: `fresh` averages (of this rank's) started from the
  // weights, the checkpoint holding none for them; `metadata`, the
  // checkpoint's, says whether it kept any.
  void ema_started(int64_t fresh, const std::map<std::string, std::string>& metadata);
  bool ema_on() const { return config_.train.ema_decay > 0; }
  void fold_ema();
  // Runs fn with the averages in the trainable weights' place (rounded to
  // their dtype), then puts the weights back as they were.
  void with_ema_weights(const std::function<void()>& fn);
  struct WrittenWeights {
    bool merged = false;      // LoRA's adapters merged in
    std::string adapter_dir;  // where the PEFT adapters went, if anywhere
  };
  WrittenWeights write_weights(const std::string& path, bool adapters) const;
  // step() of a step that trains: forward, backward, update.
  StepMetrics train_step(int64_t index);
  // step() of a step train.skip_steps names: its global batch goes by
  // unread and nothing changes but the data's place (no collective).
  StepMetrics pass_over(int64_t index);
  // Those parameters that train (all but train.freeze's): the optimizer's,
  // the gradient reducer's and the gradient norm's.
  std::vector<std::pair<std::string, Tensor>> trainable_parameters() const;
  void zero_grad() const;
  // The batch with data.eod_mask_loss applied (the batch itself without it).
  data::Batch with_loss_mask(data::Batch batch) const;
  // train.loss_average tokens: each batch's loss_weight, its share of the
  // unmasked targets of all the batches on every data-parallel rank (one
  // small all-reduce over dp); otherwise nothing.
  void weigh_by_tokens(std::vector<data::Batch>& batches) const;
  // This rank's share of a step's loss, its mean over its tokens: `sum` /
  // `count`, `sum` on the loss's device until read (a pipeline's summed
  // over its stages there). train_step reads it in one copy with the
  // gradient norm's square (grad_norm_and_loss), so a step waits for the
  // device once, not twice.
  struct StepLoss {
    Tensor sum;  // f64, one value
    double count = 1;
  };
  // The step's global gradient norm (before clipping) and this rank's loss,
  // read from the device in one copy, with the side losses' sums
  // (mtp_stats_, z_loss_stats_: LossSums::read) and the mixture's routing
  // left on the device (moe_stats_, settled: MoeStats::pending). Collective
  // over the pipeline, the tensor-parallel group and (ZeRO-1) the world,
  // as the norm is.
  // With `group_squares` under log.grad_norms, the groups' squares too;
  // `words` (a captured step's cuda::Graph::check_words, or an uncaptured
  // one's cuda::DeviceChecks::words: its checks of its device indices)
  // come back in `word_values`, for their check(word_values).
  std::pair<double, double> grad_norm_and_loss(const StepLoss& step_loss,
                                               std::vector<double>* group_squares = nullptr,
                                               const std::vector<Tensor>& words = {},
                                               std::vector<int64_t>* word_values = nullptr) const;
  // Forward and backward of this rank's share of step `index`. Times its
  // passes in step_timer() (and, for pipelines, the whole of them as
  // "pipeline").
  StepLoss forward_backward(int64_t index);
  // train.cuda_graph: the step's passes captured once (the second step)
  // and replayed on each later step's batches (captured_step.cpp's
  // CapturedStep: the graph, its device batches and loss). Null until then,
  // and without train.cuda_graph.
  struct CapturedStep;
  std::unique_ptr<CapturedStep> captured_;
  int64_t uncaptured_steps_ = 0;  // train.cuda_graph: steps run before the capture
  StepLoss captured_forward_backward(const std::vector<data::Batch>& batches, uint64_t call);
  // The step's MoE routing statistics (model.moe), gathered from every rank
  // into m.
  void moe_metrics_into(StepMetrics& m) const;
  // Each MoE layer's expert loads of the step summed over every rank,
  // layer by layer ((n_layer + mtp_layers) x experts; zeros for the dense
  // ones). Collective the first time in a step (the expert biases' update
  // and log.moe_per_layer share the sum).
  const std::vector<double>& world_expert_loads() const;
  mutable std::optional<std::vector<double>> world_expert_loads_;  // this step's, once summed
  // Multi-token prediction's losses (model.mtp_layers) and the z-loss
  // (model.z_loss_coef) this step, into m.
  void side_loss_metrics_into(StepMetrics& m) const;
  // model.moe.expert_bias: the step's loads of every MoE layer, summed over
  // every rank, move the biases this rank holds (after an applied step).
  void update_expert_biases();
  // Every optimizer's weight decay from this step on (train.weight_decay_schedule).
  void set_weight_decay(double weight_decay);
  // parallel.check_replicas_interval: after step `index`, every replica of
  // each parameter compares checksums; a difference anywhere throws on
  // every rank, naming what differs. Collective.
  void check_replicas(int64_t index);
  // (layer, its expert biases) on this rank, found at the first update.
  std::optional<std::vector<std::pair<int64_t, Tensor>>> expert_biases_;
  std::shared_ptr<nn::MoeStats> moe_stats_;  // this step's, on this rank (model.moe)
  // This step's, on this rank: model.mtp_layers's, model.z_loss_coef's.
  std::shared_ptr<nn::LossSums> mtp_stats_, z_loss_stats_;

  Config config_;
  dist::ProcessGroupPtr world_;
  std::unique_ptr<dist::DeviceMesh> mesh_;
  // Data-parallel replicas (each its own sequences) and this rank's; under
  // context parallelism cp ranks share each replica's sequences, and the
  // data-parallel group (mesh_->dp()) holds dp_ * cp_ ranks.
  int dp_ = 1, dp_rank_ = 0, cp_ = 1;
  // parallel.cp_comm made concrete for the nodes the ranks run on (and its
  // all-to-alls' ranks, parallel.cp_a2a's or auto's).
  cp::ExchangeChoice cp_exchange_;
  // The data-parallel group's ranks (dp_ * cp_), which reduce gradients.
  int data_parallel_ranks() const { return dp_ * cp_; }
  std::unique_ptr<nn::Gpt> model_;                   // one process
  std::unique_ptr<tp::TensorParallelGpt> tp_model_;  // several, no pipeline
  std::unique_ptr<pipeline::PipelineModel> pp_model_;
  std::unique_ptr<pipeline::PipelineExecutor> executor_;
  std::unique_ptr<data::BlendedDataset> dataset_;  // data.train (one part or a mixture)
  data::FimOptions fim_;                           // data.fim_rate's (rate 0: none)
  // data.val's sets, in the config's order.
  // A data.val set (one component), or data.val_split's held-out tails of
  // the data.train parts, mixed with their weights.
  struct ValidationData {
    std::string name, path;
    std::unique_ptr<data::BlendedDataset> data;
    int64_t batches = 0;  // global batches an evaluation covers
  };
  std::vector<ValidationData> val_;
  // Every set's loss into m (the first's as val_loss; each named one's).
  void evaluate_into(StepMetrics& m);
  // eval.choices' sets: this data-parallel rank's share of each one's
  // questions, and how many its file holds.
  struct ChoiceSetData {
    std::string name, path;
    std::vector<TokenizedQuestion> questions;
    int64_t total = 0;
  };
  std::vector<ChoiceSetData> choices_;
  // eval.lambada's sets, so: this rank's share of each one's texts.
  struct LambadaSetData {
    std::string name, path;
    std::vector<nn::ContinuationRequest> texts;
    int64_t total = 0;
  };
  std::vector<LambadaSetData> lambada_;
  // eval.samples, tokenized: the prompts continued at every evaluation.
  std::optional<SamplePrompts> samples_;
  // Their continuations into m on the logging rank (a parallel model is
  // gathered whole there for it: every rank takes part), and the
  // milliseconds.
  double sample_into(StepMetrics& m);
  // The model's tensors, whole, one at a time: `take` gets each on the rank
  // that writes model.safetensors (and, under tensor parallelism alone, on
  // the other ranks of data-parallel replica 0 too). Collective.
  void gather_model_each(const std::function<void(const std::string&, const Tensor&)>& take) const;
  // Set `set`'s scores into m (the first's as choices; each named one's),
  // and the milliseconds it took.
  double evaluate_choices_into(StepMetrics& m, size_t set);
  double evaluate_lambada_into(StepMetrics& m, size_t set);
  // train.ema_decay: every set of eval.choices and eval.lambada scored again
  // under the averaged weights, into m's *_ema fields, and the
  // milliseconds; nothing (0) before the averages hold a step. Collective.
  double evaluate_ema_scores_into(StepMetrics& m);
  // Requests as micro_batch_size rows per batch (request_batches), each
  // batch as wide as its longest row in multiples of 64 that sequence
  // parallelism can split.
  RequestRows scoring_rows(const std::vector<nn::ContinuationRequest>& requests) const;
  // Each row's mean loss over its targets (forward only, each row one
  // document), in order, the same on every rank of a data-parallel replica;
  // with `greedy`, also whether each row's targets are what greedy decoding
  // writes (nn::rows_argmax_match).
  std::vector<double> row_losses(const std::vector<data::Batch>& batches,
                                 std::vector<bool>* greedy = nullptr);
  // Tokens one evaluation of every set reads.
  int64_t val_tokens() const;
  std::unique_ptr<optim::AdamW> optimizer_;  // (with train.optimizer muon: the rest)
  std::unique_ptr<optim::Muon> muon_;        // train.optimizer muon: the hidden matrices
  // The tensor-parallel model's parts this rank holds: the model, or its
  // pipeline chunks (none in one process).
  std::vector<const tp::TensorParallelGpt*> parallel_parts() const;
  // Builds optimizer_ (and muon_) over the trainable parameters.
  void make_optimizers(const optim::AdamWOptions& o);
  // train.optimizer muon: the trainable parameters Muon updates, by name
  // (empty otherwise), and under tensor parallelism how their shards get
  // their updates (tp::ShardedMuon; unset without it).
  std::map<std::string, optim::MuonMatrix> muon_matrices() const;
  optim::MuonUpdater muon_updater() const;
  optim::MuonOptions muon_options() const;
  // Muon's learning rate for a step whose AdamW rate is `lr`.
  double muon_lr(double lr) const;
  std::unique_ptr<dp::GradientReducer> reducer_;   // dp > 1
  std::unique_ptr<dp::ZeroAdamW> zero_optimizer_;  // parallel.zero = 1
  std::vector<double> norm_weight_;      // ZeRO-1 norm: how each parameter counts on this rank
  std::vector<std::string> norm_names_;  // ZeRO-1 norm: the reducer's parameters' names
  // When this trainer was created: train.exit_after_minutes counts from it
  // (building the model and loading its weights and checkpoint included).
  std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  // ZeRO-1 norm: each parameter's elements another TP rank counts (a shared
  // key/value head), as [begin, end) ranges.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> norm_repeated_;
  int64_t applied_steps_ = 0;      // optimizer steps taken (skipped ones excluded)
  int64_t applied_sequences_ = 0;  // the sequences of those steps
  int64_t consecutive_skips_ = 0;
  SpikeFilter spikes_;  // train.spike_sigma: the last steps' losses and norms
  // eval.early_stop_patience: the best validation loss so far (by more than
  // early_stop_delta), its step, and the evaluations since (checkpointed).
  std::optional<double> val_best_;
  int64_t val_best_step_ = 0, val_stale_ = 0;
  // Counts an evaluation's validation loss; true when the patience is spent.
  bool validation_stalled(double loss, int64_t step);
  void log_setup();  // the model, layout, data and evaluations, as run() starts
  // Why this step is a spike on some rank ("" if on none): spikes_'s
  // verdict here, agreed over the world.
  std::string spike_on_any_rank(double loss, double norm);
  int64_t nan_step_ = -1, nan_steps_ = 0;
  int64_t flip_step_ = -1;
  std::string flip_name_;
  // Step data_origin_step_ starts at global training sequence data_origin_;
  // each step takes the next global batch (ramp_.at the sequences consumed
  // before it). A resume sets both from the checkpoint, so the data goes on
  // where it stopped even when the global batch size changed.
  int64_t data_origin_ = 0, data_origin_step_ = 0;
  BatchSizeRamp ramp_;
  mutable int64_t walked_step_ = 0, walked_sequences_ = 0;  // first_sequence's last answer
  int64_t first_sequence(int64_t index) const;
  // Step `index`'s global batch.
  int64_t batch_size(int64_t index) const { return ramp_.at(first_sequence(index)); }
  // Where the learning-rate schedule is for a step of `batch` sequences:
  // the optimizer steps taken, or with a batch-size ramp the sequences the
  // step ends at, in target-sized steps, less one (Megatron-LM's rule: small
  // early batches move the schedule less).
  double schedule_position(int64_t batch) const;
  // The pipeline executor for `micro` microbatches per step (a ramp changes
  // the count; one executor per count, built when first needed).
  pipeline::PipelineExecutor& executor_for(int64_t micro);
  std::map<int64_t, std::unique_ptr<pipeline::PipelineExecutor>> ramp_executors_;
  // The schedule for `micro` microbatches per step: parallel.schedule's, or
  // for zb-auto and zb-v the order searched for zb_costs_ (equal costs until
  // measured).
  pipeline::Schedule pipeline_schedule(int64_t micro) const;
  // How the executor waits on this run's device, as the simulator models it.
  pipeline::P2PSemantics p2p_semantics() const;
  // An executor of pipeline_schedule(micro) recording into the trace.
  std::unique_ptr<pipeline::PipelineExecutor> make_executor(int64_t micro);
  // zb-auto and zb-v: after the step that measured them, averages every
  // stage's F, B and W times over the ranks holding it (collective over the
  // world, the same numbers on every rank) and rebuilds the executors with
  // the order searched for them. The times are the step timer's by chunk
  // (`read`; device time on a GPU), the counts the step's (`measured`).
  void plan_zero_bubble(const pipeline::PipelineStepResult& measured,
                        const std::map<std::string, double>& read);
  // The measured step's result until the step timer has been read.
  std::optional<pipeline::PipelineStepResult> zb_measured_;
  std::optional<pipeline::Costs> zb_costs_;
  // Layers per pipeline stage: parallel.stage_layers, or the balanced
  // split when it is auto; empty for an even split.
  std::vector<int64_t> stage_layers_;
  int64_t pipeline_steps_ = 0;                        // pipeline steps this process has run
  Device device_;                                     // where parameters and activations live
  std::unique_ptr<optim::DynamicLossScaler> scaler_;  // train.precision = fp16
  // ZeRO-1: the global L2 norm of this rank's pieces of `flat` (the
  // reducer's flat gradients or parameters), each element counted once
  // over the world (norm_weight_, norm_repeated_).
  double global_norm_zero1(const Tensor& flat) const;
  // This rank's part of that norm squared (by group when `groups` is
  // given, else one value), on `flat`'s device, not read: world_sums of its
  // values is the whole.
  Tensor local_norm_squares_zero1(const Tensor& flat, const optim::NormGroups* groups) const;
  // `values` summed element-wise over the world (on the host).
  std::vector<double> world_sums(std::vector<double> values) const;
  // log.grad_norms, log.param_norms: the groups (Config::norm_groups), and
  // which of them train on some rank (found at the first report; the others
  // are not reported).
  struct GroupNorms {
    std::optional<optim::NormGroups> groups;
    std::vector<bool> trains;
  };
  GroupNorms grad_norm_groups_, param_norm_groups_;
  // Each training group's gradient norm (or, `of_grads` false, the norm of
  // its values), the same on every rank (collective); empty without groups.
  // `read`: the groups' squares already read (grad_norm_and_loss's).
  std::vector<std::pair<std::string, double>> norms_by_group(
      GroupNorms& report, bool of_grads, const std::vector<double>* read = nullptr);
  // Those groups' squares on the device, not read (ZeRO-1: of this rank's
  // pieces, before the world's sum).
  Tensor group_norm_squares(const optim::NormGroups& groups, bool of_grads) const;
  // log.param_norm: the global L2 norm of the parameters training updates,
  // after the step's update (every rank gets it).
  double param_norm() const;
  // fp16: divides every gradient by the loss scale (before norms and clipping).
  void unscale_gradients() const;
  // Checkpoints: the layout a checkpoint must match, save (collective) and
  // resume (returns the step to continue from).
  std::map<std::string, std::string> layout() const;
  // How this rank holds its parameters (saved with checkpoints so any
  // layout can resume them).
  RankPlacement placement() const;
  // Resume from a checkpoint of another layout: full tensors cut anew;
  // returns the checkpoint's (rank 0) metadata.
  std::map<std::string, std::string> load_resharded(const io::CheckpointInfo& info);
  // Every rank file's header, read by rank 0 alone and broadcast (collective;
  // empty in one process, where the reader reads them itself): a thousand
  // ranks do not each open a thousand files.
  std::map<int, io::RankHeader> shared_rank_headers(const io::CheckpointInfo& info) const;
  // init.from's weights in parts (the tensors outside the blocks, then each
  // of `blocks`' blocks, or all): a weights file, or a checkpoint's weights
  // alone, joined whatever layout wrote them (a new run from a checkpoint:
  // its optimizer state, counters and data position are not taken).
  // Collective for a checkpoint.
  void read_init_weights(const std::set<int64_t>* blocks,
                         const std::function<void(nn::StateDict&&)>& consume) const;
  // Whether a rank file's ZeRO-1 pieces are this run's (else it is resharded).
  bool same_zero_pieces(const io::RankState& st) const;
  // Step counters and the loss scaler from a checkpoint's metadata; returns
  // the step to continue from.
  int64_t restore_counters(const io::CheckpointInfo& info,
                           const std::map<std::string, std::string>& metadata);
  int64_t metadata_int(const io::CheckpointInfo& info,
                       const std::map<std::string, std::string>& metadata,
                       const std::string& key) const;
  // Auto attention (CUDA): times the training shape and agrees with the
  // other ranks on one kernel (train/attention_choice.h).
  void choose_attention_kernel();
  // Saves the state before step next_step: at once, or (checkpoint.async)
  // as a snapshot written on a thread, committed by commit_pending_checkpoint.
  // `val_loss`: the validation loss measured at that step, if any (its
  // manifest keeps it for checkpoint.keep_best).
  void save_checkpoint(int64_t next_step, std::optional<double> val_loss = std::nullopt);
  // checkpoint.async: the write in flight, if any (this rank's part).
  struct PendingCheckpoint {
    int64_t step = 0;
    std::shared_future<void> write;
    std::optional<double> val_loss;
  };
  std::optional<PendingCheckpoint> pending_checkpoint_;
  std::function<void()> before_checkpoint_write_;
  // Whether this rank's write has finished (true without one), and the
  // error a finished one raised (null when it succeeded).
  bool pending_checkpoint_written() const;
  std::exception_ptr pending_checkpoint_error() const;
  // Commits the write in flight: with `wait`, once each rank's own write
  // has finished (a collective that also agrees on failures); without, the
  // caller has agreed at a step boundary that every rank's has, and on
  // `any_failed`. A rank whose write failed raises its error; the others
  // raise one naming the step.
  void commit_pending_checkpoint(bool wait, bool any_failed = false);
  int64_t load_checkpoint();
  void barrier() const;
  // log.plan_cluster: the planner's price of this run on that cluster,
  // logged and written to output.dir/plan.json by the lead rank.
  void log_plan(bool lead);
  // ... and, at the end of a run of two steps or more, that against the
  // mean measured step (after the first) and the peak memory.
  void log_plan_against(const std::vector<StepMetrics>& steps) const;
  double planned_step_s_ = 0;  // (0: no plan)
  double planned_memory_bytes_ = 0;
  // ... and by phase: the busiest rank's passes a step (its microbatches'
  // forward, backward and weight-gradient passes), the exposed
  // data-parallel reduction, the optimizer; the bubble (-1: no pipeline).
  double planned_passes_s_ = 0, planned_dp_s_ = 0, planned_optimizer_s_ = 0;
  double planned_bubble_ = -1;
  // What each log.interval summary measured, the slowest rank's ms a step,
  // for the plan against the run: whether its steps include the run's
  // first (one-time costs), its passes, data-parallel wait and optimizer.
  struct TimingSummary {
    bool with_first_step = false;
    double passes_ms = 0, dp_ms = 0, optimizer_ms = 0;
  };
  std::vector<TimingSummary> timing_summaries_;
  int64_t interval_peak_bytes_ = 0;  // this rank's peak since the last summary
  // Fills m.rank_timing, m.rank_peak_memory (and with log.straggler_factor
  // m.stragglers) from every rank's step timer and peak memory over the
  // last `steps` steps (a collective over the world) and returns the ranks'
  // rows (trainer.cpp's TimingColumn).
  std::vector<double> rank_timing_into(StepMetrics& m, int64_t steps);
  // The logging rank's lines of them: a warning per straggler, then one line
  // per rank up to 8 ranks, else each category's spread and slowest rank.
  void print_rank_timing(const StepMetrics& m, const std::vector<double>& rows) const;
  // Where this rank's device spends a step (forward, backward, weight-grad,
  // p2p, dp, optimizer): timed where the work runs (DeviceTimer; on a GPU
  // by events on its compute stream), read when the host waits for the
  // device anyway. Made on first use, for the rank's device.
  DeviceTimer& step_timer();
  // On a GPU, a traced step's event as the host queued it (trace.json's
  // host row; the device row comes from the step timer's traced spans).
  void trace_host(const std::string& name, const std::string& category,
                  TraceRecorder::Clock::time_point start, TraceRecorder::Clock::time_point end);
  // A traced step's phase between steps that the host times (evaluation,
  // checkpoint): on the CPU in the work's row of trace.json, on a GPU in the
  // host row (the host waits for the device's share of it).
  void trace_phase(const std::string& name, const std::string& category,
                   TraceRecorder::Clock::time_point start, TraceRecorder::Clock::time_point end);
  // Reads the step timer into timing_ and returns what it read; the traced
  // spans it has placed go into trace_ (with `wait`, every one traced so
  // far: waits for the device if need be).
  std::map<std::string, double> read_step_timer(bool wait_for_trace = false);
  // A pipeline step's bubble from what the step timer read on this rank:
  // its time in the pipeline beyond the busiest rank's passes, over those
  // (a collective over the pipeline group); -1 without a pipeline.
  double pipeline_bubble(const std::map<std::string, double>& read) const;
  std::unique_ptr<DeviceTimer> step_timer_;
  std::map<std::string, double> timing_;  // seconds per category since the last summary
  optim::LrSchedule schedule_;
  // A changing train.weight_decay_schedule (set once the step count is known).
  std::optional<optim::WeightDecaySchedule> weight_decay_schedule_;
  TraceRecorder trace_;
};

// Steps recorded in output.dir/trace.json (the first ones; a trace of every
// step of a long run would be too large to open).
inline constexpr int64_t kTracedSteps = 20;

}  // namespace triad::train
