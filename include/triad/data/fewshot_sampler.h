#pragma once

// Few-shot examples drawn at random as lm-evaluation-harness draws them, so
// that a few-shot score is asked with the very prompts the harness builds.
// The harness gives each task a Python random.Random seeded with its
// fewshot seed (1234 unless told), and each question, in order, draws its
// examples from the task's few-shot split with that generator's sample():
// the question's examples depend on how many draws came before it. Both
// are reproduced here bit for bit (MT19937 as CPython seeds it from an
// integer, getrandbits, _randbelow and sample's two algorithms).

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace triad::data {

// CPython's random.Random(seed) for a non-negative integer seed.
class PythonRandom {
 public:
  explicit PythonRandom(uint64_t seed);
  // getrandbits(32): the Mersenne Twister's next word.
  uint32_t next_u32();
  // getrandbits(k), 0 <= k <= 64 (words from the least significant up).
  uint64_t getrandbits(int k);
  // _randbelow(n): uniform in [0, n), n >= 1, by rejection of k-bit draws.
  uint64_t randbelow(uint64_t n);
  // The indices of sample(population, k) for a population of n items: the
  // same items in the same order, and the generator left where Python's
  // is. k > n is a ValueError.
  std::vector<size_t> sample(size_t n, size_t k);

 private:
  std::array<uint32_t, 624> state_{};
  size_t next_ = 624;
};

// One task's few-shot draws (lm-evaluation-harness's default
// ContextSampler.get_context): random.Random(seed), and for each question
// in order `shots` items sampled from a pool of `pool_size` — one more when
// the task's few-shot split is its test split, the question's own file or
// a task that names no test split — those that are the question itself
// dropped and the first `shots` of the rest kept.
class FewshotDraw {
 public:
  FewshotDraw(uint64_t seed, size_t pool_size, std::string where);
  // The next question's examples, as pool indices in prompt order.
  // `is_question(k)`: pool item k equals the question (the harness drops
  // such a draw, and then shows one example fewer unless it drew one
  // more). A pool smaller than the draw is a ValueError naming `where` and
  // the question (counted from 1).
  std::vector<size_t> next(int64_t shots, bool one_more,
                           const std::function<bool(size_t)>& is_question);

 private:
  PythonRandom rng_;
  size_t pool_size_;
  std::string where_;
  size_t questions_ = 0;
};

}  // namespace triad::data
