#include "triad/train/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "io/yaml_document.h"
#include "triad/backend/cuda.h"
#include "triad/core/device.h"
#include "triad/core/error.h"
#include "triad/data/token_dataset.h"
#include "triad/io/hf_config.h"
#include "triad/io/hf_export.h"
#include "triad/io/text_file.h"
#include "triad/nn/parameter_pattern.h"
#include "triad/parallel/context/ulysses.h"
#include "triad/parallel/pipeline/stage_balance.h"

namespace triad::train {
namespace {

std::string scalar_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  std::stringstream ss;
  ss << n;
  return ss.str();
}

int64_t get_int(const YAML::Node& n, const std::string& key) {
  if (n.IsScalar()) {
    try {
      return n.as<int64_t>();
    } catch (const YAML::Exception&) {
    }
  }
  throw ConfigError(key + ": expected an integer, got '" + scalar_text(n) + "'");
}

// A list of layer indices (model.full_attention_layers, model.nope_layers);
// their range and order are GptConfig::validate's to check.
std::vector<int64_t> get_layer_list(const YAML::Node& n, const std::string& key) {
  if (!n.IsSequence()) throw ConfigError(key + ": expected a list of layer indices");
  std::vector<int64_t> layers;
  for (size_t i = 0; i < n.size(); ++i)
    layers.push_back(get_int(n[i], key + "[" + std::to_string(i) + "]"));
  return layers;
}

double get_double(const YAML::Node& n, const std::string& key) {
  if (n.IsScalar()) {
    try {
      return n.as<double>();
    } catch (const YAML::Exception&) {
    }
  }
  throw ConfigError(key + ": expected a number, got '" + scalar_text(n) + "'");
}

bool get_bool(const YAML::Node& n, const std::string& key) {
  if (n.IsScalar()) {
    try {
      return n.as<bool>();
    } catch (const YAML::Exception&) {
    }
  }
  throw ConfigError(key + ": expected true or false, got '" + scalar_text(n) + "'");
}

// A mapping's key as text; `where` names the mapping ("" for the top level).
std::string key_name(const YAML::Node& k, const std::string& where) {
  if (!k.IsScalar()) {
    throw ConfigError((where.empty() ? std::string("the config") : where) +
                      ": a key must be a plain name, got '" + scalar_text(k) + "'");
  }
  return k.Scalar();
}

std::string get_string(const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) throw ConfigError(key + ": expected a string, got '" + scalar_text(n) + "'");
  return n.Scalar();
}

// A precision key that takes fp32 or bf16 (muon_ns_precision,
// grad_precision, moment_precision).
std::string get_fp32_or_bf16(const YAML::Node& n, const std::string& key) {
  std::string s = get_string(n, key);
  if (s != "fp32" && s != "bf16") throw ConfigError(key + " '" + s + "' must be fp32 or bf16");
  return s;
}

// model.moe: none, or a mapping of experts, top_k, ffn_hidden_size,
// normalize_top_k, aux_loss_coef, dense_layers, shared_ffn_hidden_size,
// shared_gate, capacity_factor, drop_policy, pad_to_capacity, z_loss_coef, score,
// routed_scaling_factor, groups, top_groups, group_score, expert_bias,
// bias_update_rate and aux_loss_scope over `base` (what model.hf_config read, or the
// defaults): the keys given replace its.
nn::GptConfig::Moe get_moe(const YAML::Node& n, const std::string& key, nn::GptConfig::Moe base) {
  const std::string keys =
      "experts, top_k, ffn_hidden_size, normalize_top_k, aux_loss_coef, dense_layers, "
      "shared_ffn_hidden_size, shared_gate, capacity_factor, drop_policy, pad_to_capacity, "
      "z_loss_coef, score, "
      "routed_scaling_factor, groups, top_groups, group_score, expert_bias, bias_update_rate, "
      "aux_loss_scope";
  const std::string expected = "none, or a mapping with experts (and " + keys.substr(9) + ")";
  if (n.IsScalar()) {
    if (get_string(n, key) == "none") return {};
    throw ConfigError(key + " ('" + n.Scalar() + "') must be " + expected);
  }
  if (!n.IsMap()) throw ConfigError(key + ": expected " + expected);
  static const std::set<std::string> allowed = {"experts",
                                                "top_k",
                                                "ffn_hidden_size",
                                                "normalize_top_k",
                                                "aux_loss_coef",
                                                "dense_layers",
                                                "shared_ffn_hidden_size",
                                                "shared_gate",
                                                "capacity_factor",
                                                "drop_policy",
                                                "pad_to_capacity",
                                                "z_loss_coef",
                                                "score",
                                                "routed_scaling_factor",
                                                "groups",
                                                "top_groups",
                                                "group_score",
                                                "expert_bias",
                                                "bias_update_rate",
                                                "aux_loss_scope"};
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string k = key_name(it->first, key);
    if (!allowed.count(k))
      throw ConfigError("unknown key '" + key + "." + k + "' (allowed: " + keys + ")");
  }
  nn::GptConfig::Moe m = base;
  if (n["experts"]) m.experts = get_int(n["experts"], key + ".experts");
  if (m.experts <= 0) {
    throw ConfigError(key + ".experts (" + std::to_string(m.experts) +
                      ") must be positive (model.moe: none for dense MLPs)");
  }
  if (n["top_k"]) m.top_k = get_int(n["top_k"], key + ".top_k");
  if (n["ffn_hidden_size"])
    m.ffn_hidden_size = get_int(n["ffn_hidden_size"], key + ".ffn_hidden_size");
  if (n["normalize_top_k"])
    m.normalize_top_k = get_bool(n["normalize_top_k"], key + ".normalize_top_k");
  if (n["aux_loss_coef"]) m.aux_loss_coef = get_double(n["aux_loss_coef"], key + ".aux_loss_coef");
  if (n["z_loss_coef"]) m.z_loss_coef = get_double(n["z_loss_coef"], key + ".z_loss_coef");
  if (n["shared_ffn_hidden_size"]) {
    m.shared_ffn_hidden_size =
        get_int(n["shared_ffn_hidden_size"], key + ".shared_ffn_hidden_size");
  }
  if (n["shared_gate"]) m.shared_gate = get_bool(n["shared_gate"], key + ".shared_gate");
  if (n["capacity_factor"])
    m.capacity_factor = get_double(n["capacity_factor"], key + ".capacity_factor");
  if (n["drop_policy"]) {
    const std::string p = get_string(n["drop_policy"], key + ".drop_policy");
    if (p != "probs" && p != "position") {
      throw ConfigError(key + ".drop_policy '" + p +
                        "' is not a policy (probs: an over-full expert keeps its most probable "
                        "tokens; position: its earliest)");
    }
    m.drop_policy = p == "probs" ? nn::GptConfig::Moe::DropPolicy::Probs
                                 : nn::GptConfig::Moe::DropPolicy::Position;
  }
  if (n["pad_to_capacity"])
    m.pad_to_capacity = get_bool(n["pad_to_capacity"], key + ".pad_to_capacity");
  if (n["score"]) {
    const std::string f = get_string(n["score"], key + ".score");
    if (f != "softmax" && f != "sigmoid") {
      throw ConfigError(key + ".score '" + f +
                        "' is not a router score (softmax: over the experts; sigmoid: each "
                        "expert's own, DeepSeek-V3's)");
    }
    m.score =
        f == "softmax" ? nn::GptConfig::Moe::Score::Softmax : nn::GptConfig::Moe::Score::Sigmoid;
  }
  if (n["routed_scaling_factor"]) {
    m.routed_scaling_factor =
        get_double(n["routed_scaling_factor"], key + ".routed_scaling_factor");
  }
  if (n["groups"]) m.groups = get_int(n["groups"], key + ".groups");
  if (n["top_groups"]) m.top_groups = get_int(n["top_groups"], key + ".top_groups");
  if (n["group_score"]) {
    const std::string g = get_string(n["group_score"], key + ".group_score");
    if (g != "top2_sum" && g != "max") {
      throw ConfigError(key + ".group_score '" + g +
                        "' is not a group score (top2_sum: the sum of a group's two best "
                        "experts', DeepSeek-V3's; max: its best one's, DeepSeek-V2's)");
    }
    m.group_score = g == "max" ? nn::GptConfig::Moe::GroupScore::Max
                               : nn::GptConfig::Moe::GroupScore::TopTwoSum;
  }
  if (n["expert_bias"]) m.expert_bias = get_bool(n["expert_bias"], key + ".expert_bias");
  if (n["bias_update_rate"])
    m.bias_update_rate = get_double(n["bias_update_rate"], key + ".bias_update_rate");
  if (n["aux_loss_scope"]) {
    const std::string scope = get_string(n["aux_loss_scope"], key + ".aux_loss_scope");
    if (scope != "micro_batch" && scope != "sequence") {
      throw ConfigError(key + ".aux_loss_scope '" + scope +
                        "' is not a scope (micro_batch: the loss balances each micro-batch's "
                        "tokens; sequence: each sequence's, DeepSeek-V3's)");
    }
    m.aux_loss_scope = scope == "sequence" ? nn::GptConfig::Moe::BalanceScope::Sequence
                                           : nn::GptConfig::Moe::BalanceScope::MicroBatch;
  }
  if (const YAML::Node d = n["dense_layers"]) {
    if (!d.IsSequence()) throw ConfigError(key + ".dense_layers: expected a list of layer indices");
    m.dense_layers.clear();
    for (size_t i = 0; i < d.size(); ++i)
      m.dense_layers.push_back(get_int(d[i], key + ".dense_layers[" + std::to_string(i) + "]"));
  }
  return m;
}

// model.mla: none, or a mapping with kv_lora_rank, q_lora_rank,
// qk_nope_head_dim, qk_rope_head_dim, v_head_dim and mscale_all_dim (each
// 0 when left out; GptConfig::validate says what they must be).
nn::GptConfig::Mla get_mla(const YAML::Node& n, const std::string& key) {
  const std::string keys =
      "kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, "
      "mscale_all_dim";
  const std::string expected = "none, or a mapping of " + keys;
  if (n.IsScalar()) {
    if (get_string(n, key) == "none") return {};
    throw ConfigError(key + " ('" + n.Scalar() + "') must be " + expected);
  }
  if (!n.IsMap()) throw ConfigError(key + ": expected " + expected);
  nn::GptConfig::Mla a;
  const std::map<std::string, int64_t*> sizes = {{"kv_lora_rank", &a.kv_lora_rank},
                                                 {"q_lora_rank", &a.q_lora_rank},
                                                 {"qk_nope_head_dim", &a.qk_nope_head_dim},
                                                 {"qk_rope_head_dim", &a.qk_rope_head_dim},
                                                 {"v_head_dim", &a.v_head_dim}};
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string k = key_name(it->first, key);
    if (k == "mscale_all_dim") {
      a.mscale_all_dim = get_double(it->second, key + "." + k);
    } else if (auto s = sizes.find(k); s != sizes.end()) {
      *s->second = get_int(it->second, key + "." + k);
    } else {
      throw ConfigError("unknown key '" + key + "." + k + "' (allowed: " + keys + ")");
    }
  }
  if (a.kv_lora_rank <= 0) {
    throw ConfigError(key + ".kv_lora_rank (" + std::to_string(a.kv_lora_rank) +
                      ") must be positive (model.mla: none for c_attn's attention)");
  }
  return a;
}

// model.lora: none, or {rank, alpha, targets, dropout}: rank required,
// alpha the rank when left out, targets every layer LoRA adapts when left
// out (a name or a list of them; the attention's alone in a mixture of
// experts, `moe`), dropout 0 when left out. A number alone is the rank.
nn::GptConfig::Lora get_lora(const YAML::Node& n, const std::string& key,
                             const nn::GptConfig& model) {
  nn::GptConfig::Lora l;
  const std::string expected = "none, a rank, or a mapping with rank (and alpha, targets, dropout)";
  if (n.IsScalar()) {
    const std::string v = get_string(n, key);
    if (v == "none") return l;
    if (v.empty() || !std::all_of(v.begin(), v.end(), [](char ch) {
          return std::isdigit(static_cast<unsigned char>(ch));
        })) {
      throw ConfigError(key + " ('" + v + "') must be " + expected);
    }
    YAML::Node as_map;
    as_map["rank"] = n;
    return get_lora(as_map, key, model);
  }
  if (!n.IsMap()) throw ConfigError(key + ": expected " + expected);
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string k = key_name(it->first, key);
    if (k != "rank" && k != "alpha" && k != "targets" && k != "dropout") {
      throw ConfigError("unknown key '" + key + "." + k +
                        "' (allowed: rank, alpha, targets, dropout)");
    }
  }
  if (!n["rank"]) throw ConfigError(key + ": missing required key 'rank' (the adapters' rank)");
  l.rank = get_int(n["rank"], key + ".rank");
  if (l.rank <= 0) {
    throw ConfigError(key + ".rank (" + std::to_string(l.rank) +
                      ") must be positive (model.lora: none for no adapters)");
  }
  if (n["alpha"]) {
    l.alpha = get_double(n["alpha"], key + ".alpha");
    if (!(l.alpha > 0) || !std::isfinite(l.alpha)) {
      std::ostringstream os;
      os << key << ".alpha (" << l.alpha
         << ") must be a positive number (the scale is alpha / rank)";
      throw ConfigError(os.str());
    }
  }
  if (n["dropout"]) {
    l.dropout = get_double(n["dropout"], key + ".dropout");
    if (!(l.dropout >= 0.0 && l.dropout < 1.0)) {
      std::ostringstream os;
      os << key << ".dropout (" << l.dropout
         << ") must be in [0, 1) (the probability of zeroing an adapter input)";
      throw ConfigError(os.str());
    }
  }
  const YAML::Node t = n["targets"];
  if (!t) {
    l.targets = model.default_lora_targets();
  } else if (t.IsScalar()) {
    l.targets.push_back(get_string(t, key + ".targets"));
  } else if (t.IsSequence()) {
    for (size_t i = 0; i < t.size(); ++i)
      l.targets.push_back(get_string(t[i], key + ".targets[" + std::to_string(i) + "]"));
  } else {
    throw ConfigError(key + ".targets: expected a layer name or a list of them");
  }
  return l;
}

// model.rope_scaling: none, or {type: llama3 | linear | yarn | longrope,
// ...} with Hugging Face's keys for the type (llama3: factor,
// low_freq_factor, high_freq_factor, original_max_position_embeddings,
// left-out ones keeping LLaMA 3.1's values; linear: factor; yarn: factor and
// original_max_position_embeddings, and beta_fast, beta_slow,
// attention_factor; longrope: short_factor and long_factor lists,
// original_max_position_embeddings and factor, and attention_factor).
RopeScaling get_rope_scaling(const YAML::Node& n, const std::string& key) {
  RopeScaling r;
  const std::string expected = "none or a mapping with type: llama3, linear, yarn or longrope";
  if (n.IsScalar()) {
    const std::string v = get_string(n, key);
    if (v != "none") throw ConfigError(key + " ('" + v + "') must be " + expected);
    return r;
  }
  if (!n.IsMap()) throw ConfigError(key + ": expected " + expected);
  const std::string type = n["type"] ? get_string(n["type"], key + ".type") : std::string();
  if (!rope_scaling_kind(type, &r.kind))
    throw ConfigError(key + ".type ('" + type +
                      "') must be llama3, linear, yarn, longrope or none");
  if (!r.scaled()) return r;
  const std::vector<RopeScalingKey> keys = rope_scaling_keys(r.kind);
  const bool lists = r.kind == RopeScaling::Kind::LongRope;
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string k = key_name(it->first, key);
    bool known = k == "type" || (lists && (k == "short_factor" || k == "long_factor"));
    std::string allowed = lists ? "type, short_factor, long_factor" : "type";
    for (const auto& a : keys) {
      known = known || k == a.name;
      allowed += std::string(", ") + a.name;
    }
    if (!known) {
      throw ConfigError("unknown key '" + key + "." + k + "' (allowed with type " + type + ": " +
                        allowed + ")");
    }
  }
  // A linear or yarn stretch has no sensible default: the factor is the
  // model's, and so is yarn's original context.
  if (r.kind != RopeScaling::Kind::Llama3 && !n["factor"])
    throw ConfigError(key + ".factor is required with type " + type);
  if ((r.kind == RopeScaling::Kind::Yarn || lists) && !n["original_max_position_embeddings"])
    throw ConfigError(key + ".original_max_position_embeddings is required with type " + type);
  for (const auto& k : keys) {
    if (n[k.name]) r.*k.field = get_double(n[k.name], key + "." + k.name);
  }
  if (lists) {
    std::vector<double> factors[2];
    const char* names[2] = {"short_factor", "long_factor"};
    for (int l = 0; l < 2; ++l) {
      const std::string at = key + "." + names[l];
      const YAML::Node v = n[names[l]];
      if (!v) throw ConfigError(at + " is required with type longrope (one factor per pair)");
      if (!v.IsSequence()) throw ConfigError(at + ": expected a list of numbers");
      for (size_t i = 0; i < v.size(); ++i)
        factors[l].push_back(get_double(v[i], at + "[" + std::to_string(i) + "]"));
    }
    if (const std::string why = set_rope_factors(r, factors[0], factors[1]); !why.empty())
      throw ConfigError(key + ": " + why);
  }
  return r;
}

