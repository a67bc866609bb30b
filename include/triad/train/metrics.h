#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace triad::train {

// What one optimizer step measured.
struct StepMetrics {
  int64_t step = 0;  // 1-based
  double loss = 0;   // mean over all global_batch_size * seq_len tokens
  double lr = 0;
  // A changing train.weight_decay_schedule: the step's weight decay
  // (matrices'; the parameters that take none take none). Negative otherwise.
  double weight_decay = -1;
  double grad_norm = 0;  // before clipping
  // log.param_norm: the global L2 norm of the parameters training updates
  // (frozen ones left out), after this step's update. Negative otherwise.
  double param_norm = -1;
  // train.skip_steps: the step passed its batch over (skipped too); it has
  // no loss, norms or speed.
  bool passed_over = false;
  // eval.at_start: step 0, the evaluations of the starting weights alone
  // (no loss, norms or speed).
  bool evaluation_only = false;
  // log.grad_norms: the gradient norm (before clipping) of each group of
  // parameters that trains, by group name; empty otherwise.
  std::vector<std::pair<std::string, double>> grad_norms;
  // log.param_norms: the same groups' parameter norms after the update.
  std::vector<std::pair<std::string, double>> param_norms;
  double tokens_per_s = 0;
  // The host's time in the step's own call. On a GPU the device's work
  // queued last (the optimizer's) is waited for by the next step, or by a
  // log.interval summary, so a step's time can hold the step before's; the
  // run's pace is elapsed_s's.
  double step_ms = 0;
  // Seconds from the start of the run (Trainer::run) to this step's line in
  // metrics.jsonl: its differences are the steps' wall-clock periods,
  // logging, evaluation and checkpoints included. Negative where not timed
  // (a step taken through Trainer::step alone).
  double elapsed_s = -1;
  double tflops_per_device = 0;  // PTD-P model FLOPs per second per device
  double mfu = 0;                // over log.peak_tflops (0 when not configured)
  // Pipeline runs: (step time - busiest rank's compute) / that compute,
  // measured; negative when there is no pipeline.
  double bubble_fraction = -1;
  // A mixture of experts (model.moe): the mean over its layers and the
  // step's micro-batches of the load-balancing loss E * sum_e f_e P_e (1:
  // balanced), and the busiest expert's load as a multiple of the balanced
  // one, the largest over layers, micro-batches and ranks. Negative
  // without one.
  double moe_balance = -1;
  double moe_max_load = -1;
  // With model.moe.capacity_factor: the share of token-to-expert
  // assignments dropped over capacity, the mean over layers and
  // micro-batches. Negative otherwise.
  double moe_dropped = -1;
  // log.moe_per_layer: each MoE layer's step ("h.3", a prediction module's
  // "mtp.0"): its busiest and idlest expert's share of the layer's
  // assignments over every micro-batch and rank, as a multiple of the
  // balanced share (1 and 1: balanced; a min_load of 0: an expert that no
  // token chose). Empty otherwise.
  struct MoeLayerLoads {
    std::string layer;
    double max_load = 0, min_load = 0;
  };
  std::vector<MoeLayerLoads> moe_layers;
  // With model.moe.z_loss_coef: the router z-loss (mean over tokens of
  // logsumexp(logits)^2), the mean over layers and micro-batches.
  // Negative otherwise.
  double moe_z_loss = -1;
  // With model.mtp_layers: each multi-token-prediction depth's loss (depth
  // k's of the token k + 1 ahead of the next), the mean over the step's
  // micro-batches and data-parallel ranks. Empty otherwise.
  std::vector<double> mtp_losses;
  // With model.z_loss_coef: the output logits' z-loss (the mean over scored
  // tokens of log(sum exp(logits))^2, before its coefficient), the mean over
  // the step's micro-batches and data-parallel ranks. Negative otherwise.
  double z_loss = -1;
  // A non-finite gradient on some rank, or a spike (train.spike_sigma):
  // every rank skipped the update.
  bool skipped = false;
  bool spike = false;  // skipped as a spike
  // fp16: the loss scale this step's backward used (0 otherwise).
  double loss_scale = 0;
  // The most bytes of tensors held at once on the training device during
  // the step (parameters, gradients, optimizer state, activations and
  // buffers), the largest over all ranks: what must fit.
  int64_t peak_memory_bytes = 0;
  // On GPUs: the bytes the caching allocator holds from the driver at the
  // step's end (its peak, unless an allocation that found the device full
  // emptied the cache to retry), the largest over all ranks: what the
  // device must have, the cache's slack included (PyTorch's
  // memory_reserved). -1 on the CPU, which caches nothing.
  int64_t reserved_memory_bytes = -1;
  // At log.interval's steps (and the last): where the ranks' devices spent
  // the steps since the last such step, in ms per step by category
  // (forward, backward, weight-grad, p2p, dp, optimizer, and `compute`,
  // the sum of forward, backward, weight-grad and optimizer), timed where
  // the work runs (on a GPU by events on its compute stream): the fastest
  // rank's, the mean, the slowest rank's, and which rank that was. Among
  // ranks that do the same work (a pipeline stage's), one whose compute
  // stands out is a straggler. Empty at other steps.
  struct RankTiming {
    std::string category;
    double min_ms = 0, mean_ms = 0, max_ms = 0;
    int slowest_rank = 0;
  };
  std::vector<RankTiming> rank_timing;
  // log.straggler_factor: at the same steps, the ranks whose compute was at
  // least that many times the median of their pipeline stage's ranks.
  struct Straggler {
    int rank = 0, stage = 0;
    double compute_ms = 0, median_ms = 0;
    int peers = 0;  // ranks of the stage, itself included
  };
  std::vector<Straggler> stragglers;
  // At the same steps: each rank's peak memory over the steps since the
  // last summary (peak_memory_bytes is the largest of them), the smallest,
  // the mean, the largest and whose it was: a pipeline's stages differ, and
  // the one that holds the most is what a rebalanced split relieves.
  struct RankMemory {
    int64_t min_bytes = 0, mean_bytes = 0, max_bytes = 0;
    int largest_rank = 0;
  };
  std::optional<RankMemory> rank_peak_memory;
  // Training sequences (of seq_len + 1 tokens) consumed after this step,
  // over the whole run (resumes included).
  int64_t consumed_sequences = 0;
  // Sequences this step trained on (train.global_batch_size, or less while
  // a batch-size ramp is below it).
  int64_t global_batch_size = 0;
  // Mean loss over the validation tokens, after this step's update (steps
  // that evaluated: every eval.interval and the last): data.val's first
  // set, and with named sets every one's by name, in the config's order.
  std::optional<double> val_loss;
  std::vector<std::pair<std::string, double>> val_losses;
  // train.ema_decay: the same sets' losses under the averaged weights.
  std::optional<double> val_ema_loss;
  std::vector<std::pair<std::string, double>> val_ema_losses;
  // eval.choices at the same steps: the questions, the share each
  // normalisation got right (acc: total -log p; acc_norm: per character;
  // acc_per_token), and the right choices' mean -log p per token. The first
  // set's, and with named sets every one's by name, in the config's order.
  struct ChoiceScores {
    int64_t questions = 0;
    double acc = 0, acc_norm = 0, acc_per_token = 0, answer_loss = 0;
    std::optional<double> mc2;  // TruthfulQA's MC2, for a set with mc2 answers
  };
  std::optional<ChoiceScores> choices;
  std::vector<std::pair<std::string, ChoiceScores>> choice_sets;
  // eval.lambada at the same steps: the texts, the share of last words
  // greedy decoding writes, the words' mean -log p (`loss`) and perplexity
  // (exp of it); the first set's, and with named sets every one's by name,
  // in the config's order.
  struct LambadaScores {
    int64_t texts = 0;
    double acc = 0, loss = 0, perplexity = 0;
  };
  std::optional<LambadaScores> lambada;
  std::vector<std::pair<std::string, LambadaScores>> lambada_sets;
  // train.ema_decay: eval.choices' and eval.lambada's scores under the
  // averaged weights, set for set.
  std::optional<ChoiceScores> choices_ema;
  std::vector<std::pair<std::string, ChoiceScores>> choice_ema_sets;
  std::optional<LambadaScores> lambada_ema;
  std::vector<std::pair<std::string, LambadaScores>> lambada_ema_sets;
  // eval.samples at an evaluation: each prompt and the model's continuation.
  std::vector<std::pair<std::string, std::string>> samples;
};

// The console's summary of StepMetrics::rank_timing over `ranks` ranks:
// each category's fastest, mean and slowest rank's ms per step and which
// rank was slowest ("forward 10.1/10.4/12.9 (rank 37) | ...").
std::string rank_timing_summary(const std::vector<StepMetrics::RankTiming>& timing, int ranks);

// The ranks whose compute_ms is at least `factor` times the median of the
// ranks that share their stage (stage_of_rank: the pipeline stage of each
// rank, as many as compute_ms), in rank order. A rank alone in its stage
// has no peers to be slower than.
std::vector<StepMetrics::Straggler> find_stragglers(const std::vector<double>& compute_ms,
                                                    const std::vector<int>& stage_of_rank,
                                                    double factor);

// Appends one JSON object per step to a metrics.jsonl file.
class MetricsWriter {
 public:
  // A new file; or, with `resumed_at` >= 0 (a run resumed from the
  // checkpoint of that step), the existing file's lines up to and including
  // that step kept and the rest dropped (steps the resumed run trains
  // again), so the file goes on as one history.
  explicit MetricsWriter(const std::string& path, int64_t resumed_at = -1);
  void write(const StepMetrics& m);

 private:
  std::ofstream out_;
  std::string path_;
};

}  // namespace triad::train
