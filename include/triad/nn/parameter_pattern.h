#pragma once

// Parameter patterns pick parameters by their dotted names
// ("h.3.attn.c_attn.weight"). train.freeze uses them to keep chosen weights
// fixed while the rest train.
//   *       any run of characters, dots included ("h.*.attn.*", "*.bias")
//   [a-b]   one integer from a to b, its whole run of digits ("h.[0-5].*":
//           the first six blocks)
//   others  themselves
// A pattern matches a name only if it matches the whole name.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace triad::nn {

class ParameterPattern {
 public:
  // Throws ValueError naming the pattern when a range is malformed or
  // empty, or when the pattern is empty or holds whitespace.
  explicit ParameterPattern(std::string text);
  bool matches(const std::string& name) const;
  const std::string& text() const { return text_; }

 private:
  struct Piece {
    enum class Kind { Literal, Star, Range } kind = Kind::Literal;
    std::string literal;
    int64_t lo = 0, hi = 0;
  };
  bool match_from(size_t piece, const std::string& name, size_t at) const;

  std::string text_;
  std::vector<Piece> pieces_;
};

// The names among `names` that any pattern matches. Each pattern must match
// at least one name; one that matches none is a ValueError that gives `key`
// with the pattern's index ("train.freeze[2]"), the pattern, and a few of
// the names it could have matched.
std::set<std::string> matching_parameters(const std::vector<std::string>& patterns,
                                          const std::vector<std::string>& names,
                                          const std::string& key);

}  // namespace triad::nn
