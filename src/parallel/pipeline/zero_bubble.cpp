#include "triad/parallel/pipeline/zero_bubble.h"

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "triad/core/error.h"

namespace triad::pipeline {
namespace {

using Order = std::vector<Action>;  // compute actions only

enum class WPolicy {
  Eager,  // W whenever neither B nor F can start now
  Fit,    // W only when it ends before the next known arrival
};

struct StageCost {
  double f, b, w;
};

// The list scheduler: every rank's order, from a simulation of the pipeline
// with the given costs (communication takes costs.transfer()).
std::vector<Order> list_schedule(int p, int m, int limit, const std::vector<StageCost>& cost,
                                 double transfer, WPolicy policy) {
  const double unknown = std::numeric_limits<double>::quiet_NaN();
  std::vector<Order> orders(p);
  std::vector<int> nf(p, 0), nb(p, 0), nw(p, 0);
  std::vector<double> clock(p, 0.0);
  std::vector<bool> blocked(p, false);
  // When rank r has the input activation of microbatch i (F) and the output
  // gradient (B); NaN until the producer has been scheduled.
  std::vector<std::vector<double>> act(p, std::vector<double>(m, unknown)), grad = act;
  for (int i = 0; i < m; ++i) act[0][i] = 0.0;
  std::vector<double> f_end(m);
  int left = p;
  while (left > 0) {
    int r = -1;
    for (int q = 0; q < p; ++q) {
      if (nw[q] == m || blocked[q]) continue;
      if (r < 0 || clock[q] < clock[r]) r = q;
    }
    if (r < 0) throw Error("zero-bubble list scheduler: every rank waits (internal error)");
    const double t = clock[r];
    // The next B and F this rank could run, and when their inputs arrive.
    const bool b_possible = nb[r] < nf[r];
    const bool f_possible = nf[r] < m && nf[r] - nw[r] < limit;
    const double b_at = !b_possible ? unknown : r == p - 1 ? t : grad[r][nb[r]];
    const double f_at = !f_possible ? unknown : act[r][nf[r]];
    auto ready = [&](double at) { return !std::isnan(at) && at <= t; };
    auto run = [&](ComputeKind kind, int mb, double duration) {
      orders[r].push_back(Action::make_compute(kind, 0, mb));
      clock[r] = t + duration;
      std::fill(blocked.begin(), blocked.end(), false);
    };
    if (b_possible && ready(b_at)) {
      const int mb = nb[r]++;
      run(ComputeKind::BackwardInput, mb, cost[r].b);
      if (r > 0) grad[r - 1][mb] = clock[r] + transfer;
      continue;
    }
    if (f_possible && ready(f_at)) {
      const int mb = nf[r]++;
      run(ComputeKind::Forward, mb, cost[r].f);
      if (r < p - 1) act[r + 1][mb] = clock[r] + transfer;
      continue;
    }
    // The earliest known arrival of an input this rank is waiting for.
    double next = std::numeric_limits<double>::infinity();
    for (double at : {b_at, f_at}) {
      if (!std::isnan(at)) next = std::min(next, at);
    }
    if (nw[r] < nb[r] && (policy == WPolicy::Eager || next >= t + cost[r].w)) {
      const int mb = nw[r]++;
      run(ComputeKind::BackwardWeight, mb, cost[r].w);
      if (nw[r] == m) --left;
      continue;
    }
    if (std::isinf(next)) {
      blocked[r] = true;  // until another rank schedules something
    } else {
      clock[r] = next;
    }
  }
  return orders;
}

// A schedule's compute actions only, its backwards split into B then W.
std::vector<Order> split_orders(const Schedule& s) {
  std::vector<Order> orders(s.p);
  for (int r = 0; r < s.p; ++r) {
    for (const Action& a : s.ranks[r]) {
      if (!a.is_compute()) continue;
      if (a.compute == ComputeKind::Backward) {
        orders[r].push_back(Action::make_compute(ComputeKind::BackwardInput, a.chunk, a.microbatch));
        orders[r].push_back(
            Action::make_compute(ComputeKind::BackwardWeight, a.chunk, a.microbatch));
      } else {
        orders[r].push_back(a);
      }
    }
  }
  return orders;
}

}  // namespace

Schedule make_zero_bubble_schedule(int p, int m, const Costs& costs,
                                   const ZeroBubbleOptions& options) {
  const std::string name = "zb-auto";
  if (p < 1) throw ValueError(name + ": pipeline ranks p (" + std::to_string(p) + ") must be >= 1");
  if (m < 1) throw ValueError(name + ": microbatches m (" + std::to_string(m) + ") must be >= 1");
  if (options.max_in_flight < 0) {
    throw ValueError(name + ": max_in_flight (" + std::to_string(options.max_in_flight) +
                     ") must be >= 1, or 0 for p");
  }
  const int limit = options.max_in_flight == 0 ? p : options.max_in_flight;
  std::vector<StageCost> cost(p);
  for (int r = 0; r < p; ++r) {
    cost[r] = {costs.of(ComputeKind::Forward, r, p, 1),
               costs.of(ComputeKind::BackwardInput, r, p, 1),
               costs.of(ComputeKind::BackwardWeight, r, p, 1)};
    for (auto [what, value] : {std::pair<const char*, double>{"forward", cost[r].f},
                               {"backward_input", cost[r].b},
                               {"backward_weight", cost[r].w}}) {
      if (!(value > 0) || !std::isfinite(value)) {
        throw ValueError(name + ": the " + what + " cost of stage " + std::to_string(r) + " (" +
                         std::to_string(value) + ") must be a finite number > 0");
      }
    }
  }
  if (!(costs.transfer() >= 0) || !std::isfinite(costs.transfer())) {
    throw ValueError(name + ": the transfer time (" + std::to_string(costs.transfer()) +
                     ") must be a finite number >= 0");
  }
  const ActionCost action_cost = [&](int rank, const Action& a) {
    return costs.of(a.compute, rank, p, 1);
  };
  std::vector<std::vector<Order>> candidates;
  // A larger budget can only help: the list scheduler also runs within 1F1B's.
  std::vector<int> budgets{limit};
  if (limit > p) budgets.push_back(p);
  for (int budget : budgets) {
    for (WPolicy policy : {WPolicy::Eager, WPolicy::Fit})
      candidates.push_back(list_schedule(p, m, budget, cost, costs.transfer(), policy));
  }
  candidates.push_back(split_orders(make_schedule(ScheduleKind::ZbH1, p, m)));
  candidates.push_back(split_orders(make_schedule(ScheduleKind::OneFOneB, p, m)));
  std::optional<Schedule> best;
  double best_time = 0;
  for (auto& orders : candidates) {
    Schedule s =
        schedule_from_orders(ScheduleKind::ZbAuto, p, m, 1, true, std::move(orders), action_cost);
    const SimulationResult sim = simulate(s, costs);
    bool fits = true;
    for (int held : sim.peak_held) fits = fits && held <= limit;
    if (!fits) continue;
    if (!best || sim.makespan < best_time) {
      best_time = sim.makespan;
      best = std::move(s);
    }
  }
  if (!best) throw Error(name + ": no candidate order fits the memory limit (internal error)");
  return *best;
}

}  // namespace triad::pipeline
