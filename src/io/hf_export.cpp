#include "triad/io/hf_export.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>
#include <set>

#include "triad/core/error.h"
#include "triad/data/sentencepiece.h"
#include "triad/data/tokenizer.h"
#include "triad/io/gpt2_weights.h"
#include "triad/io/hf_config.h"
#include "triad/io/safetensors.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/shape_ops.h"

namespace triad::io {
namespace {

// Qwen's max_window_layers for `c`'s window: the layers before it see every
// key, the rest the window. None when the exempt layers are not the first
// ones.
std::optional<int64_t> qwen_window_layers(const nn::GptConfig& c) {
  const auto& full = c.full_attention_layers;
  for (size_t i = 0; i < full.size(); ++i) {
    if (full[i] != static_cast<int64_t>(i)) return std::nullopt;
  }
  return static_cast<int64_t>(full.size());
}

// Cohere's classes (q and k turned in interleaved pairs): Command R's, and
// Cohere 2's with its windows and global layers without rope.
bool is_cohere(const std::string& type) {
  return type == "cohere" || type == "cohere2";
}

// GLM's classes: GLM-4-9B's (glm) and GLM-4-0414's with its four norms
// (glm4).
bool is_glm(const std::string& type) {
  return type == "glm" || type == "glm4";
}

// The classes holding DeepSeek-V3's mixture (sigmoid scores chosen with
// expert biases, a shared expert): GLM-4.5's and dots.llm1's.
// The classes whose files hold multi-token-prediction layers after the
// model's (num_nextn_predict_layers): DeepSeek-V3's and GLM-4.5's.
bool holds_prediction_layers(const std::string& type) {
  return type == "deepseek_v3" || type == "glm4_moe";
}

bool holds_deepseek_moe(const std::string& type) {
  return type == "glm4_moe" || type == "dots1" || type == "deepseek_v3";
}

// The classes that leave some layers without rope: SmolLM3's (any of them)
// and Cohere 2's (its global ones).
bool holds_nope_layers(const std::string& type) {
  return type == "smollm3" || type == "cohere2" || type == "exaone4";
}

bool is_gemma(const std::string& type) {
  return type == "gemma" || type == "gemma2" || type == "gemma3_text";
}

// Granite's classes: its dense blocks, and its mixtures of experts.
bool is_granite(const std::string& type) {
  return type == "granite" || type == "granitemoe" || type == "granitemoeshared";
}

bool is_granite_moe(const std::string& type) {
  return type == "granitemoe" || type == "granitemoeshared";
}

// The reasons a class cannot hold a model, joined by commas.
struct Misfit {
  std::string why;
  void add(bool bad, const std::string& what) {
    if (bad) why += (why.empty() ? "" : ", ") + what;
  }
};

// What keeps `c` from each class, "" when nothing does. LLaMA's, Qwen2's
// and Qwen3's blocks differ only in Qwen2's q, k and v biases and Qwen3's
// query/key norms; Gemma's in GeGLU, its embedding multiplier of
// sqrt(d_model) and norms scaling by 1 + weight; Gemma 2's in post-norms
// and windows on any layers; Gemma 3's in query/key norms too and its
// local layers' own RoPE base; Phi-3's in a partial rotation, with heads
// d_model / n_head wide and longrope the only scaling (`type`: llama,
// qwen2, qwen3, gemma, gemma2, gemma3_text or phi3; llama's windows are
// Mistral's).
std::string llama_misfit(const nn::GptConfig& c, const std::string& type) {
  Misfit m;
  auto add = [&](bool bad, const char* what) { m.add(bad, what); };
  const bool gemma = is_gemma(type), sandwich = type == "gemma2" || type == "gemma3_text";
  // OLMo 2's and OLMoE's: heads d_model / n_head wide, no window, query/key
  // norms over all the heads together; OLMo 2's post-norms alone.
  // OLMo 3's: OLMo 2's with windows on any layers (layer_types), the
  // windowed layers turning unscaled.
  const bool olmo3 = type == "olmo3", olmo2 = type == "olmo2" || olmo3,
             olmo = olmo2 || type == "olmoe";
  // EXAONE 4's: OLMo 2's sublayer norms with Qwen3's query/key norms (the
  // shared rules below require those), its global layers (the window's
  // full ones) without rope.
  const bool exaone4 = type == "exaone4";
  if (exaone4) {
    add(c.pre_norms, "model.pre_norms is true");
    add(!c.post_norms, "model.post_norms is false");
    if (c.sliding_window > 0) {
      add(c.full_attention_layers != c.nope_layers,
          "model.full_attention_layers is not model.nope_layers (EXAONE 4's global layers are "
          "the ones without rope)");
    }
  }
  // OLMo's (the first): LLaMA's blocks with LayerNorms that learn nothing.
  const bool olmo1 = type == "olmo";
  // Granite's: LLaMA's with its multipliers (any embedding multiplier and
  // attention scale; the residual one and the logits' scale are
  // add_granite_departures'), heads d_model / n_head wide, no window.
  const bool granite = type == "granite";
  // Cohere's: LLaMA's sublayers in parallel on one LayerNorm without a bias,
  // heads d_model / n_head wide, no window.
  const bool cohere = is_cohere(type), cohere2 = type == "cohere2";
  if (cohere) {
    add(c.heads_apart(),
        "model.head_dim is not d_model / n_head (Cohere's heads are hidden_size / "
        "num_attention_heads wide)");
    if (!cohere2) add(c.sliding_window > 0, "model.sliding_window is set");
    // Cohere 2's global layers are the ones without rope (with a window,
    // the ones exempt from it).
    if (cohere2 && c.sliding_window > 0) {
      add(c.full_attention_layers != c.nope_layers,
          "model.full_attention_layers is not model.nope_layers (Cohere 2's global layers are "
          "the ones without rope)");
    }
    add(!c.parallel_residual || !c.shared_norm,
        "model.parallel_residual and model.shared_norm are not both set (Cohere's sublayers read "
        "one norm)");
    add(c.norm_bias, "model.norm_bias is true (Cohere's LayerNorms have no bias)");
  }
  if (granite) {
    add(c.heads_apart(),
        "model.head_dim is not d_model / n_head (Granite's heads are hidden_size / "
        "num_attention_heads wide)");
    add(c.sliding_window > 0, "model.sliding_window is set");
  }
  if (olmo1) {
    add(c.heads_apart(),
        "model.head_dim is not d_model / n_head (OLMo's heads are hidden_size / "
        "num_attention_heads wide)");
    add(c.sliding_window > 0, "model.sliding_window is set");
    add(c.norm_affine, "model.norm_affine is true (OLMo's LayerNorms have no weights)");
    add(c.layer_norm_eps != 1e-5, "model.norm_eps is not 1e-5 (OLMo's LayerNorms')");
  }
  if (olmo) {
    add(c.heads_apart(),
        "model.head_dim is not d_model / n_head (OLMo's heads are hidden_size / "
        "num_attention_heads wide)");
    if (!olmo3) add(c.sliding_window > 0, "model.sliding_window is set");
    add(!c.qk_norm_full, "model.qk_norm is not full");
  }
  if (olmo2) {
    add(c.pre_norms, "model.pre_norms is true");
    add(!c.post_norms, "model.post_norms is false");
  }
  add(!c.rotary(), "model.position_embedding is not rope");
  const bool stablelm = type == "stablelm";
  if (type == "phi3") {
    add(c.heads_apart(),
        "model.head_dim is not d_model / n_head (Phi3ForCausalLM's heads are hidden_size / "
        "num_attention_heads wide)");
    add(c.rope_scaling.scaled() && c.rope_scaling.kind != RopeScaling::Kind::LongRope,
        "model.rope_scaling is not longrope (Phi3Config takes longrope only)");
  } else if (stablelm) {
    add(c.heads_apart(),
        "model.head_dim is not d_model / n_head (StableLmForCausalLM's heads are hidden_size / "
        "num_attention_heads wide)");
    add(c.rope_scaling.kind == RopeScaling::Kind::LongRope, "model.rope_scaling is longrope");
    add(c.sliding_window > 0, "model.sliding_window is set");
  } else if (is_glm(type)) {
    add(c.sliding_window > 0, "model.sliding_window is set");
    add(c.rope_scaling.scaled(), "model.rope_scaling is set (GLM's files turn unscaled)");
  } else if (type == "glm4_moe" || type == "minimax_m2") {
    // (A partial rotation in halves, as StableLM's; MiniMax-M2's query/key
    // norms span all the heads, as OLMo 2's.)
    add(c.sliding_window > 0, "model.sliding_window is set");
    add(c.rope_scaling.kind == RopeScaling::Kind::LongRope, "model.rope_scaling is longrope");
    if (type == "minimax_m2") add(!c.qk_norm_full, "model.qk_norm is not full");
  } else {
    if (type == "helium" || type == "seed_oss" || type == "arcee")
      add(c.sliding_window > 0, "model.sliding_window is set");
    add(c.rope_dim > 0,
        "model.rope_dim turns part of each head (only Phi-3, StableLM, GLM, GLM-4.5 and "
        "MiniMax-M2 turn part)");
  }
  if (gemma) {
    const double root = std::sqrt(static_cast<double>(c.d_model));
    add(c.activation != nn::Activation::GeGlu, "model.activation is not geglu");
    add(std::abs(c.embedding_multiplier - root) > 1e-9 * root,
        "model.embedding_multiplier is not sqrt(d_model)");
    add(!c.norm_weight_offset, "model.norm_weight_offset is false");
    if (!sandwich) add(c.sliding_window > 0, "model.sliding_window is set");
  } else if (type == "arcee") {  // Nemotron's ungated MLP
    add(c.gated_mlp(), "model.activation is not relu2, gelu or gelu_erf");
    add(c.embedding_multiplier != 1.0, "model.embedding_multiplier is not 1");
    add(c.norm_weight_offset, "model.norm_weight_offset is true");
  } else {
    add(c.activation != nn::Activation::SwiGlu, "model.activation is not swiglu");
    if (!granite) add(c.embedding_multiplier != 1.0, "model.embedding_multiplier is not 1");
    add(c.norm_weight_offset, "model.norm_weight_offset is true");
  }
  if (!sandwich && !granite) {
    add(c.query_pre_attn_scalar > 0.0 &&
            c.query_pre_attn_scalar != static_cast<double>(c.head_dim()),
        "model.query_pre_attn_scalar is not head_dim");
  }
  // (GLM-4's four norms are Gemma 2's without their offset.)
  if (sandwich || type == "glm4") add(!c.post_norms, "model.post_norms is false");
  if (!sandwich) {
    if (!olmo2 && type != "glm4" && !exaone4) add(c.post_norms, "model.post_norms is true");
    add(c.attn_logit_softcap > 0.0, "model.attn_logit_softcap is set");
    add(c.final_logit_softcap > 0.0, "model.final_logit_softcap is set");
  }
  if (type == "gemma3_text") {
    // Its local layers turn unscaled: a scaled model.rope_theta there needs
    // model.rope_local_theta.
    add(c.sliding_window > 0 && c.rope_local_theta == 0.0 && c.rope_scaling.scaled(),
        "the windowed layers' RoPE is scaled");
  } else if (olmo3) {
    // Its windowed layers turn at rope_theta, unscaled.
    add(c.rope_local_theta > 0.0 &&
            (c.rope_local_theta != c.rope_theta || !c.rope_scaling.scaled()),
        "model.rope_local_theta is not rope_theta under a scaled RoPE (OLMo 3's windowed layers "
        "turn unscaled at its base)");
    add(c.sliding_window > 0 && c.rope_scaling.scaled() && c.rope_local_theta == 0.0,
        "the windowed layers' RoPE is scaled");
  } else {
    add(c.rope_local_theta > 0.0, "model.rope_local_theta is set");
  }
  if (stablelm || olmo1 || cohere) {
    add(c.rms_norm(), "model.normalization is not layernorm");
  } else {
    add(!c.rms_norm(), "model.normalization is not rmsnorm");
  }
  add(c.linear_bias, "model.linear_bias is true");
  add(c.mlp_bias, "model.mlp_bias is true");
  add(c.head_bias, "model.head_bias is true");
  if (stablelm) {  // StableLM's parallel blocks share one norm
    add(c.parallel_residual && !c.shared_norm,
        "model.parallel_residual is true without model.shared_norm");
  } else if (!cohere) {
    add(c.parallel_residual, "model.parallel_residual is true");
  }
  if (type == "qwen2") add(!c.qkv_bias, "model.qkv_bias is false");
  if (type != "qwen2" && !stablelm && !is_glm(type) && type != "helium" && type != "glm4_moe" &&
      type != "seed_oss")
    add(c.qkv_bias, "model.qkv_bias is true");
  // Query/key norms: Qwen3's and Gemma 3's on each head, OLMo's over all
  // heads (above), and the LayerNorms on each head of Command R+
  // (CohereConfig's use_qk_norm; Cohere 2's has none) and StableLM 2 12B
  // (StableLmConfig's qk_layernorm).
  const bool qk =
      type == "qwen3" || type == "gemma3_text" || olmo || exaone4 || type == "minimax_m2";
  if (type == "cohere" || stablelm) {
    add(c.qk_norm && !c.qk_head_layernorm, "model.qk_norm is not head_layernorm or false");
  } else {
    if (qk) add(!c.qk_norm, "model.qk_norm is false");
    // (GLM-4.5's are Qwen3's, under use_qk_norm.)
    if (!qk && type != "glm4_moe") add(c.qk_norm, "model.qk_norm is true");
    add(c.qk_head_layernorm, "model.qk_norm is head_layernorm (only Cohere's and StableLM's are)");
  }
  // Mistral windows every layer; Qwen every layer from max_window_layers
  // on; Gemma 2 and 3 any layers (layer_types).
  // SmolLM3 any layers too (layer_types, under use_sliding_window), Cohere
  // 2 its global ones (above).
  if (type == "llama" || type == "gemma" || type == "phi3" || stablelm || (olmo && !olmo3) ||
      olmo1 || granite || (cohere && !cohere2) || is_glm(type) || type == "helium" ||
      type == "seed_oss" || type == "glm4_moe" || type == "minimax_m2" || type == "arcee") {
    add(!c.full_attention_layers.empty(),
        "model.full_attention_layers exempts layers from the window");
  } else if (!sandwich && type != "smollm3" && !cohere2 && !olmo3 && !exaone4) {
    add(!qwen_window_layers(c).has_value(), "model.full_attention_layers is not the first layers");
  }
  return m.why;
}

// The plain GELU blocks' (GPT-2's, GPT-NeoX's, Phi's, Falcon's, GPT-J's)
// shared ground: an ungated GELU (either form), LayerNorm, heads d_model /
// n_head wide, and none of the later families' departures (windows,
// query/key norms, Gemma's multiplier and norm offset, post-norms, soft
// caps). With `rotary`, rope without their rotary departures too (a
// per-head scale, a local base, Phi-3's longrope).
void add_plain_departures(const nn::GptConfig& c, bool rotary, Misfit& m) {
  m.add(c.gated_mlp(), "model.activation is not gelu or gelu_erf");
  m.add(c.rms_norm(), "model.normalization is rmsnorm");
  m.add(c.sliding_window > 0, "model.sliding_window is set");
  m.add(c.heads_apart(), "model.head_dim is not d_model / n_head");
  m.add(c.qk_norm, "model.qk_norm is true");
  m.add(c.embedding_multiplier != 1.0, "model.embedding_multiplier is not 1");
  m.add(c.norm_weight_offset, "model.norm_weight_offset is true");
  m.add(c.post_norms, "model.post_norms is true");
  m.add(c.attn_logit_softcap > 0.0, "model.attn_logit_softcap is set");
  m.add(c.final_logit_softcap > 0.0, "model.final_logit_softcap is set");
  if (!rotary) return;
  m.add(!c.rotary(), "model.position_embedding is not rope");
  m.add(
      c.query_pre_attn_scalar > 0.0 && c.query_pre_attn_scalar != static_cast<double>(c.head_dim()),
      "model.query_pre_attn_scalar is not head_dim");
  m.add(c.rope_local_theta > 0.0, "model.rope_local_theta is set");
  m.add(c.rope_scaling.kind == RopeScaling::Kind::LongRope, "model.rope_scaling is longrope");
}

// What keeps `c` from GPT-2's, GPT-NeoX's and Phi's blocks alike: the plain
// blocks' ground with biases on every linear layer. `phi`: Phi's blocks
// (grouped key/value heads allowed; one norm shared by the parallel
// sublayers and a biased head required), else GPT-2's and GPT-NeoX's (a
// key/value head per query head; neither of Phi's two).
Misfit plain_block_misfit(const nn::GptConfig& c, bool phi, bool rotary) {
  Misfit m;
  m.add(!c.linear_bias, "model.linear_bias is false");
  if (phi) {
    m.add(!c.shared_norm, "model.shared_norm is false");
    m.add(!c.head_bias, "model.head_bias is false");
  } else {
    m.add(c.kv_heads() != c.n_head, "model.n_kv_head groups the heads");
    m.add(c.shared_norm, "model.shared_norm is true");
    m.add(c.head_bias, "model.head_bias is true");
  }
  add_plain_departures(c, rotary, m);
  return m;
}

std::string gpt2_misfit(const nn::GptConfig& c) {
  Misfit m = plain_block_misfit(c, false, false);
  m.add(c.rotary(), "model.position_embedding is rope");
  m.add(c.parallel_residual, "model.parallel_residual is true");
  return m.why;
}

// GPTNeoXForCausalLM: GPT-2's blocks with rotary embeddings on any share of
// each head (no window, no per-head scale), either residual wiring, and any
// RoPE scaling but longrope (Phi-3's, tied to its own config keys).
// PhiForCausalLM (`phi`) the same with Phi's blocks (plain_block_misfit).
std::string rotary_plain_misfit(const nn::GptConfig& c, bool phi) {
  return plain_block_misfit(c, phi, true).why;
}

// FalconForCausalLM: parallel blocks with one norm for both sublayers or
// one each, rotary embeddings on whole heads, biases on every linear layer
// or none, no head bias, any count of key/value heads.
std::string falcon_misfit(const nn::GptConfig& c) {
  Misfit m;
  m.add(c.qkv_bias && !c.linear_bias, "model.qkv_bias without model.linear_bias");
  m.add(c.mlp_bias && !c.linear_bias, "model.mlp_bias without model.linear_bias");
  m.add(c.head_bias, "model.head_bias is true");
  m.add(!c.parallel_residual, "model.parallel_residual is false");
  m.add(c.rope_dim > 0, "model.rope_dim turns part of each head");
  add_plain_departures(c, true, m);
  return m.why;
}

// GPTJForCausalLM: the parallel residual with one norm, biases on the MLP
// alone, a biased untied head, rotary embeddings on any share of each head
// (turned in interleaved pairs: the export reorders q's and k's rows) at
// GPT-J's fixed base of 10000, unscaled, and a key/value head per query
// head.
std::string gptj_misfit(const nn::GptConfig& c) {
  Misfit m;
  m.add(c.linear_bias || c.qkv_bias, "the attention has biases");
  m.add(!c.mlp_biases(), "model.mlp_bias is false");
  m.add(!c.head_bias, "model.head_bias is false");
  m.add(!c.shared_norm, "model.shared_norm is false");
  m.add(c.rope_theta != 10000.0, "model.rope_theta is not 10000");
  m.add(c.rope_scaling.scaled(), "model.rope_scaling is set");
  m.add(c.kv_heads() != c.n_head, "model.n_kv_head groups the heads");
  add_plain_departures(c, true, m);
  return m.why;
}

// What the plain sequential rotary blocks (StarCoder2's, Nemotron's) lack:
// query/key norms, an embedding multiplier, post-norms, soft caps, a score
// scale other than the head's, a local RoPE base, and Phi-3's longrope.
void add_later_departures(const nn::GptConfig& c, Misfit& m) {
  m.add(c.qk_norm, "model.qk_norm is true");
  m.add(c.embedding_multiplier != 1.0, "model.embedding_multiplier is not 1");
  m.add(c.post_norms, "model.post_norms is true");
  m.add(c.attn_logit_softcap > 0.0, "model.attn_logit_softcap is set");
  m.add(c.final_logit_softcap > 0.0, "model.final_logit_softcap is set");
  m.add(
      c.query_pre_attn_scalar > 0.0 && c.query_pre_attn_scalar != static_cast<double>(c.head_dim()),
      "model.query_pre_attn_scalar is not head_dim");
  m.add(c.rope_local_theta > 0.0, "model.rope_local_theta is set");
  m.add(c.rope_scaling.kind == RopeScaling::Kind::LongRope, "model.rope_scaling is longrope");
}

// Starcoder2ForCausalLM: the sequential block with rotary embeddings on
// whole heads, LayerNorm, an ungated GELU (either form), biases on every
// linear layer or none (the norms keep theirs), no head bias, any count of
// key/value heads, and a window on every layer or none.
std::string starcoder2_misfit(const nn::GptConfig& c) {
  Misfit m;
  m.add(!c.rotary(), "model.position_embedding is not rope");
  m.add(c.rope_dim > 0, "model.rope_dim turns part of each head");
  m.add(c.gated_mlp(), "model.activation is not gelu or gelu_erf");
  m.add(c.rms_norm(), "model.normalization is rmsnorm");
  m.add(c.qkv_bias && !c.linear_bias, "model.qkv_bias without model.linear_bias");
  m.add(c.mlp_bias && !c.linear_bias, "model.mlp_bias without model.linear_bias");
  m.add(c.head_bias, "model.head_bias is true");
  m.add(c.parallel_residual, "model.parallel_residual is true");
  m.add(!c.full_attention_layers.empty(),
        "model.full_attention_layers exempts layers from the window");
  m.add(c.heads_apart(), "model.head_dim is not d_model / n_head");
  m.add(c.norm_weight_offset, "model.norm_weight_offset is true");
  add_later_departures(c, m);
  return m.why;
}

// NemotronForCausalLM: the sequential block with rotary embeddings on any
// share of each head (turned in halves), LayerNorm1P (a LayerNorm with its
// bias, scaling by 1 + weight), an ungated MLP of squared ReLU or GELU
// (either form), biases on every linear layer, on the MLP alone or none, no
// head bias, any count of key/value heads and width of head, no window, and
// any RoPE scaling but longrope.
std::string nemotron_misfit(const nn::GptConfig& c) {
  Misfit m;
  m.add(!c.rotary(), "model.position_embedding is not rope");
  m.add(c.gated_mlp(), "model.activation is not relu2, gelu or gelu_erf");
  m.add(c.rms_norm(), "model.normalization is rmsnorm");
  m.add(!c.norm_weight_offset,
        "model.norm_weight_offset is false (Nemotron's LayerNorm1P scales by 1 + weight)");
  m.add(c.qkv_bias && !c.linear_bias, "model.qkv_bias without model.linear_bias");
  m.add(c.head_bias, "model.head_bias is true");
  m.add(c.parallel_residual, "model.parallel_residual is true");
  m.add(c.sliding_window > 0, "model.sliding_window is set");
  add_later_departures(c, m);
  return m.why;
}

// CodeGenForCausalLM: GPT-J's blocks with q, k and v fused in
// kCodegenShards shards of whole heads.
std::string codegen_misfit(const nn::GptConfig& c) {
  Misfit m{gptj_misfit(c)};
  const std::string shards = std::to_string(kCodegenShards);
  m.add(c.n_head % kCodegenShards != 0, "model.n_head is not a multiple of " + shards +
                                            " (its q, k and v are fused in " + shards +
                                            " shards of whole heads)");
  return m.why;
}

// Phi-3's partial_rotary_factor for model.rope_dim: the share of the head
// that Hugging Face's int(head_dim * factor) turns back into rope_dim.
double partial_rotary_factor(const nn::GptConfig& c) {
  if (c.rope_dim == 0) return 1.0;
  const auto D = static_cast<double>(c.head_dim());
  double f = static_cast<double>(c.rope_dim) / D;
  while (static_cast<int64_t>(D * f) < c.rope_dim) f = std::nextafter(f, 2.0);
  return f;
}

// Phi-3's context lengths and RoPE scaling, in the form Phi3Config has
// always read: longrope as exactly type, short_factor and long_factor (the
// form older transformers insist on), its factor implied by
// max_position_embeddings / original_max_position_embeddings, and the
// attention factor derived from that, as Phi-3's own files write it.
// max_position_embeddings is the longrope factor's stretch of the original
// context (Phi-3.5-mini's 131072 over 4096); an attention factor the two
// lengths do not imply is written out as attention_factor, which only newer
// transformers read.
void write_phi3_rope(const nn::GptConfig& c, nlohmann::ordered_json& j) {
  const RopeScaling& r = c.rope_scaling;
  if (!r.scaled()) {
    j["max_position_embeddings"] = c.seq_len;
    j["original_max_position_embeddings"] = c.seq_len;
    j["rope_scaling"] = nullptr;
    return;
  }
  const double original = r.original_seq_len, stretched = r.factor * original;
  const bool whole = original == std::floor(original) && stretched == std::floor(stretched);
  const auto positions = whole ? static_cast<int64_t>(stretched) : c.seq_len;
  j["max_position_embeddings"] = positions;
  j["original_max_position_embeddings"] = static_cast<int64_t>(original);
  nlohmann::ordered_json s{{"type", "longrope"},
                           {"short_factor", rope_factors(r, false)},
                           {"long_factor", rope_factors(r, true)}};
  RopeScaling ours = r, implied = r;
  ours.amplitude = implied.amplitude = 1.0;
  implied.attention_factor = 0.0;
  implied.factor = static_cast<double>(positions) / original;
  const double a = rope_amplitude(ours), b = rope_amplitude(implied);
  if (std::abs(a - b) > 1e-12 * std::abs(a)) s["attention_factor"] = a;
  j["rope_scaling"] = s;
}

// rope_scaling in the form every class but Phi-3 reads: rope_type and the
// kind's keys, or null.
void write_rope_scaling(const nn::GptConfig& c, nlohmann::ordered_json& j) {
  if (!c.rope_scaling.scaled()) {
    j["rope_scaling"] = nullptr;
    return;
  }
  const RopeScaling& r = c.rope_scaling;
  nlohmann::ordered_json s{{"rope_type", rope_scaling_name(r.kind)}};
  if (r.kind == RopeScaling::Kind::LongRope) {
    // Hugging Face takes the switch to the long factors from the
    // top-level original context, and the attention factor written
    // out (whatever max_position_embeddings says).
    s["short_factor"] = rope_factors(r, false);
    s["long_factor"] = rope_factors(r, true);
    RopeScaling unit = r;
    unit.amplitude = 1.0;
    s["attention_factor"] = rope_amplitude(unit);
    s["factor"] = r.factor;
    j["original_max_position_embeddings"] = static_cast<int64_t>(r.original_seq_len);
  }
  for (const auto& k : rope_scaling_keys(r.kind)) {
    if (r.kind == RopeScaling::Kind::LongRope) break;  // (written above)
    const double x = r.*k.field;
    if (k.field == &RopeScaling::original_seq_len) {
      s[k.name] = static_cast<int64_t>(x);  // a count of positions
    } else if (k.field != &RopeScaling::attention_factor || x > 0) {
      s[k.name] = x;  // (yarn's default attention factor is written as its absence)
    }
  }
  j["rope_scaling"] = s;
}

// The class and the widths and depth every class but GPT-2's names alike
// (the MLP's width as `ffn_key`).
void write_dimensions(const nn::GptConfig& c, const char* architecture, const std::string& type,
                      nlohmann::ordered_json& j, const char* ffn_key = "intermediate_size") {
  j["architectures"] = nlohmann::ordered_json::array({architecture});
  j["model_type"] = type;
  j["hidden_size"] = c.d_model;
  j[ffn_key] = c.ffn();
  j["num_hidden_layers"] = c.n_layer;
  j["num_attention_heads"] = c.n_head;
}

// GPTNeoXConfig's keys: rotary_pct the share of each head that turns,
// rotary_emb_base RoPE's base, use_parallel_residual the wiring.
void write_neox_config(const nn::GptConfig& c, nlohmann::ordered_json& j) {
  write_dimensions(c, "GPTNeoXForCausalLM", "gpt_neox", j);
  j["hidden_act"] = c.activation == nn::Activation::GeluErf ? "gelu" : "gelu_new";
  j["rotary_pct"] = partial_rotary_factor(c);
  j["rotary_emb_base"] = c.rope_theta;
  j["max_position_embeddings"] = c.seq_len;
  j["layer_norm_eps"] = c.layer_norm_eps;
  j["use_parallel_residual"] = c.parallel_residual;
  j["attention_bias"] = true;
  write_rope_scaling(c, j);
  // Its dropouts are Triad's: after the embeddings and each residual
  // projection (hidden_dropout), none on the attention's probabilities.
  j["hidden_dropout"] = c.dropout;
  j["attention_dropout"] = 0.0;
}

// PhiConfig's keys: partial_rotary_factor the share of each head that
// turns; the parallel residual with one norm and the biased head implied.
void write_phi_config(const nn::GptConfig& c, nlohmann::ordered_json& j) {
  write_dimensions(c, "PhiForCausalLM", "phi", j);
  j["num_key_value_heads"] = c.kv_heads();
  j["hidden_act"] = c.activation == nn::Activation::GeluErf ? "gelu" : "gelu_new";
  j["max_position_embeddings"] = c.seq_len;
  j["layer_norm_eps"] = c.layer_norm_eps;
  j["rope_theta"] = c.rope_theta;
  write_rope_scaling(c, j);
  j["partial_rotary_factor"] = partial_rotary_factor(c);
  j["qk_layernorm"] = false;
  // Its dropouts are Triad's: after the embeddings (embd_pdrop) and each
  // sublayer's output (resid_pdrop), none on the attention's probabilities.
  j["embd_pdrop"] = c.dropout;
  j["resid_pdrop"] = c.dropout;
  j["attention_dropout"] = 0.0;
}

// FalconConfig's keys: Falcon 7B's form (multi_query or one key/value head
// per query head, parallel_attn's one norm) when it holds the model, the
// new decoder architecture's (num_kv_heads, num_ln_in_parallel_attn) for
// the rest; `bias` every linear layer's.
void write_falcon_config(const nn::GptConfig& c, nlohmann::ordered_json& j) {
  write_dimensions(c, "FalconForCausalLM", "falcon", j, "ffn_hidden_size");
  const int64_t kv = c.kv_heads();
  const bool classic = c.shared_norm && (kv == 1 || kv == c.n_head);
  j["new_decoder_architecture"] = !classic;
  j["multi_query"] = kv == 1;
  j["parallel_attn"] = true;
  if (!classic) {
    j["num_kv_heads"] = kv;
    j["num_ln_in_parallel_attn"] = c.shared_norm ? 1 : 2;
  }
  j["bias"] = c.linear_bias;
  j["alibi"] = false;
  j["activation"] = c.activation == nn::Activation::GeluErf ? "gelu" : "gelu_new";
  j["max_position_embeddings"] = c.seq_len;
  j["layer_norm_epsilon"] = c.layer_norm_eps;
  j["rope_theta"] = c.rope_theta;
  write_rope_scaling(c, j);
  // Its dropouts are Triad's: after each sublayer's output (hidden_dropout),
  // none on the attention's probabilities.
  j["hidden_dropout"] = c.dropout;
  j["attention_dropout"] = 0.0;
}

// Starcoder2Config's keys: norm_epsilon, use_bias every linear layer's,
// sliding_window every layer's (null: none).
void write_starcoder2_config(const nn::GptConfig& c, nlohmann::ordered_json& j) {
  write_dimensions(c, "Starcoder2ForCausalLM", "starcoder2", j);
  j["num_key_value_heads"] = c.kv_heads();
  j["hidden_act"] = c.activation == nn::Activation::GeluErf ? "gelu" : "gelu_pytorch_tanh";
  j["max_position_embeddings"] = c.seq_len;
  j["norm_epsilon"] = c.layer_norm_eps;
  j["rope_theta"] = c.rope_theta;
  write_rope_scaling(c, j);
  j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nullptr;
  j["use_bias"] = c.linear_bias;
  // Its dropouts are Triad's: after the embeddings and each sublayer's
  // output, none on the attention's probabilities.
  j["embedding_dropout"] = c.dropout;
  j["residual_dropout"] = c.dropout;
  j["attention_dropout"] = 0.0;
}

// Nemotron's ungated MLP's hidden_act (its class's and Arcee's): relu2, or
// a GELU form by Hugging Face's name.
const char* ungated_act_name(const nn::GptConfig& c) {
  return c.activation == nn::Activation::Relu2     ? "relu2"
         : c.activation == nn::Activation::GeluErf ? "gelu"
                                                   : "gelu_pytorch_tanh";
}

// NemotronConfig's keys: norm_eps, partial_rotary_factor the share of each
// head that turns, head_dim, hidden_act relu2 (or a GELU), attention_bias
// (q, k, v and o_proj) and mlp_bias (up_proj and down_proj).
void write_nemotron_config(const nn::GptConfig& c, nlohmann::ordered_json& j) {
  write_dimensions(c, "NemotronForCausalLM", "nemotron", j);
  j["num_key_value_heads"] = c.kv_heads();
  j["head_dim"] = c.head_dim();
  j["hidden_act"] = ungated_act_name(c);
  j["max_position_embeddings"] = c.seq_len;
  j["norm_eps"] = c.layer_norm_eps;
  j["rope_theta"] = c.rope_theta;
  write_rope_scaling(c, j);
  j["partial_rotary_factor"] = partial_rotary_factor(c);
  j["attention_bias"] = c.linear_bias;
  j["mlp_bias"] = c.mlp_biases();
  // NemotronConfig's one dropout is on the attention's probabilities, which
  // Triad keeps; its own (the embeddings' and each sublayer's output's) has
  // no key here: the same model for inference, a close cousin for training.
  j["attention_dropout"] = 0.0;
}

// GPTJConfig's keys: GPT-2's names for the widths and depth, rotary_dim
// the dimensions of each head that turn.
void write_gptj_config(const nn::GptConfig& c, nlohmann::ordered_json& j, bool codegen) {
  j["architectures"] =
      nlohmann::ordered_json::array({codegen ? "CodeGenForCausalLM" : "GPTJForCausalLM"});
  j["model_type"] = codegen ? "codegen" : "gptj";
  j["n_embd"] = c.d_model;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["n_positions"] = c.seq_len;
  j["n_ctx"] = c.seq_len;
  j["n_inner"] = c.ffn() != 4 * c.d_model ? nlohmann::ordered_json(c.ffn()) : nullptr;
  j["rotary_dim"] = c.rotary_width();
  j["activation_function"] = c.activation == nn::Activation::GeluErf ? "gelu" : "gelu_new";
  j["layer_norm_epsilon"] = c.layer_norm_eps;
  // Its dropouts are Triad's: after the embeddings (embd_pdrop) and each
  // sublayer's output (resid_pdrop), none on the attention's probabilities.
  j["resid_pdrop"] = c.dropout;
  j["embd_pdrop"] = c.dropout;
  j["attn_pdrop"] = 0.0;
}

const Tensor& at(const nn::StateDict& s, const std::string& name) {
  auto it = s.find(name);
  if (it == s.end()) throw ValueError("export: the state dict has no '" + name + "'");
  return it->second;
}

// The tensors outside the blocks under a class's names (`embedding`, the
// final `norm`, the `head`): the token embedding, the final norm's weight
// and bias (those the model has), and an untied head with its bias (when it
// has one).
std::map<std::string, Tensor> outside_part(const nn::StateDict& full, const nn::GptConfig& c,
                                           const std::string& embedding, const std::string& norm,
                                           const std::string& head) {
  std::map<std::string, Tensor> out;
  out[embedding + ".weight"] = at(full, "wte.weight");
  if (c.norm_weights()) out[norm + ".weight"] = at(full, "ln_f.weight");
  if (c.norm_biases()) out[norm + ".bias"] = at(full, "ln_f.bias");
  if (!c.tie_embeddings) out[head + ".weight"] = at(full, "lm_head.weight");
  if (c.head_bias) out[head + ".bias"] = at(full, "lm_head.bias");
  return out;
}

// Block `block`'s c_attn weight or bias (`kind`), [q | k | v], checked
// against the configured model's height.
const Tensor& checked_qkv(const nn::StateDict& full, const nn::GptConfig& c, int64_t block,
                          const std::string& kind) {
  const int64_t rows = c.qkv_width();
  const Tensor& qkv = at(full, "h." + std::to_string(block) + ".attn.c_attn" + kind);
  if (qkv.dim() < 1 || qkv.size(0) != rows) {
    throw ShapeError("export: layer " + std::to_string(block) + "'s c_attn" + kind + " " +
                     shape_str(qkv.shape()) + " is not " + std::to_string(rows) +
                     " tall, as the configured model's");
  }
  return qkv;
}

// The same split into `prefix` + q_proj, k_proj and v_proj (LLaMA's names
// under self_attn.), q's and k's heads (their rotated rows: c.rope_dim, or
// all) first turned into interleaved pairs when `interleaved` (Cohere's,
// GLM's).
void split_qkv(const nn::StateDict& full, const nn::GptConfig& c, int64_t block,
               const std::string& kind, const std::string& prefix,
               std::map<std::string, Tensor>& out, bool interleaved = false) {
  const int64_t Q = c.q_width(), KV = c.kv_heads() * c.head_dim();
  const Tensor& qkv = checked_qkv(full, c, block, kind);
  const Tensor rows =
      interleaved ? triad_qkv_rows_to_interleaved(qkv, c.n_head, c.kv_heads(), c.rope_dim) : qkv;
  out[prefix + "q_proj" + kind] = contiguous(narrow(rows, 0, 0, Q)).detach();
  out[prefix + "k_proj" + kind] = contiguous(narrow(rows, 0, Q, KV)).detach();
  out[prefix + "v_proj" + kind] = contiguous(narrow(rows, 0, Q + KV, KV)).detach();
}

// GPT-NeoX's names for the tensors outside the blocks (block -1) or of block
// `block`; c_attn's rows interleaved by head as query_key_value holds them.
std::map<std::string, Tensor> triad_to_neox_part(const nn::StateDict& full, const nn::GptConfig& c,
                                                 int64_t block) {
  std::map<std::string, Tensor> out;
  if (block < 0)
    return outside_part(full, c, "gpt_neox.embed_in", "gpt_neox.final_layer_norm", "embed_out");
  static const std::pair<const char*, const char*> kNames[] = {
      {"ln_1", "input_layernorm"},
      {"ln_2", "post_attention_layernorm"},
      {"attn.c_attn", "attention.query_key_value"},
      {"attn.c_proj", "attention.dense"},
      {"mlp.c_fc", "mlp.dense_h_to_4h"},
      {"mlp.c_proj", "mlp.dense_4h_to_h"}};
  const std::string p = "h." + std::to_string(block) + ".";
  const std::string hf = "gpt_neox.layers." + std::to_string(block) + ".";
  for (const auto& [ours, theirs] : kNames) {
    for (const char* kind : {".weight", ".bias"}) {
      const Tensor& t = at(full, p + ours + kind);
      out[hf + theirs + kind] =
          std::string(ours) == "attn.c_attn" ? triad_qkv_rows_to_neox(t, c.n_head) : t;
    }
  }
  return out;
}

// Phi's names for the tensors outside the blocks (block -1) or of block
// `block`: c_attn split into q_proj, k_proj and v_proj, weights and biases.
std::map<std::string, Tensor> triad_to_phi_part(const nn::StateDict& full, const nn::GptConfig& c,
                                                int64_t block) {
  std::map<std::string, Tensor> out;
  if (block < 0)
    return outside_part(full, c, "model.embed_tokens", "model.final_layernorm", "lm_head");
  static const std::pair<const char*, const char*> kNames[] = {{"ln_1", "input_layernorm"},
                                                               {"attn.c_proj", "self_attn.dense"},
                                                               {"mlp.c_fc", "mlp.fc1"},
                                                               {"mlp.c_proj", "mlp.fc2"}};
  const std::string p = "h." + std::to_string(block) + ".";
  const std::string hf = "model.layers." + std::to_string(block) + ".";
  for (const char* kind : {".weight", ".bias"}) {
    for (const auto& [ours, theirs] : kNames) out[hf + theirs + kind] = at(full, p + ours + kind);
    split_qkv(full, c, block, kind, hf + "self_attn.", out);
  }
  return out;
}

// GPT-J's names for the tensors outside the blocks (block -1) or of block
// `block`: c_attn split into q_proj, k_proj and v_proj, q's and k's rotated
// dimensions back in GPT-J's interleaved pairs.
std::map<std::string, Tensor> triad_to_gptj_part(const nn::StateDict& full, const nn::GptConfig& c,
                                                 int64_t block, bool codegen) {
  std::map<std::string, Tensor> out;
  if (block < 0) return outside_part(full, c, "transformer.wte", "transformer.ln_f", "lm_head");
  const std::string p = "h." + std::to_string(block) + ".";
  const std::string hf = "transformer.h." + std::to_string(block) + ".";
  const int64_t Q = c.q_width();
  const Tensor qkv =
      triad_qkv_rows_to_gptj(at(full, p + "attn.c_attn.weight"), c.n_head, c.rotary_width());
  if (codegen) {
    out[hf + "attn.qkv_proj.weight"] = stack_qkv_rows_to_codegen(qkv, c.n_head);
  } else {
    out[hf + "attn.q_proj.weight"] = contiguous(narrow(qkv, 0, 0, Q)).detach();
    out[hf + "attn.k_proj.weight"] = contiguous(narrow(qkv, 0, Q, Q)).detach();
    out[hf + "attn.v_proj.weight"] = contiguous(narrow(qkv, 0, 2 * Q, Q)).detach();
  }
  out[hf + "attn.out_proj.weight"] = at(full, p + "attn.c_proj.weight");
  for (const char* kind : {".weight", ".bias"}) {
    out[hf + "ln_1" + kind] = at(full, p + "ln_1" + kind);
    out[hf + "mlp.fc_in" + kind] = at(full, p + "mlp.c_fc" + kind);
    out[hf + "mlp.fc_out" + kind] = at(full, p + "mlp.c_proj" + kind);
  }
  return out;
}

// The plain sequential rotary blocks' names (StarCoder2's, Nemotron's) for
// the tensors outside the blocks (block -1) or of block `block`: LLaMA's
// attention (o_proj biased too, under model.linear_bias), the ungated MLP
// as mlp.`fc` and mlp.`proj` (biased under either bias key), LayerNorms
// with their biases.
std::map<std::string, Tensor> sequential_rotary_part(const nn::StateDict& full,
                                                     const nn::GptConfig& c, int64_t block,
                                                     const std::string& fc,
                                                     const std::string& proj) {
  std::map<std::string, Tensor> out;
  if (block < 0) return outside_part(full, c, "model.embed_tokens", "model.norm", "lm_head");
  const std::string p = "h." + std::to_string(block) + ".";
  const std::string hf = "model.layers." + std::to_string(block) + ".";
  for (const std::string kind : {".weight", ".bias"}) {
    if (kind == ".weight" || c.linear_bias) {
      split_qkv(full, c, block, kind, hf + "self_attn.", out);
      out[hf + "self_attn.o_proj" + kind] = at(full, p + "attn.c_proj" + kind);
    }
    if (kind == ".weight" || c.mlp_biases()) {
      out[hf + "mlp." + fc + kind] = at(full, p + "mlp.c_fc" + kind);
      out[hf + "mlp." + proj + kind] = at(full, p + "mlp.c_proj" + kind);
    }
    out[hf + "input_layernorm" + kind] = at(full, p + "ln_1" + kind);
    out[hf + "post_attention_layernorm" + kind] = at(full, p + "ln_2" + kind);
  }
  return out;
}

// Falcon's names for the tensors outside the blocks (block -1) or of block
// `block`; c_attn's rows grouped by key/value head as query_key_value holds
// them, and ln_attn and ln_mlp (or the one input_layernorm) for the norms.
std::map<std::string, Tensor> triad_to_falcon_part(const nn::StateDict& full,
                                                   const nn::GptConfig& c, int64_t block) {
  std::map<std::string, Tensor> out;
  if (block < 0)
    return outside_part(full, c, "transformer.word_embeddings", "transformer.ln_f", "lm_head");
  static const std::pair<const char*, const char*> kNames[] = {
      {"attn.c_attn", "self_attention.query_key_value"},
      {"attn.c_proj", "self_attention.dense"},
      {"mlp.c_fc", "mlp.dense_h_to_4h"},
      {"mlp.c_proj", "mlp.dense_4h_to_h"}};
  const std::string p = "h." + std::to_string(block) + ".";
  const std::string hf = "transformer.h." + std::to_string(block) + ".";
  for (const auto& [ours, theirs] : kNames) {
    for (const std::string kind : {".weight", ".bias"}) {
      if (kind == ".bias" && !c.linear_bias) continue;
      const Tensor& t = at(full, p + ours + kind);
      out[hf + theirs + kind] = std::string(ours) == "attn.c_attn"
                                    ? triad_qkv_rows_to_falcon(t, c.n_head, c.kv_heads())
                                    : t;
    }
  }
  for (const char* kind : {".weight", ".bias"}) {
    if (c.shared_norm) {
      out[hf + "input_layernorm" + kind] = at(full, p + "ln_1" + kind);
    } else {
      out[hf + "ln_attn" + kind] = at(full, p + "ln_1" + kind);
      out[hf + "ln_mlp" + kind] = at(full, p + "ln_2" + kind);
    }
  }
  return out;
}

// GraniteMoE's fused experts of block `block`: every expert's c_fc stacked
// into block_sparse_moe.input_linear (E, 2F, C), its c_proj into
// output_linear (E, C, F), the router as router.layer; GraniteMoeShared's
// shared expert as shared_mlp's input_linear and output_linear.
// Block `block`'s latent attention (model.mla) under DeepSeek-V3's names
// at `prefix` (q_a_proj, q_a_layernorm, q_b_proj or q_proj,
// kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj), the rope rows of each
// query head and of the shared key back in interleaved pairs.
void put_latent_attention(const nn::StateDict& full, const nn::GptConfig& c, int64_t block,
                          const std::string& prefix, std::map<std::string, Tensor>& out) {
  const std::string p = "h." + std::to_string(block) + ".attn.";
  const auto& a = c.mla;
  const int64_t qk = c.latent_qk_dim(), rope = a.qk_rope_head_dim;
  auto checked = [&](const std::string& name, const Shape& shape) -> const Tensor& {
    const Tensor& t = at(full, p + name);
    if (t.shape() != shape) {
      throw ShapeError("export: '" + p + name + "' is " + shape_str(t.shape()) + ", expected " +
                       shape_str(shape) + " for the configured model.mla");
    }
    return t;
  };
  if (a.q_lora_rank > 0) {
    out[prefix + "q_a_proj.weight"] = checked("q_a_proj.weight", {a.q_lora_rank, c.d_model});
    out[prefix + "q_a_layernorm.weight"] = checked("q_a_norm.weight", {a.q_lora_rank});
    out[prefix + "q_b_proj.weight"] =
        interleaved_rows_at(checked("q_b_proj.weight", {c.n_head * qk, a.q_lora_rank}), c.n_head,
                            qk - rope, rope, false);
  } else {
    out[prefix + "q_proj.weight"] = interleaved_rows_at(
        checked("q_proj.weight", {c.n_head * qk, c.d_model}), c.n_head, qk - rope, rope, false);
  }
  out[prefix + "kv_a_proj_with_mqa.weight"] =
      interleaved_rows_at(checked("kv_a_proj.weight", {a.kv_lora_rank + rope, c.d_model}), 1,
                          a.kv_lora_rank, rope, false);
  out[prefix + "kv_a_layernorm.weight"] = checked("kv_a_norm.weight", {a.kv_lora_rank});
  out[prefix + "kv_b_proj.weight"] =
      checked("kv_b_proj.weight", {c.n_head * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank});
}

void put_fused_experts(const nn::StateDict& full, const nn::GptConfig& c, int64_t block,
                       std::map<std::string, Tensor>& out) {
  const std::string p = "h." + std::to_string(block) + ".";
  const std::string hf = "model.layers." + std::to_string(block) + ".";
  const int64_t C = c.d_model, F = c.expert_ffn();
  std::vector<Tensor> fc, proj;
  for (int64_t e = 0; e < c.moe.experts; ++e) {
    const std::string ours = p + "mlp.experts." + std::to_string(e) + ".";
    const Tensor& up = at(full, ours + "c_fc.weight");
    const Tensor& down = at(full, ours + "c_proj.weight");
    if (up.shape() != Shape{2 * F, C} || down.shape() != Shape{C, F}) {
      throw ShapeError("export: layer " + std::to_string(block) + "'s expert " + std::to_string(e) +
                       " has c_fc " + shape_str(up.shape()) + " and c_proj " +
                       shape_str(down.shape()) + ", not the configured model's (" +
                       std::to_string(2 * F) + ", " + std::to_string(C) + ") and (" +
                       std::to_string(C) + ", " + std::to_string(F) + ")");
    }
    fc.push_back(reshape(up, {1, 2 * F, C}));
    proj.push_back(reshape(down, {1, C, F}));
  }
  out[hf + "block_sparse_moe.router.layer.weight"] = at(full, p + "mlp.router.weight");
  out[hf + "block_sparse_moe.input_linear.weight"] = concat(fc, 0).detach();
  out[hf + "block_sparse_moe.output_linear.weight"] = concat(proj, 0).detach();
  if (c.moe.shared_ffn_hidden_size > 0) {
    out[hf + "shared_mlp.input_linear.weight"] = at(full, p + "mlp.shared.c_fc.weight");
    out[hf + "shared_mlp.output_linear.weight"] = at(full, p + "mlp.shared.c_proj.weight");
  }
}

}  // namespace

bool hf_turns_interleaved(const std::string& type) {
  return is_cohere(type) || is_glm(type) || type == "helium" || type == "deepseek_v2" ||
         type == "deepseek_v3" || type == "kimi_k2";
}

const std::vector<std::string>& hf_model_types() {
  static const std::vector<std::string> types{"llama",
                                              "mistral",
                                              "mixtral",
                                              "qwen2",
                                              "qwen2_moe",
                                              "qwen3",
                                              "qwen3_moe",
                                              "gemma",
                                              "gemma2",
                                              "gemma3_text",
                                              "phi3",
                                              "stablelm",
                                              "olmo",
                                              "olmo2",
                                              "olmo3",
                                              "olmoe",
                                              "granite",
                                              "granitemoe",
                                              "granitemoeshared",
                                              "cohere",
                                              "cohere2",
                                              "smollm3",
                                              "glm",
                                              "glm4",
                                              "glm4_moe",
                                              "dots1",
                                              "deepseek_v2",
                                              "deepseek_v3",
                                              "minimax_m2",
                                              "helium",
                                              "seed_oss",
                                              "exaone4",
                                              "arcee",
                                              "gpt_neox",
                                              "starcoder2",
                                              "nemotron",
                                              "phi",
                                              "falcon",
                                              "gptj",
                                              "codegen",
                                              "gpt2"};
  return types;
}

const std::string& hf_model_type_named(const std::string& type) {
  const auto& types = hf_model_types();
  const auto it = std::find(types.begin(), types.end(), type);
  if (it == types.end()) {
    std::string names;
    for (const std::string& t : types) names += t + ", ";
    throw ConfigError("model.hf_type '" + type + "' is not a model_type Triad exports (" + names +
                      "or auto)");
  }
  return *it;
}

namespace {

// What keeps `c` from class `type` (one of hf_model_types()), "" when
// nothing does: LLaMA has no window, Mistral's covers every layer or none.
std::string dense_misfit(const nn::GptConfig& c, const std::string& type) {
  if (type == "gpt2") return gpt2_misfit(c);
  if (type == "gpt_neox" || type == "phi") return rotary_plain_misfit(c, type == "phi");
  if (type == "falcon") return falcon_misfit(c);
  if (type == "starcoder2") return starcoder2_misfit(c);
  if (type == "nemotron") return nemotron_misfit(c);
  if (type == "gptj") return gptj_misfit(c);
  if (type == "codegen") return codegen_misfit(c);
  if (type == "mistral") return llama_misfit(c, "llama");
  Misfit m{llama_misfit(c, type)};
  m.add(type == "llama" && c.sliding_window > 0, "model.sliding_window is set");
  return m.why;
}

bool is_moe_type(const std::string& type) {
  return type == "mixtral" || type == "qwen2_moe" || type == "qwen3_moe" || type == "olmoe" ||
         holds_deepseek_moe(type) || is_granite_moe(type) || type == "deepseek_v2" ||
         type == "minimax_m2";
}

// The classes whose attention is latent (model.mla): DeepSeek-V2's and -V3's.
bool holds_latent_attention(const std::string& type) {
  return type == "deepseek_v2" || type == "deepseek_v3";
}

// What only OLMo's classes hold: norms over all the queries and keys
// together (OLMo 2's and OLMoE's), blocks without pre-norms (OLMo 2's) and
// norms without weights (OLMo's).
void add_olmo_departures(const nn::GptConfig& c, const std::string& type, Misfit& m) {
  m.add(!c.norm_affine && type != "olmo", "model.norm_affine is false");
  m.add(c.clip_qkv > 0 && type != "olmo" && type != "olmoe", "model.clip_qkv is set");
  m.add(c.qk_norm_full && type != "olmo2" && type != "olmo3" && type != "olmoe" &&
            type != "minimax_m2",
        "model.qk_norm is full");
  m.add(!c.pre_norms && type != "olmo2" && type != "olmo3" && type != "exaone4",
        "model.pre_norms is false");
}

// What only Granite's class holds: sublayer outputs scaled before they join
// the residual stream, and scaled logits.
void add_granite_departures(const nn::GptConfig& c, const std::string& type, Misfit& m) {
  m.add(c.residual_multiplier != 1.0 && !is_granite(type), "model.residual_multiplier is not 1");
  m.add(c.logit_scale != 1.0 && !is_granite(type) && !is_cohere(type),
        "model.logit_scale is not 1");
  m.add(!c.norm_bias && !is_cohere(type), "model.norm_bias is false");
  m.add(!c.nope_layers.empty() && !holds_nope_layers(type), "model.nope_layers is set");
}

// The same for any class: Mixtral's are Mistral's blocks with experts
// (renormalised, on every layer), Qwen3-MoE's Qwen3's (dense layers
// allowed), OLMoE's LLaMA's with OLMo's query/key norms (experts on every
// layer), GraniteMoE's Granite's (renormalised, on every layer; an ungated
// shared expert in GraniteMoeShared's); no other class holds a mixture.
std::string misfit(const nn::GptConfig& c, const std::string& type) {
  if (c.activation == nn::Activation::Relu2 && type != "nemotron" && type != "arcee") {
    // (Nemotron's and Arcee's classes alone hold it; the rest is beside
    // the point.)
    return "model.activation is relu2 (squared ReLU, NemotronForCausalLM's and "
           "ArceeForCausalLM's alone)";
  }
  if (!holds_latent_attention(type) && c.latent_attention()) {
    // (Only DeepSeek's classes have latent attention; the rest is beside
    // the point.)
    return "model.mla is set (latent attention, DeepSeek-V2's and -V3's)";
  }
  if (!is_moe_type(type)) {
    Misfit m{dense_misfit(c, type)};
    m.add(c.moe.experts > 0, "model.moe is set (a mixture of experts)");
    add_olmo_departures(c, type, m);
    add_granite_departures(c, type, m);
    return m.why;
  }
  const bool mixtral = type == "mixtral", qwen2 = type == "qwen2_moe", olmoe = type == "olmoe";
  const bool granite = is_granite_moe(type), deepseek = holds_deepseek_moe(type),
             v2 = type == "deepseek_v2";
  // (dots.llm1's blocks are Qwen3's.)
  // (DeepSeek-V2's and -V3's are LLaMA's with latent attention.)
  Misfit m{dense_misfit(c, mixtral                        ? "mistral"
                           : qwen2                        ? "qwen2"
                           : olmoe                        ? "olmoe"
                           : granite                      ? "granite"
                           : type == "glm4_moe"           ? "glm4_moe"
                           : type == "minimax_m2"         ? "minimax_m2"
                           : holds_latent_attention(type) ? "llama"
                                                          : "qwen3")};
  if (holds_latent_attention(type)) {
    m.add(!c.latent_attention(), "model.mla is not set (DeepSeek's attention is latent)");
    m.add(c.mla.mscale_all_dim > 0 && c.rope_scaling.kind != RopeScaling::Kind::Yarn,
          "model.mla.mscale_all_dim is set without yarn rope scaling");
  }
  // DeepSeek's mixtures: the first layers dense, a shared expert some
  // experts wide, ungated.
  const auto add_deepseek_experts = [&] {
    const auto& x = c.moe;
    for (size_t i = 0; i < x.dense_layers.size(); ++i) {
      if (x.dense_layers[i] != static_cast<int64_t>(i)) {
        m.add(true, "model.moe.dense_layers are not the first layers (first_k_dense_replace)");
        break;
      }
    }
    m.add(x.shared_ffn_hidden_size == 0 || x.shared_ffn_hidden_size % c.expert_ffn() != 0,
          "model.moe.shared_ffn_hidden_size is not a multiple of the experts' width "
          "(n_shared_experts)");
    m.add(x.shared_gate, "model.moe.shared_gate is true");
  };
  add_olmo_departures(c, type, m);
  add_granite_departures(c, type, m);
  // (DeepSeek's classes hold a dense model too: every layer one of its
  // first_k_dense_replace.)
  if (holds_latent_attention(type) && c.moe.experts == 0) return m.why;
  m.add(c.moe.experts == 0, "model.moe is not set (no experts)");
  if (v2) {
    // DeepSeek-V2's: softmax scores times any scale, not renormalised, no
    // biases; groups scored by their best expert.
    const auto& x = c.moe;
    m.add(x.score != nn::GptConfig::Moe::Score::Softmax, "model.moe.score is not softmax");
    m.add(x.expert_bias, "model.moe.expert_bias is true");
    m.add(x.normalize_top_k, "model.moe.normalize_top_k is true");
    m.add(x.groups > 1 && x.group_score != nn::GptConfig::Moe::GroupScore::Max,
          "model.moe.group_score is not max (DeepSeek-V2 scores a group by its best expert)");
    add_deepseek_experts();
    return m.why;
  }
  if (deepseek) {
    // GLM-4.5's and dots.llm1's: DeepSeek-V3's sigmoid scores chosen with
    // biases (any scale and groups of at least two experts, each scored by
    // its two best), its first layers dense, and a shared expert
    // n_shared_experts experts wide.
    const auto& x = c.moe;
    m.add(x.score != nn::GptConfig::Moe::Score::Sigmoid, "model.moe.score is not sigmoid");
    m.add(!x.expert_bias, "model.moe.expert_bias is false");
    m.add(x.experts > 0 && x.experts / x.groups < 2,
          "model.moe.groups holds single experts (GLM-4.5 scores a group by its two best)");
    m.add(x.groups > 1 && x.group_score != nn::GptConfig::Moe::GroupScore::TopTwoSum,
          "model.moe.group_score is not top2_sum (DeepSeek-V3 scores a group by its two best)");
    add_deepseek_experts();
    return m.why;
  }
  if (type == "minimax_m2") {
    // MiniMax-M2's: sigmoid scores chosen with biases among all the
    // experts, renormalised, unscaled, on every layer, no shared expert.
    const auto& x = c.moe;
    m.add(x.score != nn::GptConfig::Moe::Score::Sigmoid, "model.moe.score is not sigmoid");
    m.add(!x.expert_bias, "model.moe.expert_bias is false");
    m.add(!x.normalize_top_k, "model.moe.normalize_top_k is false");
    m.add(x.routed_scaling_factor != 1.0, "model.moe.routed_scaling_factor is not 1");
    m.add(x.groups != 1, "model.moe.groups limits each token to groups of experts");
    m.add(!x.dense_layers.empty(), "model.moe.dense_layers keeps layers dense");
    m.add(x.shared_ffn_hidden_size > 0, "model.moe.shared_ffn_hidden_size is set");
    return m.why;
  }
  // Each routes by a softmax over the experts, unscaled, ungrouped, unbiased.
  m.add(c.moe.score != nn::GptConfig::Moe::Score::Softmax, "model.moe.score is sigmoid");
  m.add(c.moe.routed_scaling_factor != 1.0, "model.moe.routed_scaling_factor is not 1");
  m.add(c.moe.groups != 1, "model.moe.groups limits each token to groups of experts");
  m.add(c.moe.expert_bias, "model.moe.expert_bias is true");
  if (mixtral || granite) m.add(!c.moe.normalize_top_k, "model.moe.normalize_top_k is false");
  if (mixtral || olmoe || granite)
    m.add(!c.moe.dense_layers.empty(), "model.moe.dense_layers keeps layers dense");
  // Qwen2-MoE's blocks always have a gated shared expert, GraniteMoeShared's
  // an ungated one or none, the others none.
  if (qwen2) {
    m.add(c.moe.shared_ffn_hidden_size == 0 || !c.moe.shared_gate,
          "model.moe has no gated shared expert (shared_ffn_hidden_size, shared_gate)");
  } else if (type == "granitemoeshared") {
    m.add(c.moe.shared_gate, "model.moe.shared_gate is true");
  } else {
    m.add(c.moe.shared_ffn_hidden_size > 0, "model.moe.shared_ffn_hidden_size is set");
  }
  return m.why;
}

// The class of model_type `type` (one of hf_model_types()).
const char* architecture_of(const std::string& type) {
  return type == "llama"              ? "LlamaForCausalLM"
         : type == "mistral"          ? "MistralForCausalLM"
         : type == "mixtral"          ? "MixtralForCausalLM"
         : type == "qwen2_moe"        ? "Qwen2MoeForCausalLM"
         : type == "qwen3_moe"        ? "Qwen3MoeForCausalLM"
         : type == "qwen2"            ? "Qwen2ForCausalLM"
         : type == "qwen3"            ? "Qwen3ForCausalLM"
         : type == "gemma"            ? "GemmaForCausalLM"
         : type == "gemma2"           ? "Gemma2ForCausalLM"
         : type == "gemma3_text"      ? "Gemma3ForCausalLM"
         : type == "phi3"             ? "Phi3ForCausalLM"
         : type == "stablelm"         ? "StableLmForCausalLM"
         : type == "olmo"             ? "OlmoForCausalLM"
         : type == "olmo2"            ? "Olmo2ForCausalLM"
         : type == "olmo3"            ? "Olmo3ForCausalLM"
         : type == "olmoe"            ? "OlmoeForCausalLM"
         : type == "granite"          ? "GraniteForCausalLM"
         : type == "granitemoe"       ? "GraniteMoeForCausalLM"
         : type == "granitemoeshared" ? "GraniteMoeSharedForCausalLM"
         : type == "cohere"           ? "CohereForCausalLM"
         : type == "cohere2"          ? "Cohere2ForCausalLM"
         : type == "smollm3"          ? "SmolLM3ForCausalLM"
         : type == "glm"              ? "GlmForCausalLM"
         : type == "glm4"             ? "Glm4ForCausalLM"
         : type == "glm4_moe"         ? "Glm4MoeForCausalLM"
         : type == "dots1"            ? "Dots1ForCausalLM"
         : type == "deepseek_v2"      ? "DeepseekV2ForCausalLM"
         : type == "deepseek_v3"      ? "DeepseekV3ForCausalLM"
         : type == "minimax_m2"       ? "MiniMaxM2ForCausalLM"
         : type == "helium"           ? "HeliumForCausalLM"
         : type == "seed_oss"         ? "SeedOssForCausalLM"
         : type == "exaone4"          ? "Exaone4ForCausalLM"
         : type == "arcee"            ? "ArceeForCausalLM"
         : type == "gpt_neox"         ? "GPTNeoXForCausalLM"
         : type == "starcoder2"       ? "Starcoder2ForCausalLM"
         : type == "nemotron"         ? "NemotronForCausalLM"
         : type == "phi"              ? "PhiForCausalLM"
         : type == "falcon"           ? "FalconForCausalLM"
         : type == "gptj"             ? "GPTJForCausalLM"
         : type == "codegen"          ? "CodeGenForCausalLM"
                                      : "GPT2LMHeadModel";
}

}  // namespace

std::string hf_misfit(const nn::GptConfig& c, const std::string& type) {
  return misfit(c, hf_model_type_named(type));
}

nn::GptConfig exported_as(const nn::GptConfig& c, const std::string& type) {
  nn::GptConfig out = c;
  out.hf_type = hf_model_type_named(type);
  if (const std::string why = misfit(c, type); !why.empty()) {
    throw NotSupportedError("model_type " + type + " (" + architecture_of(type) +
                            ") cannot hold this model: " + why);
  }
  return out;
}

const std::string* hf_holding_class(const nn::GptConfig& c) {
  if (!c.hf_type.empty()) {
    const std::string& type = hf_model_type_named(c.hf_type);
    if (misfit(c, type).empty()) return &type;
  }
  for (const std::string& type : hf_model_types()) {
    if (misfit(c, type).empty()) return &type;
  }
  return nullptr;
}

const char* hf_model_type(const nn::GptConfig& c) {
  if (const std::string* type = hf_holding_class(c)) return type->c_str();
  if (c.moe.experts > 0) {
    throw NotSupportedError(
        "no Hugging Face class holds this mixture of experts: MixtralForCausalLM needs "
        "MistralForCausalLM's blocks with experts on every layer, renormalised (here " +
        misfit(c, "mixtral") +
        "); Qwen3MoeForCausalLM Qwen3ForCausalLM's with experts, dense layers allowed (here " +
        misfit(c, "qwen3_moe") +
        "); Qwen2MoeForCausalLM Qwen2ForCausalLM's with experts and a gated shared expert (here " +
        misfit(c, "qwen2_moe") +
        "); OlmoeForCausalLM LLaMA's with query/key norms over all the heads (qk_norm: full) and "
        "experts on every layer (here " +
        misfit(c, "olmoe") +
        "); GraniteMoeForCausalLM Granite's with experts on every layer, renormalised (here " +
        misfit(c, "granitemoe") +
        "); GraniteMoeSharedForCausalLM the same with an ungated shared expert (here " +
        misfit(c, "granitemoeshared") +
        "); Glm4MoeForCausalLM LLaMA's with q, k and v biases or none, query/key norms or none "
        "and any partial rotation, its first layers dense, then DeepSeek-V3's router (score: "
        "sigmoid, expert_bias) and an ungated shared expert some experts wide (here " +
        misfit(c, "glm4_moe") + "); Dots1ForCausalLM the same on Qwen3ForCausalLM's blocks (here " +
        misfit(c, "dots1") +
        "); DeepseekV3ForCausalLM the same on LLaMA's blocks with latent attention (model.mla) "
        "(here " +
        misfit(c, "deepseek_v3") +
        "); DeepseekV2ForCausalLM LLaMA's with latent attention, its first layers dense, then "
        "softmax scores times any scale, not renormalised (groups scored by their best expert, "
        "group_score: max) and an ungated shared expert some experts wide (here " +
        misfit(c, "deepseek_v2") +
        "); MiniMaxM2ForCausalLM LLaMA's with query/key norms over all the heads (qk_norm: "
        "full), any partial rotation and experts on every layer, DeepSeek-V3's router (score: "
        "sigmoid, expert_bias) among all of them, renormalised, unscaled, no shared expert (here " +
        misfit(c, "minimax_m2") + ")");
  }
  const std::string llama = misfit(c, "mistral"), qwen2 = misfit(c, "qwen2"),
                    qwen3 = misfit(c, "qwen3"), gemma = misfit(c, "gemma"),
                    gemma2 = misfit(c, "gemma2"), gemma3 = misfit(c, "gemma3_text"),
                    phi3 = misfit(c, "phi3"), stablelm = misfit(c, "stablelm"),
                    olmo = misfit(c, "olmo"), olmo2 = misfit(c, "olmo2"),
                    olmo3 = misfit(c, "olmo3"), granite = misfit(c, "granite"),
                    neox = misfit(c, "gpt_neox"), starcoder2 = misfit(c, "starcoder2"),
                    nemotron = misfit(c, "nemotron"), cohere = misfit(c, "cohere"),
                    cohere2 = misfit(c, "cohere2"), smollm3 = misfit(c, "smollm3"),
                    glm = misfit(c, "glm"), glm4 = misfit(c, "glm4"), helium = misfit(c, "helium"),
                    seed_oss = misfit(c, "seed_oss"), exaone4 = misfit(c, "exaone4"),
                    arcee = misfit(c, "arcee"), phi = misfit(c, "phi"),
                    falcon = misfit(c, "falcon"), gptj = misfit(c, "gptj"),
                    codegen = misfit(c, "codegen"), gpt2 = misfit(c, "gpt2");
  throw NotSupportedError(
      "no Hugging Face class holds this model: LlamaForCausalLM needs rope, swiglu, rmsnorm, "
      "no linear biases and no query/key norms (here " +
      llama +
      "); Qwen2ForCausalLM the same with biases on q, k and v only, and a window, if any, on "
      "every layer from some layer on (here " +
      qwen2 + "); Qwen3ForCausalLM the same with query/key norms and no biases (here " + qwen3 +
      "); GemmaForCausalLM LLaMA's with geglu, an embedding multiplier of sqrt(d_model) and "
      "norm_weight_offset (here " +
      gemma + "); Gemma2ForCausalLM Gemma's with post_norms (here " + gemma2 +
      "); Gemma3ForCausalLM Gemma 2's with query/key norms (here " + gemma3 +
      "); Phi3ForCausalLM LLaMA's with any partial rotation, heads d_model / n_head wide and "
      "longrope the only scaling (here " +
      phi3 +
      "); StableLmForCausalLM LLaMA's with layernorm, any partial rotation, q, k and v biases or "
      "none, a parallel residual only with a shared norm, and heads d_model / n_head wide (here " +
      stablelm +
      "); OlmoForCausalLM LLaMA's with layernorm without weights (norm_affine: false, eps 1e-5) "
      "(here " +
      olmo +
      "); Olmo2ForCausalLM LLaMA's with post-norms instead of pre-norms (pre_norms: false, "
      "post_norms) and query/key norms over all the heads (qk_norm: full) (here " +
      olmo2 +
      "); Olmo3ForCausalLM OLMo 2's with windows on any layers, those turning unscaled (here " +
      olmo3 +
      "); GraniteForCausalLM LLaMA's with any embedding, residual and logit multipliers and "
      "attention scale, heads d_model / n_head wide and no window (here " +
      granite +
      "); CohereForCausalLM LLaMA's sublayers in parallel on one layernorm without a bias "
      "(parallel_residual, shared_norm, norm_bias: false), heads d_model / n_head wide and no "
      "window (here " +
      cohere +
      "); Cohere2ForCausalLM the same with a window and its global layers without rope "
      "(nope_layers, the window's full_attention_layers) (here " +
      cohere2 +
      "); SmolLM3ForCausalLM LLaMA's with any layers without rope (nope_layers) and windows on "
      "any layers (here " +
      smollm3 +
      "); GlmForCausalLM LLaMA's with q, k and v biases or none, any partial rotation and no "
      "window (here " +
      glm + "); Glm4ForCausalLM GLM's with post_norms (here " + glm4 +
      "); HeliumForCausalLM LLaMA's with q, k and v biases or none and no window (here " + helium +
      "); SeedOssForCausalLM the same (here " + seed_oss +
      "); Exaone4ForCausalLM OLMo 2's sublayer norms with query/key norms on each head and "
      "windows on any layers, the global ones without rope (here " +
      exaone4 +
      "); ArceeForCausalLM LLaMA's with an ungated MLP of relu2, gelu or gelu_erf and no window "
      "(here " +
      arcee +
      "); GPTNeoXForCausalLM needs rope (on any share of each head), gelu or gelu_erf, "
      "layernorm, linear biases, a key/value head per query head and heads d_model / n_head "
      "wide (here " +
      neox +
      "); PhiForCausalLM the same with grouped heads allowed, the parallel residual with a "
      "shared norm, and a head bias (here " +
      phi +
      "); Starcoder2ForCausalLM the sequential block with rope on whole heads, gelu or "
      "gelu_erf, layernorm, biases on every linear layer or none, grouped heads allowed and a "
      "window on every layer or none (here " +
      starcoder2 +
      "); NemotronForCausalLM the sequential block with rope on any share of each head, relu2, "
      "gelu or gelu_erf, layernorm scaling by 1 + weight (norm_weight_offset), biases on every "
      "linear layer, on the MLP alone or none, grouped heads allowed and no window (here " +
      nemotron +
      "); FalconForCausalLM parallel blocks with rope on whole heads, gelu or gelu_erf, "
      "layernorm, biases on every linear layer or none, and no head bias (here " +
      falcon +
      "); GPTJForCausalLM parallel blocks with one norm, rope at base 10000 on any share of each "
      "head, biases on the MLP alone, and a head bias (here " +
      gptj + "); CodeGenForCausalLM GPT-J's with n_head a multiple of 4 (here " + codegen +
      "); GPT2LMHeadModel GPT-NeoX's with learned positions and no parallel residual (here " +
      gpt2 + ")");
}

const char* hf_architecture(const nn::GptConfig& c) {
  return architecture_of(hf_model_type(c));
}

std::string hf_config_json(const nn::GptConfig& c, const std::string& torch_dtype) {
  c.validate();
  nlohmann::ordered_json j;
  const std::string type = hf_model_type(c);
  if (type == "gpt_neox") {
    write_neox_config(c, j);
  } else if (type == "phi") {
    write_phi_config(c, j);
  } else if (type == "falcon") {
    write_falcon_config(c, j);
  } else if (type == "starcoder2") {
    write_starcoder2_config(c, j);
  } else if (type == "nemotron") {
    write_nemotron_config(c, j);
  } else if (type == "gptj" || type == "codegen") {
    write_gptj_config(c, j, type == "codegen");
  } else if (type != "gpt2") {
    write_dimensions(c, hf_architecture(c), type, j);
    j["num_key_value_heads"] = c.kv_heads();
    const bool phi3 = type == "phi3", stablelm = type == "stablelm";
    const bool olmo = type == "olmo" || type == "olmo2" || type == "olmo3" || type == "olmoe";
    const bool granite = is_granite(type), cohere = is_cohere(type);
    // (Phi3Config's, StableLmConfig's, OLMo's and Granite's heads are
    // hidden_size / heads wide.)
    if (c.latent_attention()) {
      // DeepseekV3Config's head_dim is its rotary embedding's width.
      const auto& a = c.mla;
      j["head_dim"] = a.qk_rope_head_dim;
      j["kv_lora_rank"] = a.kv_lora_rank;
      j["q_lora_rank"] = a.q_lora_rank > 0 ? nlohmann::ordered_json(a.q_lora_rank) : nullptr;
      j["qk_nope_head_dim"] = a.qk_nope_head_dim;
      j["qk_rope_head_dim"] = a.qk_rope_head_dim;
      j["v_head_dim"] = a.v_head_dim;
      if (type == "deepseek_v3") j["rope_interleave"] = true;
    } else if (!phi3 && !stablelm && !olmo && !granite && !cohere) {
      j["head_dim"] = c.head_dim();
    }
    if (is_gemma(type)) {
      j["hidden_act"] = "gelu_pytorch_tanh";
      j["hidden_activation"] = "gelu_pytorch_tanh";
    } else if (type == "arcee") {
      j["hidden_act"] = ungated_act_name(c);
    } else {
      j["hidden_act"] = "silu";
    }
    if (!phi3) j["max_position_embeddings"] = c.seq_len;
    // (OlmoConfig has no eps: its LayerNorms' is 1e-5.)
    if (type != "olmo")
      j[stablelm || cohere ? "layer_norm_eps" : "rms_norm_eps"] = c.layer_norm_eps;
    if (cohere) {
      j["logit_scale"] = c.logit_scale;
      if (type == "cohere") j["use_qk_norm"] = c.qk_head_layernorm;
    }
    if (type == "olmo" || type == "olmoe")
      j["clip_qkv"] = c.clip_qkv > 0 ? nlohmann::ordered_json(c.clip_qkv) : nullptr;
    if (granite) {
      // GraniteConfig's four multipliers; its attention's is the scores'
      // scale itself.
      const double scalar = c.query_pre_attn_scalar > 0.0 ? c.query_pre_attn_scalar
                                                          : static_cast<double>(c.head_dim());
      j["embedding_multiplier"] = c.embedding_multiplier;
      j["residual_multiplier"] = c.residual_multiplier;
      j["attention_multiplier"] = 1.0 / std::sqrt(scalar);
      j["logits_scaling"] = 1.0 / c.logit_scale;
    }
    j["rope_theta"] = c.rope_theta;
    if (phi3) {
      write_phi3_rope(c, j);
      j["partial_rotary_factor"] = partial_rotary_factor(c);
    } else {
      write_rope_scaling(c, j);
      // DeepSeek's scores' own yarn factor (model.mla.mscale_all_dim).
      if (c.latent_attention() && c.mla.mscale_all_dim > 0 && j["rope_scaling"].is_object())
        j["rope_scaling"]["mscale_all_dim"] = c.mla.mscale_all_dim;
    }
    if (stablelm) {
      j["partial_rotary_factor"] = partial_rotary_factor(c);
      j["use_qkv_bias"] = c.qkv_bias;
      j["qk_layernorm"] = c.qk_head_layernorm;
      j["use_parallel_residual"] = c.parallel_residual;
    }
    // Qwen2's q, k and v biases are implied; Phi3Config, StableLmConfig and
    // MixtralConfig have no such keys.
    if (is_glm(type) || type == "helium" || type == "glm4_moe" ||
        type == "seed_oss") {  // (biases on q, k and v alone)
      j["attention_bias"] = c.qkv_bias;
      if (type == "seed_oss") j["attention_out_bias"] = false;
      if (type != "helium" && type != "seed_oss")
        j["partial_rotary_factor"] = partial_rotary_factor(c);
      if (type == "glm4_moe") j["use_qk_norm"] = c.qk_norm;
    } else if (type != "qwen2" && type != "qwen2_moe" && !phi3 && !stablelm && type != "mixtral" &&
               type != "minimax_m2") {
      j["attention_bias"] = false;
    }
    if (stablelm) {
      // StableLM drops out the MLP's output alone (hidden_dropout), where
      // Triad drops both sublayers' and the embeddings': the same model
      // for inference, a close cousin for training.
      j["hidden_dropout"] = c.dropout;
    } else if (type == "qwen2" || type == "qwen3" || type == "qwen2_moe" || type == "qwen3_moe" ||
               type == "dots1") {
      // (Dots1Config windows the layers from max_window_layers on whenever
      // sliding_window is set: null is none.)
      if (type == "dots1") {
        j["sliding_window"] =
            c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nullptr;
      } else {
        j["use_sliding_window"] = c.sliding_window > 0;
        j["sliding_window"] = c.sliding_window > 0 ? c.sliding_window : c.seq_len;
      }
      j["max_window_layers"] = c.sliding_window > 0 ? *qwen_window_layers(c) : c.n_layer;
    } else if (!phi3 && type != "mixtral" && !olmo && !is_granite_moe(type) && !cohere &&
               !is_glm(type) && type != "glm4_moe" && type != "minimax_m2") {
      j["mlp_bias"] = false;
    }
    if (phi3) {
      // Phi-3's dropouts are Triad's: after the embeddings and after each
      // residual projection, none on the attention's probabilities.
      j["embd_pdrop"] = c.dropout;
      j["resid_pdrop"] = c.dropout;
      j["attention_dropout"] = 0.0;
    } else if (stablelm) {
      j["attention_dropout"] = 0.0;
    } else if (type == "seed_oss") {
      // Seed-OSS drops each sublayer's output (residual_dropout), as Triad
      // does (and the embeddings, which Triad drops too); Triad keeps every
      // attention probability.
      j["residual_dropout"] = c.dropout;
      j["attention_dropout"] = 0.0;
    } else {
      j["attention_dropout"] = c.dropout;
    }
    if (type == "mistral" || type == "mixtral" || phi3) {  // a window on every layer, or none
      j["sliding_window"] =
          c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nullptr;
    }
    if (holds_latent_attention(type) && c.moe.experts == 0) {
      // A dense model under DeepSeek's class: first_k_dense_replace covers
      // every layer, so no layer builds experts; the classes' configs still
      // read an expert count, and one is written.
      j["n_routed_experts"] = 1;
      j["num_experts_per_tok"] = 1;
      j["n_shared_experts"] = 0;
      j["first_k_dense_replace"] = c.n_layer;
      if (type == "deepseek_v3") j["num_nextn_predict_layers"] = c.mtp_layers;
    } else if (is_moe_type(type)) {
      // The experts: Mixtral's intermediate_size is theirs; Qwen3-MoE's
      // moe_intermediate_size, beside its dense layers' (mlp_only_layers).
      // The load-balancing loss's weight is kept; transformers trains with
      // it only when output_router_logits is set, which its published files
      // leave off.
      const auto& x = c.moe;
      const bool deepseek = holds_deepseek_moe(type) || type == "deepseek_v2";
      if (deepseek) {
        // DeepSeek-V3's keys; no load-balancing loss (the expert biases
        // balance), and none of the multi-token prediction layers Triad
        // lacks. DeepSeek-V2's: its routing named, and its expert-level
        // balance loss.
        j["n_routed_experts"] = x.experts;
        j["num_experts_per_tok"] = x.top_k;
        j["moe_intermediate_size"] = c.expert_ffn();
        j["n_shared_experts"] = x.shared_ffn_hidden_size / c.expert_ffn();
        j["first_k_dense_replace"] = static_cast<int64_t>(x.dense_layers.size());
        j["norm_topk_prob"] = x.normalize_top_k;
        j["routed_scaling_factor"] = x.routed_scaling_factor;
        j["n_group"] = x.groups;
        j["topk_group"] = x.top_groups;
        if (holds_prediction_layers(type)) j["num_nextn_predict_layers"] = c.mtp_layers;
        if (type == "deepseek_v2") {
          j["topk_method"] = x.groups > 1 ? "group_limited_greedy" : "greedy";
          j["scoring_func"] = "softmax";
          j["aux_loss_alpha"] = x.aux_loss_coef;
          j["seq_aux"] = x.aux_loss_scope == nn::GptConfig::Moe::BalanceScope::Sequence;
        }
      } else if (type == "mixtral" || is_granite_moe(type) || type == "minimax_m2") {
        j["intermediate_size"] = c.expert_ffn();
        j["num_local_experts"] = x.experts;
        if (type == "granitemoeshared") j["shared_intermediate_size"] = x.shared_ffn_hidden_size;
      } else if (type == "olmoe") {  // experts on every layer, intermediate_size wide
        j["intermediate_size"] = c.expert_ffn();
        j["num_experts"] = x.experts;
        j["norm_topk_prob"] = x.normalize_top_k;
      } else {
        j["num_experts"] = x.experts;
        j["moe_intermediate_size"] = c.expert_ffn();
        j["norm_topk_prob"] = x.normalize_top_k;
        j["decoder_sparse_step"] = 1;
        j["mlp_only_layers"] = x.dense_layers;
        if (type == "qwen2_moe") j["shared_expert_intermediate_size"] = x.shared_ffn_hidden_size;
      }
      if (!deepseek) {
        j["num_experts_per_tok"] = x.top_k;
        // (MiniMax-M2's biases balance; transformers' loss for its class
        // would be Mixtral's softmax form, not its router's.)
        if (type != "minimax_m2") j["router_aux_loss_coef"] = x.aux_loss_coef;
        j["output_router_logits"] = false;
      }
      if (type == "minimax_m2") {
        // MiniMax's own keys as its files hold them: the rotated width
        // (and transformers' share of the head), the norms over all the
        // heads, the biased sigmoid router, every layer softmax attention,
        // and none of the prediction modules Triad lacks.
        j["rotary_dim"] = c.rope_dim > 0 ? c.rope_dim : c.head_dim();
        j["partial_rotary_factor"] = partial_rotary_factor(c);
        j["use_qk_norm"] = true;
        j["qk_norm_type"] = "per_layer";
        j["scoring_func"] = "sigmoid";
        j["use_routing_bias"] = true;
        j["attn_type_list"] = std::vector<int64_t>(static_cast<size_t>(c.n_layer), 1);
        j["use_mtp"] = false;
        j["num_mtp_modules"] = 0;
      }
      if (type != "olmoe" && !deepseek && !is_granite_moe(type)) j["router_jitter_noise"] = 0.0;
    }
    // The layers without rope: Cohere 2's global layers, SmolLM3's flags.
    auto layer_kinds = [&](auto global) {
      nlohmann::ordered_json kinds = nlohmann::ordered_json::array();
      for (int64_t i = 0; i < c.n_layer; ++i)
        kinds.push_back(global(i) ? "full_attention" : "sliding_attention");
      return kinds;
    };
    auto nope = [&](int64_t i) {
      return std::binary_search(c.nope_layers.begin(), c.nope_layers.end(), i);
    };
    if (type == "cohere2") {
      j["sliding_window"] = c.sliding_window > 0 ? c.sliding_window : c.seq_len;
      j["layer_types"] = layer_kinds(nope);
    }
    if (type == "olmo3") {  // its windowed layers by name
      j["sliding_window"] = c.sliding_window > 0 ? c.sliding_window : c.seq_len;
      j["layer_types"] = layer_kinds([&](int64_t i) { return c.window_of(i) == 0; });
    }
    if (type == "exaone4") {
      // The global layers (without rope); a window as long as the context
      // where none is set but some layers turn by nothing; null for neither.
      if (c.sliding_window > 0 || !c.nope_layers.empty()) {
        j["sliding_window"] = c.sliding_window > 0 ? c.sliding_window : c.seq_len;
        j["layer_types"] = layer_kinds(nope);
      } else {
        j["sliding_window"] = nullptr;
        j["layer_types"] = layer_kinds([](int64_t) { return true; });
      }
    }
    if (type == "smollm3") {
      nlohmann::ordered_json flags = nlohmann::ordered_json::array();
      for (int64_t i = 0; i < c.n_layer; ++i) flags.push_back(nope(i) ? 0 : 1);
      j["no_rope_layers"] = flags;
      j["use_sliding_window"] = c.sliding_window > 0;
      j["sliding_window"] =
          c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nullptr;
      j["layer_types"] = layer_kinds([&](int64_t i) { return c.window_of(i) == 0; });
    }
    if (type == "gemma2" || type == "gemma3_text") {
      if (c.query_pre_attn_scalar > 0.0) {
        j["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
      } else {
        j["query_pre_attn_scalar"] = c.head_dim();
      }
      auto cap = [](double v) { return v > 0.0 ? nlohmann::ordered_json(v) : nullptr; };
      j["attn_logit_softcapping"] = cap(c.attn_logit_softcap);
      j["final_logit_softcapping"] = cap(c.final_logit_softcap);
      j["sliding_window"] = c.sliding_window > 0 ? c.sliding_window : c.seq_len;
      nlohmann::ordered_json kinds = nlohmann::ordered_json::array();
      for (int64_t i = 0; i < c.n_layer; ++i)
        kinds.push_back(c.window_of(i) > 0 ? "sliding_attention" : "full_attention");
      j["layer_types"] = kinds;
      if (type == "gemma3_text")
        j["rope_local_base_freq"] = c.rope_local_theta > 0.0 ? c.rope_local_theta : c.rope_theta;
    }
  } else {
    j["architectures"] = nlohmann::ordered_json::array({hf_architecture(c)});
    j["model_type"] = "gpt2";
    j["n_embd"] = c.d_model;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    j["n_positions"] = c.seq_len;
    j["n_ctx"] = c.seq_len;
    if (c.ffn() != 4 * c.d_model) {
      j["n_inner"] = c.ffn();
    } else {
      j["n_inner"] = nullptr;
    }
    j["activation_function"] = c.activation == nn::Activation::GeluErf ? "gelu" : "gelu_new";
    j["layer_norm_epsilon"] = c.layer_norm_eps;
    j["resid_pdrop"] = c.dropout;
    j["embd_pdrop"] = c.dropout;
    j["attn_pdrop"] = 0.0;  // Triad drops no attention probabilities
  }
  j["vocab_size"] = c.vocab_size;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["initializer_range"] = c.init_std;
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

std::map<std::string, Tensor> triad_to_hf(const nn::StateDict& full, const nn::GptConfig& c) {
  std::map<std::string, Tensor> out;
  for (int64_t part = -1; part < c.n_layer; ++part) out.merge(triad_to_hf_part(full, c, part));
  return out;
}

namespace {
// triad_to_hf_part of the model alone (no prediction modules).
std::map<std::string, Tensor> model_to_hf_part(const nn::StateDict& full, const nn::GptConfig& c,
                                               int64_t block);
}  // namespace

std::map<std::string, Tensor> triad_to_hf_part(const nn::StateDict& all, const nn::GptConfig& c,
                                               int64_t block) {
  if (c.mtp_layers == 0) return model_to_hf_part(all, c, block);
  // Multi-token prediction's modules (model.mtp_layers, mtp.*): DeepSeek-V3's
  // and GLM-4.5's files hold them as layers after the model's (each block
  // under the layers' names, beside enorm, hnorm, eh_proj, shared_head.norm
  // and copies of the head and the embedding), written with the part
  // outside the blocks; other classes have no place for them, and they stay
  // behind (Hugging Face's inference runs none).
  nn::StateDict kept;
  for (const auto& [name, t] : all)
    if (name.rfind("mtp.", 0) != 0) kept[name] = t;
  std::map<std::string, Tensor> out = model_to_hf_part(kept, c, block);
  if (block >= 0 || !holds_prediction_layers(hf_model_type(c))) return out;
  for (int64_t k = 0; k < c.mtp_layers; ++k) {
    const int64_t b = c.n_layer + k;
    const std::string mine = "mtp." + std::to_string(k) + ".";
    const std::string inner = mine + "block.";
    nn::StateDict layer;
    for (const auto& [name, t] : all) {
      if (name.rfind(inner, 0) == 0)
        layer["h." + std::to_string(b) + "." + name.substr(inner.size())] = t;
    }
    out.merge(model_to_hf_part(layer, c, b));
    const std::string p = "model.layers." + std::to_string(b) + ".";
    out[p + "enorm.weight"] = at(all, mine + "ln_embed.weight");
    out[p + "hnorm.weight"] = at(all, mine + "ln_hidden.weight");
    out[p + "eh_proj.weight"] = at(all, mine + "eh_proj.weight");
    out[p + "shared_head.norm.weight"] = at(all, mine + "ln_out.weight");
    out[p + "shared_head.head.weight"] =
        at(all, c.tie_embeddings ? "wte.weight" : "lm_head.weight");
    out[p + "embed_tokens.weight"] = at(all, "wte.weight");
  }
  return out;
}

namespace {
std::map<std::string, Tensor> model_to_hf_part(const nn::StateDict& full, const nn::GptConfig& c,
                                               int64_t block) {
  std::map<std::string, Tensor> out;
  const std::string type = hf_model_type(c);
  const bool phi3 = type == "phi3";
  if (type == "gpt2") {
    const std::string prefix = "h." + std::to_string(block) + ".";
    nn::StateDict part;
    for (const auto& [name, t] : full) {
      if (block < 0 ? name.rfind("h.", 0) != 0 : name.rfind(prefix, 0) == 0) part[name] = t;
    }
    for (auto& [name, t] : triad_to_gpt2(part))
      out[name == "lm_head.weight" ? name : "transformer." + name] = t;
    return out;
  }
  if (type == "gpt_neox") return triad_to_neox_part(full, c, block);
  if (type == "phi") return triad_to_phi_part(full, c, block);
  if (type == "falcon") return triad_to_falcon_part(full, c, block);
  // (StarCoder2's MLP keeps Triad's names; Nemotron's are up_proj and
  // down_proj.)
  if (type == "starcoder2") return sequential_rotary_part(full, c, block, "c_fc", "c_proj");
  if (type == "nemotron") return sequential_rotary_part(full, c, block, "up_proj", "down_proj");
  if (type == "gptj" || type == "codegen")
    return triad_to_gptj_part(full, c, block, type == "codegen");
  const int64_t F = c.ffn();
  // (OLMo's norms learn nothing: it stores none; StableLM's LayerNorms have
  // biases.)
  if (block < 0) return outside_part(full, c, "model.embed_tokens", "model.norm", "lm_head");
  for (int64_t i = block; i == block; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    // [gate | up] as gate_proj and up_proj (F each), or the names `gate`
    // and `up` under `prefix`.
    auto split_fc = [&](const Tensor& fc, int64_t width, const std::string& gate,
                        const std::string& up) {
      if (fc.dim() != 2 || fc.size(0) != 2 * width) {
        throw ShapeError("export: layer " + std::to_string(i) + "'s c_fc " + shape_str(fc.shape()) +
                         " does not fit the configured model (" + std::to_string(2 * width) +
                         " tall)");
      }
      out[gate] = contiguous(narrow(fc, 0, 0, width)).detach();
      out[up] = contiguous(narrow(fc, 0, width, width)).detach();
    };
    if (phi3) {  // fused as Triad holds them: [q | k | v] and [gate | up]
      out[hf + "self_attn.qkv_proj.weight"] = checked_qkv(full, c, i, ".weight");
      out[hf + "mlp.gate_up_proj.weight"] = at(full, p + "mlp.c_fc.weight");
    } else if (c.latent_attention()) {
      put_latent_attention(full, c, i, hf + "self_attn.", out);
    } else {  // (Cohere's and GLM's q and k heads turn in interleaved pairs.)
      split_qkv(full, c, i, ".weight", hf + "self_attn.", out, hf_turns_interleaved(type));
    }
    if (c.moe_layer(i) && is_granite_moe(type)) {
      put_fused_experts(full, c, i, out);
    } else if (c.moe_layer(i)) {
      // Mixtral's (and MiniMax-M2's) block_sparse_moe (w1 the gate, w3 up,
      // w2 down) or Qwen3-MoE's mlp (gate_proj, up_proj, down_proj); the
      // router is gate.
      const bool mixtral = type == "mixtral" || type == "minimax_m2";
      const std::string moe = hf + (mixtral ? "block_sparse_moe." : "mlp.");
      out[moe + "gate.weight"] = at(full, p + "mlp.router.weight");
      for (int64_t e = 0; e < c.moe.experts; ++e) {
        const std::string x = moe + "experts." + std::to_string(e) + ".";
        const std::string ours = p + "mlp.experts." + std::to_string(e) + ".";
        split_fc(at(full, ours + "c_fc.weight"), c.expert_ffn(),
                 x + (mixtral ? "w1" : "gate_proj") + ".weight",
                 x + (mixtral ? "w3" : "up_proj") + ".weight");
        out[x + (mixtral ? "w2" : "down_proj") + ".weight"] = at(full, ours + "c_proj.weight");
      }
      if (type == "minimax_m2") {  // its biases beside the experts
        out[moe + "e_score_correction_bias"] = at(full, p + "mlp.expert_bias");
      } else if (holds_deepseek_moe(type) || type == "deepseek_v2") {
        // The biases (DeepSeek-V3's) and the ungated shared experts.
        if (c.moe.expert_bias)
          out[moe + "gate.e_score_correction_bias"] = at(full, p + "mlp.expert_bias");
        split_fc(at(full, p + "mlp.shared.c_fc.weight"), c.moe.shared_ffn_hidden_size,
                 moe + "shared_experts.gate_proj.weight", moe + "shared_experts.up_proj.weight");
        out[moe + "shared_experts.down_proj.weight"] = at(full, p + "mlp.shared.c_proj.weight");
      } else if (c.moe.shared_ffn_hidden_size > 0) {  // Qwen2-MoE's shared expert and its gate
        split_fc(at(full, p + "mlp.shared.c_fc.weight"), c.moe.shared_ffn_hidden_size,
                 moe + "shared_expert.gate_proj.weight", moe + "shared_expert.up_proj.weight");
        out[moe + "shared_expert.down_proj.weight"] = at(full, p + "mlp.shared.c_proj.weight");
        out[moe + "shared_expert_gate.weight"] = at(full, p + "mlp.shared_gate.weight");
      }
    } else {
      if (is_glm(type)) {  // fused as Triad's c_fc: [gate | up]
        out[hf + "mlp.gate_up_proj.weight"] = at(full, p + "mlp.c_fc.weight");
      } else if (!c.gated_mlp()) {  // Arcee's ungated MLP: c_fc is up_proj
        out[hf + "mlp.up_proj.weight"] = at(full, p + "mlp.c_fc.weight");
      } else if (!phi3) {
        split_fc(at(full, p + "mlp.c_fc.weight"), F, hf + "mlp.gate_proj.weight",
                 hf + "mlp.up_proj.weight");
      }
      out[hf + "mlp.down_proj.weight"] = at(full, p + "mlp.c_proj.weight");
    }
    if (c.qkv_bias)
      split_qkv(full, c, i, ".bias", hf + "self_attn.", out, hf_turns_interleaved(type));
    out[hf + "self_attn.o_proj.weight"] = at(full, p + "attn.c_proj.weight");
    if (!c.norm_affine) {
      // OLMo's blocks store no norms.
    } else if (!c.pre_norms) {  // OLMo 2's two norms, on the sublayers' outputs
      out[hf + "post_attention_layernorm.weight"] = at(full, p + "post_attn_norm.weight");
      out[hf + "post_feedforward_layernorm.weight"] = at(full, p + "post_mlp_norm.weight");
    } else if (type == "glm4") {  // GLM-4's names for the four
      out[hf + "input_layernorm.weight"] = at(full, p + "ln_1.weight");
      out[hf + "post_self_attn_layernorm.weight"] = at(full, p + "post_attn_norm.weight");
      out[hf + "post_attention_layernorm.weight"] = at(full, p + "ln_2.weight");
      out[hf + "post_mlp_layernorm.weight"] = at(full, p + "post_mlp_norm.weight");
    } else if (c.post_norms) {  // Gemma 2's and 3's names for the four norms
      out[hf + "input_layernorm.weight"] = at(full, p + "ln_1.weight");
      out[hf + "post_attention_layernorm.weight"] = at(full, p + "post_attn_norm.weight");
      out[hf + "pre_feedforward_layernorm.weight"] = at(full, p + "ln_2.weight");
      out[hf + "post_feedforward_layernorm.weight"] = at(full, p + "post_mlp_norm.weight");
    } else {
      out[hf + "input_layernorm.weight"] = at(full, p + "ln_1.weight");
      // (StableLM's parallel blocks have input_layernorm alone.)
      if (!c.shared_norm) out[hf + "post_attention_layernorm.weight"] = at(full, p + "ln_2.weight");
    }
    if (c.norm_biases()) {  // StableLM's LayerNorms shift too
      out[hf + "input_layernorm.bias"] = at(full, p + "ln_1.bias");
      if (!c.shared_norm) out[hf + "post_attention_layernorm.bias"] = at(full, p + "ln_2.bias");
    }
    if (c.qk_head_layernorm) {
      // Command R+'s: (heads, D), each head's features back in Cohere's
      // interleaved order, as its q and k rows are. StableLM 2 12B's: a
      // LayerNorm of D for each head (q_layernorm.norms.h).
      for (const auto& [which, heads] :
           {std::pair<std::string, int64_t>{"q_norm", c.n_head}, {"k_norm", c.kv_heads()}}) {
        Tensor w = at(full, p + "attn." + which + ".weight");
        if (w.dim() != 1 || w.numel() != heads * c.head_dim()) {
          throw ShapeError("export: layer " + std::to_string(i) + "'s " + which + " " +
                           shape_str(w.shape()) + " is not " + std::to_string(heads) +
                           " heads of " + std::to_string(c.head_dim()));
        }
        if (type == "stablelm") {
          const std::string norms = hf + "self_attn." + which.substr(0, 1) + "_layernorm.norms.";
          for (int64_t h = 0; h < heads; ++h) {
            out[norms + std::to_string(h) + ".weight"] =
                contiguous(narrow(w, 0, h * c.head_dim(), c.head_dim())).detach();
          }
          continue;
        }
        if (is_cohere(type)) w = interleaved_head_rows(w, heads, false);
        out[hf + "self_attn." + which + ".weight"] = reshape(w, {heads, c.head_dim()}).detach();
      }
    } else if (c.qk_norm) {
      out[hf + "self_attn.q_norm.weight"] = at(full, p + "attn.q_norm.weight");
      out[hf + "self_attn.k_norm.weight"] = at(full, p + "attn.k_norm.weight");
    }
  }
  return out;
}
}  // namespace

namespace {

// dir/config.json, the weights' type named by the embedding's.
void write_hf_config(const nn::GptConfig& c, DType dtype, const std::string& dir) {
  const std::string torch_dtype = dtype == DType::BF16  ? "bfloat16"
                                  : dtype == DType::F16 ? "float16"
                                                        : "float32";
  const std::string path = dir + "/config.json";
  std::ofstream f(path);
  f << hf_config_json(c, torch_dtype);
  if (!f) throw IoError("export: cannot write '" + path + "'");
}

void make_directory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError("export: cannot create the directory '" + dir + "': " + ec.message());
}

int64_t layout_bytes(const TensorLayout& l) {
  return numel(l.shape) * static_cast<int64_t>(dtype_size(l.dtype));
}

// "model-00002-of-00005.safetensors", Hugging Face's shard names.
std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

bool is_shard_name(const std::string& name) {
  static const std::regex pattern(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return std::regex_match(name, pattern);
}

// The weights of an exported model, tensor by tensor in `layout`'s order:
// dir/model.safetensors, or, past `max_shard_bytes`, Hugging Face's shards
// (model-0000K-of-0000N.safetensors, filled in order, a tensor larger than
// the limit alone in its shard) and model.safetensors.index.json naming
// each tensor's shard. Shards are written under hidden names and renamed
// only when every one is complete, then the index; the weights of an
// earlier export to the same directory (the single file or shards the new
// ones do not replace) are removed last, so transformers never finds two
// sets. Destroyed before commit() (an error on the way), nothing of the
// new weights is left and the directory's old ones are untouched.
class HfWeightsWriter {
 public:
  // (max_shard_bytes > 0: check_options has checked it.)
  HfWeightsWriter(std::string dir, const std::vector<std::pair<std::string, TensorLayout>>& layout,
                  int64_t max_shard_bytes)
      : dir_(std::move(dir)) {
    std::vector<std::vector<std::pair<std::string, TensorLayout>>> shards(1);
    int64_t bytes = 0;
    for (const auto& entry : layout) {
      const int64_t b = layout_bytes(entry.second);
      if (!shards.back().empty() && bytes + b > max_shard_bytes) {
        shards.emplace_back();
        bytes = 0;
      }
      shards.back().push_back(entry);
      bytes += b;
      total_bytes_ += b;
    }
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string name =
          shards.size() == 1 ? "model.safetensors" : shard_name(i, shards.size());
      for (const auto& [tensor, l] : shards[i]) weight_map_[tensor] = name;
      plan_.push_back({name, std::move(shards[i])});
    }
  }
  ~HfWeightsWriter() {
    if (committed_) return;
    writer_.reset();  // removes its unfinished file
    std::error_code ignored;
    for (const auto& staged : staged_) std::filesystem::remove(staged, ignored);
  }
  HfWeightsWriter(const HfWeightsWriter&) = delete;
  HfWeightsWriter& operator=(const HfWeightsWriter&) = delete;

  void write(const std::string& name, const Tensor& t) {
    if (!writer_ || writer_->next().empty()) open_next(name);
    writer_->write(name, t);
  }

  // Every tensor written: the shards take their names, then the index.
  void commit() {
    if (writer_) writer_->finish();
    if (staged_.size() != plan_.size()) {
      throw ValueError("export: " + std::to_string(staged_.size()) + " of " +
                       std::to_string(plan_.size()) + " weight files written");
    }
    namespace fs = std::filesystem;
    std::error_code ec;
    for (size_t i = 0; i < plan_.size(); ++i) {
      const std::string to = dir_ + "/" + plan_[i].first;
      fs::rename(staged_[i], to, ec);
      if (ec)
        throw IoError("export: cannot rename '" + staged_[i] + "' to '" + to +
                      "': " + ec.message());
    }
    committed_ = true;
    const bool sharded = plan_.size() > 1;
    if (sharded) {
      nlohmann::json index;
      index["metadata"]["total_size"] = total_bytes_;
      index["weight_map"] = weight_map_;
      const std::string path = dir_ + "/model.safetensors.index.json";
      {
        std::ofstream f(path + ".tmp");
        f << index.dump(2) << "\n";
        if (!f) throw IoError("export: cannot write '" + path + ".tmp'");
      }
      fs::rename(path + ".tmp", path, ec);
      if (ec) throw IoError("export: cannot rename '" + path + ".tmp': " + ec.message());
    }
    // An earlier export's weights that these do not replace.
    std::set<std::string> mine;
    for (const auto& [name, part] : plan_) mine.insert(name);
    std::vector<fs::path> stale;
    for (const auto& entry : fs::directory_iterator(dir_, ec)) {
      const std::string name = entry.path().filename().string();
      if (mine.count(name) == 0 && (is_shard_name(name) || name == "model.safetensors" ||
                                    (!sharded && name == "model.safetensors.index.json"))) {
        stale.push_back(entry.path());
      }
    }
    for (const auto& path : stale) fs::remove(path, ec);
  }

  // The weight files' names, in order.
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& [name, part] : plan_) out.push_back(name);
    return out;
  }

 private:
  void open_next(const std::string& name) {
    if (writer_) writer_->finish();
    const size_t i = staged_.size();
    if (i == plan_.size()) {
      throw ValueError("export: tensor '" + name + "' is past the last weight file's layout");
    }
    staged_.push_back(dir_ + "/.triad-export-" + plan_[i].first);
    writer_ = std::make_unique<SafetensorsWriter>(
        staged_.back(), plan_[i].second, std::map<std::string, std::string>{{"format", "pt"}});
  }

  std::string dir_;
  // (file name, its tensors in order)
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, TensorLayout>>>> plan_;
  std::map<std::string, std::string> weight_map_;
  int64_t total_bytes_ = 0;
  std::vector<std::string> staged_;  // the shards opened so far, under their hidden names
  std::unique_ptr<SafetensorsWriter> writer_;
  bool committed_ = false;
};

}  // namespace

