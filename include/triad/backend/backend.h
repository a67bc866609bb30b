#pragma once

#include <cstdint>
#include <string>

#include "triad/core/allocator.h"
#include "triad/core/attention_heads.h"
#include "triad/core/device.h"
#include "triad/core/philox.h"
#include "triad/core/rope_scaling.h"
#include "triad/core/tensor.h"

namespace triad {

// Eq writes 1 where a == b and 0 elsewhere (in the operands' dtype).
enum class BinaryOp : uint8_t { Add, Sub, Mul, Div, Eq };
enum class ReduceOp : uint8_t { Sum, Max };

// Dtype of per-row statistics (LayerNorm mean/rstd, log-sum-exp, per-row
// losses): f64 for f64 inputs, f32 for every other floating type.
inline DType stat_dtype(DType dtype) {
  return dtype == DType::F64 ? DType::F64 : DType::F32;
}

// Hyper-parameters of one AdamW update (PyTorch semantics: decoupled weight
// decay, bias correction with the 1-based step count).
struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  int64_t step = 1;
  // The gradient is multiplied by this (in its own type, rounded once, as a
  // separate scale of the gradient would) before the update: gradient
  // clipping folds its coefficient in here instead of a pass over every
  // gradient. The gradients themselves are left as they are.
  double grad_scale = 1.0;
  // adamw_many only, clipping decided where the gradients are: when
  // defined (one f64 element on the parameters' device, their gradients'
  // global sum of squares: sum_of_squares), each entry's grad_scale is
  // times min(1, clip_max_norm / (sqrt(clip_sum_sq) + 1e-6)), the product
  // rounded to f32 as grad_scale is, and a sum that is not finite leaves
  // every entry as it is. The CUDA backend's multi-tensor launches read it
  // on the device, so nothing waits for the gradients' norm.
  Tensor clip_sum_sq;
  double clip_max_norm = 0;
};

