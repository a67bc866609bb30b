#pragma once

// ASCII white space, as Python's str.strip and Jinja's trim treat text
// here (chat templates, evaluation files).

#include <string>

namespace triad::data {

constexpr const char* kAsciiSpaces = " \t\n\r\f\v";

inline bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// `s` without the white space around it.
inline std::string strip_ascii_spaces(const std::string& s) {
  const size_t first = s.find_first_not_of(kAsciiSpaces);
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(kAsciiSpaces) - first + 1);
}

}  // namespace triad::data
