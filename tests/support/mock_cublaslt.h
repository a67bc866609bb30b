#pragma once

// A CPU stand-in for the cuBLASLt calls of src/backend/cuda/cublaslt_gemm.cpp
// (see mock_cublaslt.cpp). Device pointers are host pointers here.
#include <cstdint>
#include <string>

namespace triad::testing::mock_cublaslt {

struct Counters {
  int64_t heuristic_queries = 0;
  int64_t matmuls = 0;
  // Products with a matrix whose leading dimension is not a multiple of 16
  // bytes (cuBLASLt's fast kernels need 16-byte aligned rows).
  int64_t unaligned_matmuls = 0;
};
Counters counters();
void reset();
// When set, heuristics find no algorithm (as for a layout cuBLASLt lacks).
void set_no_algorithms(bool none);
std::string last_error();

}  // namespace triad::testing::mock_cublaslt
