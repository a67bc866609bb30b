#pragma once

// TRIAD_HOST_DEVICE marks a function that both the host compiler and nvcc
// (for the device) compile: one definition that the CPU backend and the
// CUDA kernels share, so that both compute the very same thing.
#if defined(__CUDACC__)
#define TRIAD_HOST_DEVICE __host__ __device__
#else
#define TRIAD_HOST_DEVICE
#endif
