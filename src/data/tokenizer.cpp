#include "triad/data/tokenizer.h"

#include "triad/data/chat_template.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "added_tokens.h"
#include "triad/core/error.h"
#include "triad/io/text_file.h"
#include "unicode_classes.h"
#include "utf8.h"

namespace triad::data {
namespace {

using unicode::is_white_space;
// GPT-2's pattern's classes: \s (the White_Space code points above),
// \p{L}, \p{N}, and everything else (punctuation, symbols, marks, controls).
enum class Cls { Letter, Number, Other, Space };
Cls classify(uint32_t c) {
  if (c < 0x80) {  // ASCII without a table lookup
    if (is_white_space(c)) return Cls::Space;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return Cls::Letter;
    if (c >= '0' && c <= '9') return Cls::Number;
    return Cls::Other;
  }
  if (is_white_space(c)) return Cls::Space;
  if (unicode::is_letter(c)) return Cls::Letter;
  if (unicode::is_number(c)) return Cls::Number;
  return Cls::Other;
}

}  // namespace

namespace {

// A text split by a pattern: its code points with their byte positions
// (the last one: the text's end), and the pieces found so far.
struct Pieces {
  const std::string& text;
  std::vector<uint32_t> cps;
  std::vector<size_t> pos;
  std::vector<std::string> out;
  explicit Pieces(const std::string& s) : text(s) {
    for (size_t i = 0; i < text.size();) {
      size_t len;
      cps.push_back(next_code_point(text, i, len));
      pos.push_back(i);
      i += len;
    }
    pos.push_back(text.size());
  }
  // Code points [a, b) make the next piece.
  void emit(size_t a, size_t b) { out.push_back(text.substr(pos[a], pos[b] - pos[a])); }
};

// The end of the whitespace run at i, given that it ends at k: \s+(?!\S)
// leaves the run's last character for the next piece when a non-space
// follows, \s+ takes a lone one.
size_t whitespace_end(size_t i, size_t k, size_t n) {
  return k < n && k - i > 1 ? k - 1 : k;
}

// The letter a contraction's character matches case-insensitively (the
// pattern's (?i:...)): ASCII letters, and U+017F (long s), whose simple case
// folding is 's'.
uint32_t folded(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c - 'A' + 'a';
  if (c == 0x17F) return 's';
  return c;
}

// The length of the contraction ('s 't 're 've 'm 'll 'd) at cps[i], or 0;
// `any_case`: its letters in either case ((?i:...)).
size_t contraction(const std::vector<uint32_t>& cps, size_t i, bool any_case) {
  const size_t n = cps.size();
  if (cps[i] != '\'' || i + 1 >= n) return 0;
  auto letter = [&](size_t k) { return k < n ? (any_case ? folded(cps[k]) : cps[k]) : 0; };
  const uint32_t a = letter(i + 1), b = letter(i + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

std::vector<std::string> gpt2_pieces(const std::string& text) {
  Pieces p(text);
  const std::vector<uint32_t>& cps = p.cps;
  const size_t n = cps.size();
  auto emit = [&](size_t a, size_t b) { p.emit(a, b); };
  size_t i = 0;
  while (i < n) {
    if (const size_t k = contraction(cps, i, false)) {
      emit(i, i + k);
      i += k;
      continue;
    }
    size_t start = i;
    size_t j = i;
    if (cps[j] == ' ' && j + 1 < n && classify(cps[j + 1]) != Cls::Space) ++j;
    const Cls c = classify(cps[j]);
    if (c != Cls::Space) {
      while (j < n && classify(cps[j]) == c) ++j;
      emit(start, j);
      i = j;
      continue;
    }
    size_t k = i;
    while (k < n && is_white_space(cps[k])) ++k;
    k = whitespace_end(i, k, n);
    emit(i, k);
    i = k;
  }
  return p.out;
}

// The end of the piece at cps[i] when no word or number begins there, by
// the last alternatives LLaMA 3's pattern and o200k's share:
//    ?[^\s\p{L}\p{N}]+[\r\n]*   (o200k's: [\r\n/]*, `slashes`)
//   \s*[\r\n]+ up to a whitespace run's last newline, else \s+(?!\S) or \s+.
size_t symbols_or_space_end(const std::vector<uint32_t>& cps, size_t i, bool slashes) {
  const size_t n = cps.size();
  auto newline = [&](size_t k) { return cps[k] == '\r' || cps[k] == '\n'; };
  size_t j = i;
  if (cps[j] == ' ' && j + 1 < n && classify(cps[j + 1]) == Cls::Other) ++j;
  if (classify(cps[j]) == Cls::Other) {
    while (j < n && classify(cps[j]) == Cls::Other) ++j;
    while (j < n && (newline(j) || (slashes && cps[j] == '/'))) ++j;
    return j;
  }
  size_t k = i;
  while (k < n && is_white_space(cps[k])) ++k;
  size_t last_newline = k;
  for (size_t m = i; m < k; ++m) {
    if (newline(m)) last_newline = m;
  }
  return last_newline < k ? last_newline + 1 : whitespace_end(i, k, n);
}

// LLaMA 3's pattern, and Qwen2's with numbers of at most `max_digits`:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Each alternative tried in turn at each position, as the regex does.
std::vector<std::string> llama3_pieces(const std::string& text, size_t max_digits) {
  Pieces p(text);
  const std::vector<uint32_t>& cps = p.cps;
  const size_t n = cps.size();
  auto emit = [&](size_t a, size_t b) { p.emit(a, b); };
  auto cls = [&](size_t k) { return classify(cps[k]); };
  auto newline = [&](size_t k) { return cps[k] == '\r' || cps[k] == '\n'; };
  size_t i = 0;
  while (i < n) {
    if (const size_t k = contraction(cps, i, true)) {
      emit(i, i + k);
      i += k;
      continue;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    size_t j = i;
    if (cls(j) != Cls::Letter && cls(j) != Cls::Number && !newline(j) && j + 1 < n &&
        cls(j + 1) == Cls::Letter)
      ++j;
    if (cls(j) == Cls::Letter) {
      while (j < n && cls(j) == Cls::Letter) ++j;
      emit(i, j);
      i = j;
      continue;
    }
    // \p{N}{1,max}
    if (cls(i) == Cls::Number) {
      j = i;
      while (j < n && j - i < max_digits && cls(j) == Cls::Number) ++j;
      emit(i, j);
      i = j;
      continue;
    }
    // Symbols, or whitespace.
    const size_t k = symbols_or_space_end(cps, i, false);
    emit(i, k);
    i = k;
  }
  return p.out;
}

// o200k's word classes, ASCII without a table lookup.
bool word_capital(uint32_t c) {
  return c < 0x80 ? c >= 'A' && c <= 'Z' : unicode::is_word_capital(c);
}
bool word_small(uint32_t c) {
  return c < 0x80 ? c >= 'a' && c <= 'z' : unicode::is_word_small(c);
}

// GPT-4o's o200k pattern, and Mistral's Tekken (`contractions` false,
// numbers of at most `max_digits`):
//   [^\r\n\p{L}\p{N}]?[C]*[S]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//   [^\r\n\p{L}\p{N}]?[C]+[S]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//   \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with C the capitals [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and S the small
// letters [\p{Ll}\p{Lm}\p{Lo}\p{M}], which overlap (uncased letters, marks).
// Each alternative tried in turn at each position, backtracking as the
// regex does: the optional first character is taken if the rest can match
// after it, else left out.
std::vector<std::string> o200k_pieces(const std::string& text, size_t max_digits,
                                      bool contractions) {
  Pieces p(text);
  const std::vector<uint32_t>& cps = p.cps;
  const size_t n = cps.size();
  auto emit = [&](size_t a, size_t b) { p.emit(a, b); };
  auto cls = [&](size_t k) { return classify(cps[k]); };
  auto newline = [&](size_t k) { return cps[k] == '\r' || cps[k] == '\n'; };
  // [^\r\n\p{L}\p{N}]: the character a word may take before it.
  auto lead = [&](size_t k) {
    return cls(k) != Cls::Letter && cls(k) != Cls::Number && !newline(k);
  };
  // The end of [C]*[S]+ from j, or 0: the longest run of capitals, then of
  // small letters; with no small letter after the capitals, the run gives
  // back capitals until its last small letter ends the match.
  auto capitals_then_smalls = [&](size_t j) -> size_t {
    size_t u = j;
    while (u < n && word_capital(cps[u])) ++u;
    if (u < n && word_small(cps[u])) {
      while (u < n && word_small(cps[u])) ++u;
      return u;
    }
    for (size_t m = u; m > j; --m) {
      if (word_small(cps[m - 1])) return m;
    }
    return 0;
  };
  // The end of [C]+[S]* from j, or 0.
  auto capitals = [&](size_t j) -> size_t {
    size_t u = j;
    while (u < n && word_capital(cps[u])) ++u;
    if (u == j) return 0;
    while (u < n && word_small(cps[u])) ++u;
    return u;
  };
  size_t i = 0;
  while (i < n) {
    size_t end = 0;
    // The first alternative with its leading character, then without; then
    // the second the same way.
    for (int alternative = 0; alternative < 2 && end == 0; ++alternative) {
      for (const size_t j : {i + 1, i}) {
        if (j == i + 1 && (!lead(i) || j >= n)) continue;
        end = alternative == 0 ? capitals_then_smalls(j) : capitals(j);
        if (end != 0) break;
      }
    }
    if (end != 0) {
      if (contractions && end < n) end += contraction(cps, end, true);
      emit(i, end);
      i = end;
      continue;
    }
    // \p{N}{1,max}
    if (cls(i) == Cls::Number) {
      size_t j = i;
      while (j < n && j - i < max_digits && cls(j) == Cls::Number) ++j;
      emit(i, j);
      i = j;
      continue;
    }
    // Symbols (and the slashes after them), or whitespace.
    const size_t k = symbols_or_space_end(cps, i, true);
    emit(i, k);
    i = k;
  }
  return p.out;
}

}  // namespace

std::vector<std::string> pretokenize(const std::string& text, PretokenizePattern pattern) {
  switch (pattern) {
    case PretokenizePattern::Gpt2:
      return gpt2_pieces(text);
    case PretokenizePattern::Llama3:
      return llama3_pieces(text, 3);
    case PretokenizePattern::Qwen2:
      return llama3_pieces(text, 1);
    case PretokenizePattern::O200k:
      return o200k_pieces(text, 3, true);
    case PretokenizePattern::Tekken:
      return o200k_pieces(text, 1, false);
  }
  throw ValueError("pretokenize: unknown pattern");
}

const char* pretokenize_pattern_name(PretokenizePattern pattern) {
  switch (pattern) {
    case PretokenizePattern::Gpt2:
      return "gpt2";
    case PretokenizePattern::Llama3:
      return "llama3";
    case PretokenizePattern::Qwen2:
      return "qwen2";
    case PretokenizePattern::O200k:
      return "o200k";
    case PretokenizePattern::Tekken:
      return "tekken";
  }
  return "?";
}

std::vector<std::string> gpt2_pretokenize(const std::string& text) {
  return pretokenize(text, PretokenizePattern::Gpt2);
}

std::vector<int32_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) {
    if (id < 0 || id > 255)
      throw ValueError("ByteTokenizer: id " + std::to_string(id) + " is not a byte");
    s.push_back(static_cast<char>(id));
  }
  return s;
}

namespace {

// Pieces already encoded, by their bytes: words recur (Zipf), and BPE
// costs a lookup per adjacent pair per merge. One cache per thread, so the
// workers of tokenize_documents never wait for each other, for the
// tokenizer it last served (`owner`, an id no other tokenizer takes);
// emptied when it grows past a bound.
struct PieceCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>> ids;
};
thread_local PieceCache piece_cache;
constexpr size_t kPieceCacheEntries = size_t{1} << 16;
std::atomic<uint64_t> next_tokenizer_id{1};

}  // namespace

BpeTokenizer::BpeTokenizer(std::map<std::string, int32_t> vocab,
                           const std::vector<std::pair<std::string, std::string>>& merges,
                           Settings settings)
    : settings_(std::move(settings)), encoder_(std::move(vocab)), id_(next_tokenizer_id++) {
  // GPT-2's reversible byte -> printable code point map.
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
    byte_to_unicode_[b] = utf8(cp);
    unicode_to_byte_[byte_to_unicode_[b]] = static_cast<uint8_t>(b);
  }
  for (const auto& [token, id] : encoder_) {
    if (id < 0) throw ValueError("tokenizer: '" + token + "' has a negative id");
    const auto [at, fresh] = decoder_.emplace(id, token);
    if (!fresh) {
      // (Decoding would give one of them for the other's id.)
      throw ValueError("tokenizer: '" + token + "' and '" + at->second + "' share the id " +
                       std::to_string(id));
    }
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
  }
  for (const auto& [content, id] : settings_.added_tokens) {
    if (id < 0) throw ValueError("tokenizer: added token '" + content + "' has a negative id");
    if (content.empty()) throw ValueError("tokenizer: an added token is empty");
    const auto clash = decoder_.find(id);
    if (clash != decoder_.end() && clash->second != content) {
      throw ValueError("tokenizer: added token '" + content + "' takes id " + std::to_string(id) +
                       ", the vocabulary's '" + clash->second + "'");
    }
    added_by_id_[id] = content;
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
  }
  int rank = 0;
  for (const auto& m : merges) ranks_.emplace(m, rank++);  // the first of a repeated pair wins
}

