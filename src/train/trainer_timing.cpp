// Where the trainer's steps go: the device timer's phases, the Chrome trace
// and the profiler's window, the pipeline's bubble, each rank's timings at
// a log interval, and the planner's prediction beside the measured step.

#include "triad/train/trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <numeric>

#include "train/captured_step.h"
#include "triad/core/nvtx.h"
#include "triad/ops/creation.h"
#include "triad/plan/from_config.h"

namespace triad::train {

namespace {

// What each rank gives of a log.interval summary, ms per step unless named.
enum TimingColumn : int {
  kForward,
  kBackward,
  kWeightGrad,
  kP2p,
  kDp,
  kOptimizer,
  kCompute,    // forward + backward + weight-grad + optimizer
  kStage,      // the rank's pipeline stage (its ranks do the same work)
  kPeakBytes,  // the rank's peak memory over the summary's steps
  kTimingColumns
};
// The timed categories, in column order (the step timer's names).
constexpr const char* kTimedCategories[] = {"forward", "backward", "weight-grad",
                                            "p2p",     "dp",       "optimizer"};
// Ranks up to which the console shows every rank's timing line.
constexpr int kTimingRankLines = 8;

}  // namespace

void Trainer::enter_profile_window(int64_t index) {
  const int64_t n = index + 1, first = config_.log_profile_first, last = config_.log_profile_last;
  const bool inside = first == 0 || (n >= first && n <= last);
  nvtx::set_enabled(config_.log_nvtx && profiling_rank_ && inside);
  if (first == 0 || !profiling_rank_ || !device_.is_cuda()) return;
  if (inside && !profiler_started_) {
    cuda::profiler_start();
    profiler_started_ = true;
    spdlog::info("profiling steps {} to {}: CUDA profiler started", n, last);
  } else if (!inside && profiler_started_) {
    leave_profile_window();
  }
}

void Trainer::leave_profile_window() {
  if (config_.log_nvtx) nvtx::set_enabled(false);
  if (!profiler_started_) return;
  profiler_started_ = false;
  cuda::synchronize(device_.index);  // (the window's kernels done before it closes)
  cuda::profiler_stop();
  spdlog::info("CUDA profiler stopped");
}

void Trainer::trace_steps_from(int64_t first) {
  if (config_.log_trace_first < 0) {
    trace_from_ = trace_to_ = 0;  // (none)
  } else if (config_.log_trace_first > 0) {
    trace_from_ = config_.log_trace_first - 1;
    trace_to_ = config_.log_trace_last;
  } else {
    trace_from_ = first;
    trace_to_ = first + kTracedSteps;
  }
}

void Trainer::trace_host(const std::string& name, const std::string& category,
                         TraceRecorder::Clock::time_point start,
                         TraceRecorder::Clock::time_point end) {
  if (device_.is_cuda() && step_timer().tracing()) trace_.add(name, category, start, end, 1);
}

void Trainer::trace_phase(const std::string& name, const std::string& category,
                          TraceRecorder::Clock::time_point start,
                          TraceRecorder::Clock::time_point end) {
  if (step_timer().tracing()) trace_.add(name, category, start, end, device_.is_cuda() ? 1 : 0);
}

DeviceTimer& Trainer::step_timer() {
  if (!step_timer_) step_timer_ = std::make_unique<DeviceTimer>(device_);
  return *step_timer_;
}

std::map<std::string, double> Trainer::read_step_timer(bool wait_for_trace) {
  DeviceTimer& timer = step_timer();
  std::map<std::string, double> read = timer.read();
  for (const auto& [category, seconds] : read) timing_[category] += seconds;
  for (const DeviceTimer::Traced& t : timer.take_traced(wait_for_trace))
    trace_.add(t.name, t.category, t.start, t.end);
  return read;
}

void Trainer::log_plan(bool lead) {
  // Every rank reads the cluster file, so that a bad one stops them all
  // alike; the lead prices the run on it.
  const plan::ClusterSpec cluster = plan::load_cluster(config_.log_plan_cluster);
  if (!lead) return;
  try {
    const plan::PlannedRun run = plan::planned_run(config_, world_ ? world_->size() : 1);
    const plan::Estimate e =
        plan::estimate(run.model, cluster, run.gpus, run.global_batch, run.layout);
    spdlog::info(
        "plan ({} on {}): {:.1f} ms a step, {:.0f} tokens/s, {:.1f} TFLOP/s per GPU, MFU {:.1f}%, "
        "bubble {:.1f}%, {:.2f} GB per GPU (weights {:.2f}, gradients {:.2f}, optimizer {:.2f}, "
        "activations {:.2f}){}",
        cluster.name, config_.log_plan_cluster, 1e3 * e.step_time, e.tokens_per_s, e.tflops_per_gpu,
        100 * e.mfu, 100 * e.bubble_fraction, e.memory_bytes / 1e9, e.weights_bytes / 1e9,
        e.gradient_bytes / 1e9, e.optimizer_bytes / 1e9, e.activation_bytes / 1e9,
        e.fits ? "" : " (does NOT fit)");
    if (!run.note.empty()) spdlog::info("  plan: {}", run.note);
    if (!device_.is_cuda())
      spdlog::info("  plan: this run is on the CPU, the plan on {}'s {}", cluster.name,
                   cluster.gpu_name);
    planned_step_s_ = e.step_time;
    planned_memory_bytes_ = e.memory_bytes;
    planned_passes_s_ = e.num_microbatches * e.compute_time;
    planned_dp_s_ = e.dp_comm_time;
    planned_optimizer_s_ = e.optimizer_time;
    planned_bubble_ = config_.parallel.pp > 1 ? e.bubble_fraction : -1;
    const std::string path = config_.output_dir + "/plan.json";
    std::ofstream out(path, std::ios::trunc);
    out << e.json() << "\n";
    out.flush();
    if (!out) throw IoError("output.dir: cannot write '" + path + "'");
  } catch (const ConfigError& e) {
    spdlog::warn("log.plan_cluster: the planner cannot price this run: {}", e.what());
  }
}

void Trainer::log_plan_against(const std::vector<StepMetrics>& steps) const {
  if (planned_step_s_ <= 0 || steps.size() < 2) return;
  double ms = 0;
  int64_t peak = 0;
  int64_t trained = 0;  // (train.skip_steps' steps take no time)
  for (size_t i = 1; i < steps.size(); ++i) {
    if (steps[i].passed_over) continue;
    ms += steps[i].step_ms;
    ++trained;
  }
  if (trained == 0) return;
  for (const StepMetrics& m : steps) peak = std::max(peak, m.peak_memory_bytes);
  ms /= static_cast<double>(trained);
  spdlog::info(
      "plan against the run: {:.1f} ms a step planned, {:.1f} measured (the mean after the "
      "first step, {:.2f}x the plan); {:.2f} GB per GPU planned, {:.2f} measured at the peak",
      1e3 * planned_step_s_, ms, ms / (1e3 * planned_step_s_), planned_memory_bytes_ / 1e9,
      static_cast<double>(peak) / 1e9);
  // By phase, from the log.interval summaries after the first step (or,
  // with none, the one with it).
  std::vector<TimingSummary> used;
  for (const TimingSummary& s : timing_summaries_)
    if (!s.with_first_step) used.push_back(s);
  const bool with_first = used.empty();
  if (with_first) used = timing_summaries_;
  if (used.empty()) return;
  TimingSummary mean;
  for (const TimingSummary& s : used) {
    mean.passes_ms += s.passes_ms / static_cast<double>(used.size());
    mean.dp_ms += s.dp_ms / static_cast<double>(used.size());
    mean.optimizer_ms += s.optimizer_ms / static_cast<double>(used.size());
  }
  std::string bubble;
  if (planned_bubble_ >= 0) {
    double sum = 0;
    int64_t n = 0;
    for (size_t i = 1; i < steps.size(); ++i) {
      if (steps[i].passed_over || steps[i].bubble_fraction < 0) continue;
      sum += steps[i].bubble_fraction;
      ++n;
    }
    if (n > 0)
      bubble = fmt::format(" | bubble {:.1f}% planned, {:.1f}% measured", 100 * planned_bubble_,
                           100 * sum / static_cast<double>(n));
  }
  spdlog::info(
      "plan against the run by phase, ms a step (measured: the slowest rank's{}): passes {:.1f} "
      "planned, {:.1f} measured ({:.2f}x) | dp wait {:.1f} planned, {:.1f} measured | optimizer "
      "{:.1f} planned, {:.1f} measured{}",
      with_first ? ", with the first step's one-time costs" : "", 1e3 * planned_passes_s_,
      mean.passes_ms, mean.passes_ms / (1e3 * planned_passes_s_), 1e3 * planned_dp_s_, mean.dp_ms,
      1e3 * planned_optimizer_s_, mean.optimizer_ms, bubble);
}

double Trainer::pipeline_bubble(const std::map<std::string, double>& read) const {
  // (A captured step's passes and waits are one replay, not timed apart.)
  if (!pp_model_ || captured_) return -1;
  auto seconds = [&](const char* category) {
    const auto it = read.find(category);
    return it == read.end() ? 0.0 : it->second;
  };
  // The step takes at least the busiest rank's passes.
  Tensor busiest = from_vector(
      std::vector<double>{seconds("forward") + seconds("backward") + seconds("weight-grad")}, {1},
      DType::F64);
  mesh_->pp()->all_reduce(busiest, dist::ReduceOp::Max)->wait();
  const double passes = item(busiest);
  return passes > 0 ? std::max(0.0, seconds("pipeline") - passes) / passes : -1;
}

std::vector<double> Trainer::rank_timing_into(StepMetrics& m, int64_t steps) {
  // (The last step's optimizer is still unread: reading it waits for it,
  // once per summary.)
  read_step_timer();
  std::vector<double> mine(kTimingColumns);
  for (int c = kForward; c <= kOptimizer; ++c) {
    mine[c] = 1e3 * timing_[kTimedCategories[c]] / static_cast<double>(std::max<int64_t>(steps, 1));
  }
  mine[kCompute] = mine[kForward] + mine[kBackward] + mine[kWeightGrad] + mine[kOptimizer];
  mine[kStage] = mesh_ && mesh_->pp() ? mesh_->pp()->rank() : 0;
  mine[kPeakBytes] = static_cast<double>(interval_peak_bytes_);
  timing_.clear();
  interval_peak_bytes_ = 0;
  const int ranks = world_ ? world_->size() : 1;
  Tensor local = from_vector(mine, {kTimingColumns}, DType::F64),
         all = empty({static_cast<int64_t>(kTimingColumns) * ranks}, DType::F64);
  if (world_ && ranks > 1) {
    world_->all_gather(local, all)->wait();
  } else {
    all = local;
  }
  const std::vector<double> rows = to_double_vector(all);
  auto column = [&](int c) {
    std::vector<double> out;
    for (int r = 0; r < ranks; ++r)
      out.push_back(rows[static_cast<size_t>(r * kTimingColumns + c)]);
    return out;
  };
  m.rank_timing.clear();
  for (int c = kForward; c <= kCompute; ++c) {
    const std::vector<double> ms = column(c);
    const auto slowest = std::max_element(ms.begin(), ms.end());
    m.rank_timing.push_back({c == kCompute ? "compute" : kTimedCategories[c],
                             *std::min_element(ms.begin(), ms.end()),
                             std::accumulate(ms.begin(), ms.end(), 0.0) / ranks, *slowest,
                             static_cast<int>(slowest - ms.begin())});
  }
  if (config_.log_straggler_factor > 0) {
    std::vector<int> stage;
    for (double s : column(kStage)) stage.push_back(static_cast<int>(s));
    m.stragglers = find_stragglers(column(kCompute), stage, config_.log_straggler_factor);
  }
  const std::vector<double> bytes = column(kPeakBytes);
  const auto largest = std::max_element(bytes.begin(), bytes.end());
  m.rank_peak_memory = StepMetrics::RankMemory{
      static_cast<int64_t>(*std::min_element(bytes.begin(), bytes.end())),
      static_cast<int64_t>(std::accumulate(bytes.begin(), bytes.end(), 0.0) / ranks),
      static_cast<int64_t>(*largest), static_cast<int>(largest - bytes.begin())};
  // For the plan against the run: the busiest rank's passes.
  TimingSummary summary{timing_summaries_.empty(), 0, m.rank_timing[kDp].max_ms,
                        m.rank_timing[kOptimizer].max_ms};
  for (int r = 0; r < ranks; ++r) {
    const double* row = &rows[static_cast<size_t>(r * kTimingColumns)];
    summary.passes_ms =
        std::max(summary.passes_ms, row[kForward] + row[kBackward] + row[kWeightGrad]);
  }
  timing_summaries_.push_back(summary);
  return rows;
}

void Trainer::print_rank_timing(const StepMetrics& m, const std::vector<double>& rows) const {
  if (!is_logging_rank() || m.rank_timing.empty()) return;
  for (const StepMetrics::Straggler& s : m.stragglers) {
    spdlog::warn(
        "step {}: rank {} (node {}) is a straggler: {:.1f} ms of compute a step, {:.2f}x the "
        "median of the {} ranks of pipeline stage {} ({:.1f} ms; log.straggler_factor {})",
        m.step, s.rank, mesh_ ? mesh_->node().node_of_rank.at(static_cast<size_t>(s.rank)) : 0,
        s.compute_ms, s.compute_ms / s.median_ms, s.peers, s.stage, s.median_ms,
        config_.log_straggler_factor);
  }
  const int ranks = static_cast<int>(rows.size() / kTimingColumns);
  if (ranks <= kTimingRankLines) {
    for (int r = 0; r < ranks; ++r) {
      const double* row = &rows[static_cast<size_t>(r * kTimingColumns)];
      spdlog::info(
          "  rank {:>3} ms/step: forward {:.1f} | backward {:.1f} | weight-grad {:.1f} | p2p wait "
          "{:.1f} | dp reduce {:.1f} | optimizer {:.1f} | peak {:.3g} GB",
          r, row[kForward], row[kBackward], row[kWeightGrad], row[kP2p], row[kDp], row[kOptimizer],
          row[kPeakBytes] / 1e9);
    }
    return;
  }
  // More ranks than lines worth reading: the spread, and who is slowest.
  spdlog::info("  {}", rank_timing_summary(m.rank_timing, ranks));
  if (const auto& p = m.rank_peak_memory) {
    spdlog::info(
        "  peak memory over {} ranks, min/mean/max (largest): {:.3g}/{:.3g}/{:.3g} GB (rank {})",
        ranks, p->min_bytes / 1e9, p->mean_bytes / 1e9, p->max_bytes / 1e9, p->largest_rank);
  }
}

void Trainer::align_trace_clock() {
  if (!world_ || world_->size() == 1) return;
  using std::chrono::nanoseconds;
  barrier();
  const int64_t now =
      std::chrono::duration_cast<nanoseconds>(TraceRecorder::Clock::now().time_since_epoch())
          .count();
  Tensor mine = from_vector(std::vector<int64_t>{now}, {1});
  Tensor all = empty({world_->size()}, DType::I64);
  world_->all_gather(mine, all)->wait();
  const std::vector<int>& node_of = mesh_->node().node_of_rank;
  int first = world_->rank();  // this node's first rank
  if (node_of.size() == static_cast<size_t>(world_->size())) {
    first = static_cast<int>(
        std::find(node_of.begin(), node_of.end(), node_of[static_cast<size_t>(world_->rank())]) -
        node_of.begin());
  }
  trace_.set_epoch(
      TraceRecorder::Clock::time_point(std::chrono::duration_cast<TraceRecorder::Clock::duration>(
          nanoseconds(all.data<int64_t>()[first]))));
}

}  // namespace triad::train
