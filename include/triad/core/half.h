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

// IEEE binary16. Branch-free, so that loops over arrays vectorise (mixed
// precision on the CPU converts every half op's operands): each result is
// computed for the normal and the subnormal range and the right one picked.
// Below 2^-14 the FPU does the rounding: adding 0.5 (whose ulp is 2^-24, the
// half subnormals' spacing) rounds to nearest even at exactly that spacing.
inline uint16_t float_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t a = bits & 0x7fffffffu;
  // Normal: the exponent rebiased (127 -> 15), 13 bits dropped, ties to even.
  const uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  float small;
  std::memcpy(&small, &a, 4);
  small += 0.5f;
  uint32_t small_bits;
  std::memcpy(&small_bits, &small, 4);
  uint32_t h = a < 0x38800000u ? small_bits - 0x3f000000u : normal;
  h = a >= 0x47800000u ? 0x7c00u : h;  // 65536 and above (65520 rounds up to it)
  h = a > 0x7f800000u ? 0x7e00u : h;   // NaN stays a (quiet) NaN
  return static_cast<uint16_t>(sign | h);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t shifted = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t exp = shifted & 0x0f800000u;
  uint32_t bits = shifted + 0x38000000u;                  // rebias 15 -> 127
  bits = exp == 0x0f800000u ? bits + 0x38000000u : bits;  // inf and NaN: all ones
  // Zero and subnormals: m * 2^-24 as (2^-14 + m * 2^-24) - 2^-14, exactly.
  const uint32_t lifted = bits + 0x00800000u;
  float sub;
  std::memcpy(&sub, &lifted, 4);
  sub -= 6.103515625e-05f;  // 2^-14
  uint32_t sub_bits;
  std::memcpy(&sub_bits, &sub, 4);
  bits = (exp == 0 ? sub_bits : bits) | sign;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace triad
