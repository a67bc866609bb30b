#include "triad/nn/evaluate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <string>

#include "triad/autograd/grad_mode.h"
#include "triad/nn/documents.h"
#include "triad/nn/kv_cache.h"
#include "triad/ops.h"

namespace triad::nn {

namespace {

// Requests (those at `which`) each read as one row: `batch_rows` rows at a
// time, longest first, each batch padded to its longest row.
// `short_rows` (a longrope model's original context; 0: none): rows of at
// most that many inputs never share a batch with longer ones, so each row
// takes the factors it would read alone.
void score_rows(const Gpt& model, const std::vector<ContinuationRequest>& requests,
                const std::vector<size_t>& which, int64_t batch_rows, bool greedy,
                std::vector<ContinuationScore>& out, ScoringWork& work, size_t short_rows = 0) {
  const GptConfig& cfg = model.config();
  const Device device = model.head_weight().device();
  // Longest first, so that a batch's rows are about as long (little
  // padding); each score goes back to its request's place.
  auto length = [&](size_t r) {
    return std::min(requests[r].context.size() + requests[r].continuation.size() - 1,
                    static_cast<size_t>(cfg.seq_len));
  };
  std::vector<size_t> order = which;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return length(a) > length(b); });
  const size_t boundary =
      short_rows > 0
          ? static_cast<size_t>(std::find_if(order.begin(), order.end(),
                                             [&](size_t r) { return length(r) <= short_rows; }) -
                                order.begin())
          : order.size();
  for (size_t first = 0; first < order.size();) {
    const size_t group_end = first < boundary ? boundary : order.size();
    const size_t last = std::min(group_end, first + static_cast<size_t>(batch_rows));
    const auto rows = static_cast<int64_t>(last - first);
    // Each row's input: context and continuation less the last token, cut
    // from the left to seq_len.
    std::vector<std::vector<int64_t>> inputs;
    int64_t width = 0;
    for (size_t k = first; k < last; ++k) {
      inputs.push_back(request_row(requests[order[k]], cfg.seq_len).inputs);
      width = std::max(width, static_cast<int64_t>(inputs.back().size()));
    }
    std::vector<int64_t> ids(static_cast<size_t>(rows * width), 0);  // padded with token 0
    for (int64_t b = 0; b < rows; ++b) {
      std::copy(inputs[b].begin(), inputs[b].end(), ids.begin() + b * width);
    }
    const Tensor batch = from_vector(ids, {rows, width});
    work.positions += rows * width;
    // One document per row, as generate reads text.
    const ForwardContext ctx = with_one_document(cfg, batch, {false, 0, 0}, device);
    Tensor x = model.embed(batch, ctx);
    for (int64_t i = 0; i < cfg.n_layer; ++i) x = model.block(i).forward(x, ctx);
    std::vector<Tensor> means, logits;
    std::vector<std::vector<int64_t>> conts;
    for (int64_t b = 0; b < rows; ++b) {
      const auto& cont = requests[order[first + static_cast<size_t>(b)]].continuation;
      const auto n = static_cast<int64_t>(cont.size());
      const auto len = static_cast<int64_t>(inputs[b].size());
      // Logits only where they predict the continuation (the row's last n
      // positions): context positions cost no head and hold no logits.
      // Kept past the row's loss only for the greedy check (a perplexity
      // window's are seq_len x V).
      const Tensor row_logits = model.head(narrow(narrow(x, 0, b, 1), 1, len - n, n));
      means.push_back(
          reshape(cast(cross_entropy(row_logits, from_vector(cont, {1, n})), DType::F64), {1}));
      if (greedy) {
        logits.push_back(row_logits);
        conts.push_back(cont);
      }
    }
    // The batch's scores in one read (a GPU waits once per batch, not per row).
    const std::vector<double> mean = to_double_vector(concat(means, 0));
    const std::vector<bool> matches = greedy ? argmax_matches(logits, conts) : std::vector<bool>();
    for (int64_t b = 0; b < rows; ++b) {
      const size_t r = order[first + static_cast<size_t>(b)];
      const auto n = static_cast<int64_t>(requests[r].continuation.size());
      out[r] = {mean[b] * static_cast<double>(n), n, greedy && matches[static_cast<size_t>(b)]};
    }
    first = last;
  }
}

