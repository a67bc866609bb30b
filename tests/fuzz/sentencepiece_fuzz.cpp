// A SentencePiece model file (protobuf), then a text through it both ways.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/sentencepiece.h"

TRIAD_FUZZ_TARGET(sentencepiece) {
  const std::string path = triad::fuzz::write_input("tokenizer.model", data, size);
  const auto tokenizer = triad::data::load_sentencepiece(path);
  const auto ids = tokenizer->encode("Hello, world! \xe2\x96\x81 caf\xc3\xa9 <0x41> \xff 12\n\t x");
  (void)tokenizer->decode(ids);
}
