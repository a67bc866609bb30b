#include "triad/nn/latent_attention.h"

#include <cmath>
#include <limits>
#include <string>

#include "triad/core/error.h"
#include "triad/nn/gpt.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/linalg.h"
#include "triad/ops/nn_functional.h"
#include "triad/ops/reduce.h"
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
  if (cfg.lora_on("attn.kv_b_proj")) lora_scale_ = cfg.lora_scale();
}

LatentProjections::Parts LatentProjections::parts(const Tensor& x, const DropoutDraw& draw) const {
  if (x.dim() != 3) {
    throw ShapeError("latent attention: the input must be (B, T, d_model), got " +
                     shape_str(x.shape()));
  }
  const int64_t B = x.size(0), T = x.size(1), H = heads_;
  Parts p;
  p.q = reshape(q_proj_ ? q_proj_->forward(x, draw)
                        : q_b_proj_->forward(q_a_norm_->forward(q_a_proj_->forward(x, draw)), draw),
                {B, T, H, nope_ + rope_});
  const Tensor compressed = kv_a_proj_->forward(x, draw);  // [latent | k_rope]
  p.latent = kv_a_norm_->forward(contiguous(narrow(compressed, 2, 0, rank_)));
  p.k_rope = contiguous(narrow(compressed, 2, rank_, rope_));
  return p;
}

