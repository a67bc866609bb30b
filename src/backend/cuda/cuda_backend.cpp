#include "cuda_backend.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <spdlog/spdlog.h>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/embedding_order.h"
#include "backend/expert_choice.h"
#include "backend/grouped_gemm.h"
#include "capture_safe_malloc.h"
#include "cublaslt_gemm.h"
#include "cudnn_attention.h"
#include "gemm_check_record.h"
#include "gemm_plan.h"
#include "gemm_verification.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/attention_merge.h"
#include "kernels/cached_attention.h"
#include "kernels/clamp.h"
#include "kernels/cross_entropy.h"
#include "kernels/documents.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/grouped_gemm.h"
#include "kernels/layernorm.h"
#include "kernels/rotary.h"
#include "kernels/routing.h"
#include "kernels/soft_cap.h"
#include "kernels/softmax.h"
#include "op_profiler.h"
#include "scalar_type.h"
#include "triad/autograd/grad_mode.h"
#include "triad/backend/cuda.h"
#include "triad/ops/creation.h"

namespace triad::detail {
namespace k = triad::kernels;

namespace {

void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    throw Error("cuda: " + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                ")");
  }
}

bool is_nn(DType d) {
  return d == DType::F32 || d == DType::BF16 || d == DType::F16;
}

void require_nn(const char* op, DType d) {
  if (!is_nn(d)) {
    throw NotSupportedError(std::string(op) + ": dtype " + dtype_name(d) +
                            " is not supported on device cuda (f32, bf16 or f16)");
  }
}

k::StridedView view_of(const Tensor& t) {
  return k::make_view(static_cast<int>(t.dim()), t.shape().data(), t.strides().data());
}

// Runs a kernel launcher, turning its std exceptions into Triad errors.
template <class F>
void launch(const char* op, F&& f) {
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::invalid_argument& e) {
    throw ValueError(std::string("cuda ") + op + ": " + e.what());
  } catch (const std::runtime_error& e) {
    throw Error(std::string("cuda ") + op + ": " + e.what());
  }
}

// launch(), timed under `op` while profiling is on (cuda::set_op_profiling).
template <class F>
void launch(int device, cudaStream_t stream, const char* op, F&& f) {
  OpTimer timer(device, stream, op);
  launch(op, std::forward<F>(f));
}

// Makes `device` current for the scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device)
      check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

class CudaRawMemory final : public RawMemory {
 public:
  explicit CudaRawMemory(int device) : device_(device) {}
  void* allocate(size_t nbytes) override {
    DeviceGuard g(device_);
    void* p = nullptr;
    // (A graph's capture may need a block the cache does not have.)
    if (capture_safe_malloc(&p, nbytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky out-of-memory error
      return nullptr;
    }
    return p;
  }
  // Never throws: it runs from destructors, the backend's own among them,
  // which a static object's destruction can reach after the CUDA runtime
  // has begun to unload at exit. Every call then answers
  // cudaErrorCudartUnloading, and the driver reclaims the memory itself.
  void deallocate(void* ptr, size_t) noexcept override {
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess ||
        (previous != device_ && cudaSetDevice(device_) != cudaSuccess)) {
      cudaGetLastError();
      return;
    }
    cudaFree(ptr);
    if (previous != device_) cudaSetDevice(previous);
    cudaGetLastError();
  }
  Device device() const override { return Device::cuda(device_); }

 private:
  int device_;
};

}  // namespace

// Pinned host buffers for host<->device copies. Each chunk of a copy takes
// a block whose last copy has finished (an event query, which never blocks)
// or a new block, so an upload queued behind a stream of kernels does not
// wait for them (a tensor uploaded mid-step costs no synchronisation), and
// the host-side memcpy of one chunk overlaps the DMA of another. Blocks are
// powers of two from 64 KiB to kChunk; past kMaxBlocks the least recently
// used one is waited for and reused (or replaced by a larger one).
class PinnedStaging {
 public:
  static constexpr size_t kChunk = 8u << 20;
  static constexpr size_t kMinBlock = 64u << 10;
  static constexpr size_t kMaxBlocks = 16;

  ~PinnedStaging() {
    for (Block& b : blocks_) {
      if (b.ptr) cudaFreeHost(b.ptr);
      if (b.done) cudaEventDestroy(b.done);
    }
  }

  void upload(const void* host, void* device, size_t bytes, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t off = 0; off < bytes; off += kChunk) {
      const size_t len = std::min(kChunk, bytes - off);
      Block& b = take(len);
      std::memcpy(b.ptr, static_cast<const char*>(host) + off, len);
      check(cudaMemcpyAsync(static_cast<char*>(device) + off, b.ptr, len, cudaMemcpyHostToDevice,
                            stream),
            "host->device copy");
      check(cudaEventRecord(b.done, stream), "staging event");
    }
  }

  void download(const void* device, void* host, size_t bytes, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t pending_off = 0, pending_len = 0;
    Block* pending = nullptr;
    auto drain = [&] {
      if (pending == nullptr) return;
      check(cudaEventSynchronize(pending->done), "device->host copy");
      std::memcpy(static_cast<char*>(host) + pending_off, pending->ptr, pending_len);
      pending->held = false;
      pending = nullptr;
    };
    for (size_t off = 0; off < bytes; off += kChunk) {
      const size_t len = std::min(kChunk, bytes - off);
      Block& b = take(len);
      b.held = true;  // until its bytes are out
      check(cudaMemcpyAsync(b.ptr, static_cast<const char*>(device) + off, len,
                            cudaMemcpyDeviceToHost, stream),
            "device->host copy");
      check(cudaEventRecord(b.done, stream), "staging event");
      drain();  // the previous chunk, while this one transfers
      pending_off = off, pending_len = len, pending = &b;
    }
    drain();
  }

 private:
  struct Block {
    void* ptr = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded after the block's last copy
    uint64_t used = 0;           // when it was last taken
    bool held = false;           // a download has not copied it out yet
  };

  // A block of at least `bytes` that no queued copy still uses.
  Block& take(size_t bytes) {
    Block* found = nullptr;
    for (Block& b : blocks_) {
      if (b.held || b.bytes < bytes) continue;
      const cudaError_t st = cudaEventQuery(b.done);
      if (st == cudaSuccess) {
        found = &b;
        break;
      }
      if (st != cudaErrorNotReady) check(st, "staging event");
    }
    if (found == nullptr && blocks_.size() < kMaxBlocks) {
      blocks_.emplace_back();
      found = &blocks_.back();
    }
    if (found == nullptr) {
      // All busy: wait for the least recently used one that is not held.
      for (Block& b : blocks_)
        if (!b.held && (found == nullptr || b.used < found->used)) found = &b;
      // (A download holds at most two blocks, so one is always free.)
      if (found == nullptr) throw Error("cuda: every pinned staging block is held");
      check(cudaEventSynchronize(found->done), "staging wait");
    }
    if (found->bytes < bytes) {
      if (found->ptr) check(cudaFreeHost(found->ptr), "cudaFreeHost staging");
      found->ptr = nullptr;
      size_t size = kMinBlock;
      while (size < bytes) size *= 2;
      found->bytes = std::min(size, kChunk);
      check(cudaHostAlloc(&found->ptr, found->bytes, cudaHostAllocPortable),
            "cudaHostAlloc staging");
    }
    if (!found->done) {
      check(cudaEventCreateWithFlags(&found->done, cudaEventDisableTiming), "cudaEventCreate");
    }
    found->used = ++clock_;
    return *found;
  }

  std::mutex mutex_;
  std::deque<Block> blocks_;  // stable addresses while blocks are added
  uint64_t clock_ = 0;
};

struct CudaBackend::DeviceState {
  explicit DeviceState(int device) : index(device), raw(device), allocator(raw) {
    DeviceGuard g(device);
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
          "cudaStreamCreate on device " + std::to_string(device));
  }
  ~DeviceState() {
    allocator.empty_cache();
    if (stream) cudaStreamDestroy(stream);
  }
  CublasLtGemm& gemm() {
    std::lock_guard<std::mutex> lock(gemm_mutex);
    if (!gemm_) {
      DeviceGuard g(index);
      gemm_ = std::make_unique<CublasLtGemm>(index);
      // Autotuning's scratch outputs from the caching allocator (used on
      // this stream only, and synchronised before they go back).
      gemm_->set_scratch_source([this](size_t bytes) -> std::shared_ptr<void> {
        void* p = allocator.allocate(bytes);
        return std::shared_ptr<void>(p, [this, bytes](void* q) { allocator.deallocate(q, bytes); });
      });
    }
    return *gemm_;
  }

  int index;
  CudaRawMemory raw;
  CachingAllocator allocator;
  cudaStream_t stream = nullptr;
  std::mutex gemm_mutex;
  std::unique_ptr<CublasLtGemm> gemm_;
  // GELU-derivative products (m, n, k, type) whose bias-gradient sums
  // cuBLASLt takes in their own type only, not in f32: asked once.
  std::mutex sums_mutex;
  std::set<std::tuple<int64_t, int64_t, int64_t, int>> own_type_sums;
};

namespace {

// Device scratch from the caching allocator for the duration of one launch
// sequence (freed blocks are reused only by later work on the same stream).
class Scratch {
 public:
  Scratch(Allocator& a, size_t bytes) : alloc_(a), bytes_(std::max<size_t>(bytes, 1)) {
    ptr_ = alloc_.allocate(bytes_);
  }
  ~Scratch() { alloc_.deallocate(ptr_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }

 private:
  Allocator& alloc_;
  size_t bytes_;
  void* ptr_;
};

// Host copy of a small index tensor as int64 (ids, targets).
std::vector<int64_t> host_indices(CudaBackend& be, const Tensor& ids) {
  Tensor host = empty(ids.shape(), DType::I64, Device::cpu());
  be.copy(ids, host);
  return std::vector<int64_t>(host.data<int64_t>(), host.data<int64_t>() + host.numel());
}

// The capture open on this thread (cuda::capture), if any.
thread_local CaptureChecks* t_capture = nullptr;
// The checks left to the device outside a capture (cuda::DeviceChecks), if any.
thread_local CaptureChecks* t_deferred = nullptr;

// Indices a capture's kernel reads and checks itself: contiguous on the
// device, and the word that kernel lowers to the first index out of
// [0, bound) (set to all ones, in the graph, before it), registered with
// the capture for cuda::Graph::check.
struct CheckedIndices {
  Tensor indices;
  unsigned long long* bad;
};
CheckedIndices checked_indices(CudaBackend& be, CudaBackend::DeviceState& s, CaptureChecks& capture,
                               const std::string& what, const Tensor& indices, int64_t bound) {
  Tensor ids = indices;
  if (!ids.is_contiguous()) {
    ids = empty(indices.shape(), indices.dtype(), indices.device());
    be.copy(indices, ids);
  }
  Tensor word = empty({1}, DType::I64, Device::cuda(s.index));
  check(cudaMemsetAsync(word.raw_data(), 0xFF, sizeof(int64_t), s.stream),
        what + ": cudaMemsetAsync");
  capture.checks.push_back({what, ids, bound, word});
  return {ids, static_cast<unsigned long long*>(word.raw_data())};
}

void require_index(const char* op, const Tensor& t) {
  if (t.dtype() != DType::I32 && t.dtype() != DType::I64) {
    throw ValueError(std::string(op) + ": indices must be i32 or i64, got " +
                     dtype_name(t.dtype()));
  }
}

}  // namespace

CaptureChecks* open_capture(int device) {
  return t_capture != nullptr && t_capture->device == device ? t_capture : nullptr;
}

CaptureChecks* open_checks(int device) {
  if (CaptureChecks* capture = open_capture(device)) return capture;
  return t_deferred != nullptr && t_deferred->device == device ? t_deferred : nullptr;
}

namespace {

std::vector<Tensor> check_words(const CaptureChecks* checks) {
  std::vector<Tensor> out;
  if (checks)
    for (const CaptureChecks::Check& c : checks->checks) out.push_back(c.word);
  return out;
}

// The words' values, in one read (none read when there are none).
std::vector<int64_t> read_words(const std::vector<Tensor>& words) {
  std::vector<int64_t> values;
  if (words.empty()) return values;
  for (const double v : items(words)) values.push_back(static_cast<int64_t>(v));
  return values;
}

void throw_bad_index(const CaptureChecks* checks, const std::vector<int64_t>& words,
                     const char* api, const char* found_by) {
  const size_t n = checks ? checks->checks.size() : 0;
  if (words.size() != n) {
    throw ValueError(std::string(api) + ": " + std::to_string(words.size()) + " words for " +
                     std::to_string(n) + " checks (one each expected)");
  }
  for (size_t i = 0; i < n; ++i) {
    const CaptureChecks::Check& c = checks->checks[i];
    const int64_t at = words[i];
    if (at == -1) continue;
    Tensor ids = triad::empty(c.indices.shape(), c.indices.dtype(), Device::cpu());
    cuda_backend().copy(c.indices, ids);
    const int64_t value =
        ids.dtype() == DType::I64 ? ids.data<int64_t>()[at] : int64_t{ids.data<int32_t>()[at]};
    throw ValueError(c.what + " " + std::to_string(value) + " at position " + std::to_string(at) +
                     " is outside [0, " + std::to_string(c.bound) + ") (" + found_by + ")");
  }
}

}  // namespace

CudaBackend::CudaBackend() = default;
CudaBackend::~CudaBackend() = default;

CudaBackend::DeviceState& CudaBackend::state(int device) {
  if (device < 0 || device >= kMaxDevices) {
    throw ValueError("cuda: device index " + std::to_string(device) + " is out of range [0, " +
                     std::to_string(kMaxDevices) + ")");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!devices_[device]) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || device >= count) {
      cudaGetLastError();
      throw NotSupportedError("cuda: device cuda:" + std::to_string(device) +
                              " is not available (" +
                              (err == cudaSuccess ? std::to_string(count) + " device(s) visible"
                                                  : std::string(cudaGetErrorString(err))) +
                              ")");
    }
    devices_[device] = std::make_unique<DeviceState>(device);
  }
  return *devices_[device];
}

Allocator& CudaBackend::allocator(int device_index) {
  return state(device_index).allocator;
}

PinnedStaging& CudaBackend::staging() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!staging_) staging_ = std::make_unique<PinnedStaging>();
  return *staging_;
}

