// triad-devices: lists the CUDA devices this build can see (built when
// TRIAD_WITH_CUDA is on). Exit code 77 with --require when there is none, so
// CTest can skip GPU tests cleanly on machines without a GPU.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  const bool require = argc > 1 && std::strcmp(argv[1], "--require") == 0;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("no CUDA device visible (%s)\n",
                err == cudaSuccess ? "count 0" : cudaGetErrorString(err));
    return require ? 77 : 0;
  }
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  std::printf("CUDA runtime %d, driver %d, %d device(s)\n", runtime, driver, count);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, i);
    std::printf("  cuda:%d %s, sm_%d%d, %d SMs, %.1f GiB\n", i, p.name, p.major, p.minor,
                p.multiProcessorCount, static_cast<double>(p.totalGlobalMem) / (1 << 30));
  }
  return 0;
}
