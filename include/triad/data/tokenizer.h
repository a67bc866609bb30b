#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
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
  // The id of a special token by its text (BPE's added tokens, such as
  // <|endoftext|>; SentencePiece's control, user-defined and unknown
  // pieces, such as </s>), or -1.
  virtual int32_t special_token(const std::string& text) const {
    (void)text;
    return -1;
  }
  // The texts special_token knows, each an id of its own (what a chat
  // template's rendered text is cut at: tokens_of_rendered_text).
  virtual std::vector<std::string> special_tokens() const { return {}; }
  // The ids below vocab_size() that are no token (a vocabulary with holes,
  // such as added tokens numbered past a gap): decode() refuses them, so a
  // sampler must never produce them (SamplingOptions::suppress_tokens).
  virtual std::vector<int32_t> missing_ids() const { return {}; }
};

// One token per byte (vocabulary of 256).
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return 256; }
};

// How byte-level BPE tokenizers split text into pieces before merging,
// each a hand-written matcher of the regular expression it names, with
// Unicode's classes (Unicode 15.0 tables: src/data/unicode_classes.cpp):
//   Gpt2    GPT-2's: contractions, runs of \p{L} letters, of \p{N} numbers,
//           of other symbols (each optionally after a space), whitespace.
//   Llama3  LLaMA 3's (tiktoken's cl100k): contractions in any case, a
//           letter run after at most one other character, numbers in runs of
//           at most 3 digits, symbol runs with the newlines after them, and
//           whitespace runs that end in a newline kept apart.
//   Qwen2   Qwen2's and Qwen3's: LLaMA 3's with numbers one digit each.
//   O200k   GPT-4o's (tiktoken's o200k; Phi-4-mini's, gpt-oss's): words
//           split by case, capitals then small letters (a run of capitals
//           before a capitalised word stays apart), each after at most one
//           other character and with a contraction in any case after it;
//           numbers of at most 3 digits; symbol runs with the newlines and
//           slashes after them; whitespace as LLaMA 3's.
//   Tekken  Mistral's (Mistral NeMo's, Small 3's): O200k's without the
//           contractions, numbers one digit each.
enum class PretokenizePattern { Gpt2, Llama3, Qwen2, O200k, Tekken };
std::vector<std::string> pretokenize(const std::string& text, PretokenizePattern pattern);
const char* pretokenize_pattern_name(PretokenizePattern pattern);

// Byte-level BPE (GPT-2's scheme, kept by LLaMA 3 and Qwen): text is split
// into pieces by the pattern, each piece's bytes mapped to printable code
// points and merged pair by pair, lowest rank first. Optionally the text is
// normalised to NFC first (Qwen's), a piece that is a whole vocabulary
// entry is taken as it is (`ignore_merges`, LLaMA 3's), and added tokens
// (Hugging Face's special tokens, such as <|endoftext|>) are matched
// literally before anything else, longest first, and decode to their text.
class BpeTokenizer : public Tokenizer {
 public:
  struct Settings {
    PretokenizePattern pattern = PretokenizePattern::Gpt2;
    bool nfc = false;
    bool ignore_merges = false;
    std::map<std::string, int32_t> added_tokens = {};
  };
  // `merges` in rank order; every id must be >= 0, and an added token's id
  // must not be a vocabulary entry's.
  BpeTokenizer(std::map<std::string, int32_t> vocab,
               const std::vector<std::pair<std::string, std::string>>& merges, Settings settings);
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  // One more than the largest id (vocabulary or added token).
  int64_t vocab_size() const override { return vocab_size_; }
  // The id of the added token `content`, or -1.
  int32_t added_token(const std::string& content) const;
  int32_t special_token(const std::string& text) const override { return added_token(text); }
  std::vector<std::string> special_tokens() const override;
  std::vector<int32_t> missing_ids() const override;
  const Settings& settings() const { return settings_; }

 private:
  std::vector<std::string> bpe(const std::string& word) const;
  void encode_plain(const std::string& text, std::vector<int32_t>& ids) const;

