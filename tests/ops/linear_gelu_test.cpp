// linear_gelu: the fused linear + GELU gives the unfused pair's values and
// gradients bit for bit on the CPU (its backend composes the same calls),
// keeps linear's split backward, and names itself in errors. The op table
// (op_cases.h) checks its gradients against central differences, and the
// GPU suite the cuBLASLt epilogue against the CPU.
#include <gtest/gtest.h>

#include "triad/autograd/engine.h"
#include "triad/ops.h"

namespace triad {
namespace {

struct Outcome {
  std::vector<double> y;
  std::vector<std::vector<double>> grads;
};

Outcome run_pair(DType dtype, bool fused, bool with_bias) {
  Tensor x = randn({2, 5, 6}, 4, 1, 1.0, dtype), w = randn({7, 6}, 4, 2, 0.5, dtype);
  Tensor b = with_bias ? randn({7}, 4, 3, 0.5, dtype) : Tensor();
  std::vector<Tensor> leaves{x, w};
  if (with_bias) leaves.push_back(b);
  for (Tensor& t : leaves) t.set_requires_grad(true);
  Tensor y = fused ? linear_gelu(x, w, b) : gelu(linear(x, w, b));
  autograd::backward({y}, {randn(y.shape(), 4, 4, 1.0, dtype)});
  Outcome r{to_double_vector(y), {}};
  for (Tensor& t : leaves) r.grads.push_back(to_double_vector(t.grad()));
  return r;
}

TEST(LinearGelu, EqualsGeluOfLinearBitForBit) {
  for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (with_bias ? " bias" : " no bias"));
      const Outcome fused = run_pair(dtype, true, with_bias);
      const Outcome plain = run_pair(dtype, false, with_bias);
      EXPECT_EQ(fused.y, plain.y);
      ASSERT_EQ(fused.grads.size(), plain.grads.size());
      for (size_t i = 0; i < fused.grads.size(); ++i) EXPECT_EQ(fused.grads[i], plain.grads[i]);
    }
  }
}

// An MLP both ways: fused on both sides of the GELU, and composed.
Outcome run_mlp(DType dtype, bool fused, bool defer) {
  Tensor x = randn({2, 3, 8}, 7, 1, 1.0, dtype), w1 = randn({16, 8}, 7, 2, 0.5, dtype);
  Tensor b1 = randn({16}, 7, 3, 0.5, dtype), w2 = randn({8, 16}, 7, 4, 0.5, dtype);
  Tensor b2 = randn({8}, 7, 5, 0.5, dtype);
  std::vector<Tensor> leaves{x, w1, b1, w2, b2};
  for (Tensor& t : leaves) t.set_requires_grad(true);
  Tensor y = fused ? linear_after_gelu(linear_gelu_parts(x, w1, b1), w2, b2)
                   : linear(gelu(linear(x, w1, b1)), w2, b2);
  autograd::WeightGradStore store;
  autograd::BackwardOptions opts;
  if (defer) opts.defer_weight_grads = &store;
  autograd::backward({y}, {randn(y.shape(), 7, 6, 1.0, dtype)}, opts);
  if (defer) {
    EXPECT_TRUE(x.grad().defined());
    EXPECT_FALSE(w2.grad().defined());
    store.flush();
  }
  Outcome r{to_double_vector(y), {}};
  for (Tensor& t : leaves) r.grads.push_back(to_double_vector(t.grad()));
  return r;
}

TEST(LinearAfterGelu, AnMlpFusedOnBothSidesEqualsTheComposedOneBitForBit) {
  for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    for (bool defer : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (defer ? " deferred W" : ""));
      const Outcome fused = run_mlp(dtype, true, defer), plain = run_mlp(dtype, false, defer);
      EXPECT_EQ(fused.y, plain.y);
      ASSERT_EQ(fused.grads.size(), plain.grads.size());
      for (size_t i = 0; i < fused.grads.size(); ++i)
        EXPECT_EQ(fused.grads[i], plain.grads[i]) << "gradient " << i;
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
