// triad-plan: pipeline schedule pictures and cluster-scale predictions.
//   triad-plan schedule --kind interleaved --p 4 --v 2 --m 8 --svg out.svg [--trace out.json]
//   triad-plan predict --model M.yaml --cluster C.yaml --gpus N --global-batch B --tp T --pp P
//                      [--vpp V] --micro-batch b [--recompute none|selective|full]
//                      [--recompute-layers N]
//                      [--sequence-parallel] [--zero 1] [--ep E] [--cp C]
//                      [--cp-comm auto|all_to_all|all_gather|ring|all_to_all+ring]
//                      [--cp-a2a N]
//                      [--schedule 1f1b|interleaved|zb-h1|zb-auto|zb-v]
//                      [--stage-layers auto|3,4,4,1|first=N,last=M] [--optimizer adamw|muon]
//                      [--moment-precision fp32|bf16] [--grad-precision fp32|bf16] [--ema]
//                      [--json]
//   triad-plan predict --config RUN.yaml --cluster C.yaml [any option above]
//                      [--write-config OUT.yaml]
//   triad-plan recommend --model M.yaml --cluster C.yaml --gpus N --global-batch B [--top K]
//   [--schedules interleaved,zb-h1,zb-auto,zb-v] [--even-stages] [--whole-recompute]
//   [--cps 1,2,4]
//   [--optimizer adamw|muon] [--moment-precision fp32|bf16] [--grad-precision fp32|bf16]
//   [--ema] [--json]
//   triad-plan recommend --config RUN.yaml --cluster C.yaml [--gpus N] [--write-config BEST.yaml]
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "triad/core/error.h"
#include "triad/io/text_file.h"
#include "triad/parallel/pipeline/simulator.h"
#include "triad/parallel/pipeline/stage_balance.h"
#include "triad/parallel/pipeline/zero_bubble.h"
#include "triad/plan/from_config.h"
#include "triad/plan/model_spec.h"
#include "triad/plan/planner.h"
#include "triad/train/config.h"
#include "triad/train/console.h"

#include "cli_checks.h"

namespace {

using namespace triad;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw IoError("cannot write '" + path + "'");
  out << text;
}

void print_estimate(const plan::Estimate& e, const plan::ClusterSpec& c) {
  std::printf("%s\n", e.config.str().c_str());
  std::printf(
      "  step %.3f s | %.0f tokens/s | %.1f TFLOP/s per GPU | MFU %.1f%% | bubble %.1f%% | %.1f GB "
      "per GPU%s\n",
      e.step_time, e.tokens_per_s, e.tflops_per_gpu, 100 * e.mfu, 100 * e.bubble_fraction,
      e.memory_bytes / 1e9, e.fits ? "" : " (does NOT fit)");
  std::printf(
      "  time: pipeline %.3f s (per microbatch %.1f ms: GEMM %.1f, memory-bound %.1f, TP comm "
      "%.1f of which %.1f hidden; p2p %.2f ms/msg), DP comm %.3f s, optimizer %.3f s\n",
      e.pipeline_time, 1e3 * e.compute_time, 1e3 * e.gemm_time, 1e3 * e.memory_bound_time,
      1e3 * e.tp_comm_time, 1e3 * e.tp_comm_hidden_time, 1e3 * e.p2p_time, e.dp_comm_time,
      e.optimizer_time);
  std::printf(
      "  memory: weights %.1f, grads %.1f, optimizer %.1f, activations %.1f, reserved %.1f GB (of "
      "%.1f)\n",
      e.weights_bytes / 1e9, e.gradient_bytes / 1e9, e.optimizer_bytes / 1e9,
      e.activation_bytes / 1e9, c.reserved_bytes / 1e9, c.memory_bytes / 1e9);
}

// An estimate with the triad-train settings that run its layout: a line of
// --set flags after the estimate, or --json's trainer_settings.
void print_with_settings(const plan::Estimate& e, const plan::ClusterSpec& c,
                         const std::vector<std::string>& settings) {
  print_estimate(e, c);
  std::string flags;
  for (const std::string& setting : settings) flags += " --set " + setting;
  std::printf("  triad-train%s\n", flags.c_str());
}

