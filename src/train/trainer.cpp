// The trainer's step and loop: each step's forward and backward passes
// (micro-batches, pipelines, the data-parallel reduction), the gradient
// norm and the update, with the skips, spikes and loss scale around it;
// then run(), the loop of steps, evaluations, checkpoints and log lines.
// (Set-up, checkpoints, evaluation and timing have files of their own:
// trainer.h says which.)

#include "triad/train/trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>

#include "train/captured_step.h"
#include "triad/autograd/engine.h"
#include "triad/autograd/grad_mode.h"
#include "triad/backend/backend.h"
#include "triad/backend/cuda.h"
#include "triad/core/nvtx.h"
#include "triad/data/fill_in_the_middle.h"
#include "triad/io/checkpoint.h"
#include "triad/nn/moe.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/shape_ops.h"
#include "triad/optim/clip.h"
#include "triad/parallel/pipeline/schedule.h"
#include "triad/parallel/pipeline/simulator.h"
#include "triad/parallel/pipeline/zero_bubble.h"
#include "triad/train/replica_check.h"
#include "triad/train/tensorboard.h"
#include "triad/train/training_data.h"

namespace triad::train {
namespace {

// Set by SIGTERM/SIGINT; the training loop checks it between steps.
std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) {
  g_stop_requested = true;
}

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

std::vector<const tp::TensorParallelGpt*> Trainer::parallel_parts() const {
  std::vector<const tp::TensorParallelGpt*> out;
  if (pp_model_) {
    for (int c = 0; c < pp_model_->v(); ++c) out.push_back(&pp_model_->chunk(c));
  } else if (tp_model_) {
    out.push_back(tp_model_.get());
  }
  return out;
}

void Trainer::barrier() const {
  if (world_ && world_->size() > 1) world_->barrier()->wait();
}

int64_t Trainer::optimizer_state_elements() const {
  if (zero_optimizer_) return zero_optimizer_->state_elements();
  int64_t n = 0;
  for (auto& st : optimizer_->state()) n += st.m.numel();
  return n;
}

double Trainer::global_norm_zero1(const Tensor& flat) const {
  return std::sqrt(world_sums({item(local_norm_squares_zero1(flat, nullptr))}).at(0));
}

std::vector<double> Trainer::world_sums(std::vector<double> values) const {
  Tensor t = from_vector(values, {static_cast<int64_t>(values.size())}, DType::F64);
  world_->all_reduce(t, dist::ReduceOp::Sum)->wait();
  const double* v = t.data<double>();
  return std::vector<double>(v, v + values.size());
}

Tensor Trainer::local_norm_squares_zero1(const Tensor& flat,
                                         const optim::NormGroups* groups) const {
  autograd::NoGradGuard ng;
  const size_t G = groups ? groups->size() : 1;
  std::vector<std::vector<Tensor>> pieces(G);
  for (const auto& seg : reducer_->shard_segments()) {
    if (norm_weight_[seg.param] == 0.0) continue;
    std::vector<Tensor>& into = pieces[groups ? groups->of(norm_names_[seg.param]) : 0];
    // The segment's elements [seg.param_offset, + length) of the parameter,
    // less those another TP rank counts.
    int64_t at = seg.param_offset;
    const int64_t end = seg.param_offset + seg.length;
    auto take = [&](int64_t from, int64_t to) {
      if (to > from) {
        into.push_back(make_view(flat, {to - from}, {1},
                                 flat.offset() + seg.flat_offset + (from - seg.param_offset)));
      }
    };
    for (const auto& [begin, stop] : norm_repeated_[seg.param]) {
      take(at, std::min(begin, end));
      at = std::max(at, std::min(stop, end));
    }
    take(at, end);
  }
  const Tensor local = optim::grouped_sum_of_squares(pieces, flat.device());
  return local.defined() ? local : zeros({static_cast<int64_t>(G)}, DType::F64, flat.device());
}

Tensor Trainer::group_norm_squares(const optim::NormGroups& groups, bool of_grads) const {
  autograd::NoGradGuard ng;
  const auto G = static_cast<int64_t>(groups.size());
  // As grad_norm() and param_norm() count: under ZeRO-1 from this rank's
  // pieces of the flat buffers (the updated ones for the values).
  Tensor t;
  if (zero_optimizer_) {
    t = local_norm_squares_zero1(of_grads ? reducer_->flat_grads() : reducer_->flat_params(),
                                 &groups);
  } else if (pp_model_) {
    t = pp_model_->norm_squares(of_grads, &groups);
  } else if (tp_model_) {
    t = tp_model_->norm_squares(groups, of_grads);
  } else {
    std::vector<std::vector<Tensor>> tensors(static_cast<size_t>(G));
    for (const auto& [name, p] : model_->named_parameters()) {
      // (The values of the parameters that train: a frozen one has none.)
      tensors[groups.of(name)].push_back(of_grads            ? p.grad()
                                         : p.requires_grad() ? p.detach()
                                                             : Tensor());
    }
    t = optim::grouped_sum_of_squares(tensors, device_);
  }
  return t.defined() ? t : zeros({G}, DType::F64, device_);
}

std::vector<std::pair<std::string, double>> Trainer::norms_by_group(
    GroupNorms& report, bool of_grads, const std::vector<double>* read) {
  if (!report.groups) return {};
  autograd::NoGradGuard ng;
  const optim::NormGroups& groups = *report.groups;
  const size_t G = groups.size();
  const int64_t n = static_cast<int64_t>(G);
  if (report.trains.empty()) {
    // The groups with a parameter that trains on some rank.
    std::vector<double> trains(G, 0.0);
    for (const auto& [name, p] : trainable_parameters()) trains[groups.of(name)] = 1.0;
    Tensor t = from_vector(trains, {n}, DType::F64);
    if (world_ && world_->size() > 1) world_->all_reduce(t, dist::ReduceOp::Max)->wait();
    for (size_t i = 0; i < G; ++i) report.trains.push_back(t.data<double>()[i] > 0);
  }
  std::vector<double> squares;
  if (read && read->size() == G) {
    squares = *read;
  } else {
    const Tensor t = to_device(group_norm_squares(groups, of_grads), Device::cpu());
    squares.assign(t.data<double>(), t.data<double>() + G);
    if (zero_optimizer_) squares = world_sums(std::move(squares));
  }
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < G; ++i)
    if (report.trains[i]) out.emplace_back(groups.names()[i], std::sqrt(squares[i]));
  return out;
}

double Trainer::param_norm() const {
  // Under ZeRO-1 from this rank's updated pieces: with overlapped gathers
  // the other ranks' pieces reach the parameters only in the next forward.
  if (zero_optimizer_) return global_norm_zero1(reducer_->flat_params());
  return pp_model_   ? pp_model_->param_norm()
         : tp_model_ ? tp_model_->param_norm()
                     : optim::global_param_norm(model_->parameters());
}

void Trainer::unscale_gradients() const {
  autograd::NoGradGuard ng;
  const double inv = scaler_->inv_scale();
  if (reducer_) {
    scale_(reducer_->flat_grads(), inv);  // every gradient lives in the flat buffer
    return;
  }
  for (auto& [name, p] : parameters()) {
    Tensor g = p.grad();
    if (g.defined()) scale_(g, inv);
  }
}

std::vector<std::pair<std::string, Tensor>> Trainer::parameters() const {
  // With overlap_param_gather the last step's all-gathers may still run.
  if (reducer_) reducer_->wait_gathers();
  if (pp_model_) return pp_model_->named_parameters();
  if (tp_model_) return tp_model_->named_parameters();
  return model_->named_parameters();
}

std::vector<std::pair<std::string, Tensor>> Trainer::trainable_parameters() const {
  auto all = parameters();
  std::erase_if(all, [](const auto& named) { return !named.second.requires_grad(); });
  return all;
}

void Trainer::reset_ema() {
  autograd::NoGradGuard no_grad;
  ema_.clear();
  ema_pending_ = false;
  ema_folded_ = false;
  if (!ema_on()) return;
  const Device where = config_.train.ema_device == "cpu" ? Device::cpu() : device_;
  for (const auto& [name, p] : trainable_parameters())
    ema_.emplace_back(name, clone(cast(to_device(p.detach(), where), DType::F32)).detach());
}

void Trainer::fold_ema() {
  if (!ema_pending_) return;
  autograd::NoGradGuard no_grad;
  const double d = config_.train.ema_decay;
  const auto params = trainable_parameters();  // (ZeRO-1's all-gathers done)
  if (params.size() != ema_.size())
    throw Error("train.ema_decay: " + std::to_string(params.size()) +
                " trainable parameters, but averages of " + std::to_string(ema_.size()));
  for (size_t i = 0; i < ema_.size(); ++i) {
    Tensor& average = ema_[i].second;
    // (train.ema_device cpu: the weights go to the host in their own dtype.)
    const Tensor w = to_device(params[i].second.detach(), average.device());
    scale_(average, d);
    add_(average, scale(cast(w, DType::F32), 1.0 - d));
  }
  ema_pending_ = false;
  ema_folded_ = true;
}

