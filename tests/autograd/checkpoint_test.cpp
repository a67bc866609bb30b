#include "triad/autograd/checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "triad/autograd/engine.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"

namespace triad {
namespace {

nn::GptConfig ckpt_tiny(nn::Recompute r, int64_t recompute_layers = 0) {
  // Dropout on: recomputation must reproduce the masks.
  return {.n_layer = 3,
          .n_head = 2,
          .d_model = 32,
          .vocab_size = 40,
          .seq_len = 16,
          .dropout = 0.1,
          .recompute = r,
          .recompute_layers = recompute_layers};
}

// Trains one step of the same model with activations kept and with every
// block recomputed (the first `recompute_layers` alone when given); `check`
// compares each parameter's two gradients.
void compare_recomputed(DType dtype, int64_t stride,
                        const std::function<void(const std::string&, const std::vector<double>&,
                                                 const std::vector<double>&)>& check,
                        int64_t recompute_layers = 0) {
  std::vector<int64_t> ids(4 * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * stride) % 40);
  Tensor x = from_vector(ids, {4, 16});
  const nn::ForwardContext ctx{true, 5, 2};
  nn::Gpt plain(ckpt_tiny(nn::Recompute::None), 3, dtype),
      again(ckpt_tiny(nn::Recompute::Full, recompute_layers), 3, dtype);
  Tensor a = plain.loss(x, x, ctx), b = again.loss(x, x, ctx);
  EXPECT_EQ(item(a), item(b));
  autograd::backward({a});
  autograd::backward({b});
  auto want = plain.state_dict();
  for (auto& [name, p] : again.named_parameters()) {
    auto g = to_double_vector(p.grad()), w = to_double_vector(want.at(name).grad());
    ASSERT_EQ(g.size(), w.size());
    check(name, g, w);
  }
}

// f32 gradients that agree to rounding.
void expect_f32_equal(const std::string& name, const std::vector<double>& g,
                      const std::vector<double>& w) {
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], w[i], 1e-6 + 1e-5 * std::abs(w[i])) << name;
}

TEST(Recompute, FullRecomputationLeavesEveryGradientUnchanged) {
  compare_recomputed(DType::F32, 7, expect_f32_equal);
}

// In bf16 a recomputed block's input is a bf16 leaf, whose gradient gathers
// in f32; the block hands the outer graph a bf16 gradient, as the block's own
// backward would (an f32 one used to reach the next block's bf16 GEMMs).
TEST(Recompute, FullRecomputationInBf16HandsOnBf16Gradients) {
  compare_recomputed(
      DType::BF16, 5,
      [](const std::string& name, const std::vector<double>& g, const std::vector<double>& w) {
        double err = 0, norm = 0;
        for (size_t i = 0; i < g.size(); ++i)
          err += (g[i] - w[i]) * (g[i] - w[i]), norm += w[i] * w[i];
        // bf16 rounding of the block-input gradients differs
        // (one f32 sum rounded once against rounded partial
        // sums): a bf16-sized difference.
        EXPECT_LE(std::sqrt(err), 2e-2 * std::sqrt(norm) + 1e-6) << name;
      });
}

// Zero-bubble schedules defer weight gradients (W) past the input gradient
// (B); a recomputed block must defer its W as well, not compute it in B.
TEST(Recompute, RecomputedBlocksDeferTheirWeightGradients) {
  std::vector<int64_t> ids(2 * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 5) % 40);
  Tensor x = from_vector(ids, {2, 16});
  const nn::ForwardContext ctx{true, 9, 0};
  nn::Gpt plain(ckpt_tiny(nn::Recompute::None), 4), again(ckpt_tiny(nn::Recompute::Full), 4);
  autograd::backward({plain.loss(x, x, ctx)});
  autograd::WeightGradStore store;
  autograd::BackwardOptions options;
  options.defer_weight_grads = &store;
  autograd::backward({again.loss(x, x, ctx)}, {}, options);
  int deferred = 0;
  for (auto& [name, p] : again.named_parameters()) {
    if (name.find("c_fc.weight") != std::string::npos) {
      EXPECT_FALSE(p.grad().defined()) << name << " was computed during B";
      ++deferred;
    }
  }
  EXPECT_EQ(deferred, 3);
  EXPECT_GE(store.size(), 3u * 4u);  // four linear layers per block
  store.flush();
  auto want = plain.state_dict();
  for (auto& [name, p] : again.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    expect_f32_equal(name, to_double_vector(p.grad()), to_double_vector(want.at(name).grad()));
  }
}

// The bytes a forward pass of the tiny model (8 sequences) leaves allocated
// for backward: the graph's saved activations.
int64_t graph_bytes(nn::Recompute r, int64_t recompute_layers = 0) {
  std::vector<int64_t> ids(8 * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 3) % 40);
  Tensor x = from_vector(ids, {8, 16});
  nn::Gpt m(ckpt_tiny(r, recompute_layers), 3);
  Allocator& alloc = cpu_allocator();
  const int64_t before = alloc.stats().allocated;
  Tensor loss = m.loss(x, x, {true, 5, 2});
  const int64_t held = alloc.stats().allocated - before;
  autograd::backward({loss});
  return held;
}

TEST(Recompute, FullRecomputationKeepsOnlyBlockInputs) {
  const int64_t none = graph_bytes(nn::Recompute::None), full = graph_bytes(nn::Recompute::Full);
  EXPECT_LT(full * 3, none) << "full " << full << " none " << none;
}

// model.recompute_layers: the first blocks recompute, the others keep their
// activations. The gradients are those of keeping everything, and the graph
// holds more than under full recomputation and less than without it.
TEST(Recompute, RecomputingTheFirstBlocksAloneLeavesEveryGradientUnchanged) {
  compare_recomputed(DType::F32, 3, expect_f32_equal, 2);
  const int64_t none = graph_bytes(nn::Recompute::None, 0),
                one = graph_bytes(nn::Recompute::Full, 1),
                two = graph_bytes(nn::Recompute::Full, 2),
                all = graph_bytes(nn::Recompute::Full, 0);
  EXPECT_LT(all, two);
  EXPECT_LT(two, one);
  EXPECT_LT(one, none);
  // As many as the model's blocks, or more, is every block.
  EXPECT_EQ(graph_bytes(nn::Recompute::Full, 3), all);
  EXPECT_EQ(graph_bytes(nn::Recompute::Full, 7), all);
}

TEST(Recompute, RecomputeLayersGoWithFullRecomputation) {
  nn::GptConfig c = ckpt_tiny(nn::Recompute::Selective, 2);
  try {
    c.validate();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "model.recompute_layers (2) goes with model.recompute: full (got selective)"),
              std::string::npos)
        << e.what();
  }
  c = ckpt_tiny(nn::Recompute::Full, -1);
  EXPECT_THROW(c.validate(), ConfigError);
  EXPECT_TRUE(ckpt_tiny(nn::Recompute::Full, 2).recomputes(1));
  EXPECT_FALSE(ckpt_tiny(nn::Recompute::Full, 2).recomputes(2));
  EXPECT_TRUE(ckpt_tiny(nn::Recompute::Full).recomputes(9));
  EXPECT_FALSE(ckpt_tiny(nn::Recompute::None).recomputes(0));
}

TEST(Recompute, NamesAreValidated) {
  EXPECT_EQ(nn::recompute_from_string("selective"), nn::Recompute::Selective);
  EXPECT_THROW(nn::recompute_from_string("some"), ConfigError);
}

}  // namespace
}  // namespace triad
