#pragma once

// The tokenizer options triad-generate, triad-eval and triad-tokenize
// share: --vocab and --merges (GPT-2's BPE), --tokenizer (a Hugging Face
// tokenizer.json or a SentencePiece model), bytes without any, and
// --bos-token (a special token put first, by its text).

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "triad/core/error.h"
#include "triad/data/tokenizer.h"

namespace triad::examples {

class TokenizerOptions {
 public:
  // --vocab, --merges, --tokenizer and --bos-token (what it is put before:
  // `bos_help`).
  void add_options(CLI::App& app, const std::string& bos_help) {
    app.add_option("--vocab", vocab_, "GPT-2 vocab.json (with --merges: BPE; otherwise bytes)");
    app.add_option("--merges", merges_, "GPT-2 merges.txt");
    app.add_option("--tokenizer", tokenizer_,
                   "a Hugging Face tokenizer.json (byte-level BPE: GPT-2's, LLaMA 3's, Qwen2's, "
                   "Qwen3's), a SentencePiece tokenizer.model (LLaMA 2's, Mistral 7B's, Gemma's, "
                   "T5's), or the model directory holding one");
    app.add_option("--bos-token", bos_token_, bos_help);
  }
  std::unique_ptr<data::Tokenizer> make() const {
    return data::make_tokenizer(vocab_, merges_, tokenizer_);
  }
  // The tokenizer for a model of `model_vocab` tokens: a larger one is
  // refused (it would give ids the model has no row for).
  std::unique_ptr<data::Tokenizer> make_for(int64_t model_vocab) const {
    std::unique_ptr<data::Tokenizer> tok = make();
    if (tok->vocab_size() > model_vocab) {
      throw ValueError("the tokenizer has " + std::to_string(tok->vocab_size()) +
                       " tokens but the model's vocab_size is " + std::to_string(model_vocab));
    }
    return tok;
  }
  // --bos-token's id in `tok` (an error naming it when it is no special
  // token there), or -1 without one.
  int64_t bos(const data::Tokenizer& tok) const {
    return bos_token_.empty() ? -1 : data::require_special_token(tok, bos_token_, "--bos-token");
  }
  bool has_bos() const { return !bos_token_.empty(); }
  // --tokenizer's path ("" without it): where a chat template is looked for.
  const std::string& tokenizer_path() const { return tokenizer_; }

 private:
  std::string vocab_, merges_, tokenizer_, bos_token_;
};

}  // namespace triad::examples
