// eval.samples: the prompts tokenized once, and the tokens a sample ends
// at — data.eod_token and the end tokens of a generation_config.json beside
// eval.tokenizer, as triad-generate stops.
#include "triad/train/eval_text.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "support/expect_error.h"
#include "support/temp_dir.h"

namespace triad::train {
namespace {

Config with_samples(const std::string& tokenizer) {
  Config c;
  c.model.vocab_size = 320;
  c.model.eod_token = 300;  // the chat fixture's <|endoftext|>
  c.eval.samples = {"1+2", "hello"};
  c.eval.tokenizer = tokenizer;
  return c;
}

TEST(SamplePrompts, EndAtTheDocumentsEndAndTheGenerationConfigsTokens) {
  testing::TempDir dir;
  const std::string model = dir.file("chat_model");
  std::filesystem::create_directories(model);
  std::filesystem::copy_file(TRIAD_SOURCE_DIR "/tests/data/fixtures/chat_model/tokenizer.json",
                             model + "/tokenizer.json");
  SamplePrompts p = load_sample_prompts(with_samples(model));
  EXPECT_EQ(p.ids.size(), 2u);
  EXPECT_EQ(p.stop_tokens, (std::vector<int64_t>{300}));  // no generation_config.json
  std::ofstream(model + "/generation_config.json") << R"({"eos_token_id": [302, 300]})";
  p = load_sample_prompts(with_samples(model));
  EXPECT_EQ(p.stop_tokens, (std::vector<int64_t>{300, 302}));
  // An id past the tokenizer, or one of its holes (260-299), is named.
  for (const char* id : {"303", "270"}) {
    std::ofstream(model + "/generation_config.json", std::ios::trunc)
        << "{\"eos_token_id\": " << id << "}";
    testing::expect_error([&] { load_sample_prompts(with_samples(model)); },
                          {"eval.tokenizer: its generation_config.json's eos_token_id " +
                           std::string(id) + " is not a token of the tokenizer"});
  }
  std::ofstream(model + "/generation_config.json", std::ios::trunc) << "{";
  testing::expect_error([&] { load_sample_prompts(with_samples(model)); },
                        {"eval.tokenizer: '", "generation_config.json' is not JSON"});
}

}  // namespace
}  // namespace triad::train
