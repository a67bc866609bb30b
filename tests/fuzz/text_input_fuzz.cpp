// A corpus file, plain or compressed (gzip, Zstandard: told by its first
// bytes), read to its end as the tokenizer reads it.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/text_input.h"

TRIAD_FUZZ_TARGET(text_input) {
  const std::string path = triad::fuzz::write_input("corpus.txt", data, size);
  const auto in = triad::data::open_text_input(path);
  char buffer[4096];
  while (in->read(buffer, sizeof buffer) || in->gcount() > 0) {
  }
}
