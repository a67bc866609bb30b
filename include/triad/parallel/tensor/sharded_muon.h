#pragma once

#include <map>
#include <string>
#include <vector>

#include "triad/dist/process_group.h"
#include "triad/optim/muon.h"
#include "triad/parallel/tensor/shard.h"

namespace triad::tp {

// Muon's updates (optim::MuonUpdater) of matrices split over a
// tensor-parallel group. Muon orthogonalises each matrix whole, so rather
// than every rank gathering every matrix and repeating the same
// Newton-Schulz iterations, the group shares them: the split matrices go
// in rounds of `size`, matrix k of a round orthogonalised by rank k, which
// receives every rank's shard of its u and sends each rank its shard of
// the update back (two all-to-all exchanges a round; each rank sends and
// receives its own shards once). Matrices every rank holds whole
// (replicated ones, or tp 1) are updated where they are.
class ShardedMuon {
 public:
  struct Matrix {
    ShardSpec spec;
    Shape full_shape;
    std::vector<int64_t> row_blocks;  // of the full matrix (optim::MuonMatrix)
  };
  ShardedMuon(dist::ProcessGroupPtr group, std::map<std::string, Matrix> matrices,
              optim::MuonOptions options);

  // The optim::MuonUpdater: every rank of the group calls it with the same
  // names in the same order (matrices it does not know are an error).
  void update(const std::vector<std::string>& names, const std::function<Tensor(size_t)>& u,
              const std::function<void(size_t, const Tensor&)>& apply) const;
  // This object as an updater (sharing it).
  static optim::MuonUpdater updater(std::shared_ptr<const ShardedMuon> self);

 private:
  dist::ProcessGroupPtr group_;
  std::map<std::string, Matrix> matrices_;
  optim::MuonOptions options_;
};

}  // namespace triad::tp
