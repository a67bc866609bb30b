#include "cudnn_attention_graph.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace triad::detail::cudnn_graph {

const TensorDesc& Graph::tensor(int64_t uid) const {
  for (const TensorDesc& t : tensors)
    if (t.uid == uid) return t;
  throw std::out_of_range("cudnn attention graph: no tensor with uid " + std::to_string(uid));
}

float masked_score_fill(int64_t cudnn_version) {
  return cudnn_version >= 91000 ? -std::numeric_limits<float>::infinity()
                                : std::numeric_limits<float>::lowest();
}

std::string cudnn_attention_unsupported(const AttentionProblem& p) {
  if (p.io != DataType::BF16 && p.io != DataType::F16)
    return "cuDNN fused attention takes bf16 or f16 only";
  if (p.B < 1 || p.T < 1 || p.NH < 1 || p.C < 1 || p.C % p.NH != 0)
    return "attention shape B=" + std::to_string(p.B) + " T=" + std::to_string(p.T) +
           " C=" + std::to_string(p.C) + " NH=" + std::to_string(p.NH) + " is not valid";
  const int64_t D = p.head_dim();
  if (D % 8 != 0 || D > 256)
    return "cuDNN fused attention needs a head dim that is a multiple of 8 up to 256, not " +
           std::to_string(D);
  if (p.NKV < 0 || p.NH % p.kv_heads() != 0)
    return "key/value heads (" + std::to_string(p.NKV) + ") must divide the query heads (" +
           std::to_string(p.NH) + ")";
  if (p.window < 0) return "sliding window " + std::to_string(p.window) + " must be >= 0";
  return "";
}

