#include "triad/autograd/grad_mode.h"

namespace triad::autograd {
namespace {
thread_local bool t_grad_enabled = true;
thread_local bool t_inference = false;
}  // namespace

bool grad_enabled() {
  return t_grad_enabled;
}
void set_grad_enabled(bool enabled) {
  t_grad_enabled = enabled;
}

bool inference_mode() {
  return t_inference;
}

InferenceGuard::InferenceGuard() : previous_(t_inference) {
  t_inference = true;
}
InferenceGuard::~InferenceGuard() {
  t_inference = previous_;
}

}  // namespace triad::autograd
