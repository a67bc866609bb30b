#pragma once

// LAMBADA during training (eval.lambada): texts whose last word the model
// is asked for, tokenized once, read as rows the way eval.choices' are, on
// any parallel layout, and scored as triad-eval --lambada scores them: the
// share of words greedy decoding writes, and their perplexity.

#include <cstdint>
#include <string>
#include <vector>

#include "triad/nn/evaluate.h"
#include "triad/train/config.h"

namespace triad::train {

// The texts of `set` (one of eval.lambada) with index % parts == part (a
// data-parallel rank's share) as requests: the text before its last word
// as context (after eval.bos_token when one is given), the space and the
// word as continuation, tokenized by the eval section's tokenizer.
// `total` gets the set's text count (after eval.lambada_limit). Errors are
// ConfigErrors naming the set's key (eval.lambada or eval.lambada.NAME):
// an unreadable file or line, an empty context without a bos_token, a
// word longer than model.seq_len tokens.
std::vector<nn::ContinuationRequest> load_lambada_texts(const Config& c,
                                                        const EvalSection::LambadaSet& set,
                                                        int part, int parts,
                                                        int64_t* total = nullptr);

// What the texts scored: how many, how many words greedy decoding writes,
// and the words' summed -log p. Sums over data-parallel ranks add up.
struct LambadaTally {
  double texts = 0, right = 0, nll = 0;
  std::vector<double> to_vector() const;
  static LambadaTally from_vector(const std::vector<double>& v);
  // The share right, the mean -log p per word, and exp of it (lm-
  // evaluation-harness's perplexity for lambada_openai).
  double accuracy() const { return texts > 0 ? right / texts : 0; }
  double mean_nll() const { return texts > 0 ? nll / texts : 0; }
  double perplexity() const;
};
// From each row's mean loss over its word's tokens and whether greedy
// decoding writes it, in the requests' order (filler rows after them
// ignored).
LambadaTally tally_lambada(const std::vector<nn::ContinuationRequest>& requests,
                           const std::vector<double>& row_means, const std::vector<bool>& greedy);

}  // namespace triad::train
