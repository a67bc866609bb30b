#include "triad/nn/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "support/tiny_deepseek.h"
#include "triad/autograd/grad_mode.h"
#include "triad/core/allocator.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

GptConfig generate_tiny() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.vocab_size = 40;
  c.seq_len = 8;
  return c;
}

TEST(Generate, SampleTokenFollowsTheSoftmaxOfTheTopK) {
  const std::vector<double> logits{0.5, 2.0, -1.0, 2.0, 1.0, 0.0};
  // Greedy: the largest, the lower id on a tie (1 and 3 tie at 2.0).
  EXPECT_EQ(sample_token(logits, 0.0, 0, 0.99), 1);
  for (double u : {0.0, 0.3, 0.999}) EXPECT_EQ(sample_token(logits, 1.0, 1, u), 1);
  // A grid of u values draws each of the top 3 (ids 1, 3, 4) in proportion
  // to exp(logit / T) and never anything else.
  const double T = 0.7;
  const int N = 10000;
  std::vector<int> count(logits.size(), 0);
  for (int i = 0; i < N; ++i) ++count[sample_token(logits, T, 3, (i + 0.5) / N)];
  const double z = 2 * std::exp(2.0 / T) + std::exp(1.0 / T);
  EXPECT_NEAR(count[1] / double(N), std::exp(2.0 / T) / z, 2.0 / N);
  EXPECT_NEAR(count[3] / double(N), std::exp(2.0 / T) / z, 2.0 / N);
  EXPECT_NEAR(count[4] / double(N), std::exp(1.0 / T) / z, 2.0 / N);
  EXPECT_EQ(count[0] + count[2] + count[5], 0);
  // Every token can be drawn without top_k.
  std::vector<int> all(logits.size(), 0);
  for (int i = 0; i < N; ++i) ++all[sample_token(logits, 1.0, 0, (i + 0.5) / N)];
  for (size_t t = 0; t < logits.size(); ++t) EXPECT_GT(all[t], 0) << t;
  EXPECT_THROW(sample_token(logits, -1.0, 0, 0.5), ValueError);
  EXPECT_THROW(sample_token(logits, 1.0, 0, 0.5, 0.0), ValueError);
  EXPECT_THROW(sample_token(logits, 1.0, 0, 0.5, 1.5), ValueError);
  EXPECT_THROW(sample_token(logits, 1.0, -2, 0.5), ValueError);
  EXPECT_THROW(sample_token({}, 1.0, 0, 0.5), ValueError);
}

TEST(Generate, TopPDrawsFromTheSmallestNucleusHoldingP) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (ids 2, 0, 3, 1).
  const std::vector<double> logits{std::log(0.3), std::log(0.05), std::log(0.5), std::log(0.15)};
  const int N = 10000;
  auto counts = [&](double top_p, int64_t top_k) {
    std::vector<int> c(4, 0);
    for (int i = 0; i < N; ++i) ++c[sample_token(logits, 1.0, top_k, (i + 0.5) / N, top_p)];
    return c;
  };
  // 0.5 < 0.75 <= 0.8: the two most likely, renormalised to 5/8 and 3/8.
  auto c = counts(0.75, 0);
  EXPECT_NEAR(c[2] / double(N), 0.625, 2.0 / N);
  EXPECT_NEAR(c[0] / double(N), 0.375, 2.0 / N);
  EXPECT_EQ(c[1] + c[3], 0);
  // A nucleus smaller than the most likely token is that token alone.
  c = counts(0.2, 0);
  EXPECT_EQ(c[2], N);
  // top_p applies to what top_k kept: of the top 3 (0.95 in all), 0.9 of
  // it is reached by all three (0.8 / 0.95 < 0.9).
  c = counts(0.9, 3);
  EXPECT_GT(c[3], 0);
  EXPECT_EQ(c[1], 0);
  // 1 changes nothing.
  std::vector<int> all(4, 0);
  for (int i = 0; i < N; ++i) ++all[sample_token(logits, 1.0, 0, (i + 0.5) / N)];
  EXPECT_EQ(counts(1.0, 0), all);
}

