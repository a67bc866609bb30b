// A Hugging Face tokenizer.json, then a text through it both ways. Every id
// is below the vocabulary's size, and the byte-level kind loses nothing but
// what its normaliser changes: decoding gives back the text, or its NFC form
// under an NFC normaliser (the SentencePiece kind's decoder steps may drop
// what its normalisers add, so it is held to less).
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/tokenizer.h"

TRIAD_FUZZ_TARGET(hf_tokenizer) {
  const std::string path = triad::fuzz::write_input("tokenizer.json", data, size);
  const auto tokenizer = triad::data::load_hf_tokenizer(path);
  const std::string text = "Hello, world! <|endoftext|> cafe\xcc\x81 \xe2\x96\x81 \xff 12\n\t x";
  const auto ids = tokenizer->encode(text);
  for (const int32_t id : ids) {
    triad::fuzz::require(id >= 0 && id < tokenizer->vocab_size(), "ids are in the vocabulary");
  }
  const std::string back = tokenizer->decode(ids);
  if (const auto* bpe = dynamic_cast<const triad::data::BpeTokenizer*>(tokenizer.get())) {
    triad::fuzz::require(back == (bpe->settings().nfc ? triad::data::nfc(text) : text),
                         "decode(encode(text)) is the text, or its NFC form");
  }
}
