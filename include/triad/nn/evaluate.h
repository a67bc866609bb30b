#pragma once

// Scoring text with a trained model: how likely a continuation is after a
// context (the log-likelihood requests of multiple-choice benchmarks such
// as HellaSwag), and the perplexity of long text read in windows.

#include <cstdint>
#include <functional>
#include <vector>

#include "triad/nn/gpt.h"

namespace triad::nn {

// A continuation to score after its context (token ids, both non-empty).
struct ContinuationRequest {
  std::vector<int64_t> context;
  std::vector<int64_t> continuation;
};

// The continuation's negative log-likelihood, -sum log p(token | all
// before it), over its `tokens` tokens (natural log); with greedy scoring
// asked for, also whether greedy decoding would have written it: each of
// its tokens the most likely one after what precedes it (the lowest id
// among equals, as argmax takes).
struct ContinuationScore {
  double nll = 0;
  int64_t tokens = 0;
  bool greedy = false;
};

// A request as the model reads it: context and continuation cut from the
// left to their last seq_len + 1 tokens, as `inputs` (all but the last) and
// the token after each (`targets`); the continuation's tokens are the last
// continuation.size() targets. (triad-eval's and the trainer's eval.choices
// rows both.)
struct RequestRow {
  std::vector<int64_t> inputs, targets;
};
RequestRow request_row(const ContinuationRequest& request, int64_t seq_len);

// Each request's score under `model` (no dropout, no autograd graph), the
// text read as one document whatever the model's document resets (as
// generate reads it). Context and continuation that do not fit in the
// model's window lose the context's first tokens: the model reads the last
// seq_len + 1 of them less the final one. Requests that share a context
// (a question's choices) read it once: the contexts of a batch run
// left-padded into a key/value cache, copied for each continuation, and the
// continuations decode after them in runs of about one length (requests
// whose context and longest continuation do not fit the window together
// are read as rows of their own). Every other request is one row: they run
// `batch_rows` at a time, longest first, each batch padded to its longest
// request. The pad follows a row's tokens, so a causal model's scores do not
// depend on it or on the batch (up to rounding); the scores come back in
// the requests' order.
// Contexts that begin with the same kSharedPrefixTokens tokens or more (the
// few-shot examples before each question of a subject) are a family: their
// common beginning runs through the model once, its keys and values are
// copied into each batch's cache, and only what follows it runs per
// question.
// A longrope model takes its factors by how far a forward pass reaches:
// when some request reaches past the original context, every request is a
// row of its own (those within it batched apart), so each takes the
// factors Hugging Face's rule gives it read alone.
// `greedy`: also fill each score's `greedy` (the continuation's logits
// are read back whole for it: V values per token). `work`, when given,
// says how much ran.
// Errors name the request: an empty context or continuation, a
// continuation longer than seq_len, a token outside the vocabulary.
inline constexpr int64_t kSharedPrefixTokens = 16;
struct ScoringWork {
  int64_t positions = 0;        // token positions through the model's blocks, padding included
  int64_t shared_prefixes = 0;  // families' beginnings read once
  int64_t shared_prefix_positions = 0;  // their positions (in `positions` too)
};
std::vector<ContinuationScore> score_continuations(const Gpt& model,
                                                   const std::vector<ContinuationRequest>& requests,
                                                   int64_t batch_rows = 8, bool greedy = false,
                                                   ScoringWork* work = nullptr);

// Whether greedy decoding writes each row's targets: `logits[k]` (1, n_k, V)
// predicts `targets[k]` (n_k ids), and the row matches when every target
// that is not -100 is its position's argmax (the lowest id among equals).
// One read of all the logits (V values per position). Errors name a row
// whose logits and targets differ in length, or a target outside [0, V).
std::vector<bool> argmax_matches(const std::vector<Tensor>& logits,
                                 const std::vector<std::vector<int64_t>>& targets);

// The same for rows of a batch: `targets` (B, T), on any device, and
// logits_of(b, start, length) giving row b's logits (1, length, V) at
// positions [start, start + length); each row's head runs once, over the
// positions from its first scored target to its last. A row that scores
// nothing matches.
std::vector<bool> rows_argmax_match(
    const Tensor& targets, const std::function<Tensor(int64_t, int64_t, int64_t)>& logits_of);

// Long text as continuation requests for its perplexity: every token but
// the first is scored exactly once, in runs of `stride` tokens (1 <= stride
// <= seq_len), each run after as much of the text before it as the window
// holds (seq_len + 1 tokens in all). stride == seq_len reads the text in
// windows that do not overlap (as training's validation loss does);
// smaller strides give each scored token more context for more compute
// (Hugging Face's sliding-window perplexity). Give the text a beginning
// token (a BOS or GPT-2's <|endoftext|>) to have its first real token
// scored too.
std::vector<ContinuationRequest> rolling_requests(const std::vector<int64_t>& tokens,
                                                  int64_t seq_len, int64_t stride);

// The choice a multiple-choice question's model picks from its choices'
// scores (ties to the first): the least total negative log-likelihood
// (lm-evaluation-harness's acc); the least per character of the choice's
// text, `chars[i]` (its acc_norm); the least per token (llm.c's HellaSwag
// acc_norm).
struct ChoicePicks {
  int64_t total = 0;
  int64_t per_char = 0;
  int64_t per_token = 0;
};
ChoicePicks pick_choice(const std::vector<ContinuationScore>& scores,
                        const std::vector<int64_t>& chars);

// TruthfulQA's MC2 (lm-evaluation-harness's truthfulqa_mc2): the share of
// the choices' probability (exp of minus each total score) that the first
// `n_true`, the true answers, hold. Computed from the largest log
// probability down, so that long answers' tiny probabilities keep their
// ratios (the harness exponentiates them as they are). ValueError unless
// 0 < n_true < scores.size().
double true_probability_share(const std::vector<ContinuationScore>& scores, int64_t n_true);

}  // namespace triad::nn
