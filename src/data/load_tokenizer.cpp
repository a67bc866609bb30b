// Which tokenizer a path or the command-line tools' flags name: a Hugging
// Face tokenizer.json (hf_tokenizer.cpp), a SentencePiece model
// (sentencepiece_tokenizer.cpp) or GPT-2's files, and special tokens by
// their text.
#include <cctype>
#include <filesystem>
#include <fstream>

#include "triad/core/error.h"
#include "triad/data/sentencepiece.h"
#include "triad/data/tokenizer.h"

namespace triad::data {

int32_t require_special_token(const Tokenizer& tokenizer, const std::string& text,
                              const std::string& what) {
  const int32_t id = tokenizer.special_token(text);
  if (id < 0) {
    throw ValueError(what + " '" + text +
                     "' is not a special token of the tokenizer (an added token of a "
                     "tokenizer.json, a control or user-defined piece of a SentencePiece model)");
  }
  return id;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path json = fs::path(path) / "tokenizer.json";
    const fs::path model = fs::path(path) / "tokenizer.model";
    const bool has_model = fs::exists(model, ec);
    if (fs::exists(json, ec)) {
      try {
        return load_hf_tokenizer(json.string());
      } catch (const NotSupportedError&) {
        // A directory may hold both (LLaMA 2's, Mistral's); the model file
        // stands in for a tokenizer.json of a kind Triad does not build.
        if (!has_model) throw;
      }
    }
    if (has_model) return load_sentencepiece(model.string());
    throw IoError("tokenizer directory '" + path +
                  "' holds neither tokenizer.json nor tokenizer.model");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open tokenizer '" + path + "'");
  // JSON begins with '{' after any whitespace; a SentencePiece model (a
  // protocol buffer) begins with its first piece's key, byte 0x0A.
  char c = 0;
  while (in.get(c) && std::isspace(static_cast<unsigned char>(c))) {
  }
  if (c == '{') return load_hf_tokenizer(path);
  return load_sentencepiece(path);
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& vocab, const std::string& merges,
                                          const std::string& hf) {
  if (vocab.empty() != merges.empty())
    throw ValueError("--vocab and --merges must be given together");
  if (!hf.empty() && !vocab.empty())
    throw ValueError("--tokenizer and --vocab/--merges name two tokenizers; give one");
  if (!hf.empty()) return load_tokenizer(hf);
  if (!vocab.empty()) return std::make_unique<Gpt2BpeTokenizer>(vocab, merges);
  return std::make_unique<ByteTokenizer>();
}

}  // namespace triad::data
