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

}  // namespace triad::autograd