int32_t BpeTokenizer::added_token(const std::string& content) const {
  return added_token_id(settings_.added_tokens, content);
}

std::vector<std::string> BpeTokenizer::special_tokens() const {
  return added_token_texts(settings_.added_tokens);
}

std::vector<std::string> BpeTokenizer::bpe(const std::string& word) const {
  std::vector<std::string> symbols;
  for (size_t i = 0; i < word.size();) {
    size_t len;
    next_code_point(word, i, len);
    symbols.push_back(word.substr(i, len));
    i += len;
  }
  while (symbols.size() > 1) {
    int best = INT32_MAX;
    std::pair<std::string, std::string> best_pair;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = ranks_.find({symbols[i], symbols[i + 1]});
      if (it != ranks_.end() && it->second < best) {
        best = it->second;
        best_pair = it->first;
      }
    }
    if (best == INT32_MAX) break;
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == best_pair.first &&
          symbols[i + 1] == best_pair.second) {
        merged.push_back(symbols[i] + symbols[i + 1]);
        i += 2;
      } else {
        merged.push_back(symbols[i]);
        i += 1;
      }
    }
    symbols.swap(merged);
  }
  return symbols;
}

void BpeTokenizer::encode_plain(const std::string& text, std::vector<int32_t>& ids) const {
  const std::string normal = settings_.nfc ? nfc(text) : text;
  PieceCache& cache = piece_cache;
  if (cache.owner != id_) {
    cache.ids.clear();
    cache.owner = id_;
  }
  for (const std::string& piece : pretokenize(normal, settings_.pattern)) {
    const auto hit = cache.ids.find(piece);
    if (hit != cache.ids.end()) {
      ids.insert(ids.end(), hit->second.begin(), hit->second.end());
      continue;
    }
    std::vector<int32_t> piece_ids;
    std::string mapped;
    for (unsigned char b : piece) mapped += byte_to_unicode_[b];
    const auto whole = settings_.ignore_merges ? encoder_.find(mapped) : encoder_.end();
    if (whole != encoder_.end()) {
      piece_ids.push_back(whole->second);
    } else {
      for (const std::string& sym : bpe(mapped)) {
        auto it = encoder_.find(sym);
        if (it == encoder_.end()) {
          throw ValueError("tokenizer: symbol '" + sym + "' is not in the vocabulary");
        }
        piece_ids.push_back(it->second);
      }
    }
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    if (cache.ids.size() >= kPieceCacheEntries) cache.ids.clear();
    cache.ids.emplace(piece, std::move(piece_ids));
  }
}

