#include "triad/nn/evaluate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "support/expect_error.h"
#include "support/tiny_deepseek.h"
#include "triad/autograd/grad_mode.h"
#include "triad/core/rng.h"
#include "triad/nn/generate.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

using testing::expect_error;

GptConfig eval_tiny() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.vocab_size = 37;
  c.seq_len = 12;
  return c;
}

std::vector<int64_t> random_tokens(int64_t n, uint64_t seed, int64_t vocab) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(static_cast<int64_t>(philox_uniform(seed, 3, static_cast<uint64_t>(i)) *
                                       static_cast<double>(vocab)));
  }
  return out;
}

// The continuation's -log p by hand: the model's logits over the request's
// last seq_len + 1 tokens (less the final one), a log-softmax in double.
double reference_nll(const Gpt& model, const ContinuationRequest& q) {
  autograd::NoGradGuard no_grad;
  std::vector<int64_t> all = q.context;
  all.insert(all.end(), q.continuation.begin(), q.continuation.end());
  const int64_t T = model.config().seq_len, V = model.config().vocab_size;
  if (static_cast<int64_t>(all.size()) > T + 1) all.erase(all.begin(), all.end() - (T + 1));
  const auto L = static_cast<int64_t>(all.size()) - 1;
  const std::vector<double> logits = to_double_vector(
      model.forward(from_vector(std::vector<int64_t>(all.begin(), all.end() - 1), {1, L})));
  double nll = 0;
  const auto n = static_cast<int64_t>(q.continuation.size());
  for (int64_t t = L - n; t < L; ++t) {
    const double* row = logits.data() + t * V;
    double top = row[0];
    for (int64_t v = 1; v < V; ++v) top = std::max(top, row[v]);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - top);
    nll -= row[all[t + 1]] - top - std::log(z);
  }
  return nll;
}

std::vector<ContinuationRequest> some_requests(int64_t vocab) {
  std::vector<ContinuationRequest> out;
  uint64_t seed = 1;
  // (context, continuation) lengths: short, long, one of each, and three
  // that do not fit the window of 12 (the context loses its first tokens).
  for (const auto& [c, n] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {3, 5}, {7, 2}, {1, 12}, {10, 3}, {20, 4}, {2, 11}, {30, 12}}) {
    out.push_back({random_tokens(c, seed, vocab), random_tokens(n, seed + 100, vocab)});
    ++seed;
  }
  return out;
}

TEST(ScoreContinuations, AreTheLogSoftmaxOfTheModelsLogitsWhateverTheBatch) {
  const Gpt model(eval_tiny(), 5);
  const auto requests = some_requests(eval_tiny().vocab_size);
  const auto one = score_continuations(model, requests, 1);
  const auto three = score_continuations(model, requests, 3);
  const auto all = score_continuations(model, requests, 100);
  ASSERT_EQ(one.size(), requests.size());
  for (size_t r = 0; r < requests.size(); ++r) {
    SCOPED_TRACE(r);
    const double want = reference_nll(model, requests[r]);
    EXPECT_GT(want, 0);
    EXPECT_NEAR(one[r].nll, want, 1e-4 * want);
    EXPECT_EQ(one[r].tokens, static_cast<int64_t>(requests[r].continuation.size()));
    // Rows padded to another request's length score the same.
    EXPECT_NEAR(three[r].nll, one[r].nll, 1e-5 * want);
    EXPECT_NEAR(all[r].nll, one[r].nll, 1e-5 * want);
    EXPECT_EQ(all[r].tokens, one[r].tokens);
  }
  // A context cut to the window scores as the context it was cut to.
  ContinuationRequest cut = requests[5];  // 20 + 4: the last 13 are read
  cut.context.erase(cut.context.begin(), cut.context.end() - 9);
  EXPECT_NEAR(score_continuations(model, {cut})[0].nll, one[5].nll, 1e-5 * one[5].nll);
  ContinuationRequest less = cut;
  less.context.erase(less.context.begin());  // one token less is another score
  EXPECT_GT(std::abs(score_continuations(model, {less})[0].nll - one[5].nll), 1e-4);
}

