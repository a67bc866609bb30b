#include "local_process_group.h"

#include "triad/ops/elementwise.h"

namespace triad::dist::detail {

WorkPtr LocalProcessGroup::all_reduce(Tensor&, ReduceOp) {
  return completed_work();
}

WorkPtr LocalProcessGroup::all_gather(const Tensor& input, Tensor& output) {
  if (output.numel() != input.numel()) {
    throw ShapeError("all_gather on '" + name_ + "' (size 1): output has " +
                     std::to_string(output.numel()) + " elements, expected " +
                     std::to_string(input.numel()));
  }
  Tensor src = contiguous(input).detach();
  copy_(output, make_view(src, output.shape(), contiguous_strides(output.shape()), src.offset()));
  return completed_work();
}

WorkPtr LocalProcessGroup::reduce_scatter(const Tensor& input, Tensor& output, ReduceOp) {
  return all_gather(input, output);
}

WorkPtr LocalProcessGroup::broadcast(Tensor&, int root) {
  if (root != 0)
    throw ValueError("broadcast on '" + name_ + "': root " + std::to_string(root) +
                     " is not in a group of 1");
  return completed_work();
}

WorkPtr LocalProcessGroup::send(const Tensor&, int dst, int) {
  throw ValueError("send on '" + name_ + "' (size 1): there is no peer " + std::to_string(dst));
}

WorkPtr LocalProcessGroup::recv(Tensor&, int src, int) {
  throw ValueError("recv on '" + name_ + "' (size 1): there is no peer " + std::to_string(src));
}

WorkPtr LocalProcessGroup::batch_isend_irecv(const std::vector<P2POp>& ops) {
  if (!ops.empty())
    throw ValueError("batch_isend_irecv on '" + name_ + "' (size 1): there are no peers");
  return completed_work();
}

}  // namespace triad::dist::detail
