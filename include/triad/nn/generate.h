#pragma once

#include <cstdint>
#include <vector>

#include "triad/nn/gpt.h"

namespace triad::nn {

struct SamplingOptions {
  int64_t max_new_tokens = 100;
  double temperature = 1.0;  // 0: greedy (the most likely token, the lowest id on a tie)
  int64_t top_k = 0;         // draw among the k most likely tokens; 0: all of them
  // Nucleus sampling: draw among the fewest most likely tokens whose
  // probabilities (after temperature and top_k) add up to at least top_p;
  // 1: no cut.
  double top_p = 1.0;
  uint64_t seed = 0;  // draws are a pure function of (seed, position)
  // Only ids below this are ever produced (a tokenizer's vocabulary inside a
  // padded model vocabulary); 0: the model's vocab_size.
  int64_t vocab_limit = 0;
  int64_t stop_token = -1;  // stop after producing it; -1: never
  // true: keep each layer's keys and values (KvCache), so a token costs one
  // position's work while the text fits model.seq_len. false: run the model
  // over the whole window for every token (the reference the cache is
  // tested against).
  bool kv_cache = true;
};

// The token one row of next-token logits picks: the argmax at temperature
// 0; otherwise a draw with uniform `u` in [0, 1) from softmax(logits /
// temperature) restricted to the top_k largest (ties broken by id), then to
// the smallest prefix of those holding top_p of their probability.
int64_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k, double u,
                     double top_p = 1.0);

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

}  // namespace triad::nn
