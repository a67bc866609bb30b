// log.nvtx, log.profile_steps, log.profile_ranks: the NVTX ranges a run
// emits, as an injection library (tests/support/nvtx_recorder.cpp) records
// them in place of Nsight Systems.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "triad/core/nvtx.h"
#include "triad/data/token_shard.h"
#include "triad/train/trainer.h"

namespace triad::train {
namespace {

using triad::testing::TempDir;

Config profiled_config(const TempDir& dir, const std::vector<std::string>& overrides) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back(static_cast<uint16_t>((i * 7 + i / 13) % 31));
  data::write_token_shard(dir.file("train.bin"), tokens);
  data::write_token_shard(dir.file("val.bin"), tokens);
  return parse_config(
      "model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 32, seq_len: 16}\n"
      "train: {steps: 5, global_batch_size: 4, micro_batch_size: 2, lr: 1.0e-2}\n"
      "data: {train: " +
          dir.file("train.bin") + ", val: " + dir.file("val.bin") +
          "}\n"
          "eval: {interval: 2, batches: 1}\n"
          "checkpoint: {dir: " +
          dir.file("ckpt") +
          ", interval: 3}\n"
          "output: {dir: " +
          dir.file("out") + "}\n",
      overrides);
}

// One range as recorded: its name and the ranges opened inside it.
struct Range {
  std::string name;
  std::vector<Range> inside;
};

// The recorded pushes and pops as a forest; a pop without a push, or a range
// never closed, fails the test.
std::vector<Range> read_ranges(const std::string& path) {
  std::ifstream in(path);
  std::vector<Range> roots;
  std::vector<std::vector<Range>*> open{&roots};
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("push ", 0) == 0) {
      open.back()->push_back({line.substr(5), {}});
      open.push_back(&open.back()->back().inside);
    } else {
      EXPECT_EQ(line, "pop");
      EXPECT_GT(open.size(), 1u) << "a pop without a push";
      if (open.size() > 1) open.pop_back();
    }
  }
  EXPECT_EQ(open.size(), 1u) << "ranges left open";
  return roots;
}

std::vector<std::string> names(const std::vector<Range>& ranges) {
  std::vector<std::string> out;
  for (const Range& r : ranges) out.push_back(r.name);
  return out;
}

// The recorder, attached before the process's first NVTX call (each test
// of this binary runs in a process of its own under CTest; in one process
// the first test attaches it for all). False where this build has none.
bool attach_recorder() {
#ifdef TRIAD_NVTX_RECORDER
  if (!nvtx::available()) return false;
  setenv("NVTX_INJECTION64_PATH", TRIAD_NVTX_RECORDER, 1);
  return true;
#else
  return false;
#endif
}

// Steps 2-4 of five, two microbatches each: each step a range holding its
// microbatches' forward and backward passes and the update, followed by the
// evaluation (steps 2 and 4) and the checkpoint (step 3) its step triggers;
// nothing from steps 1 and 5. The run trains as it does unprofiled.
TEST(Profiling, NvtxRangesCoverTheProfiledStepsAndWhatTheyTrigger) {
  if (!attach_recorder()) GTEST_SKIP() << "this build has no NVTX (no CUDA toolkit)";
  TempDir dir;
  const std::string log = dir.file("nvtx.log");
  setenv("TRIAD_NVTX_LOG", log.c_str(), 1);
  const auto profiled =
      Trainer(profiled_config(dir, {"log.nvtx=true", "log.profile_steps=[2, 4]"})).run();
  EXPECT_FALSE(nvtx::enabled());  // (off again after the run)
  const std::vector<Range> ranges = read_ranges(log);
  const std::vector<std::string> want = {"step 2",     "evaluation", "step 3",
                                         "checkpoint", "step 4",     "evaluation"};
  EXPECT_EQ(names(ranges), want);
  for (const Range& r : ranges) {
    if (r.name.rfind("step ", 0) != 0) continue;
    EXPECT_EQ(names(r.inside), (std::vector<std::string>{"F0", "B0", "F1", "B1", "optimizer"}))
        << r.name;
  }
  std::filesystem::remove_all(dir.file("ckpt"));
  const auto plain = Trainer(profiled_config(dir, {})).run();
  ASSERT_EQ(profiled.size(), plain.size());
  for (size_t k = 0; k < plain.size(); ++k) EXPECT_EQ(profiled[k].loss, plain[k].loss) << k;
  // Unprofiled, nothing more was recorded.
  EXPECT_EQ(read_ranges(log).size(), want.size());
}

