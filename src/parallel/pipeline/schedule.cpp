#include "triad/parallel/pipeline/schedule.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "triad/core/error.h"
#include "triad/parallel/pipeline/simulator.h"
#include "triad/parallel/pipeline/zero_bubble.h"

namespace triad::pipeline {
namespace {

using Order = std::vector<Action>;  // compute actions only

Action F(int chunk, int mb) {
  return Action::make_compute(ComputeKind::Forward, chunk, mb);
}
Action B(int chunk, int mb) {
  return Action::make_compute(ComputeKind::Backward, chunk, mb);
}

Order gpipe_order(int m) {
  Order o;
  for (int i = 0; i < m; ++i) o.push_back(F(0, i));
  for (int i = 0; i < m; ++i) o.push_back(B(0, i));
  return o;
}

Order one_f_one_b_order(int p, int m, int r) {
  Order o;
  const int warmup = std::min(p - r - 1, m);
  for (int i = 0; i < warmup; ++i) o.push_back(F(0, i));
  for (int i = 0; i < m - warmup; ++i) {
    o.push_back(F(0, warmup + i));
    o.push_back(B(0, i));
  }
  for (int i = m - warmup; i < m; ++i) o.push_back(B(0, i));
  return o;
}

// Megatron-LM's interleaved 1F1B: microbatches in groups of p, each group
// through chunk 0, then chunk 1, ...; backward takes the same order with the
// chunks reversed. Rank r warms up with 2(p - r - 1) + (v - 1)p forwards
// (all of them when one group fills the pipeline), then alternates F and B.
// When p does not divide m, the order is the one for m rounded up to a
// multiple of p with the missing microbatches' actions left out: every
// dependency of what remains was there in that valid order, and each rank
// runs its remaining actions in the same relative order, so nothing can
// wait forever (a short last group just leaves its slots empty).
Order interleaved_order(int p, int m, int v, int r) {
  const int padded = (m + p - 1) / p * p;
  const int total = padded * v;
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto fwd_chunk = [&](int k) { return (k / p) % v; };
  auto bwd_chunk = [&](int k) { return v - 1 - (k / p) % v; };
  const int warmup = padded == p ? total : std::min((p - r - 1) * 2 + (v - 1) * p, total);
  Order o;
  auto f = [&](int k) {
    if (mb_of(k) < m) o.push_back(F(fwd_chunk(k), mb_of(k)));
  };
  auto b = [&](int k) {
    if (mb_of(k) < m) o.push_back(B(bwd_chunk(k), mb_of(k)));
  };
  for (int k = 0; k < warmup; ++k) f(k);
  for (int k = 0; k < total - warmup; ++k) {
    f(warmup + k);
    b(k);
  }
  for (int k = total - warmup; k < total; ++k) b(k);
  return o;
}

// ZB-H1 (Qi et al. 2023): rank r runs p-r-1 warm-up forwards; then r
// rounds of F, B with the weight pass W held back; then F, B, W rounds while
// forwards remain; then B, W rounds; then the r held-back W passes. Rank r
// thus keeps at most p-r microbatches between F and B (1F1B's bound) plus r
// between B and W, whose weight-gradient inputs are a fraction of a full
// activation: peak activation memory stays that of 1F1B's first rank, and the
// held-back W passes fill the cool-down bubble.
std::vector<Order> zb_h1_orders(int p, int m) {
  std::vector<Order> orders(p);
  for (int r = 0; r < p; ++r) {
    Order& o = orders[r];
    int f = 0, b = 0, w = 0;
    auto F_ = [&] { o.push_back(F(0, f++)); };
    auto B_ = [&] { o.push_back(Action::make_compute(ComputeKind::BackwardInput, 0, b++)); };
    auto W_ = [&] { o.push_back(Action::make_compute(ComputeKind::BackwardWeight, 0, w++)); };
    for (int i = 0; i < p - r - 1 && f < m; ++i) F_();
    for (int i = 0; i < r && f < m; ++i) {
      F_();
      B_();
    }
    while (f < m) {
      F_();
      B_();
      W_();
    }
    while (b < m) {
      B_();
      W_();
    }
    while (w < m) W_();
  }
  return orders;
}

void check_schedule(bool ok, const std::string& message) {
  if (!ok) throw ValueError(message);
}

// Times a set of per-rank compute orders on integer costs (F 1, B 2, B/W 1
// each) with free communication: each action starts when its rank is free and
// its inputs exist. Throws if the orders are inconsistent (would wait forever).
std::vector<std::vector<std::pair<double, double>>> time_orders(const Schedule& s,
                                                                const std::vector<Order>& orders,
                                                                const ActionCost& cost_of) {
  const int p = s.p, S = s.num_stages(), m = s.m;
  std::vector<std::vector<std::pair<double, double>>> when(p);
  for (int r = 0; r < p; ++r) when[r].resize(orders[r].size());
  const double unknown = -1;
  // Finish times by (stage, microbatch) of F and of the input-gradient pass.
  std::vector<std::vector<double>> f_end(S, std::vector<double>(m, unknown)), b_end = f_end;
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0);
  size_t left = 0;
  for (const auto& o : orders) left += o.size();
  while (left > 0) {
    bool progress = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < orders[r].size()) {
        const Action& a = orders[r][next[r]];
        const int st = s.stage_of(r, a.chunk), mb = a.microbatch;
        double ready = clock[r];
        bool ok = true;
        auto need = [&](double t) {
          if (t == unknown) ok = false;
          ready = std::max(ready, t);
        };
        if (a.compute == ComputeKind::Forward) {
          if (st > 0) need(f_end[st - 1][mb]);
        } else if (a.compute == ComputeKind::BackwardWeight) {
          need(b_end[st][mb]);
        } else {
          need(f_end[st][mb]);
          if (st < S - 1) need(b_end[st + 1][mb]);
        }
        if (!ok) break;
        const double cost = cost_of                              ? cost_of(r, a)
                            : a.compute == ComputeKind::Backward ? 2.0
                                                                 : 1.0;
        if (!(cost > 0))
          throw ValueError(std::string(schedule_name(s.kind)) + ": the cost of " + a.str() +
                           " on rank " + std::to_string(r) + " (" + std::to_string(cost) +
                           ") must be > 0");
        when[r][next[r]] = {ready, ready + cost};
        clock[r] = ready + cost;
        if (a.compute == ComputeKind::Forward) f_end[st][mb] = clock[r];
        if (a.compute == ComputeKind::Backward || a.compute == ComputeKind::BackwardInput)
          b_end[st][mb] = clock[r];
        ++next[r];
        --left;
        progress = true;
      }
    }
    if (!progress)
      throw Error(std::string(schedule_name(s.kind)) +
                  ": compute orders are inconsistent (they would wait forever)");
  }
  return when;
}

