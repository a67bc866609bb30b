// SentencePiece's model file and its two segmentation algorithms, as
// Google's library runs them (see include/triad/data/sentencepiece.h).
#include "triad/data/sentencepiece.h"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <iterator>
#include <queue>

#include "protobuf_wire.h"
#include "triad/core/error.h"
#include "triad/io/text_file.h"
#include "utf8.h"

namespace triad::data {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, an escaped space
constexpr float kUnknownPenalty = 10.0f;  // an unknown piece scores this below the lowest

// Bytes in the UTF-8 character starting with lead byte c, by that byte
// alone (how SentencePiece steps through normalised text).
size_t one_char_len(char c) {
  static constexpr uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return len[static_cast<uint8_t>(c) >> 4];
}

// Bytes as text, malformed ones each U+FFFD (how byte pieces decode).
void append_bytes(std::string_view bytes, std::string& out) {
  for (size_t i = 0; i < bytes.size();) {
    const size_t len = valid_utf8_len(bytes.data() + i, bytes.size() - i);
    if (len == 0) {
      out += kReplacementCharacter;
      ++i;
    } else {
      out.append(bytes.data() + i, len);
      i += len;
    }
  }
}

std::string byte_piece(int b) {
  static constexpr char hex[] = "0123456789ABCDEF";
  return std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
}

}  // namespace

// A byte trie: every key that is a prefix of a text, shortest first.
struct SentencePieceTokenizer::Trie {
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t value = -1;
  };
  std::vector<Node> nodes = std::vector<Node>(1);

  void insert(std::string_view key, int32_t value) {
    int32_t at = 0;
    for (const char c : key) {
      const auto b = static_cast<uint8_t>(c);
      auto& next = nodes[at].next;
      auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(b, int32_t{-1}));
      if (it == next.end() || it->first != b) {
        it = next.insert(it, {b, static_cast<int32_t>(nodes.size())});
        const int32_t child = it->second;
        nodes.emplace_back();
        at = child;
      } else {
        at = it->second;
      }
    }
    nodes[at].value = value;
  }
  template <class F>
  void prefixes(const char* s, size_t n, F&& f) const {
    int32_t at = 0;
    for (size_t i = 0; i < n; ++i) {
      const auto b = static_cast<uint8_t>(s[i]);
      const auto& next = nodes[at].next;
      const auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(b, int32_t{-1}));
      if (it == next.end() || it->first != b) return;
      at = it->second;
      if (nodes[at].value >= 0) f(i + 1, nodes[at].value);
    }
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(std::vector<Piece> pieces, Settings settings)
    : pieces_(std::move(pieces)), settings_(std::move(settings)) {
  if (pieces_.empty()) throw ValueError("SentencePiece model: no pieces");
  if (pieces_.size() > static_cast<size_t>(INT32_MAX))
    throw ValueError("SentencePiece model: " + std::to_string(pieces_.size()) + " pieces");
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  byte_of_.assign(pieces_.size(), -1);
  auto user = std::make_shared<Trie>();
  auto all = std::make_shared<Trie>();
  bool has_user = false;
  min_score_ = FLT_MAX;
  max_score_ = FLT_MIN;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    const Piece& p = pieces_[i];
    const std::string at =
        "SentencePiece model: piece " + std::to_string(i) + " ('" + p.text + "')";
    if (p.text.empty())
      throw ValueError("SentencePiece model: piece " + std::to_string(i) + " is empty");
    const bool matchable = p.type == PieceType::Normal || p.type == PieceType::UserDefined ||
                           p.type == PieceType::Unused;
    auto& map = matchable ? matchable_ : reserved_;
    if (matchable_.count(p.text) || reserved_.count(p.text))
      throw ValueError(
          at + " repeats piece " +
          std::to_string(matchable_.count(p.text) ? matchable_.at(p.text) : reserved_.at(p.text)));
    map.emplace(p.text, id);
    if (matchable) all->insert(p.text, id);
    switch (p.type) {
      case PieceType::Normal:
        min_score_ = std::min(min_score_, p.score);
        max_score_ = std::max(max_score_, p.score);
        break;
      case PieceType::UserDefined:
        user->insert(p.text, id);
        has_user = true;
        break;
      case PieceType::Unknown:
        if (unk_id_ >= 0)
          throw ValueError(at + " is a second unknown piece (the first is " +
                           std::to_string(unk_id_) + ")");
        unk_id_ = id;
        break;
      case PieceType::Byte: {
        int b = -1;
        for (int v = 0; v < 256 && b < 0; ++v)
          if (p.text == byte_piece(v)) b = v;
        if (b < 0) throw ValueError(at + " is a byte piece not spelled <0xNN>");
        byte_ids_[b] = id;
        byte_of_[i] = static_cast<int16_t>(b);
        break;
      }
      case PieceType::Control:
      case PieceType::Unused:
        break;
      default:
        throw ValueError(at + " has type " + std::to_string(static_cast<int>(p.type)) +
                         "; expected 1 to 6");
    }
  }
  if (unk_id_ < 0) throw ValueError("SentencePiece model: no unknown piece (type 2)");
  if (settings_.byte_fallback) {
    for (int b = 0; b < 256; ++b)
      if (byte_ids_[b] < 0)
        throw ValueError("SentencePiece model: byte_fallback without the piece " + byte_piece(b));
  }
  if (has_user) user_defined_ = std::move(user);
  if (settings_.algorithm == Algorithm::Unigram) unigram_trie_ = std::move(all);

  // The charsmap: a little-endian uint32 byte size of the double array, the
  // array's 32-bit units, then the NUL-terminated replacement strings.
  const std::string& blob = settings_.precompiled_charsmap;
  if (!blob.empty()) {
    const std::string what = "SentencePiece model: normalizer_spec.precompiled_charsmap (" +
                             std::to_string(blob.size()) + " bytes)";
    if (blob.size() <= 4) throw ValueError(what + " is too short to hold its trie's size");
    uint32_t trie_bytes = 0;
    for (int k = 0; k < 4; ++k)
      trie_bytes |= static_cast<uint32_t>(static_cast<uint8_t>(blob[k])) << (8 * k);
    if (trie_bytes >= blob.size() - 4 || trie_bytes % 4 != 0 || trie_bytes == 0)
      throw ValueError(what + " names a trie of " + std::to_string(trie_bytes) +
                       " bytes; expected a positive multiple of 4 below " +
                       std::to_string(blob.size() - 4));
    trie_units_ = blob.data() + 4;
    trie_size_ = trie_bytes / 4;
    replacements_ = trie_units_ + trie_bytes;
    replacements_size_ = blob.size() - 4 - trie_bytes;
  }
}

