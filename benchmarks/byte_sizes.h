#pragma once

// Message sizes on the benchmarks' command lines: "64", "4K", "16M", "1G".

#include <cstdint>
#include <stdexcept>
#include <string>

namespace triad::bench {

// A byte count with an optional K, M or G suffix (powers of 1024); throws
// std::invalid_argument naming the text when it is not one.
inline int64_t parse_bytes(std::string s) {
  const std::string given = s;
  int64_t mult = 1;
  const char c = s.empty() ? ' ' : s.back();
  if (c == 'K' || c == 'k') mult = int64_t{1} << 10;
  if (c == 'M' || c == 'm') mult = int64_t{1} << 20;
  if (c == 'G' || c == 'g') mult = int64_t{1} << 30;
  if (mult != 1) s.pop_back();
  size_t used = 0;
  int64_t n = -1;
  try {
    n = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || n < 0)
    throw std::invalid_argument("'" + given + "' is not a byte count (e.g. 64, 4K, 16M, 1G)");
  return n * mult;
}

// For CLI11's Option::check: "" when `s` is a byte count, else why not.
inline std::string byte_count_error(const std::string& s) {
  try {
    parse_bytes(s);
    return "";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

}  // namespace triad::bench
