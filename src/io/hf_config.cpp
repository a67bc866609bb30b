#include "triad/io/hf_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "triad/core/error.h"
#include "triad/io/gpt2_weights.h"
#include "triad/io/text_file.h"

namespace triad::io {
namespace {

// DeepSeek-V2's and -V3's classes (multi-head latent attention), V3's
// under its own model_type or Kimi K2's.
bool is_deepseek_mla(const std::string& type) {
  return type == "deepseek_v2" || type == "deepseek_v3" || type == "kimi_k2";
}

using Json = nlohmann::json;

// obj[key] as a string: `otherwise` when absent or null, a ConfigError
// naming the file and `path.key` when something else.
std::string string_entry(const Json& obj, const char* key, const std::string& otherwise,
                         const std::string& source, const std::string& path) {
  if (!obj.contains(key) || obj.at(key).is_null()) return otherwise;
  const Json& v = obj.at(key);
  if (!v.is_string()) {
    throw ConfigError(source + ": '" + (path.empty() ? "" : path + ".") + key + "' (" + v.dump() +
                      ") must be a string");
  }
  return v.get<std::string>();
}

// Typed reads of config.json's keys, each error naming the file and key.
class Keys {
 public:
  Keys(const Json& j, std::string source) : j_(j), source_(std::move(source)) {}
  // A value out of its range, named with the file and the key.
  [[noreturn]] void bad(const char* key, const std::string& expected) const {
    throw ConfigError(source_ + ": '" + key + "' (" + j_.at(key).dump() + ") " + expected);
  }

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  // Whether the file names the key at all (null included).
  bool names(const char* key) const { return j_.contains(key); }

  int64_t integer(const char* key) const {
    if (!has(key)) throw ConfigError(source_ + ": key '" + key + "' is missing");
    const Json& v = j_.at(key);
    if (!v.is_number_integer())
      throw ConfigError(source_ + ": '" + key + "' (" + v.dump() + ") must be an integer");
    return v.get<int64_t>();
  }
  int64_t integer(const char* key, int64_t otherwise) const {
    return has(key) ? integer(key) : otherwise;
  }
  double number(const char* key, double otherwise) const {
    if (!has(key)) return otherwise;
    const Json& v = j_.at(key);
    if (!v.is_number())
      throw ConfigError(source_ + ": '" + key + "' (" + v.dump() + ") must be a number");
    return v.get<double>();
  }
  bool boolean(const char* key, bool otherwise) const {
    if (!has(key)) return otherwise;
    const Json& v = j_.at(key);
    if (!v.is_boolean())
      throw ConfigError(source_ + ": '" + key + "' (" + v.dump() + ") must be true or false");
    return v.get<bool>();
  }
  // layer_types (newer transformers' per-layer attention kinds): the
  // indices of the "full_attention" layers, every other entry
  // "sliding_attention"; n_layer entries.
  std::vector<int64_t> full_attention_layers(int64_t n_layer) const {
    const Json& v = j_.at("layer_types");
    if (!v.is_array() || static_cast<int64_t>(v.size()) != n_layer) {
      throw ConfigError(source_ + ": 'layer_types' (" + v.dump() + ") must list " +
                        std::to_string(n_layer) + " layers' attention kinds");
    }
    std::vector<int64_t> full;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string kind = v[i].is_string() ? v[i].get<std::string>() : v[i].dump();
      if (kind == "full_attention") {
        full.push_back(static_cast<int64_t>(i));
      } else if (kind != "sliding_attention") {
        throw NotSupportedError(source_ + ": 'layer_types[" + std::to_string(i) + "]' (" + kind +
                                "): expected full_attention or sliding_attention");
      }
    }
    return full;
  }
  // The key's JSON value (present: has(key)).
  const Json& json(const char* key) const { return j_.at(key); }
  std::string text(const char* key, const std::string& otherwise) const {
    if (!has(key)) return otherwise;
    const Json& v = j_.at(key);
    if (!v.is_string())
      throw ConfigError(source_ + ": '" + key + "' (" + v.dump() + ") must be a string");
    return v.get<std::string>();
  }
  // rope_scaling: {"rope_type": "llama3" | "linear" | "yarn", "factor", ...}
  // (older files say "type"); yarn's original context defaults to
  // max_position_embeddings, as in Hugging Face. Any other kind, and yarn's
  // DeepSeek variants (mscale, mscale_all_dim) or untruncated ramp, is a
  // NotSupportedError naming it.
  // DeepSeek's classes (`mscale_all_dim` given) take yarn's mscale and
  // mscale_all_dim as Hugging Face does: the rotation's attention factor
  // get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when
  // both are given (and attention_factor is not), and mscale_all_dim into
  // *mscale_all_dim for the scores' own factor (model.mla).
  RopeScaling rope_scaling(double max_positions, double* mscale_all_dim = nullptr) const {
    const Json& v = j_.at("rope_scaling");
    if (!v.is_object())
      unsupported("rope_scaling",
                  "expected an object with rope_type llama3, linear, yarn or longrope");
    std::string type =
        string_entry(v, "rope_type", string_entry(v, "type", "", source_, "rope_scaling"), source_,
                     "rope_scaling");
    if (type == "su") type = "longrope";  // (Phi-3's first files)
    // transformers' own name for no scaling ({"rope_type": "default"}, as
    // Seed-OSS's files write it): the plain rotation.
    if (type == "default") return {};
    RopeScaling r;
    if (!rope_scaling_kind(type, &r.kind) || !r.scaled())
      unsupported("rope_scaling",
                  "only rope_type llama3 (LLaMA 3.1's), linear, yarn and longrope (Phi-3's) are "
                  "implemented");
    if (r.kind == RopeScaling::Kind::LongRope) {
      // Phi-3's: the pretrained context beside max_position_embeddings, and
      // their ratio the factor (Hugging Face's rule); without it, the
      // context is max_position_embeddings and the factor rope_scaling's.
      if (has("original_max_position_embeddings")) {
        r.original_seq_len = number("original_max_position_embeddings", 0.0);
        r.factor = max_positions / r.original_seq_len;
      } else {
        r.original_seq_len = max_positions;
        r.factor = 1.0;
      }
      std::vector<double> factors[2];
      const char* names[2] = {"short_factor", "long_factor"};
      for (int l = 0; l < 2; ++l) {
        const Json& list = v.contains(names[l]) ? v.at(names[l]) : Json();
        if (!list.is_array())
          unsupported("rope_scaling", std::string("longrope needs its ") + names[l] + " list");
        for (const Json& x : list) {
          if (!x.is_number())
            throw ConfigError(source_ + ": 'rope_scaling." + names[l] + "' holds " + x.dump() +
                              ", not a number");
          factors[l].push_back(x.get<double>());
        }
      }
      if (const std::string why = set_rope_factors(r, factors[0], factors[1]); !why.empty())
        throw ConfigError(source_ + ": 'rope_scaling': " + why);
      for (const auto& k : rope_scaling_keys(r.kind)) {
        if (!v.contains(k.name) || v.at(k.name).is_null()) continue;
        if (k.field == &RopeScaling::factor && has("original_max_position_embeddings")) continue;
        if (!v.at(k.name).is_number())
          throw ConfigError(source_ + ": 'rope_scaling." + k.name + "' (" + v.at(k.name).dump() +
                            ") must be a number");
        r.*k.field = v.at(k.name).get<double>();
      }
      return r;
    }
    if (r.kind == RopeScaling::Kind::Yarn) {
      r.original_seq_len = max_positions;
      double mscales[2] = {0.0, 0.0};
      for (int i = 0; i < 2; ++i) {
        const char* key = i == 0 ? "mscale" : "mscale_all_dim";
        if (!v.contains(key) || v.at(key).is_null()) continue;
        if (mscale_all_dim == nullptr)
          unsupported("rope_scaling", std::string("yarn's ") + key +
                                          " (DeepSeek's attention factor) belongs to DeepSeek's "
                                          "latent attention");
        if (!v.at(key).is_number() || !(v.at(key).get<double>() >= 0.0))
          throw ConfigError(source_ + ": 'rope_scaling." + key + "' (" + v.at(key).dump() +
                            ") must be a number >= 0");
        mscales[i] = v.at(key).get<double>();
      }
      if (mscale_all_dim != nullptr) {
        *mscale_all_dim = mscales[1];
        const double factor =
            v.contains("factor") && v.at("factor").is_number() ? v.at("factor").get<double>() : 1.0;
        const auto get_mscale = [&](double m) {
          return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
        };
        if (mscales[0] > 0.0 && mscales[1] > 0.0 &&
            (!v.contains("attention_factor") || v.at("attention_factor").is_null()))
          r.attention_factor = get_mscale(mscales[0]) / get_mscale(mscales[1]);
      }
      if (v.contains("truncate") && v.at("truncate") == false)
        unsupported("rope_scaling", "yarn without truncate is not implemented");
    }
    if (r.kind != RopeScaling::Kind::Llama3 && !v.contains("factor"))
      unsupported("rope_scaling", "a " + type + " scaling needs its factor");
    for (const auto& k : rope_scaling_keys(r.kind)) {
      if (!v.contains(k.name) || v.at(k.name).is_null()) continue;
      if (!v.at(k.name).is_number())
        throw ConfigError(source_ + ": 'rope_scaling." + k.name + "' (" + v.at(k.name).dump() +
                          ") must be a number");
      r.*k.field = v.at(k.name).get<double>();
    }
    return r;
  }

