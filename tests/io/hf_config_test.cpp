// Hugging Face config.json files as Triad's model: LLaMA 2 7B's and 70B's
// give the model files' configs (and their published parameter counts),
// GPT-2's the default GPT-2, and what Triad does not build is named.
#include "triad/io/hf_config.h"
#include "triad/io/hf_export.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "support/temp_dir.h"
#include "triad/io/gpt2_weights.h"
#include "triad/plan/model_spec.h"
#include "triad/train/config.h"

namespace triad::io {
namespace {

// LLaMA 2 7B's config.json as Hugging Face publishes it (the keys Triad
// reads, and some it has no use for).
const char* kLlama7b = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
  "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null,
  "tie_word_embeddings": false, "vocab_size": 32000, "torch_dtype": "float16",
  "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02, "pretraining_tp": 1,
  "use_cache": true, "attention_bias": false
})";

const char* kLlama70b = R"({
  "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
  "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
  "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "vocab_size": 32000,
  "tie_word_embeddings": false
})";

std::string edited(const std::string& json, const std::string& key, const std::string& value) {
  // Appends (JSON objects keep the last value of a repeated key in
  // nlohmann's parser, so an appended key overrides).
  std::string s = json;
  s.insert(s.rfind('}'), ", \"" + key + "\": " + value);
  return s;
}

// The file with `key` left out.
std::string without(const std::string& json, const std::string& key) {
  nlohmann::json j = nlohmann::json::parse(json);
  j.erase(key);
  return j.dump();
}

// What reading `json` as a config.json throws ("no error" when nothing).
std::string error_of(const std::string& json) {
  try {
    gpt_config_from_hf(json, "m/config.json");
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

TEST(HfConfig, LlamaConfigsAreTheModelFiles) {
  const nn::GptConfig c = gpt_config_from_hf(kLlama7b, "7b/config.json");
  const nn::GptConfig want =
      plan::load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/llama2_7b.yaml");
  EXPECT_EQ(c.num_parameters(), 6'738'415'616);
  EXPECT_EQ(c.num_parameters(), want.num_parameters());
  EXPECT_TRUE(c.rotary());
  EXPECT_TRUE(c.rms_norm());
  EXPECT_EQ(c.activation, nn::Activation::SwiGlu);
  EXPECT_FALSE(c.linear_bias);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.kv_heads(), 32);
  EXPECT_EQ(c.n_kv_head, 0);  // multi-head attention, written as Triad's default
  EXPECT_EQ(c.seq_len, 4096);
  EXPECT_DOUBLE_EQ(c.layer_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  const nn::GptConfig big = gpt_config_from_hf(kLlama70b, "70b/config.json");
  EXPECT_EQ(big.n_kv_head, 8);
  EXPECT_EQ(big.num_parameters(), 68'976'648'192);
  EXPECT_EQ(big.num_parameters(),
            plan::load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/llama2_70b.yaml")
                .num_parameters());
  // LLaMA 3's larger theta; Mistral without a window shorter than its
  // context; a head_dim that is hidden_size / heads.
  EXPECT_DOUBLE_EQ(gpt_config_from_hf(edited(kLlama70b, "rope_theta", "500000.0"), "x").rope_theta,
                   500000.0);
  EXPECT_EQ(
      gpt_config_from_hf(
          edited(edited(kLlama70b, "model_type", "\"mistral\""), "sliding_window", "null"), "x")
          .n_kv_head,
      8);
  EXPECT_EQ(gpt_config_from_hf(edited(kLlama70b, "head_dim", "128"), "x").head_dim(), 128);
  // LLaMA 3.1's RoPE scaling (and the older "type" key).
  for (const char* key : {"rope_type", "type"}) {
    const nn::GptConfig l31 = gpt_config_from_hf(
        edited(kLlama70b, "rope_scaling",
               std::string("{\"") + key +
                   "\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                   "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}"),
        "x");
    EXPECT_TRUE(l31.rope_scaling.scaled()) << key;
    EXPECT_EQ(l31.rope_scaling.factor, 8.0);
    EXPECT_EQ(l31.rope_scaling.original_seq_len, 8192.0);
  }
  // Mistral's window when shorter than its context (none when as long).
  const std::string mistral = edited(kLlama70b, "model_type", "\"mistral\"");
  EXPECT_EQ(gpt_config_from_hf(edited(mistral, "sliding_window", "1024"), "x").sliding_window,
            1024);
  EXPECT_EQ(gpt_config_from_hf(edited(mistral, "sliding_window", "4096"), "x").sliding_window, 0);
}

// Qwen2-0.5B's config.json: LLaMA's blocks with biases on q, k and v, a
// tied head, 14 query heads over 2 key/value heads, and a window it does
// not use.
const char* kQwen2_05b = R"({
  "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
  "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "max_position_embeddings": 32768,
  "max_window_layers": 24, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "use_sliding_window": false, "tie_word_embeddings": true,
  "vocab_size": 151936, "torch_dtype": "bfloat16", "attention_dropout": 0.0
})";

TEST(HfConfig, Qwen2ConfigIsLlamasBlocksWithQkvBiases) {
  const nn::GptConfig c = gpt_config_from_hf(kQwen2_05b, "qwen2/config.json");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.linear_bias);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.kv_heads(), 2);
  EXPECT_EQ(c.head_dim(), 64);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window: false
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.layer_norm_eps, 1e-6);
  // Hugging Face's count for Qwen2-0.5B, the q, k and v biases included.
  EXPECT_EQ(c.num_parameters(), 494'032'768);
  nn::GptConfig without = c;
  without.qkv_bias = false;
  EXPECT_EQ(c.num_parameters() - without.num_parameters(), 24 * (896 + 2 * 2 * 64));
  // Its window, when used, covers the layers from max_window_layers on (the
  // first 21 see every key); one as long as the context is no window.
  const std::string windowed =
      edited(edited(edited(kQwen2_05b, "use_sliding_window", "true"), "sliding_window", "4096"),
             "max_window_layers", "21");
  const nn::GptConfig w = gpt_config_from_hf(windowed, "x");
  EXPECT_EQ(w.sliding_window, 4096);
  ASSERT_EQ(w.full_attention_layers.size(), 21u);
  EXPECT_EQ(w.full_attention_layers.back(), 20);
  EXPECT_EQ(w.window_of(20), 0);
  EXPECT_EQ(w.window_of(21), 4096);
  EXPECT_EQ(
      gpt_config_from_hf(edited(kQwen2_05b, "use_sliding_window", "true"), "x").sliding_window,
      0);  // 32768, the whole context
  // Newer files list each layer's kind (layer_types), which wins.
  std::string kinds = "[";
  for (int i = 0; i < 24; ++i)
    kinds +=
        std::string(i ? ", " : "") + (i % 4 == 3 ? "\"full_attention\"" : "\"sliding_attention\"");
  const nn::GptConfig typed = gpt_config_from_hf(edited(windowed, "layer_types", kinds + "]"), "x");
  EXPECT_EQ(typed.full_attention_layers, (std::vector<int64_t>{3, 7, 11, 15, 19, 23}));
  EXPECT_EQ(typed.sliding_window, 4096);
  EXPECT_THROW(gpt_config_from_hf(edited(windowed, "layer_types", "[\"full_attention\"]"), "x"),
               ConfigError);  // one kind for 24 layers
  kinds.replace(kinds.find("full_attention"), 14, "chunked_attention");
  try {
    gpt_config_from_hf(edited(windowed, "layer_types", kinds + "]"), "x");
    FAIL() << "an unknown attention kind was read";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("'layer_types[3]' (chunked_attention)"), std::string::npos)
        << e.what();
  }
}

// Qwen3-0.6B's config.json: LLaMA's blocks with RMSNorm over each query and
// key head, 16 query heads of 128 (2048 wide together, hidden_size 1024)
// over 8 key/value heads, and a tied head.
const char* kQwen3_06b = R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": false,
  "attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
  "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_sliding_window": false,
  "vocab_size": 151936
})";

TEST(HfConfig, Qwen3ConfigIsLlamasBlocksWithHeadNormsAndWiderHeads) {
  const nn::GptConfig c = gpt_config_from_hf(kQwen3_06b, "qwen3/config.json");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.linear_bias);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.q_width(), 2048);
  EXPECT_EQ(c.qkv_width(), 2048 + 2 * 8 * 128);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.seq_len, 40960);
  // Hugging Face's count for Qwen3-0.6B: 28 layers of q (2048 x 1024), k
  // and v (1024 x 1024 each), o (1024 x 2048), the MLP (3 x 3072 x 1024),
  // two norms of 1024 and the head norms of 128 each, plus the tied table
  // and the final norm.
  EXPECT_EQ(c.num_parameters(), 596'049'920);
  nn::GptConfig without = c;
  without.qk_norm = false;
  EXPECT_EQ(c.num_parameters() - without.num_parameters(), 28 * 2 * 128);
  // A head_dim equal to hidden_size / num_attention_heads is no different
  // from its absence (LLaMA's configs write it).
  EXPECT_EQ(gpt_config_from_hf(edited(kQwen3_06b, "head_dim", "64"), "x").head_size, 0);
}

// Gemma 7B's config.json: LLaMA's blocks with GeGLU (hidden_act "gelu",
// which transformers reads as GELU's tanh approximation), 16 heads of 256
// on a hidden size of 3072, token embeddings times sqrt(3072), norms
// scaling by 1 + weight and a tied head (the default for Gemma).
const char* kGemma7b = R"({
  "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "attention_bias": false,
  "attention_dropout": 0.0, "head_dim": 256, "hidden_act": "gelu", "hidden_size": 3072,
  "intermediate_size": 24576, "max_position_embeddings": 8192, "num_attention_heads": 16,
  "num_hidden_layers": 28, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 10000.0, "torch_dtype": "bfloat16", "vocab_size": 256000
})";

TEST(HfConfig, GemmaConfigIsLlamasBlocksWithGegluScaledEmbeddingsAndOffsetNorms) {
  const nn::GptConfig c = gpt_config_from_hf(kGemma7b, "gemma/config.json");
  EXPECT_EQ(c.activation, nn::Activation::GeGlu);
  EXPECT_DOUBLE_EQ(c.embedding_multiplier, std::sqrt(3072.0));
  EXPECT_TRUE(c.norm_weight_offset);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_TRUE(c.rms_norm());
  EXPECT_EQ(c.head_dim(), 256);
  EXPECT_EQ(c.q_width(), 4096);
  EXPECT_EQ(c.kv_heads(), 16);
  // Hugging Face's count for Gemma 7B: 28 layers of q, k, v (4096 x 3072
  // each), o (3072 x 4096), the MLP (3 x 24576 x 3072) and two norms, plus
  // the tied table and the final norm.
  EXPECT_EQ(c.num_parameters(), 8'537'680'896);
  // GELU's exact form is not Triad's GeGLU.
  try {
    gpt_config_from_hf(edited(kGemma7b, "hidden_activation", "\"gelu\""), "gemma/config.json");
    FAIL() << "exact GELU accepted";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("'hidden_activation' (\"gelu\")"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(gpt_config_from_hf(edited(kGemma7b, "hidden_activation", "\"gelu_pytorch_tanh\""), "x")
                .activation,
            nn::Activation::GeGlu);
}

// Gemma 3 1B's config.json (the text model, Gemma3ForCausalLM): Gemma's
// blocks with post-norms and query/key norms, 4 heads of 256 on a hidden
// size of 1152 over one key/value head, a window of 512 on five layers in
// six, and the local layers' own RoPE base.
const char* kGemma3_1b = R"({
  "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "attention_bias": false,
  "attention_dropout": 0.0, "attn_logit_softcapping": null, "final_logit_softcapping": null,
  "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
  "intermediate_size": 6912, "max_position_embeddings": 32768, "num_attention_heads": 4,
  "num_hidden_layers": 26, "num_key_value_heads": 1, "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": null,
  "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
  "torch_dtype": "bfloat16", "vocab_size": 262144
})";

TEST(HfConfig, Gemma3ConfigIsGemmasBlocksWithPostNormsLocalLayersAndTheirRope) {
  const nn::GptConfig c = gpt_config_from_hf(kGemma3_1b, "gemma3/config.json");
  EXPECT_EQ(c.activation, nn::Activation::GeGlu);
  EXPECT_TRUE(c.post_norms);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.norm_weight_offset);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_DOUBLE_EQ(c.embedding_multiplier, std::sqrt(1152.0));
  EXPECT_EQ(c.head_dim(), 256);
  EXPECT_EQ(c.kv_heads(), 1);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.full_attention_layers, (std::vector<int64_t>{5, 11, 17, 23}));
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_local_theta, 1e4);
  EXPECT_EQ(c.rope_of(0).theta, 1e4);
  EXPECT_EQ(c.rope_of(5).theta, 1e6);
  // Hugging Face's count for Gemma 3 1B: 26 layers of q (1024 x 1152), k
  // and v (256 x 1152), o (1152 x 1024), the MLP (3 x 6912 x 1152), four
  // norms and the two head norms, plus the tied table and the final norm.
  EXPECT_EQ(c.num_parameters(), 999'885'952);
  // The planner's file is the same model.
  const nn::GptConfig spec =
      plan::load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/gemma3_1b.yaml");
  EXPECT_EQ(spec.num_parameters(), c.num_parameters());
  EXPECT_EQ(spec.full_attention_layers, c.full_attention_layers);
  EXPECT_EQ(spec.sliding_window, c.sliding_window);
  EXPECT_TRUE(spec.post_norms && spec.qk_norm && spec.norm_weight_offset);
  EXPECT_DOUBLE_EQ(spec.embedding_multiplier, c.embedding_multiplier);
  // layer_types (newer files) names the global layers instead.
  std::string kinds;
  for (int i = 0; i < 26; ++i)
    kinds +=
        std::string(i ? ", " : "") + (i % 3 == 2 ? "\"full_attention\"" : "\"sliding_attention\"");
  const nn::GptConfig typed = gpt_config_from_hf(
      edited(kGemma3_1b, "layer_types", "[" + kinds + "]"), "gemma3/config.json");
  EXPECT_EQ(typed.full_attention_layers, (std::vector<int64_t>{2, 5, 8, 11, 14, 17, 20, 23}));
  // The 4B and larger scale the global layers' RoPE (linear, 8x): the local
  // ones keep theirs, unscaled.
  const nn::GptConfig scaled = gpt_config_from_hf(
      edited(kGemma3_1b, "rope_scaling", R"({"rope_type": "linear", "factor": 8.0})"), "x");
  EXPECT_TRUE(scaled.rope_of(5).scaling.scaled());
  EXPECT_FALSE(scaled.rope_of(0).scaling.scaled());
  // 27B's attention scale (query_pre_attn_scalar 168 against heads of
  // 128): q and k each turn with the fourth root of the scores' change.
  EXPECT_EQ(c.query_pre_attn_scalar, 0.0);  // 256, the head dimension
  const nn::GptConfig big = gpt_config_from_hf(
      edited(edited(kGemma3_1b, "query_pre_attn_scalar", "168"), "head_dim", "128"), "x");
  EXPECT_EQ(big.query_pre_attn_scalar, 168.0);
  EXPECT_DOUBLE_EQ(std::pow(big.rope_of(0).scaling.amplitude, 4), 128.0 / 168.0);
  EXPECT_DOUBLE_EQ(rope_amplitude(big.rope_of(5).scaling), big.rope_of(0).scaling.amplitude);
  try {
    gpt_config_from_hf(edited(kGemma3_1b, "query_pre_attn_scalar", "-1"), "gemma3/config.json");
    FAIL() << "a negative attention scalar accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.query_pre_attn_scalar (-1.000000) must be a "
                                         "positive number"),
              std::string::npos)
        << e.what();
  }
  // Gemma 3 4B's config.json (Gemma3ForConditionalGeneration): its
  // text_config names few keys, the others being Gemma3TextConfig's
  // defaults (8 heads of 256 over 4, vocabulary 262208, 131072 positions,
  // a window on five layers in six). Its language model: 34 layers of q
  // (2048 x 2560), k and v (1024 x 2560), o, the MLP (3 x 10240 x 2560),
  // four norms and two head norms, the tied table and the final norm.
  const nn::GptConfig four_b = gpt_config_from_hf(R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "boi_token_index": 255999, "image_token_index": 262144, "mm_tokens_per_image": 256,
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}})",
                                                  "gemma3-4b/config.json");
  EXPECT_EQ(four_b.n_head, 8);
  EXPECT_EQ(four_b.kv_heads(), 4);
  EXPECT_EQ(four_b.head_dim(), 256);
  EXPECT_EQ(four_b.vocab_size, 262208);
  EXPECT_EQ(four_b.seq_len, 131072);
  EXPECT_EQ(four_b.sliding_window, 1024);
  EXPECT_EQ(four_b.full_attention_layers, (std::vector<int64_t>{5, 11, 17, 23, 29}));
  EXPECT_TRUE(four_b.rope_of(5).scaling.scaled());
  EXPECT_FALSE(four_b.rope_of(0).scaling.scaled());
  EXPECT_EQ(four_b.num_parameters(), 3'880'263'168);
  // Gemma 2: no query/key norms, every other layer global, one RoPE base,
  // and its soft caps on the attention's scores and the head's logits.
  const std::string gemma2 = edited(
      edited(edited(kGemma3_1b, "model_type", "\"gemma2\""), "attn_logit_softcapping", "50.0"),
      "final_logit_softcapping", "30.0");
  const nn::GptConfig g2 = gpt_config_from_hf(gemma2, "gemma2/config.json");
  EXPECT_TRUE(g2.post_norms);
  EXPECT_FALSE(g2.qk_norm);
  EXPECT_EQ(g2.full_attention_layers.size(), 13u);
  EXPECT_EQ(g2.full_attention_layers.front(), 1);
  EXPECT_EQ(g2.rope_local_theta, 0.0);
  EXPECT_EQ(g2.attn_logit_softcap, 50.0);
  EXPECT_EQ(g2.final_logit_softcap, 30.0);
  EXPECT_EQ(g2.heads().softcap, 50.0);
  // null is no cap; left out, Gemma2Config's 50 and 30 (Gemma 3's none).
  const nn::GptConfig uncapped = gpt_config_from_hf(
      edited(edited(gemma2, "attn_logit_softcapping", "null"), "final_logit_softcapping", "null"),
      "gemma2/config.json");
  EXPECT_EQ(uncapped.attn_logit_softcap, 0.0);
  EXPECT_EQ(uncapped.final_logit_softcap, 0.0);
  const nn::GptConfig implied = gpt_config_from_hf(
      without(without(gemma2, "attn_logit_softcapping"), "final_logit_softcapping"),
      "gemma2/config.json");
  EXPECT_EQ(implied.attn_logit_softcap, 50.0);
  EXPECT_EQ(implied.final_logit_softcap, 30.0);
  const nn::GptConfig g3 = gpt_config_from_hf(
      without(without(kGemma3_1b, "attn_logit_softcapping"), "final_logit_softcapping"),
      "gemma3/config.json");
  EXPECT_EQ(g3.attn_logit_softcap, 0.0);
  EXPECT_EQ(g3.final_logit_softcap, 0.0);
  try {
    gpt_config_from_hf(edited(gemma2, "final_logit_softcapping", "-30.0"), "gemma2/config.json");
    FAIL() << "a negative soft cap accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.final_logit_softcap (-30"), std::string::npos)
        << e.what();
  }
}

