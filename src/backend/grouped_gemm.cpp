#include "backend/grouped_gemm.h"

#include <string>

#include "triad/backend/backend.h"
#include "triad/core/error.h"
#include "triad/ops/elementwise.h"

namespace triad {

namespace detail {

namespace {

void check_offsets(const Tensor& offsets, const Tensor& a, const char* op) {
  if (offsets.dtype() != DType::I64 || offsets.dim() != 1 || offsets.size(0) < 2 ||
      !offsets.is_contiguous() || !(offsets.device() == a.device())) {
    throw ShapeError(std::string(op) + ": offsets " + dtype_name(offsets.dtype()) + " " +
                     shape_str(offsets.shape()) + " on " + offsets.device().str() +
                     " (expected contiguous i64 (groups + 1), at least one group, on " +
                     a.device().str() + ")");
  }
}

void check_matrix(const Tensor& t, const Tensor& a, const char* op, const char* what,
                  const Shape& shape, bool f32_allowed) {
  const bool half = a.dtype() == DType::BF16 || a.dtype() == DType::F16;
  f32_allowed = f32_allowed && half;
  const bool dtype_ok = t.dtype() == a.dtype() || (f32_allowed && t.dtype() == DType::F32);
  if (!dtype_ok || t.shape() != shape || !t.is_contiguous() || !(t.device() == a.device())) {
    throw ShapeError(std::string(op) + ": " + what + " " + dtype_name(t.dtype()) + " " +
                     shape_str(t.shape()) + " on " + t.device().str() + " (expected contiguous " +
                     dtype_name(a.dtype()) + (f32_allowed ? " (or f32)" : "") + " " +
                     shape_str(shape) + " on " + a.device().str() + ")");
  }
}

void check_a(const Tensor& a, const char* op) {
  if (a.dim() != 2 || !a.is_contiguous() || !is_floating(a.dtype())) {
    throw ShapeError(std::string(op) + ": a " + dtype_name(a.dtype()) + " " + shape_str(a.shape()) +
                     " (expected a contiguous floating-point matrix)");
  }
}

// a and the offsets checked: the rows, columns and groups they give.
GroupedGemmSizes sizes_of(const Tensor& a, const Tensor& offsets, const char* op) {
  check_a(a, op);
  check_offsets(offsets, a, op);
  GroupedGemmSizes s;
  s.M = a.size(0);
  s.K = a.size(1);
  s.groups = offsets.size(0) - 1;
  return s;
}

}  // namespace

GroupedGemmSizes check_grouped_gemm_rows(const Tensor& a, const std::vector<Tensor>& b,
                                         const Tensor& offsets, bool trans_b, const Tensor& c) {
  const char* op = "grouped_gemm_rows";
  GroupedGemmSizes s = sizes_of(a, offsets, op);
  if (static_cast<int64_t>(b.size()) != s.groups || b.front().dim() != 2) {
    throw ShapeError(std::string(op) + ": " + std::to_string(b.size()) + " matrices b for " +
                     std::to_string(s.groups) + " groups (expected one matrix a group)");
  }
  s.N = b.front().size(trans_b ? 0 : 1);
  const Shape b_shape = trans_b ? Shape{s.N, s.K} : Shape{s.K, s.N};
  for (const Tensor& t : b) check_matrix(t, a, op, "b", b_shape, false);
  check_matrix(c, a, op, "c", {s.M, s.N}, false);
  return s;
}

GroupedGemmSizes check_grouped_gemm_sums(const Tensor& a, const Tensor& b, const Tensor& offsets,
                                         const std::vector<Tensor>& c) {
  const char* op = "grouped_gemm_sums";
  GroupedGemmSizes s = sizes_of(a, offsets, op);
  if (b.dim() != 2 || b.size(0) != s.M) {
    throw ShapeError(std::string(op) + ": b " + shape_str(b.shape()) + " beside a " +
                     shape_str(a.shape()) + " (expected (" + std::to_string(s.M) + ", columns))");
  }
  check_matrix(b, a, op, "b", b.shape(), false);
  s.N = b.size(1);
  if (static_cast<int64_t>(c.size()) != s.groups) {
    throw ShapeError(std::string(op) + ": " + std::to_string(c.size()) + " matrices c for " +
                     std::to_string(s.groups) + " groups (expected one matrix a group)");
  }
  for (const Tensor& t : c) check_matrix(t, a, op, "c", {s.K, s.N}, true);
  return s;
}

std::vector<int64_t> host_offsets(const Tensor& offsets, int64_t M, const char* op) {
  Tensor host = offsets;
  if (offsets.device().type != DeviceType::CPU) host = to_device(offsets, Device::cpu());
  const int64_t* o = host.data<int64_t>();
  std::vector<int64_t> v(o, o + host.numel());
  bool ordered = v.front() == 0 && v.back() <= M;
  for (size_t g = 1; g < v.size(); ++g) ordered = ordered && v[g - 1] <= v[g];
  if (!ordered) {
    std::string listed;
    for (size_t g = 0; g < v.size() && g < 16; ++g)
      listed += (g ? ", " : "") + std::to_string(v[g]);
    if (v.size() > 16) listed += ", ...";
    throw ValueError(std::string(op) + ": offsets [" + listed + "] for " + std::to_string(M) +
                     " rows (expected 0 = offsets[0] <= ... <= offsets[groups] <= rows)");
  }
  return v;
}

}  // namespace detail

namespace {

// Rows [at, at + n) of a contiguous matrix, as a view.
Tensor row_piece(const Tensor& t, int64_t at, int64_t n) {
  return make_view(t, {n, t.size(1)}, {t.size(1), 1}, t.offset() + at * t.size(1));
}

}  // namespace

void Backend::grouped_gemm_rows(const Tensor& a, const std::vector<Tensor>& b,
                                const Tensor& offsets, bool trans_b, Tensor& c) {
  const detail::GroupedGemmSizes s = detail::check_grouped_gemm_rows(a, b, offsets, trans_b, c);
  const std::vector<int64_t> at = detail::host_offsets(offsets, s.M, "grouped_gemm_rows");
  for (int64_t g = 0; g < s.groups; ++g) {
    const int64_t n = at[static_cast<size_t>(g + 1)] - at[static_cast<size_t>(g)];
    if (n == 0) continue;
    Tensor cg = row_piece(c, at[static_cast<size_t>(g)], n);
    gemm(row_piece(a, at[static_cast<size_t>(g)], n), b[static_cast<size_t>(g)], cg, false, trans_b,
         1.0, 0.0);
  }
  if (at.back() < s.M) {
    Tensor tail = row_piece(c, at.back(), s.M - at.back());
    fill(tail, 0.0);
  }
}

void Backend::grouped_gemm_sums(const Tensor& a, const Tensor& b, const Tensor& offsets,
                                std::vector<Tensor>& c, double beta) {
  const detail::GroupedGemmSizes s = detail::check_grouped_gemm_sums(a, b, offsets, c);
  const std::vector<int64_t> at = detail::host_offsets(offsets, s.M, "grouped_gemm_sums");
  for (int64_t g = 0; g < s.groups; ++g) {
    const int64_t n = at[static_cast<size_t>(g + 1)] - at[static_cast<size_t>(g)];
    Tensor& cg = c[static_cast<size_t>(g)];
    if (n > 0) {
      gemm(row_piece(a, at[static_cast<size_t>(g)], n), row_piece(b, at[static_cast<size_t>(g)], n),
           cg, true, false, 1.0, beta);
    } else if (beta == 0.0) {
      fill(cg, 0.0);
    } else if (beta != 1.0) {
      affine(cg, beta, 0.0, cg);
    }
  }
}

}  // namespace triad
