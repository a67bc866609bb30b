// GPT-2's tokenizer files as its release has them: vocab.json and
// merges.txt (the input's two parts, kPartSeparator between), then a text
// through the tokenizer both ways. Every token has an id of its own (a
// vocabulary in which two share one is refused), so decoding gives back
// exactly the text encoded: byte-level BPE loses nothing, malformed UTF-8
// included; and every id is below the vocabulary's size.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/tokenizer.h"

TRIAD_FUZZ_TARGET(gpt2_bpe) {
  const auto parts = triad::fuzz::split_input(data, size, 2);
  const std::string vocab = triad::fuzz::write_input("vocab.json", parts[0]);
  const std::string merges = triad::fuzz::write_input("merges.txt", parts[1]);
  const auto tokenizer = triad::data::make_tokenizer(vocab, merges, "");
  for (const std::string text : {"Hello, world! It's 2024.", "caf\xc3\xa9 \xff\xfe 12\n\t  x",
                                 "\xe2\x96\x81\xf0\x9f\x99\x82 <|endoftext|>"}) {
    const auto ids = tokenizer->encode(text);
    for (const int32_t id : ids) {
      triad::fuzz::require(id >= 0 && id < tokenizer->vocab_size(), "ids are in the vocabulary");
    }
    triad::fuzz::require(tokenizer->decode(ids) == text, "decode(encode(text)) is the text");
  }
}
