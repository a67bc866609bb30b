#include "triad/plan/planner.h"

#include <algorithm>
#include <cmath>

#include "triad/core/error.h"
#include "triad/parallel/pipeline/stage_balance.h"

namespace triad::plan {

std::vector<Estimate> recommend(const nn::GptConfig& m, const ClusterSpec& c, int gpus,
                                int global_batch, const SearchSpace& space) {
  std::vector<ParallelConfig> candidates;
  for (int tp = 1; tp <= std::min(gpus, c.gpus_per_node); tp *= 2) {
    if (gpus % tp != 0 || m.n_head % tp != 0 || m.kv_heads() % tp != 0) continue;
    for (int pp = 1; pp <= gpus / tp; ++pp) {
      if ((gpus / tp) % pp != 0 || pp > m.n_layer) continue;
      if (m.n_layer % pp != 0 && !space.try_balanced_stages) continue;
      const int dp = gpus / (tp * pp);
      if (global_batch % dp != 0) continue;
      for (int mb : space.micro_batches) {
        if (global_batch % (mb * dp) != 0) continue;
        std::vector<std::pair<pipeline::ScheduleKind, int>> schedules{
            {pipeline::ScheduleKind::OneFOneB, 1}};
        if (pp > 1) {
          for (int v : space.vpps) {
            if (v > 1) schedules.push_back({pipeline::ScheduleKind::Interleaved, v});
          }
          if (space.try_zb_h1) schedules.push_back({pipeline::ScheduleKind::ZbH1, 1});
          if (space.try_zb_auto) schedules.push_back({pipeline::ScheduleKind::ZbAuto, 1});
          if (space.try_zb_v) schedules.push_back({pipeline::ScheduleKind::ZbV, 2});
        }
        for (auto [kind, v] : schedules) {
          for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
            // With fused attention selective recomputation is none (nothing
            // score-sized is stored): one entry, not two equal ones.
            if (rc == Recompute::Selective && space.attention == Attention::Flash) continue;
            for (bool sp : {false, true}) {
              if (sp && tp == 1) continue;
              for (bool z : {false, true}) {
                if (z && dp == 1) continue;
                ParallelConfig p;
                p.tp = tp;
                p.pp = pp;
                p.dp = dp;
                p.vpp = v;
                p.micro_batch = mb;
                p.recompute = rc;
                p.sequence_parallel = sp;
                p.zero1 = z;
                p.schedule = kind;
                p.overlap_dp = space.overlap_dp;
                p.overlap_tp = space.overlap_tp;
                p.attention = space.attention;
                std::vector<ParallelConfig> layouts{p};
                if (pp > 1 && space.try_balanced_stages && m.n_layer >= pp * v) {
                  ParallelConfig balanced = p;
                  balanced.stage_layers =
                      pipeline::balanced_stage_layers(m, pp, v, rc == Recompute::Full);
                  const bool even =
                      std::all_of(balanced.stage_layers.begin(), balanced.stage_layers.end(),
                                  [&](int64_t n) { return n * pp * v == m.n_layer; });
                  if (!even) layouts.push_back(balanced);
                }
                for (const ParallelConfig& layout : layouts) {
                  try {
                    check_config(m, c, gpus, global_batch, layout);
                  } catch (const ConfigError&) {
                    continue;
                  }
                  candidates.push_back(layout);
                }
              }
            }
          }
        }
      }
    }
  }
  std::vector<Estimate> priced(candidates.size());
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < candidates.size(); ++i)
    priced[i] = estimate(m, c, gpus, global_batch, candidates[i]);
  std::vector<Estimate> out;
  for (const Estimate& e : priced) {
    if (e.fits) out.push_back(e);
  }
  // Fastest first; among equally fast layouts (the same 0.1% bucket of step
  // time), the leaner one.
  auto bucket = [](const Estimate& e) {
    return std::floor(std::log(e.step_time) / std::log(1.001));
  };
  std::stable_sort(out.begin(), out.end(), [&](const Estimate& x, const Estimate& y) {
    const double bx = bucket(x), by = bucket(y);
    return bx != by ? bx < by : x.memory_bytes < y.memory_bytes;
  });
  return out;
}

}  // namespace triad::plan
