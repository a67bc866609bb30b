#pragma once

// cuDNN's fused causal attention (flash attention in cuDNN's own kernels),
// the third attention implementation next to the hand-written SIMT and
// tensor-core kernels. cudnn_attention_graph.h says which operation graphs
// are built; cudnn_attention.cpp turns them into backend-API descriptors,
// picks an engine by cuDNN's heuristics, caches one execution plan per
// (device, shape, direction) and runs it on the caller's stream.
// cudnn_attention_absent.cpp stands in for builds without cuDNN.
//
// The backward runs cuDNN's deterministic graph (dQ written by a matmul, not
// accumulated with atomics) unless the caller asks for the faster one, which
// accumulates dQ in an f32 workspace tensor and does not repeat bit for bit.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "cudnn_attention_graph.h"

namespace triad::detail {

// True when this build links cuDNN.
bool cudnn_attention_compiled();
// Why cuDNN attention cannot take this call on a device of compute
// capability `sm_major` ("" when it can, as far as can be told before
// asking cuDNN for an engine).
std::string cudnn_attention_unavailable(const cudnn_graph::AttentionProblem& p, int sm_major);

// Device workspace (bytes) the call needs; builds and caches its plan. Throws
// Error naming the shape when cuDNN has no engine for it.
// `deterministic` chooses the backward graph (the forward has one).
size_t cudnn_attention_workspace(int device, const cudnn_graph::AttentionProblem& p, bool backward,
                                 bool deterministic = true);

// qkv (B, T, 3C), out (B, T, C), lse (B, NH, T) f32 as in kernels/attention.h;
// `workspace` holds cudnn_attention_workspace(device, p, backward) bytes.
void cudnn_attention_forward(int device, cudaStream_t stream,
                             const cudnn_graph::AttentionProblem& p, const void* qkv, void* out,
                             float* lse, void* workspace);
void cudnn_attention_backward(int device, cudaStream_t stream,
                              const cudnn_graph::AttentionProblem& p, const void* qkv,
                              const void* out, const float* lse, const void* dout, void* dqkv,
                              void* workspace, bool deterministic = true);

}  // namespace triad::detail