// Adds the point-to-point batches. Every message gets a round: the time its
// producer finishes in time_orders(). Each rank posts all its operations of
// one round as one batch, rounds in increasing order, sends after their
// producer and receives before their consumer. Then the smallest unfinished
// round always has every participant posted, so the lists cannot deadlock
// under blocking (rendezvous) semantics.
std::vector<std::vector<Action>> with_p2p(const Schedule& s, const std::vector<Order>& orders,
                                          const ActionCost& cost) {
  const int p = s.p, S = s.num_stages();
  const auto when = time_orders(s, orders, cost);
  // Per rank: (round, op), in the order found; sorted stably below.
  std::vector<std::vector<std::pair<double, P2POp>>> rounds(p);
  for (int r = 0; r < p; ++r) {
    for (size_t i = 0; i < orders[r].size(); ++i) {
      const Action& a = orders[r][i];
      const int st = s.stage_of(r, a.chunk);
      const double t = when[r][i].second;
      const bool input_grad =
          a.compute == ComputeKind::Backward || a.compute == ComputeKind::BackwardInput;
      if (a.compute == ComputeKind::Forward && st < S - 1 && s.rank_of(st + 1) != r) {
        const int q = s.rank_of(st + 1);
        rounds[r].push_back({t, {true, Payload::Activation, st, a.microbatch, q}});
        rounds[q].push_back({t, {false, Payload::Activation, st, a.microbatch, r}});
      }
      if (input_grad && st > 0 && s.rank_of(st - 1) != r) {
        const int q = s.rank_of(st - 1);
        rounds[r].push_back({t, {true, Payload::Gradient, st, a.microbatch, q}});
        rounds[q].push_back({t, {false, Payload::Gradient, st, a.microbatch, r}});
      }
    }
  }
  std::vector<std::vector<Action>> lists(p);
  for (int r = 0; r < p; ++r) {
    auto& mine = rounds[r];
    std::stable_sort(mine.begin(), mine.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    size_t next = 0;
    auto flush_until = [&](double t) {  // one batch per round <= t
      while (next < mine.size() && mine[next].first <= t) {
        Action batch;
        batch.type = Action::Type::P2P;
        const double round = mine[next].first;
        for (; next < mine.size() && mine[next].first == round; ++next)
          batch.ops.push_back(mine[next].second);
        lists[r].push_back(std::move(batch));
      }
    };
    for (size_t i = 0; i < orders[r].size(); ++i) {
      flush_until(when[r][i].first);
      lists[r].push_back(orders[r][i]);
    }
    flush_until(std::numeric_limits<double>::infinity());
  }
  return lists;
}

}  // namespace

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return "gpipe";
    case ScheduleKind::OneFOneB:
      return "1f1b";
    case ScheduleKind::Interleaved:
      return "interleaved";
    case ScheduleKind::ZbH1:
      return "zb-h1";
    case ScheduleKind::ZbAuto:
      return "zb-auto";
    case ScheduleKind::ZbV:
      return "zb-v";
  }
  return "?";
}

