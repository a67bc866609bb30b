#include "triad/core/rng.h"

#include <cmath>

#include "triad/core/philox.h"

namespace triad {

std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  const philox::Words r = philox::block(key, counter_hi, counter_lo);
  return {r.w[0], r.w[1], r.w[2], r.w[3]};
}

float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox::uniform(seed, stream, index);
}

float philox_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  // Two words feed one Box-Muller pair; element i takes the cos or sin half.
  const auto r = philox4x32(seed, stream, index >> 1);
  const float u1 = (static_cast<float>(r[0] >> 8) + 1.0f) * (1.0f / 16777217.0f);  // (0, 1]
  const float u2 = uint_to_unit_float(r[1]);
  const float radius = std::sqrt(-2.0f * std::log(u1));
  const float theta = 6.28318530717958647692f * u2;
  return (index & 1) ? radius * std::sin(theta) : radius * std::cos(theta);
}

uint64_t stable_hash(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace triad
