#pragma once

// Causal flash attention (attention.cu), forward and backward, for GPT's
// fused projection layout: qkv (B, T, 3*C) holds q, k, v side by side, each
// split into NH heads of D = C / NH; out (B, T, C); lse (B, NH, T) f32, the
// log-sum-exp of each query's scaled scores. Scores never exist as a T x T
// matrix: keys and values stream through shared memory in tiles while each
// query keeps an online softmax (running max, running sum) in f32. The
// backward recomputes probabilities from lse and runs two passes without
// atomics (dq per query; dk, dv per key), so results are deterministic.
// Inputs f32, bf16 or f16; head dims up to 128.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

struct AttentionShape {
  int64_t B = 0, T = 0, C = 0, NH = 0;
  int64_t head_dim() const { return NH > 0 ? C / NH : 0; }
};

// The largest head dimension the kernels are built for.
constexpr int64_t kAttentionMaxHeadDim = 128;

Status check_attention(ScalarType type, const AttentionShape& s);

void attention_forward(const void* qkv, void* out, float* lse, ScalarType type,
                       const AttentionShape& s, cudaStream_t stream);

// Bytes of device scratch attention_backward needs.
size_t attention_backward_workspace(const AttentionShape& s);
// dqkv (B, T, 3*C) is overwritten.
void attention_backward(const void* qkv, const void* out, const float* lse, const void* dout,
                        void* dqkv, ScalarType type, const AttentionShape& s, void* workspace,
                        cudaStream_t stream);

}  // namespace triad::kernels
