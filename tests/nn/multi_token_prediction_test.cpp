// Multi-token prediction (model.mtp_layers, DeepSeek-V3's MTP modules): the
// inputs each depth reads, the objective the loss carries into backward, and
// the settings' errors. (Parity with PyTorch: Gpt2Parity.MultiTokenPrediction*;
// every parallel layout against one process: mpi.train_mtp_matches_one_process.)
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "triad/autograd/engine.h"
#include "triad/core/error.h"
#include "triad/nn/documents.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"
#include "triad/train/config.h"

namespace triad::nn {
namespace {

std::vector<int64_t> mtp_values(const Tensor& t) {
  const Tensor h = contiguous(cast(t, DType::I64));
  return std::vector<int64_t>(h.data<int64_t>(), h.data<int64_t>() + h.numel());
}

// (B, T) token ids spread over the vocabulary, a function of `seed`.
Tensor some_ids(int64_t B, int64_t T, int64_t vocab, int64_t seed) {
  std::vector<int64_t> v(static_cast<size_t>(B * T));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<int64_t>((i * 7 + static_cast<size_t>(seed) * 13 + i * i) %
                                static_cast<size_t>(vocab));
  return from_vector(v, {B, T});
}

GptConfig small(int64_t depths) {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.vocab_size = 37;
  c.seq_len = 12;
  c.mtp_layers = depths;
  c.mtp_loss_weight = 0.3;
  return c;
}

TEST(MultiTokenPrediction, InputsLookAheadWithinARowAndADocument) {
  const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {2, 5});
  EXPECT_EQ(mtp_values(mtp_ahead(ids, 1)), (std::vector<int64_t>{2, 3, 4, 5, 0, 7, 8, 9, 10, 0}));
  EXPECT_EQ(mtp_values(mtp_ahead(cast(ids, DType::I32), 2)),
            (std::vector<int64_t>{3, 4, 5, 0, 0, 8, 9, 10, 0, 0}));
  // Targets k ahead; an ignored one stays ignored; nothing past the row.
  const Tensor targets =
      from_vector(std::vector<int64_t>{2, 3, -100, 5, 6, 7, 8, 9, 10, 11}, {2, 5});
  EXPECT_EQ(mtp_values(mtp_targets(targets, Tensor(), 1)),
            (std::vector<int64_t>{3, -100, 5, 6, -100, 8, 9, 10, 11, -100}));
  // Row 0 holds documents [0, 2) and [2, 5): no prediction crosses the end.
  const Tensor starts =
      from_vector(std::vector<int64_t>{0, 0, 2, 2, 2, 0, 0, 0, 0, 0}, {2, 5}, DType::I32);
  EXPECT_EQ(mtp_values(mtp_targets(targets, starts, 1)),
            (std::vector<int64_t>{3, -100, 5, 6, -100, 8, 9, 10, 11, -100}));
  EXPECT_EQ(mtp_values(mtp_targets(targets, starts, 2)),
            (std::vector<int64_t>{-100, -100, 6, -100, -100, 9, 10, 11, -100, -100}));
  EXPECT_THROW(mtp_ahead(from_vector(std::vector<int64_t>{1, 2}, {2}), 1), ShapeError);
  EXPECT_THROW(mtp_targets(targets, from_vector(std::vector<int64_t>{0, 0}, {1, 2}, DType::I32), 1),
               ShapeError);
}

// The loss's value is the next token's alone (a model without the modules,
// same weights by name, gives it); its gradient is that of
// loss_grad * (loss + weight / depths * sum of the depths' losses), written
// out here from the pieces.
TEST(MultiTokenPrediction, TheLossStaysTheNextTokensAndItsGradientCarriesTheDepths) {
  const GptConfig cfg = small(2);
  Gpt model(cfg, 5);
  GptConfig plain_cfg = cfg;
  plain_cfg.mtp_layers = 0;
  const Gpt plain(plain_cfg, 5);
  const Tensor ids = some_ids(3, cfg.seq_len, cfg.vocab_size, 11);
  const Tensor targets = some_ids(3, cfg.seq_len, cfg.vocab_size, 12);
  ForwardContext ctx;
  ctx.loss_grad = 0.5;
  ctx.mtp_stats = std::make_shared<LossSums>();
  const Tensor loss = model.loss(ids, targets, ctx);
  EXPECT_NEAR(item(loss), item(plain.loss(ids, targets)), 1e-6);
  ASSERT_EQ(ctx.mtp_stats->records, 1);
  autograd::backward({scale(loss, ctx.loss_grad)});
  std::map<std::string, std::vector<double>> got;
  for (auto& [name, p] : model.named_parameters()) {
    got[name] = to_double_vector(p.grad());
    p.set_grad(Tensor());
  }

  // The objective by hand: the blocks, the head's loss and each depth's.
  ForwardContext eval;
  eval.training = false;
  Tensor x = model.embed(ids, eval);
  for (int64_t i = 0; i < cfg.n_layer; ++i) x = model.block(i).forward(x, eval);
  const std::vector<Tensor> depths = model.mtp_losses(x, ids, targets, eval);
  ASSERT_EQ(depths.size(), 2u);
  const std::vector<double> recorded = ctx.mtp_stats->host_sums(2);
  for (size_t k = 0; k < 2; ++k) EXPECT_NEAR(recorded[k], item(depths[k]), 1e-6) << k;
  EXPECT_GT(std::abs(item(depths[0]) - item(loss)), 1e-4);  // (another prediction)
  const Tensor objective =
      add(model.loss(ids, targets, eval), scale(add(depths[0], depths[1]), 0.3 / 2));
  autograd::backward({scale(objective, 0.5)});
  int moved = 0;
  for (auto& [name, p] : model.named_parameters()) {
    const std::vector<double> want = to_double_vector(p.grad());
    ASSERT_EQ(got[name].size(), want.size()) << name;
    double largest = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[name][i], want[i], 1e-6 + 1e-4 * std::abs(want[i]))
          << name << "[" << i << "]";
      largest = std::max(largest, std::abs(want[i]));
    }
    moved += name.rfind("mtp.1.", 0) == 0 && largest > 0;
  }
  EXPECT_GT(moved, 0) << "the second module's parameters got no gradient";
}

