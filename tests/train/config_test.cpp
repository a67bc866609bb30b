#include "triad/train/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "support/expect_error.h"

namespace triad::train {
namespace {

const char* kValid = R"(
model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 256, seq_len: 32}
train: {steps: 5, global_batch_size: 8, micro_batch_size: 4, lr: 1.0e-3}
data: {train: data/x.bin}
)";

void expect_config_error(const std::string& yaml, const std::vector<std::string>& overrides,
                         const std::string& fragment) {
  try {
    parse_config(yaml, overrides);
    FAIL() << "expected ConfigError with '" << fragment << "'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Config, ParsesDefaultsAndOverrides) {
  Config c = parse_config(kValid);
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.accumulation_steps(), 2);
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.train.min_lr, 1e-4);  // default: lr / 10
  EXPECT_EQ(c.output_dir, "out");
  EXPECT_EQ(c.device, "cpu");
  Config o = parse_config(kValid, {"train.lr=0.01", "model.dropout=0.1", "log.interval=3",
                                   "device=cpu", "model.recompute=full"});
  EXPECT_DOUBLE_EQ(o.train.lr, 0.01);
  EXPECT_DOUBLE_EQ(o.model.dropout, 0.1);
  EXPECT_EQ(o.log_interval, 3);
  // to_yaml round-trips.
  Config r = parse_config(to_yaml(o));
  EXPECT_DOUBLE_EQ(r.train.lr, 0.01);
  EXPECT_EQ(r.train.seed, o.train.seed);
  EXPECT_EQ(r.data_train, o.data_train);
  EXPECT_EQ(c.model.recompute, nn::Recompute::None);  // default
  EXPECT_EQ(r.model.recompute, nn::Recompute::Full);
  // Collectives' time limit and validate mode, defaults and round trip.
  EXPECT_DOUBLE_EQ(c.parallel.timeout_s, 600);
  EXPECT_FALSE(c.parallel.validate_collectives);
  EXPECT_EQ(c.parallel.check_replicas_interval, 0);
  EXPECT_EQ(to_yaml(c).find("check_replicas"), std::string::npos);
  EXPECT_EQ(parse_config(to_yaml(parse_config(kValid, {"parallel.check_replicas_interval=100"})))
                .parallel.check_replicas_interval,
            100);
  expect_config_error(kValid, {"parallel.check_replicas_interval=-1"},
                      "parallel.check_replicas_interval (-1) must be >= 0 (0: never)");
  EXPECT_TRUE(c.parallel.overlap_param_gather);
  EXPECT_TRUE(c.parallel.pipeline_scatter_gather);
  Config d = parse_config(to_yaml(parse_config(
      kValid, {"parallel.timeout_s=45.5", "parallel.validate_collectives=true",
               "parallel.overlap_param_gather=false", "parallel.pipeline_scatter_gather=false"})));
  EXPECT_FALSE(d.parallel.pipeline_scatter_gather);
  EXPECT_DOUBLE_EQ(d.parallel.timeout_s, 45.5);
  EXPECT_TRUE(d.parallel.validate_collectives);
  EXPECT_FALSE(d.parallel.overlap_param_gather);
  // Validation data and its schedule.
  EXPECT_TRUE(c.data_val.empty());
  EXPECT_EQ(c.eval.interval, 0);
  EXPECT_EQ(c.eval.batches, 0);
  Config v = parse_config(to_yaml(
      parse_config(kValid, {"data.val=data/v_*.bin", "eval.interval=50", "eval.batches=4"})));
  EXPECT_EQ(v.data_val, (std::vector<Config::ValidationSet>{{"", "data/v_*.bin"}}));
  EXPECT_EQ(v.eval.interval, 50);
  EXPECT_EQ(v.eval.batches, 4);
  // Named sets, in the config's order, round-tripped; names stay plain.
  auto with_val = [](const std::string& val) {
    return "model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 256, seq_len: 32}\n"
           "train: {steps: 5, global_batch_size: 8, micro_batch_size: 4}\n"
           "data: {train: data/x.bin, val: " +
           val + "}\n";
  };
  const Config n = parse_config(to_yaml(parse_config(with_val("{web: data/w.bin, code: c.bin}"))));
  EXPECT_EQ(n.data_val,
            (std::vector<Config::ValidationSet>{{"web", "data/w.bin"}, {"code", "c.bin"}}));
  expect_config_error(with_val("{\"a b\": data/w.bin}"), {},
                      "data.val: the set name 'a b' must be letters, digits");
  expect_config_error(with_val("[data/w.bin]"), {},
                      "data.val: expected a path or glob, or a mapping of names to them");
  EXPECT_FALSE(c.data_shuffle);
  EXPECT_TRUE(parse_config(to_yaml(parse_config(kValid, {"data.shuffle=true"}))).data_shuffle);
  // train.lr_scale: patterns to factors, in order, round-tripped; a factor
  // not > 0, a pattern matching nothing, two patterns on one parameter and
  // a list named.
  EXPECT_TRUE(c.train.lr_scale.empty());
  const Config s = parse_config(
      to_yaml(parse_config(kValid, {"train.lr_scale={wte.weight: 0.5, \"h.*.mlp.*\": 2}"})));
  ASSERT_EQ(s.train.lr_scale.size(), 2u);
  EXPECT_EQ(s.train.lr_scale[0], (std::pair<std::string, double>{"wte.weight", 0.5}));
  const std::map<std::string, double> factors = s.lr_scale_factors();
  EXPECT_EQ(factors.at("wte.weight"), 0.5);
  EXPECT_EQ(factors.at("h.1.mlp.c_proj.bias"), 2.0);
  EXPECT_EQ(factors.count("h.0.attn.c_attn.weight"), 0u);
  expect_config_error(kValid, {"train.lr_scale={wte.weight: 0}"},
                      "train.lr_scale['wte.weight'] (0.000000) must be a finite number > 0");
  expect_config_error(kValid, {"train.lr_scale={lm_head.weight: 2}"},
                      "train.lr_scale[0]: 'lm_head.weight' matches no parameter");
  expect_config_error(kValid, {"train.lr_scale={\"h.*\": 2, \"*.bias\": 3}"},
                      "train.lr_scale['*.bias'] and train.lr_scale['h.*'] both match");
  expect_config_error(kValid, {"train.lr_scale=[wte.weight]"},
                      "train.lr_scale: expected a mapping of parameter patterns to factors");
  // Fill-in-the-middle: off by default, round-tripped; its sentinels named
  // when missing, outside the vocabulary, doubled or the end token, and
  // refused beside whole-document packing.
  EXPECT_EQ(c.data_fim_rate, 0.0);
  const Config fim = parse_config(to_yaml(parse_config(
      kValid, {"data.fim_rate=0.5", "data.fim_spm_rate=0.25", "data.fim_tokens=[1, 2, 3]"})));
  EXPECT_EQ(fim.data_fim_rate, 0.5);
  EXPECT_EQ(fim.data_fim_spm_rate, 0.25);
  EXPECT_EQ(fim.data_fim_tokens, (std::vector<int64_t>{1, 2, 3}));
  const data::FimOptions fo = fim.fim_options();
  EXPECT_EQ(fo.rate, 0.5);
  EXPECT_EQ(fo.spm_rate, 0.25);
  EXPECT_EQ(fo.prefix_token, 1);
  EXPECT_EQ(fo.middle_token, 2);
  EXPECT_EQ(fo.suffix_token, 3);
  EXPECT_EQ(fo.eod_token, fim.model.eod_token);
  EXPECT_NE(fo.seed, fim.train.seed);  // (not dropout's draws)
  EXPECT_EQ(c.fim_options().rate, 0.0);
  expect_config_error(kValid, {"data.fim_rate=0.5"},
                      "data.fim_rate 0.500000 needs data.fim_tokens: the [prefix, middle, suffix]");
  expect_config_error(
      kValid, {"data.fim_rate=0.5", "data.fim_tokens=[1, 2, 256]"},
      "data.fim_tokens[2] (the suffix sentinel, 256) must be a token id in [0, 256)");
  expect_config_error(kValid, {"data.fim_rate=0.5", "data.fim_tokens=[1, 2, 1]"},
                      "data.fim_tokens[0] (the prefix sentinel, 1)");
  expect_config_error(kValid,
                      {"data.fim_rate=0.5", "data.fim_tokens=[1, 2, 3]", "data.eod_token=2"},
                      "data.fim_tokens[1] (the middle sentinel, 2)");
  expect_config_error(kValid, {"data.fim_rate=1.5"}, "data.fim_rate (1.5");
  expect_config_error(kValid, {"data.fim_tokens=[1, 2, 3]"},
                      "data.fim_tokens goes with data.fim_rate > 0");
  expect_config_error(kValid,
                      {"data.fim_rate=0.5", "data.fim_tokens=[1, 2, 3]", "data.eod_token=0",
                       "data.packing=documents"},
                      "data.fim_rate applies to data.packing: stream");
  // The output z-loss: off by default, round-tripped, a negative one named.
  EXPECT_EQ(c.model.z_loss_coef, 0.0);
  EXPECT_DOUBLE_EQ(
      parse_config(to_yaml(parse_config(kValid, {"model.z_loss_coef=1e-4"}))).model.z_loss_coef,
      1e-4);
  expect_config_error(kValid, {"model.z_loss_coef=-0.1"}, "model.z_loss_coef (-0.100000)");
}

// YAML forbids a key given twice in one mapping; yaml-cpp would keep the
// first and drop the second, so the error names both lines.
TEST(Config, AKeyGivenTwiceIsAnError) {
  const std::string twice = R"(
model:
  n_layer: 2
  n_head: 2
  d_model: 16
  vocab_size: 256
  seq_len: 32
  n_layer: 4
train: {steps: 5, global_batch_size: 8, micro_batch_size: 4, lr: 1.0e-3}
data: {train: data/x.bin}
)";
  expect_config_error(twice, {},
                      "key 'model.n_layer' is given twice (lines 3 and 8); give it once");
  expect_config_error(std::string(kValid) + "train: {steps: 7}\n", {},
                      "key 'train' is given twice (lines 3 and 5)");
  expect_config_error(kValid, {"data.train=[{path: a, path: b}]"},
                      "--set 'data.train=[{path: a, path: b}]': key 'data.train[0].path' is "
                      "given twice (columns 3 and 12 of line 1)");
  EXPECT_NO_THROW(parse_config(kValid));
}

// A mapping's key that is a list or a mapping (YAML allows it) is an error
// naming where, at the top level and inside sections.
TEST(Config, AKeyThatIsNoNameIsAnError) {
  expect_config_error(std::string(kValid) + "? [a, b]\n: 1\n", {},
                      "<config>: a key must be a plain name, got '[a, b]' (line 5)");
  expect_config_error(kValid, {"model.moe={[x]: 1}"}, "model.moe: a key must be a plain name");
  expect_config_error(kValid, {"train.lr_scale={{a: b}: 2}"},
                      "train.lr_scale: a key must be a plain name");
  expect_config_error(kValid, {"data.train=[{[p]: a.bin}]"},
                      "data.train[0]: a key must be a plain name");
}

// train.epochs instead of train.steps: one of the two, positive; written
// back as given; turned into steps by the data's size (the ramp counted).
TEST(Config, EpochsStandInForStepsUntilTheDataIsRead) {
  const std::string by_epochs = R"(
model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 256, seq_len: 32}
train: {epochs: 3, global_batch_size: 16, micro_batch_size: 4, lr: 1.0e-3, lr_decay: wsd}
data: {train: data/x.bin}
)";
  Config c = parse_config(by_epochs);
  EXPECT_EQ(c.train.epochs, 3.0);
  EXPECT_EQ(c.train.steps, 0);
  const std::string yaml = to_yaml(c);
  EXPECT_NE(yaml.find("epochs: 3"), std::string::npos) << yaml;
  EXPECT_EQ(yaml.find(" steps:"), std::string::npos) << yaml;
  EXPECT_EQ(parse_config(yaml).train.epochs, 3.0);
  // 3 passes over 614 sequences: 1842 in batches of 16.
  EXPECT_EQ(steps_for_epochs(c.train, 614), 116);
  resolve_epochs(c, 614);
  EXPECT_EQ(c.train.steps, 116);
  EXPECT_EQ(c.train.lr_schedule().decay_steps, 116);
  // Half a pass rounds up to whole sequences, then steps.
  c.train.epochs = 0.5;
  EXPECT_EQ(steps_for_epochs(c.train, 33), 2);  // 17 sequences
  // Through a ramp from 4 by 4 over 64 sequences: 4 x 6 (24), 8 x 3 (48),
  // 12 x 2 (72), then 16s: 100 sequences after 13 steps.
  c.train.epochs = 1;
  c.train.rampup_batch_size = {4, 4, 64};
  EXPECT_EQ(steps_for_epochs(c.train, 100), 13);
  // Passes no run counts (1e300 is finite; its cast to int64 was undefined).
  c.train.epochs = 1e300;
  triad::testing::expect_error([&] { steps_for_epochs(c.train, 100); },
                               {"train.epochs (1e+300) over 100 training sequences is more"});
  // A config in steps is left as it is.
  Config s = parse_config(kValid);
  resolve_epochs(s, 1000);
  EXPECT_EQ(s.train.steps, 5);
  expect_config_error(kValid, {"train.epochs=2"}, "give train.steps or train.epochs, not both");
  expect_config_error(by_epochs, {"train.epochs=-1"},
                      "train.epochs (-1) must be a positive number of passes over data.train");
  expect_config_error(R"(
model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 256, seq_len: 32}
train: {global_batch_size: 16, micro_batch_size: 4}
data: {train: data/x.bin}
)",
                      {}, "missing required key 'train.steps' (or 'train.epochs'");
  // The wsd cool-down is checked once the steps are known: 3 steps leave
  // no room after 5 warm-up steps.
  Config w = parse_config(by_epochs, {"train.warmup_steps=5"});
  try {
    resolve_epochs(w, 16);
    FAIL() << "expected the wsd check";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.lr_decay 'wsd' needs"), std::string::npos)
        << e.what();
  }
}

TEST(Config, LearningRateDecayKeys) {
  Config c = parse_config(kValid);
  EXPECT_EQ(c.train.lr_decay, "cosine");
  auto o = c.train.lr_schedule();
  EXPECT_EQ(o.decay, optim::LrDecay::Cosine);
  EXPECT_EQ(o.decay_steps, 5);  // train.steps
  EXPECT_EQ(o.cooldown_steps, 0);
  Config w = parse_config(
      to_yaml(parse_config(kValid, {"train.steps=1000", "train.warmup_steps=100",
                                    "train.lr_decay=wsd", "train.lr_decay_steps=900"})));
  o = w.train.lr_schedule();
  EXPECT_EQ(o.decay, optim::LrDecay::Wsd);
  EXPECT_EQ(o.decay_steps, 900);
  EXPECT_EQ(o.cooldown_steps, 160);  // a fifth of 900 - 100
  EXPECT_EQ(parse_config(to_yaml(parse_config(kValid, {"train.steps=1000", "train.lr_decay=wsd",
                                                       "train.cooldown_steps=50"})))
                .train.lr_schedule()
                .cooldown_steps,
            50);
  EXPECT_EQ(parse_config(kValid, {"train.lr_decay=linear"}).train.lr_schedule().decay,
            optim::LrDecay::Linear);
  EXPECT_EQ(o.cooldown_shape, optim::CooldownShape::Linear);
  EXPECT_EQ(parse_config(to_yaml(parse_config(kValid, {"train.steps=1000", "train.lr_decay=wsd",
                                                       "train.cooldown_shape=1-sqrt"})))
                .train.lr_schedule()
                .cooldown_shape,
            optim::CooldownShape::OneMinusSqrt);
  expect_config_error(kValid, {"train.lr_decay=wsd", "train.cooldown_shape=exponential"},
                      "train.cooldown_shape ('exponential') must be linear, cosine or 1-sqrt");
  expect_config_error(kValid, {"train.cooldown_shape=cosine"},
                      "train.cooldown_shape ('cosine') applies to train.lr_decay 'wsd', not "
                      "'cosine'");
  EXPECT_EQ(parse_config(to_yaml(parse_config(kValid, {"train.lr_decay=inverse_sqrt"})))
                .train.lr_schedule()
                .decay,
            optim::LrDecay::InverseSqrt);
  expect_config_error(
      kValid, {"train.lr_decay=step"},
      "train.lr_decay ('step') must be cosine, linear, constant, wsd or inverse_sqrt");
  expect_config_error(kValid, {"train.cooldown_steps=2"},
                      "train.cooldown_steps (2) applies to train.lr_decay 'wsd', not 'cosine'");
  expect_config_error(kValid, {"train.lr_decay=wsd", "train.cooldown_steps=6"},
                      "train.lr_decay 'wsd' needs 1 <= train.cooldown_steps (6) <= decay steps - "
                      "train.warmup_steps (5 - 0)");
  expect_config_error(kValid, {"train.lr_decay_steps=-1"},
                      "train.lr_decay_steps (-1) must be >= 0");
}