// Phi-3-mini-4k's config.json: LLaMA's blocks (its fused qkv_proj and
// gate_up_proj are the weights' concern) with Mistral's window of 2047 on a
// context of 4096, and an untied head.
const char* kPhi3Mini = R"({
  "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "attention_bias": false,
  "attention_dropout": 0.0, "embd_pdrop": 0.0, "hidden_act": "silu", "hidden_size": 3072,
  "intermediate_size": 8192, "max_position_embeddings": 4096,
  "original_max_position_embeddings": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 32, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "vocab_size": 32064
})";

TEST(HfConfig, Phi3ConfigIsLlamasBlocksWithMistralsWindow) {
  const nn::GptConfig c = gpt_config_from_hf(kPhi3Mini, "phi3/config.json");
  EXPECT_EQ(c.activation, nn::Activation::SwiGlu);
  EXPECT_EQ(c.sliding_window, 2047);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.kv_heads(), 32);
  // Hugging Face's count for Phi-3-mini: 32 layers of qkv (9216 x 3072),
  // o (3072 x 3072), gate_up (16384 x 3072), down (3072 x 8192) and two
  // norms, plus the embedding, the head and the final norm.
  EXPECT_EQ(c.num_parameters(), 3'821'079'552);
  // A partial_rotary_factor out of (0, 1] is named.
  try {
    gpt_config_from_hf(edited(kPhi3Mini, "partial_rotary_factor", "1.5"), "phi3/config.json");
    FAIL() << "a rotation of 1.5 heads accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'partial_rotary_factor' (1.5) must be a share of the "
                                         "head in (0, 1]"),
              std::string::npos)
        << e.what();
  }
}

// Phi-4-mini's config.json: Phi-3's blocks with 24 query heads of 128 over 8
// key/value heads, a tied head, three quarters of each head turned
// (partial_rotary_factor) and longrope's factors for those 48 pairs.
TEST(HfConfig, Phi4MiniTurnsThreeQuartersOfEachHead) {
  nlohmann::json j = nlohmann::json::parse(kPhi3Mini);
  j["num_attention_heads"] = 24;
  j["num_key_value_heads"] = 8;
  j["vocab_size"] = 200064;
  j["tie_word_embeddings"] = true;
  j["partial_rotary_factor"] = 0.75;
  j["max_position_embeddings"] = 131072;
  j["sliding_window"] = 262144;
  nlohmann::json factors = nlohmann::json::array();
  for (int i = 0; i < 48; ++i) factors.push_back(1.0 + 0.5 * i);
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", factors}, {"long_factor", factors}};
  const nn::GptConfig c = gpt_config_from_hf(j.dump(), "phi4/config.json");
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.rope_dim, 96);
  EXPECT_EQ(c.rope_of(0).scaling.rotary_dim, 96);
  EXPECT_EQ(c.rope_scaling.pairs, 48);
  EXPECT_TRUE(c.tie_embeddings);
  // Hugging Face's count for Phi-4-mini-instruct (3.84B).
  EXPECT_EQ(c.num_parameters(), 3'836'021'760);
  // Written back as Phi-3 (the file's own class, and the only one that
  // turns part of a head): the share that int(128 * factor) turns into 96,
  // longrope as Phi3Config has always read it (type and the two lists, its
  // factor the two contexts' ratio), heads as wide as hidden_size / heads.
  EXPECT_EQ(c.hf_type, "phi3");
  const auto out = nlohmann::json::parse(hf_config_json(c));
  EXPECT_EQ(out.at("architectures").at(0), "Phi3ForCausalLM");
  EXPECT_EQ(out.at("model_type"), "phi3");
  EXPECT_EQ(static_cast<int64_t>(128 * out.at("partial_rotary_factor").get<double>()), 96);
  EXPECT_EQ(out.at("max_position_embeddings"), 131072);
  EXPECT_EQ(out.at("original_max_position_embeddings"), 4096);
  EXPECT_EQ(out.at("rope_scaling").size(), 3u);
  EXPECT_EQ(out.at("rope_scaling").at("type"), "longrope");
  EXPECT_EQ(out.at("rope_scaling").at("short_factor").size(), 48u);
  EXPECT_TRUE(out.at("sliding_window").is_null());  // (262144 covers the whole context)
  EXPECT_FALSE(out.contains("head_dim"));
  const nn::GptConfig again = gpt_config_from_hf(out.dump(), "x");
  EXPECT_EQ(again.rope_dim, 96);
  EXPECT_EQ(again.rope_scaling.factor, 32.0);
  EXPECT_EQ(rope_factors(again.rope_scaling, true), rope_factors(c.rope_scaling, true));
  EXPECT_DOUBLE_EQ(rope_amplitude(again.rope_scaling), rope_amplitude(c.rope_scaling));
  // With model.hf_type auto it is Phi-3 all the same: no other class turns
  // part of a head. A share like 2/3 of 96 is written so that Hugging
  // Face's product truncates to the dimensions meant.
  nn::GptConfig any = c;
  any.hf_type.clear();
  EXPECT_STREQ(hf_model_type(any), "phi3");
  nn::GptConfig thirds = any;
  thirds.n_head = 32;  // heads of 96
  thirds.n_kv_head = 8;
  thirds.rope_dim = 64;
  thirds.rope_scaling = {};
  const auto tj = nlohmann::json::parse(hf_config_json(thirds));
  EXPECT_EQ(static_cast<int64_t>(96 * tj.at("partial_rotary_factor").get<double>()), 64);
  EXPECT_EQ(gpt_config_from_hf(tj.dump(), "x").rope_dim, 64);
  EXPECT_TRUE(tj.at("rope_scaling").is_null());
  EXPECT_EQ(tj.at("max_position_embeddings"), 131072);
  // What Phi3ForCausalLM cannot hold is named: a partial rotation with
  // another RoPE scaling (no class's), or with heads wider than
  // hidden_size / heads (GLM's, which turns them in interleaved pairs).
  nn::GptConfig yarn = thirds;
  yarn.rope_scaling.kind = RopeScaling::Kind::Yarn;
  yarn.rope_scaling.factor = 4.0;
  yarn.rope_scaling.original_seq_len = 4096.0;
  try {
    hf_config_json(yarn);
    FAIL() << "exported a partial rotation under yarn";
  } catch (const NotSupportedError& e) {
    for (const char* why : {"model.rope_scaling is not longrope (Phi3Config takes longrope only)",
                            "model.rope_dim turns part of each head (only Phi-3, StableLM, GLM, "
                            "GLM-4.5 and MiniMax-M2 turn part)",
                            "model.rope_scaling is set (GLM's files turn unscaled)"})
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  nn::GptConfig wide = thirds;
  wide.head_size = 128;
  EXPECT_NE(hf_misfit(wide, "phi3").find("model.head_dim is not d_model / n_head"),
            std::string::npos);
  EXPECT_EQ(std::string(hf_model_type(wide)), "glm");
}

// Phi-3-mini-128k's and Phi-3.5-mini's long context: longrope over the
// pretrained 4096 positions, a factor per pair of the 96-wide heads, the
// factor max_position_embeddings / original_max_position_embeddings (32)
// and Hugging Face's attention factor from it; written back by triad-export
// with the attention factor spelled out.
// Phi-3-mini-128k's kind of longrope scaling: a factor per pair of the
// 96-wide heads, the short ones near 1, the long ones growing to 71.5.
nlohmann::json phi3_longrope() {
  nlohmann::json shorts = nlohmann::json::array(), longs = nlohmann::json::array();
  for (int i = 0; i < 48; ++i) {
    shorts.push_back(1.0 + 0.01 * i);
    longs.push_back(1.0 + 1.5 * i);
  }
  return {{"type", "longrope"}, {"short_factor", shorts}, {"long_factor", longs}};
}

// kPhi3Mini over 131072 positions with phi3_longrope().
std::string phi3_128k() {
  return edited(edited(kPhi3Mini, "max_position_embeddings", "131072"), "rope_scaling",
                phi3_longrope().dump());
}

TEST(HfConfig, Phi3LongRopeScaling) {
  const nlohmann::json scaling = phi3_longrope();
  const std::string json = phi3_128k();
  const nn::GptConfig c = gpt_config_from_hf(json, "phi3/config.json");
  const RopeScaling& r = c.rope_scaling;
  EXPECT_EQ(r.kind, RopeScaling::Kind::LongRope);
  EXPECT_EQ(c.seq_len, 131072);
  EXPECT_EQ(r.original_seq_len, 4096.0);
  EXPECT_EQ(r.factor, 32.0);
  EXPECT_EQ(r.pairs, 48);
  EXPECT_DOUBLE_EQ(rope_amplitude(r), std::sqrt(1.0 + std::log(32.0) / std::log(4096.0)));
  // Up to the original context the short factors, past it the long ones.
  const double f5 = std::pow(10000.0, -10.0 / 96.0);
  EXPECT_NEAR(rope_frequency(5, 96, 10000.0, r.with_positions_up_to(4096)),
              f5 / static_cast<double>(1.05f), 1e-15);  // (the factors are kept as floats)
  EXPECT_NEAR(rope_frequency(5, 96, 10000.0, r.with_positions_up_to(4097)), f5 / 8.5, 1e-15);
  // Phi-3's first files call it "su"; the attention factor may be given.
  nlohmann::json su = scaling;
  su["type"] = "su";
  su["attention_factor"] = 1.5;
  const nn::GptConfig s = gpt_config_from_hf(
      edited(edited(kPhi3Mini, "max_position_embeddings", "131072"), "rope_scaling", su.dump()),
      "phi3/config.json");
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::LongRope);
  EXPECT_EQ(rope_amplitude(s.rope_scaling), 1.5);
  // Written back as Phi-3, its own class: the lists under Phi3Config's
  // three keys, the factor implied by the two contexts; an attention factor
  // they do not imply spelled out. As Mistral (model.hf_type auto): the lists,
  // the resolved attention factor, and the original context at the top.
  // Each, read again, gives the same rotation.
  nn::GptConfig as_llama = c;
  as_llama.hf_type.clear();
  nn::GptConfig given = s;
  given.seq_len = 8192;  // (the context trained on need not be the factor's)
  for (const nn::GptConfig& model : {c, s, as_llama, given}) {
    const auto out = nlohmann::json::parse(hf_config_json(model));
    const auto& rs = out.at("rope_scaling");
    EXPECT_EQ(out.at("original_max_position_embeddings"), 4096);
    EXPECT_EQ(rs.at("long_factor").size(), 48u);
    if (model.hf_type == "phi3") {
      EXPECT_EQ(out.at("model_type"), "phi3");
      EXPECT_EQ(rs.at("type"), "longrope");
      EXPECT_EQ(rs.size(), model.rope_scaling.attention_factor > 0 ? 4u : 3u) << rs.dump();
      EXPECT_EQ(out.at("max_position_embeddings"), 131072);
    } else {
      EXPECT_EQ(out.at("model_type"), "mistral");  // (Phi-3-mini's window)
      EXPECT_EQ(rs.at("rope_type"), "longrope");
    }
    const nn::GptConfig again = gpt_config_from_hf(out.dump(), "x");
    EXPECT_DOUBLE_EQ(rope_amplitude(again.rope_scaling), rope_amplitude(model.rope_scaling));
    for (int64_t i : {0, 5, 47}) {
      for (int64_t end : {100, 5000}) {
        EXPECT_EQ(rope_frequency(i, 96, 10000.0, again.rope_scaling.with_positions_up_to(end)),
                  rope_frequency(i, 96, 10000.0, model.rope_scaling.with_positions_up_to(end)));
      }
    }
  }
  // A factor that stretches the original context to no whole number of
  // positions: the context trained on, and the attention factor spelled out.
  nn::GptConfig odd = c;
  odd.seq_len = 8192;
  odd.rope_scaling.factor = 2.5;
  odd.rope_scaling.original_seq_len = 4095.0;
  const auto oj = nlohmann::json::parse(hf_config_json(odd));
  EXPECT_EQ(oj.at("max_position_embeddings"), 8192);
  EXPECT_EQ(oj.at("original_max_position_embeddings"), 4095);
  EXPECT_DOUBLE_EQ(oj.at("rope_scaling").at("attention_factor").get<double>(),
                   rope_amplitude(odd.rope_scaling));
  EXPECT_DOUBLE_EQ(rope_amplitude(gpt_config_from_hf(oj.dump(), "x").rope_scaling),
                   std::sqrt(1.0 + std::log(2.5) / std::log(4095.0)));
  // Lists that do not fit the heads, or that are missing, are named.
  nlohmann::json few = scaling;
  few["short_factor"] = {1.0, 1.0};
  few["long_factor"] = {1.0, 2.0};
  try {
    gpt_config_from_hf(edited(kPhi3Mini, "rope_scaling", few.dump()), "phi3/config.json");
    FAIL() << "2 factors for 48 pairs accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("longrope scaling has 2 short_factor and long_factor "
                                         "values, but a head turning 96 dimensions has 48 pairs"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(gpt_config_from_hf(edited(kPhi3Mini, "rope_scaling",
                                         R"({"type": "longrope", "long_factor": [1.0]})"),
                                  "phi3/config.json"),
               NotSupportedError);
}

// Mistral NeMo 12B's config.json: Mistral's blocks with heads of 128 on a
// hidden size of 5120 (32 query heads, 4096 wide together) over 8 key/value
// heads, an untied head and no window.
const char* kMistralNemo = R"({
  "architectures": ["MistralForCausalLM"], "model_type": "mistral", "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 14336,
  "max_position_embeddings": 128000, "num_attention_heads": 32, "num_hidden_layers": 40,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "vocab_size": 131072
})";

TEST(HfConfig, MistralNemoConfigHasHeadsWiderThanItsHiddenSizeSplits) {
  const nn::GptConfig c = gpt_config_from_hf(kMistralNemo, "nemo/config.json");
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.q_width(), 4096);
  EXPECT_TRUE(c.heads_apart());
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0);
  // 40 layers of q (4096 x 5120), k and v (1024 x 5120 each), o (5120 x
  // 4096), the MLP (3 x 14336 x 5120) and two norms, the two 131072-row
  // tables and the final norm: Mistral-Nemo-Base-2407's 12.2B.
  EXPECT_EQ(c.num_parameters(), 12'247'782'400);
}

// Qwen2.5's long-context recipe (yarn, factor 4 over 32768 positions) and a
// linear stretch.
TEST(HfConfig, YarnAndLinearRopeScaling) {
  const nn::GptConfig q = gpt_config_from_hf(
      edited(kQwen2_05b, "rope_scaling",
             R"({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})"),
      "x");
  EXPECT_EQ(q.rope_scaling.kind, RopeScaling::Kind::Yarn);
  EXPECT_EQ(q.rope_scaling.factor, 4.0);
  EXPECT_EQ(q.rope_scaling.original_seq_len, 32768.0);
  EXPECT_EQ(q.rope_scaling.beta_fast, 32.0);  // Hugging Face's defaults
  EXPECT_EQ(q.rope_scaling.beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(rope_amplitude(q.rope_scaling), 0.1 * std::log(4.0) + 1.0);
  // Without its own original context, yarn stretches max_position_embeddings.
  const nn::GptConfig d = gpt_config_from_hf(
      edited(kQwen2_05b, "rope_scaling", R"({"rope_type": "yarn", "factor": 2.0})"), "x");
  EXPECT_EQ(d.rope_scaling.original_seq_len, 32768.0);
  const nn::GptConfig l = gpt_config_from_hf(
      edited(kLlama7b, "rope_scaling", R"({"type": "linear", "factor": 2.0})"), "x");
  EXPECT_EQ(l.rope_scaling.kind, RopeScaling::Kind::Linear);
  EXPECT_DOUBLE_EQ(rope_frequency(5, 128, 10000.0, l.rope_scaling),
                   std::pow(10000.0, -10.0 / 128.0) / 2.0);
}

// GLM-4-9B-0414's config.json keys (Glm4ForCausalLM): LLaMA's blocks with
// biases on q, k and v, half of each 128-wide head turned (in interleaved
// pairs, which the weights' reader reorders), 32 query heads over 2
// key/value heads and GLM-4's four norms a block. Its count by the shapes:
// 151552 x 4096 embeddings twice (untied), 40 blocks of 2 x 4096^2 + 2 x
// 4096 x 256 + 3 x 4096 x 13696 + the biases' 4096 + 512 + four norms, and
// the final norm: 9,400,279,040 (9.4B). GLM-4-9B-chat-hf's (glm): the same
// without the post-norms, 327,680 fewer. A scaled RoPE is refused.
TEST(HfConfig, GlmConfigsTurnHalfOfEachHeadWithQkvBiases) {
  const std::string glm4 = R"({
    "architectures": ["Glm4ForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 13696,
    "max_position_embeddings": 32768, "model_type": "glm4", "num_attention_heads": 32,
    "num_hidden_layers": 40, "num_key_value_heads": 2, "pad_token_id": 151329,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 151552})";
  const nn::GptConfig c = gpt_config_from_hf(glm4, "GLM-4-9B-0414/config.json");
  EXPECT_EQ(c.hf_type, "glm4");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.linear_bias);
  EXPECT_TRUE(c.post_norms);
  EXPECT_TRUE(c.pre_norms);
  EXPECT_FALSE(c.norm_weight_offset);
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.kv_heads(), 2);
  EXPECT_TRUE(c.rms_norm());
  EXPECT_EQ(c.activation, nn::Activation::SwiGlu);
  EXPECT_EQ(c.num_parameters(), 9'400'279'040);
  EXPECT_TRUE(weight_layout(c).interleaved_rotation);
  EXPECT_STREQ(hf_architecture(c), "Glm4ForCausalLM");
  const auto j = nlohmann::json::parse(hf_config_json(c));
  EXPECT_EQ(j.at("attention_bias"), true);
  EXPECT_EQ(j.at("partial_rotary_factor"), 0.5);
  EXPECT_EQ(j.at("head_dim"), 128);
  const nn::GptConfig g =
      gpt_config_from_hf(edited(glm4, "model_type", "\"glm\""), "glm-4-9b-chat-hf/config.json");
  EXPECT_EQ(g.hf_type, "glm");
  EXPECT_FALSE(g.post_norms);
  EXPECT_EQ(c.num_parameters() - g.num_parameters(), 40 * 2 * 4096);
  EXPECT_STREQ(hf_architecture(g), "GlmForCausalLM");
  EXPECT_FALSE(gpt_config_from_hf(edited(glm4, "attention_bias", "false"), "x").qkv_bias);
  EXPECT_EQ(gpt_config_from_hf(without(glm4, "partial_rotary_factor"), "x").rope_dim, 64);
  EXPECT_NE(error_of(edited(glm4, "rope_scaling", R"({"rope_type": "linear", "factor": 2.0})"))
                .find("GLM's partial rotation in interleaved pairs turns unscaled"),
            std::string::npos);
}