namespace {

using Dims = std::array<int64_t, 4>;

Dims natural_strides(const Dims& d) {
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

// Builds one graph: tensors get uids from kFirstInternal on unless bound.
class Builder {
 public:
  explicit Builder(const AttentionProblem& p) : p_(p) {}

  int64_t bound(int64_t uid, const char* name, DataType type, Dims dims, Dims strides) {
    TensorDesc t;
    t.uid = uid, t.name = name, t.type = type, t.dims = dims, t.strides = strides;
    t.is_virtual = false;
    g_.tensors.push_back(t);
    return uid;
  }
  int64_t scalar(int64_t uid, const char* name, float value) {
    TensorDesc t;
    t.uid = uid, t.name = name, t.type = DataType::F32, t.dims = {1, 1, 1, 1};
    t.strides = {1, 1, 1, 1}, t.is_virtual = false, t.by_value = true, t.value = value;
    g_.tensors.push_back(t);
    return uid;
  }
  int64_t scalar(const char* name, float value) { return scalar(next_++, name, value); }
  int64_t virtual_tensor(const char* name, DataType type, Dims dims) {
    return virtual_tensor(name, type, dims, natural_strides(dims));
  }
  int64_t virtual_tensor(const char* name, DataType type, Dims dims, Dims strides) {
    TensorDesc t;
    t.uid = next_++, t.name = name, t.type = type, t.dims = dims, t.strides = strides;
    g_.tensors.push_back(t);
    return t.uid;
  }

  void matmul(const char* name, int64_t a, int64_t b, int64_t y) {
    Op op;
    op.kind = OpKind::Matmul, op.name = name, op.x = a, op.b = b, op.y = y;
    g_.ops.push_back(op);
  }
  void pointwise(const char* name, PointwiseMode mode, int64_t x, int64_t b, int64_t y,
                 int64_t t = 0, DataType compute = DataType::F32, int64_t axis = 0) {
    Op op;
    op.kind = OpKind::Pointwise, op.name = name, op.pointwise = mode, op.compute = compute;
    op.axis = axis, op.x = x, op.b = b, op.t = t, op.y = y;
    g_.ops.push_back(op);
  }
  void reduction(const char* name, ReductionMode mode, int64_t x, int64_t y) {
    Op op;
    op.kind = OpKind::Reduction, op.name = name, op.reduction = mode, op.x = x, op.y = y;
    g_.ops.push_back(op);
  }
  void reshape(const char* name, int64_t x, int64_t y) {
    Op op;
    op.kind = OpKind::Reshape, op.name = name, op.x = x, op.y = y;
    g_.ops.push_back(op);
  }

  // scores = (q @ k^T) * scale, [B, NH, T, T] f32.
  int64_t scaled_scores(int64_t q, int64_t kt, int64_t scale) {
    const Dims tt{g_.tensor(q).dims[0], g_.tensor(q).dims[1], g_.tensor(q).dims[2],
                  g_.tensor(kt).dims[3]};
    const int64_t s = virtual_tensor("scores", DataType::F32, tt);
    matmul("q_kt", q, kt, s);
    const int64_t scaled = virtual_tensor("scaled_scores", DataType::F32, tt);
    pointwise("scale_scores", PointwiseMode::Mul, s, scale, scaled);
    return scaled;
  }

  // Scores on and below the diagonal survive; the rest become
  // masked_score_fill (cuDNN's causal mask), so exp() makes them exactly zero.
  int64_t causal_mask(int64_t scores) {
    const Dims sdims = g_.tensor(scores).dims;
    const int64_t row = virtual_tensor("row_index", DataType::I32, sdims);
    const int64_t col = virtual_tensor("col_index", DataType::I32, sdims);
    const int64_t keep = virtual_tensor("causal_keep", DataType::Bool, sdims);
    const int64_t fill = scalar("mask_fill", masked_score_fill(p_.cudnn_version));
    const int64_t out = virtual_tensor("masked_scores", DataType::F32, sdims);
    pointwise("gen_row_index", PointwiseMode::GenIndex, scores, 0, row, 0, DataType::I32, 2);
    pointwise("gen_col_index", PointwiseMode::GenIndex, scores, 0, col, 0, DataType::I32, 3);
    pointwise("row_ge_col", PointwiseMode::CmpGe, row, col, keep, 0, DataType::Bool);
    pointwise("select_causal", PointwiseMode::BinarySelect, scores, fill, out, keep);
    return p_.windowed() ? window_mask(out) : out;
  }

  // The sliding window's left edge after the causal mask, as cuDNN's
  // frontend writes a left bound with the diagonal at the top left: keys
  // with col + window > row survive (the window a float, as the frontend
  // passes it), the rest take the mask's fill.
  int64_t window_mask(int64_t scores) {
    const Dims sdims = g_.tensor(scores).dims;
    const int64_t row = virtual_tensor("window_row_index", DataType::I32, sdims);
    const int64_t col = virtual_tensor("window_col_index", DataType::I32, sdims);
    const int64_t shifted = virtual_tensor("col_plus_window", DataType::F32, sdims);
    const int64_t keep = virtual_tensor("window_keep", DataType::Bool, sdims);
    const int64_t width = scalar("window", static_cast<float>(p_.window));
    const int64_t fill = scalar("window_fill", masked_score_fill(p_.cudnn_version));
    const int64_t out = virtual_tensor("windowed_scores", DataType::F32, sdims);
    pointwise("gen_window_row_index", PointwiseMode::GenIndex, scores, 0, row, 0, DataType::I32, 2);
    pointwise("gen_window_col_index", PointwiseMode::GenIndex, scores, 0, col, 0, DataType::I32, 3);
    pointwise("col_plus_window", PointwiseMode::Add, col, width, shifted, 0, DataType::F32, 3);
    pointwise("col_plus_window_gt_row", PointwiseMode::CmpGt, shifted, row, keep, 0,
              DataType::Bool);
    pointwise("select_window", PointwiseMode::BinarySelect, scores, fill, out, keep);
    return out;
  }

  const AttentionProblem& p() const { return p_; }
  Graph take() { return std::move(g_); }

 private:
  AttentionProblem p_;
  Graph g_;
  int64_t next_ = kFirstInternal;
};

// q, k, v heads inside qkv (B, T, W) and o heads inside out (B, T, C): NH
// query heads, NKV key/value heads.
struct Layout {
  int64_t B, T, C, NH, NKV, D, W;
  explicit Layout(const AttentionProblem& p)
      : B(p.B), T(p.T), C(p.C), NH(p.NH), NKV(p.kv_heads()), D(p.head_dim()), W(p.qkv_width()) {}
  bool grouped() const { return NKV != NH; }
  Dims bhtd() const { return {B, NH, T, D}; }
  Dims kv_btd() const { return {B, NKV, T, D}; }
  Dims kv_bdt() const { return {B, NKV, D, T}; }
  Dims bhtt() const { return {B, NH, T, T}; }
  Dims bht1() const { return {B, NH, T, 1}; }
  Dims qkv_strides() const { return {T * W, D, W, 1}; }
  Dims qkv_strides_transposed() const { return {T * W, D, 1, W}; }
  Dims out_strides() const { return {T * C, D, C, 1}; }
  Dims stats_strides() const { return {NH * T, T, 1, 1}; }
  // A [B, NH, T, T] tensor seen transposed through its strides.
  Dims tt_transposed() const { return {NH * T * T, T * T, 1, T}; }
};

void check(const AttentionProblem& p) {
  const std::string why = cudnn_attention_unsupported(p);
  if (!why.empty()) throw std::invalid_argument(why);
}

// What both graphs begin with: the layout, the builder, q, k seen
// transposed, and the softmax scale 1/sqrt(D) as a by-value scalar.
struct GraphStart {
  Layout l;
  Builder g;
  int64_t q, kt, sc;
  explicit GraphStart(const AttentionProblem& p) : l((check(p), p)), g(p) {
    q = g.bound(kQ, "q", p.io, l.bhtd(), l.qkv_strides());
    kt = g.bound(kK, "k_transposed", p.io, l.kv_bdt(), l.qkv_strides_transposed());
    sc = g.scalar(kScale, "attn_scale", 1.0f / std::sqrt(static_cast<float>(l.D)));
  }
};

}  // namespace

Graph attention_forward_graph(const AttentionProblem& p) {
  GraphStart start(p);
  const Layout& l = start.l;
  Builder& g = start.g;
  const int64_t q = start.q, kt = start.kt, sc = start.sc;
  const int64_t v = g.bound(kV, "v", p.io, l.kv_btd(), l.qkv_strides());
  const int64_t o = g.bound(kO, "o", p.io, l.bhtd(), l.out_strides());
  const int64_t stats = g.bound(kStats, "stats", DataType::F32, l.bht1(), l.stats_strides());

  const int64_t scaled = g.scaled_scores(q, kt, sc);
  const int64_t masked = g.causal_mask(scaled);

  // Softmax with its statistics: stats = max + log(sum(exp(x - max))).
  const int64_t mx = g.virtual_tensor("row_max", DataType::F32, l.bht1());
  g.reduction("max", ReductionMode::Max, masked, mx);
  const int64_t shifted = g.virtual_tensor("shifted", DataType::F32, l.bhtt());
  g.pointwise("sub_max", PointwiseMode::Sub, masked, mx, shifted);
  const int64_t e = g.virtual_tensor("exp", DataType::F32, l.bhtt());
  g.pointwise("exp", PointwiseMode::Exp, shifted, 0, e);
  const int64_t sum = g.virtual_tensor("row_sum", DataType::F32, l.bht1());
  g.reduction("sum", ReductionMode::Add, e, sum);
  const int64_t log_sum = g.virtual_tensor("log_sum", DataType::F32, l.bht1());
  g.pointwise("log", PointwiseMode::Log, sum, 0, log_sum);
  g.pointwise("stats", PointwiseMode::Add, mx, log_sum, stats);
  // The probabilities enter the second matmul in the input type.
  const int64_t probs = g.virtual_tensor("probs", p.io, l.bhtt());
  g.pointwise("div_sum", PointwiseMode::Div, e, sum, probs);
  g.matmul("p_v", probs, v, o);
  return g.take();
}

Graph attention_backward_graph(const AttentionProblem& p, bool deterministic) {
  GraphStart start(p);
  const Layout& l = start.l;
  Builder& g = start.g;
  const int64_t q = start.q, kt = start.kt, sc = start.sc;
  const int64_t vt = g.bound(kV, "v_transposed", p.io, l.kv_bdt(), l.qkv_strides_transposed());
  const int64_t o = g.bound(kO, "o", p.io, l.bhtd(), l.out_strides());
  const int64_t d_o = g.bound(kDO, "do", p.io, l.bhtd(), l.out_strides());
  const int64_t stats = g.bound(kStats, "stats", DataType::F32, l.bht1(), l.stats_strides());
  const int64_t dq = g.bound(kDQ, "dq", p.io, l.bhtd(), l.qkv_strides());
  const int64_t dk = g.bound(kDK, "dk", p.io, l.kv_btd(), l.qkv_strides());
  const int64_t dv = g.bound(kDV, "dv", p.io, l.kv_btd(), l.qkv_strides());
  const int64_t softmax_sum =
      g.bound(kSoftmaxSum, "softmax_sum", DataType::F32, l.bht1(), natural_strides(l.bht1()));
  const int64_t one = g.scalar("one", 1.0f);

  // softmax_sum = rowsum(dO * O): the softmax backward's correction term.
  const int64_t do_o = g.virtual_tensor("do_times_o", DataType::F32, l.bhtd());
  g.pointwise("mul_do_o", PointwiseMode::Mul, d_o, o, do_o);
  const int64_t rows = g.virtual_tensor("do_o_rowsum", DataType::F32, l.bht1());
  g.reduction("sum_do_o", ReductionMode::Add, do_o, rows);
  g.pointwise("softmax_sum", PointwiseMode::Mul, rows, one, softmax_sum);

  // Probabilities again, from the forward's statistics: exp(s * scale - lse).
  const int64_t scaled = g.scaled_scores(q, kt, sc);
  const int64_t centred = g.virtual_tensor("minus_stats", DataType::F32, l.bhtt());
  g.pointwise("sub_stats", PointwiseMode::Sub, scaled, stats, centred);
  const int64_t masked = g.causal_mask(centred);
  const int64_t probs = g.virtual_tensor("probs", DataType::F32, l.bhtt());
  g.pointwise("exp", PointwiseMode::Exp, masked, 0, probs);

  // A key/value gradient: the product itself, or under grouped-query
  // attention each query head's (virtual, in the input type, as cuDNN's
  // frontend declares it) summed over its group.
  struct Names {
    const char *product, *per_query_head, *group_sum;
  };
  auto kv_gradient = [&](const Names& n, int64_t a, int64_t b, int64_t out) {
    if (!l.grouped()) {
      g.matmul(n.product, a, b, out);
      return;
    }
    const int64_t full = g.virtual_tensor(n.per_query_head, p.io, l.bhtd());
    g.matmul(n.product, a, b, full);
    g.reduction(n.group_sum, ReductionMode::Add, full, out);
  };

  // dV = P^T dO.
  const int64_t probs_t = g.virtual_tensor("probs_t", p.io, l.bhtt(), l.tt_transposed());
  g.reshape("transpose_probs", probs, probs_t);
  kv_gradient({"pt_do", "dv_per_query_head", "sum_dv_over_group"}, probs_t, d_o, dv);

  // dS = P * (dO V^T - softmax_sum) * scale.
  const int64_t dp = g.virtual_tensor("dp", DataType::F32, l.bhtt());
  g.matmul("do_vt", d_o, vt, dp);
  const int64_t dp_centred = g.virtual_tensor("dp_minus_sum", DataType::F32, l.bhtt());
  g.pointwise("sub_softmax_sum", PointwiseMode::Sub, dp, softmax_sum, dp_centred);
  const int64_t ds_unscaled = g.virtual_tensor("ds_unscaled", DataType::F32, l.bhtt());
  g.pointwise("mul_probs", PointwiseMode::Mul, dp_centred, probs, ds_unscaled);
  const int64_t ds = g.virtual_tensor("ds", DataType::F32, l.bhtt());
  g.pointwise("scale_ds", PointwiseMode::Mul, ds_unscaled, sc, ds);

  // dK = dS^T Q.
  const int64_t ds_t = g.virtual_tensor("ds_t", p.io, l.bhtt(), l.tt_transposed());
  g.reshape("transpose_ds", ds, ds_t);
  kv_gradient({"dst_q", "dk_per_query_head", "sum_dk_over_group"}, ds_t, q, dk);

  // dQ = dS K, through K's untransposed view of the same memory.
  const int64_t k = g.virtual_tensor("k", p.io, l.kv_btd(), l.qkv_strides());
  g.reshape("untranspose_k", kt, k);
  if (deterministic) {
    g.matmul("ds_k", ds, k, dq);
  } else {
    const int64_t acc =
        g.bound(kDQAccum, "dq_accum", DataType::F32, l.bhtd(), natural_strides(l.bhtd()));
    g.matmul("ds_k", ds, k, acc);
    g.pointwise("dq_from_accum", PointwiseMode::Identity, acc, 0, dq);
  }
  return g.take();
}

int64_t element_offset(const AttentionProblem& p, int64_t uid) {
  switch (uid) {
    case kK:
    case kDK:
      return p.C;
    case kV:
    case kDV:
      return p.C + p.kv_heads() * p.head_dim();
    default:
      return 0;
  }
}

std::vector<WorkspaceTensor> workspace_tensors(const Graph& g) {
  std::vector<WorkspaceTensor> out;
  for (int64_t uid : {int64_t{kSoftmaxSum}, int64_t{kDQAccum}}) {
    for (const TensorDesc& t : g.tensors) {
      if (t.uid != uid) continue;
      out.push_back({uid, t.dims[0] * t.dims[1] * t.dims[2] * t.dims[3] *
                              static_cast<int64_t>(sizeof(float))});
    }
  }
  return out;
}

}  // namespace triad::detail::cudnn_graph
