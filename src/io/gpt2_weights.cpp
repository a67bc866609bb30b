#include "triad/io/gpt2_weights.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "triad/io/hf_export.h"
#include "triad/io/peft_adapter.h"
#include "triad/io/safetensors.h"
#include "triad/io/text_file.h"
#include "triad/io/torch_checkpoint.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/shape_ops.h"

namespace triad::io {
namespace {

Tensor transposed_copy(const Tensor& t) {
  if (t.dim() != 2)
    throw ShapeError("GPT-2 linear weight must be 2-d, got " + shape_str(t.shape()));
  return contiguous(transpose(t.detach(), 0, 1)).detach();
}

// Whether two host tensors hold the same dtype, shape and bytes.
bool same_values(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ac = contiguous(a), bc = contiguous(b);
  return std::memcmp(ac.raw_data(), bc.raw_data(), ac.nbytes()) == 0;
}

}  // namespace

bool is_gpt2_conv1d_weight(const std::string& name) {
  return name.ends_with(".attn.c_attn.weight") || name.ends_with(".attn.c_proj.weight") ||
         name.ends_with(".mlp.c_fc.weight") || name.ends_with(".mlp.c_proj.weight");
}

nn::StateDict gpt2_to_triad(const std::map<std::string, Tensor>& tensors) {
  nn::StateDict out;
  for (const auto& [raw, t] : tensors) {
    std::string name = raw.rfind("transformer.", 0) == 0 ? raw.substr(12) : raw;
    if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")) continue;
    out[name] = is_gpt2_conv1d_weight(name) ? transposed_copy(t) : t;
  }
  return out;
}

std::map<std::string, Tensor> triad_to_gpt2(const nn::StateDict& state) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : state)
    out[name] = is_gpt2_conv1d_weight(name) ? transposed_copy(t) : t.detach();
  return out;
}

namespace {

// A multimodal checkpoint's parts other than its language model.
bool is_vision_tensor(const std::string& name) {
  for (const char* p : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                        "model.multi_modal_projector."}) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

}  // namespace

int64_t block_index(const std::string& name) {
  size_t at = std::string::npos;
  if (name.rfind("h.", 0) == 0) {
    at = 2;
  } else if (name.rfind("transformer.h.", 0) == 0) {
    at = 14;
  } else if (name.rfind("layers.", 0) == 0) {
    at = 7;
  } else if (const size_t l = name.find(".layers."); l != std::string::npos) {
    at = l + 8;
  }
  if (at == std::string::npos) return -1;
  int64_t n = 0;
  size_t i = at;
  for (; i < name.size() && i < at + 18 && name[i] >= '0' && name[i] <= '9'; ++i)
    n = n * 10 + (name[i] - '0');
  return i > at && i < name.size() && name[i] == '.' ? n : -1;
}

std::map<std::string, Tensor> language_model_tensors(std::map<std::string, Tensor> tensors) {
  static const char* const kText[][2] = {{"language_model.model.", "model."},
                                         {"model.language_model.", "model."},
                                         {"language_model.lm_head.", "lm_head."}};
  auto starts = [](const std::string& name, const char* prefix) {
    return name.rfind(prefix, 0) == 0;
  };
  bool multimodal = false;
  for (const auto& [name, t] : tensors) {
    for (const auto& p : kText) multimodal = multimodal || starts(name, p[0]);
  }
  if (!multimodal) return tensors;
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : tensors) {
    if (is_vision_tensor(name)) continue;
    std::string renamed = name;
    for (const auto& p : kText) {
      if (starts(name, p[0])) renamed = p[1] + name.substr(std::string(p[0]).size());
    }
    out[renamed] = std::move(t);
  }
  return out;
}

bool is_hf_llama(const std::map<std::string, Tensor>& tensors) {
  return tensors.count("model.embed_tokens.weight") > 0;
}

bool is_hf_phi(const std::map<std::string, Tensor>& tensors) {
  return tensors.count("model.final_layernorm.weight") > 0;
}

namespace {

// A Hugging Face decoder's tensors outside its blocks renamed by `outside`
// (Hugging Face's name -> Triad's), and each block's by its name under
// `blocks`N. ("self_attn.o_proj.weight" under model.layers.N.), for the
// caller to convert (`family` names the layout in errors).
struct DecoderTensors {
  nn::StateDict outside;
  std::map<int64_t, std::map<std::string, Tensor>> layers;
};

DecoderTensors split_decoder(const std::map<std::string, Tensor>& tensors,
                             const std::map<std::string, std::string>& outside,
                             const std::string& family,
                             const std::string& blocks = "model.layers.") {
  DecoderTensors out;
  for (const auto& [name, t] : tensors) {
    if (const auto it = outside.find(name); it != outside.end()) {
      out.outside[it->second] = t;
    } else if (name.rfind(blocks, 0) == 0) {
      const std::string rest = name.substr(blocks.size());
      const size_t dot = rest.find('.');
      // The layer's number as transformers writes it: digits, no sign, no
      // leading zero ("3x" or "03" is no layer 3 of this model).
      const std::string digits = rest.substr(0, dot);
      int64_t layer = -1;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), layer);
      if (ec != std::errc() || end != digits.data() + digits.size() ||
          digits != std::to_string(layer))
        layer = -1;
      if (dot == std::string::npos || layer < 0)
        throw IoError("Hugging Face " + family + " weights: tensor '" + name +
                      "' has no layer number");
      out.layers[layer][rest.substr(dot + 1)] = t;
    } else {
      throw IoError("Hugging Face " + family + " weights: unexpected tensor '" + name + "'");
    }
  }
  return out;
}

// Takes block tensors out of `parts` by name, naming a missing one.
class BlockParts {
 public:
  BlockParts(std::map<std::string, Tensor>& parts, std::string where)
      : parts_(parts), where_(std::move(where)) {}
  bool has(const std::string& key) const { return parts_.count(key) > 0; }
  Tensor take(const std::string& key) {
    auto it = parts_.find(key);
    if (it == parts_.end()) throw IoError(where_ + key + "' is missing");
    Tensor t = it->second;
    parts_.erase(it);
    return t;
  }

 private:
  std::map<std::string, Tensor>& parts_;
  std::string where_;
};

// self_attn's q_proj, k_proj and v_proj (and their biases, all three or
// none) stacked into block `p`'s c_attn ([q | k | v]); grouped-query
// attention's narrower k_proj and v_proj as they are.
void stack_qkv(BlockParts& parts, int64_t i, const std::string& family, const std::string& p,
               nn::StateDict& out) {
  const Tensor q = parts.take("self_attn.q_proj.weight"), k = parts.take("self_attn.k_proj.weight"),
               v = parts.take("self_attn.v_proj.weight");
  if (q.dim() != 2 || k.shape() != v.shape() || k.dim() != 2 || k.size(1) != q.size(1) ||
      k.size(0) < 1 || q.size(0) % k.size(0) != 0) {
    throw IoError("Hugging Face " + family + " weights: layer " + std::to_string(i) +
                  " has q_proj " + shape_str(q.shape()) + ", k_proj " + shape_str(k.shape()) +
                  " and v_proj " + shape_str(v.shape()) +
                  "; expected k_proj and v_proj alike, as wide as q_proj, and a divisor of its "
                  "height");
  }
  out[p + "attn.c_attn.weight"] = concat({q, k, v}, 0);
  if (!parts.has("self_attn.q_proj.bias") && !parts.has("self_attn.k_proj.bias") &&
      !parts.has("self_attn.v_proj.bias"))
    return;
  const Tensor bq = parts.take("self_attn.q_proj.bias"), bk = parts.take("self_attn.k_proj.bias"),
               bv = parts.take("self_attn.v_proj.bias");
  if (bq.dim() != 1 || bk.dim() != 1 || bv.dim() != 1 || bq.size(0) != q.size(0) ||
      bk.size(0) != k.size(0) || bv.size(0) != v.size(0)) {
    throw IoError("Hugging Face " + family + " weights: layer " + std::to_string(i) +
                  "'s q, k and v biases " + shape_str(bq.shape()) + ", " + shape_str(bk.shape()) +
                  " and " + shape_str(bv.shape()) + " do not fit its projections' heights");
  }
  out[p + "attn.c_attn.bias"] = concat({bq, bk, bv}, 0);
}

// GraniteMoE's mixture, its experts fused (ParallelExperts): the router
// block_sparse_moe.router.layer (E, C), input_linear (E, 2F, C), each
// expert's [gate | up] as Triad's c_fc holds it, and output_linear (E, C,
// F), each expert's c_proj; GraniteMoeShared's ungated shared_mlp beside
// them (input_linear (2S, C), output_linear (C, S)). Block `p`'s router,
// experts and shared expert.
void take_fused_experts(BlockParts& parts, const std::string& p, nn::StateDict& out) {
  const Tensor router = parts.take("block_sparse_moe.router.layer.weight");
  const Tensor in = parts.take("block_sparse_moe.input_linear.weight");
  const Tensor down = parts.take("block_sparse_moe.output_linear.weight");
  const int64_t E = router.dim() == 2 ? router.size(0) : -1;
  if (E < 1 || in.dim() != 3 || down.dim() != 3 || in.size(0) != E || down.size(0) != E ||
      in.size(2) != router.size(1) || down.size(1) != router.size(1) ||
      in.size(1) != 2 * down.size(2)) {
    throw IoError("Hugging Face GraniteMoE weights: " + p + " has router.layer " +
                  shape_str(router.shape()) + ", input_linear " + shape_str(in.shape()) +
                  " and output_linear " + shape_str(down.shape()) +
                  "; expected (E, C), (E, 2F, C) and (E, C, F)");
  }
  out[p + "mlp.router.weight"] = router;
  for (int64_t e = 0; e < E; ++e) {
    const std::string ours = p + "mlp.experts." + std::to_string(e) + ".";
    out[ours + "c_fc.weight"] =
        contiguous(reshape(narrow(in, 0, e, 1), {in.size(1), in.size(2)})).detach();
    out[ours + "c_proj.weight"] =
        contiguous(reshape(narrow(down, 0, e, 1), {down.size(1), down.size(2)})).detach();
  }
  if (parts.has("shared_mlp.input_linear.weight") || parts.has("shared_mlp.output_linear.weight")) {
    out[p + "mlp.shared.c_fc.weight"] = parts.take("shared_mlp.input_linear.weight");
    out[p + "mlp.shared.c_proj.weight"] = parts.take("shared_mlp.output_linear.weight");
  }
}

