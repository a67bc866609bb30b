#pragma once

#include <functional>
#include <vector>

namespace triad::autograd {

// Weight-gradient work deferred by a split backward (the W of zero-bubble
// pipeline schedules). Each entry computes some parameters' gradients and
// accumulates them into .grad (running their gradient-ready hooks).
class WeightGradStore {
 public:
  void push(std::function<void()> work) { work_.push_back(std::move(work)); }
  bool empty() const { return work_.empty(); }
  size_t size() const { return work_.size(); }
  // Runs all pending work in the order it was deferred, then clears it.
  void flush();

 private:
  std::vector<std::function<void()>> work_;
};

}  // namespace triad::autograd
