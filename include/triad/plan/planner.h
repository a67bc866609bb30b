#pragma once

#include <vector>

#include "triad/plan/cost_model.h"

namespace triad::plan {

struct SearchSpace {
  std::vector<int> micro_batches{1, 2, 4, 8, 16};
  std::vector<int> vpps{1, 2, 4};
  bool try_zb_h1 = true;
  bool try_zb_auto = true;  // the order searched for the predicted costs
  bool try_zb_v = true;     // two chunks per rank in a V (vpp 2)
  // Each pipeline also with its stages balanced for the head
  // (pipeline::balanced_stage_layers), and pp not dividing the layers.
  bool try_balanced_stages = true;
  bool overlap_dp = false;
  bool overlap_tp = false;
  Attention attention = Attention::Unfused;
};

// Every valid configuration of `gpus` GPUs for this model and global batch
// (tp within a node and dividing the heads, pp dividing the layers, ...),
// priced, those that do not fit in memory dropped, fastest first.
std::vector<Estimate> recommend(const nn::GptConfig& model, const ClusterSpec& cluster, int gpus,
                                int global_batch, const SearchSpace& space = {});

}  // namespace triad::plan
