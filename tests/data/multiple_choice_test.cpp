#include "triad/data/multiple_choice.h"

#include <gtest/gtest.h>

#include <sstream>

#include "support/expect_error.h"

namespace triad::data {
namespace {

using testing::expect_error;

std::vector<ChoiceQuestion> read(const std::string& text, int64_t limit = 0) {
  std::istringstream in(text);
  return read_choice_questions(in, "q.jsonl", limit);
}

TEST(ChoiceQuestions, ReadHellaSwagsLinesAndPlainOnes) {
  // A HellaSwag validation line (its other fields ignored), a blank line, a
  // plain line with Hugging Face's string label, and one past the limit.
  const std::string text =
      R"({"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he", "ctx": "A man is sitting on a roof. he", "split": "val", "split_type": "indomain", "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik's cube.", "starts pulling up roofing on a roof."], "source_id": "activitynet~v_-JhWjGDPHMY", "label": 3})"
      "\n  \n"
      R"({"context": "The capital of France is", "choices": ["Paris", "Lyon"], "answer": "0"})"
      "\n"
      R"({"context": "x", "choices": ["a", "b"], "answer": 1})"
      "\n";
  const auto q = read(text);
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q[0].context, "A man is sitting on a roof. he");
  ASSERT_EQ(q[0].choices.size(), 4u);
  EXPECT_EQ(q[0].choices[1], "is ripping level tiles off.");
  EXPECT_EQ(q[0].answer, 3);
  EXPECT_EQ(q[1].context, "The capital of France is");
  EXPECT_EQ(q[1].choices, (std::vector<std::string>{"Paris", "Lyon"}));
  EXPECT_EQ(q[1].answer, 0);
  EXPECT_EQ(q[2].answer, 1);
  EXPECT_EQ(read(text, 2).size(), 2u);
}

TEST(ChoiceQuestions, NameTheLineAndWhatItLacks) {
  const std::string ok = R"({"context": "c", "choices": ["a", "b"], "answer": 0})";
  expect_error([&] { read(ok + "\n{\"context\": \"c\",\n"); }, {"q.jsonl line 2 does not parse"});
  expect_error([&] { read("[1, 2]\n"); }, {"q.jsonl line 1 is not a JSON object"});
  expect_error([&] { read(R"({"choices": ["a", "b"], "answer": 0})"); },
               {"line 1 has no string \"ctx\" or \"context\""});
  expect_error([&] { read(R"({"context": "c", "choices": "a", "answer": 0})"); },
               {"line 1 has no list \"endings\" or \"choices\""});
  expect_error([&] { read(R"({"context": "c", "choices": ["a", 7], "answer": 0})"); },
               {"line 1: choice 1 is 7, not a string"});
  expect_error([&] { read(R"({"context": "c", "choices": ["a", ""], "answer": 0})"); },
               {"line 1: choice 1 is empty"});
  expect_error([&] { read(R"({"context": "c", "choices": ["a"], "answer": 0})"); },
               {"line 1 has 1 choice(s); a question needs at least two"});
  expect_error([&] { read(ok + "\n" + R"({"context": "c", "choices": ["a", "b"]})"); },
               {"line 2 has no \"label\" or \"answer\""});
  // HellaSwag's test split: its labels are empty strings.
  expect_error([&] { read(R"({"ctx": "c", "endings": ["a", "b"], "label": ""})"); },
               {"unlabelled", "validation split"});
  expect_error([&] { read(R"({"context": "c", "choices": ["a", "b"], "answer": 2})"); },
               {"line 1: label 2 is not a choice's index in [0, 2)"});
  expect_error([&] { read(R"({"context": "c", "choices": ["a", "b"], "answer": "B"})"); },
               {"label \"B\" is not a choice's index"});
  expect_error([&] { read(R"({"context": "c", "choices": ["a", "b"], "answer": -1})"); },
               {"label -1"});
  expect_error([&] { read("\n\n"); }, {"q.jsonl holds no questions"});
  expect_error([&] { read(ok, -1); }, {"limit (-1) must be >= 0"});
  expect_error([&] { read_choice_questions("/no/such/file.jsonl"); },
               {"cannot open multiple-choice questions '/no/such/file.jsonl'"});
}

TEST(ChoiceQuestions, TheContextsTrailingSpaceMovesToTheContinuation) {
  const ByteTokenizer bytes;
  auto ids = [](const std::string& s) { return std::vector<int32_t>(s.begin(), s.end()); };
  auto [c, n] = encode_context_and_continuation(bytes, "Answer: \n", "Paris");
  EXPECT_EQ(c, ids("Answer:"));
  EXPECT_EQ(n, ids(" \nParis"));
  std::tie(c, n) = encode_context_and_continuation(bytes, "A man", " runs");
  EXPECT_EQ(c, ids("A man"));
  EXPECT_EQ(n, ids(" runs"));
  std::tie(c, n) = encode_context_and_continuation(bytes, "  ", "x");
  EXPECT_TRUE(c.empty());
  EXPECT_EQ(n, ids("  x"));
}

TEST(ChoiceQuestions, CharactersAreCodePoints) {
  EXPECT_EQ(utf8_characters(""), 0);
  EXPECT_EQ(utf8_characters("Paris"), 5);
  EXPECT_EQ(utf8_characters("h\xC3\xA9llo"), 5);              // héllo: 6 bytes
  EXPECT_EQ(utf8_characters("\xE6\x97\xA5\xE6\x9C\xAC"), 2);  // 日本
  EXPECT_EQ(utf8_characters("\xF0\x9F\x98\x80!"), 2);         // an emoji and !
}

}  // namespace
}  // namespace triad::data
