#include "mpi_process_group.h"

#include "call_checks.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <thread>

#include "triad/backend/backend.h"
#include "triad/ops/elementwise.h"

namespace triad::dist::detail {
namespace {

void check_mpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(what + " failed: " + std::string(msg, static_cast<size_t>(len)));
}

int as_count(int64_t n, const std::string& what) {
  if (n > INT_MAX) {
    throw ValueError(what + ": " + std::to_string(n) + " elements exceed MPI's int count limit");
  }
  return static_cast<int>(n);
}

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::BF16:
    case DType::F16:
      return MPI_FLOAT;  // reduced through f32 staging
  }
  return MPI_BYTE;
}

// The element type a tensor moves as (no arithmetic: bf16 and f16 are
// 16-bit words), so that counts are elements, not bytes.
MPI_Datatype mpi_element_type(DType d) {
  switch (d) {
    case DType::BF16:
    case DType::F16:
      return MPI_UINT16_T;
    default:
      return mpi_type(d);
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// Whether a communicator has put more of its ranks on this node than it has
// cores (mpirun --oversubscribe): then a waiting rank sleeps between polls,
// leaving the cores to the ranks that compute. Set as groups are made (the
// world first), read by every wait.
std::atomic<bool> g_oversubscribed{false};

// Outstanding MPI requests plus what to do when they complete.
class MpiWork final : public Work {
 public:
  MpiWork(std::vector<MPI_Request> requests, std::function<void()> on_complete, std::string what,
          std::chrono::milliseconds timeout)
      : requests_(std::move(requests)),
        on_complete_(std::move(on_complete)),
        what_(std::move(what)),
        timeout_(timeout) {}

  bool is_completed() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                          MPI_STATUSES_IGNORE),
              what_);
    if (flag) finish();
    return done_;
  }

  void wait() override { wait_for(timeout_); }

  void wait_for(std::chrono::milliseconds timeout) override {
    if (done_) return;
    const auto start = std::chrono::steady_clock::now();
    int spins = 0;
    while (!is_completed()) {
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited > timeout) {
        throw TimeoutError(what_ + " timed out after " + std::to_string(timeout.count()) + " ms");
      }
      // Past the first polls: with a core to itself a rank keeps polling
      // for a while (yielding to anything else runnable), since an exchange
      // takes a few rounds of polls on both sides and sleeping between them
      // (50 us a time) made each exchange a rank had waited for take about
      // 0.2 ms instead of 0.02 (bench_p2p --late-us). A longer wait, or
      // ranks that outnumber the cores, sleep, so the ranks computing get
      // the cores.
      if (++spins > 1000) {
        if (!g_oversubscribed.load(std::memory_order_relaxed) &&
            waited < std::chrono::milliseconds(2))
          std::this_thread::yield();
        else
          std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

 private:
  void finish() {
    done_ = true;
    if (on_complete_) on_complete_();
  }
  std::vector<MPI_Request> requests_;
  std::function<void()> on_complete_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  bool done_ = false;
};

Tensor to_f32(const Tensor& t) {
  Tensor f = empty(t.shape(), DType::F32);
  backend_for(DeviceType::CPU).copy(t, f);
  return f;
}

}  // namespace

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm, std::string name)
    : ProcessGroup(std::move(name), 0, 1, {}), comm_(comm) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  members_.resize(size_);
  MPI_Allgather(&world_rank, 1, MPI_INT, members_.data(), 1, MPI_INT, comm_);
  MPI_Comm node = MPI_COMM_NULL;
  int on_node = 1;
  if (MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    MPI_Comm_size(node, &on_node);
    MPI_Comm_free(&node);
  }
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0 && static_cast<unsigned>(on_node) > cores) g_oversubscribed = true;
}

MpiProcessGroup::~MpiProcessGroup() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::string MpiProcessGroup::describe(const std::string& op, const Tensor& t,
                                      const std::string& peers) const {
  return describe_call(*this, "", op, t, peers);
}

void MpiProcessGroup::check_tensor(const Tensor& t, const char* op) const {
  if (!t.defined()) throw ValueError(std::string(op) + " on '" + name_ + "': undefined tensor");
  if (!t.device().is_cpu()) {
    throw NotSupportedError(std::string(op) + " on '" + name_ +
                            "': the MPI process group moves cpu tensors, got " + t.device().str() +
                            " (cuda tensors use the NCCL group)");
  }
  if (!t.is_contiguous())
    throw ValueError(std::string(op) + " on '" + name_ + "': tensor must be contiguous");
}

