// The process-wide GEMM settings and the record of verified products (every
// build; only the CUDA backend reads and writes them).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "gemm_check_record.h"
#include "triad/backend/cuda.h"
#include "triad/core/error.h"

namespace triad::cuda {
namespace {
std::mutex g_mutex;

GemmSettings from_environment() {
  GemmSettings s;
  const char* verify = std::getenv("TRIAD_VERIFY_GEMMS");
  s.verify = verify != nullptr && std::strcmp(verify, "1") == 0;
  // TRIAD_GEMM_AUTOTUNE=N: N candidates a problem (a number from 0 to 64;
  // anything else is named and ignored, as a typo should not stop a run).
  if (const char* tune = std::getenv("TRIAD_GEMM_AUTOTUNE")) {
    char* end = nullptr;
    const long n = std::strtol(tune, &end, 10);
    if (end != tune && *end == '\0' && n >= 0 && n <= 64) {
      s.autotune = static_cast<int>(n);
    } else {
      std::fprintf(stderr,
                   "triad: ignoring TRIAD_GEMM_AUTOTUNE='%s' (expected a number from 0 to 64)\n",
                   tune);
    }
  }
  return s;
}
GemmSettings g_settings = from_environment();
GemmVerification g_verification;
constexpr size_t kMaxFailures = 32;

// How far past (or short of) its tolerance a check is.
double badness(const GemmCheck& c) {
  if (c.nonfinite > 0 || !(c.relative_error == c.relative_error)) return 1e300;
  return c.relative_error / c.tolerance;
}
}  // namespace

void set_gemm_settings(const GemmSettings& settings) {
  if (settings.autotune < 0 || settings.autotune > 64) {
    throw ValueError("GemmSettings::autotune = " + std::to_string(settings.autotune) +
                     ": expected a candidate count from 0 to 64");
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_settings = settings;
}

GemmSettings gemm_settings() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_settings;
}

GemmVerification gemm_verification() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_verification;
}

void reset_gemm_verification() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_verification = {};
}

}  // namespace triad::cuda

namespace triad::detail {

bool record_gemm_check(const cuda::GemmCheck& check) {
  using cuda::g_verification;
  std::lock_guard<std::mutex> lock(cuda::g_mutex);
  ++g_verification.checked;
  if (g_verification.checked == 1 || cuda::badness(check) > cuda::badness(g_verification.worst))
    g_verification.worst = check;
  if (!check.failed()) return false;
  ++g_verification.failed;
  for (const cuda::GemmCheck& f : g_verification.failures)
    if (f.problem == check.problem) return false;
  if (g_verification.failures.size() < cuda::kMaxFailures) g_verification.failures.push_back(check);
  return true;
}

void record_gemm_unchecked() {
  std::lock_guard<std::mutex> lock(cuda::g_mutex);
  ++cuda::g_verification.unchecked;
}

}  // namespace triad::detail
