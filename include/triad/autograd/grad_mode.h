#pragma once

namespace triad::autograd {

// Whether ops record the graph on this thread (on by default).
bool grad_enabled();
void set_grad_enabled(bool enabled);

// Disables graph recording for a scope (inference, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Whether this thread is inside an InferenceGuard.
bool inference_mode();

// Inference (evaluation, scoring, generation): no graph is recorded, and
// nothing computed in the scope is ever differentiated, so a backend may pick
// its kernels by their forward alone (the CUDA backend's attention choice).
// Activation recomputation's own no-grad forward is not inference: its
// backward follows.
class InferenceGuard {
 public:
  InferenceGuard();
  ~InferenceGuard();
  InferenceGuard(const InferenceGuard&) = delete;
  InferenceGuard& operator=(const InferenceGuard&) = delete;

 private:
  NoGradGuard no_grad_;
  bool previous_;
};

}  // namespace triad::autograd