TEST(Generate, MinPKeepsTheTokensAtLeastThatShareOfTheMostLikely) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (ids 2, 0, 3, 1).
  const std::vector<double> logits{std::log(0.3), std::log(0.05), std::log(0.5), std::log(0.15)};
  const int N = 10000;
  auto counts = [&](double min_p, double top_p) {
    std::vector<int> c(4, 0);
    for (int i = 0; i < N; ++i) ++c[sample_token(logits, 1.0, 0, (i + 0.5) / N, top_p, min_p)];
    return c;
  };
  // 0.4 * 0.5 = 0.2: ids 2 and 0, renormalised to 5/8 and 3/8.
  auto c = counts(0.4, 1.0);
  EXPECT_NEAR(c[2] / double(N), 0.625, 2.0 / N);
  EXPECT_NEAR(c[0] / double(N), 0.375, 2.0 / N);
  EXPECT_EQ(c[1] + c[3], 0);
  // 0.25 * 0.5 = 0.125: three of them, 0.05 out.
  c = counts(0.25, 1.0);
  EXPECT_GT(c[3], 0);
  EXPECT_EQ(c[1], 0);
  EXPECT_NEAR(c[3] / double(N), 0.15 / 0.95, 2.0 / N);
  // After top_p's nucleus (0.5 and 0.3), min_p cuts within it.
  c = counts(0.7, 0.75);
  EXPECT_EQ(c[2], N);
  EXPECT_EQ(counts(1.0, 1.0)[2], N);  // only the most likely
  std::vector<int> all(4, 0);
  for (int i = 0; i < N; ++i) ++all[sample_token(logits, 1.0, 0, (i + 0.5) / N)];
  EXPECT_EQ(counts(0.0, 1.0), all);  // 0 changes nothing
  EXPECT_THROW(sample_token(logits, 1.0, 0, 0.5, 1.0, 1.5), ValueError);
  EXPECT_THROW(sample_token(logits, 1.0, 0, 0.5, 1.0, -0.1), ValueError);
}

TEST(Generate, PenaltiesLowerTheLogitsOfTokensTheTextHolds) {
  SamplingOptions o;
  o.repetition_penalty = 2.0;
  std::vector<double> l{2.0, -1.0, 0.5, 3.0, 7.0};
  // Token 0 in the prompt, 1 twice and 3 once in the output; 9 is past the
  // row (a vocab_limit) and skipped.
  apply_penalties(l, {0, 9}, {1, 1, 3}, o);
  EXPECT_EQ(l, (std::vector<double>{1.0, -2.0, 0.5, 1.5, 7.0}));
  o.repetition_penalty = 1.0;
  o.frequency_penalty = 0.5;
  o.presence_penalty = 0.25;
  apply_penalties(l, {0, 9}, {1, 1, 3}, o);  // the output's counts only
  EXPECT_EQ(l, (std::vector<double>{1.0, -3.25, 0.5, 0.75, 7.0}));
  o.repetition_penalty = 0;
  EXPECT_THROW(apply_penalties(l, {}, {}, o), ValueError);
  o.repetition_penalty = 1;
  o.frequency_penalty = INFINITY;
  EXPECT_THROW(apply_penalties(l, {}, {}, o), ValueError);
}

// Weights 8x the initial ones: small random weights predict one token
// forever, which would make the comparison below vacuous.
void make_opinionated(Gpt& model) {
  autograd::NoGradGuard ng;
  for (auto& [name, p] : model.named_parameters()) {
    if (name.find("ln_") == std::string::npos) scale_(p, 8.0);
  }
}

// Greedy tokens by hand: each the argmax of the last position's logits of a
// full forward pass over the last 8 tokens (generate_tiny()'s window), after
// `adjust` (given the row and the output so far).
std::vector<int64_t> greedy_by_hand(
    const Gpt& model, const std::vector<int64_t>& prompt, int steps,
    const std::function<void(std::vector<double>&, const std::vector<int64_t>&)>& adjust = {}) {
  std::vector<int64_t> seq = prompt, out;
  for (int step = 0; step < steps; ++step) {
    const auto w = std::min<int64_t>(static_cast<int64_t>(seq.size()), 8);
    std::vector<int64_t> ids(seq.end() - w, seq.end());
    auto logits = to_double_vector(model.forward(from_vector(ids, {1, w}), {false, 0, 0}));
    std::vector<double> row(logits.begin() + (w - 1) * 40, logits.begin() + w * 40);
    if (adjust) adjust(row, out);
    const int64_t best = std::max_element(row.begin(), row.end()) - row.begin();
    seq.push_back(best);
    out.push_back(best);
  }
  return out;
}

TEST(Generate, GreedyMatchesArgmaxOfTheFullForwardOverASlidingWindow) {
  Gpt model(generate_tiny(), 3);
  make_opinionated(model);
  const std::vector<int64_t> prompt{4, 9, 1};
  SamplingOptions o;
  o.max_new_tokens = 12;  // past seq_len 8: the window slides
  o.temperature = 0;
  const auto got = generate(model, prompt, o);
  ASSERT_EQ(got.size(), 12u);
  EXPECT_EQ(got, greedy_by_hand(model, prompt, 12));
  EXPECT_GE(std::set<int64_t>(got.begin(), got.end()).size(), 3u) << "a vacuous comparison";
}