// DeepSeek-V3's multi-head latent attention (its kv_a_proj_with_mqa names
// it) as block `p`'s attn.q_a_proj, q_a_norm and q_b_proj (or q_proj),
// kv_a_proj, kv_a_norm and kv_b_proj; with `interleaved_n_head` query heads
// its rope rows (the last qk_rope of each query head, and of kv_a_proj,
// qk_rope being kv_a_proj's height beyond kv_a_layernorm's width) turn in
// interleaved pairs and are reordered into Triad's halves. False for a
// block without it.
bool take_latent_attention(BlockParts& parts, int64_t layer, const std::string& p,
                           int64_t interleaved_n_head, nn::StateDict& out) {
  if (!parts.has("self_attn.kv_a_proj_with_mqa.weight")) return false;
  const std::string a = "self_attn.";
  Tensor kv_a = parts.take(a + "kv_a_proj_with_mqa.weight");
  Tensor kv_a_bias = parts.has(a + "kv_a_proj_with_mqa.bias")
                         ? parts.take(a + "kv_a_proj_with_mqa.bias")
                         : Tensor();
  const Tensor kv_norm = parts.take(a + "kv_a_layernorm.weight");
  const bool q_latent = parts.has(a + "q_a_proj.weight");
  const std::string q_name = q_latent ? "q_b_proj" : "q_proj";
  Tensor q = parts.take(a + q_name + ".weight");
  Tensor q_bias =
      !q_latent && parts.has(a + "q_proj.bias") ? parts.take(a + "q_proj.bias") : Tensor();
  if (interleaved_n_head > 0) {
    const int64_t rank = kv_norm.numel(), H = interleaved_n_head;
    const int64_t rope = kv_a.dim() == 2 ? kv_a.size(0) - rank : 0;
    const int64_t qk = q.dim() == 2 && q.size(0) % H == 0 ? q.size(0) / H : 0;
    if (rope < 2 || rope % 2 != 0 || qk < rope) {
      throw IoError("Hugging Face DeepSeek weights: layer " + std::to_string(layer) +
                    "'s kv_a_proj_with_mqa " + shape_str(kv_a.shape()) + ", kv_a_layernorm " +
                    shape_str(kv_norm.shape()) + " and " + q_name + " " + shape_str(q.shape()) +
                    " do not make an even rotated width within " + std::to_string(H) +
                    " query heads");
    }
    q = interleaved_rows_at(q, H, qk - rope, rope, true);
    if (q_bias.defined()) q_bias = interleaved_rows_at(q_bias, H, qk - rope, rope, true);
    kv_a = interleaved_rows_at(kv_a, 1, rank, rope, true);
    if (kv_a_bias.defined()) kv_a_bias = interleaved_rows_at(kv_a_bias, 1, rank, rope, true);
  }
  const std::string t = p + "attn.";
  if (q_latent) {
    out[t + "q_a_proj.weight"] = parts.take(a + "q_a_proj.weight");
    if (parts.has(a + "q_a_proj.bias")) out[t + "q_a_proj.bias"] = parts.take(a + "q_a_proj.bias");
    out[t + "q_a_norm.weight"] = parts.take(a + "q_a_layernorm.weight");
  }
  out[t + q_name + ".weight"] = q;
  if (q_bias.defined()) out[t + "q_proj.bias"] = q_bias;
  out[t + "kv_a_proj.weight"] = kv_a;
  if (kv_a_bias.defined()) out[t + "kv_a_proj.bias"] = kv_a_bias;
  out[t + "kv_a_norm.weight"] = kv_norm;
  out[t + "kv_b_proj.weight"] = parts.take(a + "kv_b_proj.weight");
  return true;
}

// A block's mixture of experts, Mixtral's (block_sparse_moe.gate and
// experts.<e>.w1, w3, w2) or Qwen's (mlp.gate and experts.<e>.gate_proj,
// up_proj, down_proj; Qwen2-MoE's shared_expert and shared_expert_gate
// too) or GraniteMoE's (take_fused_experts), as block `p`'s router and
// experts (c_fc [gate | up], c_proj). False for a block without one.
bool take_experts(BlockParts& parts, const std::string& p, nn::StateDict& out) {
  if (parts.has("block_sparse_moe.router.layer.weight")) {
    take_fused_experts(parts, p, out);
    return true;
  }
  struct Names {
    const char *prefix, *gate, *up, *down;
  };
  static const Names kinds[] = {{"block_sparse_moe.", "w1", "w3", "w2"},
                                {"mlp.", "gate_proj", "up_proj", "down_proj"}};
  for (const Names& n : kinds) {
    const std::string router = std::string(n.prefix) + "gate.weight";
    if (!parts.has(router)) continue;
    out[p + "mlp.router.weight"] = parts.take(router);
    // GLM-4.5's (DeepSeek-V3's) biases for choosing the experts, beside
    // the router (MiniMax-M2's beside the experts).
    for (const char* where : {"gate.e_score_correction_bias", "e_score_correction_bias"}) {
      const std::string bias = std::string(n.prefix) + where;
      if (parts.has(bias)) out[p + "mlp.expert_bias"] = parts.take(bias);
    }
    for (int64_t e = 0;; ++e) {
      const std::string x = std::string(n.prefix) + "experts." + std::to_string(e) + ".";
      const std::string ours = p + "mlp.experts." + std::to_string(e) + ".";
      if (!parts.has(x + n.gate + ".weight") && !parts.has(x + n.up + ".weight") &&
          !parts.has(x + n.down + ".weight"))
        break;
      out[ours + "c_fc.weight"] =
          concat({parts.take(x + n.gate + ".weight"), parts.take(x + n.up + ".weight")}, 0);
      out[ours + "c_proj.weight"] = parts.take(x + n.down + ".weight");
    }
    // Qwen2-MoE's shared expert and its gate.
    const std::string shared = std::string(n.prefix) + "shared_expert.";
    if (parts.has(shared + "down_proj.weight")) {
      out[p + "mlp.shared.c_fc.weight"] = concat(
          {parts.take(shared + "gate_proj.weight"), parts.take(shared + "up_proj.weight")}, 0);
      out[p + "mlp.shared.c_proj.weight"] = parts.take(shared + "down_proj.weight");
    }
    // GLM-4.5's shared experts, one MLP (n_shared_experts wide), ungated.
    const std::string experts = std::string(n.prefix) + "shared_experts.";
    if (parts.has(experts + "down_proj.weight")) {
      out[p + "mlp.shared.c_fc.weight"] = concat(
          {parts.take(experts + "gate_proj.weight"), parts.take(experts + "up_proj.weight")}, 0);
      out[p + "mlp.shared.c_proj.weight"] = parts.take(experts + "down_proj.weight");
    }
    if (parts.has(std::string(n.prefix) + "shared_expert_gate.weight"))
      out[p + "mlp.shared_gate.weight"] =
          parts.take(std::string(n.prefix) + "shared_expert_gate.weight");
    return true;
  }
  return false;
}

}  // namespace

nn::StateDict hf_phi_to_triad(const std::map<std::string, Tensor>& tensors) {
  static const std::map<std::string, std::string> kOutside = {
      {"model.embed_tokens.weight", "wte.weight"},
      {"model.final_layernorm.weight", "ln_f.weight"},
      {"model.final_layernorm.bias", "ln_f.bias"},
      {"lm_head.weight", "lm_head.weight"},
      {"lm_head.bias", "lm_head.bias"}};
  static const std::pair<const char*, const char*> kBlock[] = {{"input_layernorm", "ln_1"},
                                                               {"self_attn.dense", "attn.c_proj"},
                                                               {"mlp.fc1", "mlp.c_fc"},
                                                               {"mlp.fc2", "mlp.c_proj"}};
  DecoderTensors d = split_decoder(tensors, kOutside, "Phi");
  for (auto& [i, layer] : d.layers) {
    const std::string p = "h." + std::to_string(i) + ".";
    BlockParts parts(layer,
                     "Hugging Face Phi weights: tensor 'model.layers." + std::to_string(i) + ".");
    for (const auto& [theirs, ours] : kBlock) {
      for (const char* kind : {".weight", ".bias"})
        d.outside[p + ours + kind] = parts.take(std::string(theirs) + kind);
    }
    stack_qkv(parts, i, "Phi", p, d.outside);
    layer.erase("self_attn.rotary_emb.inv_freq");  // a buffer, recomputed
    if (!layer.empty()) {
      throw IoError("Hugging Face Phi weights: unexpected tensor 'model.layers." +
                    std::to_string(i) + "." + layer.begin()->first + "'");
    }
  }
  return std::move(d.outside);
}

Tensor interleaved_head_rows(const Tensor& t, int64_t heads, bool to_halves, int64_t rotated) {
  const int64_t rows = t.dim() >= 1 ? t.size(0) : 0;
  const int64_t D = heads >= 1 ? rows / heads : 0;
  if (rotated < 0 || heads < 1 || rows == 0 || rows % heads != 0) {
    throw ShapeError("rotary rows: " + shape_str(t.shape()) + " is not " + std::to_string(heads) +
                     " heads tall, each with an even count of rotated rows" +
                     (rotated > 0 ? " (" + std::to_string(rotated) + ")" : std::string()));
  }
  return interleaved_rows_at(t, heads, 0, rotated > 0 ? rotated : D, to_halves);
}