void CudaBackend::synchronize() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& d : devices_) {
    if (d) check(cudaStreamSynchronize(d->stream), "synchronize");
  }
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  if (src.shape() != dst.shape()) {
    throw ShapeError("copy: source shape " + shape_str(src.shape()) + " != destination shape " +
                     shape_str(dst.shape()));
  }
  if (src.numel() == 0) return;
  const bool from_host = src.device().is_cpu(), to_host = dst.device().is_cpu();
  if (from_host && to_host) {
    backend_for(DeviceType::CPU).copy(src, dst);
    return;
  }
  if (!from_host && !to_host) {
    if (src.device() == dst.device()) {
      DeviceState& s = state(dst.device().index);
      DeviceGuard g(s.index);
      launch(s.index, s.stream, "copy", [&] {
        k::copy(src.raw_data(), scalar(src.dtype()), view_of(src), dst.raw_data(),
                scalar(dst.dtype()), view_of(dst), s.stream);
      });
      return;
    }
    // Across devices: make a contiguous copy in the destination dtype on the
    // source device, then a peer copy, then place it.
    DeviceState& ss = state(src.device().index);
    DeviceState& ds = state(dst.device().index);
    Tensor staged = empty(src.shape(), dst.dtype(), src.device());
    copy(src, staged);
    Tensor landed = dst.is_contiguous() ? dst : empty(dst.shape(), dst.dtype(), dst.device());
    check(cudaStreamSynchronize(ss.stream), "peer copy: source stream");
    check(cudaMemcpyPeerAsync(landed.raw_data(), ds.index, staged.raw_data(), ss.index,
                              staged.nbytes(), ds.stream),
          "cudaMemcpyPeerAsync");
    if (!landed.same(dst)) copy(landed, dst);
    check(cudaStreamSynchronize(ds.stream), "peer copy: destination stream");
    return;
  }
  // Inside a CUDA graph's capture neither direction can work: an upload
  // goes through a pinned staging block that the graph would read again at
  // every replay, whatever it then holds, and a download waits for the
  // device, which a capture refuses.
  if (open_capture((from_host ? dst : src).device().index) != nullptr) {
    throw Error(
        std::string(from_host ? "copy: an upload from the host" : "copy: a download to the host") +
        " of " + shape_str(src.shape()) + " " + dtype_name(src.dtype()) +
        " inside a CUDA graph's capture (" +
        (from_host ? "its replays would read the staging buffer as it is then: make the "
                     "tensor on the device before the capture, or form it there"
                   : "the host cannot wait for the device there: read it after a replay") +
        ")");
  }
  if (from_host) {
    DeviceState& s = state(dst.device().index);
    DeviceGuard g(s.index);
    // Upload the source as it is (contiguous, its own dtype), convert on the GPU.
    Tensor host = src;
    if (!src.is_contiguous()) {
      host = empty(src.shape(), src.dtype(), Device::cpu());
      backend_for(DeviceType::CPU).copy(src, host);
    }
    if (dst.is_contiguous() && dst.dtype() == src.dtype()) {
      staging().upload(host.raw_data(), dst.raw_data(), host.nbytes(), s.stream);
      return;
    }
    Tensor raw = empty(src.shape(), src.dtype(), dst.device());
    copy(host, raw);
    copy(raw, dst);
    return;
  }
  // Device -> host: convert on the GPU into a contiguous buffer of the
  // destination dtype, download, then place it on the host.
  DeviceState& s = state(src.device().index);
  DeviceGuard g(s.index);
  Tensor dev = src;
  if (!src.is_contiguous() || src.dtype() != dst.dtype()) {
    dev = empty(src.shape(), dst.dtype(), src.device());
    copy(src, dev);
  }
  Tensor host = dst.is_contiguous() ? dst : empty(dst.shape(), dst.dtype(), Device::cpu());
  staging().download(dev.raw_data(), host.raw_data(), dev.nbytes(), s.stream);
  if (!host.same(dst)) backend_for(DeviceType::CPU).copy(host, dst);
}

void CudaBackend::fill(Tensor& dst, double value) {
  if (!dst.is_contiguous()) throw ShapeError("fill: destination must be contiguous");
  DeviceState& s = state(dst.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "fill",
         [&] { k::fill(dst.raw_data(), scalar(dst.dtype()), dst.numel(), value, s.stream); });
}

bool CudaBackend::capturing(const Device& device) const {
  return device.is_cuda() && open_capture(device.index) != nullptr;
}

bool CudaBackend::checks_indices_on_device(const Device& device) const {
  return device.is_cuda() && open_checks(device.index) != nullptr;
}

void CudaBackend::inverse_target_count(const Tensor& targets, int64_t ignore_index, int64_t classes,
                                       Tensor& inv, const char* op) {
  require_index(op, targets);
  CaptureChecks* capture = open_checks(inv.device().index);
  if (!capture || targets.device() != inv.device()) {
    Backend::inverse_target_count(targets, ignore_index, classes, inv, op);  // (refuses)
    return;
  }
  if (inv.numel() != 1 || (inv.dtype() != DType::F32 && inv.dtype() != DType::F64)) {
    throw ValueError(std::string(op) + ": the inverse count must be one f32 or f64 element, got " +
                     shape_str(inv.shape()) + " " + dtype_name(inv.dtype()));
  }
  DeviceState& s = state(inv.device().index);
  DeviceGuard g(s.index);
  const auto [t, bad] =
      checked_indices(*this, s, *capture, std::string(op) + ": target", targets, classes);
  launch(s.index, s.stream, "inverse_target_count", [&] {
    k::inverse_target_count(t.raw_data(), t.dtype() == DType::I64, t.numel(), ignore_index, classes,
                            inv.raw_data(), scalar(inv.dtype()), bad, s.stream);
  });
}

void CudaBackend::vocab_shard_ids(const Tensor& ids, int64_t start, int64_t valid, int64_t vocab,
                                  Tensor& local, Tensor& keep, const char* op) {
  require_index(op, ids);
  CaptureChecks* capture = open_checks(local.device().index);
  if (!capture || ids.device() != local.device() || keep.device() != local.device()) {
    Backend::vocab_shard_ids(ids, start, valid, vocab, local, keep, op);  // (refuses)
    return;
  }
  if (local.dtype() != DType::I64 || !local.is_contiguous() || !keep.is_contiguous() ||
      local.numel() != ids.numel() || keep.numel() != ids.numel()) {
    throw ValueError(std::string(op) + ": a shard's ids need contiguous i64 local ids and keep " +
                     "marks of " + std::to_string(ids.numel()) + " elements, got " +
                     shape_str(local.shape()) + " " + dtype_name(local.dtype()) + " and " +
                     shape_str(keep.shape()) + " " + dtype_name(keep.dtype()));
  }
  DeviceState& s = state(local.device().index);
  DeviceGuard g(s.index);
  const auto [t, bad] = checked_indices(*this, s, *capture, std::string(op) + ": id", ids, vocab);
  launch(s.index, s.stream, "vocab_shard_ids", [&] {
    k::vocab_shard_ids(t.raw_data(), t.dtype() == DType::I64, t.numel(), start, valid, vocab,
                       local.data<int64_t>(), keep.raw_data(), scalar(keep.dtype()), bad, s.stream);
  });
}

void CudaBackend::arange(Tensor& dst, int64_t start) {
  if (!dst.is_contiguous() || (dst.dtype() != DType::I64 && dst.dtype() != DType::I32)) {
    throw ValueError("arange: destination must be a contiguous i32 or i64 tensor, got " +
                     std::string(dtype_name(dst.dtype())));
  }
  DeviceState& s = state(dst.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "arange",
         [&] { k::arange(dst.raw_data(), scalar(dst.dtype()), dst.numel(), start, s.stream); });
}

void CudaBackend::document_starts(const Tensor& ids, int64_t eod, int64_t window, Tensor& starts,
                                  Tensor* positions) {
  if (ids.device().is_cpu() || starts.device() != ids.device() ||
      (positions && positions->device() != ids.device())) {
    // (Ids on the host, or results elsewhere: formed there and copied.)
    return Backend::document_starts(ids, eod, window, starts, positions);
  }
  check_document_starts(ids, window, starts, positions);
  DeviceState& s = state(starts.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "document_starts", [&] {
    k::document_starts(ids.raw_data(), ids.dtype() == DType::I64, ids.size(0), ids.size(1), eod,
                       window, starts.data<int32_t>(),
                       positions ? positions->data<int64_t>() : nullptr, s.stream);
  });
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  DeviceState& s = state(out.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "binary", [&] {
    k::binary(static_cast<k::BinaryKind>(op), a.raw_data(), view_of(a), b.raw_data(), view_of(b),
              out.raw_data(), scalar(out.dtype()), s.stream);
  });
}

void CudaBackend::accumulate(const Tensor& src, Tensor& acc) {
  const bool fused = acc.dtype() == DType::F32 && src.shape() == acc.shape() &&
                     src.device() == acc.device() && src.is_contiguous() && acc.is_contiguous() &&
                     (src.dtype() == DType::F32 || is_half(src.dtype()));
  if (!fused) {
    Backend::accumulate(src, acc);
    return;
  }
  DeviceState& s = state(acc.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "accumulate", [&] {
    k::accumulate(src.raw_data(), scalar(src.dtype()), acc.data<float>(), acc.numel(), s.stream);
  });
}

void CudaBackend::sum_rows_into(const Tensor& x, Tensor& acc, double beta) {
  const bool fused = x.dim() == 2 && acc.shape() == Shape{x.size(1)} && acc.dtype() == DType::F32 &&
                     x.device() == acc.device() && x.is_contiguous() && acc.is_contiguous() &&
                     (x.dtype() == DType::F32 || is_half(x.dtype()));
  if (!fused) {
    Backend::sum_rows_into(x, acc, beta);
    return;
  }
  DeviceState& s = state(acc.device().index);
  DeviceGuard g(s.index);
  const size_t ws_bytes = k::column_sum_workspace(scalar(x.dtype()), x.size(0), x.size(1));
  std::unique_ptr<Scratch> ws;
  if (ws_bytes > 0) ws = std::make_unique<Scratch>(s.allocator, ws_bytes);
  launch(s.index, s.stream, "sum_rows_into", [&] {
    k::column_sum_into(x.raw_data(), scalar(x.dtype()), x.size(0), x.size(1), acc.data<float>(),
                       beta, ws ? ws->get() : nullptr, s.stream);
  });
}

void CudaBackend::affine(const Tensor& x, double alpha, double beta, Tensor& out) {
  DeviceState& s = state(out.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "affine", [&] {
    k::affine(x.raw_data(), out.raw_data(), scalar(out.dtype()), out.numel(), alpha, beta,
              s.stream);
  });
}

namespace {
// The split-k reductions cuda::GemmSettings allows half-precision outputs.
GemmReduction reduction_of(const cuda::GemmSettings& settings) {
  return settings.half_reduced_precision_reduction ? GemmReduction::Any
                                                   : GemmReduction::ComputeType;
}
// Whether a product of `dtype` operands may take cuBLASLt's epilogues (half
// products widened to f32 take Triad's bias and GELU kernels after them).
bool epilogues_allowed(const cuda::GemmSettings& settings, DType dtype) {
  return settings.epilogues && (!is_half(dtype) || settings.half_products);
}
// One cuBLASLt product on the device's stream, its algorithm autotuned per
// settings.autotune; with settings.verify checked against the reference
// kernel.
void run_gemm(CudaBackend::DeviceState& s, const GemmPlan& plan, GemmTypes types, const void* a,
              const void* b, void* c, double alpha, double beta, const GemmEpilogue& epilogue,
              GemmReduction reduction, const cuda::GemmSettings& settings) {
  const bool verify = settings.verify;
  s.gemm().set_autotune(settings.autotune);
  if (!verify || !GemmProductCheck::checkable(plan, types)) {
    if (verify) record_gemm_unchecked();
    s.gemm().run(plan, types, a, b, c, alpha, beta, s.stream, epilogue, reduction);
    return;
  }
  Scratch scratch(s.allocator, GemmProductCheck::scratch_bytes(plan, epilogue));
  GemmProductCheck check(plan, types, a, b, c, alpha, beta, epilogue, reduction, scratch.get(),
                         s.stream);
  s.gemm().run(plan, types, a, b, c, alpha, beta, s.stream, epilogue, reduction);
  check.finish();
}
}  // namespace

void CudaBackend::gemm(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b,
                       double alpha, double beta) {
  // 2-D operands may be row-strided (padded logits): their leading dimension.
  const GemmPlan plan =
      plan_gemm(a.shape(), b.shape(), c.shape(), trans_a, trans_b,
                {matrix_ld(a, "gemm"), matrix_ld(b, "gemm"), matrix_ld(c, "gemm")});
  check_gemm_dtypes(a, b, c);
  if (c.numel() == 0) return;
  DeviceState& s = state(c.device().index);
  DeviceGuard g(s.index);
  // (Half operands into an f32 product: a weight gradient into its buffer.)
  OpTimer timer(s.index, s.stream,
                is_half(a.dtype()) && c.dtype() == DType::F32 ? "gemm_into_f32" : "gemm");
  if (plan.k == 0) {  // empty inner dimension: c = beta * c
    Tensor flat = c.is_contiguous() ? c : empty(c.shape(), c.dtype(), c.device());
    if (!c.is_contiguous()) copy(c, flat);
    launch(s.index, s.stream, "gemm", [&] {
      k::affine(flat.raw_data(), flat.raw_data(), scalar(c.dtype()), c.numel(), beta, 0.0,
                s.stream);
    });
    if (!c.is_contiguous()) copy(flat, c);
    return;
  }
  const cuda::GemmSettings settings = cuda::gemm_settings();
  // Half operands widened to f32, the product in f32, rounded once.
  auto in_f32 = [&] {
    Tensor a32 = empty(a.shape(), DType::F32, a.device());
    Tensor b32 = empty(b.shape(), DType::F32, b.device());
    copy(a, a32);
    copy(b, b32);
    Tensor c32 = c;
    if (c.dtype() != DType::F32) {
      c32 = empty(c.shape(), DType::F32, c.device());
      if (beta != 0.0) copy(c, c32);
    }
    // (The f32 copies of a and b, and of a half c, are contiguous.)
    const GemmPlan plan32 = plan_gemm(a.shape(), b.shape(), c.shape(), trans_a, trans_b,
                                      {0, 0, c32.is_contiguous() ? 0 : plan.out.ld});
    run_gemm(s, plan32, DType::F32, a32.raw_data(), b32.raw_data(), c32.raw_data(), alpha, beta, {},
             GemmReduction::Any, settings);
    if (c.dtype() != DType::F32) copy(c32, c);
  };
  if (is_half(a.dtype()) && !settings.half_products) {
    in_f32();
    return;
  }
  try {
    run_gemm(s, plan, GemmTypes(a.dtype(), c.dtype()), a.raw_data(), b.raw_data(), c.raw_data(),
             alpha, beta, {}, reduction_of(settings), settings);
  } catch (const NotSupportedError&) {
    // cuBLASLt has no half-precision algorithm for some layouts (odd leading
    // dimensions): run those in f32 and round once, rather than fail.
    if (!is_half(a.dtype())) throw;
    in_f32();
  }
}

void CudaBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y,
                                 Tensor* gelu_input) {
  // The bias and GELU (or a bias-free layer's GELU) in the GEMM's epilogue:
  // one pass over y instead of a bias broadcast before the product and a
  // GELU pass after it. f64, a bias-free layer without GELU (a plain
  // product), empty products and layouts cuBLASLt has no epilogue algorithm
  // for take the composed path.
  const cuda::GemmSettings settings = cuda::gemm_settings();
  if (gelu_input && !settings.gelu_epilogue) {
    // GemmSettings::gelu_epilogue false: the product (its bias in the
    // epilogue) into the pre-activation, then the GELU kernel over it.
    linear_forward(x, w, bias, *gelu_input, nullptr);
    gelu_forward(*gelu_input, y, GeluForm::Tanh);
    return;
  }
  const bool fusable = (bias.defined() || gelu_input) && y.numel() > 0 && x.size(1) > 0 &&
                       (y.dtype() == DType::F32 || is_half(y.dtype())) && x.dtype() == y.dtype() &&
                       w.dtype() == y.dtype() && (!bias.defined() || bias.dtype() == y.dtype()) &&
                       epilogues_allowed(settings, y.dtype());
  if (!fusable) {
    Backend::linear_forward(x, w, bias, y, gelu_input);
    return;
  }
  const GemmPlan plan = plan_gemm(x.shape(), w.shape(), y.shape(), false, true);
  // (cuBLASLt wants the GELU input's leading dimension a multiple of 8.)
  if (plan.batch != 1 || plan.m != w.size(0) || (gelu_input && plan.out.ld % 8 != 0)) {
    Backend::linear_forward(x, w, bias, y, gelu_input);
    return;
  }
  DeviceState& s = state(y.device().index);
  DeviceGuard g(s.index);
  OpTimer timer(s.index, s.stream,
                !bias.defined() ? "linear_gelu"
                : gelu_input    ? "linear_bias_gelu"
                                : "linear_bias");
  GemmEpilogue ep;
  ep.kind = !bias.defined() ? GemmEpilogue::Kind::Gelu
            : gelu_input    ? GemmEpilogue::Kind::BiasGelu
                            : GemmEpilogue::Kind::Bias;
  ep.bias = bias.defined() ? bias.raw_data() : nullptr;
  ep.gelu_input = gelu_input ? gelu_input->raw_data() : nullptr;
  try {
    run_gemm(s, plan, y.dtype(), x.raw_data(), w.raw_data(), y.raw_data(), 1.0, 0.0, ep,
             reduction_of(settings), settings);
  } catch (const NotSupportedError&) {
    Backend::linear_forward(x, w, bias, y, gelu_input);
  }
}

namespace {
// Whether the GELU-derivative product dpre = GELU'(pre) * (dy @ w) of `plan`
// can run with its derivative (and sums) in cuBLASLt's epilogue: one type
// throughout, f32 or half, a single product whose output rows cuBLASLt's
// aux matrix takes (leading dimension a multiple of 8).
bool dgelu_fusable(const cuda::GemmSettings& settings, const GemmPlan& plan, const Tensor& dy,
                   const Tensor& w, const Tensor& pre, const Tensor& dpre) {
  return dpre.numel() > 0 && dy.size(1) > 0 &&
         (dpre.dtype() == DType::F32 || is_half(dpre.dtype())) && dy.dtype() == dpre.dtype() &&
         w.dtype() == dpre.dtype() && pre.dtype() == dpre.dtype() &&
         epilogues_allowed(settings, dpre.dtype()) && plan.batch == 1 && plan.out.ld % 8 == 0;
}
}  // namespace

void CudaBackend::gelu_linear_input_grad(const Tensor& dy, const Tensor& w, const Tensor& pre,
                                         Tensor& dpre) {
  // GELU's derivative in the input-gradient GEMM's epilogue (DGELU): no
  // separate pass reading the pre-activation and the gradient.
  const cuda::GemmSettings settings = cuda::gemm_settings();
  const GemmPlan plan = plan_gemm(dy.shape(), w.shape(), dpre.shape(), false, false);
  if (!dgelu_fusable(settings, plan, dy, w, pre, dpre)) {
    Backend::gelu_linear_input_grad(dy, w, pre, dpre);
    return;
  }
  DeviceState& s = state(dpre.device().index);
  DeviceGuard g(s.index);
  OpTimer timer(s.index, s.stream, "gelu_linear_input_grad");
  GemmEpilogue ep;
  ep.kind = GemmEpilogue::Kind::DGelu;
  ep.gelu_input = pre.raw_data();
  try {
    run_gemm(s, plan, dpre.dtype(), dy.raw_data(), w.raw_data(), dpre.raw_data(), 1.0, 0.0, ep,
             reduction_of(settings), settings);
  } catch (const NotSupportedError&) {
    Backend::gelu_linear_input_grad(dy, w, pre, dpre);
  }
}

Tensor CudaBackend::gelu_linear_input_grad_with_sums(const Tensor& dy, const Tensor& w,
                                                     const Tensor& pre, Tensor& dpre) {
  // cuBLASLt's DGELU_BGRAD: the GELU derivative, and dpre's column sums (the
  // layer before's bias gradient) from the same epilogue, where the
  // column-sum kernel would read dpre again (GPT-2 350M: 24 sums of 16384 x
  // 4096 a step). The sums in f32; where cuBLASLt has that for no algorithm
  // of the problem, in dpre's own type (bf16 sums over the rows, rounded
  // once, as a bf16 bias's gradient is under PyTorch's autocast). Only where
  // the GELU-derivative product itself would fuse, and the setting asks for
  // it; otherwise dpre alone.
  const cuda::GemmSettings settings = cuda::gemm_settings();
  const GemmPlan plan = plan_gemm(dy.shape(), w.shape(), dpre.shape(), false, false);
  if (!settings.dgelu_bias_grad_epilogue || !dgelu_fusable(settings, plan, dy, w, pre, dpre)) {
    gelu_linear_input_grad(dy, w, pre, dpre);
    return Tensor();
  }
  DeviceState& s = state(dpre.device().index);
  DeviceGuard g(s.index);
  const auto problem = std::make_tuple(plan.m, plan.n, plan.k, static_cast<int>(dpre.dtype()));
  bool own_type = false;
  {
    std::lock_guard<std::mutex> lock(s.sums_mutex);
    own_type = s.own_type_sums.count(problem) > 0;
  }
  for (const bool f32 : {true, false}) {
    if (f32 && own_type) continue;  // (refused before: no empty call in the op profile)
    if (!f32 && dpre.dtype() == DType::F32) break;  // (the same problem again)
    Tensor sums = empty({dpre.size(-1)}, f32 ? DType::F32 : dpre.dtype(), dpre.device());
    try {
      OpTimer timer(s.index, s.stream, "gelu_linear_input_grad_bias_sums");
      GemmEpilogue ep;
      ep.kind = GemmEpilogue::Kind::DGeluBiasGrad;
      ep.gelu_input = pre.raw_data();
      ep.bias_grad = sums.raw_data();
      ep.bias_grad_f32 = f32;
      run_gemm(s, plan, dpre.dtype(), dy.raw_data(), w.raw_data(), dpre.raw_data(), 1.0, 0.0, ep,
               reduction_of(settings), settings);
      return sums;
    } catch (const NotSupportedError&) {
      // (No such algorithm for these types: the next, or the product and
      // the sums apart.)
      if (f32) {
        std::lock_guard<std::mutex> lock(s.sums_mutex);
        s.own_type_sums.insert(problem);
      }
    }
  }
  gelu_linear_input_grad(dy, w, pre, dpre);
  return Tensor();
}

void CudaBackend::linear_weight_bias_grad(const Tensor& dy, const Tensor& x, Tensor& gw, Tensor& gb,
                                          double beta) {
  // The bias gradient in the weight-gradient GEMM's epilogue (cuBLASLt's
  // BGRADB sums op(second), here dy, over k): dy is read once, and the
  // column-sum kernel (3.1 ms of the H200's 80 ms GPT-2 350M step) is gone.
  // The epilogue overwrites its sums, so under beta 1 they go to a scratch
  // vector that one small launch adds into gb. Half operands into f32
  // buffers only (the training path); anything else, and layouts cuBLASLt
  // has no such algorithm for, compose gemm and sum_rows_into.
  const cuda::GemmSettings settings = cuda::gemm_settings();
  const bool fusable =
      dy.dim() == 2 && x.dim() == 2 && is_half(dy.dtype()) && x.dtype() == dy.dtype() &&
      gw.dtype() == DType::F32 && gb.dtype() == DType::F32 && dy.size(0) == x.size(0) &&
      dy.size(0) > 0 && gw.shape() == Shape{dy.size(1), x.size(1)} &&
      gb.shape() == Shape{dy.size(1)} && gw.numel() > 0 && dy.is_contiguous() &&
      x.is_contiguous() && gw.is_contiguous() && gb.is_contiguous() && dy.device() == gw.device() &&
      x.device() == gw.device() && gb.device() == gw.device() && (beta == 0.0 || beta == 1.0) &&
      settings.bias_grad_epilogue && epilogues_allowed(settings, dy.dtype());
  if (!fusable) {
    Backend::linear_weight_bias_grad(dy, x, gw, gb, beta);
    return;
  }
  const GemmPlan plan = plan_gemm(dy.shape(), x.shape(), gw.shape(), true, false);
  DeviceState& s = state(gw.device().index);
  DeviceGuard g(s.index);
  std::unique_ptr<Scratch> sums;
  if (beta != 0.0) sums = std::make_unique<Scratch>(s.allocator, gb.numel() * sizeof(float));
  {
    OpTimer timer(s.index, s.stream, "gemm_bias_grad_into_f32");
    GemmEpilogue ep;
    ep.kind = GemmEpilogue::Kind::BiasGrad;
    ep.bias_grad = sums ? sums->get() : gb.raw_data();
    try {
      run_gemm(s, plan, GemmTypes(dy.dtype(), DType::F32), dy.raw_data(), x.raw_data(),
               gw.raw_data(), 1.0, beta, ep, reduction_of(settings), settings);
    } catch (const NotSupportedError&) {
      Backend::linear_weight_bias_grad(dy, x, gw, gb, beta);
      return;
    }
  }
  if (sums) {
    launch(s.index, s.stream, "accumulate", [&] {
      k::accumulate(sums->get(), scalar(DType::F32), gb.data<float>(), gb.numel(), s.stream);
    });
  }
}

void CudaBackend::reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner,
                         Tensor& out, Tensor* indices) {
  DeviceState& s = state(out.device().index);
  DeviceGuard g(s.index);
  if (indices && (indices->dtype() != DType::I64 || indices->device() != out.device())) {
    throw ValueError("reduce: indices must be i64 on " + out.device().str());
  }
  const size_t ws_bytes =
      k::reduce_workspace(static_cast<k::ReduceKind>(op), scalar(x.dtype()), outer, n, inner);
  std::unique_ptr<Scratch> ws;
  if (ws_bytes > 0) ws = std::make_unique<Scratch>(s.allocator, ws_bytes);
  launch(s.index, s.stream, "reduce", [&] {
    k::reduce(static_cast<k::ReduceKind>(op), x.raw_data(), scalar(x.dtype()), outer, n, inner,
              out.raw_data(), indices ? indices->data<int64_t>() : nullptr,
              ws ? ws->get() : nullptr, s.stream);
  });
}

void CudaBackend::gelu_forward(const Tensor& x, Tensor& y, GeluForm form) {
  DeviceState& s = state(y.device().index);
  DeviceGuard g(s.index);
  const bool erf = form == GeluForm::Erf;
  launch(s.index, s.stream, erf ? "gelu_erf_forward" : "gelu_forward", [&] {
    k::gelu_forward(x.raw_data(), y.raw_data(), scalar(x.dtype()), x.numel(), erf, s.stream);
  });
}

void CudaBackend::soft_cap(const Tensor& x, double cap, Tensor& y) {
  // Contiguous, or (the head's padded logits) one row stride for both.
  const int64_t ld = same_row_stride(x, y, "soft_cap");
  const int64_t cols = x.dim() ? x.size(-1) : 1, rows = cols ? x.numel() / cols : 0;
  DeviceState& s = state(y.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "soft_cap", [&] {
    k::soft_cap(x.raw_data(), y.raw_data(), scalar(x.dtype()), rows, cols, ld, cap, s.stream);
  });
}

void CudaBackend::soft_cap_backward(const Tensor& y, const Tensor& dy, double cap, Tensor& dx) {
  DeviceState& s = state(dx.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "soft_cap_backward", [&] {
    k::soft_cap_backward(y.raw_data(), dy.raw_data(), dx.raw_data(), scalar(y.dtype()), y.numel(),
                         cap, s.stream);
  });
}

void CudaBackend::clamp(const Tensor& x, double lo, double hi, Tensor& y) {
  DeviceState& s = state(y.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "clamp", [&] {
    k::clamp(x.raw_data(), y.raw_data(), scalar(x.dtype()), x.numel(), lo, hi, s.stream);
  });
}

void CudaBackend::clamp_backward(const Tensor& x, const Tensor& dy, double lo, double hi,
                                 Tensor& dx) {
  DeviceState& s = state(dx.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "clamp_backward", [&] {
    k::clamp_backward(x.raw_data(), dy.raw_data(), dx.raw_data(), scalar(x.dtype()), x.numel(), lo,
                      hi, s.stream);
  });
}

void CudaBackend::glu_forward(const Tensor& x, Tensor& y, GluGate gate) {
  DeviceState& s = state(y.device().index);
  DeviceGuard g(s.index);
  const int64_t F = y.size(-1);
  const bool gelu = gate == GluGate::GeluTanh;
  launch(s.index, s.stream, gelu ? "geglu_forward" : "swiglu_forward", [&] {
    k::glu_forward(x.raw_data(), y.raw_data(), scalar(x.dtype()), F ? y.numel() / F : 0, F, gelu,
                   s.stream);
  });
}

