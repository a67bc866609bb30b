#pragma once

#include <set>
#include <string>
#include <vector>

#include "triad/nn/gpt.h"
#include "triad/parallel/context/exchange.h"
#include "triad/parallel/pipeline/schedule.h"
#include "triad/plan/cluster.h"

namespace triad::plan {

enum class Recompute { None, Selective, Full };
const char* recompute_name(Recompute r);
Recompute recompute_from_name(const std::string& name);

// How the attention core runs. Unfused: Megatron-LM as published in 2021,
// batched GEMMs around a stored (s x s) score matrix per head, softmax and
// dropout over it. Flash: Triad's (and cuDNN's) fused causal attention, no
// score matrix in memory (the backward recomputes it from the saved
// log-sum-exp), masked tiles skipped.
enum class Attention { Unfused, Flash };
const char* attention_name(Attention a);
Attention attention_from_name(const std::string& name);

// One way to lay a training run out on the cluster.
struct ParallelConfig {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int vpp = 1;  // chunks per pipeline rank (interleaved when > 1; zb-v: 2)
  int micro_batch = 1;
  Recompute recompute = Recompute::None;
  // Under Recompute::Full (model.recompute_layers): the layers of each
  // pipeline chunk that recompute, its first ones; the rest keep their
  // activations. 0: every layer.
  int recompute_layers = 0;
  bool sequence_parallel = false;
  bool zero1 = false;
  // Expert parallelism (parallel.ep): a mixture's experts shared out among
  // ep data-parallel ranks (divides dp and model.moe.experts).
  int ep = 1;
  // Context parallelism (parallel.cp): each sequence shared out among cp
  // ranks (consecutive data-parallel ones: the GPUs are tp*pp*dp*cp, and
  // gradients reduce over dp*cp), each computing s/cp positions of every
  // layer and, by `cp_exchange` (parallel.cp_comm), a cp-th of the heads
  // of every attention over the whole sequence, exchanged all-to-all, or
  // its own queries over the keys and values gathered up to them (as much
  // work, balanced; it keeps the gathered keys and values for backward).
  int cp = 1;
  cp::Exchange cp_exchange = cp::Exchange::Auto;
  // Under cp_exchange AllToAllRing (parallel.cp_a2a): the all-to-all's
  // ranks, a ring of cp / cp_a2a across them.
  int cp_a2a = 1;
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::OneFOneB;
  // zb-auto, zb-v: microbatches a rank holds from F to W (0: pp), as in the trainer.
  int zb_max_in_flight = 0;
  // Layers of each of the pp * vpp stages (parallel.stage_layers); empty:
  // an even split. The last stage also runs the head, so an uneven split
  // (pipeline::balanced_stage_layers) can even the stages' work out.
  std::vector<int64_t> stage_layers;
  // Whether the data-parallel gradient reduction overlaps backward (Triad's
  // bucketed reducer) or runs after it (Megatron-LM as published in 2021).
  bool overlap_dp = false;
  // ZeRO-1 with overlap_dp: the parameters' all-gather runs during the next
  // step's first forward pass (parallel.overlap_param_gather) rather than
  // after the optimizer step.
  bool overlap_param_gather = true;
  // Whether a column-parallel layer's input-gradient all-reduce
  // (reduce-scatter under sequence parallelism) runs during its
  // weight-gradient GEMM (Triad's layers, outside zero-bubble schedules,
  // which compute the two apart) or after it (Megatron-LM as published in
  // 2021).
  bool overlap_tp = false;
  // Without sequence parallelism, each TP rank sends 1/tp of a stage's
  // activation and the next stage all-gathers it (PTD-P's scatter-gather,
  // parallel.pipeline_scatter_gather); false: every TP rank sends it whole.
  bool scatter_gather = true;
  Attention attention = Attention::Unfused;
  // Parameters the run holds fixed (train.freeze; the trainer's
  // train::Config::frozen_parameters()), by their whole-model names: no
  // gradient, optimizer state, reduction or weight-gradient GEMM, and
  // leading layers with nothing to train no backward pass at all (nor
  // activations kept for one). Under model.lora every weight but the
  // adapters is fixed whatever this holds.
  std::set<std::string> frozen;
  // train.optimizer muon: the blocks' hidden matrices keep one f32 moment
  // (not AdamW's two), and each step orthogonalises them by Newton-Schulz
  // (five iterations of three GEMMs per matrix, each matrix whole on one
  // of its TP ranks, the stage's matrices shared out over them; under ZeRO-1
  // each rank takes about 1/dp of the matrices, after an all-gather of the
  // updates over dp), in bf16 or, with muon_ns_fp32
  // (train.muon_ns_precision fp32), in f32.
  bool muon = false;
  bool muon_ns_fp32 = false;
  // train.moment_precision bf16: the optimizer's moments (AdamW's two,
  // Muon's momentum) in 2 bytes each, not 4; the step streams 8 bytes a
  // parameter fewer.
  bool bf16_moments = false;
  // train.grad_precision bf16: gradients in 2 bytes, not 4, and reduced in
  // bf16 over the data-parallel ranks (NCCL's bf16 sums).
  bool bf16_grads = false;
  // train.ema_decay: an f32 average of the weights each rank trains (4
  // bytes a trained parameter, not sharded by ZeRO-1), folded in after
  // each step (10 bytes a parameter streamed).
  bool ema = false;

