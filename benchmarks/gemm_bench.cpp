// GEMM GFLOP/s on the CPU: Triad's backend (OpenMP row split over
// single-threaded OpenBLAS) against OpenBLAS's own threaded sgemm and Eigen,
// for the shapes a GPT layer produces. Counters report GFLOP/s.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include "triad/backend/backend.h"
#include "triad/ops/creation.h"

#ifdef TRIAD_BENCH_EIGEN
#include <Eigen/Dense>
#endif

namespace {

void set_flops(benchmark::State& state, int64_t M, int64_t N, int64_t K) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * M * N * K * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void BM_TriadGemm(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  triad::Tensor a = triad::randn({M, K}, 1, 1), b = triad::randn({N, K}, 1, 2),
                c = triad::empty({M, N});
  triad::Backend& be = triad::backend_for(triad::DeviceType::CPU);
  for (auto _ : state) {
    be.gemm(a, b, c, false, true, 1.0, 0.0);
    benchmark::DoNotOptimize(c.raw_data());
  }
  set_flops(state, M, N, K);
}

void BM_OpenBlasThreadedSgemm(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  triad::Tensor a = triad::randn({M, K}, 1, 1), b = triad::randn({N, K}, 1, 2),
                c = triad::empty({M, N});
  triad::backend_for(
      triad::DeviceType::CPU);  // constructs the backend (which pins BLAS to 1 thread)
  openblas_set_num_threads(omp_get_max_threads());
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.data<float>(), K,
                b.data<float>(), K, 0.0f, c.data<float>(), N);
    benchmark::DoNotOptimize(c.raw_data());
  }
  openblas_set_num_threads(1);
  set_flops(state, M, N, K);
}

#ifdef TRIAD_BENCH_EIGEN
void BM_EigenGemm(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Mat a = Mat::Random(M, K), b = Mat::Random(N, K), c(M, N);
  for (auto _ : state) {
    c.noalias() = a * b.transpose();
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, M, N, K);
}
#endif

// (M, N, K) of the benchmark GPT (d_model 384, 8 x 256 tokens): QKV, MLP up,
// MLP down, the vocab head, and one square 1024 problem.
void shapes(benchmark::internal::Benchmark* b) {
  b->Args({2048, 1152, 384})
      ->Args({2048, 1536, 384})
      ->Args({2048, 384, 1536})
      ->Args({2048, 8192, 384})
      ->Args({1024, 1024, 1024})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

BENCHMARK(BM_TriadGemm)->Apply(shapes);
BENCHMARK(BM_OpenBlasThreadedSgemm)->Apply(shapes);
#ifdef TRIAD_BENCH_EIGEN
BENCHMARK(BM_EigenGemm)->Apply(shapes);
#endif

}  // namespace

BENCHMARK_MAIN();