void CudaBackend::glu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, GluGate gate) {
  DeviceState& s = state(dx.device().index);
  DeviceGuard g(s.index);
  const int64_t F = dy.size(-1);
  const bool gelu = gate == GluGate::GeluTanh;
  launch(s.index, s.stream, gelu ? "geglu_backward" : "swiglu_backward", [&] {
    k::glu_backward(x.raw_data(), dy.raw_data(), dx.raw_data(), scalar(x.dtype()),
                    F ? dy.numel() / F : 0, F, gelu, s.stream);
  });
}

void CudaBackend::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx, GeluForm form) {
  DeviceState& s = state(dx.device().index);
  DeviceGuard g(s.index);
  const bool erf = form == GeluForm::Erf;
  launch(s.index, s.stream, erf ? "gelu_erf_backward" : "gelu_backward", [&] {
    k::gelu_backward(x.raw_data(), dy.raw_data(), dx.raw_data(), scalar(x.dtype()), x.numel(), erf,
                     s.stream);
  });
}

namespace {
// LayerNorm, or RMSNorm when `mean` is null (no bias then), with or without
// the fused residual add (residual/sum, dsum null for the plain op); the
// scale is weight_offset + weight.
void run_norm_forward(CudaBackend& be, const Tensor& x, const Tensor* residual,
                      const Tensor& weight, const Tensor* bias, double eps, Tensor* sum, Tensor& y,
                      Tensor* mean, Tensor& rstd, double weight_offset = 0.0) {
  const char* name = mean ? "layer_norm_forward" : "rms_norm_forward";
  require_nn(mean ? "layer_norm" : "rms_norm", x.dtype());
  const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
  CudaBackend::DeviceState& s = be.state(y.device().index);
  DeviceGuard g(s.index);
  const void* r = residual ? residual->raw_data() : nullptr;
  void* h = sum ? sum->raw_data() : nullptr;
  launch(s.index, s.stream, name, [&] {
    if (mean) {
      k::layer_norm_forward(x.raw_data(), weight.raw_data(), bias->raw_data(), y.raw_data(),
                            mean->data<float>(), rstd.data<float>(), scalar(x.dtype()), N, C, eps,
                            s.stream, r, h, weight_offset);
    } else {
      k::rms_norm_forward(x.raw_data(), weight.raw_data(), y.raw_data(), rstd.data<float>(),
                          scalar(x.dtype()), N, C, eps, s.stream, r, h, weight_offset);
    }
  });
}

void run_norm_backward(CudaBackend& be, const Tensor& dy, const Tensor* dsum, const Tensor& x,
                       const Tensor& weight, const Tensor* mean, const Tensor& rstd, Tensor& dx,
                       Tensor& dweight, Tensor* dbias, double beta = 0.0,
                       double weight_offset = 0.0, float* dx_sums = nullptr) {
  const char* name = dx_sums ? "layer_norm_backward_dx_sums"
                     : mean  ? "layer_norm_backward"
                             : "rms_norm_backward";
  require_nn(name, x.dtype());
  const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
  CudaBackend::DeviceState& s = be.state(dx.device().index);
  DeviceGuard g(s.index);
  const bool register_sums = cuda::norm_backward_register_sums();
  Scratch ws(s.allocator,
             k::layer_norm_backward_workspace(N, C, dx_sums != nullptr, register_sums));
  const void* ds = dsum ? dsum->raw_data() : nullptr;
  const bool f32_grads = dweight.dtype() == DType::F32 && x.dtype() != DType::F32;
  launch(s.index, s.stream, name, [&] {
    if (mean) {
      k::layer_norm_backward(dy.raw_data(), x.raw_data(), weight.raw_data(), mean->data<float>(),
                             rstd.data<float>(), dx.raw_data(), dweight.raw_data(),
                             dbias->raw_data(), scalar(x.dtype()), N, C, ws.get(), s.stream, ds,
                             f32_grads, beta, weight_offset, dx_sums, register_sums);
    } else {
      k::rms_norm_backward(dy.raw_data(), x.raw_data(), weight.raw_data(), rstd.data<float>(),
                           dx.raw_data(), dweight.raw_data(), scalar(x.dtype()), N, C, ws.get(),
                           s.stream, ds, f32_grads, beta, weight_offset, register_sums);
    }
  });
}

// Whether the kernels can add a parameter's gradient straight into `g`: f32,
// or x's dtype; contiguous, on x's device, of the weight's shape.
bool fits_grad_buffer(const Tensor& g, const Tensor& x, const Tensor& weight) {
  return g.shape() == weight.shape() && g.is_contiguous() && g.device() == x.device() &&
         (g.dtype() == x.dtype() || (is_half(x.dtype()) && g.dtype() == DType::F32));
}
}  // namespace

void CudaBackend::layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                     double eps, Tensor& y, Tensor& mean, Tensor& rstd,
                                     double weight_offset) {
  run_norm_forward(*this, x, nullptr, weight, &bias, eps, nullptr, y, &mean, rstd, weight_offset);
}

void CudaBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                      const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                      Tensor& dweight, Tensor& dbias, double weight_offset) {
  run_norm_backward(*this, dy, nullptr, x, weight, &mean, rstd, dx, dweight, &dbias, 0.0,
                    weight_offset);
}

void CudaBackend::add_layer_norm_forward(const Tensor& x, const Tensor& residual,
                                         const Tensor& weight, const Tensor& bias, double eps,
                                         Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd,
                                         double weight_offset) {
  run_norm_forward(*this, x, &residual, weight, &bias, eps, &h, y, &mean, rstd, weight_offset);
}

void CudaBackend::add_layer_norm_backward(const Tensor& dy, const Tensor& dh, const Tensor& h,
                                          const Tensor& weight, const Tensor& mean,
                                          const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                          Tensor& dbias, double weight_offset) {
  run_norm_backward(*this, dy, &dh, h, weight, &mean, rstd, dx, dweight, &dbias, 0.0,
                    weight_offset);
}

void CudaBackend::layer_norm_backward_into(const Tensor& dy, const Tensor* dh, const Tensor& x,
                                           const Tensor& weight, const Tensor& mean,
                                           const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                           Tensor& dbias, double beta, double weight_offset) {
  // The kernel's last stage adds the column sums into the buffers (f32, or
  // x's dtype) directly: no half-precision temporaries, no adds after.
  if (x.dtype() == DType::F64 || !fits_grad_buffer(dweight, x, weight) ||
      !fits_grad_buffer(dbias, x, weight) || dweight.dtype() != dbias.dtype() ||
      (beta != 0.0 && beta != 1.0)) {
    Backend::layer_norm_backward_into(dy, dh, x, weight, mean, rstd, dx, dweight, dbias, beta,
                                      weight_offset);
    return;
  }
  run_norm_backward(*this, dy, dh, x, weight, &mean, rstd, dx, dweight, &dbias, beta,
                    weight_offset);
}

Tensor CudaBackend::layer_norm_backward_into_with_dx_sums(const Tensor& dy, const Tensor* dh,
                                                          const Tensor& x, const Tensor& weight,
                                                          const Tensor& mean, const Tensor& rstd,
                                                          Tensor& dx, Tensor& dweight,
                                                          Tensor& dbias, double beta,
                                                          double weight_offset) {
  // dx's column sums from the fused kernel's own pass (a third slice of its
  // shared memory beside the weight's and the bias's), where the next
  // linear layer's bias gradient would take a column-sum kernel over dx
  // (GPT-2 350M: 48 of a step's 96). Rows the fused kernel takes with room
  // for the slice (C <= 1024), and the setting on; otherwise no sums.
  const int64_t C = x.size(-1);
  if (!cuda::add_norm_bias_sums() || x.dtype() == DType::F64 ||
      !k::layer_norm_backward_sums_dx(C) || !fits_grad_buffer(dweight, x, weight) ||
      !fits_grad_buffer(dbias, x, weight) || dweight.dtype() != dbias.dtype() ||
      (beta != 0.0 && beta != 1.0)) {
    layer_norm_backward_into(dy, dh, x, weight, mean, rstd, dx, dweight, dbias, beta,
                             weight_offset);
    return Tensor();
  }
  Tensor sums = empty({C}, DType::F32, dx.device());
  run_norm_backward(*this, dy, dh, x, weight, &mean, rstd, dx, dweight, &dbias, beta, weight_offset,
                    sums.data<float>());
  return sums;
}

void CudaBackend::rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                                   Tensor& rstd, double weight_offset) {
  run_norm_forward(*this, x, nullptr, weight, nullptr, eps, nullptr, y, nullptr, rstd,
                   weight_offset);
}

void CudaBackend::add_rms_norm_forward(const Tensor& x, const Tensor& residual,
                                       const Tensor& weight, double eps, Tensor& h, Tensor& y,
                                       Tensor& rstd, double weight_offset) {
  run_norm_forward(*this, x, &residual, weight, nullptr, eps, &h, y, nullptr, rstd, weight_offset);
}

void CudaBackend::rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                    const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                    double weight_offset) {
  run_norm_backward(*this, dy, nullptr, x, weight, nullptr, rstd, dx, dweight, nullptr, 0.0,
                    weight_offset);
}

void CudaBackend::rms_norm_backward_into(const Tensor& dy, const Tensor* dh, const Tensor& x,
                                         const Tensor& weight, const Tensor& rstd, Tensor& dx,
                                         Tensor& dweight, double beta, double weight_offset) {
  if (x.dtype() == DType::F64 || !fits_grad_buffer(dweight, x, weight) ||
      (beta != 0.0 && beta != 1.0)) {
    Backend::rms_norm_backward_into(dy, dh, x, weight, rstd, dx, dweight, beta, weight_offset);
    return;
  }
  run_norm_backward(*this, dy, dh, x, weight, nullptr, rstd, dx, dweight, nullptr, beta,
                    weight_offset);
}

void CudaBackend::softmax_forward(const Tensor& x, Tensor& y) {
  require_nn("softmax", x.dtype());
  const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
  DeviceState& s = state(y.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "softmax_forward", [&] {
    k::softmax_forward(x.raw_data(), y.raw_data(), scalar(x.dtype()), N, C, s.stream);
  });
}

void CudaBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  require_nn("softmax_backward", y.dtype());
  const int64_t C = y.size(-1), N = y.numel() / std::max<int64_t>(C, 1);
  DeviceState& s = state(dx.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "softmax_backward", [&] {
    k::softmax_backward(y.raw_data(), dy.raw_data(), dx.raw_data(), scalar(y.dtype()), N, C,
                        s.stream);
  });
}

namespace {
// The kernels' shape of (B, T) queries of C = q D columns with `heads`.
// `first_keys`: the calls get first keys (doc_starts), as a window needs;
// only then, and for a window shorter than T, is the heads' sliding-window
// promise kept (a window of T or more is no window: no first keys are made).
k::AttentionShape attention_problem(int64_t B, int64_t T, int64_t C, const AttentionHeads& heads,
                                    bool first_keys) {
  k::AttentionShape s{B, T, C, heads.q, heads.kv, heads.softcap};
  s.window = first_keys && heads.window > 0 && heads.window < T ? heads.window : 0;
  return s;
}

// A call's shape: qkv (B, T, (q + 2 kv) D); `documents`: it has first keys.
k::AttentionShape attention_shape(const Tensor& qkv, const AttentionHeads& heads,
                                  bool documents = false) {
  return attention_problem(qkv.size(0), qkv.size(1), qkv.size(2) / heads.fused() * heads.q, heads,
                           documents);
}

cudnn_graph::AttentionProblem cudnn_problem(const k::AttentionShape& s, DType dtype) {
  cudnn_graph::AttentionProblem p{
      s.B, s.T, s.C, s.NH,
      dtype == DType::F16 ? cudnn_graph::DataType::F16 : cudnn_graph::DataType::BF16};
  p.NKV = s.kv_heads();
  p.window = s.window;
  return p;
}

int sm_major(int device) {
  int major = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
        "cudaDeviceGetAttribute");
  return major;
}

// What one attention call runs: one of Triad's kernels, or cuDNN's.
struct AttentionRoute {
  bool cudnn = false;
  k::AttentionKernel kernel = k::AttentionKernel::Auto;
};

// Why cuDNN cannot take the call ("" when it can); f32 never goes there.
std::string cudnn_unavailable(DType dtype, const k::AttentionShape& shape, int device) {
  if (dtype == DType::F32) return "cuDNN fused attention takes bf16 or f16 only";
  if (shape.softcap > 0)
    return "its graph has no logit soft-capping (softcap " + std::to_string(shape.softcap) + ")";
  return cudnn_attention_unavailable(cudnn_problem(shape, dtype), sm_major(device));
}

// Auto's per-shape choice between Triad's kernels (`own`: the tensor-core
// ones where they apply, else SIMT) and cuDNN: the one recorded for the
// problem (cuda::set_attention_choice), else made now by timing both
// (forward + backward) on scratch outputs and recorded. A forward that is
// never differentiated (`forward_only`, under autograd::InferenceGuard)
// takes the training decision if there is one, else one timed on the
// forward alone, recorded apart (training never takes it: its backward
// must run the forward's kernel).
class AttentionTuner {
 public:
  cuda::AttentionChoice decide(CudaBackend::DeviceState& s, const void* qkv, DType dtype,
                               const k::AttentionShape& shape, k::AttentionKernel own,
                               bool forward_only);

 private:
  std::mutex mutex_;  // one timing at a time
};

AttentionTuner& attention_tuner() {
  static AttentionTuner* t = new AttentionTuner();
  return *t;
}

