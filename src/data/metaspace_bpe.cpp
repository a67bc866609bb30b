// Hugging Face's BPE of the SentencePiece kind (MetaspaceBpeTokenizer,
// include/triad/data/tokenizer.h): normalisers and the Metaspace
// pre-tokeniser write spaces as ▁, each word's characters (or their
// <0xXX> bytes) are merged by rank, and the decoder's steps undo it.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <queue>

#include "added_tokens.h"
#include "triad/core/error.h"
#include "triad/data/tokenizer.h"
#include "utf8.h"

namespace triad::data {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

void replace_every(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t at = 0;
  for (size_t k = s.find(from); k != std::string::npos; k = s.find(from, at)) {
    out.append(s, at, k - at);
    out += to;
    at = k + from.size();
  }
  if (at == 0) return;
  out.append(s, at, std::string::npos);
  s.swap(out);
}

// The byte a <0xXX> token stands for (two hex digits, either case, as the
// ByteFallback decoder reads them), or -1.
int byte_of_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Words already encoded, per thread, for the tokenizer that last used the
// cache (`owner`); only short words (a whole unsplit text is one word).
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>> ids;
};
thread_local WordCache word_cache;
constexpr size_t kWordCacheEntries = size_t{1} << 16;
constexpr size_t kCachedWordBytes = 64;
std::atomic<uint64_t> next_metaspace_id{1};

}  // namespace

MetaspaceBpeTokenizer::MetaspaceBpeTokenizer(
    std::map<std::string, int32_t> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, Settings settings)
    : settings_(std::move(settings)), vocab_(vocab.begin(), vocab.end()), id_(next_metaspace_id++) {
  if (settings_.metaspace && settings_.replacement.empty())
    throw ValueError("tokenizer: the Metaspace replacement is empty");
  for (const auto& [token, id] : vocab_) {
    if (id < 0) throw ValueError("tokenizer: '" + token + "' has a negative id");
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
  }
  for (const auto& [content, id] : settings_.added_tokens) {
    if (id < 0) throw ValueError("tokenizer: added token '" + content + "' has a negative id");
    if (content.empty()) throw ValueError("tokenizer: an added token is empty");
    added_by_id_[id] = content;
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
  }
  // Ids index a table: a vocabulary with a few holes is fine (missing_ids),
  // one whose largest id dwarfs its size is a broken file.
  const auto entries = static_cast<int64_t>(vocab_.size() + settings_.added_tokens.size());
  if (vocab_size_ > 2 * entries + 65536) {
    throw ValueError("tokenizer: the largest id is " + std::to_string(vocab_size_ - 1) + " for " +
                     std::to_string(entries) +
                     " tokens (expected ids numbered from 0 with few gaps)");
  }
  pieces_.assign(static_cast<size_t>(vocab_size_), "");
  has_piece_.assign(static_cast<size_t>(vocab_size_), 0);
  for (const auto& [token, id] : vocab_) {
    const auto i = static_cast<size_t>(id);
    if (has_piece_[i]) {
      throw ValueError("tokenizer: '" + token + "' and '" + pieces_[i] + "' share the id " +
                       std::to_string(id));
    }
    pieces_[i] = token;
    has_piece_[i] = 1;
  }
  for (const auto& [content, id] : settings_.added_tokens) {
    const auto i = static_cast<size_t>(id);
    if (has_piece_[i] && pieces_[i] != content) {
      throw ValueError("tokenizer: added token '" + content + "' takes id " + std::to_string(id) +
                       ", the vocabulary's '" + pieces_[i] + "'");
    }
  }
  if (settings_.unk_id >= vocab_size_)
    throw ValueError("tokenizer: the unknown token's id " + std::to_string(settings_.unk_id) +
                     " is outside the vocabulary");
  for (int b = 0; b < 256; ++b) {
    static constexpr char hex[] = "0123456789ABCDEF";
    const auto it = vocab_.find(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  const auto id_of = [&](const std::string& token, size_t rank) {
    const auto it = vocab_.find(token);
    if (it == vocab_.end()) {
      throw ValueError("tokenizer: merge " + std::to_string(rank) + " ('" + merges[rank].first +
                       "' '" + merges[rank].second + "') needs '" + token +
                       "', which is not in the vocabulary");
    }
    return it->second;
  };
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [left, right] = merges[r];
    const Merge m{static_cast<int32_t>(std::min<size_t>(r, INT32_MAX)), id_of(left + right, r)};
    merges_.emplace(pair_key(id_of(left, r), id_of(right, r)), m);  // the first of a repeat wins
  }
}

int32_t MetaspaceBpeTokenizer::special_token(const std::string& text) const {
  return added_token_id(settings_.added_tokens, text);
}

std::vector<std::string> MetaspaceBpeTokenizer::special_tokens() const {
  return added_token_texts(settings_.added_tokens);
}

std::vector<int32_t> MetaspaceBpeTokenizer::missing_ids() const {
  std::vector<int32_t> missing;
  for (int64_t id = 0; id < vocab_size_; ++id) {
    const auto i = static_cast<int32_t>(id);
    if (!has_piece_[static_cast<size_t>(id)] && !added_by_id_.contains(i)) missing.push_back(i);
  }
  return missing;
}

std::vector<std::string> MetaspaceBpeTokenizer::words(const std::string& piece, bool first) const {
  std::string s = piece;
  for (const NormalizeStep& step : settings_.normalizer) {
    switch (step.kind) {
      case NormalizeStep::Kind::Prepend:
        if (!s.empty()) s = step.to + s;
        break;
      case NormalizeStep::Kind::Replace:
        replace_every(s, step.from, step.to);
        break;
      case NormalizeStep::Kind::Nfc:
        s = nfc(s);
        break;
    }
  }
  if (settings_.split_behavior != Settings::SplitBehavior::None) return split_words(s);
  if (!settings_.metaspace) return {s};
  const std::string& rep = settings_.replacement;
  replace_every(s, " ", rep);
  const bool starts = s.compare(0, rep.size(), rep) == 0;
  const bool prepend =
      !s.empty() && !starts &&
      (settings_.prepend == Prepend::Always || (settings_.prepend == Prepend::First && first));
  if (prepend) s = rep + s;
  if (!settings_.split || s.empty()) return {s};
  // Each replacement begins a word (MergedWithNext).
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t k = s.find(rep); k != std::string::npos; k = s.find(rep, k + rep.size())) {
    if (k > begin) out.push_back(s.substr(begin, k - begin));
    begin = k;
  }
  out.push_back(s.substr(begin));
  return out;
}