  // What Triad does not build, named with the key's value.
  [[noreturn]] void unsupported(const char* key, const std::string& why) const {
    throw NotSupportedError(source_ + ": '" + key + "' (" +
                            (names(key) ? j_.at(key).dump() : std::string("absent")) + "): " + why);
  }

 private:
  const Json& j_;
  std::string source_;
};

// An ungated MLP's GELU by its Hugging Face name (`key`, `otherwise` when
// absent): "gelu" is the exact form, gelu_new and gelu_pytorch_tanh the
// tanh approximation.
nn::Activation gelu_named(const Keys& k, const char* key, const char* otherwise) {
  const std::string act = k.text(key, otherwise);
  if (act == "gelu") return nn::Activation::GeluErf;
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    k.unsupported(key, "expected gelu (exact), gelu_new or gelu_pytorch_tanh (tanh)");
  return nn::Activation::Gelu;
}

// Nemotron's ungated MLP's activation (its class's and Arcee's, of
// `family`), by hidden_act: relu2 (squared ReLU, their default) or a GELU
// form.
nn::Activation ungated_activation(const Keys& k, const std::string& family) {
  const std::string act = k.text("hidden_act", "relu2");
  if (act == "relu2") return nn::Activation::Relu2;
  if (act != "gelu" && act != "gelu_new" && act != "gelu_pytorch_tanh") {
    k.unsupported("hidden_act",
                  "expected relu2 (squared ReLU), gelu (exact), gelu_new or gelu_pytorch_tanh "
                  "(tanh): " +
                      family + "'s MLP is ungated");
  }
  return gelu_named(k, "hidden_act", "relu2");
}

// A partial rotation from the share of each head a file turns (`key`,
// `otherwise` when absent): Hugging Face's int(head_dim * share)
// dimensions as model.rope_dim, 0 for the whole head.
int64_t rotated_dims(const Keys& k, const char* key, double otherwise, const nn::GptConfig& c) {
  const double f = k.number(key, otherwise);
  if (!(f > 0.0 && f <= 1.0)) k.bad(key, "must be a share of the head in (0, 1]");
  if (c.n_head <= 0) return 0;  // (validate() names the heads)
  const auto dims = static_cast<int64_t>(static_cast<double>(c.head_dim()) * f);
  return dims == c.head_dim() ? 0 : dims;  // (validate() names an odd one)
}

// The widths, depth, vocabulary and context every class but GPT-2's names
// alike (hidden_size, num_hidden_layers, ...); key/value heads as many as
// the query heads when num_key_value_heads is left out.
nn::GptConfig decoder_dimensions(const Keys& k) {
  nn::GptConfig c;
  c.n_layer = k.integer("num_hidden_layers");
  c.n_head = k.integer("num_attention_heads");
  c.d_model = k.integer("hidden_size");
  c.n_kv_head = k.integer("num_key_value_heads", c.n_head);
  if (c.n_kv_head == c.n_head) c.n_kv_head = 0;  // multi-head attention
  c.vocab_size = k.integer("vocab_size");
  c.seq_len = k.integer("max_position_embeddings");
  c.ffn_hidden_size = k.integer("intermediate_size");
  return c;
}

// LlamaForCausalLM and its relatives: rotary embeddings, SwiGLU, RMSNorm,
// no linear biases.
nn::GptConfig llama_config(const Keys& k, const std::string& type) {
  nn::GptConfig c = decoder_dimensions(k);
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.rope_theta = k.number("rope_theta", type == "gemma3_text"  ? 1e6
                                        : type == "smollm3"    ? 2e6
                                        : type == "minimax_m2" ? 5e6
                                                               : 10000.0);
  c.normalization = nn::Normalization::RmsNorm;
  c.layer_norm_eps = k.number("rms_norm_eps", 1e-6);
  c.activation = nn::Activation::SwiGlu;
  c.linear_bias = false;
  const bool gemma = type == "gemma" || type == "gemma2" || type == "gemma3_text";
  c.tie_embeddings = k.boolean("tie_word_embeddings", gemma);
  if (k.has("rope_scaling")) {
    c.rope_scaling = k.rope_scaling(static_cast<double>(c.seq_len),
                                    is_deepseek_mla(type) ? &c.mla.mscale_all_dim : nullptr);
  }
  if (gemma) {
    // Gemma: GeGLU (transformers reads hidden_activation and takes GELU's
    // tanh approximation when it is absent, whatever hidden_act says), the
    // token embeddings times sqrt(hidden_size), norms scaling by 1 + weight.
    c.activation = nn::Activation::GeGlu;
    const std::string act = k.text("hidden_activation", "gelu_pytorch_tanh");
    if (act != "gelu_pytorch_tanh" && act != "gelu_new")
      k.unsupported("hidden_activation", "Triad's GeGLU uses GELU's tanh approximation");
    c.embedding_multiplier = std::sqrt(static_cast<double>(c.d_model));
    c.norm_weight_offset = true;
  }
  if (type == "gemma2" || type == "gemma3_text") {
    // Gemma 2 and 3: Gemma's blocks with each sublayer's output normalised
    // again; Gemma 3's query/key norms too.
    c.post_norms = true;
    c.qk_norm = type == "gemma3_text";
    // Soft-capping of the attention's scores and the head's logits: null is
    // none; left out, Gemma2Config's 50 and 30 (Gemma3TextConfig's none).
    auto cap = [&](const char* key, double gemma2_default) {
      if (!k.names(key)) return type == "gemma2" ? gemma2_default : 0.0;
      return k.number(key, 0.0);  // (validate() names a negative one)
    };
    c.attn_logit_softcap = cap("attn_logit_softcapping", 50.0);
    c.final_logit_softcap = cap("final_logit_softcapping", 30.0);
  }
  if (type == "arcee") {
    // Arcee (AFM-4.5B): LLaMA's blocks with Nemotron's ungated MLP, up_proj
    // and down_proj, of squared ReLU by default.
    c.activation = ungated_activation(k, "Arcee");
  } else if (!gemma && k.text("hidden_act", "silu") != "silu") {
    k.unsupported("hidden_act", "Triad's gated MLP is SwiGLU (silu)");
  }
  // GLM (GLM-4-9B's "glm") and GLM-4 (0414's, GLM-Z1's "glm4"): LLaMA's
  // blocks with biases on q, k and v (attention_bias, o_proj has none),
  // partial_rotary_factor of each head (half by default) turned in
  // interleaved pairs (the weights' reader reorders them into Triad's
  // halves), gate_up_proj fused as Triad's c_fc; GLM-4's blocks normalise
  // each sublayer's output again (post_self_attn_layernorm,
  // post_mlp_layernorm).
  const bool glm = type == "glm" || type == "glm4";
  if (type == "helium") {
    // Helium (Kyutai's): LLaMA's blocks turning q and k in interleaved
    // pairs (reordered as Cohere's), biases on q, k and v alone under
    // attention_bias.
    c.qkv_bias = k.boolean("attention_bias", false);
  } else if (type == "seed_oss") {
    // Seed-OSS (ByteDance's): LLaMA's blocks with biases on q, k and v
    // (attention_bias, on by default), heads of their own width; o_proj's
    // bias (attention_out_bias) has no place in Triad's blocks without
    // every other linear layer's.
    c.qkv_bias = k.boolean("attention_bias", true);
    if (k.boolean("attention_out_bias", false))
      k.unsupported("attention_out_bias",
                    "Triad's attention output projection has a bias only beside every other "
                    "linear layer's (model.linear_bias)");
  } else if (type == "glm4_moe") {
    // GLM-4.5's: biases on q, k and v alone under attention_bias (none by
    // default), Qwen3's query/key norms under use_qk_norm, and half of each
    // head (partial_rotary_factor) turned in halves, as GPT-NeoX's.
    c.qkv_bias = k.boolean("attention_bias", false);
    c.qk_norm = k.boolean("use_qk_norm", false);
  } else if (glm) {
    c.qkv_bias = k.boolean("attention_bias", true);
    c.post_norms = type == "glm4";
    if (c.rope_scaling.scaled())
      k.unsupported("rope_scaling", "GLM's partial rotation in interleaved pairs turns unscaled");
  } else if (k.boolean("attention_bias", false)) {
    k.unsupported("attention_bias", "Triad's LLaMA blocks have no attention biases");
  }
  if (k.boolean("mlp_bias", false))
    k.unsupported("mlp_bias", "Triad's LLaMA blocks have no MLP biases");
  // Heads of their own width (Qwen3's, Mistral NeMo's); the same as
  // hidden_size / num_attention_heads is no different from its absence.
  if (k.has("head_dim") && k.integer("head_dim") * c.n_head != c.d_model)
    c.head_size = k.integer("head_dim");
  // Phi-3: LLaMA's blocks with fused projections (the weights' reader
  // takes qkv_proj and gate_up_proj) and Mistral's window; Phi-4-mini's
  // partial rotation turns the first int(head_dim * partial_rotary_factor)
  // dimensions of each head, as Hugging Face's Phi3 does (below, with
  // StableLM's).
  // Gemma 2's and 3's attention scale 1 / sqrt(query_pre_attn_scalar)
  // (27B's 168 and 144, d_model / n_head, against heads of 128); the head
  // dimension's is no different from its absence.
  if (gemma && k.has("query_pre_attn_scalar")) {
    const double s = k.number("query_pre_attn_scalar", 0.0);
    if (s != static_cast<double>(c.head_dim())) c.query_pre_attn_scalar = s;  // validated below
  }
  // Qwen2: LLaMA's blocks with biases on q, k and v (implied by the type).
  // Qwen3: LLaMA's blocks with RMSNorm over each query and key head (and
  // heads of their own width, head_dim above).
  if (type == "qwen3" || type == "dots1") c.qk_norm = true;
  if (type == "qwen2" || type == "qwen3") c.qkv_bias = type == "qwen2";
  // StableLM (2 1.6B, 2 12B, 3B-4E1T, Zephyr): LLaMA's blocks with
  // LayerNorms (scale and shift), q, k and v biases when use_qkv_bias says
  // so, and partial_rotary_factor of each head turned (a quarter by
  // default). StableLM 2 12B's qk_layernorm, a LayerNorm without a bias on
  // each query and key head, each head's its own, is model.qk_norm:
  // head_layernorm.
  if (type == "stablelm") {
    c.normalization = nn::Normalization::LayerNorm;
    c.layer_norm_eps = k.number("layer_norm_eps", 1e-5);
    c.qkv_bias = k.boolean("use_qkv_bias", false);
    if (k.boolean("qk_layernorm", false)) nn::set_qk_norm(c, "head_layernorm");
    // Its parallel blocks (StableLM 2 12B's) share input_layernorm between
    // the attention and the MLP.
    c.parallel_residual = c.shared_norm = k.boolean("use_parallel_residual", false);
  }
  if (type == "stablelm" || type == "phi3" || glm || type == "glm4_moe") {
    c.rope_dim = rotated_dims(k, "partial_rotary_factor",
                              type == "phi3"              ? 1.0
                              : glm || type == "glm4_moe" ? 0.5
                                                          : 0.25,
                              c);
  }
  // Granite (3.0 to 3.3): LLaMA's blocks with four scalars, each 1 when
  // left out (GraniteConfig's defaults): the token embeddings times
  // embedding_multiplier, each sublayer's output times residual_multiplier,
  // the attention's scores times attention_multiplier in place of
  // 1 / sqrt(head_dim) (model.query_pre_attn_scalar 1 / multiplier^2), and
  // the logits over logits_scaling (model.logit_scale its inverse).
  if (type == "granite") {
    auto positive = [&](const char* key) {
      const double v = k.number(key, 1.0);
      if (!(v > 0.0) || !std::isfinite(v)) k.bad(key, "must be a positive number");
      return v;
    };
    c.embedding_multiplier = positive("embedding_multiplier");
    c.residual_multiplier = positive("residual_multiplier");
    const double a = positive("attention_multiplier");
    // (1 / sqrt(head_dim) written out, to its last digit, is the usual scale.)
    const double scalar = 1.0 / (a * a), usual = static_cast<double>(c.head_dim());
    if (std::abs(scalar - usual) > 1e-12 * usual) c.query_pre_attn_scalar = scalar;
    c.logit_scale = 1.0 / positive("logits_scaling");
  }
  // Sliding windows: Mistral's on every layer (null: none); Qwen's, when
  // use_sliding_window is set, on the layers from max_window_layers on; or
  // the layers layer_types names (newer files, any of these types). A
  // window as long as the context changes nothing.
  const bool qwen = type == "qwen2" || type == "qwen3";
  std::vector<int64_t> full;
  bool windowed = (type == "mistral" || type == "phi3") && k.has("sliding_window");
  // Gemma 2 and 3: local and global layers interleaved, every
  // sliding_window_pattern-th layer global (Gemma 2's every other).
  if ((type == "gemma2" || type == "gemma3_text") && k.has("sliding_window")) {
    windowed = true;
    const int64_t every = type == "gemma2" ? 2 : k.integer("sliding_window_pattern", 6);
    if (every < 1) k.unsupported("sliding_window_pattern", "expected a positive count of layers");
    for (int64_t i = every - 1; i < c.n_layer; i += every) full.push_back(i);
  }
  if (qwen && k.boolean("use_sliding_window", false)) {
    windowed = true;
    for (int64_t i = 0; i < std::min(k.integer("max_window_layers", c.n_layer), c.n_layer); ++i)
      full.push_back(i);
  }
  // dots.llm1: Qwen's windows from max_window_layers on whenever its
  // sliding_window is set (Dots1Config reads no use_sliding_window).
  if (type == "dots1" && k.has("sliding_window") && !k.has("layer_types")) {
    windowed = true;
    for (int64_t i = 0; i < std::min(k.integer("max_window_layers", c.n_layer), c.n_layer); ++i)
      full.push_back(i);
  }
  // SmolLM3: its layer_types' windows only under use_sliding_window.
  if (k.has("layer_types") && (type != "smollm3" || k.boolean("use_sliding_window", false))) {
    full = k.full_attention_layers(c.n_layer);
    windowed = static_cast<int64_t>(full.size()) < c.n_layer;
  }
  if (type == "smollm3") {
    // SmolLM3: LLaMA's blocks, some layers without rope: no_rope_layers
    // flags each layer (1: rope, 0: none), else every
    // no_rope_layer_interval-th (4th) layer goes without.
    if (k.has("no_rope_layers")) {
      const Json& v = k.json("no_rope_layers");
      if (!v.is_array() || static_cast<int64_t>(v.size()) < c.n_layer)
        k.bad("no_rope_layers", "must flag each of the " + std::to_string(c.n_layer) +
                                    " layers with 1 (rope) or 0 (none)");
      for (int64_t i = 0; i < c.n_layer; ++i) {
        const Json& f = v[static_cast<size_t>(i)];
        if (!f.is_number_integer() || (f.get<int64_t>() != 0 && f.get<int64_t>() != 1))
          k.bad("no_rope_layers", "must flag each layer with 1 (rope) or 0 (none)");
        if (f.get<int64_t>() == 0) c.nope_layers.push_back(i);
      }
    } else {
      const int64_t every = k.integer("no_rope_layer_interval", 4);
      if (every < 1) k.bad("no_rope_layer_interval", "must be a positive count of layers");
      for (int64_t i = every - 1; i < c.n_layer; i += every) c.nope_layers.push_back(i);
    }
    // Without layer_types, SmolLM3Config windows the layers without rope.
    if (k.boolean("use_sliding_window", false) && !k.has("layer_types") &&
        k.has("sliding_window")) {
      windowed = true;
      full.clear();
      for (int64_t i = 0; i < c.n_layer; ++i) {
        if (!std::binary_search(c.nope_layers.begin(), c.nope_layers.end(), i)) full.push_back(i);
      }
    }
  }
  if (windowed && static_cast<int64_t>(full.size()) < c.n_layer) {
    const int64_t w = k.integer("sliding_window");
    if (w < 1) k.unsupported("sliding_window", "a window must hold at least one key");
    // Gemma 3's local layers turn by a RoPE base of their own, unscaled,
    // which the window marks out even when it is as long as the context.
    const double local = type == "gemma3_text" ? k.number("rope_local_base_freq", 10000.0) : 0.0;
    const bool local_rope = local > 0.0 && (local != c.rope_theta || c.rope_scaling.scaled());
    if (w < c.seq_len || local_rope) {
      c.sliding_window = w;
      c.full_attention_layers = full;
      if (local_rope) c.rope_local_theta = local;
    }
  }
  return c;
}

// A mixture's count of experts (`experts_key`) and the top
// num_experts_per_tok each token takes.
void read_expert_counts(const Keys& k, const char* experts_key, nn::GptConfig::Moe& m) {
  m.experts = k.integer(experts_key);
  if (m.experts < 1) k.bad(experts_key, "must be positive");
  m.top_k = k.integer("num_experts_per_tok");
  if (m.top_k < 1 || m.top_k > m.experts)
    k.bad("num_experts_per_tok", "must be between 1 and the number of experts");
}

// Mixtral's and MiniMax-M2's router_jitter_noise: while training their
// routers multiply each token by noise drawn from [1 - j, 1 + j]; Triad's
// routers read the tokens as they are, so a file asking for noise is
// refused rather than trained otherwise (0, the published files' value,
// reads as none).
void refuse_router_jitter(const Keys& k) {
  if (k.number("router_jitter_noise", 0.0) != 0.0)
    k.unsupported("router_jitter_noise",
                  "Triad's routers take the tokens without jitter; set it to 0");
}

// Mixtral's, Qwen2-MoE's and Qwen3-MoE's mixtures of experts over
// Mistral's, Qwen2's and Qwen3's blocks: num_local_experts (Mixtral) or
// num_experts, num_experts_per_tok chosen, renormalised (always for
// Mixtral, norm_topk_prob for Qwen), the experts' width (Mixtral's
// intermediate_size, Qwen's moe_intermediate_size beside its dense layers'
// intermediate_size), Qwen's dense layers (mlp_only_layers, and those
// between its decoder_sparse_step), and Qwen2-MoE's gated shared expert
// (shared_expert_intermediate_size). The load-balancing loss weighs router_aux_loss_coef
// (the recipe the file was trained with: transformers applies it only with
// output_router_logits, Triad always; model.moe.aux_loss_coef: 0 trains
// without it).
nn::GptConfig moe_config(const Keys& k, const std::string& type) {
  const bool mixtral = type == "mixtral";
  nn::GptConfig c = llama_config(k, mixtral ? "mistral" : type == "qwen2_moe" ? "qwen2" : "qwen3");
  nn::GptConfig::Moe& m = c.moe;
  read_expert_counts(k, mixtral ? "num_local_experts" : "num_experts", m);
  m.normalize_top_k = mixtral || k.boolean("norm_topk_prob", false);
  m.aux_loss_coef = k.number("router_aux_loss_coef", 0.001);  // (both classes' default)
  refuse_router_jitter(k);
  if (mixtral) return c;  // (intermediate_size is the experts' width)
  m.ffn_hidden_size = k.integer("moe_intermediate_size");
  if (type == "qwen2_moe") {
    m.shared_ffn_hidden_size = k.integer("shared_expert_intermediate_size");
    if (m.shared_ffn_hidden_size < 1)
      k.bad("shared_expert_intermediate_size", "must be positive (Qwen2-MoE's shared expert)");
    m.shared_gate = true;
  }
  const int64_t step = k.integer("decoder_sparse_step", 1);
  if (step < 1) k.bad("decoder_sparse_step", "must be positive");
  std::vector<int64_t> dense;
  if (k.has("mlp_only_layers")) {
    const Json& list = k.json("mlp_only_layers");
    if (!list.is_array()) k.bad("mlp_only_layers", "must be a list of layer indices");
    for (const Json& v : list) {
      if (!v.is_number_integer()) k.bad("mlp_only_layers", "must be a list of layer indices");
      dense.push_back(v.get<int64_t>());
    }
  }
  for (int64_t i = 0; i < c.n_layer; ++i) {
    if ((i + 1) % step != 0) dense.push_back(i);
  }
  std::sort(dense.begin(), dense.end());
  dense.erase(std::unique(dense.begin(), dense.end()), dense.end());
  m.dense_layers = dense;  // (validate() names one outside the model)
  return c;
}

// DeepSeek-V3's mixture on LLaMA-style blocks (llama_config's `type`), as
// GLM-4.5 (glm4_moe: GLM-4.5, GLM-4.5-Air, GLM-4.6) and dots.llm1 (dots1)
// hold it: the first first_k_dense_replace layers dense
// (intermediate_size), the others n_routed_experts of
// moe_intermediate_size, each scored by a sigmoid, the top
// num_experts_per_tok chosen with the router's e_score_correction_bias
// (model.moe.expert_bias) among the topk_group best of n_group groups,
// renormalised under norm_topk_prob and scaled by routed_scaling_factor,
// beside a shared expert of n_shared_experts * moe_intermediate_size,
// ungated. Their files carry no load-balancing loss: the biases balance
// (model.moe.bias_update_rate, at its default). GLM-4.5's defaults: one
// dense layer, one shared expert, renormalised; dots1's: none dense, the
// shared experts given, not renormalised.
//
// DeepSeek-V3 (deepseek_v3; Kimi K2's kimi_k2 files, the same class): that
// mixture (DeepseekV3Config's defaults: three dense layers, one shared
// expert, renormalised, scaled by 2.5, 8 groups, the best 4) on LLaMA's
// blocks whose attention is multi-head latent attention (model.mla:
// kv_lora_rank, q_lora_rank (null: queries straight from x),
// qk_nope_head_dim, qk_rope_head_dim, v_head_dim), its rope turning
// interleaved pairs (rope_interleave, which the weights' reader reorders
// into halves) and yarn's mscale and mscale_all_dim as Hugging Face's.
//
// DeepSeek-V2 (deepseek_v2: V2, V2-Lite, V2.5, Coder-V2): the same
// attention, and DeepSeekMoE's routing: a softmax over the experts, the
// top num_experts_per_tok (greedy, or group_limited_greedy: among the
// topk_group best of n_group groups, a group scored by its best expert)
// times routed_scaling_factor, not renormalised, no expert biases; the
// expert-level balance loss aux_loss_alpha, per sequence under seq_aux (its
// device-level and communication losses are not built). DeepseekV2Config's
// defaults: no dense layer, two shared experts, experts 1407 wide.
nn::GptConfig deepseek_moe_config(const Keys& k, const std::string& type) {
  const bool glm = type == "glm4_moe", v2 = type == "deepseek_v2";
  const bool v3 = type == "deepseek_v3" || type == "kimi_k2", mla = v2 || v3;
  nn::GptConfig c = llama_config(k, type);
  nn::GptConfig::Moe& m = c.moe;
  if (mla) {
    // DeepseekV2Config's and DeepseekV3Config's head_dim is qk_rope_head_dim
    // (for their rotary embeddings); the heads' widths are model.mla's.
    c.head_size = 0;
    c.rope_dim = 0;
    c.mla.kv_lora_rank = k.integer("kv_lora_rank", 512);
    c.mla.q_lora_rank = k.names("q_lora_rank") && k.json("q_lora_rank").is_null()
                            ? 0
                            : k.integer("q_lora_rank", 1536);
    if (c.mla.q_lora_rank == 0 && k.has("q_lora_rank"))
      k.bad("q_lora_rank", "must be positive, or null for queries straight from the input");
    c.mla.qk_nope_head_dim = k.integer("qk_nope_head_dim", 128);
    c.mla.qk_rope_head_dim = k.integer("qk_rope_head_dim", 64);
    c.mla.v_head_dim = k.integer("v_head_dim", 128);
    if (!k.boolean("rope_interleave", true))
      k.unsupported(
          "rope_interleave",
          "Triad reads DeepSeek's rope rows as its files hold them, in interleaved pairs");
    if (k.integer("moe_layer_freq", 1) != 1)
      k.unsupported("moe_layer_freq", "every layer after the dense ones is a mixture");
  }
  if (v3) {
    if (k.text("topk_method", "noaux_tc") != "noaux_tc")
      k.unsupported("topk_method", "DeepSeek-V3's routing is noaux_tc (biased sigmoid scores)");
    if (k.text("scoring_func", "sigmoid") != "sigmoid")
      k.unsupported("scoring_func", "DeepSeek-V3's experts are scored by sigmoids");
  }
  read_expert_counts(k, "n_routed_experts", m);
  m.ffn_hidden_size = k.integer("moe_intermediate_size", v3 ? 2048 : v2 ? 1407 : 1408);
  m.routed_scaling_factor = k.number("routed_scaling_factor", v3 ? 2.5 : 1.0);
  if (v2) {
    if (k.text("scoring_func", "softmax") != "softmax")
      k.unsupported("scoring_func", "DeepSeek-V2's experts are scored by a softmax");
    if (k.boolean("norm_topk_prob", false))
      k.unsupported("norm_topk_prob",
                    "DeepSeek-V2's published gates are its softmax scores times "
                    "routed_scaling_factor; renormalised, DeepSeek's code drops the scale and "
                    "Hugging Face's the renormalisation");
    m.score = nn::GptConfig::Moe::Score::Softmax;
    m.normalize_top_k = false;
    const std::string method = k.text("topk_method", "greedy");
    if (method == "group_limited_greedy") {
      m.groups = k.integer("n_group");
      m.top_groups = k.integer("topk_group");
      if (m.groups < 1 || m.experts % m.groups != 0)
        k.bad("n_group", "must divide n_routed_experts into equal groups");
      if (m.groups > 1) m.group_score = nn::GptConfig::Moe::GroupScore::Max;
    } else if (method != "greedy") {
      k.unsupported("topk_method",
                    "DeepSeek-V2 routes greedy or group_limited_greedy (a group scored by its "
                    "best expert)");
    }
    m.aux_loss_coef = k.number("aux_loss_alpha", 0.001);
    if (k.boolean("seq_aux", true)) m.aux_loss_scope = nn::GptConfig::Moe::BalanceScope::Sequence;
  } else {
    m.normalize_top_k = k.boolean("norm_topk_prob", glm || v3);
    m.score = nn::GptConfig::Moe::Score::Sigmoid;
    m.groups = k.integer("n_group", v3 ? 8 : 1);
    m.top_groups = k.integer("topk_group", v3 ? 4 : 1);
    if (k.has("n_group") && (m.groups < 1 || m.experts % m.groups != 0 || m.experts / m.groups < 2))
      k.bad("n_group",
            "must divide n_routed_experts into groups of at least 2 (each group is scored by its "
            "two best)");
    m.expert_bias = true;
    m.aux_loss_coef = 0;
  }
  const int64_t shared = glm || v3 ? k.integer("n_shared_experts", 1)
                         : v2      ? k.integer("n_shared_experts", 2)
                                   : k.integer("n_shared_experts");
  if (shared < 0) k.bad("n_shared_experts", "must be a count >= 0");
  m.shared_ffn_hidden_size = shared * m.ffn_hidden_size;
  const int64_t dense = k.integer("first_k_dense_replace", v3 ? 3 : glm ? 1 : 0);
  if (dense < 0) k.bad("first_k_dense_replace", "must be a count of layers >= 0");
  // Every layer dense: a dense model (its expert keys describe nothing).
  if (mla && dense >= c.n_layer) {
    m = {};
    return c;
  }
  for (int64_t i = 0; i < std::min(dense, c.n_layer); ++i) m.dense_layers.push_back(i);
  return c;
}

// MiniMax-M2 (minimax_m2: MiniMax-M2, M2.1, M2.5): LLaMA's blocks with
// OLMo 2's query/key norms, one RMSNorm over all the queries and one over
// all the keys (use_qk_norm with qk_norm_type per_layer; Hugging Face's
// class always has them), the first rotary_dim of each head turned in
// halves (or partial_rotary_factor of it, transformers' newer name for the
// same share; given both, they must agree), RoPE's base 5e6 when left
// out; and a mixture on every layer: num_local_experts SwiGLU experts of
// intermediate_size, each scored by a sigmoid, the top num_experts_per_tok
// chosen with the router's e_score_correction_bias
// (block_sparse_moe.e_score_correction_bias; model.moe.expert_bias) among
// all of them, renormalised, unscaled, no shared expert. The biases
// balance, as DeepSeek-V3's do: no load-balancing loss (transformers
// computes router_aux_loss_coef's only under output_router_logits, and
// then Mixtral's softmax form, not this router's). What the class does not
// build is refused by name: linear attention layers in attn_type_list
// (MiniMax-01's), norms on each head, grouped or scaled routing, a shared
// expert, a noisy router. The multi-token-prediction modules
// (num_mtp_modules) are left unread, as Hugging Face's inference leaves
// them.
nn::GptConfig minimax_m2_config(const Keys& k) {
  nn::GptConfig c = llama_config(k, "minimax_m2");
  if (k.has("rotary_dim") && c.n_head > 0) {
    const int64_t r = k.integer("rotary_dim"), d = c.head_dim();
    if (r < 2 || r > d || r % 2 != 0)
      k.bad("rotary_dim", "must be an even width of at most head_dim (" + std::to_string(d) + ")");
    c.rope_dim = r == d ? 0 : r;
    if (k.has("partial_rotary_factor") &&
        rotated_dims(k, "partial_rotary_factor", 1.0, c) != c.rope_dim)
      k.bad("partial_rotary_factor",
            "disagrees with rotary_dim (" + std::to_string(r) + " of " + std::to_string(d) + ")");
  } else {
    c.rope_dim = rotated_dims(k, "partial_rotary_factor", 1.0, c);
  }
  if (!k.boolean("use_qk_norm", true))
    k.unsupported("use_qk_norm",
                  "Hugging Face's MiniMaxM2 normalises its queries and keys whatever the key says");
  if (k.text("qk_norm_type", "per_layer") != "per_layer")
    k.unsupported("qk_norm_type",
                  "MiniMax-M2's query/key norms span all the heads (per_layer); Triad does not "
                  "read another kind under this class");
  nn::set_qk_norm(c, "full");
  if (k.has("attn_type_list")) {
    const Json& kinds = k.json("attn_type_list");
    if (!kinds.is_array()) k.bad("attn_type_list", "must list each layer's attention kind");
    for (const Json& v : kinds) {
      if (!v.is_number_integer() || v.get<int64_t>() != 1)
        k.unsupported("attn_type_list",
                      "every layer must be softmax attention (1); MiniMax-01's linear "
                      "(lightning) attention is not built");
    }
  }
  nn::GptConfig::Moe& m = c.moe;
  read_expert_counts(k, "num_local_experts", m);
  if (k.text("scoring_func", "sigmoid") != "sigmoid")
    k.unsupported("scoring_func", "MiniMax-M2's experts are scored by sigmoids");
  if (k.boolean("use_grouped_topk", false))
    k.unsupported("use_grouped_topk", "Hugging Face's MiniMaxM2 chooses among all the experts");
  if (k.number("routed_scaling_factor", 1.0) != 1.0)
    k.unsupported("routed_scaling_factor", "Hugging Face's MiniMaxM2 leaves its gates unscaled");
  if (k.integer("shared_intermediate_size", 0) != 0)
    k.unsupported("shared_intermediate_size", "MiniMax-M2's class has no shared expert");
  refuse_router_jitter(k);
  m.score = nn::GptConfig::Moe::Score::Sigmoid;
  m.expert_bias = true;
  m.normalize_top_k = true;
  m.aux_loss_coef = 0;
  return c;
}

// GraniteMoE (GraniteMoeForCausalLM): Granite's blocks (its multipliers
// too) with a mixture on every layer: num_local_experts SwiGLU experts of
// intermediate_size, the top num_experts_per_tok of the router's logits
// softmaxed among themselves (Triad's renormalised top k), and
// router_aux_loss_coef as the load-balancing loss's weight.
// GraniteMoeShared: and a shared expert of shared_intermediate_size (0:
// none) every token takes, ungated.
nn::GptConfig granite_moe_config(const Keys& k, const std::string& type) {
  nn::GptConfig c = llama_config(k, "granite");
  nn::GptConfig::Moe& m = c.moe;
  read_expert_counts(k, "num_local_experts", m);
  m.normalize_top_k = true;
  m.aux_loss_coef = k.number("router_aux_loss_coef", 0.001);  // (GraniteMoeConfig's default)
  if (type == "granitemoeshared") {
    m.shared_ffn_hidden_size = k.integer("shared_intermediate_size", 0);
    if (m.shared_ffn_hidden_size < 0)
      k.bad("shared_intermediate_size", "must be 0 (no shared expert) or positive");
  }
  return c;
}

// OLMo (OlmoForCausalLM): LLaMA's blocks with LayerNorms that learn
// nothing (no weight, no bias, eps 1e-5: model.norm_affine false), and
// clip_qkv's clamp on q, k and v (model.clip_qkv).
// OLMo 2 (Olmo2ForCausalLM): LLaMA's blocks whose sublayers read the
// residual stream itself, each output normalised instead
// (post_attention_layernorm, post_feedforward_layernorm), with one RMSNorm
// over all the queries and one over all the keys (q_norm, k_norm) before
// the rotation. OLMoE (OlmoeForCausalLM): LLaMA's pre-norm blocks with
// those query/key norms and a mixture of num_experts experts of
// intermediate_size on every layer, num_experts_per_tok chosen,
// renormalised when norm_topk_prob says so, and clip_qkv as OLMo's.
// EXAONE 4.0 (LG AI Research's, "exaone4"): OLMo 2's blocks (norms on the
// sublayers' outputs alone) with Qwen3's RMSNorm over each query and key
// head. With a sliding_window, the layers layer_types names (else
// sliding_window_pattern's: every 4th, or a string such as "LLLG") are
// global and turn by no rope, the others windowed; without one (null),
// every layer is global and turns.
nn::GptConfig exaone4_blocks(const Keys& k, nn::GptConfig c) {
  c.pre_norms = false;
  c.post_norms = true;
  nn::set_qk_norm(c, "true");
  c.sliding_window = 0;
  c.full_attention_layers.clear();
  if (!k.has("sliding_window")) return c;
  std::vector<int64_t> global;
  if (k.has("layer_types")) {
    global = k.full_attention_layers(c.n_layer);
  } else if (k.has("sliding_window_pattern") && k.json("sliding_window_pattern").is_string()) {
    const std::string pattern = k.text("sliding_window_pattern", "");
    if (pattern.empty() || pattern.find_first_not_of("LG") != std::string::npos)
      k.unsupported("sliding_window_pattern", "expected a string of L (local) and G (global)");
    for (int64_t i = 0; i < c.n_layer; ++i) {
      if (pattern[static_cast<size_t>(i) % pattern.size()] == 'G') global.push_back(i);
    }
  } else {
    const int64_t every = k.integer("sliding_window_pattern", 4);
    if (every < 1) k.unsupported("sliding_window_pattern", "expected a positive count of layers");
    for (int64_t i = every - 1; i < c.n_layer; i += every) global.push_back(i);
  }
  c.nope_layers = global;
  const int64_t w = k.integer("sliding_window");
  if (w < 1) k.unsupported("sliding_window", "a window must hold at least one key");
  // (A window as long as the context changes nothing; the global layers
  // still turn by no rope.)
  if (static_cast<int64_t>(global.size()) < c.n_layer && w < c.seq_len) {
    c.sliding_window = w;
    c.full_attention_layers = global;
  }
  return c;
}

nn::GptConfig olmo_config(const Keys& k, const std::string& type) {
  nn::GptConfig c = llama_config(k, "llama");
  // q, k and v clamped to [-clip_qkv, clip_qkv] (OLMo 7B 0424's and
  // 0724's 8); null is none.
  if ((type == "olmo" || type == "olmoe") && k.has("clip_qkv")) {
    c.clip_qkv = k.number("clip_qkv", 0.0);
    if (!(c.clip_qkv > 0.0)) k.bad("clip_qkv", "must be a positive number, or null for none");
  }
  if (type == "olmo") {
    c.normalization = nn::Normalization::LayerNorm;
    c.norm_affine = false;
    c.layer_norm_eps = 1e-5;  // (OlmoLayerNorm's, fixed)
    return c;
  }
  c.layer_norm_eps = k.number("rms_norm_eps", 1e-5);  // (both classes' default)
  if (type == "exaone4") return exaone4_blocks(k, c);
  nn::set_qk_norm(c, "full");
  if (type == "olmo2" || type == "olmo3") {
    c.pre_norms = false;
    c.post_norms = true;
  }
  if (type == "olmo3") {
    // OLMo 3: OLMo 2's blocks with a window (sliding_window, 4096 when left
    // out) on the layers layer_types names sliding_attention, else on three
    // of every four (each fourth global); the windowed layers turn
    // unscaled at rope_theta (a scaled RoPE, yarn for the long context,
    // turns the global ones alone), which the window marks out even when it
    // is as long as the context.
    std::vector<int64_t> full;
    if (k.has("layer_types")) {
      full = k.full_attention_layers(c.n_layer);
    } else {
      for (int64_t i = 3; i < c.n_layer; i += 4) full.push_back(i);
    }
    c.sliding_window = 0;
    c.full_attention_layers.clear();
    if (static_cast<int64_t>(full.size()) < c.n_layer) {
      const int64_t w = k.integer("sliding_window", 4096);
      if (w < 1) k.unsupported("sliding_window", "a window must hold at least one key");
      const bool local_rope = c.rope_scaling.scaled();
      if (w < c.seq_len || local_rope) {
        c.sliding_window = w;
        c.full_attention_layers = full;
        if (local_rope) c.rope_local_theta = c.rope_theta;
      }
    }
  }
  if (type == "olmo2" || type == "olmo3") return c;
  nn::GptConfig::Moe& m = c.moe;
  read_expert_counts(k, "num_experts", m);
  m.normalize_top_k = k.boolean("norm_topk_prob", false);
  m.aux_loss_coef = k.number("router_aux_loss_coef", 0.01);
  return c;
}

// GPT-2's names for the widths, depth, vocabulary and context (GPT-J's and
// CodeGen's too).
nn::GptConfig gpt2_dimensions(const Keys& k) {
  nn::GptConfig c;
  c.n_layer = k.integer("n_layer");
  c.n_head = k.integer("n_head");
  c.d_model = k.integer("n_embd");
  c.vocab_size = k.integer("vocab_size");
  c.seq_len = k.integer("n_positions");
  c.ffn_hidden_size = k.integer("n_inner", 0);
  return c;
}

// GPT2LMHeadModel: learned positions, GELU (tanh), LayerNorm, biases, a
// tied head.
nn::GptConfig gpt2_config(const Keys& k) {
  nn::GptConfig c = gpt2_dimensions(k);
  c.layer_norm_eps = k.number("layer_norm_epsilon", 1e-5);
  c.tie_embeddings = k.boolean("tie_word_embeddings", true);
  c.activation = gelu_named(k, "activation_function", "gelu_new");
  return c;
}

// GPTNeoXForCausalLM (Pythia's): rotary embeddings on the first rotary_pct
// of each head, GELU (exact by default), LayerNorm, biases on every linear
// layer, an untied head (embed_out), and by default the parallel residual.
// Newer transformers name rotary_pct and rotary_emb_base
// partial_rotary_factor and rope_theta; either is read.
nn::GptConfig gpt_neox_config(const Keys& k) {
  nn::GptConfig c = decoder_dimensions(k);  // (GPTNeoXConfig has no num_key_value_heads)
  c.layer_norm_eps = k.number("layer_norm_eps", 1e-5);
  c.tie_embeddings = k.boolean("tie_word_embeddings", false);
  c.parallel_residual = k.boolean("use_parallel_residual", true);
  c.activation = gelu_named(k, "hidden_act", "gelu");
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.rope_theta = k.number("rotary_emb_base", k.number("rope_theta", 10000.0));
  if (k.has("rope_scaling")) c.rope_scaling = k.rope_scaling(static_cast<double>(c.seq_len));
  c.rope_dim =
      rotated_dims(k, k.has("rotary_pct") ? "rotary_pct" : "partial_rotary_factor", 0.25, c);
  if (!k.boolean("attention_bias", true))
    k.unsupported("attention_bias", "Triad's GPT-NeoX blocks have biases on every linear layer");
  return c;
}

// CohereForCausalLM (Command R, Aya 23, Aya Expanse): LLaMA's attention and
// SwiGLU MLP as parallel sublayers reading one LayerNorm without a bias
// (layer_norm_eps), rotary embeddings turning q and k in interleaved pairs
// (the weights' reader reorders them into Triad's halves), no linear
// biases, a tied head by default, and the logits times logit_scale.
// Command R+'s per-head query/key LayerNorms (use_qk_norm) are
// model.qk_norm: head_layernorm.
// Cohere2ForCausalLM ("cohere2"): the same blocks, its global layers
// without rope and the others windowed.
nn::GptConfig cohere_config(const Keys& k, const std::string& type) {
  nn::GptConfig c = decoder_dimensions(k);
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.rope_theta = k.number("rope_theta", 10000.0);
  if (k.has("rope_scaling")) c.rope_scaling = k.rope_scaling(static_cast<double>(c.seq_len));
  c.layer_norm_eps = k.number("layer_norm_eps", 1e-5);
  c.norm_bias = false;
  c.activation = nn::Activation::SwiGlu;
  c.linear_bias = false;
  c.parallel_residual = c.shared_norm = true;
  c.tie_embeddings = k.boolean("tie_word_embeddings", true);
  c.logit_scale = k.number("logit_scale", 0.0625);  // (CohereConfig's default)
  if (!(c.logit_scale > 0.0) || !std::isfinite(c.logit_scale))
    k.bad("logit_scale", "must be a positive number");
  if (k.text("hidden_act", "silu") != "silu")
    k.unsupported("hidden_act", "Triad's gated MLP is SwiGLU (silu)");
  if (k.boolean("attention_bias", false))
    k.unsupported("attention_bias", "Triad's Cohere blocks have no attention biases");
  if (k.boolean("use_qk_norm", false)) nn::set_qk_norm(c, "head_layernorm");
  if (type == "cohere2") {
    // Cohere 2 (Command R7B, Command A): local layers with rope and a
    // window, every sliding_window_pattern-th (4th) layer global and
    // without rope (layer_types, in newer files, names each).
    std::vector<int64_t> global;
    if (k.has("layer_types")) {
      global = k.full_attention_layers(c.n_layer);
    } else {
      const int64_t every = k.integer("sliding_window_pattern", 4);
      if (every < 1) k.unsupported("sliding_window_pattern", "expected a positive count of layers");
      for (int64_t i = every - 1; i < c.n_layer; i += every) global.push_back(i);
    }
    c.nope_layers = global;
    const int64_t w = k.integer("sliding_window", 4096);
    if (w < 1) k.unsupported("sliding_window", "a window must hold at least one key");
    // (A window as long as the context changes nothing.)
    if (static_cast<int64_t>(global.size()) < c.n_layer && w < c.seq_len) {
      c.sliding_window = w;
      c.full_attention_layers = global;
    }
  }
  return c;
}

// Starcoder2ForCausalLM (StarCoder2 3B, 7B, 15B): the sequential block with
// rotary embeddings on whole heads, LayerNorm (norm_epsilon), an ungated
// GELU MLP (c_fc, c_proj; tanh's by default), biases on every linear layer
// when use_bias says so (the norms always have theirs), grouped key/value
// heads, Mistral's window on every layer (null: none), and a tied head by
// default.
nn::GptConfig starcoder2_config(const Keys& k) {
  nn::GptConfig c = decoder_dimensions(k);
  c.layer_norm_eps = k.number("norm_epsilon", 1e-5);
  c.tie_embeddings = k.boolean("tie_word_embeddings", true);
  c.activation = gelu_named(k, "hidden_act", "gelu_pytorch_tanh");
  c.linear_bias = k.boolean("use_bias", true);
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.rope_theta = k.number("rope_theta", 10000.0);
  if (k.has("rope_scaling")) c.rope_scaling = k.rope_scaling(static_cast<double>(c.seq_len));
  if (k.has("sliding_window")) {
    const int64_t w = k.integer("sliding_window");
    if (w < 1) k.unsupported("sliding_window", "a window must hold at least one key");
    if (w < c.seq_len) c.sliding_window = w;  // (one as long as the context changes nothing)
  }
  return c;
}

// NemotronForCausalLM (Nemotron-4, Minitron 4B and 8B, Nemotron-Mini): the
// sequential block with rotary embeddings on partial_rotary_factor of each
// head (half by default) turned in halves, LayerNorm1P (a LayerNorm with
// its bias, scaling by 1 + weight: model.norm_weight_offset) of norm_eps,
// an ungated MLP (up_proj, down_proj) of squared ReLU by default, grouped
// key/value heads, heads of their own width (head_dim), no linear biases
// unless attention_bias and mlp_bias say so, and an untied head by
// default.
nn::GptConfig nemotron_config(const Keys& k) {
  nn::GptConfig c = decoder_dimensions(k);
  c.normalization = nn::Normalization::LayerNorm;
  c.layer_norm_eps = k.number("norm_eps", 1e-5);
  c.norm_weight_offset = true;
  c.tie_embeddings = k.boolean("tie_word_embeddings", false);
  c.activation = ungated_activation(k, "Nemotron");
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.rope_theta = k.number("rope_theta", 10000.0);
  if (k.has("rope_scaling")) c.rope_scaling = k.rope_scaling(static_cast<double>(c.seq_len));
  if (k.has("head_dim") && k.integer("head_dim") * c.n_head != c.d_model)
    c.head_size = k.integer("head_dim");
  c.rope_dim = rotated_dims(k, "partial_rotary_factor", 0.5, c);
  // attention_bias puts biases on q, k, v and o_proj; mlp_bias on up_proj
  // and down_proj. Triad's attention output projection has one only beside
  // every other linear layer's.
  const bool attention = k.boolean("attention_bias", false), mlp = k.boolean("mlp_bias", false);
  if (attention && !mlp)
    k.unsupported("attention_bias",
                  "Triad's attention output projection has a bias only beside every other "
                  "linear layer's (set mlp_bias too, or neither)");
  c.linear_bias = attention && mlp;
  c.mlp_bias = mlp && !attention;
  return c;
}

// PhiForCausalLM (Phi-1, Phi-1.5, Phi-2): rotary embeddings on
// partial_rotary_factor of each head (half by default), GELU (tanh by
// default), LayerNorm, biases on every linear layer, the parallel residual
// with one norm for both sublayers, and an untied head with a bias.
nn::GptConfig phi_config(const Keys& k) {
  nn::GptConfig c = decoder_dimensions(k);
  c.layer_norm_eps = k.number("layer_norm_eps", 1e-5);
  c.tie_embeddings = k.boolean("tie_word_embeddings", false);
  c.parallel_residual = c.shared_norm = c.head_bias = true;
  c.activation = gelu_named(k, "hidden_act", "gelu_new");
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.rope_theta = k.number("rope_theta", 10000.0);
  if (k.has("rope_scaling")) c.rope_scaling = k.rope_scaling(static_cast<double>(c.seq_len));
  c.rope_dim = rotated_dims(k, "partial_rotary_factor", 0.5, c);
  if (k.boolean("qk_layernorm", false))
    k.unsupported("qk_layernorm", "Phi's per-head LayerNorms are not implemented");
  return c;
}

// FalconForCausalLM (Falcon 7B, 40B, 180B, Falcon 2 11B): rotary embeddings
// on whole heads, GELU (exact by default), LayerNorm, linear biases only
// when `bias` says so, a tied head by default, and key/value heads as
// multi_query (one) or the new decoder architecture (num_kv_heads) say. The
// blocks are parallel: one norm for both sublayers (parallel_attn, or
// num_ln_in_parallel_attn 1), or the new decoder architecture's two
// (ln_attn and ln_mlp); parallel_attn false is the sequential block.
// FalconConfig's defaults for the keys a file leaves out.
nn::GptConfig falcon_config(const Keys& k) {
  nn::GptConfig c;
  c.n_layer = k.integer("num_hidden_layers");
  c.n_head = k.integer("num_attention_heads");
  c.d_model = k.integer("hidden_size");
  c.vocab_size = k.integer("vocab_size");
  c.seq_len = k.integer("max_position_embeddings", 2048);
  c.ffn_hidden_size = k.integer("ffn_hidden_size", 0);  // 0: 4 * d_model, as Falcon's None
  c.layer_norm_eps = k.number("layer_norm_epsilon", 1e-5);
  c.tie_embeddings = k.boolean("tie_word_embeddings", true);
  c.linear_bias = k.boolean("bias", false);
  c.activation = gelu_named(k, "activation", "gelu");
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.rope_theta = k.number("rope_theta", 10000.0);
  if (k.has("rope_scaling")) c.rope_scaling = k.rope_scaling(static_cast<double>(c.seq_len));
  if (k.boolean("alibi", false))
    k.unsupported("alibi",
                  "ALiBi's position biases are not implemented (Triad's Falcon turns by "
                  "rotary embeddings)");
  if (k.boolean("apply_residual_connection_post_layernorm", false)) {
    k.unsupported("apply_residual_connection_post_layernorm",
                  "a residual taken after the norm is not implemented (Triad's blocks add the "
                  "sublayers to their input)");
  }
  const bool new_architecture = k.boolean("new_decoder_architecture", false);
  const int64_t kv = new_architecture                 ? k.integer("num_kv_heads", c.n_head)
                     : k.boolean("multi_query", true) ? 1
                                                      : c.n_head;
  c.n_kv_head = kv == c.n_head ? 0 : kv;
  if (new_architecture) {
    const int64_t norms = k.integer("num_ln_in_parallel_attn", 2);
    if (norms != 1 && norms != 2) k.bad("num_ln_in_parallel_attn", "must be 1 or 2");
    c.parallel_residual = true;
    c.shared_norm = norms == 1;
  } else {
    c.parallel_residual = c.shared_norm = k.boolean("parallel_attn", true);
  }
  return c;
}

// GPTJForCausalLM (GPT-J 6B): GPT-2's keys for the widths and depth, rotary
// embeddings on rotary_dim of each head (64 when left out) at a base of
// 10000, turned in interleaved pairs (the weights' reader reorders q's and
// k's rows into the halves Triad turns), the parallel residual with one
// norm, no biases in the attention but the MLP's, GELU (tanh by default),
// and an untied head with a bias.
nn::GptConfig gptj_config(const Keys& k, const std::string& type) {
  nn::GptConfig c = gpt2_dimensions(k);
  c.layer_norm_eps = k.number("layer_norm_epsilon", 1e-5);
  c.tie_embeddings = k.boolean("tie_word_embeddings", false);
  c.activation = gelu_named(k, "activation_function", "gelu_new");
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.parallel_residual = c.shared_norm = c.head_bias = true;
  c.linear_bias = false;
  c.mlp_bias = true;
  if (c.n_head > 0 && c.d_model % c.n_head == 0) {
    // (CodeGen turns whole heads' worth of the model's width without it.)
    if (type == "codegen" && !k.has("rotary_dim"))
      k.unsupported("rotary_dim", "CodeGen without rotary_dim is not implemented");
    const int64_t r = k.integer("rotary_dim", 64);  // (validate() names a default misfit)
    if (k.has("rotary_dim") && (r < 2 || r > c.head_dim() || r % 2 != 0))
      k.bad("rotary_dim", "must be an even count of dimensions, at most each head's " +
                              std::to_string(c.head_dim()));
    c.rope_dim = r == c.head_dim() ? 0 : r;
  }
  return c;
}

// transformers 5's rope_parameters in the older keys every reader here
// takes: rope_theta, rope_scaling (its scaling kind's keys), and
// partial_rotary_factor; Phi-3's longrope keeps its pretrained context at the
// top level (original_max_position_embeddings). Given per layer kind
// ({"full_attention": {...}, "sliding_attention": {...}}), the full layers'
// parameters are the model's and Gemma 3's windowed layers' base its
// rope_local_base_freq; any other model's windowed layers must turn as its
// full ones do. A key given both ways must agree. Without rope_parameters,
// the object as it is.
Json with_rope_parameters_flattened(Json j, const std::string& source) {
  if (!j.contains("rope_parameters") || j.at("rope_parameters").is_null()) return j;
  const Json params = j.at("rope_parameters");
  const std::string type = string_entry(j, "model_type", "", source, "");
  auto fail = [&](const std::string& why) {
    throw ConfigError(source + ": 'rope_parameters' (" + params.dump() + "): " + why);
  };
  if (!params.is_object()) fail("expected an object");
  const bool per_kind =
      !params.empty() && std::all_of(params.items().begin(), params.items().end(), [](auto&& kv) {
        return (kv.key() == "full_attention" || kv.key() == "sliding_attention") &&
               kv.value().is_object();
      });
  const Json full = per_kind ? params.value("full_attention", Json::object()) : params;
  // One key at the top level: set from rope_parameters, or there already
  // with the same value.
  auto set = [&](const char* key, const Json& value) {
    if (j.contains(key) && !j.at(key).is_null() && j.at(key) != value) {
      throw ConfigError(source + ": '" + key + "' (" + j.at(key).dump() +
                        ") and rope_parameters' " + key + " (" + value.dump() + ") disagree");
    }
    j[key] = value;
  };
  auto kind_of = [&](const Json& p, const std::string& path = "rope_parameters") {
    return string_entry(p, "rope_type", string_entry(p, "type", "default", source, path), source,
                        path);
  };
  if (full.contains("rope_theta")) set("rope_theta", full.at("rope_theta"));
  if (full.contains("partial_rotary_factor"))
    set("partial_rotary_factor", full.at("partial_rotary_factor"));
  const std::string kind = kind_of(full);
  if (kind != "default") {
    Json scaling = full;
    scaling.erase("rope_theta");
    scaling.erase("partial_rotary_factor");
    if ((kind == "longrope" || kind == "su") &&
        scaling.contains("original_max_position_embeddings")) {
      set("original_max_position_embeddings", scaling.at("original_max_position_embeddings"));
      scaling.erase("original_max_position_embeddings");
    }
    if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null()) {
      // (The older key beside the newer one: each of its entries the same.)
      const Json& older = j.at("rope_scaling");
      if (!older.is_object() || kind_of(older, "rope_scaling") != kind) {
        throw ConfigError(source + ": 'rope_scaling' (" + older.dump() + ") and rope_parameters (" +
                          params.dump() + ") disagree");
      }
      for (const auto& [key, value] : older.items()) {
        if (key != "type" && key != "rope_type" && scaling.contains(key) &&
            scaling.at(key) != value)
          throw ConfigError(source + ": 'rope_scaling." + key + "' (" + value.dump() +
                            ") and rope_parameters' " + key + " (" + scaling.at(key).dump() +
                            ") disagree");
      }
    }
    j["rope_scaling"] = scaling;
  }
  if (per_kind && params.contains("sliding_attention")) {
    const Json& local = params.at("sliding_attention");
    if (kind_of(local) != "default") {
      throw NotSupportedError(source + ": 'rope_parameters.sliding_attention' (" + local.dump() +
                              "): the windowed layers' RoPE turns unscaled in Triad");
    }
    if (local.value("partial_rotary_factor", full.value("partial_rotary_factor", Json())) !=
        full.value("partial_rotary_factor", Json())) {
      throw NotSupportedError(source + ": 'rope_parameters.sliding_attention' (" + local.dump() +
                              "): the windowed layers turn as much of each head as the others");
    }
    const Json theta = local.value("rope_theta", full.value("rope_theta", Json()));
    if (type == "gemma3_text") {
      if (!theta.is_null()) set("rope_local_base_freq", theta);
    } else if (theta != full.value("rope_theta", Json()) || kind != "default") {
      throw NotSupportedError(source + ": 'rope_parameters.sliding_attention' (" + local.dump() +
                              "): a " + (type.empty() ? std::string("model") : type) +
                              "'s windowed layers turn as its full ones do in Triad");
    }
  }
  j.erase("rope_parameters");
  return j;
}

