#pragma once

// Fill-in-the-middle (Bavarian et al. 2022, "Efficient Training of Language
// Models to Fill in the Middle"; StarCoder's and Santacoder's data,
// Megatron-LM's --fim-rate): a share of the training documents is cut in
// three, prefix | middle | suffix, and moved around sentinel tokens so that
// the model learns to write a middle from what surrounds it:
//   PSM  <prefix> prefix <suffix> suffix <middle> middle
//   SPM  <prefix> <suffix> suffix <middle> prefix middle
// The data here is already tokenized, so the cuts fall between tokens (the
// paper cut characters, before tokenizing). Each document keeps its length:
// the three sentinels take the last three tokens of its suffix (a document
// whose suffix is shorter stays as it was), and the end-of-document tokens
// between documents stay where they are (document masks and position resets
// see the same documents).
#include <cstdint>

#include "triad/data/token_dataset.h"

namespace triad::data {

struct FimOptions {
  double rate = 0.0;      // the share of documents rearranged (data.fim_rate)
  double spm_rate = 0.5;  // of those, the share in SPM order (data.fim_spm_rate)
  int64_t prefix_token = -1, middle_token = -1, suffix_token = -1;  // data.fim_tokens
  int64_t eod_token = -1;  // where documents end; -1: a row is one document
  uint64_t seed = 0;       // with the sequence's index, keys every draw
};

// Rearranges the documents of one sequence's n tokens in place. Every draw
// is a function of (seed, sequence, the document's place in the row) alone,
// so any process reading sequence `sequence` rearranges it the same way.
void fill_in_the_middle(int64_t* tokens, int64_t n, int64_t sequence, const FimOptions& options);

// The batch of global sequences [first, first + B) with each rearranged
// (its inputs and targets are one row of seq_len + 1 tokens). A target of
// -100 (a loss mask) is a ValueError: the rearrangement moves tokens, and a
// masked one's value is gone.
Batch fill_in_the_middle(const Batch& batch, int64_t first, const FimOptions& options);

}  // namespace triad::data