// Multiple-choice requests: a context shared by several continuations runs
// once (left-padded beside other questions' contexts, its key/value cache
// copied for each continuation, which decode together); every score is
// still the log-softmax of the model's logits, for learned and rotary
// positions, grouped heads under a sliding window, latent attention (its
// cache of latents copied and read in the absorbed form), batches of any
// size, single-token continuations, and a question too long for the window
// (scored row by row, its context cut).
TEST(ScoreContinuations, ShareAContextAmongItsContinuations) {
  GptConfig rotary = eval_tiny();
  rotary.position_embedding = PositionEmbedding::Rotary;
  rotary.n_kv_head = 1;
  rotary.sliding_window = 5;
  GptConfig latent = eval_tiny();
  latent.position_embedding = PositionEmbedding::Rotary;
  latent.normalization = Normalization::RmsNorm;
  latent.mla = testing::tiny_latent_attention();
  latent.validate();
  for (const GptConfig& cfg : {eval_tiny(), rotary, latent}) {
    const Gpt model(cfg, 7);
    std::vector<ContinuationRequest> requests;
    uint64_t seed = 40;
    // (context length, continuation lengths): the last question does not
    // fit the window of 12 with its longest choice.
    for (const auto& [c, ns] : std::vector<std::pair<int64_t, std::vector<int64_t>>>{
             {3, {2, 4, 1, 3}}, {6, {1, 1}}, {1, {5, 2, 3}}, {8, {3, 4}}, {9, {2, 6}}}) {
      const std::vector<int64_t> context = random_tokens(c, seed++, cfg.vocab_size);
      for (int64_t n : ns) requests.push_back({context, random_tokens(n, seed++, cfg.vocab_size)});
    }
    requests.push_back({random_tokens(4, 99, cfg.vocab_size), {5, 6}});  // a context of its own
    for (int64_t batch : {1, 3, 100}) {
      const auto scores = score_continuations(model, requests, batch);
      ASSERT_EQ(scores.size(), requests.size());
      for (size_t r = 0; r < requests.size(); ++r) {
        SCOPED_TRACE("batch " + std::to_string(batch) + ", request " + std::to_string(r));
        const double want = reference_nll(model, requests[r]);
        EXPECT_NEAR(scores[r].nll, want, 1e-4 * want);
        EXPECT_EQ(scores[r].tokens, static_cast<int64_t>(requests[r].continuation.size()));
      }
    }
  }
}

// Few-shot questions: contexts that begin with the same examples are a
// family whose beginning runs through the model once (its keys and values
// copied into each batch's rows); every score is still the model's, for
// learned and rotary positions (under a window too), in any batch, with a
// question whose own text is longer than the examples (rows that take
// nothing of the beginning beside it), next to a second family, a question
// of no family and a request alone. Fewer positions run than the contexts
// hold.
TEST(ScoreContinuations, ReadAFewShotBeginningOnceForAllItsQuestions) {
  GptConfig learned = eval_tiny();
  learned.seq_len = 64;
  GptConfig rotary = learned;
  rotary.position_embedding = PositionEmbedding::Rotary;
  rotary.n_kv_head = 1;
  rotary.sliding_window = 20;
  for (const GptConfig& cfg : {learned, rotary}) {
    const Gpt model(cfg, 11);
    const int64_t V = cfg.vocab_size;
    std::vector<ContinuationRequest> requests;
    int64_t context_positions = 0;
    uint64_t seed = 800;
    // (examples, question lengths): each question's first token its own.
    const std::vector<int64_t> five_shot = random_tokens(24, 500, V);
    const std::vector<int64_t> other = random_tokens(20, 600, V);
    for (const auto& [examples, lengths] :
         std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
             {five_shot, {3, 7, 1, 30, 5}}, {other, {4, 2}}, {{}, {6}}}) {
      int64_t first_token = 0;
      for (const int64_t n : lengths) {
        std::vector<int64_t> context = examples;
        std::vector<int64_t> question = random_tokens(n, seed++, V);
        question.front() = first_token++;
        context.insert(context.end(), question.begin(), question.end());
        for (const int64_t c : {2, 1, 3}) {
          requests.push_back({context, random_tokens(c, seed++, V)});
          context_positions += static_cast<int64_t>(context.size());
        }
      }
    }
    requests.push_back({random_tokens(9, 77, V), {3, 4}});  // alone
    for (const int64_t batch : {1, 4, 100}) {
      SCOPED_TRACE("batch " + std::to_string(batch));
      ScoringWork work;
      const auto scores = score_continuations(model, requests, batch, false, &work);
      for (size_t r = 0; r < requests.size(); ++r) {
        const double want = reference_nll(model, requests[r]);
        EXPECT_NEAR(scores[r].nll, want, 1e-4 * want) << "request " << r;
      }
      EXPECT_EQ(work.shared_prefixes, 2);
      EXPECT_EQ(work.shared_prefix_positions, 24 + 20);
      // Each context once would be a third of context_positions (three
      // choices each); with one question a batch, little of it is padding.
      if (batch < 100) {
        EXPECT_LT(work.positions, context_positions / 3);
      }
    }
  }
}

