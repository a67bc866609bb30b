#include "triad/train/trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "triad/autograd/engine.h"
#include "triad/data/token_shard.h"
#include "triad/io/gpt2_weights.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/optim/clip.h"

namespace triad::train {
namespace {

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>((s / 60) % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return buf;
}

}  // namespace

Trainer::Trainer(Config config, dist::ProcessGroupPtr world)
    : config_(std::move(config)),
      world_(std::move(world)),
      schedule_(config_.train.lr, config_.train.min_lr, config_.train.warmup_steps,
                config_.train.steps) {
  const Device device = device_from_string(config_.device);
  if (!device.is_cpu()) {
    throw NotSupportedError("device '" + config_.device +
                            "': this build trains on cpu only (the CUDA backend is not available)");
  }
  const int world_size = world_ ? world_->size() : 1;
  // The layout is checked against the world before any communicator exists.
  dist::MeshShape shape{config_.parallel.tp, 1, 1};
  shape.validate(world_size);
  if (config_.parallel.tp > 1) {
    mesh_ = std::make_unique<dist::DeviceMesh>(world_, shape);
    tp_model_ = std::make_unique<tp::TensorParallelGpt>(
        config_.model, config_.train.seed, mesh_->tp(), config_.parallel.sequence_parallel);
    if (!config_.init_from.empty()) {
      tp_model_->load_full_state_dict(
          io::load_gpt2_state_dict(config_.init_from, tp_model_->full_shapes()));
    }
  } else {
    model_ = std::make_unique<nn::Gpt>(config_.model, config_.train.seed);
    if (!config_.init_from.empty()) io::load_gpt2_safetensors(*model_, config_.init_from);
  }
  dataset_ = std::make_unique<data::TokenDataset>(data::expand_shard_paths(config_.data_train),
                                                  config_.model.seq_len, config_.model.vocab_size);
  optim::AdamWOptions o;
  o.lr = config_.train.lr;
  o.beta1 = config_.train.beta1;
  o.beta2 = config_.train.beta2;
  o.eps = config_.train.eps;
  o.weight_decay = config_.train.weight_decay;
  // Weight decay follows the full tensor's rank (2-d shards stay 2-d).
  optimizer_ = std::make_unique<optim::AdamW>(module().named_parameters(), o);
}

nn::Module& Trainer::module() const {
  return tp_model_ ? static_cast<nn::Module&>(*tp_model_) : static_cast<nn::Module&>(*model_);
}

Tensor Trainer::micro_loss(const Tensor& ids, const Tensor& targets,
                           const nn::ForwardContext& ctx) const {
  return tp_model_ ? tp_model_->loss(ids, targets, ctx) : model_->loss(ids, targets, ctx);
}

nn::StateDict Trainer::full_state_dict() const {
  return tp_model_ ? tp_model_->full_state_dict() : model_->state_dict();
}

StepMetrics Trainer::step(int64_t index) {
  const auto start = std::chrono::steady_clock::now();
  const auto& t = config_.train;
  const int64_t accum = config_.accumulation_steps();
  double loss_sum = 0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    data::Batch b =
        dataset_->batch(index, t.global_batch_size, micro * t.micro_batch_size, t.micro_batch_size);
    nn::ForwardContext ctx{true, t.seed, static_cast<uint64_t>(index * accum + micro)};
    Tensor loss = micro_loss(b.inputs, b.targets, ctx);
    const double value = item(loss);
    if (!std::isfinite(value)) {
      throw Error("loss is " + std::to_string(value) + " at step " + std::to_string(index + 1) +
                  ", micro-batch " + std::to_string(micro));
    }
    loss_sum += value;
    // Each micro-batch's mean loss weighs 1/accum: the step loss is the mean
    // over all global_batch_size * seq_len tokens.
    autograd::backward({scale(loss, 1.0 / static_cast<double>(accum))});
  }
  double norm = 0;
  if (tp_model_) {
    tp_model_->reduce_sequence_parallel_grads();
    norm = tp_model_->clip_grad_norm(t.grad_clip);
  } else {
    norm = optim::clip_grad_norm(model_->parameters(), t.grad_clip);
  }
  const double lr = schedule_.at(index);
  optimizer_->step(lr);
  module().zero_grad();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  StepMetrics m;
  m.step = index + 1;
  m.loss = loss_sum / static_cast<double>(accum);
  m.lr = lr;
  m.grad_norm = norm;
  m.step_ms = ms;
  m.tokens_per_s = static_cast<double>(t.global_batch_size * config_.model.seq_len) / (ms / 1000.0);
  return m;
}

std::vector<StepMetrics> Trainer::run() {
  const bool lead = is_logging_rank();
  std::unique_ptr<MetricsWriter> metrics;
  if (lead) {
    std::filesystem::create_directories(config_.output_dir);
    std::ofstream cfg(config_.output_dir + "/config.yaml");
    cfg << to_yaml(config_);
    metrics = std::make_unique<MetricsWriter>(config_.output_dir + "/metrics.jsonl");
  } else {
    spdlog::set_level(spdlog::level::warn);
  }
  spdlog::info("model: {} layers, {} heads, d_model {}, vocab {}, seq {} ({:.2f}M parameters)",
               config_.model.n_layer, config_.model.n_head, config_.model.d_model,
               config_.model.vocab_size, config_.model.seq_len,
               config_.model.num_parameters() / 1e6);
  if (tp_model_) {
    spdlog::info("parallel: tp {}{} over {} ranks", config_.parallel.tp,
                 config_.parallel.sequence_parallel ? " with sequence parallelism" : "",
                 world_->size());
  }
  spdlog::info("data: {} tokens, {} sequences; {} steps of {} sequences ({} micro-batches of {})",
               dataset_->num_tokens(), dataset_->num_sequences(), config_.train.steps,
               config_.train.global_batch_size, config_.accumulation_steps(),
               config_.train.micro_batch_size);
  std::vector<StepMetrics> out;
  double total_ms = 0;
  const int64_t steps = config_.train.steps;
  for (int64_t k = 0; k < steps; ++k) {
    StepMetrics m = step(k);
    total_ms += m.step_ms;
    if (metrics) metrics->write(m);
    out.push_back(m);
    if (m.step == 1 || m.step % config_.log_interval == 0 || m.step == steps) {
      const double eta =
          total_ms / 1000.0 / static_cast<double>(m.step) * static_cast<double>(steps - m.step);
      spdlog::info(
          "step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | {:.1f} ms | "
          "ETA {}",
          m.step, steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.step_ms,
          format_duration(eta));
    }
  }
  const std::string weights = config_.output_dir + "/model.safetensors";
  const nn::StateDict full = full_state_dict();  // collective
  if (lead) {
    io::save_gpt2_state_dict(full, config_.model, weights);
    spdlog::info("wrote {} and {}/metrics.jsonl", weights, config_.output_dir);
  }
  return out;
}

}  // namespace triad::train
