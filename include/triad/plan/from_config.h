#pragma once

// The run a triad-train config describes, as the planner prices it: the
// model, its layout (tp, pp, vpp, dp, micro batch, recompute, sequence
// parallelism, ZeRO-1, schedule) and Triad's own implementation choices
// (the data-parallel reduction overlapping backward, fused attention).
#include <string>
#include <vector>

#include "triad/plan/cost_model.h"
#include "triad/plan/planner.h"
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
// What the planner prices differently from `config` ("" if nothing).
std::string planning_note(const train::Config& config);

// The search space of layouts for a triad-train config: Triad's own
// implementation (as planned_run prices it) and what the config holds
// whatever the layout (the optimizer, frozen parameters, the parameters'
// all-gathers, scatter-gather between stages) and the batch sizes of its
// ramp, which a layout's micro batch times dp must divide too; the layouts
// tried are SearchSpace's defaults.
SearchSpace search_space(const train::Config& config);

// The trainer settings that run `layout` at `global_batch` sequences a step,
// as triad-train's --set takes them ("parallel.tp=2", values in YAML), in a
// fixed order: every key planned_run reads for a layout (parallel.tp, pp,
// dp, vpp, schedule, zb_max_in_flight, stage_layers, sequence_parallel,
// zero, ep, cp, cp_comm, cp_a2a, overlap_param_gather,
// pipeline_scatter_gather; train.global_batch_size, micro_batch_size;
// model.recompute, recompute_layers), so that they take a config of any
// other layout to this one: planned_run of the result gives `layout` back.
std::vector<std::string> trainer_settings(const ParallelConfig& layout, int global_batch);

}  // namespace triad::plan
