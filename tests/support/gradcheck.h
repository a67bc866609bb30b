#pragma once

// Finite-difference gradient check shared by the op harness and layer tests.
#include <gtest/gtest.h>
#include <cstdint>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "triad/autograd/engine.h"
#include "triad/autograd/grad_mode.h"
#include "triad/ops.h"

namespace triad::testing {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Checks d(sum(f(x) * w))/dx against central differences for every element
// of every floating input, with a random weighting w. Inputs must be f64 CPU
// leaves; they are marked requires_grad here.
inline void expect_gradients_match(const Fn& f, std::vector<Tensor> inputs, double eps = 1e-6,
                                   double rtol = 1e-5, double atol = 1e-7) {
  for (auto& x : inputs) {
    if (is_floating(x.dtype())) x.set_requires_grad(true);
  }
  Tensor out = f(inputs);
  Tensor w = randn(out.shape(), 1234, 99, 1.0, out.dtype());
  autograd::backward({out}, {w});

  auto objective = [&]() {
    autograd::NoGradGuard ng;
    Tensor o = f(inputs);
    auto ov = to_double_vector(o);
    auto wv = to_double_vector(w);
    double s = 0;
    for (size_t i = 0; i < ov.size(); ++i) s += ov[i] * wv[i];
    return s;
  };
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    if (!is_floating(x.dtype())) continue;
    ASSERT_TRUE(x.grad().defined()) << "input " << k << " got no gradient";
    auto analytic = to_double_vector(x.grad());
    double* data = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double saved = data[i];
      data[i] = saved + eps;
      const double up = objective();
      data[i] = saved - eps;
      const double down = objective();
      data[i] = saved;
      const double numeric = (up - down) / (2 * eps);
      EXPECT_NEAR(analytic[i], numeric, atol + rtol * std::abs(numeric))
          << "input " << k << " element " << i;
    }
  }
}

}  // namespace triad::testing
