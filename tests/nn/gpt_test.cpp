#include "triad/nn/gpt.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include <cmath>

#include "triad/autograd/engine.h"
#include "triad/nn/init.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

GptConfig tiny(int64_t layers = 2) {
  return {.n_layer = layers, .n_head = 2, .d_model = 16, .vocab_size = 23, .seq_len = 8};
}

TEST(Gpt, ParameterNamesAreGpt2sAndCountMatchesTheFormula) {
  Gpt m(tiny(), 1);
  auto names = m.named_parameters();
  EXPECT_EQ(names.front().first, "wte.weight");
  EXPECT_EQ(names.back().first, "ln_f.bias");
  auto sd = m.state_dict();
  for (const char* n :
       {"wpe.weight", "h.1.ln_1.weight", "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias",
        "h.1.attn.c_proj.weight", "h.0.ln_2.bias", "h.1.mlp.c_fc.weight", "h.1.mlp.c_proj.bias"}) {
    EXPECT_TRUE(sd.count(n)) << n;
  }
  EXPECT_EQ(sd.at("h.0.attn.c_attn.weight").shape(), (Shape{48, 16}));  // (out, in)
  EXPECT_EQ(m.num_parameters(), tiny().num_parameters());
  EXPECT_EQ(sd.size(), 2u + 12u * 2 + 2u);
}

// The count in floating point is the integer one, and a size whose count
// would overflow the 64-bit integers is refused by name before anything is
// built.
// Muon's matrices (train.optimizer: muon): the blocks' 2-d weights, each
// fused weight cut into the matrices it fuses.
TEST(Gpt, HiddenMatricesAndTheirFusedBlocks) {
  GptConfig cfg;
  cfg.n_layer = 1;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.d_model = 32;
  cfg.vocab_size = 50;
  cfg.seq_len = 8;
  cfg.position_embedding = PositionEmbedding::Rotary;
  cfg.activation = Activation::SwiGlu;
  cfg.ffn_hidden_size = 40;
  cfg.moe.experts = 4;
  cfg.moe.top_k = 2;
  cfg.moe.shared_ffn_hidden_size = 24;
  cfg.moe.shared_gate = true;
  std::set<std::string> hidden;
  for (const auto& [name, shape] : gpt_parameter_shapes(cfg)) {
    if (is_hidden_matrix(name, shape)) hidden.insert(name);
  }
  EXPECT_EQ(hidden.size(), 2u + 2u * 4u + 2u);  // attention, 4 experts, the shared expert
  EXPECT_TRUE(hidden.count("h.0.attn.c_attn.weight"));
  EXPECT_TRUE(hidden.count("h.0.mlp.experts.3.c_proj.weight"));
  EXPECT_TRUE(hidden.count("h.0.mlp.shared.c_fc.weight"));
  for (const char* not_hidden : {"wte.weight", "h.0.mlp.router.weight",
                                 "h.0.mlp.shared_gate.weight", "h.0.attn.c_attn.lora_a"}) {
    EXPECT_FALSE(is_hidden_matrix(not_hidden, {8, 32})) << not_hidden;
  }
  EXPECT_FALSE(is_hidden_matrix("h.0.ln_1.weight", {32}));
  // q (4 heads of 8), k and v (2 heads each); the gated MLPs' halves.
  EXPECT_EQ(fused_row_blocks(cfg, "h.0.attn.c_attn.weight", 64),
            (std::vector<int64_t>{32, 16, 16}));
  EXPECT_EQ(fused_row_blocks(cfg, "h.0.mlp.experts.1.c_fc.weight", 80),
            (std::vector<int64_t>{40, 40}));
  EXPECT_EQ(fused_row_blocks(cfg, "h.0.mlp.experts.1.c_proj.weight", 32),
            (std::vector<int64_t>{32}));
  EXPECT_THROW(fused_row_blocks(cfg, "h.0.attn.c_attn.weight", 96), ShapeError);
  EXPECT_THROW(fused_row_blocks(cfg, "h.0.mlp.c_fc.weight", 81), ShapeError);
  cfg.activation = Activation::Gelu;
  EXPECT_EQ(fused_row_blocks(cfg, "h.0.mlp.c_fc.weight", 81), (std::vector<int64_t>{81}));
}

