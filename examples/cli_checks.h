#pragma once

// Option checks shared by the example programs (CLI11's PositiveNumber
// names a range of doubles in its error; these name the rule), and how
// they report errors.

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <exception>
#include <string>

#include "triad/core/error.h"

namespace triad::examples {

// A whole number >= 1: "--gpus: expected an integer >= 1, got '0'".
inline CLI::Validator at_least_one() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        size_t used = 0;
        try {
          if (std::stoll(value, &used) >= 1 && used == value.size()) return "";
        } catch (const std::exception&) {
        }
        return "expected an integer >= 1, got '" + value + "'";
      },
      "INT >= 1");
}

// A whole number from 0 to 2^64 - 1, digits only, for unsigned options such
// as seeds (CLI11 would take "-1" as 2^64 - 1).
inline CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        bool digits = !value.empty();
        for (char ch : value) digits = digits && std::isdigit(static_cast<unsigned char>(ch));
        if (digits) {
          try {
            std::stoull(value);
            return "";
          } catch (const std::exception&) {
          }
        }
        return "expected an integer from 0 to 18446744073709551615, got '" + value + "'";
      },
      "UINT");
}

// A tool's work after its options parse: its exit code, or 2 with the error
// logged, Triad's (bad input, config, files: the message says what to fix)
// or the system's (memory, files).
template <class Body>
int report_errors(Body&& body) {
  try {
    return body();
  } catch (const triad::Error& e) {
    spdlog::error("{}", e.what());
  } catch (const std::exception& e) {
    spdlog::error("unexpected error: {}", e.what());
  }
  return 2;
}

}  // namespace triad::examples
