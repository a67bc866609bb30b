#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "triad/nn/gpt.h"

namespace triad::pipeline {

// The layers of a pipeline stage cost about the same, but the last stage
// also runs the output head and the loss: a GPT-2 124M head (768 x 50257)
// costs as much as four and a half of its layers, so an even split of 12
// layers over 4 stages leaves the last one doing 2.5x the others' work and
// the whole pipeline running at its pace. `parallel.stage_layers: auto`
// balances the split instead.

// What one token costs each stage's work in training (forward + backward,
// FLOPs): layer i (its products and its attention scores over its window;
// one more forward under full recomputation) and the head (its product;
// the loss itself is a few passes over the logits and is left out; with
// model.mtp_layers each prediction module's block, eh_proj and head pass
// too, all on the last stage).
struct StageWork {
  std::vector<double> layer;    // n_layer entries
  std::vector<double> forward;  // each layer's forward pass alone (what recomputing it costs)
  double head = 0;
};
StageWork stage_work(const nn::GptConfig& cfg, bool full_recompute = false);

// Of a stage's `layers`, how many recompute under full recomputation
// (model.recompute_layers; 0: all of them): its first ones
// (nn::GptConfig::recomputes).
inline int64_t recomputed_layers(int64_t layers, int64_t recompute_layers) {
  return recompute_layers > 0 && recompute_layers < layers ? recompute_layers : layers;
}

// Checks a split's layers per stage (parallel.stage_layers, in stage order):
// `stages` entries (pp * vpp) adding up to n_layer, every stage holding at
// least one layer but the first and the last, which may hold none: a stage
// of the embedding alone, or of the head alone (with multi-token
// prediction's modules, which sit beside it), as Megatron-LM's first and
// last pipeline stages of no decoder layer. ConfigError naming the entry.
void check_stage_layers(const std::vector<int64_t>& counts, int64_t stages, int64_t n_layer);

// The split with `first` layers on the first of `stages` stages and `last`
// on the last (-1: not given), the other stages sharing the rest evenly
// (parallel.stage_layers {first, last}; Megatron-LM's
// --decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers):
// 24 layers, 4 stages, first 3, last 5: [3, 8, 8, 5]. ConfigError naming
// the numbers for fewer than 2 stages, or a rest that does not share out
// evenly into at least a layer a stage.
std::vector<int64_t> stage_layers_around(int64_t n_layer, int64_t stages, int64_t first,
                                         int64_t last);

// Layers per stage for pp * vpp stages (stage order; the last holds the
// head), each stage at least one layer but the last, which holds none when
// the head (and multi-token prediction's modules) alone outweigh what the
// others would give it: the split whose most expensive stage is cheapest,
// and among those the most even (least sum of squared stage costs). Under
// full recomputation the first `recompute_layers` layers of each stage
// (model.recompute_layers; 0: all of them) cost a forward pass more.
// ConfigError when n_layer < pp * vpp.
std::vector<int64_t> balanced_stage_layers(const nn::GptConfig& cfg, int pp, int vpp,
                                           bool full_recompute = false,
                                           int64_t recompute_layers = 0);

}  // namespace triad::pipeline
