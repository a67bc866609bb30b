#include "triad/nn/evaluate.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "triad/autograd/grad_mode.h"
#include "triad/nn/documents.h"
#include "triad/ops.h"

namespace triad::nn {

std::vector<ContinuationScore> score_continuations(const Gpt& model,
                                                   const std::vector<ContinuationRequest>& requests,
                                                   int64_t batch_rows) {
  const GptConfig& cfg = model.config();
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
  const Device device = model.head_weight().device();
  std::vector<ContinuationScore> out(requests.size());
  // Longest first, so that a batch's rows are about as long (little
  // padding); each score goes back to its request's place.
  auto length = [&](size_t r) {
    return std::min(requests[r].context.size() + requests[r].continuation.size() - 1,
                    static_cast<size_t>(cfg.seq_len));
  };
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return length(a) > length(b); });
  for (size_t first = 0; first < requests.size(); first += static_cast<size_t>(batch_rows)) {
    const size_t last = std::min(requests.size(), first + static_cast<size_t>(batch_rows));
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
    // One document per row, as generate reads text.
    const ForwardContext ctx = with_one_document(cfg, batch, {false, 0, 0}, device);
    Tensor x = model.embed(batch, ctx);
    for (int64_t i = 0; i < cfg.n_layer; ++i) x = model.block(i).forward(x, ctx);
    std::vector<Tensor> means;
    for (int64_t b = 0; b < rows; ++b) {
      const auto& cont = requests[order[first + static_cast<size_t>(b)]].continuation;
      const auto n = static_cast<int64_t>(cont.size());
      const auto len = static_cast<int64_t>(inputs[b].size());
      // Logits only where they predict the continuation (the row's last n
      // positions): context positions cost no head and hold no logits.
      const Tensor logits = model.head(narrow(narrow(x, 0, b, 1), 1, len - n, n));
      means.push_back(
          reshape(cast(cross_entropy(logits, from_vector(cont, {1, n})), DType::F64), {1}));
    }
    // The batch's scores in one read (a GPU waits once per batch, not per row).
    const std::vector<double> mean = to_double_vector(concat(means, 0));
    for (int64_t b = 0; b < rows; ++b) {
      const size_t r = order[first + static_cast<size_t>(b)];
      const auto n = static_cast<int64_t>(requests[r].continuation.size());
      out[r] = {mean[b] * static_cast<double>(n), n};
    }
  }
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
