#include "triad/parallel/pipeline/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <sstream>

#include "triad/core/error.h"
#include "triad/parallel/pipeline/simulator.h"

namespace triad::pipeline {
namespace {

struct Grid {
  ScheduleKind kind;
  int p, v, m;
};

std::vector<Grid> grid() {
  std::vector<Grid> g;
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 5, 7, 8, 12, 16, 17}) {
      g.push_back({ScheduleKind::GPipe, p, 1, m});
      g.push_back({ScheduleKind::OneFOneB, p, 1, m});
      g.push_back({ScheduleKind::ZbH1, p, 1, m});
      for (int v : {2, 3, 4}) g.push_back({ScheduleKind::Interleaved, p, v, m});
    }
  }
  return g;
}

TEST(Schedule, EveryGeneratorOverTheGridIsValidAndDeadlockFree) {
  int checked = 0;
  for (const Grid& c : grid()) {
    Schedule s = make_schedule(c.kind, c.p, c.m, c.v);
    Validation v = validate(s);
    ASSERT_TRUE(v.ok) << schedule_name(c.kind) << " p=" << c.p << " v=" << c.v << " m=" << c.m
                      << ": " << v.error;
    ++checked;
  }
  EXPECT_GT(checked, 200);
}

TEST(Schedule, OneFOneBWarmupIsMinOfPMinusRMinusOneAndM) {
  for (int p : {2, 4}) {
    for (int m : {1, 3, 8}) {
      Schedule s = make_schedule(ScheduleKind::OneFOneB, p, m);
      for (int r = 0; r < p; ++r) {
        int warm = 0;
        for (const Action& a : s.ranks[r]) {
          if (!a.is_compute()) continue;
          if (a.compute != ComputeKind::Forward) break;
          ++warm;
        }
        // The warm-up forwards, plus the first steady-state forward when any remain.
        const int expect = std::min(p - r - 1, m);
        EXPECT_EQ(warm, expect + (m > expect ? 1 : 0)) << "p=" << p << " m=" << m << " r=" << r;
      }
    }
  }
}

TEST(Schedule, InterleavedPlacesChunkCOfRankROnStageCpPlusR) {
  Schedule s = make_schedule(ScheduleKind::Interleaved, 4, 8, 2);
  EXPECT_EQ(s.num_stages(), 8);
  EXPECT_EQ(s.stage_of(1, 1), 5);
  EXPECT_EQ(s.rank_of(6), 2);
  // Rank 0 starts with microbatches 0..3 on chunk 0, then 0..3 on chunk 1.
  std::vector<std::pair<int, int>> first;
  for (const Action& a : s.ranks[0]) {
    if (a.is_compute() && first.size() < 8) first.push_back({a.chunk, a.microbatch});
  }
  std::vector<std::pair<int, int>> expect{{0, 0}, {0, 1}, {0, 2}, {0, 3},
                                          {1, 0}, {1, 1}, {1, 2}, {1, 3}};
  EXPECT_EQ(first, expect);
}

