// The head's cross entropy on the CPU: the loss and the logits' gradient
// written in one call (cross_entropy_forward_backward, what a training step
// runs) against the two calls it replaces (cross_entropy_forward, then
// cross_entropy_backward), in place over padded logits rows as
// linear_cross_entropy keeps them. Counters: the logits' bytes one read and
// one write would move, per second.
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "triad/backend/backend.h"
#include "triad/ops.h"

namespace {

struct Head {
  triad::Tensor logits, targets, losses, lse, dlosses;
};

Head make_head(int64_t N, int64_t V, triad::DType dtype) {
  const int64_t ld = triad::padded_logits_row(V);
  const triad::DType sd = dtype == triad::DType::F64 ? triad::DType::F64 : triad::DType::F32;
  triad::Tensor rows = triad::randn({N, ld}, 1, 1, 2.0, dtype);
  std::vector<int64_t> t(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) t[static_cast<size_t>(i)] = (i * 2654435761LL) % V;
  return {triad::make_view(rows, {N, V}, {ld, 1}, 0), triad::from_vector(t, {N}, triad::DType::I64),
          triad::empty({N}, sd), triad::empty({N}, sd),
          triad::full({N}, 1.0 / static_cast<double>(N), sd)};
}

void set_bytes(benchmark::State& state, const Head& h) {
  const double bytes = 2.0 * static_cast<double>(h.logits.numel()) *
                       static_cast<double>(triad::dtype_size(h.logits.dtype()));
  state.counters["GB/s"] = benchmark::Counter(bytes * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

triad::DType dtype_of(int64_t code) {
  return code ? triad::DType::BF16 : triad::DType::F32;
}

// (Each iteration runs over the previous one's gradient: the same work on
// other finite values.)
void BM_CrossEntropyTwoCalls(benchmark::State& state) {
  Head h = make_head(state.range(0), state.range(1), dtype_of(state.range(2)));
  triad::Backend& be = triad::backend_for(h.logits);
  for (auto _ : state) {
    be.cross_entropy_forward(h.logits, h.targets, -100, h.losses, h.lse);
    be.cross_entropy_backward(h.logits, h.targets, h.lse, h.dlosses, triad::Tensor(), -100,
                              h.logits, 0.0);
    benchmark::DoNotOptimize(h.logits.raw_data());
  }
  set_bytes(state, h);
}

void BM_CrossEntropyOneCall(benchmark::State& state) {
  Head h = make_head(state.range(0), state.range(1), dtype_of(state.range(2)));
  triad::Backend& be = triad::backend_for(h.logits);
  for (auto _ : state) {
    be.cross_entropy_forward_backward(h.logits, h.targets, -100, h.losses, h.lse, h.dlosses,
                                      h.logits, 0.0);
    benchmark::DoNotOptimize(h.logits.raw_data());
  }
  set_bytes(state, h);
}

// (rows, vocabulary, 0 f32 | 1 bf16): the CPU training benchmark's head
// (batch 8 x seq 256, vocabulary 8192) and GPT-2's vocabulary.
void shapes(benchmark::internal::Benchmark* b) {
  b->Args({2048, 8192, 0})->Args({2048, 8192, 1})->Args({512, 50257, 0});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_CrossEntropyTwoCalls)->Apply(shapes);
BENCHMARK(BM_CrossEntropyOneCall)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
