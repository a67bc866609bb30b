#include "triad/data/fewshot_sampler.h"

#include <bit>
#include <cmath>
#include <unordered_set>
#include <utility>

#include "triad/core/error.h"

namespace triad::data {

namespace {

constexpr size_t kN = 624, kM = 397;

}  // namespace

// CPython's random_seed for an integer: init_by_array over the seed's
// 32-bit words, least significant first (one zero word for 0).
PythonRandom::PythonRandom(uint64_t seed) {
  std::vector<uint32_t> key{static_cast<uint32_t>(seed)};
  if (seed >> 32) key.push_back(static_cast<uint32_t>(seed >> 32));
  // init_genrand(19650218)
  state_[0] = 19650218u;
  for (size_t i = 1; i < kN; ++i) {
    state_[i] = 1812433253u * (state_[i - 1] ^ (state_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  }
  size_t i = 1, j = 0;
  for (size_t k = std::max(kN, key.size()); k > 0; --k) {
    state_[i] = (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1664525u)) + key[j] +
                static_cast<uint32_t>(j);
    if (++i >= kN) {
      state_[0] = state_[kN - 1];
      i = 1;
    }
    if (++j >= key.size()) j = 0;
  }
  for (size_t k = kN - 1; k > 0; --k) {
    state_[i] = (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1566083941u)) -
                static_cast<uint32_t>(i);
    if (++i >= kN) {
      state_[0] = state_[kN - 1];
      i = 1;
    }
  }
  state_[0] = 0x80000000u;  // a non-zero state, whatever the key
  next_ = kN;
}

uint32_t PythonRandom::next_u32() {
  if (next_ >= kN) {
    const auto mix = [](uint32_t hi, uint32_t lo) {
      const uint32_t y = (hi & 0x80000000u) | (lo & 0x7fffffffu);
      return (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    };
    for (size_t k = 0; k < kN; ++k) {
      state_[k] = state_[(k + kM) % kN] ^ mix(state_[k], state_[(k + 1) % kN]);
    }
    next_ = 0;
  }
  uint32_t y = state_[next_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t PythonRandom::getrandbits(int k) {
  if (k < 0 || k > 64) {
    throw ValueError("getrandbits(" + std::to_string(k) + "): k must be in [0, 64]");
  }
  if (k == 0) return 0;
  if (k <= 32) return next_u32() >> (32 - k);
  const uint64_t low = next_u32();
  const uint64_t high = next_u32() >> (64 - k);
  return low | (high << 32);
}

uint64_t PythonRandom::randbelow(uint64_t n) {
  if (n == 0) throw ValueError("randbelow(0): the range must hold at least one value");
  const int k = std::bit_width(n);
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

std::vector<size_t> PythonRandom::sample(size_t n, size_t k) {
  if (k > n) {
    throw ValueError("sample of " + std::to_string(k) + " from a population of " +
                     std::to_string(n) + ": larger than the population");
  }
  std::vector<size_t> out(k);
  // Python keeps a copy of the population when a set of picks would cost
  // more memory than it (a list of n), else it re-draws repeated picks.
  size_t setsize = 21;
  if (k > 5) {
    setsize += static_cast<size_t>(
        std::pow(4.0, std::ceil(std::log(static_cast<double>(k) * 3) / std::log(4.0))));
  }
  if (n <= setsize) {
    std::vector<size_t> pool(n);
    for (size_t i = 0; i < n; ++i) pool[i] = i;
    for (size_t i = 0; i < k; ++i) {
      const auto j = static_cast<size_t>(randbelow(n - i));
      out[i] = pool[j];
      pool[j] = pool[n - i - 1];
    }
  } else {
    std::unordered_set<size_t> picked;
    for (size_t i = 0; i < k; ++i) {
      auto j = static_cast<size_t>(randbelow(n));
      while (picked.count(j)) j = static_cast<size_t>(randbelow(n));
      picked.insert(j);
      out[i] = j;
    }
  }
  return out;
}

FewshotDraw::FewshotDraw(uint64_t seed, size_t pool_size, std::string where)
    : rng_(seed), pool_size_(pool_size), where_(std::move(where)) {}

std::vector<size_t> FewshotDraw::next(int64_t shots, bool one_more,
                                      const std::function<bool(size_t)>& is_question) {
  ++questions_;
  if (shots < 0) {
    throw ValueError(where_ + ": the few-shot count " + std::to_string(shots) + " must be >= 0");
  }
  if (shots == 0) return {};  // (the harness draws nothing for a zero-shot prompt)
  const auto draws = static_cast<size_t>(shots) + (one_more ? 1 : 0);
  if (draws > pool_size_) {
    throw ValueError(where_ + ": question " + std::to_string(questions_) + " draws " +
                     std::to_string(draws) + " few-shot example(s)" +
                     (one_more ? " (" + std::to_string(shots) + " and one to spare)" : "") +
                     " from " + std::to_string(pool_size_) + ": too few to draw from");
  }
  std::vector<size_t> kept;
  for (const size_t k : rng_.sample(pool_size_, draws)) {
    if (kept.size() < static_cast<size_t>(shots) && !is_question(k)) kept.push_back(k);
  }
  return kept;
}

}  // namespace triad::data
