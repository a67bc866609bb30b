#pragma once

// How the trainer settles the CUDA backend's Auto attention choice (Triad's
// kernels or cuDNN's, cuda::AttentionChoice) across ranks and restarts.
#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "triad/backend/cuda.h"
#include "triad/dist/process_group.h"

namespace triad::train {

// Every rank's decision for the same problem made one: the ranks' times are
// summed and cuDNN is taken where its sum is the smaller, so every rank runs
// the same kernel, the one fastest for the world (a rank alone would pick
// by its own noise). A collective over `world` (null or size 1: the rank's
// own decision). `has`: whether this rank had anything to decide; when any
// rank had not (cuDNN cannot run there), every rank runs Triad's kernels.
// Returns whether `choice` now holds an agreed decision.
bool agree_attention_choice(bool has, cuda::AttentionChoice& choice, dist::ProcessGroup* world);

// Decisions as checkpoint metadata, and back (IoError naming a bad entry).
nlohmann::json attention_choices_to_json(const std::vector<cuda::AttentionChoice>& choices);
std::vector<cuda::AttentionChoice> attention_choices_from_json(const nlohmann::json& j);

}  // namespace triad::train
