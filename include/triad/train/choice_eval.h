#pragma once

// Multiple-choice accuracy during training (eval.choices): the questions
// tokenized once, cut into micro-batches of rows the model reads as it
// reads training rows, and each row's mean loss turned back into the
// choice each question's scores pick — the numbers triad-eval reports for
// the same model.

#include <cstdint>
#include <string>
#include <vector>

#include "triad/data/token_dataset.h"
#include "triad/nn/evaluate.h"
#include "triad/train/config.h"

namespace triad::train {

// A question as token requests: each choice's context and continuation
// (nn::ContinuationRequest), the choice's characters and the right index.
struct TokenizedQuestion {
  std::vector<nn::ContinuationRequest> choices;
  std::vector<int64_t> chars;
  int64_t answer = 0;
  // TruthfulQA's second set (data::ChoiceQuestion::mc2_choices), its first
  // mc2_true true; empty for other questions.
  std::vector<nn::ContinuationRequest> mc2;
  int64_t mc2_true = 0;
};
// Every request of `questions`, each question's choices then its mc2 set:
// the order choice_batches' rows and tally_choices' scores follow.
std::vector<nn::ContinuationRequest> question_requests(
    const std::vector<TokenizedQuestion>& questions);

// The questions of `set` (one of eval.choices) with index % parts == part
// (a data-parallel rank's share), tokenized by eval.tokenizer (or
// vocab/merges; bytes without), each choice after a space (as triad-eval's
// default --separator) and the context after eval.bos_token when one is
// given. `total` gets the file's question count. Errors are ConfigErrors
// naming the set's key (eval.choices, or eval.choices.NAME) or the
// tokenizer's: an unreadable file or line, a tokenizer larger than
// model.vocab_size, an empty context without a bos_token, a choice longer
// than model.seq_len tokens.
std::vector<TokenizedQuestion> load_choice_questions(const Config& c,
                                                     const EvalSection::ChoiceSet& set, int part,
                                                     int parts, int64_t* total = nullptr);

// Requests as rows, `rows` per batch, longest first (so a batch's rows are
// about as long): each row the request's tokens cut from the left to
// seq_len + 1, less the last one as input (nn::request_row); a batch as
// wide as its longest row rounded up to a multiple of `width_multiple` (at
// most seq_len), shorter rows padded with `pad`; targets -100 but for the
// continuation's; a group's last batch filled with rows that score nothing.
// order[k] is the request that the batches' k-th row holds, kFiller for a
// row that scores nothing. (eval.choices' and eval.lambada's rows.)
// `short_rows` (a longrope model's original context; 0: no such limit):
// rows of at most that many inputs never share a batch with longer ones,
// and their batches are no wider than it where a multiple of
// `short_multiple` allows, so each row takes the factors Hugging Face's
// rule gives the request read alone (long past the original context).
struct RequestRows {
  static constexpr size_t kFiller = static_cast<size_t>(-1);
  std::vector<data::Batch> batches;
  std::vector<size_t> order;
};
RequestRows request_batches(const std::vector<nn::ContinuationRequest>& requests, int64_t seq_len,
                            int64_t rows, int64_t pad, int64_t width_multiple = 1,
                            int64_t short_rows = 0, int64_t short_multiple = 1);
// The questions' choices so, in question-then-choice order.
RequestRows choice_batches(const std::vector<TokenizedQuestion>& questions, int64_t seq_len,
                           int64_t rows, int64_t pad, int64_t width_multiple = 1,
                           int64_t short_rows = 0, int64_t short_multiple = 1);

// What the questions scored: how many, how many each normalisation
// (nn::pick_choice) got right, the right choices' summed -log p and
// tokens, and TruthfulQA's MC2 summed over the questions with an mc2 set
// (nn::true_probability_share). Sums over data-parallel ranks add up.
struct ChoiceTally {
  double questions = 0, right = 0, right_norm = 0, right_per_token = 0;
  double answer_nll = 0, answer_tokens = 0;
  double mc2 = 0, mc2_questions = 0;
  std::vector<double> to_vector() const;
  static ChoiceTally from_vector(const std::vector<double>& v);
};
// From each request's mean loss over its scored targets, in
// question_requests' order (rows past them ignored).
ChoiceTally tally_choices(const std::vector<TokenizedQuestion>& questions,
                          const std::vector<double>& row_means);

}  // namespace triad::train
