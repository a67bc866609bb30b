#pragma once

// cudaMalloc that a graph's capture (cuda::capture) does not refuse.
// cudaMalloc is not stream work: from a thread with a capture open, CUDA
// refuses it (and spoils the capture) unless the thread's capture mode is
// relaxed. Memory asked for during a capture is what the capture needs now
// (the caching allocator keeps it the graph's for the graph's life), so the
// call runs relaxed, and the thread's mode is restored after it.
#include <cuda_runtime_api.h>

#include <cstddef>

namespace triad::detail {

inline cudaError_t capture_safe_malloc(void** p, size_t bytes) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  const bool exchanged = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  const cudaError_t st = cudaMalloc(p, bytes);
  if (exchanged) cudaThreadExchangeStreamCaptureMode(&mode);
  return st;
}

}  // namespace triad::detail
