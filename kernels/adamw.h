#pragma once

// Fused AdamW over a flat buffer (adamw.cu): param, grad, m, v (n) in one
// type (f32, or bf16/f16), updated in f32 with the same sequence of
// roundings as the CPU reference (torch.optim.AdamW, foreach=False). The
// moments may instead be bf16 beside an f32 parameter and gradient
// (`moment_type`, train.moment_precision: bf16): read into f32, updated and
// used in f32 as f32 moments would be, stored rounded to bf16.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "common.h"

namespace triad::kernels {

struct AdamWArgs {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  int64_t step = 1;  // 1-based, for bias correction
  // Multiplies the gradient first (rounded once in f32, exactly as a
  // separate scale of it would be): the clipping coefficient.
  double grad_scale = 1.0;
  // adamw_multi only, clipping decided on the device: when not null (one
  // f64 in device memory, the gradients' global sum of squares) each
  // tensor's scale is times min(1, clip_max_norm / (sqrt(*clip_sum_sq) +
  // 1e-6)), rounded to f32, and a sum that is not finite leaves every
  // tensor as it is.
  const double* clip_sum_sq = nullptr;
  double clip_max_norm = 0;
};

Status check_adamw(ScalarType type, int64_t n, const AdamWArgs& args);
// The moments' type beside a parameter of `type`: the same type, or bf16
// beside f32.
Status check_adamw_moments(ScalarType type, ScalarType moment_type);
void adamw(void* param, const void* grad, void* m, void* v, ScalarType type, ScalarType moment_type,
           int64_t n, const AdamWArgs& args, cudaStream_t stream);

// Many parameters in a few launches (a multi-tensor step): each launch takes
// up to kAdamWTensorsPerLaunch parameters, each block one chunk of one of
// them, as many blocks as their chunks. `types` names the parameters' type, the gradients' and the
// moments', every tensor's alike. An f32 parameter is updated in place
// (master null) from f32 gradients; a bf16/f16 parameter has f32 master
// weights, which are updated and then rounded into it in the same pass,
// from f32 gradients or gradients of its own type (train.grad_precision:
// bf16), each scaled in its own type as a scale of it would store it, then
// used in f32. The moments are f32 or bf16 (read into f32, stored rounded).
// args.weight_decay is replaced by each tensor's own, and so is
// args.grad_scale. Same arithmetic as adamw().
struct AdamWTypes {
  ScalarType param = ScalarType::F32;
  ScalarType grad = ScalarType::F32;
  ScalarType moment = ScalarType::F32;
};
struct AdamWTensor {
  void* param = nullptr;
  const void* grad = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  float* master = nullptr;
  int64_t n = 0;
  double weight_decay = 0;
  double grad_scale = 1.0;
};
// As many as a kernel's 4 KiB argument block holds beside their chunk table.
constexpr int kAdamWTensorsPerLaunch = 48;

// How adamw_multi splits its tensors into launches (host logic, tested
// without a GPU): each launch holds at most `max_tensors` slots and
// `max_blocks` blocks, one block per chunk (of `chunk` elements). Slot s
// covers `chunks` chunks of tensor `tensor` (an index into `sizes`) from
// chunk `first_chunk` on, taking the launch's blocks after those of the
// slots before it. Every chunk of every non-empty tensor appears exactly
// once, in order; a tensor splits across launches only where its chunks
// outnumber `max_blocks`. Launches are as few as the limits allow: a launch
// of many blocks keeps the device's memory busy where a cap of a few
// hundred left it idle between launches (the global norm's sum of squares
// ran at 52% of an H200's bandwidth in launches of 320 chunks).
struct AdamWLaunch {
  struct Slot {
    int tensor;
    int64_t first_chunk;
    int64_t chunks;
  };
  std::vector<Slot> slots;
  int64_t blocks = 0;  // the slots' chunks together
};
std::vector<AdamWLaunch> plan_adamw_multi(const std::vector<int64_t>& sizes, int max_tensors,
                                          int64_t max_blocks, int64_t chunk);
Status check_adamw_multi(const AdamWTypes& types, const std::vector<AdamWTensor>& tensors,
                         const AdamWArgs& args);
void adamw_multi(const AdamWTypes& types, const std::vector<AdamWTensor>& tensors,
                 const AdamWArgs& args, cudaStream_t stream);

// The global gradient norm's square (adamw.cu): the sum of x^2 over every
// element of many tensors of `type` (f32, bf16 or f16), each square and sum
// in f64, in a fixed order (the same bits every run). Chunks of the tensors
// are planned as adamw_multi's; each block writes its chunk's sum to
// `partial` (sum_squares_partials() entries, f64, device memory) and a last
// launch adds them in order into out[0] (one f64, device memory). A NaN or
// infinity anywhere makes the result non-finite: the step's NaN/Inf check.
// `accumulate` adds to out[0] instead of overwriting it.
struct SumSquaresTensor {
  const void* x = nullptr;
  int64_t n = 0;
};
int64_t sum_squares_partials(const std::vector<SumSquaresTensor>& tensors);
Status check_sum_squares(ScalarType type, const std::vector<SumSquaresTensor>& tensors);
void sum_squares_multi(ScalarType type, const std::vector<SumSquaresTensor>& tensors,
                       double* partial, double* out, bool accumulate, cudaStream_t stream);

}  // namespace triad::kernels
