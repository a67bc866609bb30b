#include "triad/parallel/tensor/mappings.h"

#include "triad/autograd/grad_mode.h"
#include "triad/autograd/node.h"
#include "triad/ops.h"

namespace triad::tp {

using autograd::record;
using autograd::TensorList;

namespace {

int64_t check_divisible(const Tensor& x, int64_t dim, const dist::ProcessGroupPtr& g,
                        const char* op) {
  const int64_t d = wrap_dim(dim, x.dim(), op);
  if (x.size(d) % g->size() != 0) {
    throw ShapeError(std::string(op) + ": dim " + std::to_string(d) + " of " +
                     shape_str(x.shape()) + " must be divisible by the tensor-parallel size (" +
                     std::to_string(g->size()) + ")");
  }
  return d;
}

// Moves dim d to the front, contiguous (so collectives split rows).
Tensor front(const Tensor& x, int64_t d) {
  return d == 0 ? contiguous(x) : contiguous(transpose(x, 0, d));
}
Tensor unfront(const Tensor& x, int64_t d) {
  return d == 0 ? x : contiguous(transpose(x, 0, d));
}

}  // namespace

namespace {

// Begins all_gather_along; the function returned waits and gives its result.
std::function<Tensor()> start_all_gather_along(const Tensor& x, int64_t dim,
                                               const dist::ProcessGroupPtr& g) {
  autograd::NoGradGuard ng;
  const int64_t d = wrap_dim(dim, x.dim(), "all_gather_along");
  Tensor in = front(x, d).detach();
  Shape s = in.shape();
  s[0] *= g->size();
  Tensor out = empty(s, x.dtype(), x.device());
  dist::WorkPtr work = g->all_gather(in, out);
  return [work, in, out, d]() {
    autograd::NoGradGuard guard;
    work->wait();
    return unfront(out, d).detach();
  };
}

}  // namespace

Tensor all_gather_along(const Tensor& x, int64_t dim, const dist::ProcessGroupPtr& g) {
  if (g->size() == 1) return x;
  return start_all_gather_along(x, dim, g)();
}

namespace {

// Begins reduce_scatter_along; the function returned waits and gives its result.
std::function<Tensor()> start_reduce_scatter_along(const Tensor& x, int64_t dim,
                                                   const dist::ProcessGroupPtr& g) {
  autograd::NoGradGuard ng;
  const int64_t d = check_divisible(x, dim, g, "reduce_scatter_along");
  Tensor in = front(x, d).detach();
  Shape s = in.shape();
  s[0] /= g->size();
  Tensor out = empty(s, x.dtype(), x.device());
  dist::WorkPtr work = g->reduce_scatter(in, out, dist::ReduceOp::Sum);
  return [work, in, out, d]() {
    autograd::NoGradGuard guard;
    work->wait();
    return unfront(out, d).detach();
  };
}

// Begins the in-place all-reduce (sum) of x, which must be contiguous.
std::function<Tensor()> start_all_reduce_in_place(const Tensor& x, const dist::ProcessGroupPtr& g) {
  Tensor t = x.detach();
  dist::WorkPtr work = g->all_reduce(t, dist::ReduceOp::Sum);
  return [work, t]() {
    work->wait();
    return t;
  };
}

}  // namespace

Tensor reduce_scatter_along(const Tensor& x, int64_t dim, const dist::ProcessGroupPtr& g) {
  if (g->size() == 1) return x;
  return start_reduce_scatter_along(x, dim, g)();
}

Tensor slice_along(const Tensor& x, int64_t dim, const dist::ProcessGroupPtr& g) {
  autograd::NoGradGuard ng;
  if (g->size() == 1) return x;
  const int64_t d = check_divisible(x, dim, g, "slice_along");
  const int64_t part = x.size(d) / g->size();
  return contiguous(narrow(x.detach(), d, g->rank() * part, part)).detach();
}

namespace {

Tensor all_reduced(const Tensor& x, const dist::ProcessGroupPtr& g) {
  autograd::NoGradGuard ng;
  Tensor y = clone(contiguous(x)).detach();
  return g->size() > 1 ? start_all_reduce_in_place(y, g)() : y;
}

}  // namespace

RegionInput enter_region(const Tensor& x, const dist::ProcessGroupPtr& g, bool sequence_parallel) {
  if (g->size() == 1) return {x, {}};
  InputGradComm comm;
  comm.source = x;
  if (sequence_parallel) {
    comm.start = [g](const Tensor& dx) { return start_reduce_scatter_along(dx, 1, g); };
    // The layer keeps this shard, not the gathered input, for its weight
    // gradient (Korthikanti et al.'s sequence-parallel activation memory).
    comm.regather = [g, shard = x.detach()]() { return start_all_gather_along(shard, 1, g); };
    return {all_gather_along(x, 1, g), std::move(comm)};
  }
  comm.start = [g](const Tensor& dx) {
    autograd::NoGradGuard ng;
    return start_all_reduce_in_place(contiguous(dx), g);
  };
  return {x, std::move(comm)};
}

Tensor copy_to_region(const Tensor& x, const dist::ProcessGroupPtr& g) {
  Tensor y = x.detach();
  record("tp_copy_to_region", {x}, {y},
         [g](const TensorList& gr) -> TensorList { return {all_reduced(gr[0], g)}; });
  return y;
}

Tensor reduce_from_region(const Tensor& x, const dist::ProcessGroupPtr& g) {
  Tensor y = all_reduced(x, g);
  record("tp_reduce_from_region", {x}, {y},
         [](const TensorList& gr) -> TensorList { return {gr[0]}; });
  return y;
}

Tensor scatter_to_region(const Tensor& x, const dist::ProcessGroupPtr& g) {
  Tensor y = slice_along(x, -1, g);
  if (y.same(x)) y = x.detach();
  record("tp_scatter_to_region", {x}, {y},
         [g](const TensorList& gr) -> TensorList { return {all_gather_along(gr[0], -1, g)}; });
  return y;
}

Tensor gather_from_region(const Tensor& x, const dist::ProcessGroupPtr& g) {
  Tensor y = all_gather_along(x, -1, g);
  if (y.same(x)) y = x.detach();
  record("tp_gather_from_region", {x}, {y},
         [g](const TensorList& gr) -> TensorList { return {slice_along(gr[0], -1, g)}; });
  return y;
}

Tensor gather_from_sequence_region(const Tensor& x, const dist::ProcessGroupPtr& g) {
  Tensor y = all_gather_along(x, 1, g);
  if (y.same(x)) y = x.detach();
  record("sp_gather", {x}, {y},
         [g](const TensorList& gr) -> TensorList { return {reduce_scatter_along(gr[0], 1, g)}; });
  return y;
}

Tensor gather_from_sequence_region_replicated(const Tensor& x, const dist::ProcessGroupPtr& g) {
  Tensor y = all_gather_along(x, 1, g);
  if (y.same(x)) y = x.detach();
  record("sp_gather_replicated", {x}, {y},
         [g](const TensorList& gr) -> TensorList { return {slice_along(gr[0], 1, g)}; });
  return y;
}

Tensor reduce_scatter_to_sequence_region(const Tensor& x, const dist::ProcessGroupPtr& g) {
  Tensor y = reduce_scatter_along(x, 1, g);
  if (y.same(x)) y = x.detach();
  record("sp_reduce_scatter", {x}, {y},
         [g](const TensorList& gr) -> TensorList { return {all_gather_along(gr[0], 1, g)}; });
  return y;
}

Tensor scatter_to_sequence_region(const Tensor& x, const dist::ProcessGroupPtr& g) {
  Tensor y = slice_along(x, 1, g);
  if (y.same(x)) y = x.detach();
  record("sp_scatter", {x}, {y},
         [g](const TensorList& gr) -> TensorList { return {all_gather_along(gr[0], 1, g)}; });
  return y;
}

}  // namespace triad::tp
