#pragma once

// Texts whose last word a language model is asked to predict: LAMBADA's
// cloze test (Paperno et al., 2016), which GPT-2's paper and Megatron-LM's
// zero-shot evaluation report as accuracy (the word is what greedy decoding
// writes) and perplexity.

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace triad::data {

// A text cut before its last word: the context, and the target that
// follows it (the last space and the word after it).
struct LastWordText {
  std::string context;
  std::string target;
};

// JSON lines with a string "text" each (lambada_openai's test file, as
// lm-evaluation-harness reads it; other fields ignored), split as
// lm-evaluation-harness splits them: at the text's last space. The first
// `limit` texts (0: all). Errors name `where` and the line: one that does
// not parse or has no "text", a text without a space before its last word
// or ending in one.
std::vector<LastWordText> read_last_word_texts(std::istream& in, const std::string& where,
                                               int64_t limit = 0);
// From a file (gzip and Zstandard too, data/text_input.h).
std::vector<LastWordText> read_last_word_texts(const std::string& path, int64_t limit = 0);

}  // namespace triad::data
