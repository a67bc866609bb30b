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

TEST(GemmPlan, RowStridedOperandsBecomeLeadingDimensions) {
  // The padded head: logits (6, 67) in rows 128 apart = x (6, 8) W^T with
  // W (67, 8); then the input gradient (6, 8) = dlogits (6, 67) W and the
  // weight gradient (67, 8) = dlogits^T x, dlogits in the logits' rows.
  const GemmPlan fwd = plan_gemm({6, 8}, {67, 8}, {6, 67}, false, true, {0, 0, 128});
  EXPECT_EQ(fwd.m, 67);
  EXPECT_EQ(fwd.out.ld, 128);
  EXPECT_EQ(fwd.first.ld, 8);
  const GemmPlan dx = plan_gemm({6, 67}, {67, 8}, {6, 8}, false, false, {128, 0, 0});
  EXPECT_EQ(dx.k, 67);
  EXPECT_EQ(dx.second.ld, 128);
  EXPECT_EQ(dx.out.ld, 8);
  const GemmPlan dw = plan_gemm({6, 67}, {6, 8}, {67, 8}, true, false, {128, 0, 0});
  EXPECT_EQ(dw.n, 67);
  EXPECT_TRUE(dw.second.transpose);
  EXPECT_EQ(dw.second.ld, 128);
  // A stride equal to the row is the contiguous case; shorter rows overlap,
  // and 3-D operands have no row stride of their own.
  EXPECT_EQ(plan_gemm({3, 4}, {4, 5}, {3, 5}, false, false, {4, 5, 5}).out.ld, 5);
  try {
    plan_gemm({6, 8}, {67, 8}, {6, 67}, false, true, {0, 0, 64});
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("c's row stride 64 is shorter than its rows"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(plan_gemm({2, 7, 4}, {6, 4}, {2, 7, 6}, false, true, {8, 0, 0}), ShapeError);
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

// Classes of an extent: below 16 each its own; above, eight an octave, the
// class the next multiple of 2^(floor(log2 e) - 3), never below the extent
// nor more than an eighth above it.
TEST(GemmPlan, ExtentClassesAreEighthsOfAnOctave) {
  EXPECT_EQ(gemm_extent_class(1), 1);
  EXPECT_EQ(gemm_extent_class(15), 15);
  EXPECT_EQ(gemm_extent_class(16), 16);
  EXPECT_EQ(gemm_extent_class(17), 18);
  EXPECT_EQ(gemm_extent_class(33), 36);
  EXPECT_EQ(gemm_extent_class(4000), 4096);
  EXPECT_EQ(gemm_extent_class(4097), 4608);
  EXPECT_EQ(gemm_extent_class(8189), 8192);
  int64_t classes = 0;
  for (int64_t e = 1; e <= 70000; ++e) {
    const int64_t c = gemm_extent_class(e);
    ASSERT_GE(c, e);
    ASSERT_LE(8 * c, 9 * e) << e;
    ASSERT_EQ(gemm_extent_class(c), c) << e;
    if (e > 1) {
      ASSERT_GE(c, gemm_extent_class(e - 1)) << e;
    }
    classes += c == e;
  }
  // 2^12 to 2^16: 8 classes an octave.
  int64_t octave = 0;
  for (int64_t e = 4096; e < 8192; ++e) octave += gemm_extent_class(e) == e;
  EXPECT_EQ(octave, 8);
  EXPECT_LT(classes, 15 + 8 * 13);
}

}  // namespace
}  // namespace triad::detail