// A beginning several contexts share (the few-shot examples before each
// question of a subject), its keys and values computed once, as one row.
struct SharedPrefix {
  std::vector<int64_t> tokens;
  std::optional<KvCache> cache;
};

// A batch's key/value cache over contexts that all begin with `prefix`,
// left-padded to `width`: the prefix's cached slots are copied into each row
// (a row's positions count from its start, so they are the same keys and
// values wherever the row starts), and only what follows the slots all rows
// can take from it runs through the model (`ids`, (G, width - filled)).
// Returns that run's ids; `cache` is filled to `filled` slots.
Tensor place_shared_prefix(const Gpt& model, SharedPrefix& prefix,
                           const std::vector<const std::vector<int64_t>*>& contexts, int64_t width,
                           KvCache& cache, ScoringWork& work) {
  const GptConfig& cfg = model.config();
  const Tensor& w = model.head_weight();
  const auto p = static_cast<int64_t>(prefix.tokens.size());
  if (!prefix.cache) {
    prefix.cache.emplace(cfg, 1, w.dtype(), w.device());
    model.decode_hidden(from_vector(prefix.tokens, {1, p}), *prefix.cache);
    work.positions += p;
    work.shared_prefix_positions += p;
    ++work.shared_prefixes;
  }
  // Every row runs at least its last token (its logits predict the first
  // continuation token); the slots before what the longest remainder needs
  // come from the prefix.
  const auto G = static_cast<int64_t>(contexts.size());
  int64_t run = 1;
  for (const auto* c : contexts) run = std::max(run, static_cast<int64_t>(c->size()) - p);
  const int64_t filled = width - run;
  for (const auto& [to_list, from_list] :
       {std::pair{&cache.k, &prefix.cache->k}, std::pair{&cache.v, &prefix.cache->v}}) {
    for (size_t l = 0; l < to_list->size(); ++l) {
      Tensor& t = (*to_list)[l];
      t = zeros(t.shape(), t.dtype(), t.device());  // padding slots hold no stray values
      const Tensor& from = (*from_list)[l];
      for (int64_t g = 0; g < G; ++g) {
        const int64_t pad = cache.row_start[static_cast<size_t>(g)];
        const int64_t n = filled - pad;  // the prefix slots this row takes
        if (n <= 0) continue;
        Tensor to = narrow(narrow(t, 0, g, 1), 2, pad, n);
        copy_(to, narrow(from, 2, 0, n));
      }
    }
  }
  cache.length = filled;
  std::vector<int64_t> ids(static_cast<size_t>(G * run), 0);
  for (int64_t g = 0; g < G; ++g) {
    // The row's last `run` slots: padding, then the context's tokens.
    const auto& c = *contexts[static_cast<size_t>(g)];
    const int64_t pad = cache.row_start[static_cast<size_t>(g)];
    for (int64_t j = 0; j < run; ++j) {
      const int64_t slot = filled + j;
      if (slot >= pad) ids[static_cast<size_t>(g * run + j)] = c[static_cast<size_t>(slot - pad)];
    }
  }
  return from_vector(ids, {G, run});
}

