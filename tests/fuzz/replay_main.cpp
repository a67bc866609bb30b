// triad_fuzz_replay TARGET PATH...: runs the fuzz target TARGET
// (fuzz_target.h) on each file PATH names, or on every file in a folder
// PATH names, as the fuzzer would. A triad::Error is the reader refusing the
// input (fine); any other exception is reported with the file and the run
// fails. A crash ends the run, as it would the fuzzer. TRIAD_FUZZ_VERBOSE=1
// prints each input's outcome.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <typeinfo>
#include <vector>

#include "fuzz_target.h"

namespace triad::fuzz {
namespace {
std::map<std::string, TargetFn>& targets() {
  static std::map<std::string, TargetFn> all;
  return all;
}
}  // namespace

int register_target(const char* name, TargetFn fn) {
  targets()[name] = fn;
  return 0;
}

}  // namespace triad::fuzz

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const auto& targets = triad::fuzz::targets();
  auto it = argc >= 3 ? targets.find(argv[1]) : targets.end();
  if (it == targets.end()) {
    std::fprintf(stderr, "usage: %s TARGET PATH... (TARGET:", argv[0]);
    for (const auto& [name, fn] : targets) std::fprintf(stderr, " %s", name.c_str());
    std::fprintf(stderr, ")\n");
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int i = 2; i < argc; ++i) {
    const fs::path path(argv[i]);
    if (fs::is_directory(path)) {
      for (const auto& entry : fs::directory_iterator(path)) {
        if (entry.is_regular_file()) inputs.push_back(entry.path());
      }
    } else if (fs::is_regular_file(path)) {
      inputs.push_back(path);
    } else {
      std::fprintf(stderr, "%s: no such file or folder\n", argv[i]);
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "%s: no inputs for %s\n", argv[0], argv[1]);
    return 2;
  }
  // TRIAD_FUZZ_VERBOSE=1: each input's outcome (read, or the error that refused it).
  const char* verbose_env = std::getenv("TRIAD_FUZZ_VERBOSE");
  const bool verbose = verbose_env && std::string(verbose_env) == "1";
  int failed = 0;
  for (const auto& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                     std::istreambuf_iterator<char>());
    try {
      it->second(bytes.data(), bytes.size());
      if (verbose) std::printf("%s: read\n", path.c_str());
    } catch (const triad::Error& e) {
      if (verbose) std::printf("%s: refused: %s\n", path.c_str(), e.what());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s escaped (not a triad::Error): %s\n", path.c_str(),
                   typeid(e).name(), e.what());
      ++failed;
    } catch (...) {
      std::fprintf(stderr, "%s: a non-std exception escaped\n", path.c_str());
      ++failed;
    }
  }
  std::printf("%s: %zu inputs, %d failed\n", argv[1], inputs.size(), failed);
  return failed == 0 ? 0 : 1;
}
