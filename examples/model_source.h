#pragma once

// Where triad-generate, triad-eval and triad-export take a trained model
// from: a run's output.dir, a config with a weights file, or a checkpoint
// (or the mean of the last few); and a PEFT adapter to merge into the
// weights.

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "triad/core/error.h"
#include "triad/io/checkpoint.h"
#include "triad/io/gpt2_weights.h"
#include "triad/io/peft_adapter.h"
#include "triad/io/text_file.h"
#include "triad/nn/gpt.h"
#include "triad/train/checkpoint_reshard.h"
#include "triad/train/config.h"

namespace triad::examples {

class ModelSource {
 public:
  // --run, --config, --weights and --checkpoint.
  void add_options(CLI::App& app) {
    app.add_option("--run", run_dir_,
                   "a triad-train output.dir (its config.yaml and model.safetensors)");
    app.add_option("--config", config_path_, "the model's YAML config (instead of --run)");
    app.add_option("--weights", weights_,
                   "the model's safetensors (instead of --run): Triad's, or any init.from takes");
    app.add_option("--checkpoint", checkpoint_,
                   "a checkpoint instead of the run's final model: a checkpoint.dir (its latest) "
                   "or one of its step_<N> directories, written under any layout (its own config "
                   "unless --config or --run gives one)");
    app.add_option("--average", average_,
                   "with --checkpoint: the mean of the weights of this many checkpoints, the one "
                   "it names and those before it in its checkpoint.dir (Polyak averaging, as "
                   "Llama 3 averaged its annealing checkpoints); 1: that checkpoint alone")
        ->capture_default_str();
    app.add_flag("--ema", ema_,
                 "the run's averaged weights (train.ema_decay) instead of its weights: with --run "
                 "its model_ema.safetensors, with --checkpoint the average the checkpoint keeps");
    app.add_option("--adapter", adapter_dir_,
                   "a PEFT LoRA adapter's directory, merged into the weights as they are read "
                   "(as init.adapter: a PEFT adapter, or a LoRA run's adapter/ onto its base)");
  }

  // After parsing: the paths resolved, the checkpoint's manifest read, and
  // the config loaded; a missing or doubled source is a ValueError saying
  // what to give.
  train::Config resolve() {
    if (!checkpoint_.empty() && !weights_.empty()) {
      throw ValueError("give --weights or --checkpoint, not both");
    }
    if (ema_ && !weights_.empty()) {
      throw ValueError(
          "--ema reads a run's averaged weights: give --run or --checkpoint, not "
          "--weights (a model_ema.safetensors is a weights file of its own)");
    }
    if (!run_dir_.empty()) {
      if (config_path_.empty()) config_path_ = run_dir_ + "/config.yaml";
      if (weights_.empty() && checkpoint_.empty()) {
        weights_ = run_dir_ + (ema_ ? "/model_ema.safetensors" : "/model.safetensors");
        if (ema_ && !io::path_exists(weights_)) {
          throw ValueError("--ema: run '" + run_dir_ +
                           "' has no model_ema.safetensors (it trained without train.ema_decay)");
        }
      }
    } else if (ema_ && checkpoint_.empty()) {
      throw ValueError("--ema reads a run's averaged weights: give --run or --checkpoint");
    }
    if (average_ != 1 && checkpoint_.empty()) {
      throw ValueError("--average " + std::to_string(average_) +
                       " averages checkpoints: give --checkpoint");
    }
    if (average_ < 1) {
      throw ValueError("--average " + std::to_string(average_) +
                       " (expected 1 or more checkpoints)");
    }
    if (!checkpoint_.empty()) {
      info_ = io::open_checkpoint(checkpoint_);
      if (average_ > 1) averaged_ = io::recent_checkpoints(checkpoint_, average_);
      if (config_path_.empty() && info_->config.empty()) {
        throw ValueError("checkpoint '" + info_->step_dir + "' keeps no config: give --config");
      }
    } else if (config_path_.empty() || weights_.empty()) {
      throw ValueError("give --run DIR, both --config and --weights, or --checkpoint");
    }
    if (!adapter_dir_.empty()) {
      if (info_) {
        throw ValueError("--adapter '" + adapter_dir_ +
                         "' is merged into a weights file (--weights or --run), not a checkpoint");
      }
      adapter_ = io::read_peft_adapter(adapter_dir_);
    }
    train::Config c = config_path_.empty() ? train::parse_config(info_->config)
                                           : train::load_config(config_path_);
    // A run trained with LoRA wrote its model with the adapters merged in,
    // and a checkpoint's are merged as it is read: the model either gives
    // has the base model's shape.
    c.model.lora = {};
    return c;
  }

  // The weights in init.from's parts (the tensors outside the blocks, then
  // block by block), from the file or the checkpoint (joined whatever
  // layout wrote it; its files are checked against their checksums on the
  // first read only: an export reads twice). After resolve().
  void read(const nn::GptConfig& model, const std::function<void(nn::StateDict&&)>& consume) {
    if (averaged_.size() > 1) {
      train::read_averaged_checkpoint_weights(averaged_, model, consume, ema_);
    } else if (info_) {
      train::read_checkpoint_weights(*info_, model, consume, {.verify = !verified_, .ema = ema_});
      verified_ = true;
    } else {
      io::WeightLayout layout = io::weight_layout(model);
      if (adapter_) layout.adapter = &*adapter_;
      io::read_gpt2_weights(weights_, nn::gpt_parameter_shapes(model), nullptr, consume, layout);
    }
  }

  // The weights file, empty for a checkpoint.
  const std::string& weights() const { return weights_; }
  // Whether --adapter is merged into what read() gives.
  bool has_adapter() const { return adapter_.has_value(); }

 private:
  std::string run_dir_, config_path_, weights_, checkpoint_, adapter_dir_;
  std::optional<io::CheckpointInfo> info_;
  int64_t average_ = 1;                       // --average
  std::vector<io::CheckpointInfo> averaged_;  // its checkpoints, newest first (when > 1)
  std::optional<io::PeftDeltas> adapter_;     // --adapter
  bool verified_ = false;
  bool ema_ = false;  // --ema
};

}  // namespace triad::examples
