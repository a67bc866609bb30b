#include "triad/ops/linalg.h"

#include <functional>

#include "op_checks.h"
#include "op_nodes.h"
#include "triad/autograd/node.h"
#include "triad/backend/backend.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/shape_ops.h"

namespace triad {

using autograd::record;
using autograd::TensorList;

namespace {

Tensor gemm_new(const Tensor& a, const Tensor& b, Shape out_shape, bool ta, bool tb) {
  Tensor c = empty(out_shape, a.dtype(), a.device());
  backend_for(a).gemm(a, b, c, ta, tb, 1.0, 0.0);
  return c;
}

// grouped_linear's weights checked against x: one shape, x's dtype and
// device, two dimensions.
void check_grouped_weights(const Tensor& x, const std::vector<Tensor>& weights, const char* op) {
  for (const Tensor& w : weights) {
    detail::check_same(x, w, op);
    detail::check_dim(w, 2, op, "weight");
    if (w.shape() != weights[0].shape()) {
      throw ShapeError(std::string(op) + ": weights " + shape_str(weights[0].shape()) + " and " +
                       shape_str(w.shape()) + " (expected one shape)");
    }
  }
}

// grouped_linear's node: x and every weight its inputs, each weight's
// gradient deferrable.
void record_grouped(const char* op, const Tensor& x, const std::vector<Tensor>& weights,
                    const Tensor& y, autograd::BackwardFn input_grad,
                    detail::WeightGradFn weight_grad, const Tensor& saved) {
  TensorList inputs{x};
  std::vector<int> deferrable;
  for (size_t e = 0; e < weights.size(); ++e) {
    inputs.push_back(weights[e]);
    deferrable.push_back(static_cast<int>(e + 1));
  }
  detail::record_layer(op, inputs, {y}, deferrable, std::move(input_grad), std::move(weight_grad),
                       saved, nullptr);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  detail::check_floating(a, "matmul", "a");
  detail::check_floating(b, "matmul", "b");
  detail::check_same(a, b, "matmul");
  if (a.dim() < 2 || b.dim() < 2) {
    throw ShapeError("matmul: operands must be at least 2-d, got " + shape_str(a.shape()) +
                     " and " + shape_str(b.shape()));
  }
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  if (b.size(-2) != K) {
    throw ShapeError("matmul: inner dimensions differ: " + shape_str(a.shape()) + " @ " +
                     shape_str(b.shape()));
  }
  Shape out_shape(a.shape().begin(), a.shape().end() - 2);
  const int64_t batch = numel(out_shape);
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor ac = contiguous(a).detach(), bc = contiguous(b).detach();
  if (b.dim() == 2) {
    Tensor a2 = reshape(ac, {batch * M, K});
    Tensor y = reshape(gemm_new(a2, bc, {batch * M, N}, false, false), out_shape);
    y = y.detach();
    record("matmul", {a, b}, {y},
           [a2, bc, out_shape, M, N, K, batch](const TensorList& g) -> TensorList {
             Tensor g2 = reshape(contiguous(g[0]), {batch * M, N});
             Tensor ga = gemm_new(g2, bc, {batch * M, K}, false, true);
             Tensor gb = gemm_new(a2, g2, {K, N}, true, false);
             Shape a_shape(out_shape.begin(), out_shape.end() - 1);
             a_shape.push_back(K);
             return {reshape(ga, a_shape), gb};
           });
    return y;
  }
  Shape b_lead(b.shape().begin(), b.shape().end() - 2);
  Shape a_lead(a.shape().begin(), a.shape().end() - 2);
  if (a_lead != b_lead) {
    throw ShapeError("matmul: batch dimensions differ: " + shape_str(a.shape()) + " @ " +
                     shape_str(b.shape()) + " (batched operands must have equal leading dims)");
  }
  Tensor a3 = reshape(ac, {batch, M, K}), b3 = reshape(bc, {batch, K, N});
  Tensor y = reshape(gemm_new(a3, b3, {batch, M, N}, false, false), out_shape).detach();
  const Shape as = a.shape(), bs = b.shape();
  record("matmul", {a, b}, {y},
         [a3, b3, as, bs, batch, M, N, K](const TensorList& g) -> TensorList {
           Tensor g3 = reshape(contiguous(g[0]), {batch, M, N});
           Tensor ga = gemm_new(g3, b3, {batch, M, K}, false, true);
           Tensor gb = gemm_new(a3, g3, {batch, K, N}, true, false);
           return {reshape(ga, as), reshape(gb, bs)};
         });
  return y;
}

std::shared_ptr<detail::FusedBiasSums> detail::output_grad_sums_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad() || !t.grad_fn() || t.impl().output_nr != 0) return nullptr;
  return t.grad_fn()->output_grad_sums;
}

