#include "triad/data/multiple_choice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "support/expect_error.h"

namespace triad::data {
namespace {

using testing::expect_error;

std::vector<ChoiceQuestion> read(const std::string& text, int64_t limit = 0) {
  std::istringstream in(text);
  return read_choice_questions(in, "q.jsonl", limit);
}

std::vector<ChoiceQuestion> read_lines(const std::string& text, HellaSwagPrompt hellaswag) {
  std::istringstream in(text);
  return read_choice_questions(in, "q.jsonl", 0, hellaswag);
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
  // Fields another form uses change nothing beside the plain form's.
  const auto extra = read(
      R"({"context": "c", "choices": ["a", "b"], "answer": 1, "passage": "p", "question": "q", "sentence": "_"})");
  EXPECT_EQ(extra[0].context, "c");
  EXPECT_TRUE(extra[0].contexts.empty());
}

// WinoGrande's lines as they come (its validation split's first): each
// option in the blank makes its context, and the rest of the sentence is
// scored after either; and the same by hand, a context per choice.
TEST(ChoiceQuestions, ReadWinoGrandesLinesAndAContextPerChoice) {
  const auto q = read(
      R"({"sentence": "Sarah was a much better surgeon than Maria so _ always got the harder cases.", "option1": "Sarah", "option2": "Maria", "answer": "1"})"
      "\n"
      R"({"sentence": "He put the _ in the box  ", "option1": "ring", "option2": "vase", "answer": 2})"
      "\n"
      R"({"contexts": ["I drank the", "I ate the", "I read the"], "continuation": "soup.", "answer": 1})"
      "\n");
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q[0].contexts,
            (std::vector<std::string>{"Sarah was a much better surgeon than Maria so Sarah",
                                      "Sarah was a much better surgeon than Maria so Maria"}));
  EXPECT_EQ(q[0].choices, (std::vector<std::string>{"always got the harder cases.",
                                                    "always got the harder cases."}));
  EXPECT_EQ(q[0].answer, 0);  // WinoGrande counts from 1
  EXPECT_EQ(q[0].context_of(1), "Sarah was a much better surgeon than Maria so Maria");
  EXPECT_EQ(q[1].contexts[1], "He put the vase");
  EXPECT_EQ(q[1].choices[0], "in the box");  // stripped, as lm-evaluation-harness does
  EXPECT_EQ(q[1].answer, 1);
  EXPECT_EQ(q[2].context_of(2), "I read the");
  EXPECT_EQ(q[2].choices, (std::vector<std::string>(3, "soup.")));
  EXPECT_EQ(q[2].answer, 1);
  // A question with one context answers context_of with it.
  const auto plain = read(R"({"context": "c", "choices": ["a", "b"], "answer": 0})");
  EXPECT_EQ(plain[0].context_of(1), "c");
}

// ARC, OpenBookQA, PIQA, MMLU, BoolQ and Social IQa as Hugging Face's
// copies hold them, each as lm-evaluation-harness's default prompt asks it.
TEST(ChoiceQuestions, ReadTheLinesOfTheCommonBenchmarks) {
  const auto q = read(
      R"({"id": "Mercury_1", "question": "Which gas do plants take in?", "choices": {"text": ["oxygen", "carbon dioxide", "helium"], "label": ["A", "B", "C"]}, "answerKey": "B"})"
      "\n"
      R"({"id": "x", "question": "Two?", "choices": {"text": ["one", "two"], "label": ["1", "2"]}, "answerKey": "2"})"
      "\n"
      R"({"id": "7-980", "question_stem": "The sun is responsible for", "choices": {"text": ["puppies learning new tricks", "plants sprouting"], "label": ["A", "B"]}, "answerKey": " B"})"
      "\n"
      R"({"goal": "How do I open a jar?", "sol1": "Twist the lid.", "sol2": "Eat the lid.", "label": 0})"
      "\n"
      R"({"question": "  What is 2 + 2?\n", "subject": "elementary_mathematics", "choices": ["3", "4", "5", "22"], "answer": 1})"
      "\n"
      R"({"question": "Pick B.", "choices": ["no", "yes"], "answer": 1})"
      "\n");
  ASSERT_EQ(q.size(), 6u);
  EXPECT_EQ(q[0].context, "Question: Which gas do plants take in?\nAnswer:");
  EXPECT_EQ(q[0].choices, (std::vector<std::string>{"oxygen", "carbon dioxide", "helium"}));
  EXPECT_EQ(q[0].answer, 1);
  EXPECT_EQ(q[1].answer, 1);  // labels that are digits, as some ARC lines have
  EXPECT_EQ(q[2].context, "The sun is responsible for");
  EXPECT_EQ(q[2].answer, 1);  // OpenBookQA's answerKey, its space stripped
  EXPECT_EQ(q[3].context, "Question: How do I open a jar?\nAnswer:");
  EXPECT_EQ(q[3].choices, (std::vector<std::string>{"Twist the lid.", "Eat the lid."}));
  EXPECT_EQ(q[3].answer, 0);
  EXPECT_EQ(q[4].context_of(0),
            "The following are multiple choice questions (with answers) about elementary "
            "mathematics.\n\nWhat is 2 + 2?\nA. 3\nB. 4\nC. 5\nD. 22\nAnswer:");
  EXPECT_EQ(q[4].group, "elementary_mathematics");
  EXPECT_EQ(q[4].choices, (std::vector<std::string>{"A", "B", "C", "D"}));
  EXPECT_EQ(q[4].answer, 1);
  EXPECT_EQ(q[5].context_of(1), "Pick B.\nA. no\nB. yes\nAnswer:");  // no subject, no heading
  for (const auto& question : q) EXPECT_TRUE(question.contexts.empty());
  // BoolQ (SuperGLUE's and Google's copies) and Social IQa.
  const auto more = read(
      R"({"question": "is the sky blue", "passage": "The sky is blue.", "idx": 0, "label": 1})"
      "\n"
      R"({"question": "is ice hot", "answer": false, "passage": "Ice is cold."})"
      "\n"
      R"({"context": "Tracy gave Kim a gift.", "question": "How would Kim feel?", "answerA": "sad", "answerB": "thankful", "answerC": "angry", "label": "2"})"
      "\n");
  ASSERT_EQ(more.size(), 3u);
  EXPECT_EQ(more[0].context, "The sky is blue.\nQuestion: is the sky blue?\nAnswer:");
  EXPECT_EQ(more[0].choices, (std::vector<std::string>{"no", "yes"}));
  EXPECT_EQ(more[0].answer, 1);
  EXPECT_EQ(more[1].answer, 0);
  EXPECT_EQ(more[2].context, "Q: Tracy gave Kim a gift. How would Kim feel?\nA:");
  EXPECT_EQ(more[2].choices, (std::vector<std::string>{"sad", "thankful", "angry"}));
  EXPECT_EQ(more[2].answer, 1);  // counted from 1
}

// An MMLU dev split: three law questions, one on art.
const std::string kMmluDev =
    R"({"question": "Dev 1?", "subject": "law", "choices": ["a", "b"], "answer": 1})"
    "\n"
    R"({"question": "Dev 2?", "subject": "art", "choices": ["c", "d"], "answer": 0})"
    "\n"
    R"({"question": "Dev 3?", "subject": "law", "choices": ["e", "f"], "answer": 0})"
    "\n"
    R"({"question": "Dev 4?", "subject": "law", "choices": ["g", "h"], "answer": 0})"
    "\n";

// Few-shot examples: each solved (its context, the separator, its right
// choice, a blank line) before the question's context, after its heading;
// from the questions' own file without the question itself, or from
// another file; of the question's subject when it names one.
TEST(ChoiceQuestions, FewShotExamplesGoBeforeTheContext) {
  const std::string plain =
      R"({"context": "1+1=", "choices": ["2", "3"], "answer": 0})"
      "\n"
      R"({"context": "2+2=", "choices": ["3", "4"], "answer": 1})"
      "\n"
      R"({"sentence": "A _ barks.", "option1": "cat", "option2": "dog", "answer": "2"})"
      "\n";
  auto q = read(plain);
  add_examples(q, read(plain), 2, " ", true, "q.jsonl");
  EXPECT_EQ(q[0].context, "2+2= 4\n\nA dog barks.\n\n1+1=");
  EXPECT_EQ(q[1].context, "1+1= 2\n\nA dog barks.\n\n2+2=");
  EXPECT_EQ(q[2].contexts,
            (std::vector<std::string>{"1+1= 2\n\n2+2= 4\n\nA cat", "1+1= 2\n\n2+2= 4\n\nA dog"}));
  auto none = read(plain);
  add_examples(none, read(plain), 0, " ", true, "q.jsonl");
  EXPECT_EQ(none[0].context, "1+1=");
  expect_error([&] { add_examples(none, read(plain), 3, " ", true, "q.jsonl"); },
               {"q.jsonl: question 1 has 2 example(s) to show, 3 asked"});
  expect_error([&] { add_examples(none, read(plain), -1, " ", true, "q.jsonl"); },
               {"few-shot examples (-1) must be >= 0"});

  // MMLU: the examples of the question's subject alone, after its heading;
  // another file's examples (a dev split) are all candidates.
  const std::string& dev = kMmluDev;
  auto mmlu =
      read(R"({"question": "Test?", "subject": "law", "choices": ["x", "y"], "answer": 0})");
  add_examples(mmlu, read(dev), 2, " ", false, "test.jsonl");
  EXPECT_EQ(mmlu[0].context_of(0),
            "The following are multiple choice questions (with answers) about law.\n\n"
            "Dev 1?\nA. a\nB. b\nAnswer: B\n\nDev 3?\nA. e\nB. f\nAnswer: A\n\n"
            "Test?\nA. x\nB. y\nAnswer:");
  auto art = read(R"({"question": "Art?", "subject": "art", "choices": ["x", "y"], "answer": 0})");
  expect_error([&] { add_examples(art, read(dev), 2, " ", false, "test.jsonl"); },
               {"test.jsonl: question 1 (art) has 1 example(s) to show, 2 asked (examples of its "
                "subject only)"});
}

// Examples drawn as lm-evaluation-harness draws them (--fewshot-seed): the
// expected indices are CPython's random.Random(seed).sample, call after
// call, as the harness's ContextSampler makes them.
TEST(ChoiceQuestions, DrawnExamplesAreTheHarnesss) {
  std::string train;
  for (int k = 0; k < 30; ++k) {
    train += R"({"context": "c)" + std::to_string(k) + R"(=", "choices": ["x", "y)" +
             std::to_string(k) + R"("], "answer": 1})" + "\n";
  }
  const auto shown = [](const std::vector<int>& ks) {
    std::string s;
    for (const int k : ks) s += "c" + std::to_string(k) + "= y" + std::to_string(k) + "\n\n";
    return s;
  };
  // A task with a test split: 2 drawn per question (Random(1234): [24, 14],
  // [3, 0], [2, 29]).
  auto plain = read(R"({"context": "t0=", "choices": ["a", "b"], "answer": 0})"
                    "\n"
                    R"({"context": "t1=", "choices": ["a", "b"], "answer": 0})"
                    "\n"
                    R"({"context": "t2=", "choices": ["a", "b"], "answer": 0})");
  add_examples(plain, read(train), 2, " ", false, "test.jsonl", 1234);
  EXPECT_EQ(plain[0].context, shown({24, 14}) + "t0=");
  EXPECT_EQ(plain[1].context, shown({3, 0}) + "t1=");
  EXPECT_EQ(plain[2].context, shown({2, 29}) + "t2=");
  // HellaSwag names no test split: 3 drawn for 2 shown ([24, 14, 3],
  // [0, 2, 29]), which moves the second question's draw.
  auto hellaswag = read(R"({"ctx": "h0", "endings": ["a", "b"], "label": 0})"
                        "\n"
                        R"({"ctx": "h1", "endings": ["a", "b"], "label": 0})");
  EXPECT_TRUE(hellaswag[0].draws_one_more);
  EXPECT_FALSE(plain[0].draws_one_more);
  add_examples(hellaswag, read(train), 2, " ", false, "val.jsonl", 1234);
  EXPECT_EQ(hellaswag[0].context, shown({24, 14}) + "h0");
  EXPECT_EQ(hellaswag[1].context, shown({0, 2}) + "h1");
  // A question that is a train line (its keys in another order) drops
  // that draw and, with no spare, shows one example fewer.
  auto same = read(R"({"answer": 1, "choices": ["x", "y24"], "context": "c24="})");
  add_examples(same, read(train), 2, " ", false, "test.jsonl", 1234);
  EXPECT_EQ(same[0].context, shown({14}) + "c24=");
  // From the questions' own file: one more drawn, the question dropped
  // (Random(2): [0, 5, 4], [2, 1, 5], [2, 4, 1], [4, 0, 1]).
  std::string six;
  for (int k = 0; k < 6; ++k) {
    six += R"({"context": "c)" + std::to_string(k) + R"(=", "choices": ["x", "y)" +
           std::to_string(k) + R"("], "answer": 1})" + "\n";
  }
  auto own = read(six, 4);
  add_examples(own, read(six), 2, " ", true, "six.jsonl", 2);
  EXPECT_EQ(own[0].context, shown({5, 4}) + "c0=");
  EXPECT_EQ(own[1].context, shown({2, 5}) + "c1=");
  EXPECT_EQ(own[2].context, shown({4, 1}) + "c2=");
  EXPECT_EQ(own[3].context, shown({4, 0}) + "c3=");
  // Too few to draw from, named.
  auto small = read(R"({"context": "t0=", "choices": ["a", "b"], "answer": 0})");
  expect_error([&] { add_examples(small, read(six), 7, " ", false, "test.jsonl", 2); },
               {"test.jsonl: question 1 draws 7 few-shot example(s) from 6"});
  expect_error([&] { add_examples(own, read(six), 6, " ", true, "six.jsonl", 2); },
               {"six.jsonl: question 1 draws 7", "6 and one to spare"});
}

