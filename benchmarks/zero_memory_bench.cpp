// Optimizer memory per data-parallel rank with and without ZeRO-1: the AdamW
// moments each rank keeps for a GPT of the given shape.
//   mpirun -np 4 bench_zero_memory --layers 6 --d-model 384 --heads 6 --vocab 8192 --seq 256
#include <CLI/CLI.hpp>
#include <cstdio>

#include "triad/dist/world.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"
#include "triad/parallel/data/grad_reducer.h"

int main(int argc, char** argv) {
  CLI::App app{"ZeRO-1 optimizer memory"};
  triad::nn::GptConfig cfg;
  cfg.n_layer = 6;
  cfg.d_model = 384;
  cfg.n_head = 6;
  cfg.vocab_size = 8192;
  cfg.seq_len = 256;
  app.add_option("--layers", cfg.n_layer);
  app.add_option("--d-model", cfg.d_model);
  app.add_option("--heads", cfg.n_head);
  app.add_option("--vocab", cfg.vocab_size);
  app.add_option("--seq", cfg.seq_len);
  CLI11_PARSE(app, argc, argv);
  auto world = triad::dist::init_world();
  for (bool zero : {false, true}) {
    triad::nn::Gpt model(cfg, 1);
    triad::dp::GradientReducer reducer(model.named_parameters(), world, 25e6, zero);
    int64_t elements = 0;
    if (zero) {
      triad::dp::ZeroAdamW opt(reducer, {});
      elements = opt.state_elements();
    } else {
      triad::optim::AdamW opt(model.named_parameters(), {});
      for (auto& s : opt.state()) elements += s.m.numel();
    }
    // Two f32 moments per element.
    const double mib = 2.0 * 4.0 * static_cast<double>(elements) / (1 << 20);
    std::vector<double> all_mib(world->size());
    triad::Tensor mine = triad::from_vector(std::vector<double>{mib}, {1}, triad::DType::F64);
    triad::Tensor all = triad::empty({world->size()}, triad::DType::F64);
    world->all_gather(mine, all)->wait();
    if (world->rank() == 0) {
      auto v = triad::to_double_vector(all);
      std::printf("%s: %lld parameters; AdamW state per rank (MiB):", zero ? "ZeRO-1" : "plain DDP",
                  static_cast<long long>(model.num_parameters()));
      for (double x : v) std::printf(" %.2f", x);
      std::printf("\n");
    }
  }
  return 0;
}
