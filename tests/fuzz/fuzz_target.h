#pragma once

// A fuzz target: a reader of untrusted bytes (a file Triad is handed, a
// config, a template) run on whatever input the fuzzer makes. The contract
// every reader keeps is the one Triad promises for bad input: it returns, or
// it throws a triad::Error that says what is wrong. Anything else (another
// exception type, a crash, a read outside a buffer, a hang) is a finding.
//
//   TRIAD_FUZZ_TARGET(safetensors) { ...use data, size... }
//
// One source per target (tests/fuzz/<name>_fuzz.cpp). Built with
// TRIAD_BUILD_FUZZERS (clang, libFuzzer; scripts/fuzz.sh) each is a fuzzer
// program of its own; in every other build they are linked together into
// triad_fuzz_replay, which CTest runs over tests/fuzz/corpus/<name>/ (the
// seeds and every input a fuzzer found wrong), so a fixed finding stays fixed.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "triad/core/error.h"

namespace triad::fuzz {

using TargetFn = void (*)(const uint8_t* data, size_t size);

// Runs `fn` on the input: a triad::Error is the reader refusing bad input
// (fine); every other exception escapes to the caller.
inline void run_target(TargetFn fn, const uint8_t* data, size_t size) {
  try {
    fn(data, size);
  } catch (const triad::Error&) {
  }
}

// A property what was read must have; its failure is a finding (it throws
// what no reader throws: not a triad::Error).
inline void require(bool holds, const char* what) {
  if (!holds) throw std::logic_error(std::string("fuzz: the property failed: ") + what);
}

// (Replay builds.) Adds a target under `name`; returns 0.
int register_target(const char* name, TargetFn fn);

}  // namespace triad::fuzz

#if defined(TRIAD_LIBFUZZER)
#define TRIAD_FUZZ_TARGET(name)                                             \
  static void triad_fuzz_##name(const uint8_t* data, size_t size);          \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    ::triad::fuzz::run_target(&triad_fuzz_##name, data, size);              \
    return 0;                                                               \
  }                                                                         \
  static void triad_fuzz_##name([[maybe_unused]] const uint8_t* data, [[maybe_unused]] size_t size)
#else
#define TRIAD_FUZZ_TARGET(name)                                    \
  static void triad_fuzz_##name(const uint8_t* data, size_t size); \
  [[maybe_unused]] static const int triad_fuzz_registered_##name = \
      ::triad::fuzz::register_target(#name, &triad_fuzz_##name);   \
  static void triad_fuzz_##name([[maybe_unused]] const uint8_t* data, [[maybe_unused]] size_t size)
#endif