// Requests that share a context (a multiple-choice question's choices),
// groups of `groups`: each batch's contexts run once, left-padded, into a
// key/value cache, whose rows are then copied for each continuation, and the
// continuations decode together (right-padded: a causal model's scores do
// not see what follows). A continuation's first token is scored by its
// context's last logits, the others by the decoding step's. Groups of one
// family (`family[i]`, an index into `prefixes`, or -1) batch together, and
// their shared beginning is read once for all of them.
void score_shared_contexts(const Gpt& model, const std::vector<ContinuationRequest>& requests,
                           const std::vector<std::vector<size_t>>& groups,
                           const std::vector<int>& family, std::vector<SharedPrefix>& prefixes,
                           int64_t batch_rows, bool greedy, std::vector<ContinuationScore>& out,
                           ScoringWork& work) {
  const GptConfig& cfg = model.config();
  const Tensor& w = model.head_weight();
  auto context_of = [&](const std::vector<size_t>& g) -> const std::vector<int64_t>& {
    return requests[g.front()].context;
  };
  auto longest_continuation = [&](const std::vector<size_t>& g) {
    size_t n = 0;
    for (size_t r : g) n = std::max(n, requests[r].continuation.size());
    return static_cast<int64_t>(n);
  };
  for (size_t first = 0; first < groups.size();) {
    // Groups while their continuations fit batch_rows (one at least) and the
    // longest context and continuation fit the window together.
    size_t last = first;
    int64_t rows = 0, width = 0, longest = 0;
    while (last < groups.size()) {
      const auto& g = groups[last];
      const int64_t r = rows + static_cast<int64_t>(g.size());
      const int64_t w_ = std::max(width, static_cast<int64_t>(context_of(g).size()));
      const int64_t n = std::max(longest, longest_continuation(g));
      if (last > first &&
          (r > batch_rows || w_ + n - 1 > cfg.seq_len || family[last] != family[first]))
        break;
      rows = r, width = w_, longest = n;
      ++last;
    }
    const auto G = static_cast<int64_t>(last - first);
    KvCache cache(cfg, G, w.dtype(), w.device());
    cache.row_start.assign(static_cast<size_t>(G), 0);
    std::vector<int64_t> ids(static_cast<size_t>(G * width), 0);  // left-padded with token 0
    for (int64_t g = 0; g < G; ++g) {
      const auto& ctx = context_of(groups[first + static_cast<size_t>(g)]);
      const int64_t pad = width - static_cast<int64_t>(ctx.size());
      cache.row_start[static_cast<size_t>(g)] = pad;
      std::copy(ctx.begin(), ctx.end(), ids.begin() + g * width + pad);
    }
    // (G, 1, V): what each context predicts first.
    Tensor head;
    if (family[first] >= 0) {
      std::vector<const std::vector<int64_t>*> contexts;
      for (int64_t g = 0; g < G; ++g)
        contexts.push_back(&context_of(groups[first + static_cast<size_t>(g)]));
      const Tensor rest = place_shared_prefix(model, prefixes[static_cast<size_t>(family[first])],
                                              contexts, width, cache, work);
      work.positions += rest.numel();
      head = model.decode(rest, cache, true);
    } else {
      work.positions += G * width;
      head = model.decode(from_vector(ids, {G, width}), cache, true);
    }
    // The continuations, longest first, each with its context's cache row.
    std::vector<int64_t> copies;  // the cache row of each continuation
    std::vector<size_t> order;    // the request of each
    for (int64_t g = 0; g < G; ++g) {
      for (size_t r : groups[first + static_cast<size_t>(g)]) {
        copies.push_back(g);
        order.push_back(r);
      }
    }
    auto tokens_of = [&](int64_t k) {
      return static_cast<int64_t>(requests[order[static_cast<size_t>(k)]].continuation.size());
    };
    std::vector<int64_t> by_length(static_cast<size_t>(rows));
    std::iota(by_length.begin(), by_length.end(), int64_t{0});
    std::stable_sort(by_length.begin(), by_length.end(),
                     [&](int64_t a, int64_t b) { return tokens_of(a) > tokens_of(b); });
    // Each continuation's logits (1, n, V): the first from its context's,
    // the rest from decoding its tokens after the context.
    std::vector<Tensor> logits(static_cast<size_t>(rows));
    for (int64_t k = 0; k < rows; ++k) logits[k] = narrow(head, 0, copies[k], 1);
    // Runs of about one length decode together (right-padded to the run's
    // longest): a run ends before the row that would leave more than a
    // quarter of its positions padding. Each run takes its rows' copies of
    // the contexts' cache.
    for (size_t at = 0; at < by_length.size();) {
      const int64_t width = tokens_of(by_length[at]) - 1;  // the run's longest, less one
      size_t end = at + 1;
      int64_t used = width;
      while (end < by_length.size() && 4 * (used + tokens_of(by_length[end]) - 1) >=
                                           3 * width * static_cast<int64_t>(end - at + 1)) {
        used += tokens_of(by_length[end]) - 1;
        ++end;
      }
      if (width > 0) {
        const auto run = static_cast<int64_t>(end - at);
        std::vector<int64_t> run_rows, next(static_cast<size_t>(run * width), 0);
        for (int64_t i = 0; i < run; ++i) {
          const int64_t k = by_length[at + static_cast<size_t>(i)];
          run_rows.push_back(copies[k]);
          const auto& cont = requests[order[k]].continuation;
          std::copy(cont.begin(), cont.end() - 1, next.begin() + i * width);
        }
        KvCache copy = cache;  // keep_rows gives the copy tensors of its own
        copy.keep_rows(run_rows, 0);
        work.positions += run * width;
        const Tensor hidden = model.decode_hidden(from_vector(next, {run, width}), copy);
        for (int64_t i = 0; i < run; ++i) {
          const int64_t k = by_length[at + static_cast<size_t>(i)];
          const int64_t n = tokens_of(k);
          // The head only where the row's tokens are (not on its padding).
          if (n > 1) {
            logits[k] =
                concat({logits[k], model.head(narrow(narrow(hidden, 0, i, 1), 1, 0, n - 1))}, 1);
          }
        }
      }
      at = end;
    }
    std::vector<Tensor> means;
    std::vector<std::vector<int64_t>> conts;
    for (int64_t k = 0; k < rows; ++k) {
      const auto& cont = requests[order[static_cast<size_t>(k)]].continuation;
      if (greedy) conts.push_back(cont);
      means.push_back(reshape(
          cast(cross_entropy(logits[k], from_vector(cont, {1, tokens_of(k)})), DType::F64), {1}));
    }
    const std::vector<double> mean = to_double_vector(concat(means, 0));  // one read
    const std::vector<bool> matches = greedy ? argmax_matches(logits, conts) : std::vector<bool>();
    for (int64_t k = 0; k < rows; ++k) {
      const size_t r = order[static_cast<size_t>(k)];
      const auto n = static_cast<int64_t>(requests[r].continuation.size());
      out[r] = {mean[static_cast<size_t>(k)] * static_cast<double>(n), n,
                greedy && matches[static_cast<size_t>(k)]};
    }
    // A family's batches are neighbours: past its last, its beginning's
    // cache (a row of seq_len slots per layer) is let go.
    if (family[first] >= 0 && (last == groups.size() || family[last] != family[first]))
      prefixes[static_cast<size_t>(family[first])].cache.reset();
    first = last;
  }
}

}  // namespace

