#include "triad/nn/embedding.h"
#include "triad/nn/layer_norm.h"
#include "triad/nn/linear.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/linalg.h"
#include "triad/ops/nn_functional.h"
#include "triad/ops/shape_ops.h"

namespace triad::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, DType dtype) {
  if (in_features <= 0 || out_features <= 0) {
    throw ValueError("Linear: features must be positive, got in=" + std::to_string(in_features) +
                     " out=" + std::to_string(out_features));
  }
  weight_ = register_parameter("weight", zeros({out_features, in_features}, dtype));
  if (bias) bias_ = register_parameter("bias", zeros({out_features}, dtype));
}

void LinearBase::enable_lora(int64_t rank, double scale, const LoraDropout& dropout) {
  if (has_lora()) throw ValueError("enable_lora: the layer has adapters already");
  if (!weight_.defined() || weight_.dim() != 2)
    throw ValueError("enable_lora: the layer has no 2-d weight to adapt");
  if (rank <= 0) throw ValueError("enable_lora: rank " + std::to_string(rank) + " <= 0");
  if (!(dropout.p >= 0.0 && dropout.p < 1.0))
    throw ValueError("enable_lora: dropout " + std::to_string(dropout.p) + " is not in [0, 1)");
  lora_a_ = register_parameter("lora_a", zeros({rank, weight_.size(1)}, weight_.dtype()));
  lora_b_ = register_parameter("lora_b", zeros({weight_.size(0), rank}, weight_.dtype()));
  lora_scale_ = scale;
  lora_dropout_ = dropout;
  if (lora_in_full_ > 0) lora_dropout_.by_feature = true;  // a shard's slice
}

Tensor LinearBase::add_lora(const Tensor& y, const Tensor& x, const DropoutDraw& draw) const {
  if (!has_lora()) return y;
  Tensor in = x;
  const double p = lora_dropout_.p;
  if (draw.training && p > 0.0) {
    const int64_t features = x.size(-1), rows = x.numel() / features;
    const int64_t full = lora_in_full_ > 0 ? lora_in_full_ : features;
    const auto per_call = static_cast<uint64_t>(rows * full);
    const uint64_t call = draw.call * per_call;
    if (draw.keys.defined()) {
      if (draw.calls.defined()) {
        throw NotSupportedError(
            "LoRA dropout of a mixture's keyed rows with the call count in device memory (the "
            "keys are formed from the call on the host)");
      }
      // Row r is row keys[r] of the whole input's masks, by row: a shard's
      // features [f0, f0 + features) of it draw f0 on.
      in = dropout(x, p, draw.seed, lora_dropout_.stream,
                   philox::Counters{static_cast<uint64_t>(lora_in_offset_),
                                    static_cast<uint64_t>(features), static_cast<uint64_t>(full)},
                   draw.keys);
    } else if (draw.pieces) {
      in = lora_dropout_pieces(x, draw);
    } else if (!lora_dropout_.by_feature) {
      in = dropout(x, p, draw.seed, lora_dropout_.stream, philox::Counters{call, 0, 0, per_call},
                   Tensor{}, draw.calls);
    } else {
      // The transposed input's flat index is f * M + m: a shard's features
      // are one contiguous run of the whole's counters.
      const Tensor t = contiguous(transpose(reshape(x, {rows, features}), 0, 1));
      const Tensor d = dropout(
          t, p, draw.seed, lora_dropout_.stream,
          philox::Counters{call + static_cast<uint64_t>(lora_in_offset_ * rows), 0, 0, per_call},
          Tensor{}, draw.calls);
      in = reshape(contiguous(transpose(d, 0, 1)), x.shape());
    }
  }
  return add(y, scale(linear(linear(in, lora_a_), lora_b_), lora_scale_));
}