std::vector<int32_t> BpeTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  split_on_added_tokens(text, settings_.added_tokens, ids, [&](size_t begin, size_t end) {
    encode_plain(begin == 0 && end == text.size() ? text : text.substr(begin, end - begin), ids);
  });
  return ids;
}

std::vector<int32_t> BpeTokenizer::missing_ids() const {
  std::vector<int32_t> missing;
  for (int64_t id = 0; id < vocab_size_; ++id) {
    const auto i = static_cast<int32_t>(id);
    if (!decoder_.contains(i) && !added_by_id_.contains(i)) missing.push_back(i);
  }
  return missing;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    const auto added = added_by_id_.find(id);
    if (added != added_by_id_.end()) {
      out += added->second;
      continue;
    }
    auto it = decoder_.find(id);
    if (it == decoder_.end())
      throw ValueError("tokenizer: id " + std::to_string(id) + " is not in the vocabulary");
    const std::string& tok = it->second;
    for (size_t i = 0; i < tok.size();) {
      size_t len;
      next_code_point(tok, i, len);
      auto b = unicode_to_byte_.find(tok.substr(i, len));
      if (b == unicode_to_byte_.end())
        throw ValueError("tokenizer: token '" + tok + "' has a non-byte symbol");
      out.push_back(static_cast<char>(b->second));
      i += len;
    }
  }
  return out;
}

