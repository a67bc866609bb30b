#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "triad/nn/gpt.h"
#include "triad/nn/kv_cache.h"

namespace triad::nn {

struct SamplingOptions {
  int64_t max_new_tokens = 100;
  double temperature = 1.0;  // 0: greedy (the most likely token, the lowest id on a tie)
  int64_t top_k = 0;         // draw among the k most likely tokens; 0: all of them
  // Nucleus sampling: draw among the fewest most likely tokens whose
  // probabilities (after temperature and top_k) add up to at least top_p;
  // 1: no cut.
  double top_p = 1.0;
  // Min-p sampling: of what top_k and top_p kept, only the tokens at least
  // min_p times as likely as the most likely one; 0: no cut.
  double min_p = 0.0;
  // Penalties on tokens the text already holds, applied to the logits
  // before everything above (greedy decoding included). repetition_penalty
  // r (CTRL's, Hugging Face's): every token of the prompt or of the output
  // so far has its logit divided by r when positive and multiplied by r
  // otherwise; 1: none, above 1 discourages repeats. frequency_penalty f and
  // presence_penalty q (OpenAI's, vLLM's): a token the output holds n > 0
  // times loses f * n + q from its logit (the prompt is not counted); 0:
  // none, negative values encourage repeats.
  double repetition_penalty = 1.0;
  double frequency_penalty = 0.0;
  double presence_penalty = 0.0;
  uint64_t seed = 0;  // draws are a pure function of (seed, position)
  // Only ids below this are ever produced (a tokenizer's vocabulary inside a
  // padded model vocabulary); 0: the model's vocab_size.
  int64_t vocab_limit = 0;
  // Ids never produced (below vocab_size; a tokenizer's holes:
  // Tokenizer::missing_ids): their logits are -inf before anything else.
  std::vector<int64_t> suppress_tokens;
  // Generation stops after producing any of these (an instruction-tuned
  // model may end its answer with more than one: LLaMA 3's <|eot_id|> or
  // <|end_of_text|>, Gemma's <end_of_turn> or <eos>); empty: never early.
  std::vector<int64_t> stop_tokens;
  bool is_stop(int64_t id) const {
    return std::find(stop_tokens.begin(), stop_tokens.end(), id) != stop_tokens.end();
  }
  // true: keep each layer's keys and values (KvCache), so a token costs one
  // position's work while the text fits model.seq_len. false: run the model
  // over the whole window for every token (the reference the cache is
  // tested against).
  bool kv_cache = true;
  // Called with the output after each new token (a stop token included);
  // true ends generation there (stop strings: a caller decodes and looks).
  std::function<bool(const std::vector<int64_t>& output)> stop_when;
};

// The token one row of next-token logits picks: the argmax at temperature
// 0; otherwise a draw with uniform `u` in [0, 1) from softmax(logits /
// temperature) restricted to the top_k largest (ties broken by id), then to
// the smallest prefix of those holding top_p of their probability, then to
// those at least min_p times as likely as the first.
int64_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k, double u,
                     double top_p = 1.0, double min_p = 0.0);

// Every option checked against a model of `cfg`'s kind (what generate()
// checks before its first step): a ValueError names the first bad one. A
// program can call it before it prints or reads anything.
void check_sampling(const GptConfig& cfg, const SamplingOptions& options);

// options' repetition, frequency and presence penalties applied to one row
// of next-token logits, given the prompt and the output so far (ids past
// the row, a vocab_limit's, are skipped).
void apply_penalties(std::vector<double>& logits, const std::vector<int64_t>& prompt,
                     const std::vector<int64_t>& output, const SamplingOptions& options);

// Continues `prompt` autoregressively and returns the new tokens. Each step
// samples from the model's logits (no dropout, no autograd graph) at the
// last position, given the last model.config().seq_len tokens. While prompt
// and output fit in seq_len, the prompt runs once and every new token is
// one decode step over the key/value cache (Gpt::decode); past that the
// window slides, every position moves, and each token runs the model over
// the whole window again. Errors name bad options and out-of-vocabulary
// prompt tokens.
std::vector<int64_t> generate(const Gpt& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options);

// A key/value cache kept from one generate() call to the next (a
// conversation): a prompt that begins with tokens the cache holds (the last
// prompt and reply, when the next turn repeats them) decodes only what
// follows them. The tokens generated are the same as without it (logits
// equal up to rounding). `tokens`: what the cache holds, slot by slot;
// `reused`: how many tokens of the last prompt came from it.
struct GenerationSession {
  std::unique_ptr<KvCache> cache;
  std::vector<int64_t> tokens;
  int64_t reused = 0;
};
std::vector<int64_t> generate(const Gpt& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options, GenerationSession& session);

// generate() for many prompts at once: each prompt's new tokens, the ones
// generate(model, prompt, options) gives it alone (the same draws, the same
// stops; logits equal up to rounding), in the prompts' order. With the
// key/value cache the prompts that fit model.seq_len decode together, one
// batched step per token: one left-padded KvCache, each row at its own
// positions and blind to its padding; a text leaves the batch when it stops
// or outgrows the context (then it goes on alone over a sliding window, as
// generate() does), and the cache drops the padding no staying row needs.
// `stop_when(i, output)`, when given, ends prompt i's text too (stop strings
// that depend on the prompt), as options.stop_when does every text's.
std::vector<std::vector<int64_t>> generate_batch(
    const Gpt& model, const std::vector<std::vector<int64_t>>& prompts,
    const SamplingOptions& options,
    const std::function<bool(size_t, const std::vector<int64_t>&)>& stop_when = {});

}  // namespace triad::nn