Tensor interleaved_rows_at(const Tensor& t, int64_t heads, int64_t offset, int64_t rotated,
                           bool to_halves) {
  const int64_t rows = t.dim() >= 1 ? t.size(0) : 0;
  const int64_t D = heads >= 1 ? rows / heads : 0, r = rotated;
  if (heads < 1 || rows == 0 || rows % heads != 0 || r < 2 || r % 2 != 0 || offset < 0 ||
      offset + r > D) {
    throw ShapeError("rotary rows: " + shape_str(t.shape()) + " is not " + std::to_string(heads) +
                     " heads tall, each with an even count of rotated rows (" +
                     std::to_string(rotated) + ") from row " + std::to_string(offset));
  }
  const int64_t rest = t.numel() / rows;
  const Tensor each = reshape(contiguous(t.detach()), {heads, D, rest});
  const Shape pairs = to_halves ? Shape{heads, r / 2, 2, rest} : Shape{heads, 2, r / 2, rest};
  std::vector<Tensor> parts;
  if (offset > 0) parts.push_back(contiguous(narrow(each, 1, 0, offset)));
  parts.push_back(
      reshape(contiguous(transpose(reshape(contiguous(narrow(each, 1, offset, r)), pairs), 1, 2)),
              {heads, r, rest}));
  if (offset + r < D) parts.push_back(contiguous(narrow(each, 1, offset + r, D - offset - r)));
  return reshape(parts.size() == 1 ? parts[0] : concat(parts, 1), t.shape()).detach();
}

Tensor triad_qkv_rows_to_interleaved(const Tensor& t, int64_t n_head, int64_t kv_heads,
                                     int64_t rotated) {
  const int64_t rows = t.dim() >= 1 ? t.size(0) : 0;
  const int64_t fused = n_head + 2 * kv_heads;
  if (n_head < 1 || kv_heads < 1 || rows == 0 || rows % fused != 0) {
    throw ShapeError("c_attn's rows: " + shape_str(t.shape()) + " are not " +
                     std::to_string(n_head) + " query and 2 x " + std::to_string(kv_heads) +
                     " key/value heads tall");
  }
  const int64_t D = rows / fused;
  return concat({interleaved_head_rows(narrow(t, 0, 0, n_head * D), n_head, false, rotated),
                 interleaved_head_rows(narrow(t, 0, n_head * D, kv_heads * D), kv_heads, false,
                                       rotated),
                 contiguous(narrow(t, 0, (n_head + kv_heads) * D, kv_heads * D))},
                0)
      .detach();
}

nn::StateDict hf_llama_to_triad(const std::map<std::string, Tensor>& tensors,
                                int64_t interleaved_n_head, int64_t rotated) {
  static const std::map<std::string, std::string> kOutside = {
      {"model.embed_tokens.weight", "wte.weight"},
      {"model.norm.weight", "ln_f.weight"},
      {"model.norm.bias", "ln_f.bias"},  // StableLM's LayerNorms
      {"lm_head.weight", "lm_head.weight"}};
  DecoderTensors d = split_decoder(tensors, kOutside, "LLaMA");
  nn::StateDict& out = d.outside;
  static const std::map<std::string, std::string> kSingle = {
      {"self_attn.o_proj.weight", "attn.c_proj.weight"}};
  for (auto& [i, layer] : d.layers) {
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    const std::string p = "h." + std::to_string(i) + ".";
    BlockParts block(layer, "Hugging Face LLaMA weights: tensor '" + hf);
    auto take = [&](const std::string& key) { return block.take(key); };
    std::map<std::string, Tensor>& parts = layer;
    for (const auto& [from, to] : kSingle) out[p + to] = take(from);
    // StarCoder2's o_proj has a bias.
    if (parts.count("self_attn.o_proj.bias") > 0)
      out[p + "attn.c_proj.bias"] = take("self_attn.o_proj.bias");
    // Every class's blocks but OLMo 2's normalise the attention's input;
    // OLMo's store no norms at all (they learn nothing).
    const bool olmo2 = parts.count("input_layernorm.weight") == 0 &&
                       parts.count("post_feedforward_layernorm.weight") > 0;
    const bool no_norms = parts.count("input_layernorm.weight") == 0 &&
                          parts.count("post_attention_layernorm.weight") == 0 &&
                          parts.count("post_feedforward_layernorm.weight") == 0;
    if (!olmo2 && !no_norms) out[p + "ln_1.weight"] = take("input_layernorm.weight");
    // StableLM's LayerNorms shift as well as scale.
    for (const char* norm : {"input_layernorm", "post_attention_layernorm"}) {
      const std::string bias = std::string(norm) + ".bias";
      if (parts.count(bias) > 0) out[p + (norm[0] == 'i' ? "ln_1.bias" : "ln_2.bias")] = take(bias);
    }
    // Gemma 2's and 3's four norms: post_attention_layernorm is then the
    // attention output's (post_attn_norm) and pre_feedforward_layernorm the
    // MLP's input's (ln_2); LLaMA's post_attention_layernorm is ln_2, which
    // StableLM's parallel blocks (one norm for both sublayers) lack.
    // OLMo 2's two norms: on the attention's output (post_attention_layernorm
    // then) and the MLP's.
    // GLM-4's four: post_self_attn_layernorm and post_mlp_layernorm on the
    // sublayers' outputs, post_attention_layernorm on the MLP's input.
    if (olmo2) {
      out[p + "post_attn_norm.weight"] = take("post_attention_layernorm.weight");
      out[p + "post_mlp_norm.weight"] = take("post_feedforward_layernorm.weight");
    } else if (parts.count("post_self_attn_layernorm.weight") > 0) {
      out[p + "post_attn_norm.weight"] = take("post_self_attn_layernorm.weight");
      out[p + "ln_2.weight"] = take("post_attention_layernorm.weight");
      out[p + "post_mlp_norm.weight"] = take("post_mlp_layernorm.weight");
    } else if (parts.count("pre_feedforward_layernorm.weight") > 0) {
      out[p + "post_attn_norm.weight"] = take("post_attention_layernorm.weight");
      out[p + "ln_2.weight"] = take("pre_feedforward_layernorm.weight");
      out[p + "post_mlp_norm.weight"] = take("post_feedforward_layernorm.weight");
    } else if (parts.count("post_attention_layernorm.weight") > 0) {
      out[p + "ln_2.weight"] = take("post_attention_layernorm.weight");
    }
    // Phi-3's projections come fused, already in Triad's layout: qkv_proj
    // is c_attn's [q | k | v], gate_up_proj c_fc's [gate | up]. (GLM's
    // gate_up_proj beside separate q, k and v: below.)
    if (parts.count("self_attn.qkv_proj.weight") > 0) {
      out[p + "attn.c_attn.weight"] = take("self_attn.qkv_proj.weight");
      out[p + "mlp.c_fc.weight"] = take("mlp.gate_up_proj.weight");
      out[p + "mlp.c_proj.weight"] = take("mlp.down_proj.weight");
      parts.erase("self_attn.rotary_emb.inv_freq");  // a buffer, recomputed
      if (!parts.empty()) {
        throw IoError("Hugging Face Phi-3 weights: unexpected tensor '" + hf +
                      parts.begin()->first + "'");
      }
      continue;
    }
    // Cohere's and GLM's q and k turn in interleaved pairs: each head's
    // (rotated) rows reordered into Triad's halves, GLM's biases with them
    // (q . k, and the model, unchanged).
    if (interleaved_n_head > 0 && parts.count("self_attn.q_proj.weight") > 0 &&
        parts.count("self_attn.k_proj.weight") > 0) {
      Tensor& q = parts.at("self_attn.q_proj.weight");
      Tensor& k = parts.at("self_attn.k_proj.weight");
      const int64_t D = q.dim() == 2 ? q.size(0) / interleaved_n_head : 0;
      if (D < 1 || k.dim() != 2 || k.size(0) % D != 0) {
        throw IoError("Hugging Face weights turned in interleaved pairs: layer " +
                      std::to_string(i) + "'s q_proj " + shape_str(q.shape()) + " and k_proj " +
                      shape_str(k.shape()) + " are not whole heads of " +
                      std::to_string(interleaved_n_head) + " query heads");
      }
      const int64_t kv_heads = k.size(0) / D;
      q = interleaved_head_rows(q, interleaved_n_head, true, rotated);
      k = interleaved_head_rows(k, kv_heads, true, rotated);
      for (const auto& [bias, heads] :
           {std::pair<const char*, int64_t>{"self_attn.q_proj.bias", interleaved_n_head},
            {"self_attn.k_proj.bias", kv_heads}}) {
        auto b = parts.find(bias);
        if (b != parts.end()) b->second = interleaved_head_rows(b->second, heads, true, rotated);
      }
    }
    // Grouped-query attention: k_proj and v_proj are n_kv_head heads tall,
    // a divisor of q_proj's n_head heads; the stack is c_attn's [q | k | v],
    // with Qwen2's q, k and v biases stacked the same way.
    if (!take_latent_attention(block, i, p, interleaved_n_head, out))
      stack_qkv(block, i, "LLaMA", p, out);
    // StableLM 2 12B's per-head LayerNorms (q_layernorm.norms.h, one of D
    // for each head, k_layernorm's for each key/value head), joined head by
    // head into one vector.
    for (const char* which : {"q", "k"}) {
      const std::string base = std::string("self_attn.") + which + "_layernorm.norms.";
      std::vector<Tensor> heads;
      while (parts.count(base + std::to_string(heads.size()) + ".weight") > 0)
        heads.push_back(take(base + std::to_string(heads.size()) + ".weight"));
      if (!heads.empty()) out[p + "attn." + which + "_norm.weight"] = concat(heads, 0);
    }
    // Qwen3's query/key norms (both or neither). Command R+'s are (heads, D),
    // a weight per head: one vector here, each head's features in the order
    // its q or k rows were put in (Cohere's interleaved pairs into halves).
    if (parts.count("self_attn.q_norm.weight") > 0 || parts.count("self_attn.k_norm.weight") > 0) {
      for (const char* which : {"q_norm", "k_norm"}) {
        Tensor w = take(std::string("self_attn.") + which + ".weight");
        if (w.dim() == 2) {
          const int64_t heads = w.size(0);
          w = reshape(contiguous(w), {w.numel()});
          if (interleaved_n_head > 0) w = interleaved_head_rows(w, heads, true);
        }
        out[p + "attn." + which + ".weight"] = w;
      }
    }
    // Mixtral's and Qwen3-MoE's experts, StarCoder2's ungated MLP (c_fc,
    // c_proj, with their biases when it has them), or the dense gated MLP.
    if (parts.count("mlp.c_fc.weight") > 0) {
      for (const char* layer : {"mlp.c_fc", "mlp.c_proj"}) {
        out[p + layer + ".weight"] = take(std::string(layer) + ".weight");
        if (parts.count(std::string(layer) + ".bias") > 0)
          out[p + layer + ".bias"] = take(std::string(layer) + ".bias");
      }
    } else if (parts.count("mlp.gate_up_proj.weight") > 0) {  // GLM's, [gate | up] as c_fc's
      out[p + "mlp.c_fc.weight"] = take("mlp.gate_up_proj.weight");
      out[p + "mlp.c_proj.weight"] = take("mlp.down_proj.weight");
    } else if (parts.count("mlp.up_proj.weight") > 0 && parts.count("mlp.gate_proj.weight") == 0) {
      // Nemotron's ungated MLP: up_proj is c_fc, down_proj c_proj (with
      // their biases under mlp_bias).
      for (const auto& [from, to] :
           {std::pair<const char*, const char*>{"up_proj", "c_fc"}, {"down_proj", "c_proj"}}) {
        const std::string hf_name = std::string("mlp.") + from;
        out[p + "mlp." + to + ".weight"] = take(hf_name + ".weight");
        if (parts.count(hf_name + ".bias") > 0)
          out[p + "mlp." + to + ".bias"] = take(hf_name + ".bias");
      }
    } else if (!take_experts(block, p, out)) {
      out[p + "mlp.c_fc.weight"] =
          concat({take("mlp.gate_proj.weight"), take("mlp.up_proj.weight")}, 0);
      out[p + "mlp.c_proj.weight"] = take("mlp.down_proj.weight");
    }
    parts.erase("self_attn.rotary_emb.inv_freq");  // a buffer, recomputed
    if (!parts.empty()) {
      throw IoError("Hugging Face LLaMA weights: unexpected tensor '" + hf + parts.begin()->first +
                    "'");
    }
  }
  return std::move(d.outside);
}