// data.train: one path or glob, or a list of {path, weight} (a mixture).
std::vector<Config::DataPart> get_data_parts(const YAML::Node& n, const std::string& key) {
  if (n.IsScalar()) return {{get_string(n, key), 1.0}};
  if (!n.IsSequence() || n.size() == 0) {
    throw ConfigError(key +
                      ": expected a path or glob, or a list of {path: ..., weight: ...} entries");
  }
  std::vector<Config::DataPart> parts;
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string at = key + "[" + std::to_string(i) + "]";
    const YAML::Node e = n[i];
    if (!e.IsMap()) throw ConfigError(at + ": expected {path: ..., weight: ...}");
    for (auto it = e.begin(); it != e.end(); ++it) {
      const std::string k = key_name(it->first, at);
      if (k != "path" && k != "weight") {
        throw ConfigError("unknown key '" + at + "." + k + "' (allowed: path, weight)");
      }
    }
    if (!e["path"]) throw ConfigError("missing required key '" + at + ".path'");
    Config::DataPart part{get_string(e["path"], at + ".path"), 1.0};
    if (e["weight"]) {
      part.weight = get_double(e["weight"], at + ".weight");
      if (!(part.weight > 0) || !std::isfinite(part.weight)) {
        throw ConfigError(at + ".weight (" + scalar_text(e["weight"]) + ") must be positive");
      }
    }
    parts.push_back(part);
  }
  return parts;
}

// data.val and eval.choices: a path (`what`), or a mapping of names to
// them (`example`), as (name, path) sets.
template <class Set>
std::vector<Set> get_named_paths(const YAML::Node& n, const std::string& key, const char* what,
                                 const char* example) {
  if (n.IsScalar()) return {{"", get_string(n, key)}};
  if (!n.IsMap() || n.size() == 0) {
    throw ConfigError(key + ": expected " + what + ", or a mapping of names to them (" + example +
                      ")");
  }
  std::vector<Set> sets;
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string name = key_name(it->first, key);
    // Names become metric and TensorBoard keys: kept plain.
    const bool plain = !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.';
    });
    if (!plain) {
      throw ConfigError(key + ": the set name '" + name +
                        "' must be letters, digits, '_', '-' or '.' (it names the set's metrics)");
    }
    sets.push_back({name, get_string(it->second, key + "." + name)});
  }
  return sets;
}

struct Field {
  bool required;
  std::function<void(const YAML::Node&, const std::string&)> set;
};
using Section = std::vector<std::pair<std::string, Field>>;

void apply_section(const YAML::Node& node, const std::string& name, const Section& fields) {
  if (!node.IsMap()) throw ConfigError(name + ": expected a mapping of keys");
  std::string allowed;
  for (const auto& [k, f] : fields) allowed += (allowed.empty() ? "" : ", ") + k;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string key = key_name(it->first, name);
    bool known = false;
    for (const auto& [k, f] : fields) known = known || k == key;
    if (!known) {
      throw ConfigError("unknown key '" + name + "." + key + "' (allowed in " + name + ": " +
                        allowed + ")");
    }
  }
  for (const auto& [k, f] : fields) {
    const YAML::Node v = node[k];
    if (!v || v.IsNull()) {
      if (f.required) throw ConfigError("missing required key '" + name + "." + k + "'");
      continue;
    }
    f.set(v, name + "." + k);
  }
}

// A parameter pattern, or a list of them (train.freeze, train.no_weight_decay).
std::vector<std::string> get_patterns(const YAML::Node& v, const std::string& k) {
  std::vector<std::string> out;
  if (v.IsScalar()) {
    out.push_back(get_string(v, k));
  } else if (v.IsSequence()) {
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(get_string(v[i], k + "[" + std::to_string(i) + "]"));
  } else {
    throw ConfigError(k +
                      ": expected a parameter pattern or a list of them, e.g. "
                      "[wte.weight, \"h.[0-5].*\"]");
  }
  return out;
}

// --set's `path=value`: the path's keys, split at dots, name a key at any
// depth (model.moe.top_k=4); missing maps on the way are made, and a key
// holding something other than a map cannot be gone into.
void apply_override(YAML::Node& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError("--set '" + assignment + "': expected key=value (e.g. train.lr=1e-3)");
  }
  const std::string path = assignment.substr(0, eq);
  YAML::Node value = io::load_yaml(assignment.substr(eq + 1), "--set '" + assignment + "'", path);
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  if (path.back() == '.' ||
      std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); })) {
    throw ConfigError("--set '" + assignment +
                      "': the key has an empty part (expected names joined by dots, e.g. "
                      "model.moe.top_k)");
  }
  // node.reset() moves the handle down the tree; assigning a node to a
  // handle would overwrite what it refers to instead.
  YAML::Node node = root;
  std::string at;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    at += (i ? "." : "") + parts[i];
    YAML::Node child = node[parts[i]];
    if (child && !child.IsNull() && !child.IsMap()) {
      throw ConfigError("--set '" + assignment + "': '" + at + "' is " +
                        (child.IsScalar() ? "'" + child.Scalar() + "'" : std::string("a list")) +
                        ", not a section of keys (set it whole: --set '" + at + "={...}')");
    }
    if (!child || child.IsNull()) {
      node[parts[i]] = YAML::Node(YAML::NodeType::Map);
      child.reset(node[parts[i]]);
    }
    node.reset(child);
  }
  node[parts.back()] = value;
}

template <class T>
void require(bool ok, const std::string& key, T value, const std::string& rule) {
  if (!ok) {
    std::ostringstream os;
    os << key << " (" << value << ") " << rule;
    throw ConfigError(os.str());
  }
}

