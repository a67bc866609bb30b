#include "triad/train/eval_text.h"

#include <algorithm>

#include "triad/core/error.h"
#include "triad/io/hf_config.h"
#include "triad/nn/generate.h"

namespace triad::train {

EvalTokenizer eval_tokenizer(const Config& c, const std::string& what) {
  const auto& e = c.eval;
  const std::string key = !e.tokenizer.empty() ? "eval.tokenizer"
                          : !e.vocab.empty()   ? "eval.vocab/eval.merges"
                                               : what;
  EvalTokenizer out;
  try {
    out.tokenizer = data::make_tokenizer(e.vocab, e.merges, e.tokenizer);
  } catch (const Error& err) {
    throw ConfigError(key + ": " + err.what());
  }
  if (out.tokenizer->vocab_size() > c.model.vocab_size) {
    throw ConfigError(key + ": the tokenizer has " + std::to_string(out.tokenizer->vocab_size()) +
                      " tokens, more than model.vocab_size " + std::to_string(c.model.vocab_size));
  }
  if (!e.bos_token.empty()) {
    try {
      out.bos = data::require_special_token(*out.tokenizer, e.bos_token, "eval.bos_token");
    } catch (const ValueError& err) {
      throw ConfigError(err.what());
    }
  }
  return out;
}

SamplePrompts load_sample_prompts(const Config& c) {
  SamplePrompts p;
  p.tok = eval_tokenizer(c, "eval.samples");
  for (size_t i = 0; i < c.eval.samples.size(); ++i) {
    std::vector<int64_t> ids;
    if (p.tok.bos >= 0) ids.push_back(p.tok.bos);
    for (const int32_t id : p.tok.tokenizer->encode(c.eval.samples[i])) ids.push_back(id);
    if (ids.empty()) {
      throw ConfigError("eval.samples[" + std::to_string(i) + "] ('" + c.eval.samples[i] +
                        "') has no tokens");
    }
    p.texts.push_back(c.eval.samples[i]);
    p.ids.push_back(std::move(ids));
  }
  const int64_t limit = p.tok.tokenizer->vocab_size();
  const int64_t eod = c.model.eod_token;
  if (eod >= 0 && eod < limit) p.stop_tokens.push_back(eod);
  if (!c.eval.tokenizer.empty()) {
    std::vector<int64_t> ids;
    try {
      ids = io::load_hf_stop_tokens(c.eval.tokenizer);
    } catch (const Error& err) {
      throw ConfigError(std::string("eval.tokenizer: ") + err.what());
    }
    const std::vector<int32_t> missing = p.tok.tokenizer->missing_ids();
    for (const int64_t id : ids) {
      if (id >= limit || std::find(missing.begin(), missing.end(), id) != missing.end()) {
        throw ConfigError("eval.tokenizer: its generation_config.json's eos_token_id " +
                          std::to_string(id) + " is not a token of the tokenizer (" +
                          std::to_string(limit) + " ids)");
      }
      if (std::find(p.stop_tokens.begin(), p.stop_tokens.end(), id) == p.stop_tokens.end())
        p.stop_tokens.push_back(id);
    }
  }
  return p;
}

std::vector<std::string> continue_samples(const nn::Gpt& model, const SamplePrompts& prompts,
                                          const Config& c) {
  nn::SamplingOptions o;
  o.max_new_tokens = c.eval.sample_tokens;
  o.temperature = c.eval.sample_temperature;
  o.top_k = c.eval.sample_top_k;
  o.seed = c.train.seed;
  o.vocab_limit = prompts.tok.tokenizer->vocab_size();  // never an id it cannot print
  for (const int32_t id : prompts.tok.tokenizer->missing_ids()) o.suppress_tokens.push_back(id);
  o.stop_tokens = prompts.stop_tokens;
  const auto outs = nn::generate_batch(model, prompts.ids, o);
  std::vector<std::string> texts;
  for (size_t i = 0; i < outs.size(); ++i) {
    std::vector<int32_t> in(prompts.ids[i].begin(), prompts.ids[i].end());
    std::vector<int32_t> out(outs[i].begin(), outs[i].end());
    if (!out.empty() && o.is_stop(out.back())) out.pop_back();
    texts.push_back(data::continuation_text(*prompts.tok.tokenizer, in, out));
  }
  return texts;
}

}  // namespace triad::train