TEST(MultiTokenPrediction, EvaluationRunsNoPredictionModule) {
  const GptConfig cfg = small(1);
  Gpt model(cfg, 5);
  const Tensor ids = some_ids(2, cfg.seq_len, cfg.vocab_size, 3);
  ForwardContext eval;
  eval.training = false;
  eval.mtp_stats = std::make_shared<LossSums>();
  const Tensor loss = model.loss(ids, ids, eval);
  EXPECT_EQ(eval.mtp_stats->records, 0);
  autograd::backward({loss});
  for (auto& [name, p] : model.named_parameters()) {
    if (name.rfind("mtp.", 0) != 0) continue;
    const Tensor g = p.grad();
    if (g.defined()) {
      EXPECT_EQ(item(sum(mul(g, g))), 0.0) << name;
    }
  }
}

// Names and counts: the modules' parameters are where gpt_parameter_shapes
// says (checkpoints and exports build on it), num_parameters counts them,
// and a mixture's block among them takes its expert biases' loads as layer
// n_layer + k.
TEST(MultiTokenPrediction, ParametersAreNamedAndCounted) {
  for (const bool mixture : {false, true}) {
    SCOPED_TRACE(mixture ? "mixture" : "dense");
    GptConfig cfg = small(2);
    if (mixture) {
      cfg.moe.experts = 4;
      cfg.moe.top_k = 2;
      cfg.moe.ffn_hidden_size = 8;
      cfg.moe.expert_bias = true;
      cfg.moe.score = GptConfig::Moe::Score::Sigmoid;
    }
    Gpt model(cfg, 1);
    const auto shapes = gpt_parameter_shapes(cfg);
    int64_t total = 0;
    std::set<std::string> names;
    for (auto& [name, p] : model.named_parameters()) {
      names.insert(name);
      ASSERT_TRUE(shapes.count(name)) << name;
      EXPECT_EQ(shapes.at(name), p.shape()) << name;
      total += p.numel();  // (expert biases too, as num_parameters counts them)
    }
    EXPECT_EQ(names.size(), shapes.size());
    EXPECT_TRUE(names.count("mtp.1.eh_proj.weight"));
    EXPECT_TRUE(names.count("mtp.0.ln_embed.weight"));
    EXPECT_TRUE(names.count("mtp.1.block.attn.c_attn.weight"));
    EXPECT_EQ(cfg.num_parameters(), total);
    EXPECT_EQ(expert_bias_layer(cfg, "h.1.mlp.expert_bias"), 1);
    EXPECT_EQ(expert_bias_layer(cfg, "mtp.1.block.mlp.expert_bias"), cfg.n_layer + 1);
    EXPECT_EQ(expert_bias_layer(cfg, "mtp.x.block.mlp.expert_bias"), -1);
    EXPECT_EQ(expert_bias_layer(cfg, "h.99999999999999999999.mlp.expert_bias"), -1);
    EXPECT_EQ(expert_bias_layer(cfg, "h.1.mlp.router.weight"), -1);
    // Muon takes the modules' matrices as it takes the blocks'.
    EXPECT_TRUE(is_hidden_matrix("mtp.0.eh_proj.weight", {16, 32}));
  }
  // Training FLOPs grow by a block, eh_proj and another head pass a depth.
  GptConfig none = small(0), two = small(2);
  EXPECT_GT(two.training_flops(1), none.training_flops(1));
}

void expect_mtp_error(const std::vector<std::string>& overrides, const std::string& fragment) {
  const char* yaml = R"(
model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 256, seq_len: 32}
train: {steps: 5, global_batch_size: 8, micro_batch_size: 4}
data: {train: data/x.bin}
)";
  try {
    (void)train::parse_config(yaml, overrides);
    ADD_FAILURE() << "expected an error with '" << fragment << "'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(MultiTokenPrediction, SettingsOutOfRangeAreNamed) {
  expect_mtp_error({"model.mtp_layers=-1"}, "model.mtp_layers (-1)");
  expect_mtp_error({"model.mtp_layers=32"}, "below model.seq_len (32)");
  expect_mtp_error({"model.mtp_layers=1", "model.mtp_loss_weight=-0.5"}, "model.mtp_loss_weight");
  expect_mtp_error({"model.mtp_layers=1", "model.lora={rank: 4}"}, "model.lora");
  // (The config writes them back.)
  const train::Config c = train::parse_config(R"(
model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 256, seq_len: 32, mtp_layers: 2, mtp_loss_weight: 0.25}
train: {steps: 5, global_batch_size: 8, micro_batch_size: 4}
data: {train: data/x.bin}
)");
  EXPECT_EQ(c.model.mtp_layers, 2);
  const train::Config again = train::parse_config(train::to_yaml(c));
  EXPECT_EQ(again.model.mtp_layers, 2);
  EXPECT_EQ(again.model.mtp_loss_weight, 0.25);
}

}  // namespace
}  // namespace triad::nn