// MMLU's examples stay the first of the subject with a seed, as the
// harness's first_n sampler takes them from the dev split.
TEST(ChoiceQuestions, GroupedQuestionsTakeTheFirstExamplesEvenWhenDrawing) {
  const std::string& dev = kMmluDev;
  const std::string test =
      R"({"question": "Test?", "subject": "law", "choices": ["x", "y"], "answer": 0})";
  auto first = read(test), drawn = read(test);
  add_examples(first, read(dev), 2, " ", false, "test.jsonl");
  add_examples(drawn, read(dev), 2, " ", false, "test.jsonl", 1234);
  EXPECT_EQ(drawn[0].context_of(0), first[0].context_of(0));
  EXPECT_NE(drawn[0].context_of(0).find("Dev 1?"), std::string::npos);
  EXPECT_EQ(drawn[0].context_of(0).find("Dev 4?"), std::string::npos);
}

// HellaSwag as lm-evaluation-harness asks it: the activity label, ctx_b
// capitalised, WikiHow's markers cleaned as its preprocess does (the
// expected strings are that Python function's output for these lines).
// TruthfulQA's lines: the paper's QA prompt, then the question; mc1's
// choices with the one labelled 1 right, mc2's beside them.
TEST(ChoiceQuestions, TruthfulQaIsAskedAfterItsQaPrompt) {
  const auto q = read(
      R"({"question": "Can pigs fly?", "mc1_targets": {"choices": ["No.", "Yes."], "labels": [1, 0]},)"
      R"( "mc2_targets": {"choices": ["No.", "Never.", "Yes."], "labels": [1, 1, 0]}})");
  ASSERT_EQ(q.size(), 1u);
  const std::string& c = q[0].context;
  EXPECT_EQ(c.rfind("Q: What is human life expectancy in the United States?\n"
                    "A: Human life expectancy in the United States is 78 years.\n\n",
                    0),
            0u);
  const std::string tail =
      "A: The 1992 Olympics were held in Barcelona, Spain.\n\nQ: Can pigs fly?\nA:";
  ASSERT_GE(c.size(), tail.size());
  EXPECT_EQ(c.substr(c.size() - tail.size()), tail);
  // Six questions and answers (16 line breaks), then the question (3).
  EXPECT_EQ(std::count(c.begin(), c.end(), '\n'), 19);
  EXPECT_EQ(q[0].choices, (std::vector<std::string>{"No.", "Yes."}));
  EXPECT_EQ(q[0].answer, 0);
  EXPECT_EQ(q[0].mc2_choices, (std::vector<std::string>{"No.", "Never.", "Yes."}));
  EXPECT_EQ(q[0].mc2_true, 2);
  EXPECT_TRUE(q[0].draws_one_more);
  // The right mc1 answer is the one labelled 1, wherever it stands; mc2 is
  // optional (mc1 alone is truthfulqa_mc1).
  const auto later = read(
      R"({"question": "Q", "mc1_targets": {"choices": ["a", "b", "c"], "labels": [0, 0, 1]}})");
  EXPECT_EQ(later[0].answer, 2);
  EXPECT_TRUE(later[0].mc2_choices.empty());

  const auto bad = [&](const std::string& mc1, const std::string& mc2) {
    return R"({"question": "Q", "mc1_targets": )" + mc1 +
           (mc2.empty() ? "" : R"(, "mc2_targets": )" + mc2) + "}";
  };
  const std::string ok1 = R"({"choices": ["a", "b"], "labels": [1, 0]})";
  expect_error([&] { read(bad(R"({"choices": ["a", "b"], "labels": [1, 1]})", "")); },
               {"line 1", "mc1_targets.labels must mark exactly one choice 1"});
  expect_error([&] { read(bad(R"({"choices": ["a", "b"], "labels": [1, 2]})", "")); },
               {"mc1_targets.labels holds 2, not 0 or 1"});
  expect_error([&] { read(bad(R"({"choices": ["a", "b"], "labels": [1]})", "")); },
               {"mc1_targets has 2 choices and 1 labels"});
  expect_error([&] { read(bad(R"(["a"])", "")); },
               {"\"mc1_targets\" is not an object of \"choices\" and \"labels\""});
  expect_error([&] { read(bad(ok1, R"({"choices": ["a", "b"], "labels": [0, 1]})")); },
               {"mc2_targets.labels must begin with the true answers"});
  expect_error([&] { read(bad(ok1, R"({"choices": ["a", "b"], "labels": [1, 1]})")); },
               {"mc2_targets.labels must begin with the true answers"});
}