  Settings settings_;
  std::map<std::string, int32_t> encoder_;
  std::map<int32_t, std::string> decoder_;
  std::map<int32_t, std::string> added_by_id_;
  std::map<std::pair<std::string, std::string>, int> ranks_;
  std::string byte_to_unicode_[256];
  std::map<std::string, uint8_t> unicode_to_byte_;
  int64_t vocab_size_ = 0;
  uint64_t id_;  // this tokenizer's, for the per-thread piece cache
};

// GPT-2's byte-level BPE from its vocab.json (token -> id) and merges.txt,
// GPT-2's pattern: any text splits as OpenAI's encoder splits it.
class Gpt2BpeTokenizer final : public BpeTokenizer {
 public:
  Gpt2BpeTokenizer(const std::string& vocab_json_path, const std::string& merges_path);
};

// Hugging Face's BPE of the SentencePiece kind (the tokenizer.json that
// transformers writes for LLaMA 2, Mistral, Gemma and Phi-3, converted from
// their tokenizer.model, or one trained that way): spaces are written as a
// marker (U+2581, "▁"), by normalisers (LLaMA 2's "legacy" form: ▁
// prepended, every space replaced) or by a Metaspace pre-tokeniser (the
// newer form, prepending ▁ to the text's first piece only); the characters
// of each word (the whole piece, or each ▁-led run with Metaspace's split)
// are merged pair by pair, lowest rank first; a character outside the
// vocabulary becomes its UTF-8 bytes' <0xXX> tokens (byte fallback), else
// the unknown token (runs of them one token with fuse_unk). Decoding runs
// the file's decoder steps: Replace, ByteFallback (a byte run that is not
// UTF-8 gives U+FFFD per byte), Fuse, Strip, Metaspace. Added tokens are
// matched in the raw text first, as BpeTokenizer's are; the normalisers
// and the pre-tokeniser see each piece between them on its own.
class MetaspaceBpeTokenizer final : public Tokenizer {
 public:
  enum class Prepend { Always, First, Never };  // Metaspace's prepend_scheme
  // A normaliser step: prepend `text` to a non-empty piece, or replace
  // every `from` by `to`.
  struct NormalizeStep {
    enum class Kind { Prepend, Replace, Nfc } kind;
    std::string from, to;
  };
  struct DecodeStep {
    enum class Kind { Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
    std::string from, to;     // Replace's pattern and content; Strip's and Metaspace's character
    int start = 0, stop = 0;  // Strip's counts
    Prepend prepend = Prepend::Always;  // Metaspace's
  };
  struct Settings {
    std::vector<NormalizeStep> normalizer = {};
    bool metaspace = false;  // a Metaspace pre-tokeniser:
    std::string replacement = "\xE2\x96\x81";
    Prepend prepend = Prepend::Always;
    bool split = true;
    // Or a Split pre-tokeniser on a literal (Gemma's, on " " after its
    // normaliser has written spaces as ▁): each match removed, kept as a
    // piece of its own (runs of them one piece: contiguous), or joined to
    // the piece before or after it.
    enum class SplitBehavior {
      None,
      Removed,
      Isolated,
      Contiguous,
      MergedWithPrevious,
      MergedWithNext
    };
    SplitBehavior split_behavior = SplitBehavior::None;
    std::string split_pattern;
    bool byte_fallback = false;
    int32_t unk_id = -1;  // -1: none (an unknown character is an error)
    bool fuse_unk = false;
    bool ignore_merges = false;
    // Empty: no decoder (the tokens joined by spaces, as Hugging Face does).
    std::vector<DecodeStep> decoder = {};
    std::map<std::string, int32_t> added_tokens = {};
  };
  // `merges` in rank order, each pair and its concatenation vocabulary
  // entries (a ValueError names the first that is not).
  MetaspaceBpeTokenizer(std::map<std::string, int32_t> vocab,
                        const std::vector<std::pair<std::string, std::string>>& merges,
                        Settings settings);
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t special_token(const std::string& text) const override;
  std::vector<std::string> special_tokens() const override;
  std::vector<int32_t> missing_ids() const override;
  const Settings& settings() const { return settings_; }
  // The words a piece of text (between added tokens; `first`: at the text's
  // start) is merged in, after the normaliser and the pre-tokeniser.
  std::vector<std::string> words(const std::string& piece, bool first) const;

