// Process group over NCCL for CUDA tensors. Every call is enqueued on the
// group's own stream (point-to-point calls with a linked neighbour on that
// link's stream, NcclOptions::p2p_streams_per_peer) after the device's
// compute stream (so it sees every result queued so far) and records an
// event after it on each stream it used. Work::wait() makes
// the compute stream wait for that event, not the host: the host runs on,
// and everything it queues later sees the result. The group's watchdog
// (watchdog.h) enforces the timeout from a thread of its own, polling the
// events and NCCL's asynchronous error state; on a timeout or an error it
// aborts the communicator, and the next call or wait on the group raises
// the failure, naming the group, the op, the peers and the sizes (or, if
// the program never gets there, the watchdog ends the process). bf16/f16
// reductions go through f32 copies (one rounding at the end), as in the MPI
// group; data movement of any dtype goes as bytes. Uneven all_gather and
// reduce_scatter pieces become grouped broadcasts and reduces (their sizes
// are known to every rank: nothing goes over the host before the data).
// Calls issued while the compute stream is in capture (a CUDA graph) join
// the capture and run at each replay; the watchdog does not watch them.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "call_checks.h"
#include "triad/backend/cuda.h"
#include "triad/dist/nccl.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "watchdog.h"

namespace triad::dist {
namespace {

void check_nccl(ncclResult_t r, const std::string& what) {
  if (r != ncclSuccess && r != ncclInProgress) {
    throw Error(what + ": NCCL error " + std::to_string(static_cast<int>(r)) + " (" +
                ncclGetErrorString(r) + ")");
  }
}

void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw Error(what + ": " + cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

class NcclProcessGroup;

// A CUDA event shared by a Work and the watchdog that polls it.
using Event = std::shared_ptr<CUevent_st>;

// The events of a group's calls, reused: creating and destroying one per
// call would cost the host two driver calls on every collective. An event
// comes back when its last holder (the Work, the watchdog's poll) lets go;
// nothing waits on it any more by then (a stream that waited on it keeps
// its own dependency), so recording it again is safe. Each event holds the
// pool, so an event let go after its group is gone still finds it.
class EventPool : public std::enable_shared_from_this<EventPool> {
 public:
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  Event take(const std::string& what) {
    cudaEvent_t ev = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        ev = free_.back();
        free_.pop_back();
      }
    }
    if (!ev) check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), what);
    return Event(ev, [pool = shared_from_this()](cudaEvent_t e) { pool->give_back(e); });
  }

 private:
  void give_back(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.size() < kKeep) {
      free_.push_back(e);
      return;
    }
    cudaEventDestroy(e);
  }
  static constexpr size_t kKeep = 256;  // more in flight at once are destroyed
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

// An enqueued NCCL call: the events after it (one per stream it runs on),
// the tensors it uses (kept alive until the compute stream is ordered after
// it: their memory belongs to the compute stream's pool of the caching
// allocator, and only work ordered after the call may reuse it), and what
// to do with the result.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclProcessGroup> group, std::vector<Event> events,
           std::vector<Tensor> keep, std::function<void()> on_complete, std::string what,
           std::chrono::milliseconds timeout, bool captured)
      : group_(std::move(group)),
        events_(std::move(events)),
        keep_(std::move(keep)),
        on_complete_(std::move(on_complete)),
        what_(std::move(what)),
        timeout_(timeout),
        captured_(captured) {}
  ~NcclWork() override;
  bool is_completed() override;
  void wait() override;
  void wait_for(std::chrono::milliseconds timeout) override;

 private:
  void finish();
  std::shared_ptr<NcclProcessGroup> group_;
  std::vector<Event> events_;
  std::vector<Tensor> keep_;
  std::function<void()> on_complete_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  // Issued while the compute stream was in capture (a CUDA graph's): the
  // events are points in the graph, which the host cannot poll or wait for.
  bool captured_ = false;
  bool done_ = false;
};

