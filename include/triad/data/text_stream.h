#pragma once

#include <string>
#include <vector>

namespace triad::data {

// Shows a reply while it is being generated, never writing what a later
// token could still change. Given the reply's whole text after each token,
// update() returns the bytes that may be written now: everything new except
// a tail that is not final yet, which is
//   - an unfinished UTF-8 character (a byte-level token can end mid-way)
//     or trailing U+FFFD (how some decoders show such bytes until the rest
//     arrives), and
//   - the longest tail that could be the start of a stop string (a stop
//     string is never shown, nor anything after it).
// Once a stop string appears, nothing more is written until finish(), which
// takes the reply's final text (cut before its first stop string, the stop
// token left out) and returns the rest: what update() wrote plus what
// finish() returns is that final text, whenever the texts given only grew
// at the end (the tokenizers' decoding of a longer output keeps the shorter
// one's text). A text that rewrote what was already written is held until
// finish(), which then returns only its part after the written bytes.
class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops = {});
  std::string update(const std::string& text);
  std::string finish(const std::string& final_text);
  // The bytes written so far.
  const std::string& written() const { return written_; }

 private:
  std::vector<std::string> stops_;
  std::string written_;
  bool held_ = false;  // a stop string appeared, or the text changed what was written
};

}  // namespace triad::data
