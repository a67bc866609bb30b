#pragma once

#include <string>
#include <vector>

#include "triad/dist/process_group.h"

namespace triad::dist {

// The processes of this job. init_world() starts MPI when Triad was built
// with it and an MPI launcher started the process (mpi_launched: mpirun,
// srun, mpiexec, ...), and returns the group of all ranks; a process started
// alone, or a build without MPI, gets a world of one without MPI (no
// singleton start-up, which spawns a daemon and takes about half a
// second). MPI is finalised at exit.
ProcessGroupPtr init_world();

// Whether the environment (`getenv`) shows an MPI launcher's process: a
// variable that Open MPI's mpirun, PMIx, PMI-1/2 (MPICH's and Intel MPI's
// Hydra, MVAPICH, Cray's), Slurm's srun, Flux or LSF's jsrun set in each
// process it starts. TRIAD_MPI=1 says yes for a launcher none of these
// name; any other value of TRIAD_MPI is a ConfigError.
bool mpi_launched(const char* (*getenv)(const char*));

// A sub-group of `world` for each colour: every world rank calls this with
// its colour (ranks with equal colour form a group, ordered by world rank)
// and gets its own group back. Collective over the whole world.
ProcessGroupPtr split_group(const ProcessGroupPtr& world, int color, const std::string& name);

// Ranks sharing this one's node (a shared-memory split of the world):
// (local rank, local size, node index in first-rank order). Collective.
// With TRIAD_RANKS_PER_NODE=N in the environment, the nodes are rehearsed
// (rehearsed_nodes): every N consecutive world ranks count as a node, to
// try a multi-node layout's topology (parallel.topology's check of the
// tensor-parallel groups, parallel.cp_comm auto) on one machine.
struct NodeInfo {
  int local_rank = 0;
  int local_size = 1;
  int node = 0;
  int num_nodes = 1;
  std::vector<int> node_of_rank;  // world rank -> node index
};
NodeInfo node_info(const ProcessGroupPtr& world);

// `host` (the machines' nodes) seen as nodes of `ranks_per_node`
// consecutive world ranks each, from `rank`'s side: the node indices and
// count change; the local rank and size, which pick a rank's GPU and its
// CPU threads, stay the machine's. ConfigError unless ranks_per_node >= 1
// and every rehearsed node lies on one machine (a rehearsal can only split
// the machines' nodes).
NodeInfo rehearsed_nodes(const NodeInfo& host, int ranks_per_node, int rank);

// OpenMP threads for one of `local_size` CPU ranks sharing a node of
// `node_cores` cores, when this rank may run on `rank_cores` of them (its
// CPU affinity, which mpirun narrows when it binds ranks): the node's cores
// shared out evenly, no more than the rank's own, at least one. Ranks that
// each start a thread per core (OpenMP's default) would run local_size
// threads on every core.
int cpu_threads_per_rank(int node_cores, int rank_cores, int local_size);

// Ends the job from any rank after an unrecoverable error (MPI_Abort), so no
// rank hangs waiting for this one.
[[noreturn]] void abort_job(int code);

}  // namespace triad::dist
