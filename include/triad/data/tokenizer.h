#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace triad::data {

// Text -> token ids.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
};

// One token per byte (vocabulary of 256).
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return 256; }
};

// GPT-2's byte-level BPE from its vocab.json (token -> id) and merges.txt.
// Pre-tokenisation follows GPT-2's pattern (contractions, runs of \p{L}
// letters, of \p{N} numbers, of other symbols, whitespace) with Unicode's
// classes (Unicode 15.0 tables: src/data/unicode_classes.cpp), so any text
// splits as OpenAI's encoder splits it.
class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  Gpt2BpeTokenizer(const std::string& vocab_json_path, const std::string& merges_path);
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(decoder_.size()); }

 private:
  std::vector<std::string> bpe(const std::string& word) const;

  std::map<std::string, int32_t> encoder_;
  std::map<int32_t, std::string> decoder_;
  std::map<std::pair<std::string, std::string>, int> ranks_;
  std::string byte_to_unicode_[256];
  std::map<std::string, uint8_t> unicode_to_byte_;
};

// How a text file divides into documents (triad-tokenize --documents):
// the whole file is one; each non-empty line is one (a trailing \r is
// dropped); paragraphs, runs of lines separated by blank lines (lines of
// spaces, tabs or \r only), each document its lines joined by \n; or JSON
// lines (Megatron-LM's preprocessing input: one object per non-blank line,
// the document the string under `json_key`).
enum class DocumentSplit { Whole, Lines, Paragraphs, JsonLines };
// whole | lines | paragraphs | jsonl; anything else is a ValueError naming it.
DocumentSplit document_split_from_string(const std::string& name);
// A JSON line that does not parse, is not an object or lacks a string
// under json_key is a ValueError naming its line number.
std::vector<std::string> split_documents(const std::string& text, DocumentSplit how,
                                         const std::string& json_key = "text");
// Each document's tokens, each followed by eod_token when it is >= 0 (it
// must then be below the tokenizer's vocab_size: a ValueError otherwise).
// Documents are encoded one by one, so no BPE merge crosses a boundary.
std::vector<std::vector<int64_t>> tokenize_documents(const Tokenizer& tokenizer,
                                                     const std::vector<std::string>& documents,
                                                     int64_t eod_token);

// GPT-2 pre-tokenisation of text into pieces (exposed for tests).
std::vector<std::string> gpt2_pretokenize(const std::string& text);

}  // namespace triad::data
