#include "triad/plan/from_config.h"

#include "triad/core/error.h"
#include "triad/parallel/pipeline/stage_balance.h"

namespace triad::plan {

PlannedRun planned_run(const train::Config& config, int gpus) {
  const auto& par = config.parallel;
  PlannedRun run;
  run.model = config.model;
  // (Context parallelism's ranks beside the replicas: tp*pp*cp GPUs each.)
  const int tp_pp = par.tp * par.pp * par.cp;
  const std::string product = par.cp > 1 ? "tp*pp*cp" : "tp*pp";
  if (gpus <= 0) {
    if (par.dp <= 0) {
      throw ConfigError(
          "the config leaves parallel.dp to the world size: give the number of GPUs (--gpus), "
          "a multiple of " +
          product + " = " + std::to_string(tp_pp));
    }
    gpus = tp_pp * par.dp;
  }
  if (gpus % tp_pp != 0) {
    throw ConfigError("GPUs (" + std::to_string(gpus) + ") must be a multiple of " + product +
                      " = " + std::to_string(par.tp) + "*" + std::to_string(par.pp) +
                      (par.cp > 1 ? "*" + std::to_string(par.cp) : ""));
  }
  ParallelConfig& p = run.layout;
  p.tp = par.tp;
  p.pp = par.pp;
  p.vpp = par.vpp;
  p.dp = gpus / tp_pp;
  if (par.dp > 0 && par.dp != p.dp) {
    throw ConfigError("parallel.dp (" + std::to_string(par.dp) + ") with " + product + " = " +
                      std::to_string(tp_pp) + " needs " + std::to_string(par.dp * tp_pp) +
                      " GPUs, not " + std::to_string(gpus));
  }
  p.micro_batch = static_cast<int>(config.train.micro_batch_size);
  p.recompute = config.model.recompute == nn::Recompute::Full        ? Recompute::Full
                : config.model.recompute == nn::Recompute::Selective ? Recompute::Selective
                                                                     : Recompute::None;
  p.recompute_layers = static_cast<int>(config.model.recompute_layers);
  p.sequence_parallel = par.sequence_parallel;
  p.zero1 = par.zero == 1;
  p.ep = par.ep;
  p.cp = par.cp;
  p.cp_exchange = cp::exchange_from_string(par.cp_comm);
  p.cp_a2a = par.cp_a2a;
  p.schedule =
      par.pp > 1 ? pipeline::schedule_from_name(par.schedule) : pipeline::ScheduleKind::OneFOneB;
  p.zb_max_in_flight = par.zb_max_in_flight;
  // The trainer's split: as given, or balanced as the trainer balances it.
  p.stage_layers = par.stage_layers;
  if (par.pp > 1 && par.stage_layers_auto) {
    p.stage_layers = pipeline::balanced_stage_layers(config.model, par.pp, par.vpp,
                                                     config.model.recompute == nn::Recompute::Full,
                                                     config.model.recompute_layers);
  }
  // Triad's implementation and what the config holds whatever the layout.
  search_space(config).apply_to(p);
  run.gpus = gpus;
  run.global_batch = static_cast<int>(config.train.global_batch_size);
  run.note = planning_note(config);
  return run;
}

std::string planning_note(const train::Config& config) {
  if (config.train.precision != "fp32") return "";
  return "the planner prices mixed precision (bf16/fp16 weights and activations); this config "
         "trains in fp32, which needs about twice the activation memory and runs slower";
}

SearchSpace search_space(const train::Config& config) {
  SearchSpace space;
  space.overlap_dp = true;  // Triad's bucketed reducer starts during backward
  space.overlap_tp = true;  // Triad's column-parallel layers
  space.attention = Attention::Flash;
  space.muon = config.train.optimizer == "muon";
  space.muon_ns_fp32 = space.muon && config.train.muon_ns_dtype() == DType::F32;
  space.bf16_moments = config.train.moment_dtype() == DType::BF16;
  space.bf16_grads = config.train.grad_dtype() == DType::BF16;
  // (An average in host memory, train.ema_device cpu, costs the GPU nothing.)
  space.ema = config.train.ema_decay > 0 && config.train.ema_device == "device";
  space.overlap_param_gather = config.parallel.overlap_param_gather;
  space.scatter_gather = config.parallel.pipeline_scatter_gather;
  // train.freeze (model.lora's own freezing the cost model applies itself).
  if (config.model.lora.rank <= 0) space.frozen = config.frozen_parameters();
  space.ramp_batches = config.train.batch_ramp().sizes();
  return space;
}

std::vector<std::string> trainer_settings(const ParallelConfig& p, int global_batch) {
  std::vector<std::string> out;
  const auto set = [&](const char* key, const std::string& value) {
    std::string setting = key;
    setting += '=';
    setting += value;
    out.push_back(std::move(setting));
  };
  const auto flag = [](bool on) { return std::string(on ? "true" : "false"); };
  std::string stages = "[";
  for (size_t i = 0; i < p.stage_layers.size(); ++i) {
    if (i > 0) stages += ',';
    stages += std::to_string(p.stage_layers[i]);
  }
  stages += ']';
  const bool zero_bubble_search =
      p.schedule == pipeline::ScheduleKind::ZbAuto || p.schedule == pipeline::ScheduleKind::ZbV;
  set("parallel.tp", std::to_string(p.tp));
  set("parallel.pp", std::to_string(p.pp));
  set("parallel.dp", std::to_string(p.dp));
  set("parallel.vpp", std::to_string(p.vpp));
  set("parallel.schedule", pipeline::schedule_name(p.schedule));
  set("parallel.zb_max_in_flight", std::to_string(zero_bubble_search ? p.zb_max_in_flight : 0));
  set("parallel.stage_layers", stages);
  set("parallel.sequence_parallel", flag(p.sequence_parallel));
  set("parallel.zero", p.zero1 ? "1" : "0");
  set("parallel.ep", std::to_string(p.ep));
  set("parallel.cp", std::to_string(p.cp));
  set("parallel.cp_comm", cp::exchange_name(p.cp_exchange));
  set("parallel.cp_a2a", std::to_string(p.cp_a2a));
  set("parallel.overlap_param_gather", flag(p.overlap_param_gather));
  set("parallel.pipeline_scatter_gather", flag(p.scatter_gather));
  set("train.global_batch_size", std::to_string(global_batch));
  set("train.micro_batch_size", std::to_string(p.micro_batch));
  set("model.recompute", recompute_name(p.recompute));
  set("model.recompute_layers", std::to_string(p.recompute_layers));
  return out;
}

}  // namespace triad::plan
