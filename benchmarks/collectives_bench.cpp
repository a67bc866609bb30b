// Collective bandwidth in the style of nccl-tests: for each message size, the
// mean time of an operation, the algorithm bandwidth (bytes / time) and the
// bus bandwidth (algbw x the op's traffic factor: all_reduce 2(n-1)/n,
// all_gather and reduce_scatter (n-1)/n, broadcast 1), comparable across
// rank counts and with the links' nominal speed. Before each size is timed,
// one call on known values (rank r contributes r + 1) is checked against
// the result the op must give; "#wrong" counts the elements that differ,
// and the program exits 1 when any does. On the NCCL group a wait() only
// orders the caller's stream, so the timed loop ends with a device
// synchronisation: the time is the collectives', not their enqueueing.
//   mpirun -np 4 bench_collectives --op all_reduce --min-bytes 8 --max-bytes 64M
//   mpirun -np 8 bench_collectives --backend nccl     (one GPU per rank: local rank)
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "byte_sizes.h"
#include "triad/backend/cuda.h"
#include "triad/dist/nccl.h"
#include "triad/dist/world.h"
#include "triad/ops.h"

int main(int argc, char** argv) {
  CLI::App app{"Triad collective benchmark"};
  std::string op = "all", min_s = "8", max_s = "64M", dtype_name = "f32";
  int iters = 20, warmup = 5;
  double factor = 2;
  app.add_option("--op", op, "all_reduce, all_gather, reduce_scatter, broadcast or all");
  app.add_option("--min-bytes", min_s)->check(triad::bench::byte_count_error);
  app.add_option("--max-bytes", max_s)->check(triad::bench::byte_count_error);
  app.add_option("--factor", factor);
  app.add_option("--iters", iters);
  app.add_option("--warmup", warmup);
  app.add_option("--dtype", dtype_name, "f32, bf16, ...");
  std::string backend = "mpi";
  app.add_option("--backend", backend, "mpi (host tensors) or nccl (cuda tensors)")
      ->check(CLI::IsMember({"mpi", "nccl"}));
  CLI11_PARSE(app, argc, argv);
  using namespace triad;
  dist::ProcessGroupPtr mpi_world = dist::init_world();
  dist::ProcessGroupPtr world = mpi_world;
  Device device = Device::cpu();
  if (backend == "nccl") {
    // One GPU per rank: the rank on its node picks the device.
    const dist::NodeInfo node = dist::node_info(mpi_world);
    const int count = cuda::device_count();
    if (count == 0) {
      std::fprintf(stderr, "--backend nccl: no CUDA device is visible\n");
      return 2;
    }
    device = Device::cuda(node.local_rank % count);
    world = dist::make_nccl_group(mpi_world, device.index);
  }
  const int n = world->size();
  const DType dt = dtype_from_name(dtype_name);
  const int64_t esize = static_cast<int64_t>(dtype_size(dt));
  std::vector<std::string> ops =
      op == "all"
          ? std::vector<std::string>{"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
          : std::vector<std::string>{op};
  bool any_wrong = false;
  for (const auto& name : ops) {
    if (world->rank() == 0) {
      std::printf("# %s, %d ranks, %s (%s process group)\n", name.c_str(), n, dtype_name.c_str(),
                  backend == "nccl" ? "NCCL" : "MPI");
      std::printf("# %12s %12s %10s %10s %10s %8s\n", "size(B)", "count", "time(us)", "algbw(GB/s)",
                  "busbw(GB/s)", "#wrong");
    }
    const double bus = name == "all_reduce"  ? 2.0 * (n - 1) / n
                       : name == "broadcast" ? 1.0
                                             : 1.0 * (n - 1) / n;
    for (int64_t bytes = bench::parse_bytes(min_s); bytes <= bench::parse_bytes(max_s);
         bytes = std::max<int64_t>(bytes + 1, static_cast<int64_t>(bytes * factor))) {
      // Sizes are of the whole result; per-rank pieces for gather/scatter.
      const int64_t count = std::max<int64_t>(n, bytes / esize / n * n);
      const double mine = world->rank() + 1, sum = n * (n + 1) / 2.0;
      Tensor full_t = full({count}, mine, dt, device), piece = full({count / n}, mine, dt, device);
      auto run = [&] {
        if (name == "all_reduce")
          world->all_reduce(full_t, dist::ReduceOp::Sum)->wait();
        else if (name == "all_gather")
          world->all_gather(piece, full_t)->wait();
        else if (name == "reduce_scatter")
          world->reduce_scatter(full_t, piece, dist::ReduceOp::Sum)->wait();
        else
          world->broadcast(full_t, 0)->wait();
      };
      auto finish = [&] {
        if (device.is_cuda()) cuda::synchronize(device.index);
      };
      run();
      // What the op must leave: the sum of every rank's r + 1, each rank's
      // piece in rank order, or root 0's values.
      const bool scattered = name == "reduce_scatter";
      const std::vector<double> got = to_double_vector(scattered ? piece : full_t);
      int64_t wrong = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double want = name == "all_reduce" || scattered ? sum
                            : name == "all_gather" ? static_cast<double>(i / (count / n) + 1)
                                                   : 1.0;
        if (got[i] != want) ++wrong;
      }
      Tensor wrong_t =
          from_vector(std::vector<double>{static_cast<double>(wrong)}, {1}, DType::F64);
      mpi_world->all_reduce(wrong_t, dist::ReduceOp::Sum)->wait();
      const auto total_wrong = static_cast<int64_t>(to_double_vector(wrong_t)[0]);
      any_wrong = any_wrong || total_wrong > 0;
      for (int i = 0; i < warmup; ++i) run();
      finish();
      mpi_world->barrier()->wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) run();
      finish();
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          iters;
      if (world->rank() == 0) {
        const double algbw = static_cast<double>(count * esize) / us / 1e3;
        std::printf("  %12lld %12lld %10.1f %10.2f %10.2f %8lld\n",
                    static_cast<long long>(count * esize), static_cast<long long>(count), us, algbw,
                    algbw * bus, static_cast<long long>(total_wrong));
      }
    }
  }
  if (any_wrong && world->rank() == 0) {
    std::fprintf(stderr, "bench_collectives: some results were wrong (#wrong above)\n");
  }
  return any_wrong ? 1 : 0;
}
