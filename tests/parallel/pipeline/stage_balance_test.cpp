#include "triad/parallel/pipeline/stage_balance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "triad/core/error.h"

namespace triad::pipeline {
namespace {

nn::GptConfig gpt2_124m() {
  return {.n_layer = 12, .n_head = 12, .d_model = 768, .vocab_size = 50257, .seq_len = 1024};
}

// Each stage's cost under a split (the last stage with the head), its
// first `again` layers recomputed (a forward pass more; -1: none).
std::vector<double> costs_of(const StageWork& w, const std::vector<int64_t>& counts,
                             int64_t again = -1) {
  std::vector<double> out;
  size_t next = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    double c = s + 1 == counts.size() ? w.head : 0.0;
    for (int64_t i = 0; i < counts[s]; ++i, ++next)
      c += w.layer[next] + (i < again ? w.forward[next] : 0.0);
    out.push_back(c);
  }
  return out;
}

// Every split of n layers into k stages of at least one layer, the last
// (of several) of any number.
void for_each_split(int64_t n, int64_t k, const std::function<void(const std::vector<int64_t>&)>& f,
                    std::vector<int64_t> prefix = {}) {
  if (k == 1) {
    if (n < 1 && prefix.empty()) return;
    prefix.push_back(n);
    f(prefix);
    return;
  }
  for (int64_t first = 1; first <= n - (k - 2); ++first) {
    std::vector<int64_t> p = prefix;
    p.push_back(first);
    for_each_split(n - first, k - 1, f, p);
  }
}

TEST(StageBalance, TheHeadOfGpt2WeighsFourAndAHalfLayers) {
  const StageWork w = stage_work(gpt2_124m());
  ASSERT_EQ(w.layer.size(), 12u);
  // Per token: 3 x (24 h^2 + 4 s h) a layer, 3 x 2 h V the head.
  EXPECT_DOUBLE_EQ(w.layer[0], 3.0 * (24.0 * 768 * 768 + 4.0 * 1024 * 768));
  EXPECT_DOUBLE_EQ(w.head, 3.0 * 2.0 * 768 * 50257);
  EXPECT_NEAR(w.head / w.layer[0], 4.46, 0.01);
  // Full recomputation runs each layer forward once more, not the head.
  EXPECT_DOUBLE_EQ(stage_work(gpt2_124m(), true).layer[0], w.layer[0] * 4.0 / 3.0);
}

// GPT-2 124M's head outweighs four of its layers: on four stages it takes
// the last stage alone.
TEST(StageBalance, Gpt2OnFourStagesGivesTheHeadAStageOfItsOwn) {
  const auto counts = balanced_stage_layers(gpt2_124m(), 4, 1);
  EXPECT_EQ(counts, (std::vector<int64_t>{4, 4, 4, 0}));
  const StageWork w = stage_work(gpt2_124m());
  const auto balanced = costs_of(w, counts), even = costs_of(w, {3, 3, 3, 3});
  // The slowest stage: the head alone, against three layers and the head.
  EXPECT_NEAR(*std::max_element(balanced.begin(), balanced.end()) /
                  *std::max_element(even.begin(), even.end()),
              4.46 / (3 + 4.46), 0.01);
  // Six layers: two a stage, the head alone.
  nn::GptConfig six = gpt2_124m();
  six.n_layer = 6;
  EXPECT_EQ(balanced_stage_layers(six, 4, 1), (std::vector<int64_t>{2, 2, 2, 0}));
  // A light head keeps its layers.
  six.vocab_size = 64;
  EXPECT_EQ(balanced_stage_layers(six, 3, 1), (std::vector<int64_t>{2, 2, 2}));
}

TEST(StageBalance, NoSplitHasACheaperSlowestStageOrIsMoreEven) {
  int checked = 0;
  for (int64_t vocab : {64, 50257}) {
    for (int64_t n_layer : {4, 7, 12}) {
      for (int64_t window : {0, 64}) {
        nn::GptConfig cfg = gpt2_124m();
        cfg.vocab_size = vocab;
        cfg.n_layer = n_layer;
        if (window > 0) {  // windowed layers, every other one global: unequal layers
          cfg.position_embedding = nn::PositionEmbedding::Rotary;
          cfg.sliding_window = window;
          for (int64_t i = 1; i < n_layer; i += 2) cfg.full_attention_layers.push_back(i);
        }
        for (auto [pp, vpp] :
             {std::pair{2, 1}, std::pair{3, 1}, std::pair{4, 1}, std::pair{2, 2}}) {
          if (n_layer < pp * vpp) continue;
          const std::string at = "vocab " + std::to_string(vocab) + " layers " +
                                 std::to_string(n_layer) + " window " + std::to_string(window) +
                                 " pp " + std::to_string(pp) + " vpp " + std::to_string(vpp);
          const StageWork w = stage_work(cfg);
          const auto got = balanced_stage_layers(cfg, pp, vpp);
          const auto mine = costs_of(w, got);
          const double most = *std::max_element(mine.begin(), mine.end());
          double squares = 0;
          for (double c : mine) squares += c * c;
          for_each_split(n_layer, pp * vpp, [&](const std::vector<int64_t>& split) {
            const auto c = costs_of(w, split);
            const double m = *std::max_element(c.begin(), c.end());
            EXPECT_GE(m, most * (1 - 1e-12)) << at;
            if (m <= most * (1 + 1e-12)) {
              double sq = 0;
              for (double x : c) sq += x * x;
              EXPECT_GE(sq, squares * (1 - 1e-12)) << at;
            }
          });
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 2 * 3 * 4);  // vocabularies, windows, depths, layouts
}

// Full recomputation of the first layers of each stage alone
// (model.recompute_layers): a forward pass more for each of those, and the
// balanced split is still the best of every split.
TEST(StageBalance, RecomputingTheFirstLayersOfEachStageIsCounted) {
  nn::GptConfig cfg = gpt2_124m();
  cfg.n_layer = 7;
  const StageWork w = stage_work(cfg);
  EXPECT_DOUBLE_EQ(w.forward[0] * 3.0, w.layer[0]);
  for (int64_t again : {1, 2, 3}) {
    for (int pp : {2, 3, 4}) {
      const auto got = balanced_stage_layers(cfg, pp, 1, true, again);
      const auto mine = costs_of(w, got, again);
      const double most = *std::max_element(mine.begin(), mine.end());
      for_each_split(cfg.n_layer, pp, [&](const std::vector<int64_t>& split) {
        const auto c = costs_of(w, split, again);
        EXPECT_GE(*std::max_element(c.begin(), c.end()), most * (1 - 1e-12))
            << "recompute_layers " << again << " pp " << pp;
      });
    }
  }
  // Recomputing every layer of a stage is plain full recomputation.
  EXPECT_EQ(balanced_stage_layers(cfg, 3, 1, true, 7), balanced_stage_layers(cfg, 3, 1, true));
  // On 2 stages the first stage's layers no longer all cost a forward more
  // when only one of them recomputes: another split.
  EXPECT_NE(balanced_stage_layers(cfg, 2, 1, true, 1), balanced_stage_layers(cfg, 2, 1, true));
}

// parallel.stage_layers {first, last}: those two stages' layers, the
// others sharing the rest evenly.
TEST(StageBalance, TheFirstAndLastStagesAroundAnEvenRest) {
  EXPECT_EQ(stage_layers_around(24, 4, 3, 5), (std::vector<int64_t>{3, 8, 8, 5}));
  EXPECT_EQ(stage_layers_around(8, 4, 2, -1), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(stage_layers_around(8, 3, -1, 0), (std::vector<int64_t>{4, 4, 0}));
  EXPECT_EQ(stage_layers_around(8, 2, 0, 8), (std::vector<int64_t>{0, 8}));
  auto expect_error = [](int64_t n, int64_t stages, int64_t first, int64_t last,
                         const std::string& fragment) {
    try {
      stage_layers_around(n, stages, first, last);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error(8, 4, 1, -1,
               "parallel.stage_layers {first: 1}: the other 3 of the 4 stages must share the 7 "
               "layers left of model.n_layer (8) evenly, at least one each");
  expect_error(8, 4, 4, 4, "the other 2 of the 4 stages must share the 0 layers");
  expect_error(8, 2, 3, 4,
               "parallel.stage_layers {first: 3, last: 4}: the two stages add up to 7 layers but "
               "model.n_layer is 8");
  expect_error(8, 1, 0, -1, "needs a pipeline: parallel.pp * parallel.vpp is 1");
}

TEST(StageBalance, EqualLayersAndALightHeadSplitEvenly) {
  nn::GptConfig cfg = gpt2_124m();
  cfg.vocab_size = 64;
  EXPECT_EQ(balanced_stage_layers(cfg, 4, 1), (std::vector<int64_t>{3, 3, 3, 3}));
  EXPECT_EQ(balanced_stage_layers(cfg, 2, 2), (std::vector<int64_t>{3, 3, 3, 3}));
  EXPECT_EQ(balanced_stage_layers(cfg, 1, 1), (std::vector<int64_t>{12}));
}

TEST(StageBalance, FewerLayersThanStagesIsNamed) {
  nn::GptConfig cfg = gpt2_124m();
  cfg.n_layer = 3;
  try {
    balanced_stage_layers(cfg, 2, 2);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_layer (3) must be at least parallel.pp * "
                                         "parallel.vpp (4)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace triad::pipeline
