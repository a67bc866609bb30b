#pragma once

// Products over rows grouped where the group sizes live on the device: a
// dropless mixture's experts (Backend::grouped_gemm_rows and
// grouped_gemm_sums), whose rows per expert the host never reads, so that
// the step can be captured in a CUDA graph. Every launch covers the most
// tiles the groups could need (a fixed grid); each block reads the offsets
// and finds its group's tile, and the blocks past the groups' tiles return.
// bf16/f16 run on tensor cores (WMMA 16x16x16, f32 accumulation; 128 x 128
// tiles, 8 warps of 64 x 32), f32 and f64 as SIMT tiles (64 x 64, 4 x 4 a
// thread) in their own type. Each output sums its products in order over
// k, no atomics: the same bits on every run.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

// The most groups one launch takes (their matrices' addresses travel as
// launch arguments); the launchers split more into batches of these.
constexpr int64_t kGroupedGemmMaxGroups = 256;

// rows, cols, inner: the product's M (rows of a), N and K (the columns of
// a); groups: G, offsets (G + 1, i64, on the device) giving group g the
// rows [offsets[g], offsets[g + 1]) (clamped into [0, M]; a group whose end
// comes before its start is empty).
struct GroupedGemmShape {
  int64_t rows = 0, cols = 0, inner = 0, groups = 1;
};

// Whether the kernels take these: f32, f64, bf16 or f16 operands (the
// sums' output f32 under bf16/f16 too), sizes >= 0 and at least one
// group.
Status check_grouped_gemm(ScalarType type, ScalarType out_type, const GroupedGemmShape& shape);

// c (M, N) = a (M, K) @ op(b[g]) on group g's rows; op(b) = b^T for b
// (N, K) with trans_b, else b (K, N). Rows past offsets[G] are zeroed.
// b holds G device pointers (host array). All row-major, contiguous.
void grouped_gemm_rows(ScalarType type, const GroupedGemmShape& shape, const void* a,
                       const void* const* b, const int64_t* offsets, bool trans_b, void* c,
                       cudaStream_t stream);

// c[g] (K, N) = a_g^T @ b_g + beta * c[g] for a (M, K) and b (M, N), a_g
// and b_g group g's rows (a group of none: beta * c[g]; beta 0 reads no
// c). c holds G device pointers of out_type (the operands' type, or f32
// under bf16/f16).
void grouped_gemm_sums(ScalarType type, ScalarType out_type, const GroupedGemmShape& shape,
                       const void* a, const void* b, const int64_t* offsets, void* const* c,
                       double beta, cudaStream_t stream);

}  // namespace triad::kernels
