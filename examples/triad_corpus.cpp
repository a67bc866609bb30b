// triad-corpus: writes a synthetic English-like corpus so the examples need
// no download. Sentences come from a small grammar (subject, verb, object,
// place, time) plus simple sums, drawn with a seeded generator, so there is
// real structure for a model to learn.
//   triad-corpus --output data/tiny.txt --bytes 2000000 --seed 1
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "triad/core/error.h"
#include "triad/core/rng.h"
#include "triad/train/console.h"

#include "cli_checks.h"

namespace {

const std::vector<std::string> kAdjectives{"small", "quiet",   "bright",  "old",
                                           "brave", "clever",  "sleepy",  "green",
                                           "tall",  "patient", "curious", "gentle"};
const std::vector<std::string> kNouns{"cat",   "farmer", "river", "robot",  "teacher", "fox",
                                      "child", "sailor", "bird",  "engine", "painter", "garden"};
const std::vector<std::string> kVerbs{"watches", "follows", "helps",  "finds",     "paints",
                                      "carries", "visits",  "builds", "remembers", "greets"};
const std::vector<std::string> kPlaces{"near the hill",    "by the sea",    "in the city",
                                       "under the bridge", "at the market", "behind the old mill"};
const std::vector<std::string> kTimes{"every morning",  "at night",      "in the spring",
                                      "after the rain", "before dinner", "on sunday"};
const std::vector<std::string> kNumbers{"zero", "one", "two",   "three", "four",
                                        "five", "six", "seven", "eight", "nine"};

class Draw {
 public:
  explicit Draw(uint64_t seed) : seed_(seed) {}
  size_t below(size_t n) {
    return static_cast<size_t>(triad::philox_uniform(seed_, 1, i_++) * n) % n;
  }
  const std::string& pick(const std::vector<std::string>& v) { return v[below(v.size())]; }

 private:
  uint64_t seed_;
  uint64_t i_ = 0;
};

std::string sentence(Draw& d) {
  const size_t kind = d.below(5);
  if (kind == 0) {
    const size_t a = d.below(5), b = d.below(5);
    return kNumbers[a] + " plus " + kNumbers[b] + " is " + kNumbers[a + b] + ".";
  }
  std::string s = "the " + d.pick(kAdjectives) + " " + d.pick(kNouns) + " " + d.pick(kVerbs) +
                  " the " + d.pick(kNouns);
  if (kind >= 2) s += " " + d.pick(kPlaces);
  if (kind >= 3) s += " " + d.pick(kTimes);
  return s + ".";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Write a synthetic corpus for the examples"};
  std::string output;
  int64_t bytes = 2'000'000;
  uint64_t seed = 1;
  app.add_option("--output", output, "text file to write")->required();
  app.add_option("--bytes", bytes, "approximate size in bytes")
      ->check(triad::examples::at_least_one());
  app.add_option("--seed", seed, "generator seed")->check(triad::examples::unsigned_integer());
  CLI11_PARSE(app, argc, argv);
  try {
    triad::train::configure_console_colors();
  } catch (const triad::Error& e) {
    spdlog::error("{}", e.what());
    return 2;
  }
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  if (!out) {
    spdlog::error("cannot open '{}' for writing", output);
    return 2;
  }
  Draw d(seed);
  int64_t written = 0;
  int in_paragraph = 0;
  while (written < bytes) {
    std::string s = sentence(d);
    s += (++in_paragraph % 6 == 0) ? "\n" : " ";
    out << s;
    written += static_cast<int64_t>(s.size());
  }
  spdlog::info("wrote {} bytes to {}", written, output);
  return out ? 0 : 2;
}