Tensor LatentProjections::qkv(const Parts& p, const DropoutDraw& draw) const {
  const Tensor& q = p.q;
  const int64_t B = q.size(0), T = q.size(1), H = heads_;
  const Tensor kv = reshape(kv_b_proj_->forward(p.latent, draw), {B, T, H, nope_ + v_});
  const Tensor k_rope = expand(reshape(p.k_rope, {B, T, 1, rope_}), {B, T, H, rope_});
  // Each head's parts side by side, zeros after them up to D.
  auto head = [&](std::vector<Tensor> parts, int64_t width) {
    if (width < D_) parts.push_back(zeros({B, T, H, D_ - width}, q.dtype(), q.device()));
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

std::pair<Tensor, Tensor> LatentProjections::turned(const Parts& p, int64_t start,
                                                    const Tensor& positions, double theta,
                                                    const RopeScaling& scaling) const {
  const int64_t B = p.q.size(0), n = p.q.size(1), H = heads_, P = rope_;
  // The heads' rope queries and the one rope key as a fused (B, n, (H + 2)
  // P) of H query heads and one key/value head, turned as the padded heads'
  // first P dimensions are.
  const Tensor fused =
      rotary_embedding(concat({reshape(contiguous(narrow(p.q, 3, nope_, P)), {B, n, H * P}),
                               p.k_rope, zeros({B, n, P}, p.q.dtype(), p.q.device())},
                              2),
                       AttentionHeads{H, 1}, positions, start, theta, scaling);
  return {reshape(contiguous(narrow(fused, 2, 0, H * P)), {B, n, H, P}),
          contiguous(narrow(fused, 2, H * P, P))};
}

void LatentProjections::write(const Parts& p, const Tensor& key, Tensor& latents, Tensor& rope_keys,
                              int64_t start) const {
  const int64_t B = p.latent.size(0), n = p.latent.size(1);
  const Shape want_latents{B, 1, latents.dim() == 4 ? latents.size(2) : -1, rank_},
      want_keys{B, 1, want_latents[2], rope_};
  if (latents.shape() != want_latents || rope_keys.shape() != want_keys) {
    throw ShapeError("latent attention: the cache's latents " + shape_str(latents.shape()) +
                     " and rope keys " + shape_str(rope_keys.shape()) + " must be (" +
                     std::to_string(B) + ", 1, capacity, " + std::to_string(rank_) + ") and (" +
                     std::to_string(B) + ", 1, capacity, " + std::to_string(rope_) + ")");
  }
  if (start < 0 || start + n > want_latents[2]) {
    throw ValueError("latent attention: slots [" + std::to_string(start) + ", " +
                     std::to_string(start + n) + ") do not fit a cache of " +
                     std::to_string(want_latents[2]));
  }
  Tensor l = narrow(latents, 2, start, n), k = narrow(rope_keys, 2, start, n);
  copy_(l, reshape(p.latent, {B, 1, n, rank_}));
  copy_(k, reshape(key, {B, 1, n, rope_}));
}

void LatentProjections::store(const Parts& p, Tensor& latents, Tensor& rope_keys, int64_t start,
                              const Tensor& positions, double theta,
                              const RopeScaling& scaling) const {
  write(p, turned(p, start, positions, theta, scaling).second, latents, rope_keys, start);
}

Tensor LatentProjections::decode(const Parts& p, Tensor& latents, Tensor& rope_keys, int64_t start,
                                 const Tensor& positions, double theta, const RopeScaling& scaling,
                                 int64_t window, const std::vector<int64_t>& row_start,
                                 double softcap) const {
  const int64_t B = p.q.size(0), n = p.q.size(1), H = heads_, P = rope_, r = rank_, T = start + n;
  if (!row_start.empty() && static_cast<int64_t>(row_start.size()) != B) {
    throw ShapeError("latent attention: " + std::to_string(row_start.size()) +
                     " row starts for a batch of " + std::to_string(B));
  }
  const auto [q_rope, key] = turned(p, start, positions, theta, scaling);
  write(p, key, latents, rope_keys, start);
  // kv_b_proj (H (nope + v), r) by head: W_uk (H, nope, r), W_uv (H, v, r),
  // its adapters merged in.
  Tensor w = kv_b_proj_->weight();
  if (lora_scale_ > 0) {
    const auto sd = kv_b_proj_->state_dict();
    w = add(w, scale(matmul(sd.at("lora_b"), sd.at("lora_a")), lora_scale_));
  }
  w = reshape(w, {H, nope_ + v_, r});
  const Tensor w_uv = contiguous(transpose(narrow(w, 1, nope_, v_), 1, 2));  // (H, r, v)
  // Each head's query in the latent's space, (B, H n, r), rows by head:
  // q_nope W_uk; and its turned rope query (B, H n, P).
  Tensor q_latent;
  if (nope_ > 0) {
    const Tensor q_nope =  // (H, B n, nope)
        contiguous(
            transpose(reshape(contiguous(narrow(p.q, 3, 0, nope_)), {B * n, H, nope_}), 0, 1));
    q_latent = reshape(
        contiguous(transpose(
            reshape(matmul(q_nope, contiguous(narrow(w, 1, 0, nope_))), {H, B, n, r}), 0, 1)),
        {B, H * n, r});
  }
  const Tensor q_turned = reshape(contiguous(transpose(q_rope, 1, 2)), {B, H * n, P});
  const Tensor cached = reshape(contiguous(narrow(latents, 2, 0, T)), {B, T, r});
  const Tensor keys = reshape(contiguous(narrow(rope_keys, 2, 0, T)), {B, T, P});
  Tensor scores = matmul(q_turned, contiguous(transpose(keys, 1, 2)));  // (B, H n, T)
  if (q_latent.defined())
    scores = add(scores, matmul(q_latent, contiguous(transpose(cached, 1, 2))));
  // The fused attention's scale: 1 / sqrt(D) of queries scaled by the factor.
  scores = scale(cast(scores, scores.dtype() == DType::F64 ? DType::F64 : DType::F32),
                 query_factor_ / std::sqrt(static_cast<double>(D_)));
  if (softcap > 0) scores = soft_cap(scores, softcap);
  // Which slots each query sees (as cached_attention's).
  std::vector<float> mask(static_cast<size_t>(B * n * T), 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t text = row_start.empty() ? 0 : row_start[static_cast<size_t>(b)];
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = start + i;
      int64_t lo = at >= text ? text : 0;
      if (window > 0) lo = std::max(lo, at - window + 1);
      float* row = mask.data() + (b * n + i) * T;
      for (int64_t t = 0; t < T; ++t)
        if (t < lo || t > at) row[t] = -std::numeric_limits<float>::infinity();
    }
  }
  const Tensor masked = add(
      scores,
      reshape(contiguous(expand(from_vector(mask, {B, 1, n, T}, scores.dtype(), scores.device()),
                                {B, H, n, T})),
              {B, H * n, T}));
  const Tensor weights = cast(softmax(masked), cached.dtype());
  const Tensor mixed =  // (H, B n, r): each head's weighted sum of the latents
      reshape(contiguous(transpose(reshape(matmul(weights, cached), {B, H, n, r}), 0, 1)),
              {H, B * n, r});
  const Tensor out = reshape(matmul(mixed, w_uv), {H, B, n, v_});  // each head's values
  return reshape(contiguous(transpose(transpose(out, 0, 1), 1, 2)), {B, n, H * v_});
}

}  // namespace triad::nn
