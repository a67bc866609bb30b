#include "triad/data/tokenizer.h"

#include <climits>
#include <fstream>
#include <nlohmann/json.hpp>

#include "triad/core/error.h"
#include "unicode_classes.h"

namespace triad::data {
namespace {

// Decodes one UTF-8 code point at s[i]; malformed bytes decode as themselves.
uint32_t next_code_point(const std::string& s, size_t i, size_t& len) {
  const auto c = static_cast<unsigned char>(s[i]);
  auto cont = [&](size_t k) {
    return i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
  };
  if (c < 0x80) {
    len = 1;
    return c;
  }
  if ((c & 0xE0) == 0xC0 && cont(1)) {
    len = 2;
    return ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
  }
  if ((c & 0xF0) == 0xE0 && cont(1) && cont(2)) {
    len = 3;
    return ((c & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
           (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
  }
  if ((c & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
    len = 4;
    return ((c & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
           ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) |
           (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
  }
  len = 1;
  return c;
}

std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

bool is_space(uint32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}
// GPT-2's pattern's classes: \s (the White_Space code points above),
// \p{L}, \p{N}, and everything else (punctuation, symbols, marks, controls).
enum class Cls { Letter, Number, Other, Space };
Cls classify(uint32_t c) {
  if (c < 0x80) {  // ASCII without a table lookup
    if (is_space(c)) return Cls::Space;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return Cls::Letter;
    if (c >= '0' && c <= '9') return Cls::Number;
    return Cls::Other;
  }
  if (is_space(c)) return Cls::Space;
  if (unicode::is_letter(c)) return Cls::Letter;
  if (unicode::is_number(c)) return Cls::Number;
  return Cls::Other;
}

}  // namespace

std::vector<std::string> gpt2_pretokenize(const std::string& text) {
  // Code points with their byte positions.
  std::vector<uint32_t> cps;
  std::vector<size_t> pos;
  for (size_t i = 0; i < text.size();) {
    size_t len;
    cps.push_back(next_code_point(text, i, len));
    pos.push_back(i);
    i += len;
  }
  pos.push_back(text.size());
  const size_t n = cps.size();
  std::vector<std::string> out;
  auto emit = [&](size_t a, size_t b) { out.push_back(text.substr(pos[a], pos[b] - pos[a])); };
  size_t i = 0;
  while (i < n) {
    // Contractions: 's 't 're 've 'm 'll 'd
    if (cps[i] == '\'' && i + 1 < n) {
      const uint32_t a = cps[i + 1];
      const uint32_t b = i + 2 < n ? cps[i + 2] : 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        emit(i, i + 2);
        i += 2;
        continue;
      }
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        emit(i, i + 3);
        i += 3;
        continue;
      }
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
    // Whitespace run: leave its last character for the next piece when a
    // non-space follows (\s+(?!\S)), else take it all (\s+).
    size_t k = i;
    while (k < n && is_space(cps[k])) ++k;
    if (k < n && k - i > 1) k -= 1;
    emit(i, k);
    i = k;
  }
  return out;
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

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::string& vocab_json_path,
                                   const std::string& merges_path) {
  // GPT-2's reversible byte -> printable code point map.
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
    byte_to_unicode_[b] = utf8(cp);
    unicode_to_byte_[byte_to_unicode_[b]] = static_cast<uint8_t>(b);
  }
  std::ifstream vin(vocab_json_path);
  if (!vin) throw IoError("tokenizer: cannot open vocab '" + vocab_json_path + "'");
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(vin);
  } catch (const nlohmann::json::exception& e) {
    throw IoError("tokenizer: vocab '" + vocab_json_path + "' is not valid JSON: " + e.what());
  }
  if (!vocab.is_object())
    throw IoError("tokenizer: vocab '" + vocab_json_path + "' must map tokens to ids");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) {
      throw IoError("tokenizer: vocab entry '" + it.key() + "' has a non-integer id");
    }
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > INT32_MAX)
      throw IoError("tokenizer: vocab id " + std::to_string(id) + " is out of range");
    encoder_[it.key()] = static_cast<int32_t>(id);
    decoder_[static_cast<int32_t>(id)] = it.key();
  }
  std::ifstream min(merges_path);
  if (!min) throw IoError("tokenizer: cannot open merges '" + merges_path + "'");
  std::string line;
  int rank = 0, line_no = 0;
  while (std::getline(min, line)) {
    ++line_no;
    if (line.rfind("#version", 0) == 0 || line.empty()) continue;
    const auto sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size()) {
      throw IoError("tokenizer: merges '" + merges_path + "' line " + std::to_string(line_no) +
                    " is not 'left right'");
    }
    ranks_[{line.substr(0, sp), line.substr(sp + 1)}] = rank++;
  }
}

