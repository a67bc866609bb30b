// Activation memory per tensor-parallel rank: what one bf16 forward pass of
// a GPT leaves alive for its backward, per transformer layer (the
// difference between 2L and L layers, over L), without and with sequence
// parallelism, in bytes and in units of s·b·h (sequence x batch x hidden),
// beside Korthikanti et al.'s count for Megatron-LM with the attention core
// recomputed (Triad's fused attention keeps only its log-sum-exp). The world
// is the tensor-parallel group.
//   mpirun -np 2 bench_tp_memory --layers 2 --d-model 512 --heads 8 --seq 256 --batch 2
#include <CLI/CLI.hpp>
#include <cstdio>
#include <vector>

#include "triad/core/allocator.h"
#include "triad/dist/world.h"
#include "triad/ops.h"
#include "triad/parallel/tensor/gpt.h"

namespace {

// Bytes a forward pass through `layers` layers leaves alive (the loss held).
int64_t held_after_forward(triad::nn::GptConfig cfg, int64_t layers, int64_t batch,
                           const triad::dist::ProcessGroupPtr& world, bool sp) {
  cfg.n_layer = layers;
  triad::tp::TensorParallelGpt model(cfg, 1, world, sp);
  model.to(triad::DType::BF16);
  std::vector<int64_t> ids(static_cast<size_t>(batch * cfg.seq_len));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7919) % cfg.vocab_size;
  const triad::Tensor in = triad::from_vector(ids, {batch, cfg.seq_len});
  const int64_t before = triad::cpu_allocator().stats().allocated;
  const triad::Tensor loss = model.loss(in, in);
  return triad::cpu_allocator().stats().allocated - before;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"activation memory per tensor-parallel rank, with and without sequence parallelism"};
  triad::nn::GptConfig cfg;
  cfg.n_layer = 2;
  cfg.d_model = 512;
  cfg.n_head = 8;
  cfg.vocab_size = 4096;
  cfg.seq_len = 256;
  int64_t batch = 2;
  app.add_option("--layers", cfg.n_layer, "L: layers of the smaller model (the other has 2L)");
  app.add_option("--d-model", cfg.d_model);
  app.add_option("--heads", cfg.n_head);
  app.add_option("--vocab", cfg.vocab_size);
  app.add_option("--seq", cfg.seq_len);
  app.add_option("--batch", batch);
  CLI11_PARSE(app, argc, argv);
  auto world = triad::dist::init_world();
  const double t = world->size();
  const double sbh = static_cast<double>(cfg.seq_len) * static_cast<double>(batch) *
                     static_cast<double>(cfg.d_model);
  if (world->rank() == 0) {
    std::printf("tp %d, %lld x %lld tokens, d_model %lld, %lld heads, bf16\n", world->size(),
                static_cast<long long>(batch), static_cast<long long>(cfg.seq_len),
                static_cast<long long>(cfg.d_model), static_cast<long long>(cfg.n_head));
  }
  for (bool sp : {false, true}) {
    const int64_t L = cfg.n_layer;
    const double per_layer = static_cast<double>(held_after_forward(cfg, 2 * L, batch, world, sp) -
                                                 held_after_forward(cfg, L, batch, world, sp)) /
                             static_cast<double>(L);
    // Korthikanti et al. 2022, selective recomputation, 2-byte activations
    // and 1-byte dropout masks: sbh(10 + 24/t), sequence-parallel sbh(34/t).
    const double megatron = sp ? 34.0 / t : 10.0 + 24.0 / t;
    if (world->rank() == 0) {
      std::printf("sequence parallel %-3s: %.2f MiB per layer = %.2f sbh (Megatron-LM: %.2f sbh)\n",
                  sp ? "on" : "off", per_layer / (1 << 20), per_layer / sbh, megatron);
    }
  }
  return 0;
}
