// triad-export: a trained model in Hugging Face's layout (config.json and
// model.safetensors, or its shards past --max-shard-size), for transformers,
// vLLM and the rest of that ecosystem.
//   triad-export --run out/llama_tiny --output out/llama_tiny_hf
//   (out/llama_tiny/{config.yaml,model.safetensors})
//   triad-export --config my.yaml --weights model.safetensors --output hf/
//   triad-export --checkpoint out/ckpt --output hf/   (its latest checkpoint)
// LLaMA-style models become LlamaForCausalLM (MistralForCausalLM with a
// window, Qwen2ForCausalLM with q, k and v biases, Qwen3ForCausalLM with
// query/key norms, the Gemma classes, Phi3ForCausalLM with a partial
// rotation; a model read from Hugging Face as its own class, model.hf_type),
// GPT-2-style ones GPT2LMHeadModel; model.hf_config and init.from read the
// directory back.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>

#include "triad/core/error.h"
#include "triad/io/hf_export.h"
#include "triad/train/config.h"

#include "cli_checks.h"
#include "model_source.h"

int main(int argc, char** argv) {
  CLI::App app{"Write a model trained by Triad in Hugging Face's layout"};
  triad::examples::ModelSource source;
  source.add_options(app);
  std::string output;
  app.add_option("--output", output, "the directory to write config.json and model.safetensors")
      ->required();
  std::string tokenizer;
  app.add_option("--tokenizer", tokenizer,
                 "the tokenizer the model was trained with, copied into --output: a "
                 "tokenizer.json, a SentencePiece tokenizer.model, or a model directory (its "
                 "tokenizer files, tokenizer_config.json and generation_config.json)");
  std::string max_shard_size = "5GB";
  app.add_option("--max-shard-size", max_shard_size,
                 "the largest weight file (transformers' max_shard_size: 5GB, 500MB, 2GiB); "
                 "larger models are written as model-00001-of-0000N.safetensors and on, with "
                 "model.safetensors.index.json")
      ->capture_default_str();
  std::string dtype;
  app.add_option("--dtype", dtype,
                 "the weights' type: float32, bfloat16 or float16 (default: the model's; "
                 "bfloat16 halves an fp32-trained model's files)");
  std::string hf_type;
  app.add_option("--hf-type", hf_type,
                 "the Hugging Face model_type to write (llama, mistral, qwen2, qwen3, gemma, "
                 "gemma2, gemma3_text, phi3, stablelm, gpt_neox, gpt2), refused with the reason if "
                 "that class cannot hold the model; default: the model's model.hf_type where it "
                 "can, else the first class that can");
  CLI11_PARSE(app, argc, argv);
  return triad::examples::report_errors([&]() -> int {
    triad::io::HfExportOptions options;
    options.max_shard_bytes = triad::io::parse_byte_size(max_shard_size);
    if (!dtype.empty()) options.dtype = triad::io::hf_weights_dtype(dtype);
    triad::nn::GptConfig model = source.resolve().model;
    if (!hf_type.empty()) model = triad::io::exported_as(model, hf_type);
    const char* architecture = triad::io::hf_architecture(model);  // before reading the weights
    // One block at a time: the model is never whole in memory. The weights
    // are checked whole first, then the tokenizer is copied (it is checked
    // before anything is written), then the weights are written.
    std::vector<std::string> tokenizer_files;
    options.before_writing = [&] {
      if (!tokenizer.empty())
        tokenizer_files = triad::io::copy_hf_tokenizer(tokenizer, output, model.vocab_size);
    };
    const std::vector<std::string> weight_files =
        source.weights().empty() || source.has_adapter()
            ? triad::io::export_hf_parts(
                  [&](const std::function<void(triad::nn::StateDict &&)>& consume) {
                    source.read(model, consume);
                  },
                  model, output, options)
            : triad::io::export_hf_model(source.weights(), model, output, options);
    std::string what = weight_files.size() == 1
                           ? weight_files.front()
                           : std::to_string(weight_files.size()) + " shards (" +
                                 weight_files.front() + " .. " + weight_files.back() +
                                 ") and model.safetensors.index.json";
    for (const auto& f : tokenizer_files) what += ", " + f;
    std::printf("wrote %s/config.json and %s (%s, %lld parameters)\n", output.c_str(), what.c_str(),
                architecture, static_cast<long long>(model.num_parameters()));
    return 0;
  });
}
