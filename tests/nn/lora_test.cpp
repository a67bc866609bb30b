// LoRA adapters (GptConfig::lora): a model with them starts exactly as the
// model without (B is zero), computes W x + (alpha / rank) B A x in every
// targeted layer (the GELU-fused MLP paths included), and its adapters'
// gradients are the loss's derivatives; merge_lora folds them into W.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "support/expect_error.h"
#include "triad/autograd/engine.h"
#include "triad/core/rng.h"
#include "triad/nn/gpt.h"
#include "triad/nn/moe.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

using triad::testing::expect_error;

GptConfig lora_tiny(std::vector<std::string> targets = GptConfig::lora_layers()) {
  GptConfig c{.n_layer = 2, .n_head = 2, .d_model = 16, .vocab_size = 23, .seq_len = 8};
  c.lora = {.rank = 3, .alpha = 6, .targets = std::move(targets)};
  return c;
}

Tensor tokens(int64_t salt) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < 16; ++i) v.push_back((i * 7 + salt * 5 + i / 3) % 23);
  return from_vector(v, {2, 8}, DType::I64);
}
Tensor lora_ids() {
  return tokens(1);
}
Tensor targets() {
  return tokens(2);
}

// `sd`'s weights with their adapters merged in (W + s B A) copied into
// `msd`, a model without adapters.
void merge_into(StateDict& msd, const StateDict& sd, double s) {
  for (auto& [name, t] : msd) {
    const std::string stem = name.substr(0, name.size() - 6);
    if (sd.count(stem + "lora_a"))
      copy_(t, merge_lora(sd.at(name), sd.at(stem + "lora_a"), sd.at(stem + "lora_b"), s));
  }
}

// After backward through both: each adapter's gradient in `sd` follows from
// the gradient G of its weight in the merged `msd`, dL/dB = s G A^T and
// dL/dA = s B^T G (with `nonzero`, A's not all zero). The adapted weights
// checked are appended to `checked`.
void expect_adapter_gradients(const StateDict& sd, const StateDict& msd, double s, bool nonzero,
                              std::vector<std::string>& checked) {
  for (const auto& [name, t] : msd) {
    const std::string stem = name.substr(0, name.size() - 6);
    if (!sd.count(stem + "lora_a")) continue;
    const Tensor G = t.grad(), A = sd.at(stem + "lora_a"), B = sd.at(stem + "lora_b");
    ASSERT_TRUE(G.defined()) << name;
    const auto want_b = to_double_vector(scale(matmul(G, transpose(A, 0, 1)), s));
    const auto want_a = to_double_vector(scale(matmul(transpose(B, 0, 1), G), s));
    const auto got_b = to_double_vector(B.grad()), got_a = to_double_vector(A.grad());
    ASSERT_EQ(got_b.size(), want_b.size());
    ASSERT_EQ(got_a.size(), want_a.size());
    if (nonzero) {
      double norm_a = 0;
      for (double v : want_a) norm_a = std::max(norm_a, std::abs(v));
      EXPECT_GT(norm_a, 1e-4) << name;
    }
    for (size_t i = 0; i < got_b.size(); ++i)
      ASSERT_NEAR(got_b[i], want_b[i], 1e-5 + 1e-3 * std::abs(want_b[i])) << stem << "lora_b";
    for (size_t i = 0; i < got_a.size(); ++i)
      ASSERT_NEAR(got_a[i], want_a[i], 1e-5 + 1e-3 * std::abs(want_a[i])) << stem << "lora_a";
    checked.push_back(name);
  }
}

TEST(Lora, AdaptersAreNamedAfterTheirLayersAndShapedByThem) {
  const GptConfig c = lora_tiny({"attn.c_attn", "mlp.c_proj"});
  const auto shapes = gpt_parameter_shapes(c);
  EXPECT_EQ(shapes.at("h.1.attn.c_attn.lora_a"), (Shape{3, 16}));
  EXPECT_EQ(shapes.at("h.1.attn.c_attn.lora_b"), (Shape{48, 3}));
  EXPECT_EQ(shapes.at("h.0.mlp.c_proj.lora_a"), (Shape{3, 64}));
  EXPECT_EQ(shapes.at("h.0.mlp.c_proj.lora_b"), (Shape{16, 3}));
  EXPECT_FALSE(shapes.count("h.0.mlp.c_fc.lora_a"));
  EXPECT_EQ(shapes.size(), gpt_parameter_shapes(c.without_lora()).size() + 8);
  Gpt m(c, 1);
  for (const auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(shapes.count(name)) << name;
    EXPECT_EQ(p.shape(), shapes.at(name)) << name;
  }
  EXPECT_EQ(m.named_parameters().size(), shapes.size());
  EXPECT_TRUE(is_lora_adapter("h.0.mlp.c_proj.lora_b"));
  EXPECT_FALSE(is_lora_adapter("h.0.mlp.c_proj.weight"));
  EXPECT_EQ(lora_adapted_weight("h.4.attn.c_attn.lora_a"), "h.4.attn.c_attn.weight");
  EXPECT_DOUBLE_EQ(c.lora_scale(), 2.0);
}

