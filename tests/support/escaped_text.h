#pragma once

// Text for test messages: every byte outside printable ASCII as \xNN.

#include <sstream>
#include <string>

namespace triad::testing {

inline std::string escaped(const std::string& s) {
  std::ostringstream o;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F) {
      o << c;
    } else {
      static const char* hex = "0123456789abcdef";
      o << "\\x" << hex[c >> 4] << hex[c & 15];
    }
  }
  return o.str();
}

}  // namespace triad::testing