std::vector<bool> argmax_matches(const std::vector<Tensor>& logits,
                                 const std::vector<std::vector<int64_t>>& targets) {
  if (logits.size() != targets.size()) {
    throw ValueError("argmax_matches: " + std::to_string(logits.size()) + " rows of logits, " +
                     std::to_string(targets.size()) + " of targets");
  }
  if (logits.empty()) return {};
  for (size_t k = 0; k < logits.size(); ++k) {
    const Tensor& l = logits[k];
    if (l.dim() != 3 || l.size(0) != 1 || l.size(1) != static_cast<int64_t>(targets[k].size()) ||
        l.size(2) != logits.front().size(2)) {
      throw ValueError("argmax_matches: row " + std::to_string(k) + "'s logits are " +
                       shape_str(l.shape()) + ", expected [1, " +
                       std::to_string(targets[k].size()) + ", " +
                       std::to_string(logits.front().size(2)) + "] for its targets");
    }
  }
  const std::vector<double> all = to_double_vector(concat(logits, 1));
  const auto V = static_cast<size_t>(logits.front().size(2));
  std::vector<bool> out;
  size_t row = 0;
  for (size_t k = 0; k < targets.size(); ++k) {
    bool match = true;
    for (const int64_t want : targets[k]) {
      const auto first = all.begin() + static_cast<std::ptrdiff_t>(row++ * V);
      if (want == -100) continue;
      if (want < 0 || static_cast<size_t>(want) >= V) {
        throw ValueError("argmax_matches: row " + std::to_string(k) + " has target " +
                         std::to_string(want) + ", outside [0, " + std::to_string(V) +
                         ") (-100: ignored)");
      }
      const auto best = std::max_element(first, first + static_cast<std::ptrdiff_t>(V));
      match = match && best - first == want;
    }
    out.push_back(match);
  }
  return out;
}

