#pragma once

#include <memory>
#include <vector>

#include "triad/data/token_dataset.h"
#include "triad/dist/mesh.h"
#include "triad/nn/gpt.h"
#include "triad/optim/adamw.h"
#include "triad/optim/lr_schedule.h"
#include "triad/parallel/tensor/gpt.h"
#include "triad/train/config.h"
#include "triad/train/metrics.h"

namespace triad::train {

// The training loop: gradient accumulation over micro-batches, global-norm
// clipping, AdamW with warm-up + cosine LR, console lines and metrics.jsonl
// (rank 0), final GPT-2 safetensors (gathered, written by rank 0). With
// parallel.tp > 1 the model is split over a tensor-parallel group of the
// world; the world size must equal tp (pipeline and data parallelism are
// not part of the trainer yet), checked before any other communicator.
class Trainer {
 public:
  // `world` defaults to a world of one process.
  explicit Trainer(Config config, dist::ProcessGroupPtr world = nullptr);
  // Runs config.train.steps steps and writes output_dir/model.safetensors.
  std::vector<StepMetrics> run();
  // One optimizer step (0-based index); exposed for tests.
  StepMetrics step(int64_t index);
  // The model's parameters as full (unsharded) tensors; collective.
  nn::StateDict full_state_dict() const;
  bool is_logging_rank() const { return !world_ || world_->rank() == 0; }
  const Config& config() const { return config_; }

 private:
  Tensor micro_loss(const Tensor& ids, const Tensor& targets, const nn::ForwardContext& ctx) const;
  nn::Module& module() const;

  Config config_;
  dist::ProcessGroupPtr world_;
  std::unique_ptr<dist::DeviceMesh> mesh_;
  std::unique_ptr<nn::Gpt> model_;                   // tp == 1
  std::unique_ptr<tp::TensorParallelGpt> tp_model_;  // tp > 1
  std::unique_ptr<data::TokenDataset> dataset_;
  std::unique_ptr<optim::AdamW> optimizer_;
  optim::CosineSchedule schedule_;
};

}  // namespace triad::train
