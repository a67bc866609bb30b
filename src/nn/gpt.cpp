#include "triad/nn/gpt.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "triad/autograd/checkpoint.h"
#include "triad/autograd/grad_mode.h"
#include "triad/backend/backend.h"
#include "triad/core/half.h"
#include "triad/core/rng.h"
#include "triad/nn/documents.h"
#include "triad/nn/init.h"
#include "triad/nn/latent_attention.h"
#include "triad/nn/moe.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/linalg.h"
#include "triad/ops/nn_functional.h"
#include "triad/ops/shape_ops.h"

namespace triad::nn {

namespace {

// model.<name>: increasing layer indices below n_layer.
void require_layer_list(const std::vector<int64_t>& layers, const char* name, int64_t n_layer) {
  for (size_t i = 0; i < layers.size(); ++i) {
    const int64_t l = layers[i];
    if (l < 0 || l >= n_layer || (i > 0 && l <= layers[i - 1])) {
      throw ConfigError(std::string("model.") + name + ": " + std::to_string(l) + " at position " +
                        std::to_string(i) + "; expected increasing layer indices in [0, " +
                        std::to_string(n_layer) + ")");
    }
  }
}

void require_positive(int64_t v, const char* name) {
  if (v <= 0)
    throw ConfigError(std::string("model.") + name + " (" + std::to_string(v) +
                      ") must be positive");
}

// Dropout at a named site; identity when not training or p == 0.
Tensor site_dropout(const Tensor& x, double p, const ForwardContext& ctx, int64_t layer,
                    const char* site) {
  if (!ctx.training || p == 0.0) return x;
  return sequence_dropout(x, p, ctx.seed, site_stream(site, layer), ctx.call, nullptr, ctx.calls);
}

}  // namespace

Recompute recompute_from_string(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full") return Recompute::Full;
  throw ConfigError("model.recompute ('" + name + "') must be none, selective or full");
}

const char* recompute_string(Recompute r) {
  return r == Recompute::Full ? "full" : r == Recompute::Selective ? "selective" : "none";
}

PositionEmbedding position_embedding_from_string(const std::string& name) {
  if (name == "learned") return PositionEmbedding::Learned;
  if (name == "rope") return PositionEmbedding::Rotary;
  throw ConfigError("model.position_embedding ('" + name + "') must be learned or rope");
}

const char* position_embedding_string(PositionEmbedding p) {
  return p == PositionEmbedding::Rotary ? "rope" : "learned";
}

Normalization normalization_from_string(const std::string& name) {
  if (name == "layernorm") return Normalization::LayerNorm;
  if (name == "rmsnorm") return Normalization::RmsNorm;
  throw ConfigError("model.normalization ('" + name + "') must be layernorm or rmsnorm");
}

const char* normalization_string(Normalization n) {
  return n == Normalization::RmsNorm ? "rmsnorm" : "layernorm";
}

void set_qk_norm(GptConfig& c, const std::string& value) {
  if (value == "false" || value == "none") {
    c.qk_norm = c.qk_norm_full = c.qk_head_layernorm = false;
  } else if (value == "true" || value == "head") {
    c.qk_norm = true;
    c.qk_norm_full = c.qk_head_layernorm = false;
  } else if (value == "full") {
    c.qk_norm = c.qk_norm_full = true;
    c.qk_head_layernorm = false;
  } else if (value == "head_layernorm") {
    c.qk_norm = c.qk_head_layernorm = true;
    c.qk_norm_full = false;
  } else {
    throw ConfigError("model.qk_norm ('" + value +
                      "') must be true (or head: each head alone), full (all heads together), "
                      "head_layernorm (a LayerNorm on each head, weights per head) or false");
  }
}

const char* qk_norm_string(const GptConfig& c) {
  return !c.qk_norm            ? "false"
         : c.qk_norm_full      ? "full"
         : c.qk_head_layernorm ? "head_layernorm"
                               : "true";
}

Activation activation_from_string(const std::string& name) {
  if (name == "gelu") return Activation::Gelu;
  if (name == "gelu_erf") return Activation::GeluErf;
  if (name == "swiglu") return Activation::SwiGlu;
  if (name == "geglu") return Activation::GeGlu;
  if (name == "relu2") return Activation::Relu2;
  throw ConfigError("model.activation ('" + name +
                    "') must be gelu, gelu_erf, swiglu, geglu or relu2");
}

const char* activation_string(Activation a) {
  switch (a) {
    case Activation::SwiGlu:
      return "swiglu";
    case Activation::GeGlu:
      return "geglu";
    case Activation::GeluErf:
      return "gelu_erf";
    case Activation::Relu2:
      return "relu2";
    case Activation::Gelu:
      break;
  }
  return "gelu";
}

Tensor scale_token_embeddings(const GptConfig& cfg, const Tensor& x) {
  if (cfg.embedding_multiplier == 1.0) return x;
  // In the embeddings' type, as Gemma's reference implementations multiply
  // (Hugging Face's by a tensor of that dtype): bf16 training and inference
  // use sqrt(3072) = 55.5, not 55.43.
  double m = cfg.embedding_multiplier;
  if (x.dtype() == DType::BF16) m = bf16_to_float(float_to_bf16(static_cast<float>(m)));
  if (x.dtype() == DType::F16) m = f16_to_float(float_to_f16(static_cast<float>(m)));
  return affine(x, m);
}

Tensor unfused_activation(Activation a, const Tensor& x) {
  switch (a) {
    case Activation::GeluErf:
      return gelu_erf(x);
    case Activation::GeGlu:
      return geglu(x);
    case Activation::SwiGlu:
      return swiglu(x);
    case Activation::Relu2:  // (So et al. 2021, Primer; Nemotron-4's MLP)
      return relu2(x);
    case Activation::Gelu:
      break;
  }
  throw ValueError("unfused_activation: gelu runs fused into the MLP's linear layers");
}

void GptConfig::validate() const {
  require_positive(n_layer, "n_layer");
  require_positive(n_head, "n_head");
  require_positive(d_model, "d_model");
  require_positive(vocab_size, "vocab_size");
  require_positive(seq_len, "seq_len");
  if (resets_documents() && (eod_token < 0 || eod_token >= vocab_size)) {
    throw ConfigError("data.eod_token (" + std::to_string(eod_token) +
                      ") must be a token id in [0, " + std::to_string(vocab_size) +
                      ") when data.reset_attention_mask or data.reset_position_ids is set");
  }
  if (latent_attention() || mla != Mla{}) validate_latent_attention();
  if (mtp_layers < 0 || mtp_layers >= seq_len) {
    throw ConfigError("model.mtp_layers (" + std::to_string(mtp_layers) +
                      ") must be at least 0 and below model.seq_len (" + std::to_string(seq_len) +
                      "): module k predicts the token k + 1 ahead of each position's next");
  }
  if (recompute_layers < 0 || (recompute_layers > 0 && recompute != Recompute::Full)) {
    throw ConfigError("model.recompute_layers (" + std::to_string(recompute_layers) + ") " +
                      (recompute_layers < 0 ? "must be at least 0 (0: every layer)"
                                            : std::string("goes with model.recompute: full (got ") +
                                                  recompute_string(recompute) + ")"));
  }
  if (!(z_loss_coef >= 0.0) || !std::isfinite(z_loss_coef)) {
    throw ConfigError("model.z_loss_coef (" + std::to_string(z_loss_coef) +
                      ") must be a finite number >= 0 (0: no z-loss; PaLM used 1e-4)");
  }
  if (!(mtp_loss_weight >= 0.0) || !std::isfinite(mtp_loss_weight)) {
    throw ConfigError("model.mtp_loss_weight (" + std::to_string(mtp_loss_weight) +
                      ") must be a finite number >= 0");
  }
  if (head_size < 0) {
    throw ConfigError("model.head_dim (" + std::to_string(head_size) +
                      ") must be positive (or 0 for model.d_model / model.n_head)");
  }
  if (head_size == 0 && !latent_attention() && d_model % n_head != 0) {
    throw ConfigError("model.d_model (" + std::to_string(d_model) +
                      ") must be divisible by model.n_head (" + std::to_string(n_head) +
                      "), or model.head_dim must set the heads' width");
  }
  if (n_kv_head < 0 || n_head % kv_heads() != 0) {
    throw ConfigError("model.n_kv_head (" + std::to_string(n_kv_head) +
                      ") must divide model.n_head (" + std::to_string(n_head) +
                      "), or be 0 for one key/value head per query head");
  }
  if (rotary() && head_dim() % 2 != 0) {
    throw ConfigError("model.position_embedding rope needs an even head dimension; " +
                      (head_size > 0 ? "model.head_dim is " + std::to_string(head_size)
                                     : "model.d_model (" + std::to_string(d_model) +
                                           ") / model.n_head (" + std::to_string(n_head) + ") is " +
                                           std::to_string(d_model / n_head)));
  }
  if (sliding_window < 0) {
    throw ConfigError("model.sliding_window (" + std::to_string(sliding_window) +
                      ") must be >= 0 (0: no window)");
  }
  if (lora.rank < 0) {
    throw ConfigError("model.lora.rank (" + std::to_string(lora.rank) +
                      ") must be positive (or 0: no adapters)");
  }
  if (lora.rank > 0) {
    if (!(lora.alpha >= 0) || !std::isfinite(lora.alpha)) {
      throw ConfigError("model.lora.alpha (" + std::to_string(lora.alpha) +
                        ") must be a finite number >= 0 (0: the rank, a scale of 1)");
    }
    if (!(lora.dropout >= 0.0 && lora.dropout < 1.0)) {
      throw ConfigError("model.lora.dropout (" + std::to_string(lora.dropout) +
                        ") must be in [0, 1)");
    }
    if (lora.targets.empty()) throw ConfigError("model.lora.targets must name at least one layer");
    std::string allowed;
    for (const auto* list : {&lora_layers(), &latent_lora_layers()})
      for (const std::string& l : *list) allowed += (allowed.empty() ? "" : ", ") + l;
    const auto& latent = latent_lora_layers();
    for (size_t i = 0; i < lora.targets.size(); ++i) {
      const std::string& t = lora.targets[i];
      const std::string where = "model.lora.targets[" + std::to_string(i) + "] '" + t + "'";
      const bool of_latent = std::find(latent.begin(), latent.end(), t) != latent.end();
      if (!of_latent &&
          std::find(lora_layers().begin(), lora_layers().end(), t) == lora_layers().end())
        throw ConfigError(where + " is not a layer LoRA adapts (one of " + allowed + ")");
      if (of_latent && !latent_attention())
        throw ConfigError(where +
                          " is a layer of model.mla's latent attention, which the model "
                          "has not");
      if (of_latent && !latent_layer_present(t)) {
        throw ConfigError(where + (mla.q_lora_rank > 0
                                       ? " reads the input straight, but model.mla.q_lora_rank "
                                         "makes the queries through a latent (attn.q_a_proj, "
                                         "attn.q_b_proj)"
                                       : " belongs to a query latent, but model.mla.q_lora_rank "
                                         "is 0 (attn.q_proj reads the input)"));
      }
      if (std::find(lora.targets.begin(), lora.targets.begin() + static_cast<std::ptrdiff_t>(i),
                    t) != lora.targets.begin() + static_cast<std::ptrdiff_t>(i))
        throw ConfigError(where + " is given twice");
    }
  }
  if (!full_attention_layers.empty() && sliding_window == 0) {
    throw ConfigError(
        "model.full_attention_layers exempts layers from a window, but model.sliding_window is 0");
  }
  require_layer_list(full_attention_layers, "full_attention_layers", n_layer);
  require_layer_list(nope_layers, "nope_layers", n_layer);
  if (!nope_layers.empty() && !rotary()) {
    throw ConfigError(
        "model.nope_layers leaves layers without rope, but model.position_embedding is learned "
        "(no layer turns its queries and keys)");
  }
  if (ffn_hidden_size < 0) {
    throw ConfigError("model.ffn_hidden_size (" + std::to_string(ffn_hidden_size) +
                      ") must be positive (or 0 for 4 * d_model)");
  }
  if (!(rope_theta > 0.0) || !std::isfinite(rope_theta)) {
    throw ConfigError("model.rope_theta (" + std::to_string(rope_theta) +
                      ") must be a positive number");
  }
  if (query_pre_attn_scalar != 0.0) {
    if (!(query_pre_attn_scalar > 0.0) || !std::isfinite(query_pre_attn_scalar)) {
      throw ConfigError("model.query_pre_attn_scalar (" + std::to_string(query_pre_attn_scalar) +
                        ") must be a positive number (or 0: head_dim)");
    }
    if (!rotary()) {
      throw ConfigError("model.query_pre_attn_scalar (" + std::to_string(query_pre_attn_scalar) +
                        ") rescales the attention through the rotary embedding: it needs "
                        "model.position_embedding rope");
    }
  }
  if (rope_dim != 0) {
    if (!rotary() || rope_dim < 2 || rope_dim > head_dim() || rope_dim % 2 != 0) {
      throw ConfigError("model.rope_dim (" + std::to_string(rope_dim) +
                        ") must be an even number of dimensions, at most head_dim " +
                        std::to_string(head_dim()) +
                        ", under model.position_embedding rope (0: the whole head)");
    }
    if (query_pre_attn_scalar > 0.0) {
      throw ConfigError(
          "model.rope_dim (" + std::to_string(rope_dim) +
          ") with model.query_pre_attn_scalar: the scalar rescales q and k through the rotation, "
          "which a partial rotation would apply to the turned dimensions alone");
    }
  }
  if (rope_local_theta != 0.0) {
    if (!(rope_local_theta > 0.0) || !std::isfinite(rope_local_theta)) {
      throw ConfigError("model.rope_local_theta (" + std::to_string(rope_local_theta) +
                        ") must be a positive number (or 0: rope_theta on every layer)");
    }
    if (!rotary() || sliding_window == 0) {
      throw ConfigError("model.rope_local_theta (" + std::to_string(rope_local_theta) +
                        ") is the windowed layers' RoPE base: it needs model.position_embedding "
                        "rope and a model.sliding_window");
    }
  }
  for (auto [key, cap] : {std::pair<const char*, double>{"attn_logit_softcap", attn_logit_softcap},
                          {"final_logit_softcap", final_logit_softcap}}) {
    if (!(cap >= 0.0) || !std::isfinite(cap)) {
      throw ConfigError(std::string("model.") + key + " (" + std::to_string(cap) +
                        ") must be a positive number (or 0: no soft-capping)");
    }
  }
  RopeScaling turned = rope_scaling;  // (longrope's factors are the turned pairs')
  turned.rotary_dim = latent_attention() ? mla.qk_rope_head_dim : rope_dim;
  if (const std::string why = rope_scaling_problem(turned, head_dim()); !why.empty())
    throw ConfigError("model.rope_scaling: " + why);
  if (!(layer_norm_eps > 0.0) || !std::isfinite(layer_norm_eps)) {
    throw ConfigError("model.norm_eps (" + std::to_string(layer_norm_eps) +
                      ") must be a positive number");
  }
  if (!(init_std > 0.0) || !std::isfinite(init_std)) {
    throw ConfigError("model.init_std (" + std::to_string(init_std) +
                      ") must be a positive number (the weights' initial std)");
  }
  if (!(embedding_multiplier > 0.0) || !std::isfinite(embedding_multiplier)) {
    throw ConfigError("model.embedding_multiplier (" + std::to_string(embedding_multiplier) +
                      ") must be a positive number");
  }
  for (auto [key, v] : {std::pair<const char*, double>{"residual_multiplier", residual_multiplier},
                        {"logit_scale", logit_scale}}) {
    if (!(v > 0.0) || !std::isfinite(v))
      throw ConfigError(std::string("model.") + key + " (" + std::to_string(v) +
                        ") must be a positive number (1: none)");
  }
  if (logit_scale != 1.0 && head_bias) {
    throw ConfigError("model.logit_scale (" + std::to_string(logit_scale) +
                      ") scales ln_f's output, which equals scaling the logits only without a "
                      "head bias; model.head_bias is true");
  }
  // (Every count and offset is a 64-bit integer; 2^60 parameters, a
  // million times today's largest models, leaves room for their products.)
  if (const double count = parameter_count(); !(count < 0x1p60)) {
    char what[64];
    std::snprintf(what, sizeof what, "%.3g", count);
    throw ConfigError("model: n_layer " + std::to_string(n_layer) + ", d_model " +
                      std::to_string(d_model) + " and vocab_size " + std::to_string(vocab_size) +
                      " make " + what + " parameters, more than the 2^60 Triad can count");
  }
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    throw ConfigError("model.dropout (" + std::to_string(dropout) + ") must be in [0, 1)");
  }
  if (shared_norm && (!parallel_residual || post_norms)) {
    throw ConfigError(std::string("model.shared_norm: one norm for both sublayers needs ") +
                      (post_norms ? "no model.post_norms" : "model.parallel_residual: true") +
                      " (the sequential block's MLP reads the attention's sum, normalised anew)");
  }
  if (!(clip_qkv >= 0.0) || !std::isfinite(clip_qkv)) {
    throw ConfigError("model.clip_qkv (" + std::to_string(clip_qkv) +
                      ") must be a finite number >= 0 (0: no clamp)");
  }
  if (!norm_bias && (!norm_affine || normalization != Normalization::LayerNorm)) {
    throw ConfigError(
        std::string("model.norm_bias: false drops a LayerNorm's learned shift, but ") +
        (normalization != Normalization::LayerNorm
             ? "model.normalization is rmsnorm, which has none"
             : "model.norm_affine: false norms learn nothing"));
  }
  if (!norm_affine && norm_weight_offset) {
    throw ConfigError(
        "model.norm_weight_offset scales each norm by 1 + weight, but model.norm_affine: false "
        "norms have no weight");
  }
  if (qk_norm_full && !qk_norm) {
    throw ConfigError("model.qk_norm_full: norms over all the queries and keys need model.qk_norm");
  }
  if (qk_head_layernorm && (!qk_norm || qk_norm_full)) {
    throw ConfigError(
        "model.qk_head_layernorm: LayerNorms on each head need model.qk_norm, and not full ones");
  }
  if (qk_head_layernorm && norm_weight_offset) {
    throw ConfigError(
        "model.qk_norm: head_layernorm scales each head by its weights, not by 1 + weight: it does "
        "not go with model.norm_weight_offset");
  }
  if (!pre_norms && (!post_norms || parallel_residual)) {
    throw ConfigError(std::string("model.pre_norms: false (OLMo 2's blocks) needs ") +
                      (!post_norms ? "model.post_norms: true (else nothing in the blocks "
                                     "normalises)"
                                   : "no model.parallel_residual (the sublayers read the "
                                     "residual stream in turn)"));
  }
  if (moe.experts < 0) {
    throw ConfigError("model.moe.experts (" + std::to_string(moe.experts) +
                      ") must be positive (or 0: dense MLPs)");
  }
  if (moe.experts > 0) {
    if (moe.top_k < 1 || moe.top_k > moe.experts) {
      throw ConfigError("model.moe.top_k (" + std::to_string(moe.top_k) +
                        ") must be in [1, model.moe.experts (" + std::to_string(moe.experts) +
                        ")]");
    }
    if (moe.ffn_hidden_size < 0) {
      throw ConfigError("model.moe.ffn_hidden_size (" + std::to_string(moe.ffn_hidden_size) +
                        ") must be positive (or 0: the model's ffn_hidden_size)");
    }
    if (!(moe.z_loss_coef >= 0.0) || !std::isfinite(moe.z_loss_coef)) {
      throw ConfigError("model.moe.z_loss_coef (" + std::to_string(moe.z_loss_coef) +
                        ") must be a finite number >= 0 (0: no router z-loss)");
    }
    if (!(moe.aux_loss_coef >= 0.0) || !std::isfinite(moe.aux_loss_coef)) {
      throw ConfigError("model.moe.aux_loss_coef (" + std::to_string(moe.aux_loss_coef) +
                        ") must be a finite number >= 0 (0: no load-balancing loss)");
    }
    for (size_t i = 0; i < moe.dense_layers.size(); ++i) {
      const int64_t l = moe.dense_layers[i];
      if (l < 0 || l >= n_layer || (i > 0 && l <= moe.dense_layers[i - 1])) {
        throw ConfigError("model.moe.dense_layers: " + std::to_string(l) + " at position " +
                          std::to_string(i) + "; expected increasing layer indices in [0, " +
                          std::to_string(n_layer) + ")");
      }
    }
    if (moe.shared_ffn_hidden_size < 0) {
      throw ConfigError("model.moe.shared_ffn_hidden_size (" +
                        std::to_string(moe.shared_ffn_hidden_size) +
                        ") must be positive (or 0: no shared expert)");
    }
    // A number model.moe.`key` holds, which must be finite and at least
    // `least` (above it when `strictly`), else a ConfigError saying `means`.
    const auto check_number = [](const char* key, double v, double least, bool strictly,
                                 const char* means) {
      if (std::isfinite(v) && (strictly ? v > least : v >= least)) return;
      char text[32], bound[32];
      std::snprintf(text, sizeof text, "%g", v);
      std::snprintf(bound, sizeof bound, "%g", least);
      throw ConfigError(std::string("model.moe.") + key + " (" + text +
                        ") must be a finite number " + (strictly ? "> " : ">= ") + bound + " (" +
                        means + ")");
    };
    check_number("capacity_factor", moe.capacity_factor, 0, false, "0: dropless");
    if (moe.pad_to_capacity && moe.capacity_factor == 0) {
      throw ConfigError(
          "model.moe.pad_to_capacity pads each expert's batch to its capacity, but "
          "model.moe.capacity_factor is 0 (dropless: no capacity)");
    }
    check_number("routed_scaling_factor", moe.routed_scaling_factor, 0, true,
                 "1: the gates as they are");
    check_number("bias_update_rate", moe.bias_update_rate, 0, false,
                 "0: the expert biases stay as loaded");
    if (moe.groups < 1 || moe.experts % moe.groups != 0) {
      throw ConfigError("model.moe.groups (" + std::to_string(moe.groups) +
                        ") must divide model.moe.experts (" + std::to_string(moe.experts) +
                        ") into equal groups (1: no group limit)");
    }
    if (moe.top_groups < 1 || moe.top_groups > moe.groups) {
      throw ConfigError("model.moe.top_groups (" + std::to_string(moe.top_groups) +
                        ") must be in [1, model.moe.groups (" + std::to_string(moe.groups) + ")]");
    }
    if (moe.groups > 1 && moe.top_k > moe.top_groups * (moe.experts / moe.groups)) {
      throw ConfigError("model.moe.top_k (" + std::to_string(moe.top_k) + ") exceeds the " +
                        std::to_string(moe.top_groups * (moe.experts / moe.groups)) +
                        " experts of model.moe.top_groups (" + std::to_string(moe.top_groups) +
                        ") groups of " + std::to_string(moe.experts / moe.groups));
    }
    if (moe.group_score != Moe::GroupScore::TopTwoSum && moe.groups == 1) {
      throw ConfigError(
          "model.moe.group_score max scores groups of experts, but model.moe.groups is 1 (no "
          "groups)");
    }
    if (moe.shared_gate && moe.shared_ffn_hidden_size == 0) {
      throw ConfigError(
          "model.moe.shared_gate gates the shared expert, but model.moe.shared_ffn_hidden_size "
          "is 0 (none)");
    }
    if (mlp_bias) {
      throw ConfigError(
          "model.mlp_bias with model.moe: the experts have no biases (Mixtral's and Qwen's "
          "have none); model.linear_bias applies to the attention and the dense MLPs alone");
    }
  } else if (!moe.dense_layers.empty() || moe.shared_ffn_hidden_size != 0 || moe.shared_gate ||
             moe.capacity_factor != 0 || moe.pad_to_capacity || moe.z_loss_coef != 0 ||
             moe.score != Moe::Score::Softmax || moe.routed_scaling_factor != 1.0 ||
             moe.groups != 1 || moe.top_groups != 1 ||
             moe.group_score != Moe::GroupScore::TopTwoSum || moe.expert_bias ||
             moe.aux_loss_scope != Moe::BalanceScope::MicroBatch) {
    throw ConfigError(
        "model.moe's dense_layers, shared_ffn_hidden_size, shared_gate, capacity_factor, "
        "pad_to_capacity, z_loss_coef, score, routed_scaling_factor, groups, top_groups, "
        "group_score, "
        "expert_bias and aux_loss_scope belong to a mixture, but model.moe.experts is 0");
  }
  if (head_bias && tie_embeddings) {
    throw ConfigError(
        "model.head_bias: a bias on the logits needs an untied head (model.tie_embeddings: "
        "false); the token embedding has no bias to share");
  }
}