// Helium's config.json keys (kyutai/helium-1-preview-2b, HeliumForCausalLM):
// LLaMA's blocks, heads of 128 turned in interleaved pairs (the weights'
// reader reorders them), an untied head. Its count by the shapes: 48000 x
// 2560 embeddings twice, 24 blocks of 4 x 2560^2 + 3 x 2560 x 7040 + two
// norms, and the final norm: 2,172,643,840. attention_bias puts biases on
// q, k and v alone.
TEST(HfConfig, HeliumTurnsInInterleavedPairs) {
  const std::string helium = R"({
    "architectures": ["HeliumForCausalLM"], "attention_bias": false, "bos_token_id": 1,
    "eos_token_id": 2, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
    "intermediate_size": 7040, "max_position_embeddings": 4096, "mlp_bias": false,
    "model_type": "helium", "num_attention_heads": 20, "num_hidden_layers": 24,
    "num_key_value_heads": 20, "pad_token_id": 3, "rms_norm_eps": 1e-08, "rope_theta": 100000.0,
    "tie_word_embeddings": false, "vocab_size": 48000})";
  const nn::GptConfig c = gpt_config_from_hf(helium, "helium-1-preview-2b/config.json");
  EXPECT_EQ(c.hf_type, "helium");
  EXPECT_EQ(c.num_parameters(), 2'172'643'840);
  EXPECT_EQ(c.rope_theta, 1e5);
  EXPECT_EQ(c.rope_dim, 0);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_TRUE(weight_layout(c).interleaved_rotation);
  EXPECT_STREQ(hf_architecture(c), "HeliumForCausalLM");
  EXPECT_TRUE(gpt_config_from_hf(edited(helium, "attention_bias", "true"), "x").qkv_bias);
  EXPECT_NE(error_of(edited(helium, "mlp_bias", "true")).find("'mlp_bias' (true)"),
            std::string::npos);
}

// Seed-OSS-36B's config.json (SeedOssForCausalLM): LLaMA's blocks with
// biases on q, k and v, 80 query heads of 128 over 8 key/value heads on a
// width of 5120, RoPE at 1e7. Its count by the shapes: 64 blocks of
// 540,039,168 (q and o 5120 x 10240, k and v 5120 x 1024, their biases,
// the MLP 3 x 5120 x 27648, two norms), two 155136 x 5120 tables and the
// final norm: 36,151,104,512 (36B). Its rope_scaling {"rope_type":
// "default"} (transformers' name for none) turns unscaled. o_proj's bias
// alone is refused by name; so is the MLP's.
TEST(HfConfig, SeedOssIsLlamasBlocksWithQkvBiases) {
  const std::string seed = R"({
    "architectures": ["SeedOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.1,
    "attention_out_bias": false, "bos_token_id": 0, "eos_token_id": 2, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
    "intermediate_size": 27648, "max_position_embeddings": 524288, "mlp_bias": false,
    "model_type": "seed_oss", "num_attention_heads": 80, "num_hidden_layers": 64,
    "num_key_value_heads": 8, "pad_token_id": 1, "residual_dropout": 0.1, "rms_norm_eps": 1e-06,
    "rope_scaling": {"rope_type": "default"}, "rope_theta": 10000000.0,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "vocab_size": 155136})";
  const nn::GptConfig c = gpt_config_from_hf(seed, "Seed-OSS-36B-Instruct/config.json");
  EXPECT_EQ(c.hf_type, "seed_oss");
  EXPECT_EQ(c.num_parameters(), 36'151'104'512);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.linear_bias);
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.kv_heads(), 8);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_FALSE(c.rope_scaling.scaled());  // (rope_type default: none)
  EXPECT_STREQ(hf_architecture(c), "SeedOssForCausalLM");
  EXPECT_TRUE(gpt_config_from_hf(without(seed, "attention_bias"), "x").qkv_bias);  // the default
  EXPECT_FALSE(gpt_config_from_hf(edited(seed, "attention_bias", "false"), "x").qkv_bias);
  EXPECT_NE(
      error_of(edited(seed, "attention_out_bias", "true")).find("'attention_out_bias' (true)"),
      std::string::npos);
  EXPECT_NE(error_of(edited(seed, "mlp_bias", "true")).find("'mlp_bias' (true)"),
            std::string::npos);
}

// Olmo-3-1025-7B's config.json keys (Olmo3ForCausalLM): OLMo 2's blocks
// with a window of 4096 on three of every four layers (layer_types), yarn
// over its 8192 pretrained positions turning the global layers alone (the
// windowed ones turn unscaled at rope_theta). Its count by the shapes:
// 100278 x 4096 embeddings twice, 32 blocks of 4 x 4096^2 + 3 x 4096 x
// 11008 + two norms + the query/key norms (2 x 4096), and the final norm:
// 7,298,011,136 (7.3B). Without layer_types, every fourth layer is global.
TEST(HfConfig, Olmo3WindowsThreeLayersInFourAndScalesTheOthers) {
  nlohmann::json kinds = nlohmann::json::array();
  for (int i = 0; i < 32; ++i)
    kinds.push_back((i + 1) % 4 == 0 ? "full_attention" : "sliding_attention");
  const std::string olmo3 = edited(R"({
    "architectures": ["Olmo3ForCausalLM"], "attention_bias": false, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 65536,
    "model_type": "olmo3", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "rms_norm_eps": 1e-06, "rope_theta": 500000,
    "rope_scaling": {"attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1,
                     "factor": 8.0, "original_max_position_embeddings": 8192,
                     "rope_type": "yarn"},
    "sliding_window": 4096, "tie_word_embeddings": false, "vocab_size": 100278})",
                                   "layer_types", kinds.dump());
  const nn::GptConfig c = gpt_config_from_hf(olmo3, "Olmo-3-1025-7B/config.json");
  EXPECT_EQ(c.hf_type, "olmo3");
  EXPECT_EQ(c.num_parameters(), 7'298'011'136);
  EXPECT_FALSE(c.pre_norms);
  EXPECT_TRUE(c.post_norms && c.qk_norm_full);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.full_attention_layers, (std::vector<int64_t>{3, 7, 11, 15, 19, 23, 27, 31}));
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::Yarn);
  EXPECT_EQ(c.rope_local_theta, 500000.0);
  EXPECT_EQ(c.rope_of(0).scaling.kind, RopeScaling::Kind::None);
  EXPECT_EQ(c.rope_of(3).scaling.kind, RopeScaling::Kind::Yarn);
  EXPECT_STREQ(hf_architecture(c), "Olmo3ForCausalLM");
  const nn::GptConfig d = gpt_config_from_hf(without(olmo3, "layer_types"), "x");
  EXPECT_EQ(d.full_attention_layers, c.full_attention_layers);
  const nn::GptConfig unscaled = gpt_config_from_hf(without(olmo3, "rope_scaling"), "x");
  EXPECT_EQ(unscaled.rope_local_theta, 0.0);
  EXPECT_EQ(unscaled.sliding_window, 4096);
}

// EXAONE-4.0-32B's config.json keys (Exaone4ForCausalLM): OLMo 2's sublayer
// norms with an RMSNorm over each query and key head, a window of 4096 on
// three layers in four, the fourth global and without rope, LLaMA 3.1's
// scaling on the layers that turn. Its count by the shapes: 102400 x 5120
// embeddings twice, 64 blocks of 2 x 5120^2 + 2 x 5120 x 1024 + 3 x 5120 x
// 27392 + two norms + the head norms (2 x 128), and the final norm:
// 32,003,216,384. The pattern may be a count or a string of L and G;
// without a window (EXAONE-4.0-1.2B's null) every layer is global and turns.
TEST(HfConfig, Exaone4GlobalLayersTurnNothing) {
  const std::string exaone = R"({
    "architectures": ["Exaone4ForCausalLM"], "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 5120, "intermediate_size": 27392, "max_position_embeddings": 131072,
    "model_type": "exaone4", "num_attention_heads": 40, "num_hidden_layers": 64,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000,
    "rope_scaling": {"factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "sliding_window": 4096, "sliding_window_pattern": 4, "tie_word_embeddings": false,
    "vocab_size": 102400})";
  const nn::GptConfig c = gpt_config_from_hf(exaone, "EXAONE-4.0-32B/config.json");
  EXPECT_EQ(c.hf_type, "exaone4");
  EXPECT_EQ(c.num_parameters(), 32'003'216'384);
  EXPECT_FALSE(c.pre_norms);
  EXPECT_TRUE(c.post_norms);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qk_norm_full);
  EXPECT_EQ(c.sliding_window, 4096);
  std::vector<int64_t> global;
  for (int64_t i = 3; i < 64; i += 4) global.push_back(i);
  EXPECT_EQ(c.full_attention_layers, global);
  EXPECT_EQ(c.nope_layers, global);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_STREQ(hf_architecture(c), "Exaone4ForCausalLM");
  const nn::GptConfig lettered =
      gpt_config_from_hf(edited(exaone, "sliding_window_pattern", "\"LLLG\""), "x");
  EXPECT_EQ(lettered.nope_layers, global);
  EXPECT_NE(error_of(edited(exaone, "sliding_window_pattern", "\"LXG\""))
                .find("expected a string of L (local) and G (global)"),
            std::string::npos);
  const nn::GptConfig small = gpt_config_from_hf(edited(exaone, "sliding_window", "null"), "x");
  EXPECT_EQ(small.sliding_window, 0);
  EXPECT_TRUE(small.nope_layers.empty());
}

// `json` as transformers 5 writes it: the keys `moved` (rope_theta,
// rope_scaling, ...) left out and rope_parameters given instead.
std::string with_rope_parameters(const std::string& json, const std::vector<std::string>& moved,
                                 const std::string& parameters) {
  nlohmann::json j = nlohmann::json::parse(json);
  for (const std::string& key : moved) j.erase(key);
  j["rope_parameters"] = nlohmann::json::parse(parameters);
  return j.dump();
}

// A kind named by something other than a string (rope_type, the older
// type, model_type, a quantization's method) is an error naming the key and
// its value, as every other key of the wrong type is.
TEST(HfConfig, AKindThatIsNoStringIsNamed) {
  EXPECT_NE(error_of(with_rope_parameters(kLlama7b, {"rope_theta", "rope_scaling"},
                                          R"({"rope_type": 5, "rope_theta": 1.0})"))
                .find("'rope_parameters.rope_type' (5) must be a string"),
            std::string::npos);
  EXPECT_NE(error_of(with_rope_parameters(
                         kGemma3_1b, {"rope_theta", "rope_scaling", "rope_local_base_freq"},
                         R"({"full_attention": {"type": [1], "rope_theta": 1000000},
                             "sliding_attention": {"rope_type": "default"}})"))
                .find("'rope_parameters.type' ([1]) must be a string"),
            std::string::npos);
  EXPECT_NE(error_of(edited(kLlama7b, "rope_scaling", R"({"rope_type": {"x": 1}, "factor": 2})"))
                .find("'rope_scaling.rope_type' ({\"x\":1}) must be a string"),
            std::string::npos);
  EXPECT_NE(error_of(edited(kLlama7b, "quantization_config", R"({"quant_method": 8})"))
                .find("'quantization_config.quant_method' (8) must be a string"),
            std::string::npos);
}

// transformers 5's rope_parameters read as the older keys they replace:
// each file the same model (the config.json Triad writes for it the same)
// as its older form, for LLaMA 3.1's llama3 scaling, Qwen2.5's yarn,
// Phi-3's longrope (its pretrained context inside), Pythia's share of each
// head, and Gemma 3's parameters per layer kind (the windowed layers' base
// its rope_local_base_freq). Keys given both ways must agree; another
// model's windowed layers turning otherwise than its full ones, or scaled,
// are named.
TEST(HfConfig, Transformers5RopeParametersReadAsTheOlderKeys) {
  auto same = [](const std::string& older, const std::string& newer) {
    const nn::GptConfig a = gpt_config_from_hf(older, "older/config.json");
    const nn::GptConfig b = gpt_config_from_hf(newer, "newer/config.json");
    EXPECT_EQ(hf_config_json(b), hf_config_json(a));
    return b;
  };
  const std::string llama31 = edited(
      edited(edited(kLlama7b, "rope_theta", "500000.0"), "max_position_embeddings", "131072"),
      "rope_scaling",
      R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192})");
  const nn::GptConfig l =
      same(llama31, with_rope_parameters(llama31, {"rope_theta", "rope_scaling"},
                                         R"({"rope_type": "llama3", "rope_theta": 500000.0,
                                        "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8192})"));
  EXPECT_EQ(l.rope_theta, 500000.0);
  EXPECT_EQ(l.rope_scaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_EQ(l.rope_scaling.original_seq_len, 8192.0);
  // A plain file: rope_type default, the base alone.
  EXPECT_EQ(
      same(kLlama7b, with_rope_parameters(kLlama7b, {"rope_theta", "rope_scaling"},
                                          R"({"rope_type": "default", "rope_theta": 10000.0})"))
          .rope_scaling.kind,
      RopeScaling::Kind::None);
  const std::string qwen25 =
      edited(kQwen2_05b, "rope_scaling",
             R"({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})");
  const nn::GptConfig q =
      same(qwen25, with_rope_parameters(qwen25, {"rope_theta", "rope_scaling"},
                                        R"({"rope_type": "yarn", "rope_theta": 1000000.0,
                                            "factor": 4.0,
                                            "original_max_position_embeddings": 32768})"));
  EXPECT_EQ(q.rope_scaling.kind, RopeScaling::Kind::Yarn);
  const std::string phi3 = phi3_128k();
  nlohmann::json phi3_params = phi3_longrope();
  phi3_params.erase("type");
  phi3_params["rope_type"] = "longrope";
  phi3_params["rope_theta"] = 10000.0;
  phi3_params["original_max_position_embeddings"] = 4096;
  const nn::GptConfig p = same(
      phi3,
      with_rope_parameters(phi3, {"rope_theta", "rope_scaling", "original_max_position_embeddings"},
                           phi3_params.dump()));
  EXPECT_EQ(p.rope_scaling.kind, RopeScaling::Kind::LongRope);
  EXPECT_EQ(p.rope_scaling.original_seq_len, 4096.0);
  EXPECT_EQ(p.rope_scaling.factor, 32.0);
  const std::string pythia = R"({
    "model_type": "gpt_neox", "hidden_act": "gelu", "hidden_size": 768,
    "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
    "num_attention_heads": 12, "num_hidden_layers": 12, "rotary_emb_base": 10000,
    "rotary_pct": 0.25, "tie_word_embeddings": false, "use_parallel_residual": true,
    "vocab_size": 50304})";
  EXPECT_EQ(same(pythia, with_rope_parameters(pythia, {"rotary_emb_base", "rotary_pct"},
                                              R"({"rope_type": "default", "rope_theta": 10000,
                                                  "partial_rotary_factor": 0.25})"))
                .rope_dim,
            16);
  // Gemma 3: per layer kind, the windowed layers' base their own.
  const nn::GptConfig g = same(
      kGemma3_1b,
      with_rope_parameters(kGemma3_1b, {"rope_theta", "rope_scaling", "rope_local_base_freq"},
                           R"({"full_attention": {"rope_type": "default", "rope_theta": 1000000},
                               "sliding_attention": {"rope_type": "default",
                                                     "rope_theta": 10000}})"));
  EXPECT_EQ(g.rope_theta, 1e6);
  EXPECT_EQ(g.rope_local_theta, 1e4);
  const std::string gemma3_4b =
      edited(kGemma3_1b, "rope_scaling", R"({"rope_type": "linear", "factor": 8.0})");
  EXPECT_EQ(same(gemma3_4b, with_rope_parameters(
                                gemma3_4b, {"rope_theta", "rope_scaling", "rope_local_base_freq"},
                                R"({"full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000000},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000}})"))
                .rope_scaling.factor,
            8.0);
  // Disagreements and what Triad does not build.
  EXPECT_NE(error_of(with_rope_parameters(kLlama7b, {"rope_scaling"},
                                          R"({"rope_type": "default", "rope_theta": 500000.0})"))
                .find("'rope_theta' (10000.0) and rope_parameters' rope_theta (500000.0) disagree"),
            std::string::npos);
  EXPECT_NE(error_of(with_rope_parameters(llama31, {"rope_theta"},
                                          R"({"rope_type": "llama3", "rope_theta": 500000.0,
                                              "factor": 4.0})"))
                .find("'rope_scaling.factor' (8.0) and rope_parameters' factor (4.0) disagree"),
            std::string::npos);
  EXPECT_NE(error_of(with_rope_parameters(kLlama7b, {"rope_theta"}, "[1, 2]"))
                .find("'rope_parameters' ([1,2]): expected an object"),
            std::string::npos);
  const std::string windowed =
      edited(edited(kLlama7b, "sliding_window", "512"), "layer_types",
             nlohmann::json(std::vector<std::string>(32, "sliding_attention")).dump());
  EXPECT_NE(error_of(with_rope_parameters(
                         windowed, {"rope_theta"},
                         R"({"full_attention": {"rope_type": "default", "rope_theta": 10000},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 500}})"))
                .find("'rope_parameters.sliding_attention' ({\"rope_theta\":500,\"rope_type\":"
                      "\"default\"}): a llama's windowed layers turn as its full ones do"),
            std::string::npos);
  EXPECT_NE(error_of(with_rope_parameters(
                         kGemma3_1b, {"rope_theta", "rope_local_base_freq"},
                         R"({"full_attention": {"rope_type": "default", "rope_theta": 1000000},
                             "sliding_attention": {"rope_type": "linear", "factor": 2.0}})"))
                .find("the windowed layers' RoPE turns unscaled in Triad"),
            std::string::npos);
}

