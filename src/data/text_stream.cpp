#include "triad/data/text_stream.h"

#include <algorithm>
#include <string_view>

#include "utf8.h"

namespace triad::data {
namespace {

// Bytes at the end of text[0, end) that begin a UTF-8 character the text
// has not finished (0 when the last character is whole or malformed).
size_t unfinished_utf8(const std::string& text, size_t end) {
  // A character is at most 4 bytes: look back for its lead byte.
  for (size_t back = 1; back <= std::min<size_t>(4, end); ++back) {
    const auto c = static_cast<unsigned char>(text[end - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    size_t need = 0;
    if ((c & 0xE0) == 0xC0) need = 2;
    if ((c & 0xF0) == 0xE0) need = 3;
    if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

TextStream::TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string TextStream::update(const std::string& text) {
  if (held_) return {};
  if (text.compare(0, written_.size(), written_) != 0) {
    held_ = true;  // the decoder rewrote what was shown: nothing more until finish()
    return {};
  }
  size_t end = text.size();
  for (const auto& s : stops_) {
    const size_t at = text.find(s);
    if (at != std::string::npos) {
      end = std::min(end, at);
      held_ = true;
    }
  }
  if (!held_) {
    // Hold what is not final: an unfinished character, replacement
    // characters that may become one, a tail that may begin a stop string.
    end -= unfinished_utf8(text, end);
    while (end >= kReplacementCharacter.size() &&
           std::string_view(text).substr(end - kReplacementCharacter.size(),
                                         kReplacementCharacter.size()) == kReplacementCharacter) {
      end -= kReplacementCharacter.size();
    }
    // The longest tail that a stop string begins with (each stop's longest
    // covers every later start it could have).
    size_t hold = 0;
    for (const auto& s : stops_) {
      for (size_t k = std::min(s.size() - 1, end); k > hold; --k) {
        if (text.compare(end - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
    end -= hold;
  }
  if (end <= written_.size()) return {};
  std::string piece = text.substr(written_.size(), end - written_.size());
  written_ += piece;
  return piece;
}

std::string TextStream::finish(const std::string& final_text) {
  held_ = true;
  const size_t shown = std::min(written_.size(), final_text.size());
  std::string rest = final_text.substr(shown);
  written_ = final_text;
  return rest;
}

}  // namespace triad::data
