#include "triad/nn/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <set>
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
  // u rounding to the very end: the last token with any weight (a
  // suppressed one, at -inf, has none).
  int64_t last = k - 1;
  while (last > 0 && weight[last] == 0) --last;
  return order[last];
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

namespace {

// `name`: "the prompt", or "prompt 3" of a batch.
void check_prompt(const GptConfig& cfg, const std::vector<int64_t>& prompt,
                  const std::string& name) {
  if (prompt.empty()) throw ValueError("generate: " + name + " is empty (give at least one token)");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= cfg.vocab_size) {
      throw ValueError("generate: " + name + "'s token " + std::to_string(prompt[i]) +
                       " at position " + std::to_string(i) + " is not in [0, vocab_size " +
                       std::to_string(cfg.vocab_size) + ")");
    }
  }
}

}  // namespace

void check_sampling(const GptConfig& cfg, const SamplingOptions& o) {
  if (o.max_new_tokens < 0) {
    throw ValueError("generate: max_new_tokens (" + std::to_string(o.max_new_tokens) +
                     ") must be >= 0");
  }
  check_penalties(o);
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    throw ValueError("generate: temperature (" + std::to_string(o.temperature) +
                     ") must be a finite number >= 0 (0: greedy)");
  }
  if (o.top_k < 0) {
    throw ValueError("generate: top_k (" + std::to_string(o.top_k) + ") must be >= 0 (0: all)");
  }
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    throw ValueError("generate: top_p (" + std::to_string(o.top_p) + ") must be in (0, 1]");
  }
  if (!(o.min_p >= 0 && o.min_p <= 1)) {
    throw ValueError("generate: min_p (" + std::to_string(o.min_p) + ") must be in [0, 1]");
  }
  if (o.vocab_limit < 0 || o.vocab_limit > cfg.vocab_size) {
    throw ValueError("generate: vocab_limit (" + std::to_string(o.vocab_limit) +
                     ") must be in [0, vocab_size " + std::to_string(cfg.vocab_size) + "]");
  }
  const int64_t limit = o.vocab_limit > 0 ? o.vocab_limit : cfg.vocab_size;
  for (const int64_t id : o.suppress_tokens) {
    if (id < 0 || id >= cfg.vocab_size) {
      throw ValueError("generate: suppress_tokens holds " + std::to_string(id) +
                       ", not a token id in [0, " + std::to_string(cfg.vocab_size) + ")");
    }
  }
  for (const int64_t id : o.stop_tokens) {
    if (id < 0 || id >= cfg.vocab_size) {
      throw ValueError("generate: stop_tokens holds " + std::to_string(id) +
                       ", not a token id in [0, " + std::to_string(cfg.vocab_size) + ")");
    }
    if (std::find(o.suppress_tokens.begin(), o.suppress_tokens.end(), id) !=
        o.suppress_tokens.end()) {
      throw ValueError("generate: the stop token " + std::to_string(id) + " is in suppress_tokens");
    }
  }
  std::set<int64_t> below;
  for (const int64_t id : o.suppress_tokens) {
    if (id < limit) below.insert(id);
  }
  if (static_cast<int64_t>(below.size()) == limit) {
    throw ValueError("generate: suppress_tokens holds every id below " + std::to_string(limit) +
                     ": no token is left to produce");
  }
}

