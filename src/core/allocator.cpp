#include "triad/core/allocator.h"

#include <malloc.h>
#include <algorithm>
#include <atomic>

#include <cstdlib>
#include <new>
#include <string>

#include "triad/core/error.h"

namespace triad {
namespace {

class CpuAllocator final : public Allocator {
 public:
  CpuAllocator() {
    // Training allocates and frees the same large activation buffers every
    // step. Keep them in the malloc heap (no mmap/munmap and page faults per
    // op); the heap is still returned to the system beyond 1 GiB of slack.
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  void* allocate(size_t nbytes) override {
    const size_t rounded = std::max<size_t>(64, (nbytes + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, rounded);
    if (!p)
      throw Error("cpu allocator: out of memory allocating " + std::to_string(nbytes) + " bytes");
    const int64_t now =
        allocated_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    ++num_allocs_;
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    std::free(ptr);
    allocated_ -= static_cast<int64_t>(nbytes);
  }
  Device device() const override { return Device::cpu(); }
  AllocatorStats stats() const override {
    AllocatorStats s;
    s.allocated = allocated_.load();
    s.peak_allocated = peak_.load();
    s.reserved = s.allocated;
    s.num_allocs = num_allocs_.load();
    s.system_allocs = s.num_allocs;
    return s;
  }
  void reset_peak() override { peak_ = allocated_.load(); }

 private:
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> num_allocs_{0};
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator allocator;
  return allocator;
}

}  // namespace triad