// The kernels one device family provides. The front end (ops/) validates
// shapes and dtypes, allocates outputs and records autograd; a backend only
// computes. Unless a comment says otherwise, every tensor argument is
// contiguous and lives on this backend's device. A backend that cannot run a
// (kernel, dtype) combination throws NotSupportedError naming all three.
//
// Adding a backend: implement this interface, register it with
// register_backend(), and run the shared conformance suite
// (tests/ops/op_harness_test.cpp) against it.
// The activation a gated linear unit applies to its gate half.
enum class GluGate { Silu, GeluTanh };
// GELU's two forms: the tanh approximation (GPT-2's gelu_new) and the exact
// x * Phi(x) through erf (Hugging Face's "gelu": GPT-NeoX's, BERT's).
enum class GeluForm { Tanh, Erf };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Allocator& allocator(int device_index) = 0;
  virtual void synchronize() = 0;

  // dst = src elementwise with dtype conversion. Both may be strided views of
  // equal shape; one of them may live on the host (the other on this device).
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  virtual void fill(Tensor& dst, double value) = 0;
  // dst[i] = start + i (dst contiguous, i32 or i64). The default makes the
  // values on the host and copies them; a device backend makes them there.
  virtual void arange(Tensor& dst, int64_t start);
  // Packed documents' layout of rows of token ids (B, T), i32 or i64,
  // contiguous: a token equal to `eod` ends its document (an eod no id
  // equals keeps each row one document). starts (B, T) i32, contiguous: the
  // first key each token attends to, its document's start d(t), or with
  // window > 0 max(d(t), t - window + 1); positions (B, T) i64, contiguous,
  // when not null: t - d(t). All on this backend's device. The default
  // reads the ids on the host; a device backend forms them there.
  virtual void document_starts(const Tensor& ids, int64_t eod, int64_t window, Tensor& starts,
                               Tensor* positions);

  // out = a (op) b. `a` and `b` are views already expanded to out's shape
  // (broadcast dimensions have stride 0); out is contiguous and may alias a.
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // acc += src elementwise, src converted to acc's dtype first; equal
  // shapes, acc contiguous. Gradient accumulation (half-precision gradients
  // into f32 ones); the CUDA backend does it in one pass.
  virtual void accumulate(const Tensor& src, Tensor& acc);
  // acc (cols) = beta * acc + the column sums of x (rows, cols), both
  // contiguous: a linear layer's bias gradient added into its gradient
  // buffer. acc has x's dtype, or f32 under bf16/f16 x; beta 0 ignores
  // acc's contents. The default composes reduce and an add; the CUDA
  // backend sums straight into acc.
  virtual void sum_rows_into(const Tensor& x, Tensor& acc, double beta);
  // A linear layer's weight and bias gradients added into their buffers in
  // one call: gw (out, in) = beta * gw + dy^T x and gb (out) = beta * gb +
  // the column sums of dy, for dy (rows, out) and x (rows, in), all
  // contiguous; gw and gb have dy's dtype, or f32 under bf16/f16 dy. The
  // default composes gemm and sum_rows_into; the CUDA backend sums the bias
  // gradient in the weight-gradient GEMM's epilogue (one read of dy, not
  // two, and one launch fewer).
  virtual void linear_weight_bias_grad(const Tensor& dy, const Tensor& x, Tensor& gw, Tensor& gb,
                                       double beta);
  // out = alpha * x + beta (out may alias x).
  virtual void affine(const Tensor& x, double alpha, double beta, Tensor& out) = 0;

  // c = alpha * op(a) @ op(b) + beta * c, batched. a is (batch?, M, K) or
  // (batch?, K, M) when trans_a; b is (batch?, K, N) or (batch?, N, K) when
  // trans_b; c is (batch, M, N). A 2-D a or b is shared by every batch.
  // A 2-D operand may be a row-strided matrix (matrix_ld): a BLAS leading
  // dimension, e.g. logits whose rows are padded for aligned kernels.
  // a and b share a dtype; c has it too, or is f32 under bf16/f16 a and b
  // (products summed and stored in f32: a weight gradient added straight
  // into an f32 gradient, beta 1, without a half-precision temporary).
  virtual void gemm(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b,
                    double alpha, double beta) = 0;

  // x viewed as (outer, n, inner) reduced over n into out (outer, inner).
  // For Max, `indices` (i64, same shape as out) receives the arg-max.
  virtual void reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner,
                      Tensor& out, Tensor* indices) = 0;

  // GELU in either form: y = x * Phi(x), exactly (erf) or through tanh.
  virtual void gelu_forward(const Tensor& x, Tensor& y, GeluForm form) = 0;
  virtual void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, GeluForm form) = 0;
  // Soft-capping (Gemma 2's): y = cap * tanh(x / cap) for cap > 0, so no
  // |y| exceeds cap. x and y may be one tensor, and may be row-strided
  // matrices of one row stride (matrix_ld: the head's padded logits).
  virtual void soft_cap(const Tensor& x, double cap, Tensor& y) = 0;
  // Its backward from the output: dx = dy * (1 - (y / cap)^2); contiguous.
  virtual void soft_cap_backward(const Tensor& y, const Tensor& dy, double cap, Tensor& dx) = 0;
  // Clamping (OLMo's clip_qkv): y = min(max(x, lo), hi), lo <= hi; x and y
  // contiguous, and may be one tensor.
  virtual void clamp(const Tensor& x, double lo, double hi, Tensor& y) = 0;
  // Its backward from the input: dx = dy where lo <= x <= hi (bounds
  // included, as PyTorch's), 0 elsewhere; contiguous.
  virtual void clamp_backward(const Tensor& x, const Tensor& dy, double lo, double hi,
                              Tensor& dx) = 0;
  // A gated linear unit over the last dimension: x (rows, 2F) = [a | b] ->
  // y (rows, F) = act(a) * b, act silu (SwiGLU: a * sigmoid(a)) or GELU's
  // tanh approximation (GeGLU). Backward: dx = [dy * b * act'(a) | dy *
  // act(a)] from x and dy (rows, F).
  virtual void glu_forward(const Tensor& x, Tensor& y, GluGate gate) = 0;
  virtual void glu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, GluGate gate) = 0;

  // A linear layer's forward: y (rows, out) = x (rows, in) @ w^T (w is
  // (out, in)) + bias (out; may be undefined, then no bias). With
  // `gelu_input`, y = GELU(that) and *gelu_input (rows, out) receives the
  // pre-activation GELU's backward needs. All contiguous. The default
  // composes copy, gemm and gelu_forward (the reference); a backend may fuse
  // them (the CUDA backend: cuBLASLt bias and GELU epilogues).
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y,
                              Tensor* gelu_input);
  // The input gradient of a linear layer whose input was GELU(pre), taken
  // all the way to pre: dpre (rows, in) = GELU'(pre) * (dy (rows, out) @ w
  // (out, in)). The default composes gemm and gelu_backward; the CUDA
  // backend applies the derivative in the GEMM's epilogue.
  virtual void gelu_linear_input_grad(const Tensor& dy, const Tensor& w, const Tensor& pre,
                                      Tensor& dpre);
  // gelu_linear_input_grad, and where the backend gets them from the same
  // pass, dpre's column sums (the bias gradient of the layer whose output
  // pre is): (in) in f32 or in dpre's dtype, or an undefined tensor when
  // only dpre was computed (the default; the CUDA backend with
  // GemmSettings::dgelu_bias_grad_epilogue sums in the GEMM's epilogue).
  virtual Tensor gelu_linear_input_grad_with_sums(const Tensor& dy, const Tensor& w,
                                                  const Tensor& pre, Tensor& dpre);
  // layer_norm_backward_into with dh (the fused add's), and where the
  // backend gets them from the same pass, dx's column sums (C, f32: the
  // bias gradient of the linear layer whose output was the residual), or an
  // undefined tensor when only the rest was computed (the default; the CUDA
  // backend with cuda::set_add_norm_bias_sums(true)).
  virtual Tensor layer_norm_backward_into_with_dx_sums(const Tensor& dy, const Tensor* dh,
                                                       const Tensor& x, const Tensor& weight,
                                                       const Tensor& mean, const Tensor& rstd,
                                                       Tensor& dx, Tensor& dweight, Tensor& dbias,
                                                       double beta, double weight_offset);

  // x (N, C); weight, bias (C); mean, rstd (N) in stat_dtype. The scale is
  // weight_offset + weight, the sum formed in the computation's precision
  // (Nemotron's LayerNorm1P, 1 + weight, never rounded to half; 0: the
  // weight itself).
  virtual void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                  double eps, Tensor& y, Tensor& mean, Tensor& rstd,
                                  double weight_offset) = 0;
  // Writes dx; dweight and dbias are overwritten (not accumulated); the
  // offset has no gradient.
  virtual void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                   Tensor& dweight, Tensor& dbias, double weight_offset) = 0;
  // The residual add fused with the LayerNorm after it: h = x + residual
  // (the residual stream) and y = LayerNorm(h) (the next sublayer's input),
  // all (N, C). The backward takes dh, the gradient h gets from its other
  // uses, and writes dx = LayerNorm's input gradient + dh (x's and the
  // residual's gradient alike). The defaults compose binary and the
  // LayerNorm calls (the reference); the CUDA backend fuses each into one
  // pass.
  virtual void add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                      const Tensor& bias, double eps, Tensor& h, Tensor& y,
                                      Tensor& mean, Tensor& rstd, double weight_offset);
  virtual void add_layer_norm_backward(const Tensor& dy, const Tensor& dh, const Tensor& h,
                                       const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                       Tensor& dx, Tensor& dweight, Tensor& dbias,
                                       double weight_offset);

  // LayerNorm's backward (with dh: the fused residual add's) with the
  // parameter gradients added into buffers: dweight = beta * dweight + the
  // weight gradient, dbias likewise (beta 0 ignores their contents). They
  // have x's dtype, or f32 under bf16/f16 x (the f32 gradients of
  // mixed-precision parameters, never rounded to half). dx as in
  // layer_norm_backward / add_layer_norm_backward. The default computes in
  // the buffers' dtype and adds; the CUDA backend writes them directly.
  virtual void layer_norm_backward_into(const Tensor& dy, const Tensor* dh, const Tensor& x,
                                        const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                        Tensor& dbias, double beta, double weight_offset);

  // RMSNorm over the last dimension (LLaMA's: no mean, no bias): x, y (N, C)
  // and weight (C) in one dtype; rstd (N) in stat_dtype, 1/sqrt(mean(x^2) +
  // eps); y = x * rstd * (weight_offset + weight), the sum formed in the
  // computation's precision (Gemma's 1 + weight never rounded to half; 0:
  // the weight itself). Backward writes dx; dweight (x's dtype) is
  // overwritten (the offset has no gradient).
  virtual void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                                Tensor& rstd, double weight_offset) = 0;
  virtual void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                 const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                 double weight_offset) = 0;
  // The residual add fused with the RMSNorm after it, as
  // add_layer_norm_forward: h = x + residual, y = RMSNorm(h). The default
  // composes binary and rms_norm_forward; the CUDA backend fuses them.
  virtual void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                    double eps, Tensor& h, Tensor& y, Tensor& rstd,
                                    double weight_offset);
  // RMSNorm's backward (with dh: the fused residual add's, dx = the input
  // gradient + dh) with the weight's gradient added into a buffer, as
  // layer_norm_backward_into: dweight = beta * dweight + the gradient, in
  // x's dtype or f32 under bf16/f16 x. The default computes in the buffer's
  // dtype and adds; the CUDA backend writes it directly, in one pass over
  // the rows and a second over the blocks' partial sums.
  virtual void rms_norm_backward_into(const Tensor& dy, const Tensor* dh, const Tensor& x,
                                      const Tensor& weight, const Tensor& rstd, Tensor& dx,
                                      Tensor& dweight, double beta, double weight_offset);

  // Softmax over the last dimension of x viewed as (rows, cols).
  virtual void softmax_forward(const Tensor& x, Tensor& y) = 0;
  virtual void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) = 0;

  // Causal self-attention. qkv (B, T, 3*C) holds q, k, v side by side, each
  // split into n_head heads of C/n_head; out (B, T, C); lse (B, NH, T) in stat_dtype is
  // the log-sum-exp of each query's scaled scores, kept for backward.
  // Grouped-query attention (heads.kv < heads.q): qkv (B, T, (q + 2 kv) D)
  // holds q's heads, then k's and v's kv heads; query head h uses key/value
  // head h / heads.group(); out (B, T, q D); lse (B, q, T); the k and v
  // gradients sum over each group's query heads.
  // doc_starts, when defined, is (B, T) i32 on qkv's device: the first key
  // query t sees, where its document begins in its packed row or where its
  // sliding window does (0 <= start <= t, never below the previous query's);
  // query t then attends to keys [start, t] only. Undefined: every earlier
  // key.
  virtual void attention_forward(const Tensor& qkv, const AttentionHeads& heads, Tensor& out,
                                 Tensor& lse, const Tensor& doc_starts) = 0;
  virtual void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                  const Tensor& dout, const AttentionHeads& heads, Tensor& dqkv,
                                  const Tensor& doc_starts) = 0;
  // A block of queries apart from its keys and values (context
  // parallelism's all-gather and ring): q (B, Tq, q D) holds the queries at
  // positions [query_start, query_start + Tq) of the keys' frame, kv (B, Tk,
  // 2 kv D) the keys then values of positions [0, Tk), all contiguous. Query
  // i sees keys [start_i, min(query_start + i, Tk - 1)], start_i its
  // doc_starts entry ((B, Tq) i32, non-decreasing, at most its position;
  // undefined: 0); query_start = Tk - Tq is a chunk at the end of a sequence,
  // query_start >= Tk a block of queries after every key. out (B, Tq, q D)
  // in q's dtype, or f32 under bf16/f16 q (a ring step's block, folded
  // without a rounding), lse (B, q, Tq); a query that sees no key gets out 0
  // and lse -inf. The
  // backward takes out and lse as the forward left them or, for a block of a
  // larger attention, the whole attention's (ring attention: each block's
  // share of the gradient); dq and dkv of q's and kv's shapes are
  // overwritten.
  virtual void attention_parts_forward(const Tensor& q, const Tensor& kv,
                                       const AttentionHeads& heads, int64_t query_start,
                                       Tensor& out, Tensor& lse, const Tensor& doc_starts) = 0;
  virtual void attention_parts_backward(const Tensor& q, const Tensor& kv, const Tensor& out,
                                        const Tensor& lse, const Tensor& dout,
                                        const AttentionHeads& heads, int64_t query_start,
                                        Tensor& dq, Tensor& dkv, const Tensor& doc_starts) = 0;
  // Folds a block's attention into an accumulated one over other keys (ring
  // attention): out (B, Tq, q D) and lse (B, q, Tq), both in the stat dtype
  // of part's (f32 under bf16/f16), become the attention over both sets of
  // keys: lse = log(e^lse + e^part_lse), out = (e^(old lse) out + e^part_lse
  // part) / e^lse. Either side's -inf (no key seen) leaves the other's.
  virtual void attention_merge(Tensor& out, Tensor& lse, const Tensor& part,
                               const Tensor& part_lse) = 0;

  // Stores the n new tokens' keys and values into a key/value cache: qkv
  // (B, n, (q + 2 kv) D) contiguous; its k heads go to k_cache and its v
  // heads to v_cache (B, kv, capacity, D), each slot's D elements
  // contiguous, at slots [start, start + n). The default copies each part
  // as a strided view; the CUDA backend writes both in one launch.
  virtual void write_kv_cache(const Tensor& qkv, const AttentionHeads& heads, int64_t start,
                              Tensor& k_cache, Tensor& v_cache);

  // Attention of the n newest tokens over a key/value cache (decoding;
  // forward only). qkv (B, n, (q + 2 kv) D) contiguous: the new tokens'
  // projection, of which only the q heads are read. keys and values
  // (B, kv, L, D): the cache's slots [0, L), the last n holding the new
  // tokens' own keys and values; each slot's D elements are contiguous and
  // slots lie D apart (the batch and head strides are free: a cache holds
  // more slots than L). Query i of row b sits in slot p = L - n + i and
  // attends, with scale 1/sqrt(D) and heads.softcap, to slots [first, p]:
  // first is 0, or p - window + 1 under a window > 0, and at least
  // text_starts[b] when text_starts ((B) i32 on qkv's device) is defined and
  // p >= text_starts[b] (a row's left padding is never seen by its text).
  // out (B, n, q D) contiguous.
  virtual void cached_attention_forward(const Tensor& qkv, const Tensor& keys, const Tensor& values,
                                        const AttentionHeads& heads, int64_t window,
                                        const Tensor& text_starts, Tensor& out) = 0;

  // Rotary position embedding (RoPE, the rotate-half form of GPT-NeoX and
  // LLaMA) of the q and k parts of qkv (B, T, (q + 2 kv) D), D even; the v
  // part is copied. Token (b, t) sits at positions[b, t] ((B, T)
  // i64 on qkv's device) or, with positions undefined, at start + t. In each
  // head, elements i and i + R/2 (i < R/2; R = scaling.turned(D), the whole
  // head or its first rotary_dim dimensions, the rest copied) turn by the
  // angle position * rope_frequency(i, D, theta, scaling) (theta^(-2i/R)
  // unscaled); `inverse` turns them back (the backward pass: the rotation's
  // transpose). cos and sin are taken in f64.
  virtual void rotary_embedding(const Tensor& qkv, const AttentionHeads& heads,
                                const Tensor& positions, int64_t start, double theta,
                                const RopeScaling& scaling, bool inverse, Tensor& out) = 0;

  // weight (V, C); ids (N) i32 or i64; out (N, C). Ids are validated < V.
  virtual void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) = 0;
  // dweight (V, C) is overwritten; the order of accumulation is fixed.
  virtual void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) = 0;
  // dweight = beta * dweight + the embedding gradient, dweight in dout's
  // dtype or f32 under bf16/f16 dout (beta 0 ignores its contents). The
  // default computes a dense gradient in dweight's dtype and adds it; the
  // CUDA backend adds into the rows the ids touch and nowhere else.
  virtual void embedding_backward_into(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                                       double beta);

  // logits (N, V); targets (N) i32/i64; losses, lse and dlosses (N) in stat_dtype. Rows whose
  // target equals ignore_index get loss 0. logits and dlogits may be
  // row-strided matrices (matrix_ld), dlogits with logits' row stride, and
  // dlogits may be logits itself (the gradient overwrites the logits).
  virtual void cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                     int64_t ignore_index, Tensor& losses, Tensor& lse) = 0;
  // dlogits = (softmax(logits) - onehot(target)) * dlosses[row]; ignored rows 0.
  // dlse (N) in stat_dtype, when defined: the gradient of each row's lse as
  // well (a z-loss over it), adding dlse[row] * softmax(logits) (ignored
  // rows still 0); undefined: none.
  // softcap > 0: the logits hold soft-capped values z = softcap * tanh(x /
  // softcap) (soft_cap, in place), and dlogits is the gradient with respect
  // to x, each element times 1 - (z / softcap)^2; 0: no cap.
  virtual void cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                      const Tensor& lse, const Tensor& dlosses, const Tensor& dlse,
                                      int64_t ignore_index, Tensor& dlogits, double softcap) = 0;
  // cross_entropy_forward, then cross_entropy_backward with `dlosses`
  // (given now: a training step knows its loss's gradient before its
  // backward pass), in one pass over the logits where the backend can: the
  // same losses, lse and dlogits. dlogits may be the logits. z_scale > 0: a
  // z-loss's gradient as well, each row's dlse (lse[row] * dlosses[row]) *
  // z_scale, rounded to the stat dtype at each product (z_scale twice the
  // z-loss's coefficient: the z-loss weighs its rows as the loss does);
  // 0: no dlse. The default makes the two calls; the CPU backend (row by
  // row) and the CUDA backend (one kernel, a block a row) read a row for
  // its log-sum-exp and again, from cache, for the gradient they write.
  virtual void cross_entropy_forward_backward(const Tensor& logits, const Tensor& targets,
                                              int64_t ignore_index, Tensor& losses, Tensor& lse,
                                              const Tensor& dlosses, Tensor& dlogits,
                                              double softcap, double z_scale = 0.0);
  // Whether this thread is capturing work for `device` into a CUDA graph
  // (cuda::capture): nothing may then wait for the device or copy from the
  // host, and ops take their device-side paths (a loss counts its targets
  // on the device).
  virtual bool capturing(const Device& device) const {
    (void)device;
    return false;
  }
  // Whether indices on `device` are checked by the kernels that read them
  // rather than on the host: while capturing, and (CUDA) while a
  // cuda::DeviceChecks is open on this thread for the device. Ops that
  // would read indices back only to check them then leave them where they
  // are.
  virtual bool checks_indices_on_device(const Device& device) const { return capturing(device); }
  // While capturing (capturing()): inv = 1 / (the targets not equal to
  // ignore_index), 0 when there are none: one element of f32 or f64 on
  // targets' device, formed in f64 and rounded once, as 1.0 / count on the
  // host. Every other target must lie in [0, classes); a bad one is left
  // to cuda::Graph::check. Outside a capture the loss counts on the host;
  // the default (and the CUDA backend when not capturing) refuses.
  virtual void inverse_target_count(const Tensor& targets, int64_t ignore_index, int64_t classes,
                                    Tensor& inv, const char* op);
  // While capturing: a vocabulary-parallel lookup's ids (VocabParallelEmbedding,
  // a shard of rows [start, start + valid) of `vocab`): local (i64, ids'
  // elements) = id - start for an id in the shard, else 0; keep (a floating
  // tensor of ids' elements) 1 there, else 0 — what the host forms from ids
  // it can read. Every id must lie in [0, vocab); a bad one is left to
  // cuda::Graph::check. The default (and the CUDA backend when not
  // capturing) refuses: outside a capture the lookup reads the ids on the
  // host.
  virtual void vocab_shard_ids(const Tensor& ids, int64_t start, int64_t valid, int64_t vocab,
                               Tensor& local, Tensor& keep, const char* op);
  // x *= actual / expected, unless actual == expected: then x is left as it
  // is (and on a GPU nothing reads it). actual: one element of x's
  // statistics dtype on x's device (a gradient as it arrived); expected
  // nonzero, compared as that dtype rounds it. x may be row-strided
  // (matrix_ld). The default reads actual on the host (on a GPU, a wait).
  virtual void scale_by_ratio(const Tensor& actual, double expected, Tensor& x);

  // Vocab-parallel cross entropy over a shard of the vocabulary: logits
  // (N, Vl) hold global columns [vocab_start, vocab_start + Vl), of which the
  // first `valid` are real (the rest padding, ignored). targets (N) global.
  // logits and dlogits may be row-strided as for cross_entropy_*, and
  // dlogits may be the logits.
  // Step 1: per row, the max over valid columns and the target's logit when
  // the target is in this shard (else 0); both (N) in stat_dtype.
  virtual void vocab_ce_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                int64_t valid, Tensor& row_max, Tensor& target_logit) = 0;
  // Steps 1 and 2 as one pass over the shard, the sum of exponentials
  // against this shard's own row max: per row, the max over its valid
  // columns (-inf where it has none), the sum over them of exp(logit - that
  // max) (0 where none), and the target's logit when the target is in this
  // shard (else 0); all (N) in stat_dtype. With M the max over the shards,
  // a shard's sum times exp(its max - M) is its part of the sum against M
  // (vocab_ce_sumexp over the (N, 1) column of its maxes gives the factor).
  // The default makes the two calls; the CUDA backend reads the logits once.
  virtual void vocab_ce_shard_sums(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                   int64_t valid, Tensor& row_max, Tensor& sumexp,
                                   Tensor& target_logit);
  // Step 2: per row, sum over valid columns of exp(logit - global_max).
  virtual void vocab_ce_sumexp(const Tensor& logits, const Tensor& global_max, int64_t valid,
                               Tensor& sumexp) = 0;
  // Step 3 (after the reductions): per row, the loss
  // log(sumexp) + global_max - target_logit; all (N) in stat_dtype, computed
  // where they are (the host never waits to read them).
  virtual void vocab_ce_loss(const Tensor& global_max, const Tensor& target_logit,
                             const Tensor& sumexp, Tensor& losses) = 0;
  // Backward: dlogits = (exp(logit - max) / sumexp - onehot) * dloss[row]
  // + exp(logit - max) / sumexp * dlse[row] (dlse (N) as for
  // cross_entropy_backward, or undefined); padding columns get 0; softcap as
  // for cross_entropy_backward.
  virtual void vocab_ce_backward(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                 int64_t valid, const Tensor& global_max, const Tensor& sumexp,
                                 const Tensor& dloss, const Tensor& dlse, Tensor& dlogits,
                                 double softcap) = 0;

  // y = x * keep / (1 - p), keep = philox_uniform(seed, stream, at.at(i)) >= p
  // (at.row_length divides x's elements, or is 0). With `keys` defined (i64
  // on x's device, one non-negative key per row of at.row_length elements)
  // row r's element c draws at.keyed(keys[r], c) instead. With `calls`
  // defined (one i64 on x's device, read there) the draws are
  // at.after_calls(calls): a CUDA graph's replay draws its own step's mask.
  // The same call maps dy to dx in backward.
  virtual void dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream,
                       const philox::Counters& at, const Tensor& keys, const Tensor& calls,
                       Tensor& y) = 0;

  // One AdamW update of param in place; m and v are its moments, of its
  // type, or bf16 beside an f32 parameter (train.moment_precision: bf16:
  // read into f32, updated and used in f32, stored rounded to bf16).
  virtual void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                     const AdamWStep& hp) = 0;

  // One AdamW update of many parameters (the optimizer's whole step). With
  // `master` defined (f32 master weights of a half parameter) the master is
  // updated and then rounded into `param`; `grad` is f32 then, or of the
  // parameter's half type (train.grad_precision: scaled in it, then
  // widened), and `m` and `v` f32 or bf16.
  // hp.weight_decay and hp.grad_scale are replaced by each entry's own. The
  // default runs adamw() (and the rounding copy) per entry, the reference,
  // reading hp.clip_sum_sq on the host; the CUDA backend updates them all
  // in a few multi-tensor launches.
  struct AdamWEntry {
    Tensor param, grad, m, v, master;
    double weight_decay = 0;
    double grad_scale = 1.0;
  };
  virtual void adamw_many(std::vector<AdamWEntry>& entries, const AdamWStep& hp);

  // The global gradient norm's square: out (an f64 tensor of one element on
  // this backend's device) = the sum of x^2 over every element of `tensors`
  // (contiguous, on that device). A NaN or infinity anywhere makes it
  // non-finite, which is the step's NaN/Inf check. The default squares and
  // sums tensor by tensor in the tensor's dtype (f32 for bf16/f16) and adds
  // the sums in f64 (the reference);
  // the CUDA backend reads every tensor once, in a few launches, squaring
  // and summing in f64.
  virtual void sum_of_squares(const std::vector<Tensor>& tensors, Tensor& out);

  // A mixture of experts' top-k choice (src/backend/expert_choice.h):
  // choice (N, k) i64 = each row of scores (N, E; f32 or f64, contiguous)'s
  // k experts, best first, chosen by score plus `bias` ((E), f32 or f64;
  // undefined: none) among the experts of the best `top_groups` of `groups`
  // contiguous groups, each scored by its `group_best` best; in f64, equal
  // ones by the lower index. A row holding a score (plus its bias) that is
  // not finite chooses -1 k times. Every backend chooses the same experts. The
  // default chooses on the host (copying through it when the tensors are
  // elsewhere); the CUDA backend chooses on the device, without a wait.
  // Throws ShapeError/ValueError naming the value for shapes, dtypes or a
  // rule that cannot choose. A bias that is not finite: the default
  // refuses it; the CUDA backend, which does not read it on the host, has
  // every row choose -1.
  // chosen, when not null: (N, k) in scores' dtype on their device, each
  // choice's own score (without its bias; a -1 row's 0), what an expert
  // over its capacity ranks its assignments by.
  virtual void route_top_k(const Tensor& scores, const Tensor& bias, int64_t groups,
                           int64_t top_groups, int64_t group_best, Tensor& choice,
                           Tensor* chosen = nullptr);
  // A mixture's experts' batches padded to their capacity
  // (model.moe.pad_to_capacity), formed where the choices are, so that
  // nothing about them waits for the host: from choice (N, k) i64
  // (route_top_k's; -1 where a token could not choose), each expert keeps
  // `capacity` of its assignments (a = n * k + j), in token order: with
  // scores ((N, k), f32 or f64, route_top_k's chosen scores; undefined:
  // none) those of the highest score, equal ones the earlier assignment's
  // (drop_policy probs); without, the earliest (position).
  // slot_token and slot_assignment (E * capacity, i64): expert e's slot i
  // at e * capacity + i holds its i-th kept assignment's token and
  // assignment, an empty slot token 0 and assignment N * k (the padding's
  // gate, 0). picked (N * k, i64): n * E + choice[n][j], N * E where a token
  // could not choose. counts (N / group, E, i64): the assignments each
  // expert received from each run of `group` tokens, those over its
  // capacity included. The default forms them on the host (copying through
  // it when the tensors are elsewhere); the CUDA backend on the device.
  // Throws ShapeError/ValueError naming the value for shapes, dtypes,
  // capacity < 1 or a group that does not divide N.
  virtual void capacity_slots(const Tensor& choice, const Tensor& scores, int64_t experts,
                              int64_t capacity, int64_t group, Tensor& slot_token,
                              Tensor& slot_assignment, Tensor& picked, Tensor& counts);
  // A dropless mixture's experts' batch formed where the choices are, so
  // that nothing about it waits for the host: from choice (N, k) i64
  // (route_top_k's; -1 where a token could not choose), every assignment
  // (a = n * k + j) gets a row, the rows grouped by expert (expert 0's
  // first), each group in token order. row_token and row_assignment
  // (N * k, i64): row r's token and assignment; rows past the last group
  // (one for each assignment of a token that could not choose) token 0
  // and assignment N * k (the padding's gate, 0). offsets (E + 1, i64):
  // expert e's rows are [offsets[e], offsets[e + 1]), offsets[0] = 0.
  // picked and counts as capacity_slots's. The default forms them on the
  // host (copying through it when the tensors are elsewhere); the CUDA
  // backend on the device. Throws ShapeError/ValueError naming the value
  // for shapes, dtypes or a group that does not divide N.
  virtual void dropless_rows(const Tensor& choice, int64_t experts, int64_t group,
                             Tensor& row_token, Tensor& row_assignment, Tensor& offsets,
                             Tensor& picked, Tensor& counts);
  // Products over rows grouped where the group sizes are not known to the
  // host (a dropless mixture's experts inside a CUDA graph): offsets
  // (G + 1, i64, contiguous, on a's device; 0 = offsets[0] <= ... <=
  // offsets[G] <= M) gives group g the rows [offsets[g], offsets[g + 1]).
  // grouped_gemm_rows: c (M, N) = a (M, K) @ op(b[g]) on group g's rows,
  // op(b) = b^T for b (N, K) with trans_b, else b (K, N); rows past
  // offsets[G] are zeros. grouped_gemm_sums: c[g] = a_g^T @ b_g + beta *
  // c[g] for a (M, K1) and b (M, K2), a_g and b_g group g's rows, c[g]
  // (K1, K2) (a group of no rows: beta * c[g]). The b's (c's) share one
  // shape; a, b and c share a dtype, or c is f32 under bf16/f16 a and b
  // (grouped_gemm_sums). Every matrix contiguous. Offsets out of order or
  // past M: ValueError on the host (the default reads them there); the
  // CUDA backend, which does not, clamps them into [0, M] and treats a
  // group that would end before it begins as empty.
  virtual void grouped_gemm_rows(const Tensor& a, const std::vector<Tensor>& b,
                                 const Tensor& offsets, bool trans_b, Tensor& c);
  virtual void grouped_gemm_sums(const Tensor& a, const Tensor& b, const Tensor& offsets,
                                 std::vector<Tensor>& c, double beta);
};

