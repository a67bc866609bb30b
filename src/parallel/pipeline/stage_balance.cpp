#include "triad/parallel/pipeline/stage_balance.h"

#include <algorithm>
#include <limits>
#include <string>

#include "triad/core/error.h"

namespace triad::pipeline {

StageWork stage_work(const nn::GptConfig& cfg, bool full_recompute) {
  // GptConfig::training_flops's terms, per layer: 2 FLOPs a weight of the
  // products (a mixture's router and top_k experts) and 4 * keys seen * q
  // for the scores, forward; backward twice.
  const double s = static_cast<double>(cfg.seq_len), h = static_cast<double>(cfg.d_model);
  const double f = static_cast<double>(cfg.ffn()), m = static_cast<double>(cfg.fc_width());
  // (Under model.mla the attention's own projections, and the scores'
  // width the mean of a query's and a value's.)
  const double attn = static_cast<double>(cfg.attention_weights());
  const double q = cfg.latent_attention()
                       ? static_cast<double>(cfg.n_head) *
                             static_cast<double>(cfg.latent_qk_dim() + cfg.mla.v_head_dim) / 2
                       : static_cast<double>(cfg.q_width());
  const double dense = 2.0 * (attn + h * m + f * h);
  const double moe = 2.0 * (attn + h * static_cast<double>(cfg.moe.experts) +
                            static_cast<double>(cfg.moe.top_k) * h *
                                static_cast<double>(cfg.expert_fc_width() + cfg.expert_ffn()));
  const double passes = full_recompute ? 4.0 : 3.0;
  StageWork work;
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const int64_t window = cfg.window_of(i);
    const double keys = window > 0 ? std::min(s, static_cast<double>(window)) : s;
    const double forward = (cfg.moe_layer(i) ? moe : dense) + 4.0 * keys * q;
    work.layer.push_back(passes * forward);
    work.forward.push_back(forward);
  }
  work.head = 3.0 * 2.0 * h * static_cast<double>(cfg.vocab_size);
  // Multi-token prediction's modules run beside the head: each a block (as
  // layer n_layer + k - 1), eh_proj (2h -> h) and the head again.
  for (int64_t k = 1; k <= cfg.mtp_layers; ++k) {
    const int64_t i = cfg.n_layer + k - 1, window = cfg.window_of(i);
    const double keys = window > 0 ? std::min(s, static_cast<double>(window)) : s;
    work.head += passes * ((cfg.moe_layer(i) ? moe : dense) + 4.0 * keys * q) +
                 3.0 * 2.0 * (2.0 * h * h) + 3.0 * 2.0 * h * static_cast<double>(cfg.vocab_size);
  }
  return work;
}

void check_stage_layers(const std::vector<int64_t>& counts, int64_t stages, int64_t n_layer) {
  if (static_cast<int64_t>(counts.size()) != stages) {
    throw ConfigError("parallel.stage_layers has " + std::to_string(counts.size()) +
                      " entries, expected parallel.pp * parallel.vpp = " + std::to_string(stages));
  }
  int64_t total = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    const bool end = s == 0 || s + 1 == counts.size();
    if (counts[s] < (end ? 0 : 1)) {
      throw ConfigError("parallel.stage_layers[" + std::to_string(s) + "] (" +
                        std::to_string(counts[s]) + ") must be >= " + (end ? "0" : "1") +
                        (end ? "" : " (only the first and the last stage may hold no layer)"));
    }
    total += counts[s];
  }
  if (total != n_layer) {
    throw ConfigError("parallel.stage_layers add up to " + std::to_string(total) +
                      " layers but model.n_layer is " + std::to_string(n_layer));
  }
}

