#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace triad {

// Element types a tensor can hold. F64 exists for the CPU reference (finite
// difference gradient checks); backends that lack it say so.
enum class DType : uint8_t { F32, F64, BF16, F16, I32, I64 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
bool is_floating(DType dtype);
// bf16 or f16: stored in 16 bits, computed in f32.
inline bool is_half(DType dtype) {
  return dtype == DType::BF16 || dtype == DType::F16;
}
// Parses "f32", "bf16", ... (the names dtype_name returns); throws ValueError.
DType dtype_from_name(const std::string& name);

}  // namespace triad
