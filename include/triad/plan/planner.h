#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "triad/plan/cost_model.h"

namespace triad::plan {

struct SearchSpace {
  std::vector<int> micro_batches{1, 2, 4, 8, 16};
  std::vector<int> vpps{1, 2, 4};
  // Context-parallel sizes tried (each dividing the GPUs left after tp and
  // pp, and the model's length), each by the keys' and values' all-gather
  // and, where the heads share out, by the heads' all-to-all too: none by
  // default.
  std::vector<int> cps{1};
  bool try_zb_h1 = true;
  bool try_zb_auto = true;  // the order searched for the predicted costs
  bool try_zb_v = true;     // two chunks per rank in a V (vpp 2)
  // Each pipeline also with its stages balanced for the head
  // (pipeline::balanced_stage_layers), and pp not dividing the layers.
  bool try_balanced_stages = true;
  // Full recomputation also of a quarter, half and three quarters of each
  // chunk's layers alone (ParallelConfig::recompute_layers).
  bool try_recompute_layers = true;
  bool overlap_dp = false;
  bool overlap_tp = false;
  Attention attention = Attention::Unfused;
  bool muon = false;  // every layout under train.optimizer muon (ParallelConfig::muon)
  // What every layout holds as ParallelConfig does (the search varies none
  // of them): Newton-Schulz in f32, the parameters' all-gathers after
  // ZeRO-1's step left running, PTD-P's scatter-gather between stages, the
  // parameters held fixed.
  bool muon_ns_fp32 = false;
  bool bf16_moments = false;
  bool bf16_grads = false;
  bool ema = false;
  bool overlap_param_gather = true;
  bool scatter_gather = true;
  std::set<std::string> frozen;
  // Global batch sizes the run also steps through (train.rampup_batch_size's
  // ramp): only layouts whose micro batch times dp divides each of them too.
  std::vector<int64_t> ramp_batches;
  // Gives `layout` what every layout of this space holds (overlap_dp and
  // overlap_tp, attention, muon and muon_ns_fp32, bf16_moments, bf16_grads,
  // ema, overlap_param_gather,
  // scatter_gather, frozen).
  void apply_to(ParallelConfig& layout) const;
  // > 0: only the `top` fastest layouts that fit are wanted. Layouts are
  // then priced in the order of estimate_lower_bound's step time, and the
  // search stops where that bound passes the top-th best found: the same
  // `top` layouts, in the same order, as pricing every one.
  int top = 0;
};

// What a search looked at.
struct SearchStats {
  size_t layouts = 0;  // valid layouts of the search space
  size_t priced = 0;   // of those, priced in full (schedule simulated)
  size_t fit = 0;      // of those, fitting in memory
};

// Every valid configuration of `gpus` GPUs for this model and global batch
// (tp within a node and dividing the heads, pp dividing the layers, ...),
// priced, those that do not fit in memory dropped, fastest first (at most
// space.top of them when it is set).
std::vector<Estimate> recommend(const nn::GptConfig& model, const ClusterSpec& cluster, int gpus,
                                int global_batch, const SearchSpace& space = {},
                                SearchStats* stats = nullptr);

}  // namespace triad::plan
