#include "data/token_run.h"

#include <cstring>

namespace triad::data {
namespace {

template <class Fn>
auto with_type(IndexedDType dtype, Fn&& fn) {
  switch (dtype) {
    case IndexedDType::U8:
      return fn(uint8_t{});
    case IndexedDType::I8:
      return fn(int8_t{});
    case IndexedDType::I16:
      return fn(int16_t{});
    case IndexedDType::U16:
      return fn(uint16_t{});
    case IndexedDType::I32:
      return fn(int32_t{});
    case IndexedDType::I64:
      break;
  }
  return fn(int64_t{});
}

}  // namespace

void widen_tokens(const std::byte* p, IndexedDType dtype, int64_t first, int64_t count,
                  int64_t* out) {
  with_type(dtype, [&](auto zero) {
    using T = decltype(zero);
    const std::byte* q = p + first * static_cast<int64_t>(sizeof(T));
    for (int64_t i = 0; i < count; ++i) {
      T v;
      std::memcpy(&v, q + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
      out[i] = static_cast<int64_t>(v);
    }
  });
}

int64_t find_token_outside(const std::byte* p, IndexedDType dtype, int64_t count, int64_t limit) {
  return with_type(dtype, [&](auto zero) -> int64_t {
    using T = decltype(zero);
    // Blocks of 4096 are checked branch-free (a vectorisable pass over the
    // mapped file); only a block with a bad token is searched.
    constexpr int64_t kBlock = 4096;
    for (int64_t b = 0; b < count; b += kBlock) {
      const int64_t n = count - b < kBlock ? count - b : kBlock;
      const std::byte* q = p + b * static_cast<int64_t>(sizeof(T));
      bool bad = false;
      for (int64_t i = 0; i < n; ++i) {
        T v;
        std::memcpy(&v, q + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
        const auto w = static_cast<int64_t>(v);
        bad |= (w < 0) | (w >= limit);
      }
      if (!bad) continue;
      for (int64_t i = 0; i < n; ++i) {
        T v;
        std::memcpy(&v, q + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
        const auto w = static_cast<int64_t>(v);
        if (w < 0 || w >= limit) return b + i;
      }
    }
    return -1;
  });
}

}  // namespace triad::data
