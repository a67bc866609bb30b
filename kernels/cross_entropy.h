#pragma once

// Cross entropy over logits (N, V) (cross_entropy.cu), one pass per row with
// an online max/sum (probabilities are never stored): forward writes the
// per-row loss and log-sum-exp, backward writes dlogits = (softmax - onehot)
// * dloss, plus softmax * dlse when dlse (N, f32) is not null (the gradient
// of a z-loss over the log-sum-exp). Targets (N) are i32 or i64; rows whose target is ignore_index
// get loss 0 and gradient 0. losses, lse, dlosses (N) are f32; logits f32, bf16 or f16, each row
// `ld` >= V elements after the last (padded rows keep a GEMM's output aligned); dlogits has the
// same layout and may be logits itself (each element read before its gradient overwrites it).
//
// Soft-capped logits (softcap > 0, for the backward passes): the logits hold
// z = softcap * tanh(x / softcap) (soft_cap.h) and the gradient written is
// x's, each element's times 1 - (z / softcap)^2; 0: no cap.
//
// The vocab-parallel variant works on one rank's shard (N, Vl) (rows `ld`
// apart, dlogits alike and possibly the logits themselves) whose first
// `valid` columns are the real vocabulary [vocab_start, vocab_start + valid):
// partial (row max, target logit) -> all-reduce max / sum -> sumexp ->
// all-reduce sum -> backward, the three reductions the TP layer performs.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

Status check_cross_entropy(ScalarType logits_type, int64_t N, int64_t V, int64_t ld);

void cross_entropy_forward(const void* logits, ScalarType type, const void* targets, bool targets64,
                           int64_t N, int64_t V, int64_t ld, int64_t ignore_index, float* losses,
                           float* lse, cudaStream_t stream);
void cross_entropy_backward(const void* logits, ScalarType type, const void* targets,
                            bool targets64, const float* lse, const float* dlosses,
                            const float* dlse, int64_t N, int64_t V, int64_t ld,
                            int64_t ignore_index, double softcap, void* dlogits,
                            cudaStream_t stream);

// cross_entropy_forward and cross_entropy_backward (dlosses given) in one
// kernel: one block a row computes the row's log-sum-exp, then writes its
// gradient, reading the row again from cache. z_scale != 0: a z-loss's too,
// with each row's dlse (lse * dlosses[row]) * z_scale in f32; 0: none. The
// same losses, lse and dlogits as the two calls (given that dlse), bit for
// bit; dlogits may be logits.
void cross_entropy_forward_backward(const void* logits, ScalarType type, const void* targets,
                                    bool targets64, const float* dlosses, int64_t N, int64_t V,
                                    int64_t ld, int64_t ignore_index, double softcap,
                                    double z_scale, float* losses, float* lse, void* dlogits,
                                    cudaStream_t stream);
// *inv_count = 1 / (the targets of N not equal to ignore_index), as the
// host forms it (in f64, rounded once to inv_type: f32 or f64; 0 when every
// target is ignored). A target outside [0, V) and not ignored lowers *bad
// (when given) to its position (atomicMin): the device's check of targets
// a CUDA graph's capture cannot bring to the host. One block.
void inverse_target_count(const void* targets, bool targets64, int64_t N, int64_t ignore_index,
                          int64_t V, void* inv_count, ScalarType inv_type, unsigned long long* bad,
                          cudaStream_t stream);
// x (rows, cols, rows ld apart; f32, bf16 or f16) *= *actual / expected
// (f32 arithmetic), unless *actual == (float)expected: then nothing is read
// but *actual. A gradient computed ahead with the gradient it expected,
// corrected on the device when another came.
void scale_by_ratio(void* x, ScalarType type, int64_t rows, int64_t cols, int64_t ld,
                    const float* actual, double expected, cudaStream_t stream);

Status check_vocab_ce(ScalarType logits_type, int64_t N, int64_t Vl, int64_t ld, int64_t valid);
void vocab_ce_partial(const void* logits, ScalarType type, const void* targets, bool targets64,
                      int64_t N, int64_t Vl, int64_t ld, int64_t vocab_start, int64_t valid,
                      float* row_max, float* target_logit, cudaStream_t stream);
// Per row of the shard, the max over its valid columns (-inf for none),
// the sum over them of exp(logit - that max) (0 for none) and the target's
// logit when it lies in the shard (else 0): one read of the logits where
// vocab_ce_partial and vocab_ce_sumexp take two.
void vocab_ce_shard_sums(const void* logits, ScalarType type, const void* targets, bool targets64,
                         int64_t N, int64_t Vl, int64_t ld, int64_t vocab_start, int64_t valid,
                         float* row_max, float* sumexp, float* target_logit, cudaStream_t stream);
void vocab_ce_sumexp(const void* logits, ScalarType type, const float* global_max, int64_t N,
                     int64_t Vl, int64_t ld, int64_t valid, float* sumexp, cudaStream_t stream);
// losses[i] = log(sumexp[i]) + global_max[i] - target_logit[i], i < N.
void vocab_ce_loss(const float* global_max, const float* target_logit, const float* sumexp,
                   int64_t N, float* losses, cudaStream_t stream);
void vocab_ce_backward(const void* logits, ScalarType type, const void* targets, bool targets64,
                       int64_t N, int64_t Vl, int64_t ld, int64_t vocab_start, int64_t valid,
                       const float* global_max, const float* sumexp, const float* dloss,
                       const float* dlse, double softcap, void* dlogits, cudaStream_t stream);

}  // namespace triad::kernels
