// Point-to-point exchange time between pairs of ranks (r and r ^ 1) on the
// MPI process group, as the pipeline executor exchanges activations and
// gradients: one batch_isend_irecv holding a send and a receive, waited for.
// Per message size, two columns:
//   on time  both ranks post together: the exchange itself;
//   late     one rank posts --late-us after its peer (the two take turns),
//            and the column is the late rank's time from posting to done:
//            what the exchange adds once the peer has been waiting. A rank
//            that waits must keep its side moving; if it sleeps between
//            polls, this column grows by the sleeps.
// Every exchange's payload is checked (each rank sends r + 1); "#wrong"
// counts elements that differ and the program exits 1 when any does.
//   mpirun -np 2 bench_p2p --min-bytes 4K --max-bytes 4M --late-us 500
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "byte_sizes.h"
#include "triad/dist/world.h"
#include "triad/ops.h"

namespace {

using Clock = std::chrono::steady_clock;

// Keeps the core busy for `us` microseconds, as a compute pass would.
void busy_for(double us) {
  const auto start = Clock::now();
  while (std::chrono::duration<double, std::micro>(Clock::now() - start).count() < us) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Triad point-to-point exchange benchmark"};
  std::string min_s = "4K", max_s = "4M";
  int iters = 100;
  double factor = 4, late_us = 500;
  app.add_option("--min-bytes", min_s)
      ->check(triad::bench::byte_count_error)
      ->capture_default_str();
  app.add_option("--max-bytes", max_s)
      ->check(triad::bench::byte_count_error)
      ->capture_default_str();
  app.add_option("--factor", factor)->capture_default_str();
  app.add_option("--iters", iters, "exchanges timed per size and column")->capture_default_str();
  app.add_option("--late-us", late_us, "how much later the late rank posts")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  using namespace triad;
  dist::ProcessGroupPtr world = dist::init_world();
  const int n = world->size(), r = world->rank();
  if (n % 2 != 0) {
    if (r == 0)
      std::fprintf(stderr, "bench_p2p: %d ranks; expected an even number (pairs r, r ^ 1)\n", n);
    return 2;
  }
  if (iters < 2 || !(factor > 1) || late_us < 0) {
    if (r == 0)
      std::fprintf(stderr,
                   "bench_p2p: --iters (%d) must be >= 2, --factor (%g) > 1, --late-us "
                   "(%g) >= 0\n",
                   iters, factor, late_us);
    return 2;
  }
  const int peer = r ^ 1;
  if (r == 0) {
    std::printf("# exchanges between rank pairs, %d ranks (MPI process group), late by %g us\n", n,
                late_us);
    std::printf("# %12s %14s %14s %8s\n", "size(B)", "on time(us)", "late(us)", "#wrong");
  }
  bool any_wrong = false;
  for (int64_t bytes = bench::parse_bytes(min_s); bytes <= bench::parse_bytes(max_s);
       bytes = std::max<int64_t>(bytes + 1, static_cast<int64_t>(bytes * factor))) {
    const int64_t count = std::max<int64_t>(1, bytes / 4);
    Tensor out = full({count}, static_cast<double>(r + 1)), in = empty({count}, DType::F32);
    int64_t wrong = 0;
    // Seconds this rank spent in exchanges it posted on time / late.
    double on_time = 0, late = 0;
    int lates = 0;
    auto exchange = [&] {
      const auto t0 = Clock::now();
      world->batch_isend_irecv({{true, out, peer, 0}, {false, in, peer, 0}})->wait();
      return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    };
    auto check = [&] {
      for (double x : to_double_vector(in)) wrong += x != peer + 1;
    };
    exchange();  // warm-up: connections, buffers
    world->barrier()->wait();
    for (int i = 0; i < iters; ++i) {
      on_time += exchange();
      check();
    }
    world->barrier()->wait();
    for (int i = 0; i < iters; ++i) {
      // The pair takes turns being late: rank r is late on every other one.
      const bool mine = (i + r) % 2 == 0;
      if (mine) busy_for(late_us);
      const double us = exchange();
      if (mine) {
        late += us;
        ++lates;
      }
      check();
    }
    Tensor stats =
        from_vector(std::vector<double>{on_time / iters, late / lates, static_cast<double>(wrong)},
                    {3}, DType::F64);
    world->all_reduce(stats, dist::ReduceOp::Sum)->wait();
    const std::vector<double> s = to_double_vector(stats);
    any_wrong = any_wrong || s[2] > 0;
    if (r == 0) {
      std::printf("  %12lld %14.1f %14.1f %8lld\n", static_cast<long long>(count * 4), s[0] / n,
                  s[1] / n, static_cast<long long>(s[2]));
    }
  }
  if (any_wrong && r == 0)
    std::fprintf(stderr, "bench_p2p: some payloads were wrong (#wrong above)\n");
  return any_wrong ? 1 : 0;
}