void GptConfig::validate_latent_attention() const {
  const auto sizes = [&] {
    return "kv_lora_rank " + std::to_string(mla.kv_lora_rank) + ", q_lora_rank " +
           std::to_string(mla.q_lora_rank) + ", qk_nope_head_dim " +
           std::to_string(mla.qk_nope_head_dim) + ", qk_rope_head_dim " +
           std::to_string(mla.qk_rope_head_dim) + ", v_head_dim " + std::to_string(mla.v_head_dim);
  };
  if (mla.kv_lora_rank < 1) {
    throw ConfigError("model.mla (" + sizes() +
                      "): kv_lora_rank must be positive (model.mla: none for c_attn's attention)");
  }
  if (mla.q_lora_rank < 0 || mla.qk_nope_head_dim < 0 || mla.v_head_dim < 1 ||
      mla.qk_rope_head_dim < 2 || mla.qk_rope_head_dim % 2 != 0) {
    throw ConfigError("model.mla (" + sizes() +
                      "): expected q_lora_rank >= 0 (0: queries straight from x), "
                      "qk_nope_head_dim >= 0, an even qk_rope_head_dim >= 2 and v_head_dim >= 1");
  }
  if (!(mla.mscale_all_dim >= 0.0) || !std::isfinite(mla.mscale_all_dim)) {
    throw ConfigError("model.mla.mscale_all_dim (" + std::to_string(mla.mscale_all_dim) +
                      ") must be a finite number >= 0 (0: the scores unscaled by yarn)");
  }
  // What the latent attention replaces, or cannot carry.
  std::string clash;
  if (!rotary()) clash = "model.position_embedding learned (its keys turn by rope)";
  if (n_kv_head != 0 && n_kv_head != n_head)
    clash = "model.n_kv_head " + std::to_string(n_kv_head) + " (every head has its own key)";
  if (head_size != 0) clash = "model.head_dim (the heads' widths are model.mla's)";
  if (rope_dim != 0) clash = "model.rope_dim (model.mla.qk_rope_head_dim turns)";
  if (qk_norm) clash = "model.qk_norm (the latents have their norms)";
  if (qkv_bias) clash = "model.qkv_bias (there is no c_attn)";
  if (clip_qkv != 0.0) clash = "model.clip_qkv (there is no c_attn)";
  if (query_pre_attn_scalar != 0.0) clash = "model.query_pre_attn_scalar";
  if (lora_on("attn.c_attn")) clash = "model.lora.targets attn.c_attn (there is no c_attn)";
  if (!clash.empty()) throw ConfigError("model.mla does not go with " + clash);
}