std::vector<int64_t> stage_layers_around(int64_t n_layer, int64_t stages, int64_t first,
                                         int64_t last) {
  const std::string asked = std::string("parallel.stage_layers {") +
                            (first >= 0 ? "first: " + std::to_string(first) : "") +
                            (first >= 0 && last >= 0 ? ", " : "") +
                            (last >= 0 ? "last: " + std::to_string(last) : "") + "}";
  if (stages < 2) {
    throw ConfigError(asked + " needs a pipeline: parallel.pp * parallel.vpp is " +
                      std::to_string(stages));
  }
  const int64_t others = stages - (first >= 0) - (last >= 0);
  const int64_t rest = n_layer - std::max<int64_t>(first, 0) - std::max<int64_t>(last, 0);
  if (others == 0 && rest != 0) {
    throw ConfigError(asked + ": the two stages add up to " + std::to_string(n_layer - rest) +
                      " layers but model.n_layer is " + std::to_string(n_layer));
  }
  if (others > 0 && (rest < others || rest % others != 0)) {
    throw ConfigError(asked + ": the other " + std::to_string(others) + " of the " +
                      std::to_string(stages) + " stages must share the " + std::to_string(rest) +
                      " layers left of model.n_layer (" + std::to_string(n_layer) +
                      ") evenly, at least one each");
  }
  std::vector<int64_t> counts(static_cast<size_t>(stages), others > 0 ? rest / others : 0);
  if (first >= 0) counts.front() = first;
  if (last >= 0) counts.back() = last;
  return counts;
}

std::vector<int64_t> balanced_stage_layers(const nn::GptConfig& cfg, int pp, int vpp,
                                           bool full_recompute, int64_t recompute_layers) {
  const int64_t S = static_cast<int64_t>(pp) * vpp, L = cfg.n_layer;
  if (pp < 1 || vpp < 1) throw ConfigError("parallel.pp and parallel.vpp must be >= 1");
  if (L < S) {
    throw ConfigError("parallel.stage_layers auto: model.n_layer (" + std::to_string(L) +
                      ") must be at least parallel.pp * parallel.vpp (" + std::to_string(S) +
                      "), a layer per stage");
  }
  // (The layers' training without recomputation, the head's as it runs.)
  const StageWork work = stage_work(cfg), head = stage_work(cfg, full_recompute);
  std::vector<double> prefix(L + 1, 0.0), forward(L + 1, 0.0);
  for (int64_t i = 0; i < L; ++i) {
    prefix[i + 1] = prefix[i] + work.layer[i];
    forward[i + 1] = forward[i] + work.forward[i];
  }
  // Stage s (0-based) holding layers [j, i): its cost, the forward passes
  // of the ones it recomputes again.
  auto cost = [&](int64_t s, int64_t j, int64_t i) {
    const int64_t again = full_recompute ? recomputed_layers(i - j, recompute_layers) : 0;
    return prefix[i] - prefix[j] + forward[j + again] - forward[j] + (s == S - 1 ? head.head : 0.0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // Two passes over (stages, first layers): the least possible most
  // expensive stage, then the least sum of squares within it.
  // best[s][i]: stages 0..s over the first i layers. Every stage holds a
  // layer but the last (of several), which may hold the head alone; the
  // first's embedding costs next to nothing, so it keeps its layer.
  const auto least = [&](int64_t s) -> int64_t { return s == S - 1 && S > 1 ? 0 : 1; };
  auto solve = [&](double cap, bool squares, std::vector<std::vector<int64_t>>* cut) {
    std::vector<std::vector<double>> best(S, std::vector<double>(L + 1, inf));
    if (cut) cut->assign(S, std::vector<int64_t>(L + 1, -1));
    // (Stages after s hold at least `after` layers, stages up to s at least s + 1.)
    int64_t after = 0;
    for (int64_t t = 1; t < S; ++t) after += least(t);
    for (int64_t i = 1; i <= L - after; ++i) {
      const double c = cost(0, 0, i);
      if (c <= cap) best[0][i] = squares ? c * c : c;
    }
    for (int64_t s = 1; s < S; ++s) {
      after -= least(s);
      for (int64_t i = s + least(s); i <= L - after; ++i) {
        for (int64_t j = s; j <= i - least(s); ++j) {
          if (best[s - 1][j] == inf) continue;
          const double c = cost(s, j, i);
          if (c > cap) continue;
          const double v = squares ? best[s - 1][j] + c * c : std::max(best[s - 1][j], c);
          if (v < best[s][i]) {
            best[s][i] = v;
            if (cut) (*cut)[s][i] = j;
          }
        }
      }
    }
    return best[S - 1][L];
  };
  const double most = solve(inf, false, nullptr);
  std::vector<std::vector<int64_t>> cut;
  // A hair of slack: the two passes add the same costs in other orders.
  solve(most * (1 + 1e-12), true, &cut);
  std::vector<int64_t> counts(S);
  int64_t i = L;
  for (int64_t s = S - 1; s > 0; --s) {
    const int64_t j = cut[s][i];
    counts[s] = i - j;
    i = j;
  }
  counts[0] = i;
  return counts;
}

}  // namespace triad::pipeline