// MMLU-Pro as the harness's leaderboard_mmlu_pro asks it: the letters
// scored right after "Answer:" (its target_delimiter is ""), its examples
// the first of the few-shot file even when drawing (first_n).
TEST(ChoiceQuestions, MmluProIsAskedWithoutASeparatorAfterTheFirstExamples) {
  const std::string pro =
      R"({"question": "Q1?", "options": ["a", "b", "c"], "answer": "C", "category": "x"})"
      "\n"
      R"({"question": "Q2?", "options": ["d", "e"], "answer_index": 0})"
      "\n"
      R"({"question": "Q3?", "options": ["f", "g"], "answer": "B"})"
      "\n";
  auto q = read(pro);
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q[0].context, "Q1?\nA. a\nB. b\nC. c\nAnswer:");
  EXPECT_EQ(q[0].choices, (std::vector<std::string>{"A", "B", "C"}));
  EXPECT_EQ(q[0].answer, 2);
  EXPECT_EQ(q[1].answer, 0);
  EXPECT_EQ(q[0].separator, std::optional<std::string>(""));
  EXPECT_TRUE(q[0].first_examples);
  EXPECT_TRUE(q[0].group.empty());  // (the harness draws across categories)
  auto asked = read(R"({"question": "T?", "options": ["x", "y"], "answer": "A"})");
  auto drawn = asked;
  add_examples(asked, q, 2, " ", false, "test.jsonl");
  add_examples(drawn, q, 2, " ", false, "test.jsonl", 1234);
  const std::string want =
      "Q1?\nA. a\nB. b\nC. c\nAnswer:C\n\nQ2?\nA. d\nB. e\nAnswer:A\n\nT?\nA. x\nB. y\nAnswer:";
  EXPECT_EQ(asked[0].context, want);
  EXPECT_EQ(drawn[0].context, want);
  expect_error([&] { read(R"({"question": "Q?", "options": ["a", "b"], "answer": "D"})"); },
               {"line 1: answer \"D\" is none of the 2 options' letters"});
  expect_error([&] { read(R"({"question": "Q?", "options": ["a"], "answer": "A"})"); },
               {"has 1 option(s); a question needs 2 to 26"});
}