// Greedy decoding under every penalty picks the argmax of the penalised
// logits of a full forward pass, with the cache and without it; a presence
// penalty past any logit makes every token new; stop_when ends the text.
TEST(Generate, GreedyWithPenaltiesMatchesTheRuleAndStopWhenEndsIt) {
  Gpt model(generate_tiny(), 3);
  make_opinionated(model);
  const std::vector<int64_t> prompt{4, 9, 1, 4};
  SamplingOptions o;
  o.max_new_tokens = 12;
  o.temperature = 0;
  o.repetition_penalty = 1.7;
  o.frequency_penalty = 0.3;
  o.presence_penalty = 0.2;
  const auto got = generate(model, prompt, o);
  ASSERT_EQ(got.size(), 12u);
  EXPECT_EQ(got, greedy_by_hand(model, prompt, 12,
                                [&](std::vector<double>& row, const std::vector<int64_t>& out) {
                                  std::vector<int> count(40, 0);
                                  for (int64_t t : out) ++count[t];
                                  for (int64_t t = 0; t < 40; ++t) {
                                    const bool seen =
                                        count[t] > 0 || std::count(prompt.begin(), prompt.end(), t);
                                    if (seen) row[t] = row[t] > 0 ? row[t] / 1.7 : row[t] * 1.7;
                                    if (count[t] > 0) row[t] -= 0.3 * count[t] + 0.2;
                                  }
                                }));
  o.kv_cache = false;
  EXPECT_EQ(generate(model, prompt, o), got);
  SamplingOptions plain;
  plain.max_new_tokens = 12;
  plain.temperature = 0;
  EXPECT_NE(generate(model, prompt, plain), got) << "the penalties changed nothing";
  o.kv_cache = true;
  o.presence_penalty = 1e9;
  const auto fresh = generate(model, prompt, o);
  EXPECT_EQ(std::set<int64_t>(fresh.begin(), fresh.end()).size(), fresh.size());
  // stop_when sees the output so far.
  o.presence_penalty = 0.2;
  int calls = 0;
  o.stop_when = [&](const std::vector<int64_t>& so_far) {
    ++calls;
    return so_far.size() == 5;
  };
  const auto stopped = generate(model, prompt, o);
  EXPECT_EQ(stopped, std::vector<int64_t>(got.begin(), got.begin() + 5));
  EXPECT_EQ(calls, 5);
  o.min_p = 2;
  EXPECT_THROW(generate(model, prompt, o), ValueError);
}

