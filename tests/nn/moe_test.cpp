// Mixtures of experts (model.moe): the routing, the layer against its
// definition written out token by token, its gradients (the load-balancing
// loss's included) against finite differences, and the model's shapes and
// counts.
#include "triad/nn/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/gradcheck.h"
#include "triad/autograd/engine.h"
#include "triad/autograd/grad_mode.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"
#include "triad/optim/adamw.h"

namespace triad::nn {
namespace {

// f must throw an E whose message holds `fragment`.
template <class E, class F>
void expect_refused(F&& f, const std::string& fragment) {
  try {
    f();
    FAIL() << "expected an error with '" << fragment << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

GptConfig moe_config(int64_t experts = 4, int64_t top_k = 2,
                     Activation activation = Activation::SwiGlu) {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 8;
  c.vocab_size = 32;
  c.seq_len = 8;
  c.activation = activation;
  c.ffn_hidden_size = 12;
  c.moe.experts = experts;
  c.moe.top_k = top_k;
  c.moe.ffn_hidden_size = 6;
  c.moe.aux_loss_coef = 0.0;
  return c;
}

// Random f64 weights for every parameter of a module (never all zeros).
void randomise(Module& m, uint64_t seed) {
  m.to(DType::F64);
  uint64_t stream = 1;
  for (auto& [name, p] : m.named_parameters()) {
    Tensor r = randn(p.shape(), seed, stream++, 0.5, DType::F64);
    copy_(p, r);
  }
}

TEST(AttachLoss, GivesTheLossItsWeightAndPassesTheRestOn) {
  // y = attach_loss(x, sum(z^2), 0.75) * x: y's value is x * x, and the
  // gradients are those of sum(w * x * x) + 0.75 * sum(z^2).
  Tensor x = randn({3, 4}, 1, 1, 1.0, DType::F64), z = randn({5}, 1, 2, 1.0, DType::F64);
  x.set_requires_grad(true);
  z.set_requires_grad(true);
  const Tensor w = randn({3, 4}, 1, 3, 1.0, DType::F64);
  const Tensor y = mul(attach_loss(x, sum(mul(z, z)), 0.75), x);
  EXPECT_EQ(to_double_vector(y), to_double_vector(mul(x, x)));
  autograd::backward({y}, {w});
  const std::vector<double> xs = to_double_vector(x), zs = to_double_vector(z),
                            ws = to_double_vector(w), gx = to_double_vector(x.grad()),
                            gz = to_double_vector(z.grad());
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_NEAR(gx[i], 2 * ws[i] * xs[i], 1e-12);
  for (size_t i = 0; i < zs.size(); ++i) EXPECT_NEAR(gz[i], 0.75 * 2 * zs[i], 1e-12);
  expect_refused<ShapeError>([&] { (void)attach_loss(x, z, 1.0); }, "must hold one element");
}

// The weight as a one-element tensor (multi-token prediction's inside a
// captured step under per-token averaging): read when backward runs, so a
// value written after the forward pass is the one the loss's gradient
// takes; the same gradients as the number. A weight of another dtype or
// more than one element is refused by name.
TEST(AttachLoss, ATensorWeightIsReadWhenBackwardRuns) {
  Tensor x = randn({3, 4}, 1, 1, 1.0, DType::F64), z = randn({5}, 1, 2, 1.0, DType::F64);
  x.set_requires_grad(true);
  z.set_requires_grad(true);
  Tensor weight = full({}, 0.25, DType::F64);
  const Tensor y = mul(attach_loss(x, sum(mul(z, z)), weight), x);
  fill_(weight, 0.75);  // (after the forward pass, before backward)
  autograd::backward({sum(y)});
  const std::vector<double> zs = to_double_vector(z), gz = to_double_vector(z.grad());
  for (size_t i = 0; i < zs.size(); ++i) EXPECT_EQ(gz[i], 0.75 * 2 * zs[i]);
  expect_refused<ShapeError>([&] { (void)attach_loss(x, sum(z), full({}, 1.0, DType::F32)); },
                             "of one dtype");
  expect_refused<ShapeError>([&] { (void)attach_loss(x, sum(z), full({2}, 1.0, DType::F64)); },
                             "one element each");
}

TEST(RouteTopK, PicksTheMostProbableExpertsAndGroupsTheRowsByExpert) {
  // 3 tokens, 4 experts, top 2. Token 1 ties experts 0 and 2: the lower first.
  const std::vector<double> probs = {0.1, 0.5, 0.3, 0.1,  //
                                     0.3, 0.1, 0.3, 0.3,  //
                                     0.6, 0.1, 0.2, 0.1};
  const Routing r = route_top_k(probs, 3, 4, 2);
  EXPECT_EQ(r.choice, (std::vector<int64_t>{1, 2, 0, 2, 0, 2}));
  // Expert 0: tokens 1 and 2; expert 1: token 0; expert 2: tokens 0, 1, 2;
  // expert 3: no token, one padding row (token 0, the zero gate at 3 * 2).
  EXPECT_EQ(r.rows, (std::vector<int64_t>{2, 1, 3, 1}));
  EXPECT_EQ(r.load, (std::vector<int64_t>{2, 1, 3, 0}));
  EXPECT_EQ(r.token, (std::vector<int64_t>{1, 2, 0, 0, 1, 2, 0}));
  EXPECT_EQ(r.assignment, (std::vector<int64_t>{2, 4, 0, 1, 3, 5, 6}));
}

TEST(RouteTopK, RefusesImpossibleArguments) {
  const std::vector<double> probs(8, 0.25);
  expect_refused<ValueError>([&] { (void)(route_top_k(probs, 2, 4, 5)); }, "top_k 5 of 4 experts");
  expect_refused<ValueError>([&] { (void)(route_top_k(probs, 3, 4, 2)); },
                             "8 probabilities for 3 tokens");
  std::vector<double> bad = probs;
  bad[5] = std::nan("");
  expect_refused<ValueError>([&] { (void)(route_top_k(bad, 2, 4, 2)); },
                             "token 1's probability for expert 1 is nan");
}

// A capacity: an over-full expert keeps its most probable assignments
// (equal ones the earlier token's) or its earliest, in token order; the
// others get no row. Its load still counts them.
TEST(RouteTopK, AnExpertOverCapacityDropsItsLeastProbableOrLatestAssignments) {
  using Policy = GptConfig::Moe::DropPolicy;
  // 4 tokens, 2 experts, top 1: expert 0 takes tokens 0, 1 and 2 (0.9, 0.6,
  // 0.8), expert 1 token 3.
  const std::vector<double> probs = {0.9, 0.1, 0.6, 0.4, 0.8, 0.2, 0.3, 0.7};
  const Routing by_probs = route_top_k(probs, 4, 2, 1, 2, Policy::Probs);
  EXPECT_EQ(by_probs.token, (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(by_probs.assignment, (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(by_probs.rows, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(by_probs.load, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(by_probs.dropped, 1);
  const Routing by_position = route_top_k(probs, 4, 2, 1, 2, Policy::Position);
  EXPECT_EQ(by_position.token, (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(by_position.dropped, 1);
  // A capacity no expert exceeds changes nothing.
  const Routing roomy = route_top_k(probs, 4, 2, 1, 3), dropless = route_top_k(probs, 4, 2, 1);
  EXPECT_EQ(roomy.token, dropless.token);
  EXPECT_EQ(roomy.assignment, dropless.assignment);
  EXPECT_EQ(roomy.dropped, 0);
  // Top 2 of 2 at capacity 1: expert 0 keeps token 2 (0.6), expert 1 the
  // first of its equal 0.5s, token 0; four assignments are dropped.
  const std::vector<double> ties = {0.5, 0.5, 0.5, 0.5, 0.6, 0.4};
  const Routing one_each = route_top_k(ties, 3, 2, 2, 1);
  EXPECT_EQ(one_each.token, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(one_each.assignment, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(one_each.rows, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(one_each.dropped, 4);
  expect_refused<ValueError>([&] { (void)(route_top_k(probs, 4, 2, 1, -1)); }, "capacity -1");
}

// keep_assignments: a capacity decided elsewhere (context parallelism's
// whole micro-batch) applied to a routing: only the flagged assignments
// keep their rows, in token order; the rest count as dropped; an expert
// left with none gets the padding row.
TEST(RouteTopK, KeepAssignmentsKeepsTheFlaggedRowsOnly) {
  // 3 tokens, top 1 of 2 experts: tokens 0 and 2 choose expert 1, token 1
  // expert 0.
  const std::vector<double> probs{0.2, 0.8, 0.9, 0.1, 0.3, 0.7};
  const Routing r = route_top_k(probs, 3, 2, 1);
  ASSERT_EQ(r.rows, (std::vector<int64_t>{1, 2}));
  const Routing k = keep_assignments(r, {1, 0, 1}, 3, 1);
  EXPECT_EQ(k.rows, (std::vector<int64_t>{1, 2}));  // expert 0 loses token 1: the padding row
  EXPECT_EQ(k.token, (std::vector<int64_t>{0, 0, 2}));
  EXPECT_EQ(k.assignment, (std::vector<int64_t>{3, 0, 2}));
  EXPECT_EQ(k.dropped, 1);
  EXPECT_EQ(k.load, r.load);  // (the choices, dropped ones too)
  EXPECT_EQ(k.choice, r.choice);
  EXPECT_THROW(keep_assignments(r, {1, 1}, 3, 1), ValueError);
}

TEST(ExpertCapacity, IsTheFactorTimesABalancedShareRoundedUp) {
  EXPECT_EQ(expert_capacity(1.0, 8, 4, 2), 4);
  EXPECT_EQ(expert_capacity(1.25, 8, 4, 2), 5);
  EXPECT_EQ(expert_capacity(1.1, 10, 4, 2), 6);  // 5.5 up
  EXPECT_EQ(expert_capacity(0.1, 8, 4, 1), 1);   // at least 1
  EXPECT_EQ(expert_capacity(0.0, 8, 4, 2), 0);   // dropless
  // Past every assignment (8 tokens x 2): no more is needed, and a factor
  // of 1e300 is no capacity an int64 holds.
  EXPECT_EQ(expert_capacity(4.0, 8, 4, 2), 16);
  EXPECT_EQ(expert_capacity(1e300, 8, 4, 2), 16);
  expect_refused<ValueError>([] { (void)(expert_capacity(-1.0, 8, 4, 2)); }, "factor -1");
}

TEST(BalanceLoss, IsOneWhenBalancedAndEOverKWhenCollapsed) {
  // 4 tokens, 4 experts, top 1, each token certain of its own expert.
  std::vector<double> even(16, 0.0);
  for (int n = 0; n < 4; ++n) even[static_cast<size_t>(n * 5)] = 1.0;
  EXPECT_DOUBLE_EQ(balance_loss(route_top_k(even, 4, 4, 1), even), 1.0);
  // Every token certain of experts 0 and 1 (top 2): E / k.
  std::vector<double> collapsed(16, 0.0);
  for (int n = 0; n < 4; ++n)
    collapsed[static_cast<size_t>(n * 4)] = 0.5, collapsed[static_cast<size_t>(n * 4 + 1)] = 0.5;
  EXPECT_DOUBLE_EQ(balance_loss(route_top_k(collapsed, 4, 4, 2), collapsed), 2.0);
}

TEST(BalanceLoss, PerSequenceIsTheMeanOfEachSequencesOwn) {
  // Two experts, top 1; the first sequence of 2 tokens balanced (1), the
  // second collapsed onto expert 0 (2): 1.5, where the micro-batch as one
  // (f = P = (3/4, 1/4)) gives 1.25.
  const std::vector<double> p = {1, 0, 0, 1, 1, 0, 1, 0};
  const Routing r = route_top_k(p, 4, 2, 1);
  EXPECT_DOUBLE_EQ(balance_loss(r, p, 2), 1.5);
  EXPECT_DOUBLE_EQ(balance_loss(r, p), 1.25);
  EXPECT_DOUBLE_EQ(balance_loss(r, p, 4), 1.25);
  expect_refused<ValueError>([&] { (void)balance_loss(r, p, 3); },
                             "sequences of 3 tokens do not divide 4");
}

// The layer's definition, token by token, on the host: softmax of the
// router's logits, the top k (renormalised or not), each chosen expert's
// MLP (SwiGLU: silu(gate) * up) weighted by its gate.
// A SwiGLU expert's output (C) for one token x (C) on the host: c_fc (2F,
// C) holds [gate | up], c_proj (C, F) reads silu(gate) * up.
std::vector<double> swiglu_expert_by_hand(const std::vector<double>& fc,
                                          const std::vector<double>& proj, const double* x,
                                          int64_t C, int64_t F) {
  std::vector<double> hidden(static_cast<size_t>(F));
  for (int64_t f = 0; f < F; ++f) {
    double a = 0, b = 0;
    for (int64_t c = 0; c < C; ++c) {
      a += fc[static_cast<size_t>(f * C + c)] * x[c];
      b += fc[static_cast<size_t>((F + f) * C + c)] * x[c];
    }
    hidden[static_cast<size_t>(f)] = a / (1.0 + std::exp(-a)) * b;
  }
  std::vector<double> y(static_cast<size_t>(C), 0.0);
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t f = 0; f < F; ++f)
      y[static_cast<size_t>(c)] +=
          proj[static_cast<size_t>(c * F + f)] * hidden[static_cast<size_t>(f)];
  }
  return y;
}

std::vector<double> moe_by_hand(MoeMlp& moe, const GptConfig& cfg, const Tensor& x) {
  const auto state = moe.state_dict();
  const int64_t C = cfg.d_model, E = cfg.moe.experts, F = cfg.expert_ffn();
  const std::vector<double> xs = to_double_vector(x),
                            router = to_double_vector(state.at("router.weight"));
  const int64_t N = x.numel() / C;
  std::vector<double> out(static_cast<size_t>(N * C), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const double* xn = xs.data() + n * C;
    std::vector<double> logit(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += router[static_cast<size_t>(e * C + c)] * xn[c];
      logit[static_cast<size_t>(e)] = s;
    }
    if (cfg.moe.score == GptConfig::Moe::Score::Sigmoid) {
      for (double& l : logit) l = 1.0 / (1.0 + std::exp(-l));
    } else {
      const double top = *std::max_element(logit.begin(), logit.end());
      double z = 0;
      for (double& l : logit) z += (l = std::exp(l - top));
      for (double& l : logit) l /= z;
    }
    // Chosen by score plus bias, among the experts of the best groups (a
    // group's score: its two best, or its best under group_score max).
    std::vector<double> by = logit;
    if (cfg.moe.expert_bias) {
      const std::vector<double> bias = to_double_vector(state.at("expert_bias"));
      for (int64_t e = 0; e < E; ++e) by[static_cast<size_t>(e)] += bias[static_cast<size_t>(e)];
    }
    const int64_t G = cfg.moe.groups, size = E / G;
    std::vector<std::pair<double, int64_t>> group;
    for (int64_t g = 0; g < G; ++g) {
      std::vector<double> in(by.begin() + g * size, by.begin() + (g + 1) * size);
      std::sort(in.rbegin(), in.rend());
      const bool two = size > 1 && cfg.moe.group_score == GptConfig::Moe::GroupScore::TopTwoSum;
      group.push_back({-(two ? in[0] + in[1] : in[0]), g});
    }
    std::sort(group.begin(), group.end());
    std::vector<int64_t> order;
    for (int64_t g = 0; g < cfg.moe.top_groups; ++g) {
      for (int64_t e = 0; e < size; ++e)
        order.push_back(group[static_cast<size_t>(g)].second * size + e);
    }
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return by[static_cast<size_t>(a)] > by[static_cast<size_t>(b)];
    });
    double chosen = 0;
    for (int64_t j = 0; j < cfg.moe.top_k; ++j) chosen += logit[static_cast<size_t>(order[j])];
    for (int64_t j = 0; j < cfg.moe.top_k; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      const double gate = logit[static_cast<size_t>(e)] / (cfg.moe.normalize_top_k ? chosen : 1.0) *
                          cfg.moe.routed_scaling_factor;
      const std::string p = "experts." + std::to_string(e) + ".";
      const std::vector<double> y =
          swiglu_expert_by_hand(to_double_vector(state.at(p + "c_fc.weight")),
                                to_double_vector(state.at(p + "c_proj.weight")), xn, C, F);
      for (int64_t c = 0; c < C; ++c)
        out[static_cast<size_t>(n * C + c)] += gate * y[static_cast<size_t>(c)];
    }
  }
  return out;
}

TEST(MoeMlp, EqualsItsDefinitionTokenByToken) {
  for (const bool normalize : {true, false}) {
    SCOPED_TRACE(normalize ? "renormalised top k" : "raw probabilities");
    GptConfig cfg = moe_config(5, 2);
    cfg.moe.normalize_top_k = normalize;
    MoeMlp moe(cfg, 0);
    randomise(moe, 3);
    const Tensor x = randn({2, 7, cfg.d_model}, 5, 1, 1.0, DType::F64);
    const Tensor y = moe.forward(x, {false, 0, 0});
    ASSERT_EQ(y.shape(), x.shape());
    const std::vector<double> got = to_double_vector(y), want = moe_by_hand(moe, cfg, x);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << i;
  }
}

// DeepSeek-V3's routing: sigmoid scores, chosen with the expert biases
// among the best groups' experts, the gates the unbiased scores
// renormalised and scaled; the biases (f32 under any precision) are state.
TEST(MoeMlp, SigmoidScoresBiasedGroupLimitedChoiceEqualsItsDefinition) {
  for (const bool normalize : {true, false}) {
    SCOPED_TRACE(normalize ? "renormalised top k" : "raw scores");
    GptConfig cfg = moe_config(8, 3);
    cfg.moe.normalize_top_k = normalize;
    cfg.moe.score = GptConfig::Moe::Score::Sigmoid;
    cfg.moe.routed_scaling_factor = 2.5;
    cfg.moe.groups = 4;
    cfg.moe.top_groups = 2;
    cfg.moe.expert_bias = true;
    MoeMlp moe(cfg, 1);
    const auto named = moe.named_parameters();
    const auto bias = std::find_if(named.begin(), named.end(),
                                   [](const auto& p) { return p.first == "expert_bias"; });
    ASSERT_NE(bias, named.end());
    EXPECT_FALSE(bias->second.requires_grad());
    randomise(moe, 3);  // (the bias too: it stays f32)
    EXPECT_EQ(bias->second.dtype(), DType::F32);
    EXPECT_EQ(moe.find_parameter("router.weight")->dtype(), DType::F64);
    const Tensor x = randn({2, 9, cfg.d_model}, 5, 1, 1.0, DType::F64);
    const std::vector<double> got = to_double_vector(moe.forward(x, {false, 0, 0})),
                              want = moe_by_hand(moe, cfg, x);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << i;
    // The biases change the choice: without them the output differs.
    Tensor b = bias->second;
    copy_(b, zeros({8}, DType::F32));
    const std::vector<double> unbiased = to_double_vector(moe.forward(x, {false, 0, 0}));
    double moved = 0;
    for (size_t i = 0; i < got.size(); ++i) moved = std::max(moved, std::abs(got[i] - unbiased[i]));
    EXPECT_GT(moved, 1e-3);
  }
}

// DeepSeek-V2's routing: softmax probabilities, each token's top 2 among
// the experts of its best 2 of 4 groups, a group scored by its best expert,
// the gates the probabilities times 16, not renormalised.
TEST(MoeMlp, SoftmaxGroupsScoredByTheirBestEqualTheirDefinition) {
  GptConfig cfg = moe_config(8, 2);
  cfg.moe.normalize_top_k = false;
  cfg.moe.routed_scaling_factor = 16.0;
  cfg.moe.groups = 4;
  cfg.moe.top_groups = 2;
  cfg.moe.group_score = GptConfig::Moe::GroupScore::Max;
  cfg.validate();
  MoeMlp moe(cfg, 1);
  randomise(moe, 4);
  const Tensor x = randn({2, 9, cfg.d_model}, 6, 1, 1.0, DType::F64);
  const std::vector<double> got = to_double_vector(moe.forward(x, {false, 0, 0})),
                            want = moe_by_hand(moe, cfg, x);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << i;
  // Scored by their two best instead, some token's groups differ.
  GptConfig two = cfg;
  two.moe.group_score = GptConfig::Moe::GroupScore::TopTwoSum;
  MoeMlp other(two, 1);
  other.to(DType::F64);
  other.load_state_dict(moe.state_dict());
  const std::vector<double> by_two = to_double_vector(other.forward(x, {false, 0, 0}));
  double moved = 0;
  for (size_t i = 0; i < got.size(); ++i) moved = std::max(moved, std::abs(got[i] - by_two[i]));
  EXPECT_GT(moved, 1e-3);
}

TEST(RouteTopK, BiasesAndGroupsShapeTheChoiceButNotTheRows) {
  // One token, four experts in two groups.
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.25};
  EXPECT_EQ(route_top_k(p, 1, 4, 2).choice, (std::vector<int64_t>{2, 3}));
  // Biases lift experts 0 and 1 over the others.
  const ExpertChoice lifted{{0.5, 0.3, 0, 0}, 1, 1};
  EXPECT_EQ(route_top_k(p, 1, 4, 2, 0, GptConfig::Moe::DropPolicy::Probs, lifted).choice,
            (std::vector<int64_t>{0, 1}));
  // Groups {0, 1} (0.3) and {2, 3} (0.55): one group allowed, the second.
  const ExpertChoice grouped{{}, 2, 1};
  EXPECT_EQ(route_top_k(p, 1, 4, 2, 0, GptConfig::Moe::DropPolicy::Probs, grouped).choice,
            (std::vector<int64_t>{2, 3}));
  // Scored by its best expert alone, group {2, 3} still wins (0.3 against
  // 0.2); with expert 0 at 0.35, {0, 1} wins by its best though its two
  // sum to less (0.4 against 0.55).
  const ExpertChoice by_best{{}, 2, 1, 1};
  EXPECT_EQ(route_top_k(p, 1, 4, 2, 0, GptConfig::Moe::DropPolicy::Probs, by_best).choice,
            (std::vector<int64_t>{2, 3}));
  const std::vector<double> peaked = {0.35, 0.05, 0.3, 0.25};
  EXPECT_EQ(route_top_k(peaked, 1, 4, 2, 0, GptConfig::Moe::DropPolicy::Probs, by_best).choice,
            (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(route_top_k(peaked, 1, 4, 2, 0, GptConfig::Moe::DropPolicy::Probs, grouped).choice,
            (std::vector<int64_t>{2, 3}));
  expect_refused<ValueError>(
      [&] {
        route_top_k(p, 1, 4, 1, 0, GptConfig::Moe::DropPolicy::Probs, {{}, 2, 1, 0});
      },
      "a group scored by its 0 best experts (expected at least 1)");
  // A group is scored with the biases: {0, 1} wins, however probable 2 is.
  const ExpertChoice both{{0.2, 0.2, 0, 0}, 2, 1};
  const Routing r = route_top_k(p, 1, 4, 1, 0, GptConfig::Moe::DropPolicy::Probs, both);
  EXPECT_EQ(r.choice, (std::vector<int64_t>{1}));
  EXPECT_EQ(r.load, (std::vector<int64_t>{0, 1, 0, 0}));
  expect_refused<ValueError>(
      [&] {
        route_top_k(p, 1, 4, 2, 0, GptConfig::Moe::DropPolicy::Probs, {{0.1, 0.2}, 1, 1});
      },
      "2 expert biases for 4 experts");
  expect_refused<ValueError>(
      [&] {
        route_top_k(p, 1, 4, 3, 0, GptConfig::Moe::DropPolicy::Probs, {{}, 2, 1});
      },
      "top_k 3 within the best 1 of 2 groups");
  expect_refused<ValueError>(
      [&] {
        route_top_k(p, 1, 4, 1, 0, GptConfig::Moe::DropPolicy::Probs, {{}, 3, 1});
      },
      "groups dividing the experts");
  expect_refused<ValueError>(
      [&] {
        route_top_k(p, 1, 4, 1, 0, GptConfig::Moe::DropPolicy::Probs, {{0, NAN, 0, 0}, 1, 1});
      },
      "expert 1's bias is nan");
}

TEST(UpdateExpertBias, MovesEachBiasByTheRateTowardsTheMeanLoad) {
  Tensor bias = from_vector(std::vector<double>{0.5, 0, -0.25, 1}, {4}, DType::F32);
  // Mean load 5: expert 0 under it, 1 at it, 2 and 3 over.
  update_expert_bias(bias, {2, 5, 6, 7}, 0.125);
  EXPECT_EQ(to_double_vector(bias), (std::vector<double>{0.625, 0, -0.375, 0.875}));
  EXPECT_EQ(bias.dtype(), DType::F32);
  expect_refused<ValueError>(
      [&] {
        update_expert_bias(bias, {1, 2}, 0.1);
      },
      "2 loads for biases [4]");
  expect_refused<ValueError>(
      [&] {
        update_expert_bias(bias, {1, 2, INFINITY, 0}, 0.1);
      },
      "expert 2's load is inf");
}

// A shared expert (Qwen2-MoE's): every token's output gains sigmoid(x . w)
// times the shared MLP of x, with or without the gate.
TEST(MoeMlp, ASharedExpertAddsItsGatedOutputForEveryToken) {
  for (const bool gated : {true, false}) {
    SCOPED_TRACE(gated ? "gated" : "ungated");
    GptConfig cfg = moe_config(4, 2);
    cfg.moe.shared_ffn_hidden_size = 5;
    cfg.moe.shared_gate = gated;
    MoeMlp moe(cfg, 0);
    randomise(moe, 41);
    GptConfig routed_only = cfg;
    routed_only.moe.shared_ffn_hidden_size = 0;
    routed_only.moe.shared_gate = false;
    MoeMlp routed(routed_only, 0);
    routed.to(DType::F64);
    nn::StateDict weights;
    for (const auto& [name, p] : moe.state_dict()) {
      if (name.rfind("shared", 0) != 0) weights.emplace(name, p);
    }
    routed.load_state_dict(weights);
    const Tensor x = randn({2, 3, cfg.d_model}, 43, 1, 1.0, DType::F64);
    const std::vector<double> with = to_double_vector(moe.forward(x, {false, 0, 0})),
                              without = to_double_vector(routed.forward(x, {false, 0, 0}));
    const auto state = moe.state_dict();
    const std::vector<double> xs = to_double_vector(x),
                              fc = to_double_vector(state.at("shared.c_fc.weight")),
                              proj = to_double_vector(state.at("shared.c_proj.weight"));
    const int64_t C = cfg.d_model, F = 5;
    for (int64_t n = 0; n < 6; ++n) {
      const double* xn = xs.data() + n * C;
      double gate = 1.0;
      if (gated) {
        const std::vector<double> w = to_double_vector(state.at("shared_gate.weight"));
        double z = 0;
        for (int64_t c = 0; c < C; ++c) z += w[static_cast<size_t>(c)] * xn[c];
        gate = 1.0 / (1.0 + std::exp(-z));
      }
      const std::vector<double> y = swiglu_expert_by_hand(fc, proj, xn, C, F);
      for (int64_t c = 0; c < C; ++c) {
        const size_t i = static_cast<size_t>(n * C + c);
        ASSERT_NEAR(with[i] - without[i], gate * y[static_cast<size_t>(c)], 1e-12) << "token " << n;
      }
    }
  }
}

// While training, a capacity factor drops the assignments over each
// expert's capacity: a token whose only expert dropped it gets 0 (the
// residual carries it), every other token the dropless output; evaluation
// is dropless. The layer reports the share dropped.
TEST(MoeMlp, OverCapacityAssignmentsAreDroppedWhileTrainingOnly) {
  using Policy = GptConfig::Moe::DropPolicy;
  for (const Policy policy : {Policy::Probs, Policy::Position}) {
    SCOPED_TRACE(policy == Policy::Probs ? "probs" : "position");
    GptConfig cfg = moe_config(4, 1);
    cfg.moe.normalize_top_k = false;
    cfg.moe.capacity_factor = 0.5;  // ceil(0.5 * 10 / 4) = 2 tokens an expert
    cfg.moe.drop_policy = policy;
    MoeMlp moe(cfg, 0);
    randomise(moe, 51);
    const Tensor x = randn({2, 5, cfg.d_model}, 53, 1, 1.0, DType::F64);
    const Routing r =
        route_top_k(to_double_vector(moe.route(x).probs), 10, 4, 1, 2, cfg.moe.drop_policy);
    ASSERT_GT(r.dropped, 0);
    ForwardContext ctx{true, 0, 0};
    ctx.moe_stats = std::make_shared<MoeStats>();
    const std::vector<double> trained = to_double_vector(moe.forward(x, ctx)),
                              dropless = to_double_vector(moe.forward(x, {false, 0, 0}));
    EXPECT_DOUBLE_EQ(ctx.moe_stats->mean_dropped(), static_cast<double>(r.dropped) / 10.0);
    std::vector<bool> kept(10, false);
    for (size_t i = 0; i < r.token.size(); ++i) {
      if (r.assignment[i] < 10) kept[static_cast<size_t>(r.token[i])] = true;
    }
    int64_t zeros = 0;
    for (int64_t n = 0; n < 10; ++n) {
      for (int64_t c = 0; c < cfg.d_model; ++c) {
        const size_t i = static_cast<size_t>(n * cfg.d_model + c);
        // (The experts' batches differ in size: the same sums up to rounding.)
        if (kept[static_cast<size_t>(n)]) {
          ASSERT_NEAR(trained[i], dropless[i], 1e-12) << n;
        } else {
          ASSERT_EQ(trained[i], 0.0) << n;
        }
      }
      zeros += kept[static_cast<size_t>(n)] ? 0 : 1;
    }
    EXPECT_EQ(zeros, r.dropped);
  }
}

// model.moe.pad_to_capacity: each expert's batch padded to its capacity,
// its slots filled by Backend::capacity_slots, gives what the routing read
// on the host gives under the same capacity and drop policy: the outputs,
// every gradient, the balance and z-losses and the statistics; only the
// experts' batches (and so their sums' rounding) differ.
TEST(MoeMlp, PaddedToCapacityEqualsTheRoutingReadOnTheHost) {
  for (const std::string variant :
       {"gelu top 2", "swiglu top 1, shared expert, per sequence", "sigmoid, biased, groups",
        "gelu top 2, by position", "swiglu top 1, by position"}) {
    SCOPED_TRACE(variant);
    GptConfig cfg = moe_config(4, variant[1] == 'w' ? 1 : 2,
                               variant[0] == 'g' ? Activation::Gelu : Activation::SwiGlu);
    cfg.moe.capacity_factor = 0.75;
    cfg.moe.drop_policy = variant.find("position") != std::string::npos
                              ? GptConfig::Moe::DropPolicy::Position
                              : GptConfig::Moe::DropPolicy::Probs;
    cfg.moe.aux_loss_coef = 0.1;
    cfg.moe.z_loss_coef = 0.01;
    if (variant.find("shared") != std::string::npos) {
      cfg.moe.shared_ffn_hidden_size = 4;
      cfg.moe.aux_loss_scope = GptConfig::Moe::BalanceScope::Sequence;
    }
    if (variant[1] == 'i') {
      cfg.moe.score = GptConfig::Moe::Score::Sigmoid;
      cfg.moe.expert_bias = true;
      cfg.moe.groups = 2;
      cfg.moe.top_groups = 1;
    }
    GptConfig padded_cfg = cfg;
    padded_cfg.moe.pad_to_capacity = true;
    MoeMlp host(cfg, 0), padded(padded_cfg, 0);
    randomise(host, 71);
    randomise(padded, 71);
    const Tensor x0 = randn({2, 6, cfg.d_model}, 73, 1, 1.0, DType::F64),
                 w = randn({2, 6, cfg.d_model}, 73, 2, 1.0, DType::F64);
    struct Run {
      std::vector<double> out, dx;
      std::map<std::string, std::vector<double>> grads;
      std::shared_ptr<MoeStats> stats = std::make_shared<MoeStats>();
    };
    const auto run = [&](MoeMlp& m) {
      Run r;
      Tensor x = clone(x0);
      x.set_requires_grad(true);
      ForwardContext ctx{true, 0, 0};
      ctx.moe_stats = r.stats;
      const Tensor y = m.forward(x, ctx);
      autograd::backward({y}, {w});
      r.out = to_double_vector(y);
      r.dx = to_double_vector(x.grad());
      for (const auto& [name, p] : m.named_parameters())
        if (p.grad().defined()) r.grads[name] = to_double_vector(p.grad());
      return r;
    };
    const Run a = run(host), b = run(padded);
    const auto near = [](const std::vector<double>& got, const std::vector<double>& want,
                         const std::string& what) {
      ASSERT_EQ(got.size(), want.size()) << what;
      for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << what << i;
    };
    near(b.out, a.out, "output");
    near(b.dx, a.dx, "input gradient");
    ASSERT_EQ(b.grads.size(), a.grads.size());
    for (const auto& [name, g] : a.grads) near(b.grads.at(name), g, name);
    EXPECT_GT(a.stats->dropped_sum, 0.0);  // (the capacity drops some)
    EXPECT_DOUBLE_EQ(b.stats->dropped_sum, a.stats->dropped_sum);
    EXPECT_DOUBLE_EQ(b.stats->max_load, a.stats->max_load);
    EXPECT_NEAR(b.stats->balance_sum, a.stats->balance_sum, 1e-12);
    EXPECT_NEAR(b.stats->z_loss_sum, a.stats->z_loss_sum, 1e-12);
    EXPECT_EQ(b.stats->records, 1);
    EXPECT_EQ(b.stats->loads, a.stats->loads);
    // Evaluation stays dropless: both alike, nothing padded.
    near(to_double_vector(padded.forward(x0, {false, 0, 0})),
         to_double_vector(host.forward(x0, {false, 0, 0})), "evaluation");
  }
}

// Statistics left on the device (a CUDA graph's) read as those recorded
// at once: MoeStats::settle reads every pending layer's counts, summed
// probabilities and z-loss in one copy and records each as record_counts.
// Layer 2's routing left on the device: counts (2, 4) of 4 tokens choosing
// 2, summed probabilities (2, 4) and a z-loss of 0.25, at capacity 3.
MoeStats::Pending later_pending(const std::vector<double>& counts,
                                const std::vector<double>& sums) {
  return {2,
          4,
          2,
          3,
          from_vector(counts, {2, 4}, DType::I64),
          from_vector(sums, {2, 4}, DType::F32),
          from_vector(std::vector<double>{0.25}, {}, DType::F32)};
}

TEST(MoeStats, SettleRecordsWhatThePendingCountsSay) {
  const std::vector<double> counts{3, 1, 0, 4, 2, 2, 3, 1}, sums{1.5, 0.5, 1, 1, 2, 1, 0.5, 0.5};
  MoeStats now, later;
  now.record_counts(2, counts, sums, 0.25, 4, 2, 4, 3);
  now.record_counts(5, counts, sums, 0.0, 4, 2, 4, 2);
  later.pending.push_back(later_pending(counts, sums));
  later.pending.push_back({5, 4, 2, 2, from_vector(counts, {2, 4}, DType::I64),
                           from_vector(sums, {2, 4}, DType::F32), Tensor{}});
  later.settle();
  EXPECT_TRUE(later.pending.empty());
  EXPECT_EQ(later.records, 2);
  EXPECT_EQ(later.balance_sum, now.balance_sum);
  EXPECT_EQ(later.max_load, now.max_load);
  EXPECT_EQ(later.dropped_sum, now.dropped_sum);
  EXPECT_EQ(later.z_loss_sum, now.z_loss_sum);
  EXPECT_EQ(later.loads, now.loads);
  // By hand: loads (5, 3, 3, 5) of 16 assignments; over capacity 3, 4
  // dropped (2 + 2); over 2, 8; the busiest at 5 * 4 / 16.
  EXPECT_EQ(now.loads.at(2), (std::vector<double>{5, 3, 3, 5}));
  EXPECT_DOUBLE_EQ(now.dropped_sum, 4.0 / 16 + 8.0 / 16);
  EXPECT_DOUBLE_EQ(now.max_load, 5.0 * 4 / 16);
  EXPECT_DOUBLE_EQ(now.z_loss_sum, 0.25);
  later.settle();  // (nothing pending: nothing changes)
  EXPECT_EQ(later.records, 2);
  EXPECT_FALSE(later.pending_values().defined());
  // In two halves (a caller reading the values with its own): the same
  // records; a wrong count of values is refused and keeps the records.
  MoeStats halves;
  halves.pending = {later_pending(counts, sums)};
  const Tensor values = halves.pending_values();
  ASSERT_EQ(values.numel(), 8 + 8 + 1);
  std::vector<double> read = to_double_vector(values);
  EXPECT_THROW(halves.settle(std::vector<double>(read.begin(), read.end() - 1)), ValueError);
  ASSERT_EQ(halves.pending.size(), 1u);
  halves.settle(read);
  EXPECT_EQ(halves.records, 1);
  EXPECT_EQ(halves.loads.at(2), now.loads.at(2));
  // Counts short of every token's top_k choices: some tokens chose no
  // expert (their router scores not finite), named with the layer.
  std::vector<double> short_counts = counts;
  short_counts[5] -= 2;
  halves.pending = {later_pending(short_counts, sums)};
  try {
    halves.settle();
    ADD_FAILURE() << "no error for tokens that chose no expert";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("(layer 2): 2 of the 16 routing choices chose no expert"),
              std::string::npos)
        << e.what();
  }
}

TEST(MoeMlp, GradientsOfInputRouterAndExpertsMatchFiniteDifferences) {
  for (const std::string variant : {"swiglu", "gelu, a gated shared expert", "swiglu, capacity"}) {
    SCOPED_TRACE(variant);
    GptConfig cfg = moe_config(4, 2, variant[0] == 's' ? Activation::SwiGlu : Activation::Gelu);
    if (variant[0] == 'g') {
      cfg.moe.shared_ffn_hidden_size = 3;
      cfg.moe.shared_gate = true;
    }
    // (15 tokens, 4 experts of capacity ceil(0.6 * 30 / 4) = 5.)
    if (variant.find("capacity") != std::string::npos) cfg.moe.capacity_factor = 0.6;
    auto moe = std::make_shared<MoeMlp>(cfg, 1);
    randomise(*moe, 11);
    std::vector<Tensor> inputs{randn({3, 5, cfg.d_model}, 13, 1, 1.0, DType::F64)};
    for (auto& [name, p] : moe->named_parameters()) inputs.push_back(p);
    testing::expect_gradients_match(
        [moe](const std::vector<Tensor>& in) {
          return moe->forward(in[0], {true, 0, 0});
        },
        inputs, 1e-6, 1e-5, 1e-8);
  }
}

// A loss the layer computes beside its output (the load-balancing loss, the
// router z-loss) joins backward with weight coef * loss_grad: after
// backward of y = moe(x) from w, the router's gradient is that of
// J = sum(y * w) + coef * loss_grad * (the loss the layer reports, `reported`
// of its statistics) by central differences; and with the coefficient at 0
// (`without`) the gradient differs, so the check means something.
void expect_side_loss_in_router_gradient(const GptConfig& cfg, const GptConfig& without,
                                         uint64_t seed,
                                         const std::function<double(const MoeStats&)>& reported) {
  MoeMlp moe(cfg, 0);
  randomise(moe, seed);
  const Tensor x = randn({2, 6, cfg.d_model}, seed + 2, 1, 1.0, DType::F64);
  const Tensor w = randn({2, 6, cfg.d_model}, seed + 2, 2, 1.0, DType::F64);
  const double loss_grad = 0.7;
  const double coef = cfg.moe.aux_loss_coef + cfg.moe.z_loss_coef;  // (one of them is 0)
  auto objective = [&] {
    autograd::NoGradGuard ng;
    ForwardContext ctx{true, 0, 0};
    ctx.moe_stats = std::make_shared<MoeStats>();
    const std::vector<double> y = to_double_vector(moe.forward(x, ctx)), ws = to_double_vector(w);
    double j = 0;
    for (size_t i = 0; i < y.size(); ++i) j += y[i] * ws[i];
    EXPECT_EQ(ctx.moe_stats->records, 1);
    return j + coef * loss_grad * reported(*ctx.moe_stats);
  };
  ForwardContext ctx{true, 0, 0};
  ctx.loss_grad = loss_grad;
  autograd::backward({moe.forward(x, ctx)}, {w});
  Tensor router = moe.state_dict().at("router.weight");
  const std::vector<double> analytic = to_double_vector(router.grad());
  double* data = router.data<double>();
  for (int64_t i = 0; i < router.numel(); ++i) {
    const double saved = data[i], eps = 1e-6;
    data[i] = saved + eps;
    const double up = objective();
    data[i] = saved - eps;
    const double down = objective();
    data[i] = saved;
    EXPECT_NEAR(analytic[static_cast<size_t>(i)], (up - down) / (2 * eps), 1e-7) << i;
  }
  MoeMlp plain(without, 0);
  plain.to(DType::F64);
  plain.load_state_dict(moe.state_dict());
  autograd::backward({plain.forward(x, ctx)}, {w});
  const std::vector<double> other = to_double_vector(plain.state_dict().at("router.weight").grad());
  double differ = 0;
  for (size_t i = 0; i < other.size(); ++i)
    differ = std::max(differ, std::abs(other[i] - analytic[i]));
  EXPECT_GT(differ, 1e-4);
}

TEST(MoeMlp, LoadBalancingLossJoinsTheGradientWithItsWeight) {
  // E sum_e f_e P_e, f_e fixed by the routing (which a small step does not
  // change).
  GptConfig cfg = moe_config(4, 2);
  cfg.moe.aux_loss_coef = 0.3;
  GptConfig without = cfg;
  without.moe.aux_loss_coef = 0;
  expect_side_loss_in_router_gradient(cfg, without, 21,
                                      [](const MoeStats& s) { return s.balance_sum; });
}

// DeepSeek-V3's sequence-wise balance (each of the 2 sequences' own f and
// P), and the loss over sigmoid scores (each token's over their sum), join
// the gradient as their reported values say; each differs from the
// micro-batch's softmax loss.
TEST(MoeMlp, PerSequenceAndSigmoidBalanceLossesJoinTheGradient) {
  GptConfig batch = moe_config(4, 2);
  batch.moe.aux_loss_coef = 0.3;
  GptConfig per_sequence = batch;
  per_sequence.moe.aux_loss_scope = GptConfig::Moe::BalanceScope::Sequence;
  expect_side_loss_in_router_gradient(per_sequence, batch, 23,
                                      [](const MoeStats& s) { return s.balance_sum; });
  GptConfig sigmoid = per_sequence;
  sigmoid.moe.score = GptConfig::Moe::Score::Sigmoid;
  sigmoid.moe.expert_bias = true;
  GptConfig unbalanced = sigmoid;
  unbalanced.moe.aux_loss_coef = 0;
  expect_side_loss_in_router_gradient(sigmoid, unbalanced, 29,
                                      [](const MoeStats& s) { return s.balance_sum; });
}

// The router z-loss (ST-MoE): mean_n logsumexp(logits_n)^2, reported as its
// formula gives it on the router's own logits; evaluation adds and
// reports nothing.
TEST(MoeMlp, RouterZLossJoinsTheGradientWithItsWeight) {
  GptConfig cfg = moe_config(4, 2);
  cfg.moe.aux_loss_coef = 0;
  cfg.moe.z_loss_coef = 0.4;
  GptConfig without = cfg;
  without.moe.z_loss_coef = 0;
  expect_side_loss_in_router_gradient(cfg, without, 31,
                                      [](const MoeStats& s) { return s.z_loss_sum; });
  MoeMlp moe(cfg, 0);
  randomise(moe, 31);
  const Tensor x = randn({2, 6, cfg.d_model}, 33, 1, 1.0, DType::F64);
  autograd::NoGradGuard ng;
  ForwardContext ctx{true, 0, 0};
  ctx.moe_stats = std::make_shared<MoeStats>();
  moe.forward(x, ctx);
  const std::vector<double> logits = to_double_vector(
      matmul(reshape(x, {12, cfg.d_model}), transpose(moe.state_dict().at("router.weight"), 0, 1)));
  double z = 0;
  for (int64_t n = 0; n < 12; ++n) {
    double s = 0;
    for (int64_t e = 0; e < 4; ++e) s += std::exp(logits[static_cast<size_t>(n * 4 + e)]);
    z += std::log(s) * std::log(s) / 12;
  }
  EXPECT_NEAR(ctx.moe_stats->mean_z_loss(), z, 1e-12);
  EXPECT_GT(z, 0.0);
  ForwardContext eval{false, 0, 0};
  eval.moe_stats = std::make_shared<MoeStats>();
  moe.forward(x, eval);
  EXPECT_EQ(eval.moe_stats->records, 0);
}

TEST(MoeMlp, AnExpertNoTokenChoseStillTakesAZeroGradient) {
  GptConfig cfg = moe_config(4, 1);
  MoeMlp moe(cfg, 0);
  randomise(moe, 31);
  // Router rows w, -w, anything, 0: expert 0 or 1 has a logit >= 0 = expert
  // 3's for every token (a tie goes to the lower index), so no token picks 3.
  {
    autograd::NoGradGuard ng;
    Tensor router = moe.state_dict().at("router.weight");
    Tensor second = narrow(router, 0, 1, 1), last = narrow(router, 0, 3, 1);
    copy_(second, scale(narrow(router, 0, 0, 1), -1.0));
    fill_(last, 0.0);
  }
  const Tensor x = randn({2, 5, cfg.d_model}, 33, 1, 1.0, DType::F64);
  const Tensor y = moe.forward(x, {true, 0, 0});
  autograd::backward({y}, {randn(y.shape(), 33, 2, 1.0, DType::F64)});
  const auto state = moe.state_dict();
  for (const char* w : {"c_fc.weight", "c_proj.weight"}) {
    const Tensor unused = state.at(std::string("experts.3.") + w).grad();
    ASSERT_TRUE(unused.defined()) << w;
    for (const double v : to_double_vector(unused)) ASSERT_EQ(v, 0.0) << w;
    double used = 0;
    for (const double v : to_double_vector(state.at(std::string("experts.0.") + w).grad()))
      used = std::max(used, std::abs(v));
    EXPECT_GT(used, 0.0) << w;
  }
  // Its weights do not reach the output, bit for bit.
  {
    autograd::NoGradGuard ng;
    Tensor fc = state.at("experts.3.c_fc.weight");
    copy_(fc, randn(fc.shape(), 35, 1, 100.0, DType::F64));
  }
  const std::vector<double> before = to_double_vector(y),
                            after = to_double_vector(moe.forward(x, {false, 0, 0}));
  EXPECT_EQ(before, after);
}

TEST(MoeMlp, ChecksItsInputs) {
  const GptConfig cfg = moe_config();
  MoeMlp moe(cfg, 0);
  expect_refused<ShapeError>(
      [&] {
        (void)(moe.forward(zeros({2, 3, 5}), {}));
      },
      "expected (..., 8)");
  expect_refused<ShapeError>(
      [&] {
        (void)(moe.experts(zeros({2, 3, 8}), MoeMlp::Scores{zeros({5, 4}), {}, {}}, {}));
      },
      "router probabilities [5, 4] for 6 tokens");
  // Dropless routing chooses where the scores are and names what kept a
  // token from choosing: a score that is not finite, or an expert's bias
  // (refused up front on the host; on a GPU, named after the choice).
  std::vector<double> p(24, 0.25);
  p[2 * 4 + 3] = NAN;
  expect_refused<ValueError>(
      [&] {
        (void)(moe.experts(zeros({2, 3, 8}), MoeMlp::Scores{from_vector(p, {6, 4}), {}, {}}, {}));
      },
      "token 2's probability for expert 3 is nan");
  GptConfig biased = cfg;
  biased.moe.expert_bias = true;
  MoeMlp lifted(biased, 0);
  Tensor bias = lifted.state_dict().at("expert_bias");
  copy_(bias, from_vector(std::vector<double>{0, INFINITY, 0, 0}, {4}, DType::F32));
  expect_refused<ValueError>(
      [&] {
        (void)(lifted.experts(
            zeros({2, 3, 8}),
            MoeMlp::Scores{from_vector(std::vector<double>(24, 0.25), {6, 4}), {}, {}}, {}));
      },
      "expert 1's bias is inf");
  GptConfig dense = cfg;
  dense.moe.dense_layers = {1};
  expect_refused<ValueError>([&] { MoeMlp m(dense, 1); }, "layer 1 has a dense MLP");
  expect_refused<ConfigError>([&] { MoeMlp m(cfg, 0, 4); },
                              "model.moe.ffn_hidden_size (6) must be divisible by parallel.tp (4)");
}

// Under context parallelism an expert capacity ranks the whole
// micro-batch's assignments from every rank's choices and their scores
// (Chunks::gather); what the gather gives is checked, naming the value.
TEST(MoeMlp, ACapacityOverChunksChecksWhatTheGatherGives) {
  GptConfig cfg = moe_config();
  cfg.moe.capacity_factor = 0.6;
  MoeMlp moe(cfg, 0);
  randomise(moe, 5);
  const Tensor x = randn({2, 3, cfg.d_model}, 7, 1, 1.0, DType::F64);  // 6 tokens, chunks of 3
  auto with_gather = [&](std::function<std::vector<double>(const std::vector<double>&)> gather) {
    moe.set_chunks({2, [](std::vector<double>&) {}, 0, std::move(gather)});
    autograd::NoGradGuard ng;
    (void)moe.forward(x, {true, 0, 0});
  };
  expect_refused<ValueError>([&] { with_gather({}); },
                             "needs the chunks' gather and rank (0 of 2)");
  expect_refused<ValueError>(
      [&] { with_gather([](const std::vector<double>&) { return std::vector<double>(3); }); },
      "the chunks' gather gave 3 values, not 48");
  // Rank 1's first token names an expert past the 4.
  expect_refused<ValueError>(
      [&] {
        with_gather([](const std::vector<double>& mine) {
          std::vector<double> all = mine;
          all.insert(all.end(), mine.begin(), mine.end());
          all[mine.size()] = 7;
          return all;
        });
      },
      "rank 1's token 0 chose expert 7.000000 of 4");
  // Each rank's 24 values (6 tokens' 2 choices and 2 scores) gathered
  // whole: the layer routes.
  EXPECT_NO_THROW(with_gather([](const std::vector<double>& mine) {
    EXPECT_EQ(mine.size(), 24u);
    std::vector<double> all = mine;
    all.insert(all.end(), mine.begin(), mine.end());
    return all;
  }));
}

TEST(MoeConfig, ValidatesItsKeys) {
  auto refused = [](auto change, const char* why) {
    GptConfig c = moe_config();
    change(c);
    expect_refused<ConfigError>([&] { (void)(c.validate()); }, why);
  };
  refused([](GptConfig& c) { c.moe.top_k = 5; },
          "model.moe.top_k (5) must be in [1, model.moe.experts (4)]");
  refused([](GptConfig& c) { c.moe.experts = -1; }, "model.moe.experts (-1) must be positive");
  refused([](GptConfig& c) { c.moe.aux_loss_coef = -0.1; }, "model.moe.aux_loss_coef");
  refused(
      [](GptConfig& c) {
        c.moe.dense_layers = {1, 0};
      },
      "model.moe.dense_layers: 0 at position 1");
  refused([](GptConfig& c) { c.moe.dense_layers = {2}; },
          "model.moe.dense_layers: 2 at position 0");
  refused([](GptConfig& c) { c.mlp_bias = true; }, "the experts have no biases");
  refused(
      [](GptConfig& c) { c.moe.shared_gate = true; },
      "model.moe.shared_gate gates the shared expert, but model.moe.shared_ffn_hidden_size is 0");
  refused([](GptConfig& c) { c.moe.shared_ffn_hidden_size = -1; },
          "model.moe.shared_ffn_hidden_size (-1) must be positive");
  refused([](GptConfig& c) { c.moe.capacity_factor = -0.5; },
          "model.moe.capacity_factor (-0.5) must be a finite number >= 0");
  refused(
      [](GptConfig& c) {
        c.moe.experts = 0;
        c.moe.capacity_factor = 1.0;
      },
      "capacity_factor, pad_to_capacity, z_loss_coef, score, routed_scaling_factor, groups, "
      "top_groups, group_score, expert_bias and aux_loss_scope belong to a mixture, but "
      "model.moe.experts is 0");
  refused([](GptConfig& c) { c.moe.pad_to_capacity = true; },
          "model.moe.pad_to_capacity pads each expert's batch to its capacity, but "
          "model.moe.capacity_factor is 0");

  refused([](GptConfig& c) { c.moe.group_score = GptConfig::Moe::GroupScore::Max; },
          "model.moe.group_score max scores groups of experts, but model.moe.groups is 1");
  refused(
      [](GptConfig& c) {
        c.moe.experts = 0;
        c.moe.expert_bias = true;
      },
      "belong to a mixture, but model.moe.experts is 0");
  refused([](GptConfig& c) { c.moe.groups = 3; },
          "model.moe.groups (3) must divide model.moe.experts (4)");
  refused([](GptConfig& c) { c.moe.z_loss_coef = -1e-3; },
          "model.moe.z_loss_coef (-0.001000) must be a finite number >= 0");
  refused(
      [](GptConfig& c) {
        c.moe.experts = 0;
        c.moe.dense_layers = {0};
      },
      "model.moe.experts is 0");
}

TEST(MoeConfig, ShapesCountsAndFlopsOfAMixture) {
  GptConfig c = moe_config(4, 2);
  c.moe.dense_layers = {0};
  c.tie_embeddings = false;
  c.position_embedding = PositionEmbedding::Rotary;
  c.normalization = Normalization::RmsNorm;
  c.linear_bias = false;
  c.validate();
  const auto shapes = gpt_parameter_shapes(c);
  EXPECT_EQ(shapes.at("h.0.mlp.c_fc.weight"), (Shape{24, 8}));
  EXPECT_FALSE(shapes.count("h.0.mlp.router.weight"));
  EXPECT_EQ(shapes.at("h.1.mlp.router.weight"), (Shape{4, 8}));
  EXPECT_EQ(shapes.at("h.1.mlp.experts.3.c_fc.weight"), (Shape{12, 8}));
  EXPECT_EQ(shapes.at("h.1.mlp.experts.3.c_proj.weight"), (Shape{8, 6}));
  EXPECT_FALSE(shapes.count("h.1.mlp.c_fc.weight"));
  int64_t total = 0;
  for (const auto& [name, s] : shapes) total += numel(s);
  EXPECT_EQ(c.num_parameters(), total);
  Gpt model(c, 1);
  EXPECT_EQ(model.num_parameters(), total);
  // Block 1: attention 8*24 + 8*8, router 4*8, 4 experts of 12*8 + 8*6, two
  // RMSNorms of 8.
  EXPECT_EQ(c.block_parameters(1), 8 * 24 + 8 * 8 + 4 * 8 + 4 * (12 * 8 + 8 * 6) + 2 * 8);
  EXPECT_EQ(c.block_parameters(0), 8 * 24 + 8 * 8 + 24 * 8 + 8 * 12 + 2 * 8);
  // Two of the four experts are active per token.
  EXPECT_DOUBLE_EQ(c.active_parameter_count(), static_cast<double>(total - 2 * (12 * 8 + 8 * 6)));
  // A gated shared expert of width 5 on the mixture's layer: its SwiGLU
  // weights (10 x 8 and 8 x 5) and its gate (1 x 8), all active.
  GptConfig shared = c;
  shared.moe.shared_ffn_hidden_size = 5;
  shared.moe.shared_gate = true;
  const auto with = gpt_parameter_shapes(shared);
  EXPECT_EQ(with.at("h.1.mlp.shared.c_fc.weight"), (Shape{10, 8}));
  EXPECT_EQ(with.at("h.1.mlp.shared.c_proj.weight"), (Shape{8, 5}));
  EXPECT_EQ(with.at("h.1.mlp.shared_gate.weight"), (Shape{1, 8}));
  EXPECT_FALSE(with.count("h.0.mlp.shared.c_fc.weight"));
  EXPECT_EQ(shared.num_parameters() - c.num_parameters(), 10 * 8 + 8 * 5 + 8);
  EXPECT_EQ(Gpt(shared, 1).num_parameters(), shared.num_parameters());
  EXPECT_DOUBLE_EQ(shared.active_parameter_count() - c.active_parameter_count(),
                   10 * 8 + 8 * 5 + 8);
  EXPECT_NEAR(shared.training_flops(1) - c.training_flops(1),
              3 * c.seq_len * 2.0 * (10 * 8 + 8 * 5 + 8), 1e-6);
  // The expert biases: 4 f32 values on the mixture's layer, counted as the
  // model holds them.
  GptConfig biased = c;
  biased.moe.expert_bias = true;
  EXPECT_EQ(gpt_parameter_shapes(biased).at("h.1.mlp.expert_bias"), (Shape{4}));
  EXPECT_FALSE(gpt_parameter_shapes(biased).count("h.0.mlp.expert_bias"));
  EXPECT_EQ(biased.num_parameters() - c.num_parameters(), 4);
  EXPECT_EQ(Gpt(biased, 1).num_parameters(), biased.num_parameters());
  // They are the model's state (what a gathered model file keeps in f32),
  // and nothing else is.
  for (const auto& [name, shape] : gpt_parameter_shapes(biased))
    EXPECT_EQ(is_moe_state(name), name == "h.1.mlp.expert_bias") << name;
  EXPECT_TRUE(is_moe_state("mtp.0.mlp.expert_bias"));
  // FLOPs: the dense model's, less its MLP on layer 1, plus the router and
  // two experts per token, three times forward.
  GptConfig dense = c;
  dense.moe = {};
  const double per_token = 3.0 * 2.0 * (8 * 4 + 2 * (12 * 8 + 8 * 6) - (24 * 8 + 8 * 12));
  EXPECT_NEAR(c.training_flops(3) - dense.training_flops(3), 3 * c.seq_len * per_token, 1e-6);
}

TEST(MoeGpt, TrainsWithEveryExpertTakingAGradient) {
  GptConfig c = moe_config(4, 2);
  c.moe.aux_loss_coef = 0.01;
  Gpt model(c, 7);
  std::vector<int64_t> seq(17);
  for (int64_t i = 0; i < 17; ++i) seq[static_cast<size_t>(i)] = (i * 5) % c.vocab_size;
  std::vector<int64_t> in, out;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 8; ++t) {
      in.push_back(seq[static_cast<size_t>(b * 8 + t)]);
      out.push_back(seq[static_cast<size_t>(b * 8 + t + 1)]);
    }
  }
  const Tensor ids = from_vector(in, {2, 8}), targets = from_vector(out, {2, 8});
  optim::AdamW opt(model.named_parameters(), {});
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    ForwardContext ctx{true, 1, static_cast<uint64_t>(step)};
    ctx.moe_stats = std::make_shared<MoeStats>();
    const Tensor loss = model.loss(ids, targets, ctx);
    autograd::backward({loss});
    EXPECT_EQ(ctx.moe_stats->records, 2);  // each layer once
    EXPECT_GT(ctx.moe_stats->mean_balance(), 0.0);
    EXPECT_LE(ctx.moe_stats->mean_balance(), 2.0 + 1e-9);  // at most E / k
    EXPECT_LE(ctx.moe_stats->max_load, 2.0 + 1e-9);        // a share of at most 1/k each
    if (step == 0) {
      for (const auto& [name, p] : model.named_parameters())
        ASSERT_TRUE(p.grad().defined()) << name;
      first = item(loss);
    }
    last = item(loss);
    opt.step(1e-2);
    model.zero_grad();
  }
  EXPECT_LT(last, first - 1.0);
}

TEST(MoeGpt, FullRecomputationGivesTheSameGradientsAndReportsOnce) {
  GptConfig c = moe_config(4, 2);
  c.moe.aux_loss_coef = 0.05;
  const Tensor ids =
      from_vector(std::vector<int64_t>{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3}, {2, 8});
  const Tensor targets =
      from_vector(std::vector<int64_t>{1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2}, {2, 8});
  std::map<std::string, std::vector<double>> grads[2];
  for (const Recompute r : {Recompute::None, Recompute::Full}) {
    c.recompute = r;
    Gpt model(c, 5);
    ForwardContext ctx{true, 1, 0};
    ctx.moe_stats = std::make_shared<MoeStats>();
    autograd::backward({model.loss(ids, targets, ctx)});
    EXPECT_EQ(ctx.moe_stats->records, 2) << recompute_string(r);
    for (const auto& [name, p] : model.named_parameters())
      grads[r == Recompute::Full][name] = to_double_vector(p.grad());
  }
  for (const auto& [name, g] : grads[0]) {
    const auto& h = grads[1].at(name);
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_NEAR(g[i], h[i], 1e-6 + 1e-5 * std::abs(g[i])) << name;
  }
}

}  // namespace
}  // namespace triad::nn
