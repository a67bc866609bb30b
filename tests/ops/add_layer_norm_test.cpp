// add_layer_norm: the residual add fused with the LayerNorm after it gives
// the unfused pair's values and gradients bit for bit on the CPU (whose
// backend composes the same calls), whether the sum is used downstream or
// not, and names itself in errors. The op table checks its gradients against
// central differences, and the GPU suite the fused kernels against the CPU.
#include <gtest/gtest.h>

#include "triad/autograd/engine.h"
#include "triad/ops.h"

namespace triad {
namespace {

struct Outcome {
  std::vector<std::vector<double>> values, grads;
};

Outcome run_pair(DType dtype, bool fused, bool sum_used) {
  Tensor x = randn({3, 4, 10}, 8, 1, 1.0, dtype), r = randn({3, 4, 10}, 8, 2, 1.0, dtype);
  Tensor w = randn({10}, 8, 3, 1.0, dtype), b = randn({10}, 8, 4, 1.0, dtype);
  for (Tensor* t : {&x, &r, &w, &b}) t->set_requires_grad(true);
  Tensor h, y;
  if (fused) {
    AddLayerNorm o = add_layer_norm(x, r, w, b, 1e-5);
    h = o.sum, y = o.norm;
  } else {
    h = add(x, r);
    y = layer_norm(h, w, b, 1e-5);
  }
  // Downstream: the norm always, the sum (the residual stream) when asked.
  Tensor g = randn(y.shape(), 8, 5, 1.0, dtype);
  Tensor loss = sum(mul(y, g));
  if (sum_used) loss = add(loss, sum(mul(h, randn(h.shape(), 8, 6, 1.0, dtype))));
  autograd::backward({loss});
  Outcome o{{to_double_vector(h), to_double_vector(y)}, {}};
  for (Tensor* t : {&x, &r, &w, &b}) o.grads.push_back(to_double_vector(t->grad()));
  return o;
}

TEST(AddLayerNorm, EqualsAddThenLayerNormBitForBit) {
  for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    for (bool sum_used : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (sum_used ? " sum used" : " sum unused"));
      const Outcome fused = run_pair(dtype, true, sum_used);
      const Outcome plain = run_pair(dtype, false, sum_used);
      EXPECT_EQ(fused.values, plain.values);
      ASSERT_EQ(fused.grads.size(), plain.grads.size());
      for (size_t i = 0; i < fused.grads.size(); ++i)
        EXPECT_EQ(fused.grads[i], plain.grads[i]) << "gradient " << i;
    }
  }
}

TEST(AddLayerNorm, NamesItselfAndTheMismatch) {
  Tensor x = randn({2, 6}, 9, 1), w = randn({6}, 9, 2), b = randn({6}, 9, 3);
  try {
    add_layer_norm(x, randn({3, 6}, 9, 4), w, b);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("add_layer_norm: residual [3, 6]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(add_layer_norm(x, x, randn({5}, 9, 5), b), ShapeError);
  EXPECT_THROW(add_layer_norm(x, x, w, b, 0.0), ValueError);
}

}  // namespace
}  // namespace triad