nlohmann::json json_with_settings(const plan::Estimate& e,
                                  const std::vector<std::string>& settings) {
  nlohmann::json one = nlohmann::json::parse(e.json());
  one["trainer_settings"] = settings;
  return one;
}

// --write-config: the config at `from` again with `settings` applied.
void write_config_with(const std::string& from, const std::string& to,
                       const std::vector<std::string>& settings, const char* which, int gpus) {
  std::error_code ec;
  if (std::filesystem::equivalent(to, from, ec))
    throw ConfigError("--write-config '" + to +
                      "' is the config it reads (--config): name another file");
  write_file(to, train::with_overrides(io::read_text_file(from, "config file"), settings, from));
  spdlog::info("wrote {}: {} with {} settings; run it with mpirun -np {} triad-train --config {}",
               to, from, which, gpus, to);
}

}  // namespace

int main(int argc, char** argv) {
  // Warnings and errors on stderr: stdout carries the results (--json's too).
  auto log = spdlog::stderr_color_mt("triad-plan");
  log->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_default_logger(log);
  CLI::App app{"Triad planner: pipeline schedules and cluster predictions"};
  const CLI::Validator at_least_one = examples::at_least_one();
  app.require_subcommand(1);

  auto* sched = app.add_subcommand("schedule", "simulate a pipeline schedule and draw it");
  std::string kind = "1f1b", svg, trace;
  int p = 4, v = 1, m = 8, max_in_flight = 0;
  std::vector<double> tf{1}, tb{2}, tw;
  double comm = 0;
  sched->add_option("--kind", kind, "gpipe, 1f1b, interleaved, zb-h1, zb-auto or zb-v")
      ->capture_default_str();
  sched->add_option("--p", p, "pipeline ranks")->capture_default_str();
  sched->add_option("--v", v, "chunks per rank (interleaved; zb-v: 2, its default)")
      ->capture_default_str();
  sched->add_option("--m", m, "microbatches")->capture_default_str();
  // Each time: one value (every stage), v (one per chunk) or p*v (one per
  // stage), comma-separated.
  sched->add_option("--tf", tf, "forward time per chunk; a list: per chunk or per stage")
      ->delimiter(',')
      ->capture_default_str();
  sched->add_option("--tb", tb, "backward time per chunk (B + W); a list: per chunk or per stage")
      ->delimiter(',')
      ->capture_default_str();
  sched
      ->add_option("--tw", tw,
                   "weight-gradient part of --tb for split schedules (default half); a list "
                   "as --tb's")
      ->delimiter(',');
  sched->add_option("--comm", comm, "time of one point-to-point message")->capture_default_str();
  sched->add_option("--max-in-flight", max_in_flight,
                    "zb-auto, zb-v: microbatches a rank may hold from F to W (default p)");
  std::string wait = "consumer";
  sched
      ->add_option("--wait", wait,
                   "where a rank waits for a receive: consumer (where its payload is used, as "
                   "the executor does on CPUs), posted (where its batch is posted), rendezvous "
                   "(sends wait for their receives too), stream (batches run in order on one "
                   "communication stream and rendezvous there, compute waits only where a "
                   "payload is used) or peer-streams (the same with a stream per neighbour, as "
                   "the executor does on GPUs)")
      ->capture_default_str();
  sched->add_option("--svg", svg, "write the timeline as SVG");
  sched->add_option("--trace", trace, "write the timeline as Chrome trace JSON");

  std::string model_path, cluster_path, recompute = "none", schedule_name, attention = "unfused",
                                        stage_layers, optimizer = "adamw", cp_comm = "auto",
                                        moment_precision = "fp32", grad_precision = "fp32";
  int gpus = 0, global_batch = 0, tp = 1, pp = 1, vpp = 1, micro = 1, zero = 0, top = 5, ep = 1,
      cp = 1, cp_a2a = 1, recompute_layers = 0;
  bool sp = false, json = false, overlap = false, overlap_tp = false, ema = false;
  std::string config_path, write_config;
  auto add_common = [&](CLI::App* c) {
    c->add_option("--model", model_path, "trainer config or model section YAML");
    c->add_option("--cluster", cluster_path, "cluster YAML (configs/clusters/)")->required();
    c->add_option("--gpus", gpus, "number of GPUs")->check(at_least_one);
    c->add_option("--global-batch", global_batch, "sequences per step")->check(at_least_one);
    c->add_flag("--overlap-dp", overlap, "assume the DP gradient reduction overlaps backward");
    c->add_flag("--overlap-tp", overlap_tp,
                "assume column-parallel input-gradient collectives overlap the weight gradients");
    c->add_option("--attention", attention,
                  "unfused (Megatron-LM 2021, the default) or flash (Triad's fused attention)");
    c->add_option("--optimizer", optimizer,
                  "adamw (the default) or muon (train.optimizer: the blocks' matrices keep one "
                  "moment, and each step orthogonalises them)")
        ->check(CLI::IsMember({"adamw", "muon"}));
    c->add_option("--moment-precision", moment_precision,
                  "fp32 (the default) or bf16 (train.moment_precision: the optimizer's moments "
                  "in 2 bytes each)")
        ->check(CLI::IsMember({"fp32", "bf16"}));
    c->add_option("--grad-precision", grad_precision,
                  "fp32 (the default) or bf16 (train.grad_precision: the gradients in 2 bytes "
                  "each, Megatron-LM's default)")
        ->check(CLI::IsMember({"fp32", "bf16"}));
    c->add_flag("--ema", ema,
                "an f32 moving average of the weights (train.ema_decay): 4 bytes a trained "
                "parameter on every rank");
    c->add_flag("--json", json, "print JSON");
  };
  auto* predict = app.add_subcommand("predict", "price one configuration");
  add_common(predict);
  predict->add_option("--config", config_path,
                      "a triad-train config: its model, layout and batch (options given here "
                      "override them), priced as Triad runs it (overlapped DP and TP, fused "
                      "attention)");
  predict->add_option("--write-config", write_config,
                      "with --config: write it again with this layout's settings (parallel, "
                      "micro batch, recomputation) to this file");
  predict->add_option("--tp", tp)->check(at_least_one);
  predict->add_option("--pp", pp)->check(at_least_one);
  predict->add_option("--vpp", vpp)->check(at_least_one);
  predict->add_option("--micro-batch", micro)->check(at_least_one);
  predict->add_option("--recompute", recompute, "none, selective or full");
  predict
      ->add_option("--recompute-layers", recompute_layers,
                   "with --recompute full: the layers of each pipeline stage that recompute "
                   "(the first ones; 0, the default: every one)")
      ->check(CLI::NonNegativeNumber);
  predict->add_flag("--sequence-parallel", sp);
  predict->add_option("--zero", zero, "1 shards the optimizer state (ZeRO-1)");
  predict->add_option("--ep", ep, "expert parallelism: a mixture's experts shared by ep dp ranks")
      ->check(at_least_one);
  predict
      ->add_option("--cp", cp,
                   "context parallelism: each sequence shared by cp ranks (GPUs = "
                   "tp*pp*dp*cp)")
      ->check(at_least_one);
  predict
      ->add_option("--cp-comm", cp_comm,
                   "how the cp ranks' attention sees the whole sequence: all_to_all (the heads "
                   "exchanged), all_gather (the keys and values gathered), ring (the keys and "
                   "values passed around a ring), all_to_all+ring (all-to-alls of --cp-a2a "
                   "ranks, a ring across them) or auto (the default: all_to_all where the heads "
                   "share out, else all_gather; all_to_all+ring inside and across the "
                   "cluster's nodes when a context group spans them)")
      ->check(CLI::IsMember({"auto", "all_to_all", "all_gather", "ring", "all_to_all+ring"}));
  predict
      ->add_option("--cp-a2a", cp_a2a,
                   "with --cp-comm all_to_all+ring: the all-to-all's ranks (a divisor of cp "
                   "between 1 and cp; the ring takes cp / cp-a2a)")
      ->check(at_least_one);
  predict->add_option("--stage-layers", stage_layers,
                      "layers per stage, e.g. 3,4,4,1 (the first and the last may be 0: the "
                      "embedding or the head alone), first=N and/or last=M (the other stages "
                      "sharing the rest evenly), or auto (balanced for the head)");
  predict->add_option("--schedule", schedule_name,
                      "1f1b (default), interleaved (default when --vpp > 1), zb-h1, zb-auto, "
                      "zb-v (--vpp 2, its default)");
  auto* rec =
      app.add_subcommand("recommend", "the fastest configurations that fit (--top of them)");
  add_common(rec);
  rec->add_option("--config", config_path,
                  "a triad-train config: its model, global batch, optimizer and frozen "
                  "parameters, priced as Triad runs them (as predict --config does)");
  rec->add_option("--write-config", write_config,
                  "with --config: write it again with the best layout's settings (parallel, "
                  "micro batch, recomputation) to this file");
  rec->add_option("--top", top, "how many to print")->check(at_least_one)->capture_default_str();
  std::string schedules = "interleaved,zb-h1,zb-auto,zb-v";
  bool even_stages = false, whole_recompute = false;
  rec->add_option("--schedules", schedules,
                  "pipeline schedules tried beside 1f1b (always tried), comma-separated")
      ->capture_default_str();
  rec->add_flag("--even-stages", even_stages,
                "only even stage splits (pp dividing the layers): a narrower, faster search");
  rec->add_flag("--whole-recompute", whole_recompute,
                "full recomputation of every layer only, never of some of each chunk's "
                "(model.recompute_layers): a narrower, faster search");
  std::string cps = "1";
  rec->add_option("--cps", cps,
                  "context-parallel sizes tried (each sequence shared by cp ranks), "
                  "comma-separated")
      ->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  return triad::examples::report_errors([&]() -> int {
    triad::train::configure_console_colors();
    if (sched->parsed()) {
      const pipeline::ScheduleKind k = pipeline::schedule_from_name(kind);
      for (const auto& [option, values] : {std::pair<const char*, std::vector<double>>{"--tf", tf},
                                           {"--tb", tb},
                                           {"--tw", tw},
                                           {"--comm", {comm}}}) {
        for (double t : values) {
          if (!(t >= 0) || !std::isfinite(t))
            throw ConfigError(std::string(option) + " " + fmt::format("{:g}", t) +
                              ": a time is a finite number >= 0");
        }
      }
      pipeline::Costs c;
      c.forward = tf;
      c.backward = tb;
      c.backward_weight = tw;
      if (tw.empty()) {
        for (double b : tb) c.backward_weight.push_back(b / 2);
      }
      // B = (B + W) - W, entry by entry; a single value stands for every entry.
      const size_t n = std::max(tb.size(), c.backward_weight.size());
      if (tb.size() != n && tb.size() != 1)
        throw ConfigError("--tb has " + std::to_string(tb.size()) + " values and --tw " +
                          std::to_string(tw.size()) + ": give them as many, or one of them one");
      if (c.backward_weight.size() != n && c.backward_weight.size() != 1)
        throw ConfigError("--tw has " + std::to_string(tw.size()) + " values and --tb " +
                          std::to_string(tb.size()) + ": give them as many, or one of them one");
      c.backward_input.clear();
      for (size_t i = 0; i < n; ++i) {
        const double b = tb[tb.size() == 1 ? 0 : i];
        const double w = c.backward_weight[c.backward_weight.size() == 1 ? 0 : i];
        if (!(w < b))
          throw ConfigError("--tw " + fmt::format("{:g}", w) + " must be less than --tb " +
                            fmt::format("{:g}", b) + " (W is a part of B + W)");
        c.backward_input.push_back(b - w);
      }
      if (c.backward_weight.size() != n) c.backward_weight.assign(n, c.backward_weight[0]);
      c.p2p_latency = comm;
      if (max_in_flight != 0 && k != pipeline::ScheduleKind::ZbAuto &&
          k != pipeline::ScheduleKind::ZbV)
        throw ConfigError("--max-in-flight goes with --kind zb-auto or zb-v");
      if (k == pipeline::ScheduleKind::ZbV && sched->get_option("--v")->count() == 0) v = 2;
      auto s = pipeline::make_schedule(k, p, m, v);  // names bad numbers
      // zb-auto and zb-v: the order searched for these costs.
      if (k == pipeline::ScheduleKind::ZbAuto)
        s = pipeline::make_zero_bubble_schedule(p, m, c, {max_in_flight});
      if (k == pipeline::ScheduleKind::ZbV)
        s = pipeline::make_zero_bubble_v_schedule(p, m, c, {max_in_flight});
      const pipeline::P2PSemantics semantics =
          wait == "consumer"     ? pipeline::P2PSemantics::WaitAtConsumer
          : wait == "posted"     ? pipeline::P2PSemantics::AsyncSends
          : wait == "rendezvous" ? pipeline::P2PSemantics::Blocking
          : wait == "stream"     ? pipeline::P2PSemantics::StreamOrdered
          : wait == "peer-streams"
              ? pipeline::P2PSemantics::StreamPerPeer
              : throw ConfigError(
                    "--wait " + wait +
                    ": expected consumer, posted, rendezvous, stream or peer-streams");
      auto r = pipeline::simulate(s, c, semantics);
      const int held = s.split_backward ? r.peak_held[0] : r.peak_alive[0];
      std::printf("%s p=%d v=%d m=%d: makespan %.4g, bubble %.2f%%, peak in-flight on rank 0: %d\n",
                  kind.c_str(), p, v, m, r.makespan, 100 * r.bubble_fraction, held);
      if (!svg.empty()) write_file(svg, pipeline::timeline_svg(s, r));
      if (!trace.empty()) write_file(trace, pipeline::timeline_chrome_trace(s, r));
      return 0;
    }
    const auto cluster = plan::load_cluster(cluster_path);
    auto given = [](CLI::App* c, const char* name) { return c->get_option(name)->count() > 0; };
    auto require = [&](CLI::App* c, std::initializer_list<const char*> names) {
      for (const char* name : names) {
        if (!given(c, name))
          throw ConfigError(std::string(name) + " is required" +
                            (c == predict ? " (or --config with a triad-train config)" : ""));
      }
    };
    if (predict->parsed()) {
      plan::ParallelConfig c;
      nn::GptConfig model;
      if (!config_path.empty()) {
        if (given(predict, "--model"))
          throw ConfigError("--model and --config name the model twice: give one");
        const plan::PlannedRun run =
            plan::planned_run(train::load_config(config_path), given(predict, "--gpus") ? gpus : 0);
        if (!run.note.empty()) spdlog::warn("{}", run.note);
        model = run.model;
        c = run.layout;
        if (!given(predict, "--gpus")) gpus = run.gpus;
        if (!given(predict, "--global-batch")) global_batch = run.global_batch;
      } else {
        if (!write_config.empty())
          throw ConfigError(
              "--write-config writes a triad-train config with this layout: give that config "
              "(--config), not --model");
        require(predict, {"--model", "--gpus", "--global-batch", "--tp", "--pp", "--micro-batch"});
        model = plan::load_model_spec(model_path);
        c.overlap_dp = overlap;
        c.overlap_tp = overlap_tp;
        c.attention = plan::attention_from_name(attention);
      }
      // Options given here override the config's.
      if (given(predict, "--tp")) c.tp = tp;
      if (given(predict, "--pp")) c.pp = pp;
      if (given(predict, "--vpp")) c.vpp = vpp;
      if (given(predict, "--micro-batch")) c.micro_batch = micro;
      if (given(predict, "--recompute")) c.recompute = plan::recompute_from_name(recompute);
      if (given(predict, "--recompute-layers")) c.recompute_layers = recompute_layers;
      if (given(predict, "--sequence-parallel")) c.sequence_parallel = sp;
      if (given(predict, "--zero")) {
        if (zero != 0 && zero != 1)
          throw ConfigError("--zero (" + std::to_string(zero) + ") must be 0 or 1");
        c.zero1 = zero == 1;
      }
      if (given(predict, "--ep")) c.ep = ep;
      if (given(predict, "--cp")) c.cp = cp;
      if (given(predict, "--cp-comm"))
        c.cp_exchange = cp::exchange_from_string(cp_comm, "--cp-comm");
      if (given(predict, "--cp-a2a")) c.cp_a2a = cp_a2a;
      if (given(predict, "--overlap-dp")) c.overlap_dp = overlap;
      if (given(predict, "--overlap-tp")) c.overlap_tp = overlap_tp;
      if (given(predict, "--attention")) c.attention = plan::attention_from_name(attention);
      if (given(predict, "--optimizer")) c.muon = optimizer == "muon";
      if (given(predict, "--moment-precision")) c.bf16_moments = moment_precision == "bf16";
      if (given(predict, "--grad-precision")) c.bf16_grads = grad_precision == "bf16";
      if (given(predict, "--ema")) c.ema = ema;
      if (gpus % (c.tp * c.pp * c.cp) != 0) {
        throw ConfigError("GPUs (" + std::to_string(gpus) + ") must be divisible by tp*pp" +
                          (c.cp > 1 ? "*cp" : "") + " (" + std::to_string(c.tp * c.pp * c.cp) +
                          ")");
      }
      c.dp = gpus / (c.tp * c.pp * c.cp);
      if (!schedule_name.empty()) {
        c.schedule = pipeline::schedule_from_name(schedule_name);
        if (c.schedule == pipeline::ScheduleKind::ZbV && !given(predict, "--vpp")) c.vpp = 2;
      } else if (config_path.empty() || given(predict, "--vpp")) {
        c.schedule =
            c.vpp > 1 ? pipeline::ScheduleKind::Interleaved : pipeline::ScheduleKind::OneFOneB;
      }
      if (given(predict, "--stage-layers")) {
        c.stage_layers.clear();
        if (stage_layers == "auto") {
          c.stage_layers = pipeline::balanced_stage_layers(
              model, c.pp, c.vpp, c.recompute == plan::Recompute::Full, c.recompute_layers);
        } else {
          // Layer counts, or first=N and last=M (the others sharing the
          // rest evenly).
          const bool around = stage_layers.find('=') != std::string::npos;
          int64_t first = -1, last = -1;
          std::stringstream in(stage_layers);
          for (std::string item; std::getline(in, item, ',');) {
            try {
              const size_t eq = item.find('=');
              const std::string key = around ? item.substr(0, eq) : "";
              const std::string number = around ? item.substr(eq + 1) : item;
              if (around && (eq == std::string::npos || (key != "first" && key != "last")))
                throw std::invalid_argument(item);
              size_t used = 0;
              const int64_t n = std::stoll(number, &used);
              if (used != number.size() || (around && n < 0)) throw std::invalid_argument(item);
              if (!around) c.stage_layers.push_back(n);
              (key == "first" ? first : last) = n;
            } catch (const std::exception&) {
              throw ConfigError("--stage-layers ('" + stage_layers +
                                "'): expected auto, layer counts separated by commas, e.g. "
                                "3,4,4,1, or first=N and/or last=M, e.g. first=3,last=0");
            }
          }
          if (around) {
            c.stage_layers = pipeline::stage_layers_around(
                model.n_layer, static_cast<int64_t>(c.pp) * c.vpp, first, last);
          }
        }
      }
      const auto e = plan::estimate(model, cluster, gpus, global_batch, c);
      const std::vector<std::string> settings = plan::trainer_settings(e.config, global_batch);
      if (json) {
        std::printf("%s\n", json_with_settings(e, settings).dump().c_str());
      } else {
        print_with_settings(e, cluster, settings);
      }
      if (!write_config.empty())
        write_config_with(config_path, write_config, settings, "this layout's", gpus);
      return 0;
    }
    nn::GptConfig model;
    plan::SearchSpace space;
    if (!config_path.empty()) {
      if (given(rec, "--model"))
        throw ConfigError("--model and --config name the model twice: give one");
      const train::Config run = train::load_config(config_path);
      if (const std::string note = plan::planning_note(run); !note.empty())
        spdlog::warn("{}", note);
      model = run.model;
      space = plan::search_space(run);
      if (!given(rec, "--global-batch"))
        global_batch = static_cast<int>(run.train.global_batch_size);
      // A config of context parallelism (a long sequence) has its cp tried too.
      if (!given(rec, "--cps") && run.parallel.cp > 1) cps = "1," + std::to_string(run.parallel.cp);
      if (!given(rec, "--gpus")) {
        if (run.parallel.dp <= 0)
          throw ConfigError(
              "the config leaves parallel.dp to the world size: give the number "
              "of GPUs to plan for (--gpus)");
        gpus = run.parallel.tp * run.parallel.pp * run.parallel.cp * run.parallel.dp;
      }
    } else {
      if (!write_config.empty())
        throw ConfigError(
            "--write-config writes a triad-train config with the best layout: "
            "give that config (--config), not --model");
      require(rec, {"--model", "--gpus", "--global-batch"});
      model = plan::load_model_spec(model_path);
    }
    // Options given here override the config's.
    if (config_path.empty() || given(rec, "--overlap-dp")) space.overlap_dp = overlap;
    if (config_path.empty() || given(rec, "--overlap-tp")) space.overlap_tp = overlap_tp;
    if (config_path.empty() || given(rec, "--attention"))
      space.attention = plan::attention_from_name(attention);
    if (config_path.empty() || given(rec, "--optimizer")) {
      space.muon = optimizer == "muon";
      if (!space.muon) space.muon_ns_fp32 = false;
    }
    if (config_path.empty() || given(rec, "--moment-precision"))
      space.bf16_moments = moment_precision == "bf16";
    if (config_path.empty() || given(rec, "--grad-precision"))
      space.bf16_grads = grad_precision == "bf16";
    if (config_path.empty() || given(rec, "--ema")) space.ema = ema;
    space.try_balanced_stages = !even_stages;
    space.try_recompute_layers = !whole_recompute;
    space.try_zb_h1 = space.try_zb_auto = space.try_zb_v = false;
    bool interleaved = false;
    std::stringstream names(schedules);
    for (std::string name; std::getline(names, name, ',');) {
      if (name.empty()) continue;
      switch (pipeline::schedule_from_name(name)) {  // names the choices when unknown
        case pipeline::ScheduleKind::Interleaved:
          interleaved = true;
          break;
        case pipeline::ScheduleKind::ZbH1:
          space.try_zb_h1 = true;
          break;
        case pipeline::ScheduleKind::ZbAuto:
          space.try_zb_auto = true;
          break;
        case pipeline::ScheduleKind::ZbV:
          space.try_zb_v = true;
          break;
        case pipeline::ScheduleKind::GPipe:
          throw ConfigError(
              "--schedules: gpipe holds every microbatch's activations and is "
              "never the better choice; the search leaves it out");
        case pipeline::ScheduleKind::OneFOneB:
          break;  // always tried
      }
    }
    if (!interleaved) space.vpps = {1};
    space.cps.clear();
    std::stringstream sizes(cps);
    for (std::string item; std::getline(sizes, item, ',');) {
      try {
        size_t used = 0;
        const int n = std::stoi(item, &used);
        if (used != item.size() || n < 1) throw std::invalid_argument(item);
        space.cps.push_back(n);
      } catch (const std::exception&) {
        throw ConfigError("--cps ('" + cps +
                          "'): expected context-parallel sizes >= 1 separated by commas, e.g. "
                          "1,2,4");
      }
    }
    space.top = top;
    plan::SearchStats stats;
    const auto best = plan::recommend(model, cluster, gpus, global_batch, space, &stats);
    if (best.empty())
      throw ConfigError("no configuration of " + std::to_string(gpus) +
                        " GPUs fits this model in memory");
    const size_t n = best.size();
    // Each layout as triad-train's settings.
    std::vector<std::vector<std::string>> settings;
    for (const plan::Estimate& e : best)
      settings.push_back(plan::trainer_settings(e.config, global_batch));
    if (json) {
      nlohmann::json out = nlohmann::json::array();
      for (size_t i = 0; i < n; ++i) out.push_back(json_with_settings(best[i], settings[i]));
      std::printf("%s\n", out.dump().c_str());
    } else {
      // (The rest were ruled out by a bound: too slow to rank, or too large.)
      std::printf("%zu layouts, %zu priced in full (%zu of those fit); the best %zu:\n",
                  stats.layouts, stats.priced, stats.fit, n);
      for (size_t i = 0; i < n; ++i) {
        std::printf("%zu. ", i + 1);
        print_with_settings(best[i], cluster, settings[i]);
      }
    }
    if (!write_config.empty())
      write_config_with(config_path, write_config, settings[0], "the first layout's", gpus);
    return 0;
  });
}
