#pragma once

// GSM8K's math word problems answered by a model (triad-eval --gsm8k): each
// prompt (data::math_prompt) continued greedily over the key/value cache,
// a batch of problems at a time (nn::generate_batch), the reply cut at the
// first stop string and scored by lm-evaluation-harness's strict and
// flexible exact match (data/math_problems.h).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "triad/data/math_problems.h"
#include "triad/data/tokenizer.h"
#include "triad/nn/gpt.h"

namespace triad::train {

struct Gsm8kOptions {
  // The most tokens a reply may take (the harness's max_gen_toks); a prompt
  // keeps its last model.seq_len - gen_tokens tokens, as the harness cuts.
  int64_t gen_tokens = 256;
  int64_t batch = 8;  // problems generated together
  // A reply ends once its text holds one of these, and is cut before it.
  std::vector<std::string> stops{"Question:", "</s>", "<|im_end|>"};
  std::vector<int64_t> bos;  // put before every prompt (a beginning token)
  int64_t eod_token = -1;    // a token that ends a reply too (-1: none)
  // More tokens that end a reply (a chat model's end of turn).
  std::vector<int64_t> stop_tokens;
};

struct Gsm8kReply {
  std::string reply, strict, flexible;  // the reply and its two extractions
  bool strict_right = false, flexible_right = false;
  int64_t tokens = 0;  // generated, a stop token included
};

struct Gsm8kResult {
  std::vector<Gsm8kReply> replies;  // one per problem, in order
  int64_t truncated = 0;            // prompts that lost their beginning
  double exact_match_strict() const;
  double exact_match_flexible() const;
  int64_t generated_tokens() const;
};

// Answers problems[i] after prompts[i] (as many of each) with `model`, its
// text through `tok` (never an id it cannot write). `progress`, when given,
// is called after each batch with the replies so far. Errors: a ValueError
// for gen_tokens not in [1, seq_len), batch < 1, or counts that differ.
Gsm8kResult answer_gsm8k(const nn::Gpt& model, const data::Tokenizer& tok,
                         const std::vector<data::MathProblem>& problems,
                         const std::vector<std::string>& prompts, const Gsm8kOptions& options,
                         const std::function<void(const Gsm8kResult&)>& progress = {});
// The same after prompts already tokenized (a chat template's, its markers
// by id; options.bos is not put before them).
Gsm8kResult answer_gsm8k(const nn::Gpt& model, const data::Tokenizer& tok,
                         const std::vector<data::MathProblem>& problems,
                         const std::vector<std::vector<int64_t>>& prompt_ids,
                         const Gsm8kOptions& options,
                         const std::function<void(const Gsm8kResult&)>& progress = {});

}  // namespace triad::train
