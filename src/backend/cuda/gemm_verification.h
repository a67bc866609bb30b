#pragma once

// cuda::GemmSettings::verify: one cuBLASLt product checked against the
// reference kernel (kernels/gemm_reference.h). The reference is queued
// before the product (it reads C, and a GELU input, before the product
// overwrites them); finish() queues the comparison, waits for it and
// records the result (cuda::gemm_verification(), kept in gemm_settings.cpp),
// logging a problem's first failure.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "cublaslt_gemm.h"
#include "triad/backend/cuda.h"

namespace triad::detail {

class GemmProductCheck {
 public:
  // Device scratch a check of this product needs.
  static size_t scratch_bytes(const GemmPlan& plan, const GemmEpilogue& epilogue);
  // Whether the reference can check this product (not f64; n and the
  // batch within its grid's limits).
  static bool checkable(const GemmPlan& plan, GemmTypes types);

  // Queues the reference on `stream`; `scratch` holds scratch_bytes().
  GemmProductCheck(const GemmPlan& plan, GemmTypes types, const void* a, const void* b,
                   const void* c, double alpha, double beta, const GemmEpilogue& epilogue,
                   GemmReduction reduction, void* scratch, cudaStream_t stream);
  // After the product was queued: compare, wait, record.
  void finish();

 private:
  GemmPlan plan_;
  GemmTypes types_;
  const void* c_;
  double alpha_, beta_;
  GemmEpilogue epilogue_;
  GemmReduction reduction_;
  void* scratch_;
  cudaStream_t stream_;
};

}  // namespace triad::detail
