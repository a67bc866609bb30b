#include "triad/plan/from_config.h"

#include <gtest/gtest.h>

#include "triad/core/error.h"
#include "triad/parallel/context/exchange.h"
#include "triad/parallel/pipeline/stage_balance.h"

namespace triad::plan {
namespace {

train::Config config(const std::string& parallel, const std::string& extra = "") {
  return train::parse_config(
      "model: {n_layer: 24, n_head: 16, d_model: 1024, vocab_size: 50304, seq_len: 1024" + extra +
      "}\n"
      "train: {steps: 10, global_batch_size: 512, micro_batch_size: 4, precision: bf16}\n"
      "parallel: " +
      parallel +
      "\n"
      "data: {train: data/none.bin}\n"
      "output: {dir: out/none}\n");
}

TEST(PlannedRun, TakesTheModelLayoutAndBatchOfATrainerConfig) {
  const PlannedRun run = planned_run(config(
      "{tp: 2, pp: 4, vpp: 2, dp: 8, sequence_parallel: true, zero: 1, schedule: interleaved}",
      ", recompute: full"));
  EXPECT_EQ(run.model.n_layer, 24);
  EXPECT_EQ(run.model.d_model, 1024);
  EXPECT_EQ(run.gpus, 64);
  EXPECT_EQ(run.global_batch, 512);
  const ParallelConfig& p = run.layout;
  EXPECT_EQ(p.tp, 2);
  EXPECT_EQ(p.pp, 4);
  EXPECT_EQ(p.vpp, 2);
  EXPECT_EQ(p.dp, 8);
  EXPECT_EQ(p.micro_batch, 4);
  EXPECT_EQ(p.recompute, Recompute::Full);
  EXPECT_TRUE(p.sequence_parallel);
  EXPECT_TRUE(p.zero1);
  EXPECT_EQ(p.schedule, pipeline::ScheduleKind::Interleaved);
  // Priced as Triad runs it.
  EXPECT_TRUE(p.overlap_dp);
  EXPECT_TRUE(p.overlap_tp);
  EXPECT_TRUE(p.overlap_param_gather);
  EXPECT_FALSE(planned_run(config("{dp: 8, zero: 1, overlap_param_gather: false}"))
                   .layout.overlap_param_gather);
  EXPECT_TRUE(p.scatter_gather);
  EXPECT_FALSE(planned_run(config("{tp: 2, pp: 2, dp: 16, pipeline_scatter_gather: false}"))
                   .layout.scatter_gather);
  EXPECT_EQ(p.attention, Attention::Flash);
  EXPECT_TRUE(run.note.empty()) << run.note;
  // It prices without complaint on a real cluster file.
  const ClusterSpec c = load_cluster(TRIAD_SOURCE_DIR "/configs/clusters/hgx_h200.yaml");
  EXPECT_GT(estimate(run.model, c, run.gpus, run.global_batch, run.layout).mfu, 0.0);
}

TEST(PlannedRun, PricesTheTrainersStageSplit) {
  // As given...
  EXPECT_EQ(planned_run(config("{pp: 4, dp: 1, stage_layers: [7, 7, 6, 4]}")).layout.stage_layers,
            (std::vector<int64_t>{7, 7, 6, 4}));
  // ... or balanced as the trainer balances it (ZB-V's stages too).
  const PlannedRun run = planned_run(config("{pp: 4, dp: 1, stage_layers: auto}"));
  EXPECT_EQ(run.layout.stage_layers, pipeline::balanced_stage_layers(run.model, 4, 1));
  EXPECT_EQ(planned_run(config("{pp: 2, vpp: 2, dp: 1, schedule: zb-v, stage_layers: auto}"))
                .layout.stage_layers,
            pipeline::balanced_stage_layers(run.model, 2, 2));
  EXPECT_TRUE(run.note.empty()) << run.note;
  EXPECT_TRUE(planned_run(config("{pp: 4, dp: 1}")).layout.stage_layers.empty());
  // model.recompute_layers: priced, and the auto split balanced with it.
  const PlannedRun some = planned_run(
      config("{pp: 4, dp: 1, stage_layers: auto}", ", recompute: full, recompute_layers: 2"));
  EXPECT_EQ(some.layout.recompute_layers, 2);
  EXPECT_EQ(some.layout.stage_layers, pipeline::balanced_stage_layers(some.model, 4, 1, true, 2));
}

TEST(PlannedRun, TheGpuCountComesFromDpOrIsGivenAndMustFit) {
  // dp left to the world size: the count must be given.
  EXPECT_EQ(planned_run(config("{tp: 2, pp: 2}"), 32).layout.dp, 8);
  auto expect_error = [](const std::string& parallel, int gpus, const std::string& fragment) {
    try {
      planned_run(config(parallel), gpus);
      FAIL() << "expected ConfigError with '" << fragment << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error("{tp: 2, pp: 2}", 0, "give the number of GPUs (--gpus), a multiple of tp*pp = 4");
  expect_error("{tp: 2, pp: 2}", 30, "GPUs (30) must be a multiple of tp*pp = 2*2");
  expect_error("{tp: 2, pp: 2, dp: 4}", 32, "parallel.dp (4) with tp*pp = 4 needs 16 GPUs, not 32");
  // Context parallelism's ranks beside the replicas'.
  const PlannedRun chunked = planned_run(config("{tp: 2, cp: 2}"), 16);
  EXPECT_EQ(chunked.layout.cp, 2);
  EXPECT_EQ(chunked.layout.dp, 4);
  expect_error("{tp: 2, cp: 2}", 6, "GPUs (6) must be a multiple of tp*pp*cp = 2*1*2");
  // Its exchange, all-to-alls of cp_a2a ranks with a ring across them.
  const PlannedRun both =
      planned_run(config("{tp: 2, cp: 4, cp_comm: all_to_all+ring, cp_a2a: 2}"), 16);
  EXPECT_EQ(both.layout.cp_exchange, cp::Exchange::AllToAllRing);
  EXPECT_EQ(both.layout.cp_a2a, 2);
  EXPECT_EQ(chunked.layout.cp_a2a, 1);
  expect_error("{tp: 2, cp: 2, dp: 2}", 16,
               "parallel.dp (2) with tp*pp*cp = 4 needs 8 GPUs, not 16");
  // train.freeze's patterns reach the planner as the parameters they name.
  train::Config frozen = config("{dp: 2}");
  frozen.train.freeze = {"wte.weight", "h.[0-3].*"};
  const PlannedRun fr = planned_run(frozen);
  EXPECT_TRUE(fr.layout.frozen.count("wte.weight"));
  EXPECT_TRUE(fr.layout.frozen.count("h.3.mlp.c_fc.weight"));
  EXPECT_FALSE(fr.layout.frozen.count("h.4.mlp.c_fc.weight"));
  EXPECT_EQ(fr.layout.frozen, frozen.frozen_parameters());
  EXPECT_TRUE(planned_run(config("{dp: 2}")).layout.frozen.empty());
  // What the planner prices differently is said.
  train::Config fp32 = config("{dp: 2}");
  fp32.train.precision = "fp32";
  EXPECT_NE(planned_run(fp32).note.find("fp32"), std::string::npos);
}

}  // namespace
}  // namespace triad::plan
