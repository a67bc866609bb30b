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

double global_grad_norm(const std::vector<Tensor>& params) {
  autograd::NoGradGuard no_grad;
  double total = 0;
  for (const auto& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    total += sum_of_squares(g);
  }
  return std::sqrt(total);
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
