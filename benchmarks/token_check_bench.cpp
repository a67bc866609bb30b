// How long opening token data takes a rank at start-up, the tokens checked
// against the vocabulary and a loss mask's bytes checked and counted: one
// process checking everything (data::TokenCheck of one part) against one
// rank of a job whose ranks each check 1/ranks of the stream (the slowest
// part is reported), on files in the page cache.
//   bench_token_check --mib 1024 --ranks 8 --repeat 3
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "triad/data/indexed_dataset.h"
#include "triad/data/loss_mask.h"
#include "triad/data/token_dataset.h"

namespace {

// Seconds to open `sources` as part `index` of `count` (the best of
// `repeat` timed passes after one that warms the page cache).
double open_seconds(const std::vector<std::string>& sources, int64_t vocab, int64_t index,
                    int64_t count, int repeat, int64_t* loss_tokens) {
  double best = 1e30;
  for (int r = 0; r < repeat + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    triad::data::TokenDataset ds(sources, 1024, vocab, {}, {index, count});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (ds.part_check().first_bad >= 0) {
      std::fprintf(stderr, "the generated data has a bad token\n");
      std::exit(1);
    }
    *loss_tokens = ds.part_check().loss_tokens;
    if (r > 0) best = std::min(best, s);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"start-up token check: one process against one rank's part"};
  int64_t mib = 1024;
  int64_t ranks = 8;
  int repeat = 3;
  app.add_option("--mib", mib, "token data in MiB (uint16 tokens)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--ranks", ranks, "ranks sharing the check")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 16));
  app.add_option("--repeat", repeat, "timed passes (the best is reported)")
      ->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("triad_token_check_bench_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string prefix = (dir / "data").string();
  const int64_t tokens = mib * 1048576 / 2;
  constexpr int64_t kVocab = 50257, kDocument = 1000;
  {
    // Documents of 1000 tokens, a mask scoring their second half.
    triad::data::IndexedDatasetWriter tokens_out(prefix, triad::data::IndexedDType::U16);
    triad::data::LossMaskWriter mask_out(triad::data::loss_mask_path(prefix));
    std::mt19937_64 rng(7);
    std::vector<int64_t> doc(kDocument);
    std::vector<uint8_t> keep(kDocument);
    for (int64_t i = 0; i < kDocument; ++i) keep[static_cast<size_t>(i)] = i >= kDocument / 2;
    for (int64_t at = 0; at < tokens; at += kDocument) {
      const auto n = static_cast<size_t>(std::min(kDocument, tokens - at));
      doc.resize(n);
      keep.resize(n);
      for (auto& t : doc) t = static_cast<int64_t>(rng() % kVocab);
      tokens_out.add(doc);
      mask_out.add(keep);
    }
    tokens_out.finish();
    mask_out.finish();
  }
  std::printf("%lld MiB of uint16 tokens (%lld tokens) and a %lld MiB loss mask\n",
              static_cast<long long>(mib), static_cast<long long>(tokens),
              static_cast<long long>(tokens / 1048576));
  int64_t kept = 0;
  const double one = open_seconds({prefix}, kVocab, 0, 1, repeat, &kept);
  std::printf("one process, every token:  %8.3f s  %6.2f GB/s of tokens\n", one,
              static_cast<double>(tokens) * 2 / one / 1e9);
  double slowest = 0;
  int64_t sum = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    int64_t part = 0;
    slowest = std::max(slowest, open_seconds({prefix}, kVocab, r, ranks, repeat, &part));
    sum += part;
  }
  std::printf("one of %lld ranks (slowest): %8.3f s  (%.1fx less; targets with loss %lld, %s)\n",
              static_cast<long long>(ranks), slowest, one / slowest, static_cast<long long>(sum),
              sum == kept ? "the one process's count" : "NOT the one process's count");
  fs::remove_all(dir);
  return sum == kept ? 0 : 1;
}
