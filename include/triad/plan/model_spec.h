#pragma once

#include <string>

#include "triad/nn/gpt.h"

namespace triad::plan {

// Reads the model shape the planner needs from a YAML file: a whole trainer
// config (its `model:` section) or just that section's keys (n_layer,
// n_head, d_model, vocab_size, seq_len, or hf_config and the keys that
// override it), or from a Hugging Face config.json (a path ending in .json,
// or a model's directory; io::load_hf_config). Errors name the file and the
// key.
nn::GptConfig load_model_spec(const std::string& path);
nn::GptConfig parse_model_spec(const std::string& yaml_text, const std::string& source = "<model>");

}  // namespace triad::plan