TEST(Gpt, ParameterCountsBeyondWhatCanBeCountedAreRefused) {
  GptConfig gpt2{.n_layer = 12, .n_head = 12, .d_model = 768, .vocab_size = 50257, .seq_len = 1024};
  EXPECT_EQ(gpt2.num_parameters(), 124439808);  // GPT-2 small, tied head
  EXPECT_EQ(gpt2.parameter_count(), 124439808.0);
  gpt2.n_layer = 100'000'000'000'000;  // 1e14 layers of 7.1M parameters
  EXPECT_NEAR(gpt2.parameter_count(), 7.0875e20, 1e17);
  try {
    gpt2.validate();
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model: n_layer 100000000000000, d_model 768 and "
                                         "vocab_size 50257 make 7.09e+20 parameters, more than "
                                         "the 2^60 Triad can count"),
              std::string::npos)
        << e.what();
  }
}

TEST(Gpt, InitialisationDependsOnSeedNameAndShapeOnly) {
  Gpt a(tiny(2), 5), b(tiny(3), 5), c(tiny(2), 6);
  auto sa = a.state_dict(), sb = b.state_dict(), sc = c.state_dict();
  // Same name and shape: identical, whatever else the model holds.
  EXPECT_EQ(to_double_vector(sa.at("h.1.attn.c_attn.weight")),
            to_double_vector(sb.at("h.1.attn.c_attn.weight")));
  EXPECT_EQ(to_double_vector(sa.at("wte.weight")), to_double_vector(sb.at("wte.weight")));
  EXPECT_NE(to_double_vector(sa.at("wte.weight")), to_double_vector(sc.at("wte.weight")));
  // And equal to the rule evaluated on its own, so a shard can be cut from it.
  Tensor direct = init_parameter("h.0.mlp.c_fc.weight", {64, 16}, InitRule::normal(0.02), 5);
  EXPECT_EQ(to_double_vector(direct), to_double_vector(sa.at("h.0.mlp.c_fc.weight")));
  // GPT-2 rule: LayerNorm 1/0, biases 0, residual projections scaled.
  EXPECT_EQ(to_double_vector(sa.at("h.0.ln_1.weight")), std::vector<double>(16, 1.0));
  EXPECT_EQ(to_double_vector(sa.at("h.0.attn.c_attn.bias")), std::vector<double>(48, 0.0));
  auto proj = to_double_vector(sa.at("h.0.attn.c_proj.weight"));
  double ss = 0;
  for (double v : proj) ss += v * v;
  EXPECT_NEAR(std::sqrt(ss / proj.size()), 0.02 / std::sqrt(4.0), 0.003);
}

// model.init_std scales every drawn weight (the residual projections'
// 1 / sqrt(2 n_layer) of it) and nothing else: the same draws times
// 0.006 / 0.02, the norms and biases their constants.
TEST(Gpt, InitStdScalesEveryDrawnWeight) {
  GptConfig small = tiny(2);
  small.init_std = 0.006;
  const Gpt a(tiny(2), 5), b(small, 5);
  const auto sa = a.state_dict(), sb = b.state_dict();
  for (const auto& [name, t] : sa) {
    SCOPED_TRACE(name);
    const std::vector<double> x = to_double_vector(t), y = to_double_vector(sb.at(name));
    ASSERT_EQ(x.size(), y.size());
    const bool drawn = name.find("ln_") == std::string::npos && !name.ends_with("_norm.weight") &&
                       !name.ends_with(".bias");
    for (size_t i = 0; i < x.size(); ++i)  // (f32 draws: relative to each)
      EXPECT_NEAR(y[i], drawn ? x[i] * 0.3 : x[i], 1e-6 * std::abs(x[i]));
  }
  const auto wte = to_double_vector(sb.at("wte.weight"));
  double ss = 0;
  for (double v : wte) ss += v * v;
  EXPECT_NEAR(std::sqrt(ss / static_cast<double>(wte.size())), 0.006, 0.0006);
  for (double bad : {0.0, -0.02, std::nan("")}) {
    small.init_std = bad;
    EXPECT_THROW(small.validate(), ConfigError) << bad;
  }
}

