#include "triad/ops/nn_functional.h"

#include "op_checks.h"
#include "triad/autograd/node.h"
#include "triad/backend/backend.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/shape_ops.h"

namespace triad {

using autograd::record;
using autograd::TensorList;

namespace {
// The checks layer_norm and add_layer_norm share; returns C.
int64_t check_layer_norm_args(const char* op, const Tensor& x, const Tensor& weight,
                              const Tensor& bias, double eps) {
  detail::check_floating(x, op, "x");
  detail::check_same(x, weight, op);
  detail::check_same(x, bias, op);
  const int64_t C = x.dim() ? x.size(-1) : 0;
  if (x.dim() == 0 || weight.shape() != Shape{C} || bias.shape() != Shape{C}) {
    throw ShapeError(std::string(op) + ": x " + shape_str(x.shape()) + ", weight " +
                     shape_str(weight.shape()) + ", bias " + shape_str(bias.shape()) +
                     " (weight and bias must be [C] with C the last dim of x)");
  }
  if (!(eps > 0))
    throw ValueError(std::string(op) + ": eps " + std::to_string(eps) + " must be > 0");
  return C;
}

// A LayerNorm's weight and bias when both are leaves that require grad
// (parameters): their gradients then go straight into .grad.
std::vector<Tensor> param_leaves(const Tensor& weight, const Tensor& bias) {
  const auto leaf = [](const Tensor& t) { return t.requires_grad() && t.is_leaf(); };
  if (!leaf(weight) || !leaf(bias)) return {Tensor()};
  return {weight, bias};
}
}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t C = check_layer_norm_args("layer_norm", x, weight, bias, eps);
  Tensor xc = contiguous(x).detach();
  Tensor wc = contiguous(weight).detach(), bc = contiguous(bias).detach();
  const int64_t rows = C ? x.numel() / C : 0;
  Tensor y = empty_like(xc);
  Tensor mu = empty({rows}, stat_dtype(x.dtype()), x.device());
  Tensor rs = empty({rows}, stat_dtype(x.dtype()), x.device());
  backend_for(x).layer_norm_forward(xc, wc, bc, eps, y, mu, rs);
  const std::vector<Tensor> leaves = param_leaves(weight, bias);
  record("layer_norm", {x, weight, bias}, {y},
         [xc, wc, mu, rs, leaves](const TensorList& g) -> TensorList {
           Tensor dy = contiguous(g[0]);
           Tensor dx = empty_like(xc);
           // Leaf parameters take their gradients straight from the kernel.
           if (autograd::accumulate_into_leaf_grads(
                   leaves, [&](std::vector<Tensor>& acc, double beta) {
                     backend_for(xc).layer_norm_backward_into(dy, nullptr, xc, wc, mu, rs, dx,
                                                              acc[0], acc[1], beta);
                   })) {
             return {dx, Tensor(), Tensor()};
           }
           Tensor dw = empty_like(wc), db = empty_like(wc);
           backend_for(xc).layer_norm_backward(dy, xc, wc, mu, rs, dx, dw, db);
           return {dx, dw, db};
         });
  return y;
}

