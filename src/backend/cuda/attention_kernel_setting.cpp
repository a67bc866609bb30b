// The process-wide attention-kernel choice (every build; only the CUDA
// backend reads it).
#include <atomic>
#include <mutex>
#include <vector>

#include "triad/backend/cuda.h"
#include "triad/core/error.h"

namespace triad::cuda {
namespace {
std::atomic<AttentionKernel> g_attention_kernel{AttentionKernel::Auto};
std::atomic<bool> g_attention_deterministic{true};

struct Choices {
  std::mutex mutex;
  std::vector<AttentionChoice> list;
};
Choices& choices() {
  static Choices* c = new Choices();
  return *c;
}
}  // namespace

void set_attention_choice(const AttentionChoice& choice) {
  Choices& c = choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto& existing : c.list) {
    if (existing.same_problem(choice)) {
      existing = choice;
      return;
    }
  }
  c.list.push_back(choice);
}

bool find_attention_choice(AttentionChoice& choice) {
  Choices& c = choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (const auto& existing : c.list) {
    if (existing.same_problem(choice)) {
      choice = existing;
      return true;
    }
  }
  return false;
}

std::vector<AttentionChoice> attention_choices() {
  Choices& c = choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.list;
}

void clear_attention_choices() {
  Choices& c = choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.list.clear();
}

void set_attention_kernel(AttentionKernel kernel) {
  g_attention_kernel = kernel;
}

AttentionKernel attention_kernel() {
  return g_attention_kernel;
}

void set_attention_deterministic(bool deterministic) {
  g_attention_deterministic = deterministic;
}

bool attention_deterministic() {
  return g_attention_deterministic;
}

AttentionKernel attention_kernel_from_string(const std::string& name) {
  if (name == "auto") return AttentionKernel::Auto;
  if (name == "simt") return AttentionKernel::Simt;
  if (name == "tensor_core") return AttentionKernel::TensorCore;
  if (name == "cudnn") return AttentionKernel::Cudnn;
  throw ConfigError("attention kernel '" + name +
                    "' must be one of auto, simt, tensor_core, cudnn");
}

const char* attention_kernel_name(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::Simt:
      return "simt";
    case AttentionKernel::TensorCore:
      return "tensor_core";
    case AttentionKernel::Cudnn:
      return "cudnn";
    default:
      return "auto";
  }
}

}  // namespace triad::cuda
