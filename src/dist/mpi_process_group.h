#pragma once

#include <mpi.h>
#include <cstdint>

#include "triad/dist/process_group.h"

namespace triad::dist::detail {

// Process group over an MPI communicator, for CPU tensors. Calls map to MPI's
// non-blocking operations; Work::wait() polls them against the timeout.
// bf16/f16 reductions go through f32 staging buffers (one rounding at the
// end); data movement of any dtype goes as bytes.
class MpiProcessGroup final : public ProcessGroup {
 public:
  MpiProcessGroup(MPI_Comm comm, std::string name);  // takes ownership of comm
  ~MpiProcessGroup() override;
  MPI_Comm comm() const { return comm_; }

  WorkPtr all_reduce(Tensor& tensor, ReduceOp op) override;
  WorkPtr all_gather(const Tensor& input, Tensor& output) override;
  WorkPtr all_gather_uneven(const Tensor& input, Tensor& output,
                            const std::vector<int64_t>& counts) override;
  WorkPtr reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) override;
  WorkPtr broadcast(Tensor& tensor, int root) override;
  WorkPtr send(const Tensor& tensor, int dst, int tag) override;
  WorkPtr recv(Tensor& tensor, int src, int tag) override;
  WorkPtr batch_isend_irecv(const std::vector<P2POp>& ops) override;
  WorkPtr barrier() override;

 private:
  std::string describe(const std::string& op, const Tensor& t, const std::string& peers) const;
  void check_tensor(const Tensor& t, const char* op) const;
  void check_peer(int peer, const char* op) const;
  // Validate mode: all ranks compare (op, dtype, n, row) and fail together.
  void validate_header(const char* op, const Tensor& t, int64_t extra) const;
  MPI_Comm comm_;
};

}  // namespace triad::dist::detail
