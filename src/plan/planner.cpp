#include "triad/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "triad/core/error.h"
#include "triad/parallel/pipeline/stage_balance.h"

namespace triad::plan {

namespace {

// Fastest first; among equally fast layouts (the same 0.1% bucket of step
// time), the leaner one; then in the search's order.
double bucket(const Estimate& e) {
  return std::floor(std::log(e.step_time) / std::log(1.001));
}
bool ranks_before(const Estimate& x, const Estimate& y) {
  const double bx = bucket(x), by = bucket(y);
  return bx != by ? bx < by : x.memory_bytes < y.memory_bytes;
}

}  // namespace

void SearchSpace::apply_to(ParallelConfig& p) const {
  p.overlap_dp = overlap_dp;
  p.overlap_tp = overlap_tp;
  p.attention = attention;
  p.muon = muon;
  p.muon_ns_fp32 = muon_ns_fp32;
  p.bf16_moments = bf16_moments;
  p.bf16_grads = bf16_grads;
  p.ema = ema;
  p.overlap_param_gather = overlap_param_gather;
  p.scatter_gather = scatter_gather;
  p.frozen = frozen;
}

std::vector<Estimate> recommend(const nn::GptConfig& m, const ClusterSpec& c, int gpus,
                                int global_batch, const SearchSpace& space, SearchStats* stats) {
  std::vector<ParallelConfig> candidates;
  // Each pipeline's balanced split, worked out once (it depends on neither
  // tp, dp nor the micro batch).
  std::map<std::tuple<int, int, bool>, std::vector<int64_t>> splits;
  for (int tp = 1; tp <= std::min(gpus, c.gpus_per_node); tp *= 2) {
    if (gpus % tp != 0 || m.n_head % tp != 0 || !m.kv_heads_fit(tp)) continue;
    for (int pp = 1; pp <= gpus / tp; ++pp) {
      if ((gpus / tp) % pp != 0 || pp > m.n_layer) continue;
      if (m.n_layer % pp != 0 && !space.try_balanced_stages) continue;
      for (int cp : space.cps) {
        if (cp < 1 || (gpus / (tp * pp)) % cp != 0) continue;
        const int dp = gpus / (tp * pp * cp);
        if (global_batch % dp != 0) continue;
        for (int mb : space.micro_batches) {
          if (global_batch % (mb * dp) != 0) continue;
          if (std::any_of(space.ramp_batches.begin(), space.ramp_batches.end(),
                          [&](int64_t g) { return g % (mb * dp) != 0; }))
            continue;
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
                // Expert parallelism for a mixture: each power of two that
                // divides dp and the experts.
                std::vector<int> eps{1};
                for (int ep = 2; m.moe.experts > 0 && ep <= dp * cp; ep *= 2) {
                  if ((dp * cp) % ep == 0 && m.moe.experts % ep == 0) eps.push_back(ep);
                }
                for (bool z : {false, true})
                  for (int ep : eps) {
                    if (z && dp * cp == 1) continue;
                    ParallelConfig p;
                    p.ep = ep;
                    p.cp = cp;
                    p.tp = tp;
                    p.pp = pp;
                    p.dp = dp;
                    p.vpp = v;
                    p.micro_batch = mb;
                    p.recompute = rc;
                    p.sequence_parallel = sp;
                    p.zero1 = z;
                    p.schedule = kind;
                    space.apply_to(p);
                    std::vector<ParallelConfig> layouts{p};
                    if (pp > 1 && space.try_balanced_stages && m.n_layer >= pp * v) {
                      ParallelConfig balanced = p;
                      const std::tuple<int, int, bool> split{pp, v, rc == Recompute::Full};
                      auto known = splits.find(split);
                      if (known == splits.end()) {
                        known = splits
                                    .emplace(split, pipeline::balanced_stage_layers(
                                                        m, pp, v, rc == Recompute::Full))
                                    .first;
                      }
                      balanced.stage_layers = known->second;
                      const int64_t chunks =
                          pp * v;  // (no lambda captures a binding in clang < 16)
                      const bool even =
                          std::all_of(balanced.stage_layers.begin(), balanced.stage_layers.end(),
                                      [&](int64_t n) { return n * chunks == m.n_layer; });
                      if (!even) layouts.push_back(balanced);
                    }
                    // Context parallelism by every exchange (the all-to-all
                    // only where the heads share out; all-to-alls of any
                    // divisor of cp that fits a node beside tp, a ring
                    // across them), named.
                    if (cp > 1) {
                      for (size_t i = 0, n = layouts.size(); i < n; ++i) {
                        layouts[i].cp_exchange =
                            cp::resolve_exchange(cp::Exchange::Auto, m, tp, cp);
                        if (layouts[i].cp_exchange == cp::Exchange::AllToAll) {
                          ParallelConfig gathered = layouts[i];
                          gathered.cp_exchange = cp::Exchange::AllGather;
                          layouts.push_back(gathered);
                        }
                        ParallelConfig ring = layouts[i];
                        ring.cp_exchange = cp::Exchange::Ring;
                        layouts.push_back(ring);
                        // All-to-alls inside a node, a ring across them.
                        for (int a2a = 2; a2a < cp; ++a2a) {
                          if (cp % a2a != 0 || static_cast<long long>(tp) * a2a > c.gpus_per_node)
                            continue;
                          ParallelConfig both = layouts[i];
                          both.cp_exchange = cp::Exchange::AllToAllRing;
                          both.cp_a2a = a2a;
                          layouts.push_back(both);
                        }
                      }
                    }
                    // Full recomputation of a quarter, half and three
                    // quarters of each chunk's layers alone
                    // (model.recompute_layers): between none's memory and
                    // full's time.
                    if (rc == Recompute::Full && space.try_recompute_layers) {
                      for (size_t i = 0, n = layouts.size(); i < n; ++i) {
                        const std::vector<int64_t>& split = layouts[i].stage_layers;
                        const int64_t chunk = split.empty()
                                                  ? m.n_layer / (static_cast<int64_t>(pp) * v)
                                                  : *std::max_element(split.begin(), split.end());
                        int64_t last = 0;
                        for (int64_t quarter = 1; quarter <= 3; ++quarter) {
                          const int64_t some = std::max<int64_t>(1, chunk * quarter / 4);
                          if (some <= last || some >= chunk) continue;
                          last = some;
                          ParallelConfig partial = layouts[i];
                          partial.recompute_layers = static_cast<int>(some);
                          layouts.push_back(partial);
                        }
                      }
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
  }
  SearchStats seen;
  seen.layouts = candidates.size();
  // Which candidates to price in full, in what order: all of them, or those
  // that may fit, by their bound (then the search's order).
  std::vector<size_t> order;
  std::vector<double> bound(candidates.size(), 0.0);
  if (space.top <= 0) {
    for (size_t i = 0; i < candidates.size(); ++i) order.push_back(i);
  } else {
    std::vector<char> may_fit(candidates.size());
#pragma omp parallel for schedule(dynamic)
    for (size_t i = 0; i < candidates.size(); ++i) {
      const Estimate b = estimate_lower_bound(m, c, gpus, global_batch, candidates[i]);
      bound[i] = b.step_time;
      may_fit[i] = b.fits;
    }
    for (size_t i = 0; i < candidates.size(); ++i)
      if (may_fit[i]) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return bound[x] < bound[y]; });
  }
  // Priced in rounds: once `top` layouts fit, the next round begins past the
  // first bound above the top-th best time (a margin of two ranking buckets:
  // a layout in the top-th's bucket may rank before it).
  std::vector<std::pair<size_t, Estimate>> fitting;
  std::vector<double> best;  // the fitting layouts' step times, fastest first, at most `top`
  const size_t round = space.top <= 0 ? std::max<size_t>(order.size(), 1) : 32;
  for (size_t next = 0; next < order.size();) {
    size_t end = std::min(order.size(), next + round);
    if (space.top > 0 && best.size() == static_cast<size_t>(space.top)) {
      const double limit = best.back() * 1.002;
      while (end > next && bound[order[end - 1]] > limit) --end;
      if (end == next) break;
    }
    std::vector<Estimate> priced(end - next);
#pragma omp parallel for schedule(dynamic)
    for (size_t i = next; i < end; ++i)
      priced[i - next] = estimate(m, c, gpus, global_batch, candidates[order[i]]);
    for (size_t i = next; i < end; ++i) {
      const Estimate& e = priced[i - next];
      if (!e.fits) continue;
      fitting.emplace_back(order[i], e);
      if (space.top > 0) {
        best.insert(std::upper_bound(best.begin(), best.end(), e.step_time), e.step_time);
        if (best.size() > static_cast<size_t>(space.top)) best.pop_back();
      }
    }
    seen.priced += end - next;
    next = end;
  }
  seen.fit = fitting.size();
  if (stats) *stats = seen;
  // In the search's order, then ranked (stable): the order pricing every
  // layout would give.
  std::sort(fitting.begin(), fitting.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<Estimate> out;
  for (auto& [index, e] : fitting) out.push_back(std::move(e));
  std::stable_sort(out.begin(), out.end(), ranks_before);
  if (space.top > 0 && out.size() > static_cast<size_t>(space.top)) out.resize(space.top);
  return out;
}

}  // namespace triad::plan
