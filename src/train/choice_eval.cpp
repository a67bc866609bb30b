#include "triad/train/choice_eval.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "triad/core/error.h"
#include "triad/data/multiple_choice.h"
#include "triad/data/tokenizer.h"
#include "triad/ops.h"
#include "triad/train/eval_text.h"

namespace triad::train {

std::vector<TokenizedQuestion> load_choice_questions(const Config& c,
                                                     const EvalSection::ChoiceSet& set, int part,
                                                     int parts, int64_t* total) {
  const auto& e = c.eval;
  const std::string key = set.name.empty() ? "eval.choices" : "eval.choices." + set.name;
  const EvalTokenizer t = eval_tokenizer(c, key);
  const data::Tokenizer* tok = t.tokenizer.get();
  std::vector<int64_t> bos;
  if (t.bos >= 0) bos.push_back(t.bos);
  std::vector<data::ChoiceQuestion> all;
  try {
    const data::HellaSwagPrompt hellaswag = data::hellaswag_prompt_from_string(e.hellaswag_prompt);
    all = data::read_choice_questions(set.path, e.choices_limit, hellaswag);
    if (e.choices_fewshot > 0) {
      // Examples from the same file, each question's own left out (the
      // first, or drawn as lm-evaluation-harness draws them).
      data::add_examples(
          all, data::read_choice_questions(set.path, 0, hellaswag), e.choices_fewshot, " ", true,
          "'" + set.path + "'",
          e.choices_fewshot_seed >= 0
              ? std::optional<uint64_t>(static_cast<uint64_t>(e.choices_fewshot_seed))
              : std::nullopt);
    }
  } catch (const Error& err) {
    throw ConfigError(key + ": " + err.what());
  }
  if (total) *total = static_cast<int64_t>(all.size());
  std::vector<TokenizedQuestion> out;
  for (size_t q = static_cast<size_t>(part); q < all.size(); q += static_cast<size_t>(parts)) {
    TokenizedQuestion t;
    t.answer = all[q].answer;
    t.mc2_true = all[q].mc2_true;
    // Its choices, then TruthfulQA's mc2 set after the same context.
    const size_t n = all[q].choices.size() + all[q].mc2_choices.size();
    for (size_t i = 0; i < n; ++i) {
      const bool mc2 = i >= all[q].choices.size();
      const std::string& choice =
          mc2 ? all[q].mc2_choices[i - all[q].choices.size()] : all[q].choices[i];
      auto [context, continuation] = data::encode_context_and_continuation(
          *tok, all[q].context_of(mc2 ? 0 : i), all[q].separator.value_or(" ") + choice);
      std::vector<int64_t> ctx = bos;
      ctx.insert(ctx.end(), context.begin(), context.end());
      const std::string where = key + " '" + set.path + "': question " + std::to_string(q + 1);
      if (ctx.empty()) {
        throw ConfigError(where + " has an empty context: set eval.bos_token to give it a start");
      }
      if (static_cast<int64_t>(continuation.size()) > c.model.seq_len) {
        throw ConfigError(where + " has a choice of " + std::to_string(continuation.size()) +
                          " tokens, more than model.seq_len " + std::to_string(c.model.seq_len));
      }
      (mc2 ? t.mc2 : t.choices)
          .push_back(
              {std::move(ctx), std::vector<int64_t>(continuation.begin(), continuation.end())});
      if (!mc2) t.chars.push_back(data::utf8_characters(choice));
    }
    out.push_back(std::move(t));
  }
  return out;
}

RequestRows request_batches(const std::vector<nn::ContinuationRequest>& requests, int64_t seq_len,
                            int64_t rows, int64_t pad, int64_t width_multiple, int64_t short_rows,
                            int64_t short_multiple) {
  if (rows < 1) {
    throw ValueError("request_batches: rows (" + std::to_string(rows) + ") must be >= 1");
  }
  if (width_multiple < 1 || short_multiple < 1) {
    throw ValueError("request_batches: width_multiple (" + std::to_string(width_multiple) +
                     ") and short_multiple (" + std::to_string(short_multiple) + ") must be >= 1");
  }
  // Each row's input and targets, unpadded.
  std::vector<std::vector<int64_t>> inputs, targets;
  for (const auto& r : requests) {
    nn::RequestRow row = nn::request_row(r, seq_len);
    // Only the continuation is scored.
    const auto n = static_cast<std::ptrdiff_t>(r.continuation.size());
    std::fill(row.targets.begin(), row.targets.end() - n, -100);
    inputs.push_back(std::move(row.inputs));
    targets.push_back(std::move(row.targets));
  }
  std::vector<size_t> sorted(inputs.size());
  std::iota(sorted.begin(), sorted.end(), size_t{0});
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](size_t a, size_t b) { return inputs[a].size() > inputs[b].size(); });
  auto round_up = [](int64_t n, int64_t m) { return (n + m - 1) / m * m; };
  // The rows past short_rows, then the rest: each group in batches of its own.
  const auto boundary =
      short_rows > 0 ? std::find_if(sorted.begin(), sorted.end(),
                                    [&](size_t r) {
                                      return static_cast<int64_t>(inputs[r].size()) <= short_rows;
                                    })
                     : sorted.end();
  RequestRows out;
  using Range = std::pair<std::vector<size_t>::iterator, std::vector<size_t>::iterator>;
  for (const auto& [begin, end] :
       {Range{sorted.begin(), boundary}, Range{boundary, sorted.end()}}) {
    const bool short_group = begin == boundary && short_rows > 0;
    for (auto first = begin; first < end; first += std::min<std::ptrdiff_t>(rows, end - first)) {
      const auto longest = static_cast<int64_t>(inputs[*first].size());
      int64_t width = round_up(longest, width_multiple);
      if (short_group && width > short_rows) width = round_up(longest, short_multiple);
      width = std::min(seq_len, width);
      std::vector<int64_t> in(static_cast<size_t>(rows * width), pad),
          tg(static_cast<size_t>(rows * width), -100);  // filler rows stay so
      const std::ptrdiff_t held = end - first;
      for (int64_t k = 0; k < rows; ++k) {
        if (k >= held) {
          out.order.push_back(RequestRows::kFiller);
          continue;
        }
        const size_t r = first[k];
        out.order.push_back(r);
        std::copy(inputs[r].begin(), inputs[r].end(), in.begin() + k * width);
        std::copy(targets[r].begin(), targets[r].end(), tg.begin() + k * width);
      }
      out.batches.push_back({from_vector(in, {rows, width}), from_vector(tg, {rows, width})});
    }
  }
  return out;
}