TEST(Generate, DrawsArePureFunctionsOfTheSeedAndRespectTheLimits) {
  Gpt model(generate_tiny(), 5);
  SamplingOptions o;
  o.max_new_tokens = 20;
  o.temperature = 1.5;
  o.seed = 11;
  const auto a = generate(model, {3}, o), b = generate(model, {3}, o);
  EXPECT_EQ(a, b);
  o.seed = 12;
  EXPECT_NE(generate(model, {3}, o), a);
  o.vocab_limit = 5;
  for (int64_t t : generate(model, {3}, o)) EXPECT_LT(t, 5);
  o.vocab_limit = 0;
  o.stop_tokens = {a[4]};
  o.seed = 11;
  const auto stopped = generate(model, {3}, o);
  EXPECT_LE(stopped.size(), 5u);
  EXPECT_EQ(stopped.back(), a[4]);
  // Several stop tokens: the first of any of them ends the text.
  o.stop_tokens = {a[7], a[3]};
  const auto either = generate(model, {3}, o);
  size_t first = 0;
  while (a[first] != a[7] && a[first] != a[3]) ++first;
  EXPECT_EQ(either, std::vector<int64_t>(a.begin(), a.begin() + static_cast<int64_t>(first) + 1));
  o.stop_tokens = {a[4], 40};  // not an id of the model
  EXPECT_THROW(generate(model, {3}, o), ValueError);
  o.stop_tokens = {a[4]};
  EXPECT_THROW(generate(model, {}, o), ValueError);
  EXPECT_THROW(generate(model, {40}, o), ValueError);
  o.vocab_limit = 41;
  EXPECT_THROW(generate(model, {3}, o), ValueError);
  // Every option is checked before the first step (check_sampling, which a
  // program calls before printing anything), each bad one named.
  o.vocab_limit = 0;
  EXPECT_NO_THROW(check_sampling(model.config(), o));
  const auto named = [&](SamplingOptions bad, const std::string& what) {
    SCOPED_TRACE(what);
    try {
      check_sampling(model.config(), bad);
      ADD_FAILURE() << "expected a ValueError";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_THROW(generate(model, {3}, bad), ValueError);
  };
  for (double t : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    SamplingOptions bad = o;
    bad.temperature = t;
    named(bad, "temperature (");
  }
  SamplingOptions bad = o;
  bad.top_k = -1;
  named(bad, "top_k (-1) must be >= 0");
  for (double p : {0.0, 1.5, std::nan("")}) {
    bad = o;
    bad.top_p = p;
    named(bad, "must be in (0, 1]");
  }
  bad = o;
  bad.min_p = 2;
  named(bad, "min_p (2.000000) must be in [0, 1]");
}

// suppress_tokens (a tokenizer's holes) are never produced, greedy or
// sampled, alone or in a batch; the options naming a bad id are refused.
TEST(Generate, SuppressedTokensAreNeverProduced) {
  Gpt model(generate_tiny(), 5);
  SamplingOptions o;
  o.max_new_tokens = 30;
  o.temperature = 0;
  const auto greedy = generate(model, {3}, o);
  o.suppress_tokens = {greedy[0], greedy[1]};
  for (int64_t t : generate(model, {3}, o)) {
    EXPECT_NE(t, greedy[0]);
    EXPECT_NE(t, greedy[1]);
  }
  // Hot sampling over a vocabulary of 8 with 6 ids suppressed: only 0 and 5.
  o.temperature = 3.0;
  o.vocab_limit = 8;
  o.suppress_tokens = {1, 2, 3, 4, 6, 7};
  std::set<int64_t> seen;
  for (const auto& out : generate_batch(model, {{3}, {4, 9}}, o)) {
    for (int64_t t : out) seen.insert(t);
  }
  EXPECT_EQ(seen, (std::set<int64_t>{0, 5}));
  o.suppress_tokens = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_THROW(generate(model, {3}, o), ValueError);  // nothing left
  o.suppress_tokens = {40};
  EXPECT_THROW(generate(model, {3}, o), ValueError);  // not an id
  o.suppress_tokens = {2};
  o.stop_tokens = {5, 2};
  EXPECT_THROW(generate(model, {3}, o), ValueError);
}

// Position embedding, query heads over key/value heads, sliding window.
struct Decoding {
  PositionEmbedding positions;
  int64_t n_head, n_kv_head, window = 0;
  int64_t head_dim = 0;                   // model.head_dim, with model.qk_norm when set
  std::vector<int64_t> full_layers = {};  // exempt from the window
  double softcap = 0.0;  // the scores' soft cap (and twice it the logits'), Gemma 2's
  bool olmo2 = false;    // OLMo 2's blocks: post-norms only, query/key norms over all heads
  bool mla = false;      // DeepSeek's latent attention (the cache holds its latents)
  // With mla: queries straight from x, no nope part, values wider than
  // the queries (these padded) and yarn's scaling with DeepSeek's mscale.
  bool mla_wide = false;
  // generate_tiny() with these, over 12 positions.
  GptConfig config() const {
    GptConfig cfg = generate_tiny();
    cfg.seq_len = 12;
    cfg.position_embedding = positions;
    cfg.n_head = n_head;
    cfg.n_kv_head = n_kv_head;
    cfg.sliding_window = window;
    cfg.head_size = head_dim;
    cfg.qk_norm = head_dim > 0;
    cfg.full_attention_layers = full_layers;
    cfg.attn_logit_softcap = softcap;
    cfg.final_logit_softcap = 2 * softcap;
    if (olmo2) {
      set_qk_norm(cfg, "full");
      cfg.pre_norms = false;
      cfg.post_norms = true;
    }
    if (mla) {
      cfg.normalization = Normalization::RmsNorm;
      cfg.mla = testing::tiny_latent_attention();
    }
    cfg.rope_theta = 50.0;  // large turns over 12 positions
    if (mla && mla_wide) {
      cfg.mla.q_lora_rank = 0;
      cfg.mla.qk_nope_head_dim = 0;
      cfg.mla.v_head_dim = 10;
      testing::use_deepseek_yarn(cfg);
    }
    return cfg;
  }
};
class KvCacheDecoding : public ::testing::TestWithParam<Decoding> {};

// Under rotary embeddings each step turns its keys by their positions
// before caching them, and its queries by theirs. Under grouped-query
// attention the cache holds the key/value heads only, each serving its
// group's query heads. Under a sliding window the decode steps mask the
// cached keys before it, as the forward pass's kernel skips them.
TEST_P(KvCacheDecoding, PieceByPieceGivesTheFullForwardsLogits) {
  const GptConfig cfg = GetParam().config();
  Gpt model(cfg, 7);
  make_opinionated(model);
  // Two sequences, fed as a prompt of 5, three single tokens, a piece of 3
  // and a last one: 12 positions, the whole context.
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 2 * 12; ++i) ids.push_back((i * 17 + 3) % cfg.vocab_size);
  Tensor all = from_vector(ids, {2, 12});
  const auto want = to_double_vector(model.forward(all, {false, 0, 0}));  // (2, 12, V)
  KvCache cache(cfg, 2, DType::F32, Device::cpu());
  EXPECT_EQ(cache.capacity(), 12);
  if (cfg.latent_attention()) {  // each token's latent and rope key
    EXPECT_EQ(cache.k[0].shape(), (Shape{2, 1, 12, cfg.mla.kv_lora_rank}));
    EXPECT_EQ(cache.v[1].shape(), (Shape{2, 1, 12, cfg.mla.qk_rope_head_dim}));
  } else {
    EXPECT_EQ(cache.k[0].shape(), (Shape{2, cfg.kv_heads(), 12, cfg.head_dim()}));
  }
  int64_t at = 0;
  for (int64_t n : {5, 1, 1, 1, 3, 1}) {
    Tensor logits = model.decode(narrow(all, 1, at, n), cache);
    ASSERT_EQ(logits.shape(), (Shape{2, n, cfg.vocab_size}));
    EXPECT_FALSE(logits.requires_grad());
    const auto got = to_double_vector(logits);
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t v = 0; v < cfg.vocab_size; ++v) {
          const double w = want[static_cast<size_t>((b * 12 + at + t) * cfg.vocab_size + v)];
          ASSERT_NEAR(got[static_cast<size_t>((b * n + t) * cfg.vocab_size + v)], w,
                      1e-4 * (1 + std::abs(w)))
              << "sequence " << b << " position " << at + t;
        }
      }
    }
    at += n;
    EXPECT_EQ(cache.length, at);
  }
  // The context is full: one more position is refused, naming the limit,
  // and so is a batch the cache was not made for.
  try {
    model.decode(from_vector(std::vector<int64_t>{1, 2}, {2, 1}), cache);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("positions [12, 13) exceed model.seq_len 12"),
              std::string::npos)
        << e.what();
  }
  KvCache one(cfg, 1, DType::F32, Device::cpu());
  EXPECT_THROW(model.decode(all, one), ShapeError);
  EXPECT_THROW(KvCache(cfg, 0, DType::F32, Device::cpu()), ValueError);
}

