#pragma once

// Added tokens (a tokenizer.json's special tokens, such as <|endoftext|>)
// for both BPE kinds (tokenizer.cpp, metaspace_bpe.cpp): found in text
// before anything else, and looked up by their text.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace triad::data {

// Walks `text`: the leftmost occurrence of any added token (the longest of
// those starting there) goes to `ids` as its id, and `plain(begin, end)` is
// called for each non-empty stretch before, between and after them. Each
// token's next occurrence is remembered and searched for again only once
// the walk passes it, so a text with many matches (GPT-NeoX's runs of
// spaces) is scanned once per token, not once per token per match.
template <class Plain>
void split_on_added_tokens(const std::string& text, const std::map<std::string, int32_t>& added,
                           std::vector<int32_t>& ids, Plain&& plain) {
  using Entry = std::pair<const std::string, int32_t>;
  std::vector<std::pair<const Entry*, size_t>> next;  // (token, its next occurrence)
  for (const Entry& entry : added) {
    if (!entry.first.empty()) next.emplace_back(&entry, text.find(entry.first));
  }
  size_t at = 0;
  while (at < text.size() && !next.empty()) {
    size_t best = std::string::npos;
    const Entry* found = nullptr;
    for (auto& [entry, k] : next) {
      if (k != std::string::npos && k < at) k = text.find(entry->first, at);
      if (k == std::string::npos) continue;
      if (k < best || (k == best && entry->first.size() > found->first.size())) {
        best = k;
        found = entry;
      }
    }
    if (found == nullptr) break;
    if (best > at) plain(at, best);
    ids.push_back(found->second);
    at = best + found->first.size();
  }
  if (at < text.size()) plain(at, text.size());
}

// The id of the added token `text`, or -1.
inline int32_t added_token_id(const std::map<std::string, int32_t>& added,
                              const std::string& text) {
  const auto it = added.find(text);
  return it == added.end() ? -1 : it->second;
}

// The added tokens' texts.
inline std::vector<std::string> added_token_texts(const std::map<std::string, int32_t>& added) {
  std::vector<std::string> out;
  for (const auto& [text, id] : added) out.push_back(text);
  return out;
}

}  // namespace triad::data
