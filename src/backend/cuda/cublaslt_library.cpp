#include "cublaslt_library.h"

#include <string>

#include "triad/core/error.h"

#include <link.h>

#ifndef TRIAD_CUBLASLT_LINKED
#include <dlfcn.h>
#endif

namespace triad::detail {
namespace {

#define TRIAD_STR2(x) #x
#define TRIAD_STR(x) TRIAD_STR2(x)

#ifdef TRIAD_CUBLASLT_LINKED

CublasLt load() {
  CublasLt lt;
#define TRIAD_CUBLASLT_LINK(name) lt.name = &cublasLt##name;
  TRIAD_CUBLASLT_ENTRY_POINTS(TRIAD_CUBLASLT_LINK)
#undef TRIAD_CUBLASLT_LINK
  return lt;
}

#else

constexpr const char* kFile = "libcublasLt.so." TRIAD_STR(CUBLAS_VER_MAJOR);

template <class Fn>
void resolve(void* lib, const char* name, Fn& slot) {
  dlerror();
  void* sym = dlsym(lib, name);
  if (!sym) {
    const char* why = dlerror();
    throw Error(std::string("cuBLASLt: ") + kFile + " has no " + name + " (" +
                (why ? why : "null symbol") + "); Triad was built against cuBLAS " +
                TRIAD_STR(CUBLAS_VER_MAJOR) "." TRIAD_STR(CUBLAS_VER_MINOR));
  }
  slot = reinterpret_cast<Fn>(sym);
}

CublasLt load() {
  // Kept for the life of the process: handles and descriptors outlive any
  // one caller. The search path first (LD_LIBRARY_PATH, the program's
  // run path, the loader's cache), then beside the CUDA runtime.
  void* lib = dlopen(kFile, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    const std::string first = why ? why : "not found";
    const std::string dir = cuda_runtime_directory();
    if (!dir.empty()) lib = dlopen((dir + kFile).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      throw Error(std::string("cuBLASLt: cannot load ") + kFile + " (" + first +
                  (dir.empty() ? "" : "; nor from " + dir + ", beside libcudart") +
                  "); the CUDA backend's GEMMs need it: put the CUDA toolkit's library "
                  "directory on LD_LIBRARY_PATH");
    }
  }
  CublasLt lt;
#define TRIAD_CUBLASLT_RESOLVE(name) resolve(lib, "cublasLt" #name, lt.name);
  TRIAD_CUBLASLT_ENTRY_POINTS(TRIAD_CUBLASLT_RESOLVE)
#undef TRIAD_CUBLASLT_RESOLVE
  // The same major version as the headers: cuBLASLt's structures (the
  // algorithm, the heuristic result) are laid out per major version.
  const size_t version = lt.GetVersion();
  if (version / 10000 != CUBLAS_VER_MAJOR) {
    throw Error(std::string("cuBLASLt: ") + kFile + " reports version " + std::to_string(version) +
                ", but Triad was built against major version " TRIAD_STR(CUBLAS_VER_MAJOR));
  }
  return lt;
}

#endif

}  // namespace

std::string cuda_runtime_directory() {
  std::string dir;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* out) {
        const std::string path = info->dlpi_name ? info->dlpi_name : "";
        const size_t slash = path.rfind('/');
        if (slash == std::string::npos || path.find("libcudart.so", slash) == std::string::npos) {
          return 0;
        }
        *static_cast<std::string*>(out) = path.substr(0, slash + 1);
        return 1;
      },
      &dir);
  return dir;
}

const CublasLt& cublaslt() {
  static const CublasLt lt = load();
  return lt;
}

const char* cublaslt_file() {
#ifdef TRIAD_CUBLASLT_LINKED
  return "(linked)";
#else
  return kFile;
#endif
}

}  // namespace triad::detail