cuda::AttentionChoice AttentionTuner::decide(CudaBackend::DeviceState& s, const void* qkv,
                                             DType dtype, const k::AttentionShape& shape,
                                             k::AttentionKernel own_kernel, bool forward_only) {
  // The backward timed is the one training would run.
  const bool deterministic = cuda::attention_deterministic();
  cuda::AttentionChoice choice;
  choice.dtype = dtype;
  choice.deterministic = deterministic;
  choice.batch = shape.B;
  choice.seq_len = shape.T;
  choice.d_model = shape.C;
  choice.n_head = shape.NH;
  choice.kv_heads = shape.kv_heads();
  choice.window = shape.window;
  std::lock_guard<std::mutex> lock(mutex_);
  if (cuda::find_attention_choice(choice)) return choice;
  if (forward_only) {
    choice.forward_only = true;
    if (cuda::find_attention_choice(choice)) return choice;
  }
  // Inside a CUDA graph's capture the timing runs would be captured into
  // the graph, not run, and the wait for them is refused: nothing can be
  // decided there, and nothing is recorded.
  if (open_capture(s.index) != nullptr) {
    throw Error("attention_kernel auto: attention over B=" + std::to_string(shape.B) +
                " T=" + std::to_string(shape.T) + " C=" + std::to_string(shape.C) +
                " heads=" + std::to_string(shape.NH) + "/" + std::to_string(shape.kv_heads()) +
                " in " + dtype_name(dtype) + (forward_only ? " (forward only)" : "") +
                " is first met inside a CUDA graph's capture, where cuDNN and Triad's kernels "
                "cannot be timed against each other: run the work once before capturing it (as "
                "train.cuda_graph does), or name the kernel (model.attention_kernel)");
  }
  const cudnn_graph::AttentionProblem p = cudnn_problem(shape, dtype);
  const k::ScalarType type = scalar(dtype);
  const size_t elem = dtype_size(dtype);
  const size_t n_out = static_cast<size_t>(shape.B * shape.T * shape.C);
  const size_t n_lse = static_cast<size_t>(shape.B * shape.NH * shape.T);
  try {
    const size_t ws = forward_only
                          ? cudnn_attention_workspace(s.index, p, false)
                          : std::max({cudnn_attention_workspace(s.index, p, false),
                                      cudnn_attention_workspace(s.index, p, true, deterministic),
                                      k::attention_backward_workspace(shape)});
    // A forward-only timing needs no gradient buffers.
    const size_t n_grad = forward_only ? 0 : n_out;
    Scratch out(s.allocator, n_out * elem), dout(s.allocator, n_grad * elem);
    const size_t n_qkv = forward_only ? 0
                                      : static_cast<size_t>(shape.B * shape.T) *
                                            static_cast<size_t>(shape.qkv_width());
    Scratch dqkv(s.allocator, n_qkv * elem), lse(s.allocator, n_lse * sizeof(float));
    Scratch work(s.allocator, ws);
    if (!forward_only)
      check(cudaMemsetAsync(dout.get(), 0, n_out * elem, s.stream), "cudaMemsetAsync");
    // A sliding window: Triad's kernels read it as each query's first key,
    // as a training step gives them, so that their time is the windowed one.
    std::optional<Scratch> window_starts;
    if (shape.window > 0) {
      std::vector<int32_t> host(static_cast<size_t>(shape.B * shape.T));
      for (int64_t b = 0; b < shape.B; ++b)
        for (int64_t t = 0; t < shape.T; ++t)
          host[static_cast<size_t>(b * shape.T + t)] =
              static_cast<int32_t>(std::max<int64_t>(0, t - shape.window + 1));
      window_starts.emplace(s.allocator, host.size() * sizeof(int32_t));
      // (From pageable memory: the copy has taken `host` when it returns.)
      check(cudaMemcpyAsync(window_starts->get(), host.data(), host.size() * sizeof(int32_t),
                            cudaMemcpyHostToDevice, s.stream),
            "cudaMemcpyAsync");
    }
    const int32_t* starts =
        window_starts ? static_cast<const int32_t*>(window_starts->get()) : nullptr;
    auto own = [&] {
      k::attention_forward(qkv, out.get(), static_cast<float*>(lse.get()), type, shape, s.stream,
                           own_kernel, starts);
      if (forward_only) return;
      k::attention_backward(qkv, out.get(), static_cast<const float*>(lse.get()), dout.get(),
                            dqkv.get(), type, shape, work.get(), s.stream, own_kernel, starts);
    };
    auto fused = [&] {
      cudnn_attention_forward(s.index, s.stream, p, qkv, out.get(), static_cast<float*>(lse.get()),
                              work.get());
      if (forward_only) return;
      cudnn_attention_backward(s.index, s.stream, p, qkv, out.get(),
                               static_cast<const float*>(lse.get()), dout.get(), dqkv.get(),
                               work.get(), deterministic);
    };
    auto time_ms = [&](auto&& fn) {
      fn();  // warm-up (and first-use setup)
      cudaEvent_t start, stop;
      check(cudaEventCreate(&start), "cudaEventCreate");
      check(cudaEventCreate(&stop), "cudaEventCreate");
      constexpr int kReps = 3;
      check(cudaEventRecord(start, s.stream), "cudaEventRecord");
      for (int i = 0; i < kReps; ++i) fn();
      check(cudaEventRecord(stop, s.stream), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      return static_cast<double>(ms) / kReps;
    };
    choice.own_ms = time_ms(own);
    choice.cudnn_ms = time_ms(fused);
    choice.cudnn = choice.cudnn_ms < choice.own_ms;
    const char* own_name =
        own_kernel == k::AttentionKernel::TensorCore ? "tensor-core kernels" : "SIMT kernels";
    spdlog::info(
        "attention B={} T={} C={} heads={}/{} {}: cuDNN {:.3f} ms, Triad's {} {:.3f} ms "
        "({}); using {}",
        shape.B, shape.T, shape.C, shape.NH, shape.kv_heads(), dtype_name(dtype), choice.cudnn_ms,
        own_name, choice.own_ms, forward_only ? "forward only" : "forward + backward",
        choice.cudnn ? "cuDNN" : own_name);
  } catch (const Error& e) {
    spdlog::warn("attention B={} T={} C={} heads={}/{}: cuDNN is not used ({})", shape.B, shape.T,
                 shape.C, shape.NH, shape.kv_heads(), e.what());
    choice.cudnn = false;
  }
  cuda::set_attention_choice(choice);
  return choice;
}

k::AttentionKernel own_attention_kernel(DType dtype, const k::AttentionShape& shape, int device) {
  return k::check_attention_tensor_core(scalar(dtype), shape, k::AttentionDevice::of(device)).ok
             ? k::AttentionKernel::TensorCore
             : k::AttentionKernel::Simt;
}

// Packed documents (doc_starts that are not a sliding window alone) and
// queries apart from the keys and values (shape.separate) stay with Triad's
// kernels: the cuDNN graph built here has the causal mask and a sliding
// window's, over every row's queries of one fused qkv.
AttentionRoute route_attention(CudaBackend::DeviceState& s, const Tensor& qkv,
                               const k::AttentionShape& shape, bool has_starts, bool forward_only) {
  const bool documents = has_starts && shape.window <= 0;
  switch (cuda::attention_kernel()) {
    case cuda::AttentionKernel::Simt:
      return {false, k::AttentionKernel::Simt};
    case cuda::AttentionKernel::TensorCore:
      return {false, k::AttentionKernel::TensorCore};
    case cuda::AttentionKernel::Cudnn: {
      // (Queries apart from their keys first: context parallelism's chunks
      // of queries also mark where their keys begin, as documents do.)
      const std::string why =
          shape.separate
              ? "its graph takes one fused qkv (queries apart from the keys and values, context "
                "parallelism's all-gather and ring, need the triad kernels)"
          : documents ? "its graph has no document mask (packed documents need the triad kernels)"
                      : cudnn_unavailable(qkv.dtype(), shape, s.index);
      if (!why.empty())
        throw NotSupportedError("attention_kernel cudnn: " + why +
                                " (B=" + std::to_string(shape.B) + " T=" + std::to_string(shape.T) +
                                " C=" + std::to_string(shape.C) +
                                " heads=" + std::to_string(shape.NH) + ")");
      return {true, k::AttentionKernel::Auto};
    }
    case cuda::AttentionKernel::Auto:
      break;
  }
  const k::AttentionKernel own = own_attention_kernel(qkv.dtype(), shape, s.index);
  if (documents || shape.separate) return {false, own};
  // cuDNN's tensors are declared 16-byte aligned; a view that is not stays
  // with Triad's kernels.
  const bool aligned = reinterpret_cast<uintptr_t>(qkv.raw_data()) % 16 == 0;
  // A shape Triad's kernels cannot take: they name why (cuDNN takes none of
  // them either; the grid's 2^31 - 1 blocks hold more rows than memory).
  if (!k::check_attention(scalar(qkv.dtype()), shape).ok) return {false, own};
  if (aligned && cudnn_unavailable(qkv.dtype(), shape, s.index).empty() &&
      attention_tuner().decide(s, qkv.raw_data(), qkv.dtype(), shape, own, forward_only).cudnn)
    return {true, k::AttentionKernel::Auto};
  return {false, own};
}

}  // namespace

bool tune_attention(int device, DType dtype, const k::AttentionShape& shape,
                    cuda::AttentionChoice& out) {
  if (cuda::attention_kernel() != cuda::AttentionKernel::Auto) return false;
  if (!cudnn_unavailable(dtype, shape, device).empty()) return false;
  CudaBackend::DeviceState& s = cuda_backend().state(device);
  DeviceGuard g(s.index);
  // Timed on zeros: the kernels' speed does not depend on the values.
  const size_t bytes =
      static_cast<size_t>(shape.B * shape.T * shape.qkv_width()) * dtype_size(dtype);
  Scratch qkv(s.allocator, bytes);
  check(cudaMemsetAsync(qkv.get(), 0, bytes, s.stream), "cudaMemsetAsync");
  out = attention_tuner().decide(s, qkv.get(), dtype, shape,
                                 own_attention_kernel(dtype, shape, device), false);
  return true;
}

namespace {
// The kernels' view of doc_starts: null for one document per row.
const int32_t* doc_starts_ptr(const Tensor& doc_starts) {
  if (!doc_starts.defined()) return nullptr;
  if (doc_starts.dtype() != DType::I32 || !doc_starts.device().is_cuda() ||
      !doc_starts.is_contiguous()) {
    throw ValueError("attention: doc_starts must be a contiguous i32 tensor on the GPU, got " +
                     std::string(dtype_name(doc_starts.dtype())) + " on " +
                     doc_starts.device().str());
  }
  return doc_starts.data<int32_t>();
}
}  // namespace

void CudaBackend::attention_forward(const Tensor& qkv, const AttentionHeads& heads, Tensor& out,
                                    Tensor& lse, const Tensor& doc_starts) {
  require_nn("attention", qkv.dtype());
  DeviceState& s = state(out.device().index);
  DeviceGuard g(s.index);
  const int32_t* starts = doc_starts_ptr(doc_starts);
  const k::AttentionShape shape = attention_shape(qkv, heads, starts != nullptr);
  launch(s.index, s.stream, "attention_forward", [&] {
    const AttentionRoute route =
        route_attention(s, qkv, shape, starts != nullptr, autograd::inference_mode());
    if (route.cudnn) {
      const cudnn_graph::AttentionProblem p = cudnn_problem(shape, qkv.dtype());
      Scratch ws(s.allocator, cudnn_attention_workspace(s.index, p, false));
      cudnn_attention_forward(s.index, s.stream, p, qkv.raw_data(), out.raw_data(),
                              lse.data<float>(), ws.get());
      return;
    }
    k::attention_forward(qkv.raw_data(), out.raw_data(), lse.data<float>(), scalar(qkv.dtype()),
                         shape, s.stream, route.kernel, starts);
  });
}

void CudaBackend::attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                     const Tensor& dout, const AttentionHeads& heads, Tensor& dqkv,
                                     const Tensor& doc_starts) {
  require_nn("attention_backward", qkv.dtype());
  DeviceState& s = state(dqkv.device().index);
  DeviceGuard g(s.index);
  const int32_t* starts = doc_starts_ptr(doc_starts);
  const k::AttentionShape shape = attention_shape(qkv, heads, starts != nullptr);
  launch(s.index, s.stream, "attention_backward", [&] {
    // The backward runs the training decision, as its forward did.
    const AttentionRoute route = route_attention(s, qkv, shape, starts != nullptr, false);
    if (route.cudnn) {
      const cudnn_graph::AttentionProblem p = cudnn_problem(shape, qkv.dtype());
      const bool deterministic = cuda::attention_deterministic();
      Scratch ws(s.allocator, cudnn_attention_workspace(s.index, p, true, deterministic));
      cudnn_attention_backward(s.index, s.stream, p, qkv.raw_data(), out.raw_data(),
                               lse.data<float>(), dout.raw_data(), dqkv.raw_data(), ws.get(),
                               deterministic);
      return;
    }
    Scratch ws(s.allocator, k::attention_backward_workspace(shape));
    k::attention_backward(qkv.raw_data(), out.raw_data(), lse.data<float>(), dout.raw_data(),
                          dqkv.raw_data(), scalar(qkv.dtype()), shape, ws.get(), s.stream,
                          route.kernel, starts);
  });
}

namespace {
// The kernels' shape of a block of queries q (B, Tq, q D) at positions
// [query_start, query_start + Tq) over kv (B, T, 2 kv D).
k::AttentionShape attention_parts_shape(const Tensor& q, const Tensor& kv,
                                        const AttentionHeads& heads, int64_t query_start) {
  k::AttentionShape s;
  s.B = kv.size(0);
  s.T = kv.size(1);
  s.C = q.size(2);
  s.NH = heads.q;
  s.NKV = heads.kv;
  s.softcap = heads.softcap;
  s.Q0 = query_start;
  s.QT = q.size(1);
  s.separate = true;
  return s;
}
}  // namespace

void CudaBackend::attention_parts_forward(const Tensor& q, const Tensor& kv,
                                          const AttentionHeads& heads, int64_t query_start,
                                          Tensor& out, Tensor& lse, const Tensor& doc_starts) {
  require_nn("attention", q.dtype());
  DeviceState& s = state(out.device().index);
  DeviceGuard g(s.index);
  k::AttentionShape shape = attention_parts_shape(q, kv, heads, query_start);
  shape.out_f32 = is_half(q.dtype()) && out.dtype() == DType::F32;
  if (out.dtype() != q.dtype() && !shape.out_f32) {
    throw ValueError(std::string("attention: the output is ") + dtype_name(out.dtype()) + " for " +
                     dtype_name(q.dtype()) + " queries (expected " + dtype_name(q.dtype()) +
                     ", or f32 under bf16/f16)");
  }
  const int32_t* starts = doc_starts_ptr(doc_starts);
  launch(s.index, s.stream, "attention_forward", [&] {
    const AttentionRoute route =
        route_attention(s, q, shape, starts != nullptr, autograd::inference_mode());
    k::attention_forward_parts(q.raw_data(), kv.raw_data(), out.raw_data(), lse.data<float>(),
                               scalar(q.dtype()), shape, s.stream, route.kernel, starts);
  });
}

