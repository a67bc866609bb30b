#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "triad/core/attention_heads.h"
#include "triad/core/rope_scaling.h"
#include "triad/core/tensor.h"
#include "triad/ops/linalg.h"

namespace triad {

// LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) *
// (weight_offset + weight) + bias. x (..., C); weight, bias (C);
// weight_offset 1 is Nemotron's LayerNorm1P (1 + weight), formed inside the
// kernels in f32 as rms_norm's is.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5,
                  double weight_offset = 0.0);

// A residual add and the norm after it in one op: returns {h = x +
// residual, layer_norm(h, weight, bias, eps, weight_offset)} (add_rms_norm:
// rms_norm(h, weight, eps, weight_offset)). x and residual have the same shape (..., C). Values and
// gradients equal the unfused add-then-norm; the CUDA backend does each
// direction in one pass.
struct AddNorm {
  Tensor sum;   // h, the residual stream
  Tensor norm;  // the norm of h
};
AddNorm add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                       const Tensor& bias, double eps = 1e-5, double weight_offset = 0.0);

// RMSNorm over the last dimension (LLaMA's normalisation: no mean, no
// bias): x * (weight_offset + weight) / sqrt(mean(x^2) + eps). x (..., C);
// weight (C); weight_offset 1 is Gemma's 1 + weight, formed inside the
// kernels in f32 (never rounded to a half weight's dtype). Statistics in
// f32 (f64 for f64); the weight's gradient is summed in a fixed order,
// straight into its (f32, for half weights) gradient buffer.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-5,
                double weight_offset = 0.0);
AddNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                     double eps = 1e-5, double weight_offset = 0.0);

// Softmax over the last dimension.
Tensor softmax(const Tensor& x);

// Soft-capping (Gemma 2's): cap * tanh(x / cap), cap > 0, so no |value|
// exceeds cap while small ones pass almost unchanged.
Tensor soft_cap(const Tensor& x, double cap);

// Clamping (OLMo's clip_qkv): min(max(x, lo), hi) elementwise, lo <= hi,
// both finite. Its gradient passes where lo <= x <= hi (the bounds
// included, as PyTorch's clamp) and is 0 elsewhere.
Tensor clamp(const Tensor& x, double lo, double hi);

// Squared ReLU (Primer's; Nemotron-4's MLP, model.activation relu2):
// max(x, 0)^2, as Megatron-LM computes it, a clamp at 0 and a product. It
// keeps x alone for backward, dx = 2 max(x, 0) dy (a clamp, a product and
// a doubling), not the clamp's output beside it.
Tensor relu2(const Tensor& x);

// Causal multi-head self-attention with scale 1/sqrt(head_dim).
// qkv (B, T, 3*C) = [q | k | v], each C = n_head * head_dim -> (B, T, C).
// Grouped-query attention: heads {n_head, n_kv_head} with qkv (B, T,
// (n_head + 2 * n_kv_head) * head_dim) = [q | k | v], k and v n_kv_head
// heads wide; query head h attends with key/value head h / (n_head /
// n_kv_head) -> (B, T, n_head * head_dim). The gradients of k and v sum
// over the query heads sharing them.
// Packed documents: doc_starts (B, T) i32 (nn::document_layout builds it)
// holds where each token's document begins in its row; token t then attends
// to [start, t] only, as if each document were its own sequence. In general
// it is the first key each query sees, non-decreasing along a row and at
// most t, so a sliding window (nn::sliding_window_starts: t - W + 1, or the
// document's start if later) is the same mechanism. It is checked where it
// is (values read only on the host) and moved to qkv's device; undefined
// means every earlier key.
Tensor causal_attention(const Tensor& qkv, AttentionHeads heads, const Tensor& doc_starts = {});

// A block of queries, apart from the keys and values: kv (B, T, 2 kv D: k's
// heads, then v's) holds the keys and values of positions [0, T) and q
// (B, Tq, q D) the queries of positions [query_start, query_start + Tq);
// query i attends to the keys from its doc_starts entry ((B, Tq) i32, one
// per query; undefined: 0) up to min(its position, T - 1) -> (B, Tq, q D).
// query_start -1 (the default) is T - Tq: a chunk of the sequence's last
// queries, which context parallelism's all-gather runs over the keys and
// values gathered up to it (with Tq = T it is causal_attention with q and kv
// split); query_start >= T puts every key before every query (a ring step's
// block of earlier keys). A query that sees no key gets zeros. Differentiable
// in both.
Tensor chunk_attention(const Tensor& q, const Tensor& kv, AttentionHeads heads,
                       const Tensor& doc_starts = {}, int64_t query_start = -1);

// Stores the n new tokens' keys and values, the k and v heads of qkv
// (B, n, (q + 2 kv) D), into slots [start, start + n) of k_cache and
// v_cache (B, kv, capacity, D; each slot's D elements contiguous), as
// decoding does before cached_attention reads them. Forward only, like it.
void write_kv_cache(const Tensor& qkv, AttentionHeads heads, int64_t start, Tensor& k_cache,
                    Tensor& v_cache);

