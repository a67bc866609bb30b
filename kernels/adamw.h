#pragma once

// Fused AdamW over a flat buffer (adamw.cu): param, grad, m, v (n) in one
// type (f32, or bf16/f16), updated in f32 with the same sequence of
// roundings as the CPU reference (torch.optim.AdamW, foreach=False).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

struct AdamWArgs {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  int64_t step = 1;  // 1-based, for bias correction
};

Status check_adamw(ScalarType type, int64_t n, const AdamWArgs& args);
void adamw(void* param, const void* grad, void* m, void* v, ScalarType type, int64_t n,
           const AdamWArgs& args, cudaStream_t stream);

}  // namespace triad::kernels