// train.warmup_init: parsed into the schedule, round-tripped (absent at 0),
// checked against train.lr and train.warmup_steps.
TEST(Config, WarmupInitKey) {
  const Config plain = parse_config(kValid, {"train.warmup_steps=4"});
  EXPECT_EQ(plain.train.lr_schedule().warmup_init, 0.0);
  EXPECT_EQ(to_yaml(plain).find("warmup_init"), std::string::npos) << to_yaml(plain);
  const Config c = parse_config(to_yaml(
      parse_config(kValid, {"train.lr=0.01", "train.warmup_steps=4", "train.warmup_init=0.002"})));
  EXPECT_EQ(c.train.lr_schedule().warmup_init, 0.002);
  EXPECT_NEAR(optim::LrSchedule(c.train.lr_schedule()).at(0), 0.002 + 0.008 / 4, 1e-15);
  expect_config_error(kValid, {"train.lr=0.01", "train.warmup_steps=4", "train.warmup_init=0.02"},
                      "train.warmup_init (0.02) must be in [0, train.lr (0.01)]");
  expect_config_error(kValid, {"train.warmup_steps=4", "train.warmup_init=-1"},
                      "train.warmup_init (-1) must be in [0, train.lr");
  expect_config_error(kValid, {"train.lr=0.01", "train.warmup_init=0.001"},
                      "train.warmup_init (0.001) needs a warm-up: train.warmup_steps is 0");
}

// log.straggler_factor: off by default (absent from the resolved config),
// round-tripped, and 0 or more than 1.
TEST(Config, StragglerFactorKey) {
  const Config plain = parse_config(kValid);
  EXPECT_EQ(plain.log_straggler_factor, 0.0);
  EXPECT_EQ(to_yaml(plain).find("straggler_factor"), std::string::npos) << to_yaml(plain);
  const Config c = parse_config(to_yaml(parse_config(kValid, {"log.straggler_factor=1.25"})));
  EXPECT_EQ(c.log_straggler_factor, 1.25);
  for (const char* bad : {"1", "0.5", "-2"}) {
    expect_config_error(
        kValid, {std::string("log.straggler_factor=") + bad},
        std::string("log.straggler_factor (") + bad + ") must be 0 (off) or more than 1");
  }
}

// train.weight_decay_schedule and its keys: parsed, round-tripped (absent
// when constant), checked.
TEST(Config, WeightDecayScheduleKeys) {
  const Config plain = parse_config(kValid, {"train.weight_decay=0.2"});
  auto o = plain.train.weight_decay_schedule_options();
  EXPECT_EQ(o.shape, optim::WeightDecayShape::Constant);
  EXPECT_EQ(o.end, 0.2);
  EXPECT_EQ(o.start, 0.2);
  EXPECT_EQ(to_yaml(plain).find("weight_decay_s"), std::string::npos) << to_yaml(plain);
  const Config c = parse_config(
      to_yaml(parse_config(kValid, {"train.steps=1000", "train.weight_decay_schedule=cosine",
                                    "train.weight_decay_start=0.01", "train.weight_decay=0.1"})));
  o = c.train.weight_decay_schedule_options();
  EXPECT_EQ(o.shape, optim::WeightDecayShape::Cosine);
  EXPECT_EQ(o.start, 0.01);
  EXPECT_EQ(o.end, 0.1);
  EXPECT_EQ(o.steps, 1000);  // train.steps
  o = parse_config(to_yaml(parse_config(
                       kValid, {"train.weight_decay_schedule=linear", "train.weight_decay_start=0",
                                "train.weight_decay_steps=3"})))
          .train.weight_decay_schedule_options();
  EXPECT_EQ(o.shape, optim::WeightDecayShape::Linear);
  EXPECT_EQ(o.start, 0.0);
  EXPECT_EQ(o.steps, 3);
  expect_config_error(kValid, {"train.weight_decay_schedule=exponential"},
                      "train.weight_decay_schedule ('exponential') must be constant, linear or "
                      "cosine");
  expect_config_error(kValid, {"train.weight_decay_schedule=linear"},
                      "train.weight_decay_schedule 'linear' needs train.weight_decay_start, the "
                      "decay at the first step (train.weight_decay, 0.1, is where it ends)");
  expect_config_error(kValid, {"train.weight_decay_start=0.01"},
                      "train.weight_decay_start (0.01) applies to train.weight_decay_schedule "
                      "'linear' or 'cosine', not 'constant'");
  expect_config_error(kValid, {"train.weight_decay_steps=100"},
                      "train.weight_decay_steps (100) applies to train.weight_decay_schedule "
                      "'linear' or 'cosine', not 'constant'");
  expect_config_error(kValid,
                      {"train.weight_decay_schedule=cosine", "train.weight_decay_start=-0.5"},
                      "train.weight_decay_start (-0.5) must be >= 0");
  expect_config_error(kValid,
                      {"train.weight_decay_schedule=cosine", "train.weight_decay_start=0",
                       "train.weight_decay_steps=-2"},
                      "train.weight_decay_steps (-2) must be >= 0 (0: train.steps)");
}

// train.optimizer muon and its keys: parsed, round-tripped, checked.
TEST(Config, MuonOptimizerKeys) {
  EXPECT_EQ(parse_config(kValid).train.optimizer, "adamw");
  const Config c = parse_config(to_yaml(parse_config(
      kValid, {"train.optimizer=muon", "train.muon_momentum=0.9", "train.muon_nesterov=false",
               "train.muon_ns_steps=6", "train.muon_scale=spectral", "train.muon_lr=0.02"})));
  EXPECT_EQ(c.train.optimizer, "muon");
  EXPECT_DOUBLE_EQ(c.train.muon_momentum, 0.9);
  EXPECT_FALSE(c.train.muon_nesterov);
  EXPECT_EQ(c.train.muon_ns_steps, 6);
  EXPECT_EQ(c.train.muon_scale, "spectral");
  EXPECT_DOUBLE_EQ(c.train.muon_lr, 0.02);
  // Newton-Schulz in bf16 under half precisions unless told otherwise.
  EXPECT_EQ(c.train.muon_ns_dtype(), DType::F32);
  EXPECT_EQ(
      parse_config(kValid, {"train.optimizer=muon", "train.precision=bf16"}).train.muon_ns_dtype(),
      DType::BF16);
  const Config f = parse_config(to_yaml(parse_config(
      kValid, {"train.optimizer=muon", "train.precision=bf16", "train.muon_ns_precision=fp32"})));
  EXPECT_EQ(f.train.muon_ns_dtype(), DType::F32);
  expect_config_error(kValid, {"train.optimizer=muon", "train.muon_ns_precision=fp16"},
                      "train.muon_ns_precision 'fp16' must be fp32 or bf16");
  expect_config_error(kValid, {"train.optimizer=sgd"},
                      "train.optimizer 'sgd' must be adamw or muon");
  // train.moment_precision: fp32 unless asked, round trips, and is named
  // when it is something else.
  EXPECT_EQ(parse_config(kValid).train.moment_dtype(), DType::F32);
  EXPECT_EQ(to_yaml(parse_config(kValid)).find("moment_precision"), std::string::npos);
  const Config bm = parse_config(to_yaml(parse_config(kValid, {"train.moment_precision=bf16"})));
  EXPECT_EQ(bm.train.moment_precision, "bf16");
  EXPECT_EQ(bm.train.moment_dtype(), DType::BF16);
  expect_config_error(kValid, {"train.moment_precision=fp16"},
                      "train.moment_precision 'fp16' must be fp32 or bf16");
  expect_config_error(kValid, {"train.muon_momentum=0.9"},
                      "train.muon_momentum applies to train.optimizer 'muon', not 'adamw'");
  expect_config_error(kValid, {"train.optimizer=muon", "train.muon_scale=unit"},
                      "train.muon_scale 'unit' must be adamw_rms or spectral");
  expect_config_error(kValid, {"train.optimizer=muon", "train.muon_momentum=1"},
                      "train.muon_momentum (1) must be in [0, 1)");
  expect_config_error(kValid, {"train.optimizer=muon", "train.muon_ns_steps=0"},
                      "train.muon_ns_steps (0) must be >= 1");
  expect_config_error(kValid, {"train.optimizer=muon", "train.muon_lr=0.02", "train.lr=0"},
                      "needs train.lr > 0");
  expect_config_error(kValid, {"train.optimizer=muon", "model.lora={rank: 4}"},
                      "train.optimizer 'muon' with model.lora");
}

// train.freeze: a pattern or a list of them, each checked against the
// model's parameter names before anything is built; round-trips.
TEST(Config, FreezeTakesParameterPatternsThatMustMatch) {
  EXPECT_TRUE(parse_config(kValid).frozen_parameters().empty());
  const Config one = parse_config(kValid, {"train.freeze=wte.weight"});
  EXPECT_EQ(one.train.freeze, (std::vector<std::string>{"wte.weight"}));
  EXPECT_EQ(one.frozen_parameters(), (std::set<std::string>{"wte.weight"}));
  const Config list = parse_config(kValid, {"train.freeze=[wpe.weight, 'h.[0-0].*', '*.bias']"});
  const auto frozen = list.frozen_parameters();
  EXPECT_TRUE(frozen.count("wpe.weight"));
  EXPECT_TRUE(frozen.count("h.0.attn.c_attn.weight"));
  EXPECT_TRUE(frozen.count("h.1.mlp.c_fc.bias"));
  EXPECT_TRUE(frozen.count("ln_f.bias"));
  EXPECT_FALSE(frozen.count("h.1.mlp.c_fc.weight"));
  EXPECT_FALSE(frozen.count("wte.weight"));
  EXPECT_EQ(parse_config(to_yaml(list)).train.freeze, list.train.freeze);

  expect_config_error(kValid, {"train.freeze=[wte.weight, h.*.atn.*]"},
                      "train.freeze[1]: 'h.*.atn.*' matches no parameter of this model");
  expect_config_error(kValid, {"train.freeze=['h.[2-3].*']"}, "train.freeze[0]");
  expect_config_error(kValid, {"train.freeze='h.[1-0].*'"}, "the range [1-0] is empty");
  expect_config_error(kValid, {"train.freeze={a: b}"}, "expected a parameter pattern or a list");
  expect_config_error(kValid, {"train.freeze=['*']"},
                      "train.freeze freezes every parameter of the model: nothing would train");
}

// model.lora: rank required, alpha the rank when left out, every layer LoRA
// adapts when targets are left out; every other parameter frozen; checked
// and round-tripped.
TEST(Config, LoraAdaptersAndTheParametersTheyFreeze) {
  const Config plain = parse_config(kValid);
  EXPECT_EQ(plain.model.lora.rank, 0);
  const Config c = parse_config(kValid, {"model.lora={rank: 4}"});
  EXPECT_EQ(c.model.lora.rank, 4);
  EXPECT_DOUBLE_EQ(c.model.lora_scale(), 1.0);
  EXPECT_EQ(c.model.lora.targets, nn::GptConfig::lora_layers());
  const auto frozen = c.frozen_parameters();
  EXPECT_TRUE(frozen.count("h.0.attn.c_attn.weight"));
  EXPECT_TRUE(frozen.count("wte.weight"));
  EXPECT_FALSE(frozen.count("h.0.attn.c_attn.lora_a"));
  EXPECT_EQ(frozen.size(), nn::gpt_parameter_shapes(c.model.without_lora()).size());
  const Config some =
      parse_config(kValid, {"model.lora={rank: 8, alpha: 32, targets: [attn.c_attn, mlp.c_fc]}"});
  EXPECT_DOUBLE_EQ(some.model.lora_scale(), 4.0);
  EXPECT_TRUE(some.model.lora_on("mlp.c_fc"));
  EXPECT_FALSE(some.model.lora_on("mlp.c_proj"));
  EXPECT_EQ(parse_config(to_yaml(some)).model.lora, some.model.lora);
  EXPECT_EQ(parse_config(to_yaml(plain)).model.lora, plain.model.lora);
  const Config dropped = parse_config(kValid, {"model.lora={rank: 2, dropout: 0.05}"});
  EXPECT_EQ(parse_config(to_yaml(dropped)).model.lora, dropped.model.lora);
  EXPECT_EQ(parse_config(kValid, {"model.lora=none"}).model.lora.rank, 0);
  EXPECT_EQ(parse_config(kValid, {"model.lora=16"}).model.lora,
            parse_config(kValid, {"model.lora={rank: 16}"}).model.lora);

  expect_config_error(kValid, {"model.lora={alpha: 8}"}, "model.lora: missing required key 'rank'");
  expect_config_error(kValid, {"model.lora={rank: 0}"}, "model.lora.rank (0) must be positive");
  expect_config_error(kValid, {"model.lora={rank: 4, alpha: -1}"},
                      "model.lora.alpha (-1) must be a positive number");
  EXPECT_DOUBLE_EQ(parse_config(kValid, {"model.lora={rank: 4, dropout: 0.1}"}).model.lora.dropout,
                   0.1);
  EXPECT_EQ(parse_config(kValid, {"model.lora=4"}).model.lora.dropout, 0.0);
  expect_config_error(kValid, {"model.lora={rank: 4, dropout: 1}"},
                      "model.lora.dropout (1) must be in [0, 1)");
  expect_config_error(kValid, {"model.lora={rank: 4, drop: 0.1}"},
                      "unknown key 'model.lora.drop' (allowed: rank, alpha, targets, dropout)");
  expect_config_error(kValid, {"model.lora={rank: 4, targets: [attn.qkv]}"},
                      "model.lora.targets[0] 'attn.qkv' is not a layer LoRA adapts");
  expect_config_error(kValid, {"model.lora=yes"},
                      "model.lora ('yes') must be none, a rank, or a mapping");
  expect_config_error(kValid, {"model.lora={rank: 4}", "train.freeze=wte.weight"},
                      "train.freeze with model.lora");
}

