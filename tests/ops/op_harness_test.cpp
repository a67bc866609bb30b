// The table-driven op harness: every op x dtype against the f64 CPU reference,
// plus a finite-difference gradient check in f64. Adding an op: append an
// OpCase to op_cases() in tests/ops/op_cases.h (docs/adding_an_op.md); the
// CUDA conformance suite runs the same table.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/op_cases.h"
#include "support/gradcheck.h"
#include "triad/core/allocator.h"
#include "triad/ops.h"

namespace triad {
namespace {

using testing::op_cases;
using testing::OpCase;

class OpHarness : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpHarness, GradientMatchesFiniteDifferencesF64) {
  const OpCase& c = GetParam();
  if (!c.differentiable) GTEST_SKIP() << c.name << " has no gradient";
  testing::expect_gradients_match(c.fn, c.inputs(DType::F64));
}

TEST_P(OpHarness, F32ForwardAndBackwardMatchF64Reference) {
  const OpCase& c = GetParam();
  auto run = [&](DType d, std::vector<double>& out, std::vector<std::vector<double>>& grads) {
    auto in = c.inputs(d);
    for (auto& x : in) x.set_requires_grad(true);
    Tensor y = c.fn(in);
    out = to_double_vector(y);
    autograd::backward({y}, {randn(y.shape(), 3, 3, 1.0, d)});
    for (auto& x : in) grads.push_back(to_double_vector(x.grad()));
  };
  std::vector<double> ref, got;
  std::vector<std::vector<double>> gref, ggot;
  run(DType::F64, ref, gref);
  run(DType::F32, got, ggot);
  ASSERT_EQ(ref.size(), got.size());
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(got[i], ref[i], 1e-5 + 1e-5 * std::abs(ref[i]));
  for (size_t k = 0; k < gref.size(); ++k) {
    for (size_t i = 0; i < gref[k].size(); ++i) {
      EXPECT_NEAR(ggot[k][i], gref[k][i], 1e-5 + 1e-4 * std::abs(gref[k][i])) << "input " << k;
    }
  }
}

// bf16 and f16 run through the same kernels widened to f32 (one rounding of
// each output): forward and backward near the f64 reference computed from
// the same half-rounded inputs, at the tolerance each format deserves.
TEST_P(OpHarness, HalfPrecisionNearF64Reference) {
  const OpCase& c = GetParam();
  for (DType half : {DType::BF16, DType::F16}) {
    const double tol = half == DType::BF16 ? 3e-2 : 4e-3;
    auto run = [&](bool reference, std::vector<double>& out,
                   std::vector<std::vector<double>>& grads) {
      auto in = c.inputs(half);  // half-rounded values
      if (reference) {
        for (auto& x : in) x = is_floating(x.dtype()) ? cast(x, DType::F64).detach() : x;
      }
      for (auto& x : in) {
        if (is_floating(x.dtype())) x.set_requires_grad(true);
      }
      Tensor y = c.fn(in);
      out = to_double_vector(y);
      Tensor g = cast(randn(y.shape(), 3, 3, 1.0, half), reference ? DType::F64 : half).detach();
      autograd::backward({y}, {g});
      for (auto& x : in) {
        if (is_floating(x.dtype())) grads.push_back(to_double_vector(x.grad()));
      }
    };
    std::vector<double> ref, got;
    std::vector<std::vector<double>> gref, ggot;
    run(true, ref, gref);
    run(false, got, ggot);
    ASSERT_EQ(ref.size(), got.size());
    double scale = 0;
    for (double r : ref) scale = std::max(scale, std::abs(r));
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_NEAR(got[i], ref[i], tol * (1 + scale)) << dtype_name(half) << " output " << i;
    }
    for (size_t k = 0; k < gref.size(); ++k) {
      double gs = 0;
      for (double r : gref[k]) gs = std::max(gs, std::abs(r));
      for (size_t i = 0; i < gref[k].size(); ++i) {
        ASSERT_NEAR(ggot[k][i], gref[k][i], 2 * tol * (1 + gs))
            << dtype_name(half) << " input " << k << " grad " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpHarness, ::testing::ValuesIn(op_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           std::string n = info.param.name;
                           for (auto& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace triad

namespace triad {
namespace {

// Targets are checked once, in the front end, for every backend.
TEST(CrossEntropy, ATargetOutsideTheVocabularyIsNamed) {
  Tensor logits = randn({2, 7}, 1, 1);
  try {
    cross_entropy(logits, from_vector(std::vector<int64_t>{3, 7}, {2}, DType::I64));
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("target 7 at row 1 is outside [0, 7)"), std::string::npos)
        << e.what();
  }
  // The ignore index is not a target.
  EXPECT_NO_THROW(
      cross_entropy(logits, from_vector(std::vector<int64_t>{-100, 6}, {2}, DType::I64)));
}

// Squared ReLU keeps its input alone for backward (as PyTorch's relu and
// pow keep one tensor between them): after the forward only its output is
// new, where a clamp and a product recorded apart would hold the clamp's
// output too.
TEST(Relu2, KeepsItsInputAloneForBackward) {
  Tensor x = randn({64, 96}, 3, 1);
  x.set_requires_grad(true);
  Allocator& host = cpu_allocator();
  const int64_t before = host.stats().allocated;
  Tensor y = relu2(x);
  EXPECT_EQ(host.stats().allocated - before, y.numel() * 4);
  Tensor r = clamp(x, 0.0, 1e30);
  Tensor apart = mul(r, r);
  r = Tensor();
  EXPECT_EQ(host.stats().allocated - before, 3 * y.numel() * 4);  // y, the product, the clamp's
  EXPECT_EQ(to_double_vector(apart), to_double_vector(y));
}

}  // namespace
}  // namespace triad
