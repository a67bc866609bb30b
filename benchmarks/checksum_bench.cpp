// How fast a checkpoint's rank file is hashed: the words64 checksum that
// manifests name now against the byte-by-byte FNV-1a of older ones, on a
// file in the page cache (as a rank hashes the file it has just written).
//   bench_checksum --mib 512 --repeat 3
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "triad/io/checkpoint.h"

int main(int argc, char** argv) {
  CLI::App app{"checkpoint checksum throughput"};
  int64_t mib = 512;
  int repeat = 3;
  app.add_option("--mib", mib, "file size in MiB")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--repeat", repeat, "timed passes per checksum (the best is reported)")
      ->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("triad_checksum_bench_" + std::to_string(::getpid()));
  {
    std::ofstream out(path, std::ios::binary);
    std::mt19937_64 rng(7);
    std::vector<uint64_t> block(1 << 17);  // 1 MiB
    for (int64_t i = 0; i < mib; ++i) {
      for (auto& w : block) w = rng();
      out.write(reinterpret_cast<const char*>(block.data()),
                static_cast<std::streamsize>(block.size() * sizeof(uint64_t)));
    }
  }
  for (const char* kind : {triad::io::kChecksumFnv1a64, triad::io::kChecksumWords64}) {
    double best = 1e30;
    uint64_t sum = 0;
    for (int r = 0; r < repeat + 1; ++r) {  // the first pass warms the page cache
      const auto t0 = std::chrono::steady_clock::now();
      sum = triad::io::file_checksum(path.string(), kind);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0 && s < best) best = s;
    }
    std::printf("%-8s %6lld MiB  %7.3f s  %6.2f GB/s  (checksum %llu)\n", kind,
                static_cast<long long>(mib), best,
                static_cast<double>(mib) * 1048576.0 / best / 1e9,
                static_cast<unsigned long long>(sum));
  }
  std::filesystem::remove(path);
  return 0;
}
