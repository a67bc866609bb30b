// Training throughput of one fixed GPT on the CPU backend: forward, backward,
// clipping and AdamW on random tokens. Prints one JSON line with tokens/s and
// model FLOP/s (6 * parameters + attention, per token).
//   bench_train_cpu --layers 6 --d-model 384 --heads 6 --vocab 8192 --seq 256 --batch 8
// --documents N packs N equal documents into each row (the last token of each
// an end-of-document token; data.reset_attention_mask and reset_position_ids
// on), so attention covers 1/N of the causal pairs.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "triad/autograd/engine.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"
#include "triad/optim/adamw.h"
#include "triad/optim/clip.h"

int main(int argc, char** argv) {
  CLI::App app{"Triad CPU training throughput"};
  triad::nn::GptConfig cfg;
  cfg.n_layer = 6;
  cfg.d_model = 384;
  cfg.n_head = 6;
  cfg.vocab_size = 8192;
  cfg.seq_len = 256;
  int64_t batch = 8, steps = 5, warmup = 2;
  app.add_option("--layers", cfg.n_layer);
  app.add_option("--d-model", cfg.d_model);
  app.add_option("--heads", cfg.n_head);
  app.add_option("--vocab", cfg.vocab_size);
  app.add_option("--seq", cfg.seq_len);
  app.add_option("--batch", batch);
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  int64_t documents = 0;
  app.add_option("--documents", documents, "packed documents per row (0: plain rows)");
  CLI11_PARSE(app, argc, argv);

  if (documents > 0) {
    cfg.eod_token = cfg.vocab_size - 1;
    cfg.reset_attention_mask = cfg.reset_position_ids = true;
  }
  triad::nn::Gpt model(cfg, 1);
  triad::optim::AdamW opt(model.named_parameters(), {});
  const int64_t T = cfg.seq_len;
  std::vector<int64_t> tok(static_cast<size_t>(batch * (T + 1)));
  for (size_t i = 0; i < tok.size(); ++i)
    tok[i] = static_cast<int64_t>((i * 2654435761u) % (cfg.vocab_size - 1));
  if (documents > 0) {
    const int64_t length = std::max<int64_t>(1, T / documents);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = length - 1; t < T; t += length) tok[b * (T + 1) + t] = cfg.eod_token;
    }
  }
  std::vector<int64_t> in, tg;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      in.push_back(tok[b * (T + 1) + t]);
      tg.push_back(tok[b * (T + 1) + t + 1]);
    }
  }
  triad::Tensor ids = triad::from_vector(in, {batch, T}),
                targets = triad::from_vector(tg, {batch, T});
  double loss = 0;
  auto run_step = [&] {
    triad::Tensor l = model.loss(ids, targets);
    loss = triad::item(l);
    triad::autograd::backward({l});
    triad::optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step(1e-4);
    model.zero_grad();
  };
  for (int64_t i = 0; i < warmup; ++i) run_step();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) run_step();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double tokens_per_s = static_cast<double>(steps * batch * T) / secs;
  const double params = static_cast<double>(model.num_parameters());
  const double flops_per_token = 6.0 * params + 12.0 * cfg.n_layer * cfg.d_model * T;
  nlohmann::json j{{"impl", "triad"},
                   {"params", params},
                   {"tokens_per_s", tokens_per_s},
                   {"step_ms", secs * 1000.0 / static_cast<double>(steps)},
                   {"model_gflops", tokens_per_s * flops_per_token / 1e9},
                   {"loss", loss}};
  if (documents > 0) j["documents_per_row"] = documents;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
