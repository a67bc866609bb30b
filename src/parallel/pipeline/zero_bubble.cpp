#include "triad/parallel/pipeline/zero_bubble.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>
#include <queue>
#include <string>
#include <utility>

#include "triad/core/error.h"

namespace triad::pipeline {
namespace {

using Order = std::vector<Action>;  // compute actions only

enum class WPolicy {
  Eager,  // W whenever neither B nor F can start now
  Fit,    // W only when it ends before the next known arrival
  // ZB-V only: as Eager, but when a new microbatch waits for memory alone,
  // the W passes that free it go before everything else.
  MemoryFirst,
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
  // Ranks neither finished nor blocked, earliest (clock, rank) first; each
  // at most once.
  std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>, std::greater<>>
      active;
  for (int r = 0; r < p; ++r) active.push({0.0, r});
  int left = p;
  while (left > 0) {
    if (active.empty())
      throw Error("zero-bubble list scheduler: every rank waits (internal error)");
    const int r = active.top().second;
    active.pop();
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
      // Only a neighbour's input can have become known.
      for (int q : {r - 1, r + 1}) {
        if (q >= 0 && q < p && blocked[q]) {
          blocked[q] = false;
          active.push({clock[q], q});
        }
      }
    };
    if (b_possible && ready(b_at)) {
      const int mb = nb[r]++;
      run(ComputeKind::BackwardInput, mb, cost[r].b);
      if (r > 0) grad[r - 1][mb] = clock[r] + transfer;
      active.push({clock[r], r});
      continue;
    }
    if (f_possible && ready(f_at)) {
      const int mb = nf[r]++;
      run(ComputeKind::Forward, mb, cost[r].f);
      if (r < p - 1) act[r + 1][mb] = clock[r] + transfer;
      active.push({clock[r], r});
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
      if (nw[r] == m) {
        --left;  // done: never active again
      } else {
        active.push({clock[r], r});
      }
      continue;
    }
    if (std::isinf(next)) {
      blocked[r] = true;  // until a neighbour schedules something
    } else {
      clock[r] = next;
      active.push({clock[r], r});
    }
  }
  return orders;
}

// Compute orders with each full backward split into B then W.
std::vector<Order> split_orders(const std::vector<Order>& in) {
  std::vector<Order> orders(in.size());
  for (size_t r = 0; r < in.size(); ++r) {
    for (const Action& a : in[r]) {
      if (a.compute == ComputeKind::Backward) {
        orders[r].push_back(
            Action::make_compute(ComputeKind::BackwardInput, a.chunk, a.microbatch));
        orders[r].push_back(
            Action::make_compute(ComputeKind::BackwardWeight, a.chunk, a.microbatch));
      } else {
        orders[r].push_back(a);
      }
    }
  }
  return orders;
}

// The makespan of split orders run as data flow allows: each action starts
// when its rank is free and its input has arrived (the producer's end plus
// the transfer time when the producer is on another rank), with no
// point-to-point batch making a rank wait sooner; so no schedule of these
// orders is quicker in simulate(). Infinity when a rank would hold more
// than `limit` (chunk, microbatch) activations between F and W. `cost` per
// stage; v chunks per rank in `placement`.
double makespan(int p, int v, Placement placement, int m, int limit,
                const std::vector<Order>& orders, const std::vector<StageCost>& cost,
                double transfer) {
  for (const Order& o : orders) {
    int held = 0;
    for (const Action& a : o) {
      held += a.compute == ComputeKind::Forward          ? 1
              : a.compute == ComputeKind::BackwardWeight ? -1
                                                         : 0;
      if (held > limit) return std::numeric_limits<double>::infinity();
    }
  }
  const int S = p * v;
  auto hop = [&](int from, int to) {
    return rank_at(placement, p, from) == rank_at(placement, p, to) ? 0.0 : transfer;
  };
  const double unknown = std::numeric_limits<double>::quiet_NaN();
  // When each stage's F / B of each microbatch ends.
  std::vector<std::vector<double>> f_end(S, std::vector<double>(m, unknown)), b_end = f_end;
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      for (; next[r] < orders[r].size(); ++next[r]) {
        const Action& a = orders[r][next[r]];
        const int mb = a.microbatch, st = stage_at(placement, p, r, a.chunk);
        double ready = clock[r];
        bool known = true;
        auto after = [&](double t) {  // NaN: not produced yet
          known = known && !std::isnan(t);
          if (known) ready = std::max(ready, t);
        };
        double d = 0;
        if (a.compute == ComputeKind::Forward) {
          if (st > 0) after(f_end[st - 1][mb] + hop(st - 1, st));
          d = cost[st].f;
        } else if (a.compute == ComputeKind::BackwardInput) {
          after(f_end[st][mb]);
          if (st < S - 1) after(b_end[st + 1][mb] + hop(st + 1, st));
          d = cost[st].b;
        } else {
          after(b_end[st][mb]);
          d = cost[st].w;
        }
        if (!known) break;
        clock[r] = ready + d;
        if (a.compute == ComputeKind::Forward) f_end[st][mb] = clock[r];
        if (a.compute == ComputeKind::BackwardInput) b_end[st][mb] = clock[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    if (next[r] < orders[r].size())
      throw Error("zero-bubble: candidate orders wait forever (internal error)");
  }
  return *std::max_element(clock.begin(), clock.end());
}

// Which B a ZB-V rank starts when both of its chunks have one ready.
enum class BPreference { Chunk0, Chunk1, EarliestArrival };

// Whether a ZB-V rank with both a B and an F ready starts the F. A
// microbatch's forward crosses 2p stages on its way to the loss, twice a
// loop's hops; an F that waits behind every ready B at each of them keeps
// the microbatch's earlier activations alive that much longer, and with B
// much heavier than F the ranks then run out of memory and wait for
// gradients (at p = 8, m = 64, F 1, B 2, W 1: 4.1% bubble with B first,
// 2.7% with F first). Which rule wins depends on the costs, so the search
// tries each.
enum class FPriority {
  AfterB,           // B, then F (chunk 1's first)
  BeforeB,          // F (chunk 1's first), then B
  Chunk1Alternate,  // a chunk-1 F before B unless an F just ran, else B first
};

// The ZB-V list scheduler (zero_bubble.h): every rank's order over its two
// chunks in the V placement, from a simulation with per-stage costs.
// `admit` is the most microbatches a rank holds at once.
std::vector<Order> v_list_schedule(int p, int m, int admit, const std::vector<StageCost>& cost,
                                   double transfer, WPolicy policy, BPreference prefer, int keep,
                                   FPriority f_priority) {
  const int S = 2 * p;
  const double unknown = std::numeric_limits<double>::quiet_NaN();
  std::vector<Order> orders(p);
  // Per rank and chunk: the next microbatch to forward and to backward.
  std::vector<std::array<int, 2>> nf(p, {0, 0}), nb(p, {0, 0});
  std::vector<int> w_done(p, 0), reserved(p, 0);
  std::vector<std::deque<std::pair<int, int>>> w_queue(p);  // (chunk, microbatch), B order
  std::vector<double> clock(p, 0.0);
  std::vector<bool> blocked(p, false);
  // When stage s has the input activation of microbatch i (F) and the
  // output gradient (B); NaN until its producer has been scheduled.
  std::vector<std::vector<double>> act(S, std::vector<double>(m, unknown)), grad = act;
  for (int i = 0; i < m; ++i) act[0][i] = 0.0;
  // Ranks neither finished nor blocked, earliest (clock, rank) first; each
  // at most once.
  std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>, std::greater<>>
      active;
  for (int r = 0; r < p; ++r) active.push({0.0, r});
  int left = p;
  auto stage = [&](int r, int c) { return stage_at(Placement::V, p, r, c); };
  auto hop = [&](int from, int to) {  // the transfer time between two stages
    return rank_at(Placement::V, p, from) == rank_at(Placement::V, p, to) ? 0.0 : transfer;
  };
  while (left > 0) {
    if (active.empty()) {
      // Shared room can run out with every rank waiting for another's
      // chunk-1 F: this variant fails. Reserving per microbatch cannot.
      if (keep >= 0) return {};
      throw Error("zb-v list scheduler: every rank waits (internal error)");
    }
    const int r = active.top().second;
    active.pop();
    const double t = clock[r];
    std::array<double, 2> b_at{unknown, unknown}, f_at{unknown, unknown};
    for (int c = 0; c < 2; ++c) {
      const int st = stage(r, c);
      if (nb[r][c] < nf[r][c]) b_at[c] = grad[st][nb[r][c]];
      // A chunk-0 F admits a microbatch. Either it reserves both chunks'
      // activations until their W passes, or `keep` chunk activations stay
      // free for any microbatch's chunk-1 F.
      const int held = nf[r][0] + nf[r][1] - w_done[r];
      const bool room = keep < 0 ? c == 1 || reserved[r] + 2 <= 2 * admit
                                 : held + 1 + (c == 0 ? keep : 0) <= 2 * admit;
      if (nf[r][c] < m && room) f_at[c] = act[st][nf[r][c]];
    }
    auto ready = [&](double at) { return !std::isnan(at) && at <= t; };
    // `consumer`: the rank whose input this action makes known (a blocked
    // rank waits for nothing else: room frees only by its own W passes).
    auto run = [&](ComputeKind kind, int c, int mb, double duration, int consumer) {
      orders[r].push_back(Action::make_compute(kind, c, mb));
      clock[r] = t + duration;
      if (consumer >= 0 && blocked[consumer]) {
        blocked[consumer] = false;
        active.push({clock[consumer], consumer});
      }
    };
    auto run_w = [&] {
      const auto [c, mb] = w_queue[r].front();
      w_queue[r].pop_front();
      --reserved[r];
      run(ComputeKind::BackwardWeight, c, mb, cost[stage(r, c)].w, -1);
      if (++w_done[r] == 2 * m) {
        --left;
      } else {
        active.push({clock[r], r});
      }
    };
    const bool starved = nf[r][0] < m && std::isnan(f_at[0]) && ready(act[stage(r, 0)][nf[r][0]]);
    if (!w_queue[r].empty() && policy == WPolicy::MemoryFirst && starved) {
      run_w();
      continue;
    }
    auto run_f = [&](int c) {
      const int st = stage(r, c), mb = nf[r][c]++;
      if (c == 0) reserved[r] += 2;
      run(ComputeKind::Forward, c, mb, cost[st].f,
          st < S - 1 ? rank_at(Placement::V, p, st + 1) : -1);
      if (st < S - 1) {
        act[st + 1][mb] = clock[r] + hop(st, st + 1);
      } else {
        grad[st][mb] = clock[r];  // the loss: its B may follow at once
      }
      active.push({clock[r], r});
    };
    const int f_chunk = ready(f_at[1]) ? 1 : ready(f_at[0]) ? 0 : -1;
    const bool after_f = !orders[r].empty() && orders[r].back().compute == ComputeKind::Forward;
    if (f_chunk >= 0 && (f_priority == FPriority::BeforeB ||
                         (f_priority == FPriority::Chunk1Alternate && f_chunk == 1 && !after_f))) {
      run_f(f_chunk);
      continue;
    }
    int b_chunk = -1;
    if (ready(b_at[0]) && ready(b_at[1])) {
      b_chunk = prefer == BPreference::Chunk0   ? 0
                : prefer == BPreference::Chunk1 ? 1
                                                : (b_at[1] < b_at[0] ? 1 : 0);
    } else if (ready(b_at[0]) || ready(b_at[1])) {
      b_chunk = ready(b_at[0]) ? 0 : 1;
    }
    if (b_chunk >= 0) {
      const int st = stage(r, b_chunk), mb = nb[r][b_chunk]++;
      run(ComputeKind::BackwardInput, b_chunk, mb, cost[st].b,
          st > 0 ? rank_at(Placement::V, p, st - 1) : -1);
      if (st > 0) grad[st - 1][mb] = clock[r] + hop(st, st - 1);
      w_queue[r].push_back({b_chunk, mb});
      active.push({clock[r], r});
      continue;
    }
    if (f_chunk >= 0) {
      run_f(f_chunk);
      continue;
    }
    double next = std::numeric_limits<double>::infinity();
    for (double at : {b_at[0], b_at[1], f_at[0], f_at[1]}) {
      if (!std::isnan(at)) next = std::min(next, at);
    }
    if (!w_queue[r].empty() &&
        (policy != WPolicy::Fit || next >= t + cost[stage(r, w_queue[r].front().first)].w)) {
      run_w();
      continue;
    }
    if (std::isinf(next)) {
      blocked[r] = true;  // until another rank schedules something
    } else {
      clock[r] = next;
      active.push({clock[r], r});
    }
  }
  return orders;
}

// Checks a search's inputs (`name`: the schedule, for the errors) and
// returns the costs of its p*v stages.
std::vector<StageCost> checked_inputs(const std::string& name, int p, int v, int m,
                                      const Costs& costs, const ZeroBubbleOptions& options) {
  if (p < 1) throw ValueError(name + ": pipeline ranks p (" + std::to_string(p) + ") must be >= 1");
  if (m < 1) throw ValueError(name + ": microbatches m (" + std::to_string(m) + ") must be >= 1");
  if (options.max_in_flight < 0) {
    throw ValueError(name + ": max_in_flight (" + std::to_string(options.max_in_flight) +
                     ") must be >= 1, or 0 for p");
  }
  std::vector<StageCost> cost;
  for (int st = 0; st < p * v; ++st) {
    const double f = costs.of(ComputeKind::Forward, st, p, v),
                 b = costs.of(ComputeKind::BackwardInput, st, p, v),
                 w = costs.of(ComputeKind::BackwardWeight, st, p, v);
    for (auto [what, value] : {std::pair<const char*, double>{"forward", f},
                               {"backward_input", b},
                               {"backward_weight", w}}) {
      if (!(value > 0) || !std::isfinite(value)) {
        throw ValueError(name + ": the " + what + " cost of stage " + std::to_string(st) + " (" +
                         std::to_string(value) + ") must be a finite number > 0");
      }
    }
    cost.push_back({f, b, w});
  }
  if (!(costs.transfer() >= 0) || !std::isfinite(costs.transfer())) {
    throw ValueError(name + ": the transfer time (" + std::to_string(costs.transfer()) +
                     ") must be a finite number >= 0");
  }
  return cost;
}

}  // namespace

Schedule make_zero_bubble_schedule(int p, int m, const Costs& costs,
                                   const ZeroBubbleOptions& options, SimulationResult* simulated) {
  const std::string name = "zb-auto";
  const std::vector<StageCost> cost = checked_inputs(name, p, 1, m, costs, options);
  const int limit = options.max_in_flight == 0 ? p : options.max_in_flight;
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
  const size_t searched = candidates.size();
  candidates.push_back(compute_orders(ScheduleKind::ZbH1, p, m));
  candidates.push_back(split_orders(compute_orders(ScheduleKind::OneFOneB, p, m)));
  // Each order that fits the memory limit gets its point-to-point batches
  // and is timed by the simulator as the executor runs it (a batch that
  // only receives is waited for where its payload is consumed, one that
  // also sends where it is posted). The hand-written orders keep
  // make_schedule's batches (placed for unit costs, which posts some
  // receives early), so the result is never slower than those schedules.
  // An order's time with every action as soon as its inputs have arrived
  // (`makespan`) bounds its simulated time from below: orders are simulated
  // from the lowest bound up, and one whose bound is already slower than the
  // best simulated so far is passed over.
  std::vector<std::pair<double, size_t>> bounds;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double bound =
        makespan(p, 1, Placement::Loop, m, limit, candidates[i], cost, costs.transfer());
    if (std::isfinite(bound)) bounds.emplace_back(bound, i);
  }
  std::sort(bounds.begin(), bounds.end());
  std::optional<Schedule> best;
  double best_time = std::numeric_limits<double>::infinity();
  size_t best_index = 0;
  for (const auto& [bound, i] : bounds) {
    if (bound > best_time * (1 + 1e-9)) break;
    Schedule s = schedule_from_orders(ScheduleKind::ZbAuto, p, m, 1, true, std::move(candidates[i]),
                                      i < searched ? action_cost : ActionCost{});
    SimulationResult timed = simulate(s, costs, options.semantics);
    // The quickest wins; among equally quick ones, the first candidate.
    const double t = timed.makespan;
    if (t < best_time || (t == best_time && i < best_index)) {
      best_time = t;
      best_index = i;
      best = std::move(s);
      if (simulated) *simulated = std::move(timed);
    }
  }
  if (!best) throw Error(name + ": no candidate order fits the memory limit (internal error)");
  return std::move(*best);
}

