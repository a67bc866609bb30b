#include "src/backend/cpu/parallel_for.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <vector>

namespace triad::detail {
namespace {

// Sets the OpenMP thread count for one test and puts it back after.
class Threads {
 public:
  explicit Threads(int n) : before_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~Threads() { omp_set_num_threads(before_); }

 private:
  int before_;
};

constexpr int64_t kN = 1000;

// How many times each index was visited, the largest team a visit saw and
// the deepest nesting of parallel regions (a region entered with a team of
// one counts: that is the cost the helpers avoid).
struct Visits {
  std::vector<std::atomic<int>> hits = std::vector<std::atomic<int>>(kN);
  std::atomic<int> widest{0}, deepest{0};
  static void raise(std::atomic<int>& to, int value) {
    int seen = to.load();
    while (value > seen && !to.compare_exchange_weak(seen, value)) {
    }
  }
  void visit(int64_t i) {
    ++hits[static_cast<size_t>(i)];
    raise(widest, omp_get_num_threads());
    raise(deepest, omp_get_level());
  }
  bool each_once() const {
    return std::all_of(hits.begin(), hits.end(), [](const auto& h) { return h.load() == 1; });
  }
};

// Each loop visits every index once; it runs on a team of two only when
// told the work is enough and two threads are allowed, else on this thread
// alone (no parallel region: one costs a system call even for a team of one).
TEST(CpuParallelFor, VisitsEveryIndexOnceAndUsesATeamOnlyWhenItPays) {
  for (const int threads : {1, 2}) {
    for (const bool enough : {false, true}) {
      const Threads scope(threads);
      const int want = threads == 2 && enough ? 2 : 1;
      Visits a, b, c;
      parallel_for(kN, enough, [&](int64_t i) { a.visit(i); });
      parallel_for_simd(kN, enough, [&](int64_t i) { b.visit(i); });
      on_team(enough, [&] {
#pragma omp for schedule(dynamic)
        for (int64_t i = 0; i < kN; ++i) c.visit(i);
      });
      for (const Visits* v : {&a, &b, &c}) {
        EXPECT_TRUE(v->each_once()) << threads << " threads, enough " << enough;
        EXPECT_EQ(v->widest.load(), want) << threads << " threads, enough " << enough;
        EXPECT_EQ(v->deepest.load(), want == 2 ? 1 : 0) << threads << " threads, enough " << enough;
      }
    }
  }
}

// Inside a team already running, a loop runs whole on each calling thread.
TEST(CpuParallelFor, InsideATeamEachThreadRunsTheWholeLoop) {
  const Threads scope(2);
  std::vector<Visits> per_thread(2);
  std::atomic<int> ran{0};
#pragma omp parallel num_threads(2)
  {
    Visits& v = per_thread[static_cast<size_t>(omp_get_thread_num())];
    parallel_for(kN, true, [&](int64_t i) { v.visit(i); });
    ++ran;
  }
  ASSERT_EQ(ran.load(), 2);
  for (const Visits& v : per_thread) {
    EXPECT_TRUE(v.each_once());
    EXPECT_EQ(v.widest.load(), 2);   // the enclosing team's size
    EXPECT_EQ(v.deepest.load(), 1);  // and no region nested in it
  }
}

}  // namespace
}  // namespace triad::detail
