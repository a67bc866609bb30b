#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "triad/nn/gpt.h"

namespace triad::io {

// A Hugging Face model's config.json as Triad's model. The LLaMA family
// (rotary embeddings, RMSNorm, no linear biases) by model_type:
//  - "llama" and "mistral" (SwiGLU; Mistral's sliding_window);
//  - "qwen2" (biases on q, k and v: model.qkv_bias) and "qwen3" (query/key
//    norms: model.qk_norm), with use_sliding_window's window on the layers
//    from max_window_layers on;
//  - "phi3" (fused qkv_proj and gate_up_proj, its window);
//  - "stablelm" (LayerNorms with their biases, use_qkv_bias as
//    model.qkv_bias, partial_rotary_factor as model.rope_dim);
//  - "gemma" (GeGLU, embeddings times sqrt(hidden_size), norms scaling by
//    1 + weight), "gemma2" (and each sublayer's output normalised again:
//    model.post_norms; every other layer windowed) and "gemma3_text"
//    (query/key norms too, every sliding_window_pattern-th layer global, the
//    local layers' rope_local_base_freq as model.rope_local_theta; keys
//    left out take Gemma3TextConfig's defaults), both with their
//    query_pre_attn_scalar; and "gemma3" (the multimodal checkpoints, 4B and
//    up): its text_config's language model alone;
//  - "olmo" (LayerNorms without weights or biases: model.norm_affine
//    false; clip_qkv as model.clip_qkv), "olmo2" (no norms before the
//    sublayers, their outputs normalised:
//    model.pre_norms false, model.post_norms; one RMSNorm over all the
//    queries and one over all the keys: model.qk_norm full) and "olmoe"
//    (pre-norm blocks with those query/key norms and a mixture of experts
//    on every layer; clip_qkv as OLMo's);
//  - "granite" (embedding_multiplier, residual_multiplier as
//    model.residual_multiplier, attention_multiplier as
//    model.query_pre_attn_scalar 1 / multiplier^2, logits_scaling as
//    model.logit_scale 1 / scaling), "granitemoe" (and a mixture of experts
//    on every layer, its top k renormalised) and "granitemoeshared" (and an
//    ungated shared expert of shared_intermediate_size);
//  - "minimax_m2" (MiniMax-M2: OLMo 2's query/key norms over all the heads,
//    rotary_dim of each head turned, and on every layer a mixture chosen by
//    biased sigmoid scores, renormalised; no shared expert);
// CohereForCausalLM ("cohere": LLaMA's sublayers in parallel on one
// LayerNorm without a bias, model.norm_bias false; q and k turned in
// interleaved pairs, which the weights' reader reorders; logit_scale as
// model.logit_scale); Cohere2ForCausalLM ("cohere2": the same, every
// sliding_window_pattern-th layer global and without rope as
// model.nope_layers, the others windowed);
// SmolLM3ForCausalLM ("smollm3": LLaMA's blocks, no_rope_layers' zero flags
// as model.nope_layers);
// Starcoder2ForCausalLM ("starcoder2": the sequential block with rope,
// LayerNorm of norm_epsilon, an ungated GELU MLP, use_bias's biases on
// every linear layer, Mistral's window);
// ArceeForCausalLM ("arcee", AFM-4.5B: LLaMA's blocks with Nemotron's
// ungated MLP, hidden_act "relu2" by default, as model.activation relu2);
// NemotronForCausalLM ("nemotron", Nemotron-4's and Minitron's: the
// sequential block with partial_rotary_factor of each head turned, a half
// by default, LayerNorm1P of norm_eps as a LayerNorm with
// model.norm_weight_offset, an ungated MLP of hidden_act "relu2" as
// model.activation relu2, attention_bias with mlp_bias as
// model.linear_bias, mlp_bias alone as model.mlp_bias, an untied head by
// default);
// GPTNeoXForCausalLM ("gpt_neox", Pythia's: rotary_pct's partial rotation
// as model.rope_dim, rotary_emb_base, use_parallel_residual as
// model.parallel_residual, hidden_act "gelu" as model.activation gelu_erf,
// LayerNorm and biases, an untied head by default);
// and GPT2LMHeadModel ("gpt2"; activation_function "gelu" is gelu_erf, the
// tanh forms gelu). Read: hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads (absent: one per query head),
// head_dim, intermediate_size, vocab_size, max_position_embeddings (as
// seq_len), rope_theta, rope_scaling (llama3, linear, yarn), rms_norm_eps,
// tie_word_embeddings, initializer_range (as model.init_std), and the
// windows (sliding_window, layer_types).
// The model_type itself becomes model.hf_type (the class an export writes
// back; "gemma3" as "gemma3_text").
// What Triad does not implement (another RoPE scaling, biases in the
// attention or MLP, another activation, soft-capping) is a
// NotSupportedError naming the key and its value; a missing or mistyped key
// is a ConfigError naming `source` and the key.
nn::GptConfig gpt_config_from_hf(const std::string& json_text, const std::string& source);
// The same from a file: config.json, or a directory holding one (a Hugging
// Face model's directory, the one init.from reads its weights from).
nn::GptConfig load_hf_config(const std::string& path);

// The tokens a Hugging Face model's generation_config.json ends a text at
// (its eos_token_id: an id or a list of them, as transformers' generate()
// stops at any), in the file's order. `path`: the model's directory, or
// any file in it (its tokenizer.json, say). Empty when the directory holds
// no generation_config.json or the file no eos_token_id (or null). A file
// that is not JSON, or an eos_token_id that is not a non-negative id or a
// list of them, is a ConfigError naming the file.
std::vector<int64_t> load_hf_stop_tokens(const std::string& path);

// How a model's generation_config.json says to choose tokens, as
// transformers' generate() reads it. Each setting is what the file writes
// (null counts as absent).
struct HfGenerationConfig {
  std::string file;  // the file read; empty: the directory holds none
  std::vector<int64_t> eos_token_ids;
  std::optional<bool> do_sample;
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;

  // Whether the file says anything about choosing tokens (do_sample or any
  // setting above): a file of token ids alone (GPT-2's, Gemma's) does not.
  bool names_sampling() const;
  // The settings generate() takes from the file: without do_sample true it
  // decodes greedily (temperature 0: do_sample defaults to false), with it
  // it samples at the file's temperature. top_k, top_p and min_p are what
  // sampling uses either way (a caller may sample a greedy file's model):
  // the file's, transformers' defaults (50, 1, none) where it has none; so
  // is repetition_penalty (default 1), which greedy decoding applies too.
  struct Sampling {
    double temperature = 0;
    int64_t top_k = 0;
    double top_p = 1;
    double min_p = 0;
    double repetition_penalty = 1;
  };
  Sampling sampling() const;
};

// The generation_config.json in `path` (a model's directory, or any file in
// it); a default HfGenerationConfig (no file) where there is none. A file
// that is not a JSON object, or a setting of the wrong type or outside its
// range (temperature > 0 when sampling, top_k >= 0, top_p in (0, 1],
// min_p in [0, 1], repetition_penalty > 0), is a ConfigError naming the
// file, the key and its value.
HfGenerationConfig load_hf_generation_config(const std::string& path);

}  // namespace triad::io