Tensor LinearBase::lora_dropout_pieces(const Tensor& x, const DropoutDraw& draw) const {
  const SequencePieces& s = *draw.pieces;
  const double p = lora_dropout_.p;
  if (!lora_dropout_.by_feature) {
    return sequence_dropout(x, p, draw.seed, lora_dropout_.stream, draw.call, &s, draw.calls);
  }
  const int64_t held = s.held();
  const int64_t features = x.size(-1), rows = x.numel() / features;
  if (held <= 0 || rows % held != 0 || held > s.row_length) {
    throw ShapeError("LoRA dropout: an input " + shape_str(x.shape()) +
                     " is not whole rows of this rank's " + std::to_string(held) + " tokens of " +
                     std::to_string(s.row_length) + " in each sequence");
  }
  const auto B = static_cast<uint64_t>(rows / held), T = static_cast<uint64_t>(s.row_length);
  const auto full = static_cast<uint64_t>(lora_in_full_ > 0 ? lora_in_full_ : features);
  const uint64_t M = B * T, base = draw.call * M * full;
  const Tensor whole = reshape(x, {static_cast<int64_t>(B), held, features});
  std::vector<int64_t> counts;
  for (const auto& run : s.runs) counts.push_back(run.second);
  std::vector<Tensor> parts = split(whole, counts, 1);  // (B, count, features) each
  for (size_t r = 0; r < parts.size(); ++r) {
    // Feature-major, (f, b, j) draws (offset + f) * M + b * T + t0 + j:
    // rows of count tokens, one a (feature, sequence), T apart.
    const auto t0 = static_cast<uint64_t>(s.runs[r].first);
    const auto n = static_cast<uint64_t>(s.runs[r].second);
    const Tensor t = permute(parts[r], {2, 0, 1});
    const auto f0 = static_cast<uint64_t>(lora_in_offset_);
    parts[r] =
        permute(dropout(t, p, draw.seed, lora_dropout_.stream,
                        philox::Counters{base + f0 * M + t0, n, T, M * full}, Tensor{}, draw.calls),
                {1, 2, 0});
  }
  return reshape(concat(parts, 1), x.shape());
}

Tensor Linear::forward(const Tensor& x, const DropoutDraw& draw) const {
  return add_lora(linear(x, weight_, bias_), x, draw);
}

LinearGelu Linear::forward_gelu(const Tensor& x, const DropoutDraw& draw) const {
  if (!has_lora()) return linear_gelu_parts(x, weight_, bias_);
  // (The adapters join the pre-activation, so GELU cannot be fused in.)
  const Tensor pre = forward(x, draw);
  return {pre, gelu(pre)};
}

Tensor Linear::forward_after_gelu(const LinearGelu& in, const DropoutDraw& draw) const {
  return add_lora(linear_after_gelu(in, weight_, bias_), in.act, draw);
}

LayerNorm::LayerNorm(int64_t features, double eps, DType dtype, bool rms, bool unit_offset,
                     bool affine, bool bias)
    : features_(features), eps_(eps), rms_(rms), unit_offset_(unit_offset) {
  if (!affine && unit_offset) {
    throw ValueError(
        "LayerNorm: unit_offset scales by 1 + weight, which a norm without affine "
        "parameters does not have");
  }
  if (!affine) return;
  weight_ = register_parameter("weight",
                               unit_offset ? zeros({features}, dtype) : ones({features}, dtype));
  if (!rms && bias) bias_ = register_parameter("bias", zeros({features}, dtype));
}

// Without affine parameters the kernels take a constant scale of ones and
// shift of zeros, made for x's dtype and device: the same arithmetic, and
// no gradient reaches them (they are no leaves). A unit offset is not
// added here: the norms' kernels add it to each weight in f32 (their
// weight_offset argument).
Tensor LayerNorm::scale(const Tensor& x) const {
  return weight_.defined() ? weight_ : ones({features_}, x.dtype(), x.device());
}

Tensor LayerNorm::shift(const Tensor& x) const {
  return bias_.defined() ? bias_ : zeros({features_}, x.dtype(), x.device());
}

Tensor LayerNorm::forward(const Tensor& x) const {
  const double offset = unit_offset_ ? 1.0 : 0.0;
  if (rms_) return rms_norm(x, scale(x), eps_, offset);
  return layer_norm(x, scale(x), shift(x), eps_, offset);
}

