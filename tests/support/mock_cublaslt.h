#pragma once

// A CPU stand-in for the cuBLASLt calls of src/backend/cuda/cublaslt_gemm.cpp
// (see mock_cublaslt.cpp). Device pointers are host pointers here.
#include <cstdint>
#include <string>
#include <vector>

namespace triad::testing::mock_cublaslt {

struct Counters {
  int64_t heuristic_queries = 0;
  // cublasLtMatmulAlgoCheck calls (an algorithm tried on a new problem).
  int64_t algorithm_checks = 0;
  int64_t matmuls = 0;
  // Products with a matrix whose leading dimension is not a multiple of 16
  // bytes (cuBLASLt's fast kernels need 16-byte aligned rows).
  int64_t unaligned_matmuls = 0;
  // Products whose m or k (cuBLASLt's, column-major) is not a multiple of
  // 8: on the H200 cuBLASLt ran GPT-2's head 8 times slower with m or k =
  // 50257 (n = 50257, the weight gradient's, ran at full speed).
  int64_t odd_extent_matmuls = 0;
  // Products with bf16/f16 operands, and products with an epilogue.
  int64_t half_matmuls = 0;
  int64_t epilogue_matmuls = 0;
  // Products with GELU in their epilogue (GELU_AUX_BIAS, GELU_AUX).
  int64_t gelu_matmuls = 0;
  // Products with the GELU-derivative and bias-gradient epilogue
  // (DGELU_BGRAD), and of those, the ones whose sums were asked in f32.
  int64_t dgelu_bias_grad_matmuls = 0;
  int64_t f32_bias_grad_matmuls = 0;
  // Heuristic queries whose preference allowed only split-k reductions in
  // the compute type (CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK without the
  // in-place and output-type schemes).
  int64_t compute_type_reduction_queries = 0;
  // The algorithms requested by the last heuristic query, and the products
  // run with each algorithm (by its index among those set_algorithms gave).
  int64_t last_requested = 0;
  std::vector<int64_t> matmuls_by_algorithm;
};
Counters counters();
void reset();
// When set, heuristics find no algorithm (as for a layout cuBLASLt lacks).
void set_no_algorithms(bool none);
// When set, heuristics find no algorithm for the bias-gradient epilogues
// (BGRADB, DGELU_BGRAD) only, as a cuBLASLt without them for the types would.
void set_no_bias_grad_algorithms(bool none);
// When set, heuristics find no algorithm for DGELU_BGRAD with its sums in
// f32 (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE) beside a half output: the sums
// only in the output's type, as the header documents for bias gradients.
void set_no_f32_bias_grad_algorithms(bool none);
// The algorithms heuristics offer, best first by their ranking: one per
// entry, each product run with algorithm i taking at least delays_ms[i] of
// its stream's time (one algorithm taking no time after reset()). Every
// algorithm computes the same product.
void set_algorithms(const std::vector<double>& delays_ms);
// When set, cublasLtMatmulAlgoCheck refuses every algorithm (as cuBLASLt
// refuses one whose configuration a problem does not allow).
void set_algorithm_checks_fail(bool fail);
// Multiplies every product's output by `factor` (1 after reset()): a wrong
// product, for the tests of cuda::GemmSettings::verify.
void set_output_factor(double factor);
std::string last_error();

}  // namespace triad::testing::mock_cublaslt