 private:
  void encode_word(const std::string& word, std::vector<int32_t>& ids) const;
  std::vector<std::string> split_words(const std::string& s) const;

  Settings settings_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> pieces_;  // by id ("" where none)
  std::vector<uint8_t> has_piece_;
  std::map<int32_t, std::string> added_by_id_;
  struct Merge {
    int32_t rank, id;
  };
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  int32_t byte_ids_[256];                       // <0xXX>'s ids, -1 where absent
  int64_t vocab_size_ = 0;
  uint64_t id_;  // this tokenizer's, for the per-thread word cache
};

// A Hugging Face tokenizer.json (or the directory holding it): the
// byte-level BPE kind (a BpeTokenizer: GPT-2's, LLaMA 3's, Qwen2's and
// Qwen3's; an NFC normaliser, a pre-tokeniser whose pattern is one of
// PretokenizePattern's) or the SentencePiece kind (a MetaspaceBpeTokenizer:
// a BPE model with no pre-tokeniser or a Metaspace one; Prepend, Replace
// and NFC normalisers). Reads the vocabulary, the merges (either form),
// ignore_merges, byte_fallback, unk_token, fuse_unk, the added tokens and
// the decoder. What it does not build (another model type, normaliser,
// pre-tokeniser or decoder; added tokens that strip spaces, match single
// words, or are matched after a normaliser that changes them) is a
// NotSupportedError naming the key; the post-processor's BOS/EOS templates
// are not applied (Triad's tools add their own beginning and end tokens).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);

// Tokenizer::special_token(text), or a ValueError naming `what` (the flag
// that gave it, e.g. "--eod-token") and what a special token is.
int32_t require_special_token(const Tokenizer& tokenizer, const std::string& text,
                              const std::string& what);

// The tokenizer a file or directory holds, told apart by content: a
// Hugging Face tokenizer.json (load_hf_tokenizer) or a SentencePiece model
// (load_sentencepiece, include/triad/data/sentencepiece.h). A directory's
// tokenizer.json is read before its tokenizer.model (as transformers reads
// it; LLaMA 2's and Mistral's directories hold both), which is read instead
// when the tokenizer.json is of a kind load_hf_tokenizer refuses.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// The tokenizer the command-line tools' flags name: load_tokenizer's
// (`hf`, --tokenizer), GPT-2's vocab.json and merges.txt
// (--vocab and --merges, both), or one token per byte (none). Any other
// combination is a ValueError naming the flags.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& vocab, const std::string& merges,
                                          const std::string& hf);

// Unicode's canonical composition (NFC) of UTF-8 text; malformed bytes are
// kept as they are. The data are Python's unicodedata's (Unicode
// nfc_unicode_version(); src/data/unicode_nfc_tables.cpp).
std::string nfc(const std::string& text);
const char* nfc_unicode_version();

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

// A piece of a document's text, and whether its tokens are targets with
// loss (supervised fine-tuning scores the answers, not the questions). A
// `special` piece is one special token named by its text (a chat
// template's markers), taken by id rather than encoded.
struct TextSegment {
  std::string text;
  bool scored = false;
  bool special = false;
};
using SegmentedDocument = std::vector<TextSegment>;

enum class ChatTemplate;  // chat_template.h
class ModelChatTemplate;  // chat_template.h