// Texts of different lengths in one left-padded cache: each row's logits are
// those of its text alone (positions from its own start, no padding seen),
// through the prompts, single steps, a row leaving and the padding dropped.
TEST_P(KvCacheDecoding, LeftPaddedRowsGiveEachTextItsOwnLogits) {
  const GptConfig cfg = GetParam().config();
  Gpt model(cfg, 7);
  make_opinionated(model);
  // Three texts of 9 tokens; their prompts are 4, 9 and 6 long.
  const std::vector<int64_t> prompt_len{4, 9, 6};
  std::vector<std::vector<int64_t>> texts(3);
  std::vector<std::vector<double>> want(3);  // each text's logits alone, (9, V)
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < 9; ++i) texts[r].push_back((i * 13 + r * 7 + 2) % cfg.vocab_size);
    want[r] = to_double_vector(model.forward(from_vector(texts[r], {1, 9}), {false, 0, 0}));
  }
  const int64_t V = cfg.vocab_size;
  KvCache cache(cfg, 3, DType::F32, Device::cpu());
  cache.row_start = {5, 0, 3};
  std::vector<int64_t> prompts(3 * 9);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t t = 0; t < 9; ++t) {
      const int64_t pad = cache.row_start[r];
      prompts[r * 9 + t] = t < pad ? 0 : texts[r][t - pad];
    }
  }
  // `got` (rows, n, V) against each row's text at positions [at_r, at_r + n).
  auto check = [&](const Tensor& logits, const std::vector<int64_t>& rows,
                   const std::vector<int64_t>& at, int64_t n) {
    const auto got = to_double_vector(logits);
    for (size_t b = 0; b < rows.size(); ++b) {
      for (int64_t t = 0; t < n; ++t) {
        if (at[b] + t < 0) continue;  // padding
        for (int64_t v = 0; v < V; ++v) {
          const double w = want[rows[b]][static_cast<size_t>((at[b] + t) * V + v)];
          ASSERT_NEAR(got[static_cast<size_t>((b * n + t) * V + v)], w, 1e-4 * (1 + std::abs(w)))
              << "text " << rows[b] << " position " << at[b] + t;
        }
      }
    }
  };
  check(model.decode(from_vector(prompts, {3, 9}), cache), {0, 1, 2}, {-5, 0, -3}, 9);
  // Texts 0 and 2 go on a token at a time (text 1 is whole already: what it
  // is given past its end is not checked).
  std::vector<int64_t> next{texts[0][4], texts[1][0], texts[2][6]};
  check(model.decode(from_vector(next, {3, 1}), cache), {0, 1, 2}, {4, -100, 6}, 1);
  // Text 1 leaves; the two left keep their padding's last 3 slots dropped.
  cache.keep_rows({0, 2}, 3);
  EXPECT_EQ(cache.batch(), 2);
  EXPECT_EQ(cache.length, 7);
  EXPECT_EQ(cache.row_start, (std::vector<int64_t>{2, 0}));
  for (int64_t step = 0; step < 2; ++step) {
    next = {texts[0][5 + step], texts[2][7 + step]};
    check(model.decode(from_vector(next, {2, 1}), cache), {0, 2}, {5 + step, 7 + step}, 1);
  }
  EXPECT_THROW(cache.keep_rows({0, 1}, 1), ValueError);  // row 1's first slot is text
  EXPECT_THROW(cache.keep_rows({2}, 0), ValueError);
  cache.row_start = {1, 2, 3};
  EXPECT_THROW(model.decode(from_vector(next, {2, 1}), cache), ShapeError);
}