void CudaBackend::attention_parts_backward(const Tensor& q, const Tensor& kv, const Tensor& out,
                                           const Tensor& lse, const Tensor& dout,
                                           const AttentionHeads& heads, int64_t query_start,
                                           Tensor& dq, Tensor& dkv, const Tensor& doc_starts) {
  require_nn("attention_backward", q.dtype());
  const k::AttentionShape shape = attention_parts_shape(q, kv, heads, query_start);
  DeviceState& s = state(dq.device().index);
  DeviceGuard g(s.index);
  const int32_t* starts = doc_starts_ptr(doc_starts);
  launch(s.index, s.stream, "attention_backward", [&] {
    const AttentionRoute route = route_attention(s, q, shape, starts != nullptr, false);
    Scratch ws(s.allocator, k::attention_backward_workspace(shape));
    k::attention_backward_parts(q.raw_data(), kv.raw_data(), out.raw_data(), lse.data<float>(),
                                dout.raw_data(), dq.raw_data(), dkv.raw_data(), scalar(q.dtype()),
                                shape, ws.get(), s.stream, route.kernel, starts);
  });
}

void CudaBackend::attention_merge(Tensor& out, Tensor& lse, const Tensor& part,
                                  const Tensor& part_lse) {
  require_nn("attention_merge", part.dtype());
  if (out.dtype() != DType::F32 || lse.dtype() != DType::F32 || part_lse.dtype() != DType::F32) {
    throw ValueError(std::string("attention_merge: the accumulated output and both log-sum-exps "
                                 "must be f32 on the GPU, got ") +
                     dtype_name(out.dtype()) + ", " + dtype_name(lse.dtype()) + " and " +
                     dtype_name(part_lse.dtype()));
  }
  DeviceState& s = state(out.device().index);
  DeviceGuard g(s.index);
  const int64_t B = lse.size(0), NH = lse.size(1), Tq = lse.size(2);
  launch(s.index, s.stream, "attention_merge", [&] {
    k::attention_merge(out.data<float>(), lse.data<float>(), part.raw_data(),
                       part_lse.data<float>(), scalar(part.dtype()), B, Tq, NH,
                       NH > 0 ? out.size(2) / NH : 0, s.stream);
  });
}

void CudaBackend::embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  require_nn("embedding", weight.dtype());
  require_index("embedding", ids);
  const int64_t V = weight.size(0), C = weight.size(1), N = ids.numel();
  if (CaptureChecks* capture = open_checks(out.device().index);
      capture && ids.device() == out.device()) {
    // A capture cannot wait for the ids (nor need a cuda::DeviceChecks):
    // the kernel checks them, and Graph::check or DeviceChecks::check
    // reports a bad one.
    DeviceState& s = state(out.device().index);
    DeviceGuard g(s.index);
    const auto [dev_ids, bad] = checked_indices(*this, s, *capture, "embedding: token id", ids, V);
    launch(s.index, s.stream, "embedding_forward", [&] {
      k::embedding_forward(weight.raw_data(), scalar(weight.dtype()), dev_ids.raw_data(),
                           dev_ids.dtype() == DType::I64, V, C, N, out.raw_data(), s.stream, bad);
    });
    return;
  }
  // Ids are checked on the host so a bad one is an error, not a wild read
  // (ids already on the host are read there; ids on the GPU are copied back,
  // which waits for the queued work).
  const std::vector<int64_t> host = host_indices(*this, ids);
  for (int64_t i = 0; i < N; ++i) {
    if (host[i] < 0 || host[i] >= V) {
      throw ValueError("embedding: token id " + std::to_string(host[i]) + " at position " +
                       std::to_string(i) + " is outside [0, " + std::to_string(V) + ")");
    }
  }
  DeviceState& s = state(out.device().index);
  DeviceGuard g(s.index);
  // Host ids go up as they are (the upload is queued; it does not wait).
  Tensor dev_ids = ids.device().is_cpu() ? empty(ids.shape(), ids.dtype(), out.device()) : ids;
  if (ids.device().is_cpu()) copy(ids, dev_ids);
  launch(s.index, s.stream, "embedding_forward", [&] {
    k::embedding_forward(weight.raw_data(), scalar(weight.dtype()), dev_ids.raw_data(),
                         dev_ids.dtype() == DType::I64, V, C, N, out.raw_data(), s.stream);
  });
}

void CudaBackend::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) {
  run_embedding_backward(ids, dout, dweight, false);
}

void CudaBackend::embedding_backward_into(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                                          double beta) {
  const bool fused =
      dweight.is_contiguous() && dweight.dim() == 2 && dweight.device() == dout.device() &&
      (beta == 0.0 || beta == 1.0) && dout.dtype() != DType::F64 &&
      (dweight.dtype() == dout.dtype() || (is_half(dout.dtype()) && dweight.dtype() == DType::F32));
  if (!fused) {
    Backend::embedding_backward_into(ids, dout, dweight, beta);
    return;
  }
  run_embedding_backward(ids, dout, dweight, beta != 0.0);
}

void CudaBackend::run_embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                                         bool accumulate) {
  require_nn("embedding_backward", dout.dtype());
  require_index("embedding_backward", ids);
  const int64_t V = dweight.size(0), C = dweight.size(1), N = ids.numel();
  const bool f32_grad = dweight.dtype() == DType::F32 && dout.dtype() != DType::F32;
  if (CaptureChecks* capture = open_checks(dweight.device().index);
      capture && ids.device() == dweight.device()) {
    // In a capture (or a cuda::DeviceChecks) the ids do not come to the
    // host: the device sorts them into the same pieces (kernels/embedding.h),
    // its grids sized for the most pieces N ids can make.
    DeviceState& s = state(dweight.device().index);
    DeviceGuard g(s.index);
    const auto [dev_ids, bad] =
        checked_indices(*this, s, *capture, "embedding_backward: token id", ids, V);
    k::EmbeddingPlan plan;
    Scratch ws(s.allocator, N > 0 ? k::embedding_device_plan_bytes(N) : 0);
    const int64_t slots = N > 0 ? k::embedding_device_plan_slots(N) : 0;
    Tensor partials;
    if (slots > 0) partials = empty({slots, C}, DType::F32, dweight.device());
    launch(s.index, s.stream, "embedding_backward", [&] {
      if (N > 0) {
        plan = k::embedding_plan_on_device(dev_ids.raw_data(), dev_ids.dtype() == DType::I64, N, V,
                                           ws.get(), slots > 0 ? partials.data<float>() : nullptr,
                                           bad, s.stream);
      }
      k::embedding_backward(plan, dout.raw_data(), scalar(dout.dtype()), V, C, dweight.raw_data(),
                            s.stream, f32_grad, accumulate);
    });
    return;
  }
  const std::vector<int64_t> host = host_indices(*this, ids);
  detail::EmbeddingPieces pieces;
  std::vector<int64_t> order;
  launch("embedding_backward", [&] {  // host work
    detail::EmbeddingSegments seg = detail::group_by_id(host.data(), N, V);
    pieces = detail::cut_into_pieces(seg);
    order = std::move(seg.order);
  });
  const int64_t P = static_cast<int64_t>(pieces.piece_dest.size());
  const int64_t L = static_cast<int64_t>(pieces.long_id.size());
  // order | piece_start | piece_dest | long_first | long_id in one upload.
  Tensor packed = empty({N + 2 * P + 2 * L + 2}, DType::I64, Device::cpu());
  int64_t* p = packed.data<int64_t>();
  for (const std::vector<int64_t>* part :
       {&order, &pieces.piece_start, &pieces.piece_dest, &pieces.long_first, &pieces.long_id}) {
    p = std::copy(part->begin(), part->end(), p);
  }
  Tensor dev = empty(packed.shape(), DType::I64, dweight.device());
  copy(packed, dev);
  // The long segments' pieces' sums, from the caching allocator (stream-ordered).
  Tensor partials;
  if (L > 0) partials = empty({pieces.slots(), C}, DType::F32, dweight.device());
  DeviceState& s = state(dweight.device().index);
  DeviceGuard g(s.index);
  const int64_t* d = dev.data<int64_t>();
  k::EmbeddingPlan plan;
  plan.order = d;
  plan.piece_start = d + N;
  plan.piece_dest = plan.piece_start + P + 1;
  plan.pieces = P;
  plan.long_first = plan.piece_dest + P;
  plan.long_id = plan.long_first + L + 1;
  plan.longs = L;
  plan.partials = L > 0 ? partials.data<float>() : nullptr;
  launch(s.index, s.stream, "embedding_backward", [&] {
    k::embedding_backward(plan, dout.raw_data(), scalar(dout.dtype()), V, C, dweight.raw_data(),
                          s.stream, f32_grad, accumulate);
  });
}

namespace {
// A cross entropy's optional per-row statistic (dlse): f32 of `rows`, or
// undefined (null).
const float* stats_or_null(const Tensor& t, int64_t rows, const char* op) {
  if (!t.defined()) return nullptr;
  if (t.dtype() != DType::F32 || t.numel() != rows) {
    throw ValueError(std::string(op) + ": dlse must be f32 of " + std::to_string(rows) +
                     " rows, got " + dtype_name(t.dtype()) + " " + shape_str(t.shape()));
  }
  return t.data<float>();
}
}  // namespace

void CudaBackend::cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                        int64_t ignore_index, Tensor& losses, Tensor& lse) {
  require_nn("cross_entropy", logits.dtype());
  require_index("cross_entropy", targets);
  // The front end checked the targets on the host; a bad one reaching the
  // kernel directly gives a NaN loss, never a read outside the row.
  const int64_t N = logits.size(0), V = logits.size(1);
  const int64_t ld = matrix_ld(logits, "cross_entropy");  // padded rows
  DeviceState& s = state(logits.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "cross_entropy_forward", [&] {
    k::cross_entropy_forward(logits.raw_data(), scalar(logits.dtype()), targets.raw_data(),
                             targets.dtype() == DType::I64, N, V, ld, ignore_index,
                             losses.data<float>(), lse.data<float>(), s.stream);
  });
}

void CudaBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                         const Tensor& lse, const Tensor& dlosses,
                                         const Tensor& dlse, int64_t ignore_index, Tensor& dlogits,
                                         double softcap) {
  require_nn("cross_entropy_backward", logits.dtype());
  require_index("cross_entropy_backward", targets);
  // Padded rows: dlogits takes the logits' layout (and may be the logits).
  const int64_t ld = same_row_stride(logits, dlogits, "cross_entropy_backward");
  DeviceState& s = state(logits.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "cross_entropy_backward", [&] {
    k::cross_entropy_backward(
        logits.raw_data(), scalar(logits.dtype()), targets.raw_data(),
        targets.dtype() == DType::I64, lse.data<float>(), dlosses.data<float>(),
        stats_or_null(dlse, logits.size(0), "cross_entropy_backward"), logits.size(0),
        logits.size(1), ld, ignore_index, softcap, dlogits.raw_data(), s.stream);
  });
}

void CudaBackend::cross_entropy_forward_backward(const Tensor& logits, const Tensor& targets,
                                                 int64_t ignore_index, Tensor& losses, Tensor& lse,
                                                 const Tensor& dlosses, Tensor& dlogits,
                                                 double softcap, double z_scale) {
  require_nn("cross_entropy_forward_backward", logits.dtype());
  require_index("cross_entropy_forward_backward", targets);
  const int64_t N = logits.size(0), V = logits.size(1);
  const int64_t ld = same_row_stride(logits, dlogits, "cross_entropy_forward_backward");
  DeviceState& s = state(logits.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "cross_entropy_forward_backward", [&] {
    k::cross_entropy_forward_backward(
        logits.raw_data(), scalar(logits.dtype()), targets.raw_data(),
        targets.dtype() == DType::I64, stats_or_null(dlosses, N, "cross_entropy_forward_backward"),
        N, V, ld, ignore_index, softcap, z_scale, losses.data<float>(), lse.data<float>(),
        dlogits.raw_data(), s.stream);
  });
}

void CudaBackend::scale_by_ratio(const Tensor& actual, double expected, Tensor& x) {
  const bool on_device = actual.numel() == 1 && actual.dtype() == DType::F32 &&
                         actual.device() == x.device() && actual.is_contiguous() && x.dim() == 2 &&
                         (x.dtype() == DType::F32 || is_half(x.dtype()));
  if (!on_device || expected == 0.0) {
    Backend::scale_by_ratio(actual, expected, x);  // (which checks, and reads on the host)
    return;
  }
  const int64_t ld = matrix_ld(x, "scale_by_ratio");
  DeviceState& s = state(x.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "scale_by_ratio", [&] {
    k::scale_by_ratio(x.raw_data(), scalar(x.dtype()), x.size(0), x.size(1), ld,
                      actual.data<float>(), expected, s.stream);
  });
}

void CudaBackend::vocab_ce_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                   int64_t valid, Tensor& row_max, Tensor& target_logit) {
  require_nn("vocab_ce_partial", logits.dtype());
  require_index("vocab_ce_partial", targets);
  const int64_t ld = matrix_ld(logits, "vocab_ce_partial");
  DeviceState& s = state(logits.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "vocab_ce_partial", [&] {
    k::vocab_ce_partial(logits.raw_data(), scalar(logits.dtype()), targets.raw_data(),
                        targets.dtype() == DType::I64, logits.size(0), logits.size(1), ld,
                        vocab_start, valid, row_max.data<float>(), target_logit.data<float>(),
                        s.stream);
  });
}

void CudaBackend::vocab_ce_shard_sums(const Tensor& logits, const Tensor& targets,
                                      int64_t vocab_start, int64_t valid, Tensor& row_max,
                                      Tensor& sumexp, Tensor& target_logit) {
  require_nn("vocab_ce_shard_sums", logits.dtype());
  require_index("vocab_ce_shard_sums", targets);
  const int64_t ld = matrix_ld(logits, "vocab_ce_shard_sums");
  DeviceState& s = state(logits.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "vocab_ce_shard_sums", [&] {
    k::vocab_ce_shard_sums(logits.raw_data(), scalar(logits.dtype()), targets.raw_data(),
                           targets.dtype() == DType::I64, logits.size(0), logits.size(1), ld,
                           vocab_start, valid, row_max.data<float>(), sumexp.data<float>(),
                           target_logit.data<float>(), s.stream);
  });
}

void CudaBackend::vocab_ce_sumexp(const Tensor& logits, const Tensor& global_max, int64_t valid,
                                  Tensor& sumexp) {
  require_nn("vocab_ce_sumexp", logits.dtype());
  const int64_t ld = matrix_ld(logits, "vocab_ce_sumexp");
  DeviceState& s = state(logits.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "vocab_ce_sumexp", [&] {
    k::vocab_ce_sumexp(logits.raw_data(), scalar(logits.dtype()), global_max.data<float>(),
                       logits.size(0), logits.size(1), ld, valid, sumexp.data<float>(), s.stream);
  });
}

