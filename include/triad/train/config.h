#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "triad/data/fill_in_the_middle.h"
#include "triad/nn/gpt.h"
#include "triad/optim/clip.h"
#include "triad/optim/lr_schedule.h"
#include "triad/optim/weight_decay_schedule.h"
#include "triad/train/batch_size_ramp.h"

namespace triad::train {

// Optimisation settings (`train:` section).
struct TrainSection {
  int64_t steps = 0;
  // > 0, instead of steps: train for this many passes over data.train (a
  // fraction too); the trainer turns it into steps once the data is read
  // (resolve_epochs). Exactly one of steps and epochs is given.
  double epochs = 0;
  int64_t global_batch_size = 0;
  int64_t micro_batch_size = 0;
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 0;
  double warmup_init = 0;           // the warm-up's start (Megatron-LM's --lr-warmup-init)
  std::string lr_decay = "cosine";  // cosine | linear | constant | wsd
  int64_t lr_decay_steps = 0;       // where the decay reaches min_lr; 0: steps
  int64_t cooldown_steps = 0;       // wsd: the final decay's length; 0: a fifth of the decay span
  std::string cooldown_shape = "linear";  // wsd: linear | cosine | 1-sqrt
  double weight_decay = 0.1;              // (under a changing weight_decay_schedule: its end value)
  // constant | linear | cosine: the weight decay goes from weight_decay_start
  // at the first step to weight_decay at weight_decay_steps (Megatron-LM's
  // --weight-decay-incr-style, --start- and --end-weight-decay).
  std::string weight_decay_schedule = "constant";
  std::optional<double> weight_decay_start;  // linear, cosine: required (>= 0)
  int64_t weight_decay_steps = 0;  // linear, cosine: where it reaches weight_decay; 0: steps
  optim::WeightDecayScheduleOptions weight_decay_schedule_options() const;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0 disables clipping
  // adamw | muon. muon: the blocks' hidden matrices (nn::is_hidden_matrix)
  // take Muon's update (optim/muon.h), everything else AdamW's.
  std::string optimizer = "adamw";
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int64_t muon_ns_steps = 5;
  std::string muon_scale = "adamw_rms";  // adamw_rms | spectral
  double muon_lr = 0;                    // Muon's peak learning rate; 0: lr
  // fp32 | bf16: the Newton-Schulz GEMMs' precision; empty: bf16 under a
  // bf16/fp16 precision, fp32 under fp32 (muon_ns_dtype()).
  std::string muon_ns_precision;
  DType muon_ns_dtype() const;
  int64_t max_skipped_steps = 5;  // consecutive non-finite steps before the job stops
  // train.skip_steps: steps (1-based, inclusive [first, last] ranges) whose
  // global batches are passed over: no forward, backward or update, the
  // learning-rate schedule stays where it is, the data moves on (Megatron-
  // LM's --iterations-to-skip; PaLM's way past a loss spike).
  std::vector<std::pair<int64_t, int64_t>> skip_steps;
  // Whether train.skip_steps passes over step `step` (1-based).
  bool skips_step(int64_t step) const;
  // > 0: a step whose loss or gradient norm lies more than this many
  // standard deviations above the mean of the previous spike_window steps'
  // is skipped on every rank (train/spike_filter.h); 0: none.
  double spike_sigma = 0;
  int64_t spike_window = 128;
  // > 0: after the first step that ends this many minutes after the
  // trainer was created, every rank checkpoints and the run ends, as on SIGTERM (a job
  // that must end before its allocation does); 0: no limit.
  double exit_after_minutes = 0;
  // > 0: an exponential moving average of the trainable weights, in f32,
  // folded in after every applied step (w_ema <- d*w_ema + (1-d)*w):
  // DeepSeek-V3's early look at the weights a learning-rate decay would
  // reach. Checkpointed; evaluated beside the weights (val_ema_loss);
  // written as model_ema.safetensors. 0: none.
  double ema_decay = 0;
  // Where the average lives: "device" (beside the weights) or "cpu" (host
  // memory, as DeepSeek-V3 kept it: no GPU memory, a copy of the weights to
  // the host after every applied step).
  std::string ema_device = "device";
  uint64_t seed = 1234;
  // fp32 | bf16 | fp16. bf16/fp16: parameters and activations in half
  // precision, f32 gradients, master weights and optimizer state; fp16 adds
  // dynamic loss scaling.
  std::string precision = "fp32";
  // fp32 | bf16: how the optimizer stores its moments (AdamW's two, Muon's
  // momentum). bf16 halves their memory; each step reads them into f32,
  // updates and uses them in f32 and stores them rounded. Masters stay f32.
  std::string moment_precision = "fp32";
  DType moment_dtype() const;
  // fp32 | bf16 (with precision bf16): the dtype the parameters accumulate
  // their gradients in, and the gradient reducer holds and reduces them in
  // (Megatron-LM's default is bf16; its --accumulate-allreduce-grads-in-fp32
  // is fp32).
  std::string grad_precision = "fp32";
  DType grad_dtype() const;
  // How a step's loss averages its tokens' losses: "microbatches" (the mean
  // of each microbatch's mean over its unmasked targets) or "tokens" (the
  // mean over every unmasked target of the step, whatever microbatch holds
  // it: Megatron-LM's per-token loss). They differ only where microbatches
  // hold different numbers of unmasked targets (data.eod_mask_loss).
  std::string loss_average = "microbatches";
  // true (device: cuda, one process, data, tensor, context or pipeline
  // parallelism): each step's forward and backward passes, every
  // micro-batch's, are captured once as a CUDA graph (after one uncaptured
  // step; zb-auto and zb-v after their measured step) and replayed on the
  // next steps' batches, refilled in device tensors; the optimizer steps
  // outside it. Data parallelism's reductions over NCCL are captured with
  // the backward they overlap (otherwise run after it), tensor and context
  // parallelism's collectives inside the passes and a pipeline's schedule
  // with its sends and receives (NCCL only). Fewer launches and
  // no host work a step; for a dense model (validate says what it
  // refuses). A step at a new fp16 loss scale or a ramp's new batch size
  // captures anew.
  bool cuda_graph = false;
  double loss_scale_init = 65536.0;   // fp16: initial loss scale
  int64_t loss_scale_window = 2000;   // fp16: clean steps before the scale doubles
  int64_t loss_scale_hysteresis = 1;  // fp16: overflows since the scale grew before it backs off
  double loss_scale_min = 1.0;        // fp16: the scale never backs off below it
  // [start, increment, samples]: the global batch ramps up from `start`
  // (train/batch_size_ramp.h); empty: global_batch_size from the first step.
  std::vector<int64_t> rampup_batch_size;
  // Parameter patterns (nn/parameter_pattern.h: "wte.weight", "h.[0-5].*",
  // "*.bias"): the parameters they match stay as they were loaded or
  // initialised. They get no gradient, no optimizer state and no weight
  // decay; the others train. Empty: every parameter trains.
  std::vector<std::string> freeze;
  // Parameter patterns as freeze's: the parameters they match take no
  // weight decay (AdamW's or Muon's) although they have 2+ dimensions
  // (OLMo 2's embeddings). Empty: every matrix decays.
  std::vector<std::string> no_weight_decay;
  // (pattern, factor) pairs in the config's order: the parameters a pattern
  // matches train at the schedule's learning rate times its factor (AdamW's
  // and Muon's; Megatron-LM's --decoupled-lr for the embedding and head,
  // say). Empty: every parameter at the schedule's.
  std::vector<std::pair<std::string, double>> lr_scale;
  // The ramp these keys describe (no ramp when rampup_batch_size is empty).
  BatchSizeRamp batch_ramp() const;
  // The parameter dtype `precision` asks for.
  DType param_dtype() const;
  // The learning-rate schedule these keys describe, defaults resolved.
  optim::LrScheduleOptions lr_schedule() const;
};

// How the job is laid out (`parallel:` section).
struct ParallelSection {
  int tp = 1;
  int pp = 1;
  int vpp = 1;
  int dp = 0;  // 0: derived from the world size (world / (tp * pp * cp))
  bool sequence_parallel = false;
  std::string schedule = "1f1b";  // gpipe, 1f1b, interleaved, zb-h1, zb-auto, zb-v (pp > 1)
  // zb-auto, zb-v: microbatches a rank holds from F to W; 0 = pp (1F1B's memory).
  int zb_max_in_flight = 0;
  std::string order = "tp-dp-pp";
  // Layers of each of the pp*vpp stages, in stage order; empty: even split.
  std::vector<int64_t> stage_layers;
  // `stage_layers: auto`: the split that balances the stages' work, the
  // head's included (pipeline::balanced_stage_layers); stage_layers empty.
  bool stage_layers_auto = false;
  // Expert parallelism: each block of `ep` data-parallel ranks shares a
  // mixture's experts out among itself, exchanging tokens all-to-all
  // (model.moe; ep divides dp and model.moe.experts).
  int ep = 1;
  // Context parallelism: `cp` ranks share each sequence, each computing on
  // its chunk of T / cp tokens; every attention layer reaches the whole
  // sequence by `cp_comm` (cp::Exchange: "all_to_all", the heads exchanged,
  // DeepSpeed-Ulysses'; "all_gather", the keys and values gathered, Llama
  // 3's; "ring", the keys and values passed around a ring, ring attention;
  // "all_to_all+ring", the all-to-all inside blocks of `cp_a2a`
  // consecutive ranks and a ring of cp / cp_a2a across them; "auto", the
  // all-to-all where the heads share out). The world is
  // tp * pp * dp * cp; the cp ranks of a sequence are data-parallel ranks
  // besides (their gradients reduced with the dp replicas').
  int cp = 1;
  std::string cp_comm = "auto";
  int cp_a2a = 1;
  int zero = 0;                   // 1: ZeRO-1 (optimizer state sharded over dp)
  std::string topology = "warn";  // a TP group spanning nodes: warn | refuse
  double bucket_mb = 25;          // gradient-reduction bucket size
  // ZeRO-1: leave the parameters' all-gathers running after the optimizer
  // step, each bucket waited for when the next forward pass reaches its
  // parameters (dp::GradientReducer::start_gather).
  bool overlap_param_gather = true;
  // Pipeline transfers without sequence parallelism: each TP rank sends its
  // 1/tp of a stage's activation (or gradient) and the next stage's TP ranks
  // all-gather it (pipeline::PipelineExecutor::set_scatter_gather).
  bool pipeline_scatter_gather = true;
  // Time limit of every collective and transfer (a stuck one raises an
  // error naming it, and the job ends), in seconds.
  double timeout_s = 600;
  // Validate mode: ranks compare each collective's op, dtype and size first.
  bool validate_collectives = false;
  // > 0: every this many steps the replicas of each parameter (its data-
  // parallel copies, an expert's expert-data-parallel ones, a tied
  // embedding's copy on the last stage) compare checksums of their bytes,
  // and a difference stops every rank naming it (Megatron-LM's
  // --check-weight-hash-across-dp-replicas-interval). 0: never.
  int64_t check_replicas_interval = 0;
};

// Checkpoints (`checkpoint:` section).
struct CheckpointSection {
  std::string dir;         // empty: no checkpoints
  int64_t interval = 0;    // every N steps (0: only when stopped by a signal, and at the end)
  int keep = 3;            // newest checkpoints kept
  int64_t keep_every = 0;  // also kept for good: steps that are multiples of it (0: none)
  // also kept: the checkpoint of the lowest validation loss, named by the
  // dir's `best` marker (needs validation data evaluated at every interval)
  bool keep_best = false;
  // never | auto (the newest complete checkpoint in dir) | a checkpoint: a
  // name in dir (step_<N>, best, latest) or a path with a '/'.
  std::string resume = "never";
  // false: a resumed run takes the checkpoint's weights, counters, data
  // position and schedule but starts the optimizer afresh (zero moments,
  // its step count, and so AdamW's bias correction, from 0): Megatron-LM's
  // --no-load-optim.
  bool load_optimizer = true;
  // false: checkpoints hold the weights (f32 masters included), counters and
  // data position but not the optimizer's moments (a third of an fp32
  // run's bytes); a run resuming one starts the optimizer afresh, as with
  // load_optimizer false. Megatron-LM's --no-save-optim.
  bool save_optimizer = true;
  // Whether a run resumes: auto with a dir, or a checkpoint named.
  bool resumes() const;
  // The checkpoint `resume` names (not auto or never): in dir, or the path.
  std::string resume_path() const;
  // true: each rank copies its state to host memory and writes it on a
  // thread of its own while training goes on; the checkpoint is committed
  // at the first step boundary after every rank has written.
  bool async = false;
};

// Evaluation (`eval:` section): the loss on the validation data (data.val
// or data.val_split), and accuracy on multiple-choice questions.
struct EvalSection {
  // Evaluate every N optimizer steps and after the last one (0: after the
  // last one only).
  int64_t interval = 0;
  // Global batches (of train.global_batch_size sequences) per evaluation,
  // always the first ones of data.val; 0: every whole global batch it holds.
  int64_t batches = 0;
  // > 0: the run ends early (checkpointed, as on SIGTERM) after this many
  // evaluations in a row whose validation loss (the first set's) is not
  // below the best so far by more than early_stop_delta; 0: never.
  int64_t early_stop_patience = 0;
  double early_stop_delta = 0;
  // true: also evaluate the weights a run starts from, as step 0 (not when
  // it resumes a checkpoint).
  bool at_start = false;
  // Multiple-choice questions (JSON lines, data/multiple_choice.h:
  // HellaSwag's validation file, say) scored at every evaluation as
  // triad-eval scores them: one file (no name), or several by name
  // ({hellaswag: ..., arc: ...}), each reported by it, the first also as
  // the choices' scores; empty: none. The first choices_limit of each (0:
  // all), each asked after choices_fewshot solved examples from its own
  // file (data::add_examples; 0: none): its first other questions, or with
  // choices_fewshot_seed >= 0 drawn at random as lm-evaluation-harness
  // draws them with that seed (data/fewshot_sampler.h).
  struct ChoiceSet {
    std::string name;
    std::string path;
    bool operator==(const ChoiceSet&) const = default;
  };
  std::vector<ChoiceSet> choices;
  int64_t choices_limit = 0;
  int64_t choices_fewshot = 0;
  int64_t choices_fewshot_seed = -1;
  // LAMBADA's texts (JSON lines with a "text" each, data/last_word.h) whose
  // last word the model is asked for at every evaluation, as triad-eval
  // --lambada asks: the share greedy decoding gets right and the words'
  // perplexity. One file (no name) or several by name, like choices; the
  // first lambada_limit texts of each (0: all).
  using LambadaSet = ChoiceSet;  // (a name and a path alike)
  std::vector<LambadaSet> lambada;
  int64_t lambada_limit = 0;
  // How HellaSwag's lines are asked: "llmc" (as they stand) or "harness"
  // (lm-evaluation-harness's prompt; data::HellaSwagPrompt).
  std::string hellaswag_prompt = "llmc";
  // Prompts the model continues at every evaluation (llm.c's samples during
  // training): sample_tokens new tokens each, greedy at sample_temperature
  // 0, else drawn from the sample_top_k most likely (0: all) with
  // train.seed; each stops at data.eod_token. Logged and in metrics.jsonl.
  std::vector<std::string> samples;
  int64_t sample_tokens = 64;
  double sample_temperature = 0;
  int64_t sample_top_k = 0;
  // How the questions and prompts become tokens: a tokenizer file or model
  // directory (data::load_tokenizer), or GPT-2's vocab.json and merges.txt;
  // neither: one token per byte. bos_token: a special token put before each
  // context and prompt.
  std::string tokenizer, vocab, merges, bos_token;
};

// Everything triad-train reads from its YAML file; docs/config.md lists
// each key. Validated completely before anything runs.
struct Config {
  nn::GptConfig model;
  TrainSection train;
  // data.train: a path or glob, or a mixture of them with weights.
  struct DataPart {
    std::string path;
    double weight = 1.0;
    bool operator==(const DataPart&) const = default;
  };
  std::vector<DataPart> data_train;
  // data.val (optional; validation losses): one path or glob (a set with
  // no name), or a mapping of names to paths (several held-out sets, each
  // evaluated and reported by its name, the first also as the val loss).
  struct ValidationSet {
    std::string name;
    std::string path;
    bool operator==(const ValidationSet&) const = default;
  };
  std::vector<ValidationSet> data_val;
  // data.val_split: the share f of each data.train part held out as
  // validation data (the last f of its stream; Megatron-LM's --split). The
  // parts' tails, mixed with the training weights, are then the one
  // validation set, and training reads the first 1 - f. 0: none.
  double data_val_split = 0;
  bool has_validation() const { return !data_val.empty() || data_val_split > 0; }
  // Whether anything is evaluated: validation data, eval.choices,
  // eval.lambada or eval.samples.
  bool evaluates() const { return has_validation() || reads_text_for_eval(); }
  // Whether an evaluation reads text (questions, LAMBADA's texts or
  // prompts), and so eval's tokenizer.
  bool reads_text_for_eval() const {
    return !eval.choices.empty() || !eval.lambada.empty() || !eval.samples.empty();
  }
  bool data_shuffle = false;  // data.shuffle: a seeded order of sequences every pass
  // data.eod_mask_loss: no loss on the token that follows an end-of-document
  // token (data.eod_token): predicting a new document's first token from
  // the previous one is noise. data.eod_token, data.reset_attention_mask and
  // data.reset_position_ids live in `model` (nn::GptConfig): they change
  // what the model computes.
  bool data_eod_mask_loss = false;
  // data.packing: stream (sequences cut from the token stream) | documents
  // (rows of whole documents in order, padded with data.eod_token) |
  // best_fit (rows of whole documents fitted together, padded).
  std::string data_packing = "stream";
  // data.long_documents (packing: documents): what becomes of a document
  // longer than a row: split | truncate | drop.
  std::string data_long_documents = "split";
  // data.fim_rate, data.fim_spm_rate, data.fim_tokens ([prefix, middle,
  // suffix] sentinel ids): fill-in-the-middle on the training documents
  // (data/fill_in_the_middle.h); rate 0: none.
  double data_fim_rate = 0.0;
  double data_fim_spm_rate = 0.5;
  std::vector<int64_t> data_fim_tokens;
  std::string init_from;  // init.from: GPT-2 safetensors (optional)
  // init.adapter: a PEFT LoRA adapter's directory, merged into init.from's
  // weights as they are read (io::read_peft_adapter); needs init.from, a
  // weight file rather than a checkpoint.
  std::string init_adapter;
  std::string output_dir = "out";
  int64_t log_interval = 10;
  double log_peak_tflops = 0;    // log.peak_tflops: per-device peak for MFU (0: no MFU)
  bool log_tensorboard = false;  // log.tensorboard: TensorBoard event files in output.dir
  bool log_param_norm = false;   // log.param_norm: each step's parameter norm in the metrics
  // log.trace_steps: the steps trace.json records, [first, last] as logged
  // (from 1); {0, 0}: the first 20 steps the run trains (a resumed run's
  // first 20 after its checkpoint); {-1, -1} ("none"): none.
  int64_t log_trace_first = 0, log_trace_last = 0;
  // log.grad_norms: each step's gradient norm group by group in the
  // metrics: none | layers (the embeddings, each block, the final norm,
  // the head, each prediction module) | parameters (each parameter).
  std::string log_grad_norms = "none";
  // log.param_norms: the same for the parameters' norms after the update.
  std::string log_param_norms = "none";
  // log.moe_per_layer: each MoE layer's busiest and idlest expert's load in
  // the metrics (Megatron-LM's --moe-per-layer-logging).
  bool log_moe_per_layer = false;
  // log.nvtx: NVTX ranges (core/nvtx.h) around each step, microbatch pass,
  // pipeline transfer, reduction, optimizer update, evaluation and
  // checkpoint, for Nsight Systems.
  bool log_nvtx = false;
  // log.profile_steps: [first, last] as logged (from 1): on CUDA devices
  // cudaProfilerStart before step first and cudaProfilerStop after step
  // last (nsys --capture-range=cudaProfilerApi); log.nvtx's ranges only
  // then. {0, 0}: every step, no profiler calls.
  int64_t log_profile_first = 0, log_profile_last = 0;
  // log.profile_ranks: the world ranks that profile (empty: every rank).
  std::vector<int64_t> log_profile_ranks;
  // log.straggler_factor: at each log.interval summary, warn of (and list
  // in the metrics) any rank whose compute per step is at least this many
  // times the median of the ranks of its pipeline stage (0: off; else > 1).
  double log_straggler_factor = 0;
  // log.plan_cluster: a cluster file (configs/clusters/) the planner prices
  // this run on at the start, logged and written to output.dir/plan.json
  // beside the measured steps ("": none).
  std::string log_plan_cluster;
  std::string device = "cpu";
  // model.attention_kernel: auto | simt | tensor_core | cudnn (CUDA attention;
  // see triad/backend/cuda.h). No effect on the CPU.
  std::string attention_kernel = "auto";
  // model.attention_deterministic: false lets cuDNN's attention backward
  // accumulate dQ with atomics (faster; runs no longer repeat bit for bit).
  bool attention_deterministic = true;
  ParallelSection parallel;
  CheckpointSection checkpoint;
  EvalSection eval;