  // "tp=8 pp=64 dp=6 vpp=1 mb=1 recompute=full sp=off zero1=off 1f1b", and
  // " stages=[3,4,4,1]" for an uneven split, " muon" under Muon,
  // " moments=bf16" under bf16 moments, " grads=bf16" under bf16 gradients,
  // " ema" with the weights' average.
  std::string str() const;
};

// Where the time and memory of one step go.
struct Estimate {
  ParallelConfig config;
  int num_microbatches = 0;  // per pipeline (global batch / (dp * micro batch))
  // Time, seconds per optimizer step.
  double step_time = 0;
  double pipeline_time = 0;        // simulated makespan of all microbatches (compute + p2p)
  double compute_time = 0;         // per microbatch on the slowest stage: F + B (+ recompute)
  double gemm_time = 0;            // ... of which GEMMs
  double memory_bound_time = 0;    // ... of which memory-bound kernels (softmax, norms, ...)
  double tp_comm_time = 0;         // ... of which tensor-parallel collectives
  double tp_comm_hidden_time = 0;  // ... of those, hidden behind weight-gradient GEMMs
  double ep_comm_time = 0;         // ... of which expert parallelism's all-to-all exchanges
  double p2p_time = 0;             // one activation transfer between stages
  double dp_comm_time = 0;         // gradient reduction (exposed part)
  double optimizer_time = 0;
  double bubble_fraction = 0;  // from the simulated schedule
  // Throughput.
  double tokens_per_s = 0;
  double model_flops_per_step = 0;  // PTD-P formula (with the recompute factor)
  double tflops_per_gpu = 0;
  double mfu = 0;  // model FLOP/s over peak
  // Memory per GPU, bytes (the most loaded pipeline rank).
  double weights_bytes = 0;
  double gradient_bytes = 0;
  double optimizer_bytes = 0;
  double activation_bytes = 0;
  double memory_bytes = 0;  // total including reserved
  int peak_inflight = 0;    // (chunk, microbatch) activations alive on rank 0
  bool fits = true;

  std::string json() const;  // one JSON object, the fields above
};

// `config` with cp_exchange Auto made concrete on `cluster` as the trainer
// makes parallel.cp_comm auto on the nodes it finds (cp::choose_exchange):
// the GPUs laid out tp fastest, then dp (each context group cp consecutive
// data-parallel ranks), then pp, filling nodes of gpus_per_node in order.
// Any other exchange, and cp 1, come back as they are.
ParallelConfig concrete_context_exchange(const nn::GptConfig& model, const ClusterSpec& cluster,
                                         ParallelConfig config);

// Throws ConfigError naming the numbers when the configuration is not
// possible: world = tp*pp*dp, n_head % tp, layers % (pp*vpp), global batch %
// (micro batch * dp), ...
void check_config(const nn::GptConfig& model, const ClusterSpec& cluster, int gpus,
                  int global_batch, const ParallelConfig& config);

// Prices one configuration (check_config first; cp_exchange Auto priced as
// concrete_context_exchange makes it, and the estimate's config says so).
Estimate estimate(const nn::GptConfig& model, const ClusterSpec& cluster, int gpus,
                  int global_batch, const ParallelConfig& config);

// What estimate() would say at best, without simulating the schedule (a
// small fraction of the cost of a deep pipeline's zero-bubble search): a
// step_time no greater than estimate()'s (the busiest rank's passes for
// every microbatch, back to back, plus the same communication and
// optimizer), a memory_bytes no greater (one chunk's activations held per
// rank), and `fits` false only when the layout cannot fit. The planner
// prices layouts in this bound's order and stops where it passes the best
// found (recommend).
Estimate estimate_lower_bound(const nn::GptConfig& model, const ClusterSpec& cluster, int gpus,
                              int global_batch, const ParallelConfig& config);

// Model FLOPs of one step, PTD-P eq. (3): 72 B s l h^2 (1 + s/6h + V/12lh),
// or 96 B s l h^2 (1 + s/6h + V/16lh) with full recomputation (`recomputed`
// 1; a share of the layers recomputed between).
double ptdp_model_flops(const nn::GptConfig& model, int global_batch, double recomputed);

}  // namespace triad::plan