namespace {

std::map<std::string, int32_t> read_gpt2_vocab(const std::string& path) {
  const std::optional<std::string> text = io::read_file(path);
  if (!text) throw IoError("tokenizer: cannot open vocab '" + path + "'");
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    throw IoError("tokenizer: vocab '" + path + "' is not valid JSON: " + e.what());
  }
  if (!vocab.is_object()) throw IoError("tokenizer: vocab '" + path + "' must map tokens to ids");
  std::map<std::string, int32_t> out;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) {
      throw IoError("tokenizer: vocab entry '" + it.key() + "' has a non-integer id");
    }
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > INT32_MAX)
      throw IoError("tokenizer: vocab id " + std::to_string(id) + " is out of range");
    out[it.key()] = static_cast<int32_t>(id);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> read_gpt2_merges(const std::string& path) {
  const std::optional<std::string> text = io::read_file(path);
  if (!text) throw IoError("tokenizer: cannot open merges '" + path + "'");
  std::istringstream min(*text);
  std::vector<std::pair<std::string, std::string>> out;
  std::string line;
  int line_no = 0;
  while (std::getline(min, line)) {
    ++line_no;
    if (line.rfind("#version", 0) == 0 || line.empty()) continue;
    const auto sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size()) {
      throw IoError("tokenizer: merges '" + path + "' line " + std::to_string(line_no) +
                    " is not 'left right'");
    }
    out.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  return out;
}

}  // namespace

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::string& vocab_json_path,
                                   const std::string& merges_path)
    : BpeTokenizer(read_gpt2_vocab(vocab_json_path), read_gpt2_merges(merges_path), {}) {}