// Gemma3TextConfig's defaults for the keys a file leaves out (the
// multimodal checkpoints' text_config gives few of them: 4B's names its
// widths, depth, window and RoPE scaling only).
Json with_gemma3_defaults(Json j) {
  static const Json kDefaults = {{"vocab_size", 262208},
                                 {"hidden_size", 2304},
                                 {"intermediate_size", 9216},
                                 {"num_hidden_layers", 26},
                                 {"num_attention_heads", 8},
                                 {"num_key_value_heads", 4},
                                 {"head_dim", 256},
                                 {"hidden_activation", "gelu_pytorch_tanh"},
                                 {"max_position_embeddings", 131072},
                                 {"rms_norm_eps", 1e-6},
                                 {"rope_theta", 1e6},
                                 {"query_pre_attn_scalar", 256},
                                 {"sliding_window", 4096},
                                 {"sliding_window_pattern", 6},
                                 {"rope_local_base_freq", 1e4},
                                 {"tie_word_embeddings", true}};
  for (const auto& [key, value] : kDefaults.items()) {
    if (!j.contains(key)) j[key] = value;
  }
  return j;
}

}  // namespace

nn::GptConfig gpt_config_from_hf(const std::string& json_text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    throw ConfigError(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw ConfigError(source + ": expected a JSON object");
  std::string type = Keys(j, source).text("model_type", "");
  // Gemma 3's multimodal checkpoints (4B and up, Gemma3ForConditionalGeneration):
  // the language model's config is text_config; Triad builds it alone (the
  // weights' reader leaves out the vision tower and the projector).
  if (type == "gemma3") {
    if (!j.contains("text_config") || !j.at("text_config").is_object()) {
      throw ConfigError(source +
                        ": model_type 'gemma3' needs its language model's 'text_config' object");
    }
    Json text = j.at("text_config");
    const std::string inner = Keys(text, source + " text_config").text("model_type", "gemma3_text");
    if (inner != "gemma3_text") {
      throw NotSupportedError(source + ": text_config's model_type '" + inner +
                              "' (expected gemma3_text)");
    }
    text["model_type"] = type = "gemma3_text";
    j = std::move(text);
  }
  j = with_rope_parameters_flattened(std::move(j), source);
  if (type == "gemma3_text") j = with_gemma3_defaults(std::move(j));
  const Keys k(j, source);
  // Quantized checkpoints: DeepSeek-V3's fp8 blocks are read back to full
  // precision (io::dequantize_block_scaled); other schemes' packed weights
  // are not.
  if (k.has("quantization_config")) {
    const Json& q = k.json("quantization_config");
    // (MiniMax-M2's files name the same format float8_e4m3fn.)
    const std::string where = "quantization_config";
    const std::string fmt = q.is_object() ? string_entry(q, "fmt", "e4m3", source, where) : "";
    const bool fp8 = q.is_object() && string_entry(q, "quant_method", "", source, where) == "fp8" &&
                     (fmt == "e4m3" || fmt == "float8_e4m3fn");
    if (!fp8)
      k.unsupported("quantization_config",
                    "Triad reads fp8 (e4m3) block-quantized weights, DeepSeek's, alone: "
                    "dequantize others first");
  }
  nn::GptConfig c;
  if (type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3" ||
      type == "gemma" || type == "gemma2" || type == "gemma3_text" || type == "phi3" ||
      type == "stablelm" || type == "granite" || type == "smollm3" || type == "glm" ||
      type == "glm4" || type == "helium" || type == "seed_oss" || type == "arcee") {
    c = llama_config(k, type);
  } else if (type == "mixtral" || type == "qwen2_moe" || type == "qwen3_moe") {
    c = moe_config(k, type);
  } else if (type == "olmo" || type == "olmo2" || type == "olmo3" || type == "olmoe" ||
             type == "exaone4") {
    c = olmo_config(k, type);
  } else if (type == "granitemoe" || type == "granitemoeshared") {
    c = granite_moe_config(k, type);
  } else if (type == "glm4_moe" || type == "dots1" || is_deepseek_mla(type)) {
    c = deepseek_moe_config(k, type);
  } else if (type == "minimax_m2") {
    c = minimax_m2_config(k);
  } else if (type == "gpt2") {
    c = gpt2_config(k);
  } else if (type == "gpt_neox") {
    c = gpt_neox_config(k);
  } else if (type == "starcoder2") {
    c = starcoder2_config(k);
  } else if (type == "nemotron") {
    c = nemotron_config(k);
  } else if (type == "cohere" || type == "cohere2") {
    c = cohere_config(k, type);
  } else if (type == "phi") {
    c = phi_config(k);
  } else if (type == "falcon") {
    c = falcon_config(k);
  } else if (type == "gptj" || type == "codegen") {
    // CodeGen: GPT-J's blocks, q, k and v fused in shards of whole heads.
    c = gptj_config(k, type);
    if (type == "codegen" && c.n_head % kCodegenShards != 0) {
      throw NotSupportedError(source + ": CodeGen's n_head (" + std::to_string(c.n_head) +
                              ") must be a multiple of " + std::to_string(kCodegenShards) +
                              ", the shards its q, k and v are fused in");
    }
  } else {
    throw NotSupportedError(
        source + ": model_type '" + type +
        "' is not supported (llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma, "
        "gemma2, gemma3_text, gemma3, phi3, stablelm, olmo, olmo2, olmo3, olmoe, granite, "
        "granitemoe, granitemoeshared, cohere, cohere2, smollm3, glm, glm4, glm4_moe, dots1, "
        "deepseek_v2, deepseek_v3, kimi_k2, minimax_m2, helium, seed_oss, exaone4, arcee, "
        "gpt_neox, starcoder2, nemotron, phi, falcon, gptj, codegen or gpt2)");
  }
  // initializer_range: the std a run from scratch draws the weights with
  // (model.init_std; Triad's residual projections still start
  // 1 / sqrt(2 n_layer) of it).
  if (k.has("initializer_range")) {
    c.init_std = k.number("initializer_range", c.init_std);
    if (!(c.init_std > 0.0) || !std::isfinite(c.init_std))
      k.bad("initializer_range", "must be a positive number");
  }
  // (An export writes the class it came from; Kimi K2's is DeepSeek-V3's.)
  c.hf_type = type == "kimi_k2" ? "deepseek_v3" : type;
  try {
    c.validate();
  } catch (const ConfigError& e) {
    throw ConfigError(source + ": " + e.what());
  }
  return c;
}

nn::GptConfig load_hf_config(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string file =
      io::is_directory(path) ? (fs::path(path) / "config.json").string() : path;
  return gpt_config_from_hf(read_text_file(file, "Hugging Face config"), file);
}

HfGenerationConfig load_hf_generation_config(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path dir = io::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  const std::string file = (dir / "generation_config.json").string();
  HfGenerationConfig out;
  if (!io::path_exists(file)) return out;
  out.file = file;
  Json j;
  try {
    j = Json::parse(read_text_file(file, "generation config"));
  } catch (const Json::exception& e) {
    throw ConfigError("'" + file + "' is not JSON: " + e.what());
  }
  if (!j.is_object()) throw ConfigError("'" + file + "' is not a JSON object");
  const auto bad = [&](const char* key, const Json& v, const std::string& expected) {
    return ConfigError("'" + file + "': " + key + " (" + v.dump() + ") " + expected);
  };
  // The key's value, or nullptr where it is absent or null.
  const auto find = [&](const char* key) -> const Json* {
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  if (const Json* eos = find("eos_token_id")) {
    for (const Json& id : eos->is_array() ? *eos : Json::array({*eos})) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0)
        throw bad("eos_token_id", *eos, "must be a token id or a list of them");
      if (std::find(out.eos_token_ids.begin(), out.eos_token_ids.end(), id.get<int64_t>()) ==
          out.eos_token_ids.end())
        out.eos_token_ids.push_back(id.get<int64_t>());
    }
  }
  if (const Json* v = find("do_sample")) {
    if (!v->is_boolean()) throw bad("do_sample", *v, "must be true or false");
    out.do_sample = v->get<bool>();
  }
  // A number in the range `ok` says (`range` names it).
  const auto number = [&](const char* key, std::optional<double>& to, auto ok, const char* range) {
    const Json* v = find(key);
    if (v == nullptr) return;
    if (!v->is_number() || !ok(v->get<double>()))
      throw bad(key, *v, std::string("must be a number ") + range);
    to = v->get<double>();
  };
  number(
      "temperature", out.temperature, [](double x) { return x >= 0; }, ">= 0");
  number(
      "top_p", out.top_p, [](double x) { return x > 0 && x <= 1; }, "in (0, 1]");
  number(
      "min_p", out.min_p, [](double x) { return x >= 0 && x <= 1; }, "in [0, 1]");
  number(
      "repetition_penalty", out.repetition_penalty, [](double x) { return x > 0; }, "> 0");
  if (const Json* v = find("top_k")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 0)
      throw bad("top_k", *v, "must be an integer >= 0");
    out.top_k = v->get<int64_t>();
  }
  if (out.do_sample.value_or(false) && out.temperature && *out.temperature == 0) {
    throw bad("temperature", *find("temperature"),
              "must be above 0 when do_sample is true (transformers refuses it too)");
  }
  return out;
}

bool HfGenerationConfig::names_sampling() const {
  return do_sample || temperature || top_k || top_p || min_p || repetition_penalty;
}

HfGenerationConfig::Sampling HfGenerationConfig::sampling() const {
  Sampling s;
  s.repetition_penalty = repetition_penalty.value_or(1.0);
  s.temperature = do_sample.value_or(false) ? temperature.value_or(1.0) : 0.0;
  s.top_k = top_k.value_or(50);
  s.top_p = top_p.value_or(1.0);
  s.min_p = min_p.value_or(0.0);
  return s;
}

std::vector<int64_t> load_hf_stop_tokens(const std::string& path) {
  return load_hf_generation_config(path).eos_token_ids;
}

}  // namespace triad::io
