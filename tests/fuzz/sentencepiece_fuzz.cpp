// A SentencePiece model file (protobuf), then a text through it both ways,
// every id below the vocabulary's size.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/sentencepiece.h"

TRIAD_FUZZ_TARGET(sentencepiece) {
  const std::string path = triad::fuzz::write_input("tokenizer.model", data, size);
  const auto tokenizer = triad::data::load_sentencepiece(path);
  const auto ids = tokenizer->encode("Hello, world! \xe2\x96\x81 caf\xc3\xa9 <0x41> \xff 12\n\t x");
  for (const int32_t id : ids) {
    triad::fuzz::require(id >= 0 && id < tokenizer->vocab_size(), "ids are in the vocabulary");
  }
  (void)tokenizer->decode(ids);
}
