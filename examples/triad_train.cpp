// triad-train: trains a GPT from a YAML config.
//   triad-train --config configs/gpt_tiny.yaml [--set train.lr=1e-3 ...]
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "triad/train/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{"Train a GPT-2 style model with Triad"};
  std::string config_path;
  std::vector<std::string> overrides;
  app.add_option("--config", config_path, "YAML configuration file")->required();
  app.add_option("--set", overrides, "override a config key: section.key=value (repeatable)");
  CLI11_PARSE(app, argc, argv);
  try {
    triad::train::Trainer trainer(triad::train::load_config(config_path, overrides));
    trainer.run();
  } catch (const triad::Error& e) {
    spdlog::error("{}", e.what());
    return 2;
  }
  return 0;
}
