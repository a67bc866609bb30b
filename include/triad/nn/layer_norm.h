#pragma once

#include <cstdint>

#include "triad/core/attention_heads.h"
#include "triad/nn/module.h"
#include "triad/ops/nn_functional.h"

namespace triad::nn {

// LayerNorm over the last dimension with a learned scale and shift; or,
// with `rms`, RMSNorm (LLaMA's: no mean subtracted, a scale and no shift,
// so the module has a weight and no bias). Without `affine`, neither: the
// normalisation alone (OLMo's non-parametric LayerNorm), and no parameters.
// Without `bias`, a LayerNorm's scale alone (Cohere's).
class LayerNorm : public Module {
 public:
  // unit_offset: scale by 1 + weight (Gemma's RMSNorm, Nemotron's
  // LayerNorm1P), weight starting at 0; the kernels form 1 + weight in f32.
  explicit LayerNorm(int64_t features, double eps = 1e-5, DType dtype = DType::F32,
                     bool rms = false, bool unit_offset = false, bool affine = true,
                     bool bias = true);
  Tensor forward(const Tensor& x) const;
  // {x + residual, forward(x + residual)} in one op (ops add_layer_norm,
  // add_rms_norm).
  AddNorm forward_add(const Tensor& x, const Tensor& residual) const;

 private:
  Tensor weight_;                       // undefined without affine
  Tensor bias_;                         // undefined for RMSNorm, without affine or bias
  Tensor scale(const Tensor& x) const;  // weight (the kernels add the offset), or ones like x's
  Tensor shift(const Tensor& x) const;  // LayerNorm's bias, or zeros like x's
  int64_t features_;
  double eps_;
  bool rms_;
  bool unit_offset_;
};

// Command R+'s query/key norm (model.qk_norm: head_layernorm): a LayerNorm
// without a shift over each of `heads` heads' D features, each head scaled
// by weights of its own. The weight is one vector (heads * D), head h's at
// [h * D, (h + 1) * D), so it is sharded, decayed and initialised as the
// other norms' are.
class HeadLayerNorm : public Module {
 public:
  HeadLayerNorm(int64_t heads, int64_t head_dim, double eps = 1e-5, DType dtype = DType::F32);
  // x: (..., heads, D).
  Tensor forward(const Tensor& x) const;

 private:
  Tensor weight_;
  int64_t heads_, head_dim_;
  double eps_;
};

// Qwen3's query/key normalisation (model.qk_norm): each query head of a
// fused qkv (B, T, (q + 2 kv) * D) normalised over its D features by
// `q_norm`, each key head by `k_norm` (both D wide, shared by every head),
// the values left alone. Normalised queries and keys bound the attention
// logits whatever scale the projections grow to.
Tensor norm_query_key_heads(const Tensor& qkv, const AttentionHeads& heads, const LayerNorm& q_norm,
                            const LayerNorm& k_norm);
// The same with Command R+'s norms (model.qk_norm: head_layernorm), each
// q_norm.heads query heads (k_norm's key heads) weighted by their own.
Tensor norm_query_key_heads(const Tensor& qkv, const AttentionHeads& heads,
                            const HeadLayerNorm& q_norm, const HeadLayerNorm& k_norm);

// OLMo 2's and OLMoE's query/key normalisation (model.qk_norm: full): the
// queries of a fused qkv (B, T, q_width + 2 kv_width), all heads together,
// normalised over their q_width features by `q_norm`, the keys over their
// kv_width by `k_norm`, the values left alone.
Tensor norm_query_key(const Tensor& qkv, int64_t q_width, int64_t kv_width, const LayerNorm& q_norm,
                      const LayerNorm& k_norm);

}  // namespace triad::nn
