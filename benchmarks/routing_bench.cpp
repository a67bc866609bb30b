// Host time of a mixture's routing (nn::route_top_k) for one micro-batch
// of one layer: Mixtral's softmax top 2 of 8, and DeepSeek-V3's top 8 of
// 256 chosen with expert biases within the best 4 of 8 groups, on random
// scores. The routing runs on the host while the device waits for its
// result, so this is time a GPU step spends per MoE layer and micro-batch.
//   bench_routing --tokens 4096 --repeat 5
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "triad/nn/moe.h"

namespace {

struct Case {
  const char* name;
  int64_t experts, top_k, groups, top_groups;
  bool biased;
};

// The best of `repeat` timed passes, in milliseconds.
double route_ms(const Case& c, int64_t tokens, int repeat) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> scores(static_cast<size_t>(tokens * c.experts));
  for (double& s : scores) s = unit(rng);
  triad::nn::ExpertChoice choice{{}, c.groups, c.top_groups};
  if (c.biased) {
    choice.bias.resize(static_cast<size_t>(c.experts));
    for (double& b : choice.bias) b = 0.01 * (unit(rng) - 0.5);
  }
  double best = 1e30;
  int64_t rows = 0;
  for (int r = 0; r < repeat + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const triad::nn::Routing routing =
        triad::nn::route_top_k(scores, tokens, c.experts, c.top_k, 0,
                               triad::nn::GptConfig::Moe::DropPolicy::Probs, choice);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    rows += static_cast<int64_t>(routing.token.size());
    if (r > 0) best = std::min(best, ms);
  }
  if (rows == 0) std::fprintf(stderr, "no rows routed\n");
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"host time of a mixture's routing, one layer and micro-batch"};
  int64_t tokens = 4096;
  int repeat = 5;
  app.add_option("--tokens", tokens, "tokens in the micro-batch")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--repeat", repeat, "timed passes (the best is reported)")
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  const Case cases[] = {{"mixtral: softmax, top 2 of 8", 8, 2, 1, 1, false},
                        {"qwen3-moe: softmax, top 8 of 128", 128, 8, 1, 1, false},
                        {"glm-4.5: biased, top 8 of 160", 160, 8, 1, 1, true},
                        {"deepseek-v3: biased, top 8 of 256 in 4 of 8 groups", 256, 8, 8, 4, true}};
  for (const Case& c : cases) {
    const double ms = route_ms(c, tokens, repeat);
    std::printf("%-52s %8.3f ms for %lld tokens (%.1f ns a token)\n", c.name, ms,
                static_cast<long long>(tokens), 1e6 * ms / static_cast<double>(tokens));
  }
  return 0;
}