AddLayerNorm add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                            const Tensor& bias, double eps) {
  const int64_t C = check_layer_norm_args("add_layer_norm", x, weight, bias, eps);
  detail::check_same(x, residual, "add_layer_norm");
  if (residual.shape() != x.shape()) {
    throw ShapeError("add_layer_norm: residual " + shape_str(residual.shape()) +
                     " must have x's shape " + shape_str(x.shape()));
  }
  Tensor xc = contiguous(x).detach(), rc = contiguous(residual).detach();
  Tensor wc = contiguous(weight).detach(), bc = contiguous(bias).detach();
  const int64_t rows = C ? x.numel() / C : 0;
  Tensor h = empty_like(xc), y = empty_like(xc);
  Tensor mu = empty({rows}, stat_dtype(x.dtype()), x.device());
  Tensor rs = empty({rows}, stat_dtype(x.dtype()), x.device());
  backend_for(x).add_layer_norm_forward(xc, rc, wc, bc, eps, h, y, mu, rs);
  Tensor hd = h.detach();
  const std::vector<Tensor> leaves = param_leaves(weight, bias);
  record("add_layer_norm", {x, residual, weight, bias}, {h, y},
         [hd, wc, mu, rs, leaves](const TensorList& g) -> TensorList {
           Tensor dh = contiguous(g[0]), dy = contiguous(g[1]);
           Tensor dx = empty_like(hd);
           if (autograd::accumulate_into_leaf_grads(
                   leaves, [&](std::vector<Tensor>& acc, double beta) {
                     backend_for(hd).layer_norm_backward_into(dy, &dh, hd, wc, mu, rs, dx, acc[0],
                                                              acc[1], beta);
                   })) {
             return {dx, dx, Tensor(), Tensor()};
           }
           Tensor dw = empty_like(wc), db = empty_like(wc);
           backend_for(hd).add_layer_norm_backward(dy, dh, hd, wc, mu, rs, dx, dw, db);
           return {dx, dx, dw, db};
         });
  return {h, y};
}

Tensor softmax(const Tensor& x) {
  detail::check_floating(x, "softmax", "x");
  if (x.dim() == 0) throw ShapeError("softmax: needs at least one dimension");
  Tensor xc = contiguous(x);
  Tensor y = empty_like(xc);
  backend_for(x).softmax_forward(xc, y);
  Tensor yd = y.detach();
  record("softmax", {x}, {y}, [yd](const TensorList& g) -> TensorList {
    Tensor dy = contiguous(g[0]);
    Tensor dx = empty_like(yd);
    backend_for(yd).softmax_backward(yd, dy, dx);
    return {dx};
  });
  return y;
}