DocumentSplit document_split_from_string(const std::string& name) {
  if (name == "whole") return DocumentSplit::Whole;
  if (name == "lines") return DocumentSplit::Lines;
  if (name == "paragraphs") return DocumentSplit::Paragraphs;
  if (name == "jsonl") return DocumentSplit::JsonLines;
  throw ValueError("documents '" + name + "' must be whole, lines, paragraphs or jsonl");
}

namespace {

// A JSON line as an object; errors name it by `where`.
template <class Json>
Json parse_json_line(const std::string& line, const std::string& where) {
  Json j;
  try {
    j = Json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    // The library's reason, without its "[json.exception...] parse error
    // at line 1, column N: " prefix (the line is ours).
    std::string why = e.what();
    const size_t colon = why.find(": ");
    if (colon != std::string::npos) why = why.substr(colon + 2);
    throw ValueError(where + " does not parse at byte " + std::to_string(e.byte) + ": " + why);
  } catch (const nlohmann::json::exception& e) {
    // (A number too large for a double: out_of_range, not parse_error.)
    throw ValueError(where + " does not parse: " + e.what());
  }
  if (!j.is_object()) throw ValueError(where + " is not an object");
  return j;
}

// A conversation in the model's own template (DocumentLabels::model_chat):
// one document, or one per assistant message (`each_turn`).
std::vector<SegmentedDocument> model_chat_documents(const nlohmann::ordered_json& j,
                                                    const std::string& key,
                                                    const ModelChatTemplate& chat, bool each_turn,
                                                    const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) {
    throw ValueError(where + " has no list of messages \"" + key +
                     "\" (--json-key names the field)");
  }
  // The tools a conversation may call, given beside its messages, go to
  // the program as transformers' `tools` argument does.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  if (const auto tools = j.find("tools"); tools != j.end() && !tools->is_null()) {
    if (!tools->is_array()) throw ValueError(where + ": \"tools\" is not a list");
    extra["tools"] = *tools;
  }
  try {
    if (each_turn) return chat.render_each_turn(*it, extra);
    std::vector<SegmentedDocument> one;
    one.push_back(chat.render(*it, extra));
    return one;
  } catch (const ValueError& e) {
    throw ValueError(where + ": " + e.what());
  }
}

