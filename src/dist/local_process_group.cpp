#include "local_process_group.h"

#include "call_checks.h"

#include "triad/ops/elementwise.h"

namespace triad::dist::detail {

WorkPtr LocalProcessGroup::all_reduce(Tensor&, ReduceOp) {
  return completed_work();
}

namespace {

// A group of one: the output is the input, whatever its shape.
WorkPtr copy_whole(const Tensor& input, Tensor& output) {
  Tensor src = contiguous(input).detach();
  copy_(output, make_view(src, output.shape(), contiguous_strides(output.shape()), src.offset()));
  return completed_work();
}

}  // namespace

WorkPtr LocalProcessGroup::all_gather(const Tensor& input, Tensor& output) {
  check_all_gather(*this, input, output);
  return copy_whole(input, output);
}

WorkPtr LocalProcessGroup::all_gather_uneven(const Tensor& input, Tensor& output,
                                             const std::vector<int64_t>& counts) {
  check_all_gather_uneven(*this, input, output, counts);
  return copy_whole(input, output);
}

WorkPtr LocalProcessGroup::reduce_scatter(const Tensor& input, Tensor& output, ReduceOp) {
  if (output.numel() != input.numel() || output.dtype() != input.dtype()) {
    throw ShapeError("reduce_scatter on '" + name_ + "' (size 1): the output is " +
                     dtype_name(output.dtype()) + " " + shape_str(output.shape()) +
                     ", expected the input's " + dtype_name(input.dtype()) + " " +
                     std::to_string(input.numel()) + " elements");
  }
  return copy_whole(input, output);
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