// Attention of the n newest tokens over a key/value cache: decoding's
// attention, forward only (it raises NotSupportedError where a gradient
// would be recorded). qkv (B, n, (q + 2 kv) D) is the new tokens'
// projection (only its q heads are read); k_cache and v_cache (B, kv,
// capacity, D) hold the keys and values of slots [0, length), the new
// tokens' own in the last n of them (the caller writes them first). Query i
// of row b sits in slot p = length - n + i and attends causally to slots up
// to p, reading the cache in place (no copy of it, no mask tensor): under a
// sliding window > 0 to the last `window` of them only, and when
// text_starts ((B) i32 or i64, any device) is given, never to row b's
// left padding before slot text_starts[b] (a query in a padding slot sees
// the padding up to it). Scale 1/sqrt(D) and heads.softcap as in
// causal_attention. -> (B, n, q D).
Tensor cached_attention(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                        int64_t length, AttentionHeads heads, int64_t window = 0,
                        const Tensor& text_starts = {});

// Rotary position embedding (RoPE; the rotate-half form of GPT-NeoX and
// LLaMA) of the queries and keys in qkv (B, T, 3*C) = [q | k | v], C =
// n_head * D with D even -> the same layout with q and k rotated and v
// unchanged, ready for causal_attention. In each head, elements i and
// i + D/2 turn by position * theta^(-2i/D), so a query-key product depends
// only on how far apart the two tokens are. Token (b, t) sits at
// positions[b, t] ((B, T) i32/i64, each >= 0, on qkv's device or the host,
// where they are checked) or, with positions undefined, at start + t (a
// key/value-cache step starts past the cached tokens). Grouped-query
// layouts (see causal_attention) rotate their n_head query heads and
// n_kv_head key heads alike. `scaling` (LLaMA 3.1's "llama3") changes the
// frequencies as core/rope_scaling.h says; longrope takes its long factors
// when start + T, one past the pass's last position, is beyond its
// original context (with positions given, the rows' length stands for
// them: exact for left-padded rows, a bound for packed documents).
Tensor rotary_embedding(const Tensor& qkv, AttentionHeads heads, const Tensor& positions = {},
                        int64_t start = 0, double theta = 10000.0, const RopeScaling& scaling = {});

// Rows of weight (V, C) picked by ids (..., i32/i64) -> (..., C). The ids
// are on the weight's device or on the host: host ids are checked (and, in
// backward, grouped) where they are, so a GPU step never waits to copy them
// back; ids on the GPU are copied back for that. An id outside [0, V) is a
// ValueError naming it.
Tensor embedding(const Tensor& weight, const Tensor& ids);
// embedding's transpose: out (rows, C) whose row r is the sum of the rows
// src[i] (M, C) with index[i] == r, added in the order of i (a row no index
// names is zero): PyTorch's zeros(rows, C).index_add_(0, index, src).
// index (M) i32/i64 lives on src's device or the host and is checked on
// the host (read back from a GPU, which waits for it): each entry in
// [0, rows). src's gradient is dout's rows picked by index (embedding's
// forward). A mixture-of-experts layer sums its experts' outputs for each
// token with it.
Tensor index_add_rows(const Tensor& src, const Tensor& index, int64_t rows);
// x unchanged, with `loss` (one element, computed beside x) tied into x's
// graph: backward passes x's gradient on and gives `loss` the gradient
// `grad`, whatever reaches x. A loss computed inside a layer (a
// mixture-of-experts layer's load-balancing loss) so joins the training
// objective with weight `grad` without travelling to the model's end
// (across pipeline stages): Megatron-LM's auxiliary-loss scaler.
Tensor attach_loss(const Tensor& x, const Tensor& loss, double grad);
// The same with the weight a one-element tensor of the loss's dtype on its
// device, read when backward runs (a CUDA graph's replay refills it).
Tensor attach_loss(const Tensor& x, const Tensor& loss, const Tensor& grad);

// Mean over non-ignored rows of -log softmax(logits)[target]. logits (..., V);
// targets (...) i32/i64. Returns a scalar (shape []) of the statistics dtype (f32,
// or f64 for f64 logits: half logits give an f32 loss); 0 when
// every row is ignored. Targets are on the logits' device or on the host
// (checked there without waiting for the device, then uploaded).
// z_loss, when not null, receives a second output of the same node: the
// mean over those rows of log(sum exp(logits))^2 (PaLM's z-loss, without
// its coefficient), f32 like the loss; a gradient reaching it joins the
// loss's in one fused backward.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     Tensor* z_loss = nullptr);

