#include "triad/io/peft_adapter.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "triad/core/error.h"
#include "triad/io/gpt2_weights.h"
#include "triad/io/hf_export.h"
#include "triad/io/safetensors.h"
#include "triad/io/text_file.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/linalg.h"
#include "triad/ops/shape_ops.h"

namespace triad::io {

namespace {

bool is_gpt2(const nn::GptConfig& c) {
  return std::string(hf_model_type(c)) == "gpt2";
}

bool is_neox(const nn::GptConfig& c) {
  return std::string(hf_model_type(c)) == "gpt_neox";
}

bool is_falcon(const nn::GptConfig& c) {
  return std::string(hf_model_type(c)) == "falcon";
}

bool is_gptj(const nn::GptConfig& c) {
  const std::string type = hf_model_type(c);
  return type == "gptj" || type == "codegen";
}

bool is_codegen(const nn::GptConfig& c) {
  return std::string(hf_model_type(c)) == "codegen";
}

// A Hugging Face module that takes rows [first, first + rows) of a Triad
// layer's output (its B's rows; A whole).
struct Piece {
  std::string module;
  int64_t first, rows;
};

bool starts_with(const std::string& s, const std::string& head) {
  return s.compare(0, head.size(), head) == 0;
}

// Why the model's adapters have no PEFT form, or empty when they have one.
std::string unsupported_reason(const nn::GptConfig& c) {
  if (c.lora.rank <= 0) return "the model has no LoRA adapters";
  std::string type;
  try {
    type = hf_model_type(c);
  } catch (const Error& e) {  // no class holds the model: no modules to name
    return e.what();
  }
  const bool on_experts = c.moe.experts > 0 && (c.lora_on("mlp.c_fc") || c.lora_on("mlp.c_proj"));
  if (on_experts && (type == "granitemoe" || type == "granitemoeshared")) {
    return "model_type " + type +
           " holds its experts fused (input_linear, output_linear as 3-d parameters), which "
           "PEFT's LoRA modules do not adapt; model.lora.targets mlp.c_fc and mlp.c_proj on its "
           "experts are exported merged into the weights only";
  }
  if (on_experts && c.expert_fc_width() != 2 * c.expert_ffn()) {
    return "the experts are not gated (model.activation neither swiglu nor geglu), and no "
           "Hugging Face class of "
           "mixtures holds such experts";
  }
  return "";
}

// The modules a mixture's expert layer (mlp.experts.<e>.c_fc, ...,
// mlp.shared.c_proj) of block `hf` ("model.layers.N.") becomes: Mixtral's
// (and MiniMax-M2's) block_sparse_moe.experts.<e>.w1 (gate), w3 (up) and
// w2 (down), the
// others' mlp.experts.<e>.gate_proj, up_proj and down_proj, the shared
// expert's mlp.shared_expert (Qwen2-MoE's) or mlp.shared_experts
// (DeepSeek's, GLM-4.5's, dots.llm1's).
std::vector<Piece> expert_pieces(const nn::GptConfig& c, const std::string& hf,
                                 const std::string& layer) {
  if (const std::string why = unsupported_reason(c); !why.empty())
    throw NotSupportedError("PEFT adapter: " + why);
  const std::string type = hf_model_type(c);
  // (MiniMax-M2's experts are named as Mixtral's.)
  const bool mixtral = type == "mixtral" || type == "minimax_m2",
             shared = starts_with(layer, "mlp.shared.");
  std::string stem;
  if (shared) {
    const bool deepseek =
        type == "glm4_moe" || type == "dots1" || type == "deepseek_v3" || type == "deepseek_v2";
    stem = hf + (deepseek ? "mlp.shared_experts." : "mlp.shared_expert.");
  } else {
    const std::string rest = layer.substr(std::string("mlp.experts.").size());
    stem = hf + (mixtral ? "block_sparse_moe.experts." : "mlp.experts.") +
           rest.substr(0, rest.find('.')) + ".";
  }
  if (layer.ends_with(".c_proj")) return {{stem + (mixtral ? "w2" : "down_proj"), 0, -1}};
  const int64_t F = shared ? c.moe.shared_ffn_hidden_size : c.expert_ffn();
  return {{stem + (mixtral ? "w1" : "gate_proj"), 0, F},
          {stem + (mixtral ? "w3" : "up_proj"), F, F}};
}

// The modules layer `layer` ("attn.c_attn", ..., a mixture's
// "mlp.experts.3.c_fc") of block `i` becomes.
std::vector<Piece> pieces_of(const nn::GptConfig& c, int64_t i, const std::string& layer) {
  const std::string n = std::to_string(i);
  if (starts_with(layer, "mlp.experts.") || starts_with(layer, "mlp.shared."))
    return expert_pieces(c, "model.layers." + n + ".", layer);
  if (is_gpt2(c)) return {{"transformer.h." + n + "." + layer, 0, -1}};
  if (is_neox(c)) {  // one module per layer (query_key_value's rows by head)
    const std::string hf = "gpt_neox.layers." + n + ".";
    if (layer == "attn.c_attn") return {{hf + "attention.query_key_value", 0, -1}};
    if (layer == "attn.c_proj") return {{hf + "attention.dense", 0, -1}};
    if (layer == "mlp.c_fc") return {{hf + "mlp.dense_h_to_4h", 0, -1}};
    return {{hf + "mlp.dense_4h_to_h", 0, -1}};
  }
  if (is_gptj(c)) {  // LLaMA's q, k and v; out_proj, fc_in and fc_out
    const std::string hf = "transformer.h." + n + ".";
    const int64_t Q = c.q_width();
    if (layer == "attn.c_attn" && is_codegen(c)) return {{hf + "attn.qkv_proj", 0, -1}};
    if (layer == "attn.c_attn")
      return {
          {hf + "attn.q_proj", 0, Q}, {hf + "attn.k_proj", Q, Q}, {hf + "attn.v_proj", 2 * Q, Q}};
    if (layer == "attn.c_proj") return {{hf + "attn.out_proj", 0, -1}};
    if (layer == "mlp.c_fc") return {{hf + "mlp.fc_in", 0, -1}};
    return {{hf + "mlp.fc_out", 0, -1}};
  }
  if (is_falcon(c)) {  // the same modules (query_key_value's rows by key/value head)
    const std::string hf = "transformer.h." + n + ".";
    if (layer == "attn.c_attn") return {{hf + "self_attention.query_key_value", 0, -1}};
    if (layer == "attn.c_proj") return {{hf + "self_attention.dense", 0, -1}};
    if (layer == "mlp.c_fc") return {{hf + "mlp.dense_h_to_4h", 0, -1}};
    return {{hf + "mlp.dense_4h_to_h", 0, -1}};
  }
  const std::string hf = "model.layers." + n + ".";
  if (c.latent_attention()) {  // DeepSeek's latent attention: a module each
    static const std::map<std::string, std::string> kLatent = {
        {"attn.q_a_proj", "self_attn.q_a_proj"},
        {"attn.q_b_proj", "self_attn.q_b_proj"},
        {"attn.q_proj", "self_attn.q_proj"},
        {"attn.kv_a_proj", "self_attn.kv_a_proj_with_mqa"},
        {"attn.kv_b_proj", "self_attn.kv_b_proj"}};
    if (auto it = kLatent.find(layer); it != kLatent.end()) return {{hf + it->second, 0, -1}};
  }
  const int64_t Q = c.q_width(), KV = c.kv_heads() * c.head_dim(), F = c.ffn();
  const std::string type = hf_model_type(c);
  if (type == "phi") {  // LLaMA's q, k and v; dense, fc1 and fc2
    if (layer == "attn.c_proj") return {{hf + "self_attn.dense", 0, -1}};
    if (layer == "mlp.c_fc") return {{hf + "mlp.fc1", 0, -1}};
    if (layer == "mlp.c_proj") return {{hf + "mlp.fc2", 0, -1}};
  }
  if (type == "starcoder2") {  // LLaMA's attention; its ungated MLP's own names
    if (layer == "mlp.c_fc") return {{hf + "mlp.c_fc", 0, -1}};
    if (layer == "mlp.c_proj") return {{hf + "mlp.c_proj", 0, -1}};
  }
  if ((type == "nemotron" || type == "arcee") && layer == "mlp.c_fc")  // ungated: up_proj alone
    return {{hf + "mlp.up_proj", 0, -1}};
  if (type == "phi3") {  // fused as Triad's layers are
    if (layer == "attn.c_attn") return {{hf + "self_attn.qkv_proj", 0, -1}};
    if (layer == "mlp.c_fc") return {{hf + "mlp.gate_up_proj", 0, -1}};
  }
  if ((type == "glm" || type == "glm4") && layer == "mlp.c_fc")  // GLM's MLP fused alone
    return {{hf + "mlp.gate_up_proj", 0, -1}};
  if (layer == "attn.c_attn") {
    return {{hf + "self_attn.q_proj", 0, Q},
            {hf + "self_attn.k_proj", Q, KV},
            {hf + "self_attn.v_proj", Q + KV, KV}};
  }
  if (layer == "attn.c_proj") return {{hf + "self_attn.o_proj", 0, -1}};
  if (layer == "mlp.c_fc") return {{hf + "mlp.gate_proj", 0, F}, {hf + "mlp.up_proj", F, F}};
  return {{hf + "mlp.down_proj", 0, -1}};
}

// Whether block layer `module` (lora_modules') carries target `target`'s
// adapters: the target itself, or in a mixture the experts' layer of its
// name (mlp.c_fc: mlp.experts.<e>.c_fc, mlp.shared.c_fc).
bool from_target(const std::string& module, const std::string& target) {
  return module == target || (starts_with(target, "mlp.") && starts_with(module, "mlp.") &&
                              module.ends_with("." + target.substr(4)));
}

// The module names (the last part) PEFT's target_modules lists for a
// target: those of every block's modules it adapts (a mixture's experts and
// its dense layers may differ), each once.
std::vector<std::string> target_names(const nn::GptConfig& c, const std::string& target) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < c.n_layer; ++i) {
    for (const std::string& module : c.lora_modules(i)) {
      if (!from_target(module, target)) continue;
      for (const Piece& p : pieces_of(c, i, module)) {
        // GPT-2's two c_proj layers share a name; PEFT matches by suffix, so
        // each is named with its parent (attn.c_proj, mlp.c_proj).
        const std::string name = is_gpt2(c) ? target : p.module.substr(p.module.rfind('.') + 1);
        if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
      }
    }
  }
  return out;
}

}  // namespace