std::vector<std::string> MetaspaceBpeTokenizer::split_words(const std::string& s) const {
  using B = Settings::SplitBehavior;
  const std::string& pat = settings_.split_pattern;
  std::vector<std::string> out;
  std::string pending;  // MergedWithNext: the delimiters that open the next piece
  size_t at = 0;
  auto piece = [&](std::string p) {
    if (!p.empty()) out.push_back(std::move(p));
  };
  while (at <= s.size()) {
    const size_t k = s.find(pat, at);
    const size_t end = k == std::string::npos ? s.size() : k;
    std::string text = pending + s.substr(at, end - at);
    pending.clear();
    if (k == std::string::npos) {
      piece(std::move(text));
      break;
    }
    // The run of matches starting at k (one, unless contiguous).
    size_t run_end = k + pat.size();
    if (settings_.split_behavior == B::Contiguous) {
      while (s.compare(run_end, pat.size(), pat) == 0) run_end += pat.size();
    }
    const std::string delim = s.substr(k, run_end - k);
    switch (settings_.split_behavior) {
      case B::Removed:
        piece(std::move(text));
        break;
      case B::Isolated:
      case B::Contiguous:
        piece(std::move(text));
        piece(delim);
        break;
      case B::MergedWithPrevious:
        piece(text + delim);
        break;
      case B::MergedWithNext:
        piece(std::move(text));
        pending = delim;
        break;
      case B::None:
        break;
    }
    at = run_end;
    if (at == s.size()) {
      piece(std::move(pending));
      break;
    }
  }
  return out;
}

void MetaspaceBpeTokenizer::encode_word(const std::string& word, std::vector<int32_t>& ids) const {
  if (settings_.ignore_merges) {
    const auto whole = vocab_.find(word);
    if (whole != vocab_.end()) {
      ids.push_back(whole->second);
      return;
    }
  }
  // The word's symbols: each character's token, else its bytes' tokens,
  // else the unknown token (a run of unknown characters one token with
  // fuse_unk; a pending one is written when a known character follows, as
  // Hugging Face's BPE writes it).
  std::vector<int32_t> symbols;
  int32_t unk_pending = -1;
  for (size_t i = 0; i < word.size();) {
    size_t len;
    next_code_point(word, i, len);
    const std::string ch = word.substr(i, len);
    i += len;
    if (const auto it = vocab_.find(ch); it != vocab_.end()) {
      if (unk_pending >= 0) symbols.push_back(unk_pending);
      unk_pending = -1;
      symbols.push_back(it->second);
      continue;
    }
    if (settings_.byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char b) {
          return byte_ids_[static_cast<uint8_t>(b)] >= 0;
        })) {
      for (const char b : ch) symbols.push_back(byte_ids_[static_cast<uint8_t>(b)]);
      continue;
    }
    if (settings_.unk_id < 0) {
      size_t ignored;
      char code[16];
      std::snprintf(code, sizeof code, "U+%04X", next_code_point(ch, 0, ignored));
      throw ValueError("tokenizer: the character '" + ch + "' (" + code + ")" +
                       " is not in the vocabulary, and the tokenizer has no unknown token" +
                       (settings_.byte_fallback ? " (nor all of its bytes' <0xXX> tokens)" : ""));
    }
    if (unk_pending >= 0 && !settings_.fuse_unk) symbols.push_back(unk_pending);
    unk_pending = settings_.unk_id;
  }
  if (unk_pending >= 0) symbols.push_back(unk_pending);

  // Merge the lowest-ranked adjacent pair, the leftmost of equals, until no
  // pair merges: a heap of candidate merges over a linked list of symbols;
  // an entry whose pair has changed since is skipped.
  const size_t n = symbols.size();
  std::vector<int> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t k = 0; k < n; ++k) {
    prev[k] = static_cast<int>(k) - 1;
    next[k] = k + 1 < n ? static_cast<int>(k + 1) : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto consider = [&](int left) {
    const int right = next[static_cast<size_t>(left)];
    if (right < 0) return;
    const auto it = merges_.find(
        pair_key(symbols[static_cast<size_t>(left)], symbols[static_cast<size_t>(right)]));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.id});
  };
  for (size_t k = 0; k + 1 < n; ++k) consider(static_cast<int>(k));
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const auto pos = static_cast<size_t>(top.pos);
    if (!alive[pos] || next[pos] < 0) continue;
    const auto right = static_cast<size_t>(next[pos]);
    const auto it = merges_.find(pair_key(symbols[pos], symbols[right]));
    if (it == merges_.end() || it->second.id != top.id) continue;  // stale
    symbols[pos] = top.id;
    alive[right] = 0;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[static_cast<size_t>(next[pos])] = top.pos;
    if (prev[pos] >= 0) consider(prev[pos]);
    consider(top.pos);
  }
  for (size_t k = 0; k < n; ++k) {
    if (alive[k]) ids.push_back(symbols[k]);
  }
}