TEST(Lora, AModelWithAdaptersStartsAsTheModelWithout) {
  for (bool swiglu : {false, true}) {
    GptConfig c = lora_tiny();
    if (swiglu) c.activation = Activation::SwiGlu;
    Gpt with(c, 3), without(c.without_lora(), 3);
    const auto sw = with.state_dict();
    for (const auto& [name, t] : without.state_dict()) {
      EXPECT_EQ(to_double_vector(sw.at(name)), to_double_vector(t)) << name;
    }
    EXPECT_EQ(to_double_vector(sw.at("h.0.mlp.c_fc.lora_b")),
              std::vector<double>(sw.at("h.0.mlp.c_fc.lora_b").numel(), 0.0));
    // A starts random, about 1/sqrt(in) in size.
    const auto a = to_double_vector(sw.at("h.0.mlp.c_fc.lora_a"));
    double sq = 0;
    for (double v : a) sq += v * v;
    EXPECT_NEAR(std::sqrt(sq / static_cast<double>(a.size())), 0.25, 0.08);
    EXPECT_EQ(item(with.loss(lora_ids(), targets())), item(without.loss(lora_ids(), targets())));
  }
}

// With B random, the model equals the model without adapters whose weights
// are W + scale B A: in every targeted layer, on GPT-2's fused GELU MLP and
// on SwiGLU's.
TEST(Lora, AdaptersAddTheScaledLowRankProduct) {
  for (bool swiglu : {false, true}) {
    GptConfig c = lora_tiny();
    if (swiglu) c.activation = Activation::SwiGlu;
    Gpt with(c, 4);
    StateDict sd = with.state_dict();
    uint64_t stream = 10;
    for (auto& [name, t] : sd) {
      if (name.size() > 7 && name.compare(name.size() - 7, 7, ".lora_b") == 0)
        copy_(t, randn(t.shape(), 4, stream++, 0.5));
    }
    Gpt merged(c.without_lora(), 4);
    StateDict msd = merged.state_dict();
    merge_into(msd, sd, c.lora_scale());
    const double a = item(with.loss(lora_ids(), targets())),
                 b = item(merged.loss(lora_ids(), targets()));
    EXPECT_NEAR(a, b, 1e-5 * std::abs(b)) << (swiglu ? "swiglu" : "gelu");
    // (And the adapters do change the model.)
    Gpt base(c.without_lora(), 4);
    EXPECT_GT(std::abs(item(base.loss(lora_ids(), targets())) - b), 1e-4);
  }
}

// The adapters' gradients follow from the gradient G of the weight they
// adapt, taken in the model with them merged in (W + s B A is the layer's
// weight): dL/dB = s G A^T and dL/dA = s B^T G. B nonzero, so that A's are
// not zero too.
TEST(Lora, AdapterGradientsFollowFromTheMergedWeightsGradient) {
  for (bool swiglu : {false, true}) {
    GptConfig c = lora_tiny();
    if (swiglu) c.activation = Activation::SwiGlu;
    const double s = c.lora_scale();
    Gpt with(c, 5);
    StateDict sd = with.state_dict();
    for (auto& [name, t] : sd) {
      if (is_lora_adapter(name) && name.back() == 'b') copy_(t, randn(t.shape(), 5, 3, 0.5));
    }
    Gpt merged(c.without_lora(), 5);
    StateDict msd = merged.state_dict();
    merge_into(msd, sd, s);
    autograd::backward({with.loss(lora_ids(), targets())}, {});
    autograd::backward({merged.loss(lora_ids(), targets())}, {});
    std::vector<std::string> checked;
    expect_adapter_gradients(sd, msd, s, true, checked);
    EXPECT_EQ(checked.size(), 8u) << (swiglu ? "swiglu" : "gelu");
  }
}

