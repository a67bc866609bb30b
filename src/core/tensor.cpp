#include "triad/core/tensor.h"

#include <cstdint>

#include "triad/backend/backend.h"

namespace triad {

TensorImpl& Tensor::impl() const {
  if (!impl_) throw ValueError("operation on an undefined tensor");
  return *impl_;
}

int64_t Tensor::size(int64_t d) const {
  return shape()[wrap_dim(d, dim(), "size")];
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  const auto& sh = shape();
  const auto& st = strides();
  for (size_t i = sh.size(); i-- > 0;) {
    if (sh[i] != 1 && st[i] != expected) return false;
    expected *= sh[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  auto& t = impl();
  return static_cast<char*>(t.storage->data()) +
         t.offset * static_cast<int64_t>(dtype_size(t.dtype));
}

Tensor& Tensor::set_requires_grad(bool value) {
  auto& t = impl();
  if (value && !is_floating(t.dtype)) {
    throw ValueError(std::string("only floating tensors can require gradients, got ") +
                     dtype_name(t.dtype));
  }
  if (t.grad_fn) throw ValueError("set_requires_grad: only leaf tensors can be marked");
  t.requires_grad = value;
  return *this;
}

void Tensor::register_post_accumulate_hook(GradHook hook) {
  if (!is_leaf() || !requires_grad()) {
    throw ValueError("post-accumulate hooks need a leaf tensor that requires grad");
  }
  impl().post_accumulate_hooks.push_back(std::move(hook));
}

DType Tensor::grad_dtype() const {
  const DType d = dtype();
  if (is_half(d)) return impl().half_grad ? d : DType::F32;
  return d == DType::F64 ? DType::F64 : DType::F32;
}

Tensor Tensor::detach() const {
  auto& t = impl();
  auto d = std::make_shared<TensorImpl>();
  d->storage = t.storage;
  d->shape = t.shape;
  d->strides = t.strides;
  d->offset = t.offset;
  d->dtype = t.dtype;
  return Tensor(std::move(d));
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor(shape=" + shape_str(shape()) + ", dtype=" + dtype_name(dtype()) +
         ", device=" + device().str() + ")";
}

Tensor empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t s : shape) {
    if (s < 0) throw ShapeError("empty: negative dimension in shape " + shape_str(shape));
  }
  auto impl = std::make_shared<TensorImpl>();
  const auto n = static_cast<size_t>(numel(shape));
  if (n > SIZE_MAX / dtype_size(dtype)) {
    throw ShapeError("empty: a tensor of shape " + shape_str(shape) + " in " + dtype_name(dtype) +
                     " holds more bytes than memory can address");
  }
  const size_t nbytes = n * dtype_size(dtype);
  impl->storage =
      std::make_shared<Storage>(nbytes, backend_for(device.type).allocator(device.index));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor empty_like(const Tensor& t) {
  return empty(t.shape(), t.dtype(), t.device());
}

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

}  // namespace triad
