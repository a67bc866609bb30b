#include "triad/train/gsm8k_eval.h"

#include <algorithm>

#include "triad/core/error.h"
#include "triad/nn/generate.h"

namespace triad::train {

double Gsm8kResult::exact_match_strict() const {
  int64_t right = 0;
  for (const Gsm8kReply& r : replies) right += r.strict_right;
  return replies.empty() ? 0 : static_cast<double>(right) / static_cast<double>(replies.size());
}

double Gsm8kResult::exact_match_flexible() const {
  int64_t right = 0;
  for (const Gsm8kReply& r : replies) right += r.flexible_right;
  return replies.empty() ? 0 : static_cast<double>(right) / static_cast<double>(replies.size());
}

int64_t Gsm8kResult::generated_tokens() const {
  int64_t n = 0;
  for (const Gsm8kReply& r : replies) n += r.tokens;
  return n;
}

Gsm8kResult answer_gsm8k(const nn::Gpt& model, const data::Tokenizer& tok,
                         const std::vector<data::MathProblem>& problems,
                         const std::vector<std::string>& prompts, const Gsm8kOptions& options,
                         const std::function<void(const Gsm8kResult&)>& progress) {
  std::vector<std::vector<int64_t>> ids;
  for (const std::string& p : prompts) {
    std::vector<int64_t>& row = ids.emplace_back(options.bos);
    for (const int32_t id : tok.encode(p)) row.push_back(id);
  }
  return answer_gsm8k(model, tok, problems, ids, options, progress);
}

Gsm8kResult answer_gsm8k(const nn::Gpt& model, const data::Tokenizer& tok,
                         const std::vector<data::MathProblem>& problems,
                         const std::vector<std::vector<int64_t>>& prompts,
                         const Gsm8kOptions& options,
                         const std::function<void(const Gsm8kResult&)>& progress) {
  const int64_t seq_len = model.config().seq_len;
  if (options.gen_tokens < 1 || options.gen_tokens >= seq_len) {
    throw ValueError("GSM8K: gen_tokens " + std::to_string(options.gen_tokens) +
                     " must be in [1, the model's seq_len (" + std::to_string(seq_len) +
                     ")), which holds the prompt too");
  }
  if (options.batch < 1) {
    throw ValueError("GSM8K: batch " + std::to_string(options.batch) + " must be >= 1");
  }
  if (prompts.size() != problems.size()) {
    throw ValueError("GSM8K: " + std::to_string(prompts.size()) + " prompts for " +
                     std::to_string(problems.size()) + " problems");
  }
  nn::SamplingOptions o;
  o.max_new_tokens = options.gen_tokens;
  o.temperature = 0;
  o.vocab_limit = std::min<int64_t>(tok.vocab_size(), model.config().vocab_size);
  for (const int32_t id : tok.missing_ids()) o.suppress_tokens.push_back(id);
  if (options.eod_token >= 0) o.stop_tokens.push_back(options.eod_token);
  for (const int64_t id : options.stop_tokens) {
    if (id >= 0 && !o.is_stop(id)) o.stop_tokens.push_back(id);
  }
  // A reply's text: its tokens but a stop token, decoded alone (as the
  // harness decodes the continuation).
  auto text_of = [&](const std::vector<int64_t>& out) {
    std::vector<int32_t> ids;
    for (const int64_t id : out) {
      if (!o.is_stop(id)) ids.push_back(static_cast<int32_t>(id));
    }
    return tok.decode(ids);
  };
  const int64_t keep = seq_len - options.gen_tokens;
  const auto batch = static_cast<size_t>(options.batch);
  Gsm8kResult result;
  for (size_t first = 0; first < problems.size(); first += batch) {
    const size_t last = std::min(problems.size(), first + batch);
    std::vector<std::vector<int64_t>> ids;
    for (size_t i = first; i < last; ++i) {
      std::vector<int64_t> row = prompts[i];
      if (static_cast<int64_t>(row.size()) > keep) {
        row.erase(row.begin(), row.end() - keep);
        ++result.truncated;
      }
      ids.push_back(std::move(row));
    }
    const auto outs =
        nn::generate_batch(model, ids, o, [&](size_t, const std::vector<int64_t>& out) {
          const std::string text = text_of(out);
          return data::cut_at_stops(text, options.stops).size() < text.size();
        });
    for (size_t i = first; i < last; ++i) {
      const std::vector<int64_t>& out = outs[i - first];
      Gsm8kReply r;
      r.reply = data::cut_at_stops(text_of(out), options.stops);
      r.strict = data::strict_answer(r.reply);
      r.flexible = data::flexible_answer(r.reply);
      r.strict_right = data::answer_matches(r.strict, problems[i]);
      r.flexible_right = data::answer_matches(r.flexible, problems[i]);
      r.tokens = static_cast<int64_t>(out.size());
      result.replies.push_back(std::move(r));
    }
    if (progress) progress(result);
  }
  return result;
}

}  // namespace triad::train
