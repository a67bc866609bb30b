#include "triad/plan/model_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <vector>

#include "io/yaml_document.h"
#include "triad/core/error.h"
#include "triad/io/hf_config.h"
#include "triad/io/text_file.h"

namespace triad::plan {

nn::GptConfig parse_model_spec(const std::string& yaml_text, const std::string& source) {
  const YAML::Node root = io::load_yaml(yaml_text, source);
  if (!root || !root.IsMap()) throw ConfigError(source + ": expected a mapping");
  const YAML::Node model = root["model"] ? root["model"] : root;
  if (!model.IsMap()) throw ConfigError(source + ": 'model' must be a mapping");
  // model.hf_config: a Hugging Face config.json (or its directory) gives
  // the model; the keys beside it override its values.
  const bool hf = static_cast<bool>(model["hf_config"]);
  nn::GptConfig c;
  if (hf) {
    std::string path;
    try {
      path = model["hf_config"].as<std::string>();
    } catch (const YAML::Exception&) {
      throw ConfigError(source + ": model.hf_config: expected a path");
    }
    c = io::load_hf_config(path);
  }
  auto get = [&](const char* key, int64_t& out, bool required) {
    const YAML::Node v = model[key];
    if (!v) {
      if (required) throw ConfigError(source + ": missing model key '" + key + "'");
      return;
    }
    try {
      out = v.as<int64_t>();
    } catch (const YAML::Exception&) {
      std::stringstream ss;
      ss << v;
      throw ConfigError(source + ": model." + key + ": expected an integer, got '" + ss.str() +
                        "'");
    }
  };
  get("n_layer", c.n_layer, !hf);
  get("n_head", c.n_head, !hf);
  get("d_model", c.d_model, !hf);
  get("vocab_size", c.vocab_size, !hf);
  get("seq_len", c.seq_len, !hf);
  // The architecture's options change the parameters, FLOPs and activations
  // priced: the position table, the norms' biases, the linear layers'
  // biases, the MLP's width and activation, an untied head, grouped-query
  // attention's key/value heads.
  auto option = [&](const char* key, const char* expected, const auto& apply) {
    const YAML::Node v = model[key];
    if (!v) return;
    try {
      apply(v);
    } catch (const YAML::Exception&) {
      throw ConfigError(source + ": model." + key + ": expected " + expected);
    }
  };
  option("position_embedding", "learned or rope", [&](const YAML::Node& v) {
    c.position_embedding = nn::position_embedding_from_string(v.as<std::string>());
  });
  option("normalization", "layernorm or rmsnorm", [&](const YAML::Node& v) {
    c.normalization = nn::normalization_from_string(v.as<std::string>());
  });
  option("activation", "gelu, gelu_erf, swiglu, geglu or relu2", [&](const YAML::Node& v) {
    c.activation = nn::activation_from_string(v.as<std::string>());
  });
  option("linear_bias", "true or false",
         [&](const YAML::Node& v) { c.linear_bias = v.as<bool>(); });
  option("qkv_bias", "true or false", [&](const YAML::Node& v) { c.qkv_bias = v.as<bool>(); });
  option("qk_norm", "true (or head), full, head_layernorm or false", [&](const YAML::Node& v) {
    const std::string text = v.as<std::string>();
    if (text == "full" || text == "head" || text == "head_layernorm") {
      nn::set_qk_norm(c, text);
    } else {
      nn::set_qk_norm(c, v.as<bool>() ? "true" : "false");
    }
  });
  option("pre_norms", "true or false", [&](const YAML::Node& v) { c.pre_norms = v.as<bool>(); });
  option("embedding_multiplier", "a positive number",
         [&](const YAML::Node& v) { c.embedding_multiplier = v.as<double>(); });
  option("norm_weight_offset", "true or false",
         [&](const YAML::Node& v) { c.norm_weight_offset = v.as<bool>(); });
  option("init_std", "a positive number",
         [&](const YAML::Node& v) { c.init_std = v.as<double>(); });
  option("norm_affine", "true or false",
         [&](const YAML::Node& v) { c.norm_affine = v.as<bool>(); });
  option("norm_bias", "true or false", [&](const YAML::Node& v) { c.norm_bias = v.as<bool>(); });
  option("clip_qkv", "a number >= 0 (0: none)",
         [&](const YAML::Node& v) { c.clip_qkv = v.as<double>(); });
  option("mtp_layers", "an integer >= 0",
         [&](const YAML::Node& v) { c.mtp_layers = v.as<int64_t>(); });
  option("mtp_loss_weight", "a number >= 0",
         [&](const YAML::Node& v) { c.mtp_loss_weight = v.as<double>(); });
  option("z_loss_coef", "a number >= 0 (0: none)",
         [&](const YAML::Node& v) { c.z_loss_coef = v.as<double>(); });
  option("residual_multiplier", "a positive number",
         [&](const YAML::Node& v) { c.residual_multiplier = v.as<double>(); });
  option("logit_scale", "a positive number",
         [&](const YAML::Node& v) { c.logit_scale = v.as<double>(); });
  option("post_norms", "true or false", [&](const YAML::Node& v) { c.post_norms = v.as<bool>(); });
  // The parallel residual reduces under tensor parallelism once a layer
  // fewer, unless dropout acts on each sublayer's output alone.
  option("parallel_residual", "true or false",
         [&](const YAML::Node& v) { c.parallel_residual = v.as<bool>(); });
  option("shared_norm", "true or false",
         [&](const YAML::Node& v) { c.shared_norm = v.as<bool>(); });
  option("head_bias", "true or false", [&](const YAML::Node& v) { c.head_bias = v.as<bool>(); });
  option("mlp_bias", "true or false", [&](const YAML::Node& v) { c.mlp_bias = v.as<bool>(); });
  option("dropout", "a probability", [&](const YAML::Node& v) { c.dropout = v.as<double>(); });
  option("final_logit_softcap", "a number",
         [&](const YAML::Node& v) { c.final_logit_softcap = v.as<double>(); });
  option("attn_logit_softcap", "a number",
         [&](const YAML::Node& v) { c.attn_logit_softcap = v.as<double>(); });
  option("tie_embeddings", "true or false",
         [&](const YAML::Node& v) { c.tie_embeddings = v.as<bool>(); });
  option("norm_eps", "a number", [&](const YAML::Node& v) { c.layer_norm_eps = v.as<double>(); });
  get("ffn_hidden_size", c.ffn_hidden_size, false);
  get("n_kv_head", c.n_kv_head, false);
  get("head_dim", c.head_size, false);
  get("sliding_window", c.sliding_window, false);
  option("full_attention_layers", "a list of layer indices",
         [&](const YAML::Node& v) { c.full_attention_layers = v.as<std::vector<int64_t>>(); });
  // (Read to be checked: a layer without rope costs what one with it does.)
  option("nope_layers", "a list of layer indices",
         [&](const YAML::Node& v) { c.nope_layers = v.as<std::vector<int64_t>>(); });
  // model.mla as the trainer reads it (none, or its sizes).
  option("mla",
         "none, or {kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, "
         "v_head_dim, mscale_all_dim}",
         [&](const YAML::Node& v) {
           if (v.IsScalar()) {
             if (v.as<std::string>() != "none") throw YAML::Exception(YAML::Mark(), "");
             c.mla = {};
             return;
           }
           if (!v.IsMap()) throw YAML::Exception(YAML::Mark(), "");
           c.mla = {};
           for (auto it = v.begin(); it != v.end(); ++it) {
             const std::string k = it->first.as<std::string>();
             if (k == "kv_lora_rank")
               c.mla.kv_lora_rank = it->second.as<int64_t>();
             else if (k == "q_lora_rank")
               c.mla.q_lora_rank = it->second.as<int64_t>();
             else if (k == "qk_nope_head_dim")
               c.mla.qk_nope_head_dim = it->second.as<int64_t>();
             else if (k == "qk_rope_head_dim")
               c.mla.qk_rope_head_dim = it->second.as<int64_t>();
             else if (k == "v_head_dim")
               c.mla.v_head_dim = it->second.as<int64_t>();
             else if (k == "mscale_all_dim")
               c.mla.mscale_all_dim = it->second.as<double>();
             else
               throw ConfigError(source + ": unknown key 'model.mla." + k + "'");
           }
         });
  // model.moe as the trainer reads it (none, or its keys over those of
  // model.hf_config's mixture).
  option("moe",
         "none, or {experts, top_k, ffn_hidden_size, normalize_top_k, aux_loss_coef, "
         "dense_layers, shared_ffn_hidden_size, shared_gate, capacity_factor, drop_policy, "
         "pad_to_capacity, z_loss_coef, score, routed_scaling_factor, groups, top_groups, "
         "group_score, "
         "expert_bias, bias_update_rate, aux_loss_scope}",
         [&](const YAML::Node& v) {
           if (v.IsScalar()) {
             if (v.as<std::string>() != "none") throw YAML::Exception(YAML::Mark(), "");
             c.moe = {};
             return;
           }
           if (v["experts"]) c.moe.experts = v["experts"].as<int64_t>();
           if (v["top_k"]) c.moe.top_k = v["top_k"].as<int64_t>();
           if (v["ffn_hidden_size"]) c.moe.ffn_hidden_size = v["ffn_hidden_size"].as<int64_t>();
           if (v["normalize_top_k"]) c.moe.normalize_top_k = v["normalize_top_k"].as<bool>();
           if (v["aux_loss_coef"]) c.moe.aux_loss_coef = v["aux_loss_coef"].as<double>();
           if (v["dense_layers"]) c.moe.dense_layers = v["dense_layers"].as<std::vector<int64_t>>();
           if (v["shared_ffn_hidden_size"])
             c.moe.shared_ffn_hidden_size = v["shared_ffn_hidden_size"].as<int64_t>();
           if (v["shared_gate"]) c.moe.shared_gate = v["shared_gate"].as<bool>();
           if (v["capacity_factor"]) c.moe.capacity_factor = v["capacity_factor"].as<double>();
           if (v["z_loss_coef"]) c.moe.z_loss_coef = v["z_loss_coef"].as<double>();
           if (v["pad_to_capacity"]) c.moe.pad_to_capacity = v["pad_to_capacity"].as<bool>();
           // (The routing's keys cost nothing; the expert biases count as parameters.)
           if (v["score"]) {
             const std::string f = v["score"].as<std::string>();
             if (f != "softmax" && f != "sigmoid") throw YAML::Exception(YAML::Mark(), "");
             c.moe.score = f == "softmax" ? nn::GptConfig::Moe::Score::Softmax
                                          : nn::GptConfig::Moe::Score::Sigmoid;
           }
           if (v["routed_scaling_factor"])
             c.moe.routed_scaling_factor = v["routed_scaling_factor"].as<double>();
           if (v["groups"]) c.moe.groups = v["groups"].as<int64_t>();
           if (v["top_groups"]) c.moe.top_groups = v["top_groups"].as<int64_t>();
           if (v["group_score"]) {
             const std::string g = v["group_score"].as<std::string>();
             if (g != "top2_sum" && g != "max") throw YAML::Exception(YAML::Mark(), "");
             c.moe.group_score = g == "max" ? nn::GptConfig::Moe::GroupScore::Max
                                            : nn::GptConfig::Moe::GroupScore::TopTwoSum;
           }
           if (v["aux_loss_scope"]) {
             const std::string a = v["aux_loss_scope"].as<std::string>();
             if (a != "micro_batch" && a != "sequence") throw YAML::Exception(YAML::Mark(), "");
             c.moe.aux_loss_scope = a == "sequence" ? nn::GptConfig::Moe::BalanceScope::Sequence
                                                    : nn::GptConfig::Moe::BalanceScope::MicroBatch;
           }
           if (v["expert_bias"]) c.moe.expert_bias = v["expert_bias"].as<bool>();
           if (v["bias_update_rate"]) c.moe.bias_update_rate = v["bias_update_rate"].as<double>();
           if (v["drop_policy"]) {
             const std::string p = v["drop_policy"].as<std::string>();
             if (p != "probs" && p != "position") throw YAML::Exception(YAML::Mark(), "");
             c.moe.drop_policy = p == "probs" ? nn::GptConfig::Moe::DropPolicy::Probs
                                              : nn::GptConfig::Moe::DropPolicy::Position;
           }
         });
  // model.lora as the trainer reads it (a rank, or {rank, alpha, targets,
  // dropout}; targets left out, every layer LoRA adapts, the attention's
  // alone in a mixture of experts).
  const auto default_targets = [&] { return c.default_lora_targets(); };
  option("lora", "none, a rank, or {rank, alpha, targets, dropout}", [&](const YAML::Node& v) {
    if (v.IsScalar()) {
      if (v.as<std::string>() != "none")
        c.lora = {.rank = v.as<int64_t>(), .alpha = 0, .targets = default_targets()};
      return;
    }
    c.lora.rank = v["rank"].as<int64_t>();
    c.lora.alpha = v["alpha"] ? v["alpha"].as<double>() : 0.0;
    c.lora.dropout = v["dropout"] ? v["dropout"].as<double>() : 0.0;
    const YAML::Node t = v["targets"];
    c.lora.targets = !t             ? default_targets()
                     : t.IsScalar() ? std::vector<std::string>{t.as<std::string>()}
                                    : t.as<std::vector<std::string>>();
  });
  // Keys a trainer config's model section may also hold; the ones not read
  // above change nothing priced.
  static const std::vector<std::string> kKeys = {"hf_config",
                                                 "n_layer",
                                                 "n_head",
                                                 "n_kv_head",
                                                 "head_dim",
                                                 "d_model",
                                                 "vocab_size",
                                                 "seq_len",
                                                 "dropout",
                                                 "recompute",
                                                 "recompute_layers",
                                                 "position_embedding",
                                                 "rope_theta",
                                                 "rope_scaling",
                                                 "sliding_window",
                                                 "full_attention_layers",
                                                 "nope_layers",
                                                 "lora",
                                                 "moe",
                                                 "mla",
                                                 "activation",
                                                 "ffn_hidden_size",
                                                 "normalization",
                                                 "linear_bias",
                                                 "qkv_bias",
                                                 "qk_norm",
                                                 "tie_embeddings",
                                                 "embedding_multiplier",
                                                 "norm_weight_offset",
                                                 "init_std",
                                                 "norm_affine",
                                                 "norm_bias",
                                                 "clip_qkv",
                                                 "mtp_layers",
                                                 "mtp_loss_weight",
                                                 "z_loss_coef",
                                                 "residual_multiplier",
                                                 "logit_scale",
                                                 "post_norms",
                                                 "pre_norms",
                                                 "parallel_residual",
                                                 "shared_norm",
                                                 "head_bias",
                                                 "mlp_bias",
                                                 "rope_local_theta",
                                                 "rope_dim",
                                                 "hf_type",
                                                 "query_pre_attn_scalar",
                                                 "attn_logit_softcap",
                                                 "final_logit_softcap",
                                                 "norm_eps",
                                                 "attention_kernel",
                                                 "attention_deterministic"};
  for (auto it = model.begin(); it != model.end(); ++it) {
    const std::string k = it->first.as<std::string>();
    if (std::find(kKeys.begin(), kKeys.end(), k) == kKeys.end()) {
      std::string allowed;
      for (const auto& key : kKeys) allowed += (allowed.empty() ? "" : ", ") + key;
      throw ConfigError(source + ": unknown model key '" + k + "' (allowed: " + allowed + ")");
    }
  }
  c.validate();
  return c;
}

nn::GptConfig load_model_spec(const std::string& path) {
  namespace fs = std::filesystem;
  const bool json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (json || io::is_directory(path)) return io::load_hf_config(path);
  return parse_model_spec(io::read_text_file(path, "model file"), path);
}

}  // namespace triad::plan