namespace {

// One text being continued: its prompt, every token so far, the new ones.
struct Sequence {
  const std::vector<int64_t>* prompt = nullptr;
  std::vector<int64_t> tokens, out;
  bool done = false;
};

// Takes the next token of `s` from its row of next-token logits (the first
// `limit` of them) and says whether `s` is finished. The draw is a pure
// function of (seed, the token's index in the output), so a text gets the
// same tokens alone or in a batch.
void take_next(std::vector<double> row, Sequence& s, const SamplingOptions& o,
               const std::function<bool(const std::vector<int64_t>&)>& stop_when) {
  for (const int64_t id : o.suppress_tokens) {
    if (id < static_cast<int64_t>(row.size()))
      row[static_cast<size_t>(id)] = -std::numeric_limits<double>::infinity();
  }
  apply_penalties(row, *s.prompt, s.out, o);
  const double u = philox_uniform(o.seed, kSamplingStream, static_cast<uint64_t>(s.out.size()));
  const int64_t next = sample_token(row, o.temperature, o.top_k, u, o.top_p, o.min_p);
  s.tokens.push_back(next);
  s.out.push_back(next);
  s.done = o.is_stop(next) || (stop_when && stop_when(s.out)) ||
           static_cast<int64_t>(s.out.size()) >= o.max_new_tokens;
}

// The next-token logits (1, 1, V) of the last model.seq_len tokens, run
// over the whole window (no cache).
Tensor window_logits(const Gpt& model, const std::vector<int64_t>& tokens, Device device) {
  const GptConfig& cfg = model.config();
  const auto count = static_cast<int64_t>(tokens.size());
  const int64_t window = std::min<int64_t>(count, cfg.seq_len);
  const Tensor ids =
      from_vector(std::vector<int64_t>(tokens.end() - window, tokens.end()), {1, window});
  // A sliding window's first keys, as the cached steps mask them (the text
  // is one document here, as it is to the cached steps).
  const ForwardContext ctx = with_one_document(cfg, ids, ForwardContext{false, 0, 0}, device);
  Tensor x = model.embed(ids, ctx);
  for (int64_t i = 0; i < cfg.n_layer; ++i) x = model.block(i).forward(x, ctx);
  return model.head(narrow(x, 1, window - 1, 1));  // only the last position's logits
}

// Row b's first `limit` logits of (B, 1, V) logits, on the host.
std::vector<std::vector<double>> logit_rows(const Tensor& logits, int64_t limit) {
  const int64_t B = logits.size(0), V = logits.size(2);
  const std::vector<double> all = to_double_vector(narrow(reshape(logits, {B, V}), 1, 0, limit));
  std::vector<std::vector<double>> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    rows[b].assign(all.begin() + b * limit, all.begin() + (b + 1) * limit);
  return rows;
}

}  // namespace

namespace {

// generate() with `session`'s cache when given (its tokens the prompt
// begins with are not decoded again), else a cache of its own.
std::vector<int64_t> generate_one(const Gpt& model, const std::vector<int64_t>& prompt,
                                  const SamplingOptions& o, GenerationSession* session) {
  const GptConfig& cfg = model.config();
  check_prompt(cfg, prompt, "the prompt");
  check_sampling(cfg, o);
  const int64_t limit = o.vocab_limit > 0 ? o.vocab_limit : cfg.vocab_size;
  autograd::InferenceGuard inference;
  Sequence s{&prompt, prompt, {}, o.max_new_tokens == 0};
  const Tensor w = model.named_parameters().front().second;  // (a copy: the list is a temporary)
  std::unique_ptr<KvCache> own;
  KvCache* cache = nullptr;
  if (session) session->reused = 0;
  if (o.kv_cache && !s.done) {
    if (session) {
      std::unique_ptr<KvCache>& c = session->cache;
      // A cache made for another model (or its dtype or device) starts over.
      const Shape layer{1, cfg.kv_heads(), cfg.seq_len, cfg.head_dim()};
      if (!c || static_cast<int64_t>(c->k.size()) != cfg.n_layer || c->k.front().shape() != layer ||
          c->k.front().dtype() != w.dtype() || !(c->k.front().device() == w.device())) {
        c = std::make_unique<KvCache>(cfg, 1, w.dtype(), w.device());
        session->tokens.clear();
      }
      c->row_start.clear();
      // The prompt's first tokens the cache holds (all but its last, whose
      // logits are the first draw's).
      size_t common = 0;
      const size_t held = std::min<size_t>(session->tokens.size(), static_cast<size_t>(c->length));
      while (common < held && common + 1 < prompt.size() &&
             session->tokens[common] == prompt[common])
        ++common;
      c->length = static_cast<int64_t>(common);
      session->reused = c->length;
      cache = c.get();
    } else {
      own = std::make_unique<KvCache>(cfg, 1, w.dtype(), w.device());
      cache = own.get();
    }
  }
  while (!s.done) {
    const auto count = static_cast<int64_t>(s.tokens.size());
    Tensor logits;  // (1, 1, V): the last position's
    if (cache && count <= cfg.seq_len) {
      // The tokens the cache has not seen: the prompt first, then one.
      std::vector<int64_t> ids(s.tokens.begin() + cache->length, s.tokens.end());
      const auto n = static_cast<int64_t>(ids.size());
      logits = model.decode(from_vector(ids, {1, n}), *cache, /*last_only=*/true);
    } else {
      logits = window_logits(model, s.tokens, w.device());
    }
    take_next(logit_rows(logits, limit).front(), s, o, o.stop_when);
  }
  if (session && cache) {
    // What the cache now holds: the text's first cache->length tokens.
    session->tokens.assign(s.tokens.begin(), s.tokens.begin() + cache->length);
  }
  return s.out;
}

}  // namespace

std::vector<int64_t> generate(const Gpt& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& o) {
  return generate_one(model, prompt, o, nullptr);
}