namespace {

struct LinearResult {
  Tensor y;
  Tensor pre;  // with gelu_out: the linear part's output, GELU's input
};

// linear, linear_gelu and linear_after_gelu: the checks, one fused backend
// call, and the autograd nodes. With `gelu_out`, linear's output is GELU's
// input and a gelu node follows. With `gelu_in` defined, x = gelu(gelu_in)
// and the input gradient goes to gelu_in, GELU's derivative fused into it.
// `sums` (with gelu_in): where to leave the column sums of gelu_in's
// gradient when the backend makes them in the input-gradient call.
LinearResult linear_core(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                         bool gelu_out, const Tensor& gelu_in, const InputGradComm* comm,
                         std::shared_ptr<detail::FusedBiasSums> sums = nullptr) {
  detail::check_floating(x, op, "x");
  detail::check_floating(weight, op, "weight");
  detail::check_same(x, weight, op);
  detail::check_dim(weight, 2, op, "weight");
  const int64_t out_f = weight.size(0), in_f = weight.size(1);
  if (x.dim() < 1 || x.size(-1) != in_f) {
    throw ShapeError(std::string(op) + ": input of shape " + shape_str(x.shape()) +
                     " does not match weight " + shape_str(weight.shape()) +
                     " (last input dim must be " + std::to_string(in_f) + ")");
  }
  if (bias.defined()) {
    detail::check_same(x, bias, op);
    if (bias.shape() != Shape{out_f}) {
      throw ShapeError(std::string(op) + ": bias of shape " + shape_str(bias.shape()) +
                       ", expected [" + std::to_string(out_f) + "]");
    }
  }
  if (gelu_in.defined()) {
    detail::check_same(x, gelu_in, op);
    if (gelu_in.shape() != x.shape()) {
      throw ShapeError(std::string(op) + ": GELU input of shape " + shape_str(gelu_in.shape()) +
                       " must have the activation's shape " + shape_str(x.shape()));
    }
  }
  const int64_t rows = x.numel() / in_f;
  Tensor x2 = reshape(contiguous(x).detach(), {rows, in_f}).detach();
  Tensor w = contiguous(weight).detach();
  Shape out_shape = x.shape();
  out_shape.back() = out_f;
  Tensor y = empty(out_shape, x.dtype(), x.device());
  Tensor y2 = make_view(y, {rows, out_f}, {out_f, 1}, 0);
  // With GELU after it, the linear part's output is the pre-activation.
  Tensor pre = gelu_out ? empty(out_shape, x.dtype(), x.device()) : y;
  Tensor pre2 = make_view(pre, {rows, out_f}, {out_f, 1}, 0);
  const Tensor b = bias.defined() ? contiguous(bias).detach() : Tensor();
  backend_for(x).linear_forward(x2, w, b, y2, gelu_out ? &pre2 : nullptr);

  const bool has_bias = bias.defined();
  std::function<TensorList(const TensorList&)> input_grad;
  // An input that needs no gradient (the layers before it frozen) costs no
  // input-gradient GEMM; nor does a frozen weight its weight-gradient one.
  const bool need_x = (comm ? comm->source : gelu_in.defined() ? gelu_in : x).requires_grad();
  if (!need_x) {
    input_grad = [](const TensorList&) -> TensorList { return {Tensor(), Tensor(), Tensor()}; };
  } else if (gelu_in.defined()) {
    Tensor gin = reshape(contiguous(gelu_in).detach(), {rows, in_f}).detach();
    input_grad = [w, gin, rows, out_f, in_f, xs = x.shape(),
                  sums](const TensorList& g) -> TensorList {
      Tensor g2 = reshape(contiguous(g[0]), {rows, out_f});
      Tensor dpre = empty({rows, in_f}, g2.dtype(), g2.device());
      if (!sums) {
        backend_for(g2).gelu_linear_input_grad(g2, w, gin, dpre);
        return {reshape(dpre, xs), Tensor(), Tensor()};
      }
      Tensor col = backend_for(g2).gelu_linear_input_grad_with_sums(g2, w, gin, dpre);
      Tensor out = reshape(dpre, xs);
      if (col.defined()) {
        sums->grad = out;
        sums->sums = col;
      }
      return {out, Tensor(), Tensor()};
    };
  } else {
    input_grad = [w, rows, out_f, in_f, xs = x.shape()](const TensorList& g) -> TensorList {
      Tensor g2 = reshape(contiguous(g[0]), {rows, out_f});
      Tensor gx = gemm_new(g2, w, {rows, in_f}, false, false);
      return {reshape(gx, xs), Tensor(), Tensor()};
    };
  }
  // A leaf weight (a parameter) takes its gradient from the GEMM itself,
  // added into its gradient buffer (f32 under bf16/f16 weights); a leaf
  // bias its column sums, the same way.
  const Tensor leaf_weight = weight.requires_grad() && weight.is_leaf() ? weight : Tensor();
  const Tensor leaf_bias = has_bias && bias.requires_grad() && bias.is_leaf() ? bias : Tensor();
  // A bias that takes a gradient: the op consuming the output may leave
  // that gradient's column sums here (Node::output_grad_sums).
  std::shared_ptr<detail::FusedBiasSums> own_sums;
  if (has_bias && bias.requires_grad()) own_sums = std::make_shared<detail::FusedBiasSums>();
  auto weight_grad = [rows, out_f, in_f, leaf_weight, leaf_bias, need_w = weight.requires_grad(),
                      need_b = has_bias && bias.requires_grad(),
                      own_sums](const Tensor& x2, const TensorList& g) -> TensorList {
    Tensor g2 = reshape(contiguous(g[0]), {rows, out_f});
    if (Tensor sums = own_sums ? own_sums->take(g2) : Tensor(); sums.defined()) {
      // The bias gradient already summed: the weight's product alone.
      Tensor gw;
      if (need_w &&
          !autograd::accumulate_into_leaf_grad(leaf_weight, [&](Tensor& acc, double beta) {
            backend_for(g2).gemm(g2, x2, acc, true, false, 1.0, beta);
          })) {
        gw = gemm_new(g2, x2, {out_f, in_f}, true, false);
      }
      // (A one-row column sum: beta * acc + sums, in acc's type; the sums
      // are f32 or g2's type, acc g2's type or f32.)
      Tensor gb;
      if (!autograd::accumulate_into_leaf_grad(leaf_bias, [&](Tensor& acc, double beta) {
            Tensor row = sums;
            if (acc.dtype() != DType::F32 && sums.dtype() != acc.dtype()) {
              row = empty({out_f}, acc.dtype(), acc.device());
              backend_for(acc).copy(sums, row);
            }
            backend_for(acc).sum_rows_into(reshape(row, {1, out_f}), acc, beta);
          })) {
        gb = empty({out_f}, g2.dtype(), g2.device());
        backend_for(g2).copy(sums, gb);
      }
      return {Tensor(), gw, gb};
    }
    // Both leaves' buffers at once where they can take it: one backend call
    // (on CUDA the bias's sums come from the GEMM's epilogue).
    if (need_w && need_b &&
        autograd::accumulate_into_leaf_grads(
            {leaf_weight, leaf_bias}, [&](std::vector<Tensor>& grads, double beta) {
              backend_for(g2).linear_weight_bias_grad(g2, x2, grads[0], grads[1], beta);
            })) {
      return {Tensor(), Tensor(), Tensor()};
    }
    Tensor gw;
    const bool added =
        !need_w || autograd::accumulate_into_leaf_grad(leaf_weight, [&](Tensor& acc, double beta) {
          backend_for(g2).gemm(g2, x2, acc, true, false, 1.0, beta);
        });
    if (!added) gw = gemm_new(g2, x2, {out_f, in_f}, true, false);
    Tensor gb;
    const bool bias_added =
        !need_b || autograd::accumulate_into_leaf_grad(leaf_bias, [&](Tensor& acc, double beta) {
          backend_for(g2).sum_rows_into(g2, acc, beta);
        });
    if (!bias_added) {
      gb = empty({out_f}, g2.dtype(), g2.device());
      backend_for(g2).reduce(ReduceOp::Sum, g2, 1, rows, out_f, gb, nullptr);
    }
    return {Tensor(), gw, gb};
  };
  TensorList inputs{gelu_in.defined() ? gelu_in : x, weight};
  if (has_bias) inputs.push_back(bias);
  std::vector<int> deferrable{1};
  if (has_bias) deferrable.push_back(2);
  auto node =
      detail::record_layer("linear", inputs, {pre}, deferrable, input_grad, weight_grad, x2, comm);
  if (node) node->output_grad_sums = std::move(own_sums);
  if (gelu_out) detail::record_gelu(pre, pre, y, GeluForm::Tanh);
  return {y, gelu_out ? pre : Tensor()};
}

}  // namespace