// model.moe: experts required, the rest defaulted; the keys given over
// those model.hf_config read; written back as read; a LoRA run's default
// targets are then the attention's.
TEST(Config, MixtureOfExpertsParsesRoundTripsAndIsChecked) {
  const Config plain = parse_config(kValid);
  EXPECT_EQ(plain.model.moe.experts, 0);
  const Config c = parse_config(kValid, {"model.moe={experts: 4}"});
  EXPECT_EQ(c.model.moe.experts, 4);
  EXPECT_EQ(c.model.moe.top_k, 2);
  EXPECT_TRUE(c.model.moe.normalize_top_k);
  EXPECT_DOUBLE_EQ(c.model.moe.aux_loss_coef, 0.01);
  EXPECT_EQ(c.model.expert_ffn(), c.model.ffn());
  const Config all = parse_config(
      kValid, {"model.moe={experts: 8, top_k: 1, ffn_hidden_size: 64, normalize_top_k: false, "
               "aux_loss_coef: 0.001, dense_layers: [0]}"});
  EXPECT_EQ(all.model.moe.top_k, 1);
  EXPECT_EQ(all.model.expert_ffn(), 64);
  EXPECT_FALSE(all.model.moe.normalize_top_k);
  EXPECT_EQ(all.model.moe.dense_layers, std::vector<int64_t>{0});
  EXPECT_FALSE(all.model.moe_layer(0));
  EXPECT_TRUE(all.model.moe_layer(1));
  EXPECT_EQ(parse_config(to_yaml(all)).model.moe, all.model.moe);
  EXPECT_EQ(parse_config(to_yaml(plain)).model.moe, plain.model.moe);
  EXPECT_EQ(parse_config(kValid, {"model.moe={experts: 4}", "model.moe=none"}).model.moe.experts,
            0);
  // LoRA's default targets leave the experts alone; naming them adapts
  // every expert's layer of that name.
  EXPECT_EQ(parse_config(kValid, {"model.moe={experts: 4}", "model.lora=4"}).model.lora.targets,
            (std::vector<std::string>{"attn.c_attn", "attn.c_proj"}));
  expect_config_error(kValid, {"init.adapter=/adapters/chat"},
                      "init.adapter '/adapters/chat' is merged into init.from's weights, but "
                      "init.from is not set");
  EXPECT_EQ(parse_config(kValid, {"init.from=/m", "init.adapter=/a"}).init_adapter, "/a");
  EXPECT_EQ(
      parse_config(to_yaml(parse_config(kValid, {"init.from=/m", "init.adapter=/a"}))).init_adapter,
      "/a");
  const Config on_experts =
      parse_config(kValid, {"model.moe={experts: 4}", "model.lora={rank: 4, targets: mlp.c_fc}"});
  EXPECT_EQ(on_experts.model.lora.targets, (std::vector<std::string>{"mlp.c_fc"}));
  EXPECT_EQ(on_experts.model.lora_modules(1).size(), 4u);
  expect_config_error(kValid, {"model.moe={top_k: 2}"}, "model.moe.experts (0) must be positive");
  expect_config_error(kValid, {"model.moe={experts: 4, top_k: 5}"},
                      "model.moe.top_k (5) must be in [1, model.moe.experts (4)]");
  expect_config_error(kValid, {"model.moe={experts: 4, k: 2}"},
                      "unknown key 'model.moe.k' (allowed: experts, top_k, ffn_hidden_size");
  expect_config_error(kValid, {"model.moe={experts: 4, dense_layers: 1}"},
                      "model.moe.dense_layers: expected a list of layer indices");
  expect_config_error(kValid, {"model.moe=8"}, "model.moe ('8') must be none, or a mapping");
  // A shared expert every token takes (Qwen2-MoE's), gated or not.
  const Config shared = parse_config(
      kValid, {"model.moe={experts: 4, shared_ffn_hidden_size: 48, shared_gate: true}"});
  EXPECT_EQ(shared.model.moe.shared_ffn_hidden_size, 48);
  EXPECT_TRUE(shared.model.moe.shared_gate);
  EXPECT_EQ(parse_config(to_yaml(shared)).model.moe, shared.model.moe);
  EXPECT_FALSE(parse_config(kValid, {"model.moe={experts: 4, shared_ffn_hidden_size: 48}"})
                   .model.moe.shared_gate);
  expect_config_error(kValid, {"model.moe={experts: 4, shared_ffn_hidden_size: -1}"},
                      "model.moe.shared_ffn_hidden_size (-1) must be positive");
  expect_config_error(kValid, {"model.moe={experts: 4, shared_gate: true}"},
                      "model.moe.shared_gate gates the shared expert, but "
                      "model.moe.shared_ffn_hidden_size is 0");
  expect_config_error(kValid, {"model.moe={experts: 4, shared: 8}"},
                      "(allowed: experts, top_k, ffn_hidden_size, normalize_top_k, aux_loss_coef, "
                      "dense_layers, shared_ffn_hidden_size, shared_gate, capacity_factor, "
                      "drop_policy, pad_to_capacity, z_loss_coef, score, routed_scaling_factor, "
                      "groups, top_groups, group_score, expert_bias, bias_update_rate, "
                      "aux_loss_scope)");
  // The router z-loss's weight.
  const Config z = parse_config(kValid, {"model.moe={experts: 4, z_loss_coef: 0.001}"});
  EXPECT_DOUBLE_EQ(z.model.moe.z_loss_coef, 0.001);
  EXPECT_EQ(parse_config(to_yaml(z)).model.moe, z.model.moe);
  EXPECT_EQ(parse_config(kValid, {"model.moe={experts: 4}"}).model.moe.z_loss_coef, 0.0);
  expect_config_error(kValid, {"model.moe={experts: 4, z_loss_coef: -1}"},
                      "model.moe.z_loss_coef (-1.000000) must be a finite number >= 0");
  // A capacity factor and the policy that drops over it.
  const Config capped = parse_config(
      kValid, {"model.moe={experts: 4, capacity_factor: 1.25, drop_policy: position}"});
  EXPECT_DOUBLE_EQ(capped.model.moe.capacity_factor, 1.25);
  EXPECT_EQ(capped.model.moe.drop_policy, nn::GptConfig::Moe::DropPolicy::Position);
  EXPECT_EQ(parse_config(to_yaml(capped)).model.moe, capped.model.moe);
  EXPECT_EQ(
      parse_config(kValid, {"model.moe={experts: 4, capacity_factor: 1}"}).model.moe.drop_policy,
      nn::GptConfig::Moe::DropPolicy::Probs);
  expect_config_error(kValid, {"model.moe={experts: 4, capacity_factor: -1}"},
                      "model.moe.capacity_factor (-1) must be a finite number >= 0");
  expect_config_error(kValid, {"model.moe={experts: 4, capacity_factor: 1, drop_policy: random}"},
                      "model.moe.drop_policy 'random' is not a policy");
  // DeepSeek-V3's routing: sigmoid scores, scaled gates, groups, and the
  // aux-loss-free expert biases.
  const Config v3 = parse_config(
      kValid, {"model.moe={experts: 8, top_k: 2, score: sigmoid, routed_scaling_factor: 2.5, "
               "groups: 4, top_groups: 2, expert_bias: true, bias_update_rate: 0.002}"});
  EXPECT_EQ(v3.model.moe.score, nn::GptConfig::Moe::Score::Sigmoid);
  EXPECT_DOUBLE_EQ(v3.model.moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(v3.model.moe.groups, 4);
  EXPECT_EQ(v3.model.moe.top_groups, 2);
  EXPECT_TRUE(v3.model.moe.expert_bias);
  EXPECT_DOUBLE_EQ(v3.model.moe.bias_update_rate, 0.002);
  EXPECT_EQ(parse_config(to_yaml(v3)).model.moe, v3.model.moe);
  EXPECT_EQ(nn::gpt_parameter_shapes(v3.model).at("h.1.mlp.expert_bias"), (Shape{8}));
  const Config softmax = parse_config(kValid, {"model.moe={experts: 4}"});
  EXPECT_EQ(softmax.model.moe.score, nn::GptConfig::Moe::Score::Softmax);
  EXPECT_FALSE(softmax.model.moe.expert_bias);
  EXPECT_EQ(nn::gpt_parameter_shapes(softmax.model).count("h.1.mlp.expert_bias"), 0u);
  expect_config_error(kValid, {"model.moe={experts: 4, score: tanh}"},
                      "model.moe.score 'tanh' is not a router score");
  expect_config_error(kValid, {"model.moe={experts: 4, routed_scaling_factor: 0}"},
                      "model.moe.routed_scaling_factor (0) must be a finite number > 0");
  expect_config_error(kValid, {"model.moe={experts: 4, expert_bias: true, bias_update_rate: -1}"},
                      "model.moe.bias_update_rate (-1) must be a finite number >= 0");
  expect_config_error(kValid, {"model.moe={experts: 6, groups: 4}"},
                      "model.moe.groups (4) must divide model.moe.experts (6)");
  expect_config_error(kValid, {"model.moe={experts: 8, groups: 4, top_groups: 5}"},
                      "model.moe.top_groups (5) must be in [1, model.moe.groups (4)]");
  expect_config_error(kValid, {"model.moe={experts: 8, top_k: 3, groups: 4, top_groups: 1}"},
                      "model.moe.top_k (3) exceeds the 2 experts of model.moe.top_groups (1)");
  // DeepSeek-V2's groups, scored by their best expert.
  const Config v2 = parse_config(
      kValid, {"model.moe={experts: 8, top_k: 2, groups: 4, top_groups: 2, group_score: max, "
               "routed_scaling_factor: 16}"});
  EXPECT_EQ(v2.model.moe.group_score, nn::GptConfig::Moe::GroupScore::Max);
  EXPECT_EQ(parse_config(to_yaml(v2)).model.moe, v2.model.moe);
  EXPECT_EQ(v3.model.moe.group_score, nn::GptConfig::Moe::GroupScore::TopTwoSum);
  expect_config_error(kValid, {"model.moe={experts: 8, groups: 4, group_score: mean}"},
                      "model.moe.group_score 'mean' is not a group score");
  // The load-balancing loss per sequence (DeepSeek-V3's).
  const Config per_sequence =
      parse_config(kValid, {"model.moe={experts: 4, aux_loss_scope: sequence}"});
  EXPECT_EQ(per_sequence.model.moe.aux_loss_scope, nn::GptConfig::Moe::BalanceScope::Sequence);
  EXPECT_EQ(parse_config(to_yaml(per_sequence)).model.moe, per_sequence.model.moe);
  EXPECT_EQ(v3.model.moe.aux_loss_scope, nn::GptConfig::Moe::BalanceScope::MicroBatch);
  expect_config_error(kValid, {"model.moe={experts: 4, aux_loss_scope: batch}"},
                      "model.moe.aux_loss_scope 'batch' is not a scope");
  // parallel.ep: a mixture's experts shared out among data-parallel ranks.
  const Config ep = parse_config(kValid, {"model.moe={experts: 4}", "parallel.ep=2"});
  EXPECT_EQ(ep.parallel.ep, 2);
  EXPECT_EQ(parse_config(to_yaml(ep)).parallel.ep, 2);
  EXPECT_EQ(parse_config(kValid).parallel.ep, 1);
  expect_config_error(kValid, {"parallel.ep=2"},
                      "parallel.ep (2) shares a mixture's experts out, but model.moe is not set");
  expect_config_error(kValid, {"model.moe={experts: 4}", "parallel.ep=3"},
                      "model.moe.experts (4) must be divisible by parallel.ep (3)");
  expect_config_error(kValid, {"model.moe={experts: 4}", "parallel.ep=2", "parallel.dp=3"},
                      "parallel.ep (2) must divide parallel.dp (3)");
  // parallel.cp: sequences shared out among ranks; expert parallelism may
  // span them (ep divides dp * cp).
  const Config cp = parse_config(kValid, {"parallel.cp=2"});
  EXPECT_EQ(cp.parallel.cp, 2);
  EXPECT_EQ(parse_config(to_yaml(cp)).parallel.cp, 2);
  EXPECT_EQ(parse_config(kValid).parallel.cp, 1);
  EXPECT_EQ(parse_config(kValid, {"model.moe={experts: 4, aux_loss_coef: 0}", "parallel.ep=4",
                                  "parallel.dp=2", "parallel.cp=2"})
                .parallel.ep,
            4);
  expect_config_error(kValid,
                      {"model.moe={experts: 4, aux_loss_coef: 0}", "parallel.ep=4", "parallel.dp=3",
                       "parallel.cp=2"},
                      "parallel.ep (4) must divide parallel.dp (3) times parallel.cp (2)");
  // Heads that do not share out: the all-to-all refuses them, the
  // all-gather (and auto, which picks it) takes them; the choice
  // round-trips.
  expect_config_error(kValid, {"parallel.cp=4", "parallel.cp_comm=all_to_all"},
                      "parallel.cp (4) beside parallel.tp (1) with parallel.cp_comm all_to_all: "
                      "model.n_head (2) and its key/value heads (2) leave 2 query and 2 key/value "
                      "heads on each tensor-parallel rank");
  EXPECT_EQ(parse_config(kValid, {"parallel.cp=4"}).parallel.cp_comm, "auto");
  EXPECT_EQ(
      parse_config(to_yaml(parse_config(kValid, {"parallel.cp=4", "parallel.cp_comm=all_gather"})))
          .parallel.cp_comm,
      "all_gather");
  // The all-gather's and the ring's balanced layout cuts each row into 2 cp
  // half-chunks.
  expect_config_error(kValid, {"parallel.cp=4", "model.seq_len=36"},
                      "model.seq_len (36) must be divisible by cp and by 2 cp (two half-chunks a "
                      "rank under parallel.cp_comm all_gather) (8)");
  expect_config_error(kValid, {"parallel.cp=2", "parallel.cp_comm=ring", "model.seq_len=34"},
                      "model.seq_len (34) must be divisible by cp and by 2 cp (two half-chunks a "
                      "rank under parallel.cp_comm ring) (4)");
  EXPECT_EQ(parse_config(to_yaml(parse_config(kValid, {"parallel.cp=2", "parallel.cp_comm=ring"})))
                .parallel.cp_comm,
            "ring");
  expect_config_error(
      kValid, {"parallel.cp=2", "parallel.cp_comm=p2p"},
      "parallel.cp_comm: 'p2p' is not an exchange (auto, all_to_all, all_gather, ring or "
      "all_to_all+ring)");
  // All-to-alls of parallel.cp_a2a consecutive ranks, a ring across them:
  // cp_a2a strictly between 1 and cp and dividing it, the heads sharing out
  // over it, and each ring position's two half-chunks; cp_a2a with another
  // exchange is named. The choice round-trips.
  const Config both = parse_config(
      kValid, {"parallel.cp=4", "parallel.cp_comm=all_to_all+ring", "parallel.cp_a2a=2"});
  EXPECT_EQ(both.parallel.cp_a2a, 2);
  EXPECT_EQ(parse_config(to_yaml(both)).parallel.cp_a2a, 2);
  EXPECT_EQ(parse_config(to_yaml(both)).parallel.cp_comm, "all_to_all+ring");
  EXPECT_EQ(parse_config(kValid).parallel.cp_a2a, 1);
  expect_config_error(kValid, {"parallel.cp=4", "parallel.cp_comm=all_to_all+ring"},
                      "parallel.cp_a2a (1) must be a divisor of parallel.cp (4) above 1 and below "
                      "it under parallel.cp_comm all_to_all+ring");
  expect_config_error(kValid,
                      {"parallel.cp=6", "parallel.cp_comm=all_to_all+ring", "parallel.cp_a2a=4"},
                      "parallel.cp_a2a (4) must be a divisor of parallel.cp (6)");
  expect_config_error(kValid, {"parallel.cp=4", "parallel.cp_comm=ring", "parallel.cp_a2a=2"},
                      "parallel.cp_a2a (2) is for parallel.cp_comm all_to_all+ring only (here "
                      "ring)");
  expect_config_error(kValid, {"parallel.cp_a2a=2"},
                      "parallel.cp_a2a (2) is for parallel.cp_comm all_to_all+ring only (here no "
                      "context parallelism)");
  expect_config_error(
      kValid,
      {"parallel.cp=6", "parallel.cp_comm=all_to_all+ring", "parallel.cp_a2a=3",
       "model.seq_len=36"},
      "with parallel.cp_comm all_to_all+ring: model.n_head (2) and its key/value heads (2) leave 2 "
      "query and 2 key/value heads on each tensor-parallel rank; the all-to-all needs the query "
      "heads a multiple of cp_a2a (3)");
  expect_config_error(
      kValid,
      {"parallel.cp=6", "parallel.cp_comm=all_to_all+ring", "parallel.cp_a2a=3", "model.n_head=6",
       "model.d_model=24", "model.seq_len=18"},
      "model.seq_len (18) must be divisible by cp and by 2 cp / cp_a2a (two half-chunks each of "
      "the ring's 2 positions under parallel.cp_comm all_to_all+ring) (12)");
  expect_config_error(kValid, {"parallel.cp=2", "model.seq_len=33"},
                      "model.seq_len (33) must be divisible by cp (2)");
  expect_config_error(
      kValid,
      {"parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true", "model.n_head=4",
       "model.seq_len=34"},
      "model.seq_len (34) must be divisible by cp times tp (sequence parallelism) (4)");
  // A capacity chooses among every chunk's assignments (MoeMlp::Chunks).
  EXPECT_DOUBLE_EQ(
      parse_config(kValid, {"parallel.cp=2", "model.moe={experts: 4, capacity_factor: 1.25}"})
          .model.moe.capacity_factor,
      1.25);
  EXPECT_EQ(parse_config(kValid, {"parallel.cp=2", "model.moe={experts: 4}"}).parallel.cp, 2);
}

TEST(Config, TrainingDataIsAPathOrAWeightedMixture) {
  Config c = parse_config(kValid);
  ASSERT_EQ(c.data_train.size(), 1u);
  EXPECT_EQ(c.data_train[0].path, "data/x.bin");
  EXPECT_EQ(c.data_train[0].weight, 1.0);
  Config m = parse_config(
      kValid, {"data.train=[{path: data/web_*.bin, weight: 0.7}, {path: data/code, weight: 0.3}]"});
  ASSERT_EQ(m.data_train.size(), 2u);
  EXPECT_EQ(m.data_train[1].path, "data/code");
  EXPECT_EQ(m.data_train[1].weight, 0.3);
  EXPECT_EQ(parse_config(to_yaml(m)).data_train, m.data_train);
  EXPECT_EQ(parse_config(to_yaml(c)).data_train, c.data_train);
  EXPECT_EQ(parse_config(kValid, {"data.train=[{path: a}]"}).data_train[0].weight, 1.0);
  expect_config_error(kValid, {"data.train=[]"}, "data.train: expected a path or glob, or a list");
  expect_config_error(kValid, {"data.train=[data/a.bin]"},
                      "data.train[0]: expected {path: ..., weight: ...}");
  expect_config_error(kValid, {"data.train=[{weight: 2}]"},
                      "missing required key 'data.train[0].path'");
  expect_config_error(kValid, {"data.train=[{path: a}, {path: b, weight: 0}]"},
                      "data.train[1].weight (0) must be positive");
  expect_config_error(kValid, {"data.train=[{path: a, share: 2}]"},
                      "unknown key 'data.train[0].share' (allowed: path, weight)");
}

// eval.choices: multiple-choice questions, alone or beside validation data,
// with the keys saying how they are tokenized; those keys without it, or
// naming the tokenizer twice, are errors.
TEST(Config, EvalChoicesAndHowTheyAreTokenized) {
  const Config c = parse_config(to_yaml(parse_config(
      kValid, {"eval.choices=hellaswag_val.jsonl", "eval.interval=100", "eval.choices_limit=500",
               "eval.choices_fewshot=5", "eval.choices_fewshot_seed=1234",
               "eval.hellaswag_prompt=harness", "eval.vocab=gpt2/vocab.json",
               "eval.merges=gpt2/merges.txt", "eval.bos_token=<|endoftext|>"})));
  EXPECT_EQ(c.eval.choices, (std::vector<EvalSection::ChoiceSet>{{"", "hellaswag_val.jsonl"}}));
  EXPECT_EQ(c.eval.choices_limit, 500);
  EXPECT_EQ(c.eval.choices_fewshot, 5);
  EXPECT_EQ(c.eval.choices_fewshot_seed, 1234);
  EXPECT_EQ(c.eval.hellaswag_prompt, "harness");
  EXPECT_EQ(c.eval.interval, 100);
  EXPECT_EQ(c.eval.vocab, "gpt2/vocab.json");
  EXPECT_EQ(c.eval.merges, "gpt2/merges.txt");
  EXPECT_EQ(c.eval.bos_token, "<|endoftext|>");
  EXPECT_TRUE(c.evaluates());
  EXPECT_FALSE(c.has_validation());
  const Config both = parse_config(
      to_yaml(parse_config(kValid, {"eval.choices=q.jsonl", "eval.tokenizer=/models/llama",
                                    "data.val=v.bin", "eval.batches=2"})));
  EXPECT_EQ(both.eval.tokenizer, "/models/llama");
  // Several sets by name, in the config's order.
  const Config named = parse_config(
      to_yaml(parse_config(kValid, {"eval.choices={hellaswag: h.jsonl, arc_easy: a.jsonl}"})));
  EXPECT_EQ(named.eval.choices, (std::vector<EvalSection::ChoiceSet>{{"hellaswag", "h.jsonl"},
                                                                     {"arc_easy", "a.jsonl"}}));
  expect_config_error(kValid, {"eval.choices={\"a b\": h.jsonl}"},
                      "eval.choices: the set name 'a b' must be letters, digits");
  expect_config_error(kValid, {"eval.choices=[h.jsonl]"},
                      "eval.choices: expected a path, or a mapping of names to them ({hellaswag: "
                      "hellaswag_val.jsonl, arc: arc_easy.jsonl})");
  EXPECT_EQ(both.eval.batches, 2);
  expect_config_error(kValid, {"eval.choices=q.jsonl", "eval.batches=2"},
                      "eval.batches (2) needs validation data: set data.val or data.val_split");
  expect_config_error(kValid, {"eval.choices_limit=5"},
                      "eval.choices_limit only says how much of eval.choices is read");
  expect_config_error(kValid, {"eval.choices_fewshot=5"},
                      "eval.choices_fewshot only says how eval.choices are asked");
  expect_config_error(kValid, {"eval.choices=q.jsonl", "eval.choices_fewshot=-2"},
                      "eval.choices_fewshot (-2) must be >= 0");
  expect_config_error(kValid, {"eval.choices=q.jsonl", "eval.choices_fewshot_seed=7"},
                      "eval.choices_fewshot_seed (7) draws eval.choices_fewshot's examples");
  expect_config_error(
      kValid, {"eval.choices=q.jsonl", "eval.choices_fewshot=1", "eval.choices_fewshot_seed=-1"},
      "eval.choices_fewshot_seed (-1) must be >= 0");
  EXPECT_EQ(both.eval.choices_fewshot_seed, -1);  // the first examples
  expect_config_error(kValid, {"eval.hellaswag_prompt=harness"},
                      "eval.hellaswag_prompt only says how eval.choices are asked");
  expect_config_error(kValid, {"eval.choices=q.jsonl", "eval.hellaswag_prompt=eleuther"},
                      "eval.hellaswag_prompt ('eleuther') must be llmc");
  for (const char* key : {"eval.tokenizer=t.json", "eval.bos_token=<s>"}) {
    expect_config_error(kValid, {key},
                        std::string(key).substr(0, std::string(key).find('=')) +
                            " only says how eval.choices, eval.lambada and eval.samples are read");
  }
  expect_config_error(kValid, {"eval.choices=q.jsonl", "eval.vocab=v.json"},
                      "eval.vocab needs eval.merges: GPT-2's tokenizer is the two files together");
  expect_config_error(kValid, {"eval.choices=q.jsonl", "eval.merges=m.txt"},
                      "eval.merges needs eval.vocab");
  expect_config_error(
      kValid,
      {"eval.choices=q.jsonl", "eval.tokenizer=t.json", "eval.vocab=v.json", "eval.merges=m.txt"},
      "eval.tokenizer and eval.vocab/eval.merges each name the tokenizer");
  expect_config_error(kValid, {"eval.choices=q.jsonl", "eval.choices_limit=-1"},
                      "eval.choices_limit (-1) must be >= 0");
}

// eval.lambada: LAMBADA's texts, alone (with the tokenizer's keys) or by
// name, round-tripping; its limit without it is an error.
TEST(Config, EvalLambadaTexts) {
  const Config c = parse_config(to_yaml(parse_config(
      kValid, {"eval.lambada=lambada_test.jsonl", "eval.lambada_limit=300", "eval.interval=50",
               "eval.tokenizer=/models/gpt2", "eval.bos_token=<|endoftext|>"})));
  EXPECT_EQ(c.eval.lambada, (std::vector<EvalSection::LambadaSet>{{"", "lambada_test.jsonl"}}));
  EXPECT_EQ(c.eval.lambada_limit, 300);
  EXPECT_EQ(c.eval.tokenizer, "/models/gpt2");
  EXPECT_EQ(c.eval.bos_token, "<|endoftext|>");
  EXPECT_TRUE(c.evaluates());
  EXPECT_TRUE(c.eval.choices.empty());
  const Config named =
      parse_config(to_yaml(parse_config(kValid, {"eval.lambada={en: l.jsonl, de: l_de.jsonl}"})));
  EXPECT_EQ(named.eval.lambada,
            (std::vector<EvalSection::LambadaSet>{{"en", "l.jsonl"}, {"de", "l_de.jsonl"}}));
  EXPECT_EQ(named.eval.lambada_limit, 0);
  expect_config_error(kValid, {"eval.lambada_limit=5"},
                      "eval.lambada_limit only says how much of eval.lambada is read");
  expect_config_error(kValid, {"eval.lambada=l.jsonl", "eval.lambada_limit=-1"},
                      "eval.lambada_limit (-1) must be >= 0");
  expect_config_error(kValid, {"eval.lambada={\"x y\": l.jsonl}"},
                      "eval.lambada: the set name 'x y' must be letters, digits");
  expect_config_error(kValid, {"eval.lambada=l.jsonl", "eval.batches=2"},
                      "eval.batches (2) needs validation data");
}

TEST(Config, EvalSamplesArePromptsToContinue) {
  const Config c = parse_config(to_yaml(parse_config(
      kValid, {"eval.samples=[\"Once upon a time\", The]", "eval.sample_tokens=32",
               "eval.sample_temperature=0.7", "eval.sample_top_k=20", "eval.interval=50",
               "eval.tokenizer=/models/gpt2", "eval.bos_token=<|endoftext|>"})));
  EXPECT_EQ(c.eval.samples, (std::vector<std::string>{"Once upon a time", "The"}));
  EXPECT_EQ(c.eval.sample_tokens, 32);
  EXPECT_EQ(c.eval.sample_temperature, 0.7);
  EXPECT_EQ(c.eval.sample_top_k, 20);
  EXPECT_EQ(c.eval.tokenizer, "/models/gpt2");
  EXPECT_EQ(c.eval.bos_token, "<|endoftext|>");
  EXPECT_TRUE(c.evaluates());  // samples alone are something to evaluate
  EXPECT_FALSE(c.has_validation());
  EXPECT_EQ(parse_config(kValid, {"eval.samples=Hello"}).eval.samples,
            std::vector<std::string>{"Hello"});
  expect_config_error(kValid, {"eval.samples=[a, \"\"]"},
                      "eval.samples[1] is empty: a prompt needs text to continue");
  expect_config_error(kValid, {"eval.samples={a: b}"},
                      "eval.samples: expected a prompt or a list of prompts");
  expect_config_error(kValid, {"eval.samples=a", "eval.sample_tokens=0"},
                      "eval.sample_tokens (0) must be >= 1");
  expect_config_error(kValid, {"eval.samples=a", "eval.sample_temperature=-1"},
                      "eval.sample_temperature (-1) must be >= 0 (0: greedy)");
  expect_config_error(kValid, {"eval.samples=a", "eval.sample_top_k=-2"},
                      "eval.sample_top_k (-2) must be >= 0");
  for (const char* key :
       {"eval.sample_tokens=5", "eval.sample_temperature=1", "eval.sample_top_k=3"}) {
    expect_config_error(kValid, {key},
                        std::string(key).substr(0, std::string(key).find('=')) +
                            " only says how eval.samples are continued: set eval.samples");
  }
}

TEST(Config, EvalNeedsValidationDataAndNonNegativeCounts) {
  expect_config_error(kValid, {"eval.interval=10"},
                      "eval.interval (10) needs something to evaluate: set data.val, "
                      "data.val_split, eval.choices, eval.lambada or eval.samples");
  expect_config_error(kValid, {"eval.batches=2"},
                      "eval.batches (2) needs validation data: set data.val");
  // data.val_split holds out part of data.train instead of naming a set.
  const Config split =
      parse_config(to_yaml(parse_config(kValid, {"data.val_split=0.05", "eval.interval=10"})));
  EXPECT_DOUBLE_EQ(split.data_val_split, 0.05);
  EXPECT_TRUE(split.has_validation());
  EXPECT_EQ(split.eval.interval, 10);
  EXPECT_DOUBLE_EQ(parse_config(kValid).data_val_split, 0.0);
  expect_config_error(kValid, {"data.val_split=1"},
                      "data.val_split (1) must be in [0, 1): the share of each data.train part");
  expect_config_error(kValid, {"data.val_split=-0.5"}, "data.val_split (-0.5) must be in [0, 1)");
  expect_config_error(kValid, {"data.val_split=0.1", "data.val=v.bin"},
                      "data.val_split (0.1) and data.val both name the validation data");
  expect_config_error(kValid, {"data.val=v.bin", "eval.interval=-1"},
                      "eval.interval (-1) must be >= 0");
  expect_config_error(kValid, {"data.val=v.bin", "eval.batches=-3"},
                      "eval.batches (-3) must be >= 0");
  expect_config_error(kValid, {"eval.every=3"},
                      "unknown key 'eval.every' (allowed in eval: interval, batches, at_start, "
                      "early_stop_patience, "
                      "early_stop_delta, choices, "
                      "choices_limit, choices_fewshot, choices_fewshot_seed, hellaswag_prompt, "
                      "lambada, lambada_limit, samples, "
                      "sample_tokens, "
                      "sample_temperature, sample_top_k, "
                      "tokenizer, vocab, merges, bos_token)");
  expect_config_error(
      kValid, {"data.test=x"},
      "unknown key 'data.test' (allowed in data: train, val, val_split, shuffle, eod_token, "
      "reset_attention_mask, reset_position_ids, eod_mask_loss, packing, "
      "long_documents, fim_rate, fim_spm_rate, fim_tokens)");
}

TEST(Config, ErrorsNameKeyValueAndRule) {
  expect_config_error(
      kValid, {"train.lrr=1"},
      "unknown key 'train.lrr' (allowed in train: steps, epochs, global_batch_size");
  expect_config_error(kValid, {"pipeline.pp=2"}, "unknown top-level key 'pipeline'");
  expect_config_error(kValid, {"parallel.tpp=2"},
                      "unknown key 'parallel.tpp' (allowed in parallel: tp, pp, vpp, dp");
  expect_config_error(kValid, {"parallel.pp=3"},
                      "parallel.pp (3) must not exceed model.n_layer (2)");
  expect_config_error(
      kValid, {"model.n_layer=6", "parallel.pp=4"},
      "model.n_layer (6) must be divisible by parallel.pp * parallel.vpp (4 * 1 = 4), or "
      "parallel.stage_layers must say how to split it (auto, or a list of layers per stage)");
  expect_config_error(kValid, {"model.n_layer=4", "parallel.pp=2", "parallel.vpp=2"},
                      "parallel.vpp (2) > 1 goes with parallel.schedule 'interleaved'");
  expect_config_error(kValid, {"model.n_layer=4", "parallel.pp=2", "parallel.schedule=interleaved"},
                      "parallel.schedule 'interleaved' runs several model chunks on each rank: "
                      "parallel.vpp must be at least 2 (got 1)");
  // The interleaved schedule takes any number of microbatches (here 3 on 2
  // ranks).
  EXPECT_NO_THROW(parse_config(
      kValid,
      {"model.n_layer=4", "parallel.pp=2", "parallel.vpp=2", "parallel.schedule=interleaved",
       "train.global_batch_size=12", "train.micro_batch_size=4", "parallel.dp=1"}));
  expect_config_error(kValid, {"model.n_layer=8", "parallel.pp=2", "parallel.stage_layers=[3, 4]"},
                      "parallel.stage_layers add up to 7 layers but model.n_layer is 8");
  expect_config_error(kValid, {"model.n_layer=8", "parallel.pp=2", "parallel.stage_layers=even"},
                      "parallel.stage_layers (even): expected auto, a list of layer counts");
  expect_config_error(kValid,
                      {"model.n_layer=3", "parallel.pp=2", "parallel.vpp=2",
                       "parallel.schedule=zb-v", "parallel.stage_layers=auto"},
                      "parallel.stage_layers auto: model.n_layer (3) must be at least "
                      "parallel.pp * parallel.vpp (4), a layer per stage");
  // auto: any layer count of at least a layer per stage; it round-trips.
  const Config balanced =
      parse_config(kValid, {"model.n_layer=6", "parallel.pp=4", "parallel.stage_layers=auto"});
  EXPECT_TRUE(balanced.parallel.stage_layers_auto);
  EXPECT_TRUE(balanced.parallel.stage_layers.empty());
  const Config balanced_back = parse_config(to_yaml(balanced));
  EXPECT_TRUE(balanced_back.parallel.stage_layers_auto);
  EXPECT_FALSE(
      parse_config(kValid, {"model.n_layer=6", "parallel.pp=2", "parallel.stage_layers=[2, 4]"})
          .parallel.stage_layers_auto);
  expect_config_error(
      kValid, {"model.n_layer=8", "parallel.pp=2", "parallel.stage_layers=[8]"},
      "parallel.stage_layers has 1 entries, expected parallel.pp * parallel.vpp = 2");
  expect_config_error(kValid, {"model.n_layer=8", "parallel.pp=2", "parallel.stage_layers=[-1, 9]"},
                      "parallel.stage_layers[0] (-1) must be >= 0");
  expect_config_error(kValid,
                      {"model.n_layer=8", "parallel.pp=4", "parallel.stage_layers=[3, 0, 3, 2]"},
                      "parallel.stage_layers[1] (0) must be >= 1 (only the first and the last "
                      "stage may hold no layer)");
  // {first, last}: those stages' layers, the others an even share of the
  // rest; the saved config lists the split.
  const Config around = parse_config(
      kValid, {"model.n_layer=8", "parallel.pp=4", "parallel.stage_layers={first: 0, last: 2}"});
  EXPECT_EQ(around.parallel.stage_layers, (std::vector<int64_t>{0, 3, 3, 2}));
  EXPECT_EQ(parse_config(to_yaml(around)).parallel.stage_layers, around.parallel.stage_layers);
  EXPECT_EQ(
      parse_config(kValid, {"model.n_layer=8", "parallel.pp=2", "parallel.vpp=2",
                            "parallel.schedule=interleaved", "parallel.stage_layers={last: 2}"})
          .parallel.stage_layers,
      (std::vector<int64_t>{2, 2, 2, 2}));
  expect_config_error(kValid,
                      {"model.n_layer=8", "parallel.pp=4", "parallel.stage_layers={middle: 2}"},
                      "parallel.stage_layers.middle: unknown key (allowed: first, last");
  expect_config_error(kValid, {"model.n_layer=8", "parallel.pp=4", "parallel.stage_layers={}"},
                      "parallel.stage_layers: give first, last or both");
  expect_config_error(kValid,
                      {"model.n_layer=8", "parallel.pp=4", "parallel.stage_layers={first: -1}"},
                      "parallel.stage_layers.first (-1) must be >= 0");
  expect_config_error(kValid,
                      {"model.n_layer=8", "parallel.pp=4", "parallel.stage_layers={first: 1}"},
                      "the other 3 of the 4 stages must share the 7 layers left");
  // A stage of the embedding alone, or of the head alone.
  EXPECT_EQ(
      parse_config(kValid, {"model.n_layer=8", "parallel.pp=3", "parallel.stage_layers=[0, 4, 4]"})
          .parallel.stage_layers,
      (std::vector<int64_t>{0, 4, 4}));
  EXPECT_NO_THROW(
      parse_config(kValid, {"model.n_layer=8", "parallel.pp=2", "parallel.stage_layers=[8, 0]"}));
  expect_config_error(kValid, {"parallel.stage_layers=3"},
                      "parallel.stage_layers (3): expected auto, a list");
  EXPECT_EQ(
      parse_config(kValid, {"model.n_layer=7", "parallel.pp=2", "parallel.stage_layers=[3, 4]"})
          .parallel.stage_layers,
      (std::vector<int64_t>{3, 4}));
  expect_config_error(kValid, {"parallel.topology=ignore"},
                      "parallel.topology ('ignore') must be warn or refuse");
  expect_config_error(kValid, {"parallel.schedule=pipedream"},
                      "parallel.schedule ('pipedream') must be gpipe, 1f1b");
  expect_config_error(kValid, {"parallel.schedule=gpipe"},
                      "parallel.schedule ('gpipe') needs parallel.pp > 1");
  expect_config_error(kValid, {"parallel.dp=3"},
                      "train.global_batch_size (8) must be divisible by train.micro_batch_size * "
                      "parallel.dp (4 * 3 = 12)");
  expect_config_error(kValid, {"parallel.tp=3"},
                      "model.n_head (2) must be divisible by parallel.tp (3)");
  expect_config_error(kValid, {"parallel.sequence_parallel=true"},
                      "parallel.sequence_parallel needs parallel.tp > 1");
  expect_config_error(kValid, {"parallel.tp=2", "parallel.sequence_parallel=maybe"},
                      "parallel.sequence_parallel: expected true or false, got 'maybe'");
  expect_config_error(kValid, {"parallel.tp=0"}, "parallel.tp (0) must be >= 1");
  expect_config_error(kValid, {"parallel.timeout_s=0"},
                      "parallel.timeout_s (0) must be > 0 and at most a week");
  expect_config_error(kValid, {"parallel.timeout_s=1e9"}, "parallel.timeout_s (1e9) must be > 0");
  expect_config_error(kValid, {"parallel.validate_collectives=often"},
                      "parallel.validate_collectives: expected true or false, got 'often'");
  expect_config_error(kValid, {"parallel.overlap_param_gather=1x"},
                      "parallel.overlap_param_gather: expected true or false, got '1x'");
  expect_config_error(kValid, {"train.steps=abc"}, "train.steps: expected an integer, got 'abc'");
  expect_config_error(kValid, {"train.steps=2.5"}, "train.steps: expected an integer");
  expect_config_error(kValid, {"train.lr=[1]"}, "train.lr: expected a number");
  expect_config_error(
      kValid, {"train.micro_batch_size=3"},
      "train.global_batch_size (8) must be divisible by train.micro_batch_size (3)");
  expect_config_error(kValid, {"model.n_head=3"},
                      "model.d_model (16) must be divisible by model.n_head (3)");
  expect_config_error(kValid, {"train.min_lr=0.1"},
                      "train.min_lr (0.1) must not exceed train.lr (0.001)");
  expect_config_error(kValid, {"train.steps=0"}, "train.steps (0) must be positive");
  expect_config_error(kValid, {"train.beta2=1"}, "train.beta2 (1) must be in [0, 1)");
  expect_config_error(kValid, {"model.dropout=1.5"}, "model.dropout");
  expect_config_error(kValid, {"model.recompute=attention"},
                      "model.recompute ('attention') must be none, selective or full");
  expect_config_error(kValid, {"model.recompute_layers=2"},
                      "model.recompute_layers (2) goes with model.recompute: full (got none)");
  expect_config_error(kValid, {"model.recompute=full", "model.recompute_layers=-1"},
                      "model.recompute_layers (-1) must be at least 0 (0: every layer)");
  {
    const Config some = parse_config(kValid, {"model.recompute=full", "model.recompute_layers=2"});
    EXPECT_EQ(some.model.recompute_layers, 2);
    EXPECT_EQ(parse_config(to_yaml(some)).model.recompute_layers, 2);
    EXPECT_EQ(parse_config(kValid).model.recompute_layers, 0);
  }
  expect_config_error(kValid, {"device=tpu"}, "device ('tpu') must be cpu, cuda or cuda:N");
  expect_config_error(kValid, {"novalue"}, "expected key=value");
  expect_config_error(kValid, {"train.adam.beta1=0.9"}, "unknown key 'train.adam'");
  expect_config_error(kValid, {"device=cpu", "device.index=1"},
                      "--set 'device.index=1': 'device' is 'cpu', not a section of keys (set it "
                      "whole: --set 'device={...}')");
  expect_config_error(kValid, {"train.lr=[1"}, "--set 'train.lr=[1': not valid YAML");
  // train.no_weight_decay: patterns as train.freeze's, round-tripped; one
  // that matches no parameter is named.
  {
    const Config n = parse_config(to_yaml(
        parse_config(kValid, {"train.no_weight_decay=[wte.weight, \"h.*.attn.*.weight\"]"})));
    EXPECT_EQ(n.train.no_weight_decay,
              (std::vector<std::string>{"wte.weight", "h.*.attn.*.weight"}));
    EXPECT_EQ(
        n.no_decay_parameters(),
        (std::set<std::string>{"wte.weight", "h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight",
                               "h.1.attn.c_attn.weight", "h.1.attn.c_proj.weight"}));
    EXPECT_TRUE(parse_config(kValid).no_decay_parameters().empty());
  }
  expect_config_error(kValid, {"train.no_weight_decay=embed.weight"},
                      "train.no_weight_decay[0]: 'embed.weight' matches no parameter");
  expect_config_error(kValid, {"train.no_weight_decay={a: 1}"},
                      "train.no_weight_decay: expected a parameter pattern or a list of them");
  // train.spike_sigma and spike_window: off by default, round-tripped, and
  // bad values named.
  {
    EXPECT_EQ(parse_config(kValid).train.spike_sigma, 0.0);
    const Config s = parse_config(
        to_yaml(parse_config(kValid, {"train.spike_sigma=6", "train.spike_window=64"})));
    EXPECT_DOUBLE_EQ(s.train.spike_sigma, 6.0);
    EXPECT_EQ(s.train.spike_window, 64);
  }
  expect_config_error(kValid, {"train.spike_sigma=-1"},
                      "train.spike_sigma (-1) must be a number of standard deviations > 0, or 0");
  expect_config_error(kValid, {"train.spike_sigma=.nan"}, "train.spike_sigma");
  expect_config_error(kValid, {"train.spike_window=1"},
                      "train.spike_window (1) must be at least 2 steps");
  // An end-of-document token is a token of the vocabulary, whether or not
  // a setting that needs it is on.
  for (const char* eod : {"data.eod_token=256", "data.eod_token=-2"}) {
    expect_config_error(kValid, {eod}, "must be a token id in [0, 256) (model.vocab_size), or -1");
  }
  EXPECT_EQ(parse_config(kValid, {"data.eod_token=255"}).model.eod_token, 255);
  expect_config_error(kValid,
                      {"parallel.tp=2", "parallel.sequence_parallel=true", "model.seq_len=31"},
                      "model.seq_len (31) must be divisible by parallel.tp (2) with sequence "
                      "parallelism");
  expect_config_error(kValid, {"log.interval=0"}, "log.interval (0) must be positive");
  expect_config_error(kValid, {"log.peak_tflops=-1"}, "log.peak_tflops (-1) must be >= 0");
  expect_config_error(kValid, {"train.loss_average=sequences"},
                      "train.loss_average 'sequences' must be microbatches or tokens");
  EXPECT_EQ(
      parse_config(to_yaml(parse_config(kValid, {"train.loss_average=tokens"}))).train.loss_average,
      "tokens");
  // train.cuda_graph: on a GPU, and refused where a captured step would
  // freeze what changes between steps (or read the host mid-pass).
  EXPECT_TRUE(parse_config(to_yaml(parse_config(kValid, {"train.cuda_graph=true", "device=cuda"})))
                  .train.cuda_graph);
  EXPECT_FALSE(parse_config(kValid, {"device=cuda"}).train.cuda_graph);
  expect_config_error(kValid, {"train.cuda_graph=true"}, "train.cuda_graph: needs device: cuda");
  // (Dropout is captured: each replay reads its call count from the device.
  // So are the output z-loss, its rows' marks from the targets there, and
  // multi-token prediction, its ids and targets ahead made there.
  // Packed documents too, their layout formed on the device, and beside
  // multi-token prediction, whose targets stop at ends found there; and
  // that prediction under per-token averaging, its losses' gradient
  // weighed by the seed each replay refills.)
  for (const std::vector<std::string>& captured :
       std::vector<std::vector<std::string>>{{"model.dropout=0.1"},
                                             {"model.z_loss_coef=0.0001"},
                                             {"model.mtp_layers=1"},
                                             {"data.reset_attention_mask=true"},
                                             {"model.mtp_layers=1", "data.reset_position_ids=true"},
                                             {"model.mtp_layers=1", "train.loss_average=tokens"}}) {
    std::vector<std::string> overrides{"train.cuda_graph=true", "device=cuda", "data.eod_token=0"};
    overrides.insert(overrides.end(), captured.begin(), captured.end());
    EXPECT_TRUE(parse_config(kValid, overrides).train.cuda_graph);
  }
  // A dropless mixture is captured (routed and sized on the device; under
  // context parallelism its counts added over the group there too; its
  // experts' adapters too), but not with LoRA dropout on its experts (each
  // expert's masks its own, run on rows counted on the host); a capped one
  // only padded to its capacity.
  EXPECT_TRUE(parse_config(kValid, {"train.cuda_graph=true", "device=cuda", "model.moe.experts=4"})
                  .train.cuda_graph);
  EXPECT_TRUE(parse_config(kValid, {"train.cuda_graph=true", "device=cuda", "model.moe.experts=4",
                                    "model.lora.rank=2", "model.lora.targets=[attn.c_attn]"})
                  .train.cuda_graph);
  expect_config_error(kValid,
                      {"train.cuda_graph=true", "device=cuda", "model.moe.experts=4",
                       "model.moe.capacity_factor=1.25"},
                      "train.cuda_graph: a mixture of experts capped by model.moe.capacity_factor");
  EXPECT_TRUE(parse_config(kValid, {"train.cuda_graph=true", "device=cuda", "model.moe.experts=4",
                                    "parallel.cp=2"})
                  .train.cuda_graph);
  EXPECT_TRUE(parse_config(kValid, {"train.cuda_graph=true", "device=cuda", "model.moe.experts=4",
                                    "model.lora.rank=2", "model.lora.targets=[mlp.c_proj]"})
                  .train.cuda_graph);
  expect_config_error(
      kValid,
      {"train.cuda_graph=true", "device=cuda", "model.moe.experts=4", "model.lora.rank=2",
       "model.lora.dropout=0.1", "model.lora.targets=[mlp.c_proj]"},
      "LoRA dropout (model.lora.dropout 0.1) on its experts' adapters "
      "(model.lora.targets mlp.c_proj)");
  const std::vector<std::string> padded{"model.moe.experts=4", "model.moe.capacity_factor=1.25",
                                        "model.moe.pad_to_capacity=true"};
  std::vector<std::string> graphed = padded;
  graphed.insert(graphed.end(), {"train.cuda_graph=true", "device=cuda"});
  const Config moe = parse_config(to_yaml(parse_config(kValid, graphed)));
  EXPECT_TRUE(moe.train.cuda_graph);
  EXPECT_TRUE(moe.model.moe.pad_to_capacity);
  EXPECT_FALSE(parse_config(kValid, {"model.moe.experts=4"}).model.moe.pad_to_capacity);
  // Under context parallelism too (every rank routes the whole micro-batch),
  // with LoRA dropout on the experts' adapters as well.
  std::vector<std::string> context = padded;
  context.push_back("parallel.cp=2");
  EXPECT_TRUE(parse_config(kValid, context).model.moe.pad_to_capacity);
  context.insert(context.end(),
                 {"model.lora.rank=2", "model.lora.dropout=0.1", "model.lora.targets=[mlp.c_fc]"});
  EXPECT_TRUE(parse_config(kValid, context).model.moe.pad_to_capacity);
  EXPECT_TRUE(
      parse_config(to_yaml(parse_config(kValid, {"log.tensorboard=true"}))).log_tensorboard);
  EXPECT_FALSE(parse_config(kValid).log_param_norm);
  EXPECT_TRUE(parse_config(to_yaml(parse_config(kValid, {"log.param_norm=true"}))).log_param_norm);
  expect_config_error(kValid, {"log.param_norm=2"},
                      "log.param_norm: expected true or false, got '2'");
  {
    const Config skipping = parse_config(kValid, {"train.skip_steps=[2, 3-5]"});
    const std::vector<std::pair<int64_t, int64_t>> want{{2, 2}, {3, 5}};
    EXPECT_EQ(skipping.train.skip_steps, want);
    EXPECT_EQ(parse_config(to_yaml(skipping)).train.skip_steps, want);
    EXPECT_TRUE(skipping.train.skips_step(4));
    EXPECT_FALSE(skipping.train.skips_step(1));
    EXPECT_TRUE(parse_config(kValid).train.skip_steps.empty());
  }
  expect_config_error(kValid, {"train.skip_steps=[0]"},
                      "train.skip_steps[0] ('0') must be a step >= 1, or a range A-B of steps "
                      "with 1 <= A <= B");
  expect_config_error(kValid, {"train.skip_steps=[2, 7-5]"},
                      "train.skip_steps[1] ('7-5') must be a step >= 1");
  expect_config_error(kValid, {"train.skip_steps=[2-x]"},
                      "train.skip_steps[0]: expected a step or a range of steps \"A-B\", got "
                      "'2-x'");
  expect_config_error(kValid, {"train.skip_steps=4"}, "train.skip_steps: expected a list");
  expect_config_error(kValid, {"log.moe_per_layer=true"},
                      "log.moe_per_layer reports a mixture of experts' layers: set model.moe");
  EXPECT_EQ(parse_config(kValid).log_grad_norms, "none");
  EXPECT_FALSE(parse_config(kValid).norm_groups(parse_config(kValid).log_grad_norms));
  EXPECT_EQ(
      parse_config(to_yaml(parse_config(kValid, {"log.param_norms=parameters"}))).log_param_norms,
      "parameters");
  expect_config_error(kValid, {"log.param_norms=all"},
                      "log.param_norms ('all') must be none, layers or parameters");
  EXPECT_EQ(parse_config(to_yaml(parse_config(kValid, {"log.grad_norms=layers"}))).log_grad_norms,
            "layers");
  expect_config_error(kValid, {"log.grad_norms=blocks"},
                      "log.grad_norms ('blocks') must be none, layers or parameters");
  EXPECT_EQ(parse_config(to_yaml(parse_config(kValid, {"log.plan_cluster=clusters/h200.yaml"})))
                .log_plan_cluster,
            "clusters/h200.yaml");
  EXPECT_EQ(to_yaml(parse_config(kValid)).find("plan_cluster"), std::string::npos);
  expect_config_error(kValid, {"checkpoint.interval=-2"}, "checkpoint.interval (-2) must be >= 0");
  expect_config_error(kValid, {"checkpoint.keep=0"}, "checkpoint.keep (0) must be >= 1");
  expect_config_error(kValid, {"checkpoint.keep_every=-1"},
                      "checkpoint.keep_every (-1) must be >= 0");
  expect_config_error(kValid, {"train.exit_after_minutes=-1"},
                      "train.exit_after_minutes (-1) must be a number of minutes >= 0");
  expect_config_error(kValid, {"train.exit_after_minutes=30"},
                      "train.exit_after_minutes (30) needs checkpoint.dir");
  EXPECT_EQ(parse_config(to_yaml(parse_config(
                             kValid, {"checkpoint.dir=ck", "train.exit_after_minutes=230.5"})))
                .train.exit_after_minutes,
            230.5);
  expect_config_error(
      kValid, {"checkpoint.interval=300", "checkpoint.keep_every=1000"},
      "checkpoint.keep_every (1000) must be a multiple of checkpoint.interval (300)");
  EXPECT_EQ(
      parse_config(to_yaml(parse_config(kValid, {"checkpoint.dir=ck", "checkpoint.interval=10",
                                                 "checkpoint.keep_every=1000"})))
          .checkpoint.keep_every,
      1000);
  EXPECT_TRUE(
      parse_config(to_yaml(parse_config(kValid, {"checkpoint.dir=ck", "checkpoint.keep_best=true",
                                                 "checkpoint.interval=10", "data.val=data/v.bin",
                                                 "eval.interval=5"})))
          .checkpoint.keep_best);
  expect_config_error(kValid, {"checkpoint.dir=ck", "checkpoint.keep_best=true"},
                      "checkpoint.keep_best keeps the checkpoint of the lowest validation loss and "
                      "needs validation data: set data.val or data.val_split");
  expect_config_error(kValid,
                      {"checkpoint.dir=ck", "checkpoint.keep_best=true", "checkpoint.interval=10",
                       "data.val=data/v.bin", "eval.interval=4"},
                      "checkpoint.keep_best needs a validation loss at every checkpoint: "
                      "checkpoint.interval (10) must be a multiple of eval.interval (4)");
  {
    const Config stopping = parse_config(to_yaml(
        parse_config(kValid, {"data.val=data/v.bin", "eval.interval=5",
                              "eval.early_stop_patience=3", "eval.early_stop_delta=0.01"})));
    EXPECT_EQ(stopping.eval.early_stop_patience, 3);
    EXPECT_EQ(stopping.eval.early_stop_delta, 0.01);
  }
  EXPECT_TRUE(
      parse_config(to_yaml(parse_config(kValid, {"data.val=data/v.bin", "eval.at_start=true"})))
          .eval.at_start);
  expect_config_error(kValid, {"eval.at_start=true"},
                      "eval.at_start needs something to evaluate: set data.val");
  expect_config_error(kValid, {"eval.early_stop_patience=3"},
                      "eval.early_stop_patience (3) counts evaluations of the validation loss: "
                      "set data.val or data.val_split, and eval.interval");
  expect_config_error(kValid, {"data.val=data/v.bin", "eval.interval=5", "eval.early_stop_delta=1"},
                      "eval.early_stop_delta applies with eval.early_stop_patience > 0");
  expect_config_error(kValid,
                      {"data.val=data/v.bin", "eval.interval=5", "eval.early_stop_patience=3",
                       "eval.early_stop_delta=-1"},
                      "eval.early_stop_delta (-1) must be a loss difference >= 0");
  expect_config_error(kValid, {"checkpoint.keep_best=true"},
                      "checkpoint.keep_best needs checkpoint.dir");
  expect_config_error(kValid, {"checkpoint.keep=2000000"},
                      "checkpoint.keep (2000000) must be at most 1000000");
  EXPECT_EQ(parse_config(
                to_yaml(parse_config(kValid, {"checkpoint.dir=ck", "checkpoint.resume=step_40"})))
                .checkpoint.resume_path(),
            "ck/step_40");
  EXPECT_EQ(parse_config(to_yaml(parse_config(kValid, {"checkpoint.resume=runs/a/ck/step_40"})))
                .checkpoint.resume_path(),
            "runs/a/ck/step_40");
  EXPECT_TRUE(parse_config(kValid, {"checkpoint.resume=runs/a/ck/best"}).checkpoint.resumes());
  EXPECT_FALSE(parse_config(kValid, {"checkpoint.resume=auto"}).checkpoint.resumes());
  expect_config_error(kValid, {"checkpoint.resume=step_40"},
                      "checkpoint.resume 'step_40' names a checkpoint of checkpoint.dir, which is "
                      "not set");
  expect_config_error(kValid, {"checkpoint.resume=sometimes"},
                      "checkpoint.resume 'sometimes' names a checkpoint of checkpoint.dir");
  expect_config_error(kValid, {"checkpoint.resume=''"},
                      "checkpoint.resume is empty: never, auto, or the checkpoint to resume");
  expect_config_error(kValid, {"parallel.zero=2"}, "parallel.zero (2) must be 0 or 1");
  expect_config_error(kValid, {"parallel.bucket_mb=0"}, "parallel.bucket_mb (0) must be > 0");
  expect_config_error(kValid, {"parallel.tp=2000000"},
                      "parallel.tp (2000000) must be at most 1048576");
  expect_config_error(kValid, {"train.max_skipped_steps=-1"},
                      "train.max_skipped_steps (-1) must be >= 0");
  expect_config_error("model: {n_layer: 2}\n", {}, "missing required key 'model.n_head'");
  expect_config_error("train: {steps: 1}\n", {}, "missing required section 'model'");
  expect_config_error("model: [1, 2", {}, "not valid YAML");
  EXPECT_THROW(load_config("/nonexistent.yaml"), ConfigError);
}

}  // namespace
}  // namespace triad::train