void validate(const Config& c, bool min_lr_given) {
  c.model.validate();
  if (!c.init_adapter.empty() && c.init_from.empty()) {
    throw ConfigError("init.adapter '" + c.init_adapter +
                      "' is merged into init.from's weights, but init.from is not set");
  }
  const auto& t = c.train;
  if (t.epochs > 0) {
    require(std::isfinite(t.epochs), "train.epochs", t.epochs, "must be finite");
  } else {
    require(t.steps > 0, "train.steps", t.steps, "must be positive");
  }
  require(t.global_batch_size > 0, "train.global_batch_size", t.global_batch_size,
          "must be positive");
  require(t.micro_batch_size > 0, "train.micro_batch_size", t.micro_batch_size, "must be positive");
  if (t.global_batch_size % t.micro_batch_size != 0) {
    throw ConfigError("train.global_batch_size (" + std::to_string(t.global_batch_size) +
                      ") must be divisible by train.micro_batch_size (" +
                      std::to_string(t.micro_batch_size) + ")");
  }
  for (int64_t G : t.batch_ramp().sizes()) {  // (the ramp checks its own values)
    if (G % t.micro_batch_size != 0) {
      throw ConfigError("the ramped global batch " + std::to_string(G) +
                        " (train.rampup_batch_size) must be divisible by train.micro_batch_size (" +
                        std::to_string(t.micro_batch_size) + ")");
    }
  }
  require(t.lr >= 0, "train.lr", t.lr, "must be >= 0");
  require(t.min_lr >= 0, "train.min_lr", t.min_lr, "must be >= 0");
  if (min_lr_given && t.min_lr > t.lr) {
    std::ostringstream os;
    os << "train.min_lr (" << t.min_lr << ") must not exceed train.lr (" << t.lr << ")";
    throw ConfigError(os.str());
  }
  if (t.loss_scale_min > t.loss_scale_init) {
    std::ostringstream os;
    os << "train.loss_scale_min (" << t.loss_scale_min
       << ") must not exceed train.loss_scale_init (" << t.loss_scale_init << ")";
    throw ConfigError(os.str());
  }
  require(t.warmup_steps >= 0, "train.warmup_steps", t.warmup_steps, "must be >= 0");
  if (!(t.warmup_init >= 0 && t.warmup_init <= t.lr)) {
    std::ostringstream os;
    os << "train.warmup_init (" << t.warmup_init << ") must be in [0, train.lr (" << t.lr << ")]";
    throw ConfigError(os.str());
  }
  if (t.warmup_init > 0 && t.warmup_steps == 0) {
    std::ostringstream os;
    os << "train.warmup_init (" << t.warmup_init << ") needs a warm-up: train.warmup_steps is 0";
    throw ConfigError(os.str());
  }
  require(t.lr_decay_steps >= 0, "train.lr_decay_steps", t.lr_decay_steps,
          "must be >= 0 (0: train.steps)");
  require(t.cooldown_steps >= 0, "train.cooldown_steps", t.cooldown_steps, "must be >= 0");
  if (t.cooldown_shape != "linear" && t.lr_decay != "wsd") {
    throw ConfigError("train.cooldown_shape ('" + t.cooldown_shape +
                      "') applies to train.lr_decay 'wsd', not '" + t.lr_decay + "'");
  }
  if (t.cooldown_steps > 0 && t.lr_decay != "wsd") {
    throw ConfigError("train.cooldown_steps (" + std::to_string(t.cooldown_steps) +
                      ") applies to train.lr_decay 'wsd', not '" + t.lr_decay + "'");
  }
  // (With train.epochs the step count is known once the data is read:
  // resolve_epochs checks this then.)
  if (t.lr_decay == "wsd" && (t.steps > 0 || t.lr_decay_steps > 0)) {
    const auto o = t.lr_schedule();
    if (o.decay_steps - o.warmup_steps < 1 || o.cooldown_steps > o.decay_steps - o.warmup_steps) {
      throw ConfigError("train.lr_decay 'wsd' needs 1 <= train.cooldown_steps (" +
                        std::to_string(o.cooldown_steps) +
                        ") <= decay steps - train.warmup_steps (" + std::to_string(o.decay_steps) +
                        " - " + std::to_string(o.warmup_steps) + ")");
    }
  }
  require(t.weight_decay >= 0, "train.weight_decay", t.weight_decay, "must be >= 0");
  require(t.weight_decay_steps >= 0, "train.weight_decay_steps", t.weight_decay_steps,
          "must be >= 0 (0: train.steps)");
  if (t.weight_decay_start) {
    require(*t.weight_decay_start >= 0, "train.weight_decay_start", *t.weight_decay_start,
            "must be >= 0");
  }
  if (t.weight_decay_schedule == "constant" && (t.weight_decay_start || t.weight_decay_steps > 0)) {
    std::ostringstream os;
    if (t.weight_decay_start)
      os << "train.weight_decay_start (" << *t.weight_decay_start << ")";
    else
      os << "train.weight_decay_steps (" << t.weight_decay_steps << ")";
    os << " applies to train.weight_decay_schedule 'linear' or 'cosine', not 'constant'";
    throw ConfigError(os.str());
  }
  if (t.weight_decay_schedule != "constant" && !t.weight_decay_start) {
    std::ostringstream os;
    os << "train.weight_decay_schedule '" << t.weight_decay_schedule
       << "' needs train.weight_decay_start, the decay at the first step (train.weight_decay, "
       << t.weight_decay << ", is where it ends)";
    throw ConfigError(os.str());
  }
  require(t.beta1 >= 0 && t.beta1 < 1, "train.beta1", t.beta1, "must be in [0, 1)");
  require(t.beta2 >= 0 && t.beta2 < 1, "train.beta2", t.beta2, "must be in [0, 1)");
  require(t.eps > 0, "train.eps", t.eps, "must be > 0");
  require(t.grad_clip >= 0, "train.grad_clip", t.grad_clip, "must be >= 0 (0 disables clipping)");
  if (t.cuda_graph) {
    // What a captured step would freeze at its capture, or cannot hold.
    const auto refuse = [](const std::string& what) {
      throw ConfigError("train.cuda_graph: " + what);
    };
    if (c.device == "cpu") refuse("needs device: cuda (it is cpu)");
    // A dropless mixture is routed and sized on the device (grouped
    // products); a capped one that is not padded reads its routing.
    const nn::GptConfig::Moe& moe = c.model.moe;
    if (moe.experts > 0 && !moe.pad_to_capacity) {
      if (moe.capacity_factor > 0) {
        refuse(
            "a mixture of experts capped by model.moe.capacity_factor reads its routing on the "
            "host in every layer; model.moe.pad_to_capacity routes it on the device");
      }
      for (const std::string& target : c.model.lora.targets) {
        if (c.model.lora.rank > 0 && c.model.lora.dropout > 0 &&
            (target == "mlp.c_fc" || target == "mlp.c_proj")) {
          // (Each expert draws its own masks: its adapters run apart, on
          // rows counted on the host.)
          std::ostringstream os;
          os << "a dropless mixture of experts (model.moe) with LoRA dropout (model.lora.dropout "
             << c.model.lora.dropout << ") on its experts' adapters (model.lora.targets " << target
             << ") runs each expert on rows counted on the host; model.lora.dropout 0, or "
                "model.moe.pad_to_capacity (with a capacity_factor), routes them on the device";
          refuse(os.str());
        }
      }
    }
  }
  // bf16 gradients are those of bf16 parameters (they are f32 under fp32,
  // and fp16's loss scaling wants f32 sums).
  if (t.grad_precision == "bf16" && t.precision != "bf16") {
    throw ConfigError("train.grad_precision 'bf16' needs train.precision 'bf16' (it is '" +
                      t.precision + "')");
  }
  const bool muon = t.optimizer == "muon";
  for (const auto& [key, given] : {std::pair{"muon_momentum", t.muon_momentum != 0.95},
                                   {"muon_nesterov", !t.muon_nesterov},
                                   {"muon_ns_steps", t.muon_ns_steps != 5},
                                   {"muon_scale", t.muon_scale != "adamw_rms"},
                                   {"muon_lr", t.muon_lr != 0},
                                   {"muon_ns_precision", !t.muon_ns_precision.empty()}}) {
    if (given && !muon) {
      throw ConfigError(std::string("train.") + key + " applies to train.optimizer 'muon', not '" +
                        t.optimizer + "'");
    }
  }
  require(t.muon_momentum >= 0 && t.muon_momentum < 1, "train.muon_momentum", t.muon_momentum,
          "must be in [0, 1)");
  require(t.muon_ns_steps >= 1, "train.muon_ns_steps", t.muon_ns_steps,
          "must be >= 1 (Newton-Schulz iterations)");
  require(t.muon_lr >= 0, "train.muon_lr", t.muon_lr, "must be >= 0 (0: train.lr)");
  if (t.muon_lr > 0 && !(t.lr > 0)) {
    throw ConfigError("train.muon_lr (" + std::to_string(t.muon_lr) +
                      ") follows the schedule of train.lr in proportion, which needs train.lr > "
                      "0 (it is " +
                      std::to_string(t.lr) + ")");
  }
  if (muon && c.model.lora.rank > 0) {
    throw ConfigError(
        "train.optimizer 'muon' with model.lora: LoRA trains its adapters alone, which are not "
        "the hidden matrices Muon updates; use train.optimizer 'adamw'");
  }
  if (!t.freeze.empty() && c.model.lora.rank > 0) {
    throw ConfigError(
        "train.freeze with model.lora: LoRA freezes every parameter but its adapters itself");
  }
  if (!t.freeze.empty() &&
      c.frozen_parameters().size() == nn::gpt_parameter_shapes(c.model).size()) {
    throw ConfigError("train.freeze freezes every parameter of the model: nothing would train");
  }
  c.no_decay_parameters();  // (a pattern that matches nothing is an error)
  c.lr_scale_factors();     // (nor may two patterns match one parameter)
  require(c.log_interval > 0, "log.interval", c.log_interval, "must be positive");
  if (c.log_moe_per_layer && c.model.moe.experts == 0)
    throw ConfigError("log.moe_per_layer reports a mixture of experts' layers: set model.moe");
  const auto& ck = c.checkpoint;
  require(t.exit_after_minutes == 0 || !ck.dir.empty(), "train.exit_after_minutes",
          t.exit_after_minutes,
          "needs checkpoint.dir: the run it stops goes on from the checkpoint it writes then");
  if (ck.keep_every > 0 && ck.interval > 0 && ck.keep_every % ck.interval != 0) {
    throw ConfigError("checkpoint.keep_every (" + std::to_string(ck.keep_every) +
                      ") must be a multiple of checkpoint.interval (" +
                      std::to_string(ck.interval) +
                      "): the checkpoints it keeps are the ones the interval writes");
  }
  if (ck.resume != "never" && ck.resume != "auto" && ck.resume.find('/') == std::string::npos &&
      ck.dir.empty()) {
    throw ConfigError("checkpoint.resume '" + ck.resume +
                      "' names a checkpoint of checkpoint.dir, which is not set (give a path "
                      "with a '/' for one elsewhere)");
  }
  if (ck.keep_best) {
    if (ck.dir.empty()) throw ConfigError("checkpoint.keep_best needs checkpoint.dir");
    if (!c.has_validation()) {
      throw ConfigError(
          "checkpoint.keep_best keeps the checkpoint of the lowest validation loss and needs "
          "validation data: set data.val or data.val_split");
    }
    if (ck.interval > 0 && (c.eval.interval <= 0 || ck.interval % c.eval.interval != 0)) {
      throw ConfigError(
          "checkpoint.keep_best needs a validation loss at every checkpoint: "
          "checkpoint.interval (" +
          std::to_string(ck.interval) + ") must be a multiple of eval.interval (" +
          std::to_string(c.eval.interval) + ")");
    }
  }
  if (!c.evaluates() && c.eval.interval > 0) {
    throw ConfigError("eval.interval (" + std::to_string(c.eval.interval) +
                      ") needs something to evaluate: set data.val, data.val_split, "
                      "eval.choices, eval.lambada or eval.samples");
  }
  if (c.eval.early_stop_patience > 0 && (!c.has_validation() || c.eval.interval <= 0)) {
    throw ConfigError("eval.early_stop_patience (" + std::to_string(c.eval.early_stop_patience) +
                      ") counts evaluations of the validation loss: set data.val or "
                      "data.val_split, and eval.interval");
  }
  if (c.eval.at_start && !c.evaluates()) {
    throw ConfigError(
        "eval.at_start needs something to evaluate: set data.val, data.val_split, "
        "eval.choices, eval.lambada or eval.samples");
  }
  if (c.eval.early_stop_patience == 0 && c.eval.early_stop_delta > 0) {
    throw ConfigError("eval.early_stop_delta applies with eval.early_stop_patience > 0");
  }
  if (!c.has_validation() && c.eval.batches > 0) {
    throw ConfigError("eval.batches (" + std::to_string(c.eval.batches) +
                      ") needs validation data: set data.val or data.val_split");
  }
  if (c.eval.choices.empty() && c.eval.choices_limit > 0) {
    throw ConfigError(
        "eval.choices_limit only says how much of eval.choices is read: set eval.choices "
        "(multiple-choice questions) or drop it");
  }
  if (c.eval.choices.empty() && c.eval.hellaswag_prompt != "llmc") {
    throw ConfigError(
        "eval.hellaswag_prompt only says how eval.choices are asked: set eval.choices "
        "(multiple-choice questions) or drop it");
  }
  if (c.eval.choices.empty() && c.eval.choices_fewshot > 0) {
    throw ConfigError(
        "eval.choices_fewshot only says how eval.choices are asked: set eval.choices "
        "(multiple-choice questions) or drop it");
  }
  if (c.eval.choices_fewshot == 0 && c.eval.choices_fewshot_seed >= 0) {
    throw ConfigError("eval.choices_fewshot_seed (" + std::to_string(c.eval.choices_fewshot_seed) +
                      ") draws eval.choices_fewshot's examples: set eval.choices_fewshot (how "
                      "many) or drop it");
  }
  if (c.eval.lambada.empty() && c.eval.lambada_limit > 0) {
    throw ConfigError(
        "eval.lambada_limit only says how much of eval.lambada is read: set eval.lambada "
        "(LAMBADA's texts) or drop it");
  }
  if (!c.reads_text_for_eval()) {
    const std::pair<const char*, bool> needs[] = {{"eval.tokenizer", !c.eval.tokenizer.empty()},
                                                  {"eval.vocab", !c.eval.vocab.empty()},
                                                  {"eval.merges", !c.eval.merges.empty()},
                                                  {"eval.bos_token", !c.eval.bos_token.empty()}};
    for (const auto& [key, set] : needs) {
      if (set) {
        throw ConfigError(std::string(key) +
                          " only says how eval.choices, eval.lambada and eval.samples are read: "
                          "set one of them "
                          "or drop it");
      }
    }
  }
  if (c.eval.samples.empty()) {
    const EvalSection defaults;
    const std::pair<const char*, bool> needs[] = {
        {"eval.sample_tokens", c.eval.sample_tokens != defaults.sample_tokens},
        {"eval.sample_temperature", c.eval.sample_temperature != defaults.sample_temperature},
        {"eval.sample_top_k", c.eval.sample_top_k != defaults.sample_top_k}};
    for (const auto& [key, set] : needs) {
      if (set) {
        throw ConfigError(std::string(key) +
                          " only says how eval.samples are continued: set eval.samples (prompts) "
                          "or drop it");
      }
    }
  }
  if (c.eval.vocab.empty() != c.eval.merges.empty()) {
    throw ConfigError(std::string(c.eval.vocab.empty() ? "eval.merges" : "eval.vocab") + " needs " +
                      (c.eval.vocab.empty() ? "eval.vocab" : "eval.merges") +
                      ": GPT-2's tokenizer is the two files together");
  }
  if (!c.eval.tokenizer.empty() && !c.eval.vocab.empty()) {
    throw ConfigError(
        "eval.tokenizer and eval.vocab/eval.merges each name the tokenizer: keep one");
  }
  require(c.data_val.empty() || c.data_val_split == 0, "data.val_split", c.data_val_split,
          "and data.val both name the validation data: keep one (set data.val to null to hold "
          "out part of data.train)");
  require(!c.output_dir.empty(), "output.dir", "''", "must not be empty");
  if (c.model.reset_attention_mask && c.attention_kernel == "cudnn") {
    throw ConfigError(
        "model.attention_kernel 'cudnn' cannot take data.reset_attention_mask: cuDNN's fused "
        "attention has no document mask (use auto, simt or tensor_core)");
  }
  if (c.model.eod_token < -1 || c.model.eod_token >= c.model.vocab_size) {
    throw ConfigError("data.eod_token (" + std::to_string(c.model.eod_token) +
                      ") must be a token id in [0, " + std::to_string(c.model.vocab_size) +
                      ") (model.vocab_size), or -1 for none");
  }
  if (c.data_eod_mask_loss && (c.model.eod_token < 0 || c.model.eod_token >= c.model.vocab_size)) {
    throw ConfigError("data.eod_token (" + std::to_string(c.model.eod_token) +
                      ") must be a token id in [0, " + std::to_string(c.model.vocab_size) +
                      ") when data.eod_mask_loss is set");
  }
  require(c.data_fim_rate >= 0 && c.data_fim_rate <= 1, "data.fim_rate", c.data_fim_rate,
          "must be in [0, 1]");
  require(c.data_fim_spm_rate >= 0 && c.data_fim_spm_rate <= 1, "data.fim_spm_rate",
          c.data_fim_spm_rate, "must be in [0, 1]");
  if (c.data_fim_rate > 0) {
    if (c.data_fim_tokens.size() != 3) {
      throw ConfigError("data.fim_rate " + std::to_string(c.data_fim_rate) +
                        " needs data.fim_tokens: the [prefix, middle, suffix] sentinel token ids "
                        "(StarCoder's <fim_prefix>, <fim_middle>, <fim_suffix>), got " +
                        std::to_string(c.data_fim_tokens.size()) + " id(s)");
    }
    const char* names[] = {"prefix", "middle", "suffix"};
    for (size_t i = 0; i < 3; ++i) {
      const int64_t id = c.data_fim_tokens[i];
      if (id < 0 || id >= c.model.vocab_size || id == c.model.eod_token ||
          std::count(c.data_fim_tokens.begin(), c.data_fim_tokens.end(), id) > 1) {
        throw ConfigError("data.fim_tokens[" + std::to_string(i) + "] (the " + names[i] +
                          " sentinel, " + std::to_string(id) + ") must be a token id in [0, " +
                          std::to_string(c.model.vocab_size) +
                          "), neither data.eod_token nor another sentinel");
      }
    }
    if (c.data_packing != "stream") {
      throw ConfigError(
          "data.fim_rate applies to data.packing: stream (pretraining's documents), "
          "not " +
          c.data_packing);
    }
  } else if (!c.data_fim_tokens.empty()) {
    throw ConfigError("data.fim_tokens goes with data.fim_rate > 0 (fill-in-the-middle is off)");
  }
  if (c.data_long_documents != "split" && c.data_packing == "stream") {
    throw ConfigError("data.long_documents '" + c.data_long_documents +
                      "' applies to data.packing: documents or best_fit (the stream rule cuts "
                      "every document where sequences end)");
  }
  if (c.data_packing != "stream" &&
      (c.model.eod_token < 0 || c.model.eod_token >= c.model.vocab_size)) {
    throw ConfigError("data.eod_token (" + std::to_string(c.model.eod_token) +
                      ") must be a token id in [0, " + std::to_string(c.model.vocab_size) +
                      ") when data.packing is " + c.data_packing +
                      ": it ends a shard's documents and pads each row");
  }
  if (c.model.n_head % c.parallel.tp != 0) {
    throw ConfigError("model.n_head (" + std::to_string(c.model.n_head) +
                      ") must be divisible by parallel.tp (" + std::to_string(c.parallel.tp) + ")");
  }
  if (!c.model.kv_heads_fit(c.parallel.tp)) {
    throw ConfigError("model.n_kv_head (" + std::to_string(c.model.kv_heads()) + ") " +
                      c.model.kv_heads_rule(c.parallel.tp, "parallel.tp"));
  }
  if (c.model.attn_logit_softcap > 0.0 && c.attention_kernel == "cudnn") {
    throw ConfigError(
        "model.attention_kernel 'cudnn' cannot take model.attn_logit_softcap " +
        std::to_string(c.model.attn_logit_softcap) +
        " (the cuDNN graph has no logit soft-capping; use auto, simt or tensor_core)");
  }
  if (c.device != "cpu" && c.model.head_dim() > 256) {
    // No attention on the GPU takes it (Triad's kernels and cuDNN's stop at
    // 256; CudaKernels.TheConfigRefusesANamedAttentionKernelWhereTheKernelDoes).
    throw ConfigError("model head dim " + std::to_string(c.model.head_dim()) + " on device '" +
                      c.device +
                      "': the GPU's attention kernels take head dims up to 256 (Triad's and "
                      "cuDNN's); only device cpu runs it");
  }
  if (c.device != "cpu" && (c.attention_kernel == "tensor_core" || c.attention_kernel == "cudnn")) {
    // What the kernel named can never run, refused before training starts
    // (the attention would refuse it at the first step). The rules are the
    // kernels' (kernels/attention.cu, cudnn_attention_graph.cpp), held to
    // them by CudaKernels.TheConfigRefusesANamedAttentionKernelWhereTheKernelDoes.
    // (Latent attention's head dims are its own: the attention names them.)
    const std::string named = "model.attention_kernel '" + c.attention_kernel + "'";
    if (c.train.precision == "fp32") {
      throw ConfigError(named +
                        " takes bf16 or fp16 activations, and train.precision is fp32 (use auto "
                        "or simt)");
    }
    const int64_t D = c.model.head_dim();
    if (!c.model.latent_attention() && c.attention_kernel == "tensor_core" &&
        (D % 16 != 0 || D > 256)) {
      throw ConfigError(named +
                        " needs a head dim that is a multiple of 16 up to 256 (as far as the "
                        "device's shared memory takes it: 256 on sm_90, 128 on sm_80, 64 on sm_86 "
                        "and sm_89), not " +
                        std::to_string(D) + " (use auto or simt)");
    }
    if (!c.model.latent_attention() && c.attention_kernel == "cudnn" && (D % 8 != 0 || D > 256)) {
      throw ConfigError(named + " needs a head dim that is a multiple of 8 up to 256, not " +
                        std::to_string(D) + " (use auto, simt or tensor_core)");
    }
  }
  if (c.parallel.sequence_parallel && c.parallel.tp == 1) {
    throw ConfigError("parallel.sequence_parallel needs parallel.tp > 1");
  }
  if (c.model.mtp_layers > 0) {
    if (c.model.lora.rank > 0) {
      throw ConfigError(
          "model.mtp_layers with model.lora: multi-token prediction trains with the model "
          "(pretraining), not with adapters; set model.mtp_layers: 0 to fine-tune with LoRA");
    }
  }
  if (c.parallel.ep > 1) {
    if (c.model.moe.experts == 0) {
      throw ConfigError("parallel.ep (" + std::to_string(c.parallel.ep) +
                        ") shares a mixture's experts out, but model.moe is not set");
    }
    if (c.model.moe.experts % c.parallel.ep != 0) {
      throw ConfigError("model.moe.experts (" + std::to_string(c.model.moe.experts) +
                        ") must be divisible by parallel.ep (" + std::to_string(c.parallel.ep) +
                        "): each expert-parallel rank holds an equal block of the experts");
    }
    if (c.parallel.dp > 0 && (c.parallel.dp * c.parallel.cp) % c.parallel.ep != 0) {
      throw ConfigError("parallel.ep (" + std::to_string(c.parallel.ep) +
                        ") must divide parallel.dp (" + std::to_string(c.parallel.dp) + ")" +
                        (c.parallel.cp > 1
                             ? " times parallel.cp (" + std::to_string(c.parallel.cp) + ")"
                             : std::string()) +
                        ": expert parallelism shares experts among data-parallel ranks");
    }
  }
  // (The model's heads, length and losses against the chunks.)
  cp::check_context_parallel(c.model, c.parallel.tp, c.parallel.cp, c.parallel.sequence_parallel,
                             cp::exchange_from_string(c.parallel.cp_comm), c.parallel.cp_a2a);
  if (c.attention_kernel == "cudnn" && c.parallel.cp > 1) {
    // The keys' all-gather and the ring attend each rank's chunk of queries
    // to keys and values held apart from them; cuDNN's graph takes one
    // fused qkv. (auto on groups that span nodes may still choose a ring:
    // the attention then names the same reason.)
    const cp::Exchange exchange = cp::resolve_exchange(cp::exchange_from_string(c.parallel.cp_comm),
                                                       c.model, c.parallel.tp, c.parallel.cp);
    if (exchange != cp::Exchange::AllToAll) {
      throw ConfigError(
          std::string("model.attention_kernel 'cudnn' cannot take parallel.cp_comm ") +
          cp::exchange_name(exchange) +
          (c.parallel.cp_comm == "auto" ? " (auto's choice for these heads)" : "") +
          ": cuDNN's fused attention takes each sequence's queries with their keys "
          "and values, and this exchange attends a chunk of queries to keys held "
          "apart (use auto, simt or tensor_core, or parallel.cp_comm all_to_all)");
    }
  }
  if (c.parallel.sequence_parallel && c.model.seq_len % c.parallel.tp != 0) {
    throw ConfigError("model.seq_len (" + std::to_string(c.model.seq_len) +
                      ") must be divisible by parallel.tp (" + std::to_string(c.parallel.tp) +
                      ") with sequence parallelism");
  }
  try {
    device_from_string(c.device);
  } catch (const ValueError&) {
    throw ConfigError("device ('" + c.device + "') must be cpu, cuda or cuda:N");
  }
  // log.profile_steps brackets the CUDA profiler, and log.nvtx's ranges
  // anywhere; on the CPU alone there is nothing for it to bracket.
  if (c.log_profile_first > 0 && !c.log_nvtx && c.device == "cpu") {
    throw ConfigError("log.profile_steps ([" + std::to_string(c.log_profile_first) + ", " +
                      std::to_string(c.log_profile_last) +
                      "]) on device cpu needs log.nvtx: true (it starts the CUDA profiler "
                      "only on a GPU)");
  }
  if (!c.log_profile_ranks.empty() && !c.log_nvtx && c.log_profile_first == 0) {
    throw ConfigError("log.profile_ranks applies to log.nvtx or log.profile_steps: set one");
  }
  const auto& p = c.parallel;
  const std::set<std::string> schedules{"gpipe", "1f1b", "interleaved", "zb-h1", "zb-auto", "zb-v"};
  if (!schedules.count(p.schedule)) {
    throw ConfigError("parallel.schedule ('" + p.schedule +
                      "') must be gpipe, 1f1b, interleaved, zb-h1, zb-auto or zb-v");
  }
  if (p.zb_max_in_flight != 0 && p.schedule != "zb-auto" && p.schedule != "zb-v") {
    throw ConfigError("parallel.zb_max_in_flight (" + std::to_string(p.zb_max_in_flight) +
                      ") goes with parallel.schedule 'zb-auto' or 'zb-v' (got '" + p.schedule +
                      "')");
  }
  if (p.pp > c.model.n_layer) {
    throw ConfigError("parallel.pp (" + std::to_string(p.pp) + ") must not exceed model.n_layer (" +
                      std::to_string(c.model.n_layer) + ")");
  }
  if (!p.stage_layers.empty()) {
    pipeline::check_stage_layers(p.stage_layers, static_cast<int64_t>(p.pp) * p.vpp,
                                 c.model.n_layer);
  } else if (p.stage_layers_auto) {
    if (c.model.n_layer < static_cast<int64_t>(p.pp) * p.vpp) {
      throw ConfigError("parallel.stage_layers auto: model.n_layer (" +
                        std::to_string(c.model.n_layer) +
                        ") must be at least parallel.pp * parallel.vpp (" +
                        std::to_string(p.pp * p.vpp) + "), a layer per stage");
    }
  } else if (c.model.n_layer % (static_cast<int64_t>(p.pp) * p.vpp) != 0) {
    throw ConfigError("model.n_layer (" + std::to_string(c.model.n_layer) +
                      ") must be divisible by parallel.pp * parallel.vpp (" + std::to_string(p.pp) +
                      " * " + std::to_string(p.vpp) + " = " + std::to_string(p.pp * p.vpp) +
                      "), or parallel.stage_layers must say how to split it (auto, or a list of "
                      "layers per stage)");
  }
  if (p.schedule == "zb-v") {
    if (p.vpp != 2) {
      throw ConfigError(
          "parallel.schedule 'zb-v' places two chunks on every rank in a V: "
          "parallel.vpp must be 2 (got " +
          std::to_string(p.vpp) + ")");
    }
  } else if (p.schedule == "interleaved" && p.vpp < 2) {
    throw ConfigError(
        "parallel.schedule 'interleaved' runs several model chunks on each rank: "
        "parallel.vpp must be at least 2 (got " +
        std::to_string(p.vpp) + ")");
  } else if (p.vpp > 1 && p.schedule != "interleaved") {
    throw ConfigError("parallel.vpp (" + std::to_string(p.vpp) +
                      ") > 1 goes with parallel.schedule 'interleaved' or 'zb-v' (got '" +
                      p.schedule + "')");
  }
  if (p.pp == 1 && p.schedule != "1f1b") {
    throw ConfigError("parallel.schedule ('" + p.schedule + "') needs parallel.pp > 1");
  }
  if (p.dp > 0) {
    check_batch(c, p.dp);
  }
}

}  // namespace