// Examples from the questions' own file (eval.choices_fewshot): each
// question after the first five others, so the first six questions' examples
// differ and every later one's are the same five. The run of contexts is cut
// into the families that save the most, whose questions share examples
// beside the heading, not into one family sharing the heading alone. Scores
// stay the model's.
TEST(ScoreContinuations, CutAFamilyWhereItsQuestionsShareTheMostExamples) {
  GptConfig cfg = eval_tiny();
  cfg.seq_len = 96;
  const Gpt model(cfg, 12);
  const int64_t V = cfg.vocab_size;
  const std::vector<int64_t> heading = random_tokens(20, 900, V);
  std::vector<std::vector<int64_t>> examples;
  for (uint64_t e = 0; e < 7; ++e) examples.push_back(random_tokens(10, 910 + e, V));
  std::vector<ContinuationRequest> requests;
  uint64_t seed = 950;
  for (size_t q = 0; q < 7; ++q) {
    std::vector<int64_t> context = heading;
    size_t taken = 0;
    for (size_t e = 0; e < examples.size() && taken < 5; ++e) {
      if (e == q) continue;
      context.insert(context.end(), examples[e].begin(), examples[e].end());
      ++taken;
    }
    const std::vector<int64_t> own = random_tokens(4, seed++, V);
    context.insert(context.end(), own.begin(), own.end());
    for (const int64_t c : {1, 2}) requests.push_back({context, random_tokens(c, seed++, V)});
  }
  // One family of all seven would share the heading alone: 20 + 7 * 54
  // context positions. Cut where they share examples too, fewer run, the
  // continuations and padding included.
  ScoringWork work;
  const auto scores = score_continuations(model, requests, 4, false, &work);
  for (size_t r = 0; r < requests.size(); ++r) {
    const double want = reference_nll(model, requests[r]);
    EXPECT_NEAR(scores[r].nll, want, 1e-4 * want) << "request " << r;
  }
  EXPECT_GT(work.shared_prefix_positions, 20);
  EXPECT_LT(work.positions, 20 + 7 * 54);
}

// Greedy scoring: a continuation is greedy exactly when every one of its
// tokens is its position's argmax — the model's own greedy text is, the
// same with one token changed is not — whether its context is shared
// (decoded over the key/value cache) or its own (a row), in any batch.
TEST(ScoreContinuations, SayWhetherGreedyDecodingWritesTheContinuation) {
  const Gpt model(eval_tiny(), 9);
  std::vector<ContinuationRequest> requests;
  std::vector<bool> want;
  SamplingOptions greedy;
  greedy.temperature = 0;
  uint64_t seed = 70;
  for (const auto& [c, n, shared] : std::vector<std::tuple<int64_t, int64_t, bool>>{
           {3, 4, true}, {5, 1, true}, {2, 3, false}, {4, 1, false}, {11, 3, false}}) {
    const std::vector<int64_t> context = random_tokens(c, seed++, eval_tiny().vocab_size);
    greedy.max_new_tokens = n;
    const std::vector<int64_t> own = generate(model, context, greedy);
    ASSERT_EQ(static_cast<int64_t>(own.size()), n);
    requests.push_back({context, own});
    want.push_back(true);
    if (shared) {
      // The same context with the greedy text's last token changed.
      std::vector<int64_t> other = own;
      other.back() = (other.back() + 1) % eval_tiny().vocab_size;
      requests.push_back({context, other});
      want.push_back(false);
    }
  }
  // A context of its own whose continuation is not greedy.
  std::vector<int64_t> wrong = generate(model, {7, 8}, greedy);
  wrong.front() = (wrong.front() + 3) % eval_tiny().vocab_size;
  requests.push_back({{7, 8}, wrong});
  want.push_back(false);
  for (int64_t batch : {1, 2, 100}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const auto scores = score_continuations(model, requests, batch, true);
    for (size_t r = 0; r < requests.size(); ++r) {
      EXPECT_EQ(scores[r].greedy, want[r]) << "request " << r;
      EXPECT_NEAR(scores[r].nll, reference_nll(model, requests[r]), 1e-4 * scores[r].nll);
    }
  }
  for (const auto& s : score_continuations(model, requests)) EXPECT_FALSE(s.greedy);  // not asked
}

