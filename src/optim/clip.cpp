#include "triad/optim/clip.h"

#include <cmath>

#include "triad/autograd/grad_mode.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/reduce.h"

namespace triad::optim {

double sum_of_squares(const Tensor& t) {
  autograd::NoGradGuard no_grad;
  return item(sum(mul(t, t)));
}

Tensor sum_of_squares_device(const std::vector<Tensor>& tensors) {
  autograd::NoGradGuard no_grad;
  Tensor total;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    Tensor s = cast(sum(mul(t, t)), DType::F64);
    total = total.defined() ? add(total, s) : s;
  }
  return total;
}

double global_grad_norm(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  Tensor total = sum_of_squares_device(grads);
  return total.defined() ? std::sqrt(item(total)) : 0.0;
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  const double norm = global_grad_norm(params);
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      for (const auto& p : params) {
        Tensor g = p.grad();
        if (g.defined()) scale_(g, coef);
      }
    }
  }
  return norm;
}

}  // namespace triad::optim
