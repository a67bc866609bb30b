// Packed documents' starts and positions: one block per row, which walks
// the row in chunks of its threads. A token's document starts after the
// last end of document before it, so its start is an exclusive running
// maximum of (s + 1 where token s is the end of a document, else 0):
// each chunk takes the inclusive maximum of its shifted marks in shared
// memory (log2 of the block's steps), carried from the chunk before.
#include <cstdint>
#include <string>

#include "device_utils.cuh"
#include "documents.h"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    document_starts_kernel(const void* ids, bool ids64, int64_t T, int64_t eod, int64_t window,
                           int32_t* starts, int64_t* positions) {
  __shared__ int64_t scan[kThreads];
  const int64_t row = blockIdx.x;
  int64_t carry = 0;  // the start of the document the chunk begins in
  for (int64_t c0 = 0; c0 < T; c0 += kThreads) {
    const int64_t t = c0 + threadIdx.x;
    // Token t's mark: t when token t - 1 ends a document (t starts one).
    int64_t mark = 0;
    if (t < T && t > 0 && load_id(ids, ids64, row * T + t - 1) == eod) mark = t;
    scan[threadIdx.x] = mark;
    __syncthreads();
    for (unsigned step = 1; step < kThreads; step *= 2) {
      const int64_t other = threadIdx.x >= step ? scan[threadIdx.x - step] : 0;
      __syncthreads();
      if (other > scan[threadIdx.x]) scan[threadIdx.x] = other;
      __syncthreads();
    }
    const int64_t doc = scan[threadIdx.x] > carry ? scan[threadIdx.x] : carry;
    if (t < T) {
      int64_t first = doc;
      if (window > 0 && t - window + 1 > first) first = t - window + 1;
      starts[row * T + t] = static_cast<int32_t>(first);
      if (positions) positions[row * T + t] = t - doc;
    }
    const int64_t last = scan[kThreads - 1];
    __syncthreads();  // (every thread has read the chunk's scan)
    if (last > carry) carry = last;
  }
}

}  // namespace

void document_starts(const void* ids, bool ids64, int64_t B, int64_t T, int64_t eod, int64_t window,
                     int32_t* starts, int64_t* positions, cudaStream_t stream) {
  if (B < 0 || T < 0 || T > INT32_MAX || window < 0) {
    throw std::invalid_argument("document_starts: rows (B " + std::to_string(B) + ", T " +
                                std::to_string(T) + ") and window " + std::to_string(window) +
                                " (expected B, T >= 0, T < 2^31, window >= 0)");
  }
  if (B == 0 || T == 0) return;
  document_starts_kernel<<<static_cast<unsigned>(B), kThreads, 0, stream>>>(
      ids, ids64, T, eod, window, starts, positions);
  check_launch("document_starts");
}

}  // namespace triad::kernels