// A language model's head and its loss in one op: cross_entropy(x @
// weight^T, targets) for x (..., C), weight (V, C), targets (...). The logits
// never leave it: their rows lie padded_logits_row(V) elements apart, so the
// head's three GEMMs get aligned leading dimensions whatever V is (GPT-2's
// 50257 would otherwise keep GPU GEMMs off their fast kernels), and backward
// overwrites them with their gradient instead of allocating a second
// logits-sized buffer. Hence its graph can be walked only once (a second
// backward with retain_graph is a NotSupportedError). The weight's gradient
// is deferrable (zero-bubble W) like a linear layer's.
// softcap > 0 (Gemma 2's final_logit_softcapping): the loss is over the
// logits soft-capped, softcap * tanh(logits / softcap), in place.
// bias (V), when defined (Phi-2's biased head): the logits are x @
// weight^T + bias (before the cap); its gradient, the logits' gradient
// summed over the rows, is deferrable with the weight's.
// z_loss: as for cross_entropy, over the (capped) logits. z_loss_coef > 0
// (with z_loss): the z-loss joins the loss's gradient instead — backward
// differentiates loss + z_loss_coef * z-loss from the gradient the loss
// gets — and *z_loss is its value, outside autograd (a model's output
// z-loss, model.z_loss_coef); 0: it is a second output with a gradient of
// its own.
// expected_grad, nonzero: the gradient the loss will receive in backward (a
// training step's ForwardContext::loss_grad). Where something needs a
// gradient and no z-loss has a gradient of its own, the logits' gradient is
// then written over them in the forward pass, in the loss's own pass over
// the logits (Backend::cross_entropy_forward_backward: on CUDA, one read of
// the logits fewer); backward compares the gradient that came with the one
// expected on the device and rescales the logits' gradient only when they
// differ. The same values either way, and with the expected gradient the
// same bits as without it.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets,
                            int64_t ignore_index = -100, double softcap = 0.0,
                            const Tensor& bias = {}, Tensor* z_loss = nullptr,
                            double expected_grad = 0.0, double z_loss_coef = 0.0);
// z_loss_coef a finite value >= 0, else a ValueError naming `op`.
void check_z_loss_coef(const char* op, double z_loss_coef);
// Elements from one row of linear_cross_entropy's logits to the next: V
// rounded up to a multiple of 64.
int64_t padded_logits_row(int64_t classes);

// A loss over a linear head's logits, as linear_head_loss takes it: the loss
// (a scalar), optionally a z-loss beside it (a second scalar output; else
// undefined), and how to write the logits' gradient over them given the
// outputs' gradients (the loss's, then the z-loss's when there is one).
struct HeadLoss {
  Tensor loss;
  Tensor z_loss;
  std::function<void(const std::vector<Tensor>& grads, Tensor& logits)> backward;
};
// The machinery of linear_cross_entropy for any loss over a head's logits
// (the vocab-parallel cross entropy uses it too): logits = x @ weight^T in
// padded rows, viewed (N, V) and handed to `loss_of`; backward has the loss
// overwrite them with their gradient, then takes x's (now) and weight's
// (deferrable) gradients from them. `op` names it in errors. softcap > 0:
// the logits are soft-capped in place (Backend::soft_cap) before `loss_of`
// sees them, and its backward must write the gradient with respect to the
// uncapped logits (the backends' cross entropies take the cap for that).
// A `comm` start takes x's gradient through a collective overlapped with
// the weight's gradient, as for linear (InputGradComm). A defined `bias`
// (classes) is added to the logits before the cap; its gradient, deferrable
// with the weight's, is the logits' gradient summed over the rows.
// Returns the op's outputs: the loss, then the z-loss when loss_of gave one.
std::vector<Tensor> linear_head_loss(const char* op, const Tensor& x, const Tensor& weight,
                                     const Tensor& bias,
                                     const std::function<HeadLoss(const Tensor& logits)>& loss_of,
                                     double softcap = 0.0, const InputGradComm& comm = {});

// linear_cross_entropy's loss over its logits (N, V), as linear_head_loss
// hands them (row-strided), for another head built around it (the
// vocab-parallel head on a group of one rank, over its valid columns):
// targets (N) on the logits' device or the host; softcap, z_loss,
// expected_grad and z_loss_coef as for linear_cross_entropy (with z_loss
// and z_loss_coef 0 the z-loss is HeadLoss::z_loss, a second output; with
// z_loss_coef > 0 it is written to *z_loss and HeadLoss::z_loss stays
// undefined).
HeadLoss cross_entropy_head(const char* op, const Tensor& logits, const Tensor& targets,
                            int64_t ignore_index, double softcap, Tensor* z_loss,
                            double expected_grad, double z_loss_coef);
// expected_grad where a backward through a head of x, weight and bias
// (undefined: none) will want it (grad mode on, one of them needing a
// gradient), else 0: what to pass cross_entropy_head.
double head_grad_ahead(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       double expected_grad);

// A z-loss's gradient with respect to a cross entropy's per-row
// log-sum-exp lse (N, stat dtype), for the cross entropies here and the
// vocab-parallel one, when it joins the loss's (z_loss_coef): each row's (lse_i *
// dloss_i) * z_scale, z_scale twice the coefficient and dloss (N) the
// rows' loss gradients (their weights in them), each product rounded as
// Backend::cross_entropy_forward_backward rounds it.
Tensor joined_z_loss_dlse(const Tensor& lse, const Tensor& dloss, double z_scale);

}  // namespace triad
