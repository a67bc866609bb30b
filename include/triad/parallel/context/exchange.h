#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "triad/core/attention_heads.h"
#include "triad/nn/gpt.h"
#include "triad/parallel/context/layout.h"

namespace triad::cp {

// How a context-parallel group's attention layers reach the whole sequence
// (parallel.cp_comm). Either way each rank holds its tokens of every
// sequence (layout.h) for everything but the attention.
//  - AllToAll (DeepSpeed-Ulysses', ulysses.h): q, k and v go all-to-all so
//    that each rank attends over the whole sequence with a P-th of the
//    heads, and the output comes back the same way. Needs the heads to
//    share out (heads_kept); every rank does the same work.
//  - AllGather (Llama 3's, all_gather.h): the keys and values are gathered
//    along the sequence and each rank attends with its own queries over the
//    keys up to them; their gradient is reduce-scattered back. Any head
//    count. Its ranks hold the balanced layout (layout.h: half-chunks r and
//    2P - 1 - r), so that under the causal mask every rank does the same
//    attention work.
//  - Ring (ring attention, ring.h): the keys and values pass from rank to
//    rank in P steps, each rank attending its queries over the ones it
//    holds and folding the blocks together by their log-sum-exps; their
//    gradients go around again backward. The balanced layout too, any head
//    count, and nothing gathered is kept for backward (the all-gather keeps
//    a layer's whole keys and values): the exchange for long sequences.
//  - AllToAllRing (hierarchical.h; Megatron-LM's a2a+p2p): the all-to-all
//    inside groups of `a2a` consecutive ranks (parallel.cp_a2a; a node's
//    fast links), each group then a position of a ring of cp / a2a over the
//    slower ones: the all-to-all's bytes stay in the group, and the ring
//    passes keys and values for an a2a-th of the heads, a group's whole
//    share of the sequence at a time. Needs the heads to share out over
//    the a2a ranks.
//  - Auto: AllToAll where the heads share out, else AllGather; when a
//    context group spans nodes, AllToAllRing with all-to-alls inside them
//    where they fit (choose_exchange).
enum class Exchange { Auto, AllToAll, AllGather, Ring, AllToAllRing };

// The layout (layout.h) `exchange` holds over P ranks, all-to-alls of `a2a`
// under AllToAllRing: contiguous for the all-to-all, balanced for the
// all-gather and the ring, hierarchical for the two together. (Auto
// resolved first: resolve_exchange.)
Layout layout_of(Exchange exchange, int64_t P, int64_t a2a = 1);

// "auto", "all_to_all", "all_gather", "ring", "all_to_all+ring" (ConfigError
// naming anything else and the choices, for `key`).
Exchange exchange_from_string(const std::string& name, const std::string& key = "parallel.cp_comm");
const char* exchange_name(Exchange exchange);

// Whether `heads` (a tensor-parallel rank's) share out over P ranks: the
// query heads a multiple of P, the key/value heads a multiple or a divisor.
bool heads_share_out(const AttentionHeads& heads, int64_t P);

// The exchange `requested` comes to for `cfg` under tp and cp ranks: Auto
// resolved, the others as they are (cp <= 1: AllToAll, which is no
// exchange at all).
Exchange resolve_exchange(Exchange requested, const nn::GptConfig& cfg, int64_t tp, int64_t cp);

// An exchange made concrete, with its all-to-alls' ranks (1 but under
// AllToAllRing).
struct ExchangeChoice {
  Exchange exchange = Exchange::AllToAll;
  int64_t a2a = 1;
  bool operator==(const ExchangeChoice&) const = default;
};

// What `requested` (with all-to-alls of `a2a`) comes to on the nodes the
// ranks run on: `nodes` holds each context group's ranks' nodes, in the
// group's order (dist::MeshShape::context_groups). A concrete exchange is
// kept as it is. Auto, when every group sits on one node, is
// resolve_exchange's choice; when a group spans nodes, it is AllToAllRing
// with the largest a2a (a divisor of cp above 1 and below it) whose blocks
// of consecutive ranks each sit on one node in every group, whose heads
// share out over it and whose layout model.seq_len divides into (the
// all-to-alls on a node's links, the ring over the slower ones between the
// nodes), and resolve_exchange's choice where no a2a fits. The trainer
// chooses by the nodes it finds (dist::NodeInfo), the planner by its
// cluster's GPUs per node.
ExchangeChoice choose_exchange(Exchange requested, int64_t a2a, const nn::GptConfig& cfg,
                               int64_t tp, int64_t cp, bool sequence_parallel,
                               const std::vector<std::vector<int>>& nodes);

// What a row's length must be a multiple of under cp ranks beside tp with
// `exchange` (all-to-alls of `a2a` under AllToAllRing): cp (times tp under
// sequence parallelism), and twice the ring's positions for the balanced
// and hierarchical layouts (two half-chunks a ring position; layout.h).
int64_t row_multiple(const nn::GptConfig& cfg, int64_t tp, int64_t cp, bool sequence_parallel,
                     Exchange exchange, int64_t a2a = 1);

// What keeps `cfg` from context parallelism over `cp` ranks beside tensor
// parallelism over `tp` with `exchange` (all-to-alls of `a2a` under
// AllToAllRing): a ConfigError naming the numbers when model.seq_len does
// not divide into the layout's runs (row_multiple), when the heads per
// tensor-parallel rank do not share out over the all-to-all's ranks, or
// when `a2a` is not a divisor of cp strictly between 1 and cp (AllToAllRing)
// or not 1 (the others). (A mixture's expert capacity, which chooses among
// a micro-batch's tokens together, routes every chunk's:
// nn::MoeMlp::Chunks; longrope takes the whole row's factors.)
void check_context_parallel(const nn::GptConfig& cfg, int64_t tp, int64_t cp,
                            bool sequence_parallel, Exchange exchange = Exchange::Auto,
                            int64_t a2a = 1);

}  // namespace triad::cp
