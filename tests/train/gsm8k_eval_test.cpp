#include "triad/train/gsm8k_eval.h"

#include <gtest/gtest.h>

#include <memory>

#include "support/expect_error.h"
#include "triad/autograd/grad_mode.h"
#include "triad/ops.h"

namespace triad::train {
namespace {

using testing::expect_error;

// A byte-level model that writes `byte` whatever it reads: ln_f's weight
// zero leaves its bias, one-hot, as every final hidden state, and that
// picks out the one token whose tied embedding holds 1 there.
std::unique_ptr<nn::Gpt> constant_model(int64_t byte, int64_t seq_len = 128) {
  nn::GptConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 16;
  c.vocab_size = 256;
  c.seq_len = seq_len;
  auto model = std::make_unique<nn::Gpt>(c, 7);
  autograd::NoGradGuard no_grad;
  for (auto& [name, p] : model->named_parameters()) {
    if (name == "ln_f.weight") copy_(p, zeros({16}));
    if (name == "ln_f.bias") {
      std::vector<float> e(16, 0.0f);
      e[0] = 1;
      copy_(p, from_vector(e, {16}));
    }
    if (name == "wte.weight") {
      std::vector<float> w = to_float_vector(p);
      for (int64_t v = 0; v < 256; ++v) w[static_cast<size_t>(v * 16)] = v == byte ? 1.0f : 0.0f;
      copy_(p, from_vector(w, {256, 16}));
    }
  }
  return model;
}

const std::vector<data::MathProblem> kProblems{
    {"Tom has 3 apples and buys 4. How many?", "3 + 4 = 7\n#### 7"},
    {"A pen costs $2. What do 5 cost?", "#### 10"},
    {"Sam had 10 sweets and ate 3. How many are left?", "#### 7"}};

std::vector<std::string> prompts(const std::vector<data::MathProblem>& problems) {
  std::vector<std::string> out;
  for (const auto& p : problems) out.push_back(data::math_prompt(p, {}));
  return out;
}

TEST(Gsm8kEval, RepliesAreGeneratedCutAndScored) {
  const auto model = constant_model('7');
  const data::ByteTokenizer tok;
  Gsm8kOptions o;
  o.gen_tokens = 1;
  o.batch = 2;
  int calls = 0;
  const Gsm8kResult one =
      answer_gsm8k(*model, tok, kProblems, prompts(kProblems), o, [&](const Gsm8kResult& so_far) {
        ++calls;
        EXPECT_EQ(so_far.replies.size(), calls == 1 ? 2u : 3u);
      });
  EXPECT_EQ(calls, 2);  // after each batch
  ASSERT_EQ(one.replies.size(), 3u);
  for (const auto& r : one.replies) {
    EXPECT_EQ(r.reply, "7");
    EXPECT_EQ(r.flexible, "7");
    EXPECT_EQ(r.strict, data::kInvalidAnswer);
    EXPECT_EQ(r.tokens, 1);
  }
  EXPECT_TRUE(one.replies[0].flexible_right);
  EXPECT_FALSE(one.replies[1].flexible_right);
  EXPECT_TRUE(one.replies[2].flexible_right);
  EXPECT_DOUBLE_EQ(one.exact_match_flexible(), 2.0 / 3);
  EXPECT_DOUBLE_EQ(one.exact_match_strict(), 0.0);
  EXPECT_EQ(one.generated_tokens(), 3);
  EXPECT_EQ(one.truncated, 0);

  // Four tokens write "7777", which is no answer here.
  o.gen_tokens = 4;
  const Gsm8kResult four = answer_gsm8k(*model, tok, kProblems, prompts(kProblems), o);
  EXPECT_EQ(four.replies[0].reply, "7777");
  EXPECT_DOUBLE_EQ(four.exact_match_flexible(), 0.0);
  EXPECT_EQ(four.generated_tokens(), 12);

  // A stop string ends the reply as soon as the text holds it, and is cut.
  o.gen_tokens = 20;
  o.stops = {"777"};
  const Gsm8kResult stopped = answer_gsm8k(*model, tok, kProblems, prompts(kProblems), o);
  for (const auto& r : stopped.replies) {
    EXPECT_EQ(r.tokens, 3);
    EXPECT_EQ(r.reply, "");
  }
  // So does the end-of-document token, which the reply leaves out.
  o.stops = {};
  o.eod_token = '7';
  const Gsm8kResult eod = answer_gsm8k(*model, tok, kProblems, prompts(kProblems), o);
  for (const auto& r : eod.replies) {
    EXPECT_EQ(r.tokens, 1);
    EXPECT_EQ(r.reply, "");
  }
}

// Prompts given as tokens (a chat template's) are read as they stand, no
// beginning token put first; options.stop_tokens end a reply as the end of
// a document does.
TEST(Gsm8kEval, TokenizedPromptsAndMoreStopTokens) {
  const auto model = constant_model('7', /*seq_len=*/32);
  const data::ByteTokenizer tok;
  Gsm8kOptions o;
  o.gen_tokens = 2;
  o.bos = {1};
  std::vector<std::vector<int64_t>> ids;
  for (const std::string& p : prompts({kProblems[1]})) {
    ids.emplace_back(p.end() - 20, p.end());  // 20 tokens: no room lost, none put first
  }
  const std::vector<data::MathProblem> problem{{"Short?", "#### 77"}};
  const Gsm8kResult r = answer_gsm8k(*model, tok, problem, ids, o);
  EXPECT_EQ(r.truncated, 0);
  EXPECT_EQ(r.replies[0].reply, "77");
  EXPECT_TRUE(r.replies[0].flexible_right);
  o.stop_tokens = {-1, '7'};
  const Gsm8kResult stopped = answer_gsm8k(*model, tok, problem, ids, o);
  EXPECT_EQ(stopped.replies[0].reply, "");
  EXPECT_EQ(stopped.replies[0].tokens, 1);
  ids.front().insert(ids.front().begin(), 11, 'x');  // 31 tokens: the first 1 cut
  EXPECT_EQ(answer_gsm8k(*model, tok, problem, ids, o).truncated, 1);
  expect_error([&] { answer_gsm8k(*model, tok, kProblems, ids, o); }, {"1 prompts for 3 problems"});
}

TEST(Gsm8kEval, LongPromptsKeepTheirLastTokens) {
  const auto model = constant_model('7', /*seq_len=*/32);
  const data::ByteTokenizer tok;
  Gsm8kOptions o;
  o.gen_tokens = 2;
  o.bos = {1};
  const std::vector<data::MathProblem> problems{kProblems[0], {"Short?", "#### 77"}};
  // The first prompt (57 tokens with the beginning one) keeps its last 30; the
  // second (25) fits.
  const Gsm8kResult r = answer_gsm8k(*model, tok, problems, prompts(problems), o);
  EXPECT_EQ(r.truncated, 1);
  EXPECT_EQ(r.replies[1].reply, "77");
  EXPECT_TRUE(r.replies[1].flexible_right);
}

TEST(Gsm8kEval, BadOptionsAreNamed) {
  const auto model = constant_model('7', 32);
  const data::ByteTokenizer tok;
  Gsm8kOptions o;
  o.gen_tokens = 32;
  expect_error([&] { answer_gsm8k(*model, tok, kProblems, prompts(kProblems), o); },
               {"gen_tokens 32 must be in [1, the model's seq_len (32))"});
  o.gen_tokens = 0;
  expect_error([&] { answer_gsm8k(*model, tok, kProblems, prompts(kProblems), o); },
               {"gen_tokens 0"});
  o.gen_tokens = 4;
  o.batch = 0;
  expect_error([&] { answer_gsm8k(*model, tok, kProblems, prompts(kProblems), o); },
               {"batch 0 must be >= 1"});
  o.batch = 1;
  expect_error([&] { answer_gsm8k(*model, tok, kProblems, {"one"}, o); },
               {"1 prompts for 3 problems"});
}

}  // namespace
}  // namespace triad::train