// Init::None (a model about to load its weights) draws nothing: every
// parameter is its layer's constant (zeros, a norm's ones), and once the
// weights are loaded it is the model they came from.
TEST(Gpt, UninitialisedModelIsTheOneItsLoadedWeightsMake) {
  const Gpt random(tiny(2), 5);
  const Gpt none(tiny(2), 5, DType::F32, Gpt::Init::None);
  for (const auto& [name, p] : none.named_parameters()) {
    const std::vector<double> v = to_double_vector(p);
    const double constant =
        name.find("ln_") != std::string::npos && name.find(".weight") != std::string::npos ? 1.0
                                                                                           : 0.0;
    EXPECT_EQ(v, std::vector<double>(v.size(), constant)) << name;
  }
  Gpt loaded(tiny(2), 9, DType::F32, Gpt::Init::None);
  loaded.load_state_dict(random.state_dict());
  const Tensor ids = from_vector(std::vector<int64_t>{1, 5, 9, 3, 7, 2}, {2, 3});
  EXPECT_EQ(to_double_vector(loaded.forward(ids)), to_double_vector(random.forward(ids)));
  const Gpt half(tiny(2), 5, DType::BF16, Gpt::Init::None);
  EXPECT_EQ(half.head_weight().dtype(), DType::BF16);
}

TEST(Gpt, TiedHeadGetsGradientFromBothUses) {
  Gpt m(tiny(), 2);
  Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor logits = m.forward(ids);
  EXPECT_EQ(logits.shape(), (Shape{2, 3, 23}));
  autograd::backward({m.loss(ids, ids)});
  auto g = to_double_vector(m.state_dict().at("wte.weight").grad());
  // Row 20 never appears in the input: its gradient comes from the head only.
  double row20 = 0;
  for (int c = 0; c < 16; ++c) row20 += std::abs(g[20 * 16 + c]);
  EXPECT_GT(row20, 0.0);
}

// The trunk hands each block's MLP add to the next norm (Block::Stream):
// on the CPU the logits and every gradient are those of the blocks run one
// by one, each adding its MLP's output itself, bit for bit, in f32 and bf16.
TEST(Gpt, ResidualAddsInTheNextNormChangeNoBit) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Gpt m(tiny(3), 5, dtype);
    const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
    const Tensor seed = cast(randn({2, 4, 23}, 9, 1), dtype);
    auto grads = [&](const Tensor& logits) {
      autograd::backward({sum(mul(logits, seed))});
      std::map<std::string, std::vector<double>> g;
      for (auto& [name, p] : m.named_parameters()) {
        g[name] = to_double_vector(p.grad());
        p.set_grad(Tensor());
      }
      return g;
    };
    const Tensor fused = m.forward(ids);
    const auto fused_grads = grads(fused);
    Tensor x = m.embed(ids, ForwardContext{});
    for (int64_t i = 0; i < 3; ++i) x = m.block(i).forward(x, ForwardContext{});
    const Tensor apart = m.head(x);
    EXPECT_EQ(to_double_vector(fused), to_double_vector(apart));
    const auto apart_grads = grads(apart);
    ASSERT_EQ(fused_grads.size(), apart_grads.size());
    for (const auto& [name, g] : apart_grads) EXPECT_EQ(fused_grads.at(name), g) << name;
  }
}

TEST(Gpt, RejectsBadConfigsAndInputs) {
  GptConfig c = tiny();
  c.n_head = 3;
  try {
    Gpt m(c, 1);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(
        std::string(e.what()).find("model.d_model (16) must be divisible by model.n_head (3)"),
        std::string::npos)
        << e.what();
  }
  Gpt m(tiny(), 1);
  EXPECT_THROW(m.forward(zeros({2, 9}, DType::I64)), ShapeError);     // longer than seq_len
  EXPECT_THROW(m.forward(full({1, 2}, 23, DType::I64)), ValueError);  // id >= vocab
  EXPECT_THROW(Gpt(tiny(), 1, DType::I32), NotSupportedError);
}

