// cuBLASLt is loaded when the first device GEMM needs it, not linked: a CPU
// process of a CUDA build never pays for its static constructors.
#include <gtest/gtest.h>
#include <link.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "src/backend/cuda/cublaslt_library.h"

namespace triad::detail {
namespace {

int find_cublaslt(struct dl_phdr_info* info, size_t, void* found) {
  if (info->dlpi_name && std::strstr(info->dlpi_name, "libcublasLt")) {
    *static_cast<bool*>(found) = true;
  }
  return 0;
}

bool cublaslt_loaded() {
  bool found = false;
  dl_iterate_phdr(find_cublaslt, &found);
  return found;
}

// Taken before any test runs: the loader has mapped every linked library by
// the time static initializers run, and nothing has asked for a GEMM yet.
const bool kLoadedAtStart = cublaslt_loaded();

TEST(CublasLtLibrary, IsNotLoadedWithTheProgram) {
  EXPECT_FALSE(kLoadedAtStart) << "libcublasLt was mapped before any code asked for it";
}

TEST(CublasLtLibrary, LoadsEveryEntryPointOfTheMajorVersionBuiltAgainst) {
  const CublasLt& lt = cublaslt();
  EXPECT_TRUE(cublaslt_loaded());
  EXPECT_EQ(std::string(cublaslt_file()), "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR));
#define TRIAD_EXPECT_LOADED(name) EXPECT_NE(lt.name, nullptr) << "cublasLt" #name;
  TRIAD_CUBLASLT_ENTRY_POINTS(TRIAD_EXPECT_LOADED)
#undef TRIAD_EXPECT_LOADED
  EXPECT_EQ(lt.GetVersion() / 10000, static_cast<size_t>(CUBLAS_VER_MAJOR));
  // Host-only calls work without a device: a layout made and destroyed.
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(lt.MatrixLayoutCreate(&layout, CUDA_R_32F, 4, 3, 4), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt.MatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);
  // Loaded once: the same table every time.
  EXPECT_EQ(&cublaslt(), &lt);
}

// Where the search path has no libcublasLt, cublaslt() looks beside the
// CUDA runtime the program loaded: a toolkit keeps them together.
TEST(CublasLtLibrary, LooksBesideTheLoadedCudaRuntime) {
  const std::string dir = cuda_runtime_directory();
  ASSERT_FALSE(dir.empty()) << "libcudart is linked, so it is loaded";
  EXPECT_EQ(dir.back(), '/');
  EXPECT_TRUE(std::filesystem::exists(dir + cublaslt_file())) << dir << cublaslt_file();
}

}  // namespace
}  // namespace triad::detail
