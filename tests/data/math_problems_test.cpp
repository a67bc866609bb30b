#include "triad/data/math_problems.h"

#include <gtest/gtest.h>

#include <sstream>

#include "support/expect_error.h"

namespace triad::data {
namespace {

using testing::expect_error;

std::vector<MathProblem> read_problems(const std::string& text, int64_t limit = 0) {
  std::istringstream in(text);
  return read_math_problems(in, "g.jsonl", limit);
}

TEST(MathProblems, AreReadAsGsm8kWritesThem) {
  const auto p = read_problems(R"({"question": "Tom has 3 apples and buys 4. How many?", )"
                               R"("answer": "3 + 4 = <<3+4=7>>7\n#### 7"})"
                               "\n\n"
                               R"({"answer": "#### 1,200", "question": "Q2", "id": 9})"
                               "\n"
                               R"({"question": "past the limit", "answer": "#### 1"})"
                               "\n",
                               2);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].question, "Tom has 3 apples and buys 4. How many?");
  EXPECT_EQ(p[0].answer, "3 + 4 = <<3+4=7>>7\n#### 7");
  EXPECT_EQ(p[1].answer, "#### 1,200");
  EXPECT_EQ(read_problems(R"({"question": "q", "answer": "#### 2"})").size(), 1u);
}

TEST(MathProblems, BadLinesAreNamed) {
  expect_error([] { read_problems(R"({"question": "q"})"); },
               {"g.jsonl line 1 has no string \"answer\""});
  expect_error(
      [] {
        read_problems(
            "\n"
            R"({"question": 3, "answer": "#### 3"})");
      },
      {"g.jsonl line 2 has no string \"question\""});
  expect_error([] { read_problems(R"({"question": "q", "answer": "it is 4"})"); },
               {"g.jsonl line 1: the answer has no final answer after \"#### \""});
  expect_error([] { read_problems("{not json"); }, {"g.jsonl line 1 does not parse"});
  expect_error([] { read_problems("\n\n"); }, {"g.jsonl holds no problems"});
  expect_error([] { read_math_problems("/no/such.jsonl"); },
               {"cannot open math problems '/no/such.jsonl'"});
}

// lm-evaluation-harness's gsm8k prompt: "Question: ...\nAnswer: ..."
// examples joined by blank lines, the problem left at "Answer:".
TEST(MathProblems, PromptsFollowLmEvaluationHarness) {
  const MathProblem a{"One?", "1\n#### 1"}, b{"Two?", "2\n#### 2"}, q{"Three?", "#### 3"};
  EXPECT_EQ(math_prompt(q, {}), "Question: Three?\nAnswer:");
  EXPECT_EQ(math_prompt(q, {a, b}),
            "Question: One?\nAnswer: 1\n#### 1\n\nQuestion: Two?\nAnswer: 2\n#### 2\n\n"
            "Question: Three?\nAnswer:");
}

// The conversations lm-evaluation-harness's gsm8k asks a chat model
// (fewshot_context with apply_chat_template): the plain prompt as one user
// turn, or each example a user turn and an assistant turn.
TEST(MathProblems, ChatsAreTheHarnesss) {
  const MathProblem a{"One?", "1\n#### 1"}, b{"Two?", "2\n#### 2"}, q{"Three?", "#### 3"};
  const auto flat = [](const std::vector<ChatMessage>& m) {
    std::string s;
    for (const auto& x : m) s += "[" + x.role + "]" + x.content;
    return s;
  };
  EXPECT_EQ(flat(math_chat(q, {a, b}, false, "")), "[user]" + math_prompt(q, {a, b}));
  EXPECT_EQ(flat(math_chat(q, {}, false, "Be brief.")),
            "[system]Be brief.[user]Question: Three?\nAnswer:");
  EXPECT_EQ(flat(math_chat(q, {a, b}, true, "S")),
            "[system]S[user]Question: One?\nAnswer:[assistant]1\n#### 1"
            "[user]Question: Two?\nAnswer:[assistant]2\n#### 2[user]Question: Three?\nAnswer:");
  EXPECT_EQ(flat(math_chat(q, {}, true, "")), "[user]Question: Three?\nAnswer:");
}

TEST(MathProblems, FirstShotsSkipTheProblemAsked) {
  const std::vector<MathProblem> pool{{"a", "#### 1"}, {"b", "#### 2"}, {"c", "#### 3"}};
  auto names = [](const std::vector<MathProblem>& v) {
    std::string s;
    for (const auto& p : v) s += p.question;
    return s;
  };
  EXPECT_EQ(names(first_shots(pool, 2, -1, "w")), "ab");
  EXPECT_EQ(names(first_shots(pool, 2, 0, "w")), "bc");
  EXPECT_EQ(names(first_shots(pool, 2, 1, "w")), "ac");
  EXPECT_EQ(names(first_shots(pool, 0, 1, "w")), "");
  expect_error([&] { first_shots(pool, 3, 2, "--gsm8k 'g.jsonl'"); },
               {"--gsm8k 'g.jsonl': 3 few-shot examples asked for, but only 2 other problem(s)"});
  expect_error([&] { first_shots(pool, -1, -1, "w"); }, {"the few-shot count -1 must be >= 0"});
}

// GSM8K's examples drawn as lm-evaluation-harness draws them; expected:
// CPython's random.Random(1234).sample, call after call.
TEST(MathProblems, DrawnShotsAreTheHarnesss) {
  std::vector<MathProblem> pool;
  for (int k = 0; k < 8; ++k)
    pool.push_back({"q" + std::to_string(k), "#### " + std::to_string(k)});
  const auto names = [](const std::vector<MathProblem>& v) {
    std::string s;
    for (const auto& p : v) s += p.question;
    return s;
  };
  // From train: 2 per problem ([7, 0], [0, 7], [0, 5]).
  const std::vector<MathProblem> test{{"t0", "#### 1"}, {"t1", "#### 1"}, {"t2", "#### 1"}};
  auto d = drawn_shots(test, pool, 2, false, 1234, "train");
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(names(d[0]), "q7q0");
  EXPECT_EQ(names(d[1]), "q0q7");
  EXPECT_EQ(names(d[2]), "q0q5");
  // From the file itself: 3 drawn, the problem asked dropped ([7, 0, 6],
  // [1, 6, 4], [0, 5, 6]).
  const std::vector<MathProblem> first3(pool.begin(), pool.begin() + 3);
  d = drawn_shots(first3, pool, 2, true, 1234, "own");
  EXPECT_EQ(names(d[0]), "q7q6");
  EXPECT_EQ(names(d[1]), "q6q4");
  EXPECT_EQ(names(d[2]), "q0q5");
  // A train problem equal to the one asked is dropped too (one fewer shown).
  d = drawn_shots({pool[7]}, pool, 2, false, 1234, "train");
  EXPECT_EQ(names(d[0]), "q0");
  EXPECT_TRUE(drawn_shots(test, pool, 0, false, 1234, "train")[0].empty());
  expect_error([&] { drawn_shots(test, pool, 8, true, 1234, "--gsm8k 'g.jsonl'"); },
               {"--gsm8k 'g.jsonl': question 1 draws 9", "8 and one to spare", "from 8"});
  expect_error([&] { drawn_shots(test, pool, -2, false, 1, "w"); }, {"-2 must be >= 0"});
}

TEST(MathProblems, GenerationIsCutAtTheFirstStop) {
  const std::vector<std::string> stops{"Question:", "</s>", ""};
  EXPECT_EQ(cut_at_stops(" 5 + 2 = 7\n#### 7\n\nQuestion: next", stops), " 5 + 2 = 7\n#### 7\n\n");
  EXPECT_EQ(cut_at_stops(" 7</s>Question:", stops), " 7");
  EXPECT_EQ(cut_at_stops(" no stop", stops), " no stop");
  EXPECT_EQ(cut_at_stops("", stops), "");
}

// Expected values: lm-evaluation-harness's filters and exact_match run on
// the same strings in Python (its regexes through `re.findall`, the group
// taken as its RegexFilter takes it, `regexes_to_ignore` through
// `re.sub`, then `lower()`).
TEST(MathProblems, AnswersAreExtractedAndNormalisedAsLmEvaluationHarnessDoes) {
  struct Case {
    std::string text, strict, flexible, norm;
  };
  const std::vector<Case> cases{
      {"Natalia sold 48/2 = 24 clips in May.\n#### 72", "72", "72", "72"},
      {"She has $1,234.50 left. The answer is 1234.5.", "[invalid]", "1234.5.",
       "she has 1234.50 left. the answer is 1234.5"},
      {"So the answer is -7.", "[invalid]", "-7.", "so the answer is -7"},
      {"#### -", "[invalid]", "[invalid]", "-"},
      {"#### -3, and then #### 5", "-3,", "5", "5"},
      {"no digits here", "[invalid]", "[invalid]", "no digits here"},
      {"It costs 5 dollars", "[invalid]", "5", "it costs 5 dollars"},
      {"x = 3.\n", "[invalid]", "3.", "x = 3\n"},
      {"The total is 1,000,000.\n#### 1,000,000", "1,000,000", "1,000,000", "1000000"},
      {"Values: 1 2 3 ..", "[invalid]", "..", "values: 1 2 3 ."},
      {"Answer: $5", "[invalid]", "$5", "answer: 5"},
      {"#### 12.\n", "12.", "12.", "12\n"},
      {"A-1 and -2-3", "[invalid]", "-3", "a-1 and -2-3"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(strict_answer(c.text), c.strict) << c.text;
    EXPECT_EQ(flexible_answer(c.text), c.flexible) << c.text;
    EXPECT_EQ(normalize_answer(c.text), c.norm) << c.text;
  }
}

TEST(MathProblems, AnAnswerMatchesTheSolutionsFinalNumber) {
  const MathProblem p{"q", "It is 1,000 + 200 = 1,200.\n#### 1,200"};
  EXPECT_TRUE(answer_matches("1200", p));
  EXPECT_TRUE(answer_matches("1,200.", p));
  EXPECT_TRUE(answer_matches("$1,200", p));
  EXPECT_FALSE(answer_matches("1200.0", p));
  EXPECT_FALSE(answer_matches("-1200", p));
  EXPECT_FALSE(answer_matches(kInvalidAnswer, p));
  EXPECT_TRUE(answer_matches(strict_answer(" so 1,200 in all.\n#### 1,200"), p));
  EXPECT_TRUE(answer_matches(flexible_answer(" so the total is $1,200."), p));
  EXPECT_FALSE(answer_matches(strict_answer(" so the total is $1,200."), p));
}

}  // namespace
}  // namespace triad::data
