#pragma once

// train.cuda_graph: a step's forward and backward passes captured once as a
// CUDA graph and replayed on later steps' batches (captured_step.cpp).
#include <cstdint>
#include <memory>
#include <vector>

#include "triad/backend/cuda.h"
#include "triad/core/tensor.h"
#include "triad/nn/gpt.h"
#include "triad/nn/moe.h"
#include "triad/train/trainer.h"

namespace triad::train {

struct Trainer::CapturedStep {
  cuda::Graph graph;
  // Each micro-batch's ids and targets on the device: refilled in place
  // from the step's batches before each replay.
  std::vector<Tensor> inputs, targets;
  Tensor loss_sum;  // f64, one value: written by each replay
  // train.loss_average tokens: each micro-batch's gradient seed (the
  // loss's dtype) and loss-sum factor (f64), refilled before each replay;
  // empty otherwise (the weights are the capture's constants).
  std::vector<Tensor> seeds, factors;
  // Dropout's call count (nn::ForwardContext::calls, i64): the step's call
  // less the capture's, refilled before each replay, so that each replay
  // draws its own step's masks.
  Tensor calls;
  uint64_t call = 0;  // the capture's
  // The output z-loss's sums over the micro-batches (model.z_loss_coef),
  // recorded by the capture into tensors each replay writes again: handed
  // to each replayed step's own record. Null without a z-loss.
  std::shared_ptr<nn::LossSums> z_losses;
  // Multi-token prediction's losses by depth (model.mtp_layers), alike.
  std::shared_ptr<nn::LossSums> mtp_losses;
  // A mixture's routing statistics (model.moe.pad_to_capacity), left on
  // the device by the capture (MoeStats::pending), each replay's handed
  // to its step's MoeStats. Null without a mixture.
  std::shared_ptr<nn::MoeStats> moe;
  // fp16's loss scale its backward starts from (1 without one): a step at
  // another scale captures anew.
  double loss_scale = 1.0;
  // Data parallelism: whether the graph reduces the gradients itself (the
  // buckets started as the backward reaches them, all waited for at its
  // end: GradientReducer::captures_reductions), so that the step does not
  // call GradientReducer::finish after a replay.
  bool reduces = false;
  // A pipeline's executor whose schedule the graph runs (null without a
  // pipeline): a step that takes another (a batch ramp's, or zb-auto's
  // measured order) captures anew.
  const pipeline::PipelineExecutor* executor = nullptr;
};

}  // namespace triad::train