void MpiProcessGroup::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw ValueError(std::string(op) + " on '" + name_ + "': peer " + std::to_string(peer) +
                     " must be another rank in [0, " + std::to_string(size_) + ")");
  }
}

void MpiProcessGroup::validate_header(const char* op, const Tensor& t, int64_t extra) const {
  if (!validate_) return;
  const auto mine = call_header(op, t, extra);
  std::vector<int64_t> all(kHeaderWords * static_cast<size_t>(size_));
  check_mpi(MPI_Allgather(mine.data(), kHeaderWords, MPI_INT64_T, all.data(), kHeaderWords,
                          MPI_INT64_T, comm_),
            std::string(op) + " header");
  check_call_headers(*this, op, all);
}

WorkPtr MpiProcessGroup::all_reduce(Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "all_reduce");
  validate_header("all_reduce", tensor, static_cast<int64_t>(op));
  if (op == ReduceOp::Avg && !is_floating(tensor.dtype())) {
    throw ValueError("all_reduce on '" + name_ + "': avg needs a floating dtype, got " +
                     dtype_name(tensor.dtype()));
  }
  if (tensor.numel() == 0 || size_ == 1) {
    if (op == ReduceOp::Avg || size_ == 1) return completed_work();
    return completed_work();
  }
  Tensor target = tensor;
  Tensor buf = is_half(tensor.dtype()) ? to_f32(tensor) : tensor;
  const int n = as_count(buf.numel(), "all_reduce");
  MPI_Request req;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf.raw_data(), n, mpi_type(tensor.dtype()), mpi_op(op),
                           comm_, &req),
            describe("all_reduce", tensor, ""));
  const int size = size_;
  auto done = [target, buf, op, size]() mutable {
    if (op == ReduceOp::Avg) backend_for(DeviceType::CPU).affine(buf, 1.0 / size, 0.0, buf);
    if (!buf.same(target)) backend_for(DeviceType::CPU).copy(buf, target);
  };
  return std::make_shared<MpiWork>(
      std::vector<MPI_Request>{req}, done,
      describe(std::string("all_reduce(") + reduce_op_name(op) + ")", tensor, ""), timeout_);
}

WorkPtr MpiProcessGroup::all_gather(const Tensor& input, Tensor& output) {
  check_tensor(input, "all_gather");
  check_tensor(output, "all_gather");
  validate_header("all_gather", input, output.numel());
  const bool in_place = check_all_gather(*this, input, output);
  const std::string what = describe("all_gather", input, "");
  const int n = as_count(input.numel(), what);
  MPI_Request req;
  // (In place: MPI reads this rank's piece from the output itself.)
  check_mpi(
      MPI_Iallgather(in_place ? MPI_IN_PLACE : input.raw_data(), n, mpi_element_type(input.dtype()),
                     output.raw_data(), n, mpi_element_type(input.dtype()), comm_, &req),
      what);
  Tensor keep_in = input, keep_out = output;
  return std::make_shared<MpiWork>(
      std::vector<MPI_Request>{req}, [keep_in, keep_out] {}, what, timeout_);
}

WorkPtr MpiProcessGroup::all_gather_uneven(const Tensor& input, Tensor& output,
                                           const std::vector<int64_t>& counts) {
  check_tensor(input, "all_gather_uneven");
  check_tensor(output, "all_gather_uneven");
  validate_header("all_gather_uneven", output, counts_digest(counts));
  check_all_gather_uneven(*this, input, output, counts);
  const std::string what = describe("all_gather_uneven", input, "");
  std::vector<int> n(size_), displs(size_);
  int64_t at = 0;
  for (int r = 0; r < size_; ++r) {
    n[r] = as_count(counts[r], what);
    displs[r] = as_count(at, what);
    at += counts[r];
  }
  MPI_Request req;
  check_mpi(MPI_Iallgatherv(input.raw_data(), n[rank_], mpi_element_type(input.dtype()),
                            output.raw_data(), n.data(), displs.data(),
                            mpi_element_type(input.dtype()), comm_, &req),
            what);
  Tensor keep_in = input, keep_out = output;
  return std::make_shared<MpiWork>(
      std::vector<MPI_Request>{req}, [keep_in, keep_out] {}, what, timeout_);
}