TEST(HfConfig, Gpt2ConfigIsTheDefaultGpt2) {
  const nn::GptConfig c = gpt_config_from_hf(
      R"({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
          "vocab_size": 50257, "layer_norm_epsilon": 1e-05, "activation_function": "gelu_new",
          "n_inner": null})",
      "gpt2/config.json");
  const nn::GptConfig want;  // Triad's defaults are GPT-2 124M
  EXPECT_EQ(c.num_parameters(), want.num_parameters());
  EXPECT_EQ(c.num_parameters(), 124'439'808);
  EXPECT_FALSE(c.rotary());
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_TRUE(c.linear_bias);
}

// Pythia 160M's config.json as published: GPT-NeoX's blocks (the parallel
// residual, the exact GELU, a quarter of each head turned, an untied head)
// and the paper's parameter count. Newer transformers' names for the
// rotation (partial_rotary_factor, rope_theta) read the same; a sequential
// file, a tanh GELU, and what Triad does not build are named.
TEST(HfConfig, GptNeoxConfigIsPythias) {
  const std::string pythia = R"({
    "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
    "hidden_act": "gelu", "hidden_size": 768, "initializer_range": 0.02,
    "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
    "model_type": "gpt_neox", "num_attention_heads": 12, "num_hidden_layers": 12,
    "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": false,
    "torch_dtype": "float16", "transformers_version": "4.24.0", "use_cache": true,
    "use_parallel_residual": true, "vocab_size": 50304})";
  const nn::GptConfig c = gpt_config_from_hf(pythia, "pythia-160m/config.json");
  EXPECT_EQ(c.hf_type, "gpt_neox");
  EXPECT_EQ(c.num_parameters(), 162'322'944);
  EXPECT_TRUE(c.parallel_residual);
  EXPECT_EQ(c.activation, nn::Activation::GeluErf);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_TRUE(c.linear_bias);
  EXPECT_FALSE(c.rms_norm());
  EXPECT_EQ(c.seq_len, 2048);

  nlohmann::json newer = nlohmann::json::parse(pythia);
  newer.erase("rotary_pct");
  newer.erase("rotary_emb_base");
  newer["partial_rotary_factor"] = 0.5;
  newer["rope_theta"] = 500.0;
  const nn::GptConfig n = gpt_config_from_hf(newer.dump(), "newer/config.json");
  EXPECT_EQ(n.rope_dim, 32);
  EXPECT_EQ(n.rope_theta, 500.0);
  // Left out: GPTNeoXConfig's defaults (a quarter of each head, parallel).
  const nn::GptConfig d =
      gpt_config_from_hf(without(without(pythia, "rotary_pct"), "use_parallel_residual"), "d");
  EXPECT_EQ(d.rope_dim, 16);
  EXPECT_TRUE(d.parallel_residual);
  EXPECT_FALSE(
      gpt_config_from_hf(edited(pythia, "use_parallel_residual", "false"), "s").parallel_residual);
  EXPECT_EQ(gpt_config_from_hf(edited(pythia, "hidden_act", "\"gelu_new\""), "t").activation,
            nn::Activation::Gelu);
  EXPECT_EQ(gpt_config_from_hf(edited(pythia, "rotary_pct", "1.0"), "w").rope_dim, 0);

  EXPECT_NE(error_of(edited(pythia, "attention_bias", "false"))
                .find("'attention_bias' (false): Triad's GPT-NeoX blocks have biases on every "
                      "linear layer"),
            std::string::npos);
  EXPECT_NE(error_of(edited(pythia, "hidden_act", "\"relu\""))
                .find("'hidden_act' (\"relu\"): expected gelu (exact), gelu_new or "
                      "gelu_pytorch_tanh (tanh)"),
            std::string::npos);
  EXPECT_NE(error_of(edited(pythia, "rotary_pct", "0"))
                .find("'rotary_pct' (0) must be a share of the head in (0, 1]"),
            std::string::npos);
  // GPT-2's exact GELU reads as gelu_erf too.
  EXPECT_EQ(gpt_config_from_hf(R"({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2,
                                   "n_positions": 32, "vocab_size": 100,
                                   "activation_function": "gelu"})",
                               "g")
                .activation,
            nn::Activation::GeluErf);
}

// Phi-2's config.json as published: the parallel residual with one norm, a
// biased untied head, 40% of each head turned (32 of 80), and its
// published parameter count; what Triad does not build is named.
TEST(HfConfig, PhiConfigIsPhi2s) {
  const std::string phi2 = R"({
    "architectures": ["PhiForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 50256,
    "embd_pdrop": 0.0, "eos_token_id": 50256, "hidden_act": "gelu_new", "hidden_size": 2560,
    "initializer_range": 0.02, "intermediate_size": 10240, "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048, "model_type": "phi", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "partial_rotary_factor": 0.4,
    "qk_layernorm": false, "resid_pdrop": 0.1, "rope_scaling": null, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "torch_dtype": "float16", "transformers_version": "4.37.0",
    "use_cache": true, "vocab_size": 51200})";
  const nn::GptConfig c = gpt_config_from_hf(phi2, "phi-2/config.json");
  EXPECT_EQ(c.hf_type, "phi");
  EXPECT_EQ(c.num_parameters(), 2'779'683'840);
  EXPECT_TRUE(c.parallel_residual);
  EXPECT_TRUE(c.shared_norm);
  EXPECT_TRUE(c.head_bias);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_TRUE(c.linear_bias);
  EXPECT_FALSE(c.rms_norm());
  EXPECT_EQ(c.activation, nn::Activation::Gelu);
  EXPECT_EQ(c.rope_dim, 32);
  EXPECT_EQ(c.kv_heads(), 32);
  EXPECT_EQ(c.seq_len, 2048);
  // Left out: PhiConfig's half of each head; grouped key/value heads read.
  const nn::GptConfig d = gpt_config_from_hf(
      edited(without(phi2, "partial_rotary_factor"), "num_key_value_heads", "8"), "d");
  EXPECT_EQ(d.rope_dim, 40);
  EXPECT_EQ(d.kv_heads(), 8);
  EXPECT_NE(error_of(edited(phi2, "qk_layernorm", "true"))
                .find("'qk_layernorm' (true): Phi's per-head LayerNorms are not implemented"),
            std::string::npos);
  EXPECT_NE(error_of(edited(phi2, "tie_word_embeddings", "true"))
                .find("model.head_bias: a bias on the logits needs an untied head"),
            std::string::npos);
}