double GptConfig::latent_query_factor() const {
  if (!latent_attention()) return 1.0;
  // The fused attention scales by 1 / sqrt(head_dim()), the padded width.
  double f = std::sqrt(static_cast<double>(head_dim()) / static_cast<double>(latent_qk_dim()));
  if (rope_scaling.kind == RopeScaling::Kind::Yarn && mla.mscale_all_dim > 0.0 &&
      rope_scaling.factor > 1.0) {
    const double m = 0.1 * mla.mscale_all_dim * std::log(rope_scaling.factor) + 1.0;
    f *= m * m;
  }
  return f;
}

bool GptConfig::moe_layer(int64_t layer) const {
  return moe.experts > 0 &&
         !std::binary_search(moe.dense_layers.begin(), moe.dense_layers.end(), layer);
}

int64_t GptConfig::window_of(int64_t layer) const {
  if (std::binary_search(full_attention_layers.begin(), full_attention_layers.end(), layer))
    return 0;
  return sliding_window;
}

bool GptConfig::rotary_at(int64_t layer) const {
  return rotary() && !std::binary_search(nope_layers.begin(), nope_layers.end(), layer);
}

GptConfig::Rope GptConfig::rope_of(int64_t layer) const {
  Rope r{rope_theta, rope_scaling};
  if (rope_local_theta > 0.0 && window_of(layer) > 0) r = {rope_local_theta, RopeScaling{}};
  r.scaling.rotary_dim = latent_attention() ? mla.qk_rope_head_dim : rope_dim;
  // Scores q.k / sqrt(D) become q.k / sqrt(s) when q and k each grow by
  // (D / s)^(1/4).
  if (query_pre_attn_scalar > 0.0)
    r.scaling.amplitude = std::pow(static_cast<double>(head_dim()) / query_pre_attn_scalar, 0.25);
  return r;
}

