// Trains a tiny GPT for a few steps through the installed headers and library.
#include <cstdio>

#include "triad/autograd/engine.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"
#include "triad/optim/adamw.h"

int main() {
  triad::nn::GptConfig cfg;
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.d_model = 8;
  cfg.vocab_size = 10;
  cfg.seq_len = 4;
  triad::nn::Gpt model(cfg, 1);
  triad::optim::AdamW opt(model.named_parameters(), {});
  triad::Tensor ids = triad::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {1, 4});
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    triad::Tensor loss = model.loss(ids, ids);
    last = triad::item(loss);
    if (step == 0) first = last;
    triad::autograd::backward({loss});
    opt.step(1e-2);
    model.zero_grad();
  }
  std::printf("consumer: loss %.4f -> %.4f\n", first, last);
  return last < first ? 0 : 1;
}