// GLM-4.5-Air's and GLM-4.5's config.json as published: LLaMA's blocks
// with q, k and v biases, half of each head turned (in halves), GLM-4.5's
// query/key norms, the first layers dense, then DeepSeek-V3's router
// (sigmoid scores, the expert biases, groups, the gates scaled) over the
// routed experts and a shared one; their counts, total and active (106B
// and 12B besides the embeddings for Air; 353B without the prediction
// layer for GLM-4.5). Bad counts are named.
TEST(HfConfig, Glm4MoeConfigsAreDeepSeekV3Mixtures) {
  const std::string air = R"({
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
    "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "partial_rotary_factor": 0.5,
    "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 131072,
    "model_type": "glm4_moe", "moe_intermediate_size": 1408, "norm_topk_prob": true,
    "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
    "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8,
    "first_k_dense_replace": 1, "num_hidden_layers": 46, "num_key_value_heads": 8,
    "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 1000000, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "use_qk_norm": false, "vocab_size": 151552})";
  const nn::GptConfig a = gpt_config_from_hf(air, "GLM-4.5-Air/config.json");
  EXPECT_EQ(a.hf_type, "glm4_moe");
  EXPECT_TRUE(a.qkv_bias);
  EXPECT_FALSE(a.qk_norm);
  EXPECT_EQ(a.head_dim(), 128);
  EXPECT_EQ(a.rope_dim, 64);
  EXPECT_EQ(a.kv_heads(), 8);
  EXPECT_EQ(a.ffn(), 10944);
  EXPECT_EQ(a.moe.experts, 128);
  EXPECT_EQ(a.moe.top_k, 8);
  EXPECT_EQ(a.expert_ffn(), 1408);
  EXPECT_EQ(a.moe.shared_ffn_hidden_size, 1408);
  EXPECT_FALSE(a.moe.shared_gate);
  EXPECT_EQ(a.moe.dense_layers, std::vector<int64_t>{0});
  EXPECT_EQ(a.moe.score, nn::GptConfig::Moe::Score::Sigmoid);
  EXPECT_TRUE(a.moe.expert_bias);
  EXPECT_EQ(a.moe.groups, 1);
  EXPECT_TRUE(a.moe.normalize_top_k);
  EXPECT_DOUBLE_EQ(a.moe.routed_scaling_factor, 1.0);
  EXPECT_EQ(a.moe.aux_loss_coef, 0.0);
  EXPECT_EQ(a.num_parameters(), 106'852'251'264);
  EXPECT_DOUBLE_EQ(a.active_parameter_count(), 13'424'129'664.0);
  EXPECT_EQ(std::string(hf_architecture(a)), "Glm4MoeForCausalLM");
  const std::string full =
      edited(edited(edited(edited(edited(edited(edited(edited(air, "hidden_size", "5120"),
                                                       "num_hidden_layers", "92"),
                                                "intermediate_size", "12288"),
                                         "moe_intermediate_size", "1536"),
                                  "n_routed_experts", "160"),
                           "first_k_dense_replace", "3"),
                    "routed_scaling_factor", "2.5"),
             "use_qk_norm", "true");
  const nn::GptConfig g = gpt_config_from_hf(full, "GLM-4.5/config.json");
  EXPECT_TRUE(g.qk_norm);
  EXPECT_EQ(g.moe.dense_layers, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_DOUBLE_EQ(g.moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(g.num_parameters(), 352'797'829'024);
  EXPECT_DOUBLE_EQ(g.active_parameter_count(), 33'632'266'144.0);
  // DeepSeek-V3's groups: 8 of 32 experts each, the best 4 open.
  const nn::GptConfig grouped = gpt_config_from_hf(
      edited(edited(edited(air, "n_routed_experts", "256"), "n_group", "8"), "topk_group", "4"),
      "g");
  EXPECT_EQ(grouped.moe.groups, 8);
  EXPECT_EQ(grouped.moe.top_groups, 4);
  // Left out: GLM-4.5's defaults (no q, k and v biases, one dense layer,
  // one shared expert).
  const nn::GptConfig bare = gpt_config_from_hf(
      without(without(without(air, "attention_bias"), "first_k_dense_replace"), "n_shared_experts"),
      "b");
  EXPECT_FALSE(bare.qkv_bias);
  EXPECT_EQ(bare.moe.dense_layers, std::vector<int64_t>{0});
  EXPECT_EQ(bare.moe.shared_ffn_hidden_size, 1408);
  EXPECT_NE(error_of(edited(air, "n_group", "3"))
                .find("'n_group' (3) must divide n_routed_experts into groups of at least 2"),
            std::string::npos);
  EXPECT_NE(error_of(edited(air, "n_shared_experts", "-1"))
                .find("'n_shared_experts' (-1) must be a count >= 0"),
            std::string::npos);
  EXPECT_NE(error_of(edited(air, "topk_group", "2"))
                .find("model.moe.top_groups (2) must be in [1, model.moe.groups (1)]"),
            std::string::npos);
}

// MiniMax-M2's config.json as published (fp8 blocks, their format named
// float8_e4m3fn): LLaMA's blocks with one RMSNorm over all 48 query heads
// and one over the 8 key heads, heads of 128 of which the first 64 turn,
// RoPE's base 5e6, and 256 experts on every layer, 8 chosen by biased
// sigmoid scores, renormalised; no load-balancing loss (the biases
// balance). Its 229B parameters (230B with the prediction modules) and 10B
// active besides the embeddings. What its class does not build is named.
TEST(HfConfig, MiniMaxM2ConfigIsABiasedSigmoidMixtureWithNormsOverAllHeads) {
  const std::string m2 = R"({
    "architectures": ["MiniMaxM2ForCausalLM"], "attn_type_list": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
      1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
      1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 1536,
    "layernorm_full_attention_beta": 1.0, "layernorm_linear_attention_beta": 1.0,
    "layernorm_mlp_beta": 1.0, "max_position_embeddings": 196608, "mlp_intermediate_size": 8192,
    "model_type": "minimax_m2", "mtp_transformer_layers": 1, "num_attention_heads": 48,
    "num_experts_per_tok": 8, "num_hidden_layers": 62, "num_key_value_heads": 8,
    "num_local_experts": 256, "num_mtp_modules": 3, "output_router_logits": false,
    "qk_norm_type": "per_layer", "rms_norm_eps": 1e-06, "rope_theta": 5000000, "rotary_dim": 64,
    "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "scoring_func": "sigmoid",
    "shared_intermediate_size": 0, "shared_moe_mode": "sigmoid", "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true, "use_mtp": true,
    "use_qk_norm": true, "use_routing_bias": true, "vocab_size": 200064,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn",
      "quant_method": "fp8", "weight_block_size": [128, 128],
      "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]}})";
  const nn::GptConfig c = gpt_config_from_hf(m2, "MiniMax-M2/config.json");
  EXPECT_EQ(c.hf_type, "minimax_m2");
  EXPECT_TRUE(c.qk_norm_full);
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.kv_heads(), 8);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.moe.experts, 256);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.expert_ffn(), 1536);
  EXPECT_TRUE(c.moe.dense_layers.empty());
  EXPECT_EQ(c.moe.shared_ffn_hidden_size, 0);
  EXPECT_EQ(c.moe.score, nn::GptConfig::Moe::Score::Sigmoid);
  EXPECT_TRUE(c.moe.expert_bias);
  EXPECT_EQ(c.moe.groups, 1);
  EXPECT_TRUE(c.moe.normalize_top_k);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling_factor, 1.0);
  EXPECT_EQ(c.moe.aux_loss_coef, 0.0);
  // Per layer 3,668,718,848: attention 44,040,192 (q and o 3072 x 6144
  // each, k and v 3072 x 1024 each), its norms 7168, the block's two 3072,
  // the router 786,432 and its 256 biases, 256 experts of 3 x 3072 x 1536;
  // the two embeddings 614,596,608 each and the final norm.
  EXPECT_EQ(c.num_parameters(), 228'689'764'864);
  // (8 of the 256 experts a token: 248 idle in each layer.)
  EXPECT_DOUBLE_EQ(c.active_parameter_count(), 11'030'553'088.0);
  EXPECT_EQ(std::string(hf_architecture(c)), "MiniMaxM2ForCausalLM");
  // transformers' share of the head in place of rotary_dim, or beside it.
  const nn::GptConfig shared =
      gpt_config_from_hf(edited(without(m2, "rotary_dim"), "partial_rotary_factor", "0.5"), "s");
  EXPECT_EQ(shared.rope_dim, 64);
  EXPECT_EQ(gpt_config_from_hf(edited(m2, "partial_rotary_factor", "0.5"), "s").rope_dim, 64);
  EXPECT_EQ(gpt_config_from_hf(edited(m2, "rotary_dim", "128"), "s").rope_dim, 0);
  EXPECT_NE(error_of(edited(m2, "partial_rotary_factor", "0.25"))
                .find("'partial_rotary_factor' (0.25) disagrees with rotary_dim (64 of 128)"),
            std::string::npos);
  EXPECT_NE(error_of(edited(m2, "rotary_dim", "63"))
                .find("'rotary_dim' (63) must be an even width of at most head_dim (128)"),
            std::string::npos);
  EXPECT_NE(error_of(edited(m2, "attn_type_list", "[0, 1]"))
                .find("MiniMax-01's linear (lightning) attention is not built"),
            std::string::npos);
  EXPECT_NE(error_of(edited(m2, "qk_norm_type", "\"per_head\"")).find("'qk_norm_type'"),
            std::string::npos);
  EXPECT_NE(error_of(edited(m2, "use_qk_norm", "false")).find("'use_qk_norm'"), std::string::npos);
  EXPECT_NE(error_of(edited(m2, "scoring_func", "\"softmax\""))
                .find("MiniMax-M2's experts are scored by sigmoids"),
            std::string::npos);
  EXPECT_NE(error_of(edited(m2, "use_grouped_topk", "true")).find("'use_grouped_topk'"),
            std::string::npos);
  EXPECT_NE(error_of(edited(m2, "routed_scaling_factor", "2.0")).find("leaves its gates unscaled"),
            std::string::npos);
  EXPECT_NE(error_of(edited(m2, "router_jitter_noise", "0.01")).find("'router_jitter_noise'"),
            std::string::npos);
  EXPECT_NE(error_of(edited(m2, "shared_intermediate_size", "1536"))
                .find("MiniMax-M2's class has no shared expert"),
            std::string::npos);
  EXPECT_NE(error_of(edited(m2, "quantization_config", R"({"quant_method": "fp8", "fmt": "e5m2"})"))
                .find("'quantization_config'"),
            std::string::npos);
}

// DeepSeek-V3's config.json as published (its fp8 blocks read back to full
// precision by init.from, tests/io/quantized_weights_test.cpp):
// LLaMA's blocks with multi-head latent attention (128 heads, queries
// through a latent of 1536, keys and values through one of 512, queries and
// keys 128 + 64 wide, values 128) and yarn with DeepSeek's mscales (both 1:
// the rotation's factor 1, the scores times (0.1 ln 40 + 1)^2); its three
// dense layers, then 256 experts in 8 groups, the top 8 among the best 4
// groups, renormalised and times 2.5, one shared expert. Its published 671B
// parameters and 37B active (the prediction layer apart). Kimi K2's files
// (model_type kimi_k2) are the same class: its published 1T and 32B.
TEST(HfConfig, DeepseekV3ConfigIsLatentAttentionWithItsMixture) {
  const std::string v3 = R"({
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1,
    "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]},
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "seq_aux": true, "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})";
  const nn::GptConfig d = gpt_config_from_hf(v3, "DeepSeek-V3/config.json");
  EXPECT_EQ(d.hf_type, "deepseek_v3");
  EXPECT_TRUE(d.latent_attention());
  EXPECT_EQ(d.mla, (nn::GptConfig::Mla{.kv_lora_rank = 512,
                                       .q_lora_rank = 1536,
                                       .qk_nope_head_dim = 128,
                                       .qk_rope_head_dim = 64,
                                       .v_head_dim = 128,
                                       .mscale_all_dim = 1.0}));
  EXPECT_EQ(d.head_dim(), 192);
  EXPECT_EQ(d.kv_heads(), 128);
  EXPECT_EQ(d.rope_scaling.kind, RopeScaling::Kind::Yarn);
  EXPECT_DOUBLE_EQ(d.rope_scaling.factor, 40.0);
  EXPECT_DOUBLE_EQ(d.rope_scaling.attention_factor, 1.0);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_DOUBLE_EQ(d.latent_query_factor(), m * m);
  EXPECT_EQ(d.moe.experts, 256);
  EXPECT_EQ(d.moe.top_k, 8);
  EXPECT_EQ(d.moe.groups, 8);
  EXPECT_EQ(d.moe.top_groups, 4);
  EXPECT_DOUBLE_EQ(d.moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(d.moe.dense_layers, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(d.moe.shared_ffn_hidden_size, 2048);
  EXPECT_FALSE(d.tie_embeddings);
  EXPECT_EQ(d.num_parameters(), 671'026'419'200);
  EXPECT_DOUBLE_EQ(d.active_parameter_count(), 37'552'297'472.0);
  EXPECT_EQ(std::string(hf_architecture(d)), "DeepseekV3ForCausalLM");
  const nn::GptConfig planned =
      plan::load_model_spec(std::string(TRIAD_SOURCE_DIR) + "/configs/models/deepseek_v3.yaml");
  EXPECT_EQ(planned.mla.kv_lora_rank, 512);
  EXPECT_EQ(planned.num_parameters(), d.num_parameters());
  // Kimi K2's: 64 heads, 384 experts in one group, one dense layer.
  const std::string k2 =
      edited(edited(edited(edited(edited(edited(edited(v3, "model_type", "\"kimi_k2\""),
                                                "num_attention_heads", "64"),
                                         "num_key_value_heads", "64"),
                                  "n_routed_experts", "384"),
                           "n_group", "1"),
                    "topk_group", "1"),
             "first_k_dense_replace", "1");
  const nn::GptConfig kimi = gpt_config_from_hf(edited(k2, "vocab_size", "163840"), "K2");
  EXPECT_EQ(kimi.hf_type, "deepseek_v3");
  EXPECT_EQ(kimi.num_parameters(), 1'026'408'232'448);
  EXPECT_DOUBLE_EQ(kimi.active_parameter_count(), 32'861'500'928.0);
  // Queries straight from x (DeepSeek-V2-Lite's q_lora_rank null).
  const nn::GptConfig direct = gpt_config_from_hf(edited(v3, "q_lora_rank", "null"), "q");
  EXPECT_EQ(direct.mla.q_lora_rank, 0);
  EXPECT_EQ(nn::gpt_parameter_shapes(direct).at("h.0.attn.q_proj.weight"),
            (Shape{128 * 192, 7168}));
  // DeepseekV3Config's defaults when the keys are left out.
  const nn::GptConfig bare = gpt_config_from_hf(
      without(without(without(without(v3, "kv_lora_rank"), "n_group"), "first_k_dense_replace"),
              "routed_scaling_factor"),
      "b");
  EXPECT_EQ(bare.mla.kv_lora_rank, 512);
  EXPECT_EQ(bare.moe.groups, 8);
  EXPECT_EQ(bare.moe.dense_layers.size(), 3u);
  EXPECT_DOUBLE_EQ(bare.moe.routed_scaling_factor, 2.5);
  // What Triad does not build is named.
  EXPECT_NE(error_of(edited(v3, "rope_interleave", "false")).find("'rope_interleave' (false)"),
            std::string::npos);
  EXPECT_NE(error_of(edited(v3, "topk_method", "\"greedy\""))
                .find("'topk_method' (\"greedy\"): DeepSeek-V3's routing is noaux_tc"),
            std::string::npos);
  EXPECT_NE(error_of(edited(v3, "q_lora_rank", "0")).find("'q_lora_rank' (0) must be positive"),
            std::string::npos);
}

// DeepSeek-V2-Lite's config.json as published: latent attention without a
// query latent (16 heads, q_proj straight from the input), yarn with
// DeepSeek's mscales, one dense layer, then 64 experts of 1408 under a
// softmax, the top 6 greedy, not renormalised, two shared experts; the
// sequence-wise balance loss at 0.001. Its published 15.7B parameters, 2.66B
// active (the published 2.4B leaves the token embedding out). DeepSeek-V2's
// (236B, 21B active): group_limited_greedy over 8 groups, the best 3,
// scored by their best expert, the gates times 16.
TEST(HfConfig, DeepseekV2ConfigIsLatentAttentionWithDeepSeekMoe) {
  const std::string lite = R"({
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 100000,
    "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "pretraining_tp": 1, "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "seq_aux": true, "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy",
    "torch_dtype": "bfloat16", "use_cache": true, "v_head_dim": 128, "vocab_size": 102400})";
  const nn::GptConfig d = gpt_config_from_hf(lite, "DeepSeek-V2-Lite/config.json");
  EXPECT_EQ(d.hf_type, "deepseek_v2");
  EXPECT_EQ(d.mla.q_lora_rank, 0);
  EXPECT_EQ(d.mla.kv_lora_rank, 512);
  EXPECT_DOUBLE_EQ(d.mla.mscale_all_dim, 0.707);
  EXPECT_DOUBLE_EQ(d.rope_scaling.attention_factor, 1.0);
  EXPECT_EQ(d.moe.score, nn::GptConfig::Moe::Score::Softmax);
  EXPECT_FALSE(d.moe.normalize_top_k);
  EXPECT_FALSE(d.moe.expert_bias);
  EXPECT_EQ(d.moe.groups, 1);
  EXPECT_EQ(d.moe.experts, 64);
  EXPECT_EQ(d.moe.top_k, 6);
  EXPECT_EQ(d.moe.shared_ffn_hidden_size, 2 * 1408);
  EXPECT_EQ(d.moe.dense_layers, std::vector<int64_t>{0});
  EXPECT_DOUBLE_EQ(d.moe.aux_loss_coef, 0.001);
  EXPECT_EQ(d.moe.aux_loss_scope, nn::GptConfig::Moe::BalanceScope::Sequence);
  EXPECT_EQ(d.num_parameters(), 15'706'484'224);
  EXPECT_DOUBLE_EQ(d.active_parameter_count(), 2'661'150'208.0);
  EXPECT_EQ(std::string(hf_architecture(d)), "DeepseekV2ForCausalLM");
  const std::string v2 = edited(
      edited(
          edited(
              edited(edited(edited(edited(edited(edited(edited(edited(lite, "hidden_size", "5120"),
                                                               "intermediate_size", "12288"),
                                                        "q_lora_rank", "1536"),
                                                 "num_attention_heads", "128"),
                                          "num_key_value_heads", "128"),
                                   "num_hidden_layers", "60"),
                            "moe_intermediate_size", "1536"),
                     "n_routed_experts", "160"),
              "n_group", "8"),
          "topk_group", "3"),
      "topk_method", "\"group_limited_greedy\"");
  const nn::GptConfig big = gpt_config_from_hf(edited(v2, "routed_scaling_factor", "16.0"), "V2");
  EXPECT_EQ(big.moe.groups, 8);
  EXPECT_EQ(big.moe.top_groups, 3);
  EXPECT_EQ(big.moe.group_score, nn::GptConfig::Moe::GroupScore::Max);
  EXPECT_DOUBLE_EQ(big.moe.routed_scaling_factor, 16.0);
  EXPECT_NEAR(big.parameter_count() / 1e9, 235.7, 0.05);
  EXPECT_NEAR(big.active_parameter_count() / 1e9, 21.4, 0.05);
  // What differs from DeepSeek-V2's published routing is named.
  EXPECT_NE(error_of(edited(lite, "norm_topk_prob", "true")).find("'norm_topk_prob' (true)"),
            std::string::npos);
  EXPECT_NE(error_of(edited(lite, "topk_method", "\"noaux_tc\""))
                .find("DeepSeek-V2 routes greedy or group_limited_greedy"),
            std::string::npos);
  EXPECT_NE(error_of(edited(lite, "scoring_func", "\"sigmoid\""))
                .find("DeepSeek-V2's experts are scored by a softmax"),
            std::string::npos);
}

// dots.llm1's config.json as published: Qwen3's blocks (head norms) with
// DeepSeek-V3's mixture after one dense layer (128 experts, top 6
// renormalised and times 2.5, chosen with the expert biases, two experts'
// width shared); its published 142B parameters and 14B active. Without
// layer_types, a sliding_window windows the layers from max_window_layers
// on (Dots1Config reads no use_sliding_window); its shared experts have no
// default.
TEST(HfConfig, Dots1ConfigIsQwen3WithDeepSeekV3sMixture) {
  const std::string dots = R"({
    "architectures": ["Dots1ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 32768,
    "max_window_layers": 62, "model_type": "dots1", "moe_intermediate_size": 1408,
    "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 2,
    "norm_topk_prob": true, "num_attention_heads": 32, "num_experts_per_tok": 6,
    "num_hidden_layers": 62, "num_key_value_heads": 32, "rms_norm_eps": 1e-05,
    "rope_scaling": null, "rope_theta": 10000000, "routed_scaling_factor": 2.5,
    "sliding_window": null, "tie_word_embeddings": false, "topk_group": 1,
    "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 152064})";
  const nn::GptConfig d = gpt_config_from_hf(dots, "dots.llm1/config.json");
  EXPECT_EQ(d.hf_type, "dots1");
  EXPECT_TRUE(d.qk_norm);
  EXPECT_FALSE(d.qkv_bias);
  EXPECT_EQ(d.rope_dim, 0);
  EXPECT_EQ(d.sliding_window, 0);
  EXPECT_EQ(d.moe.experts, 128);
  EXPECT_EQ(d.moe.top_k, 6);
  EXPECT_TRUE(d.moe.normalize_top_k);
  EXPECT_EQ(d.moe.shared_ffn_hidden_size, 2 * 1408);
  EXPECT_EQ(d.moe.dense_layers, std::vector<int64_t>{0});
  EXPECT_EQ(d.moe.score, nn::GptConfig::Moe::Score::Sigmoid);
  EXPECT_TRUE(d.moe.expert_bias);
  EXPECT_DOUBLE_EQ(d.moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(d.num_parameters(), 142'774'381'696);
  EXPECT_DOUBLE_EQ(d.active_parameter_count(), 14'016'588'928.0);
  EXPECT_EQ(std::string(hf_architecture(d)), "Dots1ForCausalLM");
  // Dots1Config's defaults: no dense layer, not renormalised.
  const nn::GptConfig bare =
      gpt_config_from_hf(without(without(dots, "first_k_dense_replace"), "norm_topk_prob"), "d");
  EXPECT_TRUE(bare.moe.dense_layers.empty());
  EXPECT_FALSE(bare.moe.normalize_top_k);
  const nn::GptConfig windowed = gpt_config_from_hf(
      edited(edited(edited(dots, "sliding_window", "4096"), "max_window_layers", "60"),
             "max_position_embeddings", "8192"),
      "w");
  EXPECT_EQ(windowed.sliding_window, 4096);
  EXPECT_EQ(windowed.full_attention_layers.size(), 60u);
  EXPECT_NE(error_of(without(dots, "n_shared_experts")).find("n_shared_experts"),
            std::string::npos);
  EXPECT_NE(error_of(edited(dots, "attention_bias", "true")).find("'attention_bias' (true)"),
            std::string::npos);
}

// Mixtral 8x7B's and Qwen3-30B-A3B's config.json as published: their
// mixtures (experts, top k, the experts' width, Qwen's renormalisation and
// dense layers) and their published parameter counts, total and active;
// what Triad does not build (a noisy router, Qwen2-MoE's shared expert) is
// named.
TEST(HfConfig, MixtralAndQwen3MoeConfigsAreTheirMixtures) {
  const std::string mixtral = R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})";
  const nn::GptConfig m = gpt_config_from_hf(mixtral, "Mixtral-8x7B/config.json");
  EXPECT_EQ(m.hf_type, "mixtral");
  EXPECT_EQ(m.moe.experts, 8);
  EXPECT_EQ(m.moe.top_k, 2);
  EXPECT_TRUE(m.moe.normalize_top_k);
  EXPECT_EQ(m.expert_ffn(), 14336);
  EXPECT_TRUE(m.moe.dense_layers.empty());
  EXPECT_DOUBLE_EQ(m.moe.aux_loss_coef, 0.02);
  EXPECT_EQ(m.sliding_window, 0);
  EXPECT_EQ(m.num_parameters(), 46'702'792'704);
  EXPECT_DOUBLE_EQ(m.active_parameter_count(), 12'879'925'248.0);
  EXPECT_EQ(std::string(hf_architecture(m)), "MixtralForCausalLM");
  const std::string qwen = R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})";
  const nn::GptConfig q = gpt_config_from_hf(qwen, "Qwen3-30B-A3B/config.json");
  EXPECT_EQ(q.hf_type, "qwen3_moe");
  EXPECT_TRUE(q.qk_norm);
  EXPECT_EQ(q.head_dim(), 128);
  EXPECT_EQ(q.moe.experts, 128);
  EXPECT_EQ(q.moe.top_k, 8);
  EXPECT_EQ(q.expert_ffn(), 768);
  EXPECT_EQ(q.ffn(), 6144);
  EXPECT_TRUE(q.moe.normalize_top_k);
  EXPECT_EQ(q.num_parameters(), 30'532'122'624);
  EXPECT_DOUBLE_EQ(q.active_parameter_count(), 3'353'032'704.0);
  // Dense layers: mlp_only_layers, and every layer but each
  // decoder_sparse_step-th.
  const nn::GptConfig sparse_every_2 = gpt_config_from_hf(
      edited(edited(qwen, "decoder_sparse_step", "2"), "mlp_only_layers", "[1, 4]"), "q");
  std::vector<int64_t> dense;
  for (int64_t i = 0; i < 48; i += 2) dense.push_back(i);
  dense.insert(dense.begin() + 1, 1);
  dense.insert(dense.begin() + 3, 4);
  dense.erase(std::unique(dense.begin(), dense.end()), dense.end());
  EXPECT_EQ(sparse_every_2.moe.dense_layers, dense);
  EXPECT_FALSE(gpt_config_from_hf(without(qwen, "norm_topk_prob"), "q").moe.normalize_top_k);
  EXPECT_NE(error_of(edited(mixtral, "router_jitter_noise", "0.1"))
                .find("'router_jitter_noise' (0.1): Triad's routers take the tokens without "
                      "jitter; set it to 0"),
            std::string::npos);
  EXPECT_NE(error_of(edited(qwen, "mlp_only_layers", "[48]"))
                .find("model.moe.dense_layers: 48 at position 0"),
            std::string::npos);
  EXPECT_NE(error_of(edited(mixtral, "num_experts_per_tok", "9"))
                .find("'num_experts_per_tok' (9) must be between 1 and the number of experts"),
            std::string::npos);
  // Qwen1.5-MoE-A2.7B (Qwen2-MoE): 60 experts, 4 chosen without
  // renormalising, and a shared expert of 5632 gated by a sigmoid; its
  // published 14.3B parameters, 2.7B active.
  const std::string qwen2 = R"({
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192,
    "max_window_layers": 21, "model_type": "qwen2_moe", "moe_intermediate_size": 1408,
    "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 60,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 5632,
    "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";
  const nn::GptConfig q2 = gpt_config_from_hf(qwen2, "Qwen1.5-MoE-A2.7B/config.json");
  EXPECT_EQ(q2.hf_type, "qwen2_moe");
  EXPECT_EQ(q2.moe.experts, 60);
  EXPECT_EQ(q2.moe.top_k, 4);
  EXPECT_FALSE(q2.moe.normalize_top_k);
  EXPECT_EQ(q2.expert_ffn(), 1408);
  EXPECT_EQ(q2.moe.shared_ffn_hidden_size, 5632);
  EXPECT_TRUE(q2.moe.shared_gate);
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_EQ(q2.sliding_window, 0);
  EXPECT_EQ(q2.num_parameters(), 14'315'784'192);
  EXPECT_DOUBLE_EQ(q2.active_parameter_count(), 2'689'173'504.0);
  EXPECT_EQ(std::string(hf_architecture(q2)), "Qwen2MoeForCausalLM");
  EXPECT_NE(error_of(edited(qwen2, "shared_expert_intermediate_size", "0"))
                .find("'shared_expert_intermediate_size' (0) must be positive"),
            std::string::npos);
  EXPECT_NE(error_of(without(qwen2, "shared_expert_intermediate_size"))
                .find("shared_expert_intermediate_size"),
            std::string::npos);
}

// OLMo-7B-hf's config.json as published: LLaMA's blocks with LayerNorms
// that learn nothing (eps 1e-5, which the file does not say); the
// published count (6.89B; OLMo-1B's 1.18B with its tied head), OLMo 7B
// 0424's clip_qkv read, and attention biases or another activation refused.
TEST(HfConfig, OlmoConfigIsItsOwn) {
  const std::string olmo = R"({
    "architectures": ["OlmoForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": null, "clip_qkv": null, "eos_token_id": 50279, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
    "max_position_embeddings": 2048, "model_type": "olmo", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "pad_token_id": 1, "pretraining_tp": 1,
    "rope_scaling": null, "rope_theta": 10000.0, "tie_word_embeddings": false,
    "torch_dtype": "float32", "use_cache": true, "vocab_size": 50304})";
  const nn::GptConfig o = gpt_config_from_hf(olmo, "OLMo-7B-hf/config.json");
  EXPECT_EQ(o.hf_type, "olmo");
  EXPECT_FALSE(o.norm_affine);
  EXPECT_FALSE(o.rms_norm());
  EXPECT_DOUBLE_EQ(o.layer_norm_eps, 1e-5);
  EXPECT_FALSE(o.qk_norm);
  EXPECT_TRUE(o.pre_norms);
  EXPECT_FALSE(o.post_norms);
  EXPECT_TRUE(o.rotary());
  EXPECT_EQ(o.activation, nn::Activation::SwiGlu);
  EXPECT_FALSE(o.linear_bias);
  EXPECT_FALSE(o.tie_embeddings);
  EXPECT_EQ(o.num_parameters(), 6'888'095'744);
  EXPECT_EQ(std::string(hf_architecture(o)), "OlmoForCausalLM");
  std::string one_b =
      edited(edited(edited(olmo, "hidden_size", "2048"), "intermediate_size", "8192"),
             "num_hidden_layers", "16");
  one_b = edited(edited(edited(one_b, "num_attention_heads", "16"), "num_key_value_heads", "16"),
                 "tie_word_embeddings", "true");
  EXPECT_EQ(gpt_config_from_hf(one_b, "OLMo-1B-hf/config.json").num_parameters(), 1'176'764'416);
  EXPECT_EQ(o.clip_qkv, 0.0);  // (null: none)
  // OLMo-7B-0424-hf's clamp.
  EXPECT_EQ(gpt_config_from_hf(edited(olmo, "clip_qkv", "8.0"), "m").clip_qkv, 8.0);
  EXPECT_NE(error_of(edited(olmo, "clip_qkv", "-1")).find("'clip_qkv' (-1)"), std::string::npos);
  EXPECT_NE(error_of(edited(olmo, "attention_bias", "true")).find("attention_bias"),
            std::string::npos);
  EXPECT_NE(error_of(edited(olmo, "hidden_act", "\"gelu\"")).find("hidden_act"), std::string::npos);
}

// c4ai-command-r-v01's config.json: LLaMA's attention and SwiGLU MLP in
// parallel on one LayerNorm without a bias (eps 1e-5), q and k turned in
// interleaved pairs (the weights' reader reorders them), 64 heads of 128,
// a tied head and the logits times 0.0625. Its count by the shapes:
// 256000 x 8192 embeddings, 40 blocks of 4 x 8192^2 + 3 x 8192 x 22528 + 8192
// (one norm), and the final norm's 8192: 34,980,831,232.
TEST(HfConfig, CohereConfigIsItsOwn) {
  const std::string cohere = R"({
    "architectures": ["CohereForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 5, "eos_token_id": 255001, "hidden_act": "silu", "hidden_size": 8192,
    "initializer_range": 0.02, "intermediate_size": 22528, "layer_norm_eps": 1e-05,
    "logit_scale": 0.0625, "max_position_embeddings": 8192, "model_type": "cohere",
    "num_attention_heads": 64, "num_hidden_layers": 40, "num_key_value_heads": 64,
    "pad_token_id": 0, "rope_theta": 8000000.0, "torch_dtype": "float16", "use_cache": true,
    "use_qk_norm": false, "vocab_size": 256000})";
  const nn::GptConfig c = gpt_config_from_hf(cohere, "c4ai-command-r-v01/config.json");
  EXPECT_EQ(c.hf_type, "cohere");
  EXPECT_FALSE(c.rms_norm());
  EXPECT_FALSE(c.norm_bias);
  EXPECT_TRUE(c.norm_affine);
  EXPECT_DOUBLE_EQ(c.layer_norm_eps, 1e-5);
  EXPECT_TRUE(c.parallel_residual);
  EXPECT_TRUE(c.shared_norm);
  EXPECT_EQ(c.activation, nn::Activation::SwiGlu);
  EXPECT_FALSE(c.linear_bias);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.logit_scale, 0.0625);
  EXPECT_EQ(c.rope_theta, 8e6);
  EXPECT_EQ(c.num_parameters(), 34'980'831'232);
  EXPECT_EQ(std::string(hf_architecture(c)), "CohereForCausalLM");
  EXPECT_EQ(gpt_config_from_hf(without(cohere, "logit_scale"), "m").logit_scale, 0.0625);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_NE(error_of(edited(cohere, "logit_scale", "0")).find("'logit_scale' (0)"),
            std::string::npos);
}

// c4ai-command-r-plus' config.json keys (Command R+): Cohere's blocks with
// use_qk_norm, a LayerNorm on each query and key head with weights of its
// own (model.qk_norm: head_layernorm), and grouped-query attention. Its
// count by the shapes: 256000 x 12288 embeddings, 64 blocks of 2 x 12288^2
// + 2 x 12288 x 1024 + 3 x 12288 x 33792 + 12288 (one norm) + 96 x 128 +
// 8 x 128 (the head norms), and the final norm's 12288: 103,810,674,688
// (104B). It exports as CohereForCausalLM with use_qk_norm again.
TEST(HfConfig, CommandRPlusNormsEachHeadWithItsOwnWeights) {
  const std::string plus = R"({
    "architectures": ["CohereForCausalLM"], "attention_bias": false, "bos_token_id": 5,
    "eos_token_id": 255001, "hidden_act": "silu", "hidden_size": 12288,
    "intermediate_size": 33792, "layer_norm_eps": 1e-05, "logit_scale": 0.8333333333333334,
    "max_position_embeddings": 8192, "model_type": "cohere", "num_attention_heads": 96,
    "num_hidden_layers": 64, "num_key_value_heads": 8, "pad_token_id": 0,
    "rope_theta": 75000000.0, "torch_dtype": "float16", "use_qk_norm": true,
    "vocab_size": 256000})";
  const nn::GptConfig c = gpt_config_from_hf(plus, "c4ai-command-r-plus/config.json");
  EXPECT_TRUE(c.qk_norm && c.qk_head_layernorm);
  EXPECT_FALSE(c.qk_norm_full);
  EXPECT_EQ(c.q_norm_width(), 96 * 128);
  EXPECT_EQ(c.k_norm_width(), 8 * 128);
  EXPECT_EQ(c.num_parameters(), 103'810'674'688);
  EXPECT_EQ(std::string(hf_architecture(c)), "CohereForCausalLM");
  const auto j = nlohmann::json::parse(hf_config_json(c, "bfloat16"));
  EXPECT_EQ(j.at("use_qk_norm"), true);
  EXPECT_TRUE(gpt_config_from_hf(hf_config_json(c, "bfloat16"), "back").qk_head_layernorm);
}

// c4ai-command-r7b-12-2024's config.json keys (Cohere 2): Cohere's blocks,
// every sliding_window_pattern-th (4th) layer global and without rope, the
// others windowed (4096 of its 132096 positions). Newer files' layer_types
// say the same; a window as long as the context leaves the layers without
// rope as they are. Its count by the shapes: 8,028,033,024 (8.03B).
TEST(HfConfig, Cohere2GlobalLayersTurnNothing) {
  const std::string r7b = R"({
    "architectures": ["Cohere2ForCausalLM"], "attention_bias": false, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "layer_norm_eps": 1e-05,
    "logit_scale": 0.25, "max_position_embeddings": 132096, "model_type": "cohere2",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rope_theta": 50000.0, "sliding_window": 4096, "sliding_window_pattern": 4,
    "vocab_size": 256000})";
  const nn::GptConfig c = gpt_config_from_hf(r7b, "c4ai-command-r7b-12-2024/config.json");
  EXPECT_EQ(c.hf_type, "cohere2");
  std::vector<int64_t> every_fourth;
  for (int64_t i = 3; i < 32; i += 4) every_fourth.push_back(i);
  EXPECT_EQ(c.nope_layers, every_fourth);
  EXPECT_EQ(c.full_attention_layers, every_fourth);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_FALSE(c.rotary_at(3));
  EXPECT_TRUE(c.rotary_at(4));
  EXPECT_FALSE(c.norm_bias);
  EXPECT_TRUE(c.parallel_residual && c.shared_norm);
  EXPECT_EQ(c.logit_scale, 0.25);
  EXPECT_EQ(c.num_parameters(), 8'028'033'024);
  EXPECT_EQ(std::string(hf_architecture(c)), "Cohere2ForCausalLM");
  std::string kinds = "[";
  for (int64_t i = 0; i < 32; ++i)
    kinds += std::string(i ? ", " : "") +
             ((i % 4 == 3) ? "\"full_attention\"" : "\"sliding_attention\"");
  kinds += "]";
  const nn::GptConfig typed =
      gpt_config_from_hf(edited(without(r7b, "sliding_window_pattern"), "layer_types", kinds), "m");
  EXPECT_EQ(typed.nope_layers, every_fourth);
  EXPECT_EQ(typed.full_attention_layers, every_fourth);
  const nn::GptConfig unwindowed = gpt_config_from_hf(edited(r7b, "sliding_window", "132096"), "m");
  EXPECT_EQ(unwindowed.sliding_window, 0);
  EXPECT_TRUE(unwindowed.full_attention_layers.empty());
  EXPECT_EQ(unwindowed.nope_layers, every_fourth);
  EXPECT_EQ(std::string(hf_model_type(unwindowed)), "cohere2");
  const nn::GptConfig halves = gpt_config_from_hf(edited(r7b, "sliding_window_pattern", "2"), "m");
  EXPECT_EQ(halves.nope_layers.size(), 16u);
  EXPECT_EQ(halves.nope_layers.front(), 1);
  EXPECT_NE(error_of(edited(r7b, "sliding_window_pattern", "0")).find("sliding_window_pattern"),
            std::string::npos);
}

// SmolLM3-3B's config.json keys: LLaMA's blocks, no_rope_layers flagging
// every fourth layer 0 (no rope); without the list, no_rope_layer_interval
// (4 by default) says the same. Its base, 2e6 when left out. Its count by
// the shapes: 3,075,098,624 (3.08B). A flag other than 0 or 1, or a list
// shorter than the layers, is refused.
TEST(HfConfig, Smollm3LayersWithoutRope) {
  std::string flags = "[";
  for (int64_t i = 0; i < 36; ++i) flags += std::string(i ? ", " : "") + (i % 4 == 3 ? "0" : "1");
  flags += "]";
  const std::string smol = R"({
    "architectures": ["SmolLM3ForCausalLM"], "attention_bias": false, "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 11008, "max_position_embeddings": 65536,
    "mlp_bias": false, "model_type": "smollm3", "num_attention_heads": 16,
    "num_hidden_layers": 36, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 5000000.0, "sliding_window": null, "tie_word_embeddings": true,
    "use_sliding_window": false, "vocab_size": 128256, "no_rope_layers": )" +
                           flags + "}";
  const nn::GptConfig c = gpt_config_from_hf(smol, "SmolLM3-3B/config.json");
  EXPECT_EQ(c.hf_type, "smollm3");
  std::vector<int64_t> every_fourth;
  for (int64_t i = 3; i < 36; i += 4) every_fourth.push_back(i);
  EXPECT_EQ(c.nope_layers, every_fourth);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.num_parameters(), 3'075'098'624);
  EXPECT_EQ(std::string(hf_architecture(c)), "SmolLM3ForCausalLM");
  const std::string listless = without(smol, "no_rope_layers");
  EXPECT_EQ(gpt_config_from_hf(listless, "m").nope_layers, every_fourth);
  EXPECT_EQ(gpt_config_from_hf(without(listless, "rope_theta"), "m").rope_theta, 2e6);
  EXPECT_EQ(gpt_config_from_hf(edited(listless, "no_rope_layer_interval", "12"), "m").nope_layers,
            (std::vector<int64_t>{11, 23, 35}));
  EXPECT_NE(error_of(edited(smol, "no_rope_layers", "[2]")).find("'no_rope_layers'"),
            std::string::npos);
  EXPECT_NE(error_of(edited(smol, "no_rope_layers", "[1, 0]")).find("each of the 36 layers"),
            std::string::npos);
}

// starcoder2-3b's config.json: the sequential block with rope on whole
// heads (at its base of about 1e6), LayerNorm, biases on every linear
// layer, an ungated GELU (tanh) MLP, 24 heads over 2 key/value heads, a
// window of 4096 within its 16384 positions, and the tied head
// PretrainedConfig gives when the file says nothing. Its count by the
// shapes: 3,030,371,328 (3.03B). use_bias false drops the linear biases;
// another activation, or a window of no key, is refused.
TEST(HfConfig, Starcoder2ConfigIsItsOwn) {
  const std::string sc2 = R"({
    "architectures": ["Starcoder2ForCausalLM"], "attention_dropout": 0.1, "bos_token_id": 0,
    "embedding_dropout": 0.1, "eos_token_id": 0, "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 3072, "initializer_range": 0.018042, "intermediate_size": 12288,
    "max_position_embeddings": 16384, "mlp_type": "default", "model_type": "starcoder2",
    "norm_epsilon": 1e-05, "norm_type": "layer_norm", "num_attention_heads": 24,
    "num_hidden_layers": 30, "num_key_value_heads": 2, "residual_dropout": 0.1,
    "rope_theta": 999999.4420358813, "sliding_window": 4096, "torch_dtype": "float32",
    "use_bias": true, "use_cache": true, "vocab_size": 49152})";
  const nn::GptConfig c = gpt_config_from_hf(sc2, "starcoder2-3b/config.json");
  EXPECT_EQ(c.hf_type, "starcoder2");
  EXPECT_TRUE(c.rotary());
  EXPECT_EQ(c.rope_theta, 999999.4420358813);
  EXPECT_EQ(c.rope_dim, 0);
  EXPECT_FALSE(c.rms_norm());
  EXPECT_DOUBLE_EQ(c.layer_norm_eps, 1e-5);
  EXPECT_EQ(c.activation, nn::Activation::Gelu);
  EXPECT_EQ(c.ffn(), 12288);
  EXPECT_TRUE(c.linear_bias);
  EXPECT_FALSE(c.parallel_residual);
  EXPECT_EQ(c.kv_heads(), 2);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_TRUE(c.full_attention_layers.empty());
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.num_parameters(), 3'030'371'328);
  EXPECT_EQ(std::string(hf_architecture(c)), "Starcoder2ForCausalLM");
  EXPECT_FALSE(gpt_config_from_hf(edited(sc2, "use_bias", "false"), "m").linear_bias);
  EXPECT_EQ(gpt_config_from_hf(edited(sc2, "sliding_window", "null"), "m").sliding_window, 0);
  EXPECT_EQ(gpt_config_from_hf(edited(sc2, "hidden_act", "\"gelu\""), "m").activation,
            nn::Activation::GeluErf);
  EXPECT_NE(error_of(edited(sc2, "hidden_act", "\"silu\"")).find("hidden_act"), std::string::npos);
  EXPECT_NE(error_of(edited(sc2, "sliding_window", "0")).find("'sliding_window' (0)"),
            std::string::npos);
}

// Minitron-4B-Base's config.json (Nemotron-4 15B pruned): the sequential
// block with half of each head turned, LayerNorm1P (a LayerNorm with its
// bias, scaling by 1 + weight), a squared-ReLU MLP, 24 heads of 128 over 8
// key/value heads, no linear biases and an untied head. Its count by the
// shapes: 2 x 256000 x 3072 (the embedding, the head) + 32 blocks of
// 3072^2 x 2 (q, o) + 3072 x 1024 x 2 (k, v) + 2 x 3072 x 9216 (up, down)
// + 2 x 2 x 3072 (two norms' weights and biases) + 2 x 3072 (ln_f):
// 4,190,509,056 (4.19B). Minitron-8B-Base's heads are apart (48 of 128 on
// 4096 wide): 8,271,699,968. The biases, the activation and what is
// refused follow.
TEST(HfConfig, NemotronConfigIsMinitrons) {
  const std::string minitron = R"({
    "architectures": ["NemotronForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 2, "eos_token_id": 3, "head_dim": 128, "hidden_act": "relu2",
    "hidden_size": 3072, "initializer_range": 0.0134, "intermediate_size": 9216,
    "max_position_embeddings": 4096, "mlp_bias": false, "model_type": "nemotron",
    "norm_eps": 1e-05, "num_attention_heads": 24, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "partial_rotary_factor": 0.5, "rope_theta": 10000,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "vocab_size": 256000})";
  const nn::GptConfig c = gpt_config_from_hf(minitron, "Minitron-4B-Base/config.json");
  EXPECT_EQ(c.hf_type, "nemotron");
  EXPECT_TRUE(c.rotary());
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_FALSE(c.heads_apart());
  EXPECT_EQ(c.kv_heads(), 8);
  EXPECT_EQ(c.normalization, nn::Normalization::LayerNorm);
  EXPECT_TRUE(c.norm_weight_offset);
  EXPECT_TRUE(c.norm_biases());
  EXPECT_DOUBLE_EQ(c.layer_norm_eps, 1e-5);
  EXPECT_EQ(c.activation, nn::Activation::Relu2);
  EXPECT_EQ(c.ffn(), 9216);
  EXPECT_FALSE(c.linear_bias);
  EXPECT_FALSE(c.mlp_biases());
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.parallel_residual);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.num_parameters(), 4'190'509'056);
  EXPECT_EQ(c.init_std, 0.0134);  // its initializer_range
  EXPECT_EQ(std::string(hf_architecture(c)), "NemotronForCausalLM");
  EXPECT_EQ(nlohmann::json::parse(hf_config_json(c)).at("initializer_range"), 0.0134);
  // Minitron-8B-Base: 48 query heads of 128 on a 4096-wide stream.
  std::string eight = minitron;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"hidden_size", "4096"}, {"intermediate_size", "16384"}, {"num_attention_heads", "48"}})
    eight = edited(eight, key, value);
  const nn::GptConfig big = gpt_config_from_hf(eight, "Minitron-8B-Base/config.json");
  EXPECT_TRUE(big.heads_apart());
  EXPECT_EQ(big.q_width(), 6144);
  EXPECT_EQ(big.rope_dim, 64);
  EXPECT_EQ(big.num_parameters(), 8'271'699'968);
  // NemotronConfig's defaults: relu2, half of each head, norm_eps 1e-5.
  const nn::GptConfig bare = gpt_config_from_hf(
      without(without(without(minitron, "hidden_act"), "partial_rotary_factor"), "norm_eps"), "m");
  EXPECT_EQ(bare.activation, nn::Activation::Relu2);
  EXPECT_EQ(bare.rope_dim, 64);
  EXPECT_DOUBLE_EQ(bare.layer_norm_eps, 1e-5);
  EXPECT_EQ(gpt_config_from_hf(edited(minitron, "partial_rotary_factor", "1.0"), "m").rope_dim, 0);
  EXPECT_EQ(gpt_config_from_hf(edited(minitron, "hidden_act", "\"gelu\""), "m").activation,
            nn::Activation::GeluErf);
  EXPECT_EQ(
      gpt_config_from_hf(edited(minitron, "hidden_act", "\"gelu_pytorch_tanh\""), "m").activation,
      nn::Activation::Gelu);
  // attention_bias covers q, k, v and o_proj, mlp_bias up_proj and
  // down_proj: both are Triad's linear_bias, the MLP's alone its mlp_bias.
  const nn::GptConfig biased = gpt_config_from_hf(
      edited(edited(minitron, "attention_bias", "true"), "mlp_bias", "true"), "m");
  EXPECT_TRUE(biased.linear_bias);
  const nn::GptConfig mlp_only = gpt_config_from_hf(edited(minitron, "mlp_bias", "true"), "m");
  EXPECT_FALSE(mlp_only.linear_bias);
  EXPECT_TRUE(mlp_only.mlp_bias);
  EXPECT_NE(error_of(edited(minitron, "attention_bias", "true"))
                .find("'attention_bias' (true): Triad's attention output projection has a bias "
                      "only beside every other linear layer's"),
            std::string::npos);
  EXPECT_NE(error_of(edited(minitron, "hidden_act", "\"silu\""))
                .find("'hidden_act' (\"silu\"): expected relu2 (squared ReLU)"),
            std::string::npos);
  EXPECT_EQ(gpt_config_from_hf(without(minitron, "initializer_range"), "m").init_std, 0.02);
  EXPECT_NE(error_of(edited(minitron, "initializer_range", "0"))
                .find("'initializer_range' (0) must be a positive number"),
            std::string::npos);
  EXPECT_NE(error_of(edited(minitron, "partial_rotary_factor", "0"))
                .find("'partial_rotary_factor' (0) must be a share of the head in (0, 1]"),
            std::string::npos);
}

// ArceeConfig's defaults written out (AFM-4.5B-Base's kind): LLaMA's blocks
// with Nemotron's ungated squared-ReLU MLP (up_proj, down_proj), RMSNorm,
// 32 heads of 80 over 8 key/value heads, an untied head. Its count by the
// shapes: 2 x 32000 x 2560 (the embedding, the head) + 32 blocks of
// 2560^2 x 2 (q, o) + 2560 x 640 x 2 (k, v) + 2 x 2560 x 18432 (up, down)
// + 2 x 2560 (two norms) + 2560 (the final norm): 3,708,193,280. Another
// activation than an ungated one is refused.
TEST(HfConfig, ArceeConfigIsLlamasWithAnUngatedMlp) {
  const std::string arcee = R"({
    "architectures": ["ArceeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 80, "hidden_act": "relu2",
    "hidden_size": 2560, "initializer_range": 0.02, "intermediate_size": 18432,
    "max_position_embeddings": 4096, "mlp_bias": false, "model_type": "arcee",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32000})";
  const nn::GptConfig c = gpt_config_from_hf(arcee, "AFM/config.json");
  EXPECT_EQ(c.hf_type, "arcee");
  EXPECT_EQ(c.activation, nn::Activation::Relu2);
  EXPECT_EQ(c.ffn(), 18432);
  EXPECT_TRUE(c.rms_norm());
  EXPECT_FALSE(c.norm_weight_offset);
  EXPECT_EQ(c.rope_dim, 0);
  EXPECT_EQ(c.kv_heads(), 8);
  EXPECT_FALSE(c.linear_bias);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.num_parameters(), 3'708'193'280);
  EXPECT_EQ(std::string(hf_architecture(c)), "ArceeForCausalLM");
  EXPECT_EQ(gpt_config_from_hf(without(arcee, "hidden_act"), "m").activation,
            nn::Activation::Relu2);
  EXPECT_EQ(gpt_config_from_hf(edited(arcee, "hidden_act", "\"gelu\""), "m").activation,
            nn::Activation::GeluErf);
  EXPECT_NE(error_of(edited(arcee, "hidden_act", "\"silu\""))
                .find("'hidden_act' (\"silu\"): expected relu2 (squared ReLU), gelu (exact), "
                      "gelu_new or gelu_pytorch_tanh (tanh): Arcee's MLP is ungated"),
            std::string::npos);
  EXPECT_NE(error_of(edited(arcee, "mlp_bias", "true")).find("'mlp_bias' (true)"),
            std::string::npos);
}

// granite-3.0-8b-base's config.json: LLaMA's blocks with Granite's four
// multipliers (the token embeddings times 12, each sublayer's output times
// 0.22, the scores times 1/128 in place of 1/sqrt(128), the logits over
// 16), grouped-query attention and a tied head. Its count by the shapes:
// 49155 x 4096 embeddings, 40 blocks of 4096^2 x 2 (q, o) + 4096 x 1024 x
// 2 (k, v) + 3 x 4096 x 12800 (the MLP) + 2 x 4096 (norms), and ln_f:
// 8,170,848,256. Each multiplier left out is 1; a non-positive one is
// refused.
TEST(HfConfig, GraniteConfigIsItsOwn) {
  const std::string granite = R"({
    "architectures": ["GraniteForCausalLM"], "attention_bias": false, "attention_dropout": 0.1,
    "attention_multiplier": 0.0078125, "bos_token_id": 0, "embedding_multiplier": 12.0,
    "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 12800, "logits_scaling": 16.0, "max_position_embeddings": 4096,
    "mlp_bias": false, "model_type": "granite", "num_attention_heads": 32,
    "num_hidden_layers": 40, "num_key_value_heads": 8, "pad_token_id": 0,
    "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 10000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 49155})";
  const nn::GptConfig g = gpt_config_from_hf(granite, "granite-3.0-8b-base/config.json");
  EXPECT_EQ(g.hf_type, "granite");
  EXPECT_TRUE(g.rms_norm());
  EXPECT_TRUE(g.rotary());
  EXPECT_EQ(g.activation, nn::Activation::SwiGlu);
  EXPECT_FALSE(g.linear_bias);
  EXPECT_TRUE(g.tie_embeddings);
  EXPECT_EQ(g.kv_heads(), 8);
  EXPECT_EQ(g.embedding_multiplier, 12.0);
  EXPECT_EQ(g.residual_multiplier, 0.22);
  EXPECT_EQ(g.query_pre_attn_scalar, 16384.0);  // 1 / (1/128)^2
  EXPECT_EQ(g.logit_scale, 1.0 / 16);
  EXPECT_DOUBLE_EQ(g.layer_norm_eps, 1e-5);
  EXPECT_EQ(g.num_parameters(), 8'170'848'256);
  EXPECT_EQ(std::string(hf_architecture(g)), "GraniteForCausalLM");
  // GraniteConfig's defaults: every multiplier 1, the scores' scale too.
  std::string bare = granite;
  for (const char* key :
       {"attention_multiplier", "embedding_multiplier", "logits_scaling", "residual_multiplier"})
    bare = without(bare, key);
  const nn::GptConfig d = gpt_config_from_hf(bare, "m");
  EXPECT_EQ(d.embedding_multiplier, 1.0);
  EXPECT_EQ(d.residual_multiplier, 1.0);
  EXPECT_EQ(d.query_pre_attn_scalar, 1.0);
  EXPECT_EQ(d.logit_scale, 1.0);
  // The usual scale, 1 / sqrt(head_dim) to its last digit, is no scalar of
  // its own.
  EXPECT_EQ(gpt_config_from_hf(edited(granite, "attention_multiplier", "0.08838834764831843"), "m")
                .query_pre_attn_scalar,
            0.0);
  EXPECT_NE(error_of(edited(granite, "residual_multiplier", "0")).find("'residual_multiplier' (0)"),
            std::string::npos);
  EXPECT_NE(error_of(edited(granite, "logits_scaling", "-16")).find("'logits_scaling' (-16)"),
            std::string::npos);
  EXPECT_NE(error_of(edited(granite, "mlp_bias", "true")).find("mlp_bias"), std::string::npos);
}

// GraniteMoE's config.json (granite-3.0-1b-a400m's shape: 24 layers of
// 1024, 16 heads over 8 key/value heads, 32 experts of 512 of which each
// token takes 8): Granite's multipliers and a mixture on every layer, its
// top k renormalised; GraniteMoeShared's shared_intermediate_size as an
// ungated shared expert. The counts by the shapes: per layer 2 x 1024^2 (q,
// o) + 2 x 1024 x 512 (k, v) + 32 x 3 x 1024 x 512 (the experts) + 32 x
// 1024 (the router) + 2 x 1024 (norms), 24 layers, 49155 x 1024 tied
// embeddings and ln_f: 1,334,628,352, of which a token uses the attention,
// router and 8 experts' 3 x 1024 x 512 a layer.
TEST(HfConfig, GraniteMoeConfigsAreTheirs) {
  const std::string moe = R"({
    "architectures": ["GraniteMoeForCausalLM"], "attention_bias": false,
    "attention_multiplier": 0.015625, "embedding_multiplier": 12.0, "hidden_act": "silu",
    "hidden_size": 1024, "intermediate_size": 512, "logits_scaling": 6.0,
    "max_position_embeddings": 4096, "model_type": "granitemoe", "num_attention_heads": 16,
    "num_experts_per_tok": 8, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": false, "residual_multiplier": 0.22,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 10000, "router_aux_loss_coef": 0.01,
    "tie_word_embeddings": true, "vocab_size": 49155})";
  const nn::GptConfig g = gpt_config_from_hf(moe, "granite-3.0-1b-a400m-base/config.json");
  EXPECT_EQ(g.hf_type, "granitemoe");
  EXPECT_EQ(g.moe.experts, 32);
  EXPECT_EQ(g.moe.top_k, 8);
  EXPECT_TRUE(g.moe.normalize_top_k);
  EXPECT_EQ(g.expert_ffn(), 512);
  EXPECT_EQ(g.moe.aux_loss_coef, 0.01);
  EXPECT_TRUE(g.moe.dense_layers.empty());
  EXPECT_EQ(g.moe.shared_ffn_hidden_size, 0);
  EXPECT_EQ(g.residual_multiplier, 0.22);
  EXPECT_EQ(g.query_pre_attn_scalar, 4096.0);
  EXPECT_EQ(g.logit_scale, 1.0 / 6.0);
  EXPECT_EQ(g.num_parameters(), 1'334'628'352);
  const double layer_active =
      2.0 * 1024 * 1024 + 2.0 * 1024 * 512 + 8.0 * 3 * 1024 * 512 + 32.0 * 1024 + 2.0 * 1024;
  EXPECT_EQ(g.active_parameter_count(), 24 * layer_active + 49155.0 * 1024 + 1024);
  EXPECT_EQ(std::string(hf_architecture(g)), "GraniteMoeForCausalLM");
  const nn::GptConfig shared = gpt_config_from_hf(
      edited(edited(moe, "model_type", "\"granitemoeshared\""), "shared_intermediate_size", "1024"),
      "m");
  EXPECT_EQ(shared.hf_type, "granitemoeshared");
  EXPECT_EQ(shared.moe.shared_ffn_hidden_size, 1024);
  EXPECT_FALSE(shared.moe.shared_gate);
  EXPECT_EQ(std::string(hf_architecture(shared)), "GraniteMoeSharedForCausalLM");
  EXPECT_NE(error_of(edited(moe, "num_experts_per_tok", "33")).find("num_experts_per_tok"),
            std::string::npos);
  EXPECT_NE(error_of(edited(edited(moe, "model_type", "\"granitemoeshared\""),
                            "shared_intermediate_size", "-1"))
                .find("shared_intermediate_size"),
            std::string::npos);
}

// OLMo-2-1124-7B's and OLMoE-1B-7B-0924's config.json as published: OLMo 2's
// blocks normalise only their sublayers' outputs, both classes normalise
// all the queries together and all the keys together; the published
// counts (7.30B; OLMoE's 6.92B with 1.28B active), and clip_qkv read.
TEST(HfConfig, Olmo2AndOlmoeConfigsAreTheirs) {
  const std::string olmo2 = R"({
    "architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "olmo2", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "pad_token_id": 100277, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 500000, "tie_word_embeddings": false,
    "torch_dtype": "float32", "use_cache": true, "vocab_size": 100352})";
  const nn::GptConfig o = gpt_config_from_hf(olmo2, "OLMo-2-1124-7B/config.json");
  EXPECT_EQ(o.hf_type, "olmo2");
  EXPECT_TRUE(o.qk_norm && o.qk_norm_full);
  EXPECT_FALSE(o.pre_norms);
  EXPECT_TRUE(o.post_norms);
  EXPECT_TRUE(o.rms_norm());
  EXPECT_DOUBLE_EQ(o.layer_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(o.rope_theta, 500000.0);
  EXPECT_EQ(o.q_norm_width(), 4096);
  EXPECT_EQ(o.k_norm_width(), 4096);
  EXPECT_FALSE(o.tie_embeddings);
  EXPECT_EQ(o.num_parameters(), 7'298'617'344);
  EXPECT_EQ(std::string(hf_architecture(o)), "Olmo2ForCausalLM");
  // OlmoeConfig's and Olmo2Config's default eps is 1e-5.
  EXPECT_DOUBLE_EQ(gpt_config_from_hf(without(olmo2, "rms_norm_eps"), "o").layer_norm_eps, 1e-5);

  const std::string olmoe = R"({
    "architectures": ["OlmoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "clip_qkv": null, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 4096,
    "model_type": "olmoe", "norm_topk_prob": false, "num_attention_heads": 16,
    "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16,
    "num_key_value_heads": 16, "output_router_logits": false, "pad_token_id": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
    "router_aux_loss_coef": 0.01, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 50304})";
  const nn::GptConfig e = gpt_config_from_hf(olmoe, "OLMoE-1B-7B-0924/config.json");
  EXPECT_EQ(e.hf_type, "olmoe");
  EXPECT_TRUE(e.qk_norm && e.qk_norm_full);
  EXPECT_TRUE(e.pre_norms);
  EXPECT_FALSE(e.post_norms);
  EXPECT_EQ(e.moe.experts, 64);
  EXPECT_EQ(e.moe.top_k, 8);
  EXPECT_FALSE(e.moe.normalize_top_k);
  EXPECT_EQ(e.expert_ffn(), 1024);
  EXPECT_TRUE(e.moe.dense_layers.empty());
  EXPECT_DOUBLE_EQ(e.moe.aux_loss_coef, 0.01);
  EXPECT_EQ(e.num_parameters(), 6'919'161'856);
  EXPECT_DOUBLE_EQ(e.active_parameter_count(), 1'282'017'280.0);
  EXPECT_EQ(std::string(hf_architecture(e)), "OlmoeForCausalLM");
  EXPECT_EQ(e.clip_qkv, 0.0);
  EXPECT_EQ(gpt_config_from_hf(edited(olmoe, "clip_qkv", "8.0"), "m").clip_qkv, 8.0);
  EXPECT_NE(error_of(edited(olmoe, "num_experts_per_tok", "65")).find("num_experts_per_tok"),
            std::string::npos);
}

// Falcon 7B's config.json as published (FalconConfig's defaults for what it
// leaves out: the context, the MLP's width, the exact GELU, a tied head) and
// its published parameter count; Falcon 40B's new decoder architecture (two
// norms, grouped key/value heads), Falcon 2's one norm in it, and what
// Triad does not build are named.
TEST(HfConfig, FalconConfigIsFalcon7bs) {
  const std::string falcon7b = R"({
    "alibi": false, "apply_residual_connection_post_layernorm": false,
    "architectures": ["FalconForCausalLM"], "attention_dropout": 0.0, "bias": false,
    "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0, "hidden_size": 4544,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon",
    "multi_query": true, "new_decoder_architecture": false, "num_attention_heads": 71,
    "num_hidden_layers": 32, "parallel_attn": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.27.4", "use_cache": true, "vocab_size": 65024})";
  const nn::GptConfig c = gpt_config_from_hf(falcon7b, "falcon-7b/config.json");
  EXPECT_EQ(c.hf_type, "falcon");
  EXPECT_EQ(c.num_parameters(), 6'921'720'704);
  EXPECT_EQ(c.kv_heads(), 1);
  EXPECT_TRUE(c.parallel_residual);
  EXPECT_TRUE(c.shared_norm);
  EXPECT_FALSE(c.linear_bias);
  EXPECT_FALSE(c.c_attn_bias());
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.activation, nn::Activation::GeluErf);
  EXPECT_EQ(c.ffn(), 4 * 4544);
  EXPECT_EQ(c.seq_len, 2048);
  EXPECT_EQ(c.rope_dim, 0);
  EXPECT_FALSE(c.rms_norm());
  // Falcon 40B: the new decoder architecture, 8 key/value heads, two norms.
  std::string falcon40b =
      edited(edited(falcon7b, "new_decoder_architecture", "true"), "num_kv_heads", "8");
  falcon40b = edited(edited(edited(falcon40b, "num_attention_heads", "128"), "hidden_size", "8192"),
                     "num_hidden_layers", "60");
  const nn::GptConfig forty = gpt_config_from_hf(falcon40b, "40b");
  EXPECT_EQ(forty.kv_heads(), 8);
  EXPECT_TRUE(forty.parallel_residual);
  EXPECT_FALSE(forty.shared_norm);
  EXPECT_TRUE(gpt_config_from_hf(edited(edited(edited(falcon7b, "new_decoder_architecture", "true"),
                                               "num_kv_heads", "71"),
                                        "num_ln_in_parallel_attn", "1"),
                                 "falcon2")
                  .shared_norm);
  // Neither multi-query nor new: a key/value head per query head.
  EXPECT_EQ(gpt_config_from_hf(edited(falcon7b, "multi_query", "false"), "mha").kv_heads(), 71);
  const nn::GptConfig sequential =
      gpt_config_from_hf(edited(falcon7b, "parallel_attn", "false"), "sequential");
  EXPECT_FALSE(sequential.parallel_residual);
  EXPECT_FALSE(sequential.shared_norm);
  EXPECT_NE(error_of(edited(falcon7b, "alibi", "true"))
                .find("'alibi' (true): ALiBi's position biases are not implemented"),
            std::string::npos);
  EXPECT_NE(error_of(edited(falcon7b, "apply_residual_connection_post_layernorm", "true"))
                .find("a residual taken after the norm is not implemented"),
            std::string::npos);
  EXPECT_NE(error_of(edited(edited(falcon7b, "new_decoder_architecture", "true"),
                            "num_ln_in_parallel_attn", "3"))
                .find("'num_ln_in_parallel_attn' (3) must be 1 or 2"),
            std::string::npos);
}

// GPT-J 6B's config.json as published: GPT-2's keys, the parallel residual
// with one norm, biases on the MLP alone, a biased untied head, 64 of each
// head's 256 dimensions turned, and its published parameter count.
TEST(HfConfig, GptjConfigIsGptj6bs) {
  const std::string gptj = R"({
    "activation_function": "gelu_new", "architectures": ["GPTJForCausalLM"], "attn_pdrop": 0.0,
    "bos_token_id": 50256, "embd_pdrop": 0.0, "eos_token_id": 50256, "gradient_checkpointing": false,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gptj", "n_embd": 4096,
    "n_head": 16, "n_inner": null, "n_layer": 28, "n_positions": 2048, "resid_pdrop": 0.0,
    "rotary": true, "rotary_dim": 64, "scale_attn_weights": true, "tie_word_embeddings": false,
    "use_cache": true, "vocab_size": 50400})";
  const nn::GptConfig c = gpt_config_from_hf(gptj, "gpt-j-6b/config.json");
  EXPECT_EQ(c.hf_type, "gptj");
  EXPECT_EQ(c.num_parameters(), 6'050'882'784);
  EXPECT_TRUE(c.parallel_residual);
  EXPECT_TRUE(c.shared_norm);
  EXPECT_TRUE(c.head_bias);
  EXPECT_FALSE(c.linear_bias);
  EXPECT_TRUE(c.mlp_bias);
  EXPECT_FALSE(c.c_attn_bias());
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.activation, nn::Activation::Gelu);
  EXPECT_EQ(gpt_config_from_hf(edited(gptj, "rotary_dim", "256"), "whole").rope_dim, 0);
  EXPECT_NE(error_of(edited(gptj, "rotary_dim", "65"))
                .find("'rotary_dim' (65) must be an even count of dimensions, at most each "
                      "head's 256"),
            std::string::npos);
}

// CodeGen 350M mono's config.json: GPT-J's keys (its blocks), read as
// GPT-J's are, and its parameter count from those shapes; a head count its
// four shards cannot split, and a file without rotary_dim, are named.
TEST(HfConfig, CodegenConfigIsGptjsBlocks) {
  const std::string codegen = R"({
    "activation_function": "gelu_new", "architectures": ["CodeGenForCausalLM"],
    "attn_pdrop": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 50256,
    "layer_norm_epsilon": 1e-05, "model_type": "codegen", "n_ctx": 2048, "n_embd": 1024,
    "n_head": 16, "n_inner": null, "n_layer": 20, "n_positions": 2048, "resid_pdrop": 0.0,
    "rotary_dim": 32, "tie_word_embeddings": false, "vocab_size": 51200})";
  const nn::GptConfig c = gpt_config_from_hf(codegen, "codegen-350M-mono/config.json");
  EXPECT_EQ(c.hf_type, "codegen");
  EXPECT_EQ(c.num_parameters(), 356'712'448);
  EXPECT_TRUE(c.shared_norm);
  EXPECT_TRUE(c.mlp_bias);
  EXPECT_FALSE(c.linear_bias);
  EXPECT_EQ(c.rope_dim, 32);
  EXPECT_NE(error_of(edited(edited(codegen, "n_head", "6"), "n_embd", "1032"))
                .find("CodeGen's n_head (6) must be a multiple of 4"),
            std::string::npos);
  EXPECT_NE(error_of(without(codegen, "rotary_dim"))
                .find("'rotary_dim' (absent): CodeGen without rotary_dim is not implemented"),
            std::string::npos);
}

// StableLM 2 1.6B's config.json as published: LLaMA's blocks with
// LayerNorms, q, k and v biases and a quarter of each head turned, and its
// published parameter count; its 12B's parallel blocks (one norm shared)
// and its LayerNorm on each query and key head (qk_layernorm): 40 blocks of
// 5120 over 32 query heads of 160 and 8 key/value heads, 12,143,185,920
// parameters (12.1B) with the head norms' 40 x (32 + 8) x 160.
TEST(HfConfig, StableLmConfigIsStableLm2s) {
  const std::string stablelm = R"({
    "architectures": ["StableLmForCausalLM"], "bos_token_id": 100257, "eos_token_id": 100257,
    "hidden_act": "silu", "hidden_dropout": 0.0, "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "layer_norm_eps": 1e-05, "max_position_embeddings": 4096,
    "model_type": "stablelm", "num_attention_heads": 32, "num_hidden_layers": 24,
    "num_key_value_heads": 32, "partial_rotary_factor": 0.25, "qk_layernorm": false,
    "rope_scaling": null, "rope_theta": 10000, "tie_word_embeddings": false,
    "torch_dtype": "float16", "use_cache": true, "use_parallel_residual": false,
    "use_qkv_bias": true, "vocab_size": 100352})";
  const nn::GptConfig c = gpt_config_from_hf(stablelm, "stablelm-2-1_6b/config.json");
  EXPECT_EQ(c.hf_type, "stablelm");
  EXPECT_EQ(c.num_parameters(), 1'644'515'328);
  EXPECT_EQ(c.normalization, nn::Normalization::LayerNorm);
  EXPECT_EQ(c.layer_norm_eps, 1e-5);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.linear_bias);
  EXPECT_EQ(c.activation, nn::Activation::SwiGlu);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_FALSE(c.tie_embeddings);
  // StableLM 3B-4E1T's: no q, k and v biases; the default quarter turned.
  const nn::GptConfig b = gpt_config_from_hf(
      without(edited(stablelm, "use_qkv_bias", "false"), "partial_rotary_factor"),
      "3b/config.json");
  EXPECT_FALSE(b.qkv_bias);
  EXPECT_EQ(b.rope_dim, 16);
  EXPECT_FALSE(b.parallel_residual);
  EXPECT_FALSE(b.shared_norm);
  // StableLM 2 12B's parallel blocks: one norm for the attention and the MLP.
  const nn::GptConfig parallel =
      gpt_config_from_hf(edited(stablelm, "use_parallel_residual", "true"), "12b/config.json");
  EXPECT_TRUE(parallel.parallel_residual);
  EXPECT_TRUE(parallel.shared_norm);
  EXPECT_FALSE(parallel.head_bias);
  std::string twelve = edited(stablelm, "use_parallel_residual", "true");
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"qk_layernorm", "true"},
                                                        {"hidden_size", "5120"},
                                                        {"intermediate_size", "13824"},
                                                        {"num_hidden_layers", "40"},
                                                        {"num_key_value_heads", "8"},
                                                        {"use_qkv_bias", "false"}})
    twelve = edited(twelve, key, value);
  const nn::GptConfig big = gpt_config_from_hf(twelve, "stablelm-2-12b/config.json");
  EXPECT_TRUE(big.qk_norm && big.qk_head_layernorm);
  EXPECT_EQ(big.head_dim(), 160);
  EXPECT_EQ(big.num_parameters(), 12'143'185'920);
  EXPECT_EQ(nlohmann::json::parse(hf_config_json(big)).at("qk_layernorm"), true);
  EXPECT_NE(error_of(edited(stablelm, "partial_rotary_factor", "1.5"))
                .find("'partial_rotary_factor' (1.5) must be a share of the head in (0, 1]"),
            std::string::npos);
}

