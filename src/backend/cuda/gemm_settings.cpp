// The process-wide GEMM settings (every build; only the CUDA backend reads
// them).
#include <mutex>

#include "triad/backend/cuda.h"

namespace triad::cuda {
namespace {
std::mutex g_mutex;
GemmSettings g_settings;
}  // namespace

void set_gemm_settings(const GemmSettings& settings) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_settings = settings;
}

GemmSettings gemm_settings() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_settings;
}

}  // namespace triad::cuda