Placement placement_of(ScheduleKind kind) {
  return kind == ScheduleKind::ZbV ? Placement::V : Placement::Loop;
}

int stage_at(Placement placement, int p, int rank, int chunk) {
  if (placement == Placement::V) return chunk == 0 ? rank : 2 * p - 1 - rank;
  return chunk * p + rank;
}

int rank_at(Placement placement, int p, int stage) {
  if (placement == Placement::V) return stage < p ? stage : 2 * p - 1 - stage;
  return stage % p;
}

ScheduleKind schedule_from_name(const std::string& name) {
  for (auto k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved,
                 ScheduleKind::ZbH1, ScheduleKind::ZbAuto, ScheduleKind::ZbV}) {
    if (name == schedule_name(k)) return k;
  }
  throw ValueError("unknown pipeline schedule '" + name +
                   "' (expected gpipe, 1f1b, interleaved, zb-h1, zb-auto or zb-v)");
}

std::string Action::str() const {
  if (type == Type::Compute) {
    const char* k = compute == ComputeKind::Forward         ? "F"
                    : compute == ComputeKind::Backward      ? "B"
                    : compute == ComputeKind::BackwardInput ? "BI"
                                                            : "W";
    return std::string(k) + "(c" + std::to_string(chunk) + ",m" + std::to_string(microbatch) + ")";
  }
  std::string s = "P2P[";
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& o = ops[i];
    if (i) s += ", ";
    s += std::string(o.is_send ? "send " : "recv ") +
         (o.payload == Payload::Activation ? "act" : "grad") + " s" + std::to_string(o.stage) +
         " m" + std::to_string(o.microbatch) + (o.is_send ? " -> " : " <- ") +
         std::to_string(o.peer);
  }
  return s + "]";
}