WorkPtr MpiProcessGroup::reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) {
  check_tensor(input, "reduce_scatter");
  check_tensor(output, "reduce_scatter");
  if (input.dim() == 0)
    throw ShapeError("reduce_scatter on '" + name_ + "': input needs a first dimension");
  validate_header("reduce_scatter", input, static_cast<int64_t>(op));
  const auto rows = split_sizes(input.size(0), size_);
  const int64_t row = input.size(0) ? input.numel() / input.size(0) : 0;
  if (output.numel() != rows[rank_] * row || output.dtype() != input.dtype()) {
    throw ShapeError("reduce_scatter on '" + name_ + "': rank " + std::to_string(rank_) +
                     " receives " + std::to_string(rows[rank_]) + " rows of " +
                     std::to_string(row) + " " + dtype_name(input.dtype()) +
                     " elements, but the output is " + dtype_name(output.dtype()) + " " +
                     shape_str(output.shape()));
  }
  if (op == ReduceOp::Avg && !is_floating(input.dtype())) {
    throw ValueError("reduce_scatter on '" + name_ + "': avg needs a floating dtype");
  }
  int64_t offset = 0;  // this rank's first element in the input
  for (int r = 0; r < rank_; ++r) offset += rows[r] * row;
  const bool half = is_half(input.dtype());
  // In place (output is input's own piece): MPI_IN_PLACE reduces the input
  // buffer itself and leaves this rank's result at its start, moved to the
  // piece afterwards. (bf16/f16 reduce f32 copies: nothing aliases there.)
  const bool in_place = reduce_scatter_in_place(*this, input, output, offset) && !half;
  Tensor in = half ? to_f32(input) : input;
  Tensor out = half       ? empty(output.shape(), DType::F32)
               : in_place ? make_view(input, output.shape(), contiguous_strides(output.shape()),
                                      input.offset())
                          : output;
  std::vector<int> counts(size_);
  for (int r = 0; r < size_; ++r) counts[r] = as_count(rows[r] * row, "reduce_scatter");
  MPI_Request req;
  check_mpi(MPI_Ireduce_scatter(in_place ? MPI_IN_PLACE : in.raw_data(),
                                in_place ? in.raw_data() : out.raw_data(), counts.data(),
                                mpi_type(input.dtype()), mpi_op(op), comm_, &req),
            describe("reduce_scatter", input, ""));
  Tensor target = output;
  const int size = size_;
  auto done = [in, out, target, op, size]() mutable {
    if (op == ReduceOp::Avg) backend_for(DeviceType::CPU).affine(out, 1.0 / size, 0.0, out);
    if (out.storage() == target.storage() && out.raw_data() == target.raw_data()) return;
    // (The result at the input's start may overlap this rank's piece when
    // the pieces are uneven: through a copy then.)
    const auto* a = static_cast<const char*>(out.raw_data());
    const auto* b = static_cast<const char*>(target.raw_data());
    const auto n = static_cast<std::ptrdiff_t>(out.nbytes());
    const bool overlap = out.storage() == target.storage() && a < b + n && b < a + n;
    backend_for(DeviceType::CPU).copy(overlap ? clone(out) : out, target);
  };
  return std::make_shared<MpiWork>(
      std::vector<MPI_Request>{req}, done,
      describe(std::string("reduce_scatter(") + reduce_op_name(op) + ")", input, ""), timeout_);
}

WorkPtr MpiProcessGroup::broadcast(Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast");
  if (root < 0 || root >= size_) {
    throw ValueError("broadcast on '" + name_ + "': root " + std::to_string(root) +
                     " is not in [0, " + std::to_string(size_) + ")");
  }
  validate_header("broadcast", tensor, root);
  MPI_Request req;
  check_mpi(
      MPI_Ibcast(tensor.raw_data(), as_count(static_cast<int64_t>(tensor.nbytes()), "broadcast"),
                 MPI_BYTE, root, comm_, &req),
      describe("broadcast", tensor, ""));
  Tensor keep = tensor;
  return std::make_shared<MpiWork>(
      std::vector<MPI_Request>{req}, [keep] {},
      describe("broadcast from rank " + std::to_string(root), tensor, ""), timeout_);
}

WorkPtr MpiProcessGroup::send(const Tensor& tensor, int dst, int tag) {
  return batch_isend_irecv({{true, tensor, dst, tag}});
}