int64_t parse_byte_size(const std::string& text) {
  static const std::regex pattern(R"(\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*)");
  std::smatch m;
  auto bad = [&]() {
    return ValueError("size '" + text +
                      "': expected a positive number of bytes with an optional unit (B, KB, MB, "
                      "GB, TB, KiB, MiB, GiB, TiB), e.g. 5GB");
  };
  if (!std::regex_match(text, m, pattern)) throw bad();
  std::string unit = m[2].str();
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  static const std::map<std::string, double> units = {{"", 1.0},
                                                      {"b", 1.0},
                                                      {"kb", 1e3},
                                                      {"mb", 1e6},
                                                      {"gb", 1e9},
                                                      {"tb", 1e12},
                                                      {"kib", 1024.0},
                                                      {"mib", 1048576.0},
                                                      {"gib", 1073741824.0},
                                                      {"tib", 1099511627776.0}};
  auto it = units.find(unit);
  if (it == units.end()) throw bad();
  // (Digits past a double's range: std::stod's out_of_range.)
  const double number = std::strtod(m[1].str().c_str(), nullptr);
  const double bytes = number * it->second;
  if (!(bytes >= 1.0) || bytes > 9.0e18) throw bad();
  return static_cast<int64_t>(bytes);
}

DType hf_weights_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return DType::F32;
  if (name == "bfloat16" || name == "bf16") return DType::BF16;
  if (name == "float16" || name == "fp16") return DType::F16;
  throw ValueError("weights dtype '" + name +
                   "': expected float32, bfloat16 or float16 (or fp32, bf16, fp16)");
}

