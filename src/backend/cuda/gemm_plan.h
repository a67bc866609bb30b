#pragma once

// How a row-major Triad GEMM maps onto a column-major BLAS call (cuBLASLt):
// C = op(A) op(B) row-major is C^T = op(B)^T op(A)^T column-major, so B is
// the BLAS call's first operand and A its second. Pure host logic, compiled
// in every build and unit-tested without a GPU.
#include <cstdint>

#include "triad/core/shape.h"

namespace triad::detail {

struct GemmOperandLayout {
  int64_t rows = 0, cols = 0, ld = 0;  // of the stored column-major matrix
  bool transpose = false;              // op applied by the BLAS call
  int64_t batch_stride = 0;            // elements; 0 = shared by every batch
};

struct GemmPlan {
  int64_t m = 0, n = 0, k = 0;  // column-major: C (m x n) = op(first) (m x k) op(second) (k x n)
  GemmOperandLayout first;      // Triad's b
  GemmOperandLayout second;     // Triad's a
  GemmOperandLayout out;        // Triad's c
  int64_t batch = 1;
  bool folded = false;  // the batch was folded into the rows of a (one large GEMM)
};

// Row strides (BLAS leading dimensions) of row-major operands; 0 means the
// operand is contiguous. Only 2-D operands may have rows further apart than
// their columns (padded logits).
struct GemmRowStrides {
  int64_t a = 0, b = 0, c = 0;
};

// Shapes as Backend::gemm takes them: a (batch?, M, K) or (batch?, K, M) with
// trans_a; b (batch?, K, N) or (batch?, N, K) with trans_b; c (batch?, M, N).
// Throws ShapeError naming the mismatch.
GemmPlan plan_gemm(const Shape& a, const Shape& b, const Shape& c, bool trans_a, bool trans_b,
                   GemmRowStrides row_strides = {});

// The class of a product's extent (m, n or k) whose problems share an
// algorithm: the extent rounded up to a multiple of 2^(floor(log2 e) - 3),
// eight classes an octave, each at most an eighth above its extents;
// extents below 16 are their own class. A mixture's experts' token counts,
// new every step, fall into a few classes.
int64_t gemm_extent_class(int64_t extent);

}  // namespace triad::detail
