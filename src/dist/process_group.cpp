#include "triad/dist/process_group.h"

#include <algorithm>

#include "triad/ops/elementwise.h"
#include "triad/ops/shape_ops.h"

namespace triad::dist {
namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
  void wait_for(std::chrono::milliseconds) override {}
  bool is_completed() override { return true; }
};

}  // namespace

WorkPtr completed_work() {
  return std::make_shared<DoneWork>();
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

std::vector<int64_t> split_sizes(int64_t n, int parts) {
  if (parts < 1)
    throw ValueError("split_sizes: parts (" + std::to_string(parts) + ") must be >= 1");
  std::vector<int64_t> out(parts, n / parts);
  for (int i = 0; i < n % parts; ++i) ++out[i];
  return out;
}

WorkPtr ProcessGroup::all_to_all(const Tensor& input, const std::vector<int64_t>& send_counts,
                                 Tensor& output, const std::vector<int64_t>& recv_counts) {
  const auto sum = [](const std::vector<int64_t>& v) {
    int64_t total = 0;
    for (const int64_t c : v) {
      if (c < 0) return int64_t{-1};
      total += c;
    }
    return total;
  };
  const int64_t sent = sum(send_counts), received = sum(recv_counts);
  const auto row = [](const Tensor& t) {
    return t.dim() ? t.numel() / std::max<int64_t>(t.size(0), 1) : 0;
  };
  if (static_cast<int>(send_counts.size()) != size_ ||
      static_cast<int>(recv_counts.size()) != size_ || sent < 0 || received < 0 ||
      input.dim() < 1 || output.dim() < 1 || input.size(0) != sent || output.size(0) != received ||
      (sent > 0 && received > 0 && row(input) != row(output)) || input.dtype() != output.dtype() ||
      !input.is_contiguous() || !output.is_contiguous()) {
    throw ValueError(name_ + " all_to_all: input " + shape_str(input.shape()) + " (" +
                     dtype_name(input.dtype()) + "), output " + shape_str(output.shape()) + " (" +
                     dtype_name(output.dtype()) + "), " + std::to_string(send_counts.size()) +
                     " send and " + std::to_string(recv_counts.size()) + " receive counts for " +
                     std::to_string(size_) +
                     " ranks (expected a count per rank, >= 0, summing to each tensor's rows, of "
                     "one row width and dtype, both contiguous)");
  }
  std::vector<P2POp> ops;
  int64_t send_at = 0, recv_at = 0;
  for (int r = 0; r < size_; ++r) {
    const int64_t s = send_counts[static_cast<size_t>(r)], v = recv_counts[static_cast<size_t>(r)];
    if (r == rank_) {
      if (s != v) {
        throw ValueError(name_ + " all_to_all: rank " + std::to_string(rank_) + " sends itself " +
                         std::to_string(s) + " rows but receives " + std::to_string(v));
      }
      if (s > 0) {
        Tensor to = narrow(output, 0, recv_at, v);
        copy_(to, narrow(input, 0, send_at, s));
      }
    } else {
      if (s > 0) ops.push_back({true, narrow(input, 0, send_at, s).detach(), r, 0});
      if (v > 0) ops.push_back({false, narrow(output, 0, recv_at, v).detach(), r, 0});
    }
    send_at += s;
    recv_at += v;
  }
  if (ops.empty()) return completed_work();
  return batch_isend_irecv(ops);
}

}  // namespace triad::dist