namespace {

// One block's attention projections' weights (GptConfig::attention_weights)
// counted in T.
template <typename T>
T attention_weights_in(const GptConfig& c) {
  const T C = static_cast<T>(c.d_model), out = static_cast<T>(c.attn_out_width()) * C;
  if (!c.latent_attention()) return static_cast<T>(c.qkv_width()) * C + out;
  const auto& a = c.mla;
  const T H = static_cast<T>(c.n_head), qk = static_cast<T>(c.latent_qk_dim());
  const T q_rank = static_cast<T>(a.q_lora_rank), kv_rank = static_cast<T>(a.kv_lora_rank);
  const T queries = a.q_lora_rank > 0 ? C * q_rank + q_rank * H * qk : C * H * qk;
  const T keys = C * (kv_rank + static_cast<T>(a.qk_rope_head_dim)) +
                 kv_rank * H * static_cast<T>(a.qk_nope_head_dim + a.v_head_dim);
  return queries + keys + out;
}

// One block's parameters and the whole model's, counted in T: int64_t, or
// double for sizes whose count would overflow it.
template <typename T>
T block_parameters_in(const GptConfig& c, bool moe) {
  const T h = static_cast<T>(c.d_model), w = static_cast<T>(c.qkv_width());
  // Attention (w + q) h + w + h (4h^2 + 4h with a key/value head per query
  // head and q = h), MLP (h + 1) m + (f + 1) h, two LayerNorms 4h or
  // RMSNorms 2h (12h^2 + 13h for GPT-2), none without model.norm_affine;
  // twice that with post_norms. A mixture of experts: E experts' h m + f h
  // at their width, no biases, and the router's E h. Latent attention
  // (model.mla): its projections, their two latents' norms, and biases on
  // the layers reading x and on c_proj.
  const T norm = static_cast<T>((c.norm_weights() ? 1 : 0) + (c.norm_biases() ? 1 : 0)) * h;
  T attn_biases = (c.c_attn_bias() ? w : 0) + (c.linear_bias ? h : 0);
  if (c.latent_attention()) {
    const auto& a = c.mla;
    const T reads_x =
        static_cast<T>((a.q_lora_rank > 0 ? a.q_lora_rank : c.n_head * c.latent_qk_dim()) +
                       a.kv_lora_rank + a.qk_rope_head_dim);
    attn_biases =
        (c.linear_bias ? reads_x + h : 0) + static_cast<T>(a.q_lora_rank + a.kv_lora_rank);
  }
  const T norms = (c.pre_norms ? (c.shared_norm ? 1 : 2) : 0) + (c.post_norms ? 2 : 0);
  T mlp;
  if (moe) {
    const T E = static_cast<T>(c.moe.experts), f = static_cast<T>(c.expert_ffn()),
            m = static_cast<T>(c.expert_fc_width());
    const T shared = static_cast<T>(c.shared_fc_width() + c.moe.shared_ffn_hidden_size) * h +
                     (c.moe.shared_gate ? h : 0);
    mlp = E * (h * m + f * h) + E * h + shared + (c.moe.expert_bias ? E : 0);
  } else {
    const T f = static_cast<T>(c.ffn()), m = static_cast<T>(c.fc_width());
    mlp = h * m + f * h + (c.mlp_biases() ? m + h : 0);
  }
  return attention_weights_in<T>(c) + attn_biases + mlp + norms * norm +
         static_cast<T>(c.qk_norm ? c.q_norm_width() + c.k_norm_width() : 0);
}

template <typename T>
T parameters_in(const GptConfig& c) {
  // The blocks, the embeddings and ln_f.
  const T h = static_cast<T>(c.d_model);
  const T norm = static_cast<T>((c.norm_weights() ? 1 : 0) + (c.norm_biases() ? 1 : 0)) * h;
  const T tables =
      static_cast<T>((c.tie_embeddings ? 1 : 2) * c.vocab_size + (c.rotary() ? 0 : c.seq_len));
  const T moe_layers =
      c.moe.experts > 0
          ? static_cast<T>(c.n_layer - static_cast<int64_t>(c.moe.dense_layers.size()))
          : 0;
  const T dense_layers = static_cast<T>(c.n_layer) - moe_layers;
  // Each multi-token-prediction module: its block, eh_proj (2h -> h) and
  // three norms.
  T mtp = 0;
  for (int64_t k = 1; k <= c.mtp_layers; ++k)
    mtp += block_parameters_in<T>(c, c.moe_layer(c.n_layer + k - 1)) + 2 * h * h + 3 * norm;
  return dense_layers * block_parameters_in<T>(c, false) +
         (moe_layers > 0 ? moe_layers * block_parameters_in<T>(c, true) : 0) + tables * h + norm +
         static_cast<T>(c.head_bias ? c.vocab_size : 0) + mtp;
}

}  // namespace

int64_t GptConfig::attention_weights() const {
  return attention_weights_in<int64_t>(*this);
}

int64_t GptConfig::block_parameters(int64_t layer) const {
  return block_parameters_in<int64_t>(*this, moe_layer(layer));
}

double GptConfig::expert_parameter_count() const {
  if (moe.experts == 0) return 0.0;
  const double expert =
      static_cast<double>(d_model) * static_cast<double>(expert_fc_width() + expert_ffn());
  double moe_layers = static_cast<double>(n_layer - static_cast<int64_t>(moe.dense_layers.size()));
  for (int64_t k = 1; k <= mtp_layers; ++k) moe_layers += moe_layer(n_layer + k - 1) ? 1.0 : 0.0;
  return moe_layers * static_cast<double>(moe.experts) * expert;
}

double GptConfig::active_parameter_count() const {
  // Each MoE layer's experts count k of E times.
  if (moe.experts == 0) return parameter_count();
  const double unused = 1.0 - static_cast<double>(moe.top_k) / static_cast<double>(moe.experts);
  return parameter_count() - expert_parameter_count() * unused;
}

int64_t GptConfig::num_parameters() const {
  return parameters_in<int64_t>(*this);
}

double GptConfig::parameter_count() const {
  return parameters_in<double>(*this);
}

double GptConfig::training_flops(double sequences, double recomputed) const {
  const double s = static_cast<double>(seq_len), h = static_cast<double>(d_model);
  const double l = static_cast<double>(n_layer), V = static_cast<double>(vocab_size);
  const double f = static_cast<double>(ffn()), m = static_cast<double>(fc_width());
  // (Under model.mla a head's scores span latent_qk_dim() and its product
  // with V v_head_dim: the mean of the two stands for q's head width.)
  const double q =
      latent_attention()
          ? static_cast<double>(n_head) * static_cast<double>(latent_qk_dim() + mla.v_head_dim) / 2
          : static_cast<double>(q_width());
  // Forward per token: 2 FLOPs per weight of the layers' products (c_attn
  // h*w, 3h^2 with a key/value head per query head; c_proj q*h), 4*s*q for
  // the scores and their product with V (every query head's, q = h unless
  // model.head_dim sets the heads apart), 2*h*V for the head. A windowed
  // layer's queries each see at most the window's keys: 4*min(W, s)*q (the
  // work its kernels do, so that a model with short windows on a long
  // context is not credited with work nobody does).
  // (Each multi-token-prediction module adds a block of its own, eh_proj's
  // 2h x h and another pass through the head.)
  const int64_t blocks = n_layer + mtp_layers;
  double scores = 0.0;
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t window = window_of(i);
    scores += 4.0 * (window > 0 ? std::min(s, static_cast<double>(window)) : s) * q;
  }
  // The MLP's h*m + f*h, or a mixture's router h*E, k experts' own, and
  // the shared expert's (and its gate's).
  const double attn_weights = 2.0 * static_cast<double>(attention_weights());
  const double dense_mlp = 2.0 * (h * m + f * h);
  const double moe_mlp =
      moe.experts > 0
          ? 2.0 * (h * static_cast<double>(moe.experts) +
                   static_cast<double>(moe.top_k) * h *
                       static_cast<double>(expert_fc_width() + expert_ffn()) +
                   h * static_cast<double>(shared_fc_width() + moe.shared_ffn_hidden_size) +
                   (moe.shared_gate ? h : 0.0))
          : 0.0;
  double mlps = 0.0;
  for (int64_t i = 0; i < blocks; ++i) mlps += moe_layer(i) ? moe_mlp : dense_mlp;
  const double mtp = static_cast<double>(mtp_layers);
  const double layers = (l + mtp) * attn_weights + mlps + scores + mtp * 2.0 * (2.0 * h * h);
  const double forward = layers + (1.0 + mtp) * 2.0 * h * V;
  // Backward is twice forward; recomputation runs the layers forward once
  // more (not the head).
  const double per_token = 3.0 * forward + recomputed * layers;
  return sequences * s * per_token;
}

std::vector<const char*> block_norms(const GptConfig& cfg) {
  std::vector<const char*> out;
  if (cfg.pre_norms) out.push_back("ln_1");
  if (cfg.pre_norms && !cfg.shared_norm) out.push_back("ln_2");
  if (cfg.post_norms) out.insert(out.end(), {"post_attn_norm", "post_mlp_norm"});
  return out;
}

std::shared_ptr<LayerNorm> stream_norm(const GptConfig& cfg) {
  return std::make_shared<LayerNorm>(cfg.d_model, cfg.layer_norm_eps, DType::F32, cfg.rms_norm(),
                                     cfg.norm_weight_offset, cfg.norm_affine, cfg.norm_bias);
}

Tensor to_residual(const GptConfig& cfg, const Tensor& y) {
  return cfg.residual_multiplier == 1.0 ? y : affine(y, cfg.residual_multiplier);
}

Tensor scale_for_head(const GptConfig& cfg, const Tensor& y) {
  return cfg.logit_scale == 1.0 ? y : affine(y, cfg.logit_scale);
}

namespace {
// The parameters' shapes of a block of `cfg`'s kind, as layer i has it,
// under the names prefix p + (ln_1.weight, attn.c_attn.weight, ...).
void add_block_shapes(std::map<std::string, Shape>& s, const GptConfig& cfg, const std::string& p,
                      int64_t i) {
  const int64_t C = cfg.d_model;
  for (const char* norm : block_norms(cfg)) {
    if (cfg.norm_weights()) s[p + norm + ".weight"] = {C};
    if (cfg.norm_biases()) s[p + norm + ".bias"] = {C};
  }
  if (cfg.latent_attention()) {
    for (const auto& [name, shape] : latent_attention_shapes(cfg, cfg.n_head))
      s[p + "attn." + name] = shape;
  } else {
    s[p + "attn.c_attn.weight"] = {cfg.qkv_width(), C};
  }
  s[p + "attn.c_proj.weight"] = {C, cfg.attn_out_width()};
  if (cfg.moe_layer(i)) {
    s[p + "mlp.router.weight"] = {cfg.moe.experts, C};
    if (cfg.moe.expert_bias) s[p + "mlp.expert_bias"] = {cfg.moe.experts};
    for (int64_t e = 0; e < cfg.moe.experts; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      s[x + "c_fc.weight"] = {cfg.expert_fc_width(), C};
      s[x + "c_proj.weight"] = {C, cfg.expert_ffn()};
    }
    if (cfg.moe.shared_ffn_hidden_size > 0) {
      s[p + "mlp.shared.c_fc.weight"] = {cfg.shared_fc_width(), C};
      s[p + "mlp.shared.c_proj.weight"] = {C, cfg.moe.shared_ffn_hidden_size};
    }
    if (cfg.moe.shared_gate) s[p + "mlp.shared_gate.weight"] = {1, C};
  } else {
    s[p + "mlp.c_fc.weight"] = {cfg.fc_width(), C};
    s[p + "mlp.c_proj.weight"] = {C, cfg.ffn()};
  }
  if (cfg.c_attn_bias() && !cfg.latent_attention()) s[p + "attn.c_attn.bias"] = {cfg.qkv_width()};
  if (cfg.qk_norm) {
    s[p + "attn.q_norm.weight"] = {cfg.q_norm_width()};
    s[p + "attn.k_norm.weight"] = {cfg.k_norm_width()};
  }
  if (cfg.linear_bias) s[p + "attn.c_proj.bias"] = {C};
  if (cfg.mlp_biases() && !cfg.moe_layer(i)) {
    s[p + "mlp.c_fc.bias"] = {cfg.fc_width()};
    s[p + "mlp.c_proj.bias"] = {C};
  }
  for (const std::string& layer : cfg.lora_modules(i)) {
    if (!s.count(p + layer + ".weight")) continue;
    const Shape& w = s.at(p + layer + ".weight");
    s[p + layer + ".lora_a"] = {cfg.lora.rank, w[1]};
    s[p + layer + ".lora_b"] = {w[0], cfg.lora.rank};
  }
}
}  // namespace

