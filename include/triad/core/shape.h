#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace triad {

using Shape = std::vector<int64_t>;

// The number of elements; a ShapeError when it overflows int64.
int64_t numel(const Shape& shape);
// Row-major strides of a contiguous tensor of this shape.
Shape contiguous_strides(const Shape& shape);
std::string shape_str(const Shape& shape);
// Wraps a possibly negative dimension index into [0, ndim); throws ShapeError.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

}  // namespace triad
