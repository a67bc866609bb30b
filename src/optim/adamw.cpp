#include "triad/optim/adamw.h"

#include "triad/autograd/grad_mode.h"
#include "triad/backend/backend.h"
#include "triad/ops/creation.h"

namespace triad::optim {

AdamW::AdamW(std::vector<std::pair<std::string, Tensor>> named_params, AdamWOptions options)
    : options_(options) {
  if (!(options.lr >= 0))
    throw ValueError("AdamW: lr " + std::to_string(options.lr) + " must be >= 0");
  if (!(options.beta1 >= 0 && options.beta1 < 1) || !(options.beta2 >= 0 && options.beta2 < 1)) {
    throw ValueError("AdamW: betas (" + std::to_string(options.beta1) + ", " +
                     std::to_string(options.beta2) + ") must be in [0, 1)");
  }
  if (!(options.eps > 0)) throw ValueError("AdamW: eps must be > 0");
  if (!(options.weight_decay >= 0)) throw ValueError("AdamW: weight_decay must be >= 0");
  for (auto& [name, p] : named_params) {
    if (!p.is_contiguous()) throw ValueError("AdamW: parameter '" + name + "' is not contiguous");
    state_.push_back({name, p, zeros_like(p), zeros_like(p), p.dim() >= 2});
  }
}

void AdamW::step(double lr) {
  autograd::NoGradGuard no_grad;
  ++step_;
  for (auto& s : state_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    AdamWStep hp;
    hp.lr = lr;
    hp.beta1 = options_.beta1;
    hp.beta2 = options_.beta2;
    hp.eps = options_.eps;
    hp.weight_decay = s.decay ? options_.weight_decay : 0.0;
    hp.step = step_;
    backend_for(s.param).adamw(s.param, g, s.m, s.v, hp);
  }
}

}  // namespace triad::optim