std::map<std::string, Shape> gpt_parameter_shapes(const GptConfig& cfg,
                                                  const std::vector<int64_t>& layers,
                                                  bool token_embedding, bool embeds, bool head) {
  const int64_t C = cfg.d_model;
  std::map<std::string, Shape> s;
  if (token_embedding) s["wte.weight"] = {cfg.vocab_size, C};
  if (embeds && !cfg.rotary()) s["wpe.weight"] = {cfg.seq_len, C};
  if (head) {
    if (cfg.norm_weights()) s["ln_f.weight"] = {C};
    if (cfg.norm_biases()) s["ln_f.bias"] = {C};
    if (!cfg.tie_embeddings) s["lm_head.weight"] = {cfg.vocab_size, C};
    if (cfg.head_bias) s["lm_head.bias"] = {cfg.vocab_size};
  }
  for (int64_t i : layers) add_block_shapes(s, cfg, "h." + std::to_string(i) + ".", i);
  if (head) {
    for (int64_t k = 1; k <= cfg.mtp_layers; ++k) {
      const std::string p = "mtp." + std::to_string(k - 1) + ".";
      for (const char* norm : {"ln_embed", "ln_hidden", "ln_out"}) {
        if (cfg.norm_weights()) s[p + norm + ".weight"] = {C};
        if (cfg.norm_biases()) s[p + norm + ".bias"] = {C};
      }
      s[p + "eh_proj.weight"] = {C, 2 * C};
      add_block_shapes(s, cfg, p + "block.", cfg.n_layer + k - 1);
    }
  }
  return s;
}

const std::vector<std::string>& GptConfig::lora_layers() {
  static const std::vector<std::string> layers{"attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                               "mlp.c_proj"};
  return layers;
}

std::vector<std::string> GptConfig::default_lora_targets() const {
  std::vector<std::string> out;
  if (latent_attention()) {
    for (const std::string& l : latent_lora_layers()) {
      if (latent_layer_present(l)) out.push_back(l);
    }
  }
  for (const std::string& l : lora_layers()) {
    if (l == "attn.c_attn" && latent_attention()) continue;
    if (l.rfind("mlp.", 0) == 0 && moe.experts > 0) continue;
    out.push_back(l);
  }
  return out;
}

bool GptConfig::latent_layer_present(const std::string& layer) const {
  if (!latent_attention()) return false;
  if (layer == "attn.q_proj") return mla.q_lora_rank == 0;
  if (layer == "attn.q_a_proj" || layer == "attn.q_b_proj") return mla.q_lora_rank > 0;
  return layer == "attn.kv_a_proj" || layer == "attn.kv_b_proj";
}

const std::vector<std::string>& GptConfig::latent_lora_layers() {
  static const std::vector<std::string> layers{"attn.q_a_proj", "attn.q_b_proj", "attn.q_proj",
                                               "attn.kv_a_proj", "attn.kv_b_proj"};
  return layers;
}

LoraDropout GptConfig::lora_dropout(int64_t layer, const std::string& name) const {
  const bool row_parallel =
      name == "attn.c_proj" || (name.rfind("mlp.", 0) == 0 && name.ends_with(".c_proj"));
  return {lora.dropout, stable_hash("lora." + std::to_string(layer) + "." + name), row_parallel};
}

bool GptConfig::lora_on(const std::string& layer) const {
  return lora.rank > 0 &&
         std::find(lora.targets.begin(), lora.targets.end(), layer) != lora.targets.end();
}

std::vector<std::string> GptConfig::lora_modules(int64_t block) const {
  std::vector<std::string> out;
  if (lora.rank <= 0) return out;
  for (const std::string& layer : lora.targets) {
    if (!moe_layer(block) || layer.rfind("mlp.", 0) != 0) {
      out.push_back(layer);
      continue;
    }
    const std::string leaf = layer.substr(4);  // c_fc or c_proj
    for (int64_t e = 0; e < moe.experts; ++e)
      out.push_back("mlp.experts." + std::to_string(e) + "." + leaf);
    if (moe.shared_ffn_hidden_size > 0) out.push_back("mlp.shared." + leaf);
  }
  return out;
}

bool is_lora_adapter(const std::string& name) {
  return name.ends_with(".lora_a") || name.ends_with(".lora_b");
}

std::string lora_adapted_weight(const std::string& adapter) {
  if (!is_lora_adapter(adapter)) throw ValueError("'" + adapter + "' is not a LoRA adapter");
  return adapter.substr(0, adapter.size() - std::string("lora_a").size()) + "weight";
}

bool is_hidden_matrix(const std::string& name, const Shape& shape) {
  return shape.size() == 2 && (name.rfind("h.", 0) == 0 || name.rfind("mtp.", 0) == 0) &&
         !is_lora_adapter(name) && !name.ends_with(".mlp.router.weight") &&
         !name.ends_with(".mlp.shared_gate.weight");
}

std::vector<int64_t> fused_row_blocks(const GptConfig& cfg, const std::string& name, int64_t rows) {
  if (name.ends_with(".attn.c_attn.weight")) {
    const int64_t kv = cfg.kv_heads() * cfg.head_dim();
    if (rows != cfg.qkv_width()) {
      throw ShapeError("'" + name + "' has " + std::to_string(rows) +
                       " rows; the model's q, k and v take " + std::to_string(cfg.qkv_width()));
    }
    return {cfg.q_width(), kv, kv};
  }
  if (name.ends_with(".c_fc.weight") && cfg.gated_mlp()) {
    if (rows % 2 != 0) {
      throw ShapeError("'" + name + "' has " + std::to_string(rows) +
                       " rows; a gated MLP's gate and value halves take an even number");
    }
    return {rows / 2, rows / 2};
  }
  return {rows};
}

InitRule gpt_init_rule(const std::string& name, const Shape& full_shape, const GptConfig& cfg) {
  if (name.ends_with(".lora_b") || name.ends_with(".expert_bias")) return InitRule::constant(0.0);
  if (name.ends_with(".lora_a")) {
    // Unit variance in, about unit variance out: A x has x's scale.
    return InitRule::normal(1.0 / std::sqrt(static_cast<double>(full_shape.at(1))));
  }
  return gpt2_init_rule(name, cfg.n_layer, cfg.norm_weight_offset, cfg.init_std);
}

Tensor merge_lora(const Tensor& weight, const Tensor& lora_a, const Tensor& lora_b, double factor) {
  if (weight.dim() != 2 || lora_a.dim() != 2 || lora_b.dim() != 2 ||
      lora_a.size(1) != weight.size(1) || lora_b.size(0) != weight.size(0) ||
      lora_b.size(1) != lora_a.size(0)) {
    throw ShapeError("merge_lora: weight " + shape_str(weight.shape()) + ", lora_a " +
                     shape_str(lora_a.shape()) + ", lora_b " + shape_str(lora_b.shape()) +
                     " (expected (out, in), (rank, in) and (out, rank))");
  }
  autograd::NoGradGuard no_grad;
  const auto host_f32 = [](const Tensor& t) {
    Tensor h = to_device(t, Device::cpu());
    return h.dtype() == DType::F32 ? h : cast(h, DType::F32);
  };
  const Tensor w = host_f32(weight);
  const Tensor delta = matmul(host_f32(lora_b), host_f32(lora_a));
  const Tensor merged = add(w, scale(delta, factor));
  return weight.dtype() == DType::F32 ? merged.detach() : cast(merged, weight.dtype()).detach();
}

std::map<std::string, Shape> gpt_parameter_shapes(const GptConfig& cfg) {
  std::vector<int64_t> layers(static_cast<size_t>(cfg.n_layer));
  for (int64_t i = 0; i < cfg.n_layer; ++i) layers[static_cast<size_t>(i)] = i;
  return gpt_parameter_shapes(cfg, layers, true, true, true);
}

CausalSelfAttention::CausalSelfAttention(const GptConfig& cfg, int64_t layer)
    : heads_(cfg.heads()),
      head_dim_(cfg.head_dim()),
      layer_(layer),
      window_(cfg.window_of(layer)),
      dropout_(cfg.dropout),
      rotary_(cfg.rotary_at(layer)),
      rope_(cfg.rope_of(layer)) {
  qk_norm_full_ = cfg.qk_norm_full;
  clip_qkv_ = cfg.clip_qkv;
  if (cfg.latent_attention()) {
    latent_ = std::make_shared<LatentProjections>(cfg, cfg.n_head, layer);
    for (const auto& [name, layer] : latent_->layers()) register_module(name, layer);
  } else {
    c_attn_ = register_module(
        "c_attn", std::make_shared<Linear>(cfg.d_model, cfg.qkv_width(), cfg.c_attn_bias()));
  }
  c_proj_ = register_module(
      "c_proj", std::make_shared<Linear>(cfg.attn_out_width(), cfg.d_model, cfg.linear_bias));
  if (cfg.lora_on("attn.c_attn")) {
    c_attn_->enable_lora(cfg.lora.rank, cfg.lora_scale(), cfg.lora_dropout(layer, "attn.c_attn"));
  }
  if (cfg.lora_on("attn.c_proj")) {
    c_proj_->enable_lora(cfg.lora.rank, cfg.lora_scale(), cfg.lora_dropout(layer, "attn.c_proj"));
  }
  if (cfg.qk_head_layernorm) {
    q_head_norm_ = register_module(
        "q_norm", std::make_shared<HeadLayerNorm>(heads_.q, head_dim_, cfg.layer_norm_eps));
    k_head_norm_ = register_module(
        "k_norm", std::make_shared<HeadLayerNorm>(heads_.kv, head_dim_, cfg.layer_norm_eps));
  } else if (cfg.qk_norm) {
    q_norm_ = register_module(
        "q_norm", std::make_shared<LayerNorm>(cfg.q_norm_width(), cfg.layer_norm_eps, DType::F32,
                                              true, cfg.norm_weight_offset));
    k_norm_ = register_module(
        "k_norm", std::make_shared<LayerNorm>(cfg.k_norm_width(), cfg.layer_norm_eps, DType::F32,
                                              true, cfg.norm_weight_offset));
  }
}

Tensor CausalSelfAttention::project(const Tensor& x, const Tensor& positions, int64_t start,
                                    const DropoutDraw& draw) const {
  Tensor qkv = latent_ ? latent_->qkv(x, draw) : c_attn_->forward(x, draw);
  if (clip_qkv_ > 0) qkv = clamp(qkv, -clip_qkv_, clip_qkv_);
  if (q_norm_ && qk_norm_full_) {
    qkv = norm_query_key(qkv, heads_.q * head_dim_, heads_.kv * head_dim_, *q_norm_, *k_norm_);
  } else if (q_norm_) {
    qkv = norm_query_key_heads(qkv, heads_, *q_norm_, *k_norm_);
  } else if (q_head_norm_) {
    qkv = norm_query_key_heads(qkv, heads_, *q_head_norm_, *k_head_norm_);
  }
  if (rotary_) qkv = rotary_embedding(qkv, heads_, positions, start, rope_.theta, rope_.scaling);
  return qkv;
}

Tensor CausalSelfAttention::forward(const Tensor& x, const ForwardContext& ctx) const {
  const Tensor qkv = project(x, ctx.positions, 0, ctx.draw());
  Tensor y = causal_attention(qkv, ctx.attention_heads(heads_, window_),
                              ctx.attention_starts(window_ > 0));
  y = heads_out(y);
  return site_dropout(c_proj_->forward(y, ctx.draw()), dropout_, ctx, layer_, "attn.resid");
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache,
                                           int64_t start, const ForwardContext& ctx,
                                           const Tensor& text_starts) const {
  const int64_t n = x.size(1);
  if (latent_) {
    // model.mla: the cache holds each token's latent and rope key
    // (KvCache), the new tokens attending over them in DeepSeek's absorbed
    // form; the prompt through the fused attention, as forward() runs it.
    const LatentProjections::Parts parts = latent_->parts(x);
    if (start == 0) {
      latent_->store(parts, k_cache, v_cache, 0, ctx.positions, rope_.theta, rope_.scaling);
      const Tensor qkv = rotary_embedding(latent_->qkv(parts), heads_, ctx.positions, 0,
                                          rope_.theta, rope_.scaling);
      return c_proj_->forward(heads_out(causal_attention(qkv, ctx.attention_heads(heads_, window_),
                                                         ctx.attention_starts(window_ > 0))));
    }
    std::vector<int64_t> rows;  // the left-padded rows' first text slots (on the host)
    if (text_starts.defined()) {
      for (double v : to_double_vector(text_starts)) rows.push_back(static_cast<int64_t>(v));
    }
    return c_proj_->forward(latent_->decode(parts, k_cache, v_cache, start, ctx.positions,
                                            rope_.theta, rope_.scaling, window_, rows,
                                            heads_.softcap));
  }
  const Tensor qkv = project(x, ctx.positions, start, {});
  write_kv_cache(qkv, heads_, start, k_cache, v_cache);  // one launch on a GPU
  if (start == 0) {
    // The prompt (from an empty cache) attends over itself alone: the fused
    // attention, as forward() runs it (no (n, n) scores in memory), with
    // ctx's first keys (padding, a sliding window).
    return c_proj_->forward(heads_out(causal_attention(qkv, ctx.attention_heads(heads_, window_),
                                                       ctx.attention_starts(window_ > 0))));
  }
  // Later tokens attend over the cache where it lies: causally, within the
  // layer's window, never to a row's left padding.
  return c_proj_->forward(
      heads_out(cached_attention(qkv, k_cache, v_cache, start + n, heads_, window_, text_starts)));
}

Tensor CausalSelfAttention::heads_out(const Tensor& y) const {
  return latent_ ? latent_->values(y) : y;
}

Mlp::Mlp(const GptConfig& cfg, int64_t layer)
    : layer_(layer), dropout_(cfg.dropout), activation_(cfg.activation) {
  c_fc_ = register_module("c_fc",
                          std::make_shared<Linear>(cfg.d_model, cfg.fc_width(), cfg.mlp_biases()));
  c_proj_ =
      register_module("c_proj", std::make_shared<Linear>(cfg.ffn(), cfg.d_model, cfg.mlp_biases()));
  if (cfg.lora_on("mlp.c_fc")) {
    c_fc_->enable_lora(cfg.lora.rank, cfg.lora_scale(), cfg.lora_dropout(layer, "mlp.c_fc"));
  }
  if (cfg.lora_on("mlp.c_proj")) {
    c_proj_->enable_lora(cfg.lora.rank, cfg.lora_scale(), cfg.lora_dropout(layer, "mlp.c_proj"));
  }
}

Tensor Mlp::forward(const Tensor& x, const ForwardContext& ctx) const {
  Tensor y = activation_ != Activation::Gelu
                 ? c_proj_->forward(unfused_activation(activation_, c_fc_->forward(x, ctx.draw())),
                                    ctx.draw())
                 : c_proj_->forward_after_gelu(c_fc_->forward_gelu(x, ctx.draw()), ctx.draw());
  return site_dropout(y, dropout_, ctx, layer_, "mlp.resid");
}

Block::Block(const GptConfig& cfg, int64_t layer)
    : parallel_residual_(cfg.parallel_residual),
      layer_(layer),
      dropout_(cfg.dropout),
      residual_multiplier_(cfg.residual_multiplier) {
  auto norm = [&] { return stream_norm(cfg); };
  if (cfg.pre_norms) ln_1_ = register_module("ln_1", norm());
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(cfg, layer));
  if (cfg.pre_norms && !cfg.shared_norm) ln_2_ = register_module("ln_2", norm());
  if (cfg.moe_layer(layer)) {
    moe_ = register_module("mlp", std::make_shared<MoeMlp>(cfg, layer));
  } else {
    mlp_ = register_module("mlp", std::make_shared<Mlp>(cfg, layer));
  }
  if (cfg.post_norms) {
    post_attn_norm_ = register_module("post_attn_norm", norm());
    post_mlp_norm_ = register_module("post_mlp_norm", norm());
  }
}

