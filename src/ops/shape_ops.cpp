#include "triad/ops/shape_ops.h"

#include <algorithm>
#include <numeric>

#include "op_checks.h"
#include "triad/autograd/node.h"
#include "triad/backend/backend.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/reduce.h"

namespace triad {

using autograd::record;
using autograd::TensorList;

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw ShapeError(std::string(op) + ": shapes " + shape_str(a) + " and " + shape_str(b) +
                       " cannot be broadcast together");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

Shape resolve_shape(Shape shape, int64_t n, const Shape& from) {
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw ShapeError("reshape: more than one -1 in " + shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else if (shape[i] < 0) {
      throw ShapeError("reshape: invalid size in " + shape_str(shape));
    } else if (__builtin_mul_overflow(known, shape[i], &known)) {
      throw ShapeError("reshape: " + shape_str(shape) +
                       " holds more elements than an int64 counts");
    }
  }
  if (infer >= 0) {
    if (known == 0 || n % known != 0) {
      throw ShapeError("reshape: cannot reshape " + shape_str(from) + " into " + shape_str(shape));
    }
    shape[infer] = n / known;
  }
  if (numel(shape) != n) {
    throw ShapeError("reshape: cannot reshape " + shape_str(from) + " (" + std::to_string(n) +
                     " elements) into " + shape_str(shape));
  }
  return shape;
}

}  // namespace

Tensor reshape(const Tensor& x, Shape shape) {
  detail::check_defined(x, "reshape", "x");
  shape = resolve_shape(std::move(shape), x.numel(), x.shape());
  Tensor src = contiguous(x);
  Tensor y = make_view(src, shape, contiguous_strides(shape), src.offset());
  const Shape in_shape = src.shape();
  record("reshape", {src}, {y},
         [in_shape](const TensorList& g) -> TensorList { return {reshape(g[0], in_shape)}; });
  return y;
}

Tensor flatten(const Tensor& x) {
  return reshape(x, {x.numel()});
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  detail::check_defined(x, "permute", "x");
  const int64_t nd = x.dim();
  if (static_cast<int64_t>(dims.size()) != nd) {
    throw ShapeError("permute: " + std::to_string(dims.size()) + " dims given for a " +
                     std::to_string(nd) + "-d tensor");
  }
  Shape shape(nd), strides(nd);
  std::vector<int64_t> inverse(nd, -1);
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t d = wrap_dim(dims[i], nd, "permute");
    if (inverse[d] != -1) throw ShapeError("permute: dim " + std::to_string(d) + " repeated");
    inverse[d] = i;
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
  }
  Tensor y = make_view(x, shape, strides, x.offset());
  record("permute", {x}, {y},
         [inverse](const TensorList& g) -> TensorList { return {permute(g[0], inverse)}; });
  return y;
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  detail::check_defined(x, "transpose", "x");
  std::vector<int64_t> dims(x.dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[wrap_dim(dim0, x.dim(), "transpose")], dims[wrap_dim(dim1, x.dim(), "transpose")]);
  return permute(x, dims);
}

namespace {
// Elements [start, start + length) of dim d as a view, unrecorded.
Tensor narrow_view(const Tensor& x, int64_t d, int64_t start, int64_t length) {
  Shape shape = x.shape();
  shape[d] = length;
  return make_view(x, shape, x.strides(), x.offset() + start * x.strides()[d]);
}
}  // namespace

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  detail::check_defined(x, "narrow", "x");
  const int64_t d = wrap_dim(dim, x.dim(), "narrow");
  if (start < 0 || length < 0 || start + length > x.shape()[d]) {
    throw ShapeError("narrow: range [" + std::to_string(start) + ", " +
                     std::to_string(start + length) + ") is outside dim " + std::to_string(d) +
                     " of size " + std::to_string(x.shape()[d]));
  }
  Tensor y = narrow_view(x, d, start, length);
  const Shape in_shape = x.shape();
  const DType dt = x.dtype();
  const Device dev = x.device();
  record("narrow", {x}, {y}, [=](const TensorList& g) -> TensorList {
    Tensor gx = zeros(in_shape, dt, dev);
    Tensor window = narrow(gx, d, start, length);
    copy_(window, g[0]);
    return {gx};
  });
  return y;
}

