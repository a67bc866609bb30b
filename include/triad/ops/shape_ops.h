#pragma once

#include <cstdint>
#include <vector>

#include "triad/core/tensor.h"

namespace triad {

// All of these return views where the layout allows (no copy) and are
// differentiable.

// A tensor with the same elements in row-major order; one entry may be -1.
// A view when x is contiguous, otherwise a copy.
Tensor reshape(const Tensor& x, Shape shape);
Tensor flatten(const Tensor& x);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
// Elements [start, start + length) along dim.
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
// Broadcast to `shape` (stride-0 view); the gradient is summed back.
Tensor expand(const Tensor& x, const Shape& shape);
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
// Pieces of the given sizes along dim (sizes must add up to x.size(dim)).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);

// The shape two operands broadcast to; throws ShapeError naming both.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace triad
