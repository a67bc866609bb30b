// cuda_sim's CUDA runtime API: the calls Triad makes, on host memory. One
// simulated device (sm_90, H200-like limits). Device allocations end at a
// guard page, so reading or writing past the end of one faults at once.
// Streams run their work when it is issued; events record host time.
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "sim.h"

namespace triad_sim {
void set_max_dynamic_shared(const void* kernel, size_t bytes);
}

struct CUstream_st {
  unsigned flags = 0;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point at{};
  bool recorded = false;
  unsigned flags = 0;
};

namespace {

// TRIAD_SIM_DEVICES=n shows n devices (default 1), e.g. one per rank of an
// mpirun on one machine; they share the host's memory.
int device_count() {
  static const int n = [] {
    const char* e = std::getenv("TRIAD_SIM_DEVICES");
    const int v = e != nullptr ? std::atoi(e) : 1;
    return v >= 1 && v <= 64 ? v : 1;
  }();
  return n;
}

struct Mapping {
  void* base;
  size_t bytes;
};
std::mutex g_mutex;
std::map<const void*, Mapping> g_device;  // user pointer -> mapping
thread_local int g_current_device = 0;
thread_local cudaError_t g_last_error = cudaSuccess;

cudaError_t set(cudaError_t e) {
  if (e != cudaSuccess) g_last_error = e;
  return e;
}

size_t page() {
  return static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return set(cudaErrorInvalidValue);
  if (bytes == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  // [mapping ... user bytes | guard page]; the user block starts 256-byte
  // aligned (as cudaMalloc's) as close to the guard as that allows.
  const size_t pg = page();
  const size_t data = (bytes + 255) / 256 * 256;
  const size_t body = (data + pg - 1) / pg * pg;
  void* base = mmap(nullptr, body + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return set(cudaErrorMemoryAllocation);
  unsigned char* guard = static_cast<unsigned char*>(base) + body;
  mprotect(guard, pg, PROT_NONE);
  unsigned char* user = guard - data;
  // Fresh device memory is not zero on a GPU either.
  std::memset(user, 0xFF, data);  // NaN in every float type
  std::lock_guard<std::mutex> lock(g_mutex);
  g_device[user] = {base, body + pg};
  *p = user;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_device.find(p);
  if (it == g_device.end()) return set(cudaErrorInvalidValue);
  munmap(it->second.base, it->second.bytes);
  g_device.erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  if (p == nullptr) return set(cudaErrorInvalidValue);
  *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096 + 4096);
  return *p != nullptr ? cudaSuccess : set(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    default:
      return "cuda_sim error";
  }
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    default:
      return "cudaErrorUnknown";
  }
}
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) {
  return g_last_error;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return set(cudaErrorInvalidValue);
  *count = device_count();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return set(cudaErrorInvalidDevice);
  g_current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return set(cudaErrorInvalidValue);
  *device = g_current_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (value == nullptr) return set(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return set(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = 32;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = 227 * 1024;
      return cudaSuccess;
    default:
      return set(cudaErrorInvalidValue);
  }
}
cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  if (func == nullptr) return set(cudaErrorInvalidDeviceFunction);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return set(cudaErrorInvalidValue);
  if (value < 0 || value > 227 * 1024) return set(cudaErrorInvalidValue);
  triad_sim::set_max_dynamic_shared(func, static_cast<size_t>(value));
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) {
  if (s == nullptr) return set(cudaErrorInvalidValue);
  *s = new CUstream_st{};
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  if (s == nullptr) return set(cudaErrorInvalidValue);
  *s = new CUstream_st{flags};
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned int) {
  return e != nullptr ? cudaSuccess : set(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  if (e == nullptr) return set(cudaErrorInvalidValue);
  *e = new CUevent_st{};
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  if (e == nullptr) return set(cudaErrorInvalidValue);
  *e = new CUevent_st{};
  (*e)->flags = flags;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (e == nullptr) return set(cudaErrorInvalidResourceHandle);
  e->at = std::chrono::steady_clock::now();
  e->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  return e != nullptr ? cudaSuccess : set(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  return e != nullptr ? cudaSuccess : set(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return set(cudaErrorInvalidValue);
  if ((start->flags | end->flags) & cudaEventDisableTiming)
    return set(cudaErrorInvalidResourceHandle);
  if (!start->recorded || !end->recorded) return set(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind,
                            cudaStream_t) {
  if (count != 0 && (dst == nullptr || src == nullptr)) return set(cudaErrorInvalidValue);
  if (count != 0) std::memmove(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device,
                                size_t count, cudaStream_t stream) {
  if (dst_device < 0 || dst_device >= device_count() || src_device < 0 ||
      src_device >= device_count()) {
    return set(cudaErrorInvalidDevice);
  }
  return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t) {
  if (count != 0 && p == nullptr) return set(cudaErrorInvalidValue);
  if (count != 0) std::memset(p, value, count);
  return cudaSuccess;
}

}  // extern "C"