size_t SentencePieceTokenizer::user_defined_prefix(const char* s, size_t n) const {
  size_t longest = 0;
  if (user_defined_) user_defined_->prefixes(s, n, [&](size_t len, int32_t) { longest = len; });
  return longest;
}

// The normaliser's step: the longest user-defined piece at s, kept as it
// is; else the longest charsmap rule, replaced; else one UTF-8 character
// (a malformed byte becomes U+FFFD). Appends the result to `out` and
// returns the bytes consumed.
size_t SentencePieceTokenizer::normalize_prefix(const char* s, size_t n, std::string& out) const {
  if (const size_t len = user_defined_prefix(s, n)) {
    out.append(s, len);
    return len;
  }
  if (trie_units_ != nullptr) {
    auto fail = [&](const std::string& why) -> void {
      throw ValueError("SentencePiece model: normalizer_spec.precompiled_charsmap is corrupt: " +
                       why);
    };
    auto unit = [&](size_t i) {
      if (i >= trie_size_)
        fail("the trie points to unit " + std::to_string(i) + " of " + std::to_string(trie_size_));
      uint32_t u;
      std::memcpy(&u, trie_units_ + 4 * i, 4);
      return u;
    };
    auto offset = [](uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); };
    size_t best_len = 0;
    uint32_t best_value = 0;
    size_t pos = offset(unit(0));
    for (size_t i = 0; i < n; ++i) {
      const auto c = static_cast<uint8_t>(s[i]);
      pos ^= c;
      if (pos >= trie_size_) break;  // no key continues with this byte
      const uint32_t u = unit(pos);
      if ((u & ((1u << 31) | 0xFF)) != c) break;
      pos ^= offset(u);
      if ((u >> 8) & 1) {  // a key ends here; its value is the next unit's
        best_len = i + 1;
        best_value = unit(pos) & ((1u << 31) - 1);
      }
    }
    if (best_len > 0) {
      if (best_value >= replacements_size_ ||
          std::memchr(replacements_ + best_value, '\0', replacements_size_ - best_value) == nullptr)
        fail("a rule's replacement at byte " + std::to_string(best_value) +
             " is not a NUL-terminated string within its " + std::to_string(replacements_size_) +
             " bytes");
      out += replacements_ + best_value;
      return best_len;
    }
  }
  const size_t len = valid_utf8_len(s, n);
  if (len == 0) {
    out += kReplacementCharacter;
    return 1;
  }
  out.append(s, len);
  return len;
}