namespace {

void check_numbers(ScheduleKind kind, int p, int m, int v) {
  const std::string name = schedule_name(kind);
  check_schedule(p >= 1, name + ": pipeline ranks p (" + std::to_string(p) + ") must be >= 1");
  check_schedule(m >= 1, name + ": microbatches m (" + std::to_string(m) + ") must be >= 1");
  check_schedule(v >= 1, name + ": chunks per rank v (" + std::to_string(v) + ") must be >= 1");
  if (kind == ScheduleKind::Interleaved) {
    check_schedule(v >= 2, "interleaved: chunks per rank v (" + std::to_string(v) +
                               ") must be >= 2 (use 1f1b for one chunk)");
  } else if (kind == ScheduleKind::ZbV) {
    check_schedule(v == 2, "zb-v: chunks per rank v (" + std::to_string(v) +
                               ") must be 2 (the V places two chunks on every rank)");
  } else {
    check_schedule(v == 1, name + ": chunks per rank v (" + std::to_string(v) +
                               ") must be 1 (only interleaved and zb-v use v > 1)");
  }
}

}  // namespace

std::vector<std::vector<Action>> compute_orders(ScheduleKind kind, int p, int m, int v) {
  check_numbers(kind, p, m, v);
  if (kind == ScheduleKind::ZbAuto || kind == ScheduleKind::ZbV) {
    std::vector<Order> orders(p);
    const Schedule s = make_schedule(kind, p, m, v);
    for (int r = 0; r < p; ++r) {
      for (const Action& a : s.ranks[r]) {
        if (a.is_compute()) orders[r].push_back(a);
      }
    }
    return orders;
  }
  std::vector<Order> orders(p);
  if (kind == ScheduleKind::ZbH1) {
    orders = zb_h1_orders(p, m);
  } else {
    for (int r = 0; r < p; ++r) {
      orders[r] = kind == ScheduleKind::GPipe      ? gpipe_order(m)
                  : kind == ScheduleKind::OneFOneB ? one_f_one_b_order(p, m, r)
                                                   : interleaved_order(p, m, v, r);
    }
  }
  return orders;
}

Schedule make_schedule(ScheduleKind kind, int p, int m, int v) {
  if (kind == ScheduleKind::ZbAuto) {
    check_numbers(kind, p, m, v);
    return make_zero_bubble_schedule(p, m, Costs{});  // F, B and W of 1 each
  }
  if (kind == ScheduleKind::ZbV) {
    check_numbers(kind, p, m, v);
    return make_zero_bubble_v_schedule(p, m, Costs{});
  }
  return schedule_from_orders(kind, p, m, v, kind == ScheduleKind::ZbH1,
                              compute_orders(kind, p, m, v));
}

Schedule schedule_from_orders(ScheduleKind kind, int p, int m, int v, bool split_backward,
                              std::vector<std::vector<Action>> orders, const ActionCost& cost) {
  if (static_cast<int>(orders.size()) != p) {
    throw ValueError(std::string(schedule_name(kind)) + ": " + std::to_string(orders.size()) +
                     " rank orders for p = " + std::to_string(p));
  }
  Schedule s;
  s.kind = kind;
  s.p = p;
  s.m = m;
  s.v = v;
  s.split_backward = split_backward;
  s.ranks = with_p2p(s, orders, cost);
  return s;
}

