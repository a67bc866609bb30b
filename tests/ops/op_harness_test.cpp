// The table-driven op harness: every op x dtype against the f64 CPU reference,
// plus a finite-difference gradient check in f64. Adding an op: append an
// OpCase to cases() (docs/adding_an_op.md).
#include <gtest/gtest.h>

#include <cmath>

#include "support/gradcheck.h"
#include "triad/ops.h"

namespace triad {
namespace {

using testing::Fn;

struct OpCase {
  std::string name;
  // Builds the op's inputs (random, never all zeros) in the given dtype.
  std::function<std::vector<Tensor>(DType)> inputs;
  Fn fn;
  bool differentiable = true;
};

Tensor rnd(const Shape& s, DType dt, uint64_t stream, double stddev = 1.0) {
  return randn(s, 7, stream, stddev, dt);
}

Tensor ids(const std::vector<int64_t>& v, const Shape& s) {
  return from_vector(v, s, DType::I64);
}

std::vector<OpCase> cases() {
  std::vector<OpCase> c;
  c.push_back({"add_broadcast",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 4}, d, 1), rnd({4}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return add(x[0], x[1]); }});
  c.push_back({"sub_broadcast",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 1, 4}, d, 1), rnd({3, 1}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return sub(x[0], x[1]); }});
  c.push_back({"mul_broadcast",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 4}, d, 1), rnd({3, 1}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return mul(x[0], x[1]); }});
  c.push_back(
      {"div",
       [](DType d) {
         return std::vector<Tensor>{rnd({3, 5}, d, 1), rand_uniform({3, 5}, 7, 3, 0.5, 2.0, d)};
       },
       [](const std::vector<Tensor>& x) { return div(x[0], x[1]); }});
  c.push_back({"affine",
               [](DType d) {
                 return std::vector<Tensor>{rnd({4, 6}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return affine(x[0], -1.5, 0.25); }});
  c.push_back({"gelu",
               [](DType d) {
                 return std::vector<Tensor>{rnd({5, 7}, d, 1, 2.0)};
               },
               [](const std::vector<Tensor>& x) { return gelu(x[0]); }});
  c.push_back({"dropout_p0.3",
               [](DType d) {
                 return std::vector<Tensor>{rnd({6, 9}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return dropout(x[0], 0.3, 11, 5, 100); }});
  c.push_back({"reshape_transpose",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 4}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 return reshape(transpose(x[0], 0, 2), {4, 6});
               }});
  c.push_back({"permute",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 4}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 return contiguous(permute(x[0], {1, 2, 0}));
               }});
  c.push_back({"narrow",
               [](DType d) {
                 return std::vector<Tensor>{rnd({5, 6}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return narrow(x[0], 1, 2, 3); }});
  c.push_back({"expand",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 1}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 return expand(x[0], {2, 3, 4});
               }});
  c.push_back({"concat",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3}, d, 1), rnd({2, 2}, d, 2)};
               },
               [](const std::vector<Tensor>& x) {
                 return concat({x[0], x[1]}, 1);
               }});
  c.push_back({"split",
               [](DType d) {
                 return std::vector<Tensor>{rnd({7, 3}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 auto parts = split(x[0], {2, 5}, 0);
                 return add(sum(parts[0], 0), sum(mul(parts[1], parts[1]), 0));
               }});
  c.push_back({"sum_dim",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 4, 5}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return sum(x[0], 1); }});
  c.push_back({"mean_keepdim",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 4, 5}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return mean(x[0], -1, true); }});
  c.push_back({"max_dim",
               [](DType d) {
                 return std::vector<Tensor>{rnd({4, 6}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return max(x[0], 1); }});
  c.push_back({"sum_all",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 4}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return sum(x[0]); }});
  c.push_back({"matmul_2d",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 4}, d, 1), rnd({4, 5}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }});
  c.push_back({"matmul_3d_2d",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 4}, d, 1), rnd({4, 5}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }});
  c.push_back({"matmul_batched",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 4}, d, 1), rnd({2, 4, 5}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }});
  c.push_back(
      {"linear_bias",
       [](DType d) {
         return std::vector<Tensor>{rnd({2, 3, 4}, d, 1), rnd({5, 4}, d, 2), rnd({5}, d, 3)};
       },
       [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); }});
  c.push_back({"linear_nobias",
               [](DType d) {
                 return std::vector<Tensor>{rnd({6, 4}, d, 1), rnd({3, 4}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return linear(x[0], x[1]); }});
  c.push_back(
      {"layer_norm",
       [](DType d) {
         return std::vector<Tensor>{rnd({2, 3, 8}, d, 1, 2.0), rnd({8}, d, 2), rnd({8}, d, 3)};
       },
       [](const std::vector<Tensor>& x) { return layer_norm(x[0], x[1], x[2]); }});
  c.push_back({"softmax",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 7}, d, 1, 2.0)};
               },
               [](const std::vector<Tensor>& x) { return softmax(x[0]); }});
  c.push_back({"causal_attention_B2_T5_C12_NH3",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 5, 36}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return causal_attention(x[0], 3); }});
  // T = 70 spans two 64-row blocks of the CPU kernel (a full and a partial one).
  c.push_back({"causal_attention_B1_T70_C6_NH2",
               [](DType d) {
                 return std::vector<Tensor>{rnd({1, 70, 18}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return causal_attention(x[0], 2); }});
  c.push_back({"embedding",
               [](DType d) {
                 return std::vector<Tensor>{rnd({6, 4}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 return embedding(x[0], ids({1, 5, 1, 0, 3}, {5}));
               }});
  c.push_back({"cross_entropy_ignore",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 7}, d, 1, 2.0)};
               },
               [](const std::vector<Tensor>& x) {
                 return cross_entropy(x[0], ids({1, 6, -100, 0, 3, 3}, {2, 3}));
               }});
  return c;
}

void PrintTo(const OpCase& c, std::ostream* os) {
  *os << c.name;
}

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

INSTANTIATE_TEST_SUITE_P(AllOps, OpHarness, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           std::string n = info.param.name;
                           for (auto& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace triad