TEST(Schedule, ConstraintsAreClearErrors) {
  auto expect_error = [](auto fn, const std::string& fragment) {
    try {
      fn();
      FAIL() << "expected ValueError with '" << fragment << "'";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error([] { make_schedule(ScheduleKind::Interleaved, 4, 8, 1); }, "v (1) must be >= 2");
  expect_error([] { make_schedule(ScheduleKind::OneFOneB, 4, 8, 2); },
               "only interleaved and zb-v use v > 1");
  expect_error([] { make_schedule(ScheduleKind::GPipe, 0, 8); }, "p (0) must be >= 1");
  expect_error([] { make_schedule(ScheduleKind::ZbH1, 2, 0); }, "m (0) must be >= 1");
  expect_error([] { schedule_from_name("pipedream"); },
               "expected gpipe, 1f1b, interleaved, zb-h1, zb-auto or zb-v");
  EXPECT_EQ(schedule_from_name("zb-h1"), ScheduleKind::ZbH1);
}

TEST(Schedule, ValidatorCatchesBrokenSchedules) {
  Schedule s = make_schedule(ScheduleKind::OneFOneB, 2, 4);
  Schedule dropped = s;
  for (auto it = dropped.ranks[1].begin(); it != dropped.ranks[1].end(); ++it) {
    if (it->is_compute() && it->compute == ComputeKind::Backward) {
      dropped.ranks[1].erase(it);
      break;
    }
  }
  EXPECT_FALSE(validate(dropped).ok);
  // Swap rank 1's first receive and the forward that needs it.
  Schedule early = s;
  std::swap(early.ranks[1][0], early.ranks[1][1]);
  Validation v = validate(early);
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.error.find("before its input activation"), std::string::npos) << v.error;
  // Two ranks that both receive before they send deadlock.
  Schedule dead = s;
  for (auto& rank : dead.ranks) {
    for (auto& a : rank) {
      if (!a.is_compute()) {
        std::stable_partition(a.ops.begin(), a.ops.end(),
                              [](const P2POp& o) { return !o.is_send; });
      }
    }
  }
  // Split every batch into receive-only then send-only batches on rank 0 and the reverse order on
  // rank 1.
  Schedule split = s;
  for (int r = 0; r < 2; ++r) {
    std::vector<Action> out;
    for (const Action& a : split.ranks[r]) {
      if (a.is_compute() || a.ops.size() < 2) {
        out.push_back(a);
        continue;
      }
      Action recv = a, send = a;
      recv.ops.clear();
      send.ops.clear();
      for (const P2POp& o : a.ops) (o.is_send ? send : recv).ops.push_back(o);
      out.push_back(recv);  // both ranks wait to receive first
      out.push_back(send);
    }
    split.ranks[r] = out;
  }
  Validation d = validate(split);
  EXPECT_FALSE(d.ok);
  EXPECT_NE(d.error.find("deadlocks"), std::string::npos) << d.error;
}

Costs equal_costs(bool split) {
  Costs c;
  c.forward = {1.0};
  c.backward = {2.0};
  c.backward_input = {1.0};
  c.backward_weight = {1.0};
  (void)split;
  return c;
}

TEST(Simulator, BubbleMatchesTheoryWithEqualCostsAndFreeCommunication) {
  for (int p : {2, 4, 8}) {
    for (int m : {8, 16, 32}) {
      const double theory = static_cast<double>(p - 1) / m;
      auto g = simulate(make_schedule(ScheduleKind::GPipe, p, m), equal_costs(false));
      auto o = simulate(make_schedule(ScheduleKind::OneFOneB, p, m), equal_costs(false));
      EXPECT_NEAR(g.bubble_fraction, theory, 1e-12) << "gpipe p=" << p << " m=" << m;
      EXPECT_NEAR(o.bubble_fraction, theory, 1e-12) << "1f1b p=" << p << " m=" << m;
      EXPECT_EQ(g.peak_alive[0], m);
      EXPECT_LE(o.peak_alive[0], p);
      for (int r = 0; r < p; ++r) EXPECT_LE(o.peak_alive[r], std::min(p - r, m));
      for (int v : {2, 4}) {
        if (m % p != 0) continue;
        auto i = simulate(make_schedule(ScheduleKind::Interleaved, p, m, v), equal_costs(false));
        EXPECT_NEAR(i.bubble_fraction, theory / v, 1e-12)
            << "interleaved p=" << p << " v=" << v << " m=" << m;
      }
      auto z = simulate(make_schedule(ScheduleKind::ZbH1, p, m), equal_costs(true));
      EXPECT_LE(z.bubble_fraction, 0.4 * o.bubble_fraction) << "zb-h1 p=" << p << " m=" << m;
      // ZB-H1's theory with t_F = t_B = t_W: (p-1)(t_F + t_B - t_W) of idle.
      EXPECT_NEAR(z.bubble_fraction, (p - 1) / (3.0 * m), 1e-12) << "zb-h1 p=" << p << " m=" << m;
      for (int r = 0; r < p; ++r) {
        // Full activations (F..B) within 1F1B's bound on every rank, and with
        // the W-pending inputs never more than 1F1B's first rank holds.
        EXPECT_LE(z.peak_alive[r], o.peak_alive[r]) << "zb-h1 memory, rank " << r;
        EXPECT_LE(z.peak_held[r], o.peak_alive[0]) << "zb-h1 memory, rank " << r;
      }
      // Blocking (rendezvous) sends may only make things slower.
      auto ob = simulate(make_schedule(ScheduleKind::OneFOneB, p, m), equal_costs(false),
                         P2PSemantics::Blocking);
      EXPECT_GE(ob.makespan, o.makespan);
    }
  }
}

// When p does not divide m the interleaved order is the padded one's with the
// missing microbatches left out (a batch-size ramp, or a global batch that
// does not split into whole groups of p): valid, and never slower than 1F1B
// on the same model (each of the v chunks a v-th of a stage), within at
// most one extra group's worth of activations.
TEST(Simulator, InterleavedTakesAnyNumberOfMicrobatchesAndNeverLosesTo1F1B) {
  int checked = 0;
  for (int p : {2, 3, 4, 8}) {
    for (int v : {2, 3, 4}) {
      Costs chunk;
      chunk.forward = {1.0 / v};
      chunk.backward = {2.0 / v};
      for (int m = 1; m <= 19; ++m) {
        if (m % p == 0) continue;
        const std::string at =
            "p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m);
        const Schedule s = make_schedule(ScheduleKind::Interleaved, p, m, v);
        const Validation ok = validate(s);
        ASSERT_TRUE(ok.ok) << at << ": " << ok.error;
        const SimulationResult i = simulate(s, chunk);
        const SimulationResult o =
            simulate(make_schedule(ScheduleKind::OneFOneB, p, m), equal_costs(false));
        EXPECT_LE(i.makespan, o.makespan + 1e-9) << at;
        // Chunk activations on rank 0: those of the padded order at most.
        const int padded = (m + p - 1) / p * p;
        const SimulationResult full =
            simulate(make_schedule(ScheduleKind::Interleaved, p, padded, v), chunk);
        EXPECT_LE(i.peak_alive[0], full.peak_alive[0]) << at;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 150);
}

TEST(Simulator, CommunicationCostStretchesThePipeline) {
  Costs c = equal_costs(false);
  auto free_comm = simulate(make_schedule(ScheduleKind::OneFOneB, 4, 8), c);
  c.p2p_latency = 0.1;
  c.message_bytes = 1e6;
  c.p2p_bandwidth = 1e7;  // 0.1 per message
  auto slow = simulate(make_schedule(ScheduleKind::OneFOneB, 4, 8), c);
  EXPECT_GT(slow.makespan,
            free_comm.makespan + 6 * 0.2 - 1e-9);  // at least the fill and drain hops
  EXPECT_GT(slow.bubble_fraction, free_comm.bubble_fraction);
}

// A negative or non-finite time, size or bandwidth is refused by name, for
// every way of waiting: the timeline it would give means nothing (a negative
// forward once gave a 75% "bubble").
TEST(Simulator, NegativeOrNonFiniteCostsAreRefused) {
  const Schedule s = make_schedule(ScheduleKind::OneFOneB, 2, 4);
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::function<void(Costs&)> spoil;
    std::string named;
  };
  const std::vector<Case> cases{
      {[](Costs& c) { c.forward = {-1}; }, "forward[0] (-1.000000) must be a finite number >= 0"},
      {[&](Costs& c) {
         c.backward = {2, nan};
       },
       "backward[1] (nan)"},
      {[](Costs& c) { c.backward_input = {-0.5}; }, "backward_input[0] (-0.500000)"},
      {[&](Costs& c) { c.backward_weight = {inf}; }, "backward_weight[0] (inf)"},
      {[](Costs& c) { c.p2p_latency = -1; }, "p2p_latency (-1.000000)"},
      {[](Costs& c) { c.p2p_bandwidth = -1e9; }, "p2p_bandwidth"},
      {[&](Costs& c) { c.message_bytes = nan; }, "message_bytes (nan)"},
  };
  for (const Case& k : cases) {
    Costs c;
    k.spoil(c);
    for (P2PSemantics w :
         {P2PSemantics::WaitAtConsumer, P2PSemantics::AsyncSends, P2PSemantics::Blocking,
          P2PSemantics::StreamOrdered, P2PSemantics::StreamPerPeer}) {
      try {
        simulate(s, c, w);
        ADD_FAILURE() << k.named << ": no error";
      } catch (const ValueError& e) {
        EXPECT_NE(std::string(e.what()).find("pipeline costs: " + k.named), std::string::npos)
            << e.what();
      }
    }
  }
  // Zero is a time (an empty stage, free communication).
  Costs zero;
  zero.forward = {0, 1};
  zero.p2p_latency = 0;
  EXPECT_NO_THROW(simulate(make_schedule(ScheduleKind::OneFOneB, 2, 4), zero));
}

// A rank's simulated timeline as text: "F0[0,2) wait[2,3) B0[3,5) W0[5,6) ".
std::string timeline_boxes(const SimulationResult& r, int rank) {
  std::ostringstream out;
  for (const TimelineEvent& e : r.timeline[static_cast<size_t>(rank)]) {
    if (e.compute) {
      out << (e.kind == ComputeKind::Forward          ? "F"
              : e.kind == ComputeKind::BackwardWeight ? "W"
                                                      : "B")
          << e.microbatch;
    } else {
      out << "wait";
    }
    out << "[" << e.start << "," << e.end << ") ";
  }
  return out.str();
}

// 1F1B on two ranks whose first stage's forward is twice the second's:
// rank 1 posts the receive of microbatch 1's activation before B of
// microbatch 0. Waited for where it is posted (AsyncSends, Blocking), rank 1
// idles from 3 to 4 until it arrives; Triad's executor waits where F of
// microbatch 1 consumes it, so B runs first and the step ends at 10, not 11.
TEST(Simulator, AReceiveIsWaitedForWhereItsPayloadIsConsumed) {
  const Schedule s = make_schedule(ScheduleKind::OneFOneB, 2, 2);
  ASSERT_EQ(s.ranks[1][2].str(), "P2P[recv act s0 m1 <- 0]");
  ASSERT_EQ(s.ranks[1][3].str(), "B(c0,m0)");
  Costs c;
  c.forward = {2.0, 1.0};
  c.backward = {2.0, 2.0};
  const SimulationResult at = simulate(s, c, P2PSemantics::WaitAtConsumer);
  const SimulationResult posted = simulate(s, c, P2PSemantics::AsyncSends);
  const SimulationResult blocking = simulate(s, c, P2PSemantics::Blocking);
  EXPECT_DOUBLE_EQ(at.makespan, 10.0);
  EXPECT_DOUBLE_EQ(posted.makespan, 11.0);
  EXPECT_DOUBLE_EQ(blocking.makespan, 11.0);
  EXPECT_EQ(timeline_boxes(at, 1), "wait[0,2) F0[2,3) B0[3,5) F1[5,6) B1[6,8) ");
  EXPECT_EQ(timeline_boxes(posted, 1), "wait[0,2) F0[2,3) wait[3,4) B0[4,6) F1[6,7) B1[7,9) ");
  EXPECT_EQ(timeline_boxes(at, 0), "F0[0,2) F1[2,4) wait[4,5) B0[5,7) wait[7,8) B1[8,10) ");
  EXPECT_DOUBLE_EQ(at.compute_time[1], posted.compute_time[1]);
}

// Two ranks, backward split; the last stage's batch that sends microbatch
// 0's gradient also receives microbatch 1's activation, which the first
// stage (forward 3, every other pass 1) sends only at 6. Waited for where
// it is posted (the executor on the host, whose MPI sends move on only
// inside its calls), rank 1 idles from 5 to 6; on a GPU the batch runs on
// the communication stream and F of microbatch 1 waits for it, so W of
// microbatch 0 fills that time and the step ends at 10, not 11.
TEST(Simulator, OnAStreamABatchThatAlsoSendsIsWaitedForByItsConsumer) {
  using K = ComputeKind;
  auto compute = [](K k, int mb) { return Action::make_compute(k, 0, mb); };
  auto batch = [](std::vector<P2POp> ops) {
    Action a;
    a.type = Action::Type::P2P;
    a.ops = std::move(ops);
    return a;
  };
  const P2POp send_a0{true, Payload::Activation, 0, 0, 1},
      send_a1{true, Payload::Activation, 0, 1, 1};
  const P2POp recv_a0{false, Payload::Activation, 0, 0, 0},
      recv_a1{false, Payload::Activation, 0, 1, 0};
  const P2POp send_g0{true, Payload::Gradient, 1, 0, 0}, send_g1{true, Payload::Gradient, 1, 1, 0};
  const P2POp recv_g0{false, Payload::Gradient, 1, 0, 1},
      recv_g1{false, Payload::Gradient, 1, 1, 1};
  Schedule s;
  s.kind = ScheduleKind::ZbH1;
  s.p = 2;
  s.m = 2;
  s.split_backward = true;
  s.ranks = {{compute(K::Forward, 0), batch({send_a0}), compute(K::Forward, 1), batch({send_a1}),
              batch({recv_g0}), compute(K::BackwardInput, 0), compute(K::BackwardWeight, 0),
              batch({recv_g1}), compute(K::BackwardInput, 1), compute(K::BackwardWeight, 1)},
             {batch({recv_a0}), compute(K::Forward, 0), compute(K::BackwardInput, 0),
              batch({send_g0, recv_a1}), compute(K::BackwardWeight, 0), compute(K::Forward, 1),
              compute(K::BackwardInput, 1), batch({send_g1}), compute(K::BackwardWeight, 1)}};
  const Validation v = validate(s);
  ASSERT_TRUE(v.ok) << v.error;
  Costs c;
  c.forward = {3.0, 1.0};
  c.backward_input = {1.0, 1.0};
  c.backward_weight = {1.0, 1.0};
  c.backward = {2.0, 2.0};
  const SimulationResult stream = simulate(s, c, P2PSemantics::StreamOrdered);
  const SimulationResult host = simulate(s, c, P2PSemantics::WaitAtConsumer);
  EXPECT_EQ(timeline_boxes(stream, 1),
            "wait[0,3) F0[3,4) B0[4,5) W0[5,6) F1[6,7) B1[7,8) W1[8,9) ");
  EXPECT_EQ(timeline_boxes(stream, 0), "F0[0,3) F1[3,6) B0[6,7) W0[7,8) B1[8,9) W1[9,10) ");
  EXPECT_DOUBLE_EQ(stream.makespan, 10.0);
  EXPECT_EQ(timeline_boxes(host, 1),
            "wait[0,3) F0[3,4) B0[4,5) wait[5,6) W0[6,7) F1[7,8) B1[8,9) W1[9,10) ");
  EXPECT_EQ(timeline_boxes(host, 0),
            "F0[0,3) F1[3,6) B0[6,7) W0[7,8) wait[8,9) B1[9,10) W1[10,11) ");
  EXPECT_DOUBLE_EQ(host.makespan, 11.0);
}

// A receive nothing consumes is an error under every rule: waited for
// where it is posted, or on a stream, it never arrives (a deadlock);
// deferred to a consumer that never comes, it is named at the end.
TEST(Simulator, AReceiveNothingConsumesIsAnError) {
  Schedule s = make_schedule(ScheduleKind::OneFOneB, 2, 2);
  Action stray;
  stray.type = Action::Type::P2P;
  stray.ops.push_back({false, Payload::Activation, 0, 5, 0});
  s.ranks[1].push_back(stray);
  try {
    simulate(s, Costs{}, P2PSemantics::WaitAtConsumer);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 receives a payload no action of it consumes"),
              std::string::npos)
        << e.what();
  }
  try {
    simulate(s, Costs{}, P2PSemantics::AsyncSends);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("deadlocks"), std::string::npos) << e.what();
  }
  // On a stream it never meets a send: the stream is named where it stops.
  try {
    simulate(s, Costs{}, P2PSemantics::StreamOrdered);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("deadlocks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1's stream runs P2P[recv act s0 m5 <- 0]"),
              std::string::npos)
        << e.what();
  }
}

