#pragma once

#include <cstdint>

#include "triad/dist/process_group.h"

namespace triad::dist::detail {

// The group of one process (builds without MPI, or a size-1 split): every
// collective is a local copy.
class LocalProcessGroup final : public ProcessGroup {
 public:
  explicit LocalProcessGroup(std::string name, int world_rank = 0)
      : ProcessGroup(std::move(name), 0, 1, {world_rank}) {}
  WorkPtr all_reduce(Tensor& tensor, ReduceOp op) override;
  WorkPtr all_gather(const Tensor& input, Tensor& output) override;
  WorkPtr all_gather_uneven(const Tensor& input, Tensor& output,
                            const std::vector<int64_t>& counts) override;
  WorkPtr reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) override;
  WorkPtr broadcast(Tensor& tensor, int root) override;
  WorkPtr send(const Tensor& tensor, int dst, int tag) override;
  WorkPtr recv(Tensor& tensor, int src, int tag) override;
  WorkPtr batch_isend_irecv(const std::vector<P2POp>& ops) override;
  WorkPtr barrier() override { return completed_work(); }
};

}  // namespace triad::dist::detail