std::vector<bool> rows_argmax_match(
    const Tensor& targets, const std::function<Tensor(int64_t, int64_t, int64_t)>& logits_of) {
  if (targets.dim() != 2) {
    throw ShapeError("rows_argmax_match: targets are " + shape_str(targets.shape()) +
                     ", expected (B, T)");
  }
  const Tensor host = contiguous(cast(to_device(targets, Device::cpu()), DType::I64));
  const int64_t B = host.size(0), T = host.size(1);
  const int64_t* p = host.data<int64_t>();
  std::vector<Tensor> logits;
  std::vector<std::vector<int64_t>> wanted;
  std::vector<int64_t> row_of;  // the batch row of each entry
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* row = p + b * T;
    int64_t first = 0, last = T - 1;
    while (first < T && row[first] == -100) ++first;
    while (last >= first && row[last] == -100) --last;
    if (first > last) continue;  // nothing scored
    logits.push_back(logits_of(b, first, last - first + 1));
    wanted.emplace_back(row + first, row + last + 1);
    row_of.push_back(b);
  }
  std::vector<bool> out(static_cast<size_t>(B), true);
  const std::vector<bool> matches = argmax_matches(logits, wanted);
  for (size_t k = 0; k < matches.size(); ++k) out[static_cast<size_t>(row_of[k])] = matches[k];
  return out;
}