void check_batch(const Config& c, int dp) {
  const auto& t = c.train;
  for (int64_t G : t.batch_ramp().sizes()) {
    const bool target = G == t.global_batch_size;
    const std::string name = target ? "train.global_batch_size" : "the ramped global batch";
    if (G % (static_cast<int64_t>(t.micro_batch_size) * dp) != 0) {
      throw ConfigError(name + (target ? " (" + std::to_string(G) + ")" : " " + std::to_string(G)) +
                        " must be divisible by train.micro_batch_size * parallel.dp (" +
                        std::to_string(t.micro_batch_size) + " * " + std::to_string(dp) + " = " +
                        std::to_string(t.micro_batch_size * dp) + ")");
    }
  }
}

int64_t steps_for_epochs(const TrainSection& train, int64_t sequences) {
  if (sequences <= 0) {
    throw ValueError("steps_for_epochs: " + std::to_string(sequences) + " training sequences");
  }
  const double passes = std::ceil(train.epochs * static_cast<double>(sequences) - 1e-9);
  if (!(passes < 0x1p62)) {  // (1e300 is finite; no int64 holds its sequences)
    std::ostringstream e;
    e << "train.epochs (" << train.epochs << ") over " << sequences
      << " training sequences is more sequences than a run counts";
    throw ConfigError(e.str());
  }
  const auto wanted = static_cast<int64_t>(passes);
  const BatchSizeRamp ramp = train.batch_ramp();
  int64_t steps = 0, consumed = 0;
  // Through the ramp step by step, then the target-sized rest at once.
  while (consumed < wanted && ramp.ramps() && consumed < ramp.samples()) {
    consumed += ramp.at(consumed);
    ++steps;
  }
  if (consumed < wanted) steps += (wanted - consumed + ramp.target() - 1) / ramp.target();
  return std::max<int64_t>(steps, 1);
}

void resolve_epochs(Config& config, int64_t sequences) {
  if (config.train.epochs <= 0) return;
  config.train.steps = steps_for_epochs(config.train, sequences);
  validate(config, /*min_lr_given=*/false);
}

bool CheckpointSection::resumes() const {
  return resume == "auto" ? !dir.empty() : resume != "never";
}

std::string CheckpointSection::resume_path() const {
  return resume.find('/') == std::string::npos ? dir + "/" + resume : resume;
}

bool TrainSection::skips_step(int64_t step) const {
  for (const auto& [first, last] : skip_steps)
    if (step >= first && step <= last) return true;
  return false;
}

BatchSizeRamp TrainSection::batch_ramp() const {
  if (rampup_batch_size.empty()) return BatchSizeRamp(global_batch_size);
  return BatchSizeRamp(rampup_batch_size[0], rampup_batch_size[1], rampup_batch_size[2],
                       global_batch_size);
}

optim::WeightDecayScheduleOptions TrainSection::weight_decay_schedule_options() const {
  optim::WeightDecayScheduleOptions o;
  o.shape = optim::weight_decay_shape_from_string(weight_decay_schedule);
  o.end = weight_decay;
  o.start = weight_decay_start.value_or(weight_decay);
  o.steps = weight_decay_steps > 0 ? weight_decay_steps : steps;
  return o;
}

optim::LrScheduleOptions TrainSection::lr_schedule() const {
  optim::LrScheduleOptions o;
  o.lr = lr;
  o.min_lr = min_lr;
  o.warmup_steps = warmup_steps;
  o.warmup_init = warmup_init;
  o.decay_steps = lr_decay_steps > 0 ? lr_decay_steps : steps;
  o.decay = optim::lr_decay_from_string(lr_decay);
  if (o.decay == optim::LrDecay::Wsd) {
    o.cooldown_steps = cooldown_steps > 0
                           ? cooldown_steps
                           : std::max<int64_t>(1, (o.decay_steps - warmup_steps) / 5);
    o.cooldown_shape = optim::cooldown_shape_from_string(cooldown_shape);
  }
  return o;
}

namespace {

// Every leaf of a YAML tree as "a.b.c" -> its text (sequences in flow style).
void flatten(const YAML::Node& node, const std::string& key,
             std::map<std::string, std::string>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string name = key_name(kv.first, key);
      flatten(kv.second, key.empty() ? name : key + "." + name, out);
    }
  } else if (node.IsSequence()) {
    YAML::Emitter e;
    e << YAML::Flow << node;
    out[key] = e.c_str();
  } else if (node.IsScalar()) {
    // Floats in their shortest round-trip form (to_yaml writes 17 digits).
    const std::string& s = node.Scalar();
    double d = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
    if (ec == std::errc() && end == s.data() + s.size() &&
        s.find_first_of(".eE") != std::string::npos) {
      char buf[32];
      const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::general);
      out[key] = std::string(buf, r.ptr);
    } else {
      out[key] = s;
    }
  } else {
    out[key] = "~";
  }
}

std::map<std::string, std::string> flat_yaml(const std::string& text, const std::string& source) {
  std::map<std::string, std::string> out;
  try {
    flatten(YAML::Load(text), "", out);
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + ": not valid YAML: " + e.what());
  }
  return out;
}

}  // namespace

std::vector<std::string> config_changes(const std::string& before, const std::string& after,
                                        const std::string& before_source) {
  const auto a = flat_yaml(before, before_source);
  const auto b = flat_yaml(after, "this run's config");
  std::set<std::string> keys;
  for (const auto& [k, v] : a) keys.insert(k);
  for (const auto& [k, v] : b) keys.insert(k);
  std::vector<std::string> changes;
  for (const std::string& k : keys) {
    const auto x = a.find(k), y = b.find(k);
    const std::string old_value = x == a.end() ? "(unset)" : x->second;
    const std::string new_value = y == b.end() ? "(unset)" : y->second;
    if (old_value != new_value) changes.push_back(k + ": " + old_value + " -> " + new_value);
  }
  return changes;
}

DType TrainSection::param_dtype() const {
  if (precision == "bf16") return DType::BF16;
  if (precision == "fp16") return DType::F16;
  return DType::F32;
}

DType TrainSection::moment_dtype() const {
  return moment_precision == "bf16" ? DType::BF16 : DType::F32;
}

DType TrainSection::grad_dtype() const {
  return grad_precision == "bf16" ? DType::BF16 : DType::F32;
}

DType TrainSection::muon_ns_dtype() const {
  if (!muon_ns_precision.empty()) return muon_ns_precision == "bf16" ? DType::BF16 : DType::F32;
  return precision == "fp32" ? DType::F32 : DType::BF16;
}

namespace {
// A config text's YAML with --set's `overrides` applied.
YAML::Node config_root(const std::string& yaml_text, const std::vector<std::string>& overrides,
                       const std::string& source) {
  YAML::Node root = io::load_yaml(yaml_text, source);
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) throw ConfigError(source + ": the top level must be a mapping of sections");
  for (const auto& o : overrides) apply_override(root, o);
  return root;
}
}  // namespace

