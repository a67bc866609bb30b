#pragma once

// A plain matrix product on the GPU, for checking cuBLASLt's
// (gemm_reference.cu): the column-major product a cuBLASLt call describes,
// D = alpha op(first) op(second) + beta C, with the same epilogues (bias;
// bias then GELU, keeping its input; GELU's derivative at a kept input),
// each element summed in f32 in order over k from the operands as stored.
// The result goes to f32 scratch, and gemm_compare measures how far a
// product's output is from it. Slow (16 x 16 tiles, no tensor cores): a
// diagnosis tool (cuda::GemmSettings::verify), not a GEMM.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

struct RefMatrix {
  const void* data = nullptr;
  int64_t ld = 0;            // leading dimension (column-major), elements
  int64_t batch_stride = 0;  // elements; 0 = the same matrix for every batch
  bool transpose = false;    // op: the stored matrix is transposed
};

struct RefGemm {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  ScalarType inputs = ScalarType::F32;  // first and second
  ScalarType output = ScalarType::F32;  // C and D (bias and the GELU input too)
  RefMatrix first, second;              // op(first) m x k, op(second) k x n
  RefMatrix c;                          // read when beta != 0 (never transposed)
  double alpha = 1, beta = 0;
  // Gelu: BiasGelu without a bias.
  enum class Epilogue : uint8_t { None, Bias, BiasGelu, DGelu, Gelu } epilogue = Epilogue::None;
  const void* bias = nullptr;  // m elements (Bias, BiasGelu)
  const void* aux = nullptr;   // DGelu: GELU's input, laid out as C
};

// Why the reference cannot compute `g`, or fine: inputs f32, bf16 or f16;
// the output the inputs' type, or f32 under bf16/f16 inputs (no epilogue).
Status check_gemm_reference(const RefGemm& g);

// ref[b * m * n + j * m + i] = element (i, j) of batch b, before any
// rounding to the output type; for BiasGelu and Gelu, pre (same layout) receives the
// GELU's input. Reads C (and the DGelu input) as they are when the launch
// runs, so queue it before a product that overwrites them.
void gemm_reference(const RefGemm& g, float* ref, float* pre, cudaStream_t stream);

// How far `out` (m x n per batch, column-major with leading dimension ld
// and batch stride, in `type`) is from `ref` (gemm_reference's layout).
struct GemmDiff {
  double error_sq = 0;      // sum of (out - ref)^2 over the finite pairs
  double reference_sq = 0;  // sum of ref^2
  double max_error = 0;     // largest |out - ref|
  double max_reference = 0;
  double nonfinite = 0;  // elements where out is NaN or infinite and ref is not
};
// Writes one GemmDiff to `diff` (device memory), in a fixed order.
void gemm_compare(ScalarType type, const void* out, int64_t ld, int64_t batch_stride, int64_t m,
                  int64_t n, int64_t batch, const float* ref, GemmDiff* diff, cudaStream_t stream);

}  // namespace triad::kernels
