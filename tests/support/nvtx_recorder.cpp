// An NVTX injection library for tests: what Nsight Systems would see of a
// program's NVTX ranges, written down. NVTX loads it when the program's
// first NVTX call finds NVTX_INJECTION64_PATH naming it; from then on every
// nvtxRangePushA appends "push NAME" and every nvtxRangePop "pop" to the
// file TRIAD_NVTX_LOG names (read at each event, so a test may point it
// elsewhere between runs), with ".rank<R>" added under mpirun (Open MPI's
// OMPI_COMM_WORLD_RANK), one file per rank.
#include <nvtx3/nvToolsExt.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

std::mutex g_mutex;

void append(const std::string& line) {
  const char* path = std::getenv("TRIAD_NVTX_LOG");
  if (path == nullptr) return;
  std::string file = path;
  if (const char* rank = std::getenv("OMPI_COMM_WORLD_RANK")) file += std::string(".rank") + rank;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (FILE* f = std::fopen(file.c_str(), "a")) {
    std::fputs((line + "\n").c_str(), f);
    std::fclose(f);
  }
}

int NVTX_API range_push(const char* message) {
  append(std::string("push ") + (message != nullptr ? message : ""));
  return 0;
}

int NVTX_API range_pop() {
  append("pop");
  return 0;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr || callbacks->GetModuleFunctionTable == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) || table == nullptr ||
      size <= NVTX_CBID_CORE_RangePop) {
    return 0;
  }
  *table[NVTX_CBID_CORE_RangePushA] = reinterpret_cast<NvtxFunctionPointer>(&range_push);
  *table[NVTX_CBID_CORE_RangePop] = reinterpret_cast<NvtxFunctionPointer>(&range_pop);
  return 1;
}
