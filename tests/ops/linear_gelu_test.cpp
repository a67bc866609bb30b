// linear_gelu: the fused linear + GELU gives the unfused pair's values and
// gradients bit for bit on the CPU (its backend composes the same calls),
// keeps linear's split backward, and names itself in errors. The op table
// (op_cases.h) checks its gradients against central differences, and the
// GPU suite the cuBLASLt epilogue against the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "triad/autograd/engine.h"
#include "triad/ops.h"

namespace triad {
namespace {

struct LinearGeluOutcome {
  std::vector<double> y;
  std::vector<std::vector<double>> grads;
};

// Runs forward() on leaves that require grad, backward with a random seed
// gradient (weight gradients deferred and then flushed when asked), and
// collects the output and every leaf's gradient.
LinearGeluOutcome run_graph(std::vector<Tensor> leaves, DType dtype, bool defer,
                            const std::function<Tensor(const std::vector<Tensor>&)>& forward) {
  for (Tensor& t : leaves) t.set_requires_grad(true);
  Tensor y = forward(leaves);
  autograd::WeightGradStore store;
  autograd::BackwardOptions opts;
  if (defer) opts.defer_weight_grads = &store;
  autograd::backward({y}, {randn(y.shape(), 4, 99, 1.0, dtype)}, opts);
  if (defer) {
    EXPECT_TRUE(leaves[0].grad().defined());
    EXPECT_FALSE(leaves[1].grad().defined());
    store.flush();
  }
  LinearGeluOutcome r{to_double_vector(y), {}};
  for (Tensor& t : leaves) r.grads.push_back(to_double_vector(t.grad()));
  return r;
}

void expect_same_gelu(const LinearGeluOutcome& fused, const LinearGeluOutcome& plain) {
  EXPECT_EQ(fused.y, plain.y);
  ASSERT_EQ(fused.grads.size(), plain.grads.size());
  for (size_t i = 0; i < fused.grads.size(); ++i)
    EXPECT_EQ(fused.grads[i], plain.grads[i]) << "gradient " << i;
}

TEST(LinearGelu, EqualsGeluOfLinearBitForBit) {
  for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (with_bias ? " bias" : " no bias"));
      // Fresh leaves for each run (their gradients accumulate).
      auto leaves = [&] {
        std::vector<Tensor> l{randn({2, 5, 6}, 4, 1, 1.0, dtype), randn({7, 6}, 4, 2, 0.5, dtype)};
        if (with_bias) l.push_back(randn({7}, 4, 3, 0.5, dtype));
        return l;
      };
      auto bias = [](const std::vector<Tensor>& p) { return p.size() > 2 ? p[2] : Tensor(); };
      const LinearGeluOutcome fused =
          run_graph(leaves(), dtype, false,
                    [&](const std::vector<Tensor>& p) { return linear_gelu(p[0], p[1], bias(p)); });
      const LinearGeluOutcome plain = run_graph(
          leaves(), dtype, false,
          [&](const std::vector<Tensor>& p) { return gelu(linear(p[0], p[1], bias(p))); });
      expect_same_gelu(fused, plain);
    }
  }
}

TEST(LinearAfterGelu, AnMlpFusedOnBothSidesEqualsTheComposedOneBitForBit) {
  for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    for (bool defer : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (defer ? " deferred W" : ""));
      // x, w2 first: the input gradient and a deferred weight gradient.
      auto leaves = [&] {
        return std::vector<Tensor>{randn({2, 3, 8}, 7, 1, 1.0, dtype),
                                   randn({8, 16}, 7, 4, 0.5, dtype),
                                   randn({16, 8}, 7, 2, 0.5, dtype), randn({16}, 7, 3, 0.5, dtype),
                                   randn({8}, 7, 5, 0.5, dtype)};
      };
      const LinearGeluOutcome fused =
          run_graph(leaves(), dtype, defer, [](const std::vector<Tensor>& p) {
            return linear_after_gelu(linear_gelu_parts(p[0], p[2], p[3]), p[1], p[4]);
          });
      const LinearGeluOutcome plain =
          run_graph(leaves(), dtype, defer, [](const std::vector<Tensor>& p) {
            return linear(gelu(linear(p[0], p[2], p[3])), p[1], p[4]);
          });
      expect_same_gelu(fused, plain);
    }
  }
}

TEST(LinearAfterGelu, NamesAMismatchedPreActivation) {
  const LinearGelu in{randn({4, 5}, 8, 1), randn({4, 6}, 8, 2)};
  try {
    linear_after_gelu(in, randn({3, 6}, 8, 3));
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("linear_after_gelu: GELU input of shape [4, 5]"),
              std::string::npos)
        << e.what();
  }
}

TEST(LinearGelu, WeightGradientsCanBeDeferred) {
  Tensor x = randn({4, 3}, 5, 1, 1.0, DType::F64), w = randn({5, 3}, 5, 2, 1.0, DType::F64);
  Tensor b = randn({5}, 5, 3, 1.0, DType::F64);
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
  autograd::WeightGradStore store;
  autograd::BackwardOptions opts;
  opts.defer_weight_grads = &store;
  autograd::backward({sum(linear_gelu(x, w, b))}, {}, opts);
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  EXPECT_EQ(store.size(), 1u);
  store.flush();
  EXPECT_TRUE(w.grad().defined());
  EXPECT_TRUE(b.grad().defined());
}

TEST(LinearGelu, NamesItselfInShapeErrors) {
  Tensor x = randn({4, 3}, 6, 1), w = randn({5, 2}, 6, 2);
  try {
    linear_gelu(x, w);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("linear_gelu: input of shape"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(linear_gelu(x, randn({5, 3}, 6, 3), randn({4}, 6, 4)), ShapeError);
}

}  // namespace
}  // namespace triad

namespace triad {
namespace {

// gelu_erf is the exact GELU (Hugging Face's "gelu"), not the tanh
// approximation gelu() is: its values are 0.5 x (1 + erf(x / sqrt 2)) and
// its gradient Phi(x) + x phi(x), in f64 to 1e-12 and in f32 to 1e-6. The
// two forms differ by up to about 2e-4 (the check's tolerance is below it).
TEST(GeluErf, IsTheExactFormWithItsDerivative) {
  for (DType dtype : {DType::F64, DType::F32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const double tol = dtype == DType::F64 ? 1e-12 : 1e-6;
    Tensor x = randn({257}, 3, 5, 2.5, dtype);
    x.set_requires_grad(true);
    Tensor y = gelu_erf(x);
    autograd::backward({y}, {ones({257}, dtype)});
    const std::vector<double> xs = to_double_vector(x), ys = to_double_vector(y),
                              gs = to_double_vector(x.grad()),
                              approx = to_double_vector(gelu(x.detach()));
    double widest = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double v = xs[i], cdf = 0.5 * (1 + std::erf(v / std::sqrt(2.0)));
      EXPECT_NEAR(ys[i], v * cdf, tol) << "x = " << v;
      EXPECT_NEAR(gs[i], cdf + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI), tol * 4)
          << "x = " << v;
      widest = std::max(widest, std::fabs(ys[i] - approx[i]));
    }
    EXPECT_GT(widest, 1e-4);
  }
}

}  // namespace
}  // namespace triad
