#include "triad/train/choice_eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <tuple>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "triad/ops.h"

namespace triad::train {
namespace {

using testing::expect_error;
using testing::TempDir;

std::vector<int64_t> choice_ints(const Tensor& t) {
  std::vector<int64_t> out;
  for (const double v : to_double_vector(t)) out.push_back(static_cast<int64_t>(v));
  return out;
}

TEST(ChoiceBatches, RowsHoldTheRequestCutToTheWindowLongestFirstAndScoreTheContinuation) {
  TokenizedQuestion q;
  q.choices = {{{1, 2, 3}, {4, 5}},                            // row 0: 4 inputs
               {{11, 12, 13, 14, 15, 16, 17, 18}, {19, 20}}};  // row 1: 9 cut to 6
  q.chars = {2, 2};
  TokenizedQuestion r;
  r.choices = {{{7}, {8}}, {{6, 6}, {5}}};  // rows 2 (1 input) and 3 (2)
  r.chars = {1, 1};
  // Seq_len 6, two rows a batch, widths in multiples of 4: rows 1 and 0
  // (6 wide), then 3 and 2 (2 inputs, 4 wide).
  const RequestRows rows = choice_batches({q, r}, 6, 2, 99, 4);
  EXPECT_EQ(rows.order, (std::vector<size_t>{1, 0, 3, 2}));
  ASSERT_EQ(rows.batches.size(), 2u);
  EXPECT_EQ(rows.batches[0].inputs.shape(), (Shape{2, 6}));
  EXPECT_EQ(choice_ints(rows.batches[0].inputs),
            (std::vector<int64_t>{14, 15, 16, 17, 18, 19, 1, 2, 3, 4, 99, 99}));
  EXPECT_EQ(choice_ints(rows.batches[0].targets),
            (std::vector<int64_t>{-100, -100, -100, -100, 19, 20, -100, -100, 4, 5, -100, -100}));
  EXPECT_EQ(rows.batches[1].inputs.shape(), (Shape{2, 4}));
  EXPECT_EQ(choice_ints(rows.batches[1].inputs),
            (std::vector<int64_t>{6, 6, 99, 99, 7, 99, 99, 99}));
  EXPECT_EQ(choice_ints(rows.batches[1].targets),
            (std::vector<int64_t>{-100, 5, -100, -100, 8, -100, -100, -100}));
  // Three rows a batch: the last batch is filled with a row that scores
  // nothing; width multiples past seq_len stop at it.
  const RequestRows three = choice_batches({q, r}, 6, 3, 0, 5);
  ASSERT_EQ(three.batches.size(), 2u);
  EXPECT_EQ(three.batches[0].inputs.shape(), (Shape{3, 6}));
  EXPECT_EQ(three.batches[1].inputs.shape(), (Shape{3, 5}));
  EXPECT_EQ(choice_ints(three.batches[1].targets),
            (std::vector<int64_t>{8, -100, -100, -100, -100, -100, -100, -100, -100, -100, -100,
                                  -100, -100, -100, -100}));
  expect_error([&] { choice_batches({q}, 6, 0, 0); }, {"request_batches: rows (0) must be >= 1"});
  expect_error([&] { choice_batches({q}, 6, 2, 0, 0); },
               {"request_batches: width_multiple (0) and short_multiple (1) must be >= 1"});
}

// A longrope model's rows (short_rows: its original context of 3): rows of
// at most 3 inputs never share a batch with longer ones, and their batch is
// at most 3 wide even where width_multiple would round it past; a group's
// last batch is filled, its filler rows marked in order.
TEST(ChoiceBatches, RowsWithinTheOriginalContextAreBatchedApart) {
  TokenizedQuestion q;
  q.choices = {{{1, 2, 3}, {4, 5}},  // 4 inputs
               {{1}, {2, 3}},        // 2
               {{6, 7, 8, 9}, {1}},  // 4
               {{5, 5}, {6}}};       // 2
  q.chars = {1, 1, 1, 1};
  const RequestRows rows = choice_batches({q}, 8, 3, 0, 4, 3);
  constexpr size_t F = RequestRows::kFiller;
  EXPECT_EQ(rows.order, (std::vector<size_t>{0, 2, F, 1, 3, F}));
  ASSERT_EQ(rows.batches.size(), 2u);
  EXPECT_EQ(rows.batches[0].inputs.shape(), (Shape{3, 4}));
  EXPECT_EQ(rows.batches[1].inputs.shape(), (Shape{3, 2}));  // not 4: the original context is 3
  EXPECT_EQ(choice_ints(rows.batches[1].inputs), (std::vector<int64_t>{1, 2, 5, 5, 0, 0}));
  // Sequence parallelism over 3 ranks: the short batch widened to 3, no further.
  EXPECT_EQ(choice_batches({q}, 8, 3, 0, 4, 3, 3).batches[1].inputs.shape(), (Shape{3, 3}));
  // Without the limit the four rows share batches by length alone.
  EXPECT_EQ(choice_batches({q}, 8, 3, 0, 4).order, (std::vector<size_t>{0, 2, 1, 3, F, F}));
}

TEST(TallyChoices, EachNormalisationCountsItsRightPicks) {
  // Question 0: choices of 1 and 4 tokens, means 3 and 1 (totals 3 and 4):
  // the total picks 0, per token picks 1; per character (1 and 10
  // characters: 3 and 0.4) picks 1. Answer 1. Question 1: one choice
  // clearly best. Answer 0.
  TokenizedQuestion a, b;
  a.choices = {{{1}, {2}}, {{1}, {2, 3, 4, 5}}};
  a.chars = {1, 10};
  a.answer = 1;
  b.choices = {{{1}, {2, 3}}, {{1}, {3}}};
  b.chars = {2, 1};
  b.answer = 0;
  const ChoiceTally t = tally_choices({a, b}, {3.0, 1.0, 0.5, 2.0, 123.0 /* a filler row */});
  EXPECT_EQ(t.questions, 2);
  EXPECT_EQ(t.right, 1);                      // b only
  EXPECT_EQ(t.right_norm, 2);                 // a and b
  EXPECT_EQ(t.right_per_token, 2);            // a and b
  EXPECT_DOUBLE_EQ(t.answer_nll, 4.0 + 1.0);  // a's choice 1 (4 tokens at 1), b's choice 0
  EXPECT_DOUBLE_EQ(t.answer_tokens, 4 + 2);
  const ChoiceTally back = ChoiceTally::from_vector(t.to_vector());
  EXPECT_EQ(back.right_norm, t.right_norm);
  EXPECT_EQ(back.answer_tokens, t.answer_tokens);
  expect_error([&] { tally_choices({a, b}, {1.0, 2.0, 3.0}); }, {"3 row losses"});
}

// TruthfulQA's mc2 set: scored after the question's choices, its MC2 the
// true answers' share of exp(-total) (nn::true_probability_share), summed
// over the questions that have one.
TEST(TallyChoices, TheMc2SetsShareIsSummed) {
  TokenizedQuestion a, plain;
  a.choices = {{{1}, {2}}, {{1}, {3}}};
  a.chars = {1, 1};
  a.mc2 = {{{1}, {4}}, {{1}, {5, 6}}, {{1}, {7}}};  // 1, 2 and 1 tokens
  a.mc2_true = 2;
  plain.choices = {{{1}, {2}}, {{1}, {3}}};
  plain.chars = {1, 1};
  EXPECT_EQ(question_requests({a, plain}).size(), 7u);
  EXPECT_EQ(question_requests({a, plain})[3].continuation, (std::vector<int64_t>{5, 6}));
  // Means: a's choices 1 and 2, its mc2 set 1, 0.5 (total 1) and 3; plain's 2, 1.
  const ChoiceTally t = tally_choices({a, plain}, {1.0, 2.0, 1.0, 0.5, 3.0, 2.0, 1.0});
  const double e1 = std::exp(-1.0), e3 = std::exp(-3.0);
  EXPECT_NEAR(t.mc2, (e1 + e1) / (e1 + e1 + e3), 1e-12);
  EXPECT_EQ(t.mc2_questions, 1);
  EXPECT_EQ(t.right, 1);  // a picks 0 (its answer), plain picks 1
  const ChoiceTally back = ChoiceTally::from_vector(t.to_vector());
  EXPECT_EQ(back.mc2, t.mc2);
  EXPECT_EQ(back.mc2_questions, 1);
  expect_error([&] { ChoiceTally::from_vector({1, 2, 3, 4, 5, 6}); }, {"6 values, expected 8"});
}

Config with_questions(const TempDir& dir, const std::string& lines, int64_t vocab = 256) {
  std::ofstream(dir.file("q.jsonl")) << lines;
  Config c = parse_config(
      "model: {n_layer: 1, n_head: 2, d_model: 8, vocab_size: " + std::to_string(vocab) +
      ", seq_len: 8}\n"
      "train: {steps: 1, global_batch_size: 2, micro_batch_size: 2, lr: 1.0e-3}\n"
      "data: {train: x.bin}\n");
  c.eval.choices = {{"", dir.file("q.jsonl")}};
  return c;
}

// The config's first set, part `part` of `parts`.
std::vector<TokenizedQuestion> load_choices(const Config& c, int part, int parts,
                                            int64_t* total = nullptr) {
  return load_choice_questions(c, c.eval.choices.front(), part, parts, total);
}

TEST(LoadChoiceQuestions, EachDataParallelRankTokenizesItsShare) {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 5; ++i) {
    lines += R"({"context": "q)" + std::to_string(i) +
             R"( is", "choices": ["a", "bc"], "answer": )" + std::to_string(i % 2) + "}\n";
  }
  const Config c = with_questions(dir, lines);
  int64_t total = 0;
  const auto first = load_choices(c, 0, 2, &total);
  const auto second = load_choices(c, 1, 2);
  EXPECT_EQ(total, 5);
  ASSERT_EQ(first.size(), 3u);   // questions 0, 2, 4
  ASSERT_EQ(second.size(), 2u);  // 1, 3
  EXPECT_EQ(first[1].choices[0].context, (std::vector<int64_t>{'q', '2', ' ', 'i', 's'}));
  EXPECT_EQ(first[1].choices[1].continuation, (std::vector<int64_t>{' ', 'b', 'c'}));
  EXPECT_EQ(first[1].chars, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(second[0].answer, 1);
  Config limited = c;
  limited.eval.choices_limit = 3;
  EXPECT_EQ(load_choices(limited, 0, 1, &total).size(), 3u);
  EXPECT_EQ(total, 3);
  // Few-shot: the file's first other questions, solved, before each.
  Config shots = c;
  shots.eval.choices_fewshot = 2;
  const auto shown = load_choices(shots, 1, 2);  // questions 1 and 3
  const std::string want = "q0 is a\n\nq1 is bc\n\nq3 is";
  EXPECT_EQ(shown[1].choices[0].context, std::vector<int64_t>(want.begin(), want.end()));
  // Drawn as lm-evaluation-harness draws them (random.Random(1234), 3
  // drawn per question, its own dropped: question 1 [0, 4, 2], question 3
  // [1, 0, 3]), the same whichever rank reads the question.
  Config drawn = shots;
  drawn.eval.choices_fewshot_seed = 1234;
  for (const auto& [part, parts, index] : {std::tuple{1, 2, 0}, std::tuple{0, 1, 1}}) {
    const auto d = load_choices(drawn, part, parts);
    const std::string q1 = "q0 is a\n\nq4 is a\n\nq1 is";
    EXPECT_EQ(d[static_cast<size_t>(index)].choices[0].context,
              std::vector<int64_t>(q1.begin(), q1.end()));
  }
  const std::string q3 = "q1 is bc\n\nq0 is a\n\nq3 is";
  EXPECT_EQ(load_choices(drawn, 1, 2)[1].choices[0].context,
            std::vector<int64_t>(q3.begin(), q3.end()));
  shots.eval.choices_fewshot = 5;
  expect_error([&] { load_choices(shots, 0, 1); },
               {"eval.choices: '", "question 1 has 4 example(s) to show, 5 asked"});
  drawn.eval.choices_fewshot = 5;
  expect_error([&] { load_choices(drawn, 0, 1); },
               {"eval.choices: '", "question 1 draws 6", "from 5"});
}

