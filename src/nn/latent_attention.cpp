#include "triad/nn/latent_attention.h"

#include "triad/nn/gpt.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/shape_ops.h"

namespace triad::nn {

std::vector<std::pair<std::string, Shape>> latent_attention_shapes(const GptConfig& cfg,
                                                                   int64_t heads) {
  const GptConfig::Mla& a = cfg.mla;
  const int64_t C = cfg.d_model, qk = cfg.latent_qk_dim();
  std::vector<std::pair<std::string, Shape>> s;
  if (a.q_lora_rank > 0) {
    s.push_back({"q_a_proj.weight", {a.q_lora_rank, C}});
    if (cfg.linear_bias) s.push_back({"q_a_proj.bias", {a.q_lora_rank}});
    s.push_back({"q_a_norm.weight", {a.q_lora_rank}});
    s.push_back({"q_b_proj.weight", {heads * qk, a.q_lora_rank}});
  } else {
    s.push_back({"q_proj.weight", {heads * qk, C}});
    if (cfg.linear_bias) s.push_back({"q_proj.bias", {heads * qk}});
  }
  s.push_back({"kv_a_proj.weight", {a.kv_lora_rank + a.qk_rope_head_dim, C}});
  if (cfg.linear_bias) s.push_back({"kv_a_proj.bias", {a.kv_lora_rank + a.qk_rope_head_dim}});
  s.push_back({"kv_a_norm.weight", {a.kv_lora_rank}});
  s.push_back({"kv_b_proj.weight", {heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank}});
  return s;
}

LatentProjections::LatentProjections(const GptConfig& cfg, int64_t heads, int64_t layer)
    : heads_(heads),
      nope_(cfg.mla.qk_nope_head_dim),
      rope_(cfg.mla.qk_rope_head_dim),
      v_(cfg.mla.v_head_dim),
      rank_(cfg.mla.kv_lora_rank),
      D_(cfg.head_dim()),
      query_factor_(cfg.latent_query_factor()) {
  const GptConfig::Mla& a = cfg.mla;
  const int64_t C = cfg.d_model, qk = cfg.latent_qk_dim();
  const bool b = cfg.linear_bias;
  // DeepSeek's latents' norms: RMSNorms of the model's eps.
  auto norm = [&](int64_t width) {
    return std::make_shared<LayerNorm>(width, cfg.layer_norm_eps, DType::F32, true,
                                       cfg.norm_weight_offset);
  };
  if (a.q_lora_rank > 0) {
    q_a_proj_ = std::make_shared<Linear>(C, a.q_lora_rank, b);
    q_a_norm_ = norm(a.q_lora_rank);
    q_b_proj_ = std::make_shared<Linear>(a.q_lora_rank, heads * qk, false);
    layers_ = {{"q_a_proj", q_a_proj_}, {"q_a_norm", q_a_norm_}, {"q_b_proj", q_b_proj_}};
  } else {
    q_proj_ = std::make_shared<Linear>(C, heads * qk, b);
    layers_ = {{"q_proj", q_proj_}};
  }
  kv_a_proj_ = std::make_shared<Linear>(C, a.kv_lora_rank + a.qk_rope_head_dim, b);
  kv_a_norm_ = norm(a.kv_lora_rank);
  kv_b_proj_ = std::make_shared<Linear>(a.kv_lora_rank, heads * (nope_ + v_), false);
  layers_.insert(layers_.end(),
                 {{"kv_a_proj", kv_a_proj_}, {"kv_a_norm", kv_a_norm_}, {"kv_b_proj", kv_b_proj_}});
  // LoRA's adapters (their input whole on every tensor-parallel rank, so
  // drawn by row as one process draws them).
  for (const auto& [name, linear] :
       {std::pair{"q_a_proj", q_a_proj_}, std::pair{"q_b_proj", q_b_proj_},
        std::pair{"q_proj", q_proj_}, std::pair{"kv_a_proj", kv_a_proj_},
        std::pair{"kv_b_proj", kv_b_proj_}}) {
    const std::string target = std::string("attn.") + name;
    if (linear && cfg.lora_on(target))
      linear->enable_lora(cfg.lora.rank, cfg.lora_scale(), cfg.lora_dropout(layer, target));
  }
}

Tensor LatentProjections::qkv(const Tensor& x, const DropoutDraw& draw) const {
  if (x.dim() != 3) {
    throw ShapeError("latent attention: the input must be (B, T, d_model), got " +
                     shape_str(x.shape()));
  }
  const int64_t B = x.size(0), T = x.size(1), H = heads_;
  const Tensor q =
      reshape(q_proj_ ? q_proj_->forward(x, draw)
                      : q_b_proj_->forward(q_a_norm_->forward(q_a_proj_->forward(x, draw)), draw),
              {B, T, H, nope_ + rope_});
  const Tensor compressed = kv_a_proj_->forward(x, draw);  // [latent | k_rope]
  const Tensor latent = kv_a_norm_->forward(contiguous(narrow(compressed, 2, 0, rank_)));
  const Tensor kv = reshape(kv_b_proj_->forward(latent, draw), {B, T, H, nope_ + v_});
  const Tensor k_rope = expand(
      reshape(contiguous(narrow(compressed, 2, rank_, rope_)), {B, T, 1, rope_}), {B, T, H, rope_});
  // Each head's parts side by side, zeros after them up to D.
  auto head = [&](std::vector<Tensor> parts, int64_t width) {
    if (width < D_) parts.push_back(zeros({B, T, H, D_ - width}, x.dtype(), x.device()));
    return parts.size() == 1 ? parts[0] : concat(parts, 3);
  };
  std::vector<Tensor> q_parts{narrow(q, 3, nope_, rope_)}, k_parts{k_rope};
  if (nope_ > 0) {
    q_parts.push_back(narrow(q, 3, 0, nope_));
    k_parts.push_back(narrow(kv, 3, 0, nope_));
  }
  Tensor queries = head(std::move(q_parts), nope_ + rope_);
  if (query_factor_ != 1.0) queries = affine(queries, query_factor_);
  const Tensor keys = head(std::move(k_parts), nope_ + rope_);
  const Tensor values = head({narrow(kv, 3, nope_, v_)}, v_);
  return reshape(concat({queries, keys, values}, 2), {B, T, 3 * H * D_});
}

Tensor LatentProjections::values(const Tensor& y) const {
  if (D_ == v_) return y;
  const int64_t B = y.size(0), T = y.size(1);
  return reshape(contiguous(narrow(reshape(y, {B, T, heads_, D_}), 3, 0, v_)), {B, T, heads_ * v_});
}

}  // namespace triad::nn
