// The partial gradients a tensor-parallel model sums over its group after
// backward (under sequence parallelism every norm and row-parallel bias,
// the query/key norms, shared key/value heads): TensorParallelGpt's one
// all-reduce of them all, against one all-reduce per tensor. The world is
// the tensor-parallel group.
//   mpirun -np 2 bench_partial_grads --layers 48 --d-model 256 --heads 4 --repeats 200
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <vector>

#include "triad/autograd/engine.h"
#include "triad/dist/world.h"
#include "triad/ops.h"
#include "triad/parallel/tensor/gpt.h"

int main(int argc, char** argv) {
  CLI::App app{"summing a tensor-parallel model's partial gradients: one all-reduce or many"};
  triad::nn::GptConfig cfg;
  cfg.n_layer = 48;
  cfg.d_model = 256;
  cfg.n_head = 4;
  cfg.vocab_size = 512;
  cfg.seq_len = 64;
  int repeats = 200;
  app.add_option("--layers", cfg.n_layer)->capture_default_str();
  app.add_option("--d-model", cfg.d_model)->capture_default_str();
  app.add_option("--heads", cfg.n_head)->capture_default_str();
  app.add_option("--repeats", repeats)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  auto world = triad::dist::init_world();  // (MPI finalised at exit)
  {
    triad::tp::TensorParallelGpt model(cfg, 1, world, /*sequence_parallel=*/true);
    std::vector<int64_t> ids(static_cast<size_t>(2 * cfg.seq_len));
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int64_t>(i * 7919) % cfg.vocab_size;
    const triad::Tensor in = triad::from_vector(ids, {2, cfg.seq_len});
    triad::autograd::backward({model.loss(in, in)});
    std::vector<triad::Tensor> partial;
    int64_t elements = 0;
    for (auto& [name, p] : model.named_parameters()) {
      if (!model.reduces_after_backward(name)) continue;
      partial.push_back(p.grad());
      elements += p.numel();
    }
    using Clock = std::chrono::steady_clock;
    auto time_ms = [&](const auto& sum) {
      sum();  // warm-up
      world->barrier()->wait();
      const auto t0 = Clock::now();
      for (int r = 0; r < repeats; ++r) sum();
      world->barrier()->wait();
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / repeats;
    };
    const double each = time_ms([&] {
      for (auto& g : partial) world->all_reduce(g, triad::dist::ReduceOp::Sum)->wait();
    });
    const double one = time_ms([&] { model.reduce_partial_grads(); });
    if (world->rank() == 0) {
      std::printf(
          "tp %d, %lld layers, d_model %lld, sequence parallel: %zu partial gradients, %lld "
          "elements\n  one all-reduce per tensor: %.3f ms\n  one all-reduce of them all: %.3f ms "
          "(%.1fx)\n",
          world->size(), static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.d_model),
          partial.size(), static_cast<long long>(elements), each, one, each / one);
    }
  }
  return 0;
}