Config parse_config(const std::string& yaml_text, const std::vector<std::string>& overrides,
                    const std::string& source) {
  const YAML::Node root = config_root(yaml_text, overrides, source);

  Config c;
  bool min_lr_given = false, vpp_given = false;
  // parallel.stage_layers {first, last}: those stages' layers (-1: not
  // given), the others' worked out once pp and vpp are known.
  int64_t first_stage = -1, last_stage = -1;
  auto& m = c.model;
  auto& t = c.train;
  // model.hf_config (a Hugging Face config.json or its directory) sets the
  // whole model first; the other keys, applied after it, override it, and
  // the shape keys are required only without it.
  const bool shape = !(root["model"] && root["model"].IsMap() && root["model"]["hf_config"]);
  const Section model{
      {"hf_config",
       {false,
        [&](auto& v, auto& k) {
          const std::string path = get_string(v, k);
          try {
            m = io::load_hf_config(path);
          } catch (const Error& e) {
            throw ConfigError(k + ": " + e.what());
          }
        }}},
      {"n_layer", {shape, [&](auto& v, auto& k) { m.n_layer = get_int(v, k); }}},
      {"n_head", {shape, [&](auto& v, auto& k) { m.n_head = get_int(v, k); }}},
      {"n_kv_head", {false, [&](auto& v, auto& k) { m.n_kv_head = get_int(v, k); }}},
      {"head_dim", {false, [&](auto& v, auto& k) { m.head_size = get_int(v, k); }}},
      {"d_model", {shape, [&](auto& v, auto& k) { m.d_model = get_int(v, k); }}},
      {"vocab_size", {shape, [&](auto& v, auto& k) { m.vocab_size = get_int(v, k); }}},
      {"seq_len", {shape, [&](auto& v, auto& k) { m.seq_len = get_int(v, k); }}},
      {"dropout", {false, [&](auto& v, auto& k) { m.dropout = get_double(v, k); }}},
      {"norm_eps", {false, [&](auto& v, auto& k) { m.layer_norm_eps = get_double(v, k); }}},
      {"recompute",
       {false,
        [&](auto& v, auto& k) { m.recompute = nn::recompute_from_string(get_string(v, k)); }}},
      {"recompute_layers", {false, [&](auto& v, auto& k) { m.recompute_layers = get_int(v, k); }}},
      {"normalization",
       {false,
        [&](auto& v, auto& k) {
          m.normalization = nn::normalization_from_string(get_string(v, k));
        }}},
      {"linear_bias", {false, [&](auto& v, auto& k) { m.linear_bias = get_bool(v, k); }}},
      {"qkv_bias", {false, [&](auto& v, auto& k) { m.qkv_bias = get_bool(v, k); }}},
      {"qk_norm",
       {false,
        [&](auto& v, auto& k) {
          // true/false in any of YAML's spellings, or head / full /
          // head_layernorm.
          const char* expected = ": expected true (or head), full, head_layernorm or false, got '";
          if (v.IsScalar() &&
              (v.Scalar() == "full" || v.Scalar() == "head" || v.Scalar() == "head_layernorm")) {
            nn::set_qk_norm(m, v.Scalar());
          } else if (v.IsScalar()) {
            bool on = false;
            if (!YAML::convert<bool>::decode(v, on))
              throw ConfigError(k + expected + scalar_text(v) + "'");
            nn::set_qk_norm(m, on ? "true" : "false");
          } else {
            throw ConfigError(k + expected + scalar_text(v) + "'");
          }
        }}},
      {"pre_norms", {false, [&](auto& v, auto& k) { m.pre_norms = get_bool(v, k); }}},
      {"tie_embeddings", {false, [&](auto& v, auto& k) { m.tie_embeddings = get_bool(v, k); }}},
      {"embedding_multiplier",
       {false, [&](auto& v, auto& k) { m.embedding_multiplier = get_double(v, k); }}},
      {"norm_weight_offset",
       {false, [&](auto& v, auto& k) { m.norm_weight_offset = get_bool(v, k); }}},
      {"init_std", {false, [&](auto& v, auto& k) { m.init_std = get_double(v, k); }}},
      {"norm_affine", {false, [&](auto& v, auto& k) { m.norm_affine = get_bool(v, k); }}},
      {"norm_bias", {false, [&](auto& v, auto& k) { m.norm_bias = get_bool(v, k); }}},
      {"clip_qkv", {false, [&](auto& v, auto& k) { m.clip_qkv = get_double(v, k); }}},
      {"mtp_layers", {false, [&](auto& v, auto& k) { m.mtp_layers = get_int(v, k); }}},
      {"mtp_loss_weight", {false, [&](auto& v, auto& k) { m.mtp_loss_weight = get_double(v, k); }}},
      {"z_loss_coef", {false, [&](auto& v, auto& k) { m.z_loss_coef = get_double(v, k); }}},
      {"residual_multiplier",
       {false, [&](auto& v, auto& k) { m.residual_multiplier = get_double(v, k); }}},
      {"logit_scale", {false, [&](auto& v, auto& k) { m.logit_scale = get_double(v, k); }}},
      {"post_norms", {false, [&](auto& v, auto& k) { m.post_norms = get_bool(v, k); }}},
      {"parallel_residual",
       {false, [&](auto& v, auto& k) { m.parallel_residual = get_bool(v, k); }}},
      {"shared_norm", {false, [&](auto& v, auto& k) { m.shared_norm = get_bool(v, k); }}},
      {"mlp_bias", {false, [&](auto& v, auto& k) { m.mlp_bias = get_bool(v, k); }}},
      {"head_bias", {false, [&](auto& v, auto& k) { m.head_bias = get_bool(v, k); }}},
      {"activation",
       {false,
        [&](auto& v, auto& k) { m.activation = nn::activation_from_string(get_string(v, k)); }}},
      {"ffn_hidden_size", {false, [&](auto& v, auto& k) { m.ffn_hidden_size = get_int(v, k); }}},
      {"position_embedding",
       {false,
        [&](auto& v, auto& k) {
          m.position_embedding = nn::position_embedding_from_string(get_string(v, k));
        }}},
      {"rope_theta", {false, [&](auto& v, auto& k) { m.rope_theta = get_double(v, k); }}},
      {"rope_scaling", {false, [&](auto& v, auto& k) { m.rope_scaling = get_rope_scaling(v, k); }}},
      {"moe", {false, [&](auto& v, auto& k) { m.moe = get_moe(v, k, m.moe); }}},
      {"mla", {false, [&](auto& v, auto& k) { m.mla = get_mla(v, k); }}},
      {"lora", {false, [&](auto& v, auto& k) { m.lora = get_lora(v, k, m); }}},
      {"rope_local_theta",
       {false, [&](auto& v, auto& k) { m.rope_local_theta = get_double(v, k); }}},
      {"rope_dim", {false, [&](auto& v, auto& k) { m.rope_dim = get_int(v, k); }}},
      {"hf_type",
       {false,
        [&](auto& v, auto& k) {
          const std::string type = get_string(v, k);
          m.hf_type = type == "auto" ? "" : io::hf_model_type_named(type);
        }}},
      {"query_pre_attn_scalar",
       {false, [&](auto& v, auto& k) { m.query_pre_attn_scalar = get_double(v, k); }}},
      {"attn_logit_softcap",
       {false, [&](auto& v, auto& k) { m.attn_logit_softcap = get_double(v, k); }}},
      {"final_logit_softcap",
       {false, [&](auto& v, auto& k) { m.final_logit_softcap = get_double(v, k); }}},
      {"sliding_window", {false, [&](auto& v, auto& k) { m.sliding_window = get_int(v, k); }}},
      {"full_attention_layers",
       {false, [&](auto& v, auto& k) { m.full_attention_layers = get_layer_list(v, k); }}},
      {"nope_layers", {false, [&](auto& v, auto& k) { m.nope_layers = get_layer_list(v, k); }}},
      {"attention_kernel",
       {false,
        [&](auto& v, auto& k) {
          c.attention_kernel = get_string(v, k);
          try {
            cuda::attention_kernel_from_string(c.attention_kernel);
          } catch (const ConfigError&) {
            throw ConfigError(k + " '" + c.attention_kernel +
                              "' must be one of auto, simt, tensor_core, cudnn");
          }
        }}},
      {"attention_deterministic",
       {false, [&](auto& v, auto& k) { c.attention_deterministic = get_bool(v, k); }}},
  };
  const Section train{
      {"steps", {false, [&](auto& v, auto& k) { t.steps = get_int(v, k); }}},
      {"epochs",
       {false,
        [&](auto& v, auto& k) {
          t.epochs = get_double(v, k);
          if (!(t.epochs > 0) || !std::isfinite(t.epochs)) {
            std::ostringstream os;
            os << k << " (" << t.epochs << ") must be a positive number of passes over data.train";
            throw ConfigError(os.str());
          }
        }}},
      {"global_batch_size", {true, [&](auto& v, auto& k) { t.global_batch_size = get_int(v, k); }}},
      {"micro_batch_size", {true, [&](auto& v, auto& k) { t.micro_batch_size = get_int(v, k); }}},
      {"rampup_batch_size",
       {false,
        [&](auto& v, auto& k) {
          if (!v.IsSequence() || v.size() != 3) {
            throw ConfigError(k + ": expected [start, increment, samples], e.g. [32, 32, 2000000]");
          }
          t.rampup_batch_size.clear();
          for (size_t i = 0; i < 3; ++i)
            t.rampup_batch_size.push_back(get_int(v[i], k + "[" + std::to_string(i) + "]"));
        }}},
      {"freeze", {false, [&](auto& v, auto& k) { t.freeze = get_patterns(v, k); }}},
      {"no_weight_decay",
       {false, [&](auto& v, auto& k) { t.no_weight_decay = get_patterns(v, k); }}},
      {"lr_scale",
       {false,
        [&](auto& v, auto& k) {
          if (!v.IsMap()) {
            throw ConfigError(k +
                              ": expected a mapping of parameter patterns to factors, e.g. "
                              "{wte.weight: 0.5, \"h.*.mlp.*\": 2}");
          }
          t.lr_scale.clear();
          for (auto it = v.begin(); it != v.end(); ++it) {
            const std::string pattern = key_name(it->first, k);
            t.lr_scale.emplace_back(pattern, get_double(it->second, k + "['" + pattern + "']"));
          }
        }}},
      {"lr", {false, [&](auto& v, auto& k) { t.lr = get_double(v, k); }}},
      {"min_lr",
       {false,
        [&](auto& v, auto& k) {
          t.min_lr = get_double(v, k);
          min_lr_given = true;
        }}},
      {"warmup_steps", {false, [&](auto& v, auto& k) { t.warmup_steps = get_int(v, k); }}},
      {"warmup_init", {false, [&](auto& v, auto& k) { t.warmup_init = get_double(v, k); }}},
      {"lr_decay",
       {false,
        [&](auto& v, auto& k) {
          t.lr_decay = get_string(v, k);
          try {
            optim::lr_decay_from_string(t.lr_decay);
          } catch (const ValueError&) {
            throw ConfigError(k + " ('" + t.lr_decay +
                              "') must be cosine, linear, constant, wsd or inverse_sqrt");
          }
        }}},
      {"lr_decay_steps", {false, [&](auto& v, auto& k) { t.lr_decay_steps = get_int(v, k); }}},
      {"cooldown_steps", {false, [&](auto& v, auto& k) { t.cooldown_steps = get_int(v, k); }}},
      {"cooldown_shape",
       {false,
        [&](auto& v, auto& k) {
          t.cooldown_shape = get_string(v, k);
          try {
            optim::cooldown_shape_from_string(t.cooldown_shape);
          } catch (const ValueError&) {
            throw ConfigError(k + " ('" + t.cooldown_shape + "') must be linear, cosine or 1-sqrt");
          }
        }}},
      {"weight_decay", {false, [&](auto& v, auto& k) { t.weight_decay = get_double(v, k); }}},
      {"weight_decay_schedule",
       {false,
        [&](auto& v, auto& k) {
          t.weight_decay_schedule = get_string(v, k);
          try {
            optim::weight_decay_shape_from_string(t.weight_decay_schedule);
          } catch (const ValueError&) {
            throw ConfigError(k + " ('" + t.weight_decay_schedule +
                              "') must be constant, linear or cosine");
          }
        }}},
      {"weight_decay_start",
       {false, [&](auto& v, auto& k) { t.weight_decay_start = get_double(v, k); }}},
      {"weight_decay_steps",
       {false, [&](auto& v, auto& k) { t.weight_decay_steps = get_int(v, k); }}},
      {"beta1", {false, [&](auto& v, auto& k) { t.beta1 = get_double(v, k); }}},
      {"beta2", {false, [&](auto& v, auto& k) { t.beta2 = get_double(v, k); }}},
      {"eps", {false, [&](auto& v, auto& k) { t.eps = get_double(v, k); }}},
      {"grad_clip", {false, [&](auto& v, auto& k) { t.grad_clip = get_double(v, k); }}},
      {"optimizer",
       {false,
        [&](auto& v, auto& k) {
          t.optimizer = get_string(v, k);
          if (t.optimizer != "adamw" && t.optimizer != "muon")
            throw ConfigError(k + " '" + t.optimizer + "' must be adamw or muon");
        }}},
      {"muon_momentum", {false, [&](auto& v, auto& k) { t.muon_momentum = get_double(v, k); }}},
      {"muon_nesterov", {false, [&](auto& v, auto& k) { t.muon_nesterov = get_bool(v, k); }}},
      {"muon_ns_steps", {false, [&](auto& v, auto& k) { t.muon_ns_steps = get_int(v, k); }}},
      {"muon_scale",
       {false,
        [&](auto& v, auto& k) {
          t.muon_scale = get_string(v, k);
          if (t.muon_scale != "adamw_rms" && t.muon_scale != "spectral")
            throw ConfigError(k + " '" + t.muon_scale + "' must be adamw_rms or spectral");
        }}},
      {"muon_lr", {false, [&](auto& v, auto& k) { t.muon_lr = get_double(v, k); }}},
      {"muon_ns_precision",
       {false, [&](auto& v, auto& k) { t.muon_ns_precision = get_fp32_or_bf16(v, k); }}},
      {"ema_decay",
       {false,
        [&](auto& v, auto& k) {
          t.ema_decay = get_double(v, k);
          if (!(t.ema_decay >= 0 && t.ema_decay < 1)) {
            throw ConfigError(k + " (" + std::to_string(t.ema_decay) +
                              ") must be in [0, 1): 0 keeps no average, 0.999 averages over "
                              "about the last 1000 steps");
          }
        }}},
      {"ema_device",
       {false,
        [&](auto& v, auto& k) {
          t.ema_device = get_string(v, k);
          if (t.ema_device != "device" && t.ema_device != "cpu")
            throw ConfigError(k + " '" + t.ema_device + "' must be device or cpu");
        }}},
      {"exit_after_minutes",
       {false,
        [&](auto& v, auto& k) {
          t.exit_after_minutes = get_double(v, k);
          if (!(t.exit_after_minutes >= 0) || !std::isfinite(t.exit_after_minutes))
            throw ConfigError(k + " (" + scalar_text(v) + ") must be a number of minutes >= 0");
        }}},
      {"max_skipped_steps",
       {false,
        [&](auto& v, auto& k) {
          t.max_skipped_steps = get_int(v, k);
          if (t.max_skipped_steps < 0)
            throw ConfigError(k + " (" + scalar_text(v) + ") must be >= 0");
        }}},
      {"skip_steps",
       {false,
        [&](auto& v, auto& k) {
          if (!v.IsSequence())
            throw ConfigError(k + ": expected a list of steps and ranges of steps (\"A-B\")");
          t.skip_steps.clear();
          for (size_t i = 0; i < v.size(); ++i) {
            const std::string at = k + "[" + std::to_string(i) + "]";
            const std::string text = scalar_text(v[i]);
            int64_t first = 0, last = 0;
            const size_t dash = text.find('-', 1);
            if (dash == std::string::npos) {
              first = last = get_int(v[i], at);
            } else {
              try {
                size_t used_first = 0, used_last = 0;
                first = std::stoll(text.substr(0, dash), &used_first);
                last = std::stoll(text.substr(dash + 1), &used_last);
                if (used_first != dash || used_last != text.size() - dash - 1)
                  throw std::invalid_argument(text);
              } catch (const std::logic_error&) {
                throw ConfigError(at + ": expected a step or a range of steps \"A-B\", got '" +
                                  text + "'");
              }
            }
            if (first < 1 || last < first) {
              throw ConfigError(at + " ('" + text +
                                "') must be a step >= 1, or a range A-B of steps with 1 <= A <= B");
            }
            t.skip_steps.emplace_back(first, last);
          }
        }}},
      {"spike_sigma",
       {false,
        [&](auto& v, auto& k) {
          t.spike_sigma = get_double(v, k);
          if (!(t.spike_sigma >= 0) || !std::isfinite(t.spike_sigma)) {
            throw ConfigError(k + " (" + scalar_text(v) +
                              ") must be a number of standard deviations > 0, or 0 for none");
          }
        }}},
      {"spike_window",
       {false,
        [&](auto& v, auto& k) {
          t.spike_window = get_int(v, k);
          if (t.spike_window < 2)
            throw ConfigError(k + " (" + scalar_text(v) + ") must be at least 2 steps");
        }}},
      {"precision",
       {false,
        [&](auto& v, auto& k) {
          t.precision = get_string(v, k);
          if (t.precision != "fp32" && t.precision != "bf16" && t.precision != "fp16") {
            throw ConfigError(k + " '" + t.precision + "' must be one of fp32, bf16, fp16");
          }
        }}},
      {"grad_precision",
       {false, [&](auto& v, auto& k) { t.grad_precision = get_fp32_or_bf16(v, k); }}},
      {"moment_precision",
       {false, [&](auto& v, auto& k) { t.moment_precision = get_fp32_or_bf16(v, k); }}},
      {"cuda_graph", {false, [&](auto& v, auto& k) { t.cuda_graph = get_bool(v, k); }}},
      {"loss_average",
       {false,
        [&](auto& v, auto& k) {
          t.loss_average = get_string(v, k);
          if (t.loss_average != "microbatches" && t.loss_average != "tokens") {
            throw ConfigError(k + " '" + t.loss_average + "' must be microbatches or tokens");
          }
        }}},
      {"loss_scale_init",
       {false,
        [&](auto& v, auto& k) {
          t.loss_scale_init = get_double(v, k);
          if (!(t.loss_scale_init >= 1.0)) {
            throw ConfigError(k + " (" + std::to_string(t.loss_scale_init) + ") must be >= 1");
          }
        }}},
      {"loss_scale_window",
       {false,
        [&](auto& v, auto& k) {
          t.loss_scale_window = get_int(v, k);
          if (t.loss_scale_window <= 0) {
            throw ConfigError(k + " (" + std::to_string(t.loss_scale_window) +
                              ") must be positive");
          }
        }}},
      {"loss_scale_hysteresis",
       {false,
        [&](auto& v, auto& k) {
          t.loss_scale_hysteresis = get_int(v, k);
          if (t.loss_scale_hysteresis < 1) {
            throw ConfigError(k + " (" + std::to_string(t.loss_scale_hysteresis) +
                              ") must be >= 1 (1: every overflow backs the scale off)");
          }
        }}},
      {"loss_scale_min",
       {false,
        [&](auto& v, auto& k) {
          t.loss_scale_min = get_double(v, k);
          if (!(t.loss_scale_min > 0.0) || !std::isfinite(t.loss_scale_min)) {
            throw ConfigError(k + " (" + std::to_string(t.loss_scale_min) +
                              ") must be a positive number");
          }
        }}},
      {"seed",
       {false,
        [&](auto& v, auto& k) {
          const int64_t s = get_int(v, k);
          if (s < 0) throw ConfigError(k + " (" + std::to_string(s) + ") must be >= 0");
          t.seed = static_cast<uint64_t>(s);
        }}},
  };
  const Section data{
      {"train", {true, [&](auto& v, auto& k) { c.data_train = get_data_parts(v, k); }}},
      {"val",
       {false,
        [&](auto& v, auto& k) {
          c.data_val = get_named_paths<Config::ValidationSet>(
              v, k, "a path or glob", "{web: data/web_val, code: data/code_val}");
        }}},
      {"val_split",
       {false,
        [&](auto& v, auto& k) {
          c.data_val_split = get_double(v, k);
          require(c.data_val_split >= 0 && c.data_val_split < 1, k, c.data_val_split,
                  "must be in [0, 1): the share of each data.train part held out as validation "
                  "data (0: none)");
        }}},
      {"shuffle", {false, [&](auto& v, auto& k) { c.data_shuffle = get_bool(v, k); }}},
      {"eod_token", {false, [&](auto& v, auto& k) { c.model.eod_token = get_int(v, k); }}},
      {"reset_attention_mask",
       {false, [&](auto& v, auto& k) { c.model.reset_attention_mask = get_bool(v, k); }}},
      {"reset_position_ids",
       {false, [&](auto& v, auto& k) { c.model.reset_position_ids = get_bool(v, k); }}},
      {"eod_mask_loss", {false, [&](auto& v, auto& k) { c.data_eod_mask_loss = get_bool(v, k); }}},
      {"packing",
       {false,
        [&](auto& v, auto& k) {
          c.data_packing = get_string(v, k);
          if (c.data_packing != "stream" && c.data_packing != "documents" &&
              c.data_packing != "best_fit") {
            throw ConfigError(k + " '" + c.data_packing +
                              "' must be stream (sequences cut from the token stream), "
                              "documents (rows of whole documents in order, padded) or best_fit "
                              "(rows of whole documents fitted together, padded)");
          }
        }}},
      {"long_documents",
       {false,
        [&](auto& v, auto& k) {
          c.data_long_documents = get_string(v, k);
          try {
            data::long_documents_from_string(c.data_long_documents);
          } catch (const ValueError&) {
            throw ConfigError(k + " '" + c.data_long_documents +
                              "' must be split (rows of its own), truncate "
                              "(its first row) or drop");
          }
        }}},
      {"fim_rate", {false, [&](auto& v, auto& k) { c.data_fim_rate = get_double(v, k); }}},
      {"fim_spm_rate", {false, [&](auto& v, auto& k) { c.data_fim_spm_rate = get_double(v, k); }}},
      {"fim_tokens",
       {false, [&](auto& v, auto& k) {
          if (!v.IsSequence()) {
            throw ConfigError(k + ": expected the [prefix, middle, suffix] sentinel token ids");
          }
          c.data_fim_tokens.clear();
          for (size_t i = 0; i < v.size(); ++i)
            c.data_fim_tokens.push_back(get_int(v[i], k + "[" + std::to_string(i) + "]"));
        }}}};
  auto non_negative = [](const YAML::Node& v, const std::string& k) {
    const int64_t x = get_int(v, k);
    if (x < 0) throw ConfigError(k + " (" + std::to_string(x) + ") must be >= 0");
    return x;
  };
  const Section eval{
      {"interval", {false, [&](auto& v, auto& k) { c.eval.interval = non_negative(v, k); }}},
      {"batches", {false, [&](auto& v, auto& k) { c.eval.batches = non_negative(v, k); }}},
      {"at_start", {false, [&](auto& v, auto& k) { c.eval.at_start = get_bool(v, k); }}},
      {"early_stop_patience",
       {false, [&](auto& v, auto& k) { c.eval.early_stop_patience = non_negative(v, k); }}},
      {"early_stop_delta",
       {false,
        [&](auto& v, auto& k) {
          c.eval.early_stop_delta = get_double(v, k);
          if (!(c.eval.early_stop_delta >= 0) || !std::isfinite(c.eval.early_stop_delta))
            throw ConfigError(k + " (" + scalar_text(v) + ") must be a loss difference >= 0");
        }}},
      {"choices",
       {false,
        [&](auto& v, auto& k) {
          c.eval.choices = get_named_paths<EvalSection::ChoiceSet>(
              v, k, "a path", "{hellaswag: hellaswag_val.jsonl, arc: arc_easy.jsonl}");
        }}},
      {"choices_limit",
       {false, [&](auto& v, auto& k) { c.eval.choices_limit = non_negative(v, k); }}},
      {"choices_fewshot",
       {false, [&](auto& v, auto& k) { c.eval.choices_fewshot = non_negative(v, k); }}},
      {"choices_fewshot_seed",
       {false, [&](auto& v, auto& k) { c.eval.choices_fewshot_seed = non_negative(v, k); }}},
      {"hellaswag_prompt",
       {false,
        [&](auto& v, auto& k) {
          c.eval.hellaswag_prompt = get_string(v, k);
          if (c.eval.hellaswag_prompt != "llmc" && c.eval.hellaswag_prompt != "harness") {
            throw ConfigError(k + " ('" + c.eval.hellaswag_prompt +
                              "') must be llmc (HellaSwag's lines as they stand) or harness "
                              "(lm-evaluation-harness's prompt)");
          }
        }}},
      {"lambada",
       {false,
        [&](auto& v, auto& k) {
          c.eval.lambada = get_named_paths<EvalSection::LambadaSet>(
              v, k, "a path", "{lambada: lambada_test.jsonl, lambada_de: lambada_test_de.jsonl}");
        }}},
      {"lambada_limit",
       {false, [&](auto& v, auto& k) { c.eval.lambada_limit = non_negative(v, k); }}},
      {"samples",
       {false,
        [&](auto& v, auto& k) {
          c.eval.samples.clear();
          if (v.IsScalar()) {
            c.eval.samples.push_back(get_string(v, k));
          } else if (v.IsSequence()) {
            for (size_t i = 0; i < v.size(); ++i)
              c.eval.samples.push_back(get_string(v[i], k + "[" + std::to_string(i) + "]"));
          } else {
            throw ConfigError(k +
                              ": expected a prompt or a list of prompts, e.g. "
                              "[\"Once upon a time\", \"The capital of France is\"]");
          }
          for (size_t i = 0; i < c.eval.samples.size(); ++i) {
            if (c.eval.samples[i].empty()) {
              throw ConfigError(k + "[" + std::to_string(i) +
                                "] is empty: a prompt needs text to continue");
            }
          }
        }}},
      {"sample_tokens",
       {false,
        [&](auto& v, auto& k) {
          c.eval.sample_tokens = get_int(v, k);
          if (c.eval.sample_tokens < 1)
            throw ConfigError(k + " (" + std::to_string(c.eval.sample_tokens) + ") must be >= 1");
        }}},
      {"sample_temperature",
       {false,
        [&](auto& v, auto& k) {
          c.eval.sample_temperature = get_double(v, k);
          if (!(c.eval.sample_temperature >= 0) || !std::isfinite(c.eval.sample_temperature)) {
            throw ConfigError(k + " (" + scalar_text(v) + ") must be >= 0 (0: greedy)");
          }
        }}},
      {"sample_top_k",
       {false, [&](auto& v, auto& k) { c.eval.sample_top_k = non_negative(v, k); }}},
      {"tokenizer", {false, [&](auto& v, auto& k) { c.eval.tokenizer = get_string(v, k); }}},
      {"vocab", {false, [&](auto& v, auto& k) { c.eval.vocab = get_string(v, k); }}},
      {"merges", {false, [&](auto& v, auto& k) { c.eval.merges = get_string(v, k); }}},
      {"bos_token", {false, [&](auto& v, auto& k) { c.eval.bos_token = get_string(v, k); }}},
  };
  const Section init{
      {"from", {false, [&](auto& v, auto& k) { c.init_from = get_string(v, k); }}},
      {"adapter", {false, [&](auto& v, auto& k) { c.init_adapter = get_string(v, k); }}}};
  const Section output{
      {"dir", {false, [&](auto& v, auto& k) { c.output_dir = get_string(v, k); }}}};
  // log.grad_norms and log.param_norms: how their norms are grouped.
  auto norm_grouping = [](const YAML::Node& v, const std::string& k) {
    std::string by = get_string(v, k);
    if (by != "none" && by != "layers" && by != "parameters")
      throw ConfigError(k + " ('" + by + "') must be none, layers or parameters");
    return by;
  };
  // log.trace_steps and log.profile_steps: [first, last], steps as logged
  // (`none_too`: or none, {-1, -1}).
  auto step_window = [](const YAML::Node& v, const std::string& k, bool none_too) {
    if (none_too && v.IsScalar() && v.Scalar() == "none")
      return std::pair<int64_t, int64_t>{-1, -1};
    std::vector<int64_t> range;
    if (v.IsSequence()) {
      for (const auto& item : v) range.push_back(get_int(item, k));
    }
    if (range.size() != 2 || range[0] < 1 || range[1] < range[0]) {
      throw ConfigError(k + " (" + YAML::Dump(v) +
                        ") must be [first, last], steps numbered from 1 as logged with first <= "
                        "last" +
                        (none_too ? ", or none" : ""));
    }
    return std::pair<int64_t, int64_t>{range[0], range[1]};
  };
  const Section log{
      {"interval", {false, [&](auto& v, auto& k) { c.log_interval = get_int(v, k); }}},
      {"peak_tflops",
       {false,
        [&](auto& v, auto& k) {
          c.log_peak_tflops = get_double(v, k);
          if (!(c.log_peak_tflops >= 0))
            throw ConfigError(k + " (" + scalar_text(v) + ") must be >= 0");
        }}},
      {"tensorboard", {false, [&](auto& v, auto& k) { c.log_tensorboard = get_bool(v, k); }}},
      {"straggler_factor",
       {false,
        [&](auto& v, auto& k) {
          c.log_straggler_factor = get_double(v, k);
          if (!(c.log_straggler_factor == 0 || c.log_straggler_factor > 1)) {
            throw ConfigError(k + " (" + scalar_text(v) +
                              ") must be 0 (off) or more than 1: how many times its stage's "
                              "median compute a rank takes to be named a straggler");
          }
        }}},
      {"param_norm", {false, [&](auto& v, auto& k) { c.log_param_norm = get_bool(v, k); }}},
      {"moe_per_layer", {false, [&](auto& v, auto& k) { c.log_moe_per_layer = get_bool(v, k); }}},
      {"trace_steps",
       {false,
        [&](auto& v, auto& k) {
          std::tie(c.log_trace_first, c.log_trace_last) = step_window(v, k, /*none_too=*/true);
        }}},
      {"grad_norms", {false, [&](auto& v, auto& k) { c.log_grad_norms = norm_grouping(v, k); }}},
      {"param_norms", {false, [&](auto& v, auto& k) { c.log_param_norms = norm_grouping(v, k); }}},
      {"plan_cluster", {false, [&](auto& v, auto& k) { c.log_plan_cluster = get_string(v, k); }}},
      {"nvtx", {false, [&](auto& v, auto& k) { c.log_nvtx = get_bool(v, k); }}},
      {"profile_steps",
       {false,
        [&](auto& v, auto& k) {
          std::tie(c.log_profile_first, c.log_profile_last) = step_window(v, k, false);
        }}},
      {"profile_ranks",
       {false,
        [&](auto& v, auto& k) {
          if (!v.IsSequence() || v.size() == 0)
            throw ConfigError(k + " (" + YAML::Dump(v) + ") must be a list of world ranks");
          c.log_profile_ranks.clear();
          for (const auto& item : v) {
            const int64_t r = get_int(item, k);
            if (r < 0) throw ConfigError(k + ": rank " + std::to_string(r) + " must be >= 0");
            c.log_profile_ranks.push_back(r);
          }
        }}},
  };
  const Section checkpoint{
      {"dir", {false, [&](auto& v, auto& k) { c.checkpoint.dir = get_string(v, k); }}},
      {"interval",
       {false,
        [&](auto& v, auto& k) {
          c.checkpoint.interval = get_int(v, k);
          if (c.checkpoint.interval < 0)
            throw ConfigError(k + " (" + scalar_text(v) + ") must be >= 0");
        }}},
      {"keep_best", {false, [&](auto& v, auto& k) { c.checkpoint.keep_best = get_bool(v, k); }}},
      {"load_optimizer",
       {false, [&](auto& v, auto& k) { c.checkpoint.load_optimizer = get_bool(v, k); }}},
      {"save_optimizer",
       {false, [&](auto& v, auto& k) { c.checkpoint.save_optimizer = get_bool(v, k); }}},
      {"keep_every",
       {false,
        [&](auto& v, auto& k) {
          c.checkpoint.keep_every = get_int(v, k);
          if (c.checkpoint.keep_every < 0)
            throw ConfigError(k + " (" + scalar_text(v) + ") must be >= 0");
        }}},
      {"keep",
       {false,
        [&](auto& v, auto& k) {
          const int64_t n = get_int(v, k);
          if (n < 1) throw ConfigError(k + " (" + scalar_text(v) + ") must be >= 1");
          if (n > 1000000)
            throw ConfigError(k + " (" + scalar_text(v) + ") must be at most 1000000");
          c.checkpoint.keep = static_cast<int>(n);
        }}},
      {"resume",
       {false,
        [&](auto& v, auto& k) {
          c.checkpoint.resume = get_string(v, k);
          if (c.checkpoint.resume.empty()) {
            throw ConfigError(k +
                              " is empty: never, auto, or the checkpoint to resume (a "
                              "step_<N> of checkpoint.dir, or a path)");
          }
        }}},
      {"async", {false, [&](auto& v, auto& k) { c.checkpoint.async = get_bool(v, k); }}},
  };
  auto positive_int = [](const YAML::Node& v, const std::string& k, int min) {
    const int64_t x = get_int(v, k);
    if (x < min) {
      throw ConfigError(k + " (" + std::to_string(x) + ") must be >= " + std::to_string(min));
    }
    if (x > (1 << 20)) {
      throw ConfigError(k + " (" + std::to_string(x) + ") must be at most " +
                        std::to_string(1 << 20));
    }
    return static_cast<int>(x);
  };
  const Section parallel{
      {"tp", {false, [&](auto& v, auto& k) { c.parallel.tp = positive_int(v, k, 1); }}},
      {"pp", {false, [&](auto& v, auto& k) { c.parallel.pp = positive_int(v, k, 1); }}},
      {"vpp",
       {false,
        [&](auto& v, auto& k) {
          c.parallel.vpp = positive_int(v, k, 1);
          vpp_given = true;
        }}},
      {"dp", {false, [&](auto& v, auto& k) { c.parallel.dp = positive_int(v, k, 1); }}},
      {"ep", {false, [&](auto& v, auto& k) { c.parallel.ep = positive_int(v, k, 1); }}},
      {"cp", {false, [&](auto& v, auto& k) { c.parallel.cp = positive_int(v, k, 1); }}},
      {"cp_comm",
       {false,
        [&](auto& v, auto& k) {
          c.parallel.cp_comm = get_string(v, k);
          (void)cp::exchange_from_string(c.parallel.cp_comm, k);
        }}},
      {"cp_a2a", {false, [&](auto& v, auto& k) { c.parallel.cp_a2a = positive_int(v, k, 1); }}},
      {"sequence_parallel",
       {false, [&](auto& v, auto& k) { c.parallel.sequence_parallel = get_bool(v, k); }}},
      {"schedule", {false, [&](auto& v, auto& k) { c.parallel.schedule = get_string(v, k); }}},
      {"order", {false, [&](auto& v, auto& k) { c.parallel.order = get_string(v, k); }}},
      {"zb_max_in_flight",
       {false,
        [&](auto& v, auto& k) {
          const int64_t n = get_int(v, k);
          if (n < 0 || n > 1'000'000)
            throw ConfigError(k + " (" + std::to_string(n) +
                              ") must be >= 1, or 0 for parallel.pp");
          c.parallel.zb_max_in_flight = static_cast<int>(n);
        }}},
      {"topology",
       {false,
        [&](auto& v, auto& k) {
          c.parallel.topology = get_string(v, k);
          if (c.parallel.topology != "warn" && c.parallel.topology != "refuse") {
            throw ConfigError(k + " ('" + c.parallel.topology + "') must be warn or refuse");
          }
        }}},
      {"zero",
       {false,
        [&](auto& v, auto& k) {
          const int64_t z = get_int(v, k);
          if (z != 0 && z != 1)
            throw ConfigError(k + " (" + std::to_string(z) + ") must be 0 or 1");
          c.parallel.zero = static_cast<int>(z);
        }}},
      {"bucket_mb",
       {false,
        [&](auto& v, auto& k) {
          c.parallel.bucket_mb = get_double(v, k);
          if (!(c.parallel.bucket_mb > 0))
            throw ConfigError(k + " (" + scalar_text(v) + ") must be > 0");
        }}},
      {"overlap_param_gather",
       {false, [&](auto& v, auto& k) { c.parallel.overlap_param_gather = get_bool(v, k); }}},
      {"pipeline_scatter_gather",
       {false, [&](auto& v, auto& k) { c.parallel.pipeline_scatter_gather = get_bool(v, k); }}},
      {"timeout_s",
       {false,
        [&](auto& v, auto& k) {
          c.parallel.timeout_s = get_double(v, k);
          if (!(c.parallel.timeout_s > 0) || c.parallel.timeout_s > 7 * 24 * 3600.0)
            throw ConfigError(k + " (" + scalar_text(v) + ") must be > 0 and at most a week");
        }}},
      {"validate_collectives",
       {false, [&](auto& v, auto& k) { c.parallel.validate_collectives = get_bool(v, k); }}},
      {"check_replicas_interval",
       {false,
        [&](auto& v, auto& k) {
          c.parallel.check_replicas_interval = get_int(v, k);
          if (c.parallel.check_replicas_interval < 0)
            throw ConfigError(k + " (" + scalar_text(v) + ") must be >= 0 (0: never)");
        }}},
      {"stage_layers",
       {false,
        [&](auto& v, auto& k) {
          c.parallel.stage_layers.clear();
          first_stage = last_stage = -1;
          c.parallel.stage_layers_auto = v.IsScalar() && v.Scalar() == "auto";
          if (c.parallel.stage_layers_auto) return;
          if (v.IsMap()) {
            for (auto it = v.begin(); it != v.end(); ++it) {
              const std::string key = key_name(it->first, k);
              if (key != "first" && key != "last") {
                throw ConfigError(k + "." + key +
                                  ": unknown key (allowed: first, last: the first and the last "
                                  "stage's layers, the others sharing the rest evenly)");
              }
              const int64_t n = get_int(it->second, k + "." + key);
              if (n < 0) {
                throw ConfigError(k + "." + key + " (" + std::to_string(n) + ") must be >= 0");
              }
              (key == "first" ? first_stage : last_stage) = n;
            }
            if (first_stage < 0 && last_stage < 0) {
              throw ConfigError(k +
                                ": give first, last or both (the first and the last stage's "
                                "layers, the others sharing the rest evenly)");
            }
            return;
          }
          if (!v.IsSequence()) {
            throw ConfigError(k + " (" + scalar_text(v) +
                              "): expected auto, a list of layer counts, e.g. [3, 5], or "
                              "{first: N, last: M}");
          }
          for (size_t i = 0; i < v.size(); ++i) {
            c.parallel.stage_layers.push_back(get_int(v[i], k + "[" + std::to_string(i) + "]"));
          }
        }}},
  };
  const std::vector<std::pair<std::string, const Section*>> sections{
      {"model", &model},       {"train", &train},           {"data", &data},
      {"init", &init},         {"output", &output},         {"log", &log},
      {"parallel", &parallel}, {"checkpoint", &checkpoint}, {"eval", &eval}};

  const std::string allowed =
      "model, train, data, init, output, log, parallel, checkpoint, eval, device";
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = key_name(it->first, "");
    if (key == "device") {
      c.device = get_string(it->second, "device");
      continue;
    }
    bool known = false;
    for (const auto& [name, s] : sections) known = known || name == key;
    if (!known) throw ConfigError("unknown top-level key '" + key + "' (allowed: " + allowed + ")");
  }
  for (const auto& [name, s] : sections) {
    const YAML::Node node = root[name];
    const bool optional = name == "init" || name == "output" || name == "log" ||
                          name == "parallel" || name == "checkpoint" || name == "eval";
    if (!node || node.IsNull()) {
      if (!optional) throw ConfigError("missing required section '" + name + "'");
      continue;
    }
    apply_section(node, name, *s);
  }
  const YAML::Node train_node = root["train"];
  const bool steps_given = train_node && train_node.IsMap() && train_node["steps"];
  const bool epochs_given = train_node && train_node.IsMap() && train_node["epochs"];
  if (steps_given == epochs_given) {
    throw ConfigError(steps_given ? "give train.steps or train.epochs, not both"
                                  : "missing required key 'train.steps' (or 'train.epochs': "
                                    "passes over data.train)");
  }
  if (!min_lr_given) t.min_lr = 0.1 * t.lr;
  // ZB-V has two chunks per rank by definition: left out, vpp is 2.
  if (!vpp_given && c.parallel.schedule == "zb-v") c.parallel.vpp = 2;
  if (first_stage >= 0 || last_stage >= 0) {
    c.parallel.stage_layers = pipeline::stage_layers_around(
        c.model.n_layer, static_cast<int64_t>(c.parallel.pp) * c.parallel.vpp, first_stage,
        last_stage);
  }
  validate(c, min_lr_given);
  return c;
}

