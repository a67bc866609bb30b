#include "triad/parallel/context/exchange.h"

#include <numeric>

#include "triad/core/error.h"

namespace triad::cp {

Exchange exchange_from_string(const std::string& name, const std::string& key) {
  if (name == "auto") return Exchange::Auto;
  if (name == "all_to_all") return Exchange::AllToAll;
  if (name == "all_gather") return Exchange::AllGather;
  if (name == "ring") return Exchange::Ring;
  if (name == "all_to_all+ring") return Exchange::AllToAllRing;
  throw ConfigError(key + ": '" + name +
                    "' is not an exchange (auto, all_to_all, all_gather, ring or all_to_all+ring)");
}

Layout layout_of(Exchange exchange, int64_t P, int64_t a2a) {
  switch (exchange) {
    case Exchange::AllGather:
    case Exchange::Ring:
      return Layout::balanced(P);
    case Exchange::AllToAllRing:
      return Layout::hierarchical(P, a2a);
    case Exchange::Auto:
    case Exchange::AllToAll:
      break;
  }
  return Layout::contiguous(P);
}

const char* exchange_name(Exchange exchange) {
  switch (exchange) {
    case Exchange::Auto:
      return "auto";
    case Exchange::AllToAll:
      return "all_to_all";
    case Exchange::AllGather:
      return "all_gather";
    case Exchange::Ring:
      return "ring";
    case Exchange::AllToAllRing:
      return "all_to_all+ring";
  }
  return "?";
}

bool heads_share_out(const AttentionHeads& heads, int64_t P) {
  return P >= 1 && heads.q % P == 0 && (heads.kv % P == 0 || P % heads.kv == 0);
}

namespace {
AttentionHeads heads_per_rank(const nn::GptConfig& cfg, int64_t tp) {
  return {cfg.n_head / tp, cfg.kv_heads_per_rank(tp)};
}
}  // namespace

Exchange resolve_exchange(Exchange requested, const nn::GptConfig& cfg, int64_t tp, int64_t cp) {
  if (cp <= 1) return Exchange::AllToAll;
  if (requested != Exchange::Auto) return requested;
  return heads_share_out(heads_per_rank(cfg, tp), cp) ? Exchange::AllToAll : Exchange::AllGather;
}

namespace {
// Whether every block of `size` consecutive ranks of every group sits on one
// node.
bool blocks_within_nodes(const std::vector<std::vector<int>>& nodes, int64_t size) {
  for (const std::vector<int>& group : nodes) {
    for (size_t i = 0; i < group.size(); ++i) {
      if (group[i] != group[i - i % static_cast<size_t>(size)]) return false;
    }
  }
  return true;
}
}  // namespace

ExchangeChoice choose_exchange(Exchange requested, int64_t a2a, const nn::GptConfig& cfg,
                               int64_t tp, int64_t cp, bool sequence_parallel,
                               const std::vector<std::vector<int>>& nodes) {
  if (cp <= 1) return {};
  if (requested != Exchange::Auto)
    return {requested, requested == Exchange::AllToAllRing ? a2a : 1};
  const ExchangeChoice flat{resolve_exchange(requested, cfg, tp, cp), 1};
  if (blocks_within_nodes(nodes, cp)) return flat;
  for (int64_t size = cp / 2; size > 1; --size) {
    if (cp % size != 0 || !blocks_within_nodes(nodes, size) ||
        !heads_share_out(heads_per_rank(cfg, tp), size) ||
        cfg.seq_len % row_multiple(cfg, tp, cp, sequence_parallel, Exchange::AllToAllRing, size) !=
            0) {
      continue;
    }
    return {Exchange::AllToAllRing, size};
  }
  return flat;
}

int64_t row_multiple(const nn::GptConfig& cfg, int64_t tp, int64_t cp, bool sequence_parallel,
                     Exchange exchange, int64_t a2a) {
  if (cp <= 1) return sequence_parallel ? tp : 1;
  const Layout layout = layout_of(resolve_exchange(exchange, cfg, tp, cp), cp, a2a);
  return std::lcm(layout.row_multiple(), cp * (sequence_parallel ? tp : 1));
}

void check_context_parallel(const nn::GptConfig& cfg, int64_t tp, int64_t cp,
                            bool sequence_parallel, Exchange exchange, int64_t a2a) {
  const Exchange resolved = resolve_exchange(exchange, cfg, tp, cp);
  if (resolved == Exchange::AllToAllRing) {
    if (a2a <= 1 || a2a >= cp || cp % a2a != 0) {
      throw ConfigError("parallel.cp_a2a (" + std::to_string(a2a) +
                        ") must be a divisor of parallel.cp (" + std::to_string(cp) +
                        ") above 1 and below it under parallel.cp_comm all_to_all+ring (the "
                        "all-to-all's ranks; the ring takes cp / cp_a2a of them)");
    }
  } else if (a2a != 1) {
    throw ConfigError("parallel.cp_a2a (" + std::to_string(a2a) +
                      ") is for parallel.cp_comm all_to_all+ring only (here " +
                      (cp > 1 ? exchange_name(resolved) : "no context parallelism") + ")");
  }
  if (cp <= 1) return;
  const std::string layout =
      "parallel.cp (" + std::to_string(cp) + ") beside parallel.tp (" + std::to_string(tp) + ")";
  const AttentionHeads heads = heads_per_rank(cfg, tp);
  const int64_t shared = resolved == Exchange::AllToAllRing ? a2a : cp;
  if ((resolved == Exchange::AllToAll || resolved == Exchange::AllToAllRing) &&
      !heads_share_out(heads, shared)) {
    const std::string over = resolved == Exchange::AllToAll ? "cp" : "cp_a2a";
    throw ConfigError(layout + " with parallel.cp_comm " + exchange_name(resolved) +
                      ": model.n_head (" + std::to_string(cfg.n_head) +
                      ") and its key/value heads (" + std::to_string(cfg.kv_heads()) + ") leave " +
                      std::to_string(heads.q) + " query and " + std::to_string(heads.kv) +
                      " key/value heads on each tensor-parallel rank; the all-to-all needs the "
                      "query heads a multiple of " +
                      over + " (" + std::to_string(shared) +
                      ") and the key/value heads a multiple or a divisor of it (all_gather, or "
                      "ring, takes any heads)");
  }
  const int64_t chunks = row_multiple(cfg, tp, cp, sequence_parallel, exchange, a2a);
  if (cfg.seq_len % chunks != 0) {
    const Layout runs = layout_of(resolved, cp, a2a);
    throw ConfigError(
        layout + ": model.seq_len (" + std::to_string(cfg.seq_len) + ") must be divisible by cp" +
        (sequence_parallel ? " times tp (sequence parallelism)" : "") +
        (runs.ring == cp ? std::string(" and by 2 cp (two half-chunks a rank "
                                       "under parallel.cp_comm ") +
                               exchange_name(resolved) + ")"
         : runs.ring > 1
             ? " and by 2 cp / cp_a2a (two half-chunks each of the ring's " +
                   std::to_string(runs.ring) + " positions under parallel.cp_comm all_to_all+ring)"
             : std::string()) +
        " (" + std::to_string(chunks) + ")");
  }
}

}  // namespace triad::cp