std::vector<int32_t> MetaspaceBpeTokenizer::encode(const std::string& text) const {
  WordCache& cache = word_cache;
  if (cache.owner != id_) {
    cache.ids.clear();
    cache.owner = id_;
  }
  std::vector<int32_t> ids;
  split_on_added_tokens(text, settings_.added_tokens, ids, [&](size_t begin, size_t end) {
    for (const std::string& word : words(text.substr(begin, end - begin), begin == 0)) {
      if (word.size() > kCachedWordBytes) {
        encode_word(word, ids);
        continue;
      }
      const auto hit = cache.ids.find(word);
      if (hit != cache.ids.end()) {
        ids.insert(ids.end(), hit->second.begin(), hit->second.end());
        continue;
      }
      std::vector<int32_t> word_ids;
      encode_word(word, word_ids);
      ids.insert(ids.end(), word_ids.begin(), word_ids.end());
      if (cache.ids.size() >= kWordCacheEntries) cache.ids.clear();
      cache.ids.emplace(word, std::move(word_ids));
    }
  });
  return ids;
}

std::string MetaspaceBpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    const auto added = added_by_id_.find(id);
    if (added != added_by_id_.end()) {
      tokens.push_back(added->second);
    } else if (id >= 0 && id < vocab_size_ && has_piece_[static_cast<size_t>(id)]) {
      tokens.push_back(pieces_[static_cast<size_t>(id)]);
    } else {
      throw ValueError("tokenizer: id " + std::to_string(id) + " is not in the vocabulary");
    }
  }
  if (settings_.decoder.empty()) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const DecodeStep& step : settings_.decoder) {
    switch (step.kind) {
      case DecodeStep::Kind::Replace:
        for (std::string& t : tokens) replace_every(t, step.from, step.to);
        break;
      case DecodeStep::Kind::ByteFallback: {
        // Runs of byte tokens become their text when it is UTF-8, else one
        // U+FFFD per byte.
        std::vector<std::string> out;
        std::string run;
        size_t run_tokens = 0;
        const auto flush = [&] {
          if (run_tokens == 0) return;
          bool valid = true;
          for (size_t i = 0; i < run.size() && valid;) {
            const size_t len = valid_utf8_len(run.data() + i, run.size() - i);
            valid = len > 0;
            i += len;
          }
          if (valid) {
            out.push_back(run);
          } else {
            for (size_t i = 0; i < run_tokens; ++i) out.emplace_back(kReplacementCharacter);
          }
          run.clear();
          run_tokens = 0;
        };
        for (std::string& t : tokens) {
          const int b = byte_of_token(t);
          if (b >= 0) {
            run.push_back(static_cast<char>(b));
            ++run_tokens;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens.swap(out);
        break;
      }
      case DecodeStep::Kind::Fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, all);
        break;
      }
      case DecodeStep::Kind::Strip:
        for (std::string& t : tokens) {
          int cut = 0;
          while (cut < step.start && t.compare(static_cast<size_t>(cut) * step.from.size(),
                                               step.from.size(), step.from) == 0)
            ++cut;
          t.erase(0, static_cast<size_t>(cut) * step.from.size());
          cut = 0;
          while (cut < step.stop && t.size() >= step.from.size() &&
                 t.compare(t.size() - step.from.size(), step.from.size(), step.from) == 0) {
            t.erase(t.size() - step.from.size());
            ++cut;
          }
        }
        break;
      case DecodeStep::Kind::Metaspace:
        // The replacement is a space, except in the first token, where it
        // is dropped unless nothing was prepended (prepend_scheme never).
        for (size_t i = 0; i < tokens.size(); ++i) {
          replace_every(tokens[i], step.from, i == 0 && step.prepend != Prepend::Never ? "" : " ");
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace triad::data
