#pragma once

// The run a triad-train config describes, as the planner prices it: the
// model, its layout (tp, pp, vpp, dp, micro batch, recompute, sequence
// parallelism, ZeRO-1, schedule) and Triad's own implementation choices
// (the data-parallel reduction overlapping backward, fused attention).
#include <string>

#include "triad/plan/cost_model.h"
#include "triad/train/config.h"

namespace triad::plan {

struct PlannedRun {
  nn::GptConfig model;
  ParallelConfig layout;
  int gpus = 0;
  int global_batch = 0;
  std::string note;  // what the planner prices differently from the config ("" if nothing)
};

// `gpus` 0: tp * pp * parallel.dp (an error naming the keys when dp is not
// set). Errors name the numbers that do not fit together.
PlannedRun planned_run(const train::Config& config, int gpus = 0);

}  // namespace triad::plan