class NcclProcessGroup final : public ProcessGroup,
                               public std::enable_shared_from_this<NcclProcessGroup> {
 public:
  NcclProcessGroup(const ProcessGroupPtr& bootstrap, int device, const NcclOptions& options)
      : ProcessGroup(bootstrap->name() + "/nccl", bootstrap->rank(), bootstrap->size(),
                     bootstrap->members()),
        bootstrap_(bootstrap),
        device_(device),
        reduce_half_natively_(options.reduce_half_natively) {
    timeout_ = bootstrap->timeout();
    validate_ = bootstrap->validate();
    const char* blocking = std::getenv("TRIAD_NCCL_BLOCKING_WAIT");
    blocking_wait_ = blocking != nullptr && std::string(blocking) == "1";
    // The unique id travels as 128 bytes of an i32 host tensor.
    static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0);
    Tensor id = zeros({static_cast<int64_t>(sizeof(ncclUniqueId) / sizeof(int32_t))}, DType::I32);
    ncclUniqueId uid{};
    if (rank_ == 0) {
      check_nccl(ncclGetUniqueId(&uid), "ncclGetUniqueId");
      std::memcpy(id.raw_data(), &uid, sizeof(uid));
    }
    bootstrap->broadcast(id, 0)->wait();
    std::memcpy(&uid, id.raw_data(), sizeof(uid));
    DeviceGuard g(device_);
    check_nccl(ncclCommInitRank(&comm_, size_, uid, rank_),
               "ncclCommInitRank for group '" + name_ + "' on cuda:" + std::to_string(device_));
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "NCCL group stream");
    if (options.p2p_streams_per_peer && size_ > 2) link_neighbours();
    detail::Watchdog::Hooks hooks;
    hooks.thread_start = [device = device_] { cudaSetDevice(device); };
    hooks.async_error = [this] { return async_error(); };
    // Ends the stuck calls (NCCL's kernels return), so a host blocked on
    // the stream returns and raises the failure at its next call.
    hooks.abort = [this] {
      aborted_ = true;
      ncclCommAbort(comm_);
      for (auto& [peer, link] : links_) ncclCommAbort(link.comm);
    };
    watchdog_ = std::make_unique<detail::Watchdog>(name_, std::move(hooks));
  }

  ~NcclProcessGroup() override {
    // Calls still in flight finish first (under the watchdog, so a hung one
    // ends the process rather than this destructor).
    if (!watchdog_->failed()) {
      cudaStreamSynchronize(stream_);
      for (auto& [peer, link] : links_) cudaStreamSynchronize(link.stream);
    }
    watchdog_.reset();
    DeviceGuard g(device_);
    for (auto& [peer, link] : links_) {
      if (link.comm && !aborted_) ncclCommDestroy(link.comm);
      if (link.stream) cudaStreamDestroy(link.stream);
    }
    if (comm_ && !aborted_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Raises the group's failure (a timeout or an asynchronous NCCL error,
  // found by the watchdog or now), if any.
  void check_failure() { watchdog_->check(); }
  // A host wait on one of the group's calls ran out of time: fails the
  // group as the watchdog would and returns what to raise.
  std::string time_out(const std::string& what, std::chrono::milliseconds timeout) {
    return watchdog_->fail(what, timeout);
  }
  int device() const { return device_; }
  // TRIAD_NCCL_BLOCKING_WAIT=1: Work::wait() also blocks the host until the
  // call finished (for debugging, and for host-side timings that include
  // communication).
  bool blocking_wait() const { return blocking_wait_; }

  WorkPtr all_reduce(Tensor& tensor, ReduceOp op) override {
    check_tensor(tensor, "all_reduce");
    validate_header("all_reduce", tensor, static_cast<int64_t>(op));
    if (op == ReduceOp::Avg && !is_floating(tensor.dtype())) {
      throw ValueError("all_reduce on '" + name_ + "': avg needs a floating dtype, got " +
                       dtype_name(tensor.dtype()));
    }
    if (tensor.numel() == 0) return completed_work();
    // Half tensors sum through an f32 copy unless this group reduces them
    // natively (NcclOptions::reduce_half_natively).
    Tensor target = is_half(tensor.dtype()) && !reduce_half_natively_
                        ? cast(tensor, DType::F32).detach()
                        : tensor;
    std::function<void()> done;
    if (!target.same(tensor)) {
      Tensor out = tensor;
      done = [out, target]() mutable { copy_(out, target); };
    }
    const std::string what =
        describe(std::string("all_reduce(") + reduce_op_name(op) + ")", tensor, "");
    return enqueue(
        [&] {
          check_nccl(ncclAllReduce(target.raw_data(), target.raw_data(),
                                   static_cast<size_t>(target.numel()), nccl_type(target.dtype()),
                                   nccl_op(op), comm_, stream_),
                     what);
        },
        {tensor, target}, std::move(done), what);
  }

  WorkPtr all_gather(const Tensor& input, Tensor& output) override {
    check_tensor(input, "all_gather");
    check_tensor(output, "all_gather");
    validate_header("all_gather", input, output.numel());
    detail::check_all_gather(*this, input, output);
    const std::string what = describe("all_gather", input, "");
    return enqueue(
        [&] {
          check_nccl(ncclAllGather(input.raw_data(), output.raw_data(), input.nbytes(), ncclUint8,
                                   comm_, stream_),
                     what);
        },
        {input, output}, nullptr, what);
  }

  WorkPtr all_gather_uneven(const Tensor& input, Tensor& output,
                            const std::vector<int64_t>& counts) override {
    check_tensor(input, "all_gather_uneven");
    check_tensor(output, "all_gather_uneven");
    validate_header("all_gather_uneven", output, detail::counts_digest(counts));
    detail::check_all_gather_uneven(*this, input, output, counts);
    const std::string what = describe("all_gather_uneven", input, "");
    const size_t esize = dtype_size(input.dtype());
    const bool equal =
        std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
    return enqueue(
        [&] {
          if (equal) {  // every rank sees the same counts, so all take this path
            check_nccl(ncclAllGather(input.raw_data(), output.raw_data(), input.nbytes(), ncclUint8,
                                     comm_, stream_),
                       what);
            return;
          }
          // One broadcast per rank's piece, grouped into one launch.
          check_nccl(ncclGroupStart(), what);
          int64_t at = 0;
          for (int r = 0; r < size_; ++r) {
            char* dst = static_cast<char*>(output.raw_data()) + at;
            const size_t bytes = static_cast<size_t>(counts[r]) * esize;
            check_nccl(ncclBroadcast(r == rank_ ? input.raw_data() : dst, dst, bytes, ncclUint8, r,
                                     comm_, stream_),
                       what);
            at += static_cast<int64_t>(bytes);
          }
          check_nccl(ncclGroupEnd(), what);
        },
        {input, output}, nullptr, what);
  }

  WorkPtr reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) override {
    check_tensor(input, "reduce_scatter");
    check_tensor(output, "reduce_scatter");
    if (input.dim() == 0) {
      throw ShapeError("reduce_scatter on '" + name_ + "': input needs a first dimension");
    }
    if (input.dtype() != output.dtype()) {
      throw ValueError("reduce_scatter on '" + name_ + "': input is " + dtype_name(input.dtype()) +
                       ", output " + dtype_name(output.dtype()));
    }
    validate_header("reduce_scatter", input, static_cast<int64_t>(op));
    const auto rows = split_sizes(input.size(0), size_);
    const int64_t row = input.size(0) ? input.numel() / input.size(0) : 0;
    if (output.numel() != rows[rank_] * row) {
      throw ShapeError("reduce_scatter on '" + name_ + "': rank " + std::to_string(rank_) +
                       " receives " + std::to_string(rows[rank_]) + " rows of " +
                       std::to_string(row) + " elements, but the output is " +
                       shape_str(output.shape()));
    }
    int64_t offset = 0;  // this rank's first element in the input
    for (int r = 0; r < rank_; ++r) offset += rows[r] * row;
    // In place when output is input's own piece (NCCL's rule for both the
    // reduce-scatter and, for uneven pieces, the reduce to this rank); any
    // other overlap is an error.
    detail::reduce_scatter_in_place(*this, input, output, offset);
    const bool half = is_half(input.dtype()) && !reduce_half_natively_;
    Tensor in = half ? cast(input, DType::F32).detach() : input;
    Tensor out = half ? empty(output.shape(), DType::F32, output.device()) : output;
    std::function<void()> done;
    if (half) {
      Tensor dst = output;
      done = [dst, out]() mutable { copy_(dst, out); };
    }
    const bool equal =
        std::all_of(rows.begin(), rows.end(), [&](int64_t r) { return r == rows[0]; });
    const std::string what =
        describe(std::string("reduce_scatter(") + reduce_op_name(op) + ")", input, "");
    const size_t esize = dtype_size(in.dtype());
    return enqueue(
        [&] {
          if (equal) {
            check_nccl(
                ncclReduceScatter(in.raw_data(), out.raw_data(), static_cast<size_t>(rows[0] * row),
                                  nccl_type(in.dtype()), nccl_op(op), comm_, stream_),
                what);
            return;
          }
          check_nccl(ncclGroupStart(), what);
          int64_t at = 0;
          for (int r = 0; r < size_; ++r) {
            const char* src = static_cast<const char*>(in.raw_data()) + at * row * esize;
            check_nccl(ncclReduce(src, r == rank_ ? out.raw_data() : nullptr,
                                  static_cast<size_t>(rows[r] * row), nccl_type(in.dtype()),
                                  nccl_op(op), r, comm_, stream_),
                       what);
            at += rows[r];
          }
          check_nccl(ncclGroupEnd(), what);
        },
        {input, output, in, out}, std::move(done), what);
  }

  WorkPtr broadcast(Tensor& tensor, int root) override {
    check_tensor(tensor, "broadcast");
    if (root < 0 || root >= size_) {
      throw ValueError("broadcast on '" + name_ + "': root " + std::to_string(root) +
                       " is outside [0, " + std::to_string(size_) + ")");
    }
    validate_header("broadcast", tensor, root);
    const std::string what = describe("broadcast", tensor, "root " + std::to_string(root));
    return enqueue(
        [&] {
          check_nccl(ncclBroadcast(tensor.raw_data(), tensor.raw_data(), tensor.nbytes(), ncclUint8,
                                   root, comm_, stream_),
                     what);
        },
        {tensor}, nullptr, what);
  }

  WorkPtr send(const Tensor& tensor, int dst, int tag) override {
    return batch_isend_irecv({P2POp{true, tensor, dst, tag}});
  }
  WorkPtr recv(Tensor& tensor, int src, int tag) override {
    return batch_isend_irecv({P2POp{false, tensor, src, tag}});
  }

  WorkPtr batch_isend_irecv(const std::vector<P2POp>& ops) override {
    std::vector<Tensor> keep;
    std::string peers;
    for (const auto& o : ops) {
      check_tensor(o.tensor, o.is_send ? "send" : "recv");
      if (o.peer < 0 || o.peer >= size_ || o.peer == rank_) {
        throw ValueError(std::string(o.is_send ? "send" : "recv") + " on '" + name_ + "': peer " +
                         std::to_string(o.peer) + " must be another rank in [0, " +
                         std::to_string(size_) + ")");
      }
      keep.push_back(o.tensor);
      peers += (peers.empty() ? "" : ", ") + std::string(o.is_send ? "to " : "from ") +
               std::to_string(o.peer) + " " + shape_str(o.tensor.shape());
    }
    if (ops.empty()) return completed_work();
    const std::string what = describe("batch_isend_irecv", ops.front().tensor, peers);
    // An operation with a linked neighbour runs on that link, the others on
    // the group's own communicator; all in one NCCL group call.
    struct Route {
      ncclComm_t comm;
      cudaStream_t stream;
      int peer;  // in `comm`
    };
    std::vector<Route> routes;
    std::vector<cudaStream_t> streams;
    for (const auto& o : ops) {
      auto link = links_.find(o.peer);
      routes.push_back(link == links_.end()
                           ? Route{comm_, stream_, o.peer}
                           : Route{link->second.comm, link->second.stream, link->second.peer_rank});
      if (std::find(streams.begin(), streams.end(), routes.back().stream) == streams.end())
        streams.push_back(routes.back().stream);
    }
    return enqueue(
        [&] {
          check_nccl(ncclGroupStart(), what);
          for (size_t i = 0; i < ops.size(); ++i) {
            const P2POp& o = ops[i];
            const Route& to = routes[i];
            check_nccl(o.is_send ? ncclSend(o.tensor.raw_data(), o.tensor.nbytes(), ncclUint8,
                                            to.peer, to.comm, to.stream)
                                 : ncclRecv(o.tensor.raw_data(), o.tensor.nbytes(), ncclUint8,
                                            to.peer, to.comm, to.stream),
                       what);
          }
          check_nccl(ncclGroupEnd(), what);
        },
        std::move(keep), nullptr, what, streams);
  }

  WorkPtr barrier() override {
    Tensor one = full({1}, 1.0, DType::F32, Device::cuda(device_));
    return all_reduce(one, ReduceOp::Sum);
  }
  bool has_p2p_link(int peer) const override { return links_.count(peer) > 0; }
  bool captures_device_collectives() const override { return true; }
  void watch_device_work(const std::string& what) override {
    check_failure();
    DeviceGuard g(device_);
    const auto compute = static_cast<cudaStream_t>(cuda::compute_stream(device_));
    const std::string call = "process group '" + name_ + "' (rank " + std::to_string(rank_) +
                             " of " + std::to_string(size_) + ", cuda:" + std::to_string(device_) +
                             "): " + what;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(compute, &capture), call);
    if (capture != cudaStreamCaptureStatusNone) {
      throw Error("watch_device_work on " + call +
                  ": inside a CUDA graph's capture (nothing runs until a replay; watch that)");
    }
    const Event done = events_->take(call);
    check_cuda(cudaEventRecord(done.get(), compute), call);
    watchdog_->watch([done] { return cudaEventQuery(done.get()) != cudaErrorNotReady; }, call,
                     timeout_);
  }

 private:
  std::string describe(const std::string& op, const Tensor& t, const std::string& peers) const {
    return detail::describe_call(*this, ", cuda:" + std::to_string(device_), op, t, peers);
  }

  // "" while the communicator is healthy, else NCCL's asynchronous error.
  std::string async_error() const {
    if (aborted_) return "";
    auto error_of = [](ncclComm_t c) -> std::string {
      ncclResult_t r = ncclSuccess;
      ncclCommGetAsyncError(c, &r);
      if (r == ncclSuccess || r == ncclInProgress) return "";
      return "NCCL error " + std::to_string(static_cast<int>(r)) + " (" + ncclGetErrorString(r) +
             ")";
    };
    std::string e = error_of(comm_);
    for (const auto& [peer, link] : links_) {
      if (!e.empty()) break;
      e = error_of(link.comm);
      if (!e.empty()) e += " on the link to rank " + std::to_string(peer);
    }
    return e;
  }

  // Communicators of two (and a stream each) with the previous and the
  // next rank, for point-to-point calls. Made pair by pair in one order on
  // every rank (pair i is ranks i and i + 1 mod size; its first rank makes
  // the id and sends it over the bootstrap group), so each pair's two
  // members reach it once both have made their earlier pairs.
  void link_neighbours() {
    static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0);
    const int64_t words = static_cast<int64_t>(sizeof(ncclUniqueId) / sizeof(int32_t));
    for (int i = 0; i < size_; ++i) {
      const int first = i, second = (i + 1) % size_;
      if (rank_ != first && rank_ != second) continue;
      const bool leads = rank_ == first;
      const int peer = leads ? second : first;
      const std::string what = "ncclCommInitRank for group '" + name_ + "''s link to rank " +
                               std::to_string(peer) + " on cuda:" + std::to_string(device_);
      Tensor id = zeros({words}, DType::I32);
      ncclUniqueId uid{};
      if (leads) {
        check_nccl(ncclGetUniqueId(&uid), what);
        std::memcpy(id.raw_data(), &uid, sizeof(uid));
        bootstrap_->send(id, peer, kLinkTag)->wait();
      } else {
        bootstrap_->recv(id, peer, kLinkTag)->wait();
        std::memcpy(&uid, id.raw_data(), sizeof(uid));
      }
      PeerLink link;
      link.peer_rank = leads ? 1 : 0;
      check_nccl(ncclCommInitRank(&link.comm, 2, uid, leads ? 0 : 1), what);
      check_cuda(cudaStreamCreateWithFlags(&link.stream, cudaStreamNonBlocking), what);
      links_[peer] = link;
    }
  }

  void check_tensor(const Tensor& t, const char* op) {
    watchdog_->check();  // a failed group takes no more calls
    if (!t.defined()) throw ValueError(std::string(op) + " on '" + name_ + "': undefined tensor");
    if (t.device() != Device::cuda(device_)) {
      throw NotSupportedError(std::string(op) + " on '" + name_ + "': the NCCL group moves " +
                              Device::cuda(device_).str() + " tensors, got " + t.device().str());
    }
    if (!t.is_contiguous()) {
      throw ValueError(std::string(op) + " on '" + name_ + "': tensor must be contiguous");
    }
  }

  void validate_header(const char* op, const Tensor& t, int64_t extra) const {
    if (!validate_) return;
    const auto header = detail::call_header(op, t, extra);
    Tensor mine = from_vector(std::vector<int64_t>(header.begin(), header.end()),
                              {detail::kHeaderWords}, DType::I64);
    Tensor all = empty({detail::kHeaderWords * static_cast<int64_t>(size_)}, DType::I64);
    bootstrap_->all_gather(mine, all)->wait();
    const int64_t* p = all.data<int64_t>();
    detail::check_call_headers(*this, op, std::vector<int64_t>(p, p + all.numel()));
  }

  // Orders `streams` (by default the group's own) after the compute
  // stream, runs `issue` (which enqueues the NCCL calls on them), records an
  // event after the call on each, and returns the Work for them.
  WorkPtr enqueue(const std::function<void()>& issue, std::vector<Tensor> keep,
                  std::function<void()> on_complete, const std::string& what,
                  std::vector<cudaStream_t> streams = {}) {
    DeviceGuard g(device_);
    if (streams.empty()) streams.push_back(stream_);
    // In a capture of the compute stream (train.cuda_graph), ordering the
    // streams after it joins them to the capture, and the call becomes the
    // graph's, as does the compute stream's wait for it: nothing runs now,
    // so the watchdog has nothing to watch (each replay's calls are waited
    // for by what reads the graph's results).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda(
        cudaStreamIsCapturing(static_cast<cudaStream_t>(cuda::compute_stream(device_)), &capture),
        what);
    const bool captured = capture != cudaStreamCaptureStatusNone;
    for (cudaStream_t s : streams) cuda::order_after_compute(device_, s);
    issue();
    std::vector<Event> events;
    for (cudaStream_t s : streams) {
      events.push_back(events_->take(what));
      check_cuda(cudaEventRecord(events.back().get(), s), what);
    }
    if (captured) {
      return std::make_shared<NcclWork>(shared_from_this(), std::move(events), std::move(keep),
                                        std::move(on_complete), what, timeout_, true);
    }
    watchdog_->watch(
        [events] {
          return std::all_of(events.begin(), events.end(), [](const Event& e) {
            return cudaEventQuery(e.get()) != cudaErrorNotReady;
          });
        },
        what, timeout_);
    return std::make_shared<NcclWork>(shared_from_this(), std::move(events), std::move(keep),
                                      std::move(on_complete), what, timeout_, false);
  }

  // A point-to-point link to a neighbouring rank (link_neighbours()).
  struct PeerLink {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    int peer_rank = 0;  // the neighbour's rank in the link's communicator
  };
  static constexpr int kLinkTag = 7401;  // the ids' messages on the bootstrap group

  ProcessGroupPtr bootstrap_;
  int device_;
  bool reduce_half_natively_ = false;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::map<int, PeerLink> links_;  // by the neighbour's rank in this group
  std::atomic<bool> aborted_{false};
  bool blocking_wait_ = false;
  std::unique_ptr<detail::Watchdog> watchdog_;
  std::shared_ptr<EventPool> events_ = std::make_shared<EventPool>();
};

