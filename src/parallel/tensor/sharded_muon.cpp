#include "triad/parallel/tensor/sharded_muon.h"

#include <algorithm>
#include <utility>

#include "triad/autograd/grad_mode.h"
#include "triad/ops.h"

namespace triad::tp {

ShardedMuon::ShardedMuon(dist::ProcessGroupPtr group, std::map<std::string, Matrix> matrices,
                         optim::MuonOptions options)
    : group_(std::move(group)), matrices_(std::move(matrices)), options_(options) {
  for (const auto& [name, m] : matrices_) {
    if (m.full_shape.size() != 2) {
      throw ShapeError("ShardedMuon: '" + name + "' is " + shape_str(m.full_shape) +
                       ", not a matrix");
    }
    if (m.spec.split) m.spec.check_cut(m.full_shape[m.spec.dim], group_->size(), m.full_shape);
  }
}

void ShardedMuon::update(const std::vector<std::string>& names,
                         const std::function<Tensor(size_t)>& u,
                         const std::function<void(size_t, const Tensor&)>& apply) const {
  autograd::NoGradGuard no_grad;
  const int size = group_->size(), me = group_->rank();
  std::vector<const Matrix*> of;
  std::vector<size_t> split;
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = matrices_.find(names[i]);
    if (it == matrices_.end())
      throw ValueError("ShardedMuon: no matrix '" + names[i] + "' was given to it");
    of.push_back(&it->second);
    if (it->second.spec.split && size > 1) {
      split.push_back(i);
    } else {
      apply(i, optim::muon_update(u(i), it->second.row_blocks, options_, names[i]));
    }
  }
  for (size_t round = 0; round < split.size(); round += static_cast<size_t>(size)) {
    const size_t n = std::min(static_cast<size_t>(size), split.size() - round);
    // This rank's shards of the round's u, in the order of the ranks that
    // orthogonalise them.
    std::vector<Tensor> mine;
    std::vector<Shape> shapes;
    std::vector<int64_t> sent(static_cast<size_t>(size), 0);
    for (size_t k = 0; k < n; ++k) {
      Tensor x = u(split[round + k]);
      if (x.dtype() != DType::F32 && x.dtype() != DType::F64) x = cast(x, DType::F32);
      shapes.push_back(x.shape());
      sent[k] = x.numel();
      mine.push_back(reshape(contiguous(x), {x.numel(), 1}));
    }
    const DType dtype = mine.front().dtype();
    const Device device = mine.front().device();
    for (const Tensor& x : mine) {
      if (x.dtype() != dtype) {
        throw ValueError("ShardedMuon: the matrices' u come in " + std::string(dtype_name(dtype)) +
                         " and " + dtype_name(x.dtype()));
      }
    }
    const Tensor input = mine.size() == 1 ? mine[0] : concat(mine, 0);
    // The matrix this rank orthogonalises (if the round has one for it):
    // every rank's shard of it, all of one shape.
    const bool owns = static_cast<size_t>(me) < n;
    const int64_t own = owns ? sent[static_cast<size_t>(me)] : 0;
    std::vector<int64_t> taken(static_cast<size_t>(size), own);
    Tensor shards = empty({own * size, 1}, dtype, device);
    group_->all_to_all(input, sent, shards, taken)->wait();
    Tensor back = empty({0, 1}, dtype, device);
    if (owns) {
      const size_t i = split[round + static_cast<size_t>(me)];
      const Matrix& m = *of[i];
      std::vector<Tensor> pieces;
      for (int q = 0; q < size; ++q)
        pieces.push_back(reshape(narrow(shards, 0, q * own, own), shapes[static_cast<size_t>(me)]));
      const Tensor full = m.spec.assemble(pieces, m.full_shape);
      const Tensor whole = optim::muon_update(full, m.row_blocks, options_, names[i]);
      std::vector<Tensor> cuts;
      for (int q = 0; q < size; ++q) {
        Tensor c = contiguous(m.spec.cut(whole, q, size));
        if (c.dtype() != dtype) c = cast(c, dtype);
        cuts.push_back(reshape(c, {c.numel(), 1}));
      }
      back = concat(cuts, 0);
    }
    // Each rank's shard of every update of the round.
    Tensor updates = empty({input.size(0), 1}, dtype, device);
    group_->all_to_all(back, taken, updates, sent)->wait();
    int64_t at = 0;
    for (size_t k = 0; k < n; ++k) {
      apply(split[round + k], reshape(narrow(updates, 0, at, sent[k]), shapes[k]));
      at += sent[k];
    }
  }
}

optim::MuonUpdater ShardedMuon::updater(std::shared_ptr<const ShardedMuon> self) {
  return [self = std::move(self)](const std::vector<std::string>& names,
                                  const std::function<Tensor(size_t)>& u,
                                  const std::function<void(size_t, const Tensor&)>& apply) {
    self->update(names, u, apply);
  };
}

}  // namespace triad::tp
