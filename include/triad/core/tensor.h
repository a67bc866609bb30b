#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "triad/core/device.h"
#include "triad/core/dtype.h"
#include "triad/core/error.h"
#include "triad/core/shape.h"
#include "triad/core/storage.h"

namespace triad {

namespace autograd {
class Node;
}

class Tensor;
using GradHook = std::function<void(Tensor& grad)>;

// Shared state behind Tensor handles. Autograd metadata lives here so that a
// copy of a handle sees the same .grad and graph position.
struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;       // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::F32;

  bool requires_grad = false;
  // A bf16/f16 leaf accumulates its gradient in its own dtype, not f32
  // (train.grad_precision bf16; Tensor::grad_dtype).
  bool half_grad = false;
  std::shared_ptr<TensorImpl> grad;                // leaf gradient (accumulated)
  std::shared_ptr<autograd::Node> grad_fn;         // producer, null for leaves
  int output_nr = 0;                               // which output of grad_fn
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves only, created lazily
  std::vector<GradHook> post_accumulate_hooks;     // "gradient ready" hooks
};

// Handle to an N-dimensional strided array with reference-counted storage.
// Copying a Tensor copies the handle, not the data (like torch.Tensor).
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t offset() const { return impl().offset; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const { return triad::numel(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  bool is_contiguous() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }

  // Pointer to the first element (storage + offset). Host pointer on CPU,
  // device pointer on CUDA.
  void* raw_data() const;
  template <class T>
  T* data() const {
    return static_cast<T*>(raw_data());
  }

  // Autograd.
  bool requires_grad() const { return impl().requires_grad; }
  // Marks a leaf as a parameter whose gradient is accumulated into grad().
  Tensor& set_requires_grad(bool value);
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  Tensor grad() const { return Tensor(impl().grad); }
  // The dtype a leaf accumulates its gradient in: f32 for bf16/f16 values
  // (sums over micro-batches keep their digits) unless set_half_grad asked
  // for their own; f64 for f64; f32 otherwise.
  DType grad_dtype() const;
  Tensor& set_half_grad(bool value) {
    impl().half_grad = value;
    return *this;
  }
  void set_grad(const Tensor& g) { impl().grad = g.impl_; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl().grad_fn; }
  // Registers a hook that runs each time a gradient has been accumulated into
  // this leaf's .grad (the "gradient ready" signal for data parallelism).
  void register_post_accumulate_hook(GradHook hook);
  // A handle sharing storage but cut from the autograd graph.
  Tensor detach() const;

  std::string str() const;  // "Tensor(shape=[2, 3], dtype=f32, device=cpu)"

  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// Allocates an uninitialised contiguous tensor.
Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
Tensor empty_like(const Tensor& t);
// A view over `base`'s storage with the given geometry (no copy, no autograd).
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset);

}  // namespace triad