bool is_hf_neox(const std::map<std::string, Tensor>& tensors) {
  return tensors.count("gpt_neox.embed_in.weight") > 0;
}

namespace {

// Rows viewed as (a, b, D) regrouped as (b, a, D), the rest of each row kept.
Tensor regroup_rows(const Tensor& t, int64_t a, int64_t b, int64_t n_head) {
  const int64_t rows = t.dim() >= 1 ? t.size(0) : 0;
  if (n_head < 1 || rows == 0 || rows % (3 * n_head) != 0) {
    throw ShapeError("GPT-NeoX query_key_value: " + shape_str(t.shape()) + " is not 3 x " +
                     std::to_string(n_head) + " heads of rows tall");
  }
  const int64_t D = rows / (a * b), rest = t.numel() / rows;
  const Tensor v = reshape(contiguous(t.detach()), {a, b, D, rest});
  return reshape(contiguous(transpose(v, 0, 1)), t.shape()).detach();
}

}  // namespace

Tensor neox_qkv_rows_to_triad(const Tensor& t, int64_t n_head) {
  return regroup_rows(t, n_head, 3, n_head);
}

Tensor triad_qkv_rows_to_neox(const Tensor& t, int64_t n_head) {
  return regroup_rows(t, 3, n_head, n_head);
}

nn::StateDict hf_neox_to_triad(const std::map<std::string, Tensor>& tensors, int64_t n_head) {
  static const std::map<std::string, std::string> kOutside = {
      {"gpt_neox.embed_in.weight", "wte.weight"},
      {"gpt_neox.final_layer_norm.weight", "ln_f.weight"},
      {"gpt_neox.final_layer_norm.bias", "ln_f.bias"},
      {"embed_out.weight", "lm_head.weight"}};
  static const std::map<std::string, std::string> kBlock = {
      {"input_layernorm.weight", "ln_1.weight"},
      {"input_layernorm.bias", "ln_1.bias"},
      {"post_attention_layernorm.weight", "ln_2.weight"},
      {"post_attention_layernorm.bias", "ln_2.bias"},
      {"attention.query_key_value.weight", "attn.c_attn.weight"},
      {"attention.query_key_value.bias", "attn.c_attn.bias"},
      {"attention.dense.weight", "attn.c_proj.weight"},
      {"attention.dense.bias", "attn.c_proj.bias"},
      {"mlp.dense_h_to_4h.weight", "mlp.c_fc.weight"},
      {"mlp.dense_h_to_4h.bias", "mlp.c_fc.bias"},
      {"mlp.dense_4h_to_h.weight", "mlp.c_proj.weight"},
      {"mlp.dense_4h_to_h.bias", "mlp.c_proj.bias"}};
  if (n_head < 1) {
    throw IoError(
        "Hugging Face GPT-NeoX weights: unstacking query_key_value needs the model's head count");
  }
  DecoderTensors d = split_decoder(tensors, kOutside, "GPT-NeoX", "gpt_neox.layers.");
  for (const auto& [layer, parts] : d.layers) {
    for (const auto& [rest, t] : parts) {
      // Buffers older files carry: the causal mask and RoPE's frequencies.
      if (rest == "attention.bias" || rest == "attention.masked_bias" ||
          rest == "attention.rotary_emb.inv_freq")
        continue;
      const auto it = kBlock.find(rest);
      if (it == kBlock.end()) {
        throw IoError("Hugging Face GPT-NeoX weights: unexpected tensor 'gpt_neox.layers." +
                      std::to_string(layer) + "." + rest + "'");
      }
      d.outside["h." + std::to_string(layer) + "." + it->second] =
          rest.rfind("attention.query_key_value.", 0) == 0 ? neox_qkv_rows_to_triad(t, n_head) : t;
    }
  }
  return std::move(d.outside);
}

namespace {

// (D, the rows' width) of a c_attn of `rows` rows for n_head query heads and
// kv_heads key/value heads of one width.
int64_t qkv_head_width(const Tensor& t, int64_t n_head, int64_t kv_heads) {
  const int64_t rows = t.dim() >= 1 ? t.size(0) : 0, heads = n_head + 2 * kv_heads;
  if (n_head < 1 || kv_heads < 1 || n_head % kv_heads != 0 || rows == 0 || rows % heads != 0) {
    throw ShapeError("Falcon query_key_value: " + shape_str(t.shape()) + " is not " +
                     std::to_string(n_head) + " query heads and twice " + std::to_string(kv_heads) +
                     " key/value heads of one width tall");
  }
  return rows / heads;
}

}  // namespace

Tensor falcon_qkv_rows_to_triad(const Tensor& t, int64_t n_head, int64_t kv_heads) {
  const int64_t D = qkv_head_width(t, n_head, kv_heads), r = n_head / kv_heads;
  const int64_t row = D * (t.numel() / t.size(0));  // one head's elements
  const Tensor groups = reshape(contiguous(t.detach()), {kv_heads, r + 2, row});
  auto part = [&](int64_t first, int64_t count) {
    return reshape(contiguous(narrow(groups, 1, first, count)), {kv_heads * count, row});
  };
  return reshape(concat({part(0, r), part(r, 1), part(r + 1, 1)}, 0), t.shape()).detach();
}

Tensor triad_qkv_rows_to_falcon(const Tensor& t, int64_t n_head, int64_t kv_heads) {
  const int64_t D = qkv_head_width(t, n_head, kv_heads), r = n_head / kv_heads;
  const int64_t row = D * (t.numel() / t.size(0));
  const Tensor heads = reshape(contiguous(t.detach()), {n_head + 2 * kv_heads, row});
  auto part = [&](int64_t first, int64_t count) {
    return reshape(contiguous(narrow(heads, 0, first, kv_heads * count)), {kv_heads, count, row});
  };
  return reshape(concat({part(0, r), part(n_head, 1), part(n_head + kv_heads, 1)}, 1), t.shape())
      .detach();
}

namespace {

// c_attn's rows with each q and k head's first r rows reordered: `to_halves`
// takes GPT-J's interleaved pairs to Triad's halves, else back.
Tensor reorder_rotary_rows(const Tensor& t, int64_t n_head, int64_t rope_dim, bool to_halves) {
  const int64_t rows = t.dim() >= 1 ? t.size(0) : 0;
  if (n_head < 1 || rows == 0 || rows % (3 * n_head) != 0) {
    throw ShapeError("GPT-J q, k and v: " + shape_str(t.shape()) + " is not 3 x " +
                     std::to_string(n_head) + " heads of rows tall");
  }
  const int64_t H = n_head, D = rows / (3 * H), r = rope_dim > 0 ? rope_dim : D,
                rest = t.numel() / rows;
  if (r % 2 != 0 || r > D) {
    throw ShapeError("GPT-J q, k and v: " + std::to_string(r) + " rotated dimensions in heads of " +
                     std::to_string(D) + " (expected an even count, at most the head)");
  }
  const Tensor heads = reshape(contiguous(t.detach()), {3 * H, D, rest});
  const Tensor turned = narrow(heads, 0, 0, 2 * H);  // q's and k's heads
  const Shape pairs = to_halves ? Shape{2 * H, r / 2, 2, rest} : Shape{2 * H, 2, r / 2, rest};
  Tensor qk =
      reshape(contiguous(transpose(reshape(contiguous(narrow(turned, 1, 0, r)), pairs), 1, 2)),
              {2 * H, r, rest});
  if (r < D) qk = concat({qk, contiguous(narrow(turned, 1, r, D - r))}, 1);
  return reshape(concat({qk, contiguous(narrow(heads, 0, 2 * H, H))}, 0), t.shape()).detach();
}

}  // namespace

