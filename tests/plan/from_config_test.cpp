#include "triad/plan/from_config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "triad/core/error.h"
#include "triad/parallel/context/exchange.h"
#include "triad/parallel/pipeline/stage_balance.h"

namespace triad::plan {
namespace {

std::string config_text(const std::string& parallel, const std::string& extra = "") {
  return "model: {n_layer: 24, n_head: 16, d_model: 1024, vocab_size: 50304, seq_len: 1024" +
         extra +
         "}\n"
         "train: {steps: 10, global_batch_size: 512, micro_batch_size: 4, precision: bf16}\n"
         "parallel: " +
         parallel +
         "\n"
         "data: {train: data/none.bin}\n"
         "output: {dir: out/none}\n";
}

train::Config config(const std::string& parallel, const std::string& extra = "") {
  return train::parse_config(config_text(parallel, extra));
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
  EXPECT_FALSE(p.bf16_moments);
  EXPECT_FALSE(p.bf16_grads);
  {
    train::Config bm = config("{dp: 8, zero: 1}");
    bm.train.moment_precision = "bf16";
    EXPECT_TRUE(planned_run(bm).layout.bf16_moments);
    bm.train.grad_precision = "bf16";
    EXPECT_TRUE(planned_run(bm).layout.bf16_grads);
    EXPECT_FALSE(planned_run(bm).layout.ema);
    bm.train.ema_decay = 0.999;
    EXPECT_TRUE(planned_run(bm).layout.ema);
    bm.train.ema_device = "cpu";  // (host memory: no GPU bytes to price)
    EXPECT_FALSE(planned_run(bm).layout.ema);
  }
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

void expect_same_layout(const ParallelConfig& got, const ParallelConfig& want) {
  EXPECT_EQ(got.str(), want.str());  // sizes, micro batch, recompute, exchange, schedule, split
  EXPECT_EQ(got.tp, want.tp);
  EXPECT_EQ(got.pp, want.pp);
  EXPECT_EQ(got.dp, want.dp);
  EXPECT_EQ(got.vpp, want.vpp);
  EXPECT_EQ(got.micro_batch, want.micro_batch);
  EXPECT_EQ(got.recompute, want.recompute);
  EXPECT_EQ(got.recompute_layers, want.recompute_layers);
  EXPECT_EQ(got.sequence_parallel, want.sequence_parallel);
  EXPECT_EQ(got.zero1, want.zero1);
  EXPECT_EQ(got.ep, want.ep);
  EXPECT_EQ(got.cp, want.cp);
  EXPECT_EQ(got.cp_exchange, want.cp_exchange);
  EXPECT_EQ(got.cp_a2a, want.cp_a2a);
  EXPECT_EQ(got.schedule, want.schedule);
  EXPECT_EQ(got.zb_max_in_flight, want.zb_max_in_flight);
  EXPECT_EQ(got.stage_layers, want.stage_layers);
  EXPECT_EQ(got.overlap_param_gather, want.overlap_param_gather);
  EXPECT_EQ(got.scatter_gather, want.scatter_gather);
}

TEST(TrainerSettings, TakeAConfigOfAnotherLayoutToThisOne) {
  // A config of another layout, every key the settings name set otherwise.
  const std::string other = config_text(
      "{tp: 8, pp: 3, dp: 2, vpp: 2, schedule: zb-v, zb_max_in_flight: 5, stage_layers: auto, "
      "sequence_parallel: true, zero: 1, cp: 2, cp_comm: ring, overlap_param_gather: false, "
      "pipeline_scatter_gather: false}",
      ", recompute: full, recompute_layers: 3");
  const std::vector<std::string> layouts{
      "{tp: 2, pp: 4, vpp: 2, dp: 8, sequence_parallel: true, zero: 1, schedule: interleaved}",
      "{pp: 2, vpp: 2, dp: 4, schedule: zb-v, zb_max_in_flight: 3, stage_layers: [5, 7, 7, 5], "
      "zero: 1, overlap_param_gather: false, pipeline_scatter_gather: false}",
      "{tp: 2, cp: 4, dp: 2, cp_comm: all_to_all+ring, cp_a2a: 2}",
      "{pp: 2, cp: 2, dp: 2, cp_comm: ring, schedule: zb-auto}",
      "{tp: 4, pp: 3, dp: 1, schedule: zb-h1, stage_layers: {first: 6, last: 10}}",
  };
  const std::vector<std::string> models{", recompute: selective",
                                        ", recompute: full, recompute_layers: 2", "", "",
                                        ", recompute: full"};
  for (size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE(layouts[i]);
    const PlannedRun want = planned_run(config(layouts[i], models[i]));
    const std::vector<std::string> settings = trainer_settings(want.layout, want.global_batch);
    const PlannedRun got = planned_run(train::parse_config(other, settings));
    expect_same_layout(got.layout, want.layout);
    EXPECT_EQ(got.gpus, want.gpus);
    EXPECT_EQ(got.global_batch, want.global_batch);
  }
  // A mixture's expert parallelism, and a global batch of the planner's.
  const std::string moe = ", moe: {experts: 8, top_k: 2}";
  const PlannedRun experts = planned_run(config("{tp: 2, dp: 8, ep: 4, zero: 1}", moe));
  const train::Config applied = train::parse_config(config_text("{dp: 2, ep: 2}", moe),
                                                    trainer_settings(experts.layout, 256));
  expect_same_layout(planned_run(applied).layout, experts.layout);
  EXPECT_EQ(applied.train.global_batch_size, 256);
  // Each names its key once, in --set's form.
  const std::vector<std::string> settings = trainer_settings(experts.layout, 256);
  std::set<std::string> keys;
  for (const std::string& s : settings) {
    const size_t eq = s.find('=');
    ASSERT_NE(eq, std::string::npos) << s;
    EXPECT_TRUE(keys.insert(s.substr(0, eq)).second) << s;
  }
  EXPECT_TRUE(keys.count("parallel.ep"));
  EXPECT_TRUE(keys.count("model.recompute_layers"));
}

TEST(TrainerSettings, TheSearchPricesAConfigAsPredictDoes) {
  // A config under Muon with frozen embeddings and the parameters'
  // all-gathers waited for at once: every layout the search returns,
  // written into the config as settings and priced from it, is priced the
  // same (what `recommend --write-config` then `predict --config` does).
  std::string text = config_text("{dp: 16, zero: 1, overlap_param_gather: false}");
  const std::string bf16 = "precision: bf16}";
  text.replace(text.find(bf16), bf16.size(),
               "precision: bf16, optimizer: muon, freeze: [wte.weight]}");
  const train::Config base = train::parse_config(text);
  SearchSpace space = search_space(base);
  EXPECT_TRUE(space.overlap_dp);
  EXPECT_TRUE(space.overlap_tp);
  EXPECT_EQ(space.attention, Attention::Flash);
  EXPECT_TRUE(space.muon);
  EXPECT_FALSE(space.overlap_param_gather);
  EXPECT_TRUE(space.scatter_gather);
  EXPECT_EQ(space.frozen, std::set<std::string>{"wte.weight"});
  const ClusterSpec c = load_cluster(TRIAD_SOURCE_DIR "/configs/clusters/hgx_h200.yaml");
  space.top = 4;
  const std::vector<Estimate> best = recommend(base.model, c, 16, 512, space);
  ASSERT_EQ(best.size(), 4u);
  for (const Estimate& e : best) {
    SCOPED_TRACE(e.config.str());
    const PlannedRun run = planned_run(train::parse_config(text, trainer_settings(e.config, 512)));
    EXPECT_TRUE(run.layout.muon);
    EXPECT_EQ(run.layout.frozen, space.frozen);
    const Estimate again = estimate(run.model, c, run.gpus, run.global_batch, run.layout);
    EXPECT_EQ(again.step_time, e.step_time);
    EXPECT_EQ(again.memory_bytes, e.memory_bytes);
  }
}

TEST(TrainerSettings, TheSearchKeepsToLayoutsTheBatchRampCanRun) {
  // Global batches of 24, 32, ... then 512 on 16 GPUs: dp 16 at micro batch
  // 1 divides 512 but not 24, so with the ramp no layout has mb * dp above 8
  // (or not dividing 24), and every one written into the config is valid.
  std::string text = config_text("{}");
  const std::string bf16 = "precision: bf16}";
  text.replace(text.find(bf16), bf16.size(), "precision: bf16, rampup_batch_size: [24, 8, 1000]}");
  const train::Config ramped = train::parse_config(text);
  SearchSpace space = search_space(ramped);
  EXPECT_EQ(space.ramp_batches.front(), 24);
  space.top = 50;
  const ClusterSpec c = load_cluster(TRIAD_SOURCE_DIR "/configs/clusters/hgx_h200.yaml");
  const std::vector<Estimate> best = recommend(ramped.model, c, 16, 512, space);
  ASSERT_FALSE(best.empty());
  for (const Estimate& e : best) {
    SCOPED_TRACE(e.config.str());
    EXPECT_EQ(24 % (e.config.micro_batch * e.config.dp), 0);
    EXPECT_NO_THROW(train::parse_config(text, trainer_settings(e.config, 512)));
  }
  // Without the ramp the search has layouts of dp 16.
  space.ramp_batches.clear();
  const std::vector<Estimate> all = recommend(ramped.model, c, 16, 512, space);
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [](const Estimate& e) {
    return 24 % (e.config.micro_batch * e.config.dp) != 0;
  }));
}

TEST(WithOverrides, KeepsTheFilesKeysAndAppliesTheSettings) {
  const std::string text =
      "# a comment\n"
      "model: {n_layer: 4, n_head: 4, d_model: 128, vocab_size: 256, seq_len: 128}\n"
      "train: {steps: 30, global_batch_size: 16, micro_batch_size: 8, lr: 3.0e-3}\n"
      "data: {train: data/tiny_train.bin}\n"
      "output: {dir: out/tiny}\n";
  const std::vector<std::string> settings{"parallel.tp=2", "train.micro_batch_size=4",
                                          "parallel.stage_layers=[1,3]", "parallel.pp=2"};
  const std::string written = train::with_overrides(text, settings, "tiny.yaml");
  const train::Config c = train::parse_config(written);
  EXPECT_EQ(c.parallel.tp, 2);
  EXPECT_EQ(c.parallel.pp, 2);
  EXPECT_EQ(c.parallel.stage_layers, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(c.train.micro_batch_size, 4);
  EXPECT_EQ(c.train.steps, 30);
  EXPECT_EQ(c.train.lr, 3.0e-3);
  ASSERT_EQ(c.data_train.size(), 1u);
  EXPECT_EQ(c.data_train[0].path, "data/tiny_train.bin");
  // Only the keys given or set: nothing else is written out.
  EXPECT_EQ(written.find("weight_decay"), std::string::npos) << written;
  // A result that is no valid config is refused, named.
  try {
    train::with_overrides(text, {"parallel.pp=3"}, "tiny.yaml");
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "tiny.yaml with the settings applied: model.n_layer (4) must be divisible"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace triad::plan
