// An llm.c token shard (a 1024-byte header of magic, version and count,
// then uint16 tokens). What reads is as long as the header says, its
// tokens below the vocabulary when one is given, and writes back to a
// shard that reads the same.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/token_shard.h"

TRIAD_FUZZ_TARGET(token_shard) {
  using triad::fuzz::require;
  const std::string path = triad::fuzz::write_input("shard.bin", data, size);
  const auto tokens = triad::data::read_token_shard(path);
  require(triad::data::check_token_shard(path, data, size) == tokens.size(),
          "the check counts what the reader reads");
  require(size == triad::data::kShardHeaderBytes + 2 * tokens.size(),
          "the file is its header and its tokens");
  // GPT-2's vocabulary: every token below it reads, any other is refused.
  constexpr int64_t kVocab = 50257;
  bool below = true;
  for (uint16_t t : tokens) below = below && t < kVocab;
  try {
    require(triad::data::read_token_shard(path, kVocab) == tokens && below,
            "tokens below the vocabulary read the same");
  } catch (const triad::IoError&) {
    require(!below, "a shard is refused for a token past the vocabulary only");
  }
  const std::string again = triad::fuzz::scratch_dir() + "/again.bin";
  triad::data::write_token_shard(again, tokens);
  require(triad::data::read_token_shard(again) == tokens, "the tokens write back and read again");
}