void CudaBackend::vocab_ce_loss(const Tensor& global_max, const Tensor& target_logit,
                                const Tensor& sumexp, Tensor& losses) {
  for (const Tensor* t :
       std::initializer_list<const Tensor*>{&global_max, &target_logit, &sumexp, &losses}) {
    if (t->dtype() != DType::F32 || t->numel() != losses.numel()) {
      throw ValueError("vocab_ce_loss: statistics must be f32 of " +
                       std::to_string(losses.numel()) + " rows, got " + dtype_name(t->dtype()) +
                       " " + shape_str(t->shape()));
    }
  }
  DeviceState& s = state(losses.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "vocab_ce_loss", [&] {
    k::vocab_ce_loss(global_max.data<float>(), target_logit.data<float>(), sumexp.data<float>(),
                     losses.numel(), losses.data<float>(), s.stream);
  });
}

void CudaBackend::vocab_ce_backward(const Tensor& logits, const Tensor& targets,
                                    int64_t vocab_start, int64_t valid, const Tensor& global_max,
                                    const Tensor& sumexp, const Tensor& dloss, const Tensor& dlse,
                                    Tensor& dlogits, double softcap) {
  require_nn("vocab_ce_backward", logits.dtype());
  require_index("vocab_ce_backward", targets);
  const int64_t ld = same_row_stride(logits, dlogits, "vocab_ce_backward");
  DeviceState& s = state(logits.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "vocab_ce_backward", [&] {
    k::vocab_ce_backward(logits.raw_data(), scalar(logits.dtype()), targets.raw_data(),
                         targets.dtype() == DType::I64, logits.size(0), logits.size(1), ld,
                         vocab_start, valid, global_max.data<float>(), sumexp.data<float>(),
                         dloss.data<float>(),
                         stats_or_null(dlse, logits.size(0), "vocab_ce_backward"), softcap,
                         dlogits.raw_data(), s.stream);
  });
}

namespace {
// The kernels' view of new tokens' qkv and a key/value cache's slots
// (keys, values: (B, kv, slots, D)).
k::CachedAttentionShape cache_shape(const Tensor& qkv, const AttentionHeads& heads,
                                    const Tensor& keys, const Tensor& values) {
  k::CachedAttentionShape shape;
  shape.B = qkv.size(0);
  shape.n = qkv.size(1);
  shape.NH = heads.q;
  shape.NKV = heads.kv;
  shape.D = keys.size(3);
  shape.L = keys.size(2);
  shape.k_batch_stride = keys.strides()[0];
  shape.k_head_stride = keys.strides()[1];
  shape.v_batch_stride = values.strides()[0];
  shape.v_head_stride = values.strides()[1];
  return shape;
}
}  // namespace

void CudaBackend::write_kv_cache(const Tensor& qkv, const AttentionHeads& heads, int64_t start,
                                 Tensor& k_cache, Tensor& v_cache) {
  require_nn("write_kv_cache", qkv.dtype());
  DeviceState& s = state(k_cache.device().index);
  DeviceGuard g(s.index);
  const k::CachedAttentionShape shape = cache_shape(qkv, heads, k_cache, v_cache);
  launch(s.index, s.stream, "write_kv_cache", [&] {
    k::write_kv_cache(qkv.raw_data(), k_cache.raw_data(), v_cache.raw_data(), scalar(qkv.dtype()),
                      shape, start, s.stream);
  });
}

void CudaBackend::cached_attention_forward(const Tensor& qkv, const Tensor& keys,
                                           const Tensor& values, const AttentionHeads& heads,
                                           int64_t window, const Tensor& text_starts, Tensor& out) {
  require_nn("cached_attention", qkv.dtype());
  DeviceState& s = state(out.device().index);
  DeviceGuard g(s.index);
  if (text_starts.defined() &&
      (text_starts.dtype() != DType::I32 || !text_starts.device().is_cuda() ||
       !text_starts.is_contiguous() || text_starts.numel() != qkv.size(0))) {
    throw ValueError(
        "cached_attention: text_starts must be a contiguous (B) i32 tensor on the "
        "GPU, got " +
        std::string(dtype_name(text_starts.dtype())) + " " + shape_str(text_starts.shape()) +
        " on " + text_starts.device().str());
  }
  k::CachedAttentionShape shape = cache_shape(qkv, heads, keys, values);
  shape.window = window;
  shape.softcap = heads.softcap;
  launch(s.index, s.stream, "cached_attention_forward", [&] {
    // The chunks' partial results (a long cache split over more blocks).
    const size_t bytes = k::cached_attention_workspace(shape);
    std::optional<Scratch> ws;
    if (bytes > 0) ws.emplace(s.allocator, bytes);
    k::cached_attention_forward(qkv.raw_data(), keys.raw_data(), values.raw_data(), out.raw_data(),
                                scalar(qkv.dtype()), shape,
                                text_starts.defined() ? text_starts.data<int32_t>() : nullptr,
                                ws ? ws->get() : nullptr, s.stream);
  });
}

void CudaBackend::rotary_embedding(const Tensor& qkv, const AttentionHeads& heads,
                                   const Tensor& positions, int64_t start, double theta,
                                   const RopeScaling& scaling, bool inverse, Tensor& out) {
  DeviceState& s = state(out.device().index);
  DeviceGuard g(s.index);
  const int64_t D = qkv.size(2) / heads.fused();
  if (positions.defined() &&
      (positions.dtype() != DType::I64 || !positions.device().is_cuda() ||
       !positions.is_contiguous() || positions.numel() != qkv.size(0) * qkv.size(1))) {
    throw ValueError(
        "rotary_embedding: positions must be a contiguous (B, T) i64 tensor on the GPU, got " +
        std::string(dtype_name(positions.dtype())) + " " + shape_str(positions.shape()) + " on " +
        positions.device().str());
  }
  launch(s.index, s.stream, "rotary_embedding", [&] {
    k::rotary_embedding(qkv.raw_data(), out.raw_data(), scalar(qkv.dtype()), qkv.size(0),
                        qkv.size(1), heads.q, heads.kv, D,
                        positions.defined() ? positions.data<int64_t>() : nullptr, start, theta,
                        scaling, inverse, s.stream);
  });
}

void CudaBackend::dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream,
                          const philox::Counters& at, const Tensor& keys, const Tensor& calls,
                          Tensor& y) {
  DeviceState& s = state(y.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "dropout", [&] {
    k::dropout(x.raw_data(), y.raw_data(), scalar(x.dtype()), x.numel(), p, seed, stream, at,
               keys.defined() ? keys.data<int64_t>() : nullptr, s.stream,
               calls.defined() ? calls.data<int64_t>() : nullptr);
  });
}

namespace {
k::AdamWArgs adamw_args(const AdamWStep& hp) {
  k::AdamWArgs a;
  a.lr = hp.lr;
  a.beta1 = hp.beta1;
  a.beta2 = hp.beta2;
  a.eps = hp.eps;
  a.weight_decay = hp.weight_decay;
  a.step = hp.step;
  a.grad_scale = hp.grad_scale;
  return a;
}
}  // namespace

void CudaBackend::adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                        const AdamWStep& hp) {
  require_nn("adamw", param.dtype());
  // The moments: the parameter's type, or bf16 beside an f32 parameter
  // (train.moment_precision: bf16).
  const DType moments = m.dtype();
  const bool bf16_moments = param.dtype() == DType::F32 && moments == DType::BF16;
  for (const Tensor* t : {&grad, static_cast<const Tensor*>(&m), static_cast<const Tensor*>(&v)}) {
    const DType want = t == &grad || !bf16_moments ? param.dtype() : DType::BF16;
    if (t->dtype() != want || t->numel() != param.numel()) {
      throw ValueError(std::string("adamw: gradient and moments must match the parameter (") +
                       dtype_name(param.dtype()) + ", " + std::to_string(param.numel()) +
                       " elements; bf16 moments beside f32), got " + dtype_name(t->dtype()) + ", " +
                       std::to_string(t->numel()));
    }
  }
  DeviceState& s = state(param.device().index);
  DeviceGuard g(s.index);
  const k::AdamWArgs a = adamw_args(hp);
  launch(s.index, s.stream, "adamw", [&] {
    k::adamw(param.raw_data(), grad.raw_data(), m.raw_data(), v.raw_data(), scalar(param.dtype()),
             scalar(moments), param.numel(), a, s.stream);
  });
}

void CudaBackend::adamw_many(std::vector<AdamWEntry>& entries, const AdamWStep& hp) {
  // f32 parameters with f32 gradients, and bf16/f16 ones with f32 masters
  // and f32 gradients or gradients of their own type, with f32 or bf16
  // moments, go through the multi-tensor kernel, one launch sequence per
  // parameter, gradient and moment type; anything else takes adamw() one at
  // a time.
  std::map<std::tuple<DType, DType, DType>, std::vector<k::AdamWTensor>> groups;
  std::vector<AdamWEntry> rest;
  int device = -1;
  for (AdamWEntry& e : entries) {
    const int64_t n = e.param.numel();
    const DType moments = e.m.dtype(), grads = e.grad.dtype();
    const bool sizes = e.grad.numel() == n && e.m.numel() == n && e.v.numel() == n;
    const bool stored = (moments == DType::F32 || moments == DType::BF16) && e.v.dtype() == moments;
    const bool plain = !e.master.defined() && e.param.dtype() == DType::F32 && grads == DType::F32;
    const bool half = e.master.defined() && is_half(e.param.dtype()) &&
                      e.master.dtype() == DType::F32 && e.master.numel() == n &&
                      (grads == DType::F32 || grads == e.param.dtype());
    const int d = e.param.device().index;
    if (!sizes || !stored || !(plain || half) || (device >= 0 && d != device)) {
      rest.push_back(e);
      continue;
    }
    device = d;
    k::AdamWTensor t;
    t.param = e.param.raw_data();
    t.grad = e.grad.raw_data();
    t.m = e.m.raw_data();
    t.v = e.v.raw_data();
    t.master = half ? e.master.data<float>() : nullptr;
    t.n = n;
    t.weight_decay = e.weight_decay;
    t.grad_scale = e.grad_scale;
    groups[{e.param.dtype(), grads, moments}].push_back(t);
  }
  if (!groups.empty()) {
    DeviceState& s = state(device);
    DeviceGuard g(s.index);
    k::AdamWArgs a = adamw_args(hp);  // each tensor carries its own weight decay
    if (hp.clip_sum_sq.defined()) {
      // Clipping's coefficient read by the kernels: no wait for the norm.
      check_clip_sum_sq(hp.clip_sum_sq, Device::cuda(device));
      a.clip_sum_sq = hp.clip_sum_sq.data<double>();
      a.clip_max_norm = hp.clip_max_norm;
    }
    for (auto& [types, tensors] : groups) {
      const k::AdamWTypes kt{scalar(std::get<0>(types)), scalar(std::get<1>(types)),
                             scalar(std::get<2>(types))};
      launch(s.index, s.stream, "adamw_many", [&] { k::adamw_multi(kt, tensors, a, s.stream); });
    }
  }
  if (!rest.empty()) Backend::adamw_many(rest, hp);
}

void CudaBackend::sum_of_squares(const std::vector<Tensor>& tensors, Tensor& out) {
  if (out.dtype() != DType::F64 || out.numel() != 1) {
    throw ValueError("sum_of_squares: out must be one f64 element, got " +
                     std::string(dtype_name(out.dtype())) + " " + shape_str(out.shape()));
  }
  // f32, bf16 and f16 tensors go through the multi-tensor kernel, one launch
  // sequence per dtype; any other dtype takes the reference.
  std::map<DType, std::vector<k::SumSquaresTensor>> groups;
  std::vector<Tensor> rest;
  for (const Tensor& t : tensors) {
    if (t.device() != out.device()) {
      throw ValueError("sum_of_squares: a tensor on " + t.device().str() + ", out on " +
                       out.device().str());
    }
    const DType d = t.dtype();
    if (d != DType::F32 && d != DType::BF16 && d != DType::F16) {
      rest.push_back(t);
    } else if (t.numel() > 0) {
      groups[d].push_back({t.raw_data(), t.numel()});
    }
  }
  bool accumulate = !rest.empty();
  if (accumulate) Backend::sum_of_squares(rest, out);
  if (groups.empty()) {
    if (!accumulate) fill(out, 0.0);
    return;
  }
  DeviceState& s = state(out.device().index);
  DeviceGuard g(s.index);
  int64_t partials = 0;
  for (const auto& [dtype, list] : groups) {
    partials = std::max(partials, k::sum_squares_partials(list));
  }
  Scratch ws(s.allocator, static_cast<size_t>(partials) * sizeof(double));
  for (const auto& [dtype, list] : groups) {
    launch(s.index, s.stream, "sum_of_squares", [&] {
      k::sum_squares_multi(scalar(dtype), list, static_cast<double*>(ws.get()), out.data<double>(),
                           accumulate, s.stream);
    });
    accumulate = true;
  }
}

void CudaBackend::route_top_k(const Tensor& scores, const Tensor& bias, int64_t groups,
                              int64_t top_groups, int64_t group_best, Tensor& choice,
                              Tensor* chosen) {
  const ExpertRule rule =
      route_top_k_rule(scores, bias, groups, top_groups, group_best, choice, chosen);
  const k::RouteShape shape{scores.size(0), rule.experts, rule.top_k,
                            groups,         top_groups,   group_best};
  const k::ScalarType bias_type = scalar(bias.defined() ? bias.dtype() : scores.dtype());
  // Lists longer than a thread keeps: chosen on the host instead.
  if (!k::check_route_top_k(scalar(scores.dtype()), bias_type, shape).ok) {
    Backend::route_top_k(scores, bias, groups, top_groups, group_best, choice, chosen);
    return;
  }
  DeviceState& s = state(scores.device().index);
  launch(s.index, s.stream, "route_top_k", [&] {
    k::route_top_k(scores.raw_data(), scalar(scores.dtype()),
                   bias.defined() ? bias.raw_data() : nullptr, bias_type, shape,
                   choice.data<int64_t>(), chosen ? chosen->raw_data() : nullptr, s.stream);
  });
}