TEST(ChoiceQuestions, HellaSwagInTheHarnessesPrompt) {
  const std::string lines =
      R"({"activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he", "ctx": "A man is sitting on a roof. he", "endings": ["is using wrap.", "starts pulling up roofing."], "label": 1})"
      "\n"
      R"({"activity_label": "Home and Garden", "ctx_a": "[header] How to grow tomatoes [title] Pick a sunny spot.", "ctx_b": "the PLANT needs", "ctx": "x", "endings": ["[step] Water daily  and well.", "Never   water it [a\nb] ok."], "label": "0"})"
      "\n";
  const auto q = read_lines(lines, HellaSwagPrompt::Harness);
  ASSERT_EQ(q.size(), 2u);
  EXPECT_EQ(q[0].context, "Roof shingle removal: A man is sitting on a roof. He");
  EXPECT_EQ(q[0].choices,
            (std::vector<std::string>{"is using wrap.", "starts pulling up roofing."}));
  EXPECT_EQ(q[1].context,
            "Home and Garden: How to grow tomatoes. Pick a sunny spot. The plant needs");
  EXPECT_EQ(q[1].choices,
            (std::vector<std::string>{" Water daily and well.", "Never  water it [a\nb] ok."}));
  EXPECT_EQ(q[1].answer, 0);
  // Raw (llm.c's) reads ctx as it stands; other forms are the same either way.
  EXPECT_EQ(read_lines(lines, HellaSwagPrompt::Raw)[0].context, "A man is sitting on a roof. he");
  const std::string plain = R"({"context": "c", "choices": ["a", "b"], "answer": 1})";
  EXPECT_EQ(read_lines(plain, HellaSwagPrompt::Harness)[0].context, "c");
  expect_error(
      [] {
        read_lines(R"({"activity_label": "x", "ctx_a": "a", "endings": ["b", "c"], "label": 0})",
                   HellaSwagPrompt::Harness);
      },
      {"line 1 has no string \"ctx_b\" (HellaSwag's)"});
  expect_error(
      [] {
        read_lines(
            R"({"activity_label": "x", "ctx_a": "a", "ctx_b": "b", "endings": ["[step]", "c"], "label": 0})",
            HellaSwagPrompt::Harness);
      },
      {"line 1: choice 0 is empty once cleaned"});
  EXPECT_EQ(hellaswag_prompt_from_string("harness"), HellaSwagPrompt::Harness);
  expect_error([] { hellaswag_prompt_from_string("eleuther"); },
               {"HellaSwag prompt 'eleuther' is none of llmc"});
}