// Dropout on the adapters' input (PEFT's lora_dropout): the layer's own
// path sees x whole; the adapters see x with element (m, f) of the (M, in)
// input zeroed when philox_uniform(seed, stream, c) < p and the rest scaled
// by 1 / (1 - p), where c = call * M * in + m * in + f, or by feature (the
// row-parallel layers' order) call * M * in + f * M + m. Evaluation draws
// no mask.
TEST(Lora, AdapterDropoutMasksTheAdaptersInputAlone) {
  const int64_t in = 16, out = 8, rank = 3, M = 10;
  const double p = 0.4, s = 2.0;
  const uint64_t seed = 9, stream = 42, call = 5;
  for (bool by_feature : {false, true}) {
    SCOPED_TRACE(by_feature ? "by feature" : "by row");
    Linear layer(in, out);
    layer.enable_lora(rank, s, {p, stream, by_feature});
    uint64_t k = 1;
    for (auto& [name, t] : layer.named_parameters()) copy_(t, randn(t.shape(), 3, k++, 0.5));
    const Tensor x = randn({2, 5, in}, 3, 99);
    const auto sd = layer.state_dict();
    const Tensor W = sd.at("weight"), b = sd.at("bias"), A = sd.at("lora_a"), B = sd.at("lora_b");
    // The mask, drawn here element by element.
    std::vector<double> kept(static_cast<size_t>(M * in));
    int64_t dropped = 0;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t f = 0; f < in; ++f) {
        const auto i = static_cast<uint64_t>(call * M * in + (by_feature ? f * M + m : m * in + f));
        const bool keep = philox_uniform(seed, stream, i) >= p;
        kept[static_cast<size_t>(m * in + f)] = keep ? 1.0 / (1.0 - p) : 0.0;
        dropped += keep ? 0 : 1;
      }
    }
    EXPECT_GT(dropped, M * in / 5);
    EXPECT_LT(dropped, M * in * 3 / 5);
    const Tensor xd = mul(x, from_vector(kept, {2, 5, in}));
    const Tensor want = add(linear(x, W, b), scale(linear(linear(xd, A), B), s));
    const Tensor got = layer.forward(x, {true, seed, call});
    const auto g = to_double_vector(got), w = to_double_vector(want);
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], w[i], 1e-5) << i;
    // Evaluation, or no draw: the adapters see x whole.
    const auto plain = to_double_vector(add(linear(x, W, b), scale(linear(linear(x, A), B), s)));
    for (const DropoutDraw& d : {DropoutDraw{}, DropoutDraw{false, seed, call}}) {
      const auto e = to_double_vector(layer.forward(x, d));
      for (size_t i = 0; i < e.size(); ++i) ASSERT_NEAR(e[i], plain[i], 1e-5) << i;
    }
    // Another call draws another mask.
    EXPECT_NE(to_double_vector(layer.forward(x, {true, seed, call + 1})), g);
    // The gradient reaches x through both paths: d/dx of sum(y) is
    // sum_o W[o] + s * mask * sum_o (B A)[o].
    Tensor xg = clone(x);
    xg.set_requires_grad(true);
    autograd::backward({sum(layer.forward(xg, {true, seed, call}))}, {});
    const auto wsum = to_double_vector(sum(W, 0)), basum = to_double_vector(sum(matmul(B, A), 0));
    const auto dx = to_double_vector(xg.grad());
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t f = 0; f < in; ++f) {
        const auto i = static_cast<size_t>(m * in + f), j = static_cast<size_t>(f);
        ASSERT_NEAR(dx[i], wsum[j] + s * kept[i] * basum[j], 1e-5) << m << "," << f;
      }
    }
  }
  // The layers tensor parallelism splits by input features draw by feature.
  const GptConfig c = lora_tiny();
  EXPECT_TRUE(c.lora_dropout(1, "mlp.c_proj").by_feature);
  EXPECT_TRUE(c.lora_dropout(1, "attn.c_proj").by_feature);
  EXPECT_FALSE(c.lora_dropout(1, "attn.c_attn").by_feature);
  EXPECT_NE(c.lora_dropout(1, "mlp.c_fc").stream, c.lora_dropout(0, "mlp.c_fc").stream);
}

// A context-parallel rank's tokens of each row of t (B, T, ...): runs
// (first, count), concatenated.
using Runs = std::vector<std::pair<int64_t, int64_t>>;
Tensor take_runs(const Tensor& t, const Runs& runs) {
  std::vector<Tensor> parts;
  for (const auto& [first, n] : runs) parts.push_back(narrow(t, 1, first, n));
  return concat(parts, 1);
}
const Runs kPieces[] = {Runs{{2, 4}}, Runs{{0, 2}, {6, 2}}, Runs{{1, 2}, {4, 3}}};