INSTANTIATE_TEST_SUITE_P(
    PositionsAndHeads, KvCacheDecoding,
    ::testing::Values(Decoding{PositionEmbedding::Learned, 2, 0},
                      Decoding{PositionEmbedding::Rotary, 2, 0},
                      Decoding{PositionEmbedding::Rotary, 4, 2},
                      Decoding{PositionEmbedding::Learned, 4, 1},
                      Decoding{PositionEmbedding::Rotary, 4, 2, 5},
                      Decoding{PositionEmbedding::Rotary, 4, 2, 0, 6},
                      Decoding{PositionEmbedding::Rotary, 4, 2, 5, 0, {0}},
                      Decoding{PositionEmbedding::Rotary, 4, 2, 5, 0, {0}, 0.5},
                      Decoding{PositionEmbedding::Rotary, 4, 2, 0, 0, {}, 0.0, true},
                      Decoding{PositionEmbedding::Rotary, 4, 0, 5, 0, {}, 0.0, false, true},
                      Decoding{PositionEmbedding::Rotary, 4, 0, 0, 0, {}, 0.5, false, true},
                      Decoding{PositionEmbedding::Rotary, 2, 0, 0, 0, {}, 0.0, false, true, true}),
    [](const auto& info) {
      const Decoding& d = info.param;
      return std::string(position_embedding_string(d.positions)) + "_" + std::to_string(d.n_head) +
             "_heads_" + (d.n_kv_head ? std::to_string(d.n_kv_head) : std::string("each")) + "_kv" +
             (d.window ? "_window_" + std::to_string(d.window) : std::string()) +
             (d.full_layers.empty() ? std::string() : "_on_layer_1") +
             (d.head_dim ? "_qk_norm_heads_of_" + std::to_string(d.head_dim) : std::string()) +
             (d.softcap > 0 ? "_soft_capped" : "") + (d.olmo2 ? "_olmo2_blocks" : "") +
             (d.mla ? "_latent_attention" : "") + (d.mla_wide ? "_wide_values_yarn" : "");
    });

// Latent attention with LoRA on its up-projection (attn.kv_b_proj): the
// absorbed decoding folds the adapters (B random here) into the weight it
// splits by head, and so gives the full forward's logits.
TEST(KvCache, LatentDecodingMergesTheUpProjectionsAdapters) {
  Decoding d{PositionEmbedding::Rotary, 4, 0};
  d.mla = true;
  GptConfig cfg = d.config();
  cfg.lora = {.rank = 2, .alpha = 4, .targets = {"attn.kv_b_proj", "attn.c_proj"}};
  cfg.validate();
  Gpt model(cfg, 9);
  uint64_t stream = 3;
  for (auto& [name, t] : model.named_parameters()) {
    if (name.ends_with(".lora_b")) copy_(t, randn(t.shape(), 9, stream++, 0.5));
  }
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 12; ++i) ids.push_back((i * 11 + 5) % cfg.vocab_size);
  const Tensor all = from_vector(ids, {1, 12});
  const auto want = to_double_vector(model.forward(all, {false, 0, 0}));
  KvCache cache(cfg, 1, DType::F32, Device::cpu());
  int64_t at = 0;
  for (int64_t n : {4, 1, 2, 5}) {
    const auto got = to_double_vector(model.decode(narrow(all, 1, at, n), cache));
    for (size_t i = 0; i < got.size(); ++i) {
      const double w = want[static_cast<size_t>(at * cfg.vocab_size) + i];
      ASSERT_NEAR(got[i], w, 1e-4 * (1 + std::abs(w))) << "position " << at << " + " << i;
    }
    at += n;
  }
}

