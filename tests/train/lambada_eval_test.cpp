#include "triad/train/lambada_eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "support/expect_error.h"
#include "support/temp_dir.h"

namespace triad::train {
namespace {

using testing::expect_error;
using testing::TempDir;

Config with_texts(const TempDir& dir, const std::string& lines, int64_t seq_len = 16) {
  std::ofstream(dir.file("l.jsonl")) << lines;
  Config c =
      parse_config("model: {n_layer: 1, n_head: 2, d_model: 8, vocab_size: 256, seq_len: " +
                   std::to_string(seq_len) +
                   "}\n"
                   "train: {steps: 1, global_batch_size: 2, micro_batch_size: 2, lr: 1.0e-3}\n"
                   "data: {train: x.bin}\n");
  c.eval.lambada = {{"", dir.file("l.jsonl")}};
  return c;
}

TEST(LoadLambadaTexts, EachDataParallelRankTokenizesItsShareOfTheLastWords) {
  TempDir dir;
  const Config c = with_texts(dir,
                              "{\"text\": \"a b\"}\n{\"text\": \"cd  ef\"}\n"
                              "{\"text\": \"x yz\"}\n{\"text\": \"p q\"}\n{\"text\": \"g h\"}\n");
  int64_t total = 0;
  const auto first = load_lambada_texts(c, c.eval.lambada.front(), 0, 2, &total);
  const auto second = load_lambada_texts(c, c.eval.lambada.front(), 1, 2);
  EXPECT_EQ(total, 5);
  ASSERT_EQ(first.size(), 3u);   // texts 1, 3, 5
  ASSERT_EQ(second.size(), 2u);  // 2, 4
  EXPECT_EQ(first[1].context, (std::vector<int64_t>{'x'}));
  EXPECT_EQ(first[1].continuation, (std::vector<int64_t>{' ', 'y', 'z'}));
  // Cut at the last space; the space before it stays in the context's text
  // and moves to the word (lm-evaluation-harness's rule).
  EXPECT_EQ(second[0].context, (std::vector<int64_t>{'c', 'd'}));
  EXPECT_EQ(second[0].continuation, (std::vector<int64_t>{' ', ' ', 'e', 'f'}));
  // The limit counts texts before the split.
  Config limited = c;
  limited.eval.lambada_limit = 2;
  EXPECT_EQ(load_lambada_texts(limited, limited.eval.lambada.front(), 0, 1, &total).size(), 2u);
  EXPECT_EQ(total, 2);
  // A rank with no texts is fine (more ranks than texts).
  EXPECT_TRUE(load_lambada_texts(limited, limited.eval.lambada.front(), 3, 4).empty());
}

TEST(LoadLambadaTexts, NameTheSetAndTheText) {
  TempDir dir;
  expect_error(
      [&] {
        const Config c = with_texts(dir, "{\"text\": \"a bcdefgh\"}\n", 4);
        load_lambada_texts(c, c.eval.lambada.front(), 0, 1);
      },
      {"eval.lambada '" + dir.file("l.jsonl") +
       "': text 1 ends in a word of 8 tokens, more than model.seq_len 4"});
  expect_error(
      [&] {
        Config c = with_texts(dir, "{\"text\": \"a b\"}\n{\"nope\": 1}\n");
        c.eval.lambada = {{"de", dir.file("l.jsonl")}};
        load_lambada_texts(c, c.eval.lambada.front(), 0, 1);
      },
      {"eval.lambada.de: ", "line 2"});
  expect_error(
      [&] {
        const Config c = with_texts(dir, "{\"text\": \"a b\"}\n");
        Config missing = c;
        missing.eval.lambada = {{"", dir.file("none.jsonl")}};
        load_lambada_texts(missing, missing.eval.lambada.front(), 0, 1);
      },
      {"eval.lambada: ", "none.jsonl"});
}

TEST(LambadaTally, CountsTheRightWordsAndTheirPerplexity) {
  const std::vector<nn::ContinuationRequest> texts = {
      {{1}, {2, 3}}, {{1}, {4}}, {{5, 6}, {7, 8, 9}}};
  // Mean losses per token 1.5, 0.5, 2 -> words' -log p 3, 0.5, 6.
  const LambadaTally t =
      tally_lambada(texts, {1.5, 0.5, 2.0, 99.0 /* a filler row */}, {true, false, true, true});
  EXPECT_EQ(t.texts, 3);
  EXPECT_EQ(t.right, 2);
  EXPECT_DOUBLE_EQ(t.nll, 9.5);
  EXPECT_DOUBLE_EQ(t.accuracy(), 2.0 / 3);
  EXPECT_DOUBLE_EQ(t.mean_nll(), 9.5 / 3);
  EXPECT_DOUBLE_EQ(t.perplexity(), std::exp(9.5 / 3));
  const LambadaTally back = LambadaTally::from_vector(t.to_vector());
  EXPECT_EQ(back.right, t.right);
  EXPECT_EQ(back.nll, t.nll);
  EXPECT_EQ(LambadaTally{}.perplexity(), 0);
  expect_error(
      [&] {
        tally_lambada(texts, {1.0, 2.0}, {true, true, true});
      },
      {"tally_lambada: 3 texts but 2 row losses and 3 greedy flags"});
  expect_error([] { LambadaTally::from_vector({1, 2}); }, {"2 values, expected 3"});
}

}  // namespace
}  // namespace triad::train