std::set<std::string> Config::frozen_parameters() const {
  if (model.lora.rank > 0) {  // every weight but the adapters
    std::set<std::string> frozen;
    for (const auto& [name, shape] : nn::gpt_parameter_shapes(model)) {
      if (!nn::is_lora_adapter(name)) frozen.insert(name);
    }
    return frozen;
  }
  return matching(train.freeze, "train.freeze");
}

std::set<std::string> Config::no_decay_parameters() const {
  return matching(train.no_weight_decay, "train.no_weight_decay");
}

data::FimOptions Config::fim_options() const {
  data::FimOptions o;
  if (data_fim_rate <= 0) return o;
  o.rate = data_fim_rate;
  o.spm_rate = data_fim_spm_rate;
  o.prefix_token = data_fim_tokens.at(0);
  o.middle_token = data_fim_tokens.at(1);
  o.suffix_token = data_fim_tokens.at(2);
  o.eod_token = model.eod_token;
  o.seed = train.seed ^ 0x46494d00ULL;  // ("FIM": draws of their own)
  return o;
}

std::optional<optim::NormGroups> Config::norm_groups(const std::string& by) const {
  if (by == "none") return std::nullopt;
  std::vector<std::string> names;
  for (const auto& [name, shape] : nn::gpt_parameter_shapes(model)) names.push_back(name);
  if (by == "parameters")
    return optim::NormGroups(names, [](const std::string& name) { return name; });
  // layers: a block's parameters ("h.3.attn.c_attn.weight") and a prediction
  // module's ("mtp.0.eh_proj.weight") by their first two parts, the rest by
  // their first ("wte", "wpe", "ln_f", "lm_head").
  return optim::NormGroups(names, [](const std::string& name) {
    const size_t first = name.find('.');
    if (first == std::string::npos) return name;
    const std::string head = name.substr(0, first);
    if (head != "h" && head != "mtp") return head;
    return name.substr(0, name.find('.', first + 1));
  });
}

