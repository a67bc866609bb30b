#include "triad/dist/mesh.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstddef>
#include <sstream>

#include "triad/dist/nccl.h"

namespace triad::dist {
namespace {

std::vector<MeshDim> parse_order(const std::string& order) {
  std::vector<MeshDim> dims;
  std::stringstream ss(order);
  for (std::string part; std::getline(ss, part, '-');) {
    if (part == "tp") {
      dims.push_back(MeshDim::TP);
    } else if (part == "dp") {
      dims.push_back(MeshDim::DP);
    } else if (part == "pp") {
      dims.push_back(MeshDim::PP);
    } else {
      dims.clear();
      break;
    }
  }
  std::vector<MeshDim> sorted = dims;
  std::sort(sorted.begin(), sorted.end());
  if (dims.size() != 3 || std::unique(sorted.begin(), sorted.end()) != sorted.end()) {
    throw ConfigError("parallel.order ('" + order +
                      "') must list tp, dp and pp once each, e.g. 'tp-dp-pp'");
  }
  return dims;
}

int mesh_index_of(MeshDim d) {
  return d == MeshDim::TP ? 0 : d == MeshDim::DP ? 1 : 2;
}

}  // namespace

void MeshShape::validate(int world_size) const {
  if (tp < 1 || pp < 1 || dp < 1) {
    throw ConfigError("parallel sizes must be >= 1 (tp " + std::to_string(tp) + ", pp " +
                      std::to_string(pp) + ", dp " + std::to_string(dp) + ")");
  }
  parse_order(order);
  if (ep < 1 || dp % ep != 0) {
    throw ConfigError("parallel.ep (" + std::to_string(ep) + ") must divide parallel.dp (" +
                      std::to_string(dp) +
                      "): expert parallelism shares experts among data-parallel ranks");
  }
  if (cp < 1 || dp % cp != 0) {
    throw ConfigError("context parallelism's " + std::to_string(cp) +
                      " ranks must divide the data-parallel group's " + std::to_string(dp) +
                      " (parallel.cp shares sequences among data-parallel ranks)");
  }
  if (cp_a2a < 1 || cp % cp_a2a != 0) {
    throw ConfigError("parallel.cp_a2a (" + std::to_string(cp_a2a) + ") must divide parallel.cp (" +
                      std::to_string(cp) +
                      "): the all-to-all's ranks are blocks of the context-parallel group");
  }
  if (static_cast<long long>(tp) * pp * dp != world_size) {
    throw ConfigError("world size (" + std::to_string(world_size) + ") must equal tp*pp*dp = " +
                      std::to_string(tp) + "*" + std::to_string(pp) + "*" + std::to_string(dp) +
                      " = " + std::to_string(static_cast<long long>(tp) * pp * dp));
  }
}

int MeshShape::size(MeshDim d) const {
  return d == MeshDim::TP ? tp : d == MeshDim::DP ? dp : pp;
}

int MeshShape::stride(MeshDim d) const {
  int s = 1;
  for (MeshDim x : parse_order(order)) {
    if (x == d) return s;
    s *= size(x);
  }
  return s;
}

std::array<int, 3> MeshShape::coords(int rank) const {
  std::array<int, 3> c{};
  for (MeshDim d : {MeshDim::TP, MeshDim::DP, MeshDim::PP})
    c[mesh_index_of(d)] = (rank / stride(d)) % size(d);
  return c;
}

int MeshShape::rank_of(int tp_rank, int dp_rank, int pp_rank) const {
  return tp_rank * stride(MeshDim::TP) + dp_rank * stride(MeshDim::DP) +
         pp_rank * stride(MeshDim::PP);
}

std::vector<std::vector<int>> MeshShape::groups(MeshDim d) const {
  std::vector<std::vector<int>> out;
  std::vector<bool> seen(world(), false);
  for (int r = 0; r < world(); ++r) {
    if (seen[r]) continue;
    auto c = coords(r);
    std::vector<int> g;
    for (int i = 0; i < size(d); ++i) {
      c[mesh_index_of(d)] = i;
      const int q = rank_of(c[0], c[1], c[2]);
      g.push_back(q);
      seen[q] = true;
    }
    out.push_back(g);
  }
  return out;
}

std::vector<std::vector<int>> MeshShape::model_parallel_groups() const {
  std::vector<std::vector<int>> out(dp);
  for (int r = 0; r < world(); ++r) out[coords(r)[1]].push_back(r);
  return out;
}

std::vector<std::vector<int>> MeshShape::embedding_groups() const {
  std::vector<std::vector<int>> out;
  for (const auto& pipe : groups(MeshDim::PP)) {
    out.push_back(pipe.size() == 1 ? std::vector<int>{pipe.front()}
                                   : std::vector<int>{pipe.front(), pipe.back()});
  }
  return out;
}

namespace {

// Each group cut into blocks of `size` consecutive ranks, in order.
std::vector<std::vector<int>> blocks_of(const std::vector<std::vector<int>>& groups, int size) {
  std::vector<std::vector<int>> out;
  for (const auto& g : groups) {
    for (size_t b = 0; b + static_cast<size_t>(size) <= g.size(); b += static_cast<size_t>(size))
      out.emplace_back(g.begin() + static_cast<std::ptrdiff_t>(b),
                       g.begin() + static_cast<std::ptrdiff_t>(b) + size);
  }
  return out;
}

// Each group's ranks `stride` apart: for each j < stride, its ranks j,
// j + stride, ... in order.
std::vector<std::vector<int>> strided(const std::vector<std::vector<int>>& groups, int stride) {
  std::vector<std::vector<int>> out;
  for (const auto& g : groups) {
    for (int j = 0; j < stride; ++j) {
      std::vector<int> same;
      for (size_t i = static_cast<size_t>(j); i < g.size(); i += static_cast<size_t>(stride))
        same.push_back(g[i]);
      out.push_back(same);
    }
  }
  return out;
}

}  // namespace

std::vector<std::vector<int>> MeshShape::expert_groups() const {
  return blocks_of(groups(MeshDim::DP), ep);
}

std::vector<std::vector<int>> MeshShape::context_groups() const {
  return blocks_of(groups(MeshDim::DP), cp);
}

std::vector<std::vector<int>> MeshShape::context_a2a_groups() const {
  return blocks_of(context_groups(), cp_a2a);
}

std::vector<std::vector<int>> MeshShape::context_ring_groups() const {
  return strided(context_groups(), cp_a2a);
}

std::vector<std::vector<int>> MeshShape::expert_data_groups() const {
  return strided(groups(MeshDim::DP), ep);
}

std::string tp_group_spanning_nodes(const MeshShape& shape, const NodeInfo& node) {
  for (const auto& g : shape.groups(MeshDim::TP)) {
    bool same = true;
    for (int r : g) same = same && node.node_of_rank.at(r) == node.node_of_rank.at(g.front());
    if (same) continue;
    std::string list;
    for (int r : g) {
      if (!list.empty()) list += ", ";
      list += std::to_string(r) + "@node" + std::to_string(node.node_of_rank.at(r));
    }
    // (Counted from the nodes' ranks: a rehearsal's nodes are not the machine's.)
    const auto per_node = std::count(node.node_of_rank.begin(), node.node_of_rank.end(),
                                     node.node_of_rank.at(g.front()));
    return "tensor-parallel group [" + list + "] spans nodes (tp " + std::to_string(shape.tp) +
           ", " + std::to_string(per_node) +
           " ranks per node; parallel.topology: refuse stops here, warn goes on)";
  }
  return "";
}

std::vector<std::vector<int>> nodes_of(const std::vector<std::vector<int>>& groups,
                                       const NodeInfo& node) {
  std::vector<std::vector<int>> nodes;
  nodes.reserve(groups.size());
  for (const std::vector<int>& g : groups) {
    std::vector<int>& of = nodes.emplace_back();
    for (int r : g) of.push_back(node.node_of_rank.at(r));
  }
  return nodes;
}

DeviceMesh::DeviceMesh(ProcessGroupPtr world, MeshShape shape, TopologyPolicy policy)
    : world_(std::move(world)), shape_(std::move(shape)) {
  shape_.validate(world_->size());  // before any communicator beyond the world
  const int me = world_->rank();
  coords_ = shape_.coords(me);
  node_ = node_info(world_);
  // Each TP group should sit inside one node (NVLink).
  const std::string spanning = tp_group_spanning_nodes(shape_, node_);
  if (!spanning.empty()) {
    if (policy == TopologyPolicy::Refuse) throw ConfigError(spanning);
    if (me == 0) spdlog::warn("{}", spanning);
  }
  auto color_of = [&](const std::vector<std::vector<int>>& groups) {
    for (size_t i = 0; i < groups.size(); ++i) {
      if (std::find(groups[i].begin(), groups[i].end(), me) != groups[i].end())
        return static_cast<int>(i);
    }
    return -1;
  };
  tp_ = split_group(world_, color_of(shape_.groups(MeshDim::TP)), "tp");
  dp_ = split_group(world_, color_of(shape_.groups(MeshDim::DP)), "dp");
  pp_ = split_group(world_, color_of(shape_.groups(MeshDim::PP)), "pp");
  mp_ = split_group(world_, color_of(shape_.model_parallel_groups()), "model-parallel");
  const int emb = color_of(shape_.embedding_groups());
  // Everyone takes part in the split; ranks outside every embedding group
  // get a group of their own and drop it.
  auto g =
      split_group(world_, emb >= 0 ? emb : static_cast<int>(shape_.embedding_groups().size()) + me,
                  "embedding");
  if (emb >= 0) embedding_ = g;
  ep_ = split_group(world_, color_of(shape_.expert_groups()), "ep");
  // (Without expert parallelism the experts' replicas are the data-parallel
  // group itself: no communicator of their own.)
  edp_ = shape_.ep == 1 ? dp_
                        : split_group(world_, color_of(shape_.expert_data_groups()), "expert-dp");
  cp_ = split_group(world_, color_of(shape_.context_groups()), "cp");
  if (shape_.cp_a2a > 1 && shape_.cp_a2a < shape_.cp) {
    cp_a2a_ = split_group(world_, color_of(shape_.context_a2a_groups()), "cp-a2a");
    cp_ring_ = split_group(world_, color_of(shape_.context_ring_groups()), "cp-ring");
  }
}

std::vector<ProcessGroupPtr> DeviceMesh::groups() const {
  std::vector<ProcessGroupPtr> out;
  for (const ProcessGroupPtr& g :
       {tp_, dp_, pp_, mp_, embedding_, ep_, edp_, cp_, cp_a2a_, cp_ring_}) {
    if (!g || g->size() == 1) continue;
    if (std::none_of(out.begin(), out.end(), [&](const ProcessGroupPtr& o) { return o == g; }))
      out.push_back(g);
  }
  return out;
}

void DeviceMesh::use_cuda(int device, bool half_gradient_sums) {
  // The pipeline's neighbours exchange over links of their own, unless
  // TRIAD_NCCL_P2P_STREAMS=one keeps every call on the group's stream.
  const bool per_peer = nccl_p2p_streams_per_peer();
  for (ProcessGroupPtr* g :
       {&tp_, &dp_, &pp_, &mp_, &embedding_, &ep_, &edp_, &cp_, &cp_a2a_, &cp_ring_}) {
    // (Without expert or context parallelism nothing uses their groups.)
    if ((g == &edp_ || g == &ep_) && shape_.ep == 1) continue;
    if (g == &cp_ && shape_.cp == 1) continue;
    NcclOptions options;
    options.p2p_streams_per_peer = g == &pp_ && per_peer;
    options.reduce_half_natively = half_gradient_sums && (g == &dp_ || g == &edp_);
    if (*g) *g = make_device_routed_group(*g, make_nccl_group(*g, device, options));
  }
  if (shape_.ep == 1) edp_ = dp_;
}

}  // namespace triad::dist