std::string SentencePieceTokenizer::normalize(const std::string& text) const {
  const Settings& st = settings_;
  std::string out;
  const char* s = text.data();
  size_t n = text.size();
  std::string piece;
  if (st.remove_extra_whitespaces) {  // leading spaces go
    while (n > 0) {
      piece.clear();
      const size_t used = normalize_prefix(s, n, piece);
      if (piece != " ") break;
      s += used;
      n -= used;
    }
  }
  if (n == 0) return out;
  if (st.add_dummy_prefix) out += st.escape_whitespaces ? kSpace : " ";
  bool after_space = st.remove_extra_whitespaces;
  while (n > 0) {
    piece.clear();
    const size_t used = normalize_prefix(s, n, piece);
    std::string_view p = piece;
    while (after_space && !p.empty() && p.front() == ' ') p.remove_prefix(1);
    if (!p.empty()) {
      for (const char c : p) {
        if (st.escape_whitespaces && c == ' ')
          out += kSpace;
        else
          out += c;
      }
      after_space = p.back() == ' ';
    }
    s += used;
    n -= used;
    if (!st.remove_extra_whitespaces) after_space = false;
  }
  if (st.remove_extra_whitespaces) {  // trailing spaces go
    const std::string_view space = st.escape_whitespaces ? kSpace : " ";
    while (out.size() >= space.size() &&
           std::string_view(out).substr(out.size() - space.size()) == space)
      out.resize(out.size() - space.size());
  }
  return out;
}

int32_t SentencePieceTokenizer::id_of(std::string_view text) const {
  if (const auto r = reserved_.find(text); r != reserved_.end()) return r->second;
  if (const auto m = matchable_.find(text); m != matchable_.end()) return m->second;
  return unk_id_;
}

