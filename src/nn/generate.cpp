#include "triad/nn/generate.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>

#include "triad/autograd/grad_mode.h"
#include "triad/core/rng.h"
#include "triad/nn/documents.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

// The Philox stream of generation draws (apart from every dropout stream).
constexpr uint64_t kSamplingStream = 0x67656e6572617465ULL;  // "generate"

}  // namespace

int64_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k, double u,
                     double top_p, double min_p) {
  const auto n = static_cast<int64_t>(logits.size());
  if (n == 0) throw ValueError("sample_token: no logits");
  if (!(temperature >= 0)) {
    throw ValueError("sample_token: temperature (" + std::to_string(temperature) +
                     ") must be >= 0");
  }
  if (top_k < 0)
    throw ValueError("sample_token: top_k (" + std::to_string(top_k) + ") must be >= 0");
  if (!(top_p > 0 && top_p <= 1)) {
    throw ValueError("sample_token: top_p (" + std::to_string(top_p) + ") must be in (0, 1]");
  }
  if (!(min_p >= 0 && min_p <= 1)) {
    throw ValueError("sample_token: min_p (" + std::to_string(min_p) + ") must be in [0, 1]");
  }
  // Ids by decreasing logit, ties by id (a stable order).
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  int64_t k = top_k == 0 ? n : std::min(top_k, n);
  auto before = [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  if (temperature == 0) return order[0];
  const double top = logits[order[0]];
  std::vector<double> weight(static_cast<size_t>(k));
  double total = 0;
  for (int64_t i = 0; i < k; ++i) {
    weight[i] = std::exp((logits[order[i]] - top) / temperature);
    total += weight[i];
  }
  if (top_p < 1) {
    // The nucleus: the most likely first, until they hold top_p (at least one).
    int64_t keep = 0;
    double held = 0;
    while (keep < k && (keep == 0 || held < top_p * total)) held += weight[keep++];
    k = keep;
    total = held;
  }
  if (min_p > 0) {
    // The weights fall from the first's, 1: keep those of at least min_p.
    int64_t keep = 1;
    while (keep < k && weight[keep] >= min_p) ++keep;
    for (int64_t i = keep; i < k; ++i) total -= weight[i];
    k = keep;
  }
  const double target = u * total;
  double cum = 0;
  for (int64_t i = 0; i < k; ++i) {
    cum += weight[i];
    if (target < cum) return order[i];
  }
  return order[k - 1];  // u rounding to the very end
}

namespace {

void check_penalties(const SamplingOptions& o) {
  if (!(o.repetition_penalty > 0) || !std::isfinite(o.repetition_penalty)) {
    throw ValueError("generate: repetition_penalty (" + std::to_string(o.repetition_penalty) +
                     ") must be positive (1: none)");
  }
  if (!std::isfinite(o.frequency_penalty) || !std::isfinite(o.presence_penalty)) {
    throw ValueError("generate: frequency_penalty (" + std::to_string(o.frequency_penalty) +
                     ") and presence_penalty (" + std::to_string(o.presence_penalty) +
                     ") must be finite");
  }
}

}  // namespace

void apply_penalties(std::vector<double>& logits, const std::vector<int64_t>& prompt,
                     const std::vector<int64_t>& output, const SamplingOptions& o) {
  check_penalties(o);
  const auto n = static_cast<int64_t>(logits.size());
  auto in_row = [&](int64_t id) { return id >= 0 && id < n; };
  if (o.repetition_penalty != 1) {
    std::vector<bool> seen(logits.size(), false);
    for (const auto* ids : {&prompt, &output}) {
      for (const int64_t id : *ids) {
        if (!in_row(id) || seen[id]) continue;
        seen[id] = true;
        double& l = logits[id];
        l = l > 0 ? l / o.repetition_penalty : l * o.repetition_penalty;
      }
    }
  }
  if (o.frequency_penalty != 0 || o.presence_penalty != 0) {
    std::vector<int64_t> count(logits.size(), 0);
    for (const int64_t id : output) {
      if (in_row(id)) ++count[id];
    }
    for (int64_t id = 0; id < n; ++id) {
      if (count[id] > 0) {
        logits[id] -= o.frequency_penalty * static_cast<double>(count[id]) + o.presence_penalty;
      }
    }
  }
}

std::vector<int64_t> generate(const Gpt& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& o) {
  const GptConfig& cfg = model.config();
  if (prompt.empty()) throw ValueError("generate: the prompt is empty (give at least one token)");
  if (o.max_new_tokens < 0) {
    throw ValueError("generate: max_new_tokens (" + std::to_string(o.max_new_tokens) +
                     ") must be >= 0");
  }
  check_penalties(o);
  if (!(o.min_p >= 0 && o.min_p <= 1)) {
    throw ValueError("generate: min_p (" + std::to_string(o.min_p) + ") must be in [0, 1]");
  }
  if (o.vocab_limit < 0 || o.vocab_limit > cfg.vocab_size) {
    throw ValueError("generate: vocab_limit (" + std::to_string(o.vocab_limit) +
                     ") must be in [0, vocab_size " + std::to_string(cfg.vocab_size) + "]");
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= cfg.vocab_size) {
      throw ValueError("generate: prompt token " + std::to_string(prompt[i]) + " at position " +
                       std::to_string(i) + " is not in [0, vocab_size " +
                       std::to_string(cfg.vocab_size) + ")");
    }
  }
  const int64_t limit = o.vocab_limit > 0 ? o.vocab_limit : cfg.vocab_size;
  autograd::InferenceGuard inference;
  const ForwardContext ctx{false, 0, 0};
  std::vector<int64_t> tokens = prompt, out;
  const Tensor w = model.named_parameters().front().second;  // (a copy: the list is a temporary)
  std::unique_ptr<KvCache> cache;
  if (o.kv_cache && o.max_new_tokens > 0) {
    cache = std::make_unique<KvCache>(cfg, 1, w.dtype(), w.device());
  }
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    const auto count = static_cast<int64_t>(tokens.size());
    Tensor logits;  // (1, 1, V): the last position's
    if (cache && count <= cfg.seq_len) {
      // The tokens the cache has not seen: the prompt first, then one.
      std::vector<int64_t> ids(tokens.begin() + cache->length, tokens.end());
      const auto n = static_cast<int64_t>(ids.size());
      logits = model.decode(from_vector(ids, {1, n}), *cache, /*last_only=*/true);
    } else {
      const int64_t window = std::min<int64_t>(count, cfg.seq_len);
      const Tensor ids =
          from_vector(std::vector<int64_t>(tokens.end() - window, tokens.end()), {1, window});
      // A sliding window's first keys, as the cached steps mask them (the
      // text is one document here, as it is to the cached steps).
      const ForwardContext wctx = with_one_document(cfg, ids, ctx, w.device());
      Tensor x = model.embed(ids, wctx);
      for (int64_t i = 0; i < cfg.n_layer; ++i) x = model.block(i).forward(x, wctx);
      // Only the last position's logits are needed.
      logits = model.head(narrow(x, 1, window - 1, 1));
    }
    std::vector<double> row =
        to_double_vector(narrow(reshape(logits, {cfg.vocab_size}), 0, 0, limit));
    apply_penalties(row, prompt, out, o);
    const double u = philox_uniform(o.seed, kSamplingStream, static_cast<uint64_t>(step));
    const int64_t next = sample_token(row, o.temperature, o.top_k, u, o.top_p, o.min_p);
    tokens.push_back(next);
    out.push_back(next);
    if (next == o.stop_token || (o.stop_when && o.stop_when(out))) break;
  }
  return out;
}

}  // namespace triad::nn