const InputGradComm* detail::checked_comm(const char* op, const Tensor& x,
                                          const InputGradComm& comm) {
  if (!comm.start) return nullptr;
  detail::check_defined(comm.source, op, "comm.source");
  if (x.requires_grad() && !x.same(comm.source)) {
    throw ValueError(std::string(op) +
                     ": with an input-gradient collective the layer's gradient goes to "
                     "comm.source; x must be that tensor or carry no gradient of its own");
  }
  return &comm;
}

std::shared_ptr<autograd::FunctionNode> detail::record_layer(
    const char* op, const TensorList& inputs, const TensorList& outputs,
    std::vector<int> deferrable, autograd::BackwardFn input_grad, WeightGradFn weight_grad,
    const Tensor& saved, const InputGradComm* comm) {
  if (!autograd::any_requires_grad(inputs) &&
      !(comm && comm->start && autograd::any_requires_grad({comm->source}))) {
    return nullptr;
  }
  // Frozen weights (none of the deferrable inputs needs a gradient): the
  // input half is the whole backward, with no weight half to split off and
  // no input to keep (or gather again) for it.
  bool need_weight = false;
  for (int i : deferrable)
    need_weight = need_weight || inputs[static_cast<size_t>(i)].requires_grad();
  if (!need_weight) {
    if (comm == nullptr || !comm->start) return record(op, inputs, outputs, std::move(input_grad));
    TensorList edges = inputs;
    edges[0] = comm->source;
    auto start = comm->start;
    return record(op, edges, outputs, [input_grad, start](const TensorList& g) -> TensorList {
      TensorList grads = input_grad(g);
      if (grads[0].defined()) grads[0] = start(grads[0])();
      return grads;
    });
  }
  // How the weight half gets the layer's input: kept, or gathered again.
  using Pending = std::function<Tensor()>;
  std::function<Pending()> input_of;
  if (comm && comm->regather) {
    input_of = [regather = comm->regather, shape = saved.shape()]() -> Pending {
      Pending gathered = regather();
      return [gathered, shape]() { return reshape(contiguous(gathered()), shape).detach(); };
    };
  } else {
    input_of = [saved]() -> Pending { return [saved]() { return saved; }; };
  }
  autograd::BackwardFn weight_later = [input_of, weight_grad](const TensorList& g) {
    return weight_grad(input_of()(), g);
  };
  if (comm == nullptr || !comm->start) {
    auto node = record(op, inputs, outputs, nullptr);
    if (node)
      node->set_split(std::move(deferrable), std::move(input_grad), std::move(weight_later));
    return node;
  }
  auto start = comm->start;
  // Split (zero-bubble B): nothing to overlap the collective with.
  autograd::BackwardFn input_now = [input_grad, start](const TensorList& g) -> TensorList {
    TensorList grads = input_grad(g);
    if (grads[0].defined()) grads[0] = start(grads[0])();
    return grads;
  };
  // Unsplit: the input's gather runs during the input-gradient GEMM, the
  // input gradient's collective during the weight half.
  autograd::BackwardFn overlapped = [input_of, input_grad, weight_grad, start,
                                     deferrable](const TensorList& g) -> TensorList {
    Pending input = input_of();
    TensorList grads = input_grad(g);
    const Tensor x = input();
    Pending finish;
    if (grads[0].defined()) finish = start(grads[0]);
    grads[0] = Tensor();  // (start may have taken it over)
    const TensorList weights = weight_grad(x, g);
    for (int i : deferrable) grads[static_cast<size_t>(i)] = weights[static_cast<size_t>(i)];
    if (finish) grads[0] = finish();
    return grads;
  };
  TensorList edges = inputs;
  edges[0] = comm->source;
  auto node = record(op, edges, outputs, std::move(overlapped));
  if (node) node->set_split(std::move(deferrable), std::move(input_now), std::move(weight_later));
  return node;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_core("linear", x, weight, bias, false, Tensor(), nullptr).y;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const InputGradComm& comm) {
  return linear_core("linear", x, weight, bias, false, Tensor(),
                     detail::checked_comm("linear", x, comm))
      .y;
}

