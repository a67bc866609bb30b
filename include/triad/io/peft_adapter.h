#pragma once

// LoRA adapters (nn::GptConfig::lora) in the format of Hugging Face's PEFT
// library: a directory holding adapter_model.safetensors and
// adapter_config.json, which PeftModel.from_pretrained (and vLLM's LoRA
// serving) loads onto the base model that triad-export writes.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "triad/core/tensor.h"
#include "triad/nn/gpt.h"
#include "triad/nn/module.h"

namespace triad::io {

// The adapters, full tensors under Triad's names (h.N.<layer>.lora_a and
// .lora_b), under PEFT's names for the model's Hugging Face class:
// base_model.model.<module>.lora_A.weight (rank, in) and .lora_B.weight
// (out, rank). GPT-2's modules keep Triad's layers (transformer.h.N.attn.
// c_attn, ...; Conv1D, PEFT's fan_in_fan_out). The LLaMA-style classes split
// them as their weights split: c_attn's pair becomes q_proj's, k_proj's and
// v_proj's (each with the one A, and its rows of B), c_fc's gate_proj's
// and up_proj's; attn.c_proj is o_proj, mlp.c_proj down_proj. Each module's
// B A is then its rows of Triad's. Phi-3's fused modules take a layer's
// pair whole (qkv_proj, gate_up_proj). GPT-NeoX's take each layer's pair
// whole (query_key_value, dense, dense_h_to_4h, dense_4h_to_h), c_attn's B
// with its rows interleaved by head as query_key_value's weight is.
// A mixture's experts (model.lora.targets mlp.c_fc, mlp.c_proj) become
// each expert's modules as the class names them (Mixtral's
// block_sparse_moe.experts.<e>.w1, w3, w2; Qwen's, OLMoE's and DeepSeek's
// mlp.experts.<e>.gate_proj, up_proj, down_proj) and the shared expert's
// (mlp.shared_expert or mlp.shared_experts); a class without such modules
// (Granite MoE's fused experts) is a NotSupportedError giving
// peft_adapter_unsupported's reason.
// A missing adapter, or one whose shape
// does not fit the model, is a ShapeError naming it.
std::map<std::string, Tensor> triad_lora_to_peft(const nn::StateDict& adapters,
                                                 const nn::GptConfig& c);

// Why the model's adapters have no PEFT form (no adapters, or experts its
// class holds fused), or empty when they have one.
std::string peft_adapter_unsupported(const nn::GptConfig& c);

// adapter_config.json's text: LORA for CAUSAL_LM with r, lora_alpha (alpha,
// or the rank when alpha is 0: PEFT scales by lora_alpha / r as Triad does),
// the target modules by the class's names, and `base_model` (may be empty).
std::string peft_adapter_config_json(const nn::GptConfig& c, const std::string& base_model);

// A PEFT LoRA adapter read back, to be merged into the base model's weights
// as they are read (WeightLayout::adapter, the trainer's init.adapter):
// each adapted module's A (r, in) and B (out, r) by the module's name in the
// base model's files (its "base_model.model." taken off).
struct PeftDeltas {
  std::string dir;
  double scale = 1.0;           // lora_alpha / r, or / sqrt(r) under use_rslora
  bool fan_in_fan_out = false;  // the modules' weights stored (in, out): GPT-2's Conv1D
  std::map<std::string, std::pair<Tensor, Tensor>> modules;
  // Adds scale * B A (transposed when fan_in_fan_out) to each tensor
  // `<module>.weight` of `tensors` (a file's names, as read; GPT-2's blocks
  // with or without "transformer.") that the adapter adapts, in f32, and
  // records the module in `merged`. A delta
  // whose shape is not the weight's is an IoError naming both.
  void apply(std::map<std::string, Tensor>& tensors, std::set<std::string>& merged) const;
};

// Reads dir/adapter_config.json and dir/adapter_model.safetensors. Refused
// with an IoError naming the key: another peft_type than LORA, DoRA
// (use_dora), per-module ranks or scales (rank_pattern, alpha_pattern),
// modules saved whole (modules_to_save), trained biases (bias other than
// "none"), adapters on embeddings, a lora_alpha that is not a number; and
// a module missing its A or B, or whose A and B do not share the rank.
// Without lora_alpha the scale is PEFT's default alpha, 8, over r.
PeftDeltas read_peft_adapter(const std::string& dir);

// Writes dir/adapter_model.safetensors (in `dtype`, else as given) and
// dir/adapter_config.json; dir is created. ValueError for a model without
// adapters.
void save_peft_adapter(const nn::StateDict& adapters, const nn::GptConfig& c,
                       const std::string& dir, const std::string& base_model = "",
                       std::optional<DType> dtype = {});

}  // namespace triad::io