std::map<std::string, Tensor> triad_lora_to_peft(const nn::StateDict& adapters,
                                                 const nn::GptConfig& c) {
  if (c.lora.rank <= 0) throw ValueError("PEFT adapter: the model has no LoRA adapters");
  const auto shapes = nn::gpt_parameter_shapes(c);
  std::map<std::string, Tensor> out;
  for (int64_t i = 0; i < c.n_layer; ++i) {
    for (const std::string& layer : c.lora_modules(i)) {
      const std::string stem = "h." + std::to_string(i) + "." + layer + ".";
      Tensor ab[2];
      for (int k = 0; k < 2; ++k) {
        const std::string name = stem + (k == 0 ? "lora_a" : "lora_b");
        auto it = adapters.find(name);
        if (it == adapters.end()) throw ShapeError("PEFT adapter: missing '" + name + "'");
        if (it->second.shape() != shapes.at(name)) {
          throw ShapeError("PEFT adapter: '" + name + "' is " + shape_str(it->second.shape()) +
                           ", the model's " + shape_str(shapes.at(name)));
        }
        ab[k] = it->second;
      }
      // GPT-NeoX's query_key_value interleaves its rows by head: B's too.
      if (layer == "attn.c_attn" && is_neox(c)) ab[1] = triad_qkv_rows_to_neox(ab[1], c.n_head);
      if (layer == "attn.c_attn" && is_falcon(c))
        ab[1] = triad_qkv_rows_to_falcon(ab[1], c.n_head, c.kv_heads());
      // GPT-J's q and k turn in interleaved pairs: B's rows too.
      if (layer == "attn.c_attn" && is_gptj(c))
        ab[1] = triad_qkv_rows_to_gptj(ab[1], c.n_head, c.rotary_width());
      if (layer == "attn.c_attn" && is_codegen(c))
        ab[1] = stack_qkv_rows_to_codegen(ab[1], c.n_head);
      // Cohere's and GLM's q and k turn in interleaved pairs too, at any
      // head count (GLM's the rotated rows of each head).
      if (layer == "attn.c_attn" && hf_turns_interleaved(hf_model_type(c)))
        ab[1] = triad_qkv_rows_to_interleaved(ab[1], c.n_head, c.kv_heads(), c.rope_dim);
      // DeepSeek's rope rows (each query head's last qk_rope, the shared
      // key's) turn in interleaved pairs in its files: B's rows too.
      if (c.latent_attention()) {
        const int64_t qk = c.latent_qk_dim(), r = c.mla.qk_rope_head_dim;
        if (layer == "attn.q_b_proj" || layer == "attn.q_proj")
          ab[1] = interleaved_rows_at(ab[1], c.n_head, qk - r, r, false);
        if (layer == "attn.kv_a_proj")
          ab[1] = interleaved_rows_at(ab[1], 1, c.mla.kv_lora_rank, r, false);
      }
      for (const Piece& p : pieces_of(c, i, layer)) {
        const std::string to = "base_model.model." + p.module;
        out[to + ".lora_A.weight"] = contiguous(ab[0]).detach();
        out[to + ".lora_B.weight"] = p.rows < 0
                                         ? contiguous(ab[1]).detach()
                                         : contiguous(narrow(ab[1], 0, p.first, p.rows)).detach();
      }
    }
  }
  return out;
}

