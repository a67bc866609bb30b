// A Hugging Face tokenizer.json, then a text through it both ways.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/tokenizer.h"

TRIAD_FUZZ_TARGET(hf_tokenizer) {
  const std::string path = triad::fuzz::write_input("tokenizer.json", data, size);
  const auto tokenizer = triad::data::load_hf_tokenizer(path);
  const auto ids =
      tokenizer->encode("Hello, world! <|endoftext|> caf\xc3\xa9 \xe2\x96\x81 \xff 12\n\t x");
  (void)tokenizer->decode(ids);
}