Tensor Block::joining(const std::shared_ptr<LayerNorm>& norm, const Tensor& y) const {
  const Tensor z = norm ? norm->forward(y) : y;
  return residual_multiplier_ == 1.0 ? z : affine(z, residual_multiplier_);
}

Tensor Block::mlp_forward(const Tensor& x, const ForwardContext& ctx) const {
  if (!moe_) return mlp_->forward(x, ctx);
  return site_dropout(moe_->forward(x, ctx), dropout_, ctx, layer_, "mlp.resid");
}

Tensor Block::forward(const Tensor& x, const ForwardContext& ctx) const {
  if (!ln_1_) {  // model.pre_norms: false, the sublayers reading the stream itself
    const Tensor h = add(x, joining(post_attn_norm_, attn_->forward(x, ctx)));
    return add(h, joining(post_mlp_norm_, mlp_forward(h, ctx)));
  }
  if (parallel_residual_) {
    const Tensor n1 = ln_1_->forward(x);
    const Tensor a = joining(post_attn_norm_, attn_->forward(n1, ctx));
    const Tensor n2 = ln_2_ ? ln_2_->forward(x) : n1;  // model.shared_norm: ln_1's for both
    return add(add(x, a), joining(post_mlp_norm_, mlp_forward(n2, ctx)));
  }
  const Stream out = forward_stream({x, Tensor()}, ctx);
  return add(out.base, out.pending);
}

bool Block::defers_residual() const {
  return ln_1_ && ln_2_ && !parallel_residual_;
}

Block::Stream Block::forward_stream(const Stream& in, const ForwardContext& ctx) const {
  if (!defers_residual()) {
    throw NotSupportedError(
        "Block::forward_stream: a block with model.parallel_residual, model.shared_norm or no "
        "model.pre_norms has no fused residual adds (use forward)");
  }
  // The previous block's MLP add and ln_1 run as one op, and so do the
  // attention's residual add and ln_2.
  Tensor x = in.base, normed;
  if (in.pending.defined()) {
    const AddNorm a = ln_1_->forward_add(in.base, in.pending);
    x = a.sum;
    normed = a.norm;
  } else {
    normed = ln_1_->forward(x);
  }
  const AddNorm h = ln_2_->forward_add(x, joining(post_attn_norm_, attn_->forward(normed, ctx)));
  return {h.sum, joining(post_mlp_norm_, mlp_forward(h.norm, ctx))};
}

Tensor Block::forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache, int64_t start,
                             const ForwardContext& ctx, const Tensor& text_starts) const {
  if (!ln_1_) {
    const Tensor h =
        add(x, joining(post_attn_norm_,
                       attn_->forward_cached(x, k_cache, v_cache, start, ctx, text_starts)));
    return add(h, joining(post_mlp_norm_, mlp_forward(h, ForwardContext{false, 0, 0})));
  }
  if (parallel_residual_) {
    const Tensor n1 = ln_1_->forward(x);
    const Tensor a = joining(post_attn_norm_,
                             attn_->forward_cached(n1, k_cache, v_cache, start, ctx, text_starts));
    const Tensor n2 = ln_2_ ? ln_2_->forward(x) : n1;
    return add(add(x, a), joining(post_mlp_norm_, mlp_forward(n2, ForwardContext{false, 0, 0})));
  }
  const AddNorm h = ln_2_->forward_add(
      x, joining(post_attn_norm_, attn_->forward_cached(ln_1_->forward(x), k_cache, v_cache, start,
                                                        ctx, text_starts)));
  return add(h.sum, joining(post_mlp_norm_, mlp_forward(h.norm, ForwardContext{false, 0, 0})));
}

