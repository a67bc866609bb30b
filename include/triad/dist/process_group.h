#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "triad/core/error.h"
#include "triad/core/tensor.h"
#include "triad/dist/work.h"

namespace triad::dist {

enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);

// A collective or point-to-point call did not finish in time.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// Ranks disagree about a call (sizes, dtypes, op), found in validate mode.
class MismatchError : public Error {
 public:
  using Error::Error;
};

// One side of a batched point-to-point exchange.
struct P2POp {
  bool is_send = false;
  Tensor tensor;  // source for sends, destination for receives
  int peer = 0;   // rank in this group
  int tag = 0;
};

// How the pieces of a tensor of n elements (along dim 0) are split over
// `parts` ranks when n does not divide: the first n % parts get one more.
std::vector<int64_t> split_sizes(int64_t n, int parts);

// A set of ranks that communicate. Every call is asynchronous and returns a
// Work; call wait() before touching the tensors. Tensors must be contiguous
// and on the device the backend serves (MPI: cpu; NCCL: cuda). All dtypes
// work, including bf16 and f16 (reduced in f32 and rounded once).
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  // World ranks of this group's members, in group-rank order.
  const std::vector<int>& members() const { return members_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  // Validate mode: before each collective the ranks exchange a small header
  // (op, dtype, sizes) and a disagreement raises MismatchError on every rank.
  bool validate() const { return validate_; }
  void set_validate(bool v) { validate_ = v; }

  // In place on every rank.
  virtual WorkPtr all_reduce(Tensor& tensor, ReduceOp op) = 0;
  // Concatenates every rank's input along dim 0 into output: every rank
  // gives the same number of elements and output holds size() times that.
  // Purely local checks: nothing is exchanged before the data moves. In
  // place when input is output's own piece (elements [rank * n, (rank + 1)
  // * n) of a contiguous output, n input's count): no staging copy; input
  // sharing output's memory otherwise is an error.
  virtual WorkPtr all_gather(const Tensor& input, Tensor& output) = 0;
  // The same with pieces of different sizes: counts[r] is the number of
  // elements rank r gives (every rank passes the same counts, which it
  // knows: from split_sizes, or exchanged through all_gather beforehand);
  // output holds their sum.
  virtual WorkPtr all_gather_uneven(const Tensor& input, Tensor& output,
                                    const std::vector<int64_t>& counts) = 0;
  // Reduces input over the group and leaves on rank r its piece along dim 0:
  // rows split_sizes(input.size(0), size())[r], in rank order. In place when
  // output is input's own rows (the same memory; input's other rows are
  // then left undefined); output sharing input's memory otherwise is an
  // error.
  virtual WorkPtr reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) = 0;
  virtual WorkPtr broadcast(Tensor& tensor, int root) = 0;
  virtual WorkPtr send(const Tensor& tensor, int dst, int tag = 0) = 0;
  virtual WorkPtr recv(Tensor& tensor, int src, int tag = 0) = 0;
  // Posts all operations at once; the Work completes when all have.
  virtual WorkPtr batch_isend_irecv(const std::vector<P2POp>& ops) = 0;
  // An uneven all-to-all along dim 0: this rank sends send_counts[r] rows of
  // input (the pieces in rank order) to rank r, and output receives, in rank
  // order, the recv_counts[r] rows each rank r sends it. The ranks'
  // counts must agree (rank a's send_counts[b] is rank b's recv_counts[a]);
  // the caller exchanges them beforehand. input and output contiguous, of
  // one dtype and row width, with sum(send_counts) and sum(recv_counts)
  // rows. The default posts one batch of point-to-point calls
  // (batch_isend_irecv) and copies this rank's own piece where it is.
  virtual WorkPtr all_to_all(const Tensor& input, const std::vector<int64_t>& send_counts,
                             Tensor& output, const std::vector<int64_t>& recv_counts);
  virtual WorkPtr barrier() = 0;
  // Whether point-to-point calls with `peer` run on a link of their own, in
  // order among themselves only (the NCCL pipeline group's neighbours,
  // NcclOptions::p2p_streams_per_peer): then a batch may go out as one call
  // per linked peer without one peer's calls waiting behind another's.
  virtual bool has_p2p_link(int /*peer*/) const { return false; }
  // Whether a collective on device tensors, issued while the device's
  // compute stream is in a CUDA graph's capture, becomes part of the graph
  // (NCCL's do: each replay runs it, Work::wait orders the graph after it).
  // A group that stages device tensors through the host cannot be captured.
  virtual bool captures_device_collectives() const { return false; }
  // Watches the work queued so far on the device's compute stream as one of
  // this group's calls, described by `what`: a CUDA graph's replay, whose
  // captured calls no watchdog saw. Past the group's timeout the group
  // fails as for a late call of its own (NCCL's: its communicators aborted,
  // which ends a call that hangs in the replay, and the next call or wait
  // raising the TimeoutError). A group without a watchdog, or without
  // device calls, does nothing. Not inside a capture.
  virtual void watch_device_work(const std::string& /*what*/) {}

 protected:
  ProcessGroup(std::string name, int rank, int size, std::vector<int> members)
      : name_(std::move(name)), rank_(rank), size_(size), members_(std::move(members)) {}
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> members_;
  std::chrono::milliseconds timeout_{std::chrono::minutes(10)};
  bool validate_ = false;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

}  // namespace triad::dist
