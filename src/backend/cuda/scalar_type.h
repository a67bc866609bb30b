#pragma once

// Triad's dtypes as the kernels' element types (kernels/common.h lists them
// in triad::DType's order, so the conversion is a cast).
#include "kernels/common.h"
#include "triad/core/dtype.h"

namespace triad::detail {

static_assert(static_cast<int>(DType::F32) == static_cast<int>(kernels::ScalarType::F32) &&
                  static_cast<int>(DType::F64) == static_cast<int>(kernels::ScalarType::F64) &&
                  static_cast<int>(DType::BF16) == static_cast<int>(kernels::ScalarType::BF16) &&
                  static_cast<int>(DType::F16) == static_cast<int>(kernels::ScalarType::F16) &&
                  static_cast<int>(DType::I32) == static_cast<int>(kernels::ScalarType::I32) &&
                  static_cast<int>(DType::I64) == static_cast<int>(kernels::ScalarType::I64),
              "kernels::ScalarType must list the dtypes in triad::DType's order");

inline kernels::ScalarType scalar(DType d) {
  return static_cast<kernels::ScalarType>(d);
}

}  // namespace triad::detail