// Without log.profile_steps every step is in ranges; log.profile_ranks
// leaving out this process's rank (0) records none.
TEST(Profiling, EveryStepWithoutAWindowAndNoneOnRanksLeftOut) {
  if (!attach_recorder()) GTEST_SKIP() << "this build has no NVTX (no CUDA toolkit)";
  TempDir dir;
  const std::string log = dir.file("nvtx.log");
  setenv("TRIAD_NVTX_LOG", log.c_str(), 1);
  Trainer(profiled_config(dir, {"log.nvtx=true", "checkpoint.interval=0"})).run();
  std::vector<std::string> steps;
  for (const std::string& n : names(read_ranges(log))) {
    if (n.rfind("step ", 0) == 0) steps.push_back(n);
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"step 1", "step 2", "step 3", "step 4", "step 5"}));
  const std::string other = dir.file("other.log");
  setenv("TRIAD_NVTX_LOG", other.c_str(), 1);
  // (A world of one process: rank 1 does not exist.)
  testing::expect_error<ConfigError>(
      [&] {
        Trainer(profiled_config(dir, {"log.nvtx=true", "log.profile_ranks=[1]"}));
      },
      {"log.profile_ranks: rank 1 is not in a world of 1 rank(s)"});
  EXPECT_FALSE(std::filesystem::exists(other));
}

// A window that misses the steps the run trains is named at the start, with
// those steps; one that meets them is not.
TEST(Profiling, AWindowPastTheRunIsNamed) {
  TempDir dir;
  auto warnings = [&](const std::vector<std::string>& overrides) {
    std::ostringstream log;
    const auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
    sink->set_level(spdlog::level::warn);
    spdlog::default_logger()->sinks().push_back(sink);
    std::vector<std::string> all = {"checkpoint.interval=0", "eval.interval=0"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    Trainer(profiled_config(dir, all)).run();
    spdlog::default_logger()->sinks().pop_back();
    return log.str();
  };
  const std::string late = warnings({"log.trace_steps=[7, 9]"});
  EXPECT_NE(late.find("log.trace_steps [7, 9] misses the steps this run trains (1 to 5): it "
                      "records nothing"),
            std::string::npos)
      << late;
  const std::string met = warnings({"log.trace_steps=[4, 9]"});
  EXPECT_EQ(met.find("misses"), std::string::npos) << met;
  if (nvtx::available()) {
    const std::string profile = warnings({"log.nvtx=true", "log.profile_steps=[6, 6]"});
    EXPECT_NE(profile.find("log.profile_steps [6, 6] misses the steps this run trains (1 to 5)"),
              std::string::npos)
        << profile;
  }
}

// The keys: parsed, round-tripped, checked.
TEST(Profiling, ConfigKeys) {
  TempDir dir;
  const Config c = parse_config(to_yaml(profiled_config(
      dir, {"log.nvtx=true", "log.profile_steps=[3, 7]", "log.profile_ranks=[0, 2]"})));
  EXPECT_TRUE(c.log_nvtx);
  EXPECT_EQ(c.log_profile_first, 3);
  EXPECT_EQ(c.log_profile_last, 7);
  EXPECT_EQ(c.log_profile_ranks, (std::vector<int64_t>{0, 2}));
  const std::string plain = to_yaml(profiled_config(dir, {}));
  EXPECT_EQ(plain.find("nvtx"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("profile"), std::string::npos) << plain;
  auto refused = [&](const std::vector<std::string>& overrides, const std::string& fragment) {
    testing::expect_error<ConfigError>([&] { profiled_config(dir, overrides); }, {fragment});
  };
  refused({"log.nvtx=true", "log.profile_steps=[4, 2]"},
          "must be [first, last], steps numbered from 1 as logged with first <= last");
  refused({"log.nvtx=true", "log.profile_steps=[0, 2]"}, "log.profile_steps");
  refused({"log.nvtx=true", "log.profile_steps=3"}, "must be [first, last]");
  refused({"log.profile_steps=[1, 2]"},
          "log.profile_steps ([1, 2]) on device cpu needs log.nvtx: true");
  refused({"log.profile_ranks=[0]"},
          "log.profile_ranks applies to log.nvtx or log.profile_steps: set one");
  refused({"log.nvtx=true", "log.profile_ranks=[-1]"}, "log.profile_ranks: rank -1 must be >= 0");
  refused({"log.nvtx=true", "log.profile_ranks=[]"}, "must be a list of world ranks");
}

}  // namespace
}  // namespace triad::train