// Waiting where the payload is consumed only lifts constraints: over every
// generator and uneven costs with and without transfer time, never slower
// than waiting where each batch is posted, which is never slower than
// rendezvous; the same compute, and no deadlock.
TEST(Simulator, WaitingAtTheConsumerIsNeverSlower) {
  int quicker = 0, stream_quicker = 0, peers_quicker = 0, cases = 0;
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved,
                            ScheduleKind::ZbH1, ScheduleKind::ZbV}) {
    const int v = kind == ScheduleKind::Interleaved || kind == ScheduleKind::ZbV ? 2 : 1;
    for (int p : {2, 3, 4}) {
      for (int m : {p, 2 * p + 1, 4 * p}) {
        if (kind == ScheduleKind::Interleaved && m % p != 0) continue;
        const Schedule s = make_schedule(kind, p, m, v);
        for (double transfer : {0.0, 0.3}) {
          Costs c;
          c.forward.clear();
          c.backward.clear();
          c.backward_input.clear();
          c.backward_weight.clear();
          for (int st = 0; st < p * v; ++st) {  // uneven stages: 1.0, 1.7, 1.4, 1.1, ...
            const double f = 1.0 + 0.1 * ((7 * st) % 10);
            c.forward.push_back(f);
            c.backward_input.push_back(1.3 * f);
            c.backward_weight.push_back(0.4 * f);
            c.backward.push_back(1.7 * f);
          }
          c.p2p_latency = transfer;
          const std::string at = std::string(schedule_name(kind)) + " p=" + std::to_string(p) +
                                 " m=" + std::to_string(m) +
                                 " transfer=" + std::to_string(transfer);
          const SimulationResult a = simulate(s, c, P2PSemantics::WaitAtConsumer);
          const SimulationResult b = simulate(s, c, P2PSemantics::AsyncSends);
          const SimulationResult r = simulate(s, c, P2PSemantics::Blocking);
          const SimulationResult st = simulate(s, c, P2PSemantics::StreamOrdered);
          const SimulationResult peers = simulate(s, c, P2PSemantics::StreamPerPeer);
          EXPECT_LE(a.makespan, b.makespan + 1e-9) << at;
          EXPECT_LE(b.makespan, r.makespan + 1e-9) << at;
          // On a stream the host never waits in a batch: never slower than
          // rendezvous, which holds the host there.
          EXPECT_LE(st.makespan, r.makespan + 1e-9) << at;
          // A stream per neighbour only lifts the order between neighbours.
          EXPECT_LE(peers.makespan, st.makespan + 1e-9) << at;
          for (int rank = 0; rank < p; ++rank) {
            EXPECT_NEAR(a.compute_time[rank], b.compute_time[rank], 1e-9) << at;
            EXPECT_NEAR(st.compute_time[rank], b.compute_time[rank], 1e-9) << at;
            EXPECT_NEAR(peers.compute_time[rank], b.compute_time[rank], 1e-9) << at;
          }
          EXPECT_EQ(a.peak_alive, b.peak_alive) << at;
          EXPECT_EQ(st.peak_alive, b.peak_alive) << at;
          EXPECT_EQ(st.peak_held, b.peak_held) << at;
          quicker += a.makespan < b.makespan - 1e-9;
          stream_quicker += st.makespan < r.makespan - 1e-9;
          peers_quicker += peers.makespan < st.makespan - 1e-9;
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 60);
  EXPECT_GT(quicker, cases / 4);
  EXPECT_GT(stream_quicker, cases / 4);
  EXPECT_GT(peers_quicker, 0);
  std::printf(
      "%d cases: waiting at the consumer quicker than where posted in %d, on a stream "
      "quicker than rendezvous in %d, on a stream per neighbour quicker than on one in %d\n",
      cases, quicker, stream_quicker, peers_quicker);
}

TEST(Simulator, PicturesDescribeTheTimeline) {
  Schedule s = make_schedule(ScheduleKind::Interleaved, 4, 8, 2);
  auto r = simulate(s, equal_costs(false));
  const std::string svg = timeline_svg(s, r);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("device 3"), std::string::npos);
  size_t boxes = 0;
  for (size_t pos = 0; (pos = svg.find("<title>", pos)) != std::string::npos; ++pos) ++boxes;
  EXPECT_EQ(boxes, static_cast<size_t>(4 * 8 * 2 * 2));  // ranks x microbatches x chunks x (F, B)
  const std::string trace = timeline_chrome_trace(s, r);
  EXPECT_NE(trace.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(trace.find("\"ph\": \"X\""), std::string::npos);
}

}  // namespace
}  // namespace triad::pipeline