// Throws ShapeError unless sum_sq (AdamWStep::clip_sum_sq) is one f64
// element on `device`.
void check_clip_sum_sq(const Tensor& sum_sq, Device device);

// The row stride of a matrix a backend call may take row-strided: a 2-D
// tensor whose columns are adjacent (stride 1) and whose rows are at least
// a row apart, or any contiguous tensor (its last dimension). Throws
// ShapeError naming `op` and the strides otherwise.
int64_t matrix_ld(const Tensor& t, const char* op);
// matrix_ld of a gradient and of the matrix it belongs to, which must agree
// (a kernel writing one in the other's layout, possibly over it).
int64_t same_row_stride(const Tensor& t, const Tensor& grad, const char* op);

// Throws ValueError naming the dtypes unless a, b and c of a Backend::gemm
// share one, or a and b are both bf16 (or both f16) and c is f32.
void check_gemm_dtypes(const Tensor& a, const Tensor& b, const Tensor& c);

// Throws ShapeError naming the tensor unless Backend::document_starts's ids
// are contiguous (B, T) i32 or i64 and starts (positions, when not null)
// contiguous (B, T) i32 (i64); ValueError for a negative window.
void check_document_starts(const Tensor& ids, int64_t window, const Tensor& starts,
                           const Tensor* positions);

// The backend serving tensors of a device type; throws NotSupportedError when
// none is registered (e.g. CUDA in a build without it).
Backend& backend_for(DeviceType type);
inline Backend& backend_for(const Tensor& t) {
  return backend_for(t.device().type);
}
void register_backend(DeviceType type, Backend* backend);

}  // namespace triad
