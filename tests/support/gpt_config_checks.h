#pragma once

#include <gtest/gtest.h>

#include <string>

#include "triad/core/error.h"
#include "triad/nn/gpt.h"

namespace triad::testing {

// Expects cfg.validate() to throw a ConfigError whose message holds
// `fragment`.
inline void expect_invalid(const nn::GptConfig& cfg, const std::string& fragment) {
  try {
    cfg.validate();
    ADD_FAILURE() << "expected ConfigError with '" << fragment << "'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

}  // namespace triad::testing
