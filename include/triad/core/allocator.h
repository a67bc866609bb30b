#pragma once

#include <cstddef>
#include <cstdint>

#include "triad/core/device.h"

namespace triad {

// Byte counters an allocator keeps; `peak_allocated` is reset on demand so a
// test or benchmark can measure one region.
struct AllocatorStats {
  int64_t allocated = 0;       // bytes currently handed out
  int64_t peak_allocated = 0;  // high-water mark of `allocated`
  int64_t reserved = 0;        // bytes held from the system (>= allocated)
  int64_t num_allocs = 0;      // allocations served so far
  // Of those, the ones the system served (cudaMalloc for the CUDA backend's
  // caching allocator; every one for the host allocator). In a training
  // loop whose tensors repeat their sizes each step, none after the first.
  int64_t system_allocs = 0;
};

// Provides raw memory for tensor storage on one device. Backends own one each;
// the CUDA backend's is a caching allocator.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
};

// The host allocator: 64-byte aligned blocks, thread-safe counters.
Allocator& cpu_allocator();

}  // namespace triad
