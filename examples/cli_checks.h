#pragma once

// Option checks shared by the example programs. (CLI11's PositiveNumber
// names a range of doubles in its error; these name the rule.)

#include <CLI/CLI.hpp>
#include <exception>
#include <string>

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

}  // namespace triad::examples