Tensor gptj_qkv_rows_to_triad(const Tensor& t, int64_t n_head, int64_t rope_dim) {
  return reorder_rotary_rows(t, n_head, rope_dim, true);
}

Tensor triad_qkv_rows_to_gptj(const Tensor& t, int64_t n_head, int64_t rope_dim) {
  return reorder_rotary_rows(t, n_head, rope_dim, false);
}

namespace {

// c_attn's rows between CodeGen's shards ([q v k] of each shard's heads)
// and the stack [q | k | v].
Tensor regroup_codegen_rows(const Tensor& t, int64_t n_head, bool to_stack) {
  const int64_t rows = t.dim() >= 1 ? t.size(0) : 0, S = kCodegenShards;
  if (n_head < 1 || n_head % S != 0 || rows == 0 || rows % (3 * n_head) != 0) {
    throw ShapeError("CodeGen qkv_proj: " + shape_str(t.shape()) + " is not 3 x " +
                     std::to_string(n_head) + " heads of rows tall in " + std::to_string(S) +
                     " shards of whole heads");
  }
  const int64_t local = rows / 3 / S * (t.numel() / rows);  // a shard's q (or k, or v) elements
  if (to_stack) {
    // (shard, [q v k], local) -> ([q k v], shard, local)
    const Tensor shards = reshape(contiguous(t.detach()), {S, 3, local});
    std::vector<Tensor> parts;
    for (const int64_t which : {0, 2, 1})
      parts.push_back(reshape(contiguous(narrow(shards, 1, which, 1)), {1, S, local}));
    return reshape(concat(parts, 0), t.shape()).detach();
  }
  const Tensor stack = reshape(contiguous(t.detach()), {3, S, local});
  std::vector<Tensor> parts;
  for (const int64_t which : {0, 2, 1})
    parts.push_back(reshape(contiguous(narrow(stack, 0, which, 1)), {S, 1, local}));
  return reshape(concat(parts, 1), t.shape()).detach();
}

}  // namespace

Tensor codegen_qkv_rows_to_stack(const Tensor& t, int64_t n_head) {
  return regroup_codegen_rows(t, n_head, true);
}

Tensor stack_qkv_rows_to_codegen(const Tensor& t, int64_t n_head) {
  return regroup_codegen_rows(t, n_head, false);
}

bool is_hf_gptj(const std::map<std::string, Tensor>& tensors) {
  return tensors.count("transformer.wte.weight") > 0 &&
         tensors.count("transformer.wpe.weight") == 0;
}

nn::StateDict hf_gptj_to_triad(const std::map<std::string, Tensor>& tensors, int64_t n_head,
                               int64_t rope_dim) {
  static const std::map<std::string, std::string> kOutside = {
      {"transformer.wte.weight", "wte.weight"},
      {"transformer.ln_f.weight", "ln_f.weight"},
      {"transformer.ln_f.bias", "ln_f.bias"},
      {"lm_head.weight", "lm_head.weight"},
      {"lm_head.bias", "lm_head.bias"}};
  static const std::map<std::string, std::string> kBlock = {
      {"ln_1.weight", "ln_1.weight"},
      {"ln_1.bias", "ln_1.bias"},
      {"attn.out_proj.weight", "attn.c_proj.weight"},
      {"mlp.fc_in.weight", "mlp.c_fc.weight"},
      {"mlp.fc_in.bias", "mlp.c_fc.bias"},
      {"mlp.fc_out.weight", "mlp.c_proj.weight"},
      {"mlp.fc_out.bias", "mlp.c_proj.bias"}};
  if (n_head < 1) {
    throw IoError(
        "Hugging Face GPT-J weights: reordering q's and k's rotated rows needs the "
        "model's head count");
  }
  DecoderTensors d = split_decoder(tensors, kOutside, "GPT-J", "transformer.h.");
  nn::StateDict& out = d.outside;
  std::map<int64_t, std::map<std::string, Tensor>> qkv;  // per block: "q", "k", "v" or "qkv"
  for (const auto& [layer, block] : d.layers) {
    for (const auto& [rest, t] : block) {
      // Buffers older files carry: the causal mask and RoPE's tables.
      if (rest == "attn.bias" || rest == "attn.masked_bias" || rest == "attn.causal_mask" ||
          rest.ends_with("inv_freq") || rest.ends_with("embed_positions"))
        continue;
      if (rest == "attn.qkv_proj.weight") {  // CodeGen's, fused
        qkv[layer]["qkv"] = t;
        continue;
      }
      if (rest == "attn.q_proj.weight" || rest == "attn.k_proj.weight" ||
          rest == "attn.v_proj.weight") {
        qkv[layer][rest.substr(5, 1)] = t;
        continue;
      }
      const auto it = kBlock.find(rest);
      if (it == kBlock.end()) {
        throw IoError("Hugging Face GPT-J weights: unexpected tensor 'transformer.h." +
                      std::to_string(layer) + "." + rest + "'");
      }
      out["h." + std::to_string(layer) + "." + it->second] = t;
    }
  }
  for (const auto& [layer, parts] : qkv) {
    if (const auto fused = parts.find("qkv"); fused != parts.end()) {
      if (parts.size() > 1) {
        throw IoError("Hugging Face GPT-J weights: layer " + std::to_string(layer) +
                      " has both CodeGen's qkv_proj and separate q, k and v projections");
      }
      out["h." + std::to_string(layer) + ".attn.c_attn.weight"] = gptj_qkv_rows_to_triad(
          codegen_qkv_rows_to_stack(fused->second, n_head), n_head, rope_dim);
      continue;
    }
    std::vector<Tensor> stack;
    for (const char* p : {"q", "k", "v"}) {
      const auto it = parts.find(p);
      if (it == parts.end()) {
        throw IoError("Hugging Face GPT-J weights: tensor 'transformer.h." + std::to_string(layer) +
                      ".attn." + p + "_proj.weight' is missing");
      }
      stack.push_back(it->second);
    }
    if (stack[0].dim() != 2 || stack[1].shape() != stack[0].shape() ||
        stack[2].shape() != stack[0].shape()) {
      throw IoError("Hugging Face GPT-J weights: layer " + std::to_string(layer) + "'s q_proj " +
                    shape_str(stack[0].shape()) + ", k_proj " + shape_str(stack[1].shape()) +
                    " and v_proj " + shape_str(stack[2].shape()) + " differ");
    }
    out["h." + std::to_string(layer) + ".attn.c_attn.weight"] =
        gptj_qkv_rows_to_triad(concat(stack, 0), n_head, rope_dim);
  }
  return std::move(d.outside);
}

bool is_hf_falcon(const std::map<std::string, Tensor>& tensors) {
  return tensors.count("transformer.word_embeddings.weight") > 0;
}

nn::StateDict hf_falcon_to_triad(const std::map<std::string, Tensor>& tensors, int64_t n_head) {
  static const std::map<std::string, std::string> kOutside = {
      {"transformer.word_embeddings.weight", "wte.weight"},
      {"transformer.ln_f.weight", "ln_f.weight"},
      {"transformer.ln_f.bias", "ln_f.bias"},
      {"lm_head.weight", "lm_head.weight"}};
  static const std::map<std::string, std::string> kBlock = {{"input_layernorm", "ln_1"},
                                                            {"ln_attn", "ln_1"},
                                                            {"ln_mlp", "ln_2"},
                                                            {"post_attention_layernorm", "ln_2"},
                                                            {"self_attention.dense", "attn.c_proj"},
                                                            {"mlp.dense_h_to_4h", "mlp.c_fc"},
                                                            {"mlp.dense_4h_to_h", "mlp.c_proj"}};
  if (n_head < 1) {
    throw IoError(
        "Hugging Face Falcon weights: regrouping query_key_value needs the model's head count");
  }
  DecoderTensors d = split_decoder(tensors, kOutside, "Falcon", "transformer.h.");
  nn::StateDict& out = d.outside;
  std::map<int64_t, std::map<std::string, Tensor>> qkv;  // per block: "weight", "bias"
  for (const auto& [layer, block] : d.layers) {
    for (const auto& [rest, t] : block) {
      if (rest.ends_with("inv_freq")) continue;  // RoPE's buffer, recomputed
      const size_t dot = rest.rfind('.');
      const std::string module = rest.substr(0, dot), kind = rest.substr(dot + 1);
      if (module == "self_attention.query_key_value" && (kind == "weight" || kind == "bias")) {
        qkv[layer][kind] = t;
        continue;
      }
      const auto it = kBlock.find(module);
      if (it == kBlock.end() || (kind != "weight" && kind != "bias")) {
        throw IoError("Hugging Face Falcon weights: unexpected tensor 'transformer.h." +
                      std::to_string(layer) + "." + rest + "'");
      }
      out["h." + std::to_string(layer) + "." + it->second + "." + kind] = t;
    }
  }
  // Each block's key/value heads from its weight's height: hidden_size /
  // n_head rows a head.
  for (const auto& [layer, parts] : qkv) {
    const auto w = parts.find("weight");
    const std::string where = "Hugging Face Falcon weights: layer " + std::to_string(layer);
    if (w == parts.end()) throw IoError(where + " has a query_key_value bias but no weight");
    const Tensor& weight = w->second;
    if (weight.dim() != 2 || weight.size(1) % n_head != 0) {
      throw IoError(where + "'s query_key_value " + shape_str(weight.shape()) + " is not " +
                    std::to_string(n_head) + " heads wide");
    }
    const int64_t D = weight.size(1) / n_head, rows = weight.size(0);
    if (rows % D != 0 || rows / D <= n_head || (rows / D - n_head) % 2 != 0) {
      throw IoError(where + "'s query_key_value " + shape_str(weight.shape()) + " is not " +
                    std::to_string(n_head) + " query heads of " + std::to_string(D) +
                    " and twice as many key/value heads tall");
    }
    const int64_t kv = (rows / D - n_head) / 2;
    for (const auto& [kind, t] : parts) {
      out["h." + std::to_string(layer) + ".attn.c_attn." + kind] =
          falcon_qkv_rows_to_triad(t, n_head, kv);
    }
  }
  return std::move(d.outside);
}