TEST(KvCache, LastOnlyGivesTheLastPositionsLogits) {
  Gpt model(generate_tiny(), 8);
  const Tensor ids = from_vector(std::vector<int64_t>{5, 6, 7, 8}, {1, 4});
  KvCache a(generate_tiny(), 1, DType::F32, Device::cpu()),
      b(generate_tiny(), 1, DType::F32, Device::cpu());
  const Tensor full = model.decode(ids, a), last = model.decode(ids, b, /*last_only=*/true);
  ASSERT_EQ(last.shape(), (Shape{1, 1, 40}));
  // The head's product over one row against four: BLAS may take another
  // kernel (a matrix-vector one) with another order of summation, so the
  // logits agree to f32 rounding, not bit for bit.
  const std::vector<double> got = to_double_vector(last),
                            want = to_double_vector(narrow(full, 1, 3, 1));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << "logit " << i;
  }
  EXPECT_EQ(b.length, 4);
}

TEST(Generate, ABatchGivesEachPromptWhatItGetsAlone) {
  // Prompts of 1 to 8 tokens (generate_tiny()'s whole context), greedy and sampled,
  // with penalties: a batch's rows stop at different steps (the stop
  // token, a per-prompt stop), and the longer runs outgrow the context in
  // the batch and go on over a sliding window.
  GptConfig cfg = generate_tiny();
  cfg.position_embedding = PositionEmbedding::Rotary;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  for (const auto positions : {PositionEmbedding::Learned, PositionEmbedding::Rotary}) {
    cfg.position_embedding = positions;
    Gpt model(cfg, 11);
    make_opinionated(model);
    const std::vector<std::vector<int64_t>> prompts{
        {4, 9, 1}, {7}, {3, 3, 8, 20, 11, 6, 2, 5}, {30, 12}, {1, 2, 3, 4, 5, 6}};
    for (const double temperature : {0.0, 0.9}) {
      for (const int64_t n : {3, 11}) {
        SamplingOptions o;
        o.max_new_tokens = n;
        o.temperature = temperature;
        o.top_k = temperature > 0 ? 12 : 0;
        o.repetition_penalty = 1.3;
        o.seed = 5;
        SCOPED_TRACE(std::string(position_embedding_string(positions)) + ", temperature " +
                     std::to_string(temperature) + ", " + std::to_string(n) + " tokens");
        std::vector<std::vector<int64_t>> alone;
        for (const auto& p : prompts) alone.push_back(generate(model, p, o));
        const auto together = generate_batch(model, prompts, o);
        EXPECT_EQ(together, alone);
        // Stop tokens some texts produce end those early, and a per-prompt
        // stop ends prompt 3's after two tokens.
        o.stop_tokens = {alone[0][1], alone[2][0]};
        std::vector<std::vector<int64_t>> stopped;
        for (size_t i = 0; i < prompts.size(); ++i) {
          SamplingOptions one = o;
          if (i == 3)
            one.stop_when = [](const std::vector<int64_t>& out) { return out.size() == 2; };
          stopped.push_back(generate(model, prompts[i], one));
        }
        const auto batched = generate_batch(
            model, prompts, o,
            [](size_t i, const std::vector<int64_t>& out) { return i == 3 && out.size() == 2; });
        EXPECT_EQ(batched, stopped);
        EXPECT_EQ(batched[3].size(), std::min<size_t>(2, stopped[3].size()));
        o.kv_cache = false;
        EXPECT_EQ(generate_batch(model, prompts, o,
                                 [](size_t i, const std::vector<int64_t>& out) {
                                   return i == 3 && out.size() == 2;
                                 }),
                  stopped);
      }
    }
    // Rows really did differ in length and end: the batch is not trivially
    // one long text.
    SamplingOptions o;
    o.max_new_tokens = 4;
    o.temperature = 0;
    EXPECT_NE(generate_batch(model, prompts, o)[0], generate_batch(model, prompts, o)[1]);
  }
  Gpt model(generate_tiny(), 3);
  SamplingOptions o;
  EXPECT_TRUE(generate_batch(model, {}, o).empty());
  try {
    generate_batch(model, {{1, 2}, {}}, o);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("prompt 1 is empty"), std::string::npos) << e.what();
  }
  try {
    generate_batch(model, {{1, 2}, {3, 40}}, o);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("prompt 1's token 40 at position 1"), std::string::npos)
        << e.what();
  }
  o.max_new_tokens = 0;
  EXPECT_EQ(generate_batch(model, {{1}, {2, 3}}, o), (std::vector<std::vector<int64_t>>{{}, {}}));
}

