// The row-major -> column-major mapping behind the CUDA GEMM (host logic,
// tested in every build).
#include "src/backend/cuda/gemm_plan.h"

#include <gtest/gtest.h>

#include "triad/core/error.h"

namespace triad::detail {
namespace {

TEST(GemmPlan, PlainProductSwapsOperandsForColumnMajor) {
  // c (3, 5) = a (3, 4) b (4, 5)
  const GemmPlan p = plan_gemm({3, 4}, {4, 5}, {3, 5}, false, false);
  EXPECT_EQ(p.m, 5);
  EXPECT_EQ(p.n, 3);
  EXPECT_EQ(p.k, 4);
  EXPECT_EQ(p.batch, 1);
  // First operand is b viewed column-major: 5 x 4, ld 5, no transpose.
  EXPECT_EQ(p.first.rows, 5);
  EXPECT_EQ(p.first.cols, 4);
  EXPECT_EQ(p.first.ld, 5);
  EXPECT_FALSE(p.first.transpose);
  // Second is a: 4 x 3, ld 4.
  EXPECT_EQ(p.second.rows, 4);
  EXPECT_EQ(p.second.cols, 3);
  EXPECT_EQ(p.second.ld, 4);
  EXPECT_FALSE(p.second.transpose);
  EXPECT_EQ(p.out.rows, 5);
  EXPECT_EQ(p.out.cols, 3);
  EXPECT_EQ(p.out.ld, 5);
}

TEST(GemmPlan, LinearForwardFoldsTheBatchIntoRows) {
  // y (2, 7, 6) = x (2, 7, 4) W^T with W (6, 4): one GEMM of 14 rows.
  const GemmPlan p = plan_gemm({2, 7, 4}, {6, 4}, {2, 7, 6}, false, true);
  EXPECT_TRUE(p.folded);
  EXPECT_EQ(p.batch, 1);
  EXPECT_EQ(p.m, 6);
  EXPECT_EQ(p.n, 14);
  EXPECT_EQ(p.k, 4);
  EXPECT_TRUE(p.first.transpose);
  EXPECT_EQ(p.first.rows, 4);  // W stored (6, 4) row-major = 4 x 6 column-major
  EXPECT_EQ(p.first.cols, 6);
  EXPECT_EQ(p.first.ld, 4);
  EXPECT_EQ(p.second.cols, 14);
  EXPECT_EQ(p.second.batch_stride, 0);
}

TEST(GemmPlan, WeightGradientTransposesTheLeftOperand) {
  // dW (6, 4) = dy^T (6, 14) x (14, 4), dy stored (14, 6).
  const GemmPlan p = plan_gemm({14, 6}, {14, 4}, {6, 4}, true, false);
  EXPECT_FALSE(p.folded);
  EXPECT_EQ(p.m, 4);
  EXPECT_EQ(p.n, 6);
  EXPECT_EQ(p.k, 14);
  EXPECT_TRUE(p.second.transpose);
  EXPECT_EQ(p.second.rows, 6);
  EXPECT_EQ(p.second.cols, 14);
  EXPECT_EQ(p.second.ld, 6);
}

TEST(GemmPlan, BatchedOperandsKeepTheirStrides) {
  const GemmPlan p = plan_gemm({3, 2, 5}, {3, 5, 4}, {3, 2, 4}, false, false);
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.second.batch_stride, 10);
  EXPECT_EQ(p.first.batch_stride, 20);
  EXPECT_EQ(p.out.batch_stride, 8);
  // A shared left operand cannot fold: its batch stride is 0.
  const GemmPlan q = plan_gemm({2, 5}, {3, 5, 4}, {3, 2, 4}, false, false);
  EXPECT_EQ(q.batch, 3);
  EXPECT_EQ(q.second.batch_stride, 0);
  EXPECT_FALSE(q.folded);
}

TEST(GemmPlan, MismatchedShapesNameTheProblem) {
  try {
    plan_gemm({3, 4}, {5, 6}, {3, 6}, false, false);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("K = 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan_gemm({2, 3, 4}, {4, 5}, {3, 5}, false, false), ShapeError);
  EXPECT_THROW(plan_gemm({2, 3, 4}, {3, 4, 5}, {2, 3, 5}, false, false), ShapeError);
  EXPECT_THROW(plan_gemm({4}, {4, 5}, {1, 5}, false, false), ShapeError);
}

}  // namespace
}  // namespace triad::detail
