#pragma once
// cuBLASLt's entry points, loaded from libcublasLt.so the first time a GEMM
// on the device needs them. libcublasLt runs thousands of static
// constructors when it loads (about a third of a second of CPU); linking it
// would charge that to every process of a CUDA build, CPU runs and each rank
// of an MPI job included. Builds against the CPU stand-in
// (tests/support/mock_cublaslt.cpp) define TRIAD_CUBLASLT_LINKED and fill the
// table with the linked functions instead.
#include <cublasLt.h>

#include <string>

namespace triad::detail {

// Every entry point Triad calls, once: X(name) for cublasLt<name>.
// clang-format off
#define TRIAD_CUBLASLT_ENTRY_POINTS(X) \
  X(Create) \
  X(Destroy) \
  X(GetVersion) \
  X(MatrixLayoutCreate) \
  X(MatrixLayoutDestroy) \
  X(MatrixLayoutSetAttribute) \
  X(MatmulDescCreate) \
  X(MatmulDescDestroy) \
  X(MatmulDescSetAttribute) \
  X(MatmulPreferenceCreate) \
  X(MatmulPreferenceDestroy) \
  X(MatmulPreferenceSetAttribute) \
  X(MatmulAlgoGetHeuristic) \
  X(MatmulAlgoCheck) \
  X(Matmul)
// clang-format on

struct CublasLt {
#define TRIAD_CUBLASLT_FIELD(name) decltype(&cublasLt##name) name = nullptr;
  TRIAD_CUBLASLT_ENTRY_POINTS(TRIAD_CUBLASLT_FIELD)
#undef TRIAD_CUBLASLT_FIELD
};

// The library's entry points, loaded once (thread-safe). Throws triad::Error
// naming the file and the loader's reason when libcublasLt.so.<major> (the
// major version Triad was built against) cannot be loaded or lacks one.
const CublasLt& cublaslt();

// The file name cublaslt() loads: "libcublasLt.so.<CUBLAS_VER_MAJOR>", or
// "(linked)" in builds against the stand-in.
const char* cublaslt_file();

// The directory of the loaded libcudart, with its final '/' ("" when none is
// loaded): cublaslt() looks there when the search path has no
// libcublasLt, since a toolkit keeps the two side by side and the program
// found libcudart through its own run path.
std::string cuda_runtime_directory();

}  // namespace triad::detail
