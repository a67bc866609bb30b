#pragma once

#include <cstdint>
#include <string>

#include "triad/core/tensor.h"

namespace triad::detail {

inline void check_defined(const Tensor& t, const char* op, const char* arg) {
  if (!t.defined()) throw ValueError(std::string(op) + ": argument '" + arg + "' is undefined");
}

inline void check_floating(const Tensor& t, const char* op, const char* arg) {
  check_defined(t, op, arg);
  if (!is_floating(t.dtype())) {
    throw ValueError(std::string(op) + ": '" + arg + "' must be a floating tensor, got " +
                     dtype_name(t.dtype()));
  }
}

inline void check_index(const Tensor& t, const char* op, const char* arg) {
  check_defined(t, op, arg);
  if (t.dtype() != DType::I32 && t.dtype() != DType::I64) {
    throw ValueError(std::string(op) + ": '" + arg + "' must be i32 or i64, got " +
                     dtype_name(t.dtype()));
  }
}

inline void check_same(const Tensor& a, const Tensor& b, const char* op) {
  if (a.dtype() != b.dtype()) {
    throw ValueError(std::string(op) + ": dtype mismatch " + dtype_name(a.dtype()) + " vs " +
                     dtype_name(b.dtype()));
  }
  if (!(a.device() == b.device())) {
    throw ValueError(std::string(op) + ": device mismatch " + a.device().str() + " vs " +
                     b.device().str());
  }
}

inline void check_dim(const Tensor& t, int64_t ndim, const char* op, const char* arg) {
  if (t.dim() != ndim) {
    throw ShapeError(std::string(op) + ": '" + arg + "' must be " + std::to_string(ndim) +
                     "-d, got shape " + shape_str(t.shape()));
  }
}

}  // namespace triad::detail