std::map<std::string, double> Config::lr_scale_factors() const {
  std::map<std::string, double> factors;
  std::vector<std::string> patterns;
  for (const auto& [pattern, factor] : train.lr_scale) patterns.push_back(pattern);
  matching(patterns, "train.lr_scale");   // (names a pattern that matches nothing)
  std::map<std::string, std::string> by;  // each name's pattern
  for (const auto& [pattern, factor] : train.lr_scale) {
    const std::string key = "train.lr_scale['" + pattern + "']";
    if (!(factor > 0) || !std::isfinite(factor)) {
      throw ConfigError(key + " (" + std::to_string(factor) +
                        ") must be a finite number > 0 (train.freeze keeps a parameter fixed)");
    }
    for (const std::string& name : matching({pattern}, key)) {
      if (by.count(name)) {
        throw ConfigError(key + " and train.lr_scale['" + by[name] + "'] both match '" + name +
                          "' (each parameter takes one factor)");
      }
      by[name] = pattern;
      factors[name] = factor;
    }
  }
  return factors;
}

std::set<std::string> Config::matching(const std::vector<std::string>& patterns,
                                       const std::string& key) const {
  if (patterns.empty()) return {};
  std::vector<std::string> names;
  for (const auto& [name, shape] : nn::gpt_parameter_shapes(model)) names.push_back(name);
  try {
    return nn::matching_parameters(patterns, names, key);
  } catch (const ValueError& e) {
    throw ConfigError(e.what());
  }
}

std::string with_overrides(const std::string& yaml_text, const std::vector<std::string>& overrides,
                           const std::string& source) {
  YAML::Emitter e;
  e << config_root(yaml_text, overrides, source);
  std::string text = std::string(e.c_str()) + "\n";
  try {
    parse_config(text, {}, source);
  } catch (const ConfigError& e) {
    throw ConfigError(source + " with the settings applied: " + e.what());
  }
  return text;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_config(io::read_text_file(path, "config file"), overrides, path);
}

namespace {

// data.val, eval.choices and eval.lambada as get_named_paths reads them:
// `key` and one unnamed set's path, or a mapping of the sets' names to
// their paths (nothing for no sets).
template <class Set>
void emit_named_paths(YAML::Emitter& e, const char* key, const std::vector<Set>& sets) {
  if (sets.empty()) return;
  e << YAML::Key << key << YAML::Value;
  if (sets.size() == 1 && sets.front().name.empty()) {
    e << sets.front().path;
    return;
  }
  e << YAML::BeginMap;
  for (const auto& set : sets) e << YAML::Key << set.name << YAML::Value << set.path;
  e << YAML::EndMap;
}

}  // namespace

