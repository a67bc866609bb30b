#include "triad/autograd/checkpoint.h"

#include "triad/autograd/engine.h"
#include "triad/autograd/grad_mode.h"
#include "triad/autograd/node.h"
#include "triad/backend/backend.h"

namespace triad::autograd {
namespace {

thread_local bool recomputing_now = false;

// Marks the recomputation in backward (recomputing()).
class RecomputeGuard {
 public:
  RecomputeGuard() : previous_(recomputing_now) { recomputing_now = true; }
  ~RecomputeGuard() { recomputing_now = previous_; }
  RecomputeGuard(const RecomputeGuard&) = delete;
  RecomputeGuard& operator=(const RecomputeGuard&) = delete;

 private:
  bool previous_;
};

class EnableGradGuard {
 public:
  EnableGradGuard() : previous_(grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace

bool recomputing() {
  return recomputing_now;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x,
                  const std::vector<Tensor>& params) {
  TensorList inputs{x};
  inputs.insert(inputs.end(), params.begin(), params.end());
  if (!any_requires_grad(inputs)) return fn(x);
  Tensor y;
  {
    NoGradGuard no_grad;
    y = fn(x).detach();
  }
  Tensor saved = x.detach();
  const size_t n = params.size();
  record("checkpoint", inputs, {y}, [fn, saved, n](const TensorList& g) -> TensorList {
    Tensor input = saved.detach();
    input.set_requires_grad(true);
    Tensor out;
    {
      EnableGradGuard grad;
      RecomputeGuard again;
      out = fn(input);
    }
    // Parameter gradients accumulate into the parameters here (or are
    // deferred to the outer pass's weight-gradient store, as zero-bubble
    // schedules want); the outer graph receives only the input's gradient.
    BackwardOptions options;
    options.defer_weight_grads = current_weight_grad_store();
    backward({out}, {g[0]}, options);
    TensorList grads(1 + n);
    // A bf16/f16 leaf gathers its gradient in f32; the outer graph takes
    // the input's own dtype, as the block's backward would have produced.
    Tensor gin = input.grad();
    if (gin.defined() && gin.dtype() != saved.dtype()) {
      Tensor cast_back = empty(gin.shape(), saved.dtype(), gin.device());
      backend_for(gin).copy(gin, cast_back);
      gin = cast_back;
    }
    grads[0] = gin;
    return grads;
  });
  return y;
}

}  // namespace triad::autograd