// Each request is one document, whatever resets the model was trained
// with: an end-of-document token in a context does not hide what is before it.
TEST(ScoreContinuations, ReadEachRequestAsOneDocument) {
  GptConfig resets = eval_tiny();
  resets.eod_token = 4;
  resets.reset_attention_mask = resets.reset_position_ids = true;
  const Gpt with(resets, 9), without(eval_tiny(), 9);
  ContinuationRequest q{{7, 8, 4, 9, 10}, {11, 12, 13}};
  const double a = score_continuations(with, {q})[0].nll;
  const double b = score_continuations(without, {q})[0].nll;
  EXPECT_NEAR(a, b, 1e-5 * b);
  EXPECT_NEAR(a, reference_nll(without, q), 1e-4 * b);
  // So is a context shared by choices, and one beside it in a padded batch.
  const std::vector<ContinuationRequest> choices = {
      q, {q.context, {4, 12}}, {{3, 4, 5}, {6}}, {{3, 4, 5}, {8, 4, 9}}};
  const auto shared_with = score_continuations(with, choices);
  const auto shared_without = score_continuations(without, choices);
  for (size_t r = 0; r < choices.size(); ++r) {
    const double want = reference_nll(without, choices[r]);
    EXPECT_NEAR(shared_with[r].nll, want, 1e-4 * want) << r;
    EXPECT_NEAR(shared_without[r].nll, want, 1e-4 * want) << r;
  }
}

TEST(ScoreContinuations, NameABadRequest) {
  const Gpt model(eval_tiny(), 5);
  expect_error(
      [&] {
        score_continuations(model, {{{1}, {2}}, {{}, {2}}});
      },
      {"request 1 has an empty context", "BOS"});
  expect_error(
      [&] {
        score_continuations(model, {{{1}, {}}});
      },
      {"request 0 has an empty continuation"});
  expect_error(
      [&] {
        score_continuations(model, {{{1}, std::vector<int64_t>(13, 2)}});
      },
      {"request 0's continuation has 13 tokens", "seq_len 12"});
  expect_error(
      [&] {
        score_continuations(model, {{{1}, {2}}, {{1}, {2, 37}}});
      },
      {"request 1: continuation token 37 at position 1", "vocab_size 37"});
  expect_error(
      [&] {
        score_continuations(model, {{{-1}, {2}}});
      },
      {"request 0: context token -1 at position 0"});
  expect_error([&] { score_continuations(model, {{{1}, {2}}}, 0); }, {"batch_rows (0)"});
}

