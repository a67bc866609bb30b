#include "triad/parallel/context/exchange.h"

#include <numeric>

#include "triad/core/error.h"

namespace triad::cp {

Exchange exchange_from_string(const std::string& name, const std::string& key) {
  if (name == "auto") return Exchange::Auto;
  if (name == "all_to_all") return Exchange::AllToAll;
  if (name == "all_gather") return Exchange::AllGather;
  if (name == "ring") return Exchange::Ring;
  throw ConfigError(key + ": '" + name +
                    "' is not an exchange (auto, all_to_all, all_gather or ring)");
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

int64_t row_multiple(const nn::GptConfig& cfg, int64_t tp, int64_t cp, bool sequence_parallel,
                     Exchange exchange) {
  if (cp <= 1) return sequence_parallel ? tp : 1;
  const int64_t chunks = cp * (sequence_parallel ? tp : 1);
  return balanced_layout(resolve_exchange(exchange, cfg, tp, cp)) ? std::lcm(chunks, 2 * cp)
                                                                  : chunks;
}

void check_context_parallel(const nn::GptConfig& cfg, int64_t tp, int64_t cp,
                            bool sequence_parallel, Exchange exchange) {
  if (cp <= 1) return;
  const std::string layout =
      "parallel.cp (" + std::to_string(cp) + ") beside parallel.tp (" + std::to_string(tp) + ")";
  const AttentionHeads heads = heads_per_rank(cfg, tp);
  if (resolve_exchange(exchange, cfg, tp, cp) == Exchange::AllToAll &&
      !heads_share_out(heads, cp)) {
    throw ConfigError(layout + " with parallel.cp_comm all_to_all: model.n_head (" +
                      std::to_string(cfg.n_head) + ") and its key/value heads (" +
                      std::to_string(cfg.kv_heads()) + ") leave " + std::to_string(heads.q) +
                      " query and " + std::to_string(heads.kv) +
                      " key/value heads on each tensor-parallel rank; the all-to-all needs the "
                      "query heads a multiple of cp and the key/value heads a multiple or a "
                      "divisor of it (all_gather, or auto, takes any heads)");
  }
  const int64_t chunks = row_multiple(cfg, tp, cp, sequence_parallel, exchange);
  if (cfg.seq_len % chunks != 0) {
    const Exchange resolved = resolve_exchange(exchange, cfg, tp, cp);
    const bool balanced = balanced_layout(resolved);
    throw ConfigError(layout + ": model.seq_len (" + std::to_string(cfg.seq_len) +
                      ") must be divisible by cp" +
                      (sequence_parallel ? " times tp (sequence parallelism)" : "") +
                      (balanced ? std::string(" and by 2 cp (two half-chunks a rank under "
                                              "parallel.cp_comm ") +
                                      exchange_name(resolved) + ")"
                                : std::string()) +
                      " (" + std::to_string(chunks) + ")");
  }
}

}  // namespace triad::cp