// TruthfulQA's lines: mc1's choices as the question's, mc2's after the
// same context (the QA prompt and the question) as its mc2 set.
TEST(LoadChoiceQuestions, TruthfulQasMc2SetFollowsTheSameContext) {
  TempDir dir;
  const Config c = with_questions(
      dir, R"({"question": "Q?", "mc1_targets": {"choices": ["No.", "Yes."], "labels": [1, 0]},)"
           R"( "mc2_targets": {"choices": ["No.", "Nope.", "Yes."], "labels": [1, 1, 0]}})"
           "\n");
  const auto q = load_choices(c, 0, 1);
  ASSERT_EQ(q.size(), 1u);
  ASSERT_EQ(q[0].choices.size(), 2u);
  ASSERT_EQ(q[0].mc2.size(), 3u);
  EXPECT_EQ(q[0].mc2_true, 2);
  EXPECT_EQ(q[0].chars, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(q[0].mc2[0].context, q[0].choices[0].context);
  EXPECT_EQ(q[0].mc2[1].continuation, (std::vector<int64_t>{' ', 'N', 'o', 'p', 'e', '.'}));
}

TEST(LoadChoiceQuestions, ErrorsNameTheKeyAndTheQuestion) {
  TempDir dir;
  const std::string ok = R"({"context": "a", "choices": ["b", "c"], "answer": 0})"
                         "\n";
  expect_error([&] { load_choices(with_questions(dir, ok, 100), 0, 1); },
               {"eval.choices: the tokenizer has 256 tokens, more than model.vocab_size 100"});
  expect_error(
      [&] {
        load_choices(
            with_questions(dir, ok + R"({"context": "  ", "choices": ["b", "c"], "answer": 0})"), 0,
            1);
      },
      {"question 2 has an empty context: set eval.bos_token"});
  expect_error(
      [&] {
        load_choices(
            with_questions(dir, R"({"context": "a", "choices": ["12345678", "c"], "answer": 0})"),
            0, 1);
      },
      {"question 1 has a choice of 9 tokens, more than model.seq_len 8"});
  expect_error([&] { load_choices(with_questions(dir, "{\n"), 0, 1); },
               {"eval.choices: '", "line 1 does not parse"});
  Config bos = with_questions(dir, ok);
  bos.eval.bos_token = "<s>";
  expect_error([&] { load_choices(bos, 0, 1); }, {"eval.bos_token '<s>'"});
  Config named = with_questions(dir, "{\n");
  named.eval.choices.front().name = "hella";
  expect_error([&] { load_choices(named, 0, 1); },
               {"eval.choices.hella: '", "line 1 does not parse"});
  Config tokenizer = with_questions(dir, ok);
  tokenizer.eval.tokenizer = dir.file("no_such_tokenizer");
  expect_error([&] { load_choices(tokenizer, 0, 1); }, {"eval.tokenizer: "});
}

}  // namespace
}  // namespace triad::train
