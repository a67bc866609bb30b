#pragma once

#include <memory>
#include <vector>

#include "triad/data/token_dataset.h"
#include "triad/nn/gpt.h"
#include "triad/optim/adamw.h"
#include "triad/optim/lr_schedule.h"
#include "triad/train/config.h"
#include "triad/train/metrics.h"

namespace triad::train {

// The single-process training loop: gradient accumulation over
// micro-batches, global-norm clipping, AdamW with warm-up + cosine LR,
// console lines and metrics.jsonl, final GPT-2 safetensors.
class Trainer {
 public:
  explicit Trainer(Config config);
  // Runs config.train.steps steps and writes output_dir/model.safetensors.
  std::vector<StepMetrics> run();
  // One optimizer step (0-based index); exposed for tests.
  StepMetrics step(int64_t index);
  nn::Gpt& model() { return *model_; }
  const Config& config() const { return config_; }

 private:
  Config config_;
  std::unique_ptr<nn::Gpt> model_;
  std::unique_ptr<data::TokenDataset> dataset_;
  std::unique_ptr<optim::AdamW> optimizer_;
  optim::CosineSchedule schedule_;
};

}  // namespace triad::train
