// triad-train: trains a GPT from a YAML config.
//   triad-train --config configs/gpt_tiny.yaml [--set train.lr=1e-3 ...]
//   mpirun -np 4 triad-train --config configs/gpt_tiny.yaml --set parallel.tp=4
//   triad-train --config ... --set init.from=out/model.safetensors --eval-only   (validation loss)
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "triad/dist/world.h"
#include "triad/train/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{"Train a GPT-2 style model with Triad"};
  std::string config_path;
  std::vector<std::string> overrides;
  app.add_option("--config", config_path, "YAML configuration file")->required();
  app.add_option("--set", overrides, "override a config key: section.key=value (repeatable)");
  bool eval_only = false;
  app.add_flag("--eval-only", eval_only,
               "only evaluate data.val with the starting weights (init.from, or the newest "
               "checkpoint with checkpoint.resume: auto)");
  CLI11_PARSE(app, argc, argv);
  triad::dist::ProcessGroupPtr world;
  try {
    // The whole configuration is validated before MPI starts.
    triad::train::Config config = triad::train::load_config(config_path, overrides);
    world = triad::dist::init_world();
    triad::train::Trainer trainer(config, world);
    if (eval_only) {
      trainer.evaluate_only();
    } else {
      trainer.run();
    }
  } catch (const std::exception& e) {
    // triad::Error says what was wrong with the input; anything else is the
    // system's (memory, files) and is named as unexpected.
    const bool ours = dynamic_cast<const triad::Error*>(&e) != nullptr;
    spdlog::error("{}{}", ours ? "" : "unexpected error: ", e.what());
    // A failure on one rank must not leave the others waiting forever.
    if (world && world->size() > 1) triad::dist::abort_job(2);
    return 2;
  }
  return 0;
}