  // The names of the parameters train.freeze keeps fixed (of the whole
  // model, whatever the layout). Parses and checks the patterns as
  // parse_config does: a pattern that matches nothing is an error.
  std::set<std::string> frozen_parameters() const;
  // What data.fim_rate, data.fim_spm_rate and data.fim_tokens describe (rate
  // 0: none), its draws seeded from train.seed apart from dropout's.
  data::FimOptions fim_options() const;
  // Groups over every parameter of the whole model (the same on every rank
  // of any layout) for log.grad_norms and log.param_norms: `by` layers or
  // parameters; none for none.
  std::optional<optim::NormGroups> norm_groups(const std::string& by) const;
  // The names of the parameters train.no_weight_decay matches, checked so.
  std::set<std::string> no_decay_parameters() const;
  // Each parameter train.lr_scale matches, with its factor. Each pattern
  // must match a parameter, and no parameter two patterns.
  std::map<std::string, double> lr_scale_factors() const;

  // The parameters of the whole model that `patterns` match (`key` names
  // them in errors).
  std::set<std::string> matching(const std::vector<std::string>& patterns,
                                 const std::string& key) const;

  // Gradient-accumulation steps per optimizer step.
  int64_t accumulation_steps() const { return train.global_batch_size / train.micro_batch_size; }
};

// Parses YAML text, applies `overrides` ("train.lr=1e-3", values in YAML
// syntax), and validates. Unknown keys are errors listing the allowed keys;
// wrong types and impossible values are errors naming key, value and rule.
Config parse_config(const std::string& yaml_text, const std::vector<std::string>& overrides = {},
                    const std::string& source = "<config>");
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// `yaml_text` (a config file's) with `overrides` applied as parse_config
// applies them, written back as YAML: the text's own keys kept as given
// (its comments are not), the overridden ones replaced or added. The result
// must be a valid config (parse_config's error otherwise, naming `source`).
std::string with_overrides(const std::string& yaml_text, const std::vector<std::string>& overrides,
                           const std::string& source = "<config>");
// Checks the batch against a data-parallel size (known once the world is):
// global batch divisible by micro batch * dp, and for the interleaved
// schedule the microbatches per pipeline a multiple of pp; every size of a
// batch-size ramp likewise.
void check_batch(const Config& config, int dp);

// The steps that read `epochs` passes over `sequences` training sequences:
// the fewest whose global batches (ramp included) add up to at least
// ceil(epochs * sequences) sequences.
int64_t steps_for_epochs(const TrainSection& train, int64_t sequences);
// train.epochs turned into train.steps for data of `sequences` sequences,
// and the rules that need the step count (the wsd cool-down) checked; a
// config given in steps is left as it is.
void resolve_epochs(Config& config, int64_t sequences);
// The configuration as YAML (every key, defaults included).
std::string to_yaml(const Config& config);

// The settings that differ between two configs written by to_yaml (say a
// checkpoint's and the resuming run's), one "section.key: before -> after"
// per difference in key order; a key on one side only shows "(unset)" on the
// other. A text that is not YAML is a ConfigError naming `before_source`.
std::vector<std::string> config_changes(const std::string& before, const std::string& after,
                                        const std::string& before_source = "config");

}  // namespace triad::train