Tensor causal_attention(const Tensor& qkv, int64_t n_head) {
  detail::check_floating(qkv, "causal_attention", "qkv");
  detail::check_dim(qkv, 3, "causal_attention", "qkv");
  const int64_t B = qkv.size(0), T = qkv.size(1), C3 = qkv.size(2);
  if (C3 % 3 != 0) {
    throw ShapeError("causal_attention: last dim of qkv (" + std::to_string(C3) + ") must be 3*C");
  }
  const int64_t C = C3 / 3;
  if (n_head <= 0 || C % n_head != 0) {
    throw ShapeError("causal_attention: C (" + std::to_string(C) +
                     ") must be divisible by n_head (" + std::to_string(n_head) + ")");
  }
  Tensor qc = contiguous(qkv).detach();
  Tensor out = empty({B, T, C}, qkv.dtype(), qkv.device());
  Tensor lse = empty({B, n_head, T}, stat_dtype(qkv.dtype()), qkv.device());
  backend_for(qkv).attention_forward(qc, n_head, out, lse);
  Tensor od = out.detach();
  record("causal_attention", {qkv}, {out},
         [qc, od, lse, n_head](const TensorList& g) -> TensorList {
           Tensor dout = contiguous(g[0]);
           Tensor dqkv = empty_like(qc);
           backend_for(qc).attention_backward(qc, od, lse, dout, n_head, dqkv);
           return {dqkv};
         });
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  detail::check_floating(weight, "embedding", "weight");
  detail::check_index(ids, "embedding", "ids");
  detail::check_dim(weight, 2, "embedding", "weight");
  // Ids may also stay on the host with the weight on a GPU: the backend then
  // checks them (and, in backward, groups them) without a copy back from the
  // device, which would make the host wait for all the queued work.
  if (!(ids.device() == weight.device()) && !ids.device().is_cpu()) {
    throw ValueError("embedding: ids on " + ids.device().str() + ", weight on " +
                     weight.device().str() + " (ids go on the weight's device or the host)");
  }
  const int64_t C = weight.size(1);
  Tensor ic = contiguous(ids).detach();
  Tensor wc = contiguous(weight);
  Shape out_shape = ids.shape();
  out_shape.push_back(C);
  Tensor out = empty(out_shape, weight.dtype(), weight.device());
  backend_for(weight).embedding_forward(wc, ic, out);
  const Shape ws = weight.shape();
  const DType dt = weight.dtype();
  const Device dev = weight.device();
  const Tensor leaf = weight.requires_grad() && weight.is_leaf() ? weight : Tensor();
  record("embedding", {weight}, {out},
         [ic, ws, dt, dev, C, leaf](const TensorList& g) -> TensorList {
           Tensor dout = contiguous(g[0]);
           const Tensor rows = make_view(dout, {ic.numel(), C}, {C, 1}, dout.offset());
           // A leaf weight's gradient takes the rows the ids touch, added in place
           // (no dense gradient of the whole table, no add after).
           if (autograd::accumulate_into_leaf_grad(leaf, [&](Tensor& acc, double beta) {
                 backend_for(acc).embedding_backward_into(ic, rows, acc, beta);
               })) {
             return {Tensor()};
           }
           Tensor dw = empty(ws, dt, dev);
           backend_for(dw).embedding_backward(ic, rows, dw);
           return {dw};
         });
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  detail::check_floating(logits, "cross_entropy", "logits");
  detail::check_index(targets, "cross_entropy", "targets");
  if (logits.dim() < 1) throw ShapeError("cross_entropy: logits must have a vocab dimension");
  Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  if (targets.shape() != lead) {
    throw ShapeError("cross_entropy: targets of shape " + shape_str(targets.shape()) +
                     " do not match logits " + shape_str(logits.shape()) + " (expected " +
                     shape_str(lead) + ")");
  }
  // Targets may also stay on the host with the logits on a GPU (their check
  // below then needs no copy back from the device).
  if (!(targets.device() == logits.device()) && !targets.device().is_cpu()) {
    throw ValueError("cross_entropy: targets on " + targets.device().str() + ", logits on " +
                     logits.device().str() + " (targets go on the logits' device or the host)");
  }
  const int64_t V = logits.size(-1), N = numel(lead);
  Tensor lc = reshape(contiguous(logits).detach(), {N, V}).detach();
  Tensor tc = reshape(contiguous(targets).detach(), {N}).detach();
  const DType sd = stat_dtype(logits.dtype());
  Tensor losses = empty({N}, sd, logits.device());
  Tensor lse = empty({N}, sd, logits.device());
  // One host pass over the targets (they are small): every backend gets
  // them checked, and the non-ignored rows counted.
  int64_t count = 0;
  {
    Tensor th = cast(to_device(tc, Device::cpu()), DType::I64);
    const int64_t* p = th.data<int64_t>();
    for (int64_t i = 0; i < N; ++i) {
      if (p[i] == ignore_index) continue;
      if (p[i] < 0 || p[i] >= V) {
        throw ValueError("cross_entropy: target " + std::to_string(p[i]) + " at row " +
                         std::to_string(i) + " is outside [0, " + std::to_string(V) + ")");
      }
      ++count;
    }
  }
  if (!(tc.device() == lc.device())) tc = to_device(tc, lc.device()).detach();
  Backend& be = backend_for(logits);
  be.cross_entropy_forward(lc, tc, ignore_index, losses, lse);
  Tensor total = empty({}, sd, logits.device());
  be.reduce(ReduceOp::Sum, losses, 1, N, 1, total, nullptr);
  Tensor loss = cast(scale(total, count ? 1.0 / static_cast<double>(count) : 0.0), sd)
                    .detach();  // f32 for half logits
  const Shape ls = logits.shape();
  record("cross_entropy", {logits}, {loss},
         [lc, tc, lse, count, ignore_index, ls, sd, N](const TensorList& g) -> TensorList {
           Tensor gl = cast(g[0], sd);
           Tensor dl = empty({N}, sd, lc.device());
           backend_for(lc).copy(make_view(gl, {N}, {0}, gl.offset()), dl);
           if (count) backend_for(dl).affine(dl, 1.0 / static_cast<double>(count), 0.0, dl);
           Tensor dlogits = empty_like(lc);
           backend_for(lc).cross_entropy_backward(lc, tc, lse, dl, ignore_index, dlogits);
           return {reshape(dlogits, ls)};
         });
  return loss;
}

}  // namespace triad
