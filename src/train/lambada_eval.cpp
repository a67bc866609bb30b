#include "triad/train/lambada_eval.h"

#include <cmath>

#include "triad/core/error.h"
#include "triad/data/last_word.h"
#include "triad/data/multiple_choice.h"
#include "triad/data/tokenizer.h"
#include "triad/train/eval_text.h"

namespace triad::train {

std::vector<nn::ContinuationRequest> load_lambada_texts(const Config& c,
                                                        const EvalSection::LambadaSet& set,
                                                        int part, int parts, int64_t* total) {
  const std::string key = set.name.empty() ? "eval.lambada" : "eval.lambada." + set.name;
  const EvalTokenizer t = eval_tokenizer(c, key);
  std::vector<data::LastWordText> texts;
  try {
    texts = data::read_last_word_texts(set.path, c.eval.lambada_limit);
  } catch (const Error& err) {
    throw ConfigError(key + ": " + err.what());
  }
  if (total) *total = static_cast<int64_t>(texts.size());
  std::vector<nn::ContinuationRequest> out;
  for (size_t i = static_cast<size_t>(part); i < texts.size(); i += static_cast<size_t>(parts)) {
    auto [context, word] =
        data::encode_context_and_continuation(*t.tokenizer, texts[i].context, texts[i].target);
    nn::ContinuationRequest r;
    if (t.bos >= 0) r.context.push_back(t.bos);
    r.context.insert(r.context.end(), context.begin(), context.end());
    r.continuation.assign(word.begin(), word.end());
    const std::string where = key + " '" + set.path + "': text " + std::to_string(i + 1);
    if (r.context.empty()) {
      throw ConfigError(where + " has an empty context: set eval.bos_token to give it a start");
    }
    if (static_cast<int64_t>(r.continuation.size()) > c.model.seq_len) {
      throw ConfigError(where + " ends in a word of " + std::to_string(r.continuation.size()) +
                        " tokens, more than model.seq_len " + std::to_string(c.model.seq_len));
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<double> LambadaTally::to_vector() const {
  return {texts, right, nll};
}

LambadaTally LambadaTally::from_vector(const std::vector<double>& v) {
  if (v.size() != 3) {
    throw ValueError("LambadaTally: " + std::to_string(v.size()) + " values, expected 3");
  }
  return {v[0], v[1], v[2]};
}

double LambadaTally::perplexity() const {
  return texts > 0 ? std::exp(nll / texts) : 0;
}

LambadaTally tally_lambada(const std::vector<nn::ContinuationRequest>& requests,
                           const std::vector<double>& row_means, const std::vector<bool>& greedy) {
  if (row_means.size() < requests.size() || greedy.size() < requests.size()) {
    throw ValueError("tally_lambada: " + std::to_string(requests.size()) + " texts but " +
                     std::to_string(row_means.size()) + " row losses and " +
                     std::to_string(greedy.size()) + " greedy flags");
  }
  LambadaTally t;
  for (size_t i = 0; i < requests.size(); ++i) {
    t.texts += 1;
    t.right += greedy[i];
    t.nll += row_means[i] * static_cast<double>(requests[i].continuation.size());
  }
  return t;
}

}  // namespace triad::train