// model.z_loss_coef: while training the loss's value stays the cross
// entropy (evaluation's), the z-loss is recorded beside it, and the
// gradient is that of loss_grad * (loss + coef * z), written out here from
// the unfused logits; a coefficient that is negative or not finite is named.
TEST(Gpt, ZLossJoinsTheGradientNotTheValue) {
  GptConfig cfg = tiny();
  cfg.z_loss_coef = 0.05;
  Gpt model(cfg, 3);
  std::vector<int64_t> ids, targets;
  for (int64_t i = 0; i < 16; ++i) {
    ids.push_back((i * 7 + 2) % 23);
    targets.push_back(i == 5 ? -100 : (i * 11 + 4) % 23);
  }
  const Tensor x = from_vector(ids, {2, 8}), t = from_vector(targets, {2, 8});
  ForwardContext ctx;
  ctx.loss_grad = 0.5;
  ctx.z_loss_stats = std::make_shared<LossSums>();
  const Tensor loss = model.loss(x, t, ctx);
  ForwardContext eval;
  eval.training = false;
  EXPECT_NEAR(item(loss), item(model.loss(x, t, eval)), 1e-6);
  ASSERT_EQ(ctx.z_loss_stats->records, 1);
  autograd::backward({scale(loss, ctx.loss_grad)});
  std::map<std::string, std::vector<double>> got;
  for (auto& [name, p] : model.named_parameters()) {
    got[name] = to_double_vector(p.grad());
    p.set_grad(Tensor());
  }
  Tensor z;
  const Tensor plain = cross_entropy(model.forward(x, eval), t, -100, &z);
  EXPECT_NEAR(ctx.z_loss_stats->host_sums(1)[0], item(z), 1e-5 * item(z));
  autograd::backward({scale(add(plain, scale(z, 0.05)), 0.5)});
  double moved = 0;  // how far the z-loss moved the head's gradient
  for (auto& [name, p] : model.named_parameters()) {
    const std::vector<double> want = to_double_vector(p.grad());
    ASSERT_EQ(got[name].size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[name][i], want[i], 1e-6 + 1e-4 * std::abs(want[i]))
          << name << "[" << i << "]";
    }
  }
  // Without the coefficient the gradients differ (the test sees the z-loss).
  GptConfig none = cfg;
  none.z_loss_coef = 0;
  Gpt without(none, 3);
  autograd::backward({scale(without.loss(x, t, ctx), 0.5)});
  for (auto& [name, p] : without.named_parameters()) {
    const std::vector<double> g = to_double_vector(p.grad());
    for (size_t i = 0; i < g.size(); ++i) moved += std::abs(g[i] - got[name][i]);
  }
  EXPECT_GT(moved, 1e-3);
  for (double bad : {-1e-4, std::nan("")}) {
    GptConfig c = tiny();
    c.z_loss_coef = bad;
    try {
      Gpt m(c, 1);
      FAIL() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("model.z_loss_coef"), std::string::npos) << e.what();
    }
  }
}

// Mixed precision: half parameters are the f32 initial values rounded once,
// the loss stays f32, and gradients of half parameters accumulate in f32.
TEST(Gpt, HalfParametersRoundTheF32InitAndKeepF32LossAndGradients) {
  Gpt f32(tiny(), 1);
  for (DType half : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(half));
    Gpt m(tiny(), 1, half);
    auto a = f32.named_parameters(), b = m.named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(b[i].second.dtype(), half) << b[i].first;
      EXPECT_EQ(to_double_vector(b[i].second), to_double_vector(cast(a[i].second, half)))
          << b[i].first;
    }
    Tensor ids = from_vector(std::vector<int64_t>{1, 5, 7, 2, 9, 3, 4, 0}, {1, 8}, DType::I64);
    Tensor tg = from_vector(std::vector<int64_t>{5, 7, 2, 9, 3, 4, 0, 1}, {1, 8}, DType::I64);
    Tensor loss = m.loss(ids, tg);
    EXPECT_EQ(loss.dtype(), DType::F32);
    EXPECT_NEAR(item(loss), item(f32.loss(ids, tg)), 0.05);
    autograd::backward({loss});
    for (auto& [name, p] : m.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_EQ(p.grad().dtype(), DType::F32) << name;
    }
  }
}

