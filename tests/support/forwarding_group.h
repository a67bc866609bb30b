#pragma once

// A process group that passes every call to another one, for tests to
// derive from and change only the calls they are about (one that runs a
// collective only when it is waited for, one that logs).
#include <memory>
#include <utility>
#include <vector>

#include "triad/dist/process_group.h"

namespace triad::testing {

class ForwardingGroup : public dist::ProcessGroup {
 public:
  explicit ForwardingGroup(dist::ProcessGroupPtr inner)
      : ProcessGroup(inner->name(), inner->rank(), inner->size(), inner->members()),
        inner_(std::move(inner)) {}
  dist::WorkPtr all_reduce(Tensor& t, dist::ReduceOp op) override {
    return inner_->all_reduce(t, op);
  }
  dist::WorkPtr all_gather(const Tensor& in, Tensor& out) override {
    return inner_->all_gather(in, out);
  }
  dist::WorkPtr all_gather_uneven(const Tensor& in, Tensor& out,
                                  const std::vector<int64_t>& counts) override {
    return inner_->all_gather_uneven(in, out, counts);
  }
  dist::WorkPtr reduce_scatter(const Tensor& in, Tensor& out, dist::ReduceOp op) override {
    return inner_->reduce_scatter(in, out, op);
  }
  dist::WorkPtr broadcast(Tensor& t, int root) override { return inner_->broadcast(t, root); }
  dist::WorkPtr send(const Tensor& t, int dst, int tag) override {
    return inner_->send(t, dst, tag);
  }
  dist::WorkPtr recv(Tensor& t, int src, int tag) override { return inner_->recv(t, src, tag); }
  dist::WorkPtr batch_isend_irecv(const std::vector<dist::P2POp>& ops) override {
    return inner_->batch_isend_irecv(ops);
  }
  dist::WorkPtr barrier() override { return inner_->barrier(); }

 protected:
  const dist::ProcessGroupPtr& inner() const { return inner_; }

 private:
  dist::ProcessGroupPtr inner_;
};

}  // namespace triad::testing
