#include "triad/ops/reduce.h"

#include "op_checks.h"
#include "triad/autograd/node.h"
#include "triad/backend/backend.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/shape_ops.h"

namespace triad {

using autograd::record;
using autograd::TensorList;

namespace {

struct Reduction {
  Tensor out;
  Tensor indices;
  Shape keep_shape;  // reduced dim kept as 1
};

Reduction reduce_raw(ReduceOp op, const Tensor& x, int64_t dim, const char* name) {
  detail::check_floating(x, name, "x");
  const int64_t d = wrap_dim(dim, x.dim(), name);
  if (op == ReduceOp::Max && x.shape()[d] == 0) {
    throw ShapeError(std::string(name) + ": cannot take the max over an empty dim " +
                     std::to_string(d));
  }
  Tensor xc = contiguous(x);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= x.shape()[i];
  for (int64_t i = d + 1; i < x.dim(); ++i) inner *= x.shape()[i];
  Reduction r;
  r.keep_shape = x.shape();
  r.keep_shape[d] = 1;
  r.out = empty(r.keep_shape, x.dtype(), x.device());
  if (op == ReduceOp::Max) r.indices = empty(r.keep_shape, DType::I64, x.device());
  backend_for(xc).reduce(op, xc, outer, x.shape()[d], inner, r.out,
                         op == ReduceOp::Max ? &r.indices : nullptr);
  return r;
}

Tensor finish(const Tensor& out, const Shape& keep_shape, int64_t d, bool keepdim) {
  if (keepdim) return out;
  Shape s = keep_shape;
  s.erase(s.begin() + d);
  return make_view(out, s, contiguous_strides(s), out.offset());
}

}  // namespace

Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  Reduction r = reduce_raw(ReduceOp::Sum, x, dim, "sum");
  const int64_t d = wrap_dim(dim, x.dim(), "sum");
  Tensor y = finish(r.out, r.keep_shape, d, keepdim);
  const Shape in_shape = x.shape(), keep = r.keep_shape;
  record("sum", {x}, {y}, [in_shape, keep](const TensorList& g) -> TensorList {
    return {contiguous(expand(reshape(g[0], keep), in_shape))};
  });
  return y;
}

Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  const int64_t d = wrap_dim(dim, x.dim(), "mean");
  return scale(sum(x, d, keepdim), 1.0 / static_cast<double>(x.shape()[d]));
}

Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  Reduction r = reduce_raw(ReduceOp::Max, x, dim, "max");
  const int64_t d = wrap_dim(dim, x.dim(), "max");
  Tensor y = finish(r.out, r.keep_shape, d, keepdim);
  Tensor xd = x.detach(), vd = r.out.detach();
  const Shape keep = r.keep_shape;
  record("max", {x}, {y}, [xd, vd, keep, d](const TensorList& g) -> TensorList {
    Tensor vals = contiguous(expand(vd, xd.shape()));
    Tensor mask = empty(xd.shape(), xd.dtype(), xd.device());
    backend_for(xd).binary(BinaryOp::Eq, xd, vals, mask);
    Tensor count = sum(mask, d, true);
    Tensor share = div(reshape(g[0], keep), count);
    return {mul(mask, share)};
  });
  return y;
}

Tensor sum(const Tensor& x) {
  return sum(reshape(x, {x.numel()}), 0, false);
}

Tensor mean(const Tensor& x) {
  if (x.numel() == 0) throw ShapeError("mean: tensor has no elements");
  return scale(sum(x), 1.0 / static_cast<double>(x.numel()));
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  if (shape.size() > x.shape().size()) {
    throw ShapeError("sum_to: cannot reduce " + shape_str(x.shape()) + " to " + shape_str(shape));
  }
  Tensor t = x;
  const size_t lead = x.shape().size() - shape.size();
  for (size_t i = 0; i < lead; ++i) t = sum(t, 0, false);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1 && t.shape()[i] != 1) {
      t = sum(t, static_cast<int64_t>(i), true);
    } else if (shape[i] != t.shape()[i]) {
      throw ShapeError("sum_to: cannot reduce " + shape_str(x.shape()) + " to " + shape_str(shape));
    }
  }
  return t;
}

}  // namespace triad