namespace {

// One weights file: safetensors, or a torch.save checkpoint
// (pytorch_model.bin), told apart by its bytes.
class WeightFile {
 public:
  explicit WeightFile(const std::string& path) {
    if (is_torch_checkpoint(path)) {
      torch_ = std::make_unique<TorchCheckpointFile>(path);
    } else {
      safetensors_ = std::make_unique<SafetensorsFile>(path);
    }
  }
  const std::map<std::string, Shape>& shapes() const {
    return torch_ ? torch_->shapes() : safetensors_->shapes();
  }
  std::map<std::string, Tensor> read(const TensorFilter& wanted) const {
    return torch_ ? torch_->read(wanted) : safetensors_->read(wanted);
  }

 private:
  std::unique_ptr<SafetensorsFile> safetensors_;
  std::unique_ptr<TorchCheckpointFile> torch_;
};

// The block a quantized checkpoint's scales cover (the config.json beside
// `path`: quantization_config.weight_block_size, DeepSeek-V3's [128, 128]
// when it names none).
std::array<int64_t, 2> quantization_block_beside(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path dir = io::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  std::array<int64_t, 2> block{128, 128};
  const std::optional<std::string> text = read_file((dir / "config.json").string());
  if (!text) return block;
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object() || !j.contains("quantization_config")) return block;
  const nlohmann::json& q = j.at("quantization_config");
  if (!q.is_object() || !q.contains("weight_block_size")) return block;
  const nlohmann::json& b = q.at("weight_block_size");
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
      b[0].get<int64_t>() < 1 || b[1].get<int64_t>() < 1) {
    throw IoError("weights '" + path + "': quantization_config.weight_block_size (" + b.dump() +
                  ") must be two positive integers (rows, columns)");
  }
  return {b[0].get<int64_t>(), b[1].get<int64_t>()};
}

}  // namespace

void dequantize_block_scaled(std::map<std::string, Tensor>& tensors,
                             const std::array<int64_t, 2>& block, const std::string& where) {
  static const std::string kScales = ".weight_scale_inv", kWeight = ".weight";
  for (auto it = tensors.begin(); it != tensors.end();) {
    const std::string& name = it->first;
    if (!name.ends_with(kScales)) {
      ++it;
      continue;
    }
    std::string weight_name = name;
    weight_name.resize(name.size() - kScales.size());
    weight_name += kWeight;
    auto w = tensors.find(weight_name);
    if (w == tensors.end()) {
      throw IoError("weights '" + where + "': scales '" + name + "' without their weight '" +
                    weight_name + "'");
    }
    const Tensor& scale = it->second;
    const Tensor& weight = w->second;
    const int64_t rows = weight.dim() == 2 ? weight.size(0) : 0,
                  cols = weight.dim() == 2 ? weight.size(1) : 0;
    const Shape blocks{(rows + block[0] - 1) / block[0], (cols + block[1] - 1) / block[1]};
    if (weight.dim() != 2 || scale.shape() != blocks) {
      throw IoError("weights '" + where + "': '" + weight_name + "' " + shape_str(weight.shape()) +
                    " and its scales " + shape_str(scale.shape()) + " (expected a matrix and " +
                    shape_str(blocks) + ", one scale per block of " + std::to_string(block[0]) +
                    " x " + std::to_string(block[1]) + ")");
    }
    // DeepSeek's weight_dequant: each element times its block's scale, in f32.
    Tensor out = weight.dtype() == DType::F32 ? contiguous(weight) : cast(weight, DType::F32);
    out = contiguous(out).detach();
    const std::vector<double> by = to_double_vector(scale);
    float* d = static_cast<float*>(out.raw_data());
    for (int64_t r = 0; r < rows; ++r) {
      const double* s = by.data() + (r / block[0]) * blocks[1];
      for (int64_t c = 0; c < cols; ++c)
        d[r * cols + c] = static_cast<float>(d[r * cols + c] * s[c / block[1]]);
    }
    w->second = out;
    it = tensors.erase(it);
  }
}

namespace {

// The safetensors files behind a weights path (a file, a sharded
// checkpoint's index, or a directory of either), mapped and their headers
// checked once; tensors are copied out part by part. A multimodal
// checkpoint's vision tower and projector are never copied out.
class WeightFiles {
 public:
  explicit WeightFiles(const std::string& path)
      : path_(path), block_(quantization_block_beside(path)) {
    namespace fs = std::filesystem;
    std::string index = path;
    if (io::is_directory(path)) {
      const fs::path dir(path);
      // Safetensors first; a directory with only torch.save's files (older
      // checkpoints) is read from those.
      index.clear();
      for (const char* name : {"model.safetensors.index.json", "model.safetensors",
                               "pytorch_model.bin.index.json", "pytorch_model.bin"}) {
        if (index.empty() && io::path_exists(dir / name)) index = (dir / name).string();
      }
      if (index.empty()) {
        throw IoError("weights '" + path +
                      "': a directory without model.safetensors, model.safetensors.index.json, "
                      "pytorch_model.bin or pytorch_model.bin.index.json");
      }
    }
    if (!index.ends_with(".index.json")) {
      files_.emplace_back("", std::make_unique<WeightFile>(index));
    } else {
      read_index(index);
    }
    for (const auto& [f, file] : files_)
      shapes_.insert(file->shapes().begin(), file->shapes().end());
  }

  // Every tensor the files list, read or not.
  const std::map<std::string, Shape>& shapes() const { return shapes_; }

  // The tensors `wanted` names, from the files that hold them.
  std::map<std::string, Tensor> read(const TensorFilter& wanted) const {
    const TensorFilter text = [&](const std::string& name) {
      return !is_vision_tensor(name) && wanted(name);
    };
    std::map<std::string, Tensor> all;
    for (const auto& [f, file] : files_) {
      for (auto& [name, t] : file->read(text)) {
        if (!f.empty()) {
          auto it = where_.find(name);
          if (it == where_.end() || it->second != f)
            throw IoError("weights shard '" + f + "' holds '" + name +
                          "', which the index puts elsewhere");
        }
        all[name] = t;
      }
    }
    check_listed(text);
    // fp8 block-quantized weights (DeepSeek-V3's files): read as f32 and
    // scaled back by their blocks' scales.
    dequantize_block_scaled(all, block_, path_);
    return all;
  }

  // That the shards hold the tensors of the index that `which` names (from
  // their headers: nothing is read).
  void check_listed(const TensorFilter& which) const {
    for (const auto& [name, f] : where_) {
      if (!which(name) || is_vision_tensor(name)) continue;
      const std::string& shard = f;  // (no lambda captures a binding in clang < 16)
      const auto file = std::find_if(files_.begin(), files_.end(),
                                     [&](const auto& entry) { return entry.first == shard; });
      if (file == files_.end() || !file->second->shapes().count(name))
        throw IoError("weights shard '" + f + "' lacks '" + name + "', which the index lists");
    }
  }

 private:
  // A sharded checkpoint: the index's weight_map names each tensor's file.
  void read_index(const std::string& index) {
    namespace fs = std::filesystem;
    const std::optional<std::string> text = read_file(index);
    if (!text) throw IoError("weights index '" + index + "' cannot be read");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(*text);
    } catch (const nlohmann::json::exception& e) {
      throw IoError("weights index '" + index + "' is not valid JSON: " + e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw IoError("weights index '" + index + "' has no \"weight_map\" object");
    std::set<std::string> names;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string())
        throw IoError("weights index '" + index + "': the file of '" + name + "' is not a string");
      const std::string f = file.get<std::string>();
      // Shards lie beside their index: a name that leaves the directory
      // (a path, "..", an absolute name) or is cut short by a NUL would read
      // a file the checkpoint does not hold.
      if (f.empty() || f == "." || f == ".." ||
          f.find_first_of(std::string_view("/\\\0", 3)) != std::string::npos)
        throw IoError("weights index '" + index + "': the file of '" + name + "' is '" + f +
                      "', expected the name of a file beside the index");
      where_[name] = f;
      names.insert(f);
    }
    const fs::path dir = fs::path(index).parent_path();
    for (const std::string& f : names)
      files_.emplace_back(f, std::make_unique<WeightFile>((dir / f).string()));
  }

  std::string path_;
  std::array<int64_t, 2> block_;  // quantization_block_beside's
  std::vector<std::pair<std::string, std::unique_ptr<WeightFile>>> files_;  // (index's name, file)
  std::map<std::string, std::string> where_;  // the index's weight_map
  std::map<std::string, Shape> shapes_;
};

