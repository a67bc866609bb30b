#pragma once

#include <omp.h>

#include <cstdint>

namespace triad::detail {

// Loops over [0, n) for the CPU kernels: on the OpenMP team when the work is
// worth one, else on the calling thread. Entering a parallel region costs a
// system call even when its `if` clause is false or the team has one thread
// (libgomp releases the team through a futex): about 1.5 us on the 2-core
// VM, more than a small op's arithmetic and, at the test models' sizes, a
// large share of a training step's host time. So the region is entered only
// with work enough, several threads and no team already running.
inline bool worth_a_team(bool enough_work) {
  return enough_work && omp_get_max_threads() > 1 && !omp_in_parallel();
}

// body(i) for each i, iterations split statically over the team. (Each
// helper's loop on the calling thread calls a copy of the body: the
// original's address goes to the team's outlined function, and GCC does not
// vectorise through a closure that escapes.)
template <class F>
void parallel_for(int64_t n, bool enough_work, F&& body) {
  if (worth_a_team(enough_work)) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) body(i);
  } else {
    auto local = body;
    for (int64_t i = 0; i < n; ++i) local(i);
  }
}

// The same for an elementwise body, vectorised either way.
template <class F>
void parallel_for_simd(int64_t n, bool enough_work, F&& body) {
  if (worth_a_team(enough_work)) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) body(i);
  } else {
    auto local = body;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) local(i);
  }
}

// work() on every thread of a team when worth one, else once on this thread.
// work may set up per-thread scratch and split a loop with an orphaned
// `#pragma omp for`, which outside a team runs the whole loop here (without
// a system call).
template <class F>
void on_team(bool enough_work, F&& work) {
  if (worth_a_team(enough_work)) {
#pragma omp parallel
    work();
  } else {
    auto local = work;
    local();
  }
}

}  // namespace triad::detail
