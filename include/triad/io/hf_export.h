#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "triad/nn/gpt.h"

namespace triad::io {

// Triad models in Hugging Face's layouts, for transformers, vLLM and the
// rest of that ecosystem: the inverse of model.hf_config and init.from.
//
// Which class fits:
//  - LlamaForCausalLM: rotary embeddings + SwiGLU + RMSNorm without linear
//    biases (grouped-query attention and a tied or untied head included);
//    MistralForCausalLM, the same weights, with a sliding window on every
//    layer;
//  - Qwen2ForCausalLM: biases on q, k and v only (model.qkv_bias);
//    Qwen3ForCausalLM: query/key norms (model.qk_norm); either with a window
//    on the layers from some layer on;
//  - GemmaForCausalLM: LLaMA's with GeGLU, an embedding multiplier of
//    sqrt(d_model) and norms scaling by 1 + weight; Gemma2ForCausalLM:
//    Gemma's with post_norms and windows on any layers; Gemma3ForCausalLM:
//    Gemma 2's with query/key norms (and model.rope_local_theta);
//  - Phi3ForCausalLM: LLaMA's with q, k and v fused into qkv_proj and gate
//    and up into gate_up_proj, heads d_model / n_head wide, a window on
//    every layer or none, longrope or no RoPE scaling, and any partial
//    rotation (model.rope_dim: Phi-4-mini's partial_rotary_factor);
//  - StableLmForCausalLM: LLaMA's with LayerNorms, q, k and v biases or
//    none, heads d_model / n_head wide and any partial rotation;
//  - Olmo2ForCausalLM: LLaMA's with no norms before the sublayers, their
//    outputs normalised (model.pre_norms false, model.post_norms) and one
//    norm over all the queries and one over all the keys (model.qk_norm
//    full); OlmoeForCausalLM: LLaMA's with those query/key norms and a
//    mixture of experts on every layer, no shared expert;
//  - NemotronForCausalLM: rotary embeddings (on any share of each head) +
//    an ungated MLP of squared ReLU (or GELU) + LayerNorms scaling by
//    1 + weight (model.norm_weight_offset), biases on every linear layer,
//    the MLP alone or none; ArceeForCausalLM: LLaMA's with that ungated
//    MLP; the two classes holding model.activation relu2;
//  - GPTNeoXForCausalLM: rotary embeddings (on any share of each head) +
//    GELU (either form) + LayerNorm with biases on every linear layer,
//    multi-head attention, and either residual wiring
//    (model.parallel_residual);
//  - GPT2LMHeadModel: learned positions + GELU (either form) + LayerNorm
//    with biases and multi-head attention.
// The class is model.hf_type's when it holds the model (a Phi-3 read from
// Hugging Face goes back as Phi-3, a Mistral without a window as Mistral),
// else the first of the list that does; a partial rotation leaves the
// classes that turn part of each head (Phi-3, StableLM, GLM, GLM-4.5,
// MiniMax-M2, Nemotron, GPT-NeoX, Phi, GPT-J, CodeGen). Another
// combination has no Hugging Face class to load it: NotSupportedError
// naming what differs.
// One of hf_model_types().
const char* hf_model_type(const nn::GptConfig& c);
// The same class, or nullptr where none holds `c` (no error).
const std::string* hf_holding_class(const nn::GptConfig& c);
// Whether class `type`'s q_proj and k_proj rows turn in interleaved pairs
// (Cohere's and Cohere 2's), which Triad's reader and export reorder.
bool hf_turns_interleaved(const std::string& type);
// The model_type names an export can write (model.hf_type's values):
// "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
// "phi3", "stablelm", "olmo", "olmo2", "granite", "cohere", "cohere2", "smollm3",
// "arcee", "gpt_neox", "starcoder2", "nemotron",
// "phi", "falcon",
// "gptj", "codegen" and "gpt2" (and the mixtures
// "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe",
// "granitemoeshared", "glm4_moe", "dots1", "deepseek_v2", "deepseek_v3",
// "minimax_m2"), in the order an export
// tries them.
const std::vector<std::string>& hf_model_types();
// The list's own copy of `type` (model.hf_type's value), or a ConfigError
// naming the list.
const std::string& hf_model_type_named(const std::string& type);
// What keeps class `type` (one of hf_model_types()) from holding `c`, ""
// when nothing does; a name not in the list is a ConfigError.
std::string hf_misfit(const nn::GptConfig& c, const std::string& type);
// `c` to be exported as `type` and nothing else: c with hf_type set, or,
// when that class cannot hold it, a NotSupportedError naming what keeps it
// (triad-export --hf-type).
nn::GptConfig exported_as(const nn::GptConfig& c, const std::string& type);
// The class of hf_model_type(c)'s model_type, one for each of
// hf_model_types(): "LlamaForCausalLM", "Qwen3ForCausalLM",
// "NemotronForCausalLM", "GPT2LMHeadModel", ...
const char* hf_architecture(const nn::GptConfig& c);

// config.json's text for `c` (hf_model_type's class; gpt_config_from_hf
// reads it back to the same model). `torch_dtype` names the weights' type.
std::string hf_config_json(const nn::GptConfig& c, const std::string& torch_dtype = "float32");

// A full Triad state dict under the class's names and layouts: LLaMA's
// c_attn split into q_proj, k_proj and v_proj (k and v n_kv_head heads
// tall; Qwen2's biases alike) and c_fc into gate_proj and up_proj; Phi-3's
// c_attn whole as qkv_proj and c_fc as gate_up_proj; StableLM's as
// LLaMA's with the norms' biases; GPT-NeoX's c_attn as query_key_value,
// its rows interleaved by head; GPT-2's under
// "transformer." with its Conv1D weights transposed. load_gpt2_state_dict reads either
// back to the same state dict.
std::map<std::string, Tensor> triad_to_hf(const nn::StateDict& full, const nn::GptConfig& c);
// The same for one part of it: block -1 (the embedding, final norm and
// head), or block N's tensors (read_gpt2_weights' parts).
std::map<std::string, Tensor> triad_to_hf_part(const nn::StateDict& full, const nn::GptConfig& c,
                                               int64_t block);

// The largest weight file an export writes unless told otherwise:
// transformers' save_pretrained default (5 GB), under the Hugging Face
// Hub's limit on one file.
inline constexpr int64_t kHfMaxShardBytes = 5'000'000'000;

// How an export writes: the largest weight file, the weights' type, and
// what to do once the weights are checked, before anything is written.
struct HfExportOptions {
  // Past it, Hugging Face's shards: model-00001-of-0000N.safetensors and
  // on, filled in order (a tensor larger than the limit alone in its
  // shard), with model.safetensors.index.json naming each tensor's shard.
  int64_t max_shard_bytes = kHfMaxShardBytes;
  // The weights' type (config.json's torch_dtype names it); unset keeps
  // the model's. bf16 halves an fp32-trained model's files; each tensor is
  // rounded to nearest even as it is written.
  std::optional<DType> dtype{};
  // export_hf_model: called once the weights have been read and checked
  // whole, before the directory is touched (triad-export copies the
  // tokenizer here).
  std::function<void()> before_writing{};
};

// Writes dir/config.json and the weights (dir is created): one
// dir/model.safetensors when they fit in the largest shard, else Hugging
// Face's shards and index. The shards take their names only once all are
// written; an earlier export's weights in dir that the new ones do not
// replace are removed, so a loader never finds two sets. Returns the weight
// files' names.
std::vector<std::string> save_hf_model(const nn::StateDict& full, const nn::GptConfig& c,
                                       const std::string& dir, const HfExportOptions& options = {});
// The same from a Triad safetensors file (init.from's forms), read and
// written one block at a time (two passes over the file: the first checks
// it whole and learns the layout; then `before_writing`, then the writes):
// the whole model is never in memory, and a broken file writes nothing.
std::vector<std::string> export_hf_model(const std::string& weights, const nn::GptConfig& c,
                                         const std::string& dir,
                                         const HfExportOptions& options = {});

// The same from any reader of a model's weights in init.from's parts (the
// tensors outside the blocks, then each block in order, as
// read_gpt2_weights hands them over; train::read_checkpoint_weights reads a
// checkpoint so). It is called twice: once to check and learn the layout,
// once to write.
using WeightParts = std::function<void(const std::function<void(nn::StateDict&&)>& consume)>;
std::vector<std::string> export_hf_parts(const WeightParts& read, const nn::GptConfig& c,
                                         const std::string& dir,
                                         const HfExportOptions& options = {});

// A weights type by Hugging Face's torch_dtype name ("float32", "bfloat16",
// "float16") or Triad's ("fp32", "bf16", "fp16"); anything else is a
// ValueError naming it and the choices.
DType hf_weights_dtype(const std::string& name);

// A size as transformers' max_shard_size writes it: bytes, or a number with
// a unit, decimal (KB, MB, GB, TB) or binary (KiB, MiB, GiB, TiB), any
// case ("5GB", "500MiB", "1.5gb"). Anything else, or a size under one
// byte, is a ValueError naming the text.
int64_t parse_byte_size(const std::string& text);

// Copies the tokenizer the model was trained with into an exported
// directory, so that it is a whole Hugging Face model (AutoTokenizer reads
// it too). `source` is a tokenizer.json or a SentencePiece model (written
// as dir/tokenizer.json or dir/tokenizer.model, by content), or a model
// directory, whose tokenizer files are copied as they are:
// tokenizer.json, tokenizer.model, vocab.json and merges.txt (GPT-2's),
// tokenizer_config.json, special_tokens_map.json, added_tokens.json, and
// generation_config.json (the tokens a reply ends at, which transformers'
// generate() and vLLM read). The tokenizer is read first: one that does not
// load (or a directory with none), or whose ids, or generation_config.json's
// eos_token_id, reach past vocab_size, is an error naming it and nothing is
// copied. Returns the names written.
std::vector<std::string> copy_hf_tokenizer(const std::string& source, const std::string& dir,
                                           int64_t vocab_size);

}  // namespace triad::io