// Logits in hand: a row matches when every scored target is its position's
// argmax (the lowest id among equals); -100 positions are skipped.
TEST(ArgmaxMatches, EveryScoredTargetMustBeItsPositionsArgmax) {
  // Row 0: argmaxes 2, 0 (a tie of 0 and 1: the lowest). Row 1: argmax 1.
  const Tensor a = from_vector(std::vector<double>{0.1, 0.2, 0.9, 0.5, 0.5, -1}, {1, 2, 3});
  const Tensor b = from_vector(std::vector<double>{-3, 4, 3.99}, {1, 1, 3});
  EXPECT_EQ(argmax_matches({a, b}, {{2, 0}, {1}}), (std::vector<bool>{true, true}));
  EXPECT_EQ(argmax_matches({a, b}, {{2, 1}, {2}}), (std::vector<bool>{false, false}));
  EXPECT_EQ(argmax_matches({a, b}, {{-100, 0}, {-100}}), (std::vector<bool>{true, true}));
  EXPECT_EQ(argmax_matches({a}, {{1, -100}}), (std::vector<bool>{false}));
  EXPECT_TRUE(argmax_matches({}, {}).empty());
  expect_error([&] { argmax_matches({a}, {{2}}); },
               {"argmax_matches: row 0's logits are [1, 2, 3], expected [1, 1, 3]"});
  expect_error(
      [&] {
        argmax_matches({a}, {{2, 3}});
      },
      {"argmax_matches: row 0 has target 3, outside [0, 3)"});
  expect_error(
      [&] {
        argmax_matches({a, b}, {{2, 0}});
      },
      {"argmax_matches: 2 rows of logits, 1 of targets"});
  // Rows of a batch: each row's head runs once, from its first scored
  // target to its last; a row that scores nothing matches without a head.
  const Tensor logits =
      cast(from_vector(random_tokens(2 * 5 * 4, 3, 100), {2, 5, 4}), DType::F32);  // (B, T, V)
  const std::vector<double> flat = to_double_vector(logits);
  auto argmax_at = [&](int64_t b, int64_t t) {
    const auto first = flat.begin() + (b * 5 + t) * 4;
    return static_cast<int64_t>(std::max_element(first, first + 4) - first);
  };
  std::vector<int64_t> targets(15, -100);
  targets[1] = argmax_at(0, 1);
  targets[3] = argmax_at(0, 3);
  std::vector<std::tuple<int64_t, int64_t, int64_t>> asked;
  auto logits_of = [&](int64_t b, int64_t at, int64_t n) {
    asked.emplace_back(b, at, n);
    return narrow(narrow(logits, 0, b, 1), 1, at, n);
  };
  // Rows: 0 right at 1 and 3; 1 scores nothing; 2 (the same logits as 0)
  // wrong at 3.
  const Tensor both = concat({logits, narrow(logits, 0, 0, 1)}, 0);
  std::vector<int64_t> t3(15, -100);
  t3[1] = argmax_at(0, 1);
  t3[3] = argmax_at(0, 3);
  t3[10 + 3] = (argmax_at(0, 3) + 1) % 4;
  auto both_of = [&](int64_t b, int64_t at, int64_t n) {
    asked.emplace_back(b, at, n);
    return narrow(narrow(both, 0, b, 1), 1, at, n);
  };
  EXPECT_EQ(rows_argmax_match(from_vector(t3, {3, 5}), both_of),
            (std::vector<bool>{true, true, false}));
  EXPECT_EQ(asked, (std::vector<std::tuple<int64_t, int64_t, int64_t>>{{0, 1, 3}, {2, 3, 1}}));
  asked.clear();
  EXPECT_EQ(rows_argmax_match(from_vector(targets, {3, 5}), logits_of),
            (std::vector<bool>{true, true, true}));
  EXPECT_EQ(asked.size(), 1u);
}

