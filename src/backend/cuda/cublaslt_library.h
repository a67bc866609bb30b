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

struct CublasLt {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtDestroy) Destroy;
  decltype(&cublasLtGetVersion) GetVersion;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmul) Matmul;
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
