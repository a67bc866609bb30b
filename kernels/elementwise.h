#pragma once

// Elementwise kernels (elementwise.cu): copies with dtype conversion between
// strided views, fill, binary arithmetic with broadcasting, affine maps,
// GELU forward/backward, SwiGLU, dropout and reductions along one dimension.
// Pointers are device pointers; every launcher takes the stream it runs on.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"
#include "triad/core/philox.h"

namespace triad::kernels {

enum class BinaryKind : uint8_t { Add, Sub, Mul, Div, Eq };  // order of triad::BinaryOp
enum class ReduceKind : uint8_t { Sum, Max };                // order of triad::ReduceOp

// dst[view] = convert(src[view]); both views have the same shape.
void copy(const void* src, ScalarType src_type, StridedView src_view, void* dst,
          ScalarType dst_type, StridedView dst_view, cudaStream_t stream);
// dst[0, n) = value.
void fill(void* dst, ScalarType type, int64_t n, double value, cudaStream_t stream);
// dst[i] = start + i for i in [0, n); i32 or i64.
void arange(void* dst, ScalarType type, int64_t n, int64_t start, cudaStream_t stream);
// out[i] = a[a_view(i)] (op) b[b_view(i)] for the n elements of the (shared)
// view shape; out contiguous. Broadcast dimensions have stride 0.
void binary(BinaryKind op, const void* a, StridedView a_view, const void* b, StridedView b_view,
            void* out, ScalarType type, cudaStream_t stream);
// acc[i] += src[i] over n contiguous elements: acc f32, src f32, bf16 or
// f16 (summed in f32). Gradient accumulation of half-precision parameters
// into their f32 gradients, in one pass instead of a conversion and an add.
void accumulate(const void* src, ScalarType src_type, float* acc, int64_t n, cudaStream_t stream);
// out = alpha * x + beta over n contiguous elements (out may alias x).
void affine(const void* x, void* out, ScalarType type, int64_t n, double alpha, double beta,
            cudaStream_t stream);
// GELU, tanh approximation: y = x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3));
// with `erf`, the exact form y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)).
void gelu_forward(const void* x, void* y, ScalarType type, int64_t n, bool erf,
                  cudaStream_t stream);
void gelu_backward(const void* x, const void* dy, void* dx, ScalarType type, int64_t n, bool erf,
                   cudaStream_t stream);
// A gated linear unit: x (rows, 2F) = [a | b] -> y (rows, F) = act(a) * b,
// act silu (SwiGLU) or, with `gelu`, GELU's tanh approximation (GeGLU);
// backward dx (rows, 2F) = [dy * b * act'(a) | dy * act(a)]. f32, f64,
// bf16, f16 (f32 math for halves); contiguous.
void glu_forward(const void* x, void* y, ScalarType type, int64_t rows, int64_t F, bool gelu,
                 cudaStream_t stream);
void glu_backward(const void* x, const void* dy, void* dx, ScalarType type, int64_t rows, int64_t F,
                  bool gelu, cudaStream_t stream);
// y = x * keep / (1 - p), keep = philox::uniform(seed, rng_stream, at.at(i)) >= p: the
// CPU backend's mask, bit for bit. at.row_length (0: one row) must divide n.
// With `keys` (device i64, one non-negative key per row of at.row_length;
// null: none) row r's element c draws at.keyed(keys[r], c) instead. With
// `calls` (one device i64; null: none) the draws are at.after_calls(*calls),
// read by the kernel: a CUDA graph's replay draws the mask of the call
// written there before it.
void dropout(const void* x, void* y, ScalarType type, int64_t n, double p, uint64_t seed,
             uint64_t rng_stream, const philox::Counters& at, const int64_t* keys,
             cudaStream_t stream, const int64_t* calls = nullptr);
Status check_dropout(double p, int64_t n = 0, const philox::Counters& at = {}, bool keyed = false);
// x viewed as (outer, n, inner) reduced over n into out (outer, inner);
// for Max, indices (i64, may be null for Sum) receive the arg-max. Long
// column sums (bias gradients) run in two deterministic stages through
// `workspace` of reduce_workspace() bytes (null when that is 0).
size_t reduce_workspace(ReduceKind op, ScalarType type, int64_t outer, int64_t n, int64_t inner);
void reduce(ReduceKind op, const void* x, ScalarType type, int64_t outer, int64_t n, int64_t inner,
            void* out, int64_t* indices, void* workspace, cudaStream_t stream);
Status check_reduce(ReduceKind op, int64_t outer, int64_t n, int64_t inner, const int64_t* indices);
// acc[c] = beta * acc[c] + sum_r x[r * inner + c] over the n rows of a
// contiguous (n, inner) x (f32, bf16 or f16; summed in f64 in a fixed
// order): a linear layer's bias gradient added straight into its f32
// gradient. beta 0 ignores acc's contents. Long columns run in two stages
// through `workspace` of column_sum_workspace() bytes for x's type (null
// when that is 0).
size_t column_sum_workspace(ScalarType type, int64_t n, int64_t inner);
void column_sum_into(const void* x, ScalarType type, int64_t n, int64_t inner, float* acc,
                     double beta, void* workspace, cudaStream_t stream);

}  // namespace triad::kernels