TEST(Module, ToConvertsInPlaceSoEveryHandleFollows) {
  Gpt m(tiny(), 1);
  Tensor handle = m.named_parameters().front().second;  // shares the implementation
  const auto before = to_double_vector(handle);
  m.to(DType::BF16);
  EXPECT_EQ(handle.dtype(), DType::BF16);
  const auto after = to_double_vector(handle);
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_NEAR(after[i], before[i], 1e-2 * (1 + std::abs(before[i])));
  m.to(Device::cpu());  // already there: nothing moves
  EXPECT_EQ(handle.device(), Device::cpu());
  EXPECT_THROW(m.to(DType::I64), ValueError);
}

TEST(Module, FindParameterWalksTheDottedNameToTheSameTensor) {
  Gpt m(tiny(3), 1);
  for (const auto& [name, p] : m.named_parameters()) {
    const Tensor* found = m.find_parameter(name);
    ASSERT_NE(found, nullptr) << name;
    EXPECT_EQ(found->storage(), p.storage()) << name;
  }
  // A prefix of a name, a module, a name one character off and a layer
  // past the last are not parameters.
  for (const char* n : {"h", "h.1", "h.1.attn", "h.1.attn.c_attn", "h.1.attn.c_attn.weigh",
                        "h.3.ln_1.weight", "h.10.ln_1.weight", "", "wte"}) {
    EXPECT_EQ(m.find_parameter(n), nullptr) << n;
  }
}

TEST(Module, LoadStateDictChecksNamesAndShapes) {
  Gpt m(tiny(), 1);
  auto sd = m.state_dict();
  sd.erase("wpe.weight");
  EXPECT_THROW(m.load_state_dict(sd), ValueError);
  EXPECT_NO_THROW(m.load_state_dict(sd, /*strict=*/false));
  sd = m.state_dict();
  sd["extra"] = zeros({1});
  EXPECT_THROW(m.load_state_dict(sd), ValueError);
  sd = m.state_dict();
  sd["wpe.weight"] = zeros({3, 3});
  EXPECT_THROW(m.load_state_dict(sd), ShapeError);
}

TEST(Gpt, DropoutIsDeterministicPerCallAndOffInEval) {
  GptConfig c = tiny();
  c.dropout = 0.2;
  Gpt m(c, 1);
  Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4}, {1, 4});
  auto a = to_double_vector(m.forward(ids, {true, 9, 0}));
  auto b = to_double_vector(m.forward(ids, {true, 9, 0}));
  auto d = to_double_vector(m.forward(ids, {true, 9, 1}));
  auto e1 = to_double_vector(m.forward(ids, {false, 9, 0}));
  auto e2 = to_double_vector(m.forward(ids, {false, 9, 1}));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, d);
  EXPECT_EQ(e1, e2);
}

// LossSums: each depth's sum of the micro-batches' losses, read on the host
// in one copy, or taken as a caller read them with other values (the
// trainer, with its loss and norm: LossSums::read); a record after that
// read would be lost, and is an error.
TEST(LossSums, SumsEachDepthAndTakesWhatWasReadWithTheStep) {
  LossSums stats;
  EXPECT_EQ(stats.host_sums(2), (std::vector<double>{0.0, 0.0}));
  stats.record({full({}, 1.5, DType::F32), full({}, 0.25, DType::F32)});
  stats.record({full({}, 2.0, DType::F32), full({}, 0.5, DType::F32)});
  EXPECT_EQ(stats.records, 2);
  EXPECT_EQ(stats.host_sums(2), (std::vector<double>{3.5, 0.75}));
  EXPECT_EQ(stats.host_sums(3), (std::vector<double>{3.5, 0.75, 0.0}));
  EXPECT_EQ(stats.host_sums(1), (std::vector<double>{3.5}));
  stats.read = {7.0, 8.0};  // (what a caller's one copy gave)
  EXPECT_EQ(stats.host_sums(2), (std::vector<double>{7.0, 8.0}));
  EXPECT_THROW(stats.record({full({}, 1.0, DType::F32), full({}, 1.0, DType::F32)}), ValueError);
}

}  // namespace
}  // namespace triad::nn