std::string peft_adapter_unsupported(const nn::GptConfig& c) {
  return unsupported_reason(c);
}

std::string peft_adapter_config_json(const nn::GptConfig& c, const std::string& base_model) {
  if (c.lora.rank <= 0) throw ValueError("PEFT adapter: the model has no LoRA adapters");
  std::vector<std::string> targets;
  for (const std::string& layer : c.lora.targets) {
    for (const std::string& t : target_names(c, layer)) targets.push_back(t);
  }
  nlohmann::ordered_json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = base_model;
  j["r"] = c.lora.rank;
  j["lora_alpha"] = c.lora.alpha > 0 ? c.lora.alpha : static_cast<double>(c.lora.rank);
  j["lora_dropout"] = c.lora.dropout;
  j["target_modules"] = targets;
  j["fan_in_fan_out"] = is_gpt2(c);  // GPT-2's Conv1D weights are stored [in, out]
  j["bias"] = "none";
  j["use_rslora"] = false;
  j["inference_mode"] = true;
  return j.dump(2) + "\n";
}

void save_peft_adapter(const nn::StateDict& adapters, const nn::GptConfig& c,
                       const std::string& dir, const std::string& base_model,
                       std::optional<DType> dtype) {
  std::map<std::string, Tensor> tensors = triad_lora_to_peft(adapters, c);
  if (dtype) {
    for (auto& [name, t] : tensors) {
      if (t.dtype() != *dtype) t = cast(t, *dtype).detach();
    }
  }
  const std::string config = peft_adapter_config_json(c, base_model);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError("PEFT adapter: cannot create '" + dir + "': " + ec.message());
  save_safetensors(dir + "/adapter_model.safetensors", tensors, {{"format", "pt"}});
  const std::string path = dir + "/adapter_config.json";
  std::ofstream f(path, std::ios::trunc);
  f << config;
  f.flush();
  if (!f) throw IoError("PEFT adapter: cannot write '" + path + "'");
}

