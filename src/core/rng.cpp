#include "triad/core/rng.h"

#include <cmath>

namespace triad {

std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kW0, k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  // Four outputs per counter: element i uses word i % 4 of counter i / 4.
  const auto r = philox4x32(seed, stream, index >> 2);
  return uint_to_unit_float(r[index & 3]);
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
