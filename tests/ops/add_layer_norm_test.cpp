// add_layer_norm and add_rms_norm: the residual add fused with the norm
// after it gives the unfused pair's values and gradients bit for bit on the
// CPU (whose backend composes the same calls), whether the sum is used
// downstream or not, and names itself in errors. The op table checks its gradients against
// central differences, and the GPU suite the fused kernels against the CPU.
#include <gtest/gtest.h>

#include <cmath>

#include "triad/autograd/engine.h"
#include "triad/ops.h"

namespace triad {
namespace {

struct Outcome {
  std::vector<std::vector<double>> values, grads;
};

Outcome run_pair(DType dtype, bool fused, bool sum_used, bool rms = false) {
  Tensor x = randn({3, 4, 10}, 8, 1, 1.0, dtype), r = randn({3, 4, 10}, 8, 2, 1.0, dtype);
  Tensor w = randn({10}, 8, 3, 1.0, dtype), b = randn({10}, 8, 4, 1.0, dtype);
  for (Tensor* t : {&x, &r, &w, &b}) t->set_requires_grad(true);
  Tensor h, y;
  if (fused) {
    AddNorm o = rms ? add_rms_norm(x, r, w, 1e-5) : add_layer_norm(x, r, w, b, 1e-5);
    h = o.sum, y = o.norm;
  } else {
    h = add(x, r);
    y = rms ? rms_norm(h, w, 1e-5) : layer_norm(h, w, b, 1e-5);
  }
  // Downstream: the norm always, the sum (the residual stream) when asked.
  Tensor g = randn(y.shape(), 8, 5, 1.0, dtype);
  Tensor loss = sum(mul(y, g));
  if (sum_used) loss = add(loss, sum(mul(h, randn(h.shape(), 8, 6, 1.0, dtype))));
  autograd::backward({loss});
  Outcome o{{to_double_vector(h), to_double_vector(y)}, {}};
  for (Tensor* t : {&x, &r, &w}) o.grads.push_back(to_double_vector(t->grad()));
  if (!rms) o.grads.push_back(to_double_vector(b.grad()));
  return o;
}

void expect_fused_equals_plain(bool rms) {
  for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    for (bool sum_used : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (sum_used ? " sum used" : " sum unused"));
      const Outcome fused = run_pair(dtype, true, sum_used, rms);
      const Outcome plain = run_pair(dtype, false, sum_used, rms);
      EXPECT_EQ(fused.values, plain.values);
      ASSERT_EQ(fused.grads.size(), plain.grads.size());
      for (size_t i = 0; i < fused.grads.size(); ++i)
        EXPECT_EQ(fused.grads[i], plain.grads[i]) << "gradient " << i;
    }
  }
}

TEST(AddLayerNorm, EqualsAddThenLayerNormBitForBit) {
  expect_fused_equals_plain(false);
}

TEST(AddRmsNorm, EqualsAddThenRmsNormBitForBit) {
  expect_fused_equals_plain(true);
}

// Half-precision LayerNorm and RMSNorm parameters and embedding tables take
// f32 gradients summed straight into .grad: over two micro-batches they
// equal the f64 computation on the same (bf16-representable) values to f32
// precision, where a gradient rounded to bf16 first would be ~2^-9 off.
TEST(ParameterGradients, HalfLayerNormAndEmbeddingGradientsAreF32Sums) {
  for (int variant = 0; variant < 4; ++variant) {
    const bool fused = variant % 2 == 1, rms = variant >= 2;
    SCOPED_TRACE(std::string(fused ? "add_" : "") + (rms ? "rms_norm" : "layer_norm"));
    std::vector<Tensor> half{randn({16}, 21, 1, 1.0, DType::BF16),
                             randn({16}, 21, 2, 1.0, DType::BF16)};
    std::vector<Tensor> wide{cast(half[0], DType::F64), cast(half[1], DType::F64)};
    for (Tensor* t : {&half[0], &half[1], &wide[0], &wide[1]}) t->set_requires_grad(true);
    for (uint64_t micro = 0; micro < 2; ++micro) {
      const Tensor x = randn({40, 16}, 22, micro, 1.0, DType::BF16);
      // (A zero residual keeps the sum exact in bf16, as in f64.)
      const Tensor r = zeros({40, 16}, DType::BF16);
      const Tensor dy = randn({40, 16}, 24, micro, 1.0, DType::BF16);
      for (bool f64 : {false, true}) {
        const auto& p = f64 ? wide : half;
        const DType d = f64 ? DType::F64 : DType::BF16;
        Tensor y;
        if (rms) {
          y = fused ? add_rms_norm(cast(x, d), cast(r, d), p[0]).norm : rms_norm(cast(x, d), p[0]);
        } else {
          y = fused ? add_layer_norm(cast(x, d), cast(r, d), p[0], p[1]).norm
                    : layer_norm(cast(x, d), p[0], p[1]);
        }
        autograd::backward({y}, {cast(dy, d)});
      }
    }
    for (int i = 0; i < (rms ? 1 : 2); ++i) {
      ASSERT_EQ(half[i].grad().dtype(), DType::F32);
      const auto got = to_double_vector(half[i].grad()), want = to_double_vector(wide[i].grad());
      for (size_t k = 0; k < want.size(); ++k)
        ASSERT_NEAR(got[k], want[k], 1e-5 * (1 + std::abs(want[k]))) << i << " element " << k;
    }
  }
  // The embedding table: a tied weight, used by the lookup and the head.
  Tensor table = randn({30, 8}, 25, 1, 1.0, DType::BF16);
  Tensor table64 = cast(table, DType::F64);
  table.set_requires_grad(true);
  table64.set_requires_grad(true);
  for (uint64_t micro = 0; micro < 2; ++micro) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 50; ++i) ids.push_back((i * 7 + static_cast<int>(micro)) % 23);
    const Tensor idt = from_vector(ids, {50});
    const Tensor de = randn({50, 8}, 26, micro, 1.0, DType::BF16);
    const Tensor x = randn({50, 8}, 27, micro, 1.0, DType::BF16);
    const Tensor dy = randn({50, 30}, 28, micro, 1.0, DType::BF16);
    for (Tensor* t : {&table, &table64}) {
      const DType d = t->dtype();
      autograd::backward({embedding(*t, idt), linear(cast(x, d), *t)}, {cast(de, d), cast(dy, d)});
    }
  }
  ASSERT_EQ(table.grad().dtype(), DType::F32);
  const auto got = to_double_vector(table.grad()), want = to_double_vector(table64.grad());
  for (size_t k = 0; k < want.size(); ++k)
    ASSERT_NEAR(got[k], want[k], 1e-5 * (1 + std::abs(want[k]))) << "table element " << k;
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

TEST(AddRmsNorm, NamesItselfAndTheMismatch) {
  Tensor x = randn({2, 6}, 9, 1), w = randn({6}, 9, 2);
  try {
    add_rms_norm(x, randn({2, 7}, 9, 4), w);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("add_rms_norm: residual [2, 7]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(add_rms_norm(x, x, randn({5}, 9, 5)), ShapeError);
  EXPECT_THROW(add_rms_norm(x, x, w, -1.0), ValueError);
  EXPECT_THROW(add_rms_norm(x, cast(x, DType::BF16), w), Error);
}

}  // namespace
}  // namespace triad
