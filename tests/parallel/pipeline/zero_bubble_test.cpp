#include "triad/parallel/pipeline/zero_bubble.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "triad/core/error.h"

namespace triad::pipeline {
namespace {

Costs split_costs(double f, double b, double w, double transfer = 0.0) {
  Costs c;
  c.forward = {f};
  c.backward_input = {b};
  c.backward_weight = {w};
  c.backward = {b + w};
  c.p2p_latency = transfer;
  return c;
}

// The costs of a real pipeline: the first stage carries the embedding, the
// last the output head and the loss (its F, B and W all heavier).
Costs head_heavy(int p) {
  Costs c = split_costs(1.0, 1.3, 0.6);
  c.forward.assign(p, 1.0);
  c.backward_input.assign(p, 1.3);
  c.backward_weight.assign(p, 0.6);
  c.forward.back() += 0.5;
  c.backward_input.back() += 0.7;
  c.backward_weight.back() += 0.4;
  c.forward.front() += 0.1;
  c.backward.resize(p);
  for (int s = 0; s < p; ++s) c.backward[s] = c.backward_input[s] + c.backward_weight[s];
  return c;
}

double makespan(const Schedule& s, const Costs& c) { return simulate(s, c).makespan; }

TEST(ZeroBubble, ValidWithinMemoryInMicrobatchOrderAndNoSlowerThanTheHandWrittenOrders) {
  int checked = 0;
  for (int p : {1, 2, 3, 4, 8}) {
    std::vector<std::pair<std::string, Costs>> costs{{"equal", split_costs(1, 1, 1)},
                                                     {"short W", split_costs(1, 1.75, 0.25)},
                                                     {"long W", split_costs(1, 0.8, 1.6)},
                                                     {"transfer", split_costs(1, 1.5, 0.5, 0.2)},
                                                     {"head", head_heavy(p)}};
    for (int m : {1, 2, 3, 5, 8, 17}) {
      for (const auto& [what, c] : costs) {
        for (int limit : {0, 1, 2 * p - 1}) {
          const std::string at = what + " p=" + std::to_string(p) + " m=" + std::to_string(m) +
                                 " limit=" + std::to_string(limit);
          const Schedule s = make_zero_bubble_schedule(p, m, c, {limit});
          EXPECT_EQ(s.kind, ScheduleKind::ZbAuto);
          EXPECT_TRUE(s.split_backward);
          const Validation v = validate(s);
          ASSERT_TRUE(v.ok) << at << ": " << v.error;
          // Rendezvous sends with the real costs cannot deadlock either.
          EXPECT_NO_THROW(simulate(s, c, P2PSemantics::Blocking)) << at;
          // F, B and W each in microbatch order: gradients accumulate as in 1F1B.
          for (int r = 0; r < p; ++r) {
            int next[4] = {0, 0, 0, 0};
            for (const Action& a : s.ranks[r]) {
              if (!a.is_compute()) continue;
              EXPECT_EQ(a.microbatch, next[static_cast<int>(a.compute)]++) << at << " " << a.str();
            }
          }
          const SimulationResult sim = simulate(s, c);
          const int budget = limit == 0 ? p : limit;
          for (int r = 0; r < p; ++r) EXPECT_LE(sim.peak_held[r], budget) << at << " rank " << r;
          if (budget >= p) {
            // 1F1B's full backward costs B + W summed once: equal up to rounding.
            const double slack = 1e-12 * sim.makespan;
            EXPECT_LE(sim.makespan, makespan(make_schedule(ScheduleKind::ZbH1, p, m), c)) << at;
            EXPECT_LE(sim.makespan,
                      makespan(make_schedule(ScheduleKind::OneFOneB, p, m), c) + slack)
                << at;
            EXPECT_LE(sim.makespan, makespan(make_zero_bubble_schedule(p, m, c), c)) << at;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 5 * 6 * 5 * 3);
}

TEST(ZeroBubble, EqualCostsReachTheLowerBound) {
  // The last rank cannot start before (p-1) forwards have passed and then
  // has m (F + B + W) of work: (p-1) / (3m) is the least bubble any order
  // achieves with these costs. ZB-H1 reaches it; so must the search.
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      const Costs c = split_costs(1, 1, 1);
      EXPECT_NEAR(simulate(make_zero_bubble_schedule(p, m, c), c).bubble_fraction,
                  (p - 1) / (3.0 * m), 1e-12)
          << "p=" << p << " m=" << m;
    }
  }
}

TEST(ZeroBubble, AShortWeightPassBeatsBothHandWrittenOrders) {
  // W a seventh of B (what the tiny model of docs/benchmarks.md measures):
  // ZB-H1's fixed order stalls, and 1F1B leaves its cool-down bubble.
  const Costs c = split_costs(1, 1.75, 0.25);
  for (auto [p, m] : {std::pair{2, 8}, std::pair{4, 16}, std::pair{8, 32}}) {
    const double zb = simulate(make_schedule(ScheduleKind::ZbH1, p, m), c).bubble_fraction;
    const double ofob = simulate(make_schedule(ScheduleKind::OneFOneB, p, m), c).bubble_fraction;
    const double a = simulate(make_zero_bubble_schedule(p, m, c), c).bubble_fraction;
    EXPECT_LT(a, 0.9 * ofob) << "p=" << p << " m=" << m;
    EXPECT_LT(a, 0.6 * zb) << "p=" << p << " m=" << m;
    // ZB-H2's budget (2p - 1 microbatches) buys a little more.
    const double a2 = simulate(make_zero_bubble_schedule(p, m, c, {2 * p - 1}), c).bubble_fraction;
    EXPECT_LT(a2, a) << "p=" << p << " m=" << m;
  }
}

TEST(ZeroBubble, OneMicrobatchInFlightRunsThePipelineSerially) {
  // With room for one microbatch a rank finishes it (F, B, W) before the
  // next: the pipeline degenerates to one microbatch at a time.
  const Costs c = split_costs(1, 1, 1);
  const int p = 3, m = 4;
  const Schedule s = make_zero_bubble_schedule(p, m, c, {1});
  const SimulationResult sim = simulate(s, c);
  for (int r = 0; r < p; ++r) EXPECT_EQ(sim.peak_held[r], 1);
  EXPECT_GT(sim.makespan, makespan(make_zero_bubble_schedule(p, m, c), c));
}

TEST(ZeroBubble, MakeScheduleBuildsItForEqualCosts) {
  EXPECT_EQ(schedule_from_name("zb-auto"), ScheduleKind::ZbAuto);
  EXPECT_STREQ(schedule_name(ScheduleKind::ZbAuto), "zb-auto");
  const Schedule a = make_schedule(ScheduleKind::ZbAuto, 4, 8);
  const Schedule b = make_zero_bubble_schedule(4, 8, split_costs(1, 1, 1));
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    ASSERT_EQ(a.ranks[r].size(), b.ranks[r].size());
    for (size_t i = 0; i < a.ranks[r].size(); ++i) EXPECT_EQ(a.ranks[r][i].str(), b.ranks[r][i].str());
  }
  try {
    make_schedule(ScheduleKind::ZbAuto, 2, 4, 2);
    FAIL() << "v = 2 accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("v (2) must be 1"), std::string::npos) << e.what();
  }
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    FAIL() << "no error; expected one containing '" << needle << "'";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ZeroBubble, BadInputIsNamed) {
  const Costs c = split_costs(1, 1, 1);
  expect_error([&] { make_zero_bubble_schedule(0, 4, c); }, "p (0) must be >= 1");
  expect_error([&] { make_zero_bubble_schedule(2, 0, c); }, "m (0) must be >= 1");
  expect_error([&] { make_zero_bubble_schedule(2, 4, c, {-1}); }, "max_in_flight (-1)");
  expect_error([&] { make_zero_bubble_schedule(2, 4, split_costs(1, 0, 1)); },
               "backward_input cost of stage 0 (0.000000) must be a finite number > 0");
  Costs three = c;
  three.forward = {1, 1, 1};
  expect_error([&] { make_zero_bubble_schedule(2, 4, three); },
               "forward has 3 entries; expected 1 (every stage), v = 1 (one per chunk) or p*v = 2");
  Costs per_stage = c;
  per_stage.backward_weight = {1, -2};
  expect_error([&] { make_zero_bubble_schedule(2, 4, per_stage); },
               "backward_weight cost of stage 1 (-2.000000)");
}

}  // namespace
}  // namespace triad::pipeline
