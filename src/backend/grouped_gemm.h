#pragma once

// The argument checks of Backend::grouped_gemm_rows and grouped_gemm_sums
// (a dropless mixture's experts' products over rows whose group sizes live
// on the device), shared by every backend.
#include <cstdint>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::detail {

// The products' sizes: M rows of a, G groups, and each product's
// (rows, inner, columns) as the kernels see them.
struct GroupedGemmSizes {
  int64_t M = 0, groups = 0, K = 0, N = 0;
};

// Throws ShapeError naming the value unless a (M, K), every b (N, K) with
// trans_b else (K, N), c (M, N), offsets (G + 1) i64 on a's device, all
// contiguous, one dtype, on one device, and at least one group.
GroupedGemmSizes check_grouped_gemm_rows(const Tensor& a, const std::vector<Tensor>& b,
                                         const Tensor& offsets, bool trans_b, const Tensor& c);
// The same for a (M, K), b (M, N) and every c (K, N) (c f32 allowed under
// bf16/f16 a and b).
GroupedGemmSizes check_grouped_gemm_sums(const Tensor& a, const Tensor& b, const Tensor& offsets,
                                         const std::vector<Tensor>& c);

// The offsets read on the host (G + 1), checked: ValueError naming them
// unless 0 = offsets[0] <= ... <= offsets[G] <= M.
std::vector<int64_t> host_offsets(const Tensor& offsets, int64_t M, const char* op);

}  // namespace triad::detail