void CudaBackend::capacity_slots(const Tensor& choice, const Tensor& scores, int64_t experts,
                                 int64_t capacity, int64_t group, Tensor& slot_token,
                                 Tensor& slot_assignment, Tensor& picked, Tensor& counts) {
  check_capacity_slots(choice, scores, experts, capacity, group, slot_token, slot_assignment,
                       picked, counts);
  const k::CapacityShape shape{choice.size(0), experts, choice.size(1), capacity, group};
  DeviceState& s = state(choice.device().index);
  DeviceGuard g(s.index);
  // (Many experts list their assignments first, in a workspace.)
  const size_t bytes = k::capacity_lists(shape).bytes;
  std::optional<Scratch> ws;
  if (bytes > 0) ws.emplace(s.allocator, bytes);
  launch(s.index, s.stream, "capacity_slots", [&] {
    k::capacity_slots(choice.data<int64_t>(), scores.defined() ? scores.raw_data() : nullptr,
                      scalar(scores.defined() ? scores.dtype() : DType::F32), shape,
                      slot_token.data<int64_t>(), slot_assignment.data<int64_t>(),
                      picked.data<int64_t>(), counts.data<int64_t>(), ws ? ws->get() : nullptr,
                      s.stream);
  });
}

void CudaBackend::dropless_rows(const Tensor& choice, int64_t experts, int64_t group,
                                Tensor& row_token, Tensor& row_assignment, Tensor& offsets,
                                Tensor& picked, Tensor& counts) {
  check_dropless_rows(choice, experts, group, row_token, row_assignment, offsets, picked, counts);
  const k::DroplessShape shape{choice.size(0), experts, choice.size(1), group};
  DeviceState& s = state(choice.device().index);
  DeviceGuard g(s.index);
  const size_t bytes = k::dropless_workspace(shape);
  std::optional<Scratch> ws;
  if (bytes > 0) ws.emplace(s.allocator, bytes);
  launch(s.index, s.stream, "dropless_rows", [&] {
    k::dropless_rows(choice.data<int64_t>(), shape, row_token.data<int64_t>(),
                     row_assignment.data<int64_t>(), offsets.data<int64_t>(),
                     picked.data<int64_t>(), counts.data<int64_t>(), ws ? ws->get() : nullptr,
                     s.stream);
  });
}

void CudaBackend::grouped_gemm_rows(const Tensor& a, const std::vector<Tensor>& b,
                                    const Tensor& offsets, bool trans_b, Tensor& c) {
  const GroupedGemmSizes sizes = check_grouped_gemm_rows(a, b, offsets, trans_b, c);
  const k::GroupedGemmShape shape{sizes.M, sizes.N, sizes.K, sizes.groups};
  std::vector<const void*> bs;
  for (const Tensor& t : b) bs.push_back(t.raw_data());
  DeviceState& s = state(a.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "grouped_gemm_rows", [&] {
    k::grouped_gemm_rows(scalar(a.dtype()), shape, a.raw_data(), bs.data(), offsets.data<int64_t>(),
                         trans_b, c.raw_data(), s.stream);
  });
}

void CudaBackend::grouped_gemm_sums(const Tensor& a, const Tensor& b, const Tensor& offsets,
                                    std::vector<Tensor>& c, double beta) {
  const GroupedGemmSizes sizes = check_grouped_gemm_sums(a, b, offsets, c);
  const k::GroupedGemmShape shape{sizes.M, sizes.N, sizes.K, sizes.groups};
  std::vector<void*> cs;
  for (Tensor& t : c) cs.push_back(t.raw_data());
  DeviceState& s = state(a.device().index);
  DeviceGuard g(s.index);
  launch(s.index, s.stream, "grouped_gemm_sums", [&] {
    k::grouped_gemm_sums(scalar(a.dtype()), scalar(c.front().dtype()), shape, a.raw_data(),
                         b.raw_data(), offsets.data<int64_t>(), cs.data(), beta, s.stream);
  });
}

CudaBackend& cuda_backend() {
  static CudaBackend backend;
  return backend;
}

}  // namespace triad::detail

// ---- triad::cuda: the runtime as the rest of the library sees it ------------
namespace triad::cuda {

using detail::cuda_backend;

bool compiled() {
  return true;
}

bool cudnn_compiled() {
  return detail::cudnn_attention_compiled();
}

bool tune_attention(int device, DType dtype, int64_t batch, int64_t seq_len, int64_t d_model,
                    AttentionHeads heads, AttentionChoice& out) {
  namespace k = triad::kernels;
  if (device < 0 || device >= device_count()) {
    throw NotSupportedError("tune_attention: cuda:" + std::to_string(device) + " is not visible (" +
                            std::to_string(device_count()) + " device(s))");
  }
  if (heads.window < 0)
    throw ValueError("tune_attention: sliding window " + std::to_string(heads.window) +
                     " must be >= 0");
  const k::AttentionShape shape = detail::attention_problem(batch, seq_len, d_model, heads, true);
  const k::Status ok = k::check_attention(detail::scalar(dtype), shape);
  if (!ok.ok) {
    // Nothing to time where Triad's kernels cannot take the shape: under
    // auto cuDNN runs it where it can (route_attention).
    if (attention_kernel() == AttentionKernel::Auto &&
        detail::cudnn_unavailable(dtype, shape, device).empty())
      return false;
    throw ValueError("tune_attention: " + ok.reason);
  }
  return detail::tune_attention(device, dtype, shape, out);
}

std::string attention_kernel_unavailable(AttentionKernel kernel, DType dtype, int64_t seq_len,
                                         int64_t d_model, AttentionHeads heads, int device) {
  namespace k = triad::kernels;
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    return std::string("attention takes f32, bf16 or f16, not ") + dtype_name(dtype);
  const k::AttentionShape shape = detail::attention_problem(1, seq_len, d_model, heads, true);
  const k::ScalarType type = detail::scalar(dtype);
  const k::Status base = k::check_attention(type, shape);
  if (!base.ok) return base.reason;
  if (device < 0 || device >= device_count())
    return "CUDA device " + std::to_string(device) + " is not visible";
  switch (kernel) {
    case AttentionKernel::TensorCore: {
      const k::Status s =
          k::check_attention_tensor_core(type, shape, k::AttentionDevice::of(device));
      return s.ok ? "" : s.reason;
    }
    case AttentionKernel::Cudnn:
      return detail::cudnn_unavailable(dtype, shape, device);
    default:
      return "";
  }
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void* compute_stream(int device) {
  return cuda_backend().state(device).stream;
}

namespace {
std::atomic<uint64_t> g_next_graph{1};
}  // namespace

Graph::~Graph() {
  release();
}

Graph::Graph(Graph&& other) noexcept
    : device_(other.device_),
      exec_(std::exchange(other.exec_, nullptr)),
      id_(std::exchange(other.id_, 0)),
      checks_(std::move(other.checks_)) {}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    release();
    device_ = other.device_;
    exec_ = std::exchange(other.exec_, nullptr);
    id_ = std::exchange(other.id_, 0);
    checks_ = std::move(other.checks_);
  }
  return *this;
}

void Graph::release() {
  if (exec_ == nullptr) return;
  // (A launch still queued keeps its work; the blocks go to the compute
  // stream's cache, so whatever takes them next is queued after it.)
  cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  exec_ = nullptr;
  checks_.reset();  // (its words are the graph's blocks)
  cuda_backend().state(device_).allocator.release_graph(id_, 0);
}

std::vector<Tensor> Graph::check_words() const {
  if (exec_ == nullptr) throw Error("cuda::Graph::check: an empty graph (nothing captured)");
  return detail::check_words(checks_.get());
}

void Graph::check() const {
  // (One read of every word: it waits for the last replay.)
  check(detail::read_words(check_words()));
}

void Graph::check(const std::vector<int64_t>& words) const {
  if (exec_ == nullptr) throw Error("cuda::Graph::check: an empty graph (nothing captured)");
  detail::throw_bad_index(checks_.get(), words, "cuda::Graph::check",
                          "found by a replay of a CUDA graph");
}

void Graph::replay() const {
  if (exec_ == nullptr) throw Error("cuda::Graph::replay: an empty graph (nothing captured)");
  detail::DeviceGuard g(device_);
  detail::CudaBackend::DeviceState& s = cuda_backend().state(device_);
  detail::check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), s.stream), "cudaGraphLaunch");
  // (The peak counts the graph's temporaries while it runs.)
  s.allocator.note_replay(id_);
}

Graph capture(int device, const std::function<void()>& record) {
  if (op_profiling()) {
    throw Error(
        "cuda::capture: op profiling is on (cuda::set_op_profiling); its events cannot be "
        "part of a graph");
  }
  detail::CudaBackend::DeviceState& s = cuda_backend().state(device);
  detail::DeviceGuard g(device);
  // (cuBLASLt's handle and workspace are made on first use: before the
  // capture, whose thread may not make them. Where cuBLASLt cannot load, a
  // product in the capture says so itself.)
  try {
    s.gemm();
  } catch (const Error&) {
  }
  const uint64_t id = g_next_graph++;
  auto checks = std::make_shared<detail::CaptureChecks>();
  checks->device = device;
  s.allocator.begin_capture(id);
  const cudaError_t began = cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal);
  if (began != cudaSuccess) {
    s.allocator.end_capture();
    s.allocator.release_graph(id, 0);
    detail::check(began, "cudaStreamBeginCapture");
  }
  // Ends the capture whatever happened; the graph, when it succeeded.
  auto finish = [&]() -> std::pair<cudaError_t, cudaGraph_t> {
    detail::t_capture = nullptr;
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(s.stream, &graph);
    s.allocator.end_capture();
    return {ended, graph};
  };
  // A capture `record` failed: nothing of it is queued, and its blocks go
  // back to the cache.
  auto abandon = [&] {
    const auto [ended, graph] = finish();
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // (the capture's own error, if it failed too)
    checks.reset();      // (its words are the capture's blocks)
    s.allocator.release_graph(id, 0);
  };
  detail::t_capture = checks.get();
  try {
    record();
  } catch (const std::exception& e) {
    abandon();
    throw Error(std::string("cuda::capture: ") + e.what());
  } catch (...) {
    abandon();
    throw;
  }
  auto [ended, graph] = finish();
  if (ended != cudaSuccess) {
    checks.reset();
    s.allocator.release_graph(id, 0);
    detail::check(ended,
                  "cudaStreamEndCapture (a call the capture does not allow: a wait for the "
                  "device, a copy from or to pageable memory, an event or a collective)");
  }
  Graph out;
  out.device_ = device;
  out.id_ = id;
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    checks.reset();
    s.allocator.release_graph(id, 0);
    detail::check(made, "cudaGraphInstantiate");
  }
  out.exec_ = exec;
  out.checks_ = std::move(checks);
  return out;
}

DeviceChecks::DeviceChecks(int device) {
  if (detail::t_capture != nullptr || detail::t_deferred != nullptr) {
    throw Error("cuda::DeviceChecks on cuda:" + std::to_string(device) + ": " +
                (detail::t_capture != nullptr ? "a CUDA graph's capture" : "another DeviceChecks") +
                " is open on this thread (its checks are the device's already)");
  }
  (void)cuda_backend().state(device);  // (names a visible device, or throws)
  checks_ = std::make_shared<detail::CaptureChecks>();
  checks_->device = device;
  detail::t_deferred = checks_.get();
}

DeviceChecks::~DeviceChecks() {
  close();
}

void DeviceChecks::close() {
  if (detail::t_deferred == checks_.get()) detail::t_deferred = nullptr;
}

std::vector<Tensor> DeviceChecks::words() const {
  return detail::check_words(checks_.get());
}

void DeviceChecks::check() const {
  check(detail::read_words(words()));
}

void DeviceChecks::check(const std::vector<int64_t>& words) const {
  detail::throw_bad_index(checks_.get(), words, "cuda::DeviceChecks::check", "found on the device");
}

size_t device_memory(int device) {
  if (device < 0 || device >= device_count()) {
    throw NotSupportedError("device_memory: cuda:" + std::to_string(device) + " is not visible (" +
                            std::to_string(device_count()) + " device(s))");
  }
  detail::DeviceGuard g(device);
  size_t free = 0, total = 0;
  detail::check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total;
}

void synchronize(int device) {
  detail::check(cudaStreamSynchronize(cuda_backend().state(device).stream), "synchronize");
}

bool stream_idle(int device) {
  const cudaError_t st = cudaStreamQuery(cuda_backend().state(device).stream);
  if (st == cudaErrorNotReady) return false;
  detail::check(st, "stream query");
  return true;
}

void* create_timing_event(int device) {
  detail::DeviceGuard g(device);  // (an event belongs to the device current when it is made)
  cudaEvent_t e = nullptr;
  detail::check(cudaEventCreate(&e), "timing event");
  return e;
}

void destroy_timing_event(void* event) {
  if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void record_timing_event(int device, void* event) {
  detail::check(
      cudaEventRecord(static_cast<cudaEvent_t>(event), cuda_backend().state(device).stream),
      "timing event record");
}

double elapsed_ms(void* start, void* end) {
  detail::check(cudaEventSynchronize(static_cast<cudaEvent_t>(end)), "timing event wait");
  float ms = 0;
  detail::check(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)),
      "cudaEventElapsedTime");
  return ms;
}

bool timing_event_reached(void* event) {
  const cudaError_t st = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (st == cudaErrorNotReady) return false;
  detail::check(st, "timing event query");
  return true;
}

void profiler_start() {
  detail::check(cudaProfilerStart(), "cudaProfilerStart");
}

void profiler_stop() {
  detail::check(cudaProfilerStop(), "cudaProfilerStop");
}

namespace {
// One event per device, recorded again for every ordering: a stream wait
// takes the event's state when it is issued, so the next record cannot
// disturb it (and the host saves creating and destroying an event for
// every collective).
void order(int device, cudaStream_t first, cudaStream_t then) {
  static std::mutex mutex;
  static std::map<int, cudaEvent_t> events;
  detail::DeviceGuard g(device);
  std::lock_guard<std::mutex> lock(mutex);
  cudaEvent_t& ev = events[device];
  if (!ev) detail::check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  detail::check(cudaEventRecord(ev, first), "cudaEventRecord");
  detail::check(cudaStreamWaitEvent(then, ev, 0), "cudaStreamWaitEvent");
}
}  // namespace

void order_after_compute(int device, void* other_stream) {
  order(device, cuda_backend().state(device).stream, static_cast<cudaStream_t>(other_stream));
}

void order_compute_after(int device, void* other_stream) {
  order(device, static_cast<cudaStream_t>(other_stream), cuda_backend().state(device).stream);
}

AllocatorStats memory_stats(int device) {
  return cuda_backend().state(device).allocator.stats();
}

void empty_cache(int device) {
  synchronize(device);
  cuda_backend().state(device).allocator.empty_cache();
}

GemmTuning gemm_tuning(int device) {
  detail::CudaBackend::DeviceState& s = cuda_backend().state(device);
  std::lock_guard<std::mutex> lock(s.gemm_mutex);
  return s.gemm_ ? s.gemm_->tuning() : GemmTuning{};
}

}  // namespace triad::cuda
