#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "triad/autograd/engine.h"
#include "triad/core/error.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"

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

// One backward of `m`'s loss on a fixed batch (2 x 4 tokens below 10):
// every parameter gets a gradient, and none is all zeros.
inline void expect_every_parameter_gets_a_gradient(const nn::Gpt& m) {
  const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 9, 7, 3}, {2, 4});
  const Tensor targets = from_vector(std::vector<int64_t>{2, 3, 4, 5, 9, 7, 3, 1}, {2, 4});
  autograd::backward({m.loss(ids, targets)});
  for (const auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    double squares = 0;
    for (double g : to_double_vector(p.grad())) squares += g * g;
    EXPECT_GT(squares, 0.0) << name;
  }
}

}  // namespace triad::testing
