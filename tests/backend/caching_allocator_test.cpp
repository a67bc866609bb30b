#include "triad/backend/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <thread>
#include <utility>

#include "triad/core/error.h"

namespace triad {
namespace {

// Host memory standing in for a device, with a capacity and counters.
class FakeDevice final : public RawMemory {
 public:
  explicit FakeDevice(size_t capacity) : capacity_(capacity) {}
  ~FakeDevice() override { EXPECT_EQ(in_use_, 0u) << "device memory leaked"; }
  void* allocate(size_t n) override {
    if (in_use_ + n > capacity_) return nullptr;
    in_use_ += n;
    ++calls_;
    return std::malloc(n);
  }
  void deallocate(void* p, size_t n) override {
    in_use_ -= n;
    std::free(p);
  }
  Device device() const override { return Device::cuda(0); }
  size_t in_use() const { return in_use_; }
  int calls() const { return calls_; }

 private:
  size_t capacity_, in_use_ = 0;
  int calls_ = 0;
};

TEST(CachingAllocator, RoundsToSizeClasses) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(1 << 20), 1u << 20);
  EXPECT_EQ(CachingAllocator::round_size((1 << 20) + 1), 2u << 20);
  EXPECT_EQ(CachingAllocator::round_size((5 << 20) + 7), 6u << 20);
}

TEST(CachingAllocator, ReusesFreedBlocksOfTheSameClassAndStream) {
  FakeDevice dev(64 << 20);
  CachingAllocator a(dev);
  void* p = a.allocate_on(1000, 1);
  a.deallocate(p, 1000);
  EXPECT_EQ(a.allocate_on(900, 1), p);  // same class (1024), same stream: cached
  EXPECT_EQ(dev.calls(), 1);
  void* q = a.allocate_on(1000, 2);  // another stream: not yet
  EXPECT_NE(q, p);
  EXPECT_EQ(dev.calls(), 2);
  auto s = a.stats();
  EXPECT_EQ(s.allocated, 2048);
  EXPECT_EQ(s.reserved, 2048);
  EXPECT_EQ(s.peak_allocated, 2048);
  a.deallocate(q, 1000);
  a.release_stream(2);  // stream 2 synchronised: its blocks become shared
  void* r = a.allocate_on(1000, 3);
  EXPECT_EQ(r, q);
  EXPECT_EQ(dev.calls(), 2);
  a.deallocate(r, 1000);
  a.deallocate(p, 900);
  EXPECT_EQ(a.stats().allocated, 0);
  EXPECT_EQ(a.stats().reserved, 2048);  // cached
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0);
  EXPECT_EQ(dev.in_use(), 0u);
}

// A request whose class is not cached takes the smallest cached block
// below twice its class (its own stream's, then the shared pool's), counted
// at the block's size, rather than asking the device: a mixture of experts'
// tokens per expert vary every step, and each new class was a cudaMalloc on
// the step's path. A block twice the class or more is left for its own.
TEST(CachingAllocator, ReusesTheSmallestLargerBlockBelowTwiceTheSize) {
  FakeDevice dev(256 << 20);
  CachingAllocator a(dev);
  void* b10 = a.allocate_on(10 << 20, 1);
  void* b14 = a.allocate_on(14 << 20, 1);
  a.deallocate(b14, 14 << 20);
  a.deallocate(b10, 10 << 20);
  EXPECT_EQ(dev.calls(), 2);
  EXPECT_EQ(a.stats().system_allocs, 2);
  // 7 MiB (class 8): the 10 MiB block, not the 14.
  void* p = a.allocate_on(7 << 20, 1);
  EXPECT_EQ(p, b10);
  EXPECT_EQ(a.stats().allocated, 10 << 20);
  // 6 MiB: the 14 MiB block is 2.33x its class; the device is asked.
  void* q = a.allocate_on(6 << 20, 1);
  EXPECT_NE(q, b14);
  EXPECT_EQ(dev.calls(), 3);
  EXPECT_EQ(a.stats().system_allocs, 3);
  EXPECT_EQ(a.stats().num_allocs, 4);
  // The 10 MiB block returns to its own class, whatever was asked for.
  a.deallocate(p, 7 << 20);
  EXPECT_EQ(a.allocate_on(10 << 20, 1), b10);
  // An exact class elsewhere wins over a larger block here: the shared
  // pool's 12 MiB block before this stream's 14.
  void* b12 = a.allocate_on(12 << 20, 2);
  a.deallocate(b12, 12 << 20);
  a.release_stream(2);
  EXPECT_EQ(a.allocate_on(11 << 20, 1), b12);
  // Another stream's unreleased blocks are never taken.
  void* b16 = a.allocate_on(16 << 20, 3);
  a.deallocate(b16, 16 << 20);
  void* r = a.allocate_on(9 << 20, 1);  // 10 MiB class; 14 cached on stream 1
  EXPECT_EQ(r, b14);
  EXPECT_EQ(dev.calls(), 5);
  for (auto [ptr, n] :
       {std::pair<void*, size_t>{q, 6 << 20}, {b10, 10 << 20}, {b12, 11 << 20}, {r, 9 << 20}})
    a.deallocate(ptr, n);
  EXPECT_EQ(a.stats().allocated, 0);
  a.empty_cache();
}