namespace {

void check_options(const HfExportOptions& o) {
  if (o.max_shard_bytes <= 0) {
    throw ValueError("export: the largest shard must be a positive number of bytes, got " +
                     std::to_string(o.max_shard_bytes));
  }
  if (o.dtype && *o.dtype != DType::F32 && *o.dtype != DType::BF16 && *o.dtype != DType::F16) {
    throw ValueError(std::string("export: weights of dtype ") + dtype_name(*o.dtype) +
                     ": expected f32, bf16 or f16");
  }
}

// `t` in the export's type.
Tensor in_dtype(const Tensor& t, const HfExportOptions& o) {
  return o.dtype && t.dtype() != *o.dtype ? cast(t, *o.dtype) : t;
}

}  // namespace

std::vector<std::string> save_hf_model(const nn::StateDict& full, const nn::GptConfig& c,
                                       const std::string& dir, const HfExportOptions& options) {
  check_options(options);
  const std::map<std::string, Tensor> tensors = triad_to_hf(full, c);
  std::vector<std::pair<std::string, TensorLayout>> layout;
  for (const auto& [name, t] : tensors)
    layout.push_back({name, {t.shape(), options.dtype.value_or(t.dtype())}});
  make_directory(dir);
  HfWeightsWriter writer(dir, layout, options.max_shard_bytes);
  for (const auto& [name, t] : tensors) writer.write(name, in_dtype(t, options));
  writer.commit();
  write_hf_config(c, options.dtype.value_or(at(full, "wte.weight").dtype()), dir);
  return writer.files();
}