// unsqueeze and squeeze are views of any layout (a size-1 dimension takes
// any stride), never copies.
Tensor unsqueeze(const Tensor& x, int64_t dim) {
  detail::check_defined(x, "unsqueeze", "x");
  const int64_t d = wrap_dim(dim, x.dim() + 1, "unsqueeze");
  Shape shape = x.shape(), strides = x.strides();
  const int64_t stride = d < x.dim() ? x.strides()[d] * x.shape()[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  Tensor y = make_view(x, shape, strides, x.offset());
  record("unsqueeze", {x}, {y},
         [d](const TensorList& g) -> TensorList { return {squeeze(g[0], d)}; });
  return y;
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  detail::check_defined(x, "squeeze", "x");
  const int64_t d = wrap_dim(dim, x.dim(), "squeeze");
  if (x.shape()[d] != 1) {
    throw ShapeError("squeeze: dim " + std::to_string(d) + " has size " +
                     std::to_string(x.shape()[d]) + ", expected 1");
  }
  Shape shape = x.shape(), strides = x.strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  Tensor y = make_view(x, shape, strides, x.offset());
  record("squeeze", {x}, {y},
         [d](const TensorList& g) -> TensorList { return {unsqueeze(g[0], d)}; });
  return y;
}

Tensor expand(const Tensor& x, const Shape& shape) {
  detail::check_defined(x, "expand", "x");
  if (shape.size() < x.shape().size()) {
    throw ShapeError("expand: cannot expand " + shape_str(x.shape()) + " to " + shape_str(shape));
  }
  const size_t lead = shape.size() - x.shape().size();
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < x.shape().size(); ++i) {
    const int64_t have = x.shape()[i], want = shape[lead + i];
    if (have == want) {
      strides[lead + i] = x.strides()[i];
    } else if (have != 1) {
      throw ShapeError("expand: cannot expand " + shape_str(x.shape()) + " to " + shape_str(shape));
    }
  }
  Tensor y = make_view(x, shape, strides, x.offset());
  const Shape in_shape = x.shape();
  record("expand", {x}, {y},
         [in_shape](const TensorList& g) -> TensorList { return {sum_to(g[0], in_shape)}; });
  return y;
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  if (xs.empty()) throw ValueError("concat: no tensors given");
  const Tensor& first = xs[0];
  const int64_t d = wrap_dim(dim, first.dim(), "concat");
  Shape shape = first.shape();
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    detail::check_same(first, xs[i], "concat");
    Shape s = xs[i].shape();
    if (static_cast<int64_t>(s.size()) != first.dim()) {
      throw ShapeError("concat: tensor " + std::to_string(i) + " has shape " + shape_str(s) +
                       ", expected rank " + std::to_string(first.dim()));
    }
    total += s[d];
    s[d] = shape[d];
    if (s != shape) {
      throw ShapeError("concat: tensor " + std::to_string(i) + " has shape " +
                       shape_str(xs[i].shape()) + ", incompatible with " +
                       shape_str(first.shape()) + " outside dim " + std::to_string(d));
    }
  }
  shape[d] = total;
  Tensor out = empty(shape, first.dtype(), first.device());
  std::vector<int64_t> sizes;
  int64_t off = 0;
  for (const Tensor& x : xs) {
    Tensor window = make_view(out, x.shape(), out.strides(), off * out.strides()[d]);
    backend_for(out).copy(x, window);
    off += x.shape()[d];
    sizes.push_back(x.shape()[d]);
  }
  record("concat", xs, {out}, [sizes, d](const TensorList& g) -> TensorList {
    TensorList grads;
    int64_t o = 0;
    for (int64_t s : sizes) {
      grads.push_back(contiguous(narrow(g[0], d, o, s)));
      o += s;
    }
    return grads;
  });
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  detail::check_defined(x, "split", "x");
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) throw ShapeError("split: size " + std::to_string(s) + " is negative");
    total += s;
  }
  if (total != x.shape()[d]) {
    throw ShapeError("split: sizes add up to " + std::to_string(total) + " but dim " +
                     std::to_string(d) + " has size " + std::to_string(x.shape()[d]));
  }
  std::vector<Tensor> out;
  int64_t off = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow_view(x, d, off, s));
    off += s;
  }
  // One node for every piece: x's gradient is the pieces' gradients side by
  // side, written once (a narrow per piece would make a zero tensor the size
  // of x for each, and add them), in x's dtype as narrow's.
  if (!out.empty()) {
    const DType dt = x.dtype();
    record("split", {x}, out, [d, dt](const TensorList& g) -> TensorList {
      TensorList pieces;
      for (const Tensor& t : g) pieces.push_back(t.dtype() == dt ? t : cast(t, dt));
      return {concat(pieces, d)};
    });
  }
  return out;
}

}  // namespace triad