TEST(ChoiceQuestions, NameTheLineAndWhatItLacks) {
  const std::string ok = R"({"context": "c", "choices": ["a", "b"], "answer": 0})";
  expect_error([&] { read(ok + "\n{\"context\": \"c\",\n"); }, {"q.jsonl line 2 does not parse"});
  expect_error([&] { read("[1, 2]\n"); }, {"q.jsonl line 1 is not a JSON object"});
  // (A number past a double's range: the JSON library's out_of_range, not a
  // parse_error, and named all the same.)
  expect_error([&] { read("{\"answer\": 1e999}\n"); }, {"q.jsonl line 1 does not parse"});
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
  // WinoGrande's: its test split has empty answers; counted from 1.
  const std::string wino = R"({"sentence": "a _ b", "option1": "x", "option2": "y", )";
  expect_error([&] { read(wino + R"("answer": ""})"); }, {"unlabelled", "validation splits"});
  expect_error([&] { read(wino + R"("answer": "0"})"); },
               {"line 1: label \"0\" is not a choice's index in [1, 3)"});
  expect_error([&] { read(R"({"sentence": "a b", "option1": "x", "option2": "y", "answer": 1})"); },
               {"line 1: the sentence has no blank \"_\""});
  expect_error(
      [&] { read(R"({"sentence": "a b _ ", "option1": "x", "option2": "y", "answer": 1})"); },
      {"nothing follows the sentence's blank"});
  expect_error([&] { read(R"({"sentence": "a _ b", "option1": "x", "answer": 1})"); },
               {"line 1 has no string \"option2\" (a WinoGrande option)"});
  expect_error(
      [&] { read(R"({"sentence": "a _ b", "option1": "", "option2": "y", "answer": 1})"); },
      {"line 1: \"option1\" is empty"});
  expect_error([&] { read(R"({"contexts": ["a"], "continuation": "c", "answer": 0})"); },
               {"line 1 has 1 context(s); a question needs at least two"});
  expect_error([&] { read(R"({"contexts": ["a", 3], "continuation": "c", "answer": 0})"); },
               {"line 1: context 1 is 3, not a string"});
  expect_error([&] { read(R"({"contexts": "a", "continuation": "c", "answer": 0})"); },
               {"\"contexts\" is not a list of strings"});
  expect_error([&] { read(R"({"contexts": ["a", "b"], "answer": 0})"); },
               {"line 1 has no string \"continuation\""});
  expect_error([&] { read(R"({"contexts": ["a", "b"], "continuation": "c", "answer": 2})"); },
               {"label 2 is not a choice's index in [0, 2)"});
  const std::string arc =
      R"({"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, )";
  expect_error([&] { read(arc + R"("answerKey": "E"})"); },
               {"line 1: answerKey \"E\" is none of the labels (A, B)"});
  expect_error([&] { read(arc + "\"x\": 1}"); }, {"line 1 has no \"answerKey\""});
  expect_error(
      [&] {
        read(
            R"({"question": "q", "choices": {"text": ["a", "b"], "label": ["A"]}, "answerKey": "A"})");
      },
      {"line 1: 2 choices but 1 labels"});
  expect_error(
      [&] { read(R"({"question": "q", "choices": {"text": ["a", "b"]}, "answerKey": "A"})"); },
      {"\"choices\" is not an object of \"text\" and \"label\" lists"});
  expect_error([&] { read(R"({"question_stem": "q", "answerKey": "A"})"); },
               {"line 1: \"choices\" is not an object of \"text\" and \"label\" lists"});
  expect_error([&] { read(R"({"goal": "g", "sol1": "a", "label": 0})"); },
               {"line 1 has no string \"sol2\" (PIQA's)"});
  expect_error([&] { read(R"({"goal": "g", "sol1": "a", "sol2": "b", "label": -1})"); },
               {"label -1 marks an unlabelled question"});  // PIQA's test split
  expect_error([&] { read(R"({"question": "q", "passage": "p", "label": -1})"); },
               {"label -1 marks an unlabelled question"});  // BoolQ's test split
  expect_error([&] { read(R"({"passage": "p", "label": 1})"); },
               {"line 1 has no string \"question\" (BoolQ's)"});
  expect_error(
      [&] {
        read(R"({"context": "c", "question": "q", "answerA": "a", "answerB": "b", "label": "1"})");
      },
      {"line 1 has no string \"answerC\" (Social IQa's)"});
  expect_error(
      [&] {
        read(
            R"({"context": "c", "question": "q", "answerA": "a", "answerB": "b", "answerC": "c", "label": "4"})");
      },
      {"label \"4\" is not a choice's index in [1, 4)"});
  expect_error([&] { read(R"({"question": "q", "choices": ["a"], "answer": 0})"); },
               {"line 1 has 1 choice(s); a question needs 2 to 26"});
  expect_error([&] { read(R"({"question": "q", "choices": ["a", ""], "answer": 0})"); },
               {"line 1: choice 1 is empty"});
  expect_error([&] { read(R"({"question": "q", "choices": ["a", "b"], "answer": 4})"); },
               {"label 4 is not a choice's index in [0, 2)"});
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