void Trainer::with_ema_weights(const std::function<void()>& fn) {
  fold_ema();
  autograd::NoGradGuard no_grad;
  auto params = trainable_parameters();
  std::vector<Tensor> kept;
  kept.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor& w = params[i].second;
    kept.push_back(clone(w.detach()).detach());
    copy_(w, to_device(cast(ema_[i].second, w.dtype()), w.device()));
  }
  auto restore = [&] {
    for (size_t i = 0; i < params.size(); ++i) copy_(params[i].second, kept[i]);
  };
  try {
    fn();
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

void Trainer::ema_started(int64_t fresh, const std::map<std::string, std::string>& metadata) {
  ema_pending_ = false;
  // (Every rank alike, from the checkpoint's metadata: a rank training
  // nothing, a LoRA pipeline's head stage say, keeps no averages but still
  // joins the evaluations of them.)
  auto kept = metadata.find("ema");
  ema_folded_ = ema_on() && kept != metadata.end() && kept->second == "kept";
  if (fresh > 0 && is_logging_rank()) {
    spdlog::info(
        "resume: {} of {} trainable parameters have no average in the checkpoint "
        "(train.ema_decay was off, or they were frozen): theirs starts from the weights",
        fresh, ema_.size());
  }
}

std::vector<std::pair<std::string, Tensor>> Trainer::ema_parameters() {
  fold_ema();
  return ema_;
}

void Trainer::zero_grad() const {
  if (reducer_) {
    reducer_->zero_grad();  // gradients live in its flat buffer
    return;
  }
  if (pp_model_) pp_model_->zero_grad();
  if (tp_model_) tp_model_->zero_grad();
  if (model_) model_->zero_grad();
}

nn::StateDict Trainer::full_state_dict() const {
  if (reducer_) reducer_->wait_gathers();
  if (pp_model_) return pp_model_->full_state_dict();
  if (tp_model_) return tp_model_->full_state_dict();
  return model_->state_dict();
}

data::Batch Trainer::with_loss_mask(data::Batch batch) const {
  if (!config_.data_eod_mask_loss) return batch;
  return data::mask_loss_after_eod(batch, config_.model.eod_token);
}

void Trainer::weigh_by_tokens(std::vector<data::Batch>& batches) const {
  if (config_.train.loss_average != "tokens") return;
  // Each microbatch's unmasked targets (counted on the host, where the
  // batches are), and the step's over every data-parallel rank.
  std::vector<double> counts;
  double mine = 0;
  for (const data::Batch& b : batches) {
    const Tensor t = contiguous(cast(b.targets, DType::I64));
    const int64_t* p = t.data<int64_t>();
    int64_t n = 0;
    for (int64_t i = 0; i < t.numel(); ++i) n += p[i] != -100;
    counts.push_back(static_cast<double>(n));
    mine += static_cast<double>(n);
  }
  double all = mine;
  if (mesh_ && data_parallel_ranks() > 1) {
    Tensor total = from_vector(std::vector<double>{mine}, {1}, DType::F64);
    mesh_->dp()->all_reduce(total, dist::ReduceOp::Sum)->wait();
    all = item(total);
  }
  // Weighed by the data-parallel ranks: their reduction averages over them
  // (context-parallel ranks count their sequences' targets each, and
  // weigh as many times). A step without a single target to learn from is
  // not finite (and skipped).
  for (size_t i = 0; i < batches.size(); ++i) {
    batches[i].loss_weight = all > 0 ? counts[i] * static_cast<double>(data_parallel_ranks()) / all
                                     : std::numeric_limits<double>::quiet_NaN();
  }
}

int64_t Trainer::first_sequence(int64_t index) const {
  if (!ramp_.ramps()) return data_origin_ + (index - data_origin_step_) * ramp_.target();
  // Each step's batch depends on the sequences before it: walk from the
  // origin, or from the last answer (steps are asked for in order).
  if (index < walked_step_ || walked_step_ < data_origin_step_) {
    walked_step_ = data_origin_step_;
    walked_sequences_ = data_origin_;
  }
  for (; walked_step_ < index; ++walked_step_) walked_sequences_ += ramp_.at(walked_sequences_);
  return walked_sequences_;
}

double Trainer::schedule_position(int64_t batch) const {
  if (!ramp_.ramps()) return static_cast<double>(applied_steps_);
  // The step that ends after applied + batch sequences, in target batches.
  return static_cast<double>(applied_sequences_ + batch) / static_cast<double>(ramp_.target()) -
         1.0;
}

pipeline::Schedule Trainer::pipeline_schedule(int64_t micro) const {
  const auto& par = config_.parallel;
  const int m = static_cast<int>(micro);
  // Until measured, Costs' defaults: F, B and W of 1 each.
  const pipeline::Costs costs = zb_costs_ ? *zb_costs_ : pipeline::Costs{};
  if (par.schedule == "zb-v")
    return pipeline::make_zero_bubble_v_schedule(par.pp, m, costs, {par.zb_max_in_flight});
  if (par.schedule != "zb-auto")
    return pipeline::make_schedule(pipeline::schedule_from_name(par.schedule), par.pp, m, par.vpp);
  return pipeline::make_zero_bubble_schedule(par.pp, m, costs,
                                             {par.zb_max_in_flight, p2p_semantics()});
}

pipeline::P2PSemantics Trainer::p2p_semantics() const {
  // The executor waits for a receive where its payload is consumed; on a GPU
  // its calls run in order on the NCCL group's streams: one per neighbour
  // where the group has links (more than two stages), else its one.
  if (device_.is_cpu()) return pipeline::P2PSemantics::WaitAtConsumer;
  if (!mesh_ || !mesh_->pp()) return pipeline::P2PSemantics::StreamOrdered;
  const dist::ProcessGroupPtr& pp = mesh_->pp();
  return pp->has_p2p_link((pp->rank() + 1) % pp->size()) ? pipeline::P2PSemantics::StreamPerPeer
                                                         : pipeline::P2PSemantics::StreamOrdered;
}

std::unique_ptr<pipeline::PipelineExecutor> Trainer::make_executor(int64_t micro) {
  auto e = std::make_unique<pipeline::PipelineExecutor>(*pp_model_, pipeline_schedule(micro));
  e->set_scatter_gather(config_.parallel.pipeline_scatter_gather);
  e->set_read_loss(false);      // (train_step reads it with the gradient norm)
  e->set_timer(&step_timer());  // (its traced spans make the trace)
  if (device_.is_cuda()) {
    e->set_event_sink(
        [this](const std::string& name, const std::string& category,
               TraceRecorder::Clock::time_point t0,
               TraceRecorder::Clock::time_point t1) { trace_host(name, category, t0, t1); });
  }
  return e;
}

void Trainer::plan_zero_bubble(const pipeline::PipelineStepResult& measured,
                               const std::map<std::string, double>& read) {
  const int p = config_.parallel.pp, S = pp_model_->num_stages();
  // [kind * S + stage]: this rank's mean times in its stages' slots; the sum
  // over the world divided by the tp * dp ranks of each stage is the mean.
  std::vector<double> slots(3 * static_cast<size_t>(S), 0.0);
  auto mean = [&](pipeline::ComputeKind kind, int chunk, int count) {
    const auto it = read.find(pipeline::chunk_category(kind, chunk));
    return count > 0 && it != read.end() ? it->second / count : 0.0;
  };
  for (int c = 0; c < pp_model_->v(); ++c) {
    const auto& counts = measured.chunks.at(static_cast<size_t>(c));
    const auto stage = static_cast<size_t>(pp_model_->stage_of(c));
    slots[stage] = mean(pipeline::ComputeKind::Forward, c, counts.forwards);
    slots[S + stage] = mean(pipeline::ComputeKind::Backward, c, counts.backwards);
    slots[2 * S + stage] = mean(pipeline::ComputeKind::BackwardWeight, c, counts.weight_passes);
  }
  Tensor t = from_vector(slots, {3 * static_cast<int64_t>(S)}, DType::F64);
  world_->all_reduce(t, dist::ReduceOp::Sum)->wait();
  // Bit-identical inputs on every rank, so every rank searches the same order.
  world_->broadcast(t, 0)->wait();
  slots = to_double_vector(t);
  const double ranks_per_stage = static_cast<double>(world_->size() / p);
  pipeline::Costs costs;
  costs.forward.assign(slots.begin(), slots.begin() + S);
  costs.backward_input.assign(slots.begin() + S, slots.begin() + 2 * S);
  costs.backward_weight.assign(slots.begin() + 2 * S, slots.end());
  // A pass too short to time (or absent) still costs something: at least a
  // microsecond, so the search gets positive costs.
  for (auto* v : {&costs.forward, &costs.backward_input, &costs.backward_weight}) {
    for (double& x : *v) x = std::max(x / ranks_per_stage, 1e-6);
  }
  costs.backward.resize(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s)
    costs.backward[s] = costs.backward_input[s] + costs.backward_weight[s];
  zb_costs_ = costs;
  const int m = executor_->schedule().m;
  executor_ = make_executor(m);
  ramp_executors_.clear();  // rebuilt with the measured costs when next needed
  auto ms = [](const std::vector<double>& v) {
    std::string s;
    for (double x : v) {
      if (!s.empty()) s += ' ';
      s += fmt::format("{:.3g}", x * 1e3);
    }
    return s;
  };
  const auto& par = config_.parallel;
  const int limit = par.zb_max_in_flight == 0 ? p : par.zb_max_in_flight;
  const double chosen =
      pipeline::simulate(executor_->schedule(), costs, p2p_semantics()).bubble_fraction;
  auto bubble = [&](const pipeline::Schedule& s) {
    return 100 * pipeline::simulate(s, costs, p2p_semantics()).bubble_fraction;
  };
  // Beside the order chosen, what the fixed orders would have given.
  const std::string others =
      par.schedule == "zb-v"
          ? fmt::format("the order for equal costs {:.1f}%",
                        bubble(pipeline::make_schedule(pipeline::ScheduleKind::ZbV, p, m, 2)))
          : fmt::format("zb-h1 {:.1f}%, 1f1b {:.1f}%",
                        bubble(pipeline::make_schedule(pipeline::ScheduleKind::ZbH1, p, m)),
                        bubble(pipeline::make_schedule(pipeline::ScheduleKind::OneFOneB, p, m)));
  spdlog::info(
      "{}: measured ms per stage F [{}] B [{}] W [{}]; order for {} microbatches within {} "
      "in flight: simulated bubble {:.1f}% ({})",
      par.schedule, ms(costs.forward), ms(costs.backward_input), ms(costs.backward_weight), m,
      limit, 100 * chosen, others);
}

pipeline::PipelineExecutor& Trainer::executor_for(int64_t micro) {
  if (micro == config_.train.global_batch_size / (config_.train.micro_batch_size * dp_))
    return *executor_;
  auto& e = ramp_executors_[micro];
  if (!e) e = make_executor(micro);
  return *e;
}

std::pair<double, double> Trainer::grad_norm_and_loss(const StepLoss& step_loss,
                                                      std::vector<double>* group_squares,
                                                      const std::vector<Tensor>& words,
                                                      std::vector<int64_t>* word_values) const {
  autograd::NoGradGuard ng;
  // The norm's square (ZeRO-1: of this rank's pieces) and the loss in one
  // read: the step's one wait for the device.
  Tensor squares;
  if (zero_optimizer_) {
    squares = local_norm_squares_zero1(reducer_->flat_grads(), nullptr);
  } else if (pp_model_) {
    squares = pp_model_->grad_norm_squared();
  } else if (tp_model_) {
    squares = tp_model_->grad_norm_squared();
  } else {
    std::vector<Tensor> grads;
    for (const Tensor& p : model_->parameters()) grads.push_back(p.grad());
    squares = optim::sum_of_squares_device(grads);
  }
  // The side losses' sums (model.mtp_layers, model.z_loss_coef) come back
  // in the same copy: read later, after the optimizer is queued, they would
  // wait for it.
  std::vector<Tensor> read{step_loss.sum};
  if (squares.defined()) read.push_back(squares);
  std::vector<nn::LossSums*> sides;
  for (const auto& stats : {mtp_stats_, z_loss_stats_}) {
    if (!stats || stats->sums.empty()) continue;
    bool all = true;
    for (const Tensor& t : stats->sums) all = all && t.defined();
    if (!all) continue;  // (read on their own, as host_sums reads them)
    sides.push_back(stats.get());
    read.insert(read.end(), stats->sums.begin(), stats->sums.end());
  }
  // log.grad_norms: each group's square too, one value a group.
  int64_t G = 0;
  if (group_squares && grad_norm_groups_.groups) {
    const Tensor t = group_norm_squares(*grad_norm_groups_.groups, /*of_grads=*/true);
    G = t.numel();
    for (int64_t i = 0; i < G; ++i) read.push_back(narrow(t, 0, i, 1));
  }
  // A padded mixture's routing statistics left on the device (a captured
  // step's, or an uncaptured one's under a cuda::DeviceChecks) in the same
  // copy, then the step's checks of its device indices, last: one word a
  // check.
  const Tensor moe = moe_stats_ ? moe_stats_->pending_values() : Tensor{};
  // (Every value as f64, one after another: the mixture's are not one each.)
  std::vector<Tensor> flat;
  for (const Tensor& t : read) flat.push_back(reshape(cast(t.detach(), DType::F64), {1}));
  if (moe.defined()) flat.push_back(moe);
  for (const Tensor& t : words) flat.push_back(reshape(cast(t, DType::F64), {1}));
  const std::vector<double> values = to_double_vector(concat(flat, 0));
  const auto words_at = values.end() - static_cast<std::ptrdiff_t>(words.size());
  if (word_values) {
    word_values->clear();
    for (auto w = words_at; w != values.end(); ++w)
      word_values->push_back(static_cast<int64_t>(*w));
  }
  if (moe.defined()) moe_stats_->settle(std::vector<double>(words_at - moe.numel(), words_at));
  const double loss = values.at(0) / step_loss.count;
  std::vector<double> square{squares.defined() ? values.at(1) : 0.0};
  auto at = values.begin() + (squares.defined() ? 2 : 1);
  for (nn::LossSums* side : sides) {
    const auto n = static_cast<std::ptrdiff_t>(side->sums.size());
    side->read.assign(at, at + n);
    at += n;
  }
  square.insert(square.end(), at, at + G);
  // ZeRO-1's pieces summed over the world on the host (the groups' with
  // the global one).
  if (zero_optimizer_) square = world_sums(std::move(square));
  if (group_squares) group_squares->assign(square.begin() + 1, square.end());
  return {std::sqrt(square.at(0)), loss};
}

Trainer::StepLoss Trainer::forward_backward(int64_t index) {
  const auto& t = config_.train;
  const int64_t per_rank = batch_size(index) / dp_;
  const int64_t micro = per_rank / t.micro_batch_size;  // microbatches of this rank
  const int64_t first = dp_rank_ * per_rank;            // rank d's share of the step
  // Dropout streams: one per global microbatch of the run.
  const uint64_t call =
      static_cast<uint64_t>(first_sequence(index) / t.micro_batch_size + dp_rank_ * micro);
  std::vector<data::Batch> batches;
  for (int64_t i = 0; i < micro; ++i) {
    const int64_t g = first_sequence(index) + first + i * t.micro_batch_size;
    batches.push_back(with_loss_mask(
        data::fill_in_the_middle(dataset_->sequences(g, t.micro_batch_size), g, fim_)));
  }
  weigh_by_tokens(batches);
  if (config_.model.moe.experts > 0) moe_stats_ = std::make_shared<nn::MoeStats>();
  world_expert_loads_.reset();
  if (config_.model.mtp_layers > 0) mtp_stats_ = std::make_shared<nn::LossSums>();
  if (config_.model.z_loss_coef > 0) z_loss_stats_ = std::make_shared<nn::LossSums>();
  if (pp_model_) {
    // zb-auto and zb-v measure their second step (the first pays one-time
    // costs).
    const bool measure =
        (config_.parallel.schedule == "zb-auto" || config_.parallel.schedule == "zb-v") &&
        pipeline_steps_ == 1;
    ++pipeline_steps_;
    if (config_.train.cuda_graph) {
      // (As below, one step uncaptured first; and the measured step too,
      // whose order the capture then runs.)
      if (!measure && (captured_ || uncaptured_steps_ >= 1))
        return captured_forward_backward(batches, call);
      ++uncaptured_steps_;
    }
    pipeline::PipelineExecutor& executor = executor_for(micro);
    executor.set_chunk_timing(measure);
    nn::ForwardContext ctx{true, t.seed, call};
    ctx.moe_stats = moe_stats_;
    ctx.mtp_stats = mtp_stats_;
    ctx.z_loss_stats = z_loss_stats_;
    DeviceTimer& timer = step_timer();
    const DeviceTimer::Mark start = timer.mark();
    pipeline::PipelineStepResult r = executor.run(batches, ctx, scaler_ ? scaler_->scale() : 1.0);
    timer.add("pipeline", start, timer.mark());
    executor.set_chunk_timing(false);
    if (measure) zb_measured_ = r;                    // priced once the step timer is read
    return {r.loss_sum, static_cast<double>(micro)};  // (summed over the pipeline, not read)
  }
  if (config_.train.cuda_graph) {
    // (One step uncaptured first: what libraries set up on first use, and
    // the attention's choice, happen outside the graph.)
    if (captured_ || uncaptured_steps_ >= 1) return captured_forward_backward(batches, call);
    ++uncaptured_steps_;
  }
  // Summed on the loss's device and read once after the last micro-batch:
  // reading each one would make the host wait for the GPU every time.
  Tensor loss_sum;
  for (int64_t i = 0; i < micro; ++i) {
    const data::Batch& b = batches[static_cast<size_t>(i)];
    // Each micro-batch's mean loss weighs 1/micro (the step loss is the
    // mean over the microbatches, and averaged over dp), or its share of the
    // step's unmasked targets (train.loss_average: tokens); fp16's backward
    // starts from the scaled loss so small gradients survive.
    const double w = b.loss_weight;
    const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
    nn::ForwardContext ctx{true, t.seed, call + static_cast<uint64_t>(i)};
    ctx.loss_grad = w >= 0 ? loss_scale * w : loss_scale / static_cast<double>(micro);
    ctx.moe_stats = moe_stats_;
    ctx.mtp_stats = mtp_stats_;
    ctx.z_loss_stats = z_loss_stats_;
    const auto t0 = TraceRecorder::Clock::now();
    DeviceTimer& timer = step_timer();
    const DeviceTimer::Mark f0 = timer.mark();
    std::optional<nvtx::Range> pass;
    pass.emplace([&] { return "F" + std::to_string(i); });
    // The batch stays on the host: the embedding and the loss check it there
    // and upload what the device needs, never waiting for queued work.
    Tensor loss = tp_model_ ? tp_model_->loss(b.inputs, b.targets, ctx)
                            : model_->loss(b.inputs, b.targets, ctx);
    if (index >= nan_step_ && index < nan_step_ + nan_steps_)
      loss = scale(loss, std::numeric_limits<double>::quiet_NaN());
    // A non-finite loss is not an error here: its gradients make the step's
    // norm non-finite on every rank, and step() skips the update.
    Tensor part = cast(loss.detach(), DType::F64);
    if (w >= 0) part = scale(part, w * static_cast<double>(micro));
    loss_sum = loss_sum.defined() ? add(loss_sum, part) : part;
    const auto t1 = TraceRecorder::Clock::now();
    const DeviceTimer::Mark b0 = timer.mark();
    timer.add("forward", f0, b0);
    pass.reset();
    pass.emplace([&] { return "B" + std::to_string(i); });
    autograd::backward({scale(loss, ctx.loss_grad)});
    const DeviceTimer::Mark b1 = timer.mark();
    timer.add("backward", b0, b1);
    pass.reset();
    const std::string id = std::to_string(i);
    timer.trace(std::string("F").append(id), "forward", f0, b0);
    timer.trace(std::string("B").append(id), "backward", b0, b1);
    trace_host(std::string("F").append(id), "forward", t0, t1);
    trace_host(std::string("B").append(id), "backward", t1, TraceRecorder::Clock::now());
  }
  if (tp_model_) tp_model_->reduce_partial_grads();
  return {loss_sum, static_cast<double>(micro)};
}

namespace {
// The mean of each of the n losses `stats` records over the records of
// every rank (the last stage's micro-batches on every data-parallel rank,
// each tensor-parallel rank's the same): empty when none recorded any.
// Every rank calls it (one all-reduce over the world).
std::vector<double> world_means(const nn::LossSums& stats, int64_t n,
                                const dist::ProcessGroupPtr& world) {
  std::vector<double> sums = stats.host_sums(n);
  sums.push_back(static_cast<double>(stats.records));
  Tensor all = from_vector(sums, {n + 1}, DType::F64);
  if (world && world->size() > 1) world->all_reduce(all, dist::ReduceOp::Sum)->wait();
  sums = to_double_vector(all);
  const double records = sums[static_cast<size_t>(n)];
  if (records <= 0) return {};
  sums.pop_back();
  for (double& s : sums) s /= records;
  return sums;
}
}  // namespace

void Trainer::side_loss_metrics_into(StepMetrics& m) const {
  if (mtp_stats_) m.mtp_losses = world_means(*mtp_stats_, config_.model.mtp_layers, world_);
  if (z_loss_stats_) {
    const std::vector<double> z = world_means(*z_loss_stats_, 1, world_);
    if (!z.empty()) m.z_loss = z[0];
  }
}

void Trainer::moe_metrics_into(StepMetrics& m) const {
  if (!moe_stats_) return;
  moe_stats_->settle();  // (a captured step's, read now)
  // Each rank saw its stages' layers and its micro-batches (a tensor-parallel
  // group's ranks the same routing): the mean over every record of every
  // rank, and the largest load anywhere.
  Tensor sums = from_vector(
      std::vector<double>{moe_stats_->balance_sum, moe_stats_->dropped_sum, moe_stats_->z_loss_sum,
                          static_cast<double>(moe_stats_->records)},
      {4}, DType::F64);
  Tensor load = from_vector(std::vector<double>{moe_stats_->max_load}, {1}, DType::F64);
  if (world_ && world_->size() > 1) {
    world_->all_reduce(sums, dist::ReduceOp::Sum)->wait();
    world_->all_reduce(load, dist::ReduceOp::Max)->wait();
  }
  const std::vector<double> s = to_double_vector(sums);
  if (s[3] <= 0) return;
  if (config_.log_moe_per_layer) {
    // (Scale-free: a tensor-parallel group's ranks may each count a layer's
    // tokens, all layers' alike.)
    const std::vector<double>& loads = world_expert_loads();
    const int64_t E = config_.model.moe.experts, n = config_.model.n_layer;
    for (size_t at = 0; at < loads.size(); at += static_cast<size_t>(E)) {
      const auto first = loads.begin() + static_cast<std::ptrdiff_t>(at), last = first + E;
      const double total = std::accumulate(first, last, 0.0);
      if (total <= 0) continue;  // (a dense layer)
      const int64_t layer = static_cast<int64_t>(at) / E;
      m.moe_layers.push_back(
          {layer < n ? "h." + std::to_string(layer) : "mtp." + std::to_string(layer - n),
           static_cast<double>(E) * *std::max_element(first, last) / total,
           static_cast<double>(E) * *std::min_element(first, last) / total});
    }
  }
  m.moe_balance = s[0] / s[3];
  m.moe_max_load = item(load);
  if (config_.model.moe.capacity_factor > 0) m.moe_dropped = s[1] / s[3];
  if (config_.model.moe.z_loss_coef > 0) m.moe_z_loss = s[2] / s[3];
}

const std::vector<double>& Trainer::world_expert_loads() const {
  if (world_expert_loads_) return *world_expert_loads_;
  // Every layer's loads in one vector, zero where this rank holds none of
  // it (a pipeline's other stages): summed over the world, each layer's are
  // those of every micro-batch of every data-parallel replica.
  // (Multi-token prediction's blocks count on as layers n_layer, n_layer + 1, ...)
  const int64_t E = config_.model.moe.experts, L = config_.model.n_layer + config_.model.mtp_layers;
  moe_stats_->settle();
  std::vector<double> loads(static_cast<size_t>(L * E), 0.0);
  for (const auto& [layer, load] : moe_stats_->loads)
    std::copy(load.begin(), load.end(), loads.begin() + layer * E);
  Tensor all = from_vector(loads, {L * E}, DType::F64);
  if (world_ && world_->size() > 1) world_->all_reduce(all, dist::ReduceOp::Sum)->wait();
  return world_expert_loads_.emplace(to_double_vector(all));
}

void Trainer::update_expert_biases() {
  const auto& moe = config_.model.moe;
  if (!moe.expert_bias || moe.bias_update_rate == 0 || !moe_stats_) return;
  // (A tensor-parallel group's ranks route the same tokens alike: they
  // count each layer's loads t times over, which moves no bias, as only
  // their order about the mean does.)
  const int64_t E = moe.experts;
  const std::vector<double>& loads = world_expert_loads();
  if (!expert_biases_) {
    // This rank's biases by layer, found once (the handles follow the
    // tensors wherever they move). Not through parameters(): the biases
    // are no ZeRO-1 gather's business, which may still be running.
    expert_biases_.emplace();
    const auto named = pp_model_   ? pp_model_->named_parameters()
                       : tp_model_ ? tp_model_->named_parameters()
                                   : model_->named_parameters();
    for (const auto& [name, p] : named) {
      const int64_t layer = nn::expert_bias_layer(config_.model, name);
      if (layer >= 0) expert_biases_->emplace_back(layer, p);
    }
  }
  for (auto& [layer, bias] : *expert_biases_) {
    const auto first = loads.begin() + layer * E;
    nn::update_expert_bias(bias, std::vector<double>(first, first + E), moe.bias_update_rate);
  }
}

bool Trainer::validation_stalled(double loss, int64_t step) {
  // Keras's rule: only a fall of more than the delta counts, and moves the
  // best. (Every rank has the same loss: the decision needs no reduction.)
  if (!val_best_ || loss < *val_best_ - config_.eval.early_stop_delta) {
    val_best_ = loss;
    val_best_step_ = step;
    val_stale_ = 0;
  } else {
    ++val_stale_;
  }
  return config_.eval.early_stop_patience > 0 && val_stale_ >= config_.eval.early_stop_patience;
}

std::string Trainer::spike_on_any_rank(double loss, double norm) {
  if (!spikes_.enabled()) return "";
  std::string why = spikes_.spike(loss, norm);
  if (world_ && world_->size() > 1) {
    // The loss and the norm are reduced over the ranks, so they judge
    // alike; the verdict is agreed all the same, as every rank must skip
    // together.
    Tensor any = from_vector(std::vector<double>{why.empty() ? 0.0 : 1.0}, {1}, DType::F64);
    world_->all_reduce(any, dist::ReduceOp::Max)->wait();
    if (why.empty() && item(any) > 0) why = "judged so on another rank";
  }
  return why;
}

StepMetrics Trainer::step(int64_t index) {
  enter_profile_window(index);
  const nvtx::Range range([&] { return "step " + std::to_string(index + 1); });
  return config_.train.skips_step(index + 1) ? pass_over(index) : train_step(index);
}

StepMetrics Trainer::pass_over(int64_t index) {
  // As a skipped spike, but nothing is read or computed: the optimizer and
  // the learning-rate schedule stay, the next step reads the next batch.
  StepMetrics m;
  const int64_t G = batch_size(index);
  m.step = index + 1;
  m.consumed_sequences = first_sequence(index) + G;
  m.global_batch_size = G;
  m.lr = schedule_.at(schedule_position(G));
  m.skipped = m.passed_over = true;
  return m;
}

void Trainer::flip_parameter_bit_at(int64_t index, const std::string& name) {
  const auto named = parameters();
  if (std::none_of(named.begin(), named.end(), [&](const auto& np) { return np.first == name; }))
    throw ValueError("flip_parameter_bit_at: this rank holds no parameter '" + name + "'");
  flip_step_ = index;
  flip_name_ = name;
}

void Trainer::check_replicas(int64_t index) {
  if (!mesh_) return;  // one process: no replicas
  autograd::NoGradGuard no_grad;
  // (After ZeRO-1's all-gathers: parameters() waits for any still running.)
  std::vector<std::pair<std::string, Tensor>> named = parameters();
  if (index == flip_step_) {
    const auto it = std::find_if(named.begin(), named.end(),
                                 [&](const auto& np) { return np.first == flip_name_; });
    Tensor host = contiguous(to_device(it->second, Device::cpu()));
    *static_cast<unsigned char*>(host.raw_data()) ^= 1u;
    copy_(it->second, to_device(host, it->second.device()));
  }
  // Dense parameters' replicas are the data-parallel ranks (context-parallel
  // ones among them); under expert parallelism an expert's are the
  // expert-data-parallel ranks; a tied embedding's copy on the last stage
  // is the first stage's.
  const bool experts_apart = config_.parallel.ep > 1;
  ReplicaSet dense{"data-parallel", mesh_->dp(), {}};
  ReplicaSet experts{"expert-data-parallel", mesh_->expert_dp(), {}};
  ReplicaSet tied{"first and last pipeline stages'", mesh_->embedding(), {}};
  for (const auto& np : named) {
    (experts_apart && tp::TensorParallelGpt::is_expert(np.first) ? experts : dense)
        .tensors.push_back(np);
    if (pp_model_ && pp_model_->ties_embedding_across_ranks() && np.first == "wte.weight")
      tied.tensors.push_back(np);
  }
  const std::vector<std::string> differ = differing_replicas({dense, experts, tied});
  // Every rank learns whether any replicas differ anywhere, and all stop.
  Tensor any = from_vector(std::vector<double>{differ.empty() ? 0.0 : 1.0}, {1}, DType::F64);
  if (world_ && world_->size() > 1) world_->all_reduce(any, dist::ReduceOp::Max)->wait();
  if (item(any) == 0) return;
  std::string what;
  const size_t shown = std::min<size_t>(differ.size(), 5);
  for (size_t i = 0; i < shown; ++i) what += "\n  " + differ[i];
  if (differ.size() > shown) what += "\n  and " + std::to_string(differ.size() - shown) + " more";
  if (differ.empty()) what = " on other ranks (their errors name them)";
  throw Error("step " + std::to_string(index + 1) +
              ": replicas of the weights differ (parallel.check_replicas_interval)" + what +
              "\nA replica that changed alone is silent data corruption (a device or its memory) "
              "or a bug; the run stops before it spreads. Resume from a checkpoint written before "
              "this step.");
}

void Trainer::set_weight_decay(double weight_decay) {
  if (zero_optimizer_) zero_optimizer_->set_weight_decay(weight_decay);
  if (optimizer_) optimizer_->set_weight_decay(weight_decay);
  if (muon_) muon_->set_weight_decay(weight_decay);
}

StepMetrics Trainer::train_step(int64_t index) {
  const auto start = std::chrono::steady_clock::now();
  const auto& t = config_.train;
  Allocator& memory = backend_for(device_.type).allocator(device_.index);
  memory.reset_peak();
  // (The timer traces the step's spans; the trace takes them as they are read.)
  step_timer().set_tracing(index >= trace_from_ && index < trace_to_);
  if (reducer_) reducer_->set_microbatches(batch_size(index) / dp_ / t.micro_batch_size);
  // An uncaptured step on a GPU leaves the checks of the indices it forms
  // on the device (a padded mixture's routing) to the kernels that read
  // them, as a captured one does: read with the gradient norm, nothing
  // waits for them.
  std::optional<cuda::DeviceChecks> device_checks;
  if (device_.is_cuda()) device_checks.emplace(device_.index);
  const StepLoss step_loss = forward_backward(index);
  if (device_checks) device_checks->close();
  DeviceTimer& timer = step_timer();
  // (A captured step whose graph reduced the gradients itself has nothing
  // left to finish: train.cuda_graph under NCCL.)
  if (reducer_ && !(captured_ && captured_->reduces)) {
    const auto reduce_start = TraceRecorder::Clock::now();
    const nvtx::Range range("dp reduce");
    const DeviceTimer::Mark m0 = timer.mark();
    reducer_->finish();  // buckets started during backward; wait for all
    const DeviceTimer::Mark m1 = timer.mark();
    timer.add("dp", m0, m1);
    timer.trace("dp reduce", "dp", m0, m1);
    trace_host("dp reduce", "dp", reduce_start, TraceRecorder::Clock::now());
  }
  if (scaler_) unscale_gradients();
  double norm = 0, loss = 0;
  std::vector<double> group_squares;  // (log.grad_norms; read with the norm)
  // The checks of the step's indices on the device (a replay's ids and
  // targets, an uncaptured padded mixture's routing), read with the norm.
  const std::vector<Tensor> words = captured_       ? captured_->graph.check_words()
                                    : device_checks ? device_checks->words()
                                                    : std::vector<Tensor>{};
  std::vector<int64_t> word_values;
  std::tie(norm, loss) = grad_norm_and_loss(step_loss, &group_squares, words, &word_values);
  // Indices out of range, before anything is updated.
  if (captured_) {
    captured_->graph.check(word_values);
  } else if (device_checks) {
    device_checks->check(word_values);
  }
  double clip_coef = 1.0;
  std::vector<std::pair<std::string, double>> grad_norms =
      norms_by_group(grad_norm_groups_, /*of_grads=*/true, &group_squares);
  // The loss averaged over the data-parallel replicas, on the host (one
  // value).
  if (reducer_) {
    Tensor l = from_vector(std::vector<double>{loss}, {1}, DType::F64);
    mesh_->dp()->all_reduce(l, dist::ReduceOp::Avg)->wait();
    loss = item(l);
  }
  // The norm has made the host wait for everything queued so far, so the
  // step's timings read without a wait (the last step's optimizer among
  // them; this step's is read with the next).
  const std::map<std::string, double> timed = read_step_timer();
  const double bubble = pipeline_bubble(timed);
  if (zb_measured_) {
    plan_zero_bubble(*zb_measured_, timed);
    zb_measured_.reset();
  }
  // Clipping's coefficient goes into the optimizer step: no pass over
  // every gradient (on a GPU, one launch per parameter fewer).
  if (std::isfinite(norm)) clip_coef = optim::clip_coefficient(norm, t.grad_clip);
  // A non-finite gradient anywhere makes the norm non-finite on every rank
  // (it is reduced over all of them): all skip the update together and the
  // learning-rate schedule does not advance.
  StepMetrics m;
  const int64_t G = batch_size(index);
  const double lr = schedule_.at(schedule_position(G));
  if (weight_decay_schedule_) m.weight_decay = weight_decay_schedule_->at(schedule_position(G));
  if (scaler_) m.loss_scale = scaler_->scale();
  if (scaler_ && std::isfinite(loss) && !std::isfinite(norm)) {
    // fp16 overflow: part of dynamic loss scaling, not a failure. The scale
    // backs off and the step is skipped on every rank (the norm is global).
    const bool absorbed = scaler_->hysteresis_left() > 0;
    scaler_->update(true);
    m.skipped = true;
    if (scaler_->scale() != m.loss_scale) {
      spdlog::info("step {}: fp16 gradients overflowed; loss scale {} -> {}, update skipped",
                   index + 1, m.loss_scale, scaler_->scale());
    } else if (absorbed) {
      const int64_t left = scaler_->hysteresis_left();
      spdlog::info(
          "step {}: fp16 gradients overflowed; loss scale {} kept (train.loss_scale_hysteresis: "
          "{}), update skipped",
          index + 1, m.loss_scale,
          left == 0 ? std::string("the next overflow backs it off")
                    : "it stays through " + std::to_string(left) + " more overflow" +
                          (left == 1 ? "" : "s"));
    } else {
      // At the floor nothing changes for the next try: such overflows are
      // failures, counted as non-finite steps are.
      ++consecutive_skips_;
      spdlog::warn(
          "step {}: fp16 gradients overflowed at the smallest loss scale (train.loss_scale_min "
          "{}); skipping the update ({} in a row)",
          index + 1, m.loss_scale, consecutive_skips_);
      if (consecutive_skips_ > t.max_skipped_steps) {
        throw Error("stopping: " + std::to_string(consecutive_skips_) +
                    " consecutive steps whose fp16 gradients overflow even at "
                    "train.loss_scale_min (train.max_skipped_steps is " +
                    std::to_string(t.max_skipped_steps) + ")");
      }
    }
  } else if (!std::isfinite(norm) || !std::isfinite(loss)) {
    m.skipped = true;
    ++consecutive_skips_;
    std::string where;  // (log.grad_norms names the groups)
    for (const auto& [name, g] : grad_norms)
      if (!std::isfinite(g)) where += (where.empty() ? "; non-finite in " : ", ") + name;
    spdlog::warn("step {}: non-finite {} ({}); skipping the update ({} in a row){}", index + 1,
                 std::isfinite(loss) ? "gradient norm" : "loss", std::isfinite(loss) ? norm : loss,
                 consecutive_skips_, where);
    if (consecutive_skips_ > t.max_skipped_steps) {
      throw Error("stopping: " + std::to_string(consecutive_skips_) +
                  " consecutive steps with non-finite gradients (train.max_skipped_steps is " +
                  std::to_string(t.max_skipped_steps) + ")");
    }
  } else if (const std::string why = spike_on_any_rank(loss, norm); !why.empty()) {
    // A finite step far above the last ones: skipped on every rank, as a
    // non-finite one is (the schedule does not advance; the data does).
    m.skipped = m.spike = true;
    consecutive_skips_ = 0;
    if (scaler_) scaler_->update(false);
    spdlog::warn("step {}: a spike, {}; skipping the update", index + 1, why);
  } else {
    consecutive_skips_ = 0;
    if (scaler_) scaler_->update(false);
    const auto opt_start = TraceRecorder::Clock::now();
    const nvtx::Range range("optimizer");
    const DeviceTimer::Mark m0 = timer.mark();
    fold_ema();  // the last applied step's weights, before they change
    if (m.weight_decay >= 0) set_weight_decay(m.weight_decay);
    if (zero_optimizer_) {
      zero_optimizer_->step(lr, clip_coef, muon_lr(lr));
    } else {
      optimizer_->step(lr, clip_coef);
      if (muon_) muon_->step(muon_lr(lr), clip_coef);
    }
    ema_pending_ = ema_on();
    update_expert_biases();
    ++applied_steps_;
    applied_sequences_ += G;
    const DeviceTimer::Mark m1 = timer.mark();
    timer.add("optimizer", m0, m1);
    timer.trace("optimizer", "optimizer", m0, m1);
    trace_host("optimizer", "optimizer", opt_start, TraceRecorder::Clock::now());
  }
  spikes_.record(loss, norm);  // (finite steps only, spikes too)
  // (A captured step's gradients are its graph's: each replay writes them.
  // Data parallelism's live in the reducer's flat buffer, which the graph
  // adds into: zeroed for the next replay as for the next uncaptured step.)
  if (!captured_ || reducer_) zero_grad();
  if (const int64_t every = config_.parallel.check_replicas_interval;
      every > 0 && (index + 1) % every == 0)
    check_replicas(index);
  // (In the step's time: like the norm of the gradients, one pass over the
  // parameters and a reduction.)
  const double param_norm_value = config_.log_param_norm ? param_norm() : -1;
  std::vector<std::pair<std::string, double>> param_norms =
      norms_by_group(param_norm_groups_, /*of_grads=*/false);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  m.step = index + 1;
  m.consumed_sequences = first_sequence(index) + G;
  m.global_batch_size = G;
  m.loss = loss;
  m.lr = lr;
  m.grad_norm = norm;
  m.param_norm = param_norm_value;
  m.grad_norms = std::move(grad_norms);
  m.param_norms = std::move(param_norms);
  m.step_ms = ms;
  m.bubble_fraction = bubble;
  moe_metrics_into(m);
  side_loss_metrics_into(m);
  m.tokens_per_s = static_cast<double>(G * config_.model.seq_len) / (ms / 1000.0);
  // PTD-P model FLOPs (no recomputation) per device, and over the peak.
  const double flops = config_.model.training_flops(static_cast<double>(G));
  const int devices = world_ ? world_->size() : 1;
  m.tflops_per_device = flops / (ms / 1000.0) / devices / 1e12;
  if (config_.log_peak_tflops > 0) m.mfu = m.tflops_per_device / config_.log_peak_tflops;
  // Every rank's peak (and on GPUs what its cache holds), the largest
  // reported (a pipeline's ranks differ).
  const AllocatorStats stats = memory.stats();
  interval_peak_bytes_ = std::max(interval_peak_bytes_, stats.peak_allocated);
  Tensor peak = from_vector(std::vector<double>{static_cast<double>(stats.peak_allocated),
                                                static_cast<double>(stats.reserved)},
                            {2}, DType::F64);
  if (world_ && world_->size() > 1) world_->all_reduce(peak, dist::ReduceOp::Max)->wait();
  const std::vector<double> peaks = to_double_vector(peak);
  m.peak_memory_bytes = static_cast<int64_t>(peaks[0]);
  if (device_.is_cuda()) m.reserved_memory_bytes = static_cast<int64_t>(peaks[1]);
  return m;
}

namespace {

// A set's line: "choices acc_norm 0.3114 | acc 0.2859 | acc_per_token
// 0.2955 | answer loss 2.8123 | 10042 questions", "choices (hellaswag)
// acc_norm ..." for a named one.
std::string choices_summary(const std::string& name, const StepMetrics::ChoiceScores& c) {
  return fmt::format(
      "choices{} acc_norm {:.4f} | acc {:.4f} | acc_per_token {:.4f} | answer loss {:.4f}{} | {} "
      "questions",
      name.empty() ? "" : " (" + name + ")", c.acc_norm, c.acc, c.acc_per_token, c.answer_loss,
      c.mc2 ? fmt::format(" | mc2 {:.4f}", *c.mc2) : "", c.questions);
}

// A set's line: "lambada acc 0.3254 | perplexity 40.123 | 5153 texts",
// "lambada (de) acc ..." for a named one.
std::string lambada_summary(const std::string& name, const StepMetrics::LambadaScores& l) {
  return fmt::format("lambada{} acc {:.4f} | perplexity {:.5g} | {} texts",
                     name.empty() ? "" : " (" + name + ")", l.acc, l.perplexity, l.texts);
}

// train.ema_decay's scores, a line per set after `head`: "ema choices
// acc_norm ...", "ema lambada (de) acc ...", the first one with the time.
void log_ema_scores(const std::string& head, const StepMetrics& m, double ms) {
  std::vector<std::string> lines;
  auto first_or_named = [&](const auto& first, const auto& named, auto summary) {
    if (named.empty() && first) lines.push_back(summary("", *first));
    for (const auto& [name, scores] : named) lines.push_back(summary(name, scores));
  };
  first_or_named(m.choices_ema, m.choice_ema_sets, choices_summary);
  first_or_named(m.lambada_ema, m.lambada_ema_sets, lambada_summary);
  for (size_t i = 0; i < lines.size(); ++i) {
    spdlog::info("{} | ema {}{}", head, lines[i],
                 i == 0 ? fmt::format(" ({:.0f} ms for every set)", ms) : std::string());
  }
}

// "val loss 2.3456" for one unnamed set; "val loss 2.3456 (web) | 2.5 (code)"
// for named ones.
// train.ema_decay adds the averaged weights' losses: "... | ema 2.3012".
std::string val_summary(const StepMetrics& m, int precision) {
  const auto sets = [&](const std::string& head, const std::optional<double>& first,
                        const std::vector<std::pair<std::string, double>>& named) {
    if (named.empty()) return fmt::format("{} {:.{}f}", head, *first, precision);
    std::string s = head + " ";
    for (size_t i = 0; i < named.size(); ++i)
      s +=
          fmt::format("{}{:.{}f} ({})", i ? " | " : "", named[i].second, precision, named[i].first);
    return s;
  };
  std::string s = sets("val loss", m.val_loss, m.val_losses);
  if (m.val_ema_loss) s += " | " + sets("ema", m.val_ema_loss, m.val_ema_losses);
  return s;
}

}  // namespace

namespace {

// The samples' lines: "sample 1: <prompt><continuation>".
void log_samples(const std::string& at, const StepMetrics& m, double ms) {
  for (size_t i = 0; i < m.samples.size(); ++i) {
    spdlog::info("{} | sample {} ({:.0f} ms for {}): {}{}", at, i + 1, ms, m.samples.size(),
                 visible(m.samples[i].first), visible(m.samples[i].second));
  }
}

}  // namespace

StepMetrics Trainer::evaluate_only() {
  if (!config_.evaluates()) {
    throw ConfigError(
        "evaluation only: there is nothing to evaluate (set data.val, data.val_split, "
        "eval.choices, eval.lambada or eval.samples)");
  }
  if (!is_logging_rank()) spdlog::set_level(spdlog::level::warn);
  const auto& ck = config_.checkpoint;
  int64_t step = 0;
  if (ck.resumes()) step = load_checkpoint();
  const std::string weights = step > 0                     ? "step " + std::to_string(step)
                              : !config_.init_from.empty() ? config_.init_from
                                                           : "the random initialisation";
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  StepMetrics m;
  if (!val_.empty()) {
    const auto t0 = Clock::now();
    evaluate_into(m);
    spdlog::info("{} | {} | {} tokens in {:.0f} ms", weights, val_summary(m, 6), val_tokens(),
                 ms_since(t0));
  }
  for (size_t i = 0; i < choices_.size(); ++i) {
    const double ms = evaluate_choices_into(m, i);
    const auto& scores = choices_[i].name.empty() ? *m.choices : m.choice_sets.back().second;
    spdlog::info("{} | {} in {:.0f} ms", weights, choices_summary(choices_[i].name, scores), ms);
  }
  for (size_t i = 0; i < lambada_.size(); ++i) {
    const double ms = evaluate_lambada_into(m, i);
    const auto& scores = lambada_[i].name.empty() ? *m.lambada : m.lambada_sets.back().second;
    spdlog::info("{} | {} in {:.0f} ms", weights, lambada_summary(lambada_[i].name, scores), ms);
  }
  log_ema_scores(weights, m, evaluate_ema_scores_into(m));
  if (samples_) log_samples(weights, m, sample_into(m));
  return m;
}

std::vector<StepMetrics> Trainer::run() {
  const auto run_start = std::chrono::steady_clock::now();
  const auto elapsed_s = [&run_start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  };
  const bool lead = is_logging_rank();
  std::unique_ptr<MetricsWriter> metrics;
  std::unique_ptr<TensorBoardWriter> tensorboard;
  if (lead) {
    try {
      std::filesystem::create_directories(config_.output_dir);
    } catch (const std::filesystem::filesystem_error& e) {
      throw IoError("output.dir '" + config_.output_dir +
                    "' cannot be created: " + e.code().message());
    }
    const std::string resolved = config_.output_dir + "/config.yaml";
    std::ofstream cfg(resolved, std::ios::trunc);
    cfg << to_yaml(config_);
    cfg.flush();
    if (!cfg) throw IoError("output.dir: cannot write '" + resolved + "'");
  } else {
    spdlog::set_level(spdlog::level::warn);
  }
  log_setup();
  std::vector<StepMetrics> out;
  double total_ms = 0;
  const int64_t steps = config_.train.steps;
  const auto& ck = config_.checkpoint;
  int64_t first = 0;
  // Every rank writes its own file into checkpoint.dir: find out now, not
  // after the first `interval` steps, whether it can.
  if (!ck.dir.empty()) io::check_checkpoint_dir_writable(ck.dir, world_ ? world_->rank() : 0);
  if (ck.resumes()) first = load_checkpoint();
  trace_steps_from(first);
  align_trace_clock();
  if (device_.is_cuda()) {
    trace_.set_row_name(0, "device (cuda:" + std::to_string(device_.index) + ")");
    trace_.set_row_name(1, "host (queueing)");
  }
  // A window of steps (log.trace_steps, log.profile_steps) that misses the
  // steps this run trains records nothing: say so now, not at the end.
  for (const auto& [key, from, to] :
       {std::tuple{"log.trace_steps", config_.log_trace_first, config_.log_trace_last},
        std::tuple{"log.profile_steps", config_.log_profile_first, config_.log_profile_last}}) {
    if (from > 0 && (from > steps || to <= first)) {
      spdlog::warn("{} [{}, {}] misses the steps this run trains ({} to {}): it records nothing",
                   key, from, to, first + 1, steps);
    }
  }
  // A resumed run goes on with the history in metrics.jsonl (the steps up to
  // its checkpoint kept, any after it trained again); a new run starts one.
  if (lead) {
    metrics = std::make_unique<MetricsWriter>(config_.output_dir + "/metrics.jsonl",
                                              first > 0 ? first : -1);
    if (config_.log_tensorboard) {
      tensorboard = std::make_unique<TensorBoardWriter>(config_.output_dir);
      // TensorBoard drops an earlier file's points from this step on.
      if (first > 0) tensorboard->restart(first + 1);
      spdlog::info("tensorboard: {} (tensorboard --logdir {})", tensorboard->path(),
                   config_.output_dir);
    }
  }
  if (first >= steps && first > 0) {
    spdlog::warn(
        "the checkpoint is at step {} and train.steps is {}: no step is left to train (raise "
        "train.steps to continue); writing its weights",
        first, steps);
  }
  g_stop_requested = false;
  const double limit_minutes = config_.train.exit_after_minutes;
  auto previous_term = std::signal(SIGTERM, on_stop_signal);
  auto previous_int = std::signal(SIGINT, on_stop_signal);
  auto print_line = [&](const StepMetrics& m) {
    if (m.passed_over) {
      spdlog::info("step {:>5}/{} | passed over (train.skip_steps): global sequences {}-{} unread",
                   m.step, steps, m.consumed_sequences - m.global_batch_size,
                   m.consumed_sequences - 1);
      return;
    }
    const double eta =
        total_ms / 1000.0 / static_cast<double>(m.step) * static_cast<double>(steps - m.step);
    std::string extra = m.mfu > 0 ? fmt::format(" | MFU {:.1f}%", 100 * m.mfu) : std::string();
    if (m.param_norm >= 0) extra += fmt::format(" | param norm {:.3f}", m.param_norm);
    if (!m.grad_norms.empty()) {  // (log.grad_norms: where a spike starts shows here first)
      const auto top = std::max_element(
          m.grad_norms.begin(), m.grad_norms.end(), [](const auto& a, const auto& b) {
            // (a non-finite norm is the top one)
            return std::isfinite(a.second) && (!std::isfinite(b.second) || a.second < b.second);
          });
      extra += fmt::format(" | top grad {} {:.3f}", top->first, top->second);
    }
    if (m.bubble_fraction >= 0) extra += fmt::format(" | bubble {:.1f}%", 100 * m.bubble_fraction);
    if (m.moe_balance >= 0) {
      extra += fmt::format(" | moe balance {:.3f} max load {:.2f}", m.moe_balance, m.moe_max_load);
    }
    if (m.moe_dropped >= 0) extra += fmt::format(" dropped {:.1f}%", 100 * m.moe_dropped);
    if (m.moe_z_loss >= 0) extra += fmt::format(" z-loss {:.3f}", m.moe_z_loss);
    if (m.z_loss >= 0) extra += fmt::format(" | z-loss {:.4f}", m.z_loss);
    if (!m.mtp_losses.empty()) {
      extra += " | mtp";
      for (double l : m.mtp_losses) extra += fmt::format(" {:.4f}", l);
    }
    extra += fmt::format(" | mem {:.3g} GB", static_cast<double>(m.peak_memory_bytes) / 1e9);
    if (m.reserved_memory_bytes >= 0) {
      extra +=
          fmt::format(" ({:.3g} reserved)", static_cast<double>(m.reserved_memory_bytes) / 1e9);
    }
    if (m.skipped) extra += m.spike ? " | skipped (spike)" : " | skipped";
    spdlog::info(
        "step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | {:.3f} "
        "TFLOP/s/dev | "
        "{:.1f} ms{} | ETA {}",
        m.step, steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.tflops_per_device, m.step_ms,
        extra, format_duration(eta));
  };
  // Every evaluation of a step (its times, for the log).
  struct EvaluationTimes {
    double eval_ms = 0, samples_ms = 0, ema_ms = 0;
    std::vector<double> choices_ms, lambada_ms;
  };
  auto evaluate_step = [&](StepMetrics& m) {
    const nvtx::Range range("evaluation");
    EvaluationTimes e;
    const auto t0 = std::chrono::steady_clock::now();
    if (!val_.empty()) evaluate_into(m);
    e.eval_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    for (size_t i = 0; i < choices_.size(); ++i)
      e.choices_ms.push_back(evaluate_choices_into(m, i));
    for (size_t i = 0; i < lambada_.size(); ++i)
      e.lambada_ms.push_back(evaluate_lambada_into(m, i));
    e.ema_ms = evaluate_ema_scores_into(m);
    if (samples_) e.samples_ms = sample_into(m);
    return e;
  };
  auto log_evaluation = [&](const StepMetrics& m, const EvaluationTimes& e) {
    if (m.val_loss) {
      spdlog::info("step {:>5}/{} | {} | {} tokens in {:.0f} ms", m.step, steps, val_summary(m, 4),
                   val_tokens(), e.eval_ms);
    }
    for (size_t i = 0; i < e.choices_ms.size(); ++i) {
      const auto& scores = choices_[i].name.empty() ? *m.choices : m.choice_sets[i].second;
      spdlog::info("step {:>5}/{} | {} in {:.0f} ms", m.step, steps,
                   choices_summary(choices_[i].name, scores), e.choices_ms[i]);
    }
    for (size_t i = 0; i < e.lambada_ms.size(); ++i) {
      const auto& scores = lambada_[i].name.empty() ? *m.lambada : m.lambada_sets[i].second;
      spdlog::info("step {:>5}/{} | {} in {:.0f} ms", m.step, steps,
                   lambada_summary(lambada_[i].name, scores), e.lambada_ms[i]);
    }
    log_ema_scores(fmt::format("step {:>5}/{}", m.step, steps), m, e.ema_ms);
    log_samples(fmt::format("step {:>5}/{}", m.step, steps), m, e.samples_ms);
  };
  if (config_.eval.at_start && first == 0) {
    // eval.at_start: the weights the run starts from, as step 0.
    StepMetrics m;
    m.evaluation_only = true;
    m.lr = schedule_.at(0);
    const EvaluationTimes e = evaluate_step(m);
    m.elapsed_s = elapsed_s();
    if (metrics) metrics->write(m);
    if (tensorboard) tensorboard->write(m);
    log_evaluation(m, e);
    if (m.val_loss) validation_stalled(*m.val_loss, 0);
  }
  for (int64_t k = first; k < steps; ++k) {
    StepMetrics m = step(k);
    total_ms += m.step_ms;
    const int64_t every = config_.eval.interval;
    EvaluationTimes evaluated;
    if ((every > 0 && m.step % every == 0) || m.step == steps) {
      const auto t0 = TraceRecorder::Clock::now();
      evaluated = evaluate_step(m);
      trace_phase("evaluation", "evaluation", t0, TraceRecorder::Clock::now());
    }
    const bool summary = m.step % config_.log_interval == 0 || m.step == steps;
    std::vector<double> timing_rows;
    if (summary) {
      // (A collective; its lines follow the step's.)
      timing_rows =
          rank_timing_into(m, m.step % config_.log_interval == 0 ? config_.log_interval
                                                                 : m.step % config_.log_interval);
    }
    m.elapsed_s = elapsed_s();
    if (metrics) metrics->write(m);
    if (tensorboard) tensorboard->write(m);
    out.push_back(m);
    if (summary) {
      print_line(m);
      print_rank_timing(m, timing_rows);
    } else if (k == first) {
      print_line(m);  // (the first step this run trains, a resumed run's too)
    }
    log_evaluation(m, evaluated);
    const bool stalled = m.val_loss && validation_stalled(*m.val_loss, m.step);
    // Every rank agrees on stopping, so they all checkpoint the same step,
    // and (checkpoint.async) on whether every rank has written the one in
    // flight, so rank 0 commits it only then: one reduction for both.
    const bool written = pending_checkpoint_written();
    const bool failed = written && pending_checkpoint_ && pending_checkpoint_error();
    // (Flag 0: a signal; flag 3: train.exit_after_minutes reached, on any
    // rank's clock.)
    const bool time_up =
        limit_minutes > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count() >=
            limit_minutes * 60.0;
    Tensor flags =
        from_vector(std::vector<double>{g_stop_requested ? 1.0 : 0.0, written ? 0.0 : 1.0,
                                        failed ? 1.0 : 0.0, time_up ? 1.0 : 0.0},
                    {4}, DType::F64);
    if (world_ && world_->size() > 1) world_->all_reduce(flags, dist::ReduceOp::Max)->wait();
    const std::vector<double> agreed = to_double_vector(flags);
    const bool stopping = agreed[0] > 0 || agreed[3] > 0 || (stalled && m.step < steps);
    if (agreed[1] == 0) commit_pending_checkpoint(/*wait=*/false, agreed[2] > 0);
    const bool periodic = ck.interval > 0 && m.step % ck.interval == 0;
    if (!ck.dir.empty() && (periodic || stopping || m.step == steps)) {
      const auto t0 = TraceRecorder::Clock::now();
      save_checkpoint(m.step, m.val_loss);
      trace_phase("checkpoint", "checkpoint", t0, TraceRecorder::Clock::now());
    }
    if (stopping) {
      if (agreed[0] > 0) {
        spdlog::info("stopping after step {} on a signal", m.step);
      } else if (agreed[3] == 0) {
        spdlog::info(
            "stopping after step {}: the validation loss has not fallen below {:.4f} (step {}) "
            "by more than eval.early_stop_delta ({:g}) in {} evaluation(s) "
            "(eval.early_stop_patience)",
            m.step, *val_best_, val_best_step_, config_.eval.early_stop_delta, val_stale_);
      } else {
        spdlog::info(
            "stopping after step {}: train.exit_after_minutes ({}) reached; resume with "
            "checkpoint.resume: auto",
            m.step, limit_minutes);
      }
      break;
    }
  }
  commit_pending_checkpoint(/*wait=*/true);  // the last one, before the run returns
  leave_profile_window();
  std::signal(SIGTERM, previous_term);
  std::signal(SIGINT, previous_int);
  if (device_.is_cuda() && cuda::gemm_settings().verify) {
    // Each rank reports its own products (a failure was logged when it happened).
    const cuda::GemmVerification v = cuda::gemm_verification();
    const std::string summary = fmt::format(
        "gemm verification: {} products checked, {} failed, {} not checkable; nearest its "
        "tolerance: {:.3g} of {:.3g} ({})",
        v.checked, v.failed, v.unchecked, v.worst.relative_error, v.worst.tolerance,
        v.worst.problem);
    if (v.failed > 0) {
      spdlog::error("{}", summary);
    } else {
      spdlog::info("{}", summary);
    }
  }
  read_step_timer(/*wait_for_trace=*/true);  // (the last traced step's optimizer)
  try {
    trace_.write_merged_trace(world_, config_.output_dir + "/trace.json");  // collective
  } catch (const IoError& e) {
    // (Rank 0's alone, once every rank's events are taken: the weights come
    // next and matter more.)
    spdlog::error("{}; going on to write the weights", e.what());
  }
  const std::string weights = config_.output_dir + "/model.safetensors";
  const WrittenWeights written = write_weights(weights, /*adapters=*/true);
  std::string also;
  if (ema_on()) {
    // The average the run kept (train.ema_decay), in the weights' place.
    const std::string averaged = config_.output_dir + "/model_ema.safetensors";
    with_ema_weights([&] { write_weights(averaged, /*adapters=*/false); });
    also = ", " + averaged;
  }
  if (lead && !written.adapter_dir.empty()) {
    spdlog::info(
        "wrote {} (LoRA merged in){}, the adapters in PEFT's format in {}, and "
        "{}/metrics.jsonl",
        weights, also, written.adapter_dir, config_.output_dir);
  } else if (lead && written.merged) {
    spdlog::info("wrote {} (LoRA merged in){} and {}/metrics.jsonl", weights, also,
                 config_.output_dir);
  } else if (lead) {
    spdlog::info("wrote {}{} and {}/metrics.jsonl", weights, also, config_.output_dir);
  }
  if (lead) log_plan_against(out);
  return out;
}

}  // namespace triad::train