std::vector<ContinuationScore> score_continuations(const Gpt& model,
                                                   const std::vector<ContinuationRequest>& requests,
                                                   int64_t batch_rows, bool greedy,
                                                   ScoringWork* work) {
  const GptConfig& cfg = model.config();
  ScoringWork done;
  if (batch_rows < 1) {
    throw ValueError("score_continuations: batch_rows (" + std::to_string(batch_rows) +
                     ") must be >= 1");
  }
  for (size_t r = 0; r < requests.size(); ++r) {
    const auto& q = requests[r];
    const std::string which = "score_continuations: request " + std::to_string(r);
    if (q.context.empty()) {
      throw ValueError(which + " has an empty context (the first token has nothing to follow: " +
                       "begin it with a BOS or end-of-text token)");
    }
    if (q.continuation.empty()) throw ValueError(which + " has an empty continuation");
    if (static_cast<int64_t>(q.continuation.size()) > cfg.seq_len) {
      throw ValueError(which + "'s continuation has " + std::to_string(q.continuation.size()) +
                       " tokens, more than the model's window (seq_len " +
                       std::to_string(cfg.seq_len) + ") can score at once");
    }
    for (const auto* part : {&q.context, &q.continuation}) {
      for (size_t i = 0; i < part->size(); ++i) {
        const int64_t id = (*part)[i];
        if (id < 0 || id >= cfg.vocab_size) {
          throw ValueError(which + ": " + (part == &q.context ? "context" : "continuation") +
                           " token " + std::to_string(id) + " at position " + std::to_string(i) +
                           " is not in [0, vocab_size " + std::to_string(cfg.vocab_size) + ")");
        }
      }
    }
  }
  autograd::InferenceGuard inference;
  std::vector<ContinuationScore> out(requests.size());
  // Requests with the same context, in their first request's order; a
  // context shared by several runs once when it fits the window with its
  // longest continuation, every other request is a row of its own.
  std::map<std::vector<int64_t>, size_t> group_of;
  std::vector<std::vector<size_t>> groups;
  for (size_t r = 0; r < requests.size(); ++r) {
    const auto [at, fresh] = group_of.try_emplace(requests[r].context, groups.size());
    if (fresh) groups.emplace_back();
    groups[at->second].push_back(r);
  }
  std::vector<std::vector<size_t>> shared;
  std::vector<size_t> alone;
  // A longrope model takes its factors by how far a forward pass reaches,
  // and contexts and continuations read apart reach less far than the
  // request: when some request reaches past the original context, every
  // request is a row of its own, those within the original context in
  // batches apart (the factors each would take read alone).
  size_t short_rows = 0;
  if (cfg.rope_scaling.kind == RopeScaling::Kind::LongRope) {
    size_t context = 0, continuation = 0;
    for (const auto& q : requests) {
      context = std::max(context, q.context.size());
      continuation = std::max(continuation, q.continuation.size());
    }
    if (static_cast<double>(context + continuation) - 1 > cfg.rope_scaling.original_seq_len) {
      short_rows = static_cast<size_t>(cfg.rope_scaling.original_seq_len);
      for (auto& g : groups) alone.insert(alone.end(), g.begin(), g.end());
      groups.clear();
    }
  }
  for (auto& g : groups) {
    size_t longest = 0;
    for (size_t r : g) longest = std::max(longest, requests[r].continuation.size());
    if (g.size() > 1 &&
        requests[g.front()].context.size() + longest - 1 <= static_cast<size_t>(cfg.seq_len)) {
      shared.push_back(std::move(g));
    } else {
      alone.insert(alone.end(), g.begin(), g.end());
    }
  }
  // Families: contexts that begin alike (few-shot examples before each
  // question) are neighbours in the contexts' order. A run of neighbours
  // that each share their first kSharedPrefixTokens tokens or more with the
  // next is cut into the families that save the most positions (a family
  // of n reads its common beginning once instead of n times), so that the
  // questions whose examples are the same five are one family with all
  // five as its beginning, not one with the heading that every question of
  // the run shares. Each family's groups, and the groups of no family, go
  // longest context first (little padding).
  std::stable_sort(shared.begin(), shared.end(), [&](const auto& a, const auto& b) {
    return requests[a.front()].context < requests[b.front()].context;
  });
  auto common = [&](const std::vector<size_t>& a, const std::vector<size_t>& b) {
    const auto& x = requests[a.front()].context;
    const auto& y = requests[b.front()].context;
    const auto n = std::min(x.size(), y.size());
    return static_cast<int64_t>(std::mismatch(x.begin(), x.begin() + n, y.begin()).first -
                                x.begin());
  };
  auto longer = [&](const auto& a, const auto& b) {
    return requests[a.front()].context.size() > requests[b.front()].context.size();
  };
  std::vector<std::vector<size_t>> ordered, loners;
  std::vector<int> family;
  std::vector<SharedPrefix> prefixes;
  for (size_t run = 0; run < shared.size();) {
    // The run [run, end) and its neighbours' common lengths.
    std::vector<int64_t> next{};
    size_t end = run + 1;
    while (end < shared.size()) {
      const int64_t c = common(shared[end - 1], shared[end]);
      if (c < kSharedPrefixTokens) break;
      next.push_back(c);
      ++end;
    }
    // best[k]: the most positions families of the run's first k groups
    // save; cut[k]: where the last of them begins. A family [i, k) shares
    // the least of its neighbours' common lengths (the contexts are sorted).
    const size_t m = end - run;
    std::vector<int64_t> best(m + 1, 0);
    std::vector<size_t> cut(m + 1, 0);
    for (size_t k = 1; k <= m; ++k) {
      best[k] = best[k - 1];  // group k - 1 alone
      cut[k] = k - 1;
      int64_t p = std::numeric_limits<int64_t>::max();
      for (size_t i = k - 1; i-- > 0;) {
        p = std::min(p, next[i]);
        const int64_t saved = best[i] + static_cast<int64_t>(k - 1 - i) * p;
        if (saved > best[k]) {
          best[k] = saved;
          cut[k] = i;
        }
      }
    }
    std::vector<std::pair<size_t, size_t>> parts;  // [first, last) within the run
    for (size_t k = m; k > 0; k = cut[k]) parts.emplace_back(cut[k], k);
    std::reverse(parts.begin(), parts.end());
    for (const auto& [a, b] : parts) {
      const size_t i = run + a, j = run + b;
      if (j - i < 2) {
        loners.push_back(std::move(shared[i]));
        continue;
      }
      const int64_t p = common(shared[i], shared[j - 1]);  // the family's: its ends' (sorted)
      const auto& first = requests[shared[i].front()].context;
      prefixes.push_back({std::vector<int64_t>(first.begin(), first.begin() + p), std::nullopt});
      std::stable_sort(shared.begin() + static_cast<std::ptrdiff_t>(i),
                       shared.begin() + static_cast<std::ptrdiff_t>(j), longer);
      for (size_t k = i; k < j; ++k) {
        ordered.push_back(std::move(shared[k]));
        family.push_back(static_cast<int>(prefixes.size()) - 1);
      }
    }
    run = end;
  }
  std::stable_sort(loners.begin(), loners.end(), longer);
  for (auto& g : loners) {
    ordered.push_back(std::move(g));
    family.push_back(-1);
  }
  score_shared_contexts(model, requests, ordered, family, prefixes, batch_rows, greedy, out, done);
  std::sort(alone.begin(), alone.end());
  score_rows(model, requests, alone, batch_rows, greedy, out, done, short_rows);
  if (work != nullptr) *work = done;
  return out;
}

