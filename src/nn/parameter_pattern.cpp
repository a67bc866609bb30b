#include "triad/nn/parameter_pattern.h"

#include <cctype>
#include <optional>

#include "triad/core/error.h"

namespace triad::nn {

namespace {
bool is_ascii_digit(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}

// The integer `s` spells (digits only, not empty), or -1 when it is not one
// or does not fit.
int64_t whole_number(const std::string& s) {
  if (s.empty() || s.size() > 18) return -1;
  int64_t v = 0;
  for (char c : s) {
    if (!is_ascii_digit(c)) return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}
}  // namespace

ParameterPattern::ParameterPattern(std::string text) : text_(std::move(text)) {
  const auto bad = [&](const std::string& why) {
    return ValueError("parameter pattern '" + text_ + "': " + why);
  };
  if (text_.empty()) throw bad("is empty");
  for (size_t i = 0; i < text_.size();) {
    const char c = text_[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      throw bad(
          "holds whitespace (parameter names have none; give each pattern as its own "
          "list entry)");
    }
    if (c == '*') {
      if (pieces_.empty() || pieces_.back().kind != Piece::Kind::Star) {
        pieces_.push_back({Piece::Kind::Star, "", 0, 0});
      }
      ++i;
      continue;
    }
    if (c == '[') {
      const size_t close = text_.find(']', i);
      if (close == std::string::npos) throw bad("'[' at " + std::to_string(i) + " has no ']'");
      const std::string inside = text_.substr(i + 1, close - i - 1);
      const size_t dash = inside.find('-');
      const int64_t lo = dash == std::string::npos ? -1 : whole_number(inside.substr(0, dash));
      const int64_t hi = dash == std::string::npos ? -1 : whole_number(inside.substr(dash + 1));
      if (lo < 0 || hi < 0) {
        throw bad("'[" + inside + "]' is not a range of integers (write [lo-hi], e.g. [0-5])");
      }
      if (lo > hi) throw bad("the range [" + inside + "] is empty (lo must not exceed hi)");
      pieces_.push_back({Piece::Kind::Range, "", lo, hi});
      i = close + 1;
      continue;
    }
    if (c == ']') throw bad("']' at " + std::to_string(i) + " closes no '['");
    if (pieces_.empty() || pieces_.back().kind != Piece::Kind::Literal) {
      pieces_.push_back({Piece::Kind::Literal, "", 0, 0});
    }
    pieces_.back().literal += c;
    ++i;
  }
}

bool ParameterPattern::matches(const std::string& name) const {
  return match_from(0, name, 0);
}

bool ParameterPattern::match_from(size_t piece, const std::string& name, size_t at) const {
  if (piece == pieces_.size()) return at == name.size();
  const Piece& p = pieces_[piece];
  switch (p.kind) {
    case Piece::Kind::Literal:
      return name.compare(at, p.literal.size(), p.literal) == 0 &&
             match_from(piece + 1, name, at + p.literal.size());
    case Piece::Kind::Range: {
      // The whole run of digits is the number: "[1-2]" does not match the
      // "1" of "10".
      size_t end = at;
      while (end < name.size() && is_ascii_digit(name[end])) ++end;
      const int64_t v = whole_number(name.substr(at, end - at));
      return v >= p.lo && v <= p.hi && match_from(piece + 1, name, end);
    }
    case Piece::Kind::Star:
      for (size_t from = at; from <= name.size(); ++from) {
        if (match_from(piece + 1, name, from)) return true;
      }
      return false;
  }
  return false;
}

std::set<std::string> matching_parameters(const std::vector<std::string>& patterns,
                                          const std::vector<std::string>& names,
                                          const std::string& key) {
  std::set<std::string> out;
  for (size_t i = 0; i < patterns.size(); ++i) {
    const std::string where = key + "[" + std::to_string(i) + "]";
    std::optional<ParameterPattern> pattern;
    try {
      pattern.emplace(patterns[i]);
    } catch (const ValueError& e) {
      throw ValueError(where + ": " + e.what());
    }
    size_t found = 0;
    for (const std::string& name : names) {
      if (!pattern->matches(name)) continue;
      out.insert(name);
      ++found;
    }
    if (found == 0) {
      std::string some;
      for (size_t k = 0; k < names.size() && k < 6; ++k) some += (k ? ", " : "") + names[k];
      if (names.size() > 6) some += ", ...";
      throw ValueError(where + ": '" + patterns[i] + "' matches no parameter of this model (" +
                       std::to_string(names.size()) + " names, such as " + some + ")");
    }
  }
  return out;
}

}  // namespace triad::nn
