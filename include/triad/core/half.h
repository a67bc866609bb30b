#pragma once

#include <cstdint>
#include <cstring>

namespace triad {

// Scalar conversions between float and the 16-bit float formats. Both round
// to nearest even, and keep NaN a NaN, matching what GPUs do in hardware.

inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);

}  // namespace triad
