#pragma once

// Integers read from JSON that Triad did not write. nlohmann's
// get<int64_t>() takes a float as well, truncating it (3.7 reads as 3) and
// with undefined behaviour past int64's range (1e300), and an unsigned
// number past INT64_MAX wraps to a negative one; these read only what the
// file holds exactly.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "triad/core/error.h"

namespace triad::io {

// The integer `v` holds, or nullopt (a float, a number past int64, not a
// number at all).
template <class Json>
std::optional<int64_t> json_integer(const Json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.template get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.template get<int64_t>();
  return std::nullopt;
}

// The same, or an `Err` saying "WHAT is V, expected an integer".
template <class Err = ValueError, class Json>
int64_t json_int(const Json& v, const std::string& what) {
  const std::optional<int64_t> i = json_integer(v);
  if (!i) throw Err(what + " is " + v.dump() + ", expected an integer");
  return *i;
}

// A list of such integers.
template <class Err = ValueError, class Json>
std::vector<int64_t> json_ints(const Json& v, const std::string& what) {
  if (!v.is_array()) throw Err(what + " is " + v.dump() + ", expected a list of integers");
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(json_int<Err>(v[i], what + "[" + std::to_string(i) + "]"));
  return out;
}

}  // namespace triad::io