WorkPtr MpiProcessGroup::recv(Tensor& tensor, int src, int tag) {
  return batch_isend_irecv({{false, tensor, src, tag}});
}

WorkPtr MpiProcessGroup::batch_isend_irecv(const std::vector<P2POp>& ops) {
  std::vector<MPI_Request> reqs;
  std::vector<Tensor> keep;
  std::string peers, what = "batch_isend_irecv";
  // In validate mode each message is preceded by a header (dtype, numel) on
  // its own tag range, and a receive checks it against what it expects.
  constexpr int kHeaderTag = 1 << 20;
  std::vector<std::array<int64_t, 2>> headers(ops.size());
  std::vector<MPI_Request> header_reqs;
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& o = ops[i];
    check_tensor(o.tensor, o.is_send ? "send" : "recv");
    check_peer(o.peer, o.is_send ? "send" : "recv");
    if (o.tag < 0 || o.tag >= kHeaderTag)
      throw ValueError("p2p tag " + std::to_string(o.tag) + " is out of range");
    peers += std::string(peers.empty() ? "" : ", ") + (o.is_send ? "send " : "recv ") +
             dtype_name(o.tensor.dtype()) + " " + shape_str(o.tensor.shape()) +
             (o.is_send ? " to rank " : " from rank ") + std::to_string(o.peer) + " (world " +
             std::to_string(members_[o.peer]) + ")";
    if (validate_) {
      MPI_Request hr;
      if (o.is_send) {
        headers[i] = {static_cast<int64_t>(o.tensor.dtype()), o.tensor.numel()};
        check_mpi(
            MPI_Isend(headers[i].data(), 2, MPI_INT64_T, o.peer, kHeaderTag + o.tag, comm_, &hr),
            "p2p header");
      } else {
        check_mpi(
            MPI_Irecv(headers[i].data(), 2, MPI_INT64_T, o.peer, kHeaderTag + o.tag, comm_, &hr),
            "p2p header");
      }
      header_reqs.push_back(hr);
    }
  }
  if (validate_ && !header_reqs.empty()) {
    MpiWork hw(header_reqs, nullptr, "process group '" + name_ + "': p2p headers (" + peers + ")",
               timeout_);
    hw.wait();
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2POp& o = ops[i];
      if (!o.is_send && (headers[i][0] != static_cast<int64_t>(o.tensor.dtype()) ||
                         headers[i][1] != o.tensor.numel())) {
        throw MismatchError(
            "process group '" + name_ + "': rank " + std::to_string(rank_) + " expects " +
            dtype_name(o.tensor.dtype()) + " x " + std::to_string(o.tensor.numel()) +
            " from rank " + std::to_string(o.peer) + " but it sends " +
            dtype_name(static_cast<DType>(headers[i][0])) + " x " + std::to_string(headers[i][1]));
      }
    }
  }
  // Receives first, so a batch that sends to and receives from the same peer
  // never waits on itself.
  for (int pass = 0; pass < 2; ++pass) {
    for (const P2POp& o : ops) {
      if (o.is_send != (pass == 1)) continue;
      MPI_Request r;
      const int n = as_count(static_cast<int64_t>(o.tensor.nbytes()), "p2p");
      if (o.is_send) {
        check_mpi(MPI_Isend(o.tensor.raw_data(), n, MPI_BYTE, o.peer, o.tag, comm_, &r), "send");
      } else {
        check_mpi(MPI_Irecv(o.tensor.raw_data(), n, MPI_BYTE, o.peer, o.tag, comm_, &r), "recv");
      }
      reqs.push_back(r);
      keep.push_back(o.tensor);
    }
  }
  return std::make_shared<MpiWork>(
      reqs, [keep] {},
      "process group '" + name_ + "' (rank " + std::to_string(rank_) + "): " + what + " [" + peers +
          "]",
      timeout_);
}

WorkPtr MpiProcessGroup::barrier() {
  MPI_Request req;
  check_mpi(MPI_Ibarrier(comm_, &req), "barrier");
  std::string who;
  for (size_t i = 0; i < members_.size(); ++i) who += (i ? ", " : "") + std::to_string(members_[i]);
  return std::make_shared<MpiWork>(
      std::vector<MPI_Request>{req}, nullptr,
      "process group '" + name_ + "': barrier of world ranks [" + who + "]", timeout_);
}

}  // namespace triad::dist::detail
