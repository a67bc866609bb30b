#include "triad/autograd/weight_grad_store.h"

namespace triad::autograd {

void WeightGradStore::flush() {
  // Swap first so work that defers more work (it never should) cannot loop.
  std::vector<std::function<void()>> work;
  work.swap(work_);
  for (auto& w : work) w();
}

}  // namespace triad::autograd
