#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>

#include "triad/dist/mesh.h"
#include "triad/dist/world.h"
#include "triad/ops.h"

namespace triad::dist {
namespace {

using Groups = std::vector<std::vector<int>>;

TEST(MeshShape, SixteenRanksTp2Pp4Dp2MatchTheDesignExample) {
  MeshShape m{2, 4, 2};
  m.validate(16);
  EXPECT_EQ(m.groups(MeshDim::TP),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(m.groups(MeshDim::DP),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(m.groups(MeshDim::PP),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(m.model_parallel_groups(),
            (Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}}));
  EXPECT_EQ(m.embedding_groups(), (Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
  // rank = tp_rank + tp*dp_rank + tp*dp*pp_rank
  for (int r = 0; r < 16; ++r) {
    auto c = m.coords(r);
    EXPECT_EQ(c[0] + 2 * c[1] + 4 * c[2], r);
    EXPECT_EQ(m.rank_of(c[0], c[1], c[2]), r);
  }
}

TEST(MeshShape, OtherLayoutsAndOrders) {
  MeshShape a{2, 2, 2};
  EXPECT_EQ(a.groups(MeshDim::TP), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(a.groups(MeshDim::DP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(a.groups(MeshDim::PP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  MeshShape b{1, 2, 4};
  EXPECT_EQ(b.groups(MeshDim::DP), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(b.groups(MeshDim::PP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(b.groups(MeshDim::TP), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  MeshShape c{4, 1, 2};
  EXPECT_EQ(c.embedding_groups(), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  MeshShape d{2, 2, 2, "tp-pp-dp"};  // pipeline before data
  EXPECT_EQ(d.groups(MeshDim::PP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(d.groups(MeshDim::DP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(MeshShape, MismatchesAreErrorsNamingTheNumbers) {
  auto expect_error = [](const MeshShape& m, int world, const std::string& fragment) {
    try {
      m.validate(world);
      FAIL() << "expected ConfigError with '" << fragment << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error({2, 2, 2}, 6, "world size (6) must equal tp*pp*dp = 2*2*2 = 8");
  expect_error({0, 1, 1}, 1, "must be >= 1 (tp 0");
  expect_error({1, 1, 1, "tp-dp-xx"}, 1, "parallel.order ('tp-dp-xx')");
  expect_error({1, 1, 1, "tp-tp-pp"}, 1, "must list tp, dp and pp once each");
}

// Two nodes of four ranks: tensor-parallel groups inside a node pass, one
// across the boundary is named with each rank's node.
TEST(MeshShape, TensorParallelGroupsAcrossNodesAreNamed) {
  NodeInfo node;
  node.local_size = 4;
  node.num_nodes = 2;
  node.node_of_rank = {0, 0, 0, 0, 1, 1, 1, 1};
  EXPECT_EQ(tp_group_spanning_nodes(MeshShape{4, 1, 2}, node), "");
  EXPECT_EQ(tp_group_spanning_nodes(MeshShape{2, 2, 2}, node), "");
  EXPECT_EQ(tp_group_spanning_nodes(MeshShape{8, 1, 1}, node),
            "tensor-parallel group [0@node0, 1@node0, 2@node0, 3@node0, 4@node1, 5@node1, "
            "6@node1, 7@node1] spans nodes (tp 8, 4 ranks per node; parallel.topology: refuse "
            "stops here, warn goes on)");
  // tp varying slowest: its groups stride across the nodes.
  const std::string across = tp_group_spanning_nodes(MeshShape{2, 1, 4, "dp-pp-tp"}, node);
  EXPECT_NE(across.find("[0@node0, 4@node1]"), std::string::npos) << across;
}

// Expert parallelism's groups inside the data-parallel ones: blocks of ep
// consecutive data-parallel ranks exchange tokens, the ranks at the same
// place of each block hold the same experts.
TEST(MeshShape, ExpertGroupsSplitTheDataParallelOnes) {
  MeshShape s{.tp = 2, .pp = 1, .dp = 4, .ep = 2};
  s.validate(8);
  EXPECT_EQ(s.expert_groups(), (std::vector<std::vector<int>>{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(s.expert_data_groups(),
            (std::vector<std::vector<int>>{{0, 4}, {2, 6}, {1, 5}, {3, 7}}));
  MeshShape none{.tp = 2, .pp = 2, .dp = 2};
  EXPECT_EQ(none.expert_data_groups(), none.groups(MeshDim::DP));
  for (const auto& g : none.expert_groups()) EXPECT_EQ(g.size(), 1u);
  MeshShape odd{.tp = 1, .pp = 1, .dp = 6, .ep = 4};
  try {
    odd.validate(6);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.ep (4) must divide parallel.dp (6)"),
              std::string::npos)
        << e.what();
  }
}

// Hierarchical context parallelism's groups inside each context group:
// blocks of cp_a2a consecutive ranks (the all-to-alls) and the ranks cp_a2a
// apart (the rings); cp_a2a must divide cp.
TEST(MeshShape, HierarchicalContextGroupsSplitEachContextGroup) {
  MeshShape s{.tp = 1, .pp = 1, .dp = 8, .cp = 4, .cp_a2a = 2};
  s.validate(8);
  EXPECT_EQ(s.context_groups(), (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(s.context_a2a_groups(),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(s.context_ring_groups(),
            (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  // Beside tp 2: the context group's ranks are 2 apart, and so its blocks.
  MeshShape t{.tp = 2, .pp = 1, .dp = 4, .cp = 4, .cp_a2a = 2};
  t.validate(8);
  EXPECT_EQ(t.context_a2a_groups(),
            (std::vector<std::vector<int>>{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(t.context_ring_groups(),
            (std::vector<std::vector<int>>{{0, 4}, {2, 6}, {1, 5}, {3, 7}}));
  MeshShape odd{.tp = 1, .pp = 1, .dp = 6, .cp = 6, .cp_a2a = 4};
  try {
    odd.validate(6);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.cp_a2a (4) must divide parallel.cp (6)"),
              std::string::npos)
        << e.what();
  }
}

// Where each group's ranks run (the trainer's choice of cp_comm auto reads
// the context groups' nodes): beside tp 2 the context group [0, 2] sits on
// node 0 and [4, 6] on node 1 when nodes hold 4 ranks; with 8 context ranks
// over two nodes each group spans them.
TEST(MeshShape, NodesOfEachGroupsRanks) {
  MeshShape s{.tp = 2, .pp = 1, .dp = 4, .cp = 2};
  s.validate(8);
  NodeInfo node;
  node.node_of_rank = {0, 0, 0, 0, 1, 1, 1, 1};
  EXPECT_EQ(nodes_of(s.context_groups(), node), (Groups{{0, 0}, {1, 1}, {0, 0}, {1, 1}}));
  MeshShape t{.tp = 1, .pp = 1, .dp = 8, .cp = 8};
  t.validate(8);
  EXPECT_EQ(nodes_of(t.context_groups(), node), (Groups{{0, 0, 0, 0, 1, 1, 1, 1}}));
  node.node_of_rank = {0, 0};
  EXPECT_THROW(nodes_of(t.context_groups(), node), std::out_of_range);
}

// TRIAD_RANKS_PER_NODE: one machine's 8 ranks seen as nodes of 2 (or 3,
// the last short); the local rank and size stay the machine's. A rehearsal
// cannot join two machines' ranks into one node.
TEST(NodeInfo, RehearsedNodesSplitTheMachines) {
  NodeInfo host;
  host.local_rank = 5;
  host.local_size = 8;
  host.node_of_rank.assign(8, 0);
  const NodeInfo pairs = rehearsed_nodes(host, 2, 5);
  EXPECT_EQ(pairs.node_of_rank, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(pairs.num_nodes, 4);
  EXPECT_EQ(pairs.node, 2);
  EXPECT_EQ(pairs.local_rank, 5);
  EXPECT_EQ(pairs.local_size, 8);
  EXPECT_EQ(rehearsed_nodes(host, 3, 7).node_of_rank, (std::vector<int>{0, 0, 0, 1, 1, 1, 2, 2}));
  EXPECT_EQ(rehearsed_nodes(host, 3, 7).num_nodes, 3);
  // Two machines of 4: nodes of 2 split them, nodes of 3 would not.
  host.node_of_rank = {0, 0, 0, 0, 1, 1, 1, 1};
  EXPECT_EQ(rehearsed_nodes(host, 2, 0).num_nodes, 4);
  try {
    rehearsed_nodes(host, 3, 0);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("TRIAD_RANKS_PER_NODE (3): ranks 3 and 4 would share a "
                                         "node but run on different machines (nodes 0 and 1)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(rehearsed_nodes(host, 0, 0), ConfigError);
  // The tensor-parallel check reads the rehearsed nodes.
  MeshShape tp4{.tp = 4, .pp = 1, .dp = 2};
  tp4.validate(8);
  EXPECT_NE(tp_group_spanning_nodes(tp4, rehearsed_nodes(host, 2, 0)), "");
  EXPECT_EQ(tp_group_spanning_nodes(tp4, host), "");
}

// A fake environment for mpi_launched: the variables named in `set`.
const std::map<std::string, std::string>* g_env = nullptr;
const char* fake_getenv(const char* name) {
  const auto it = g_env->find(name);
  return it == g_env->end() ? nullptr : it->second.c_str();
}

TEST(World, MpiStartsOnlyUnderALauncher) {
  std::map<std::string, std::string> env{{"HOME", "/root"}, {"OMP_NUM_THREADS", "1"}};
  g_env = &env;
  EXPECT_FALSE(mpi_launched(fake_getenv));
  // Each launcher's own variable.
  for (const char* name :
       {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MV2_COMM_WORLD_RANK",
        "SLURM_PROCID", "FLUX_TASK_RANK", "JSM_NAMESPACE_RANK", "ALPS_APP_PE"}) {
    std::map<std::string, std::string> launched = env;
    launched[name] = "0";
    g_env = &launched;
    EXPECT_TRUE(mpi_launched(fake_getenv)) << name;
    launched[name] = "";  // (set but empty: no launcher's)
    EXPECT_FALSE(mpi_launched(fake_getenv)) << name;
  }
  // TRIAD_MPI=1 for a launcher none of them names; nothing else.
  env["TRIAD_MPI"] = "1";
  g_env = &env;
  EXPECT_TRUE(mpi_launched(fake_getenv));
  env["TRIAD_MPI"] = "yes";
  try {
    mpi_launched(fake_getenv);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("TRIAD_MPI ('yes') must be 1"), std::string::npos)
        << e.what();
  }
  g_env = nullptr;
}

TEST(World, AProcessStartedAloneIsAWorldOfOne) {
  // (This test binary runs without mpirun; under a launcher the world is
  // MPI's, of one rank too.)
  ProcessGroupPtr world = init_world();
  world->set_timeout(std::chrono::milliseconds(1234));
  ASSERT_EQ(world->size(), 1);
  EXPECT_EQ(world->rank(), 0);
  // Its groups are groups of one that keep the world's settings, and its
  // node the only one.
  ProcessGroupPtr tp = split_group(world, 0, "tp");
  EXPECT_EQ(tp->size(), 1);
  EXPECT_EQ(tp->name(), "tp");
  EXPECT_EQ(tp->timeout(), std::chrono::milliseconds(1234));
  const NodeInfo node = node_info(world);
  EXPECT_EQ(node.num_nodes, 1);
  EXPECT_EQ(node.local_size, 1);
  EXPECT_EQ(node.node_of_rank, std::vector<int>{0});
  // A mesh of one over it, and a collective that leaves the values as they are.
  DeviceMesh mesh(world, MeshShape{.tp = 1, .pp = 1, .dp = 1});
  Tensor t = from_vector(std::vector<float>{1.5f, -2.0f}, {2});
  mesh.dp()->all_reduce(t, ReduceOp::Avg)->wait();
  EXPECT_EQ(to_float_vector(t), (std::vector<float>{1.5f, -2.0f}));
}

// Context parallelism's groups, blocks of cp consecutive data-parallel
// ranks, beside expert parallelism's over the same ranks.
TEST(MeshShape, ContextGroupsSplitTheDataParallelOnes) {
  MeshShape s{.tp = 2, .pp = 1, .dp = 4, .ep = 4, .cp = 2};
  s.validate(8);
  EXPECT_EQ(s.context_groups(), (std::vector<std::vector<int>>{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(s.expert_groups(), s.groups(MeshDim::DP));
  MeshShape none{.tp = 2, .pp = 2, .dp = 2};
  for (const auto& g : none.context_groups()) EXPECT_EQ(g.size(), 1u);
  MeshShape odd{.tp = 1, .pp = 1, .dp = 6, .cp = 4};
  try {
    odd.validate(6);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("context parallelism's 4 ranks must divide the "
                                         "data-parallel group's 6"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace triad::dist

namespace triad::dist {
namespace {

TEST(CpuThreads, RanksOnANodeShareItsCores) {
  EXPECT_EQ(cpu_threads_per_rank(2, 2, 8), 1);    // CI: 8 ranks on 2 cores
  EXPECT_EQ(cpu_threads_per_rank(16, 16, 4), 4);  // unbound ranks share the node
  EXPECT_EQ(cpu_threads_per_rank(8, 8, 3), 2);    // the remainder is left idle
  EXPECT_EQ(cpu_threads_per_rank(16, 16, 1), 16);
  // A rank bound to fewer cores than its share keeps to them.
  EXPECT_EQ(cpu_threads_per_rank(16, 1, 4), 1);
  EXPECT_EQ(cpu_threads_per_rank(64, 32, 2), 32);
  EXPECT_EQ(cpu_threads_per_rank(64, 32, 8), 8);
}

TEST(CpuThreads, CountsBelowOneAreErrorsNamingThem) {
  try {
    cpu_threads_per_rank(16, 0, 4);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("the rank's cores (0)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cpu_threads_per_rank(0, 1, 1), ValueError);
  EXPECT_THROW(cpu_threads_per_rank(4, 4, 0), ValueError);
}

}  // namespace
}  // namespace triad::dist
