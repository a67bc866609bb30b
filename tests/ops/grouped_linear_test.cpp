// grouped_linear: a mixture's experts' products over their rows as they lie
// give what splitting the rows, one linear each and a concat give, bit for
// bit on the CPU (its backend makes the same calls on the same rows); the
// weights' gradients defer as linear's (zero-bubble W); a group of no rows
// gives its weight a zero gradient; bad shapes are refused naming them. So
// with the groups given as offsets where the rows are.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "triad/autograd/engine.h"
#include "triad/ops.h"

namespace triad {
namespace {

struct GroupedOutcome {
  std::vector<double> y;
  std::vector<std::vector<double>> grads;  // x's, then each weight's (none: empty)
};

// x (9, 6) and three weights (7, 6) of `dtype`, leaves that require grad;
// forward(x, weights), backward from a random seed (the weights' gradients
// deferred, then flushed, when `defer`), and every leaf's gradient.
GroupedOutcome run_grouped(
    DType dtype, bool defer,
    const std::function<Tensor(const Tensor&, const std::vector<Tensor>&)>& forward) {
  Tensor x = randn({9, 6}, 3, 1, 1.0, dtype);
  std::vector<Tensor> w;
  for (uint64_t e = 0; e < 3; ++e) w.push_back(randn({7, 6}, 3, 10 + e, 0.5, dtype));
  x.set_requires_grad(true);
  for (Tensor& t : w) t.set_requires_grad(true);
  const Tensor y = forward(x, w);
  autograd::WeightGradStore store;
  autograd::BackwardOptions opts;
  if (defer) opts.defer_weight_grads = &store;
  autograd::backward({y}, {randn(y.shape(), 3, 99, 1.0, dtype)}, opts);
  if (defer) {
    EXPECT_TRUE(x.grad().defined());
    for (const Tensor& t : w) EXPECT_FALSE(t.grad().defined());
    EXPECT_FALSE(store.empty());
    store.flush();
  }
  GroupedOutcome r{to_double_vector(y), {to_double_vector(x.grad())}};
  for (const Tensor& t : w)
    r.grads.push_back(t.grad().defined() ? to_double_vector(t.grad()) : std::vector<double>{});
  return r;
}

TEST(GroupedLinear, EqualsSplitLinearsAndConcatBitForBit) {
  const std::vector<int64_t> rows{4, 2, 3};
  auto plain = [&](const Tensor& x, const std::vector<Tensor>& w) {
    std::vector<Tensor> parts = split(x, rows, 0);
    for (size_t e = 0; e < parts.size(); ++e) parts[e] = linear(parts[e], w[e]);
    return concat(parts, 0);
  };
  auto grouped = [&](const Tensor& x, const std::vector<Tensor>& w) {
    return grouped_linear(x, w, rows);
  };
  for (DType dtype : {DType::F64, DType::F32, DType::BF16}) {
    for (bool defer : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (defer ? " deferred" : ""));
      const GroupedOutcome want = run_grouped(dtype, false, plain),
                           got = run_grouped(dtype, defer, grouped);
      EXPECT_EQ(got.y, want.y);
      ASSERT_EQ(got.grads.size(), want.grads.size());
      for (size_t i = 0; i < got.grads.size(); ++i)
        EXPECT_EQ(got.grads[i], want.grads[i]) << "gradient " << i;
    }
  }
}

// An expert no row reached: its output rows are none, and its weight's
// gradient is zero (a data-parallel reducer counts on every expert having
// one), deferred or not; the other groups are as without it.
TEST(GroupedLinear, AGroupOfNoRowsGivesItsWeightAZeroGradient) {
  for (bool defer : {false, true}) {
    SCOPED_TRACE(defer ? "deferred" : "now");
    const GroupedOutcome with_empty =
        run_grouped(DType::F64, defer, [](const Tensor& x, const auto& w) {
          return grouped_linear(x, w, {4, 0, 5});
        });
    const GroupedOutcome two = run_grouped(DType::F64, false, [](const Tensor& x, const auto& w) {
      return grouped_linear(x, {w[0], w[2]}, {4, 5});
    });
    EXPECT_EQ(with_empty.y, two.y);
    EXPECT_EQ(with_empty.grads[0], two.grads[0]);
    EXPECT_EQ(with_empty.grads[1], two.grads[1]);
    EXPECT_EQ(with_empty.grads[2], std::vector<double>(42, 0.0));
    EXPECT_EQ(with_empty.grads[3], two.grads[3]);
  }
}

TEST(GroupedLinear, RefusesShapesThatDoNotGroup) {
  const Tensor x = randn({9, 6}, 3, 1), w = randn({7, 6}, 3, 2);
  testing::expect_error<ShapeError>(
      [&] {
        (void)grouped_linear(x, {w, w}, {4, 4});
      },
      {"x [9, 6] for 8 rows of weights [7, 6]"});
  testing::expect_error<ShapeError>(
      [&] {
        (void)grouped_linear(x, {w, w}, {9});
      },
      {"2 weights and 1 row counts"});
  testing::expect_error<ShapeError>(
      [&] {
        (void)grouped_linear(x, {w, randn({7, 5}, 3, 3)}, {4, 5});
      },
      {"weights [7, 6] and [7, 5] (expected one shape)"});
  testing::expect_error<ShapeError>(
      [&] {
        (void)grouped_linear(x, {w, w}, {10, -1});
      },
      {"a row count of -1"});
  testing::expect_error<ShapeError>(
      [&] {
        (void)grouped_linear(randn({9, 5}, 3, 4), {w}, {9});
      },
      {"x [9, 5] for 9 rows", "(expected (9, 6))"});
}

// Offsets as an i64 tensor (where a dropless mixture's routing leaves
// them, on the device).
Tensor offsets_of(const std::vector<int64_t>& at) {
  std::vector<double> v(at.begin(), at.end());
  return from_vector(v, {static_cast<int64_t>(at.size())}, DType::I64);
}

// With the groups given as offsets (a tensor the host need not read), the
// same values and gradients as with row counts: bit for bit on the CPU,
// deferred or not, a group of no rows included (its weight's gradient
// zero).
TEST(GroupedLinear, OffsetsGiveWhatRowCountsGive) {
  for (const std::vector<int64_t>& rows :
       std::vector<std::vector<int64_t>>{{4, 2, 3}, {4, 0, 5}, {0, 9, 0}}) {
    std::vector<int64_t> at{0};
    for (const int64_t r : rows) at.push_back(at.back() + r);
    for (DType dtype : {DType::F64, DType::F32, DType::BF16}) {
      for (bool defer : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (defer ? " deferred" : "") + " rows " +
                     std::to_string(rows[0]) + "," + std::to_string(rows[1]) + "," +
                     std::to_string(rows[2]));
        const GroupedOutcome want = run_grouped(dtype, false, [&](const Tensor& x, const auto& w) {
          return grouped_linear(x, w, rows);
        });
        const GroupedOutcome got = run_grouped(dtype, defer, [&](const Tensor& x, const auto& w) {
          return grouped_linear(x, w, offsets_of(at));
        });
        EXPECT_EQ(got.y, want.y);
        ASSERT_EQ(got.grads.size(), want.grads.size());
        for (size_t i = 0; i < got.grads.size(); ++i)
          EXPECT_EQ(got.grads[i], want.grads[i]) << "gradient " << i;
      }
    }
  }
}

