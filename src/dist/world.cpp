#include "triad/dist/world.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "local_process_group.h"

#ifdef TRIAD_WITH_MPI
#include <mpi.h>

#include "mpi_process_group.h"
#endif

namespace triad::dist {

NodeInfo rehearsed_nodes(const NodeInfo& host, int ranks_per_node, int rank) {
  const int world = static_cast<int>(host.node_of_rank.size());
  if (ranks_per_node < 1) {
    throw ConfigError("TRIAD_RANKS_PER_NODE (" + std::to_string(ranks_per_node) +
                      ") must be a whole number of ranks >= 1");
  }
  NodeInfo out = host;
  for (int r = 0; r < world; ++r) {
    const int first = r / ranks_per_node * ranks_per_node;
    if (host.node_of_rank[r] != host.node_of_rank[first]) {
      throw ConfigError("TRIAD_RANKS_PER_NODE (" + std::to_string(ranks_per_node) + "): ranks " +
                        std::to_string(first) + " and " + std::to_string(r) +
                        " would share a node but run on different machines (nodes " +
                        std::to_string(host.node_of_rank[first]) + " and " +
                        std::to_string(host.node_of_rank[r]) +
                        "); a rehearsal can only split the machines' nodes");
    }
    out.node_of_rank[r] = r / ranks_per_node;
  }
  out.num_nodes = (world + ranks_per_node - 1) / ranks_per_node;
  out.node = rank / ranks_per_node;
  return out;
}

namespace {
// node_info's answer, rehearsed when TRIAD_RANKS_PER_NODE says so.
NodeInfo maybe_rehearsed(const NodeInfo& host, int rank) {
  const char* env = std::getenv("TRIAD_RANKS_PER_NODE");
  if (!env || !*env) return host;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < 1 || n > 1 << 24) {
    throw ConfigError(std::string("TRIAD_RANKS_PER_NODE ('") + env +
                      "') must be a whole number of ranks >= 1");
  }
  return rehearsed_nodes(host, static_cast<int>(n), rank);
}
}  // namespace

bool mpi_launched(const char* (*getenv)(const char*)) {
  if (const char* forced = getenv("TRIAD_MPI"); forced && *forced) {
    if (std::string(forced) != "1") {
      throw ConfigError(std::string("TRIAD_MPI ('") + forced +
                        "') must be 1 (start MPI though no known launcher started this process) "
                        "or unset");
    }
    return true;
  }
  // One each launcher sets in every process it starts.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD",
                           "MV2_COMM_WORLD_RANK", "MPI_LOCALRANKID", "SLURM_PROCID",
                           "FLUX_TASK_RANK", "JSM_NAMESPACE_RANK", "ALPS_APP_PE"}) {
    if (const char* v = getenv(name); v && *v) return true;
  }
  return false;
}

int cpu_threads_per_rank(int node_cores, int rank_cores, int local_size) {
  if (node_cores < 1 || rank_cores < 1 || local_size < 1) {
    throw ValueError("cpu_threads_per_rank: node cores (" + std::to_string(node_cores) +
                     "), the rank's cores (" + std::to_string(rank_cores) +
                     ") and ranks on the node (" + std::to_string(local_size) +
                     ") must each be at least 1");
  }
  return std::max(1, std::min(rank_cores, node_cores / local_size));
}

namespace {

ProcessGroupPtr local_group(const ProcessGroupPtr& world, const std::string& name) {
  auto g = std::make_shared<detail::LocalProcessGroup>(name);
  g->set_timeout(world->timeout());
  g->set_validate(world->validate());
  return g;
}

NodeInfo local_node_info() {
  NodeInfo info;
  info.node_of_rank = {0};
  return maybe_rehearsed(info, 0);
}

}  // namespace

#ifdef TRIAD_WITH_MPI
namespace {

// A world of one without MPI (init_world alone, not under a launcher): its
// groups are groups of one, and its node the one node. (A build without MPI
// has no other world.)
bool local_world(const ProcessGroupPtr& world) {
  return dynamic_cast<detail::LocalProcessGroup*>(world.get()) != nullptr;
}

void finalize_mpi() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

detail::MpiProcessGroup& as_mpi(const ProcessGroupPtr& g, const char* what) {
  auto* m = dynamic_cast<detail::MpiProcessGroup*>(g.get());
  if (!m) throw ValueError(std::string(what) + ": group '" + g->name() + "' is not an MPI group");
  return *m;
}

}  // namespace

ProcessGroupPtr init_world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized &&
      !mpi_launched([](const char* name) -> const char* { return std::getenv(name); })) {
    return std::make_shared<detail::LocalProcessGroup>("world");
  }
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      throw Error("MPI_Init_thread failed");
    }
    std::atexit(finalize_mpi);
  }
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  return std::make_shared<detail::MpiProcessGroup>(comm, "world");
}

ProcessGroupPtr split_group(const ProcessGroupPtr& world, int color, const std::string& name) {
  if (local_world(world)) return local_group(world, name);
  auto& w = as_mpi(world, "split_group");
  MPI_Comm comm;
  if (MPI_Comm_split(w.comm(), color, w.rank(), &comm) != MPI_SUCCESS) {
    throw Error("split_group '" + name + "': MPI_Comm_split failed");
  }
  auto g = std::make_shared<detail::MpiProcessGroup>(comm, name);
  g->set_timeout(world->timeout());
  g->set_validate(world->validate());
  return g;
}

NodeInfo node_info(const ProcessGroupPtr& world) {
  if (local_world(world)) return local_node_info();
  auto& w = as_mpi(world, "node_info");
  MPI_Comm node;
  MPI_Comm_split_type(w.comm(), MPI_COMM_TYPE_SHARED, w.rank(), MPI_INFO_NULL, &node);
  NodeInfo info;
  MPI_Comm_rank(node, &info.local_rank);
  MPI_Comm_size(node, &info.local_size);
  // The node's first rank names the node; index nodes in order of first rank.
  int leader = w.rank();
  MPI_Bcast(&leader, 1, MPI_INT, 0, node);
  MPI_Comm_free(&node);
  std::vector<int> leaders(w.size());
  MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, w.comm());
  std::vector<int> unique = leaders;
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  info.num_nodes = static_cast<int>(unique.size());
  info.node_of_rank.resize(w.size());
  for (int r = 0; r < w.size(); ++r) {
    info.node_of_rank[r] = static_cast<int>(
        std::lower_bound(unique.begin(), unique.end(), leaders[r]) - unique.begin());
  }
  info.node = info.node_of_rank[w.rank()];
  return maybe_rehearsed(info, w.rank());
}

void abort_job(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

#else

ProcessGroupPtr init_world() {
  return std::make_shared<detail::LocalProcessGroup>("world");
}

ProcessGroupPtr split_group(const ProcessGroupPtr& world, int, const std::string& name) {
  if (world->size() != 1)
    throw ValueError("split_group needs MPI for a world of " + std::to_string(world->size()));
  return local_group(world, name);
}

NodeInfo node_info(const ProcessGroupPtr&) {
  return local_node_info();
}

void abort_job(int code) {
  std::_Exit(code);
}

#endif

}  // namespace triad::dist