std::vector<std::string> export_hf_parts(const WeightParts& read, const nn::GptConfig& c,
                                         const std::string& dir, const HfExportOptions& options) {
  check_options(options);  // before anything is read or written
  // Which part a reader's state dict is: -1 (outside the blocks) or a block.
  auto part_of = [](const nn::StateDict& triad) {
    return triad.empty() ? int64_t{-1} : block_index(triad.begin()->first);
  };
  // The first pass learns every tensor's name, shape and type in the order
  // the second writes them.
  std::vector<std::pair<std::string, TensorLayout>> layout;
  std::optional<DType> dtype;
  read([&](nn::StateDict&& triad) {
    const int64_t part = part_of(triad);
    if (part < 0) dtype = at(triad, "wte.weight").dtype();
    for (const auto& [name, t] : triad_to_hf_part(triad, c, part))
      layout.push_back({name, {t.shape(), options.dtype.value_or(t.dtype())}});
  });
  if (!dtype) throw ValueError("export: the weights hold no wte.weight");
  if (options.before_writing) options.before_writing();
  make_directory(dir);
  HfWeightsWriter writer(dir, layout, options.max_shard_bytes);
  read([&](nn::StateDict&& triad) {
    for (const auto& [name, t] : triad_to_hf_part(triad, c, part_of(triad)))
      writer.write(name, in_dtype(t, options));
  });
  writer.commit();
  write_hf_config(c, options.dtype.value_or(*dtype), dir);
  return writer.files();
}