// Checks one part of a file (the tensors outside the blocks, or one block)
// against the model's tensors of that part: each present with its shape,
// nothing else.
void check_part(const std::string& path, const nn::StateDict& state,
                const std::map<std::string, Shape>& expected, int64_t part, bool llama) {
  for (const auto& [name, shape] : expected) {
    if (block_index(name) != part) continue;
    auto it = state.find(name);
    if (it == state.end())
      throw IoError("GPT-2 weights '" + path + "': tensor '" + name + "' is missing" +
                    (name == "wpe.weight" ? " (written by a model with rotary embeddings? Set "
                                            "model.position_embedding: rope)"
                     : name == "lm_head.weight"
                         ? " (its output head is tied to wte? Set model.tie_embeddings: true)"
                     : name.ends_with(".attn.c_attn.bias")
                         ? " (the file's q, k and v projections have no biases: set "
                           "model.qkv_bias and model.linear_bias to false)"
                     : name.ends_with("_norm.weight") && name.find(".attn.") != std::string::npos
                         ? " (the file's attention has no query/key norms: set model.qk_norm: "
                           "false)"
                     : name.find(".post_") != std::string::npos
                         ? " (the file's blocks have no post-norms: set model.post_norms: false)"
                         : ""));
    if (it->second.shape() != shape) {
      Shape stored = it->second.shape(), want = shape;
      if (!llama && is_gpt2_conv1d_weight(name)) {
        std::swap(stored[0], stored[1]);
        std::swap(want[0], want[1]);
      }
      // c_attn's weight (Triad's layout here: out, in) and bias are C + 2 *
      // n_kv_head * head_dim tall (C the weight's width, when the heads are
      // d_model / n_head wide): a height that differs points at
      // model.n_kv_head, or at model.head_dim.
      std::string hint;
      const bool c_attn =
          name.ends_with(".attn.c_attn.weight") || name.ends_with(".attn.c_attn.bias");
      const std::string weight = name.substr(0, name.rfind('.')) + ".weight";
      const auto w = state.find(weight);
      if (c_attn && w != state.end() && w->second.dim() == 2 && it->second.dim() >= 1 &&
          !shape.empty() && it->second.size(0) != shape[0]) {
        const int64_t C = w->second.size(1), rows = it->second.size(0);
        if (rows > C && shape[0] > C) {
          hint = " (its key and value projections are " + std::to_string((rows - C) / 2) +
                 " wide, the configured model's " + std::to_string((shape[0] - C) / 2) +
                 ": check model.n_kv_head and model.head_dim)";
        }
      }
      throw IoError("GPT-2 weights '" + path + "': tensor '" + name + "' has shape " +
                    shape_str(stored) + " but the configured model needs " + shape_str(want) +
                    hint);
    }
  }
  for (const auto& [name, t] : state) {
    if (!expected.count(name) || block_index(name) != part)
      throw IoError("GPT-2 weights '" + path + "': unexpected tensor '" + name + "'" +
                    (name == "wpe.weight"
                         ? " (a learned position table, but the configured model uses rotary "
                           "embeddings: model.position_embedding is rope)"
                     : name.ends_with(".attn.c_attn.bias")
                         ? " (biases on q, k and v, as Qwen2's blocks have: set "
                           "model.qkv_bias: true)"
                     : name.ends_with("_norm.weight") && name.find(".attn.") != std::string::npos
                         ? " (query/key norms, as Qwen3's blocks have: set model.qk_norm: true)"
                     : name.find(".post_") != std::string::npos
                         ? " (post-norms, as Gemma 2's and 3's blocks have: set "
                           "model.post_norms: true)"
                         : ""));
  }
}

}  // namespace

WeightLayout weight_layout(const nn::GptConfig& c) {
  const std::string* type = hf_holding_class(c);
  return {.n_head = c.n_head,
          .rope_dim = c.rope_dim,
          .interleaved_rotation = type && hf_turns_interleaved(*type)};
}

namespace {

// The model_type of the config.json in `path`'s directory (or beside the
// file `path`), "" when there is none or it names none.
std::string hf_model_type_beside(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path dir = io::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  const fs::path file = dir / "config.json";
  if (!io::path_exists(file)) return "";
  const std::optional<std::string> text = read_file(file);
  if (!text) return "";
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object() || !j.contains("model_type") || !j.at("model_type").is_string()) return "";
  return j.at("model_type").get<std::string>();
}

// The multi-token-prediction layers a config.json beside `path` says its
// files hold after the model's own (GLM-4.5's and DeepSeek-V3's
// num_nextn_predict_layers, MiniMax-M2's num_mtp_modules), which Triad, as
// Hugging Face's inference, does not read; 0 when there is no such file or
// key.
int64_t hf_prediction_layers_beside(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path dir = io::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  const std::optional<std::string> text = read_file((dir / "config.json").string());
  if (!text) return 0;
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object()) return 0;
  for (const char* key : {"num_nextn_predict_layers", "num_mtp_modules"}) {
    if (j.contains(key) && j.at(key).is_number_integer())
      return std::max<int64_t>(0, j.at(key).get<int64_t>());
  }
  return 0;
}

}  // namespace

void read_gpt2_weights(const std::string& path, const std::map<std::string, Shape>& expected,
                       const std::set<int64_t>* blocks,
                       const std::function<void(nn::StateDict&&)>& consume,
                       const WeightLayout& layout) {
  const WeightFiles files(path);
  // A PEFT adapter's deltas join the weights they change as each part is
  // read, under the file's names.
  std::set<std::string> merged;
  const auto adapted = [&](std::map<std::string, Tensor> tensors) {
    if (layout.adapter) layout.adapter->apply(tensors, merged);
    return tensors;
  };
  // First the tensors outside the blocks (the embedding, position table,
  // final norm and head): they name the file's layout and width.
  std::map<std::string, Tensor> outside = language_model_tensors(
      adapted(files.read([](const std::string& name) { return block_index(name) < 0; })));
  const bool neox = is_hf_neox(outside), phi = is_hf_phi(outside), falcon = is_hf_falcon(outside),
             gptj = is_hf_gptj(outside);
  // Cohere's (and Cohere 2's) files hold LLaMA's names; their config.json
  // beside them, or else the model's class, says q and k turn in
  // interleaved pairs.
  const std::string file_type = hf_model_type_beside(path);
  const bool interleave =
      file_type.empty() ? layout.interleaved_rotation : hf_turns_interleaved(file_type);
  const int64_t interleaved = interleave ? layout.n_head : 0;
  const int64_t n_head = layout.n_head, rope_dim = layout.rope_dim;
  // (Linear weights, [out, in])
  const bool llama = is_hf_llama(outside) || neox || falcon || gptj;
  const auto convert = [&](const std::map<std::string, Tensor>& tensors) {
    return neox     ? hf_neox_to_triad(tensors, n_head)
           : falcon ? hf_falcon_to_triad(tensors, n_head)
           : gptj   ? hf_gptj_to_triad(tensors, n_head, rope_dim)
           : phi    ? hf_phi_to_triad(tensors)
           : llama  ? hf_llama_to_triad(tensors, interleaved, interleave ? rope_dim : 0)
                    : gpt2_to_triad(tensors);
  };
  nn::StateDict state = convert(outside);
  outside.clear();
  // A tied model takes a file's lm_head.weight only as the copy of wte some
  // exports carry; an untied one needs its own.
  auto head = state.find("lm_head.weight");
  if (head != state.end() && !expected.count("lm_head.weight")) {
    auto wte = state.find("wte.weight");
    if (wte == state.end() || !same_values(wte->second, head->second)) {
      throw IoError("GPT-2 weights '" + path +
                    "': tensor 'lm_head.weight' differs from 'wte.weight' (an untied output "
                    "head), but the configured model ties them: set model.tie_embeddings: false");
    }
    state.erase(head);
  }
  // A file of another width or depth is named as such, not by the first
  // tensor (in name order) whose shape or presence differs.
  // (The depth from every name the file lists, read or not.)
  auto blocks_of = [](const std::map<std::string, Shape>& names) {
    int64_t n = 0;
    for (const auto& [name, shape] : names) {
      if (!is_vision_tensor(name)) n = std::max(n, block_index(name) + 1);
    }
    return n;
  };
  const auto file_wte = state.find("wte.weight");
  const auto model_wte = expected.find("wte.weight");
  if (file_wte != state.end() && model_wte != expected.end() && file_wte->second.dim() == 2 &&
      model_wte->second.size() == 2 && file_wte->second.size(1) != model_wte->second[1]) {
    throw IoError("GPT-2 weights '" + path + "': the file's model is " +
                  std::to_string(file_wte->second.size(1)) + " wide (wte.weight " +
                  shape_str(file_wte->second.shape()) + ") but the configured model.d_model is " +
                  std::to_string(model_wte->second[1]));
  }
  const int64_t model_blocks = blocks_of(expected);
  // An index listing a block no shard holds and no rank reads names it.
  files.check_listed([&](const std::string& name) { return block_index(name) >= model_blocks; });
  const int64_t file_blocks = blocks_of(files.shapes());
  // (Blocks past the model's that its config calls prediction layers stay
  // unread.)
  const int64_t predicting = hf_prediction_layers_beside(path);
  if (file_blocks != model_blocks &&
      (predicting == 0 || file_blocks != model_blocks + predicting)) {
    throw IoError("GPT-2 weights '" + path + "': the file holds " + std::to_string(file_blocks) +
                  " blocks but the configured model.n_layer is " + std::to_string(model_blocks));
  }
  // Multi-token prediction's modules (mtp.*, model.mtp_layers) that the
  // file lacks (a model trained without them) keep the values the caller
  // gave them: a run adds them to a pretrained model from their random
  // initialisation.
  bool file_predicts = false;
  for (const auto& [name, t] : state) file_predicts = file_predicts || name.rfind("mtp.", 0) == 0;
  std::map<std::string, Shape> outside_expected;
  for (const auto& [name, shape] : expected)
    if (file_predicts || name.rfind("mtp.", 0) != 0) outside_expected.emplace(name, shape);
  // And those of a file whose model predicted further than this one stay
  // behind.
  for (auto it = state.begin(); it != state.end();) {
    it = it->first.rfind("mtp.", 0) == 0 && !expected.count(it->first) ? state.erase(it) : ++it;
  }
  check_part(path, state, outside_expected, -1, llama);
  consume(std::move(state));
  // Then one block at a time: a rank holds one block of the file's tensors
  // (converted, before it cuts its shard) and never the whole model.
  for (int64_t b = 0; b < model_blocks; ++b) {
    if (blocks && !blocks->count(b)) continue;  // another rank's
    std::map<std::string, Tensor> tensors = language_model_tensors(
        adapted(files.read([b](const std::string& name) { return block_index(name) == b; })));
    nn::StateDict part = convert(tensors);
    tensors.clear();
    // Expert biases a file lacks (a mixture routed without them, to be
    // balanced by them from now on) start at zero: the choice is then the
    // file's own.
    for (const auto& [name, shape] : expected) {
      if (block_index(name) == b && name.ends_with(".mlp.expert_bias") && !part.count(name))
        part[name] = zeros(shape, DType::F32);
    }
    check_part(path, part, expected, b, llama);
    consume(std::move(part));
  }
  // The model's multi-token-prediction modules (mtp.K.*) from the file's
  // own prediction layers, when it has them in Hugging Face's layout
  // (DeepSeek-V3's and GLM-4.5's num_nextn_predict_layers, after its
  // blocks): each layer's block read as the blocks are, and its enorm,
  // hnorm, eh_proj and shared_head.norm as ln_embed, ln_hidden, eh_proj and
  // ln_out (its copies of the embedding and the head, embed_tokens and
  // shared_head.head, are the model's own and stay behind).
  int64_t modules = 0;
  while (expected.count("mtp." + std::to_string(modules) + ".eh_proj.weight")) ++modules;
  if (modules > 0 && predicting > 0 && !file_predicts) {
    if (predicting < modules) {
      throw IoError("GPT-2 weights '" + path + "': the file holds " + std::to_string(predicting) +
                    " prediction layer(s) (num_nextn_predict_layers) but model.mtp_layers is " +
                    std::to_string(modules));
    }
    static const std::map<std::string, std::string> kBeside = {
        {"enorm.weight", "ln_embed.weight"},
        {"hnorm.weight", "ln_hidden.weight"},
        {"eh_proj.weight", "eh_proj.weight"},
        {"shared_head.norm.weight", "ln_out.weight"}};
    for (int64_t k = 0; k < modules; ++k) {
      const int64_t b = model_blocks + k;
      const std::string layer = "layers." + std::to_string(b) + ".";
      const std::string mine = "mtp." + std::to_string(k) + ".";
      std::map<std::string, Tensor> tensors = language_model_tensors(
          adapted(files.read([b](const std::string& name) { return block_index(name) == b; })));
      nn::StateDict part;
      for (auto it = tensors.begin(); it != tensors.end();) {
        const size_t at = it->first.find(layer);
        const std::string rest =
            at == std::string::npos ? std::string() : it->first.substr(at + layer.size());
        if (auto beside = kBeside.find(rest); beside != kBeside.end()) {
          part[mine + beside->second] = it->second;
          it = tensors.erase(it);
        } else if (rest == "shared_head.head.weight" || rest == "embed_tokens.weight") {
          it = tensors.erase(it);
        } else {
          ++it;
        }
      }
      const std::string block = "h." + std::to_string(b) + ".";
      for (auto& [name, t] : convert(tensors)) {
        if (name.rfind(block, 0) != 0) {
          throw IoError("GPT-2 weights '" + path + "': prediction layer " + std::to_string(b) +
                        " holds '" + name + "', which no module of the model takes");
        }
        part[mine + "block." + name.substr(block.size())] = t;
      }
      tensors.clear();
      std::map<std::string, Shape> wanted;
      for (const auto& [name, shape] : expected) {
        if (name.rfind(mine, 0) != 0) continue;
        wanted.emplace(name, shape);
        if (name.ends_with(".mlp.expert_bias") && !part.count(name))
          part[name] = zeros(shape, DType::F32);  // (as the blocks')
      }
      check_part(path, part, wanted, -1, llama);
      consume(std::move(part));
    }
  }
  if (!layout.adapter) return;
  // Every module of the parts read found its weight: an adapter for another
  // model (or for modules Triad's layout reads otherwise) is named.
  for (const auto& [module, ab] : layout.adapter->modules) {
    const int64_t b = block_index(module + ".weight");
    if ((b >= 0 && b < model_blocks && blocks && !blocks->count(b)) || merged.count(module))
      continue;  // (another pipeline rank's block)
    throw IoError("PEFT adapter '" + layout.adapter->dir + "': module '" + module +
                  "' adapts no weight of '" + path + "' (is the adapter for another model?)");
  }
}

