#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "triad/core/error.h"

namespace triad::testing {

// Runs f, which must throw a triad::Error (of the kind E, when given) whose
// message holds every one of `fragments`.
template <class E = Error, class F>
void expect_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    FAIL() << "expected an error with '" << fragments.front() << "'";
  } catch (const E& e) {
    for (const auto& s : fragments) {
      EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
    }
  }
}

}  // namespace triad::testing
