// A PEFT LoRA adapter as init.adapter reads it: adapter_config.json and
// adapter_model.safetensors (the input's two parts, kPartSeparator
// between), then merged into base weights of the shapes its modules change
// (GPT-2's names, with and without "transformer."), each of which it must
// then have merged.
#include <filesystem>
#include <map>
#include <set>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/io/peft_adapter.h"
#include "triad/ops/creation.h"

TRIAD_FUZZ_TARGET(peft_adapter) {
  const auto parts = triad::fuzz::split_input(data, size, 2);
  const std::string dir = triad::fuzz::scratch_dir() + "/adapter";
  std::filesystem::create_directories(dir);
  triad::fuzz::write_input("adapter/adapter_config.json", parts[0]);
  triad::fuzz::write_input("adapter/adapter_model.safetensors", parts[1]);
  const triad::io::PeftDeltas deltas = triad::io::read_peft_adapter(dir);
  std::map<std::string, triad::Tensor> base;
  for (const auto& [module, ab] : deltas.modules) {
    const int64_t out = ab.second.size(0), in = ab.first.size(1);
    if (out * in > (int64_t{1} << 20)) return;  // (the fuzzer's memory)
    const triad::Shape shape =
        deltas.fan_in_fan_out ? triad::Shape{in, out} : triad::Shape{out, in};
    const std::string stem = module.starts_with("transformer.")
                                 ? module.substr(std::string("transformer.").size())
                                 : module;
    // (Two modules, with and without "transformer.", changing one weight:
    // the first is merged.)
    if (!base.emplace(stem + ".weight", triad::zeros(shape)).second) return;
  }
  std::set<std::string> merged;
  deltas.apply(base, merged);
  triad::fuzz::require(merged.size() == deltas.modules.size(), "every module is merged");
}