std::vector<std::string> Gpt2BpeTokenizer::bpe(const std::string& word) const {
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

std::vector<int32_t> Gpt2BpeTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  for (const std::string& piece : gpt2_pretokenize(text)) {
    std::string mapped;
    for (unsigned char b : piece) mapped += byte_to_unicode_[b];
    for (const std::string& sym : bpe(mapped)) {
      auto it = encoder_.find(sym);
      if (it == encoder_.end()) {
        throw ValueError("tokenizer: symbol '" + sym + "' is not in the vocabulary");
      }
      ids.push_back(it->second);
    }
  }
  return ids;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
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

DocumentSplit document_split_from_string(const std::string& name) {
  if (name == "whole") return DocumentSplit::Whole;
  if (name == "lines") return DocumentSplit::Lines;
  if (name == "paragraphs") return DocumentSplit::Paragraphs;
  if (name == "jsonl") return DocumentSplit::JsonLines;
  throw ValueError("documents '" + name + "' must be whole, lines, paragraphs or jsonl");
}

namespace {
// The string under `key` of each non-blank line's JSON object.
std::vector<std::string> json_line_documents(const std::string& text, const std::string& key) {
  std::vector<std::string> docs;
  size_t at = 0;
  for (int64_t number = 1; at < text.size(); ++number) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = "JSON line " + std::to_string(number);
    if (j.is_discarded()) throw ValueError(where + " does not parse");
    if (!j.is_object()) throw ValueError(where + " is not an object");
    const auto it = j.find(key);
    if (it == j.end() || !it->is_string()) {
      throw ValueError(where + " has no string \"" + key + "\" (--json-key names the field)");
    }
    docs.push_back(it->get<std::string>());
  }
  return docs;
}
}  // namespace

std::vector<std::string> split_documents(const std::string& text, DocumentSplit how,
                                         const std::string& json_key) {
  if (how == DocumentSplit::Whole) return {text};
  if (how == DocumentSplit::JsonLines) return json_line_documents(text, json_key);
  std::vector<std::string> docs;
  std::string paragraph;
  auto blank = [](const std::string& line) {
    return line.find_first_not_of(" \t\r") == std::string::npos;
  };
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    at = end + 1;
    if (how == DocumentSplit::Lines) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) docs.push_back(std::move(line));
    } else if (blank(line)) {
      if (!paragraph.empty()) docs.push_back(std::move(paragraph));
      paragraph.clear();
    } else {
      if (!paragraph.empty()) paragraph += '\n';
      paragraph += line;
    }
  }
  if (!paragraph.empty()) docs.push_back(std::move(paragraph));
  return docs;
}

std::vector<std::vector<int64_t>> tokenize_documents(const Tokenizer& tokenizer,
                                                     const std::vector<std::string>& documents,
                                                     int64_t eod_token) {
  if (eod_token >= tokenizer.vocab_size()) {
    throw ValueError("end-of-document token " + std::to_string(eod_token) +
                     " is outside the tokenizer's vocabulary [0, " +
                     std::to_string(tokenizer.vocab_size()) + ")");
  }
  std::vector<std::vector<int64_t>> out;
  out.reserve(documents.size());
  for (const std::string& d : documents) {
    const std::vector<int32_t> ids = tokenizer.encode(d);
    std::vector<int64_t> doc(ids.begin(), ids.end());
    if (eod_token >= 0) doc.push_back(eod_token);
    out.push_back(std::move(doc));
  }
  return out;
}

}  // namespace triad::data
