#pragma once

#include <cstdint>
#include <string>

#include "triad/core/attention_heads.h"
#include "triad/nn/gpt.h"

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
//  - Auto: AllToAll where the heads share out, else AllGather.
enum class Exchange { Auto, AllToAll, AllGather, Ring };

// Whether `exchange` holds the balanced layout (layout.h): the all-gather
// and the ring.
inline bool balanced_layout(Exchange exchange) {
  return exchange == Exchange::AllGather || exchange == Exchange::Ring;
}

// "auto", "all_to_all", "all_gather", "ring" (ConfigError naming anything
// else and the choices, for `key`).
Exchange exchange_from_string(const std::string& name, const std::string& key = "parallel.cp_comm");
const char* exchange_name(Exchange exchange);

// Whether `heads` (a tensor-parallel rank's) share out over P ranks: the
// query heads a multiple of P, the key/value heads a multiple or a divisor.
bool heads_share_out(const AttentionHeads& heads, int64_t P);

// The exchange `requested` comes to for `cfg` under tp and cp ranks: Auto
// resolved, the others as they are (cp <= 1: AllToAll, which is no
// exchange at all).
Exchange resolve_exchange(Exchange requested, const nn::GptConfig& cfg, int64_t tp, int64_t cp);

// What a row's length must be a multiple of under cp ranks beside tp with
// `exchange`: cp (times tp under sequence parallelism), and 2 cp for the
// all-gather's and the ring's balanced layout (two half-chunks a rank;
// layout.h).
int64_t row_multiple(const nn::GptConfig& cfg, int64_t tp, int64_t cp, bool sequence_parallel,
                     Exchange exchange);

// What keeps `cfg` from context parallelism over `cp` ranks beside tensor
// parallelism over `tp` with `exchange`: a ConfigError naming the numbers
// when model.seq_len does not divide into cp chunks (cp * tp with sequence
// parallelism), or, for AllToAll, when its heads per tensor-parallel rank
// do not share out. (A mixture's expert capacity, which chooses among a
// micro-batch's tokens together, routes every chunk's: nn::MoeMlp::Chunks;
// longrope takes the whole row's factors.)
void check_context_parallel(const nn::GptConfig& cfg, int64_t tp, int64_t cp,
                            bool sequence_parallel, Exchange exchange = Exchange::Auto);

}  // namespace triad::cp