AddNorm LayerNorm::forward_add(const Tensor& x, const Tensor& residual) const {
  const double offset = unit_offset_ ? 1.0 : 0.0;
  if (rms_) return add_rms_norm(x, residual, scale(x), eps_, offset);
  return add_layer_norm(x, residual, scale(x), shift(x), eps_, offset);
}

HeadLayerNorm::HeadLayerNorm(int64_t heads, int64_t head_dim, double eps, DType dtype)
    : heads_(heads), head_dim_(head_dim), eps_(eps) {
  if (heads < 1 || head_dim < 1) {
    throw ValueError("HeadLayerNorm: heads (" + std::to_string(heads) + ") and head_dim (" +
                     std::to_string(head_dim) + ") must be positive");
  }
  weight_ = register_parameter("weight", ones({heads * head_dim}, dtype));
}

Tensor HeadLayerNorm::forward(const Tensor& x) const {
  if (x.dim() < 2 || x.size(-2) != heads_ || x.size(-1) != head_dim_) {
    throw ShapeError("HeadLayerNorm: x must be (..., " + std::to_string(heads_) + ", " +
                     std::to_string(head_dim_) + "), got " + shape_str(x.shape()));
  }
  // The normalisation alone (a scale of ones, no shift), then each head's
  // weights.
  const Tensor normed = layer_norm(x, ones({head_dim_}, x.dtype(), x.device()),
                                   zeros({head_dim_}, x.dtype(), x.device()), eps_);
  return mul(normed, reshape(weight_, {heads_, head_dim_}));
}

namespace {
// qkv's query heads through `q_norm`, its key heads through `k_norm`, each
// as (B, T, heads, D); the values as they are.
template <typename Norm>
Tensor norm_heads_of(const Tensor& qkv, const AttentionHeads& heads, const Norm& q_norm,
                     const Norm& k_norm) {
  if (qkv.dim() != 3) {
    throw ShapeError("norm_query_key_heads: qkv must be (B, T, width), got " +
                     shape_str(qkv.shape()));
  }
  const int64_t B = qkv.size(0), T = qkv.size(1), W = qkv.size(2);
  const int64_t D = heads.head_dim(W, "norm_query_key_heads");
  const std::vector<Tensor> parts =
      split(reshape(qkv, {B, T, heads.fused(), D}), {heads.q, heads.kv, heads.kv}, 2);
  return reshape(concat({q_norm.forward(parts[0]), k_norm.forward(parts[1]), parts[2]}, 2),
                 {B, T, W});
}
}  // namespace

Tensor norm_query_key_heads(const Tensor& qkv, const AttentionHeads& heads, const LayerNorm& q_norm,
                            const LayerNorm& k_norm) {
  return norm_heads_of(qkv, heads, q_norm, k_norm);
}

Tensor norm_query_key_heads(const Tensor& qkv, const AttentionHeads& heads,
                            const HeadLayerNorm& q_norm, const HeadLayerNorm& k_norm) {
  return norm_heads_of(qkv, heads, q_norm, k_norm);
}

Tensor norm_query_key(const Tensor& qkv, int64_t q_width, int64_t kv_width, const LayerNorm& q_norm,
                      const LayerNorm& k_norm) {
  if (qkv.dim() != 3 || q_width < 1 || kv_width < 1 || qkv.size(2) != q_width + 2 * kv_width) {
    throw ShapeError("norm_query_key: qkv must be (B, T, " + std::to_string(q_width) + " + 2 * " +
                     std::to_string(kv_width) + "), got " + shape_str(qkv.shape()));
  }
  const std::vector<Tensor> parts = split(qkv, {q_width, kv_width, kv_width}, 2);
  return concat({q_norm.forward(parts[0]), k_norm.forward(parts[1]), parts[2]}, 2);
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim, DType dtype) {
  weight_ = register_parameter("weight", zeros({num_embeddings, dim}, dtype));
}

Tensor Embedding::forward(const Tensor& ids) const {
  return embedding(weight_, ids);
}

}  // namespace triad::nn