// BPE: start from characters (a user-defined piece is one symbol that never
// merges), then repeatedly merge the adjacent pair whose concatenation is a
// piece of the highest score, the leftmost on a tie. A merge into an unused
// piece happens but is undone at the end, back into the pieces it joined.
void SentencePieceTokenizer::bpe(const std::string& text, std::vector<Segment>& out) const {
  struct Symbol {
    size_t begin, size;
    int64_t prev, next;
    bool frozen;
  };
  std::vector<Symbol> sym;
  for (size_t i = 0; i < text.size();) {
    size_t len = user_defined_prefix(text.data() + i, text.size() - i);
    const bool frozen = len > 0;
    if (!frozen) len = std::min(one_char_len(text[i]), text.size() - i);
    const auto k = static_cast<int64_t>(sym.size());
    sym.push_back({i, len, k - 1, k + 1, frozen});
    i += len;
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  struct Candidate {
    int64_t left, right;
    float score;
    size_t size;
  };
  auto lower = [](const Candidate& a, const Candidate& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(lower)> agenda(lower);
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> unused;  // halves' sizes
  const std::string_view all = text;
  auto consider = [&](int64_t l, int64_t r) {
    if (l < 0 || r < 0 || sym[l].frozen || sym[r].frozen) return;
    const std::string_view merged = all.substr(sym[l].begin, sym[l].size + sym[r].size);
    const auto it = matchable_.find(merged);
    if (it == matchable_.end()) return;
    const Piece& p = pieces_[it->second];
    agenda.push({l, r, p.score, merged.size()});
    if (p.type == PieceType::Unused) unused[merged] = {sym[l].size, sym[r].size};
  };
  for (size_t i = 1; i < sym.size(); ++i)
    consider(static_cast<int64_t>(i) - 1, static_cast<int64_t>(i));
  while (!agenda.empty()) {
    const Candidate top = agenda.top();
    agenda.pop();
    Symbol& l = sym[top.left];
    Symbol& r = sym[top.right];
    // Stale: one side was merged away, or grew, since this was queued.
    if (l.size == 0 || r.size == 0 || l.size + r.size != top.size) continue;
    l.size += r.size;
    r.size = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = top.left;
    consider(l.prev, top.left);
    consider(top.left, l.next);
  }
  // Emit, undoing merges into unused pieces.
  std::vector<std::pair<size_t, size_t>> stack;
  for (int64_t k = 0; k >= 0; k = sym[k].next) {
    stack.push_back({sym[k].begin, sym[k].size});
    while (!stack.empty()) {
      const auto [begin, size] = stack.back();
      stack.pop_back();
      const std::string_view piece = all.substr(begin, size);
      const int32_t id = id_of(piece);
      if (pieces_[id].type == PieceType::Unused) {
        if (const auto u = unused.find(piece); u != unused.end()) {
          stack.push_back({begin + u->second.first, u->second.second});  // right half after
          stack.push_back({begin, u->second.first});
          continue;
        }
      }
      out.push_back({begin, size, id});
    }
  }
}

// Unigram: the segmentation whose pieces' scores (log probabilities) sum
// highest, by dynamic programming over character boundaries. Ties are
// broken as the library breaks them: a piece's score is added to the best
// sum so far in double and compared, unrounded, with the float stored for
// the end it reaches; the first candidate wins an exact tie. (Summing in
// float instead flips ties such as [l][ll] against [ll][l]; the parity test
// found it.) A character no piece starts with is an unknown piece scoring below
// every other; a user-defined piece scores above any split of it.
void SentencePieceTokenizer::unigram(const std::string& text, std::vector<Segment>& out) const {
  struct Best {
    int32_t id = -1;
    float score = 0;
    int64_t start = -1;
  };
  const size_t n = text.size();
  std::vector<Best> best(n + 1);
  const float unk_score = min_score_ - kUnknownPenalty;
  for (size_t start = 0; start < n;) {
    const float so_far = best[start].score;
    const size_t char_len = std::min(one_char_len(text[start]), n - start);
    bool whole_char = false;
    unigram_trie_->prefixes(text.data() + start, n - start, [&](size_t len, int32_t id) {
      const Piece& p = pieces_[id];
      if (p.type == PieceType::Unused) return;
      const double score = p.type == PieceType::UserDefined
                               ? static_cast<double>(static_cast<float>(len) * max_score_) - 0.1
                               : static_cast<double>(p.score);
      const double sum = score + static_cast<double>(so_far);
      Best& b = best[start + len];
      if (b.start < 0 || sum > static_cast<double>(b.score))
        b = {id, static_cast<float>(sum), static_cast<int64_t>(start)};
      if (len == char_len) whole_char = true;
    });
    if (!whole_char) {
      Best& b = best[start + char_len];
      if (b.start < 0 || unk_score + so_far > b.score)
        b = {unk_id_, unk_score + so_far, static_cast<int64_t>(start)};
    }
    start += char_len;
  }
  const size_t first = out.size();
  for (size_t end = n; end > 0;) {
    const Best& b = best[end];
    const auto start = static_cast<size_t>(b.start);
    out.push_back({start, end - start, b.id});
    end = start;
  }
  std::reverse(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
}

std::vector<int32_t> SentencePieceTokenizer::encode(const std::string& text) const {
  const std::string normalized = normalize(text);
  std::vector<Segment> segments;
  if (settings_.algorithm == Algorithm::Bpe)
    bpe(normalized, segments);
  else
    unigram(normalized, segments);
  std::vector<int32_t> ids;
  ids.reserve(segments.size());
  for (size_t i = 0; i < segments.size();) {
    if (segments[i].id != unk_id_) {
      ids.push_back(segments[i++].id);
      continue;
    }
    // A run of unknown pieces is one; byte fallback spells it out.
    const size_t begin = segments[i].begin;
    size_t end = begin + segments[i].size;
    for (++i; i < segments.size() && segments[i].id == unk_id_; ++i)
      end = segments[i].begin + segments[i].size;
    if (settings_.byte_fallback) {
      for (size_t k = begin; k < end; ++k)
        ids.push_back(byte_ids_[static_cast<uint8_t>(normalized[k])]);
    } else {
      ids.push_back(unk_id_);
    }
  }
  return ids;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  std::string bytes;  // a run of byte pieces, decoded together
  const bool strip_first_space = settings_.add_dummy_prefix || settings_.remove_extra_whitespaces;
  bool seen = false;  // a piece other than a control one
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw ValueError("SentencePiece decode: id " + std::to_string(id) +
                       " is outside the vocabulary of " + std::to_string(vocab_size()));
    const Piece& p = pieces_[static_cast<size_t>(id)];
    if (p.type == PieceType::Byte) {
      bytes.push_back(static_cast<char>(byte_of_[static_cast<size_t>(id)]));
      seen = true;
      continue;
    }
    append_bytes(bytes, out);
    bytes.clear();
    if (p.type == PieceType::Control) continue;
    const bool first = settings_.remove_extra_whitespaces ? out.empty() : !seen;
    seen = true;
    if (p.type == PieceType::Unknown) {
      out += settings_.unk_surface;
      continue;
    }
    // The dummy prefix's space comes off the first piece: with extra spaces
    // removed, any piece while nothing is written yet (a lone U+2581 piece
    // writes nothing); otherwise the first piece that is not a control one.
    std::string_view text = p.text;
    if (first && strip_first_space && text.substr(0, kSpace.size()) == kSpace)
      text.remove_prefix(kSpace.size());
    for (size_t i = 0; i < text.size();) {
      if (text.substr(i, kSpace.size()) == kSpace) {
        out += ' ';
        i += kSpace.size();
      } else {
        out += text[i++];
      }
    }
  }
  append_bytes(bytes, out);
  return out;
}

int32_t SentencePieceTokenizer::special_token(const std::string& text) const {
  int32_t id = -1;
  if (const auto r = reserved_.find(text); r != reserved_.end()) id = r->second;
  if (const auto m = matchable_.find(text); m != matchable_.end()) id = m->second;
  if (id < 0) return -1;
  const PieceType t = pieces_[static_cast<size_t>(id)].type;
  return t == PieceType::Control || t == PieceType::UserDefined || t == PieceType::Unknown ? id
                                                                                           : -1;
}

std::vector<std::string> SentencePieceTokenizer::special_tokens() const {
  std::vector<std::string> out;
  for (const Piece& p : pieces_) {
    if (p.type == PieceType::Control || p.type == PieceType::UserDefined ||
        p.type == PieceType::Unknown)
      out.push_back(p.text);
  }
  return out;
}

std::unique_ptr<SentencePieceTokenizer> load_sentencepiece(const std::string& path) {
  const std::optional<std::string> bytes = io::read_file(path);
  if (!bytes) throw IoError("cannot open SentencePiece model '" + path + "'");
  const std::string& data = *bytes;
  if (data.empty()) throw IoError(path + ": an empty file is not a SentencePiece model");
  using protobuf::Field;
  using protobuf::Reader;
  using protobuf::Wire;
  std::vector<SentencePieceTokenizer::Piece> pieces;
  SentencePieceTokenizer::Settings st;
  int model_type = 1;  // unigram, the format's default
  Reader model(data, path);
  Field f;
  auto expect = [&](const Reader& r, const Field& fd, Wire w, const char* name) {
    if (fd.wire != w)
      r.fail_at_field(std::string(name) + " has wire type " +
                      std::to_string(static_cast<int>(fd.wire)) + "; expected " +
                      std::to_string(static_cast<int>(w)));
  };
  auto nested = [&](const Field& fd) { return Reader(fd.bytes, path, model.offset_of(fd.bytes)); };
  while (model.next(f)) {
    if (f.number == 1) {  // pieces
      expect(model, f, Wire::Bytes, "pieces");
      SentencePieceTokenizer::Piece p;
      Reader r = nested(f);
      Field g;
      while (r.next(g)) {
        if (g.number == 1) {
          expect(r, g, Wire::Bytes, "pieces.piece");
          p.text = std::string(g.bytes);
        } else if (g.number == 2) {
          expect(r, g, Wire::Fixed32, "pieces.score");
          p.score = g.as_float();
        } else if (g.number == 3) {
          expect(r, g, Wire::Varint, "pieces.type");
          if (g.varint < 1 || g.varint > 6)
            throw IoError(path + ": piece " + std::to_string(pieces.size()) + " ('" + p.text +
                          "') has type " + std::to_string(g.varint) + "; expected 1 to 6");
          p.type = static_cast<SentencePieceTokenizer::PieceType>(g.varint);
        }
      }
      pieces.push_back(std::move(p));
    } else if (f.number == 2) {  // trainer_spec
      expect(model, f, Wire::Bytes, "trainer_spec");
      Reader r = nested(f);
      Field g;
      while (r.next(g)) {
        if (g.number == 3 && g.wire == Wire::Varint) model_type = static_cast<int>(g.varint);
        if (g.number == 24 && g.wire == Wire::Varint && g.varint != 0)
          throw NotSupportedError(path +
                                  ": trainer_spec.treat_whitespace_as_suffix (true): "
                                  "Triad reads models whose spaces begin pieces");
        if (g.number == 35 && g.wire == Wire::Varint) st.byte_fallback = g.varint != 0;
        if (g.number == 44 && g.wire == Wire::Bytes) st.unk_surface = std::string(g.bytes);
      }
    } else if (f.number == 3 || f.number == 5) {  // normalizer_spec, denormalizer_spec
      expect(model, f, Wire::Bytes, f.number == 3 ? "normalizer_spec" : "denormalizer_spec");
      Reader r = nested(f);
      Field g;
      while (r.next(g)) {
        if (f.number == 5) {
          if (g.number == 2 && g.wire == Wire::Bytes && !g.bytes.empty())
            throw NotSupportedError(path + ": denormalizer_spec.precompiled_charsmap (" +
                                    std::to_string(g.bytes.size()) +
                                    " bytes): decoding through a denormaliser is not supported");
          continue;
        }
        if (g.number == 1 && g.wire == Wire::Bytes) st.normalizer_name = std::string(g.bytes);
        if (g.number == 2 && g.wire == Wire::Bytes) st.precompiled_charsmap = std::string(g.bytes);
        if (g.number == 3 && g.wire == Wire::Varint) st.add_dummy_prefix = g.varint != 0;
        if (g.number == 4 && g.wire == Wire::Varint) st.remove_extra_whitespaces = g.varint != 0;
        if (g.number == 5 && g.wire == Wire::Varint) st.escape_whitespaces = g.varint != 0;
      }
    }
  }
  if (model_type == 1) {
    st.algorithm = SentencePieceTokenizer::Algorithm::Unigram;
  } else if (model_type == 2) {
    st.algorithm = SentencePieceTokenizer::Algorithm::Bpe;
  } else {
    const char* name = model_type == 3 ? "word" : model_type == 4 ? "char" : "unknown";
    throw NotSupportedError(path + ": trainer_spec.model_type " + std::to_string(model_type) +
                            " (" + name + "): Triad reads unigram (1) and BPE (2) models");
  }
  if (pieces.empty()) throw IoError(path + ": no pieces; is this a SentencePiece model?");
  try {
    return std::make_unique<SentencePieceTokenizer>(std::move(pieces), std::move(st));
  } catch (const ValueError& e) {
    throw IoError(path + ": " + e.what());
  }
}

}  // namespace triad::data
