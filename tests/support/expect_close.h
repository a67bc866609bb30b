#pragma once

// Element by element, |got - want| <= atol + rtol * |want|, the first
// element out of bounds named with `what` (ASSERT: the test stops there).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace triad::testing {

inline void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                         double atol, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << "[" << i << "]";
  }
}

}  // namespace triad::testing