std::string to_yaml(const Config& c) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "n_layer" << YAML::Value << c.model.n_layer;
  e << YAML::Key << "n_head" << YAML::Value << c.model.n_head;
  e << YAML::Key << "n_kv_head" << YAML::Value << c.model.n_kv_head;
  if (c.model.head_size > 0) e << YAML::Key << "head_dim" << YAML::Value << c.model.head_size;
  e << YAML::Key << "d_model" << YAML::Value << c.model.d_model;
  e << YAML::Key << "vocab_size" << YAML::Value << c.model.vocab_size;
  e << YAML::Key << "seq_len" << YAML::Value << c.model.seq_len;
  e << YAML::Key << "dropout" << YAML::Value << c.model.dropout;
  e << YAML::Key << "norm_eps" << YAML::Value << c.model.layer_norm_eps;
  e << YAML::Key << "recompute" << YAML::Value << nn::recompute_string(c.model.recompute);
  if (c.model.recompute_layers > 0)
    e << YAML::Key << "recompute_layers" << YAML::Value << c.model.recompute_layers;
  e << YAML::Key << "normalization" << YAML::Value
    << nn::normalization_string(c.model.normalization);
  e << YAML::Key << "linear_bias" << YAML::Value << c.model.linear_bias;
  if (c.model.qkv_bias) e << YAML::Key << "qkv_bias" << YAML::Value << true;
  if (c.model.qk_norm_full || c.model.qk_head_layernorm) {
    e << YAML::Key << "qk_norm" << YAML::Value << nn::qk_norm_string(c.model);
  } else if (c.model.qk_norm) {
    e << YAML::Key << "qk_norm" << YAML::Value << true;
  }
  if (!c.model.pre_norms) e << YAML::Key << "pre_norms" << YAML::Value << false;
  e << YAML::Key << "tie_embeddings" << YAML::Value << c.model.tie_embeddings;
  if (c.model.embedding_multiplier != 1.0)
    e << YAML::Key << "embedding_multiplier" << YAML::Value << c.model.embedding_multiplier;
  if (c.model.norm_weight_offset) e << YAML::Key << "norm_weight_offset" << YAML::Value << true;
  if (c.model.init_std != 0.02) e << YAML::Key << "init_std" << YAML::Value << c.model.init_std;
  if (!c.model.norm_affine) e << YAML::Key << "norm_affine" << YAML::Value << false;
  if (!c.model.norm_bias) e << YAML::Key << "norm_bias" << YAML::Value << false;
  if (c.model.clip_qkv > 0) e << YAML::Key << "clip_qkv" << YAML::Value << c.model.clip_qkv;
  if (c.model.mtp_layers > 0) {
    e << YAML::Key << "mtp_layers" << YAML::Value << c.model.mtp_layers;
    e << YAML::Key << "mtp_loss_weight" << YAML::Value << c.model.mtp_loss_weight;
  }
  if (c.model.z_loss_coef > 0)
    e << YAML::Key << "z_loss_coef" << YAML::Value << c.model.z_loss_coef;
  if (c.model.residual_multiplier != 1.0)
    e << YAML::Key << "residual_multiplier" << YAML::Value << c.model.residual_multiplier;
  if (c.model.logit_scale != 1.0)
    e << YAML::Key << "logit_scale" << YAML::Value << c.model.logit_scale;
  if (c.model.post_norms) e << YAML::Key << "post_norms" << YAML::Value << true;
  if (c.model.parallel_residual) e << YAML::Key << "parallel_residual" << YAML::Value << true;
  if (c.model.shared_norm) e << YAML::Key << "shared_norm" << YAML::Value << true;
  if (c.model.mlp_bias) e << YAML::Key << "mlp_bias" << YAML::Value << true;
  if (c.model.head_bias) e << YAML::Key << "head_bias" << YAML::Value << true;
  e << YAML::Key << "activation" << YAML::Value << nn::activation_string(c.model.activation);
  e << YAML::Key << "ffn_hidden_size" << YAML::Value << c.model.ffn_hidden_size;
  e << YAML::Key << "position_embedding" << YAML::Value
    << nn::position_embedding_string(c.model.position_embedding);
  e << YAML::Key << "rope_theta" << YAML::Value << c.model.rope_theta;
  e << YAML::Key << "rope_scaling" << YAML::Value;
  if (c.model.rope_scaling.scaled()) {
    const RopeScaling& r = c.model.rope_scaling;
    e << YAML::BeginMap << YAML::Key << "type" << YAML::Value << rope_scaling_name(r.kind);
    for (const auto& k : rope_scaling_keys(r.kind))
      e << YAML::Key << k.name << YAML::Value << r.*k.field;
    if (r.kind == RopeScaling::Kind::LongRope) {
      for (const bool long_ones : {false, true}) {
        e << YAML::Key << (long_ones ? "long_factor" : "short_factor") << YAML::Value << YAML::Flow
          << rope_factors(r, long_ones);
      }
    }
    e << YAML::EndMap;
  } else {
    e << "none";
  }
  if (c.model.rope_local_theta > 0.0)
    e << YAML::Key << "rope_local_theta" << YAML::Value << c.model.rope_local_theta;
  if (c.model.rope_dim > 0) e << YAML::Key << "rope_dim" << YAML::Value << c.model.rope_dim;
  if (!c.model.hf_type.empty()) e << YAML::Key << "hf_type" << YAML::Value << c.model.hf_type;
  if (c.model.query_pre_attn_scalar > 0.0)
    e << YAML::Key << "query_pre_attn_scalar" << YAML::Value << c.model.query_pre_attn_scalar;
  if (c.model.attn_logit_softcap > 0.0)
    e << YAML::Key << "attn_logit_softcap" << YAML::Value << c.model.attn_logit_softcap;
  if (c.model.final_logit_softcap > 0.0)
    e << YAML::Key << "final_logit_softcap" << YAML::Value << c.model.final_logit_softcap;
  if (c.model.lora.rank > 0) {
    const auto& l = c.model.lora;
    e << YAML::Key << "lora" << YAML::Value << YAML::BeginMap << YAML::Key << "rank" << YAML::Value
      << l.rank;
    if (l.alpha > 0) e << YAML::Key << "alpha" << YAML::Value << l.alpha;
    if (l.dropout > 0) e << YAML::Key << "dropout" << YAML::Value << l.dropout;
    e << YAML::Key << "targets" << YAML::Value << YAML::Flow << l.targets << YAML::EndMap;
  }
  if (c.model.latent_attention()) {
    const auto& a = c.model.mla;
    e << YAML::Key << "mla" << YAML::Value << YAML::BeginMap << YAML::Key << "kv_lora_rank"
      << YAML::Value << a.kv_lora_rank << YAML::Key << "q_lora_rank" << YAML::Value << a.q_lora_rank
      << YAML::Key << "qk_nope_head_dim" << YAML::Value << a.qk_nope_head_dim << YAML::Key
      << "qk_rope_head_dim" << YAML::Value << a.qk_rope_head_dim << YAML::Key << "v_head_dim"
      << YAML::Value << a.v_head_dim;
    if (a.mscale_all_dim > 0) e << YAML::Key << "mscale_all_dim" << YAML::Value << a.mscale_all_dim;
    e << YAML::EndMap;
  }
  if (c.model.moe.experts > 0) {
    const auto& x = c.model.moe;
    e << YAML::Key << "moe" << YAML::Value << YAML::BeginMap << YAML::Key << "experts"
      << YAML::Value << x.experts << YAML::Key << "top_k" << YAML::Value << x.top_k << YAML::Key
      << "ffn_hidden_size" << YAML::Value << x.ffn_hidden_size << YAML::Key << "normalize_top_k"
      << YAML::Value << x.normalize_top_k << YAML::Key << "aux_loss_coef" << YAML::Value
      << x.aux_loss_coef;
    if (!x.dense_layers.empty())
      e << YAML::Key << "dense_layers" << YAML::Value << YAML::Flow << x.dense_layers;
    if (x.shared_ffn_hidden_size > 0) {
      e << YAML::Key << "shared_ffn_hidden_size" << YAML::Value << x.shared_ffn_hidden_size
        << YAML::Key << "shared_gate" << YAML::Value << x.shared_gate;
    }
    if (x.z_loss_coef > 0) e << YAML::Key << "z_loss_coef" << YAML::Value << x.z_loss_coef;
    if (x.capacity_factor > 0) {
      e << YAML::Key << "capacity_factor" << YAML::Value << x.capacity_factor << YAML::Key
        << "drop_policy" << YAML::Value
        << (x.drop_policy == nn::GptConfig::Moe::DropPolicy::Probs ? "probs" : "position");
      if (x.pad_to_capacity) e << YAML::Key << "pad_to_capacity" << YAML::Value << true;
    }
    if (x.score != nn::GptConfig::Moe::Score::Softmax)
      e << YAML::Key << "score" << YAML::Value << "sigmoid";
    if (x.routed_scaling_factor != 1.0)
      e << YAML::Key << "routed_scaling_factor" << YAML::Value << x.routed_scaling_factor;
    if (x.groups != 1) {
      e << YAML::Key << "groups" << YAML::Value << x.groups << YAML::Key << "top_groups"
        << YAML::Value << x.top_groups;
    }
    if (x.group_score == nn::GptConfig::Moe::GroupScore::Max)
      e << YAML::Key << "group_score" << YAML::Value << "max";
    if (x.expert_bias) {
      e << YAML::Key << "expert_bias" << YAML::Value << true << YAML::Key << "bias_update_rate"
        << YAML::Value << x.bias_update_rate;
    }
    if (x.aux_loss_scope == nn::GptConfig::Moe::BalanceScope::Sequence)
      e << YAML::Key << "aux_loss_scope" << YAML::Value << "sequence";
    e << YAML::EndMap;
  }
  e << YAML::Key << "sliding_window" << YAML::Value << c.model.sliding_window;
  if (!c.model.full_attention_layers.empty()) {
    e << YAML::Key << "full_attention_layers" << YAML::Value << YAML::Flow
      << c.model.full_attention_layers;
  }
  if (!c.model.nope_layers.empty())
    e << YAML::Key << "nope_layers" << YAML::Value << YAML::Flow << c.model.nope_layers;
  e << YAML::Key << "attention_kernel" << YAML::Value << c.attention_kernel;
  e << YAML::Key << "attention_deterministic" << YAML::Value << c.attention_deterministic;
  e << YAML::EndMap;
  const auto& t = c.train;
  e << YAML::Key << "train" << YAML::Value << YAML::BeginMap;
  if (t.epochs > 0) {
    e << YAML::Key << "epochs" << YAML::Value << t.epochs;
  } else {
    e << YAML::Key << "steps" << YAML::Value << t.steps;
  }
  e << YAML::Key << "global_batch_size" << YAML::Value << t.global_batch_size;
  e << YAML::Key << "micro_batch_size" << YAML::Value << t.micro_batch_size;
  if (!t.rampup_batch_size.empty())
    e << YAML::Key << "rampup_batch_size" << YAML::Value << YAML::Flow << t.rampup_batch_size;
  if (!t.freeze.empty()) e << YAML::Key << "freeze" << YAML::Value << YAML::Flow << t.freeze;
  if (!t.no_weight_decay.empty())
    e << YAML::Key << "no_weight_decay" << YAML::Value << YAML::Flow << t.no_weight_decay;
  if (!t.lr_scale.empty()) {
    e << YAML::Key << "lr_scale" << YAML::Value << YAML::Flow << YAML::BeginMap;
    for (const auto& [pattern, factor] : t.lr_scale)
      e << YAML::Key << pattern << YAML::Value << factor;
    e << YAML::EndMap;
  }
  e << YAML::Key << "lr" << YAML::Value << t.lr;
  e << YAML::Key << "min_lr" << YAML::Value << t.min_lr;
  e << YAML::Key << "warmup_steps" << YAML::Value << t.warmup_steps;
  if (t.warmup_init > 0) e << YAML::Key << "warmup_init" << YAML::Value << t.warmup_init;
  e << YAML::Key << "lr_decay" << YAML::Value << t.lr_decay;
  if (t.lr_decay_steps > 0) e << YAML::Key << "lr_decay_steps" << YAML::Value << t.lr_decay_steps;
  if (t.cooldown_steps > 0) e << YAML::Key << "cooldown_steps" << YAML::Value << t.cooldown_steps;
  if (t.cooldown_shape != "linear")
    e << YAML::Key << "cooldown_shape" << YAML::Value << t.cooldown_shape;
  e << YAML::Key << "weight_decay" << YAML::Value << t.weight_decay;
  if (t.weight_decay_schedule != "constant") {
    e << YAML::Key << "weight_decay_schedule" << YAML::Value << t.weight_decay_schedule;
    e << YAML::Key << "weight_decay_start" << YAML::Value << t.weight_decay_start.value_or(0);
    if (t.weight_decay_steps > 0)
      e << YAML::Key << "weight_decay_steps" << YAML::Value << t.weight_decay_steps;
  }
  e << YAML::Key << "beta1" << YAML::Value << t.beta1;
  e << YAML::Key << "beta2" << YAML::Value << t.beta2;
  e << YAML::Key << "eps" << YAML::Value << t.eps;
  e << YAML::Key << "grad_clip" << YAML::Value << t.grad_clip;
  e << YAML::Key << "optimizer" << YAML::Value << t.optimizer;
  if (t.optimizer == "muon") {
    e << YAML::Key << "muon_momentum" << YAML::Value << t.muon_momentum;
    e << YAML::Key << "muon_nesterov" << YAML::Value << t.muon_nesterov;
    e << YAML::Key << "muon_ns_steps" << YAML::Value << t.muon_ns_steps;
    e << YAML::Key << "muon_scale" << YAML::Value << t.muon_scale;
    if (t.muon_lr > 0) e << YAML::Key << "muon_lr" << YAML::Value << t.muon_lr;
    if (!t.muon_ns_precision.empty())
      e << YAML::Key << "muon_ns_precision" << YAML::Value << t.muon_ns_precision;
  }
  e << YAML::Key << "max_skipped_steps" << YAML::Value << t.max_skipped_steps;
  if (!t.skip_steps.empty()) {
    e << YAML::Key << "skip_steps" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const auto& [first, last] : t.skip_steps) {
      if (first == last) {
        e << first;
      } else {
        e << std::to_string(first) + "-" + std::to_string(last);
      }
    }
    e << YAML::EndSeq;
  }
  if (t.spike_sigma > 0) {
    e << YAML::Key << "spike_sigma" << YAML::Value << t.spike_sigma;
    e << YAML::Key << "spike_window" << YAML::Value << t.spike_window;
  }
  e << YAML::Key << "exit_after_minutes" << YAML::Value << t.exit_after_minutes;
  if (t.ema_decay > 0) e << YAML::Key << "ema_decay" << YAML::Value << t.ema_decay;
  if (t.ema_device != "device") e << YAML::Key << "ema_device" << YAML::Value << t.ema_device;
  e << YAML::Key << "precision" << YAML::Value << t.precision;
  if (t.moment_precision != "fp32")
    e << YAML::Key << "moment_precision" << YAML::Value << t.moment_precision;
  if (t.grad_precision != "fp32")
    e << YAML::Key << "grad_precision" << YAML::Value << t.grad_precision;
  e << YAML::Key << "loss_average" << YAML::Value << t.loss_average;
  if (t.cuda_graph) e << YAML::Key << "cuda_graph" << YAML::Value << true;
  e << YAML::Key << "loss_scale_init" << YAML::Value << t.loss_scale_init;
  e << YAML::Key << "loss_scale_window" << YAML::Value << t.loss_scale_window;
  // (Keys newer than the rest only when set: a checkpoint written before
  // them reads as unchanged.)
  if (t.loss_scale_hysteresis != 1)
    e << YAML::Key << "loss_scale_hysteresis" << YAML::Value << t.loss_scale_hysteresis;
  if (t.loss_scale_min != 1.0)
    e << YAML::Key << "loss_scale_min" << YAML::Value << t.loss_scale_min;
  e << YAML::Key << "seed" << YAML::Value << t.seed;
  e << YAML::EndMap;
  e << YAML::Key << "data" << YAML::Value << YAML::BeginMap << YAML::Key << "train" << YAML::Value;
  if (c.data_train.size() == 1 && c.data_train[0].weight == 1.0) {
    e << c.data_train[0].path;
  } else {
    e << YAML::BeginSeq;
    for (const auto& part : c.data_train) {
      e << YAML::Flow << YAML::BeginMap << YAML::Key << "path" << YAML::Value << part.path
        << YAML::Key << "weight" << YAML::Value << part.weight << YAML::EndMap;
    }
    e << YAML::EndSeq;
  }
  emit_named_paths(e, "val", c.data_val);
  if (c.data_val_split > 0) e << YAML::Key << "val_split" << YAML::Value << c.data_val_split;
  e << YAML::Key << "shuffle" << YAML::Value << c.data_shuffle;
  e << YAML::Key << "eod_token" << YAML::Value << c.model.eod_token;
  e << YAML::Key << "reset_attention_mask" << YAML::Value << c.model.reset_attention_mask;
  e << YAML::Key << "reset_position_ids" << YAML::Value << c.model.reset_position_ids;
  e << YAML::Key << "eod_mask_loss" << YAML::Value << c.data_eod_mask_loss;
  e << YAML::Key << "packing" << YAML::Value << c.data_packing;
  e << YAML::Key << "long_documents" << YAML::Value << c.data_long_documents;
  if (c.data_fim_rate > 0) {
    e << YAML::Key << "fim_rate" << YAML::Value << c.data_fim_rate;
    e << YAML::Key << "fim_spm_rate" << YAML::Value << c.data_fim_spm_rate;
    e << YAML::Key << "fim_tokens" << YAML::Value << YAML::Flow << c.data_fim_tokens;
  }
  e << YAML::EndMap;
  if (!c.init_from.empty()) {
    e << YAML::Key << "init" << YAML::Value << YAML::BeginMap << YAML::Key << "from" << YAML::Value
      << c.init_from;
    if (!c.init_adapter.empty()) e << YAML::Key << "adapter" << YAML::Value << c.init_adapter;
    e << YAML::EndMap;
  }
  e << YAML::Key << "output" << YAML::Value << YAML::BeginMap << YAML::Key << "dir" << YAML::Value
    << c.output_dir << YAML::EndMap;
  e << YAML::Key << "log" << YAML::Value << YAML::BeginMap << YAML::Key << "interval" << YAML::Value
    << c.log_interval << YAML::Key << "peak_tflops" << YAML::Value << c.log_peak_tflops << YAML::Key
    << "tensorboard" << YAML::Value << c.log_tensorboard << YAML::Key << "param_norm" << YAML::Value
    << c.log_param_norm;
  if (c.log_grad_norms != "none") e << YAML::Key << "grad_norms" << YAML::Value << c.log_grad_norms;
  if (c.log_param_norms != "none")
    e << YAML::Key << "param_norms" << YAML::Value << c.log_param_norms;
  if (c.log_moe_per_layer) e << YAML::Key << "moe_per_layer" << YAML::Value << true;
  if (c.log_straggler_factor > 0)
    e << YAML::Key << "straggler_factor" << YAML::Value << c.log_straggler_factor;
  if (c.log_trace_first < 0) {
    e << YAML::Key << "trace_steps" << YAML::Value << "none";
  } else if (c.log_trace_first > 0) {
    e << YAML::Key << "trace_steps" << YAML::Value << YAML::Flow << YAML::BeginSeq
      << c.log_trace_first << c.log_trace_last << YAML::EndSeq;
  }
  if (!c.log_plan_cluster.empty())
    e << YAML::Key << "plan_cluster" << YAML::Value << c.log_plan_cluster;
  if (c.log_nvtx) e << YAML::Key << "nvtx" << YAML::Value << true;
  if (c.log_profile_first > 0) {
    e << YAML::Key << "profile_steps" << YAML::Value << YAML::Flow << YAML::BeginSeq
      << c.log_profile_first << c.log_profile_last << YAML::EndSeq;
  }
  if (!c.log_profile_ranks.empty())
    e << YAML::Key << "profile_ranks" << YAML::Value << YAML::Flow << c.log_profile_ranks;
  e << YAML::EndMap;
  const auto& p = c.parallel;
  e << YAML::Key << "parallel" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "tp" << YAML::Value << p.tp << YAML::Key << "pp" << YAML::Value << p.pp;
  e << YAML::Key << "vpp" << YAML::Value << p.vpp;
  if (p.dp > 0) e << YAML::Key << "dp" << YAML::Value << p.dp;
  if (p.ep > 1) e << YAML::Key << "ep" << YAML::Value << p.ep;
  if (p.cp > 1) e << YAML::Key << "cp" << YAML::Value << p.cp;
  if (p.cp_comm != "auto") e << YAML::Key << "cp_comm" << YAML::Value << p.cp_comm;
  if (p.cp_a2a > 1) e << YAML::Key << "cp_a2a" << YAML::Value << p.cp_a2a;
  e << YAML::Key << "sequence_parallel" << YAML::Value << p.sequence_parallel;
  e << YAML::Key << "schedule" << YAML::Value << p.schedule << YAML::Key << "order" << YAML::Value
    << p.order;
  if (p.zb_max_in_flight != 0)
    e << YAML::Key << "zb_max_in_flight" << YAML::Value << p.zb_max_in_flight;
  if (p.stage_layers_auto) e << YAML::Key << "stage_layers" << YAML::Value << "auto";
  if (!p.stage_layers.empty())
    e << YAML::Key << "stage_layers" << YAML::Value << YAML::Flow << p.stage_layers;
  e << YAML::Key << "zero" << YAML::Value << p.zero << YAML::Key << "bucket_mb" << YAML::Value
    << p.bucket_mb;
  e << YAML::Key << "overlap_param_gather" << YAML::Value << p.overlap_param_gather;
  e << YAML::Key << "pipeline_scatter_gather" << YAML::Value << p.pipeline_scatter_gather;
  e << YAML::Key << "topology" << YAML::Value << p.topology;
  e << YAML::Key << "timeout_s" << YAML::Value << p.timeout_s << YAML::Key << "validate_collectives"
    << YAML::Value << p.validate_collectives;
  if (p.check_replicas_interval > 0)
    e << YAML::Key << "check_replicas_interval" << YAML::Value << p.check_replicas_interval;
  e << YAML::EndMap;
  if (!c.checkpoint.dir.empty() || c.checkpoint.resume != "never") {
    e << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap << YAML::Key << "dir"
      << YAML::Value << c.checkpoint.dir << YAML::Key << "interval" << YAML::Value
      << c.checkpoint.interval << YAML::Key << "keep" << YAML::Value << c.checkpoint.keep
      << YAML::Key << "keep_every" << YAML::Value << c.checkpoint.keep_every << YAML::Key
      << "resume" << YAML::Value << c.checkpoint.resume << YAML::Key << "async" << YAML::Value
      << c.checkpoint.async;
    if (c.checkpoint.keep_best) e << YAML::Key << "keep_best" << YAML::Value << true;
    if (!c.checkpoint.load_optimizer) e << YAML::Key << "load_optimizer" << YAML::Value << false;
    if (!c.checkpoint.save_optimizer) e << YAML::Key << "save_optimizer" << YAML::Value << false;
    e << YAML::EndMap;
  }
  if (c.evaluates()) {
    e << YAML::Key << "eval" << YAML::Value << YAML::BeginMap << YAML::Key << "interval"
      << YAML::Value << c.eval.interval;
    if (c.has_validation()) e << YAML::Key << "batches" << YAML::Value << c.eval.batches;
    if (c.eval.at_start) e << YAML::Key << "at_start" << YAML::Value << true;
    if (c.eval.early_stop_patience > 0) {
      e << YAML::Key << "early_stop_patience" << YAML::Value << c.eval.early_stop_patience
        << YAML::Key << "early_stop_delta" << YAML::Value << c.eval.early_stop_delta;
    }
    if (!c.eval.choices.empty()) {
      emit_named_paths(e, "choices", c.eval.choices);
      e << YAML::Key << "choices_limit" << YAML::Value << c.eval.choices_limit;
      e << YAML::Key << "choices_fewshot" << YAML::Value << c.eval.choices_fewshot;
      if (c.eval.choices_fewshot_seed >= 0) {
        e << YAML::Key << "choices_fewshot_seed" << YAML::Value << c.eval.choices_fewshot_seed;
      }
      e << YAML::Key << "hellaswag_prompt" << YAML::Value << c.eval.hellaswag_prompt;
    }
    if (!c.eval.lambada.empty()) {
      emit_named_paths(e, "lambada", c.eval.lambada);
      e << YAML::Key << "lambada_limit" << YAML::Value << c.eval.lambada_limit;
    }
    if (!c.eval.samples.empty()) {
      e << YAML::Key << "samples" << YAML::Value << YAML::BeginSeq;
      for (const auto& s : c.eval.samples) e << s;
      e << YAML::EndSeq << YAML::Key << "sample_tokens" << YAML::Value << c.eval.sample_tokens
        << YAML::Key << "sample_temperature" << YAML::Value << c.eval.sample_temperature
        << YAML::Key << "sample_top_k" << YAML::Value << c.eval.sample_top_k;
    }
    if (c.reads_text_for_eval()) {
      for (const auto& [key, value] : {std::pair{"tokenizer", &c.eval.tokenizer},
                                       {"vocab", &c.eval.vocab},
                                       {"merges", &c.eval.merges},
                                       {"bos_token", &c.eval.bos_token}}) {
        if (!value->empty()) e << YAML::Key << key << YAML::Value << *value;
      }
    }
    e << YAML::EndMap;
  }
  e << YAML::Key << "device" << YAML::Value << c.device;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

}  // namespace triad::train