TEST(CachingAllocator, OutOfMemoryFreesTheCacheThenFailsClearly) {
  FakeDevice dev(6 << 20);
  CachingAllocator a(dev);
  void* big = a.allocate(4 << 20);
  a.deallocate(big, 4 << 20);         // cached, still reserved
  void* other = a.allocate(3 << 20);  // the same 4 MiB class: the cached block
  EXPECT_EQ(other, big);
  a.deallocate(other, 3 << 20);
  // A different class that only fits once the cache is returned.
  void* mid = a.allocate(5 << 20);  // rounds to 6 MiB: needs the 4 MiB block freed first
  EXPECT_NE(mid, nullptr);
  EXPECT_EQ(a.stats().reserved, 6 << 20);
  try {
    a.allocate(1 << 20);
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of memory on cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find("1048576 bytes requested"), std::string::npos) << m;
  }
  a.deallocate(mid, 5 << 20);
  EXPECT_THROW(a.deallocate(reinterpret_cast<void*>(0x1234), 8), Error);
}

// During a capture the cache is not handed back on running out (freeing
// device memory would spoil the capture): the request fails, saying so,
// and the cached blocks stay.
TEST(CachingAllocator, OutOfMemoryDuringACaptureKeepsTheCache) {
  FakeDevice dev(6 << 20);
  CachingAllocator a(dev);
  void* big = a.allocate(4 << 20);
  a.deallocate(big, 4 << 20);  // cached
  a.begin_capture(5);
  try {
    a.allocate(5 << 20);
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("during a CUDA graph's capture"), std::string::npos) << m;
  }
  EXPECT_EQ(dev.in_use(), 4u << 20);
  a.end_capture();
  void* mid = a.allocate(5 << 20);  // outside it, the cache goes back first
  EXPECT_NE(mid, nullptr);
  a.deallocate(mid, 5 << 20);
  a.release_graph(5, 0);
  a.empty_cache();
}

// A CUDA graph's replays write the addresses its capture saw: from the
// capture until the graph is released, the blocks it was handed or that
// were freed during it go to no other request. Inside the capture its own
// freed blocks are reused (its replays run in the capture's order).
TEST(CachingAllocator, AGraphsBlocksStayItsOwnUntilItIsReleased) {
  FakeDevice dev(64 << 20);
  CachingAllocator a(dev);
  void* before = a.allocate_on(1000, 1);  // an input the capture reads, freed during it
  void* cached = a.allocate_on(4096, 1);
  a.deallocate(cached, 4096);  // in the cache before the capture: the capture may take it
  a.begin_capture(7);
  EXPECT_THROW(a.begin_capture(8), Error);  // one at a time
  void* t = a.allocate_on(4096, 1);
  EXPECT_EQ(t, cached);
  a.deallocate(t, 4096);                 // a temporary of the capture
  EXPECT_EQ(a.allocate_on(4000, 1), t);  // reused within it
  void* out = a.allocate_on(2000, 1);    // an output that outlives the capture
  a.deallocate(t, 4000);
  a.deallocate(before, 1000);
  a.end_capture();
  const int calls = dev.calls();
  // Other work gets neither the temporary's block nor the freed input's.
  void* x = a.allocate_on(4096, 1);
  void* y = a.allocate_on(1000, 1);
  EXPECT_NE(x, t);
  EXPECT_NE(y, before);
  EXPECT_EQ(dev.calls(), calls + 2);
  // The output freed after the capture returns to the graph, not the cache.
  a.deallocate(out, 2000);
  void* z = a.allocate_on(2000, 1);
  EXPECT_NE(z, out);
  // empty_cache keeps the graph's blocks: its replays use them.
  a.deallocate(x, 4096);
  a.deallocate(y, 1000);
  a.deallocate(z, 2000);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 4096 + 1024 + 2048);
  // Released (its last replay queued on stream 1): the blocks are that
  // stream's cache.
  a.release_graph(7, 1);
  EXPECT_EQ(a.allocate_on(4096, 1), t);
  EXPECT_EQ(a.allocate_on(1000, 1), before);
  EXPECT_EQ(a.allocate_on(2000, 1), out);
  a.deallocate(t, 4096);
  a.deallocate(before, 1000);
  a.deallocate(out, 2000);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0);
}

