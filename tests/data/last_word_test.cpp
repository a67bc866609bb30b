#include "triad/data/last_word.h"

#include <gtest/gtest.h>

#include <sstream>

#include "support/expect_error.h"

namespace triad::data {
namespace {

using testing::expect_error;

std::vector<LastWordText> read_texts(const std::string& text, int64_t limit = 0) {
  std::istringstream in(text);
  return read_last_word_texts(in, "l.jsonl", limit);
}

// Cut at the last space, as lm-evaluation-harness cuts LAMBADA's texts:
// the space goes with the word; a double space leaves one on the context.
TEST(LastWordTexts, AreCutAtTheLastSpace) {
  const auto t = read_texts(R"({"text": "she held out her hand and said\nhello"})"
                            "\n\n"
                            R"({"text": "two  words", "id": 7})"
                            "\n"
                            R"({"text": "past the limit"})"
                            "\n",
                            2);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].context, "she held out her hand and");
  EXPECT_EQ(t[0].target, " said\nhello");  // a newline is not the cut
  EXPECT_EQ(t[1].context, "two ");
  EXPECT_EQ(t[1].target, " words");
  EXPECT_EQ(read_texts(R"({"text": "past the limit"})").front().target, " limit");
}

TEST(LastWordTexts, NameTheLineAndWhatIsWrong) {
  expect_error([] { read_texts("{\"text\": \"a b\"}\n{\n"); }, {"l.jsonl line 2 does not parse"});
  expect_error([] { read_texts(R"({"txt": "a b"})"); }, {"l.jsonl line 1 has no string \"text\""});
  expect_error([] { read_texts("[1]"); }, {"l.jsonl line 1 is not a JSON object"});
  expect_error([] { read_texts(R"({"text": "word"})"); }, {"line 1: the text has no word before"});
  expect_error([] { read_texts(R"({"text": " word"})"); }, {"no word before its last"});
  expect_error([] { read_texts(R"({"text": "a word "})"); }, {"ends with a space"});
  expect_error([] { read_texts("\n"); }, {"l.jsonl holds no texts"});
  expect_error([] { read_texts(R"({"text": "a b"})", -1); }, {"limit (-1) must be >= 0"});
  expect_error([] { read_last_word_texts("/no/such.jsonl"); },
               {"cannot open last-word texts '/no/such.jsonl'"});
}

}  // namespace
}  // namespace triad::data
