#include "triad/dist/process_group.h"

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

}  // namespace triad::dist