Gpt::Gpt(const GptConfig& cfg, uint64_t seed, DType dtype, Init how) : cfg_(cfg) {
  cfg_.validate();
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16) {
    throw NotSupportedError(std::string("Gpt: parameter dtype ") + dtype_name(dtype) +
                            " is not supported (f32, bf16 or f16)");
  }
  wte_ = register_module("wte", std::make_shared<Embedding>(cfg.vocab_size, cfg.d_model));
  if (!cfg.rotary())
    wpe_ = register_module("wpe", std::make_shared<Embedding>(cfg.seq_len, cfg.d_model));
  auto h = register_module("h", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    blocks_.push_back(std::make_shared<Block>(cfg, i));
    h->append(blocks_.back());
  }
  ln_f_ = register_module("ln_f", stream_norm(cfg));
  if (!cfg.tie_embeddings) {
    lm_head_ = register_module(
        "lm_head", std::make_shared<Linear>(cfg.d_model, cfg.vocab_size, cfg.head_bias));
  }
  if (cfg.mtp_layers > 0) {
    auto mtp = register_module("mtp", std::make_shared<ModuleList>());
    for (int64_t k = 1; k <= cfg.mtp_layers; ++k) {
      mtp_.push_back(std::make_shared<MtpModule>(cfg, k));
      mtp->append(mtp_.back());
    }
  }
  if (how == Init::Random) {
    StateDict init;
    for (auto& [name, p] : named_parameters()) {
      init.emplace(name,
                   init_parameter(name, p.shape(), gpt_init_rule(name, p.shape(), cfg), seed));
    }
    load_state_dict(init);
  }
  // Half parameters are the f32 initial values rounded once (what the f32
  // masters of mixed precision start from).
  if (dtype != DType::F32) to(dtype);
}

Tensor Gpt::embed(const Tensor& ids, const ForwardContext& ctx, int64_t start) const {
  if (ids.dim() != 2) {
    throw ShapeError("Gpt: token ids must be (B, T), got " + shape_str(ids.shape()));
  }
  const int64_t T = ids.size(1);
  if (start < 0 || start + T > cfg_.seq_len) {
    throw ShapeError("Gpt: positions [" + std::to_string(start) + ", " + std::to_string(start + T) +
                     ") exceed model.seq_len " + std::to_string(cfg_.seq_len));
  }
  Tensor positions = ctx.positions;  // per token, within its document
  if (!wpe_) {
    // Rotary embeddings: the attention layers take the positions.
    return site_dropout(scale_token_embeddings(cfg_, wte_->forward(ids)), cfg_.dropout, ctx, 0,
                        "embed");
  }
  if (positions.defined()) {
    // (Packed documents' positions from start 0; a left-padded cache's
    // rows' own positions at a later start.)
    if (positions.shape() != ids.shape()) {
      throw ShapeError("Gpt: token positions " + shape_str(positions.shape()) + " for ids " +
                       shape_str(ids.shape()) + " (expected the ids' shape)");
    }
  } else {
    positions = arange(start, T, DType::I64, ids.device());  // (made on the device)
  }
  Tensor x = add(scale_token_embeddings(cfg_, wte_->forward(ids)), wpe_->forward(positions));
  return site_dropout(x, cfg_.dropout, ctx, 0, "embed");
}

const Tensor& Gpt::head_weight() const {
  return lm_head_ ? lm_head_->weight() : wte_->weight();
}

Tensor Gpt::head_bias() const {
  return lm_head_ ? lm_head_->bias() : Tensor();
}

Tensor Gpt::head(const Tensor& hidden) const {
  return logits_of(ln_f_->forward(hidden));
}

Tensor Gpt::logits_of(const Tensor& normed) const {
  const Tensor logits = linear(scale_for_head(cfg_, normed), head_weight(), head_bias());
  return cfg_.final_logit_softcap > 0 ? soft_cap(logits, cfg_.final_logit_softcap) : logits;
}

Tensor Gpt::forward(const Tensor& ids, const ForwardContext& ctx) const {
  return logits_of(final_norm(trunk_stream(ids, ctx)).norm);
}

Block::Stream Gpt::trunk_stream(const Tensor& ids, const ForwardContext& in) const {
  const ForwardContext ctx = with_documents(cfg_, ids, in, wte_->weight().device());
  Block::Stream s{embed(ids, ctx), Tensor()};
  auto added = [&s] {
    if (s.pending.defined()) s = {add(s.base, s.pending), Tensor()};
    return s.base;
  };
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const auto& b = blocks_[i];
    if (cfg_.recomputes(static_cast<int64_t>(i))) {
      // By value: the recomputation runs in backward, after this frame.
      s.base = autograd::checkpoint([b, ctx](const Tensor& x) { return b->forward(x, ctx); },
                                    added(), b->parameters());
    } else if (b->defers_residual()) {
      s = b->forward_stream(s, ctx);
    } else {
      s.base = b->forward(added(), ctx);
    }
  }
  return s;
}

AddNorm Gpt::final_norm(const Block::Stream& s) const {
  if (s.pending.defined()) return ln_f_->forward_add(s.base, s.pending);
  return {s.base, ln_f_->forward(s.base)};
}

Tensor Gpt::loss(const Tensor& ids, const Tensor& targets, const ForwardContext& in) const {
  const ForwardContext ctx = with_documents(cfg_, ids, in, wte_->weight().device());
  const AddNorm h = final_norm(trunk_stream(ids, ctx));
  const Tensor& hidden = h.sum;
  // The head and the loss in one op: padded logits rows, aligned GEMMs.
  const bool z = cfg_.z_loss_coef > 0 && ctx.training;
  Tensor z_loss;
  // (A training step's loss gets ctx.loss_grad in backward: the logits'
  // gradient is written with the loss, in one pass over them. The z-loss
  // joins that gradient.)
  Tensor loss =
      linear_cross_entropy(scale_for_head(cfg_, h.norm), head_weight(), targets, -100,
                           cfg_.final_logit_softcap, head_bias(), z ? &z_loss : nullptr,
                           ctx.training ? ctx.loss_grad : 0.0, z ? cfg_.z_loss_coef : 0.0);
  if (z && ctx.z_loss_stats) ctx.z_loss_stats->record({z_loss});
  if (mtp_.empty() || !ctx.training) return loss;
  return with_mtp_losses(cfg_, loss, mtp_losses(hidden, ids, targets, ctx), ctx);
}

Tensor with_mtp_losses(const GptConfig& cfg, const Tensor& loss, const std::vector<Tensor>& depths,
                       const ForwardContext& ctx) {
  if (depths.empty()) return loss;
  if (ctx.mtp_stats) ctx.mtp_stats->record(depths);
  Tensor sum = depths[0];
  for (size_t k = 1; k < depths.size(); ++k) sum = add(sum, depths[k]);
  const auto n = static_cast<int64_t>(depths.size());
  return attach_side_loss(loss, sum, cfg.mtp_loss_weight / static_cast<double>(n), ctx);
}

double mtp_loss_grad(const GptConfig& cfg, int64_t depths, double loss_grad, DType dtype) {
  return side_loss_grad(cfg.mtp_loss_weight / static_cast<double>(std::max<int64_t>(depths, 1)),
                        loss_grad, dtype);
}

double side_loss_grad(double weight, double loss_grad, DType dtype) {
  if (dtype == DType::F64) return weight * loss_grad;
  return static_cast<double>(static_cast<float>(weight) * static_cast<float>(loss_grad));
}

Tensor attach_side_loss(const Tensor& x, const Tensor& loss, double weight,
                        const ForwardContext& ctx) {
  if (!ctx.loss_grad_seed.defined())
    return attach_loss(x, loss, side_loss_grad(weight, ctx.loss_grad, loss.dtype()));
  const Tensor& seed = ctx.loss_grad_seed;
  const Tensor grad = mul(full({}, weight, seed.dtype(), seed.device()), reshape(seed, {}));
  return attach_loss(x, loss, cast(grad, loss.dtype()));
}

std::vector<Tensor> Gpt::mtp_losses(const Tensor& hidden, const Tensor& ids, const Tensor& targets,
                                    const ForwardContext& ctx) const {
  // Documents end where the attention's do: depth k predicts nothing
  // across an end.
  const Tensor docs = cfg_.resets_documents() ? document_starts_of(ids, cfg_.eod_token) : Tensor();
  std::vector<Tensor> out;
  Tensor h = hidden;
  for (size_t i = 0; i < mtp_.size(); ++i) {
    const int64_t k = static_cast<int64_t>(i) + 1;
    const Tensor ahead =
        site_dropout(scale_token_embeddings(cfg_, wte_->forward(mtp_ahead(ids, k))), cfg_.dropout,
                     ctx, cfg_.n_layer + k - 1, "mtp.embed");
    h = mtp_[i]->forward(h, ahead, ctx);
    // (Each depth's loss gets with_mtp_losses's weight as its gradient:
    // written with the loss, as the head's.)
    const double expected = ctx.training
                                ? mtp_loss_grad(cfg_, static_cast<int64_t>(mtp_.size()),
                                                ctx.loss_grad, stat_dtype(head_weight().dtype()))
                                : 0.0;
    out.push_back(linear_cross_entropy(scale_for_head(cfg_, mtp_[i]->out_norm(h)), head_weight(),
                                       mtp_targets(targets, docs, k), -100,
                                       cfg_.final_logit_softcap, head_bias(), nullptr, expected));
  }
  return out;
}

namespace {
// ShapeError unless t is (B, T) ids or targets, i32 or i64.
void check_ids(const Tensor& t, const char* what) {
  if (t.dim() != 2 || (t.dtype() != DType::I64 && t.dtype() != DType::I32)) {
    throw ShapeError(std::string("multi-token prediction: ") + what +
                     " must be (B, T) i32 or i64, got " + shape_str(t.shape()) + " " +
                     dtype_name(t.dtype()));
  }
}

// ids or targets (B, T), i32 or i64 anywhere, as i64 on the host.
std::vector<int64_t> host_ids(const Tensor& t, const char* what) {
  check_ids(t, what);
  const Tensor h = contiguous(cast(to_device(t, Device::cpu()), DType::I64));
  const int64_t* p = h.data<int64_t>();
  return std::vector<int64_t>(p, p + h.numel());
}

// (B, T) ids or targets on a device, k positions ahead, the last k of each
// row `fill`: made there (inside a CUDA graph's capture they cannot be read
// on the host), the values the host's loops give.
Tensor shifted_on_device(const Tensor& t, int64_t k, double fill, const char* what) {
  check_ids(t, what);
  const int64_t B = t.size(0), T = t.size(1), n = std::min(std::max<int64_t>(k, 0), T);
  const Tensor tail = full({B, n}, fill, DType::I64, t.device());
  if (n == T) return tail;
  return concat({cast(narrow(t, 1, n, T - n), DType::I64), tail}, 1);
}
}  // namespace

