// A model as it is downloaded: config.json and model.safetensors (the
// input's first two parts), or, when a third part is there, a sharded
// checkpoint: model.safetensors.index.json (the third part) naming the
// shards model-00001-of-00002.safetensors and model-00002-of-00002.safetensors
// (the second and fourth parts). Read as init.from reads them: the
// configuration, then the weights in whichever family's names they come
// (GPT-2, LLaMA and its kin, GPT-NeoX, Phi, Falcon, GPT-J), converted to
// Triad's. What comes back is the model's every parameter, each of the
// shape it has.
#include <algorithm>
#include <filesystem>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/io/gpt2_weights.h"
#include "triad/io/hf_config.h"
#include "triad/nn/gpt.h"

TRIAD_FUZZ_TARGET(hf_weights) {
  using triad::fuzz::require;
  const auto parts = triad::fuzz::split_input(data, size, 4);
  const std::string dir = triad::fuzz::scratch_dir() + "/model";
  std::filesystem::remove_all(dir);  // (no file of an earlier input stays)
  std::filesystem::create_directories(dir);
  triad::fuzz::write_input("model/config.json", parts[0]);
  if (parts[2].empty()) {
    triad::fuzz::write_input("model/model.safetensors", parts[1]);
  } else {
    triad::fuzz::write_input("model/model.safetensors.index.json", parts[2]);
    triad::fuzz::write_input("model/model-00001-of-00002.safetensors", parts[1]);
    triad::fuzz::write_input("model/model-00002-of-00002.safetensors", parts[3]);
  }
  const triad::nn::GptConfig config = triad::io::load_hf_config(dir + "/config.json");
  // (Models no input of a fuzzer's size holds are not built.)
  constexpr int64_t kMost = int64_t{1} << 20;
  if (config.n_layer > 64) return;
  const auto expected = triad::nn::gpt_parameter_shapes(config);
  int64_t elements = 0;
  for (const auto& [name, shape] : expected) {
    elements += std::min(triad::numel(shape), kMost);
    if (elements > kMost) return;
  }
  const triad::nn::StateDict state =
      triad::io::load_gpt2_state_dict(dir, expected, nullptr, triad::io::weight_layout(config));
  require(state.size() == expected.size(), "every parameter is read, and nothing else");
  for (const auto& [name, t] : state) {
    const auto it = expected.find(name);
    require(it != expected.end() && it->second == t.shape(), "each of the model's shape");
  }
}
