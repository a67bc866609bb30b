// A downstream program built against the installed headers and library
// (find_package(triad)). It checks, and exits 1 naming the failed check:
//   - a fresh GPT-2 starts near the uniform loss ln(vocab);
//   - full activation recomputation gives the same loss and gradients;
//   - 30 AdamW steps on one sequence drive the loss below a tenth of it.
#include <cmath>
#include <cstdio>
#include <vector>

#include "triad/autograd/engine.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"
#include "triad/optim/adamw.h"

namespace {

int failures = 0;

void check(bool ok, const char* what, double value) {
  if (!ok) {
    std::fprintf(stderr, "consumer: FAILED %s (value %.6g)\n", what, value);
    ++failures;
  }
}

triad::nn::GptConfig tiny(triad::nn::Recompute recompute) {
  return {.n_layer = 2,
          .n_head = 2,
          .d_model = 16,
          .vocab_size = 10,
          .seq_len = 8,
          .recompute = recompute};
}

}  // namespace

int main() {
  using namespace triad;
  Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {1, 8});
  Tensor targets = from_vector(std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 9}, {1, 8});

  nn::Gpt model(tiny(nn::Recompute::None), 1), recomputed(tiny(nn::Recompute::Full), 1);
  Tensor loss = model.loss(ids, targets), loss_rc = recomputed.loss(ids, targets);
  const double first = item(loss);
  check(std::isfinite(first) && std::abs(first - std::log(10.0)) < 0.5,
        "initial loss within 0.5 of ln(10)", first);
  check(item(loss_rc) == first, "recomputed loss equals the plain loss", item(loss_rc));
  autograd::backward({loss});
  autograd::backward({loss_rc});
  auto want = model.state_dict();
  double worst = 0;
  for (auto& [name, p] : recomputed.named_parameters()) {
    auto g = to_double_vector(p.grad()), w = to_double_vector(want.at(name).grad());
    for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - w[i]));
  }
  check(worst < 1e-6, "recomputed gradients equal the plain ones (max abs difference)", worst);
  model.zero_grad();

  optim::AdamW opt(model.named_parameters(), {});
  double last = first;
  for (int step = 0; step < 30; ++step) {
    Tensor l = model.loss(ids, targets);
    last = item(l);
    autograd::backward({l});
    opt.step(1e-2);
    model.zero_grad();
  }
  check(last < 0.1 * first, "30 AdamW steps bring the loss below a tenth of the first", last);
  if (failures > 0) return 1;
  std::printf("consumer: ok, loss %.4f -> %.4f\n", first, last);
  return 0;
}
