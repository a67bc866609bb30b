#pragma once

#include "triad/core/attention_heads.h"
#include "triad/core/tensor.h"
#include "triad/dist/process_group.h"

namespace triad::cp {

// The two groups of hierarchical context parallelism (Exchange::AllToAllRing;
// Megatron-LM's a2a+p2p) that a context-parallel group of P ranks splits
// into: `a2a`, this rank's a2a consecutive ranks (a node's fast links), and
// `ring`, the P / a2a ranks at its place in every group (rank r of the
// context-parallel group is the ring's r / a2a-th and the a2a's r % a2a-th).
// Both null without it (dist::DeviceMesh::cp_a2a, cp_ring).
struct Hierarchy {
  dist::ProcessGroupPtr a2a, ring;
  bool defined() const { return a2a != nullptr && ring != nullptr; }
};

// Context parallelism's attention by an all-to-all inside each group and a
// ring across the groups: qkv (B, T / P, (q + 2 kv) D) is this rank's share
// of its group's two half-chunks (layout.h's hierarchical layout), all of
// `heads`. The group's all-to-all (sequence_to_heads) gives each of its
// ranks both half-chunks whole for an a2a-th of the heads; those ranks
// then run ring_attention with their counterparts in the other groups
// (P / a2a ring positions, each holding its half-chunks g and 2 P / a2a - 1
// - g: the ring's balanced layout), and a second all-to-all
// (heads_to_sequence) brings each rank its share of every head's output
// back -> (B, T / P, q D). The all-to-alls' bytes stay inside the groups;
// each ring hop carries a group's keys and values for an a2a-th of the
// heads. `starts` (B, T): the whole sequence's first keys, or undefined.
// The heads must share out over a2a ranks (heads_kept). Differentiable.
Tensor hierarchical_attention(const Tensor& qkv, const AttentionHeads& heads, const Tensor& starts,
                              const Hierarchy& groups);

}  // namespace triad::cp