TEST(RequestRow, IsTheLastSeqLenPlusOneTokensAsInputsAndTheirNextTokens) {
  const RequestRow fits = request_row({{1, 2}, {3, 4}}, 8);
  EXPECT_EQ(fits.inputs, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(fits.targets, (std::vector<int64_t>{2, 3, 4}));
  const RequestRow cut = request_row({{1, 2, 3}, {4, 5}}, 3);  // the context loses 1
  EXPECT_EQ(cut.inputs, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(cut.targets, (std::vector<int64_t>{3, 4, 5}));
}

TEST(RollingRequests, ScoreEveryTokenButTheFirstOnceWithAllTheContextTheWindowHolds) {
  const std::vector<int64_t> tokens = random_tokens(50, 77, 37);
  for (const int64_t stride : {1, 5, 12}) {
    SCOPED_TRACE(stride);
    const auto requests = rolling_requests(tokens, 12, stride);
    std::vector<int64_t> scored;
    int64_t end = 1;
    for (const auto& q : requests) {
      EXPECT_LE(static_cast<int64_t>(q.continuation.size()), stride);
      scored.insert(scored.end(), q.continuation.begin(), q.continuation.end());
      end += static_cast<int64_t>(q.continuation.size());
      // Context and continuation are the text's last 13 tokens up to the
      // run's end (all of it near the start).
      std::vector<int64_t> both = q.context;
      both.insert(both.end(), q.continuation.begin(), q.continuation.end());
      const int64_t from = std::max<int64_t>(0, end - 13);
      EXPECT_EQ(both, std::vector<int64_t>(tokens.begin() + from, tokens.begin() + end));
    }
    EXPECT_EQ(scored, std::vector<int64_t>(tokens.begin() + 1, tokens.end()));
  }
  EXPECT_TRUE(rolling_requests({5}, 12, 12).empty());
  expect_error([&] { rolling_requests(tokens, 12, 0); }, {"stride (0) must be in [1, seq_len 12]"});
  expect_error([&] { rolling_requests(tokens, 12, 13); }, {"stride (13)"});
}

// Windows that do not overlap score what training's loss does: the mean of
// rolling scores over k * seq_len + 1 tokens is the model's loss on the k
// rows they make.
TEST(RollingRequests, WithoutOverlapGiveTheTrainingLoss) {
  const Gpt model(eval_tiny(), 5);
  const int64_t k = 4, T = eval_tiny().seq_len;
  const std::vector<int64_t> tokens = random_tokens(k * T + 1, 21, 37);
  double nll = 0;
  int64_t count = 0;
  for (const auto& s : score_continuations(model, rolling_requests(tokens, T, T), 3)) {
    nll += s.nll;
    count += s.tokens;
  }
  EXPECT_EQ(count, k * T);
  std::vector<int64_t> x, y;
  for (int64_t r = 0; r < k; ++r) {
    x.insert(x.end(), tokens.begin() + r * T, tokens.begin() + r * T + T);
    y.insert(y.end(), tokens.begin() + r * T + 1, tokens.begin() + r * T + T + 1);
  }
  autograd::NoGradGuard no_grad;
  const double loss = item(model.loss(from_vector(x, {k, T}), from_vector(y, {k, T})));
  EXPECT_NEAR(nll / static_cast<double>(count), loss, 1e-5 * loss);
}

TEST(PickChoice, EachNormalisationPicksItsOwnLeastAndTiesGoToTheFirst) {
  // Totals 10, 8, 9; per token 2, 4, 3; per character 0.5, 2, 0.3.
  const std::vector<ContinuationScore> scores{{10, 5}, {8, 2}, {9, 3}};
  const ChoicePicks p = pick_choice(scores, {20, 4, 30});
  EXPECT_EQ(p.total, 1);
  EXPECT_EQ(p.per_token, 0);
  EXPECT_EQ(p.per_char, 2);
  const ChoicePicks tie = pick_choice({{3, 1}, {2, 1}, {2, 1}}, {1, 1, 1});
  EXPECT_EQ(tie.total, 1);
  EXPECT_EQ(tie.per_token, 1);
  EXPECT_EQ(tie.per_char, 1);
  expect_error([] { pick_choice({}, {}); }, {"no choices"});
  expect_error([] { pick_choice({{1, 1}, {2, 1}}, {3}); }, {"1 character counts for 2 choices"});
}

// TruthfulQA's MC2: the true answers' share of exp(-nll), as the harness's
// process_results_mc2 computes it.
TEST(TrueProbabilityShare, IsTheTrueAnswersShareOfTheProbability) {
  // p = e^-1, e^-2, e^-3: the first two hold (e^-1 + e^-2) / (sum).
  const std::vector<ContinuationScore> s{{1, 1}, {2, 1}, {3, 1}};
  const double e1 = std::exp(-1.0), e2 = std::exp(-2.0), e3 = std::exp(-3.0);
  EXPECT_NEAR(true_probability_share(s, 2), (e1 + e2) / (e1 + e2 + e3), 1e-15);
  EXPECT_NEAR(true_probability_share(s, 1), e1 / (e1 + e2 + e3), 1e-15);
  // Answers far too unlikely for exp() (which gives 0 / 0 there) keep
  // their ratio: e^-1000 against e^-1001.
  EXPECT_NEAR(true_probability_share({{1000, 9}, {1001, 9}}, 1), 1 / (1 + std::exp(-1.0)), 1e-12);
  expect_error([&] { true_probability_share(s, 0); }, {"0 true answers of 3"});
  expect_error([&] { true_probability_share(s, 3); }, {"3 true answers of 3"});
}

}  // namespace
}  // namespace triad::nn
