// triad-train: trains a GPT from a YAML config.
//   triad-train --config configs/gpt_tiny.yaml [--set train.lr=1e-3 ...]
//   mpirun -np 4 triad-train --config configs/gpt_tiny.yaml --set parallel.tp=4
//   triad-train --config ... --set init.from=out/model.safetensors --eval-only
//     (validation loss, eval.choices)
//   triad-train --config ... --show-data 3 --tokenizer /models/Qwen3-0.6B
//     (what it trains on)
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "triad/dist/world.h"
#include "triad/train/console.h"
#include "triad/train/trainer.h"
#include "triad/train/training_data.h"

int main(int argc, char** argv) {
  CLI::App app{"Train a GPT-2 style model with Triad"};
  std::string config_path;
  std::vector<std::string> overrides;
  app.add_option("--config", config_path, "YAML configuration file")->required();
  app.add_option("--set", overrides,
                 "override a config key: section.key=value, at any depth (repeatable)");
  bool eval_only = false;
  app.add_flag("--eval-only", eval_only,
               "only evaluate (data.val, eval.choices, eval.lambada, eval.samples) the starting "
               "weights (init.from, "
               "or the newest checkpoint with checkpoint.resume: auto)");
  bool check = false;
  app.add_flag("--check", check,
               "set the run up on its ranks (model, data, layout, memory, the checkpoint it would "
               "resume), take one step and exit, writing nothing: its time and peak memory");
  int64_t show_data = 0, show_from = 0;
  std::string tokenizer, vocab, merges;
  app.add_option("--show-data", show_data,
                 "print this many training sequences as training reads them, decoded, with the "
                 "text that has no loss marked, and exit (nothing is trained)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--show-from", show_from, "--show-data: the first global sequence (default 0)")
      ->check(CLI::NonNegativeNumber);
  std::string show_set = "train";
  app.add_option("--show-set", show_set,
                 "--show-data: train (default), val (data.val, or data.val_split's held-out "
                 "data) or val.NAME (a named data.val set)");
  app.add_option("--tokenizer", tokenizer,
                 "--show-data: the data's tokenizer (a Hugging Face tokenizer.json or "
                 "SentencePiece model, or the model directory holding it); default: one token "
                 "per byte");
  app.add_option("--vocab", vocab, "--show-data: GPT-2's vocab.json (with --merges)");
  app.add_option("--merges", merges, "--show-data: GPT-2's merges.txt (with --vocab)");
  CLI11_PARSE(app, argc, argv);
  triad::dist::ProcessGroupPtr world;
  try {
    // Plain log lines in files and from a launcher's ranks (console.h).
    triad::train::configure_console_colors();
    // The whole configuration is validated before MPI starts.
    triad::train::Config config = triad::train::load_config(config_path, overrides);
    if (show_data == 0 && !(tokenizer.empty() && vocab.empty() && merges.empty() &&
                            show_from == 0 && show_set == "train")) {
      throw triad::ValueError(
          "--show-from, --show-set, --tokenizer, --vocab and --merges go with --show-data");
    }
    if (show_data > 0) {
      // One process, no model: the data as step 0 onwards reads it.
      if (tokenizer.empty() && vocab.empty() && merges.empty() && config.model.vocab_size > 256) {
        throw triad::ValueError(
            "--show-data: model.vocab_size is " + std::to_string(config.model.vocab_size) +
            ", more than one token per byte: name the data's tokenizer (--tokenizer, or --vocab "
            "and --merges)");
      }
      const auto tok = triad::data::make_tokenizer(vocab, merges, tokenizer);
      std::string text;
      if (show_set == "train") {
        const auto data = triad::train::open_training_data(config);
        text = triad::train::preview_data(config, *data, "data.train", show_from, show_data, *tok);
      } else {
        std::string names = "train";
        for (const auto& v : triad::train::open_validation_data(config)) {
          // val: the set without a name (data.val's, or data.val_split's).
          const std::string name = v.name.empty() ? "val" : "val." + v.name;
          if (name == show_set) {
            text = triad::train::preview_data(config, *v.data, v.key, show_from, show_data, *tok);
          }
          names += ", " + name;
        }
        if (text.empty()) {
          throw triad::ValueError("--show-set '" + show_set + "' names no data of this config (" +
                                  names + ")");
        }
      }
      std::fputs(text.c_str(), stdout);
      return 0;
    }
    if (check && (eval_only || show_data > 0))
      throw triad::ValueError("--check goes alone (not with --eval-only or --show-data)");
    world = triad::dist::init_world();
    triad::train::Trainer trainer(config, world);
    if (check) {
      trainer.check();
    } else if (eval_only) {
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