void PeftDeltas::apply(std::map<std::string, Tensor>& tensors,
                       std::set<std::string>& merged) const {
  for (auto& [name, t] : tensors) {
    if (!name.ends_with(".weight")) continue;
    const std::string stem = name.substr(0, name.size() - std::string(".weight").size());
    // (GPT-2's files name its blocks with or without GPT2LMHeadModel's
    // "transformer.", PEFT's modules with it.)
    auto it = modules.find(stem);
    if (it == modules.end()) it = modules.find("transformer." + stem);
    if (it == modules.end()) continue;
    const std::string& module = it->first;
    const auto& [a, b] = it->second;
    // (The shape checked first: B A of an adapter for another model may be
    // far larger than the weight.)
    const Shape changed =
        fan_in_fan_out ? Shape{a.size(1), b.size(0)} : Shape{b.size(0), a.size(1)};
    if (changed != t.shape()) {
      throw IoError("PEFT adapter '" + dir + "': module '" + module + "' changes a weight of " +
                    shape_str(changed) + " (B A), but the base model's '" + name + "' is " +
                    shape_str(t.shape()) + ": is the adapter for another model?");
    }
    Tensor delta = affine(matmul(cast(b, DType::F32), cast(a, DType::F32)), scale);
    if (fan_in_fan_out) delta = transpose(delta, 0, 1);
    t = add(cast(t, DType::F32), delta).detach();
    merged.insert(module);
  }
}