// How each JSON line becomes a document of scored and unscored pieces, for
// supervised fine-tuning (JSON lines only). With a `prompt_key` a line is
// a prompt/response pair: the string under prompt_key (read only), then
// the one under json_key (scored). With a `chat` template the value under
// json_key is a conversation, a list of {"role": ..., "content": ...}
// objects (further fields ignored), written out by render_chat.
struct DocumentLabels {
  std::string prompt_key;
  std::optional<ChatTemplate> chat;
  // The model's own template instead of a built-in one: a conversation's
  // messages go to it as they are, every field kept.
  std::shared_ptr<const ModelChatTemplate> model_chat = nullptr;
  // With model_chat: one document per assistant message
  // (ModelChatTemplate::render_each_turn) rather than one per conversation.
  bool each_turn = false;
  bool any() const { return !prompt_key.empty() || chat.has_value() || model_chat; }
};

// The same documents read from a stream a batch at a time, so that a corpus
// larger than memory is tokenized in pieces (triad-tokenize): each next()
// appends documents to `batch` until the text read passes `max_bytes` (and
// at least one line was read) or the input ends, and returns false once
// the input is spent. JSON errors name the line's number in the whole
// stream. `whole` reads everything as one document. A reader with labels
// (JSON lines only, and not both kinds: ValueErrors) gives segmented
// documents, one without gives plain ones; asking it for the other kind is
// a ValueError.
class DocumentReader {
 public:
  DocumentReader(std::istream& in, DocumentSplit how, std::string json_key = "text",
                 DocumentLabels labels = {});
  bool next(std::vector<std::string>& batch, size_t max_bytes);
  bool next(std::vector<SegmentedDocument>& batch, size_t max_bytes);

 private:
  bool read(std::vector<std::string>* plain, std::vector<SegmentedDocument>* segmented,
            size_t max_bytes);

  std::istream& in_;
  DocumentSplit how_;
  std::string key_;
  DocumentLabels labels_;
  std::string paragraph_;  // a paragraph still being read
  int64_t line_ = 0;
  bool done_ = false;
};
// Each document's tokens, each followed by eod_token when it is >= 0 and
// preceded by bos_token when that is >= 0 (each must then be below the
// tokenizer's vocab_size: a ValueError otherwise).
// Documents are encoded one by one, so no BPE merge crosses a boundary, by
// `workers` threads taking the next document as they finish one (0: one
// per hardware thread); the result does not depend on their number. A
// document that cannot be encoded is named by its index (the first such),
// counted from `first_document` (a batch's place in a longer stream).
std::vector<std::vector<int64_t>> tokenize_documents(const Tokenizer& tokenizer,
                                                     const std::vector<std::string>& documents,
                                                     int64_t eod_token, int workers = 1,
                                                     int64_t first_document = 0,
                                                     int64_t bos_token = -1);

// Segmented documents (supervised fine-tuning) as tokens with loss masks:
// document i is bos_token (when >= 0), each piece's tokens, eod_token
// (when >= 0); its mask is 1 over the scored pieces' tokens, 0 over the
// others and bos, and `eod_scored` over eod (a prompt/response pair's end
// is the model's cue to stop; a chat's turns end with their own marker).
// Each piece is encoded on its own, as a prompt is at generation time, so
// no merge crosses a boundary where scoring changes; a special piece is
// its token's id (a ValueError naming it when the tokenizer has no such
// special token). Threads and errors as tokenize_documents's.
struct MaskedDocuments {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<uint8_t>> keep;
};
MaskedDocuments tokenize_segmented(const Tokenizer& tokenizer,
                                   const std::vector<SegmentedDocument>& documents,
                                   int64_t eod_token, bool eod_scored, int workers = 1,
                                   int64_t first_document = 0, int64_t bos_token = -1);

// The text `generated` adds after `prompt`: the two decoded together, less
// the prompt's own text, so that what depends on its neighbours survives
// (a SentencePiece piece's leading space is dropped at the start of a
// text). When the prompt's text is not a prefix of the whole, `generated`
// decoded alone.
std::string continuation_text(const Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& generated);

// GPT-2 pre-tokenisation of text into pieces (exposed for tests).
std::vector<std::string> gpt2_pretokenize(const std::string& text);

}  // namespace triad::data