NcclWork::~NcclWork() {
  // Dropped without a wait: the compute stream still waits for the call
  // before its pool may hand the tensors' memory out again.
  if (!done_) {
    for (const Event& e : events_) {
      cudaStreamWaitEvent(static_cast<cudaStream_t>(cuda::compute_stream(group_->device())),
                          e.get(), 0);
    }
  }
}

void NcclWork::wait() {
  group_->check_failure();
  if (done_) return;
  if (group_->blocking_wait() && !captured_) {
    wait_for(timeout_);  // the host waits too (TRIAD_NCCL_BLOCKING_WAIT=1)
    return;
  }
  finish();
}

bool NcclWork::is_completed() {
  group_->check_failure();
  if (done_) return true;
  if (captured_) {
    throw Error(what_ +
                ": issued inside a CUDA graph's capture, the call has no completion to ask "
                "about (wait() orders the graph's compute stream after it)");
  }
  for (const Event& e : events_) {
    const cudaError_t st = cudaEventQuery(e.get());
    if (st == cudaErrorNotReady) return false;
    check_cuda(st, what_);
  }
  finish();
  return true;
}

void NcclWork::wait_for(std::chrono::milliseconds timeout) {
  if (done_) return;
  if (captured_) {  // (the host cannot wait for a graph's call: ordered only)
    finish();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  int spins = 0;
  while (!is_completed()) {
    if (std::chrono::steady_clock::now() - start > timeout) {
      throw TimeoutError(group_->time_out(what_, timeout));
    }
    if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclWork::finish() {
  for (const Event& e : events_) {
    check_cuda(cudaStreamWaitEvent(
                   static_cast<cudaStream_t>(cuda::compute_stream(group_->device())), e.get(), 0),
               what_);
  }
  done_ = true;
  if (on_complete_) on_complete_();
  keep_.clear();
}

// ---- device routing ---------------------------------------------------------
class DeviceRoutedGroup final : public ProcessGroup {
 public:
  DeviceRoutedGroup(ProcessGroupPtr host, ProcessGroupPtr nccl)
      : ProcessGroup(host->name(), host->rank(), host->size(), host->members()),
        host_(std::move(host)),
        nccl_(std::move(nccl)) {
    if (host_->members() != nccl_->members()) {
      throw ValueError("device-routed group '" + name_ +
                       "': the host and NCCL groups have different members");
    }
    timeout_ = host_->timeout();
  }
  WorkPtr all_reduce(Tensor& t, ReduceOp op) override { return pick(t).all_reduce(t, op); }
  WorkPtr all_gather(const Tensor& in, Tensor& out) override {
    return pick(in).all_gather(in, out);
  }
  WorkPtr all_gather_uneven(const Tensor& in, Tensor& out,
                            const std::vector<int64_t>& counts) override {
    return pick(in).all_gather_uneven(in, out, counts);
  }
  WorkPtr reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    return pick(in).reduce_scatter(in, out, op);
  }
  WorkPtr broadcast(Tensor& t, int root) override { return pick(t).broadcast(t, root); }
  WorkPtr send(const Tensor& t, int dst, int tag) override { return pick(t).send(t, dst, tag); }
  WorkPtr recv(Tensor& t, int src, int tag) override { return pick(t).recv(t, src, tag); }
  WorkPtr batch_isend_irecv(const std::vector<P2POp>& ops) override {
    if (ops.empty()) return completed_work();
    for (const auto& o : ops) {
      if (o.tensor.device().is_cuda() != ops.front().tensor.device().is_cuda()) {
        throw ValueError("batch_isend_irecv on '" + name_ +
                         "': one batch mixes host and cuda tensors");
      }
    }
    return pick(ops.front().tensor).batch_isend_irecv(ops);
  }
  WorkPtr barrier() override { return host_->barrier(); }
  // Links are the NCCL group's: they carry the CUDA tensors.
  bool has_p2p_link(int peer) const override { return nccl_->has_p2p_link(peer); }
  bool captures_device_collectives() const override { return nccl_->captures_device_collectives(); }
  void watch_device_work(const std::string& what) override {
    nccl_->set_timeout(timeout_);
    nccl_->watch_device_work(what);
  }

 private:
  ProcessGroup& pick(const Tensor& t) {
    ProcessGroup& g = t.defined() && t.device().is_cuda() ? *nccl_ : *host_;
    g.set_timeout(timeout_);
    g.set_validate(validate_);
    return g;
  }
  ProcessGroupPtr host_, nccl_;
};

}  // namespace

bool nccl_available() {
  return true;
}

ProcessGroupPtr make_nccl_group(const ProcessGroupPtr& bootstrap, int device,
                                const NcclOptions& options) {
  if (device < 0 || device >= cuda::device_count()) {
    throw NotSupportedError("make_nccl_group: cuda:" + std::to_string(device) +
                            " is not available (" + std::to_string(cuda::device_count()) +
                            " device(s) visible)");
  }
  if (!bootstrap) throw ValueError("make_nccl_group: no bootstrap group");
  return std::make_shared<NcclProcessGroup>(bootstrap, device, options);
}

ProcessGroupPtr make_device_routed_group(ProcessGroupPtr host, ProcessGroupPtr nccl) {
  return std::make_shared<DeviceRoutedGroup>(std::move(host), std::move(nccl));
}

}  // namespace triad::dist