TEST(HfConfig, WhatTriadDoesNotBuildIsNamed) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto from = [](const std::string& json) {
    return [json] { gpt_config_from_hf(json, "m/config.json"); };
  };
  const std::string llama = kLlama70b;
  EXPECT_NE(
      message(from(edited(llama, "rope_scaling", R"({"rope_type": "dynamic", "factor": 4.0})")))
          .find("m/config.json: 'rope_scaling' ({\"factor\":4.0,\"rope_type\":\"dynamic\"}): "
                "only rope_type llama3 (LLaMA 3.1's), linear, yarn and longrope (Phi-3's) are "
                "implemented"),
      std::string::npos);
  EXPECT_NE(message(from(edited(llama, "rope_scaling",
                                R"({"rope_type": "yarn", "factor": 40, "mscale": 0.707})")))
                .find("yarn's mscale (DeepSeek's attention factor) belongs to DeepSeek's latent "
                      "attention"),
            std::string::npos);
  EXPECT_NE(message(from(edited(llama, "rope_scaling", R"({"type": "linear"})")))
                .find("a linear scaling needs its factor"),
            std::string::npos);
  EXPECT_NE(
      message(from(edited(llama, "rope_scaling", R"({"rope_type": "llama3", "factor": "x"})")))
          .find("'rope_scaling.factor' (\"x\") must be a number"),
      std::string::npos);
  EXPECT_NE(message(from(edited(llama, "hidden_act", "\"gelu\""))).find("'hidden_act' (\"gelu\")"),
            std::string::npos);
  EXPECT_NE(message(from(edited(llama, "attention_bias", "true"))).find("'attention_bias'"),
            std::string::npos);
  EXPECT_NE(message(from(edited(llama, "head_dim", "-2"))).find("model.head_dim (-2)"),
            std::string::npos);
  EXPECT_NE(message(from(edited(edited(llama, "model_type", "\"mistral\""), "sliding_window", "0")))
                .find("'sliding_window' (0): a window must hold at least one key"),
            std::string::npos);
  EXPECT_NE(
      message(from(edited(llama, "model_type", "\"deepseek_v4\"")))
          .find("model_type 'deepseek_v4' is not supported (llama, mistral, mixtral, qwen2, "
                "qwen2_moe, qwen3, qwen3_moe, gemma, gemma2, gemma3_text, gemma3, phi3, stablelm, "
                "olmo, olmo2, olmo3, olmoe, granite, granitemoe, granitemoeshared, cohere, "
                "cohere2, smollm3, glm, glm4, glm4_moe, dots1, deepseek_v2, deepseek_v3, kimi_k2, "
                "minimax_m2, helium, seed_oss, "
                "exaone4, arcee, gpt_neox, "
                "starcoder2, nemotron, "
                "phi, "
                "falcon, "
                "gptj, "
                "codegen or gpt2)"),
      std::string::npos);
  EXPECT_NE(message(from(edited(edited(edited(kQwen3_06b, "use_sliding_window", "true"),
                                       "max_window_layers", "10"),
                                "sliding_window", "0")))
                .find("'sliding_window' (0): a window must hold at least one key"),
            std::string::npos);
  EXPECT_NE(message(from(R"({"model_type": "llama", "hidden_size": 64})"))
                .find("m/config.json: key 'num_hidden_layers' is missing"),
            std::string::npos);
  EXPECT_NE(message(from(edited(llama, "num_key_value_heads", "\"eight\"")))
                .find("'num_key_value_heads' (\"eight\") must be an integer"),
            std::string::npos);
  EXPECT_NE(message(from(edited(llama, "num_key_value_heads", "7"))).find("model.n_kv_head (7)"),
            std::string::npos);
  EXPECT_NE(message(from("[1, 2]")).find("expected a JSON object"), std::string::npos);
  EXPECT_NE(message(from("{")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(message([] {
              load_hf_config("/nonexistent/dir");
            }).find("cannot open Hugging Face config '/nonexistent/dir'"),
            std::string::npos);
}

// A Hugging Face model's directory as the trainer's model (the keys beside
// model.hf_config override it) and as the planner's model file.
TEST(HfConfig, TrainerAndPlannerReadIt) {
  testing::TempDir dir;
  const std::string model_dir = dir.file("Llama-2-70b-hf");
  std::filesystem::create_directories(model_dir);
  std::ofstream(model_dir + "/config.json") << kLlama70b;
  const std::string yaml = "model: {hf_config: " + model_dir +
                           ", seq_len: 2048, recompute: full}\n"
                           "train: {steps: 5, global_batch_size: 8, micro_batch_size: 4}\n"
                           "data: {train: data/x.bin}\n";
  const train::Config c = train::parse_config(yaml);
  EXPECT_EQ(c.model.n_layer, 80);
  EXPECT_EQ(c.model.n_kv_head, 8);
  EXPECT_EQ(c.model.seq_len, 2048);  // overridden
  EXPECT_EQ(c.model.recompute, nn::Recompute::Full);
  EXPECT_FALSE(c.model.tie_embeddings);
  // The resolved model round-trips without the file.
  const train::Config back = train::parse_config(train::to_yaml(c));
  EXPECT_EQ(back.model.num_parameters(), c.model.num_parameters());
  EXPECT_EQ(back.model.n_kv_head, 8);
  // The file's class goes along (the export writes it), unless the config
  // says otherwise; a class no export writes is named.
  EXPECT_EQ(c.model.hf_type, "llama");
  EXPECT_EQ(back.model.hf_type, "llama");
  EXPECT_EQ(train::parse_config(yaml, {"model.hf_type=auto"}).model.hf_type, "");
  EXPECT_EQ(train::parse_config(yaml, {"model.hf_type=mistral"}).model.hf_type, "mistral");
  try {
    train::parse_config(yaml, {"model.hf_type=Llama"});
    FAIL() << "model_type Llama accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.hf_type 'Llama' is not a model_type Triad "
                                         "exports (llama, mistral,"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(plan::parse_model_spec("model: {hf_config: " + model_dir + ", hf_type: auto}").n_layer,
            80);
  try {
    train::parse_config("model: {hf_config: " + dir.file("missing") +
                        "}\ntrain: {steps: 1, global_batch_size: 1, micro_batch_size: 1}\n"
                        "data: {train: x.bin}\n");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.hf_config: cannot open Hugging Face config"),
              std::string::npos)
        << e.what();
  }
  // Without hf_config the shape keys are still required.
  EXPECT_THROW(train::parse_config("model: {n_layer: 2}\ntrain: {steps: 1, global_batch_size: 1, "
                                   "micro_batch_size: 1}\ndata: {train: x.bin}\n"),
               ConfigError);
  EXPECT_EQ(plan::load_model_spec(model_dir).num_parameters(), 68'976'648'192);
  EXPECT_EQ(plan::load_model_spec(model_dir + "/config.json").n_kv_head, 8);
  EXPECT_EQ(plan::parse_model_spec("model: {hf_config: " + model_dir + ", seq_len: 1024}").seq_len,
            1024);
}

// generation_config.json's eos_token_id: an id or a list (LLaMA 3.1
// Instruct's three), read from the model's directory or a file in it.
TEST(HfConfig, StopTokensComeFromTheGenerationConfig) {
  testing::TempDir dir;
  const std::string model = dir.file("Llama-3.1-8B-Instruct");
  std::filesystem::create_directories(model);
  std::ofstream(model + "/tokenizer.json") << "{}";
  EXPECT_TRUE(load_hf_stop_tokens(model).empty());  // no generation_config.json
  const auto write = [&](const std::string& text) {
    std::ofstream(model + "/generation_config.json", std::ios::trunc) << text;
  };
  write(R"({"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009, 128008],
            "temperature": 0.6})");
  EXPECT_EQ(load_hf_stop_tokens(model), (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(load_hf_stop_tokens(model + "/tokenizer.json"),
            (std::vector<int64_t>{128001, 128008, 128009}));
  write(R"({"eos_token_id": 2})");
  EXPECT_EQ(load_hf_stop_tokens(model), (std::vector<int64_t>{2}));
  write(R"({"eos_token_id": null, "pad_token_id": 0})");
  EXPECT_TRUE(load_hf_stop_tokens(model).empty());
  const auto message = [&](const std::string& text) {
    write(text);
    try {
      load_hf_stop_tokens(model);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(R"({"eos_token_id": [1, "</s>"]})")
                .find("generation_config.json': eos_token_id ([1,\"</s>\"]) must be a token id "
                      "or a list of them"),
            std::string::npos);
  EXPECT_NE(message(R"({"eos_token_id": -1})").find("eos_token_id (-1)"), std::string::npos);
  EXPECT_NE(message("{").find("generation_config.json' is not JSON"), std::string::npos);
  EXPECT_NE(message("[2]").find("is not a JSON object"), std::string::npos);
}

// How generate() would choose tokens with the file: greedy unless
// do_sample is true; transformers' defaults where a sampling file is silent.
TEST(HfConfig, SamplingSettingsComeFromTheGenerationConfig) {
  testing::TempDir dir;
  const std::string model = dir.file("model");
  std::filesystem::create_directories(model);
  EXPECT_TRUE(load_hf_generation_config(model).file.empty());
  EXPECT_FALSE(load_hf_generation_config(model).names_sampling());
  const auto read = [&](const std::string& text) {
    std::ofstream(model + "/generation_config.json", std::ios::trunc) << text;
    return load_hf_generation_config(model + "/tokenizer.json");
  };
  // GPT-2's and Gemma's: token ids alone.
  HfGenerationConfig c = read(R"({"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0})");
  EXPECT_EQ(c.file, model + "/generation_config.json");
  EXPECT_FALSE(c.names_sampling());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1}));
  // LLaMA 3.1 Instruct's: top_k left out is transformers' 50.
  c = read(R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9,
               "eos_token_id": [128001, 128008, 128009]})");
  EXPECT_TRUE(c.names_sampling());
  HfGenerationConfig::Sampling s = c.sampling();
  EXPECT_DOUBLE_EQ(s.temperature, 0.6);
  EXPECT_EQ(s.top_k, 50);
  EXPECT_DOUBLE_EQ(s.top_p, 0.9);
  EXPECT_DOUBLE_EQ(s.min_p, 0.0);
  EXPECT_DOUBLE_EQ(s.repetition_penalty, 1.0);
  // Qwen2.5 Instruct's, with a null min_p (absent).
  c = read(R"({"do_sample": true, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
               "repetition_penalty": 1.05, "min_p": null})");
  s = c.sampling();
  EXPECT_DOUBLE_EQ(s.temperature, 0.7);
  EXPECT_EQ(s.top_k, 20);
  EXPECT_DOUBLE_EQ(s.top_p, 0.8);
  EXPECT_DOUBLE_EQ(s.repetition_penalty, 1.05);
  EXPECT_FALSE(c.min_p.has_value());
  // Settings without do_sample true: greedy, the settings kept for a
  // caller that samples anyway.
  c = read(R"({"temperature": 0.6, "top_k": 0, "repetition_penalty": 1.2})");
  EXPECT_TRUE(c.names_sampling());
  s = c.sampling();
  EXPECT_DOUBLE_EQ(s.temperature, 0.0);
  EXPECT_EQ(s.top_k, 0);
  EXPECT_DOUBLE_EQ(s.repetition_penalty, 1.2);
  EXPECT_DOUBLE_EQ(read(R"({"do_sample": false, "temperature": 0.9})").sampling().temperature, 0);
  EXPECT_DOUBLE_EQ(read(R"({"do_sample": true})").sampling().temperature, 1.0);

  const auto message = [&](const std::string& text) {
    try {
      read(text);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(R"({"do_sample": "yes"})").find("do_sample (\"yes\") must be true or false"),
            std::string::npos);
  EXPECT_NE(message(R"({"top_p": 0})").find("top_p (0) must be a number in (0, 1]"),
            std::string::npos);
  EXPECT_NE(message(R"({"top_k": 2.5})").find("top_k (2.5) must be an integer >= 0"),
            std::string::npos);
  EXPECT_NE(message(R"({"temperature": -1})").find("temperature (-1) must be a number >= 0"),
            std::string::npos);
  EXPECT_NE(message(R"({"min_p": 2})").find("min_p (2) must be a number in [0, 1]"),
            std::string::npos);
  EXPECT_NE(message(R"({"repetition_penalty": 0})").find("repetition_penalty (0) must be"),
            std::string::npos);
  EXPECT_NE(message(R"({"do_sample": true, "temperature": 0})")
                .find("temperature (0) must be above 0 when do_sample is true"),
            std::string::npos);
  EXPECT_EQ(message(R"({"do_sample": false, "temperature": 0})"), "no error");
}

}  // namespace
}  // namespace triad::io
