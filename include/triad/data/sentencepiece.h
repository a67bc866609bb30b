#pragma once

// SentencePiece's tokenizers (LLaMA 1 and 2's, Mistral 7B's, Gemma's, T5's
// kind), read from the library's own model file (`tokenizer.model`, a
// ModelProto) and encoding as Google's library does: the normaliser (its
// precompiled character map, such as nmt_nfkc's, applied by longest match;
// the dummy-prefix space; extra spaces removed; spaces escaped as U+2581),
// then BPE (the pair whose merged piece scores highest merges first, the
// leftmost on a tie) or unigram (the most probable segmentation, Viterbi),
// runs of unknown characters one unknown piece, spelled as UTF-8 bytes
// (<0xNN> pieces) under byte fallback. Proven against python3-sentencepiece
// (tests/parity/sentencepiece_reference.py).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "triad/data/tokenizer.h"

namespace triad::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  enum class Algorithm { Bpe, Unigram };
  // ModelProto.SentencePiece.Type's values.
  enum class PieceType : uint8_t {
    Normal = 1,
    Unknown = 2,
    Control = 3,      // <s>, </s>: never matched in text, decode to nothing
    UserDefined = 4,  // matched literally in text, before anything else
    Unused = 5,
    Byte = 6,  // <0x00> .. <0xFF>, byte fallback's
  };
  struct Piece {
    std::string text;
    float score = 0;
    PieceType type = PieceType::Normal;
  };
  struct Settings {
    Algorithm algorithm = Algorithm::Bpe;
    bool byte_fallback = false;
    bool add_dummy_prefix = true;
    bool remove_extra_whitespaces = true;
    bool escape_whitespaces = true;
    // NormalizerSpec.precompiled_charsmap: a double-array trie of rules and
    // their replacements; empty for no rules (the identity normaliser).
    std::string precompiled_charsmap;
    std::string normalizer_name;                 // for messages only
    std::string unk_surface = " \xE2\x81\x87 ";  // what an unknown piece decodes to
  };

  // Exactly one Unknown piece; under byte fallback all 256 Byte pieces. A
  // piece's text must be non-empty and unique. Otherwise a ValueError.
  SentencePieceTokenizer(std::vector<Piece> pieces, Settings settings);

  std::vector<int32_t> encode(const std::string& text) const override;
  // Ids outside the vocabulary are a ValueError naming the id.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }
  // A Control, UserDefined or Unknown piece's id by its text (e.g. </s>).
  int32_t special_token(const std::string& text) const override;
  std::vector<std::string> special_tokens() const override;

  // The normaliser's output, spaces escaped (exposed for tests).
  std::string normalize(const std::string& text) const;
  const Settings& settings() const { return settings_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  int32_t unk_id() const { return unk_id_; }

 private:
  struct Segment {
    size_t begin, size;  // bytes of the normalised text
    int32_t id;
  };
  struct Trie;
  size_t user_defined_prefix(const char* s, size_t n) const;
  size_t normalize_prefix(const char* s, size_t n, std::string& out) const;
  void bpe(const std::string& text, std::vector<Segment>& out) const;
  void unigram(const std::string& text, std::vector<Segment>& out) const;
  int32_t id_of(std::string_view text) const;
  // Looked up by views into the text, without copying.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using PieceMap = std::unordered_map<std::string, int32_t, Hash, std::equal_to<>>;

  std::vector<Piece> pieces_;
  Settings settings_;
  PieceMap matchable_;                        // Normal, UserDefined, Unused
  PieceMap reserved_;                         // Unknown, Control, Byte
  std::shared_ptr<const Trie> user_defined_;  // literal matches in text
  std::shared_ptr<const Trie> unigram_trie_;  // every matchable piece
  int32_t unk_id_ = -1;
  int32_t byte_ids_[256] = {};
  std::vector<int16_t> byte_of_;         // per piece: the byte a Byte piece stands for, or -1
  float min_score_ = 0, max_score_ = 0;  // over Normal pieces (unigram)
  // The charsmap's double array and replacement strings, views into
  // settings_.precompiled_charsmap.
  const char* trie_units_ = nullptr;
  size_t trie_size_ = 0;  // units
  const char* replacements_ = nullptr;
  size_t replacements_size_ = 0;
};

// A SentencePiece model file (ModelProto: its pieces, trainer_spec's
// model_type, byte_fallback and unk_surface, normalizer_spec). What it does
// not build is a NotSupportedError naming the field (the word and char
// model types, treat_whitespace_as_suffix, a denormaliser with rules); a
// file that does not parse is an IoError naming it and the byte offset.
std::unique_ptr<SentencePieceTokenizer> load_sentencepiece(const std::string& path);

}  // namespace triad::data