int64_t expert_bias_layer(const GptConfig& cfg, const std::string& name) {
  static const std::string tail = ".mlp.expert_bias";
  if (!name.ends_with(tail)) return -1;
  const std::string head = name.substr(0, name.size() - tail.size());
  // An index of digits alone between `prefix` and `suffix`, or -1.
  auto index = [&](const std::string& prefix, const std::string& suffix) -> int64_t {
    if (head.size() <= prefix.size() + suffix.size() || head.compare(0, prefix.size(), prefix) ||
        !head.ends_with(suffix))
      return -1;
    const std::string digits =
        head.substr(prefix.size(), head.size() - prefix.size() - suffix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
    int64_t n = -1;
    // (Digits past int64 name no layer: std::stoll's out_of_range.)
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    return ec == std::errc() && end == digits.data() + digits.size() ? n : -1;
  };
  if (const int64_t n = index("h.", ""); n >= 0) return n;
  if (const int64_t k = index("mtp.", ".block"); k >= 0) return cfg.n_layer + k;
  return -1;
}

Tensor mtp_ahead(const Tensor& ids, int64_t k) {
  if (!ids.device().is_cpu()) return shifted_on_device(ids, k, 0.0, "ids");
  const std::vector<int64_t> in = host_ids(ids, "ids");
  const int64_t B = ids.size(0), T = ids.size(1);
  std::vector<int64_t> out(in.size(), 0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i + k < T; ++i) out[b * T + i] = in[b * T + i + k];
  }
  return from_vector(out, {B, T}, DType::I64);
}

Tensor mtp_targets(const Tensor& targets, const Tensor& doc_starts, int64_t k) {
  if (doc_starts.defined() && doc_starts.shape() != targets.shape()) {
    throw ShapeError("multi-token prediction: doc_starts " + shape_str(doc_starts.shape()) +
                     " for targets " + shape_str(targets.shape()) + " (expected the same shape)");
  }
  if (!targets.device().is_cpu() &&
      (!doc_starts.defined() || doc_starts.device() == targets.device())) {
    const Tensor ahead = shifted_on_device(targets, k, -100.0, "targets");
    if (!doc_starts.defined()) return ahead;
    // Within one document where position i's start is position i + k's
    // (a start is never -1): ahead there, else -100, as integers.
    const Tensor starts = cast(doc_starts, DType::I64);
    const Tensor starts_ahead = shifted_on_device(doc_starts, k, -1.0, "doc_starts");
    Tensor same = empty(starts.shape(), DType::I64, starts.device());
    backend_for(same).binary(BinaryOp::Eq, starts, starts_ahead, same);
    const Tensor ignored = full(starts.shape(), -100.0, DType::I64, starts.device());
    return add(mul(same, sub(ahead, ignored)), ignored);
  }
  const std::vector<int64_t> in = host_ids(targets, "targets");
  const int64_t B = targets.size(0), T = targets.size(1);
  std::vector<int32_t> starts;
  if (doc_starts.defined()) {
    const Tensor h = contiguous(cast(to_device(doc_starts, Device::cpu()), DType::I32));
    starts.assign(h.data<int32_t>(), h.data<int32_t>() + h.numel());
  }
  std::vector<int64_t> out(in.size(), -100);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i + k < T; ++i) {
      const int64_t at = b * T + i;
      if (!starts.empty() && starts[at] != starts[at + k]) continue;
      out[at] = in[at + k];
    }
  }
  return from_vector(out, {B, T}, DType::I64);
}

void LossSums::record(const std::vector<Tensor>& losses) {
  if (!read.empty()) throw ValueError("LossSums: a record after the sums were read");
  if (sums.empty()) sums.resize(losses.size());
  if (sums.size() != losses.size()) {
    throw ValueError("LossSums: " + std::to_string(losses.size()) + " losses for " +
                     std::to_string(sums.size()) + " depths");
  }
  for (size_t k = 0; k < losses.size(); ++k) {
    const Tensor l = cast(losses[k].detach(), DType::F64);
    sums[k] = sums[k].defined() ? add(sums[k], l) : l;
  }
  ++records;
}

std::vector<double> LossSums::host_sums(int64_t depths) const {
  std::vector<double> out(static_cast<size_t>(depths), 0.0);
  const size_t n = std::min(sums.size(), out.size());
  if (read.size() == sums.size()) {
    std::copy(read.begin(), read.begin() + static_cast<std::ptrdiff_t>(n), out.begin());
  } else if (n > 0) {
    const std::vector<double> all =
        items(std::vector<Tensor>(sums.begin(), sums.begin() + static_cast<std::ptrdiff_t>(n)));
    std::copy(all.begin(), all.end(), out.begin());
  }
  return out;
}

MtpModule::MtpModule(const GptConfig& cfg, int64_t depth)
    : recompute_(cfg.recompute == Recompute::Full) {
  if (depth < 1) {
    throw ValueError("MtpModule: depth " + std::to_string(depth) + " (expected 1 or more)");
  }
  ln_embed_ = register_module("ln_embed", stream_norm(cfg));
  ln_hidden_ = register_module("ln_hidden", stream_norm(cfg));
  eh_proj_ =
      register_module("eh_proj", std::make_shared<Linear>(2 * cfg.d_model, cfg.d_model, false));
  block_ = register_module("block", std::make_shared<Block>(cfg, cfg.n_layer + depth - 1));
  ln_out_ = register_module("ln_out", stream_norm(cfg));
}

Tensor MtpModule::forward(const Tensor& hidden, const Tensor& ahead,
                          const ForwardContext& ctx) const {
  if (hidden.shape() != ahead.shape()) {
    throw ShapeError("MtpModule: hidden " + shape_str(hidden.shape()) + " and embeddings " +
                     shape_str(ahead.shape()) + " (expected the same shape)");
  }
  const Tensor x =
      eh_proj_->forward(concat({ln_embed_->forward(ahead), ln_hidden_->forward(hidden)}, 2));
  if (!recompute_) return block_->forward(x, ctx);
  const std::shared_ptr<Block> b = block_;
  return autograd::checkpoint([b, ctx](const Tensor& in) { return b->forward(in, ctx); }, x,
                              b->parameters());
}

Tensor MtpModule::out_norm(const Tensor& h) const {
  return ln_out_->forward(h);
}

Tensor Gpt::decode(const Tensor& ids, KvCache& cache, bool last_only) const {
  autograd::InferenceGuard inference;
  const Tensor x = decode_hidden(ids, cache);
  return head(last_only ? narrow(x, 1, x.size(1) - 1, 1) : x);
}

Tensor Gpt::decode_hidden(const Tensor& ids, KvCache& cache) const {
  autograd::InferenceGuard inference;
  if (ids.dim() != 2 || ids.size(1) == 0) {
    throw ShapeError("Gpt::decode: token ids must be (B, n) with n >= 1, got " +
                     shape_str(ids.shape()));
  }
  if (static_cast<int64_t>(cache.k.size()) != cfg_.n_layer || ids.size(0) != cache.batch()) {
    throw ShapeError("Gpt::decode: ids " + shape_str(ids.shape()) + " for a cache of " +
                     std::to_string(cache.batch()) + " sequences and " +
                     std::to_string(cache.k.size()) + " layers (the model has " +
                     std::to_string(cfg_.n_layer) + ")");
  }
  const int64_t B = ids.size(0), n = ids.size(1), start = cache.length;
  if (!cache.row_start.empty() && static_cast<int64_t>(cache.row_start.size()) != B) {
    throw ShapeError("Gpt::decode: the cache's row_start has " +
                     std::to_string(cache.row_start.size()) + " entries for " + std::to_string(B) +
                     " sequences");
  }
  // Left-padded rows: each token at its own row's position (a padding
  // slot's at 0; its keys are masked for the row's text).
  const Device device = head_weight().device();
  ForwardContext ctx{false, 0, 0};
  Tensor text_starts;  // (B) i32 on the device in a left-padded cache after its prompt
  bool padded = false;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s = cache.start_of(b);
    if (s < 0 || s > cache.capacity()) {
      throw ValueError("Gpt::decode: row " + std::to_string(b) + " starts at slot " +
                       std::to_string(s) + ", not in [0, " + std::to_string(cache.capacity()) +
                       "]");
    }
    padded = padded || s > 0;
  }
  if (start == 0) {
    // The prompt: its first keys and positions for the fused attention.
    ctx = padded ? with_left_padding(cfg_, cache.row_start, n, ctx, device)
                 : with_one_document(cfg_, ids, ctx, device);
  } else if (padded) {
    std::vector<int64_t> pos(static_cast<size_t>(B * n));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < n; ++t)
        pos[static_cast<size_t>(b * n + t)] = std::max<int64_t>(0, start + t - cache.start_of(b));
    }
    // On the host for the position table; where the attention runs for
    // rotary embeddings (uploaded once, not once per layer).
    ctx.positions = from_vector(pos, {B, n}, DType::I64, cfg_.rotary() ? device : Device::cpu());
    // Where each row's text starts, for every layer's attention (uploaded
    // once per step; latent attention masks its scores on the host, so
    // there it stays).
    text_starts = from_vector(cache.row_start, {B}, DType::I32,
                              cfg_.latent_attention() ? Device::cpu() : device);
  }
  Tensor x = embed(ids, ctx, start);  // checks start + n <= seq_len
  for (int64_t i = 0; i < cfg_.n_layer; ++i) {
    x = blocks_[i]->forward_cached(x, cache.k[i], cache.v[i], start, ctx, text_starts);
  }
  cache.length = start + ids.size(1);
  return x;
}

}  // namespace triad::nn
