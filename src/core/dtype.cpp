#include "triad/core/dtype.h"

#include "triad/core/error.h"

namespace triad {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return 4;
    case DType::F64:
      return 8;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
  }
  throw ValueError("unknown dtype");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "f32";
    case DType::F64:
      return "f64";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
  }
  return "?";
}

bool is_floating(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16 || dtype == DType::F16;
}

DType dtype_from_name(const std::string& name) {
  for (DType d : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    if (name == dtype_name(d)) return d;
  }
  throw ValueError("unknown dtype '" + name + "' (expected one of f32, f64, bf16, f16, i32, i64)");
}

}  // namespace triad