namespace triad::train {
namespace {

TEST(Config, EveryShippedConfigIsValid) {
  int checked = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(TRIAD_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    EXPECT_NO_THROW(load_config(entry.path().string())) << entry.path();
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

// The keys an unknown key's error lists as allowed, for the YAML `yaml`
// holding one.
std::vector<std::string> allowed_keys(const std::string& yaml) {
  try {
    parse_config(yaml);
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    const size_t at = what.find("(allowed");
    const size_t colon = what.find(": ", at), end = what.find(')', at);
    if (at == std::string::npos || colon == std::string::npos || end == std::string::npos ||
        colon > end) {
      ADD_FAILURE() << "no list of allowed keys in: " << what;
      return {};
    }
    std::vector<std::string> keys;
    std::string list = what.substr(colon + 2, end - colon - 2);
    for (size_t from = 0; from <= list.size();) {
      const size_t comma = std::min(list.find(", ", from), list.size());
      keys.push_back(list.substr(from, comma - from));
      from = comma + 2;
    }
    return keys;
  }
  ADD_FAILURE() << "an unknown key was taken:\n" << yaml;
  return {};
}

// Every key the parser takes is documented in docs/config.md: each
// top-level section has its heading, and each key of a section (and of
// model.moe, model.lora and model.mla) is named in it (`key`, or `key:
// value`), so that a key added to the parser without its line in the docs
// fails here.
TEST(Config, EveryKeyTheParserTakesIsInTheDocs) {
  std::ifstream in(std::string(TRIAD_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md";
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Each section's text: from its "## `name`" heading to the next "## ".
  auto section = [&](const std::string& name) {
    const size_t at = doc.find("\n## `" + name + "`");
    if (at == std::string::npos) return std::string();
    return doc.substr(at, doc.find("\n## ", at + 1) - at);
  };
  // A key is named as `key`, or as a value given it (`key: true`).
  auto names = [](const std::string& text, const std::string& key) {
    return text.find("`" + key + "`") != std::string::npos ||
           text.find("`" + key + ": ") != std::string::npos;
  };
  // The smallest valid config with `model`, `train` and `data` extended and
  // `more` sections after them.
  struct Case {
    std::string where, model, train, data, more;
    std::string yaml() const {
      return "model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 256, seq_len: 32" + model +
             "}\ntrain: {steps: 5, global_batch_size: 8, micro_batch_size: 4, lr: 1.0e-3" + train +
             "}\ndata: {train: data/x.bin" + data + "}\n" + more;
    }
  };
  const std::vector<std::string> top = allowed_keys(Case{"", "", "", "", "zz_unknown: 1\n"}.yaml());
  EXPECT_GE(top.size(), 9u);
  for (const std::string& key : top)
    EXPECT_NE(section(key), "") << "no section for '" << key << "'";
  std::vector<Case> cases = {{"model", ", zz_unknown: 1", "", "", ""},
                             {"model.moe", ", moe: {experts: 4, zz_unknown: 1}", "", "", ""},
                             {"model.lora", ", lora: {rank: 2, zz_unknown: 1}", "", "", ""},
                             {"model.mla", ", mla: {kv_lora_rank: 8, zz_unknown: 1}", "", "", ""},
                             {"train", "", ", zz_unknown: 1", "", ""},
                             {"data", "", "", ", zz_unknown: 1", ""}};
  for (const std::string where : {"eval", "init", "output", "log", "parallel", "checkpoint"})
    cases.push_back({where, "", "", "", where + ": {zz_unknown: 1}\n"});
  int documented = 0;
  for (const Case& c : cases) {
    const std::string text = section(c.where.substr(0, c.where.find('.')));
    const std::vector<std::string> keys = allowed_keys(c.yaml());
    EXPECT_FALSE(keys.empty()) << c.where;
    for (const std::string& key : keys) {
      EXPECT_TRUE(names(text, key)) << "'" << c.where << "." << key
                                    << "' is not in docs/config.md's " << c.where << " section";
      ++documented;
    }
  }
  EXPECT_GT(documented, 150);
}

}  // namespace
}  // namespace triad::train

namespace triad::train {
namespace {

TEST(Config, AttentionKernelParsesRoundTripsAndNamesABadValue) {
  EXPECT_EQ(parse_config(kValid).attention_kernel, "auto");
  const Config c = parse_config(kValid, {"model.attention_kernel=tensor_core"});
  EXPECT_EQ(c.attention_kernel, "tensor_core");
  EXPECT_EQ(parse_config(to_yaml(c)).attention_kernel, "tensor_core");
  EXPECT_EQ(parse_config(kValid, {"model.attention_kernel=cudnn"}).attention_kernel, "cudnn");
  EXPECT_TRUE(parse_config(kValid).attention_deterministic);
  const Config fast = parse_config(kValid, {"model.attention_deterministic=false"});
  EXPECT_FALSE(fast.attention_deterministic);
  EXPECT_FALSE(parse_config(to_yaml(fast)).attention_deterministic);
  expect_config_error(kValid, {"model.attention_deterministic=sometimes"},
                      "model.attention_deterministic: expected true or false, got 'sometimes'");
  expect_config_error(
      kValid, {"model.attention_kernel=flash3"},
      "model.attention_kernel 'flash3' must be one of auto, simt, tensor_core, cudnn");
}

TEST(Config, BatchSizeRampParsesRoundTripsAndChecksEverySize) {
  EXPECT_TRUE(parse_config(kValid).train.rampup_batch_size.empty());
  const Config c = parse_config(kValid, {"train.rampup_batch_size=[4, 4, 100]"});
  EXPECT_EQ(c.train.rampup_batch_size, (std::vector<int64_t>{4, 4, 100}));
  EXPECT_EQ(c.train.batch_ramp().sizes(), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(parse_config(to_yaml(c)).train.rampup_batch_size, c.train.rampup_batch_size);
  expect_config_error(kValid, {"train.rampup_batch_size=[4, 4]"},
                      "train.rampup_batch_size: expected [start, increment, samples]");
  expect_config_error(kValid, {"train.rampup_batch_size=[2, 4, 100]"},
                      "(8 - 2) must be a multiple of the increment");
  expect_config_error(kValid, {"train.rampup_batch_size=[2, 2, 100]"},
                      "the ramped global batch 2 (train.rampup_batch_size) must be divisible by "
                      "train.micro_batch_size (4)");
  // Each size against the data-parallel split too (known with the world).
  const Config dp =
      parse_config(kValid, {"train.rampup_batch_size=[4, 4, 100]", "train.micro_batch_size=2"});
  EXPECT_NO_THROW(check_batch(dp, 2));
  try {
    check_batch(
        parse_config(kValid, {"train.rampup_batch_size=[2, 2, 100]", "train.micro_batch_size=2"}),
        2);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the ramped global batch 2"), std::string::npos)
        << e.what();
  }
}

TEST(Config, AsyncCheckpointsParseAndRoundTrip) {
  EXPECT_FALSE(parse_config(kValid).checkpoint.async);
  const Config c = parse_config(kValid, {"checkpoint.dir=ck", "checkpoint.async=true"});
  EXPECT_TRUE(c.checkpoint.async);
  EXPECT_TRUE(parse_config(to_yaml(c)).checkpoint.async);
  expect_config_error(kValid, {"checkpoint.async=later"},
                      "checkpoint.async: expected true or false, got 'later'");
}

TEST(Config, QkvBiasParsesAndRoundTrips) {
  EXPECT_FALSE(parse_config(kValid).model.qkv_bias);
  const Config c = parse_config(kValid, {"model.linear_bias=false", "model.qkv_bias=true"});
  EXPECT_TRUE(c.model.qkv_bias);
  EXPECT_TRUE(c.model.c_attn_bias());
  EXPECT_TRUE(parse_config(to_yaml(c)).model.qkv_bias);
  expect_config_error(kValid, {"model.qkv_bias=some"},
                      "model.qkv_bias: expected true or false, got 'some'");
}

TEST(Config, HeadDimAndQkNormParseAndRoundTrip) {
  const Config plain = parse_config(kValid);
  EXPECT_FALSE(plain.model.qk_norm);
  EXPECT_EQ(plain.model.head_size, 0);
  EXPECT_FALSE(plain.model.heads_apart());
  EXPECT_EQ(to_yaml(plain).find("head_dim"), std::string::npos);  // written only when set
  const Config c = parse_config(kValid, {"model.qk_norm=true", "model.head_dim=12"});
  EXPECT_TRUE(c.model.qk_norm);
  EXPECT_EQ(c.model.head_dim(), 12);
  EXPECT_EQ(c.model.q_width(), 12 * c.model.n_head);
  const Config back = parse_config(to_yaml(c));
  EXPECT_TRUE(back.model.qk_norm);
  EXPECT_EQ(back.model.head_size, 12);
  expect_config_error(
      kValid, {"model.qk_norm=maybe"},
      "model.qk_norm: expected true (or head), full, head_layernorm or false, got 'maybe'");
  // Command R+'s: a LayerNorm on each head, each head's weights its own.
  const Config heads = parse_config(kValid, {"model.qk_norm=head_layernorm"});
  EXPECT_TRUE(heads.model.qk_norm && heads.model.qk_head_layernorm);
  EXPECT_FALSE(heads.model.qk_norm_full);
  EXPECT_EQ(heads.model.q_norm_width(), heads.model.q_width());
  const Config heads_back = parse_config(to_yaml(heads));
  EXPECT_TRUE(heads_back.model.qk_head_layernorm && heads_back.model.qk_norm);
  expect_config_error(kValid, {"model.qk_norm=head_layernorm", "model.norm_weight_offset=true"},
                      "head_layernorm scales each head by its weights, not by 1 + weight");
  // OLMo 2's: the norms over all the heads together, and no pre-norms.
  const Config olmo =
      parse_config(kValid, {"model.qk_norm=full", "model.pre_norms=false", "model.post_norms=true",
                            "model.position_embedding=rope", "model.normalization=rmsnorm"});
  EXPECT_TRUE(olmo.model.qk_norm && olmo.model.qk_norm_full);
  EXPECT_FALSE(olmo.model.pre_norms);
  const Config olmo_back = parse_config(to_yaml(olmo));
  EXPECT_TRUE(olmo_back.model.qk_norm_full);
  EXPECT_FALSE(olmo_back.model.pre_norms);
  EXPECT_TRUE(olmo_back.model.post_norms);
  EXPECT_EQ(to_yaml(plain).find("pre_norms"), std::string::npos);  // written only when off
  EXPECT_TRUE(parse_config(kValid, {"model.qk_norm=head"}).model.qk_norm);
  EXPECT_FALSE(parse_config(kValid, {"model.qk_norm=head"}).model.qk_norm_full);
  expect_config_error(kValid, {"model.pre_norms=false"},
                      "model.pre_norms: false (OLMo 2's blocks) needs model.post_norms: true");
  expect_config_error(kValid, {"model.head_dim=-3"}, "model.head_dim (-3) must be positive");
}

TEST(Config, NopeLayersParseRoundTripAndAreChecked) {
  const Config c = parse_config(kValid, {"model.position_embedding=rope", "model.nope_layers=[1]"});
  EXPECT_EQ(c.model.nope_layers, (std::vector<int64_t>{1}));
  EXPECT_EQ(parse_config(to_yaml(c)).model.nope_layers, c.model.nope_layers);
  EXPECT_EQ(to_yaml(parse_config(kValid)).find("nope_layers"), std::string::npos);
  expect_config_error(kValid, {"model.position_embedding=rope", "model.nope_layers=1"},
                      "model.nope_layers: expected a list of layer indices");
  expect_config_error(kValid, {"model.nope_layers=[0]"},
                      "model.nope_layers leaves layers without rope, but "
                      "model.position_embedding is learned");
  expect_config_error(kValid, {"model.position_embedding=rope", "model.nope_layers=[2]"},
                      "model.nope_layers: 2 at position 0");
}

TEST(Config, FullAttentionLayersParseRoundTripAndAreChecked) {
  const Config c =
      parse_config(kValid, {"model.sliding_window=8", "model.full_attention_layers=[0, 1]"});
  EXPECT_EQ(c.model.full_attention_layers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(parse_config(to_yaml(c)).model.full_attention_layers, c.model.full_attention_layers);
  EXPECT_EQ(to_yaml(parse_config(kValid)).find("full_attention_layers"), std::string::npos);
  expect_config_error(kValid, {"model.sliding_window=8", "model.full_attention_layers=3"},
                      "model.full_attention_layers: expected a list of layer indices");
  expect_config_error(kValid, {"model.full_attention_layers=[0]"},
                      "model.full_attention_layers exempts layers from a window");
}

TEST(Config, ZeroBubbleAutoParsesRoundTripsAndNamesBadValues) {
  const Config c = parse_config(
      kValid, {"parallel.pp=2", "parallel.schedule=zb-auto", "parallel.zb_max_in_flight=3"});
  EXPECT_EQ(c.parallel.schedule, "zb-auto");
  EXPECT_EQ(c.parallel.zb_max_in_flight, 3);
  EXPECT_EQ(parse_config(to_yaml(c)).parallel.zb_max_in_flight, 3);
  EXPECT_EQ(parse_config(kValid, {"parallel.pp=2", "parallel.schedule=zb-auto"})
                .parallel.zb_max_in_flight,
            0);
  expect_config_error(kValid, {"parallel.pp=2", "parallel.schedule=zb-h2"},
                      "parallel.schedule ('zb-h2') must be gpipe, 1f1b, interleaved, zb-h1, "
                      "zb-auto or zb-v");
  expect_config_error(
      kValid, {"parallel.pp=2", "parallel.schedule=zb-auto", "parallel.zb_max_in_flight=-1"},
      "parallel.zb_max_in_flight (-1) must be >= 1, or 0 for parallel.pp");
  expect_config_error(kValid,
                      {"parallel.pp=2", "parallel.schedule=zb-h1", "parallel.zb_max_in_flight=3"},
                      "parallel.zb_max_in_flight (3) goes with parallel.schedule 'zb-auto' or "
                      "'zb-v' (got 'zb-h1')");
  // ZB-V's two chunks per rank need no vpp; a vpp given is checked.
  EXPECT_EQ(parse_config(kValid, {"model.n_layer=4", "parallel.pp=2", "parallel.schedule=zb-v"})
                .parallel.vpp,
            2);
  expect_config_error(
      kValid, {"model.n_layer=4", "parallel.pp=2", "parallel.vpp=1", "parallel.schedule=zb-v"},
      "parallel.schedule 'zb-v' places two chunks on every rank in a V: "
      "parallel.vpp must be 2 (got 1)");
  expect_config_error(
      kValid, {"model.n_layer=6", "parallel.pp=2", "parallel.vpp=2", "parallel.schedule=zb-v"},
      "model.n_layer (6) must be divisible by parallel.pp * parallel.vpp (2 * 2 = 4)");
  // A valid ZB-V layout, its in-flight budget included, round-trips.
  const Config zbv =
      parse_config(kValid, {"model.n_layer=4", "parallel.pp=2", "parallel.vpp=2",
                            "parallel.schedule=zb-v", "parallel.zb_max_in_flight=3"});
  EXPECT_EQ(zbv.parallel.schedule, "zb-v");
  EXPECT_EQ(zbv.parallel.zb_max_in_flight, 3);
  const Config back = parse_config(to_yaml(zbv));
  EXPECT_EQ(back.parallel.schedule, "zb-v");
  EXPECT_EQ(back.parallel.vpp, 2);
  EXPECT_EQ(back.parallel.zb_max_in_flight, 3);
  expect_config_error(kValid, {"parallel.schedule=zb-auto"},
                      "parallel.schedule ('zb-auto') needs parallel.pp > 1");
}

// --set reaches keys at any depth: a key inside a map that is there is set
// beside its siblings, a missing map on the way is made, and something
// that is not a map, or an empty part, is refused by name.
TEST(Config, SetReachesKeysAtAnyDepth) {
  const std::string with_moe =
      "model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 256, seq_len: 32, "
      "moe: {experts: 4, top_k: 2, ffn_hidden_size: 24}}\n"
      "train: {steps: 5, global_batch_size: 8, micro_batch_size: 4}\n"
      "data: {train: data/x.bin}\n";
  const Config c = parse_config(with_moe, {"model.moe.top_k=1", "model.moe.aux_loss_coef=0.02"});
  EXPECT_EQ(c.model.moe.experts, 4);  // its siblings kept
  EXPECT_EQ(c.model.moe.top_k, 1);
  EXPECT_EQ(c.model.moe.ffn_hidden_size, 24);
  EXPECT_DOUBLE_EQ(c.model.moe.aux_loss_coef, 0.02);
  // A map made on the way: LoRA from nothing.
  const Config l = parse_config(kValid, {"model.lora.rank=4", "model.lora.alpha=8"});
  EXPECT_EQ(l.model.lora.rank, 4);
  EXPECT_DOUBLE_EQ(l.model.lora.alpha, 8.0);
  // And a section made whole from nothing, as two parts always could.
  EXPECT_EQ(parse_config(kValid, {"checkpoint.dir=ckpt"}).checkpoint.dir, "ckpt");
  // A misspelt key deep down is the parser's unknown key, named in full.
  expect_config_error(with_moe, {"model.moe.topk=1"}, "unknown key 'model.moe.topk'");
  // Into something that is not a map.
  expect_config_error(kValid, {"model.moe=none", "model.moe.top_k=2"},
                      "--set 'model.moe.top_k=2': 'model.moe' is 'none', not a section of keys "
                      "(set it whole: --set 'model.moe={...}')");
  expect_config_error(kValid,
                      {"model.full_attention_layers=[0]", "model.full_attention_layers.x=1"},
                      "'model.full_attention_layers' is a list, not a section of keys");
  for (const char* bad : {"model..n_layer=2", ".model=1", "model.=1"}) {
    expect_config_error(kValid, {bad}, "the key has an empty part");
  }
}

// cuDNN's fused attention takes each sequence's queries with their keys and
// values: under context parallelism only the heads' all-to-all gives it
// that; the keys' all-gather, the ring and the two hierarchical are refused
// by name before anything starts (they once failed at the first step), auto
// where it would choose the all-gather too.
TEST(Config, CudnnAttentionTakesTheHeadsAllToAllAloneUnderContextParallelism) {
  for (const char* exchange : {"all_to_all", "auto"}) {
    const Config c = parse_config(kValid, {"parallel.cp=2", "model.attention_kernel=cudnn",
                                           std::string("parallel.cp_comm=") + exchange});
    EXPECT_EQ(c.attention_kernel, "cudnn");
  }
  for (const char* exchange : {"all_gather", "ring"}) {
    expect_config_error(
        kValid,
        {"parallel.cp=2", "model.attention_kernel=cudnn",
         std::string("parallel.cp_comm=") + exchange},
        std::string("model.attention_kernel 'cudnn' cannot take parallel.cp_comm ") + exchange +
            ": cuDNN's fused attention takes each sequence's queries");
  }
  expect_config_error(
      kValid,
      {"parallel.cp=4", "parallel.cp_comm=all_to_all+ring", "parallel.cp_a2a=2", "model.n_head=4",
       "model.attention_kernel=cudnn"},
      "model.attention_kernel 'cudnn' cannot take parallel.cp_comm all_to_all+ring");
  // (Two heads do not share out over 4 ranks: auto takes the all-gather.)
  expect_config_error(kValid, {"parallel.cp=4", "model.attention_kernel=cudnn"},
                      "model.attention_kernel 'cudnn' cannot take parallel.cp_comm all_gather "
                      "(auto's choice for these heads)");
  // Without context parallelism, or with another kernel, nothing changes.
  EXPECT_EQ(parse_config(kValid, {"parallel.cp_comm=ring", "model.attention_kernel=cudnn"})
                .attention_kernel,
            "cudnn");
  EXPECT_EQ(parse_config(kValid, {"parallel.cp=2", "parallel.cp_comm=ring",
                                  "model.attention_kernel=tensor_core"})
                .attention_kernel,
            "tensor_core");
}

// On a GPU, an attention kernel named that can never run the model is
// refused before training starts (it once failed at the first step):
// tensor cores and cuDNN take half precision, head dims of a multiple of 16
// and of 8 (at most 256). On the CPU the key changes nothing and is kept.
TEST(Config, AnAttentionKernelByNameFitsThePrecisionAndHeadDimOnTheGpu) {
  for (const char* kernel : {"tensor_core", "cudnn"}) {
    SCOPED_TRACE(kernel);
    const std::string named = std::string("model.attention_kernel=") + kernel;
    expect_config_error(kValid, {"device=cuda", named},
                        std::string("model.attention_kernel '") + kernel +
                            "' takes bf16 or fp16 activations, and train.precision is fp32");
    EXPECT_EQ(parse_config(kValid, {named}).attention_kernel, kernel);  // (cpu)
    // (d_model 32 over 2 heads: 16 wide, which both take; kValid's 16 make 8.)
    const Config half =
        parse_config(kValid, {"device=cuda", "train.precision=bf16", named, "model.d_model=32"});
    EXPECT_EQ(half.attention_kernel, kernel);
  }
  expect_config_error(kValid,
                      {"device=cuda", "train.precision=bf16", "model.attention_kernel=tensor_core"},
                      "model.attention_kernel 'tensor_core' needs a head dim that is a multiple of "
                      "16 up to 256 (as far as the device's shared memory takes it: 256 on "
                      "sm_90, 128 on sm_80, 64 on sm_86 and sm_89), not 8");
  // Every kernel takes Gemma's 256 (tensor cores where the device's shared
  // memory allows, which the attention checks); nothing on the GPU takes
  // 320, under any choice (the CPU does).
  for (const char* kernel : {"auto", "simt", "tensor_core", "cudnn"}) {
    EXPECT_EQ(parse_config(kValid,
                           {"device=cuda", "train.precision=bf16",
                            std::string("model.attention_kernel=") + kernel, "model.head_dim=256"})
                  .model.head_dim(),
              256);
    expect_config_error(kValid,
                        {"device=cuda", "train.precision=bf16",
                         std::string("model.attention_kernel=") + kernel, "model.head_dim=320"},
                        "model head dim 320 on device 'cuda': the GPU's attention kernels take "
                        "head dims up to 256");
  }
  EXPECT_EQ(parse_config(kValid, {"model.head_dim=320"}).model.head_dim(), 320);
  EXPECT_EQ(
      parse_config(kValid, {"device=cuda", "train.precision=fp16", "model.attention_kernel=cudnn"})
          .attention_kernel,
      "cudnn");
  expect_config_error(
      kValid,
      {"device=cuda", "train.precision=bf16", "model.attention_kernel=cudnn", "model.head_dim=12"},
      "model.attention_kernel 'cudnn' needs a head dim that is a multiple of 8 up "
      "to 256, not 12");
  EXPECT_EQ(parse_config(kValid, {"device=cuda", "model.attention_kernel=simt"}).attention_kernel,
            "simt");
}

TEST(Config, PackedDocumentSettingsParseRoundTripAndNeedAnEndToken) {
  const Config plain = parse_config(kValid);
  EXPECT_EQ(plain.model.eod_token, -1);
  EXPECT_FALSE(plain.model.reset_attention_mask || plain.model.reset_position_ids ||
               plain.data_eod_mask_loss);
  const Config c =
      parse_config(kValid, {"data.eod_token=10", "data.reset_attention_mask=true",
                            "data.reset_position_ids=true", "data.eod_mask_loss=true"});
  EXPECT_EQ(c.model.eod_token, 10);
  EXPECT_TRUE(c.model.reset_attention_mask && c.model.reset_position_ids && c.data_eod_mask_loss);
  const Config back = parse_config(to_yaml(c));
  EXPECT_EQ(back.model.eod_token, 10);
  EXPECT_TRUE(back.model.reset_attention_mask && back.model.reset_position_ids &&
              back.data_eod_mask_loss);
  expect_config_error(kValid, {"data.reset_attention_mask=true"},
                      "data.eod_token (-1) must be a token id in [0, 256)");
  expect_config_error(kValid, {"data.reset_position_ids=true", "data.eod_token=256"},
                      "data.eod_token (256) must be a token id in [0, 256)");
  expect_config_error(
      kValid,
      {"data.eod_token=1", "data.reset_attention_mask=true", "model.attention_kernel=cudnn"},
      "model.attention_kernel 'cudnn' cannot take data.reset_attention_mask");
  expect_config_error(kValid, {"data.eod_mask_loss=true"},
                      "data.eod_token (-1) must be a token id in [0, 256) when data.eod_mask_loss");
  // data.packing: documents pads with the end token.
  EXPECT_EQ(plain.data_packing, "stream");
  const Config rows = parse_config(kValid, {"data.eod_token=0", "data.packing=documents"});
  EXPECT_EQ(rows.data_packing, "documents");
  EXPECT_EQ(parse_config(to_yaml(rows)).data_packing, "documents");
  expect_config_error(kValid, {"data.packing=documents"},
                      "data.eod_token (-1) must be a token id in [0, 256) when data.packing is "
                      "documents");
  EXPECT_EQ(rows.data_long_documents, "split");
  const Config drop = parse_config(to_yaml(parse_config(
      kValid, {"data.eod_token=0", "data.packing=documents", "data.long_documents=drop"})));
  EXPECT_EQ(drop.data_long_documents, "drop");
  expect_config_error(kValid,
                      {"data.eod_token=0", "data.packing=documents", "data.long_documents=cut"},
                      "data.long_documents 'cut' must be split (rows of its own), truncate");
  expect_config_error(kValid, {"data.long_documents=truncate"},
                      "data.long_documents 'truncate' applies to data.packing: documents or "
                      "best_fit");
  expect_config_error(kValid, {"data.packing=rows"},
                      "data.packing 'rows' must be stream (sequences cut from the token stream), "
                      "documents");
  const Config fit = parse_config(to_yaml(parse_config(
      kValid, {"data.eod_token=0", "data.packing=best_fit", "data.long_documents=truncate"})));
  EXPECT_EQ(fit.data_packing, "best_fit");
  EXPECT_EQ(fit.data_long_documents, "truncate");
  expect_config_error(kValid, {"data.packing=best_fit"},
                      "data.eod_token (-1) must be a token id in [0, 256) when data.packing is "
                      "best_fit");
}

TEST(Config, PositionEmbeddingParsesRoundTripsAndNamesABadValue) {
  const Config plain = parse_config(kValid);
  EXPECT_FALSE(plain.model.rotary());
  EXPECT_EQ(plain.model.rope_theta, 10000.0);
  const Config c =
      parse_config(kValid, {"model.position_embedding=rope", "model.rope_theta=500000"});
  EXPECT_TRUE(c.model.rotary());
  EXPECT_EQ(c.model.rope_theta, 500000.0);
  const Config back = parse_config(to_yaml(c));
  EXPECT_TRUE(back.model.rotary());
  EXPECT_EQ(back.model.rope_theta, 500000.0);
  expect_config_error(kValid, {"model.position_embedding=alibi"},
                      "model.position_embedding ('alibi') must be learned or rope");
  expect_config_error(kValid, {"model.position_embedding=rope", "model.rope_theta=-1"},
                      "model.rope_theta (-1.000000) must be a positive number");
  expect_config_error(kValid, {"model.position_embedding=rope", "model.n_head=16"},
                      "model.position_embedding rope needs an even head dimension");
}

TEST(Config, KeyValueHeadsParseRoundTripAndAreChecked) {
  EXPECT_EQ(parse_config(kValid).model.kv_heads(), 2);  // one per query head
  const Config c = parse_config(kValid, {"model.n_head=4", "model.n_kv_head=2"});
  EXPECT_EQ(c.model.n_kv_head, 2);
  EXPECT_EQ(c.model.qkv_width(), 16 + 2 * 2 * 4);
  EXPECT_EQ(parse_config(to_yaml(c)).model.n_kv_head, 2);
  expect_config_error(kValid, {"model.n_head=4", "model.n_kv_head=3"},
                      "model.n_kv_head (3) must divide model.n_head (4)");
  // Fewer key/value heads than ranks are shared (multi-query over tp 2);
  // three over two ranks neither split nor share.
  EXPECT_EQ(parse_config(kValid, {"model.n_head=4", "model.n_kv_head=1", "parallel.tp=2"})
                .model.kv_heads_per_rank(2),
            1);
  expect_config_error(kValid,
                      {"model.n_head=6", "model.n_kv_head=3", "parallel.tp=2", "model.d_model=24"},
                      "model.n_kv_head (3) must be divisible by parallel.tp (2), or divide it");
  // cuDNN's graph takes grouped-query attention too.
  EXPECT_EQ(
      parse_config(kValid, {"model.n_head=4", "model.n_kv_head=2", "model.attention_kernel=cudnn"})
          .attention_kernel,
      "cudnn");
  expect_config_error(kValid, {"model.n_kv_head=two"}, "model.n_kv_head");
}

TEST(Config, RopeScalingParsesRoundTripsAndIsChecked) {
  EXPECT_FALSE(parse_config(kValid).model.rope_scaling.scaled());
  const Config c = parse_config(
      std::string(kValid) + "",
      {"model.position_embedding=rope",
       "model.rope_scaling={type: llama3, factor: 4, original_max_position_embeddings: 16}"});
  EXPECT_TRUE(c.model.rope_scaling.scaled());
  EXPECT_EQ(c.model.rope_scaling.factor, 4.0);
  EXPECT_EQ(c.model.rope_scaling.high_freq_factor, 4.0);  // LLaMA 3.1's default
  EXPECT_EQ(c.model.rope_scaling.original_seq_len, 16.0);
  const Config back = parse_config(to_yaml(c));
  EXPECT_TRUE(back.model.rope_scaling.scaled());
  EXPECT_EQ(back.model.rope_scaling.original_seq_len, 16.0);
  EXPECT_FALSE(parse_config(kValid, {"model.rope_scaling=none"}).model.rope_scaling.scaled());
  expect_config_error(kValid, {"model.rope_scaling={type: dynamic}"},
                      "model.rope_scaling.type ('dynamic') must be llama3, linear, yarn, longrope "
                      "or none");
  expect_config_error(kValid, {"model.rope_scaling={type: llama3, alpha: 2}"},
                      "unknown key 'model.rope_scaling.alpha' (allowed with type llama3: type, "
                      "factor, low_freq_factor");
  expect_config_error(kValid, {"model.rope_scaling={type: llama3, factor: 0.5}"},
                      "model.rope_scaling: llama3 scaling needs factor >= 1");
  // Linear and yarn: their keys, the factor (and yarn's original context)
  // required, every value round-tripping.
  const Config lin = parse_config(
      kValid, {"model.position_embedding=rope", "model.rope_scaling={type: linear, factor: 2.5}"});
  EXPECT_EQ(lin.model.rope_scaling.kind, RopeScaling::Kind::Linear);
  EXPECT_EQ(parse_config(to_yaml(lin)).model.rope_scaling.factor, 2.5);
  const Config yarn = parse_config(
      kValid, {"model.position_embedding=rope",
               "model.rope_scaling={type: yarn, factor: 4, original_max_position_embeddings: 32, "
               "beta_fast: 16, attention_factor: 1.25}"});
  const RopeScaling y = parse_config(to_yaml(yarn)).model.rope_scaling;
  EXPECT_EQ(y.kind, RopeScaling::Kind::Yarn);
  EXPECT_EQ(y.factor, 4.0);
  EXPECT_EQ(y.original_seq_len, 32.0);
  EXPECT_EQ(y.beta_fast, 16.0);
  EXPECT_EQ(y.beta_slow, 1.0);
  EXPECT_EQ(y.attention_factor, 1.25);
  expect_config_error(kValid, {"model.rope_scaling={type: linear}"},
                      "model.rope_scaling.factor is required with type linear");
  expect_config_error(kValid, {"model.rope_scaling={type: yarn, factor: 4}"},
                      "model.rope_scaling.original_max_position_embeddings is required with type "
                      "yarn");
  expect_config_error(kValid, {"model.rope_scaling={type: linear, factor: 2, beta_fast: 3}"},
                      "unknown key 'model.rope_scaling.beta_fast' (allowed with type linear: "
                      "type, factor)");
  expect_config_error(kValid,
                      {"model.rope_scaling={type: yarn, factor: 4, "
                       "original_max_position_embeddings: 32, beta_fast: 1, beta_slow: 2}"},
                      "model.rope_scaling: yarn scaling needs original_max_position_embeddings > "
                      "0 (got 32.000000), beta_fast (1.000000) > beta_slow (2.000000)");
  // longrope: a factor per pair of the head (4 here), both lists, round-
  // tripping exactly; the lists' length and values checked.
  const std::string longrope =
      "model.rope_scaling={type: longrope, factor: 32, original_max_position_embeddings: 16, "
      "short_factor: [1, 1.25, 1.5, 2.125], long_factor: [1.0000001, 3, 7.5, 40]}";
  const Config lr = parse_config(kValid, {"model.position_embedding=rope", longrope});
  const RopeScaling l = parse_config(to_yaml(lr)).model.rope_scaling;
  EXPECT_EQ(l.kind, RopeScaling::Kind::LongRope);
  EXPECT_EQ(l.factor, 32.0);
  EXPECT_EQ(l.original_seq_len, 16.0);
  EXPECT_EQ(l.attention_factor, 0.0);
  EXPECT_EQ(rope_factors(l, false), (std::vector<double>{1, 1.25, 1.5, 2.125}));
  EXPECT_EQ(rope_factors(l, true), rope_factors(lr.model.rope_scaling, true));
  EXPECT_EQ(l.long_factor[0], 1.0000001f);
  expect_config_error(kValid,
                      {"model.position_embedding=rope",
                       "model.rope_scaling={type: longrope, factor: 32, "
                       "original_max_position_embeddings: 16, short_factor: [1, 1], "
                       "long_factor: [1, 2]}"},
                      "model.rope_scaling: longrope scaling has 2 short_factor and long_factor "
                      "values, but a head turning 8 dimensions has 4 pairs");
  expect_config_error(kValid,
                      {"model.rope_scaling={type: longrope, factor: 32, "
                       "original_max_position_embeddings: 16, short_factor: [1, 1]}"},
                      "model.rope_scaling.long_factor is required with type longrope");
  expect_config_error(kValid,
                      {"model.rope_scaling={type: longrope, factor: 32, "
                       "original_max_position_embeddings: 16, short_factor: [1, 0], "
                       "long_factor: [1, 2]}"},
                      "model.rope_scaling: short_factor[1] (0.000000) must be a positive number");
  expect_config_error(kValid,
                      {"model.rope_scaling={type: longrope, factor: 32, "
                       "original_max_position_embeddings: 16, short_factor: [1, 1, 1], "
                       "long_factor: [1, 2]}"},
                      "short_factor and long_factor need the same number of values");
  expect_config_error(kValid,
                      {"model.rope_scaling={type: longrope, factor: 32, short_factor: [1], "
                       "long_factor: [1]}"},
                      "model.rope_scaling.original_max_position_embeddings is required with type "
                      "longrope");
}

TEST(Config, RopeDimParsesRoundTripsAndIsChecked) {
  EXPECT_EQ(parse_config(kValid).model.rope_dim, 0);
  const Config c = parse_config(kValid, {"model.position_embedding=rope", "model.rope_dim=6"});
  EXPECT_EQ(c.model.rope_dim, 6);
  EXPECT_EQ(parse_config(to_yaml(c)).model.rope_dim, 6);
  expect_config_error(
      kValid, {"model.position_embedding=rope", "model.rope_dim=5"},
      "model.rope_dim (5) must be an even number of dimensions, at most head_dim 8");
  expect_config_error(kValid, {"model.position_embedding=rope", "model.rope_dim=10"},
                      "model.rope_dim (10) must be an even number");
  expect_config_error(kValid, {"model.rope_dim=4"},
                      "under model.position_embedding rope (0: the whole head)");
}

TEST(Config, LatentAttentionParsesRoundTripsAndIsChecked) {
  EXPECT_FALSE(parse_config(kValid).model.latent_attention());
  const std::vector<std::string> rope = {"model.position_embedding=rope",
                                         "model.normalization=rmsnorm"};
  auto with = [&](const std::string& mla) {
    std::vector<std::string> o = rope;
    o.push_back("model.mla=" + mla);
    return o;
  };
  const Config c = parse_config(
      kValid, with("{kv_lora_rank: 12, q_lora_rank: 10, qk_nope_head_dim: 6, qk_rope_head_dim: 4, "
                   "v_head_dim: 8, mscale_all_dim: 1}"));
  EXPECT_TRUE(c.model.latent_attention());
  EXPECT_EQ(c.model.mla.kv_lora_rank, 12);
  EXPECT_EQ(c.model.mla.q_lora_rank, 10);
  EXPECT_EQ(c.model.mla.qk_nope_head_dim, 6);
  EXPECT_EQ(c.model.mla.qk_rope_head_dim, 4);
  EXPECT_EQ(c.model.mla.v_head_dim, 8);
  EXPECT_DOUBLE_EQ(c.model.mla.mscale_all_dim, 1.0);
  EXPECT_EQ(parse_config(to_yaml(c)).model.mla, c.model.mla);
  // LoRA's default targets: latent attention's own layers (no c_attn).
  const Config lora = parse_config(kValid, [&] {
    auto o = with(
        "{kv_lora_rank: 12, qk_nope_head_dim: 6, qk_rope_head_dim: 4, "
        "v_head_dim: 8}");
    o.push_back("model.lora=4");
    return o;
  }());
  EXPECT_EQ(lora.model.lora.targets,
            (std::vector<std::string>{"attn.q_proj", "attn.kv_a_proj", "attn.kv_b_proj",
                                      "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}));
  expect_config_error(kValid, with("{kv_lora_rank: 12, qk_rope: 4}"),
                      "unknown key 'model.mla.qk_rope' (allowed: kv_lora_rank, q_lora_rank");
  expect_config_error(kValid, with("{q_lora_rank: 12}"),
                      "model.mla.kv_lora_rank (0) must be positive (model.mla: none");
  expect_config_error(kValid, with("[12]"), "model.mla: expected none, or a mapping of");
  expect_config_error(kValid,
                      with("{kv_lora_rank: 12, qk_nope_head_dim: 6, qk_rope_head_dim: 5, "
                           "v_head_dim: 8}"),
                      "expected q_lora_rank >= 0 (0: queries straight from x), "
                      "qk_nope_head_dim >= 0, an even qk_rope_head_dim >= 2");
  expect_config_error(kValid,
                      {"model.mla={kv_lora_rank: 12, qk_nope_head_dim: 6, qk_rope_head_dim: 4, "
                       "v_head_dim: 8}"},
                      "model.mla does not go with model.position_embedding learned");
  expect_config_error(
      kValid,
      [&] {
        auto o =
            with("{kv_lora_rank: 12, qk_nope_head_dim: 6, qk_rope_head_dim: 4, v_head_dim: 8}");
        o.push_back("model.lora={rank: 4, targets: attn.c_attn}");
        return o;
      }(),
      "model.mla does not go with model.lora.targets attn.c_attn");
}

TEST(Config, SlidingWindowParsesRoundTripsAndIsChecked) {
  EXPECT_EQ(parse_config(kValid).model.sliding_window, 0);
  const Config c = parse_config(kValid, {"model.sliding_window=8"});
  EXPECT_EQ(c.model.sliding_window, 8);
  EXPECT_EQ(parse_config(to_yaml(c)).model.sliding_window, 8);
  expect_config_error(kValid, {"model.sliding_window=-2"}, "model.sliding_window (-2) must be");
  // cuDNN's graph takes a window (as a second mask), and a window as long
  // as the sequence is no window.
  EXPECT_NO_THROW(parse_config(kValid, {"model.sliding_window=8", "model.attention_kernel=cudnn"}));
  EXPECT_NO_THROW(
      parse_config(kValid, {"model.sliding_window=32", "model.attention_kernel=cudnn"}));
}

TEST(Config, MlpActivationWidthAndNormalizationParseRoundTripAndAreChecked) {
  const Config plain = parse_config(kValid);
  EXPECT_EQ(plain.model.activation, nn::Activation::Gelu);
  EXPECT_EQ(plain.model.ffn(), 64);
  const Config c = parse_config(kValid, {"model.activation=swiglu", "model.ffn_hidden_size=44"});
  EXPECT_EQ(c.model.activation, nn::Activation::SwiGlu);
  EXPECT_EQ(c.model.fc_width(), 88);
  const Config back = parse_config(to_yaml(c));
  EXPECT_EQ(back.model.activation, nn::Activation::SwiGlu);
  EXPECT_EQ(back.model.ffn_hidden_size, 44);
  const Config gemma = parse_config(
      kValid, {"model.activation=geglu", "model.embedding_multiplier=5.656854249492381",
               "model.norm_weight_offset=true"});
  EXPECT_EQ(gemma.model.activation, nn::Activation::GeGlu);
  EXPECT_EQ(gemma.model.fc_width(), 128);
  const Config gemma_back = parse_config(to_yaml(gemma));
  EXPECT_EQ(gemma_back.model.activation, nn::Activation::GeGlu);
  const Config relu2 = parse_config(kValid, {"model.activation=relu2"});
  EXPECT_EQ(relu2.model.activation, nn::Activation::Relu2);
  EXPECT_EQ(relu2.model.fc_width(), 4 * relu2.model.d_model);  // ungated
  EXPECT_EQ(parse_config(to_yaml(relu2)).model.activation, nn::Activation::Relu2);
  EXPECT_DOUBLE_EQ(gemma_back.model.embedding_multiplier, 5.656854249492381);
  EXPECT_TRUE(gemma_back.model.norm_weight_offset);
  EXPECT_DOUBLE_EQ(plain.model.embedding_multiplier, 1.0);
  EXPECT_FALSE(plain.model.norm_weight_offset);
  expect_config_error(kValid, {"model.embedding_multiplier=0"},
                      "model.embedding_multiplier (0.000000) must be a positive number");
  // The weights' initial std (Megatron-LM's --init-method-std), to its
  // last digit through the run's config.yaml; 0.02 by default.
  const Config small = parse_config(kValid, {"model.init_std=0.0134"});
  EXPECT_EQ(small.model.init_std, 0.0134);
  EXPECT_EQ(parse_config(to_yaml(small)).model.init_std, 0.0134);
  EXPECT_EQ(plain.model.init_std, 0.02);
  expect_config_error(kValid, {"model.init_std=-0.01"},
                      "model.init_std (-0.010000) must be a positive number (the weights' "
                      "initial std)");
  // Granite's residual multiplier and logit scale, to their last digit.
  const Config granite =
      parse_config(kValid, {"model.residual_multiplier=0.22", "model.logit_scale=0.0625"});
  const Config granite_back = parse_config(to_yaml(granite));
  EXPECT_EQ(granite_back.model.residual_multiplier, 0.22);
  EXPECT_EQ(granite_back.model.logit_scale, 0.0625);
  EXPECT_EQ(plain.model.residual_multiplier, 1.0);
  EXPECT_EQ(plain.model.logit_scale, 1.0);
  EXPECT_EQ(to_yaml(plain).find("residual_multiplier"), std::string::npos);
  expect_config_error(kValid, {"model.residual_multiplier=-1"},
                      "model.residual_multiplier (-1.000000) must be a positive number");
  expect_config_error(kValid, {"model.logit_scale=0"},
                      "model.logit_scale (0.000000) must be a positive number");
  // Cohere's LayerNorms without a bias.
  const Config cohere = parse_config(kValid, {"model.norm_bias=false"});
  EXPECT_FALSE(parse_config(to_yaml(cohere)).model.norm_bias);
  EXPECT_TRUE(plain.model.norm_bias);
  EXPECT_EQ(to_yaml(plain).find("norm_bias"), std::string::npos);
  expect_config_error(kValid, {"model.norm_bias=false", "model.normalization=rmsnorm"},
                      "model.norm_bias: false drops a LayerNorm's learned shift");
  // Gemma 3's: post-norms, and a RoPE base of the windowed layers' own,
  // which needs rope and a window.
  const Config gemma3 = parse_config(
      kValid, {"model.post_norms=true", "model.position_embedding=rope", "model.sliding_window=4",
               "model.full_attention_layers=[1]", "model.rope_local_theta=100"});
  const Config gemma3_back = parse_config(to_yaml(gemma3));
  EXPECT_TRUE(gemma3_back.model.post_norms);
  EXPECT_EQ(gemma3_back.model.rope_local_theta, 100.0);
  EXPECT_EQ(gemma3_back.model.rope_of(0).theta, 100.0);
  EXPECT_EQ(gemma3_back.model.rope_of(1).theta, gemma3.model.rope_theta);
  EXPECT_FALSE(plain.model.post_norms);
  // GPT-NeoX's: the parallel residual and the exact GELU, through the YAML.
  const Config neox =
      parse_config(kValid, {"model.parallel_residual=true", "model.activation=gelu_erf"});
  const Config neox_back = parse_config(to_yaml(neox));
  EXPECT_TRUE(neox_back.model.parallel_residual);
  EXPECT_EQ(neox_back.model.activation, nn::Activation::GeluErf);
  EXPECT_FALSE(plain.model.parallel_residual);
  expect_config_error(
      kValid, {"model.activation=gelu_exact"},
      "model.activation ('gelu_exact') must be gelu, gelu_erf, swiglu, geglu or relu2");
  const Config scaled =
      parse_config(kValid, {"model.position_embedding=rope", "model.query_pre_attn_scalar=12"});
  EXPECT_EQ(parse_config(to_yaml(scaled)).model.query_pre_attn_scalar, 12.0);
  expect_config_error(kValid, {"model.query_pre_attn_scalar=12"},
                      "model.query_pre_attn_scalar (12.000000) rescales the attention through the "
                      "rotary embedding: it needs model.position_embedding rope");
  expect_config_error(kValid, {"model.position_embedding=rope", "model.rope_local_theta=100"},
                      "model.rope_local_theta (100.000000) is the windowed layers' RoPE base: it "
                      "needs model.position_embedding rope and a model.sliding_window");
  expect_config_error(
      kValid,
      {"model.position_embedding=rope", "model.sliding_window=4", "model.rope_local_theta=-1"},
      "model.rope_local_theta (-1.000000) must be a positive number");
  const Config nobias = parse_config(kValid, {"model.linear_bias=false"});
  EXPECT_FALSE(nobias.model.linear_bias);
  EXPECT_FALSE(parse_config(to_yaml(nobias)).model.linear_bias);
  EXPECT_TRUE(plain.model.linear_bias);
  EXPECT_TRUE(plain.model.tie_embeddings);
  EXPECT_DOUBLE_EQ(plain.model.layer_norm_eps, 1e-5);
  const Config eps = parse_config(kValid, {"model.norm_eps=1e-6"});
  EXPECT_DOUBLE_EQ(eps.model.layer_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(parse_config(to_yaml(eps)).model.layer_norm_eps, 1e-6);
  expect_config_error(kValid, {"model.norm_eps=0"}, "model.norm_eps (0.000000) must be a positive");
  const Config untied = parse_config(kValid, {"model.tie_embeddings=false"});
  EXPECT_FALSE(untied.model.tie_embeddings);
  EXPECT_FALSE(parse_config(to_yaml(untied)).model.tie_embeddings);
  expect_config_error(kValid, {"model.tie_embeddings=maybe"}, "model.tie_embeddings");
  const Config rms = parse_config(kValid, {"model.normalization=rmsnorm"});
  EXPECT_TRUE(rms.model.rms_norm());
  EXPECT_TRUE(parse_config(to_yaml(rms)).model.rms_norm());
  expect_config_error(kValid, {"model.normalization=batchnorm"},
                      "model.normalization ('batchnorm') must be layernorm or rmsnorm");
  expect_config_error(kValid, {"model.activation=relu"},
                      "model.activation ('relu') must be gelu, gelu_erf, swiglu, geglu or relu2");
  expect_config_error(kValid, {"model.ffn_hidden_size=-4"},
                      "model.ffn_hidden_size (-4) must be positive");
}

// A resumed run logs what changed since its checkpoint: the resolved
// configs compared key by key.
TEST(Config, ChangesBetweenResolvedConfigsAreListedKeyByKey) {
  const std::string before = to_yaml(parse_config(kValid));
  EXPECT_TRUE(config_changes(before, before).empty());
  const std::string after = to_yaml(parse_config(
      kValid, {"train.lr=5.0e-4", "train.global_batch_size=16", "parallel.stage_layers=[1, 1]",
               "parallel.pp=2", "data.val=data/v.bin"}));
  // Resolved values: min_lr follows lr, and data.val brings the eval section.
  const std::vector<std::string> expected{"data.val: (unset) -> data/v.bin",
                                          "eval.batches: (unset) -> 0",
                                          "eval.interval: (unset) -> 0",
                                          "parallel.pp: 1 -> 2",
                                          "parallel.stage_layers: (unset) -> [1, 1]",
                                          "train.global_batch_size: 8 -> 16",
                                          "train.lr: 0.001 -> 0.0005",
                                          "train.min_lr: 0.0001 -> 5e-05"};
  EXPECT_EQ(config_changes(before, after), expected);
  try {
    config_changes("a: [", before, "checkpoint 'x'");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint 'x': not valid YAML"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace triad::train