Validation validate(const Schedule& s) {
  auto fail = [](const std::string& e) { return Validation{false, e}; };
  const int S = s.num_stages();
  if (static_cast<int>(s.ranks.size()) != s.p)
    return fail("schedule has " + std::to_string(s.ranks.size()) +
                " rank lists, expected p = " + std::to_string(s.p));
  using Key = std::tuple<int, int>;                 // (stage, microbatch)
  std::map<std::tuple<int, int, int>, int> counts;  // (kind, stage, mb)
  // Sends and receives: (from, to, payload, stage, mb).
  std::multiset<std::tuple<int, int, int, int, int>> sends, recvs;
  for (int r = 0; r < s.p; ++r) {
    std::set<Key> forwarded, input_grad_done, weight_grad_done;
    std::set<std::tuple<int, int, int>> received;  // (payload, stage, mb)
    for (const Action& a : s.ranks[r]) {
      if (!a.is_compute()) {
        for (const P2POp& o : a.ops) {
          if (o.peer < 0 || o.peer >= s.p || o.peer == r)
            return fail("rank " + std::to_string(r) + ": " + a.str() + " has an invalid peer");
          if (o.is_send) {
            const bool have = o.payload == Payload::Activation
                                  ? forwarded.count({o.stage, o.microbatch})
                                  : input_grad_done.count({o.stage, o.microbatch});
            if (!have)
              return fail("rank " + std::to_string(r) + ": " + a.str() +
                          " sends a payload it has not produced yet");
            sends.insert({r, o.peer, static_cast<int>(o.payload), o.stage, o.microbatch});
          } else {
            recvs.insert({o.peer, r, static_cast<int>(o.payload), o.stage, o.microbatch});
            received.insert({static_cast<int>(o.payload), o.stage, o.microbatch});
          }
        }
        continue;
      }
      if (a.chunk < 0 || a.chunk >= s.v || a.microbatch < 0 || a.microbatch >= s.m) {
        return fail("rank " + std::to_string(r) + ": " + a.str() + " is out of range");
      }
      const int stage = s.stage_of(r, a.chunk);
      const Key key{stage, a.microbatch};
      ++counts[{static_cast<int>(a.compute), stage, a.microbatch}];
      auto have_input = [&](Payload pl, int from_stage, const std::set<Key>& local) {
        if (s.rank_of(from_stage) == r) return local.count({from_stage, a.microbatch}) > 0;
        return received.count({static_cast<int>(pl), from_stage, a.microbatch}) > 0;
      };
      switch (a.compute) {
        case ComputeKind::Forward:
          if (stage > 0 && !have_input(Payload::Activation, stage - 1, forwarded)) {
            return fail("rank " + std::to_string(r) + ": " + a.str() +
                        " runs before its input activation arrived");
          }
          forwarded.insert(key);
          break;
        case ComputeKind::Backward:
        case ComputeKind::BackwardInput:
          if (!forwarded.count(key))
            return fail("rank " + std::to_string(r) + ": " + a.str() + " runs before its forward");
          if (stage < S - 1 && !have_input(Payload::Gradient, stage + 1, input_grad_done)) {
            return fail("rank " + std::to_string(r) + ": " + a.str() +
                        " runs before its output gradient arrived");
          }
          input_grad_done.insert(key);
          break;
        case ComputeKind::BackwardWeight:
          if (!input_grad_done.count(key))
            return fail("rank " + std::to_string(r) + ": " + a.str() +
                        " runs before its input-gradient pass");
          weight_grad_done.insert(key);
          break;
      }
    }
  }
  for (int st = 0; st < S; ++st) {
    for (int mb = 0; mb < s.m; ++mb) {
      auto count = [&](ComputeKind k) {
        auto it = counts.find({static_cast<int>(k), st, mb});
        return it == counts.end() ? 0 : it->second;
      };
      const std::string where = "stage " + std::to_string(st) + " microbatch " + std::to_string(mb);
      if (count(ComputeKind::Forward) != 1)
        return fail(where + " is forwarded " + std::to_string(count(ComputeKind::Forward)) +
                    " times, expected once");
      if (s.split_backward) {
        if (count(ComputeKind::BackwardInput) != 1 || count(ComputeKind::BackwardWeight) != 1 ||
            count(ComputeKind::Backward) != 0) {
          return fail(where +
                      ": split schedules need exactly one B and one W and no full backward");
        }
      } else if (count(ComputeKind::Backward) != 1 ||
                 count(ComputeKind::BackwardInput) + count(ComputeKind::BackwardWeight) != 0) {
        return fail(where + " is backwarded " + std::to_string(count(ComputeKind::Backward)) +
                    " times, expected once");
      }
    }
  }
  if (sends != recvs) return fail("sends and receives do not pair up one to one");
  for (const auto& snd : sends) {
    if (sends.count(snd) != 1) return fail("a payload is sent more than once");
  }
  try {
    Costs unit;
    simulate(s, unit, P2PSemantics::Blocking);
  } catch (const ValueError& e) {
    return fail(e.what());
  }
  return {};
}

}  // namespace triad::pipeline
