#pragma once

// LayerNorm over the last dimension (layernorm.cu). x, y, dy, dx (N, C) and
// weight, bias (C) in the tensor type (f32, bf16 or f16), dweight and dbias
// in it or f32; mean and rstd (N) always f32. Statistics and every sum run in f32.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

Status check_layer_norm(ScalarType type, int64_t N, int64_t C, double eps);

// With `residual` (N, C), the residual add is fused in: h = x + residual is
// written to `sum` (rounded to the type, as an add would store it) and h is
// normalized. The scale is weight_offset + w, formed in f32 (Nemotron's
// LayerNorm1P, 1 + w, never rounded to the type).
void layer_norm_forward(const void* x, const void* weight, const void* bias, void* y, float* mean,
                        float* rstd, ScalarType type, int64_t N, int64_t C, double eps,
                        cudaStream_t stream, const void* residual = nullptr, void* sum = nullptr,
                        double weight_offset = 0.0);

// Bytes of device scratch layer_norm_backward needs for (N, C), with or
// without dx's column sums, and with or without register_sums (below: its
// blocks, and so its partial rows, are its own).
size_t layer_norm_backward_workspace(int64_t N, int64_t C, bool dx_sums = false,
                                     bool register_sums = false);
// Whether layer_norm_backward can sum dx's columns for rows of C (up to
// 1024: the sums' third slice of shared memory must fit beside the others).
bool layer_norm_backward_sums_dx(int64_t C);
// dweight = beta * dweight + the weight gradient, dbias likewise (beta 0:
// overwritten, their contents never read); they are of the tensor type, or
// f32 with f32_param_grads (the f32 gradients of half parameters). The
// column sums are formed in a fixed order (row chunks, then chunks in
// order), so results are deterministic. With `dsum` (N, C; the gradient
// the fused sum gets from its other uses), dx = LayerNorm's input gradient
// + dsum. weight_offset as in the forward (the offset has no gradient).
// With `dx_sums` (C f32, layer_norm_backward_sums_dx(C); the workspace sized
// for them), dx's column sums too, from the values before they are rounded
// to the type, in a fixed order; stored, never added to (the bias gradient
// of the layer whose output was the residual).
// With `register_sums`, rows a warp holds whole (up to 1024 columns in
// bf16/f16, 512 in f32) keep each lane's column sums in registers rather
// than in shared memory: the same order of addition, other blocks (the
// kernel's occupancy differs), so the same bits only at the same grid. The
// workspace must be sized with the same flag.
void layer_norm_backward(const void* dy, const void* x, const void* weight, const float* mean,
                         const float* rstd, void* dx, void* dweight, void* dbias, ScalarType type,
                         int64_t N, int64_t C, void* workspace, cudaStream_t stream,
                         const void* dsum = nullptr, bool f32_param_grads = false,
                         double beta = 0.0, double weight_offset = 0.0, float* dx_sums = nullptr,
                         bool register_sums = false);

// RMSNorm (LLaMA's), LayerNorm's kernels with the mean taken as 0 and no
// bias: y = x * rstd * (weight_offset + w), rstd = 1/sqrt(mean(x^2) + eps),
// in f32 (Gemma's 1 + w is formed there, as LayerNorm1P's is). The
// residual add, workspace (layer_norm_backward_workspace), dsum,
// f32_param_grads and beta as for LayerNorm; dweight gets the weight's
// gradient in the same fixed order (the offset has none).
void rms_norm_forward(const void* x, const void* weight, void* y, float* rstd, ScalarType type,
                      int64_t N, int64_t C, double eps, cudaStream_t stream,
                      const void* residual = nullptr, void* sum = nullptr,
                      double weight_offset = 0.0);
void rms_norm_backward(const void* dy, const void* x, const void* weight, const float* rstd,
                       void* dx, void* dweight, ScalarType type, int64_t N, int64_t C,
                       void* workspace, cudaStream_t stream, const void* dsum = nullptr,
                       bool f32_param_grads = false, double beta = 0.0, double weight_offset = 0.0,
                       bool register_sums = false);

}  // namespace triad::kernels
