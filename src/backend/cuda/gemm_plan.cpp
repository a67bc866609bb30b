#include "gemm_plan.h"

#include <string>

#include "triad/core/error.h"

namespace triad::detail {
namespace {

std::string describe(const Shape& a, const Shape& b, const Shape& c, bool ta, bool tb) {
  return "gemm(a " + shape_str(a) + (ta ? "^T" : "") + ", b " + shape_str(b) + (tb ? "^T" : "") +
         " -> c " + shape_str(c) + ")";
}

}  // namespace

GemmPlan plan_gemm(const Shape& a, const Shape& b, const Shape& c, bool ta, bool tb,
                   GemmRowStrides rs) {
  auto fail = [&](const std::string& why) -> GemmPlan {
    throw ShapeError(describe(a, b, c, ta, tb) + ": " + why);
  };
  const auto rank_ok = [](const Shape& s) { return s.size() == 2 || s.size() == 3; };
  if (!rank_ok(a) || !rank_ok(b) || !rank_ok(c)) return fail("operands must be 2-D or 3-D");
  const int64_t batch = c.size() == 3 ? c[0] : 1;
  const int64_t M = c[c.size() - 2], N = c[c.size() - 1];
  const int64_t a_rows = a[a.size() - 2], a_cols = a[a.size() - 1];
  const int64_t b_rows = b[b.size() - 2], b_cols = b[b.size() - 1];
  const int64_t K = ta ? a_rows : a_cols;
  if ((ta ? a_cols : a_rows) != M)
    return fail("a does not have M = " + std::to_string(M) + " rows");
  if ((tb ? b_cols : b_rows) != K)
    return fail("b does not have K = " + std::to_string(K) + " rows");
  if ((tb ? b_rows : b_cols) != N)
    return fail("b does not have N = " + std::to_string(N) + " columns");
  if (a.size() == 3 && a[0] != batch) return fail("a's batch differs from c's");
  if (b.size() == 3 && b[0] != batch) return fail("b's batch differs from c's");
  if (c.size() == 2 && (a.size() == 3 || b.size() == 3)) return fail("a 3-D operand needs a 3-D c");

  // A row stride: 0 (contiguous) or, for a 2-D operand, at least a row.
  const auto stride_of = [&](const Shape& s, int64_t given, const char* name) {
    const int64_t cols = s[s.size() - 1];
    if (given == 0 || given == cols) return cols;
    if (s.size() != 2 || given < cols) {
      fail(std::string(name) + "'s row stride " + std::to_string(given) +
           (s.size() != 2 ? " needs a 2-D operand" : " is shorter than its rows"));
    }
    return given;
  };
  const int64_t lda = stride_of(a, rs.a, "a"), ldb = stride_of(b, rs.b, "b"),
                ldc = stride_of(c, rs.c, "c");

  GemmPlan p;
  int64_t rows = M, a_stride = a.size() == 3 ? M * K : 0;
  const int64_t b_stride = b.size() == 3 ? K * N : 0;
  p.batch = batch;
  // A shared right operand lets the batch fold into M: one large GEMM.
  if (!ta && b_stride == 0 && a_stride != 0) {
    rows = batch * M;
    a_stride = 0;
    p.batch = 1;
    p.folded = true;
  }
  p.m = N;
  p.n = rows;
  p.k = K;
  // Column-major, each stored matrix's leading dimension is the row-major
  // operand's row stride.
  p.first = tb ? GemmOperandLayout{K, N, ldb, true, b_stride}
               : GemmOperandLayout{N, K, ldb, false, b_stride};
  p.second = ta ? GemmOperandLayout{rows, K, lda, true, a_stride}
                : GemmOperandLayout{K, rows, lda, false, a_stride};
  p.out = GemmOperandLayout{N, rows, ldc, false, p.batch > 1 ? M * N : 0};
  return p;
}

int64_t gemm_extent_class(int64_t extent) {
  int64_t step = 1;
  while ((step << 4) <= extent) step <<= 1;
  return (extent + step - 1) / step * step;
}

}  // namespace triad::detail