PeftDeltas read_peft_adapter(const std::string& dir) {
  PeftDeltas d;
  d.dir = dir;
  const std::string config_path = dir + "/adapter_config.json";
  const std::optional<std::string> file = read_file(config_path);
  if (!file) throw IoError("PEFT adapter: cannot read '" + config_path + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(*file);
  } catch (const nlohmann::json::exception& e) {
    throw IoError("PEFT adapter: '" + config_path + "' is not JSON: " + e.what());
  }
  const auto refuse = [&](const std::string& key, const std::string& why) {
    throw IoError("PEFT adapter '" + config_path + "': " + key + " " + why);
  };
  if (!j.is_object()) refuse("the file (" + j.dump().substr(0, 40) + ")", "is not a JSON object");
  // Typed reads: a key of another type is refused by name, not read as
  // something else.
  const auto text = [&](const char* key, const std::string& otherwise) {
    if (!j.contains(key) || j.at(key).is_null()) return otherwise;
    if (!j.at(key).is_string())
      refuse(std::string(key) + " (" + j.at(key).dump() + ")", "must be a string");
    return j.at(key).get<std::string>();
  };
  const auto flag = [&](const char* key) {
    if (!j.contains(key) || j.at(key).is_null()) return false;
    if (!j.at(key).is_boolean())
      refuse(std::string(key) + " (" + j.at(key).dump() + ")", "must be true or false");
    return j.at(key).get<bool>();
  };
  const std::string type = text("peft_type", "");
  if (type != "LORA") refuse("peft_type '" + type + "'", "is not LORA, the one Triad merges");
  if (flag("use_dora")) refuse("use_dora", "is true: DoRA's magnitudes are not merged");
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (j.contains(key) && !j.at(key).is_null() && !j.at(key).empty())
      refuse(key, "sets ranks or scales per module, which Triad does not read");
  }
  if (j.contains("modules_to_save") && !j.at("modules_to_save").is_null() &&
      !j.at("modules_to_save").empty())
    refuse("modules_to_save", "holds whole modules, which Triad does not read");
  if (const std::string bias = text("bias", "none"); bias != "none")
    refuse("bias '" + bias + "'", "trains biases; only 'none' is read");
  // (A number past int64 reads negative.)
  if (!j.contains("r") || !j.at("r").is_number_integer() || j.at("r").get<int64_t>() <= 0)
    refuse("r", "must be a positive integer");
  const auto r = j.at("r").get<int64_t>();
  // Absent, lora_alpha is PEFT's LoraConfig default (8), as PEFT reads the
  // file; of another type it is refused rather than replaced.
  double alpha = 8.0;
  if (j.contains("lora_alpha") && !j.at("lora_alpha").is_null()) {
    if (!j.at("lora_alpha").is_number())
      refuse("lora_alpha (" + j.at("lora_alpha").dump() + ")", "must be a number");
    alpha = j.at("lora_alpha").get<double>();
  }
  d.scale = flag("use_rslora") ? alpha / std::sqrt(static_cast<double>(r))
                               : alpha / static_cast<double>(r);
  d.fan_in_fan_out = flag("fan_in_fan_out");
  const std::string weights = dir + "/adapter_model.safetensors";
  if (!io::path_exists(weights)) {
    throw IoError("PEFT adapter: '" + weights +
                  "' does not exist (adapter_model.bin is not read: save with "
                  "safe_serialization)");
  }
  const std::string prefix = "base_model.model.";
  std::map<std::string, Tensor> a_of, b_of;
  for (auto& [name, t] : load_safetensors(weights).tensors) {
    if (name.find("lora_embedding_") != std::string::npos)
      throw IoError("PEFT adapter '" + weights + "': '" + name +
                    "' adapts an embedding, which Triad does not read");
    const bool is_a = name.ends_with(".lora_A.weight"), is_b = name.ends_with(".lora_B.weight");
    if (!is_a && !is_b) {
      throw IoError("PEFT adapter '" + weights + "': '" + name +
                    "' is neither a lora_A nor a lora_B weight");
    }
    std::string module = name.substr(0, name.size() - std::string(".lora_A.weight").size());
    if (module.compare(0, prefix.size(), prefix) == 0) module = module.substr(prefix.size());
    (is_a ? a_of : b_of)[module] = t;
  }
  for (const auto& [module, a] : a_of) {
    auto b = b_of.find(module);
    if (b == b_of.end())
      throw IoError("PEFT adapter '" + weights + "': module '" + module + "' has no lora_B");
    if (a.dim() != 2 || b->second.dim() != 2 || a.size(0) != r || b->second.size(1) != r) {
      throw IoError("PEFT adapter '" + weights + "': module '" + module + "' has lora_A " +
                    shape_str(a.shape()) + " and lora_B " + shape_str(b->second.shape()) +
                    " (expected (r, in) and (out, r), r = " + std::to_string(r) +
                    " as adapter_config.json says)");
    }
    d.modules[module] = {a, b->second};
    b_of.erase(b);
  }
  if (!b_of.empty()) {
    throw IoError("PEFT adapter '" + weights + "': module '" + b_of.begin()->first +
                  "' has no lora_A");
  }
  if (d.modules.empty()) throw IoError("PEFT adapter '" + weights + "' holds no LoRA module");
  return d;
}

}  // namespace triad::io
