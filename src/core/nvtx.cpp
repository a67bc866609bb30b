#include "triad/core/nvtx.h"

#include <atomic>

#if defined(TRIAD_WITH_CUDA) && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define TRIAD_HAS_NVTX 1
#else
#define TRIAD_HAS_NVTX 0
#endif

namespace triad::nvtx {
namespace {
std::atomic<bool> g_enabled{false};
}  // namespace

bool available() {
  return TRIAD_HAS_NVTX != 0;
}

void set_enabled(bool on) {
  g_enabled.store(on && available(), std::memory_order_relaxed);
}

bool enabled() {
  return g_enabled.load(std::memory_order_relaxed);
}

namespace detail {

void push(const char* name) {
#if TRIAD_HAS_NVTX
  nvtxRangePushA(name);
#else
  (void)name;
#endif
}

void pop() {
#if TRIAD_HAS_NVTX
  nvtxRangePop();
#endif
}

}  // namespace detail

}  // namespace triad::nvtx
