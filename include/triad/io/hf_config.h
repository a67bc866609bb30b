#pragma once

#include <string>

#include "triad/nn/gpt.h"

namespace triad::io {

// A Hugging Face model's config.json as Triad's model: LlamaForCausalLM
// (model_type "llama"), MistralForCausalLM ("mistral", its sliding_window
// as model.sliding_window) and Qwen2ForCausalLM ("qwen2", biases on q, k
// and v: model.qkv_bias; not with use_sliding_window), whose blocks are
// Triad's with rotary embeddings, SwiGLU, RMSNorm and no other linear
// biases; and GPT2LMHeadModel ("gpt2"). Read: hidden_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads (grouped-query
// attention; absent means one per query head), intermediate_size,
// vocab_size, max_position_embeddings (as seq_len), rope_theta,
// rope_scaling (LLaMA 3.1's llama3), rms_norm_eps and tie_word_embeddings.
// What Triad does not implement (other RoPE scaling, biases in the
// attention, another activation, a head_dim other than hidden_size /
// num_attention_heads) is a
// NotSupportedError naming the key and its value; a missing or mistyped key
// is a ConfigError naming `source` and the key.
nn::GptConfig gpt_config_from_hf(const std::string& json_text, const std::string& source);
// The same from a file: config.json, or a directory holding one (a Hugging
// Face model's directory, the one init.from reads its weights from).
nn::GptConfig load_hf_config(const std::string& path);

}  // namespace triad::io
