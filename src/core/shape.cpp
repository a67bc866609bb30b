#include "triad/core/shape.h"

#include "triad/core/error.h"

namespace triad {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (__builtin_mul_overflow(n, s, &n)) {
      throw ShapeError("shape " + shape_str(shape) + " holds more elements than an int64 counts");
    }
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim) {
    throw ShapeError(std::string(op) + ": dim " + std::to_string(dim) + " is out of range for a " +
                     std::to_string(ndim) + "-d tensor");
  }
  return d;
}

}  // namespace triad