std::vector<nn::ContinuationRequest> question_requests(
    const std::vector<TokenizedQuestion>& questions) {
  std::vector<nn::ContinuationRequest> all;
  for (const auto& q : questions) {
    all.insert(all.end(), q.choices.begin(), q.choices.end());
    all.insert(all.end(), q.mc2.begin(), q.mc2.end());
  }
  return all;
}

RequestRows choice_batches(const std::vector<TokenizedQuestion>& questions, int64_t seq_len,
                           int64_t rows, int64_t pad, int64_t width_multiple, int64_t short_rows,
                           int64_t short_multiple) {
  return request_batches(question_requests(questions), seq_len, rows, pad, width_multiple,
                         short_rows, short_multiple);
}

std::vector<double> ChoiceTally::to_vector() const {
  return {questions,  right,         right_norm, right_per_token,
          answer_nll, answer_tokens, mc2,        mc2_questions};
}

ChoiceTally ChoiceTally::from_vector(const std::vector<double>& v) {
  if (v.size() != 8) {
    throw ValueError("ChoiceTally: " + std::to_string(v.size()) + " values, expected 8");
  }
  return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
}

ChoiceTally tally_choices(const std::vector<TokenizedQuestion>& questions,
                          const std::vector<double>& row_means) {
  ChoiceTally t;
  size_t row = 0;
  // Requests' scores from their mean losses, in order.
  const auto scored = [&](const std::vector<nn::ContinuationRequest>& requests) {
    if (row + requests.size() > row_means.size()) {
      throw ValueError("tally_choices: " + std::to_string(row_means.size()) +
                       " row losses for more rows than that");
    }
    std::vector<nn::ContinuationScore> scores;
    for (const auto& r : requests) {
      const auto n = static_cast<int64_t>(r.continuation.size());
      scores.push_back({row_means[row++] * static_cast<double>(n), n});
    }
    return scores;
  };
  for (const auto& q : questions) {
    const std::vector<nn::ContinuationScore> scores = scored(q.choices);
    if (!q.mc2.empty()) {
      t.mc2 += nn::true_probability_share(scored(q.mc2), q.mc2_true);
      t.mc2_questions += 1;
    }
    const nn::ChoicePicks p = nn::pick_choice(scores, q.chars);
    t.questions += 1;
    t.right += p.total == q.answer;
    t.right_norm += p.per_char == q.answer;
    t.right_per_token += p.per_token == q.answer;
    t.answer_nll += scores[static_cast<size_t>(q.answer)].nll;
    t.answer_tokens += static_cast<double>(scores[static_cast<size_t>(q.answer)].tokens);
  }
  return t;
}

}  // namespace triad::train
