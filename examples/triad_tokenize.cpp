// triad-tokenize: turns a text file into an llm.c token shard.
//   triad-tokenize --input corpus.txt --output train.bin            (bytes, vocab 256)
//   triad-tokenize --input corpus.txt --output train.bin --vocab vocab.json --merges merges.txt
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <memory>
#include <sstream>

#include "triad/core/error.h"
#include "triad/data/token_shard.h"
#include "triad/data/tokenizer.h"

int main(int argc, char** argv) {
  CLI::App app{"Tokenize a text file into an llm.c shard (uint16 tokens)"};
  std::string input, output, vocab, merges;
  app.add_option("--input", input, "UTF-8 text file")->required();
  app.add_option("--output", output, "shard to write")->required();
  app.add_option("--vocab", vocab, "GPT-2 vocab.json (with --merges: BPE; otherwise bytes)");
  app.add_option("--merges", merges, "GPT-2 merges.txt");
  CLI11_PARSE(app, argc, argv);
  try {
    if (vocab.empty() != merges.empty()) {
      throw triad::ValueError("--vocab and --merges must be given together");
    }
    std::unique_ptr<triad::data::Tokenizer> tok;
    if (vocab.empty()) {
      tok = std::make_unique<triad::data::ByteTokenizer>();
    } else {
      tok = std::make_unique<triad::data::Gpt2BpeTokenizer>(vocab, merges);
    }
    std::ifstream in(input, std::ios::binary);
    if (!in) throw triad::IoError("cannot open input '" + input + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    const auto ids = tok->encode(ss.str());
    std::vector<uint16_t> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      if (id < 0 || id > 65535)
        throw triad::ValueError("token id " + std::to_string(id) + " does not fit in uint16");
      tokens.push_back(static_cast<uint16_t>(id));
    }
    triad::data::write_token_shard(output, tokens);
    spdlog::info("wrote {} tokens (vocab {}) to {}", tokens.size(), tok->vocab_size(), output);
  } catch (const triad::Error& e) {
    spdlog::error("{}", e.what());
    return 2;
  }
  return 0;
}