// Rows past the last group (tokens that chose no expert) give zeros and
// send no gradient back; the groups' rows are as without them.
TEST(GroupedLinear, RowsPastTheLastOffsetGiveZerosAndNoGradient) {
  const GroupedOutcome tail = run_grouped(DType::F64, false, [](const Tensor& x, const auto& w) {
    return grouped_linear(x, w, offsets_of({0, 3, 3, 6}));
  });
  const GroupedOutcome head = run_grouped(DType::F64, false, [](const Tensor& x, const auto& w) {
    return concat({grouped_linear(narrow(x, 0, 0, 6), w, {3, 0, 3}), zeros({3, 7}, DType::F64)}, 0);
  });
  EXPECT_EQ(tail.y, head.y);
  for (size_t i = 0; i < tail.grads.size(); ++i) EXPECT_EQ(tail.grads[i], head.grads[i]) << i;
  EXPECT_EQ(std::vector<double>(tail.y.end() - 21, tail.y.end()), std::vector<double>(21, 0.0));
  EXPECT_EQ(std::vector<double>(tail.grads[0].end() - 18, tail.grads[0].end()),
            std::vector<double>(18, 0.0));
}

TEST(GroupedLinear, RefusesOffsetsThatDoNotGroup) {
  const Tensor x = randn({9, 6}, 3, 1), w = randn({7, 6}, 3, 2);
  testing::expect_error<ShapeError>(
      [&] {
        (void)grouped_linear(x, {w, w}, offsets_of({0, 9}));
      },
      {"2 weights and i64 offsets [2]", "(expected i64 (3)"});
  testing::expect_error<ShapeError>([&] { (void)grouped_linear(x, {w}, zeros({2}, DType::F32)); },
                                    {"f32 offsets [2]"});
  testing::expect_error<ValueError>(
      [&] {
        (void)grouped_linear(x, {w, w}, offsets_of({0, 5, 4}));
      },
      {"offsets [0, 5, 4] for 9 rows", "offsets[0] <= ... <= offsets[groups] <= rows"});
  testing::expect_error<ValueError>(
      [&] {
        (void)grouped_linear(x, {w, w}, offsets_of({0, 5, 10}));
      },
      {"offsets [0, 5, 10] for 9 rows"});
  testing::expect_error<ShapeError>(
      [&] {
        (void)grouped_linear(randn({9, 5}, 3, 4), {w}, offsets_of({0, 9}));
      },
      {"x [9, 5] for weights [7, 6]", "(expected (rows, 6))"});
}

}  // namespace
}  // namespace triad
