#pragma once

// The text the trainer's evaluations read: the tokenizer the eval section
// names (eval.tokenizer, or eval.vocab and eval.merges; bytes without) and
// eval.samples, the prompts the model continues at every evaluation.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "triad/data/tokenizer.h"
#include "triad/nn/gpt.h"
#include "triad/train/config.h"

namespace triad::train {

// The eval section's tokenizer, and eval.bos_token's id (-1 without one).
// ConfigErrors name the key: a tokenizer that cannot be read or is larger
// than model.vocab_size (`what`: the key that needs it when eval.tokenizer
// and eval.vocab are unset), a bos_token it has no special token for.
struct EvalTokenizer {
  std::unique_ptr<data::Tokenizer> tokenizer;
  int64_t bos = -1;
};
EvalTokenizer eval_tokenizer(const Config& c, const std::string& what);

// eval.samples tokenized (after eval.bos_token when given), ready to
// continue at every evaluation, and the tokens a sample ends at:
// data.eod_token, and the eos_token_id of a generation_config.json beside
// eval.tokenizer (a ConfigError names an id the tokenizer lacks).
struct SamplePrompts {
  EvalTokenizer tok;
  std::vector<std::string> texts;
  std::vector<std::vector<int64_t>> ids;
  std::vector<int64_t> stop_tokens;
};
SamplePrompts load_sample_prompts(const Config& c);

// Each prompt's continuation's text by `model` (no dropout), as
// eval.sample_tokens, sample_temperature and sample_top_k say, drawn with
// train.seed, ending at a stop token (not printed): the prompts decoded
// together (nn::generate_batch).
std::vector<std::string> continue_samples(const nn::Gpt& model, const SamplePrompts& prompts,
                                          const Config& c);

}  // namespace triad::train
