// Process-wide switches of the CUDA backend's fusions across ops (every
// build; only the CUDA backend reads them).
#include <atomic>

#include "triad/backend/cuda.h"

namespace triad::cuda {
namespace {
std::atomic<bool> g_add_norm_bias_sums{false};
std::atomic<bool> g_norm_backward_register_sums{false};
}  // namespace

void set_add_norm_bias_sums(bool enabled) {
  g_add_norm_bias_sums = enabled;
}

bool add_norm_bias_sums() {
  return g_add_norm_bias_sums;
}

void set_norm_backward_register_sums(bool enabled) {
  g_norm_backward_register_sums = enabled;
}

bool norm_backward_register_sums() {
  return g_norm_backward_register_sums;
}

}  // namespace triad::cuda