nn::StateDict load_gpt2_state_dict(const std::string& path,
                                   const std::map<std::string, Shape>& expected,
                                   const std::set<int64_t>* blocks, const WeightLayout& layout) {
  nn::StateDict all;
  read_gpt2_weights(
      path, expected, blocks, [&](nn::StateDict&& part) { all.merge(part); }, layout);
  return all;
}

void load_gpt2_safetensors(nn::Gpt& model, const std::string& path) {
  std::map<std::string, Shape> expected;
  for (auto& [name, p] : model.named_parameters()) expected[name] = p.shape();
  model.load_state_dict(
      load_gpt2_state_dict(path, expected, nullptr, weight_layout(model.config())));
}

namespace {

// What a GPT-2 layout file's metadata says of the model beyond its shapes.
std::map<std::string, std::string> gpt2_metadata(const nn::GptConfig& c) {
  std::map<std::string, std::string> meta{{"format", "pt"},
                                          {"n_layer", std::to_string(c.n_layer)},
                                          {"n_head", std::to_string(c.n_head)},
                                          {"d_model", std::to_string(c.d_model)},
                                          {"vocab_size", std::to_string(c.vocab_size)},
                                          {"seq_len", std::to_string(c.seq_len)}};
  if (!c.tie_embeddings) meta["tie_embeddings"] = "false";
  if (c.kv_heads() != c.n_head) meta["n_kv_head"] = std::to_string(c.kv_heads());
  if (c.heads_apart()) meta["head_dim"] = std::to_string(c.head_dim());
  if (c.qk_norm) meta["qk_norm"] = nn::qk_norm_string(c);
  if (c.norm_weight_offset) meta["norm_weight_offset"] = "true";
  if (c.post_norms) meta["post_norms"] = "true";
  if (!c.pre_norms) meta["pre_norms"] = "false";
  if (!c.norm_affine) meta["norm_affine"] = "false";
  if (!c.norm_bias) meta["norm_bias"] = "false";
  if (c.clip_qkv > 0.0) meta["clip_qkv"] = std::to_string(c.clip_qkv);
  if (c.parallel_residual) meta["parallel_residual"] = "true";
  if (c.shared_norm) meta["shared_norm"] = "true";
  if (c.head_bias) meta["head_bias"] = "true";
  if (c.mtp_layers > 0) meta["mtp_layers"] = std::to_string(c.mtp_layers);
  if (c.mlp_bias) meta["mlp_bias"] = "true";
  if (c.rope_local_theta > 0.0) meta["rope_local_theta"] = std::to_string(c.rope_local_theta);
  if (c.query_pre_attn_scalar > 0.0)
    meta["query_pre_attn_scalar"] = std::to_string(c.query_pre_attn_scalar);
  if (c.attn_logit_softcap > 0.0) meta["attn_logit_softcap"] = std::to_string(c.attn_logit_softcap);
  if (c.final_logit_softcap > 0.0)
    meta["final_logit_softcap"] = std::to_string(c.final_logit_softcap);
  if (c.embedding_multiplier != 1.0)
    meta["embedding_multiplier"] = std::to_string(c.embedding_multiplier);
  if (c.residual_multiplier != 1.0)
    meta["residual_multiplier"] = std::to_string(c.residual_multiplier);
  if (c.logit_scale != 1.0) meta["logit_scale"] = std::to_string(c.logit_scale);
  if (c.rotary()) {
    meta["position_embedding"] = nn::position_embedding_string(c.position_embedding);
    meta["rope_theta"] = std::to_string(c.rope_theta);
  }
  return meta;
}

std::vector<std::pair<std::string, TensorLayout>> gpt2_layout(
    const std::vector<std::pair<std::string, TensorLayout>>& triad) {
  std::vector<std::pair<std::string, TensorLayout>> out;
  for (auto [name, l] : triad) {
    if (is_gpt2_conv1d_weight(name)) {
      if (l.shape.size() != 2)
        throw ShapeError("GPT-2 linear weight must be 2-d, got " + shape_str(l.shape));
      std::swap(l.shape[0], l.shape[1]);
    }
    out.emplace_back(name, l);
  }
  return out;
}

}  // namespace

Gpt2Writer::Gpt2Writer(const std::string& path, const nn::GptConfig& config,
                       const std::vector<std::pair<std::string, TensorLayout>>& layout)
    : writer_(path, gpt2_layout(layout), gpt2_metadata(config)) {}

void Gpt2Writer::write(const std::string& name, const Tensor& t) {
  writer_.write(name, is_gpt2_conv1d_weight(name) ? transposed_copy(t) : t);
}

void Gpt2Writer::finish() {
  writer_.finish();
}

void save_gpt2_state_dict(const nn::StateDict& full, const nn::GptConfig& c,
                          const std::string& path) {
  std::vector<std::pair<std::string, TensorLayout>> layout;
  for (const auto& [name, t] : full) layout.push_back({name, {t.shape(), t.dtype()}});
  Gpt2Writer writer(path, c, layout);
  for (const auto& [name, t] : full) writer.write(name, t);
  writer.finish();
}

void save_gpt2_safetensors(const nn::Gpt& model, const std::string& path) {
  save_gpt2_state_dict(model.state_dict(), model.config(), path);
}

}  // namespace triad::io