// A replayed graph's temporaries are in use while it runs: the peak after
// a replay counts the blocks its capture freed into its pool, as the
// capture's own peak did, and reset_peak starts the next count from what is
// handed out alone.
TEST(CachingAllocator, AReplayCountsTheGraphsTemporariesInThePeak) {
  FakeDevice dev(64 << 20);
  CachingAllocator a(dev);
  void* kept = a.allocate_on(1024, 1);  // a tensor outside the graph
  a.begin_capture(11);
  void* t1 = a.allocate_on(4096, 1);
  void* t2 = a.allocate_on(8192, 1);
  void* out = a.allocate_on(2048, 1);  // the graph's output, still handed out
  a.deallocate(t1, 4096);
  a.deallocate(t2, 8192);
  a.end_capture();
  EXPECT_EQ(a.stats().peak_allocated, 1024 + 4096 + 8192 + 2048);
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated, 1024 + 2048);
  a.note_replay(11);
  EXPECT_EQ(a.stats().peak_allocated, 1024 + 2048 + 4096 + 8192);
  a.note_replay(12);  // (no such graph: nothing to count)
  EXPECT_EQ(a.stats().peak_allocated, 1024 + 2048 + 4096 + 8192);
  a.release_graph(11, 1);
  a.reset_peak();
  a.note_replay(11);  // released: its blocks are the cache's
  EXPECT_EQ(a.stats().peak_allocated, 1024 + 2048);
  a.deallocate(kept, 1024);
  a.deallocate(out, 2048);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0);
}

// A block handed out before the capture and freed after it (an input the
// graph reads, let go by its caller) joins the graph too: no request takes
// it until the graph is released. One freed before the capture is the
// cache's as ever.
TEST(CachingAllocator, ABlockLiveAtTheCaptureAndFreedAfterItStaysTheGraphs) {
  FakeDevice dev(64 << 20);
  CachingAllocator a(dev);
  void* input = a.allocate_on(3000, 1);
  a.begin_capture(9);
  a.end_capture();
  a.deallocate(input, 3000);
  void* other = a.allocate_on(3000, 1);
  EXPECT_NE(other, input);
  a.deallocate(other, 3000);
  // Released: both are the stream's cache.
  a.release_graph(9, 1);
  const int calls = dev.calls();
  void* p = a.allocate_on(3000, 1);
  void* q = a.allocate_on(3000, 1);
  EXPECT_EQ(dev.calls(), calls);
  EXPECT_EQ(std::set<void*>({p, q}), std::set<void*>({input, other}));
  a.deallocate(p, 3000);
  a.deallocate(q, 3000);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0);
}

// Another thread's requests during a capture are not the graph's (a
// communication thread's buffers); the capturing thread's are.
TEST(CachingAllocator, OnlyTheCapturingThreadsRequestsJoinTheGraph) {
  FakeDevice dev(64 << 20);
  CachingAllocator a(dev);
  a.begin_capture(3);
  void* mine = a.allocate_on(1000, 1);
  void* theirs = nullptr;
  std::thread([&] { theirs = a.allocate_on(1000, 1); }).join();
  a.end_capture();
  a.deallocate(theirs, 1000);  // an ordinary block: back to the cache
  EXPECT_EQ(a.allocate_on(1000, 1), theirs);
  a.deallocate(mine, 1000);  // the graph's
  void* other = a.allocate_on(1000, 1);
  EXPECT_NE(other, mine);
  a.deallocate(other, 1000);
  a.deallocate(theirs, 1000);
  a.release_graph(3, 1);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0);
  EXPECT_THROW(a.begin_capture(0), Error);
}

}  // namespace
}  // namespace triad
