#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace triad {

// Counter-based random numbers (Philox-4x32-10). A value is a pure function of
// (key, counter), so any element of any tensor can be generated on its own,
// on any device, in any order: the basis of layout-independent initialisation
// and of dropout masks that agree across CPU and CUDA.
std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);

// Uniform in [0, 1) from 32 random bits (24-bit mantissa, never 1.0).
inline float uint_to_unit_float(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

// Element `index` of stream (seed, stream): a uniform float in [0, 1).
float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index);
// Element `index` of stream (seed, stream): a standard normal (Box-Muller).
float philox_normal(uint64_t seed, uint64_t stream, uint64_t index);

// Stable 64-bit hash of a name (FNV-1a), used to give each parameter its own
// stream so initial values depend on the name, not on creation order.
uint64_t stable_hash(std::string_view text);

}  // namespace triad