Tensor grouped_linear(const Tensor& x, const std::vector<Tensor>& weights,
                      const std::vector<int64_t>& rows) {
  const char* op = "grouped_linear";
  detail::check_floating(x, op, "x");
  if (weights.empty() || weights.size() != rows.size()) {
    throw ShapeError(std::string(op) + ": " + std::to_string(weights.size()) + " weights and " +
                     std::to_string(rows.size()) + " row counts (expected one count per weight)");
  }
  check_grouped_weights(x, weights, op);
  const int64_t out_f = weights[0].size(0), in_f = weights[0].size(1);
  int64_t M = 0;
  for (const int64_t r : rows) {
    if (r < 0) throw ShapeError(std::string(op) + ": a row count of " + std::to_string(r));
    M += r;
  }
  if (x.dim() != 2 || x.size(0) != M || x.size(1) != in_f) {
    throw ShapeError(std::string(op) + ": x " + shape_str(x.shape()) + " for " + std::to_string(M) +
                     " rows of weights " + shape_str(weights[0].shape()) + " (expected (" +
                     std::to_string(M) + ", " + std::to_string(in_f) + "))");
  }
  const Tensor x2 = contiguous(x).detach();
  std::vector<Tensor> w(weights.size());
  for (size_t e = 0; e < w.size(); ++e) w[e] = contiguous(weights[e]).detach();
  Tensor y = empty({M, out_f}, x.dtype(), x.device());
  Backend& be = backend_for(x);
  // Each group's rows: contiguous pieces of the row-major matrices.
  auto piece = [](const Tensor& t, int64_t at, int64_t n) {
    return make_view(t, {n, t.size(1)}, {t.size(1), 1}, t.offset() + at * t.size(1));
  };
  for (size_t e = 0, at = 0; e < w.size(); at += static_cast<size_t>(rows[e]), ++e) {
    if (rows[e] == 0) continue;
    Tensor ye = piece(y, static_cast<int64_t>(at), rows[e]);
    be.linear_forward(piece(x2, static_cast<int64_t>(at), rows[e]), w[e], Tensor(), ye, nullptr);
  }
  std::function<TensorList(const TensorList&)> input_grad;
  const size_t E = w.size();
  if (!x.requires_grad()) {
    input_grad = [E](const TensorList&) -> TensorList { return TensorList(E + 1); };
  } else {
    input_grad = [w, rows, M, in_f, piece, E](const TensorList& g) -> TensorList {
      const Tensor g2 = contiguous(g[0]);
      Tensor dx = empty({M, in_f}, g2.dtype(), g2.device());
      int64_t at = 0;
      for (size_t e = 0; e < E; at += rows[e], ++e) {
        if (rows[e] == 0) continue;
        Tensor dxe = piece(dx, at, rows[e]);
        backend_for(g2).gemm(piece(g2, at, rows[e]), w[e], dxe, false, false, 1.0, 0.0);
      }
      TensorList grads(E + 1);
      grads[0] = dx;
      return grads;
    };
  }
  // Each leaf weight (a parameter) takes its gradient straight into its
  // buffer, as linear's does.
  std::vector<Tensor> leaves(E);
  for (size_t e = 0; e < E; ++e) {
    if (weights[e].requires_grad() && weights[e].is_leaf()) leaves[e] = weights[e];
  }
  auto weight_grad = [rows, out_f, in_f, leaves, piece, E](const Tensor& x2,
                                                           const TensorList& g) -> TensorList {
    const Tensor g2 = contiguous(g[0]);
    TensorList grads(E + 1);
    int64_t at = 0;
    for (size_t e = 0; e < E; at += rows[e], ++e) {
      const int64_t n = rows[e];
      const bool added =
          autograd::accumulate_into_leaf_grad(leaves[e], [&](Tensor& acc, double beta) {
            if (n > 0) {
              backend_for(g2).gemm(piece(g2, at, n), piece(x2, at, n), acc, true, false, 1.0, beta);
            } else if (beta == 0.0) {
              backend_for(acc).fill(acc, 0.0);
            }
          });
      if (added) continue;
      grads[e + 1] = n > 0
                         ? gemm_new(piece(g2, at, n), piece(x2, at, n), {out_f, in_f}, true, false)
                         : zeros({out_f, in_f}, g2.dtype(), g2.device());
    }
    return grads;
  };
  record_grouped(op, x, weights, y, input_grad, weight_grad, x2);
  return y;
}

