#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "triad/core/allocator.h"

namespace triad {

// Where a caching allocator gets its memory from (cudaMalloc/cudaFree on a
// GPU). allocate returns nullptr when the device is out of memory.
class RawMemory {
 public:
  virtual ~RawMemory() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;
};

// A caching allocator for device memory: requests are rounded to size
// classes (512 B steps up to 1 MiB, then 2 MiB steps), freed blocks stay in a
// per-stream pool and are reused by later requests on the same stream
// (stream order makes that safe without synchronisation): of the same class,
// or where none is cached the smallest cached block less than twice the
// request's class (blocks are never split, so a request whose size varies
// between steps reuses one instead of reaching the device each step). A
// stream's pool joins the shared one only after release_stream() — call it
// once the stream is synchronised. When the device runs out, the allocator
// returns every cached block to it and retries once; a request that still
// fails is an error naming the size and the statistics.
class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(RawMemory& raw) : raw_(raw) {}
  ~CachingAllocator() override;

  void* allocate(size_t nbytes) override { return allocate_on(nbytes, 0); }
  void* allocate_on(size_t nbytes, uint64_t stream);
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return raw_.device(); }
  AllocatorStats stats() const override;
  void reset_peak() override;

  // Moves the blocks freed on `stream` to the shared pool (any stream may
  // then reuse them). Call after the stream has been synchronised.
  void release_stream(uint64_t stream);
  // Returns every cached (free) block to the device.
  void empty_cache();
  // The size class a request is rounded to.
  static size_t round_size(size_t nbytes);

 private:
  static constexpr uint64_t kShared = ~0ull;
  struct Block {
    size_t size;
    uint64_t stream;
  };
  // A cached block of `size` in `pool`, or with `larger` the smallest below
  // twice it; {null, 0} when there is none. Returns the block and its size.
  std::pair<void*, size_t> take_cached(size_t size, uint64_t pool, bool larger);
  void free_cached_locked();

  RawMemory& raw_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;                   // handed out
  std::map<uint64_t, std::multimap<size_t, void*>> pools_;  // stream -> size -> free blocks
  AllocatorStats stats_;
};

}  // namespace triad