// The chunk of x (B, T, ...) that `runs` hold through `forward`: its
// outputs are `whole`'s (x's) there, and the gradient of their squares'
// sum x.grad()'s (which the whole's took). Returns the chunk.
Tensor expect_chunk_of_whole(const Tensor& x, const Tensor& whole, const Runs& runs,
                             const std::function<Tensor(const Tensor&)>& forward, double tol) {
  Tensor chunk = contiguous(take_runs(x.detach(), runs));
  chunk.set_requires_grad(true);
  const Tensor got = forward(chunk);
  const auto g = to_double_vector(got), w = to_double_vector(take_runs(whole.detach(), runs));
  EXPECT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size() && i < w.size(); ++i) {
    if (std::abs(g[i] - w[i]) > tol) {
      ADD_FAILURE() << "output " << i << ": " << g[i] << " (the whole's " << w[i] << ")";
      break;
    }
  }
  autograd::backward({sum(mul(got, got))}, {});
  const auto dg = to_double_vector(chunk.grad()), dw = to_double_vector(take_runs(x.grad(), runs));
  for (size_t i = 0; i < dg.size(); ++i) {
    if (std::abs(dg[i] - dw[i]) > 10 * tol) {
      ADD_FAILURE() << "input gradient " << i << ": " << dg[i] << " (the whole's " << dw[i] << ")";
      break;
    }
  }
  return chunk;
}