Tensor grouped_linear(const Tensor& x, const std::vector<Tensor>& weights, const Tensor& offsets) {
  const char* op = "grouped_linear";
  detail::check_floating(x, op, "x");
  if (weights.empty() || offsets.dtype() != DType::I64 || offsets.dim() != 1 ||
      offsets.size(0) != static_cast<int64_t>(weights.size()) + 1 ||
      !(offsets.device() == x.device())) {
    throw ShapeError(std::string(op) + ": " + std::to_string(weights.size()) + " weights and " +
                     dtype_name(offsets.dtype()) + " offsets " + shape_str(offsets.shape()) +
                     " on " + offsets.device().str() + " (expected i64 (" +
                     std::to_string(weights.size() + 1) + ") on " + x.device().str() + ")");
  }
  check_grouped_weights(x, weights, op);
  const int64_t out_f = weights[0].size(0), in_f = weights[0].size(1);
  if (x.dim() != 2 || x.size(1) != in_f) {
    throw ShapeError(std::string(op) + ": x " + shape_str(x.shape()) + " for weights " +
                     shape_str(weights[0].shape()) + " (expected (rows, " + std::to_string(in_f) +
                     "))");
  }
  const int64_t M = x.size(0);
  const size_t E = weights.size();
  const Tensor x2 = contiguous(x).detach();
  const Tensor at = contiguous(offsets).detach();
  std::vector<Tensor> w(E);
  for (size_t e = 0; e < E; ++e) w[e] = contiguous(weights[e]).detach();
  Tensor y = empty({M, out_f}, x.dtype(), x.device());
  backend_for(x).grouped_gemm_rows(x2, w, at, true, y);
  std::function<TensorList(const TensorList&)> input_grad;
  if (!x.requires_grad()) {
    input_grad = [E](const TensorList&) -> TensorList { return TensorList(E + 1); };
  } else {
    input_grad = [w, at, M, in_f, E](const TensorList& g) -> TensorList {
      const Tensor g2 = contiguous(g[0]);
      Tensor dx = empty({M, in_f}, g2.dtype(), g2.device());
      backend_for(g2).grouped_gemm_rows(g2, w, at, false, dx);
      TensorList grads(E + 1);
      grads[0] = dx;
      return grads;
    };
  }
  // The weights' gradients in one call: straight into the leaves' buffers
  // when every weight is a parameter that takes it there (as linear's
  // does), else into fresh ones.
  std::vector<Tensor> leaves(E);
  bool all_leaves = true;
  for (size_t e = 0; e < E; ++e) {
    if (weights[e].requires_grad() && weights[e].is_leaf()) leaves[e] = weights[e];
    all_leaves = all_leaves && leaves[e].defined();
  }
  auto weight_grad = [at, out_f, in_f, leaves, all_leaves, E](const Tensor& x2,
                                                              const TensorList& g) -> TensorList {
    const Tensor g2 = contiguous(g[0]);
    TensorList grads(E + 1);
    if (all_leaves &&
        autograd::accumulate_into_leaf_grads(leaves, [&](std::vector<Tensor>& acc, double beta) {
          backend_for(g2).grouped_gemm_sums(g2, x2, at, acc, beta);
        })) {
      return grads;
    }
    std::vector<Tensor> fresh(E);
    for (Tensor& t : fresh) t = empty({out_f, in_f}, g2.dtype(), g2.device());
    backend_for(g2).grouped_gemm_sums(g2, x2, at, fresh, 0.0);
    for (size_t e = 0; e < E; ++e) grads[e + 1] = fresh[e];
    return grads;
  };
  record_grouped(op, x, weights, y, input_grad, weight_grad, x2);
  return y;
}

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_core("linear_gelu", x, weight, bias, true, Tensor(), nullptr).y;
}

LinearGelu linear_gelu_parts(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  LinearResult r = linear_core("linear_gelu", x, weight, bias, true, Tensor(), nullptr);
  return {r.pre, r.y};
}

LinearGelu linear_gelu_parts(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const InputGradComm& comm) {
  LinearResult r = linear_core("linear_gelu", x, weight, bias, true, Tensor(),
                               detail::checked_comm("linear_gelu", x, comm));
  return {r.pre, r.y};
}

Tensor linear_after_gelu(const LinearGelu& in, const Tensor& weight, const Tensor& bias) {
  detail::check_defined(in.pre, "linear_after_gelu", "pre");
  return linear_core("linear_after_gelu", in.act, weight, bias, false, in.pre, nullptr,
                     detail::output_grad_sums_of(in.pre))
      .y;
}

}  // namespace triad
