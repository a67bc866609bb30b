// The trainer's set-up: the mesh and its groups, the model and its parts,
// the optimizers, the data, the checks a config gets before the first step
// (the memory the training state needs, `triad-train --check`), and the
// log lines that say what was set up.

#include "triad/train/trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <numeric>
#include <set>
#include <thread>

#include <omp.h>
#include <unistd.h>

#include "train/captured_step.h"
#include "triad/backend/cuda.h"
#include "triad/core/nvtx.h"
#include "triad/dist/nccl.h"
#include "triad/io/checkpoint.h"
#include "triad/io/peft_adapter.h"
#include "triad/ops/creation.h"
#include "triad/parallel/pipeline/schedule.h"
#include "triad/parallel/pipeline/stage_balance.h"
#include "triad/parallel/tensor/sharded_muon.h"
#include "triad/train/attention_choice.h"
#include "triad/train/training_data.h"

namespace triad::train {
namespace {

// "4, 4, 3, 1": counts joined by `sep`.
std::string joined(const std::vector<int64_t>& counts, const char* sep) {
  std::string out;
  for (int64_t n : counts) {
    if (!out.empty()) out += sep;
    out += std::to_string(n);
  }
  return out;
}

// The memory a rank has: its GPU's, or (CPU) its share of the host's among
// the `ranks_here` ranks on it, and how to name it; 0 when unknown.
struct RankMemory {
  double bytes = 0;
  std::string where;
};

RankMemory rank_memory(Device device, int ranks_here) {
  if (device.is_cuda()) {
    return {static_cast<double>(cuda::device_memory(device.index)),
            "the " + device.str() + " device's"};
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return {};
  return {static_cast<double>(pages) * static_cast<double>(page) / ranks_here,
          ranks_here > 1
              ? "each of this node's " + std::to_string(ranks_here) + " ranks' share of its"
              : "this machine's"};
}

// Refuses, before anything is built, a model whose training state cannot fit:
// its weights, gradients and AdamW's moments (f32, or bf16 under
// train.moment_precision; and f32 master weights under
// half precision; ZeRO-1 shards the optimizer's part over the dp data-parallel
// ranks, dp * cp under context parallelism) average over
// the tp * pp ranks holding one copy, and `ranks_here` such ranks share the
// host's memory (CPU) or each has its GPU's. The average rank needs no less
// than that, so a model that can train is never refused. (--eval-only builds
// the same trainer, moments included, and is checked the same way.)
void check_training_state_fits(const Config& config, int dp, Device device, int ranks_here) {
  const bool half = config.train.param_dtype() != DType::F32;
  const double moments = config.train.moment_dtype() == DType::BF16 ? 4.0 : 8.0;
  const double optimizer = ((half ? 4.0 : 0.0) + moments) / (config.parallel.zero == 1 ? dp : 1);
  const double grads = config.train.grad_dtype() == DType::BF16 ? 2.0 : 4.0;
  const double per_parameter = (half ? 2.0 : 4.0) + grads + optimizer;
  const double ranks = static_cast<double>(config.parallel.tp) * config.parallel.pp;
  // (Expert parallelism shares the experts out among ep ranks.)
  const double count = config.model.parameter_count() -
                       config.model.expert_parameter_count() * (1.0 - 1.0 / config.parallel.ep);
  // A frozen parameter (train.freeze) holds its weight only.
  double frozen = 0;
  if (!config.train.freeze.empty()) {
    const auto shapes = nn::gpt_parameter_shapes(config.model);
    for (const std::string& name : config.frozen_parameters())
      frozen += static_cast<double>(numel(shapes.at(name)));
  }
  const double need = (count * per_parameter - frozen * (grads + optimizer)) / ranks;
  const auto [have, where] = rank_memory(device, ranks_here);
  if (have <= 0 || need <= have) return;  // (unknown: nothing to check against)
  auto g = [](double x) {                 // 3 significant digits
    char out[32];
    std::snprintf(out, sizeof out, "%.3g", x);
    return std::string(out);
  };
  throw ConfigError("model: n_layer " + std::to_string(config.model.n_layer) + ", d_model " +
                    std::to_string(config.model.d_model) + ": " + g(count) + " parameters need " +
                    g(need / 1e9) + " GB per rank (" + g(per_parameter) +
                    " bytes each over tp*pp = " + g(ranks) +
                    " ranks) for weights, gradients and optimizer state, more than " + where + " " +
                    g(have / 1e9) +
                    " GB of memory (tp and pp split it; parallel.zero: 1 shards the "
                    "optimizer's part over dp" +
                    (config.train.moment_dtype() == DType::F32
                         ? std::string("; train.moment_precision: bf16 halves its moments")
                         : std::string()) +
                    ")");
}

// The learning-rate schedule; with train.epochs, whose steps are known once
// the data is read, a constant stand-in the trainer replaces then.
optim::LrSchedule initial_schedule(const TrainSection& t) {
  optim::LrScheduleOptions o = t.lr_schedule();
  if (t.epochs > 0 && t.steps == 0) {
    o.decay = optim::LrDecay::Constant;
    o.cooldown_steps = 0;
    o.cooldown_shape = optim::CooldownShape::Linear;
  }
  return optim::LrSchedule(o);
}

}  // namespace

Trainer::Trainer(Config config, dist::ProcessGroupPtr world)
    : config_(std::move(config)),
      world_(std::move(world)),
      schedule_(initial_schedule(config_.train)) {
  grad_norm_groups_.groups = config_.norm_groups(config_.log_grad_norms);
  param_norm_groups_.groups = config_.norm_groups(config_.log_param_norms);
  const auto& par = config_.parallel;
  const int world_size = world_ ? world_->size() : 1;
  device_ = device_from_string(config_.device);
  if (config_.log_nvtx && !nvtx::available()) {
    throw NotSupportedError(
        "log.nvtx: this build of Triad emits no NVTX ranges (they need the CUDA toolkit's NVTX "
        "headers: configure with TRIAD_WITH_CUDA=ON)");
  }
  for (const int64_t r : config_.log_profile_ranks) {
    if (r >= world_size) {
      throw ConfigError("log.profile_ranks: rank " + std::to_string(r) + " is not in a world of " +
                        std::to_string(world_size) + " rank(s)");
    }
  }
  if (!config_.log_profile_ranks.empty()) {
    const int64_t rank = world_ ? world_->rank() : 0;
    profiling_rank_ = std::find(config_.log_profile_ranks.begin(), config_.log_profile_ranks.end(),
                                rank) != config_.log_profile_ranks.end();
  }
  cuda::set_attention_kernel(cuda::attention_kernel_from_string(config_.attention_kernel));
  cuda::set_attention_deterministic(config_.attention_deterministic);
  if (device_.is_cuda()) {
    if (!cuda::compiled()) {
      throw NotSupportedError("device '" + config_.device +
                              "': this build has no CUDA backend (configure with "
                              "TRIAD_WITH_CUDA=ON)");
    }
    if (world_size > 1 && !dist::nccl_available()) {
      throw NotSupportedError("device '" + config_.device + "' with " + std::to_string(world_size) +
                              " ranks needs the NCCL process group, which this build lacks");
    }
    if (world_size > 1 && config_.device != "cuda") {
      throw ConfigError("device '" + config_.device + "' with " + std::to_string(world_size) +
                        " ranks: use 'cuda' (each rank takes the GPU of its rank on the node)");
    }
    const int count = cuda::device_count();
    if (count == 0) {
      throw NotSupportedError("device '" + config_.device + "': no CUDA device is visible");
    }
    // One rank takes the first device ("cuda") or the one named ("cuda:N");
    // several ranks take their node-local GPU once the mesh knows it.
    if (config_.device == "cuda") device_ = Device::cuda(0);
    if (device_.index >= count) {
      throw ConfigError("device '" + config_.device + "': only " + std::to_string(count) +
                        " CUDA device(s) are visible");
    }
  }
  // The layout is checked against the world before any communicator exists.
  const int tp_pp = par.tp * par.pp * par.cp;
  if (par.dp == 0 && world_size % tp_pp != 0) {
    throw ConfigError("world size (" + std::to_string(world_size) + ") must be divisible by tp*pp" +
                      (par.cp > 1 ? "*cp" : "") + " = " + std::to_string(par.tp) + "*" +
                      std::to_string(par.pp) + (par.cp > 1 ? "*" + std::to_string(par.cp) : "") +
                      " = " + std::to_string(tp_pp));
  }
  if (par.dp > 0 && par.cp > 1 && static_cast<long long>(tp_pp) * par.dp != world_size) {
    throw ConfigError("world size (" + std::to_string(world_size) + ") must equal tp*pp*dp*cp = " +
                      std::to_string(par.tp) + "*" + std::to_string(par.pp) + "*" +
                      std::to_string(par.dp) + "*" + std::to_string(par.cp) + " = " +
                      std::to_string(static_cast<long long>(tp_pp) * par.dp));
  }
  dp_ = par.dp > 0 ? par.dp : world_size / tp_pp;
  cp_ = par.cp;
  // (The context-parallel ranks are data-parallel ranks of the mesh.)
  dist::MeshShape shape{par.tp, par.pp, dp_ * cp_, par.order, par.ep, par.cp};
  shape.cp_a2a = par.cp_a2a;
  shape.validate(world_size);
  // cp_comm auto by where the context groups' ranks run: all-to-alls inside
  // the nodes and a ring across them when a group spans nodes.
  const cp::Exchange asked = cp::exchange_from_string(par.cp_comm);
  cp_exchange_ =
      cp::choose_exchange(asked, par.cp_a2a, config_.model, par.tp, cp_, par.sequence_parallel,
                          cp_ > 1 && asked == cp::Exchange::Auto
                              ? dist::nodes_of(shape.context_groups(), dist::node_info(world_))
                              : std::vector<std::vector<int>>{});
  shape.cp_a2a = static_cast<int>(cp_exchange_.a2a);
  check_batch(config_, dp_);
  if (config_.train.cuda_graph && par.ep > 1 && !config_.model.moe.pad_to_capacity) {
    // (Data, tensor, context and pipeline parallelism's exchanges join the
    // capture; a dropless mixture's experts are fed by counts read on the
    // host.)
    throw ConfigError("train.cuda_graph: expert parallelism (this run has ep " +
                      std::to_string(par.ep) +
                      ") routes its tokens by counts read on the host, which a graph cannot hold "
                      "(model.moe.pad_to_capacity routes them on the device)");
  }
  ramp_ = config_.train.batch_ramp();
  const uint64_t seed = config_.train.seed;
  if (world_size == 1) {
    check_training_state_fits(config_, data_parallel_ranks(), device_, 1);
    // Weights read from init.from whole (no LoRA adapters to start from
    // their initial values, no multi-token-prediction modules the file may
    // lack) need no random initialisation first.
    const bool read_whole =
        !config_.init_from.empty() && config_.model.lora.rank == 0 && config_.model.mtp_layers == 0;
    model_ = std::make_unique<nn::Gpt>(config_.model, seed, DType::F32,
                                       read_whole ? nn::Gpt::Init::None : nn::Gpt::Init::Random);
    if (!config_.init_from.empty()) {
      // Block by block: the freshly initialised model and one block of the
      // file, never two copies of the model.
      read_init_weights(
          nullptr, [&](nn::StateDict&& part) { model_->load_state_dict(part, /*strict=*/false); });
    }
  } else {
    // Every group of the mesh (and its NCCL communicator) inherits these.
    world_->set_timeout(std::chrono::milliseconds(static_cast<int64_t>(par.timeout_s * 1000.0)));
    world_->set_validate(par.validate_collectives);
    mesh_ = std::make_unique<dist::DeviceMesh>(
        world_, shape,
        par.topology == "refuse" ? dist::TopologyPolicy::Refuse : dist::TopologyPolicy::Warn);
    dp_rank_ = mesh_->dp_rank() / cp_;
    if (!device_.is_cuda() && !std::getenv("OMP_NUM_THREADS")) {
      // CPU ranks on one node share its cores rather than each starting a
      // thread per core.
      omp_set_num_threads(dist::cpu_threads_per_rank(
          static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), omp_get_num_procs(),
          mesh_->node().local_size));
    }
    if (device_.is_cuda()) {
      // One GPU per rank: the rank within its node picks it.
      const int count = cuda::device_count();
      if (mesh_->node().local_size > count) {
        throw ConfigError("device 'cuda': " + std::to_string(mesh_->node().local_size) +
                          " ranks on this node but only " + std::to_string(count) +
                          " GPU(s); start at most one rank per GPU");
      }
      device_ = Device::cuda(mesh_->local_device());
      // bf16 gradients (train.grad_precision) are reduced in bf16, as
      // Megatron-LM reduces them: half the data-parallel traffic.
      mesh_->use_cuda(device_.index, config_.train.grad_dtype() == DType::BF16);
    }
    check_training_state_fits(config_, data_parallel_ranks(), device_, mesh_->node().local_size);
    if (par.pp > 1) {
      stage_layers_ = par.stage_layers;
      if (par.stage_layers_auto) {
        stage_layers_ = pipeline::balanced_stage_layers(
            config_.model, par.pp, par.vpp, config_.model.recompute == nn::Recompute::Full,
            config_.model.recompute_layers);
      }
      pp_model_ = std::make_unique<pipeline::PipelineModel>(
          config_.model, seed,
          pipeline::PipelineGroups{mesh_->tp(), mesh_->pp(), mesh_->embedding(), mesh_->ep(),
                                   mesh_->cp(), cp_exchange_.exchange,
                                   cp::Hierarchy{mesh_->cp_a2a(), mesh_->cp_ring()}},
          par.sequence_parallel, par.vpp, stage_layers_,
          pipeline::placement_of(pipeline::schedule_from_name(par.schedule)));
      const int m = static_cast<int>(config_.train.global_batch_size /
                                     (config_.train.micro_batch_size * dp_));
      executor_ = make_executor(m);
      if (!config_.init_from.empty()) {
        // Every parameter's name and full shape, without building the model;
        // each rank reads its own stages' blocks only, one at a time, cutting
        // its shards from each (the file's other blocks are checked by the
        // ranks that read them), and every rank learns whether all could.
        const std::set<int64_t> mine = pp_model_->local_layers();
        std::exception_ptr error;
        try {
          read_init_weights(&mine,
                            [&](nn::StateDict&& part) { pp_model_->load_full_tensors(part); });
        } catch (const Error&) {
          error = std::current_exception();
        }
        Tensor first_failed = from_vector(
            std::vector<double>{static_cast<double>(error ? world_->rank() : world_->size())}, {1},
            DType::F64);
        world_->all_reduce(first_failed, dist::ReduceOp::Min)->wait();
        if (error) std::rethrow_exception(error);
        const int failed = static_cast<int>(item(first_failed));
        if (failed < world_->size()) {
          throw IoError("init.from '" + config_.init_from + "': rank " + std::to_string(failed) +
                        " could not read its part of the weights (its log names the reason)");
        }
      }
    } else {
      tp_model_ = std::make_unique<tp::TensorParallelGpt>(
          config_.model, seed, mesh_->tp(), par.sequence_parallel,
          tp::StagePlan::whole(config_.model.n_layer), mesh_->ep(), mesh_->cp(),
          cp_exchange_.exchange, cp::Hierarchy{mesh_->cp_a2a(), mesh_->cp_ring()});
      if (!config_.init_from.empty()) {
        // One block of the file at a time, each rank cutting its shards.
        read_init_weights(nullptr,
                          [&](nn::StateDict&& part) { tp_model_->load_full_tensors(part); });
      }
    }
  }
  // Mixed precision: parameters initialised (or loaded) in f32 are rounded
  // once to the half type; the optimizer keeps the f32 originals as masters.
  const DType param_dtype = config_.train.param_dtype();
  if (model_) {
    model_->to(device_);
    if (param_dtype != DType::F32) model_->to(param_dtype);
  }
  if (tp_model_) {
    tp_model_->to(device_);
    if (param_dtype != DType::F32) tp_model_->to(param_dtype);
  }
  if (pp_model_) {
    pp_model_->to(device_);
    if (param_dtype != DType::F32) pp_model_->to(param_dtype);
  }
  // train.freeze: these parameters need no gradient, so backward computes
  // none for them (nor the weight-gradient GEMMs of frozen layers), and the
  // optimizer, the gradient reducer and the norm never see them.
  const std::set<std::string> frozen = config_.frozen_parameters();
  for (auto& [name, p] : parameters()) {
    if (frozen.count(name)) p.set_requires_grad(false);
  }
  // train.grad_precision bf16: the half parameters accumulate (and the
  // gradient reducer holds and reduces) their gradients in bf16, not f32.
  if (config_.train.grad_dtype() == DType::BF16) {
    for (auto& [name, p] : parameters()) {
      if (p.requires_grad()) p.set_half_grad(true);
    }
  }
  if (config_.train.spike_sigma > 0)
    spikes_ = SpikeFilter(config_.train.spike_sigma, config_.train.spike_window);
  if (config_.train.precision == "fp16") {
    optim::LossScalerOptions so;
    so.init_scale = config_.train.loss_scale_init;
    so.growth_interval = config_.train.loss_scale_window;
    so.hysteresis = config_.train.loss_scale_hysteresis;
    so.min_scale = config_.train.loss_scale_min;
    so.max_scale = std::max(so.max_scale, so.init_scale);
    scaler_ = std::make_unique<optim::DynamicLossScaler>(so);
  }
  // Each rank checks its part of every dataset's tokens and loss-mask
  // bytes (the job reads the data once at start-up, not once per rank); the
  // ranks combine what they found below, before any raises.
  const data::TokenCheck token_check = world_ && world_->size() > 1
                                           ? data::TokenCheck{world_->rank(), world_->size()}
                                           : data::TokenCheck{};
  dataset_ = open_training_data(config_, token_check);
  if (config_.data_fim_rate > 0) {
    for (size_t c = 0; c < dataset_->num_components(); ++c) {
      if (dataset_->component(c).masked_sources() > 0) {
        throw ConfigError("data.fim_rate: data.train '" + dataset_->name(c) +
                          "' has a loss mask (<source>.loss_mask), and fill-in-the-middle moves "
                          "tokens across it; give it to unmasked pretraining data");
      }
    }
    fim_ = config_.fim_options();
  }
  if (config_.train.epochs > 0) {
    // train.epochs: the steps that pass over the data that many times.
    resolve_epochs(config_, dataset_->num_sequences());
    schedule_ = optim::LrSchedule(config_.train.lr_schedule());
  }
  if (config_.train.weight_decay_schedule != "constant")
    weight_decay_schedule_.emplace(config_.train.weight_decay_schedule_options());
  for (ValidationSource& source : open_validation_data(config_, token_check)) {
    const std::string& key = source.key;
    ValidationData v{source.name, source.path, std::move(source.data), 0};
    const int64_t G = config_.train.global_batch_size;
    const int64_t held = v.data->num_sequences();
    if (held < G) {
      throw ConfigError(key + " ('" + v.path + "') holds " + std::to_string(held) +
                        " sequences of model.seq_len + 1 tokens, fewer than one global batch "
                        "(train.global_batch_size = " +
                        std::to_string(G) + ")");
    }
    v.batches = config_.eval.batches > 0 ? config_.eval.batches : held / G;
    if (v.batches * G > held) {
      throw ConfigError("eval.batches (" + std::to_string(v.batches) + ") global batches of " +
                        std::to_string(G) + " sequences need " + std::to_string(v.batches * G) +
                        " validation sequences, but " + key + " ('" + v.path + "') holds " +
                        std::to_string(held));
    }
    val_.push_back(std::move(v));
  }
  for (const auto& set : config_.eval.choices) {
    ChoiceSetData d{set.name, set.path, {}, 0};
    d.questions = load_choice_questions(config_, set, dp_rank_, dp_, &d.total);
    choices_.push_back(std::move(d));
  }
  for (const auto& set : config_.eval.lambada) {
    LambadaSetData d{set.name, set.path, {}, 0};
    d.texts = load_lambada_texts(config_, set, dp_rank_, dp_, &d.total);
    lambada_.push_back(std::move(d));
  }
  if (!config_.eval.samples.empty()) samples_ = load_sample_prompts(config_);
  if (token_check.count > 1) {
    // Each dataset's first bad position is the least any rank found, its
    // targets with loss the sum of the ranks' parts; every rank then raises
    // the same error, or takes the same count.
    std::vector<data::TokenDataset*> sets;
    for (size_t c = 0; c < dataset_->num_components(); ++c) sets.push_back(&dataset_->component(c));
    for (auto& v : val_) {
      for (size_t c = 0; c < v.data->num_components(); ++c) sets.push_back(&v.data->component(c));
    }
    const double none = std::ldexp(1.0, 62);
    std::vector<double> first, kept;
    for (const auto* d : sets) {
      const data::TokenDataset::PartCheck mine = d->part_check();
      first.push_back(mine.first_bad < 0 ? none : static_cast<double>(mine.first_bad));
      kept.push_back(static_cast<double>(mine.loss_tokens));
    }
    const auto n = static_cast<int64_t>(sets.size());
    Tensor least = from_vector(first, {n}, DType::F64), sum = from_vector(kept, {n}, DType::F64);
    world_->all_reduce(least, dist::ReduceOp::Min)->wait();
    world_->all_reduce(sum, dist::ReduceOp::Sum)->wait();
    for (size_t i = 0; i < sets.size(); ++i) {
      const double at = least.data<double>()[i];
      sets[i]->accept_check(
          {at < none ? static_cast<int64_t>(at) : -1, static_cast<int64_t>(sum.data<double>()[i])});
    }
  }
  optim::AdamWOptions o;
  o.lr = config_.train.lr;
  o.beta1 = config_.train.beta1;
  o.beta2 = config_.train.beta2;
  o.eps = config_.train.eps;
  o.weight_decay = config_.train.weight_decay;
  o.moment_dtype = config_.train.moment_dtype();
  o.no_decay = config_.no_decay_parameters();
  o.lr_scale = config_.lr_scale_factors();
  if (mesh_ && data_parallel_ranks() > 1) {
    // Gradients still changed after backward are reduced last: the tied
    // embedding (summed across stages) and sequence-parallel partial sums.
    std::set<std::string> late;
    if (pp_model_ && config_.model.head_reads_token_embedding()) late.insert("wte.weight");
    std::map<std::string, tp::ShardSpec> specs;
    // Each parameter's elements that another TP rank holds too.
    std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> repeated;
    for (const tp::TensorParallelGpt* part : parallel_parts()) {
      for (auto& [n, sp] : part->shard_specs()) {
        specs[n] = sp;
        if (part->reduces_after_backward(n)) late.insert(n);
        if (sp.split) repeated[n] = part->repeated_elements(n);
      }
    }
    // Under expert parallelism an expert's replicas are the expert-data-
    // parallel ranks, and its gradient already sums ep ranks' tokens.
    dp::GradientReducer::OtherReplicas experts;
    if (par.ep > 1) {
      experts.group = mesh_->expert_dp();
      experts.divisor = par.ep;
      for (const auto& [name, p] : trainable_parameters()) {
        if (tp::TensorParallelGpt::is_expert(name)) experts.names.insert(name);
      }
    }
    reducer_ = std::make_unique<dp::GradientReducer>(trainable_parameters(), mesh_->dp(),
                                                     par.bucket_mb * 1e6, par.zero == 1, late,
                                                     std::move(experts));
    // ZeRO-1 clipping sums squares over the whole world: split parameters
    // on every TP rank, replicated ones on TP rank 0 only, the tied
    // embedding on the first stage only.
    // A shared key/value head counts on the first TP rank holding it.
    for (auto& [name, p] : trainable_parameters()) {  // (the reducer's order)
      const bool split = specs.count(name) && specs.at(name).split;
      double w = split || mesh_->tp_rank() == 0 ? 1.0 : 0.0;
      if (name == "wte.weight" && pp_model_ && mesh_->pp_rank() != 0) w = 0.0;
      norm_weight_.push_back(w);
      norm_names_.push_back(name);
      norm_repeated_.push_back(split ? repeated.at(name)
                                     : std::vector<std::pair<int64_t, int64_t>>{});
    }
  } else if (par.zero == 1) {
    throw ConfigError(
        "parallel.zero = 1 shards the optimizer over data-parallel ranks and needs dp > 1 (dp is " +
        std::to_string(dp_) + ")");
  }
  // Weight decay follows the tensor's rank (2-d shards stay 2-d).
  if (reducer_ && reducer_->zero1()) {
    zero_optimizer_ = std::make_unique<dp::ZeroAdamW>(*reducer_, o, muon_matrices(), muon_options(),
                                                      muon_updater());
    if (par.overlap_param_gather) {
      // The optimizer step leaves its all-gathers running; each part of the
      // model waits for its own parameters' buckets when the next forward
      // pass reaches it.
      reducer_->set_overlap_param_gather(true);
      dp::GradientReducer* reducer = reducer_.get();
      const tp::TensorParallelGpt::ParameterFence fence = [reducer](const nn::Module& part) {
        if (reducer->pending_gathers() > 0) reducer->wait_gathered(part.parameters());
      };
      if (tp_model_) tp_model_->set_parameter_fence(fence);
      if (pp_model_) {
        for (int c = 0; c < par.vpp; ++c) pp_model_->chunk(c).set_parameter_fence(fence);
      }
    }
  } else {
    make_optimizers(o);
  }
  reset_ema();
  trace_steps_from(0);
  choose_attention_kernel();
}

Trainer::~Trainer() {
  try {
    leave_profile_window();
  } catch (const std::exception& e) {
    spdlog::warn("stopping the CUDA profiler: {}", e.what());
  }
}

void Trainer::make_optimizers(const optim::AdamWOptions& o) {
  auto matrices = muon_matrices();
  std::vector<std::pair<std::string, Tensor>> rest;
  std::vector<std::pair<optim::MuonMatrix, Tensor>> muon;
  for (const auto& [name, p] : trainable_parameters()) {
    auto it = matrices.find(name);
    if (it == matrices.end()) {
      rest.push_back({name, p});
    } else {
      muon.push_back({std::move(it->second), p});
    }
  }
  optimizer_ = std::make_unique<optim::AdamW>(std::move(rest), o);
  if (config_.train.optimizer == "muon")
    muon_ = std::make_unique<optim::Muon>(std::move(muon), muon_options(), muon_updater());
}

std::map<std::string, optim::MuonMatrix> Trainer::muon_matrices() const {
  std::map<std::string, optim::MuonMatrix> out;
  if (config_.train.optimizer != "muon") return out;
  // Each parameter's full shape (a shard's is its whole matrix's).
  std::map<std::string, Shape> shapes;
  for (const tp::TensorParallelGpt* part : parallel_parts()) {
    for (const auto& [n, shape] : part->full_shapes()) shapes[n] = shape;
  }
  for (const auto& [name, p] : trainable_parameters()) {
    const auto it = shapes.find(name);
    const Shape full = it != shapes.end() ? it->second : p.shape();
    if (!nn::is_hidden_matrix(name, full)) continue;
    out[name] = {name, nn::fused_row_blocks(config_.model, name, full[0])};
  }
  return out;
}

optim::MuonUpdater Trainer::muon_updater() const {
  if (config_.train.optimizer != "muon" || !mesh_ || mesh_->tp()->size() == 1) return {};
  // Each matrix's cut over the TP ranks and its full shape.
  std::map<std::string, tp::ShardedMuon::Matrix> cuts;
  for (const tp::TensorParallelGpt* part : parallel_parts()) {
    for (const auto& [n, spec] : part->shard_specs())
      cuts[n] = {spec, part->full_shapes().at(n), {}};
  }
  std::map<std::string, tp::ShardedMuon::Matrix> matrices;
  for (auto& [name, m] : muon_matrices()) {
    tp::ShardedMuon::Matrix& x = matrices[name] = cuts.at(name);
    x.row_blocks = m.row_blocks;
  }
  return tp::ShardedMuon::updater(
      std::make_shared<tp::ShardedMuon>(mesh_->tp(), std::move(matrices), muon_options()));
}

optim::MuonOptions Trainer::muon_options() const {
  const auto& t = config_.train;
  optim::MuonOptions mo;
  mo.momentum = t.muon_momentum;
  mo.nesterov = t.muon_nesterov;
  mo.ns_steps = static_cast<int>(t.muon_ns_steps);
  mo.scale = optim::muon_scale_from_string(t.muon_scale);
  mo.weight_decay = t.weight_decay;
  mo.ns_dtype = t.muon_ns_dtype();
  mo.moment_dtype = t.moment_dtype();
  mo.no_decay = config_.no_decay_parameters();
  mo.lr_scale = config_.lr_scale_factors();
  return mo;
}

double Trainer::muon_lr(double lr) const {
  // It follows the schedule in proportion to its peak.
  const auto& t = config_.train;
  return t.muon_lr > 0 ? lr * t.muon_lr / t.lr : lr;
}

void Trainer::choose_attention_kernel() {
  if (!device_.is_cuda() || cuda::attention_kernel() != cuda::AttentionKernel::Auto) return;
  // The problem every training and evaluation forward poses: a microbatch
  // of whole sequences (sequence parallelism gathers them before attention)
  // with this rank's share of the heads.
  const int64_t tp = mesh_ ? mesh_->tp()->size() : 1;
  const auto& m = config_.model;
  // The windows the layers' calls pose: a sliding window shorter than the
  // sequence, where no document resets the mask, is a problem of its own
  // (its first keys the window alone); layers without one pose the whole
  // causal problem.
  std::set<int64_t> windows;
  for (int64_t i = 0; i < m.n_layer; ++i) {
    const int64_t w = m.window_of(i);
    windows.insert(w > 0 && w < m.seq_len && !m.reset_attention_mask ? w : 0);
  }
  const AttentionHeads heads =
      AttentionHeads{m.n_head / tp, m.kv_heads_per_rank(tp)}.with_softcap(m.attn_logit_softcap);
  for (int64_t window : windows) {
    cuda::AttentionChoice choice;
    const bool has = cuda::tune_attention(device_.index, config_.train.param_dtype(),
                                          config_.train.micro_batch_size, m.seq_len,
                                          m.q_width() / tp, heads.with_window(window), choice);
    if (!train::agree_attention_choice(has, choice, world_.get())) continue;
    cuda::set_attention_choice(choice);
    const int ranks = world_ ? world_->size() : 1;
    spdlog::info("attention{}: {} ({:.3f} ms with cuDNN, {:.3f} ms with Triad's kernels{})",
                 window > 0 ? fmt::format(" over a window of {}", window) : std::string(),
                 choice.cudnn ? "cuDNN" : "Triad's kernels", choice.cudnn_ms, choice.own_ms,
                 ranks > 1 ? fmt::format(", summed over {} ranks", ranks) : std::string());
  }
}

std::map<std::string, std::string> Trainer::layout() const {
  const auto& p = config_.parallel;
  const auto& m = config_.model;
  const std::string stages = joined(stage_layers_, ",");
  std::map<std::string, std::string> out{
      {"world", std::to_string(world_ ? world_->size() : 1)},
      {"tp", std::to_string(p.tp)},
      {"pp", std::to_string(p.pp)},
      {"dp", std::to_string(dp_)},
      {"vpp", std::to_string(p.vpp)},
      {"zero", std::to_string(p.zero)},
      {"sequence_parallel", p.sequence_parallel ? "true" : "false"},
      {"order", p.order},
      {"stage_layers", stages},
      {"bucket_mb", std::to_string(p.bucket_mb)},
      {"precision", config_.train.precision},
      // (Key/value heads only when grouped: earlier checkpoints' models
      // read the same.)
      {"model", std::to_string(m.n_layer) + "x" + std::to_string(m.d_model) + "x" +
                    std::to_string(m.n_head) +
                    (m.kv_heads() != m.n_head ? " kv " + std::to_string(m.kv_heads()) : "") +
                    " vocab " + std::to_string(m.vocab_size) + " seq " +
                    std::to_string(m.seq_len)}};
  // Expert parallelism (without it no key, as below).
  if (p.ep > 1) out["ep"] = std::to_string(p.ep);
  if (p.cp > 1) out["cp"] = std::to_string(p.cp);
  // The optimizer when not AdamW (earlier checkpoints' layouts read the
  // same): a run that changes it resumes as under another layout, the new
  // optimizer's state starting from zero.
  if (config_.train.optimizer != "adamw") out["optimizer"] = config_.train.optimizer;
  // The moments' storage when not f32 (earlier checkpoints read the same):
  // a run that changes it resumes as under another layout, its moments cast.
  if (config_.train.moment_precision != "fp32") out["moments"] = config_.train.moment_precision;
  // LoRA's adapters and their scale (a checkpoint read as a model merges
  // them with it). Without them no key: earlier checkpoints' layouts read
  // the same.
  if (m.lora.rank > 0) {
    std::string targets;
    for (const std::string& t : m.lora.targets) targets += (targets.empty() ? "" : ",") + t;
    char scale[32];
    std::snprintf(scale, sizeof scale, "%.17g", m.lora_scale());
    out["lora"] = "rank=" + std::to_string(m.lora.rank) + " scale=" + scale + " targets=" + targets;
  }
  // Which parameters hold optimizer state (patterns hold no whitespace).
  // Without train.freeze no key, as above.
  if (!config_.train.freeze.empty()) {
    std::string patterns;
    for (const std::string& p : config_.train.freeze) patterns += (patterns.empty() ? "" : " ") + p;
    out["freeze"] = patterns;
  }
  return out;
}

RankPlacement Trainer::placement() const {
  RankPlacement pl;
  if (mesh_) {
    pl.tp_rank = mesh_->tp_rank();
    pl.tp_size = mesh_->tp()->size();
    pl.pp_rank = mesh_->pp_rank();
    pl.dp_rank = mesh_->dp_rank();
  }
  for (const tp::TensorParallelGpt* part : parallel_parts()) {
    const auto& shapes = part->full_shapes();
    for (const auto& [name, spec] : part->shard_specs()) pl.params[name] = {spec, shapes.at(name)};
  }
  if (!tp_model_ && !pp_model_) {
    for (auto& [name, p] : model_->named_parameters()) {
      pl.params[name] = {tp::ShardSpec::replicated(), p.shape()};
    }
  }
  if (zero_optimizer_) {
    for (const auto& seg : reducer_->shard_segments()) {
      pl.zero_segments.push_back({reducer_->params()[seg.param].first, seg.param_offset, seg.length,
                                  zero_optimizer_->is_muon(seg.param)});
    }
  }
  return pl;
}

void Trainer::log_setup() {
  const auto& model = config_.model;
  spdlog::info(
      "model: {} layers, {} heads{}{}, d_model {}, vocab {}, seq {}{} ({:.2f}M parameters)",
      model.n_layer, model.n_head,
      model.latent_attention()
          ? fmt::format(
                " of latent attention (queries through {}, keys and values through a latent "
                "of {}, queries and keys {} + {} wide, values {})",
                model.mla.q_lora_rank > 0 ? "a latent of " + std::to_string(model.mla.q_lora_rank)
                                          : std::string("no latent"),
                model.mla.kv_lora_rank, model.mla.qk_nope_head_dim, model.mla.qk_rope_head_dim,
                model.mla.v_head_dim)
      : model.head_size > 0 ? fmt::format(" of width {}", model.head_size)
                            : std::string(),
      model.kv_heads() != model.n_head
          ? fmt::format(" sharing {} key/value head{}", model.kv_heads(),
                        model.kv_heads() == 1 ? "" : "s")
          : std::string(),
      model.d_model, model.vocab_size, model.seq_len,
      model.sliding_window > 0 && model.sliding_window < model.seq_len
          ? fmt::format(", attention over a window of {}{}", model.sliding_window,
                        model.full_attention_layers.empty()
                            ? std::string()
                            : fmt::format(" on {} of {} layers",
                                          model.n_layer - static_cast<int64_t>(
                                                              model.full_attention_layers.size()),
                                          model.n_layer))
          : std::string(),
      model.num_parameters() / 1e6);
  if (model.moe.experts > 0) {
    const auto& m = model.moe;
    // DeepSeek-V3's routing, where it is used: how the experts are scored
    // and chosen, and what balances them.
    std::string routing;
    if (m.score == nn::GptConfig::Moe::Score::Sigmoid) routing += ", sigmoid scores";
    if (m.groups > 1)
      routing += fmt::format(", within the best {} of {} groups", m.top_groups, m.groups);
    if (m.routed_scaling_factor != 1.0)
      routing += fmt::format(", gates times {:g}", m.routed_scaling_factor);
    if (m.expert_bias)
      routing += fmt::format(", expert biases moving {:g} a step", m.bias_update_rate);
    if (m.aux_loss_scope == nn::GptConfig::Moe::BalanceScope::Sequence && m.aux_loss_coef > 0)
      routing += ", balance loss per sequence";
    spdlog::info(
        "mixture of experts: {} experts of width {}, top {}{}{}, on {} of {} layers; "
        "{:.2f}M parameters active per token",
        m.experts, model.expert_ffn(), m.top_k, m.normalize_top_k ? " (renormalised)" : "", routing,
        model.n_layer - static_cast<int64_t>(m.dense_layers.size()), model.n_layer,
        model.active_parameter_count() / 1e6);
  }
  if (!config_.train.freeze.empty() || model.lora.rank > 0) {
    const auto shapes = nn::gpt_parameter_shapes(model);
    const std::set<std::string> frozen = config_.frozen_parameters();
    double all = 0, fixed = 0;
    for (const auto& [name, shape] : shapes) {
      all += static_cast<double>(numel(shape));
      if (frozen.count(name)) fixed += static_cast<double>(numel(shape));
    }
    if (model.lora.rank > 0) {
      std::string targets;
      for (const std::string& t : model.lora.targets) targets += (targets.empty() ? "" : ", ") + t;
      spdlog::info(
          "LoRA: rank {} (scale {:g}) on {}; the adapters' {:.3f}M of {:.2f}M parameters "
          "train, the rest frozen",
          model.lora.rank, model.lora_scale(), targets, (all - fixed) / 1e6, all / 1e6);
      if (const std::string why = io::peft_adapter_unsupported(model); !why.empty())
        spdlog::warn("LoRA: no PEFT adapter will be written beside the merged model: {}", why);
    } else {
      spdlog::info("train.freeze: {} of {} tensors frozen; {:.2f}M of {:.2f}M parameters train",
                   frozen.size(), shapes.size(), (all - fixed) / 1e6, all / 1e6);
    }
  }
  if (mesh_) {
    const auto& par = config_.parallel;
    std::string pipeline;
    if (par.pp > 1) {
      pipeline = ", schedule " + par.schedule;
      if (par.vpp > 1) pipeline += " (vpp " + std::to_string(par.vpp) + ")";
      if (par.tp > 1 && !par.sequence_parallel && par.pipeline_scatter_gather)
        pipeline += ", scatter-gather between stages";
    }
    if (const char* rehearsal = std::getenv("TRIAD_RANKS_PER_NODE"); rehearsal && *rehearsal) {
      spdlog::info("topology: TRIAD_RANKS_PER_NODE={} rehearses {} node(s) of up to {} rank(s)",
                   rehearsal, mesh_->node().num_nodes, rehearsal);
    }
    spdlog::info(
        "parallel: tp {} x pp {} x dp {}{} over {} ranks{}{}{}", par.tp, par.pp, dp_,
        cp_ > 1
            ? " x cp " + std::to_string(cp_) + " (" + cp::exchange_name(cp_exchange_.exchange) +
                  (cp_exchange_.a2a > 1
                       ? ": all-to-alls of " + std::to_string(cp_exchange_.a2a) + ", a ring of " +
                             std::to_string(cp_ / cp_exchange_.a2a) +
                             (par.cp_comm == "auto" ? ", auto: the context groups span nodes" : "")
                       : std::string()) +
                  ")"
            : std::string(),
        world_->size(), par.sequence_parallel ? ", sequence parallel" : "", pipeline,
        zero_optimizer_ ? (par.overlap_param_gather
                               ? ", ZeRO-1 (parameter all-gathers overlap the next forward)"
                               : ", ZeRO-1")
                        : "");
    if (!device_.is_cuda()) {
      const int threads = omp_get_max_threads();
      const int local = mesh_->node().local_size;
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      if (std::getenv("OMP_NUM_THREADS")) {
        spdlog::info("cpu: {} OpenMP thread(s) per rank (OMP_NUM_THREADS)", threads);
      } else {
        spdlog::info(
            "cpu: {} OpenMP thread(s) per rank: {} cores shared by the {} ranks on this node "
            "(OMP_NUM_THREADS sets it)",
            threads, cores, local);
      }
      if (threads > 1 && threads * local > cores && is_logging_rank()) {
        spdlog::warn(
            "cpu: {} ranks on this node with {} OpenMP threads each exceed its {} cores; leave "
            "OMP_NUM_THREADS unset to share them out, or set it to {}",
            local, threads, cores, std::max(1, cores / local));
      }
    }
    if (par.ep > 1) {
      spdlog::info(
          "expert parallel: ep {}: each of {} data-parallel ranks holds {} of the {} "
          "experts of every MoE layer, tokens exchanged all-to-all",
          par.ep, par.ep, config_.model.moe.experts / par.ep, config_.model.moe.experts);
    }
    if (config_.model.kv_heads() < par.tp) {
      spdlog::info("tensor parallel: each of the {} key/value heads is shared by {} ranks",
                   config_.model.kv_heads(), par.tp / config_.model.kv_heads());
    }
    const pipeline::StageWork work = pipeline::stage_work(config_.model);
    const double layer = std::accumulate(work.layer.begin(), work.layer.end(), 0.0) /
                         static_cast<double>(work.layer.size());
    if (!stage_layers_.empty()) {
      spdlog::info("pipeline stages' layers: [{}]{}", joined(stage_layers_, ", "),
                   par.stage_layers_auto
                       ? fmt::format(" (parallel.stage_layers auto: the head's work is that of "
                                     "{:.1f} layers)",
                                     work.head / layer)
                       : std::string());
    } else if (par.pp > 1) {
      // An even split: say when the head makes the last stage the bottleneck.
      const double per_stage =
          static_cast<double>(config_.model.n_layer) / (par.pp * par.vpp) * layer;
      const double ratio = (per_stage + work.head) / per_stage;
      if (ratio > 1.15) {
        spdlog::info(
            "pipeline stages: the last one also runs the head, {:.2f}x the others' work; "
            "parallel.stage_layers: auto would balance them",
            ratio);
      }
    }
  }
  if (device_.is_cuda() && cuda::gemm_settings().verify) {
    spdlog::warn(
        "gemm verification is on (TRIAD_VERIFY_GEMMS=1): every product is checked against a "
        "reference kernel and waited for, which makes training much slower");
  }
  {
    const auto name = [](DType d) { return d == DType::BF16 ? "bf16" : "f32"; };
    const std::string moments = name(config_.train.moment_dtype());
    std::string detail;
    if (config_.train.precision == "fp32") {
      if (moments != "f32") detail = " (bf16 optimizer moments)";
    } else {
      detail = std::string(" (") + name(config_.train.grad_dtype()) +
               " gradients, f32 master weights, " + moments + " optimizer moments" +
               (scaler_ ? ", dynamic loss scaling)" : ")");
    }
    spdlog::info("device: {}; precision: {}{}", device_.str(), config_.train.precision, detail);
  }
  if (!config_.train.no_weight_decay.empty()) {
    // (Vectors never decay: the ones matched are not news.)
    const std::set<std::string> matched = config_.no_decay_parameters();
    std::string listed;
    int64_t matrices = 0;
    for (const auto& [name, shape] : nn::gpt_parameter_shapes(config_.model)) {
      if (shape.size() < 2 || !matched.count(name)) continue;
      if (matrices++ < 6) listed += (listed.empty() ? "" : ", ") + name;
    }
    if (matrices > 6) listed += ", ...";
    spdlog::info("train.no_weight_decay: {} {} no weight decay{}{}", matrices,
                 matrices == 1 ? "matrix takes" : "matrices take", matrices > 0 ? ": " : "",
                 listed);
  }
  if (!config_.train.lr_scale.empty()) {
    // How many parameters take each factor.
    std::map<double, int64_t> counts;
    for (const auto& [name, factor] : config_.lr_scale_factors()) ++counts[factor];
    std::string listed;
    for (const auto& [factor, n] : counts)
      listed += fmt::format("{}{} at x{:g}", listed.empty() ? "" : ", ", n, factor);
    spdlog::info("train.lr_scale: parameters at the learning rate times a factor: {}", listed);
  }
  if (fim_.rate > 0) {
    spdlog::info(
        "data.fim_rate: {:g} of the training documents rearranged around sentinels {}, {}, {} "
        "(prefix, middle, suffix), {:g} of those suffix first",
        fim_.rate, fim_.prefix_token, fim_.middle_token, fim_.suffix_token, fim_.spm_rate);
  }
  if (!config_.train.skip_steps.empty()) {
    std::string listed;
    int64_t count = 0;
    for (const auto& [first, last] : config_.train.skip_steps) {
      listed += (listed.empty() ? "" : ", ") +
                (first == last ? std::to_string(first) : fmt::format("{}-{}", first, last));
    }
    int64_t last = 0;  // (ranges may overlap: counted step by step)
    for (int64_t k = 1; k <= config_.train.steps; ++k) count += config_.train.skips_step(k);
    for (const auto& [first, end] : config_.train.skip_steps) last = std::max(last, end);
    spdlog::info(
        "train.skip_steps: {} step(s) pass their batches over unread, nothing trained ({})", count,
        listed);
    if (last > config_.train.steps) {
      spdlog::warn("train.skip_steps names step {}, past this run's last ({}): it never comes",
                   last, config_.train.steps);
    }
  }
  if (config_.eval.early_stop_patience > 0) {
    spdlog::info(
        "early stopping: the run ends after {} evaluation(s) in a row without the validation loss "
        "falling by more than {:g} below its best",
        config_.eval.early_stop_patience, config_.eval.early_stop_delta);
  }
  if (spikes_.enabled()) {
    spdlog::info(
        "spikes: a step whose loss or gradient norm exceeds the mean of the last {} steps' by "
        "{:g} standard deviations is skipped (judged from step {} on)",
        config_.train.spike_window, config_.train.spike_sigma,
        std::max<int64_t>(2, config_.train.spike_window / 2) + 1);
  }
  if (config_.model.recompute_layers > 0) {
    spdlog::info(
        "recompute: full, the first {} layer(s) of each {}; the others keep their "
        "activations",
        config_.model.recompute_layers, config_.parallel.pp > 1 ? "pipeline stage" : "model");
  }
  if (config_.train.optimizer == "muon") {
    // (This rank's parameters: its stage's, its shards.)
    const auto matrices = muon_matrices();
    int64_t muon_elements = 0, rest = 0;
    for (const auto& [name, p] : trainable_parameters())
      (matrices.count(name) ? muon_elements : rest) += p.numel();
    const auto& t = config_.train;
    spdlog::info(
        "optimizer: Muon on {} matrices ({} elements here; momentum {}{}, {} Newton-Schulz steps "
        "in {}, scale {}, peak lr {:g}), AdamW on the rest ({} elements)",
        matrices.size(), muon_elements, t.muon_momentum, t.muon_nesterov ? ", Nesterov" : "",
        t.muon_ns_steps, dtype_name(t.muon_ns_dtype()), t.muon_scale,
        t.muon_lr > 0 ? t.muon_lr : t.lr, rest);
  }
  spdlog::info(
      "data: {} tokens, {} sequences{}; {} steps{} of {} sequences ({} micro-batches of {}{})",
      dataset_->num_tokens(), dataset_->num_sequences(),
      std::string(config_.data_shuffle ? " (shuffled every pass)" : "") +
          (config_.data_val_split > 0
               ? fmt::format(" (the first {:g}%: data.val_split holds out the rest)",
                             100 * (1 - config_.data_val_split))
               : std::string()),
      config_.train.steps,
      config_.train.epochs > 0 ? fmt::format(" (train.epochs {:g})", config_.train.epochs)
                               : std::string(),
      config_.train.global_batch_size, config_.accumulation_steps(), config_.train.micro_batch_size,
      dp_ > 1
          ? ", " + std::to_string(config_.accumulation_steps() / dp_) + " per data-parallel rank"
          : std::string());
  if (dataset_->num_sequences() < config_.train.global_batch_size) {
    spdlog::warn(
        "data.train holds {} sequences of model.seq_len + 1 = {} tokens, fewer than one global "
        "batch (train.global_batch_size = {}): each step repeats some of them",
        dataset_->num_sequences(), config_.model.seq_len + 1, config_.train.global_batch_size);
  }
  if (ramp_.ramps()) {
    const auto sizes = ramp_.sizes();
    spdlog::info("  the global batch ramps from {} by {} to {} over the first {} sequences",
                 sizes.front(), sizes.size() > 1 ? sizes[1] - sizes[0] : 0, sizes.back(),
                 ramp_.samples());
  }
  if (!config_.log_plan_cluster.empty()) log_plan(is_logging_rank());
  const auto& mc = config_.model;
  if (mc.resets_documents() || config_.data_eod_mask_loss) {
    std::string what;
    auto say = [&](bool on, const char* s) {
      if (on) what.append(what.empty() ? "" : ", ").append(s);
    };
    say(mc.reset_attention_mask, "attention within each document");
    say(mc.reset_position_ids, "positions from each document's start");
    say(config_.data_eod_mask_loss, "no loss on the token after the end");
    spdlog::info("  packed documents ending with token {}: {}", mc.eod_token, what);
  }
  // Each set's rows of whole documents (data.packing) and loss masks (fine-tuning data).
  auto say_set = [&](const data::TokenDataset& d, const std::string& name) {
    if (config_.data_packing != "stream") {
      const double all = static_cast<double>(d.num_sequences() * (config_.model.seq_len + 1));
      spdlog::info(
          "  {}: {} rows of whole documents, {:.1f}% padding{}", name, d.num_sequences(),
          100.0 * static_cast<double>(d.padding_tokens()) / all,
          d.long_documents() > 0
              ? fmt::format("; {} documents longer than a row {}", d.long_documents(),
                            config_.data_long_documents == "split" ? "cut into rows of their own"
                            : config_.data_long_documents == "truncate" ? "truncated to one row"
                                                                        : "dropped")
              : std::string());
    }
    if (d.masked_sources() == 0) return;
    spdlog::info(
        "  {}: loss masks on {} source(s); {} of {} tokens ({:.1f}%) are targets with loss", name,
        d.masked_sources(), d.loss_tokens(), d.num_tokens(),
        100.0 * static_cast<double>(d.loss_tokens()) / static_cast<double>(d.num_tokens()));
  };
  for (size_t c = 0; c < dataset_->num_components(); ++c) {
    say_set(dataset_->component(c), "data.train " + config_.data_train[c].path);
  }
  for (const auto& v : val_) {
    for (size_t c = 0; c < v.data->num_components(); ++c) {
      say_set(v.data->component(c),
              config_.data_val_split > 0
                  ? fmt::format("data.val_split {} (its last {:g}%)", v.data->name(c),
                                100 * config_.data_val_split)
                  : (v.name.empty() ? "data.val " : "data.val." + v.name + " ") + v.path);
    }
  }
  if (dataset_->num_components() > 1) {
    for (size_t c = 0; c < dataset_->num_components(); ++c) {
      const auto& d = dataset_->component(c);
      spdlog::info("  mixture: {:.1f}% from {} ({} tokens; one pass every {:.0f} steps)",
                   100 * dataset_->share(c), config_.data_train[c].path, d.num_tokens(),
                   static_cast<double>(d.num_sequences()) /
                       (dataset_->share(c) * static_cast<double>(config_.train.global_batch_size)));
    }
  }
  // What each evaluation reads, and when.
  const std::string when =
      config_.eval.interval > 0
          ? "every " + std::to_string(config_.eval.interval) + " steps and at the end"
          : std::string("after the last step");
  const std::string share =
      dp_ > 1 ? fmt::format(" (each data-parallel rank scores about 1/{})", dp_) : std::string();
  for (const auto& set : choices_) {
    spdlog::info("choices{}: {} questions of {}{}, {}", set.name.empty() ? "" : " set " + set.name,
                 set.total, set.path, share, when);
  }
  for (const auto& set : lambada_) {
    spdlog::info("lambada{}: {} texts of {}{}, {}", set.name.empty() ? "" : " set " + set.name,
                 set.total, set.path, share, when);
  }
  for (const auto& v : val_) {
    spdlog::info("validation{}: {} global batches ({} tokens) of {}, {}",
                 v.name.empty() ? "" : " set " + v.name, v.batches,
                 v.batches * config_.train.global_batch_size * config_.model.seq_len, v.path, when);
  }
}

StepMetrics Trainer::check() {
  if (!is_logging_rank()) spdlog::set_level(spdlog::level::warn);
  log_setup();
  const auto& ck = config_.checkpoint;
  int64_t first = 0;
  if (!ck.dir.empty()) io::check_checkpoint_dir_writable(ck.dir, world_ ? world_->rank() : 0);
  if (ck.resumes()) first = load_checkpoint();
  // (From a checkpoint at the last step, the step after it; trained even
  // when train.skip_steps would pass it over, to be measured.)
  StepMetrics m = train_step(first);
  rank_timing_into(m, 1);  // (every rank's peak; a collective)
  const int local = mesh_ ? mesh_->node().local_size : 1;
  const RankMemory memory = rank_memory(device_, local);
  const double peak = static_cast<double>(m.peak_memory_bytes);
  std::string share;  // the peak against what this rank has
  if (memory.bytes > 0) {
    const double pct = 100 * peak / memory.bytes, gb = memory.bytes / 1e9;
    share = device_.is_cuda() ? fmt::format(" ({:.1f}% of {}'s {:.3g} GB)", pct, device_.str(), gb)
            : local > 1
                ? fmt::format(" ({:.1f}% of {:.3g} GB, 1/{} of this node's memory)", pct, gb, local)
                : fmt::format(" ({:.1f}% of this machine's {:.3g} GB)", pct, gb);
  }
  if (world_ && world_->size() > 1) {
    const StepMetrics::RankMemory& r = *m.rank_peak_memory;
    share += fmt::format(", rank {} the largest (the smallest {:.3g} GB)", r.largest_rank,
                         static_cast<double>(r.min_bytes) / 1e9);
  }
  spdlog::info(
      "check: step {} ran in {:.1f} ms (with the first step's one-time costs) at a peak of {:.3g} "
      "GB a rank{}; loss {:.4f}, grad norm {:.3f}. The run is ready; nothing was written",
      m.step, m.step_ms, peak / 1e9, share, m.loss, m.grad_norm);
  return m;
}

}  // namespace triad::train
