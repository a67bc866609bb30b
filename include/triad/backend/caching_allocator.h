#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
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
  // Returns every cached (free) block to the device (a graph's private
  // blocks stay: its replays use them).
  void empty_cache();

  // CUDA graphs (cuda::capture). A graph's replays write the addresses its
  // capture saw, so from begin_capture(graph) until release_graph(graph)
  // those blocks are the graph's alone. While the capture is open, every
  // block the capturing thread is handed, and every block anyone frees,
  // joins the graph: a request is served from the graph's own freed blocks
  // first (its replays run in the capture's order, so that reuse is safe),
  // then from the cache or the device; a freed block goes to the graph's
  // private pool, never back to the cache. After end_capture the graph's
  // blocks freed later still return to its pool, and so do the blocks that
  // were handed out when the capture began (its inputs, or what they were
  // made from, which its replays may read; a tensor freed after the capture
  // would otherwise lend its memory to another whose values each replay
  // then reads): memory freed while a graph lives stays reserved until the
  // graph is destroyed. release_graph (the graph
  // destroyed; its last replay queued on `stream`) hands its pool to that
  // stream's cache, and its blocks still handed out are ordinary from then
  // on. One capture at a time; throws Error when one is already open.
  void begin_capture(uint64_t graph);
  void end_capture();
  void release_graph(uint64_t graph, uint64_t stream);
  // A replay of `graph` is queued: its freed blocks (the temporaries its
  // capture made and let go, which each replay uses again) count as
  // handed out for the peak, which becomes at least allocated plus them.
  // Between replays they are counted in `reserved` alone, as cached blocks
  // are; without this a replayed step's peak would leave out most of its
  // activations.
  void note_replay(uint64_t graph);
  // The size class a request is rounded to.
  static size_t round_size(size_t nbytes);

 private:
  static constexpr uint64_t kShared = ~0ull;
  struct Block {
    size_t size;
    uint64_t stream;
    uint64_t graph = 0;  // the graph it belongs to (0: none)
  };
  using Pools = std::map<uint64_t, std::multimap<size_t, void*>>;  // key -> size -> free blocks
  // A cached block of `size` in pools[pool], or with `larger` the smallest
  // below twice it; {null, 0} when there is none. Returns the block and its
  // size.
  static std::pair<void*, size_t> take_cached(Pools& pools, size_t size, uint64_t pool,
                                              bool larger);
  void free_cached_locked();

  RawMemory& raw_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;  // handed out
  Pools pools_;                            // stream -> size -> free blocks
  // graph -> size -> its freed blocks; a graph is here from begin_capture
  // to release_graph, and so are its blocks still handed out (by graph).
  Pools graph_pools_;
  uint64_t capturing_ = 0;  // the graph being captured (0: none)
  std::thread::id capturer_;
  AllocatorStats stats_;
};

}  // namespace triad
