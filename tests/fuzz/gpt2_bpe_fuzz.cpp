// GPT-2's tokenizer files as its release has them: vocab.json and
// merges.txt (the input's two parts, kPartSeparator between), then a text
// through the tokenizer both ways. Where every token has an id of its own,
// decoding gives back exactly the text encoded (byte-level BPE loses
// nothing, malformed UTF-8 included).
#include <set>

#include <nlohmann/json.hpp>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/tokenizer.h"

namespace {

// Whether vocab.json maps its tokens to distinct ids (else decoding an id
// shared by two tokens gives one of them, whichever was encoded).
bool ids_distinct(const std::string& vocab) {
  const auto j = nlohmann::json::parse(vocab, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  std::set<int64_t> seen;
  for (const auto& [token, id] : j.items()) {
    if (!id.is_number_integer() || !seen.insert(id.get<int64_t>()).second) return false;
  }
  return true;
}

}  // namespace

TRIAD_FUZZ_TARGET(gpt2_bpe) {
  const auto parts = triad::fuzz::split_input(data, size, 2);
  const std::string vocab = triad::fuzz::write_input("vocab.json", parts[0]);
  const std::string merges = triad::fuzz::write_input("merges.txt", parts[1]);
  const auto tokenizer = triad::data::make_tokenizer(vocab, merges, "");
  const bool distinct = ids_distinct(parts[0]);
  for (const std::string text : {"Hello, world! It's 2024.", "caf\xc3\xa9 \xff\xfe 12\n\t  x",
                                 "\xe2\x96\x81\xf0\x9f\x99\x82 <|endoftext|>"}) {
    const auto ids = tokenizer->encode(text);
    const std::string back = tokenizer->decode(ids);
    if (distinct) triad::fuzz::require(back == text, "decode(encode(text)) is the text");
  }
}