// Under context parallelism a rank holds pieces of each sequence (one run,
// or the ring's two half-chunks): its adapters draw those rows of the whole
// sequences' masks, by row and by feature, so the chunk's outputs and
// gradients are the whole's rows; a (rows, features) input of whole pieces
// (a shared expert's) draws the same, and one that is not is refused.
TEST(Lora, AContextParallelChunkDrawsItsRowsOfTheWholeMask) {
  const int64_t in = 12, out = 5, B = 2, T = 8;
  for (bool by_feature : {false, true}) {
    SCOPED_TRACE(by_feature ? "by feature" : "by row");
    Linear layer(in, out);
    layer.enable_lora(3, 1.5, {0.5, 42, by_feature});
    uint64_t k = 1;
    for (auto& [name, t] : layer.named_parameters()) copy_(t, randn(t.shape(), 3, k++, 0.5));
    Tensor x = randn({B, T, in}, 3, 7);
    x.set_requires_grad(true);
    const Tensor whole = layer.forward(x, {true, 9, 5});
    autograd::backward({sum(mul(whole, whole))}, {});
    for (const Runs& runs : kPieces) {
      SCOPED_TRACE("runs from " + std::to_string(runs[0].first));
      const auto pieces = std::make_shared<SequencePieces>(SequencePieces{T, runs});
      const DropoutDraw draw{true, 9, 5, pieces};
      const Tensor chunk = expect_chunk_of_whole(
          x, whole, runs, [&](const Tensor& c) { return layer.forward(c, draw); }, 1e-6);
      const int64_t held = chunk.size(1);
      const auto flat = to_double_vector(layer.forward(reshape(chunk, {B * held, in}), draw));
      const auto w = to_double_vector(take_runs(whole.detach(), runs));
      for (size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(flat[i], w[i], 1e-6) << i;
      EXPECT_THROW(layer.forward(randn({held + 1, in}, 3, 8), draw), ShapeError);
    }
  }
}

// A mixture of experts (model.moe) with mlp.c_fc and mlp.c_proj among the
// targets: every expert's layers and the shared expert's carry adapters of
// their own, a dense layer's MLP its usual ones, the router none; and the
// model equals the one whose expert weights have them merged in, with the
// adapters' gradients following from the merged weights'.
GptConfig tiny_mixture() {
  GptConfig c = lora_tiny({"attn.c_proj", "mlp.c_fc", "mlp.c_proj"});
  c.activation = Activation::SwiGlu;
  c.normalization = Normalization::RmsNorm;
  c.linear_bias = false;
  c.moe = {.experts = 3,
           .top_k = 2,
           .ffn_hidden_size = 6,
           .aux_loss_coef = 0.1,
           .dense_layers = {0},
           .shared_ffn_hidden_size = 4,
           .shared_gate = true};
  c.validate();
  return c;
}

TEST(Lora, ExpertsCarryAdaptersOfTheirOwn) {
  const GptConfig c = tiny_mixture();
  EXPECT_EQ(c.lora_modules(0), (std::vector<std::string>{"attn.c_proj", "mlp.c_fc", "mlp.c_proj"}));
  EXPECT_EQ(c.lora_modules(1),
            (std::vector<std::string>{"attn.c_proj", "mlp.experts.0.c_fc", "mlp.experts.1.c_fc",
                                      "mlp.experts.2.c_fc", "mlp.shared.c_fc",
                                      "mlp.experts.0.c_proj", "mlp.experts.1.c_proj",
                                      "mlp.experts.2.c_proj", "mlp.shared.c_proj"}));
  const auto shapes = gpt_parameter_shapes(c);
  EXPECT_EQ(shapes.at("h.1.mlp.experts.2.c_fc.lora_a"), (Shape{3, 16}));
  EXPECT_EQ(shapes.at("h.1.mlp.experts.2.c_fc.lora_b"), (Shape{12, 3}));  // gate and up of 6
  EXPECT_EQ(shapes.at("h.1.mlp.experts.0.c_proj.lora_a"), (Shape{3, 6}));
  EXPECT_EQ(shapes.at("h.1.mlp.shared.c_proj.lora_a"), (Shape{3, 4}));
  EXPECT_EQ(shapes.at("h.0.mlp.c_fc.lora_b"), (Shape{2 * c.ffn(), 3}));
  EXPECT_FALSE(shapes.count("h.1.mlp.router.lora_a"));
  EXPECT_FALSE(shapes.count("h.1.mlp.shared_gate.lora_a"));
  // Two layers' attn.c_proj, the dense MLP's two, three experts' and the
  // shared expert's four: A and B each.
  EXPECT_EQ(shapes.size(), gpt_parameter_shapes(c.without_lora()).size() + 2 * (2 + 2 + 8));
  Gpt m(c, 1);
  for (const auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(shapes.count(name)) << name;
    EXPECT_EQ(p.shape(), shapes.at(name)) << name;
  }
  EXPECT_EQ(m.named_parameters().size(), shapes.size());
  // Each expert draws its own masks; their c_proj by feature, as tensor
  // parallelism splits it.
  EXPECT_TRUE(c.lora_dropout(1, "mlp.experts.2.c_proj").by_feature);
  EXPECT_TRUE(c.lora_dropout(1, "mlp.shared.c_proj").by_feature);
  EXPECT_FALSE(c.lora_dropout(1, "mlp.experts.2.c_fc").by_feature);
  EXPECT_NE(c.lora_dropout(1, "mlp.experts.0.c_fc").stream,
            c.lora_dropout(1, "mlp.experts.1.c_fc").stream);
  // Left out, the targets stay the attention's in a mixture.
  GptConfig d = c;
  d.lora.targets = d.default_lora_targets();
  EXPECT_EQ(d.lora.targets, (std::vector<std::string>{"attn.c_attn", "attn.c_proj"}));
}

TEST(Lora, ExpertAdaptersAddTheirProductAndTakeTheMergedWeightsGradient) {
  const GptConfig c = tiny_mixture();
  const double s = c.lora_scale();
  Gpt with(c, 4);
  StateDict sd = with.state_dict();
  uint64_t stream = 10;
  for (auto& [name, t] : sd) {
    if (name.ends_with(".lora_b")) copy_(t, randn(t.shape(), 4, stream++, 0.5));
  }
  Gpt merged(c.without_lora(), 4);
  StateDict msd = merged.state_dict();
  merge_into(msd, sd, s);
  const ForwardContext ctx{true, 5, 1};
  const Tensor lw = with.loss(lora_ids(), targets(), ctx),
               lm = merged.loss(lora_ids(), targets(), ctx);
  EXPECT_NEAR(item(lw), item(lm), 1e-5 * std::abs(item(lm)));
  Gpt base(c.without_lora(), 4);
  EXPECT_GT(std::abs(item(base.loss(lora_ids(), targets(), ctx)) - item(lm)), 1e-4);
  autograd::backward({lw}, {});
  autograd::backward({lm}, {});
  std::vector<std::string> checked;
  expect_adapter_gradients(sd, msd, s, false, checked);
  EXPECT_EQ(std::count_if(checked.begin(), checked.end(),
                          [](const std::string& n) { return n.find(".mlp.experts.") != n.npos; }),
            6);
}

// Dropout on the experts' adapters: each expert's masks drawn from its own
// stream, so the model with dropout differs from evaluation's and from
// another call's, and the same call draws the same.
TEST(Lora, ExpertAdapterDropoutDrawsPerCall) {
  GptConfig c = tiny_mixture();
  c.lora.targets = {"mlp.c_fc", "mlp.c_proj"};
  c.lora.dropout = 0.3;
  Gpt m(c, 6);
  uint64_t stream = 30;
  for (auto& [name, t] : m.named_parameters()) {
    if (name.ends_with(".lora_b") && name.find(".experts.") != std::string::npos)
      copy_(t, randn(t.shape(), 6, stream++, 0.5));
  }
  const double a = item(m.loss(lora_ids(), targets(), ForwardContext{true, 7, 2}));
  EXPECT_EQ(item(m.loss(lora_ids(), targets(), ForwardContext{true, 7, 2})), a);
  EXPECT_GT(std::abs(item(m.loss(lora_ids(), targets(), ForwardContext{true, 7, 3})) - a), 1e-6);
  EXPECT_GT(std::abs(item(m.loss(lora_ids(), targets(), ForwardContext{false, 7, 2})) - a), 1e-6);
}

// An expert's row draws its assignment's mask (token b * T + t's j-th
// choice of the micro-batch), whichever tokens a rank holds and wherever the
// row runs: a context-parallel rank's pieces of the sequences give the whole
// micro-batch's outputs and gradients at those tokens; another call draws
// other masks.
TEST(Lora, AnExpertsRowsDrawTheirAssignmentsMasks) {
  GptConfig c = tiny_mixture();
  c.lora.targets = {"mlp.c_fc", "mlp.c_proj"};
  c.lora.dropout = 0.5;
  c.moe.aux_loss_coef = 0;  // (a chunk's balance is not the whole's)
  MoeMlp moe(c, 1);
  moe.to(DType::F64);
  uint64_t stream = 40;
  for (auto& [name, t] : moe.named_parameters())
    copy_(t, randn(t.shape(), 6, stream++, 0.5, DType::F64));
  const int64_t B = 2, T = 8;
  Tensor x = randn({B, T, c.d_model}, 6, 1, 1.0, DType::F64);
  x.set_requires_grad(true);
  const ForwardContext ctx{true, 9, 5};
  const Tensor whole = moe.forward(x, ctx);
  autograd::backward({sum(mul(whole, whole))}, {});
  const auto other = to_double_vector(moe.forward(x.detach(), ForwardContext{true, 9, 6}));
  const auto w0 = to_double_vector(whole);
  double apart = 0;
  for (size_t i = 0; i < w0.size(); ++i) apart = std::max(apart, std::abs(other[i] - w0[i]));
  EXPECT_GT(apart, 1e-3) << "another call's masks";
  for (const Runs& runs : kPieces) {
    SCOPED_TRACE("runs from " + std::to_string(runs[0].first));
    ForwardContext piece = ctx;
    piece.pieces = std::make_shared<SequencePieces>(SequencePieces{T, runs});
    expect_chunk_of_whole(
        x, whole, runs, [&](const Tensor& c) { return moe.forward(c, piece); }, 1e-10);
  }
}

TEST(Lora, BadSettingsAndShapesAreNamed) {
  GptConfig c = lora_tiny({"attn.c_attn", "mlp.fc"});
  expect_error([&] { c.validate(); },
               {"model.lora.targets[1] 'mlp.fc' is not a layer LoRA adapts", "mlp.c_fc"});
  c.lora.targets = {"mlp.c_fc", "mlp.c_fc"};
  expect_error([&] { c.validate(); }, {"model.lora.targets[1] 'mlp.c_fc' is given twice"});
  c.lora.targets = {};
  expect_error([&] { c.validate(); }, {"model.lora.targets must name at least one layer"});
  c = lora_tiny();
  c.lora.dropout = 1.0;
  expect_error([&] { c.validate(); }, {"model.lora.dropout (1.0", "must be in [0, 1)"});
  expect_error([] { Linear(4, 4).enable_lora(2, 1.0, {-0.1}); }, {"enable_lora: dropout -0.1"});
  expect_error(
      [] {
        merge_lora(zeros({4, 3}), zeros({2, 3}), zeros({4, 3}), 1.0);
      },
      {"merge_lora", "lora_b [4, 3]"});
}

}  // namespace
}  // namespace triad::nn
