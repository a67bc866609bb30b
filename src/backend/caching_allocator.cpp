#include "triad/backend/caching_allocator.h"

#include <algorithm>
#include <string>
#include <thread>
#include <utility>

#include "triad/core/error.h"

namespace triad {

size_t CachingAllocator::round_size(size_t nbytes) {
  constexpr size_t kSmall = 512, kLarge = 2u << 20, kSmallLimit = 1u << 20;
  if (nbytes == 0) return kSmall;
  if (nbytes <= kSmallLimit) return (nbytes + kSmall - 1) / kSmall * kSmall;
  return (nbytes + kLarge - 1) / kLarge * kLarge;
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  free_cached_locked();
  for (auto& [graph, pool] : graph_pools_)
    for (auto& [size, ptr] : pool) raw_.deallocate(ptr, size);
  // Blocks still handed out are the caller's leak; give them back too.
  for (auto& [ptr, b] : live_) raw_.deallocate(ptr, b.size);
  live_.clear();
}

std::pair<void*, size_t> CachingAllocator::take_cached(Pools& pools, size_t size, uint64_t pool,
                                                       bool larger) {
  auto p = pools.find(pool);
  if (p == pools.end()) return {nullptr, 0};
  // Blocks are never split: a larger one wastes its surplus while it is
  // handed out, so only one less than twice the size is taken, the
  // smallest there is.
  auto it = p->second.lower_bound(size);
  if (it == p->second.end() || (it->first != size && (!larger || it->first >= 2 * size)))
    return {nullptr, 0};
  const std::pair<void*, size_t> taken{it->second, it->first};
  p->second.erase(it);
  return taken;
}

void* CachingAllocator::allocate_on(size_t nbytes, uint64_t stream) {
  size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  // The size's own class first (this stream's, then the shared pool), then
  // a larger block: a request whose size varies from step to step (a
  // mixture's tokens per expert) reuses a block of a nearby class instead
  // of asking the device for one each time.
  std::pair<void*, size_t> taken{nullptr, 0};
  // (A capture takes its own freed blocks first: its replays reuse them in
  // the order the capture did.)
  const uint64_t graph =
      capturing_ != 0 && std::this_thread::get_id() == capturer_ ? capturing_ : 0;
  if (graph != 0) {
    for (bool larger : {false, true})
      if (!taken.first) taken = take_cached(graph_pools_, size, graph, larger);
  }
  for (bool larger : {false, true}) {
    if (!taken.first) taken = take_cached(pools_, size, stream, larger);
    if (!taken.first) taken = take_cached(pools_, size, kShared, larger);
  }
  void* ptr = taken.first;
  if (ptr) size = taken.second;
  if (!ptr) {
    ptr = raw_.allocate(size);
    if (!ptr && graph == 0) {
      // Out of memory: hand every cached block back and try once more (not
      // during a capture, whose thread may not free device memory).
      free_cached_locked();
      ptr = raw_.allocate(size);
    }
    if (!ptr) {
      throw Error("out of memory on " + raw_.device().str() + ": " + std::to_string(nbytes) +
                  " bytes requested (" + std::to_string(size) + " rounded); " +
                  std::to_string(stats_.allocated) + " bytes allocated, " +
                  std::to_string(stats_.reserved) + " reserved" +
                  (graph != 0 ? " (during a CUDA graph's capture: the cache was kept)" : ""));
    }
    stats_.reserved += static_cast<int64_t>(size);
    ++stats_.system_allocs;
  }
  live_[ptr] = {size, stream, graph};
  stats_.allocated += static_cast<int64_t>(size);
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  ++stats_.num_allocs;
  return ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) throw Error("CachingAllocator: freeing a pointer it did not allocate");
  const Block b = it->second;
  live_.erase(it);
  stats_.allocated -= static_cast<int64_t>(b.size);
  // A block freed during a capture may be read by the graph's replays; one
  // of a graph is written by them.
  const uint64_t graph = capturing_ != 0 ? capturing_ : b.graph;
  if (graph != 0 && graph_pools_.count(graph)) {
    graph_pools_[graph].emplace(b.size, ptr);
    return;
  }
  pools_[b.stream].emplace(b.size, ptr);
}

void CachingAllocator::begin_capture(uint64_t graph) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (graph == 0) throw Error("CachingAllocator::begin_capture: graph 0 (expected a nonzero id)");
  if (capturing_ != 0) {
    throw Error("CachingAllocator::begin_capture: graph " + std::to_string(capturing_) +
                " is being captured on " + raw_.device().str() + " (one capture at a time)");
  }
  capturing_ = graph;
  capturer_ = std::this_thread::get_id();
  graph_pools_[graph];
  // The blocks handed out now may be the graph's inputs (or what they were
  // made from): freed while it lives, they join its pool too, rather than
  // serve other tensors whose values each replay would then read.
  for (auto& [ptr, b] : live_)
    if (b.graph == 0) b.graph = graph;
}

void CachingAllocator::end_capture() {
  std::lock_guard<std::mutex> lock(mutex_);
  capturing_ = 0;
}

void CachingAllocator::release_graph(uint64_t graph, uint64_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto g = graph_pools_.find(graph);
  if (g == graph_pools_.end()) return;
  pools_[stream].insert(g->second.begin(), g->second.end());
  graph_pools_.erase(g);
  for (auto& [ptr, b] : live_)
    if (b.graph == graph) b.graph = 0;
}

void CachingAllocator::note_replay(uint64_t graph) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto g = graph_pools_.find(graph);
  if (g == graph_pools_.end()) return;
  int64_t pooled = 0;
  for (const auto& [size, ptr] : g->second) pooled += static_cast<int64_t>(size);
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated + pooled);
}

void CachingAllocator::release_stream(uint64_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto p = pools_.find(stream);
  if (p == pools_.end() || stream == kShared) return;
  pools_[kShared].insert(p->second.begin(), p->second.end());
  pools_.erase(stream);
}

void CachingAllocator::free_cached_locked() {
  for (auto& [stream, pool] : pools_) {
    for (auto& [size, ptr] : pool) {
      raw_.deallocate(ptr, size);
      stats_.reserved -= static_cast<int64_t>(size);
    }
  }
  pools_.clear();
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  free_cached_locked();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated = stats_.allocated;
}

}  // namespace triad
