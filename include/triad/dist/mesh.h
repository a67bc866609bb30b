#pragma once

#include <array>
#include <string>
#include <vector>

#include "triad/dist/process_group.h"
#include "triad/dist/world.h"

namespace triad::dist {

enum class MeshDim { TP, DP, PP };

// The 3D layout of world ranks: sizes along tensor (tp), data (dp) and
// pipeline (pp) parallelism and the order in which they vary. With the
// default order "tp-dp-pp", tp varies fastest:
//   rank = tp_rank + tp * dp_rank + tp * dp * pp_rank.
// Pure arithmetic: usable (and tested) without any communication.
struct MeshShape {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  std::string order = "tp-dp-pp";
  // Expert parallelism: blocks of `ep` consecutive data-parallel ranks
  // (same tp and pp rank) share a mixture's experts out among themselves;
  // must divide dp.
  int ep = 1;
  // Context parallelism: blocks of `cp` consecutive data-parallel ranks
  // (same tp and pp rank) share their sequences, each computing on its
  // chunk of them (cp::sequence_to_heads); must divide dp. They are
  // data-parallel ranks still: their gradients are reduced with the rest.
  int cp = 1;
  // Hierarchical context parallelism (parallel.cp_a2a): each context group
  // cut into blocks of `cp_a2a` consecutive ranks (the all-to-all's, on a
  // node's fast links) and the cp / cp_a2a ranks at the same place in each
  // block (the ring's); must divide cp. 1: none.
  int cp_a2a = 1;

  int world() const { return tp * pp * dp; }
  // Throws ConfigError naming the numbers: sizes >= 1, world == tp*pp*dp,
  // order a permutation of tp, dp, pp.
  void validate(int world_size) const;
  int size(MeshDim d) const;
  int stride(MeshDim d) const;
  // (tp_rank, dp_rank, pp_rank) of a world rank, and back.
  std::array<int, 3> coords(int rank) const;
  int rank_of(int tp_rank, int dp_rank, int pp_rank) const;
  // Every group along a dimension (each a list of world ranks in order of
  // that dimension's index), e.g. for 16 ranks, tp=2, pp=4, dp=2:
  // TP [0,1] [2,3] ...; DP [0,2] [1,3] [4,6] ...; PP [0,4,8,12] [1,5,9,13] ...
  std::vector<std::vector<int>> groups(MeshDim d) const;
  // Ranks sharing a data-parallel index (tp x pp), the model replica.
  std::vector<std::vector<int>> model_parallel_groups() const;
  // {first, last} stage of each pipeline (just the rank when pp == 1), for
  // the tied input/output embedding.
  std::vector<std::vector<int>> embedding_groups() const;
  // Expert parallelism's groups, each inside a data-parallel group (its
  // ranks in data-parallel order): the expert-parallel groups, ep
  // consecutive data-parallel ranks exchanging tokens (for 8 ranks, tp=2,
  // dp=4, ep=2: [0,2] [4,6] [1,3] [5,7]); and the expert-data-parallel
  // groups, the dp/ep ranks holding the same experts, which reduce their
  // gradients ([0,4] [2,6] [1,5] [3,7]). Single ranks when ep == 1 (the
  // whole data-parallel groups for the second).
  std::vector<std::vector<int>> expert_groups() const;
  std::vector<std::vector<int>> expert_data_groups() const;
  // Context parallelism's groups: cp consecutive data-parallel ranks (for
  // 8 ranks, tp=2, dp=4, cp=2: [0,2] [4,6] [1,3] [5,7]); single ranks when
  // cp == 1.
  std::vector<std::vector<int>> context_groups() const;
  // Hierarchical context parallelism's groups inside each context group:
  // the all-to-all's, cp_a2a consecutive ranks of it, and the ring's, its
  // ranks cp_a2a apart (for 8 ranks, dp=8, cp=4, cp_a2a=2: all-to-alls [0,1]
  // [2,3] [4,5] [6,7], rings [0,2] [1,3] [4,6] [5,7]).
  std::vector<std::vector<int>> context_a2a_groups() const;
  std::vector<std::vector<int>> context_ring_groups() const;
};

// What to do when a tensor-parallel group spans nodes.
enum class TopologyPolicy { Warn, Refuse };

// The first tensor-parallel group of `shape` whose ranks are not all on one
// node (by `node.node_of_rank`), described with each rank's node; empty when
// every group sits inside a node.
std::string tp_group_spanning_nodes(const MeshShape& shape, const NodeInfo& node);

// The node (by `node.node_of_rank`) of each rank of each of `groups`, in
// the groups' order: where a mesh's groups would run.
std::vector<std::vector<int>> nodes_of(const std::vector<std::vector<int>>& groups,
                                       const NodeInfo& node);

// The communicators of a 3D layout over a world group: one per dimension,
// the model-parallel group, and the embedding group (null on ranks that are
// neither first nor last pipeline stage). Created collectively by every
// world rank, after the shape has been validated against the world size.
class DeviceMesh {
 public:
  DeviceMesh(ProcessGroupPtr world, MeshShape shape, TopologyPolicy policy = TopologyPolicy::Warn);

  const MeshShape& shape() const { return shape_; }
  const ProcessGroupPtr& world() const { return world_; }
  const ProcessGroupPtr& tp() const { return tp_; }
  const ProcessGroupPtr& dp() const { return dp_; }
  const ProcessGroupPtr& pp() const { return pp_; }
  const ProcessGroupPtr& model_parallel() const { return mp_; }
  const ProcessGroupPtr& embedding() const { return embedding_; }  // may be null
  const ProcessGroupPtr& ep() const { return ep_; }
  const ProcessGroupPtr& expert_dp() const { return edp_; }
  // The context-parallel group (one rank without context parallelism).
  const ProcessGroupPtr& cp() const { return cp_; }
  // Hierarchical context parallelism's all-to-all and ring groups (both
  // null unless 1 < cp_a2a < cp).
  const ProcessGroupPtr& cp_a2a() const { return cp_a2a_; }
  const ProcessGroupPtr& cp_ring() const { return cp_ring_; }
  // Every group of more than one rank this rank belongs to (tp, dp, pp,
  // model-parallel, embedding, the expert and context groups), each once:
  // what use_cuda gives NCCL, and what a CUDA graph's replay may hold
  // calls of.
  std::vector<ProcessGroupPtr> groups() const;
  int ep_rank() const { return ep_->rank(); }
  int tp_rank() const { return coords_[0]; }
  int dp_rank() const { return coords_[1]; }
  int pp_rank() const { return coords_[2]; }
  const NodeInfo& node() const { return node_; }
  // The CUDA device this rank should use: its rank within the node.
  int local_device() const { return node_.local_rank; }
  // GPU training: gives every group (tp, dp, pp, model-parallel, embedding,
  // the expert and context groups, the hierarchical ones)
  // an NCCL communicator on `device` and routes CUDA tensors through it,
  // host tensors through MPI as before. Collective over the world; every
  // rank creates its groups' communicators in the same order.
  // `half_gradient_sums`: the gradients' groups (dp, expert-dp) reduce
  // bf16/f16 tensors in their own type (NcclOptions::reduce_half_natively).
  void use_cuda(int device, bool half_gradient_sums = false);

 private:
  ProcessGroupPtr world_;
  MeshShape shape_;
  std::array<int, 3> coords_{};
  NodeInfo node_;
  ProcessGroupPtr tp_, dp_, pp_, mp_, embedding_, ep_, edp_, cp_, cp_a2a_, cp_ring_;
};

}  // namespace triad::dist
