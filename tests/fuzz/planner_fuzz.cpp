// What triad-plan reads: a cluster file and a model file (YAML, the input's
// first two parts), then the search over layouts for a GPU count and global
// batch (the third part: two numbers). Whatever the files say, the search
// returns or names what is wrong, and every layout it recommends is one the
// search space allows for these GPUs and this batch, fits the GPU's memory,
// and is priced with a finite, positive step time, fastest first (those
// within 0.1% of each other the leaner first).
#include <cmath>
#include <sstream>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/plan/cluster.h"
#include "triad/plan/model_spec.h"
#include "triad/plan/planner.h"

TRIAD_FUZZ_TARGET(planner) {
  using triad::fuzz::require;
  const auto parts = triad::fuzz::split_input(data, size, 3);
  // (A model file may name a config.json to read: not a file of this input.)
  if (parts[1].find("hf_config") != std::string::npos) return;
  const triad::plan::ClusterSpec cluster = triad::plan::parse_cluster(parts[0], "cluster.yaml");
  const triad::nn::GptConfig model = triad::plan::parse_model_spec(parts[1], "model.yaml");
  int gpus = 8, batch = 32;
  std::istringstream(parts[2]) >> gpus >> batch;
  // (Small searches: a fuzzer's input is run in milliseconds.)
  if (gpus < 1 || gpus > 16 || batch < 1 || batch > 128 || model.n_layer > 128) return;
  triad::plan::SearchSpace space;
  space.top = 3;
  triad::plan::SearchStats stats;
  const auto found = triad::plan::recommend(model, cluster, gpus, batch, space, &stats);
  require(found.size() <= 3, "at most `top` layouts");
  require(stats.fit >= found.size() && stats.priced >= stats.fit && stats.layouts >= stats.priced,
          "the search's counts nest");
  double last = 0, last_memory = 0;
  for (const auto& e : found) {
    const auto& p = e.config;
    require(int64_t{p.tp} * p.pp * p.dp * p.cp == gpus, "a layout uses every GPU");
    require(batch % (p.micro_batch * p.dp) == 0, "micro batches times dp divide the batch");
    require(std::isfinite(e.step_time) && e.step_time > 0, "a step takes a finite time");
    require(e.step_time >= last || (e.step_time * 1.001 >= last && e.memory_bytes >= last_memory),
            "fastest first, the leaner first among equally fast");
    require(e.fits && e.memory_bytes <= cluster.memory_bytes, "a layout fits");
    last = e.step_time;
    last_memory = e.memory_bytes;
  }
}