TEST(KvCache, APromptIsAttendedWithoutItsScoresInMemory) {
  // A 512-token prompt into an empty cache runs the fused attention, as
  // forward() does: its (512, 512) scores per head (4 MiB of f32 over 4
  // heads) are never held; decoding it takes less than a quarter of that.
  GptConfig cfg = generate_tiny();
  cfg.seq_len = 512;
  cfg.n_head = 4;
  Gpt model(cfg, 2);
  KvCache cache(cfg, 1, DType::F32, Device::cpu());  // (allocated before the count)
  std::vector<int64_t> ids(512);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7 % 40);
  const Tensor prompt = from_vector(ids, {1, 512});
  Allocator& host = cpu_allocator();
  host.reset_peak();
  const int64_t before = host.stats().allocated;
  const Tensor last = model.decode(prompt, cache, /*last_only=*/true);
  const int64_t peak = host.stats().peak_allocated - before;
  EXPECT_LT(peak, 512 * 512 * 4 * 4 / 4) << peak << " bytes at the peak";
  // And its logits are forward()'s.
  const auto want = to_double_vector(narrow(model.forward(prompt, {false, 0, 0}), 1, 511, 1));
  const auto got = to_double_vector(last);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << i;
}

TEST(Generate, ASessionDecodesOnlyWhatFollowsTheTokensItHolds) {
  // A conversation: each turn's prompt is the last prompt, its reply and a
  // new question. With a session the cache keeps the text between calls
  // and only the new part is decoded; the tokens are those without it.
  GptConfig cfg = generate_tiny();
  cfg.seq_len = 24;
  Gpt model(cfg, 5);
  make_opinionated(model);
  SamplingOptions o;
  o.max_new_tokens = 4;
  o.temperature = 0.8;
  o.top_k = 10;
  o.seed = 9;
  GenerationSession session;
  std::vector<int64_t> prompt{4, 9, 1};
  const auto first = generate(model, prompt, o, session);
  EXPECT_EQ(first, generate(model, prompt, o));
  EXPECT_EQ(session.reused, 0);
  // The cache holds the prompt and every new token but the last (never fed).
  std::vector<int64_t> text = prompt;
  text.insert(text.end(), first.begin(), first.end());
  EXPECT_EQ(session.tokens, std::vector<int64_t>(text.begin(), text.end() - 1));
  // The next turn repeats it all and asks more: all but the last reply
  // token come from the cache.
  std::vector<int64_t> next = text;
  for (const int64_t id : {7, 30, 2}) next.push_back(id);
  EXPECT_EQ(generate(model, next, o, session), generate(model, next, o));
  EXPECT_EQ(session.reused, static_cast<int64_t>(text.size()) - 1);
  // A prompt that parts from the cached text at token 2 reuses two tokens.
  const std::vector<int64_t> other{4, 9, 20, 21};
  EXPECT_EQ(generate(model, other, o, session), generate(model, other, o));
  EXPECT_EQ(session.reused, 2);
  // Past the window (the text slides) and back: still the same tokens.
  o.max_new_tokens = 30;
  EXPECT_EQ(generate(model, other, o, session), generate(model, other, o));
  EXPECT_EQ(generate(model, next, o, session), generate(model, next, o));
  // A session made on another model starts over on this one.
  GptConfig wider = cfg;
  wider.n_head = 4;
  Gpt other_model(wider, 6);
  o.max_new_tokens = 3;
  EXPECT_EQ(generate(other_model, next, o, session), generate(other_model, next, o));
  EXPECT_EQ(session.reused, 0);
}

TEST(KvCache, GenerationWithAndWithoutTheCacheAgrees) {
  // Greedy and sampled, short (everything cached) and past seq_len (the
  // window slides after 8 tokens and the rest is recomputed).
  Gpt model(generate_tiny(), 3);
  make_opinionated(model);
  for (double temperature : {0.0, 1.0}) {
    for (int64_t n : {4, 12}) {
      SamplingOptions o;
      o.max_new_tokens = n;
      o.temperature = temperature;
      o.top_k = temperature > 0 ? 10 : 0;
      o.seed = 21;
      const auto cached = generate(model, {4, 9, 1}, o);
      o.kv_cache = false;
      const auto recomputed = generate(model, {4, 9, 1}, o);
      EXPECT_EQ(cached, recomputed) << "temperature " << temperature << ", " << n << " tokens";
      EXPECT_GE(std::set<int64_t>(cached.begin(), cached.end()).size(), 2u);
    }
  }
}

}  // namespace
}  // namespace triad::nn
