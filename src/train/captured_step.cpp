// train.cuda_graph: the step's forward and backward passes, every
// micro-batch's, captured once as a CUDA graph and replayed on later steps'
// batches (docs/cuda.md, "A captured forward and backward pass").
//
// The graph runs on the addresses its capture saw: each micro-batch's ids
// and targets live in device tensors refilled from the step's batches
// before a replay, the loss sum is written where the capture put it, and
// the gradients the captured backward made stay the parameters' between
// steps (the trainer does not drop them; each replay writes them again).
// What the capture could not check on the host (an id or target out of
// range) Graph::check reports after the gradient norm's wait, before the
// optimizer steps.
#include "train/captured_step.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <string>

#include "triad/autograd/engine.h"
#include "triad/core/error.h"
#include "triad/dist/mesh.h"
#include "triad/nn/documents.h"
#include "triad/ops.h"
#include "triad/parallel/pipeline/executor.h"

namespace triad::train {

Trainer::StepLoss Trainer::captured_forward_backward(const std::vector<data::Batch>& batches,
                                                     uint64_t call) {
  if (!(model_ || tp_model_ || pp_model_) || !device_.is_cuda()) {
    throw Error(
        "train.cuda_graph: a captured step needs one process, or data-, tensor-, context- or "
        "pipeline-parallel ranks, on CUDA devices");
  }
  // Tensor, context and pipeline parallelism exchange inside the passes
  // (a pipeline's stages between them too, on the schedule's order, and
  // its first and last stage sum the tied embedding's gradients): over
  // NCCL, whose calls join the capture.
  std::vector<dist::ProcessGroupPtr> inside;
  if ((tp_model_ || pp_model_) && mesh_)
    inside = {mesh_->tp(), mesh_->cp(), mesh_->cp_a2a(), mesh_->cp_ring()};
  if (pp_model_) {
    inside.push_back(pp_model_->groups().pp);
    if (pp_model_->ties_embedding_across_ranks()) inside.push_back(pp_model_->groups().embedding);
  }
  for (const dist::ProcessGroupPtr& g : inside) {
    if (!g || g->size() == 1 || g->captures_device_collectives()) continue;
    throw Error("train.cuda_graph: the collectives inside the passes (group '" + g->name() +
                "') cannot join a CUDA graph's capture: they need NCCL (device tensors staged "
                "through the host are not captured)");
  }
  const double micro = static_cast<double>(batches.size());
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  // A pipeline's schedule for this many micro-batches (zb-auto's and
  // zb-v's, ordered by the costs their measured step gave).
  pipeline::PipelineExecutor* executor =
      pp_model_ ? &executor_for(static_cast<int64_t>(batches.size())) : nullptr;
  if (captured_ &&
      (captured_->loss_scale != loss_scale || captured_->inputs.size() != batches.size() ||
       captured_->executor != executor)) {
    // fp16's loss scale moved (after a window of clean steps, or an
    // overflow), or a batch ramp changed the micro-batches a step holds (a
    // pipeline's schedule with them): all seldom. The graph's backward
    // starts from the old scale and runs the old micro-batches in the old
    // order, so the step is captured anew, the old graph's gradients
    // dropped first so that the new capture writes its own.
    captured_.reset();
    zero_grad();
  }
  DeviceTimer& timer = step_timer();
  if (captured_) {
    const DeviceTimer::Mark m0 = timer.mark();
    // (Modulo 2^64, as the draws' offsets are: philox::Counters::per_call.)
    copy_(captured_->calls,
          full({}, static_cast<double>(static_cast<int64_t>(call - captured_->call)), DType::I64));
    for (size_t i = 0; i < batches.size(); ++i) {
      copy_(captured_->inputs[i], batches[i].inputs);  // (ShapeError if the shape changed)
      copy_(captured_->targets[i], batches[i].targets);
      if (captured_->seeds.empty()) continue;
      // train.loss_average tokens: this step's weights of the micro-batches.
      const double w = batches[i].loss_weight;
      copy_(captured_->seeds[i], full({}, loss_scale * w, captured_->seeds[i].dtype()));
      copy_(captured_->factors[i], full({}, w * micro, DType::F64));
    }
    // ZeRO-1's parameters gathered before the graph reads them (the
    // forward's fences ran at the capture only).
    if (reducer_) reducer_->wait_gathers();
    captured_->graph.replay();
    // The graph's collectives were issued at its capture, where no watchdog
    // saw them: each group that may have calls in it watches the replay as
    // one call, so that a hung exchange inside it fails the group past its
    // timeout (its communicator aborted, the next call raising it) rather
    // than hang the host's next wait for good.
    if (mesh_) {
      const std::string what =
          fmt::format("a replay of the captured step's passes ({} micro-batches, train.cuda_graph)",
                      batches.size());
      for (const dist::ProcessGroupPtr& g : mesh_->groups()) g->watch_device_work(what);
    }
    // (The sums the capture recorded, which this replay wrote.)
    for (const auto& [captured, step] : {std::pair{captured_->z_losses, z_loss_stats_},
                                         std::pair{captured_->mtp_losses, mtp_stats_}}) {
      if (!captured || !step) continue;
      step->sums = captured->sums;
      step->records = captured->records;
    }
    if (captured_->moe && moe_stats_) moe_stats_->pending = captured_->moe->pending;
    const DeviceTimer::Mark m1 = timer.mark();
    // (The replay's passes cannot be timed apart: rank timing's forward
    // column holds both, its backward column none.)
    timer.add("forward", m0, m1);
    timer.trace("replay", "forward", m0, m1);
    return {captured_->loss_sum, micro};
  }
  auto step = std::make_unique<CapturedStep>();
  for (const data::Batch& b : batches) {
    step->inputs.push_back(to_device(b.inputs, device_).detach());
    step->targets.push_back(to_device(b.targets, device_).detach());
  }
  const auto& t = config_.train;
  // The graph keeps the memory its capture is given for as long as it
  // lives, in a pool of its own: the blocks the uncaptured step left cached
  // go back to the device first, so that the pool takes their place rather
  // than doubling the step's memory.
  cuda::empty_cache(device_.index);
  // (No gradients are held here: the last step dropped them, so the
  // captured backward writes new ones rather than adding to old.)
  // train.loss_average tokens weighs each micro-batch by its share of the
  // step's targets, anew every step: those weights come from device
  // scalars refilled before each replay (the loss's gradient seeds, and
  // the f64 factors of its sum), and the head's gradient waits for its seed
  // in the backward pass instead of being written ahead (the same bits).
  const bool per_token = !batches.empty() && batches.front().loss_weight >= 0;
  for (size_t i = 0; per_token && i < batches.size(); ++i) {
    // (Made before the capture, as the batch's tensors are: a tensor made
    // during it may share memory with the capture's earlier temporaries,
    // which each replay writes after the refill.)
    step->seeds.push_back(empty({}, DType::F32, device_));  // (the loss's dtype)
    step->factors.push_back(empty({}, DType::F64, device_));
  }
  // Dropout's masks: each replay's call, less this one, is written to
  // `calls` before it, and the kernels read it there.
  step->calls = empty({}, DType::I64, device_);
  step->call = call;
  nn::ForwardContext layout{true, t.seed, call};
  layout.calls = step->calls;
  // The output z-loss and multi-token prediction's losses: recorded by the
  // capture into sums of its own, handed to each replayed step's records.
  if (config_.model.z_loss_coef > 0) {
    step->z_losses = std::make_shared<nn::LossSums>();
    layout.z_loss_stats = step->z_losses;
  }
  if (config_.model.mtp_layers > 0) {
    step->mtp_losses = std::make_shared<nn::LossSums>();
    layout.mtp_stats = step->mtp_losses;
  }
  if (config_.model.moe.experts > 0) {
    step->moe = std::make_shared<nn::MoeStats>();
    layout.moe_stats = step->moe;
  }
  // A sliding window's key ranges depend on the batch's shape alone: made
  // (and uploaded) once before the capture, for every micro-batch. (Freed
  // when this returns, their memory stays the graph's: the caching
  // allocator keeps a block live at a capture's start for its graph.) Packed
  // documents' ranges and positions depend on each batch's ids: the capture
  // forms them from the device batch (nn::with_documents on device ids),
  // so each replay forms its own.
  if (config_.model.sliding_window > 0 && !config_.model.resets_documents()) {
    layout = nn::with_documents(config_.model, batches.front().inputs, layout, device_);
  }
  // Data parallelism: NCCL's reductions join the capture, so the graph
  // starts each bucket's as the captured backward completes it and ends
  // with finish()'s waits: every replay reduces as the uncaptured step
  // does, overlapping the backward. A group that cannot be captured (device
  // tensors staged through the host) leaves the buckets to finish(), after
  // each replay. ZeRO-1's gathers are waited for before the capture (the
  // forward's fences would wait inside it) and before each replay.
  step->reduces = reducer_ && reducer_->captures_reductions();
  if (reducer_) {
    reducer_->set_deferred(!step->reduces);
    reducer_->wait_gathers();
  }
  // A pipeline's executor runs its schedule inside the capture, each
  // micro-batch's ids and targets read from the device, its weight from the
  // refilled scalars; its host clock and the step timer's events are left
  // out (a replay is timed whole).
  std::vector<data::Batch> on_device;
  pipeline::PipelineExecutor::DeviceLossWeights weights;
  if (executor) {
    for (size_t i = 0; i < batches.size(); ++i) {
      data::Batch b = batches[i];
      b.inputs = step->inputs[i];
      b.targets = step->targets[i];
      on_device.push_back(std::move(b));
    }
    weights.seeds = step->seeds;
    weights.factors = step->factors;
  }
  cuda::Graph graph = cuda::capture(device_.index, [&] {
    if (executor) {
      struct Untimed {
        pipeline::PipelineExecutor& e;
        DeviceTimer& timer;
        ~Untimed() { e.set_timer(&timer); }
      } untimed{*executor, timer};
      executor->set_timer(nullptr);
      executor->set_chunk_timing(false);
      const pipeline::PipelineStepResult r =
          executor->run(on_device, layout, loss_scale, per_token ? &weights : nullptr);
      step->loss_sum = r.loss_sum;
      if (step->reduces) reducer_->finish();
      return;
    }
    Tensor loss_sum;
    for (size_t i = 0; i < batches.size(); ++i) {
      // As the uncaptured step's micro-batch (forward_backward): its mean
      // loss weighs 1 / micro or its share of the targets, times fp16's
      // loss scale (no side losses: validate refuses them).
      nn::ForwardContext ctx = layout;
      ctx.call = call + static_cast<uint64_t>(i);
      ctx.loss_grad = per_token ? 0.0 : loss_scale / micro;
      // (Multi-token prediction's losses weigh their gradient by the seed.)
      if (per_token) ctx.loss_grad_seed = step->seeds[i];
      const Tensor loss = tp_model_ ? tp_model_->loss(step->inputs[i], step->targets[i], ctx)
                                    : model_->loss(step->inputs[i], step->targets[i], ctx);
      Tensor part = cast(loss.detach(), DType::F64);
      if (per_token) part = mul(part, step->factors[i]);
      loss_sum = loss_sum.defined() ? add(loss_sum, part) : part;
      autograd::backward({per_token ? mul(loss, step->seeds[i]) : scale(loss, ctx.loss_grad)});
    }
    step->loss_sum = loss_sum;
    // Then, as after the uncaptured passes: tensor parallelism's partial
    // gradients summed (nothing at tp 1), then the data-parallel buckets
    // finished (the late ones, which wait for those sums, start here).
    if (tp_model_) tp_model_->reduce_partial_grads();
    if (step->reduces) reducer_->finish();
  });
  step->graph = std::move(graph);
  step->loss_scale = loss_scale;
  step->executor = executor;
  const char* plural = batches.size() == 1 ? "" : "es";
  std::string extra;
  if (executor) {
    extra += fmt::format(", schedule {} over {} stages with its sends and receives",
                         pipeline::schedule_name(executor->schedule().kind),
                         executor->schedule().num_stages());
  }
  if (scaler_) extra += fmt::format(", loss scale {}", loss_scale);
  if (step->reduces) {
    extra +=
        fmt::format("; the gradients' reductions too, {} of {} buckets during the backward pass",
                    reducer_->launched_early_last_step(), reducer_->num_buckets());
  } else if (reducer_) {
    extra += "; the gradients are reduced after each replay";
  }
  spdlog::info(
      "train.cuda_graph: captured the step's forward and backward passes ({} micro-batch{}{})",
      batches.size(), plural, extra);
  captured_ = std::move(step);
  // (The capture ran nothing: this step's passes are the first replay.)
  return captured_forward_backward(batches, call);
}

}  // namespace triad::train
