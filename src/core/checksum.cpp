#include "triad/core/checksum.h"

#include <algorithm>
#include <cstring>

namespace triad {
namespace {

constexpr uint64_t kWordMultiplier = 0x9e3779b97f4a7c15ull;  // odd: a bijection mod 2^64

// MurmurHash3's 64-bit finalizer (a bijection).
uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb93f05c0d25bull;
  x ^= x >> 33;
  return x;
}

}  // namespace

uint64_t words64_checksum(const void* data, uint64_t length) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  // Four lanes, each taking every fourth 64-bit word: lane = (lane ^ word) *
  // odd, a bijection in both the lane and the word, so a change to any one
  // word (any one bit) changes its lane's end value; the lanes multiply
  // independently, so the loop runs at memory speed.
  uint64_t lane[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull,
                      0x082efa98ec4e6c89ull};
  const uint64_t whole = length / 32 * 32;
  for (uint64_t i = 0; i < whole; i += 32) {
    uint64_t w[4];
    std::memcpy(w, bytes + i, sizeof w);
    for (int k = 0; k < 4; ++k) lane[k] = (lane[k] ^ w[k]) * kWordMultiplier;
  }
  // The last bytes, zero-padded to whole words (the length tells padded
  // data from data that ends in zeros).
  const uint64_t tail = length - whole;
  for (uint64_t i = 0; i < tail; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, bytes + whole + i, std::min<uint64_t>(8, tail - i));
    uint64_t& l = lane[(i / 8) % 4];
    l = (l ^ w) * kWordMultiplier;
  }
  uint64_t h = mix64(length);
  for (const uint64_t l : lane) h = (h ^ mix64(l)) * kWordMultiplier;
  return mix64(h);
}

}  // namespace triad