std::vector<std::string> export_hf_model(const std::string& weights, const nn::GptConfig& c,
                                         const std::string& dir, const HfExportOptions& options) {
  check_options(options);
  // The export's weights would replace (or, sharded, remove) the file it
  // reads: a run's model.safetensors exported into its own directory.
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path source_dir =
      fs::is_directory(weights, ec) ? fs::path(weights) : fs::path(weights).parent_path();
  if (fs::exists(dir, ec) && fs::equivalent(source_dir.empty() ? "." : source_dir, dir, ec)) {
    throw ValueError("export: the output directory '" + dir + "' holds the weights '" + weights +
                     "' being exported; write the export to another directory");
  }
  const auto shapes = nn::gpt_parameter_shapes(c);
  return export_hf_parts(
      [&](const std::function<void(nn::StateDict &&)>& consume) {
        read_gpt2_weights(weights, shapes, nullptr, consume, weight_layout(c));
      },
      c, dir, options);
}

std::vector<std::string> copy_hf_tokenizer(const std::string& source, const std::string& dir,
                                           int64_t vocab_size) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // (source file, name in dir)
  std::vector<std::pair<fs::path, std::string>> files;
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (fs::is_directory(source, ec)) {
    const fs::path from(source);
    for (const char* name :
         {"tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "tokenizer_config.json",
          "special_tokens_map.json", "added_tokens.json", "generation_config.json"}) {
      if (fs::is_regular_file(from / name, ec)) files.emplace_back(from / name, name);
    }
    const bool gpt2 = fs::is_regular_file(from / "vocab.json", ec) &&
                      fs::is_regular_file(from / "merges.txt", ec);
    if (fs::exists(from / "tokenizer.json", ec) || fs::exists(from / "tokenizer.model", ec)) {
      tokenizer = data::load_tokenizer(source);
    } else if (gpt2) {
      tokenizer = std::make_unique<data::Gpt2BpeTokenizer>((from / "vocab.json").string(),
                                                           (from / "merges.txt").string());
    } else {
      throw IoError("tokenizer directory '" + source +
                    "' holds no tokenizer.json, tokenizer.model, or vocab.json with merges.txt");
    }
  } else {
    tokenizer = data::load_tokenizer(source);
    const bool sentencepiece =
        dynamic_cast<const data::SentencePieceTokenizer*>(tokenizer.get()) != nullptr;
    files.emplace_back(source, sentencepiece ? "tokenizer.model" : "tokenizer.json");
  }
  if (tokenizer->vocab_size() > vocab_size) {
    throw ValueError("tokenizer '" + source + "' has " + std::to_string(tokenizer->vocab_size()) +
                     " tokens but the model's vocab_size is " + std::to_string(vocab_size));
  }
  if (fs::is_directory(source, ec)) {
    for (const int64_t id : load_hf_stop_tokens(source)) {
      if (id >= vocab_size) {
        throw ValueError("'" + (fs::path(source) / "generation_config.json").string() +
                         "': eos_token_id " + std::to_string(id) +
                         " is not below the model's vocab_size " + std::to_string(vocab_size));
      }
    }
  }
  fs::create_directories(dir, ec);
  if (ec) throw IoError("cannot create the directory '" + dir + "': " + ec.message());
  std::vector<std::string> written;
  for (const auto& [from, name] : files) {
    const fs::path to = fs::path(dir) / name;
    if (!fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec) || ec) {
      throw IoError("cannot copy '" + from.string() + "' to '" + to.string() +
                    "': " + ec.message());
    }
    written.push_back(name);
  }
  return written;
}

}  // namespace triad::io