std::vector<int64_t> generate(const Gpt& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& o, GenerationSession& session) {
  return generate_one(model, prompt, o, &session);
}

std::vector<std::vector<int64_t>> generate_batch(
    const Gpt& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& o,
    const std::function<bool(size_t, const std::vector<int64_t>&)>& stop_when) {
  const GptConfig& cfg = model.config();
  for (size_t i = 0; i < prompts.size(); ++i)
    check_prompt(cfg, prompts[i], "prompt " + std::to_string(i));
  check_sampling(cfg, o);
  const int64_t limit = o.vocab_limit > 0 ? o.vocab_limit : cfg.vocab_size;
  autograd::InferenceGuard inference;
  const auto stop_of = [&](size_t i) -> std::function<bool(const std::vector<int64_t>&)> {
    if (!stop_when) return o.stop_when;
    return [&, i](const std::vector<int64_t>& out) {
      return (o.stop_when && o.stop_when(out)) || stop_when(i, out);
    };
  };
  std::vector<Sequence> seqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    seqs[i] = Sequence{&prompts[i], prompts[i], {}, o.max_new_tokens == 0};
  const Tensor w = model.named_parameters().front().second;
  // The texts whose prompts fit the context decode together in one
  // left-padded cache, a step at a time. A text leaves it when it is done,
  // or when it outgrows the context (it goes on alone, as generate() would,
  // over a sliding window); the cache then drops the padding no text needs.
  std::vector<int64_t> rows;  // the cache's rows' sequences
  int64_t longest = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto n = static_cast<int64_t>(seqs[i].tokens.size());
    if (o.kv_cache && !seqs[i].done && n <= cfg.seq_len) {
      rows.push_back(static_cast<int64_t>(i));
      longest = std::max(longest, n);
    }
  }
  if (!rows.empty()) {
    const auto B = static_cast<int64_t>(rows.size());
    KvCache cache(cfg, B, w.dtype(), w.device());
    cache.row_start.resize(static_cast<size_t>(B));
    // The prompts, right-aligned; the padding repeats each row's first token
    // (any id would do: no text sees it).
    std::vector<int64_t> ids(static_cast<size_t>(B * longest));
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<int64_t>& p = seqs[rows[b]].tokens;
      const int64_t pad = longest - static_cast<int64_t>(p.size());
      cache.row_start[b] = pad;
      for (int64_t t = 0; t < longest; ++t)
        ids[static_cast<size_t>(b * longest + t)] = t < pad ? p.front() : p[t - pad];
    }
    Tensor step = from_vector(ids, {B, longest});
    while (!rows.empty()) {
      const Tensor logits = model.decode(step, cache, /*last_only=*/true);
      const std::vector<std::vector<double>> next = logit_rows(logits, limit);
      for (size_t b = 0; b < rows.size(); ++b)
        take_next(next[b], seqs[rows[b]], o, stop_of(static_cast<size_t>(rows[b])));
      // Who stays: not done, and its text (the newest token too) still
      // within the context, as generate() keeps to its cache.
      std::vector<int64_t> keep;
      int64_t shift = cache.capacity();
      for (size_t b = 0; b < rows.size(); ++b) {
        const Sequence& s = seqs[rows[b]];
        if (s.done || static_cast<int64_t>(s.tokens.size()) > cfg.seq_len) continue;
        keep.push_back(static_cast<int64_t>(b));
        shift = std::min(shift, cache.start_of(static_cast<int64_t>(b)));
      }
      if (keep.empty()) break;
      // Rows leaving, or no slot left for the newest tokens: the cache keeps
      // the staying rows and drops the padding none of them needs. (A full
      // cache always has some: a staying row holds at most seq_len - 1
      // cached tokens, so it starts at slot 1 or later.)
      if (keep.size() != rows.size() || cache.length == cache.capacity()) {
        cache.keep_rows(keep, shift);
        std::vector<int64_t> staying;
        for (const int64_t b : keep) staying.push_back(rows[b]);
        rows = std::move(staying);
      }
      std::vector<int64_t> last;
      for (const int64_t r : rows) last.push_back(seqs[r].tokens.back());
      step = from_vector(last, {static_cast<int64_t>(rows.size()), 1});
    }
  }
  // Whatever is left (past the context, or without the cache) goes on alone.
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence& s = seqs[i];
    while (!s.done)
      take_next(logit_rows(window_logits(model, s.tokens, w.device()), limit).front(), s, o,
                stop_of(i));
  }
  std::vector<std::vector<int64_t>> out;
  out.reserve(seqs.size());
  for (auto& s : seqs) out.push_back(std::move(s.out));
  return out;
}

}  // namespace triad::nn