// A labelled JSON line's pieces (DocumentLabels); `where` names the line.
SegmentedDocument labelled_document(const nlohmann::json& j, const std::string& key,
                                    const DocumentLabels& labels, const std::string& where) {
  const auto it = j.find(key);
  if (labels.chat) {
    if (it == j.end() || !it->is_array()) {
      throw ValueError(where + " has no list of messages \"" + key +
                       "\" (--json-key names the field)");
    }
    std::vector<ChatMessage> messages;
    for (size_t i = 0; i < it->size(); ++i) {
      const nlohmann::json& m = (*it)[i];
      const auto role = m.is_object() ? m.find("role") : m.end();
      const auto content = m.is_object() ? m.find("content") : m.end();
      if (!m.is_object() || role == m.end() || !role->is_string() || content == m.end() ||
          !content->is_string()) {
        throw ValueError(where + ": message " + std::to_string(i) +
                         " is not an object with a string \"role\" and a string \"content\"");
      }
      messages.push_back({role->get<std::string>(), content->get<std::string>()});
    }
    try {
      return render_chat(*labels.chat, messages);
    } catch (const ValueError& e) {
      throw ValueError(where + ": " + e.what());
    }
  }
  if (it == j.end() || !it->is_string()) {
    throw ValueError(where + " has no string \"" + key + "\" (--json-key names the field)");
  }
  const auto prompt = j.find(labels.prompt_key);
  if (prompt == j.end() || !prompt->is_string()) {
    throw ValueError(where + " has no string \"" + labels.prompt_key +
                     "\" (--prompt-key names the field)");
  }
  return {{prompt->get<std::string>(), false}, {it->get<std::string>(), true}};
}

}  // namespace

DocumentReader::DocumentReader(std::istream& in, DocumentSplit how, std::string json_key,
                               DocumentLabels labels)
    : in_(in), how_(how), key_(std::move(json_key)), labels_(std::move(labels)) {
  if (labels_.each_turn && !labels_.model_chat) {
    throw ValueError(
        "a document per assistant turn (--chat-turns each) needs the model's chat "
        "template (--chat-template model)");
  }
  if (!labels_.any()) return;
  const std::string what =
      labels_.model_chat ? std::string("the model's chat template")
      : labels_.chat ? std::string("a chat template ('") + chat_template_name(*labels_.chat) + "')"
                     : "a prompt key ('" + labels_.prompt_key + "')";
  if (how_ != DocumentSplit::JsonLines) {
    throw ValueError(what + " needs JSON lines (--documents jsonl): each line holds one " +
                     "labelled document");
  }
  if (labels_.chat && labels_.model_chat) {
    throw ValueError("give a built-in chat template or the model's, not both");
  }
  if ((labels_.chat || labels_.model_chat) && !labels_.prompt_key.empty()) {
    throw ValueError("give a prompt key or a chat template, not both: a line is a " +
                     std::string("prompt/response pair or a conversation"));
  }
  if (labels_.prompt_key == key_) {
    throw ValueError("the prompt key and the response's key are both '" + key_ +
                     "' (expected two fields of each JSON line)");
  }
}

bool DocumentReader::next(std::vector<std::string>& batch, size_t max_bytes) {
  if (labels_.any()) {
    throw ValueError(
        "DocumentReader::next: this reader labels its documents; ask for "
        "segmented ones");
  }
  return read(&batch, nullptr, max_bytes);
}

bool DocumentReader::next(std::vector<SegmentedDocument>& batch, size_t max_bytes) {
  if (!labels_.any()) {
    throw ValueError(
        "DocumentReader::next: this reader has no labels (a prompt key or a chat "
        "template) to segment its documents by");
  }
  return read(nullptr, &batch, max_bytes);
}