// A chat template's context: its trailing whitespace (the newline after
// the assistant's header) moves to the continuation, as the harness moves
// it; markers go in by id.
TEST(ChoiceQuestions, AChatContextsTrailingSpaceMovesToTheContinuation) {
  const auto tok = make_tokenizer(
      "", "", std::string(TRIAD_SOURCE_DIR) + "/tests/data/fixtures/chat_model/tokenizer.json");
  const int32_t start = static_cast<int32_t>(tok->special_token("<|im_start|>")),
                end = static_cast<int32_t>(tok->special_token("<|im_end|>"));
  const auto join = [](std::vector<std::vector<int32_t>> parts) {
    std::vector<int32_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  auto [c, n] = encode_chat_context_and_continuation(
      *tok, render_chat_prompt(ChatTemplate::ChatML, {{"user", "Q?"}}), "A");
  EXPECT_EQ(c, join({{start},
                     tok->encode("user\nQ?"),
                     {end},
                     tok->encode("\n"),
                     {start},
                     tok->encode("assistant")}));
  EXPECT_EQ(n, tok->encode("\nA"));
  // A last piece of whitespace alone goes whole, and the piece before it
  // (a marker) stays.
  const SegmentedDocument spaced{{"<|im_start|>", false, true}, {" \n", false, false}};
  std::tie(c, n) = encode_chat_context_and_continuation(*tok, spaced, "B");
  EXPECT_EQ(c, std::vector<int32_t>{start});
  EXPECT_EQ(n, tok->encode(" \nB"));
}

// The conversation a chat model is asked a multiple-choice question in:
// the heading (the task's description) a system message, after
// --system_instruction's text; the examples one user turn with the
// question, or a user turn and the right answer each.
TEST(ChoiceQuestions, ChatsAreTheHarnesss) {
  auto q = read(R"({"question": "Test?", "subject": "law", "choices": ["x", "y"], "answer": 0})");
  add_examples(q, read(kMmluDev), 2, " ", false, "test.jsonl");
  EXPECT_EQ(q[0].example_turns.size(), 2u);
  const auto flat = [](const std::vector<ChatMessage>& m) {
    std::string s;
    for (const auto& x : m) s += "[" + x.role + "]" + x.content;
    return s;
  };
  const std::string heading =
      "The following are multiple choice questions (with answers) about law.\n\n";
  const std::string dev1 = "Dev 1?\nA. a\nB. b\nAnswer:", dev3 = "Dev 3?\nA. e\nB. f\nAnswer:",
                    test = "Test?\nA. x\nB. y\nAnswer:";
  EXPECT_EQ(flat(choice_chat(q[0], false, "", "t")),
            "[system]" + heading + "[user]" + dev1 + " B\n\n" + dev3 + " A\n\n" + test);
  EXPECT_EQ(flat(choice_chat(q[0], true, "Think.", "t")),
            "[system]Think.\n\n" + heading + "[user]" + dev1 + "[assistant]B[user]" + dev3 +
                "[assistant]A[user]" + test);
  // No heading, no system message; zero-shot, the context alone.
  auto plain = read(R"({"context": "1+1=", "choices": ["2", "3"], "answer": 0})");
  EXPECT_EQ(flat(choice_chat(plain[0], true, "", "t")), "[user]1+1=");
  EXPECT_EQ(flat(choice_chat(plain[0], false, "S", "t")), "[system]S[user]1+1=");
  const auto wino =
      read(R"({"sentence": "A _ barks.", "option1": "cat", "option2": "dog", "answer": "2"})");
  expect_error([&] { choice_chat(wino[0], false, "", "w.jsonl"); },
               {"w.jsonl: a question with a context per choice (WinoGrande's) is not asked"});
}

TEST(ChoiceQuestions, CharactersAreCodePoints) {
  EXPECT_EQ(utf8_characters(""), 0);
  EXPECT_EQ(utf8_characters("Paris"), 5);
  EXPECT_EQ(utf8_characters("h\xC3\xA9llo"), 5);              // héllo: 6 bytes
  EXPECT_EQ(utf8_characters("\xE6\x97\xA5\xE6\x9C\xAC"), 2);  // 日本
  EXPECT_EQ(utf8_characters("\xF0\x9F\x98\x80!"), 2);         // an emoji and !
}

// Words as Python's len(re.split(r"\s+", text)) counts them: white space
// at either end adds an empty word, any run of it (Unicode's too) one cut.
TEST(ChoiceQuestions, WordsAreCountedAsReSplitCountsThem) {
  EXPECT_EQ(count_words("a b"), 2);
  EXPECT_EQ(count_words(" a  b\n"), 4);  // ['', 'a', 'b', '']
  EXPECT_EQ(count_words(""), 1);
  EXPECT_EQ(count_words("\xC2\xA0x\tyz \xE3\x80\x80 w"), 4);  // NBSP, tab, ideographic space
  EXPECT_EQ(count_words("caf\xC3\xA9"), 1);                   // é is no space
}

}  // namespace
}  // namespace triad::data