Schedule make_zero_bubble_v_schedule(int p, int m, const Costs& costs,
                                     const ZeroBubbleOptions& options) {
  const std::string name = "zb-v";
  const std::vector<StageCost> cost = checked_inputs(name, p, 2, m, costs, options);
  const int limit = options.max_in_flight == 0 ? p : options.max_in_flight;
  const ActionCost action_cost = [&](int rank, const Action& a) {
    return costs.of(a.compute, stage_at(Placement::V, p, rank, a.chunk), p, 2);
  };
  std::vector<int> budgets{limit};
  if (limit > p) budgets.push_back(p);
  // No order ends before every rank has done its work, which it cannot
  // start before the first microbatch's forwards reach it: an order that
  // ends then ends the search.
  double bound = 0;
  for (int r = 0; r < p; ++r) {
    double start = 0, work = 0;
    for (int st = 0; st < r; ++st) start += cost[st].f + costs.transfer();
    for (int c = 0; c < 2; ++c) {
      const StageCost& sc = cost[stage_at(Placement::V, p, r, c)];
      work += m * (sc.f + sc.b + sc.w);
    }
    bound = std::max(bound, start + work);
  }
  // Large pipelines (the planner prices many) try the variants that win most.
  const bool large = static_cast<int64_t>(p) * m > 2048;
  std::vector<BPreference> prefers{BPreference::Chunk0, BPreference::EarliestArrival};
  if (!large) prefers.push_back(BPreference::Chunk1);
  const std::vector<int> keeps{1, -1};
  std::vector<FPriority> f_priorities{FPriority::AfterB, FPriority::BeforeB};
  if (!large) f_priorities.push_back(FPriority::Chunk1Alternate);
  std::vector<Order> best;
  double best_time = std::numeric_limits<double>::infinity();
  for (int budget : budgets) {
    for (FPriority f_priority : f_priorities) {
      for (WPolicy policy : {WPolicy::Fit, WPolicy::MemoryFirst, WPolicy::Eager}) {
        for (BPreference prefer : prefers) {
          for (int keep : keeps) {
            if (best_time <= bound * (1 + 1e-9)) break;
            auto orders = v_list_schedule(p, m, budget, cost, costs.transfer(), policy, prefer,
                                          keep, f_priority);
            if (orders.empty()) continue;  // this variant ran out of room
            const double t =
                makespan(p, 2, Placement::V, m, 2 * limit, orders, cost, costs.transfer());
            if (t < best_time) {
              best_time = t;
              best = std::move(orders);
            }
          }
        }
      }
    }
  }
  if (best.empty())
    throw Error(name + ": no candidate order fits the memory limit (internal error)");
  return schedule_from_orders(ScheduleKind::ZbV, p, m, 2, true, std::move(best), action_cost);
}

}  // namespace triad::pipeline