bool DocumentReader::read(std::vector<std::string>* plain,
                          std::vector<SegmentedDocument>* segmented, size_t max_bytes) {
  if (done_) return false;
  size_t added = 0;
  auto push = [&](std::string&& doc) {
    plain->push_back(std::move(doc));
    ++added;
  };
  if (how_ == DocumentSplit::Whole) {
    // (read, not << rdbuf(): a decompressing input's errors must reach the
    // caller, and an ostream's insertion would swallow them.)
    std::string all;
    std::array<char, 1 << 16> block;
    while (in_.read(block.data(), block.size()) || in_.gcount() > 0) {
      all.append(block.data(), static_cast<size_t>(in_.gcount()));
    }
    push(std::move(all));
    done_ = true;
    return true;
  }
  auto blank = [](const std::string& line) {
    return line.find_first_not_of(" \t\r") == std::string::npos;
  };
  size_t bytes = 0;
  std::string line;
  while (bytes < max_bytes || added == 0) {
    if (!std::getline(in_, line)) {
      done_ = true;
      // The input's last paragraph.
      if (!paragraph_.empty()) push(std::move(paragraph_));
      paragraph_.clear();
      break;
    }
    ++line_;
    bytes += line.size() + 1;
    switch (how_) {
      case DocumentSplit::Lines:
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!line.empty()) push(std::move(line));
        break;
      case DocumentSplit::Paragraphs:
        if (blank(line)) {
          if (!paragraph_.empty()) push(std::move(paragraph_));
          paragraph_.clear();
        } else {
          if (!paragraph_.empty()) paragraph_ += '\n';
          paragraph_ += line;
        }
        break;
      case DocumentSplit::JsonLines: {
        if (blank(line)) break;
        const std::string where = "JSON line " + std::to_string(line_);
        if (segmented && labels_.model_chat) {
          // In the order written: the model's template may write fields
          // out as they are (tool calls' arguments).
          const auto j = parse_json_line<nlohmann::ordered_json>(line, where);
          for (SegmentedDocument& d :
               model_chat_documents(j, key_, *labels_.model_chat, labels_.each_turn, where)) {
            segmented->push_back(std::move(d));
            ++added;
          }
          break;
        }
        const auto j = parse_json_line<nlohmann::json>(line, where);
        if (segmented) {
          segmented->push_back(labelled_document(j, key_, labels_, where));
          ++added;
          break;
        }
        const auto it = j.find(key_);
        if (it == j.end() || !it->is_string()) {
          throw ValueError(where + " has no string \"" + key_ + "\" (--json-key names the field)");
        }
        push(it->get<std::string>());
        break;
      }
      case DocumentSplit::Whole:
        break;
    }
  }
  return added > 0 || !done_;
}

std::vector<std::string> split_documents(const std::string& text, DocumentSplit how,
                                         const std::string& json_key) {
  std::istringstream in(text);
  DocumentReader reader(in, how, json_key);
  std::vector<std::string> docs;
  while (reader.next(docs, SIZE_MAX)) {
  }
  return docs;
}

namespace {

void check_document_tokens(const Tokenizer& tokenizer, int64_t eod_token, int64_t bos_token,
                           int workers) {
  if (eod_token >= tokenizer.vocab_size()) {
    throw ValueError("end-of-document token " + std::to_string(eod_token) +
                     " is outside the tokenizer's vocabulary [0, " +
                     std::to_string(tokenizer.vocab_size()) + ")");
  }
  if (bos_token >= tokenizer.vocab_size()) {
    throw ValueError("beginning-of-document token " + std::to_string(bos_token) +
                     " is outside the tokenizer's vocabulary [0, " +
                     std::to_string(tokenizer.vocab_size()) + ")");
  }
  if (workers < 0) throw ValueError("workers (" + std::to_string(workers) + ") must be >= 0");
}

// Every text's ids, encoded by `workers` threads (0: one per hardware
// thread) each taking the next text as it finishes one. A text that cannot
// be encoded: *failed_at is the first such (by index), *failure why;
// otherwise *failed_at is texts.size().
std::vector<std::vector<int32_t>> encode_in_parallel(const Tokenizer& tokenizer,
                                                     const std::vector<std::string>& texts,
                                                     int workers, size_t* failed_at,
                                                     std::string* failure) {
  if (workers == 0) workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t n = texts.size();
  std::vector<std::vector<int32_t>> out(n);
  std::atomic<size_t> next{0};
  std::mutex failure_mutex;
  *failed_at = n;
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) {
      try {
        out[i] = tokenizer.encode(texts[i]);
      } catch (const std::exception& e) {
        const std::lock_guard<std::mutex> lock(failure_mutex);
        if (i < *failed_at) {
          *failed_at = i;
          *failure = e.what();
        }
      }
    }
  };
  const size_t threads = std::min<size_t>(static_cast<size_t>(workers), n);
  if (threads <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (size_t t = 0; t < threads; ++t) pool.emplace_back(work);
    for (auto& t : pool) t.join();
  }
  return out;
}

}  // namespace

