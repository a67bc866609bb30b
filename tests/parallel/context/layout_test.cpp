// Context parallelism's layouts of a row (cp::Layout, cp::chunk_runs): the
// contiguous chunks, the balanced half-chunks and the hierarchical groups'
// shares between them each hold every position once, and the ranks' tokens
// gathered in rank order go back to the row's order.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "triad/core/error.h"
#include "triad/ops.h"
#include "triad/parallel/context/exchange.h"
#include "triad/parallel/context/layout.h"

namespace triad::cp {
namespace {

TEST(ContextLayout, ContiguousBalancedAndHierarchicalRuns) {
  // Contiguous: rank r's P-th; balanced: half-chunks r and 2P - 1 - r.
  EXPECT_EQ(chunk_runs(12, 1, Layout::contiguous(3)), (std::vector<cp::Run>{{4, 4}}));
  EXPECT_EQ(chunk_runs(12, 1, Layout::balanced(3)), (std::vector<cp::Run>{{2, 2}, {8, 2}}));
  // Hierarchical, 4 ranks in all-to-alls of 2 (a ring of 2): the first
  // group holds half-chunks 0 and 3, the second 1 and 2, one a rank.
  const Layout pairs = Layout::hierarchical(4, 2);
  EXPECT_EQ(pairs.ring, 2);
  EXPECT_EQ(chunk_runs(16, 0, pairs), (std::vector<cp::Run>{{0, 4}}));
  EXPECT_EQ(chunk_runs(16, 1, pairs), (std::vector<cp::Run>{{12, 4}}));
  EXPECT_EQ(chunk_runs(16, 2, pairs), (std::vector<cp::Run>{{4, 4}}));
  EXPECT_EQ(chunk_runs(16, 3, pairs), (std::vector<cp::Run>{{8, 4}}));
  // 6 ranks in all-to-alls of 3: a group's two half-chunks of 6 cut in
  // threes of 4, the middle rank's straddling both.
  const Layout threes = Layout::hierarchical(6, 3);
  EXPECT_EQ(chunk_runs(24, 0, threes), (std::vector<cp::Run>{{0, 4}}));
  EXPECT_EQ(chunk_runs(24, 1, threes), (std::vector<cp::Run>{{4, 2}, {18, 2}}));
  EXPECT_EQ(chunk_runs(24, 2, threes), (std::vector<cp::Run>{{20, 4}}));
  EXPECT_EQ(chunk_runs(24, 4, threes), (std::vector<cp::Run>{{10, 2}, {12, 2}}));
  // (Adjacent half-chunks stay two runs: the balanced layout's last rank.)
  EXPECT_EQ(chunk_runs(12, 2, Layout::balanced(3)), (std::vector<cp::Run>{{4, 2}, {6, 2}}));
  // What a row's length must be a multiple of.
  EXPECT_EQ(Layout::contiguous(3).row_multiple(), 3);
  EXPECT_EQ(Layout::balanced(3).row_multiple(), 6);
  EXPECT_EQ(threes.row_multiple(), 12);
  EXPECT_EQ(Layout::hierarchical(8, 2).row_multiple(), 8);
  EXPECT_THROW(chunk_runs(16, 0, Layout{4, 3}), ValueError);
  EXPECT_THROW(chunk_runs(16, 4, pairs), ValueError);
}

TEST(ContextLayout, EveryLayoutHoldsEachPositionOnceAndGathersBackInOrder) {
  for (const int64_t P : {1, 2, 3, 4, 6, 8}) {
    for (int64_t ring = 1; ring <= P; ++ring) {
      if (P % ring != 0) continue;
      const Layout layout{P, ring};
      const int64_t T = 2 * layout.row_multiple();
      SCOPED_TRACE(std::to_string(P) + " ranks, a ring of " + std::to_string(ring) + ", T " +
                   std::to_string(T));
      std::vector<int> seen(static_cast<size_t>(T), 0);
      std::vector<double> gathered;
      for (int64_t r = 0; r < P; ++r) {
        int64_t held = 0;
        for (const auto& [first, count] : chunk_runs(T, r, layout)) {
          for (int64_t t = first; t < first + count; ++t) {
            ++seen[static_cast<size_t>(t)];
            gathered.push_back(static_cast<double>(t));
          }
          held += count;
        }
        EXPECT_EQ(held, T / P) << "rank " << r;
      }
      for (int64_t t = 0; t < T; ++t) EXPECT_EQ(seen[static_cast<size_t>(t)], 1) << t;
      // Gathered in rank order ((1, T, 1): position t holds t) -> 0, 1, ...
      const Tensor back = to_sequence_order(from_vector(gathered, {1, T, 1}), 1, layout);
      std::vector<double> row(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) row[static_cast<size_t>(t)] = static_cast<double>(t);
      EXPECT_EQ(to_double_vector(back), row);
    }
  }
}

// Which layout each exchange holds.
TEST(ContextLayout, EachExchangesLayout) {
  EXPECT_EQ(layout_of(Exchange::AllToAll, 4).ring, 1);
  EXPECT_EQ(layout_of(Exchange::AllGather, 4).ring, 4);
  EXPECT_EQ(layout_of(Exchange::Ring, 4).ring, 4);
  EXPECT_EQ(layout_of(Exchange::AllToAllRing, 8, 2).ring, 4);
  EXPECT_EQ(exchange_from_string("all_to_all+ring"), Exchange::AllToAllRing);
  EXPECT_STREQ(exchange_name(Exchange::AllToAllRing), "all_to_all+ring");
}

// parallel.cp_comm auto by where the ranks run: a context group on one node
// takes the flat choice; one spanning nodes, all-to-alls inside them (the
// largest that fits, whose heads share out and whose layout the row divides
// into) and a ring across; concrete exchanges stay as asked.
TEST(ContextExchange, AutoRunsAllToAllsInsideNodesAndARingAcrossThem) {
  nn::GptConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 8;
  cfg.d_model = 64;
  cfg.vocab_size = 64;
  cfg.seq_len = 64;
  using Nodes = std::vector<std::vector<int>>;
  auto choose = [&](int64_t cp, const Nodes& nodes, Exchange asked = Exchange::Auto,
                    int64_t a2a = 1) {
    return choose_exchange(asked, a2a, cfg, 1, cp, false, nodes);
  };
  const Nodes one{{0, 0, 0, 0, 0, 0, 0, 0}};
  EXPECT_EQ(choose(8, one), (ExchangeChoice{Exchange::AllToAll, 1}));
  EXPECT_EQ(choose(8, {}), (ExchangeChoice{Exchange::AllToAll, 1}));
  const Nodes halves{{0, 0, 0, 0, 1, 1, 1, 1}, {2, 2, 2, 2, 3, 3, 3, 3}};
  EXPECT_EQ(choose(8, halves), (ExchangeChoice{Exchange::AllToAllRing, 4}));
  EXPECT_EQ(choose(8, {{0, 0, 1, 1, 2, 2, 3, 3}}), (ExchangeChoice{Exchange::AllToAllRing, 2}));
  // A group whose pairs straddle nodes of three ranks: no all-to-all fits.
  EXPECT_EQ(choose(8, {{0, 0, 0, 1, 1, 1, 2, 2}}), (ExchangeChoice{Exchange::AllToAll, 1}));
  // Every group counts, not only the first.
  EXPECT_EQ(choose(8, {{0, 0, 0, 0, 1, 1, 1, 1}, {1, 1, 2, 2, 2, 2, 3, 3}}),
            (ExchangeChoice{Exchange::AllToAllRing, 2}));
  // Six heads: none of 8 ranks' all-to-all (the flat choice gathers), but
  // pairs' all-to-alls inside the nodes.
  cfg.n_head = 6;
  cfg.d_model = 48;
  EXPECT_EQ(choose(8, one), (ExchangeChoice{Exchange::AllGather, 1}));
  EXPECT_EQ(choose(8, halves), (ExchangeChoice{Exchange::AllToAllRing, 2}));
  // Rows of 18 over 6 ranks on two nodes of 3: all-to-alls of 3 need rows
  // of a multiple of 12 (two half-chunks of each of the ring's 2
  // positions), so the flat all-to-all stays; rows of 24 take them.
  cfg.seq_len = 18;
  EXPECT_EQ(choose(6, {{0, 0, 0, 1, 1, 1}}), (ExchangeChoice{Exchange::AllToAll, 1}));
  cfg.seq_len = 24;
  EXPECT_EQ(choose(6, {{0, 0, 0, 1, 1, 1}}), (ExchangeChoice{Exchange::AllToAllRing, 3}));
  // Concrete exchanges, and no context parallelism, whatever the nodes.
  EXPECT_EQ(choose(6, {{0, 0, 0, 1, 1, 1}}, Exchange::Ring), (ExchangeChoice{Exchange::Ring, 1}));
  EXPECT_EQ(choose(6, {{0, 0, 0, 1, 1, 1}}, Exchange::AllToAllRing, 2),
            (ExchangeChoice{Exchange::AllToAllRing, 2}));
  EXPECT_EQ(choose(1, {{0}}), (ExchangeChoice{Exchange::AllToAll, 1}));
}

}  // namespace
}  // namespace triad::cp
