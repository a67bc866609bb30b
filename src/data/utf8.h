#pragma once

// UTF-8 one code point at a time, for the tokenizers and Unicode
// normalisation (src/data).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace triad::data {

// U+FFFD, what a malformed byte decodes to where text must stay valid.
constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

// Decodes one UTF-8 code point at s[i]; malformed bytes decode as themselves.
inline uint32_t next_code_point(const std::string& s, size_t i, size_t& len) {
  const auto c = static_cast<unsigned char>(s[i]);
  auto cont = [&](size_t k) {
    return i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
  };
  if (c < 0x80) {
    len = 1;
    return c;
  }
  if ((c & 0xE0) == 0xC0 && cont(1)) {
    len = 2;
    return ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
  }
  if ((c & 0xF0) == 0xE0 && cont(1) && cont(2)) {
    len = 3;
    return ((c & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
           (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
  }
  if ((c & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
    len = 4;
    return ((c & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
           ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) |
           (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
  }
  len = 1;
  return c;
}

inline std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

// The length of the well-formed UTF-8 character at s[0..n) (no surrogates,
// no overlong forms), or 0 when it is malformed.
inline size_t valid_utf8_len(const char* s, size_t n) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i])); };
  auto trail = [&](size_t i) { return (b(i) & 0xC0) == 0x80; };
  auto scalar = [](uint32_t cp) { return cp < 0xD800 || (cp >= 0xE000 && cp <= 0x10FFFF); };
  if (b(0) < 0x80) return 1;
  if (n >= 2 && (b(0) & 0xE0) == 0xC0 && trail(1)) {
    const uint32_t cp = ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    return cp >= 0x80 ? 2 : 0;
  }
  if (n >= 3 && (b(0) & 0xF0) == 0xE0 && trail(1) && trail(2)) {
    const uint32_t cp = ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    return cp >= 0x800 && scalar(cp) ? 3 : 0;
  }
  if (n >= 4 && (b(0) & 0xF8) == 0xF0 && trail(1) && trail(2) && trail(3)) {
    const uint32_t cp =
        ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    return cp >= 0x10000 && scalar(cp) ? 4 : 0;
  }
  return 0;
}

}  // namespace triad::data