std::vector<std::vector<int64_t>> tokenize_documents(const Tokenizer& tokenizer,
                                                     const std::vector<std::string>& documents,
                                                     int64_t eod_token, int workers,
                                                     int64_t first_document, int64_t bos_token) {
  check_document_tokens(tokenizer, eod_token, bos_token, workers);
  size_t failed_at = 0;
  std::string failure;
  const auto ids = encode_in_parallel(tokenizer, documents, workers, &failed_at, &failure);
  if (failed_at < documents.size()) {
    throw ValueError("document " +
                     std::to_string(first_document + static_cast<int64_t>(failed_at)) + ": " +
                     failure);
  }
  std::vector<std::vector<int64_t>> out(documents.size());
  for (size_t i = 0; i < documents.size(); ++i) {
    std::vector<int64_t>& doc = out[i];
    doc.reserve(ids[i].size() + 2);
    if (bos_token >= 0) doc.push_back(bos_token);
    doc.insert(doc.end(), ids[i].begin(), ids[i].end());
    if (eod_token >= 0) doc.push_back(eod_token);
  }
  return out;
}

MaskedDocuments tokenize_segmented(const Tokenizer& tokenizer,
                                   const std::vector<SegmentedDocument>& documents,
                                   int64_t eod_token, bool eod_scored, int workers,
                                   int64_t first_document, int64_t bos_token) {
  check_document_tokens(tokenizer, eod_token, bos_token, workers);
  // Every piece of every document encoded at once; a failure is named by
  // the document holding the piece.
  std::vector<std::string> pieces;
  std::vector<int64_t> owner;
  for (size_t d = 0; d < documents.size(); ++d) {
    for (const TextSegment& s : documents[d]) {
      if (s.special) {
        if (tokenizer.special_token(s.text) < 0) {
          throw ValueError("document " + std::to_string(first_document + static_cast<int64_t>(d)) +
                           ": '" + s.text + "' is not a special token of the tokenizer");
        }
        continue;
      }
      pieces.push_back(s.text);
      owner.push_back(first_document + static_cast<int64_t>(d));
    }
  }
  size_t failed_at = 0;
  std::string failure;
  const auto ids = encode_in_parallel(tokenizer, pieces, workers, &failed_at, &failure);
  if (failed_at < pieces.size()) {
    throw ValueError("document " + std::to_string(owner[failed_at]) + ": " + failure);
  }
  MaskedDocuments out;
  out.tokens.resize(documents.size());
  out.keep.resize(documents.size());
  size_t at = 0;
  for (size_t d = 0; d < documents.size(); ++d) {
    std::vector<int64_t>& doc = out.tokens[d];
    std::vector<uint8_t>& keep = out.keep[d];
    if (bos_token >= 0) {
      doc.push_back(bos_token);
      keep.push_back(0);
    }
    for (const TextSegment& s : documents[d]) {
      if (s.special) {
        doc.push_back(tokenizer.special_token(s.text));
      } else {
        const std::vector<int32_t>& piece = ids[at++];
        doc.insert(doc.end(), piece.begin(), piece.end());
      }
      keep.resize(doc.size(), s.scored ? 1 : 0);
    }
    if (eod_token >= 0) {
      doc.push_back(eod_token);
      keep.push_back(eod_scored ? 1 : 0);
    }
  }
  return out;
}

std::string continuation_text(const Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& generated) {
  const std::string before = tokenizer.decode(prompt);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), generated.begin(), generated.end());
  const std::string after = tokenizer.decode(all);
  if (after.compare(0, before.size(), before) == 0) return after.substr(before.size());
  return tokenizer.decode(generated);
}

}  // namespace triad::data