RequestRow request_row(const ContinuationRequest& q, int64_t seq_len) {
  std::vector<int64_t> all = q.context;
  all.insert(all.end(), q.continuation.begin(), q.continuation.end());
  const int64_t keep = std::min<int64_t>(static_cast<int64_t>(all.size()) - 1, seq_len);
  const auto from = all.end() - 1 - keep;
  return {std::vector<int64_t>(from, from + keep), std::vector<int64_t>(from + 1, all.end())};
}

std::vector<ContinuationRequest> rolling_requests(const std::vector<int64_t>& tokens,
                                                  int64_t seq_len, int64_t stride) {
  if (seq_len < 1) {
    throw ValueError("rolling_requests: seq_len (" + std::to_string(seq_len) + ") must be >= 1");
  }
  if (stride < 1 || stride > seq_len) {
    throw ValueError("rolling_requests: stride (" + std::to_string(stride) + ") must be in [1, " +
                     "seq_len " + std::to_string(seq_len) + "]");
  }
  std::vector<ContinuationRequest> out;
  const auto n = static_cast<int64_t>(tokens.size());
  for (int64_t begin = 1; begin < n; begin += stride) {
    const int64_t end = std::min(n, begin + stride);
    // As much text before the run as the window holds with it.
    const int64_t from = std::max<int64_t>(0, end - 1 - seq_len);
    out.push_back({std::vector<int64_t>(tokens.begin() + from, tokens.begin() + begin),
                   std::vector<int64_t>(tokens.begin() + begin, tokens.begin() + end)});
  }
  return out;
}

double true_probability_share(const std::vector<ContinuationScore>& scores, int64_t n_true) {
  if (n_true < 1 || n_true >= static_cast<int64_t>(scores.size())) {
    throw ValueError("true_probability_share: " + std::to_string(n_true) + " true answers of " +
                     std::to_string(scores.size()) + " (some of each are needed)");
  }
  double least = scores.front().nll;
  for (const auto& s : scores) least = std::min(least, s.nll);
  double all = 0, truth = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    const double p = std::exp(least - scores[i].nll);
    all += p;
    if (static_cast<int64_t>(i) < n_true) truth += p;
  }
  return truth / all;
}

ChoicePicks pick_choice(const std::vector<ContinuationScore>& scores,
                        const std::vector<int64_t>& chars) {
  if (scores.empty()) throw ValueError("pick_choice: no choices");
  if (chars.size() != scores.size()) {
    throw ValueError("pick_choice: " + std::to_string(chars.size()) + " character counts for " +
                     std::to_string(scores.size()) + " choices");
  }
  ChoicePicks p;
  // A choice of no characters (its text all tokenizer-invisible) counts as one.
  auto per_char = [&](size_t i) {
    return scores[i].nll / static_cast<double>(std::max<int64_t>(1, chars[i]));
  };
  auto per_token = [&](size_t i) { return scores[i].nll / static_cast<double>(scores[i].tokens); };
  for (size_t i = 1; i < scores.size(); ++i) {
    const auto c = static_cast<int64_t>(i);
    if (scores[i].nll < scores[p.total].nll) p.total = c;
    if (per_char(i) < per_char(p.per_char)) p.per_char = c;
    if (per_token(i) < per_token(p.per_token)) p.per_token = c;
  }
  return p;
}

}  // namespace triad::nn
