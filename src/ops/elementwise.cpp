#include "triad/ops/elementwise.h"

#include "op_checks.h"
#include "op_nodes.h"
#include "triad/autograd/node.h"
#include "triad/backend/backend.h"
#include "triad/ops/creation.h"
#include "triad/ops/reduce.h"
#include "triad/ops/shape_ops.h"

namespace triad {

using autograd::record;
using autograd::TensorList;

namespace {

// A stride-0 view of x broadcast to shape, outside autograd.
Tensor broadcast_view(const Tensor& x, const Shape& shape) {
  const size_t lead = shape.size() - x.shape().size();
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < x.shape().size(); ++i) {
    if (x.shape()[i] == shape[lead + i]) strides[lead + i] = x.strides()[i];
  }
  return make_view(x, shape, strides, x.offset());
}

Tensor binary_raw(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  detail::check_defined(a, name, "a");
  detail::check_defined(b, name, "b");
  detail::check_same(a, b, name);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty(shape, a.dtype(), a.device());
  backend_for(out).binary(op, broadcast_view(a, shape), broadcast_view(b, shape), out);
  return out;
}

// A leaf (a parameter) that add() broadcasts as a bias over the rows of an
// (..., C) result, or undefined.
Tensor bias_leaf(const Tensor& b, const Shape& out) {
  const bool bias =
      b.dim() == 1 && out.size() >= 2 && b.size(0) == out.back() && numel(out) > b.numel();
  return bias && b.requires_grad() && b.is_leaf() ? b : Tensor();
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = binary_raw(BinaryOp::Add, a, b, "add");
  const Shape sa = a.shape(), sb = b.shape();
  // A broadcast bias parameter takes its column sums straight into its
  // gradient buffer (f32 under bf16/f16), as a linear layer's bias does.
  const Tensor bias = bias_leaf(b, y.shape());
  record("add", {a, b}, {y}, [sa, sb, bias](const TensorList& g) -> TensorList {
    const Tensor g2 =
        bias.defined() ? reshape(contiguous(g[0]), {g[0].numel() / sb[0], sb[0]}) : Tensor();
    const bool added = autograd::accumulate_into_leaf_grad(
        bias, [&](Tensor& acc, double beta) { backend_for(g2).sum_rows_into(g2, acc, beta); });
    return {sum_to(g[0], sa), added ? Tensor() : sum_to(g[0], sb)};
  });
  return y;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor y = binary_raw(BinaryOp::Sub, a, b, "sub");
  const Shape sa = a.shape(), sb = b.shape();
  record("sub", {a, b}, {y}, [sa, sb](const TensorList& g) -> TensorList {
    return {sum_to(g[0], sa), sum_to(scale(g[0], -1.0), sb)};
  });
  return y;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor y = binary_raw(BinaryOp::Mul, a, b, "mul");
  Tensor ad = a.detach(), bd = b.detach();
  record("mul", {a, b}, {y}, [ad, bd](const TensorList& g) -> TensorList {
    return {sum_to(mul(g[0], bd), ad.shape()), sum_to(mul(g[0], ad), bd.shape())};
  });
  return y;
}

Tensor div(const Tensor& a, const Tensor& b) {
  // (Integer division would trap on a zero divisor on the CPU and give an
  // unspecified value on a GPU: floating types only.)
  detail::check_floating(a, "div", "a");
  detail::check_floating(b, "div", "b");
  Tensor y = binary_raw(BinaryOp::Div, a, b, "div");
  Tensor ad = a.detach(), bd = b.detach();
  record("div", {a, b}, {y}, [ad, bd](const TensorList& g) -> TensorList {
    Tensor ga = div(g[0], bd);
    Tensor gb = scale(div(mul(ga, ad), bd), -1.0);
    return {sum_to(ga, ad.shape()), sum_to(gb, bd.shape())};
  });
  return y;
}

Tensor affine(const Tensor& x, double alpha, double beta) {
  detail::check_floating(x, "affine", "x");
  Tensor xc = contiguous(x);
  Tensor y = empty_like(xc);
  backend_for(xc).affine(xc, alpha, beta, y);
  record("affine", {x}, {y},
         [alpha](const TensorList& g) -> TensorList { return {scale(g[0], alpha)}; });
  return y;
}

void detail::record_gelu(const Tensor& x, const Tensor& saved_input, const Tensor& y,
                         GeluForm form) {
  Tensor saved = saved_input.detach();
  record(form == GeluForm::Erf ? "gelu_erf" : "gelu", {x}, {y},
         [saved, form](const TensorList& g) -> TensorList {
           Tensor dy = contiguous(g[0]);
           Tensor dx = empty_like(saved);
           backend_for(saved).gelu_backward(saved, dy, dx, form);
           return {dx};
         });
}

namespace {

Tensor gelu_of(const Tensor& x, GeluForm form, const char* name) {
  detail::check_floating(x, name, "x");
  Tensor xc = contiguous(x);
  Tensor y = empty_like(xc);
  backend_for(xc).gelu_forward(xc, y, form);
  detail::record_gelu(x, xc, y, form);
  return y;
}

}  // namespace

Tensor gelu(const Tensor& x) {
  return gelu_of(x, GeluForm::Tanh, "gelu");
}

Tensor gelu_erf(const Tensor& x) {
  return gelu_of(x, GeluForm::Erf, "gelu_erf");
}

namespace {

Tensor glu(const Tensor& x, GluGate gate, const char* name) {
  detail::check_floating(x, name, "x");
  if (x.dim() == 0 || x.size(-1) % 2 != 0) {
    throw ShapeError(std::string(name) + ": the last dimension of x " + shape_str(x.shape()) +
                     " must hold two halves [a | b] (an even size)");
  }
  Tensor xc = contiguous(x).detach();
  Shape out_shape = x.shape();
  out_shape.back() /= 2;
  Tensor y = empty(out_shape, x.dtype(), x.device());
  backend_for(xc).glu_forward(xc, y, gate);
  record(name, {x}, {y}, [xc, gate](const TensorList& g) -> TensorList {
    Tensor dy = contiguous(g[0]);
    Tensor dx = empty_like(xc);
    backend_for(xc).glu_backward(xc, dy, dx, gate);
    return {dx};
  });
  return y;
}

}  // namespace

Tensor swiglu(const Tensor& x) {
  return glu(x, GluGate::Silu, "swiglu");
}

Tensor geglu(const Tensor& x) {
  return glu(x, GluGate::GeluTanh, "geglu");
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, uint64_t offset) {
  return dropout(x, p, seed, stream, philox::Counters{offset, 0, 0});
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream,
               const philox::Counters& at) {
  return dropout(x, p, seed, stream, at, Tensor{});
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream,
               const philox::Counters& at, const Tensor& keys) {
  return dropout(x, p, seed, stream, at, keys, Tensor{});
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream,
               const philox::Counters& at, const Tensor& keys, const Tensor& calls) {
  detail::check_floating(x, "dropout", "x");
  if (!(p >= 0.0 && p < 1.0)) {
    throw ValueError("dropout: probability " + std::to_string(p) + " must be in [0, 1)");
  }
  const uint64_t n = static_cast<uint64_t>(x.numel());
  if (at.row_length > 0 && n % at.row_length != 0) {
    throw ShapeError("dropout: rows of " + std::to_string(at.row_length) +
                     " draws do not divide the " + std::to_string(n) + " elements of " +
                     shape_str(x.shape()));
  }
  if (keys.defined()) {
    // Rows in any order, each drawing its keyed row of a larger tensor's
    // masks: distinct keys must not share draws.
    if (at.row_length == 0 || at.row_stride < at.row_length) {
      throw ValueError("dropout: keyed rows need a row length, and rows " +
                       std::to_string(at.row_stride) + " draws apart (got rows of " +
                       std::to_string(at.row_length) + ")");
    }
    if (keys.dtype() != DType::I64 || keys.dim() != 1 ||
        static_cast<uint64_t>(keys.numel()) != n / at.row_length) {
      throw ShapeError("dropout: keys " + shape_str(keys.shape()) + " " + dtype_name(keys.dtype()) +
                       " for " + shape_str(x.shape()) + " (expected i64 (" +
                       std::to_string(n / at.row_length) + "), one per row of " +
                       std::to_string(at.row_length) + ")");
    }
    if (keys.device() != x.device()) {
      throw ValueError("dropout: keys on " + keys.device().str() + " for x on " + x.device().str());
    }
  } else if (at.row_length > 0 && n > at.row_length && at.row_stride < at.row_length) {
    throw ValueError("dropout: rows of " + std::to_string(at.row_length) + " draws " +
                     std::to_string(at.row_stride) + " apart overlap (elements would share draws)");
  }
  if (calls.defined()) {
    if (calls.dtype() != DType::I64 || calls.numel() != 1) {
      throw ShapeError("dropout: calls " + shape_str(calls.shape()) + " " +
                       dtype_name(calls.dtype()) + " (expected one i64)");
    }
    if (calls.device() != x.device()) {
      throw ValueError("dropout: calls on " + calls.device().str() + " for x on " +
                       x.device().str());
    }
  }
  if (p == 0.0) return x;
  if (!calls.defined() && !keys.defined() && backend_for(x).capturing(x.device())) {
    // The seed and offsets are the kernel's arguments: without a call count
    // read from memory a graph would draw the same mask at every replay.
    // (Keyed rows read their keys from memory, which hold their call: a
    // capture's are formed on the device, each replay's own.)
    throw NotSupportedError(
        "dropout (p " + std::to_string(p) +
        ") inside a CUDA graph's capture without a call count in device memory: its draws would "
        "be the same at every replay (nn::ForwardContext::calls; train.cuda_graph sets it)");
  }
  const Tensor cc = calls.defined() ? contiguous(calls) : calls;
  const Tensor kc = keys.defined() ? contiguous(keys) : keys;
  if (kc.defined() && kc.device().is_cpu()) {
    const int64_t* k = kc.data<int64_t>();
    for (int64_t r = 0; r < kc.numel(); ++r) {
      if (k[r] < 0)
        throw ValueError("dropout: key " + std::to_string(k[r]) + " of row " + std::to_string(r) +
                         " is negative");
    }
  }
  Tensor xc = contiguous(x);
  Tensor y = empty_like(xc);
  backend_for(xc).dropout(xc, p, seed, stream, at, kc, cc, y);
  record("dropout", {x}, {y}, [=](const TensorList& g) -> TensorList {
    // (The backward reads the count when it runs: in a graph, the replay's.)
    Tensor dy = contiguous(g[0]);
    Tensor dx = empty_like(dy);
    backend_for(dy).dropout(dy, p, seed, stream, at, kc, cc, dx);
    return {dx};
  });
  return y;
}

Tensor cast(const Tensor& x, DType dtype) {
  detail::check_defined(x, "cast", "x");
  if (x.dtype() == dtype) return x;
  Tensor y = empty(x.shape(), dtype, x.device());
  backend_for(x).copy(x, y);
  if (is_floating(dtype) && is_floating(x.dtype())) {
    const DType from = x.dtype();
    record("cast", {x}, {y},
           [from](const TensorList& g) -> TensorList { return {cast(g[0], from)}; });
  }
  return y;
}

Tensor contiguous(const Tensor& x) {
  detail::check_defined(x, "contiguous", "x");
  if (x.is_contiguous()) return x;
  return clone(x);
}

Tensor clone(const Tensor& x) {
  detail::check_defined(x, "clone", "x");
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  backend_for(x).copy(x, y);
  record("clone", {x}, {y}, [](const TensorList& g) -> TensorList { return {g[0]}; });
  return y;
}

Tensor to_device(const Tensor& x, Device device) {
  detail::check_defined(x, "to_device", "x");
  if (x.device() == device) return x;
  Tensor y = empty(x.shape(), x.dtype(), device);
  // The accelerator side's backend moves data across the host boundary.
  Backend& b = backend_for(device.is_cpu() ? x.device().type : device.type);
  b.copy(x, y);
  const Device from = x.device();
  record("to_device", {x}, {y},
         [from](const TensorList& g) -> TensorList { return {to_device(g[0], from)}; });
  return y;
}

void copy_(Tensor& dst, const Tensor& src) {
  if (src.shape() != dst.shape()) {
    throw ShapeError("copy_: source shape " + shape_str(src.shape()) + " != destination shape " +
                     shape_str(dst.shape()));
  }
  Backend& b = backend_for(dst.device().is_cpu() ? src.device().type : dst.device().type);
  b.copy(src, dst);
}

void fill_(Tensor& dst, double value) {
  if (dst.is_contiguous()) {
    backend_for(dst).fill(dst, value);
    return;
  }
  Tensor tmp = full(dst.shape(), value, dst.dtype(), dst.device());
  copy_(dst, tmp);
}

void add_(Tensor& dst, const Tensor& src) {
  detail::check_same(dst, src, "add_");
  if (!dst.is_contiguous()) throw ShapeError("add_: destination must be contiguous");
  backend_for(dst).binary(BinaryOp::Add, dst, broadcast_view(src, dst.shape()), dst);
}

void scale_(Tensor& dst, double alpha) {
  if (!dst.is_contiguous()) throw ShapeError("scale_: destination must be contiguous");
  backend_for(dst).affine(dst, alpha, 0.0, dst);
}

}  // namespace triad
