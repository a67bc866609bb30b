// Every schedule on real stages, against one process accumulating the same
// microbatches: loss and every parameter gradient after one step, then ten
// steps of losses, for p = world size (CTest: 2 and 4 ranks), v in {1, 2}
// (ZB-V's two chunks in a V, with a tied and an untied head),
// m in {p, 2p, p + 1 where allowed}. fp32; loss within 1e-6 relative,
// gradients within 1e-6 + 1e-4 relative, ten-step losses within 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "support/forwarding_group.h"
#include "support/mpi_main.h"
#include "triad/autograd/engine.h"
#include "triad/backend/device_timer.h"
#include "triad/core/allocator.h"
#include "triad/core/rng.h"
#include "triad/dist/mesh.h"
#include "triad/ops.h"
#include "triad/optim/adamw.h"
#include "triad/optim/clip.h"
#include "triad/parallel/pipeline/executor.h"
#include "triad/parallel/pipeline/simulator.h"
#include "triad/parallel/pipeline/zero_bubble.h"

namespace triad::pipeline {
namespace {

dist::ProcessGroupPtr g_world;
std::unique_ptr<dist::DeviceMesh> g_mesh;

nn::GptConfig tiny() {
  return {.n_layer = 8, .n_head = 2, .d_model = 16, .vocab_size = 50, .seq_len = 8};
}

std::vector<data::Batch> batches(int m, uint64_t salt) {
  std::vector<data::Batch> out;
  for (int mb = 0; mb < m; ++mb) {
    std::vector<int64_t> in(2 * 8), tg(2 * 8);
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = static_cast<int64_t>(philox_uniform(3, salt * 1000 + mb, i) * 50) % 50;
      tg[i] = static_cast<int64_t>(philox_uniform(4, salt * 1000 + mb, i) * 50) % 50;
    }
    out.push_back({from_vector(in, {2, 8}), from_vector(tg, {2, 8})});
  }
  return out;
}

PipelineGroups groups() {
  return {g_mesh->tp(), g_mesh->pp(), g_mesh->embedding()};
}

struct Case {
  ScheduleKind kind;
  int v, m;
  bool untied = false;  // an lm_head of its own
};

nn::GptConfig config(const Case& c) {
  nn::GptConfig cfg = tiny();
  cfg.tie_embeddings = !c.untied;
  return cfg;
}

std::vector<Case> cases(int p) {
  std::vector<Case> c;
  for (ScheduleKind k :
       {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZbH1, ScheduleKind::ZbAuto}) {
    for (int m : {p, 2 * p, p + 1}) c.push_back({k, 1, m});
  }
  for (int m : {p, 2 * p, p + 1}) c.push_back({ScheduleKind::Interleaved, 2, m});
  for (int m : {p, 2 * p, p + 1}) c.push_back({ScheduleKind::ZbV, 2, m});
  c.push_back({ScheduleKind::ZbV, 2, 2 * p, true});
  return c;
}

std::string name(const Case& c) {
  return std::string(schedule_name(c.kind)) + " v=" + std::to_string(c.v) +
         " m=" + std::to_string(c.m) + (c.untied ? " untied" : "");
}

PipelineModel model_for(const Case& c, uint64_t seed) {
  return PipelineModel(config(c), seed, groups(), false, c.v, {}, placement_of(c.kind));
}

TEST(Pipeline, OneStepEqualsGradientAccumulationForEverySchedule) {
  const int p = g_world->size();
  for (const Case& c : cases(p)) {
    nn::Gpt ref(config(c), 21);
    PipelineModel model = model_for(c, 21);
    PipelineExecutor exec(model, make_schedule(c.kind, p, c.m, c.v));
    DeviceTimer timer(Device::cpu());
    timer.set_tracing(true);
    exec.set_timer(&timer);
    exec.set_chunk_timing(true);
    auto data = batches(c.m, 1);
    PipelineStepResult res = exec.run(data, {});
    const std::map<std::string, double> timed = timer.read();
    double ref_loss = 0;
    for (const auto& b : data) {
      Tensor l = ref.loss(b.inputs, b.targets);
      ref_loss += item(l) / c.m;
      autograd::backward({scale(l, 1.0 / c.m)});
    }
    EXPECT_NEAR(res.loss, ref_loss, 1e-6 * ref_loss) << name(c);
    const auto want = ref.state_dict();
    int checked = 0;
    for (auto& [pname, t] : model.named_parameters()) {
      auto a = to_double_vector(t.grad()), b = to_double_vector(want.at(pname).grad());
      // The token embedding is padded to a multiple of 128 rows: padding gets no gradient.
      ASSERT_GE(a.size(), b.size()) << pname;
      for (size_t i = b.size(); i < a.size(); ++i) ASSERT_EQ(a[i], 0.0) << pname << " padding";
      for (size_t i = 0; i < b.size(); ++i) {
        ASSERT_NEAR(a[i], b[i], 1e-6 + 1e-4 * std::abs(b[i]))
            << name(c) << " " << pname << "[" << i << "]";
      }
      ++checked;
    }
    EXPECT_GT(checked, 0);
    // Live stage outputs never exceed what the schedule promises.
    auto sim = simulate(exec.schedule(), Costs{});
    EXPECT_LE(res.peak_live_outputs, sim.peak_alive[g_world->rank()]) << name(c);
    // Every compute action is timed under its kind.
    const bool split = exec.schedule().split_backward;
    EXPECT_EQ(res.forwards, c.m * c.v) << name(c);
    EXPECT_EQ(res.backwards, c.m * c.v) << name(c);
    EXPECT_EQ(res.weight_passes, split ? c.m * c.v : 0) << name(c);
    EXPECT_GT(res.forward_seconds, 0.0) << name(c);
    EXPECT_GT(res.backward_seconds, 0.0) << name(c);
    EXPECT_EQ(res.weight_seconds > 0.0, split) << name(c);
    EXPECT_NEAR(res.forward_seconds + res.backward_seconds + res.weight_seconds,
                res.compute_seconds, 1e-9 * res.compute_seconds)
        << name(c);
    // The timer has the same passes by kind and, with chunk timing, by
    // chunk (what zb-auto prices its stages by), and traces each by name.
    for (const auto kind :
         {ComputeKind::Forward, ComputeKind::Backward, ComputeKind::BackwardWeight}) {
      const std::string whole =
          chunk_category(kind, 0).substr(0, chunk_category(kind, 0).size() - 3);
      double by_chunk = 0;
      for (int k = 0; k < c.v; ++k) {
        const auto it = timed.find(chunk_category(kind, k));
        const bool ran = kind != ComputeKind::BackwardWeight || split;
        ASSERT_EQ(it != timed.end(), ran) << name(c) << " " << chunk_category(kind, k);
        if (ran) {
          EXPECT_GT(it->second, 0.0) << name(c) << " " << it->first;
          by_chunk += it->second;
        }
      }
      EXPECT_NEAR(by_chunk, timed.count(whole) ? timed.at(whole) : 0.0, 1e-9)
          << name(c) << " " << whole;
    }
    // A wait for a payload is traced by the pass it was waited for ("wait
    // F3" before F3); every rank past the first waits for its first forward.
    int traced_passes = 0;
    std::vector<std::string> waited_for;
    std::set<std::string> passes;
    for (const DeviceTimer::Traced& t : timer.take_traced()) {
      if (t.category != "p2p") {
        ++traced_passes;
        passes.insert(t.name);
        continue;
      }
      if (t.name.rfind("wait ", 0) == 0) {
        waited_for.push_back(t.name.substr(5));
        EXPECT_EQ(passes.count(t.name.substr(5)), 0u) << name(c) << ": " << t.name << " after it";
      }
    }
    EXPECT_EQ(traced_passes, res.forwards + res.backwards + res.weight_passes) << name(c);
    for (const std::string& pass : waited_for)
      EXPECT_EQ(passes.count(pass), 1u) << name(c) << ": waited for " << pass << ", never run";
    if (g_world->rank() > 0) {
      const std::string first = c.v > 1 ? "F0 c0" : "F0";
      EXPECT_NE(std::find(waited_for.begin(), waited_for.end(), first), waited_for.end())
          << name(c) << " rank " << g_world->rank();
    }
  }
}

// The step's loss sum is on every rank of the pipeline, still on the
// device, whether or not the executor reads it; unread, `loss` is NaN (a
// trainer reads the sum with the gradient norm's square, which
// grad_norm_squared leaves on the device the same way).
TEST(Pipeline, TheLossSumReachesEveryRankAndIsReadOnlyWhenAsked) {
  const int p = g_world->size();
  for (const bool read : {true, false}) {
    const Case c{ScheduleKind::OneFOneB, 1, p + 1};
    PipelineModel model = model_for(c, 23);
    PipelineExecutor exec(model, make_schedule(c.kind, p, c.m, c.v));
    exec.set_read_loss(read);
    const auto data = batches(c.m, 3);
    const PipelineStepResult res = exec.run(data, {});
    ASSERT_TRUE(res.loss_sum.defined());
    EXPECT_EQ(res.loss_sum.numel(), 1);
    EXPECT_EQ(res.loss_sum.dtype(), DType::F64);
    const double sum = item(res.loss_sum);
    // The same sum on every rank: the first rank's, broadcast, compared.
    Tensor first = from_vector(std::vector<double>{sum}, {1}, DType::F64);
    g_world->broadcast(first, 0)->wait();
    EXPECT_EQ(sum, item(first)) << "rank " << g_world->rank();
    nn::Gpt ref(config(c), 23);
    double ref_sum = 0;
    for (const auto& b : data) ref_sum += item(ref.loss(b.inputs, b.targets));
    EXPECT_NEAR(sum, ref_sum, 1e-6 * ref_sum);
    if (read) {
      EXPECT_EQ(res.loss, sum / c.m);
    } else {
      EXPECT_TRUE(std::isnan(res.loss)) << res.loss;
    }
    const Tensor squares = model.grad_norm_squared();
    EXPECT_EQ(squares.numel(), 1);
    EXPECT_GT(item(squares), 0.0);
    EXPECT_DOUBLE_EQ(std::sqrt(item(squares)), model.grad_norm());
  }
}

// A captured step's loss weights (train.cuda_graph under loss_average
// tokens) come from device scalars refilled before each replay: run with
// them, and with the batches' own weights unset, the step is the one the
// batches' host weights give, loss sum and every gradient to the bit, under
// a plain and a split-backward schedule. Seeds or factors that do not
// match the micro-batches are refused by name.
TEST(Pipeline, DeviceLossWeightsStepAsTheBatchesOwnWeights) {
  const int p = g_world->size();
  for (const ScheduleKind kind : {ScheduleKind::OneFOneB, ScheduleKind::ZbH1}) {
    const Case c{kind, 1, p + 1};
    const double loss_scale = 4.0;
    auto weighted = batches(c.m, 5);
    PipelineExecutor::DeviceLossWeights weights;
    for (int mb = 0; mb < c.m; ++mb) {
      // Unequal shares of the step's targets, as per-token averaging gives.
      const double w = (1.0 + mb) / (c.m * (c.m + 1) / 2.0);
      weighted[static_cast<size_t>(mb)].loss_weight = w;
      weights.seeds.push_back(full({}, loss_scale * w, DType::F32));
      weights.factors.push_back(full({}, w * c.m, DType::F64));
    }
    auto unweighted = weighted;
    for (auto& b : unweighted) b.loss_weight = -1;  // (read from the device scalars instead)
    PipelineModel host_model = model_for(c, 29), device_model = model_for(c, 29);
    PipelineExecutor host(host_model, make_schedule(kind, p, c.m, c.v));
    PipelineExecutor device(device_model, make_schedule(kind, p, c.m, c.v));
    const PipelineStepResult want = host.run(weighted, {}, loss_scale);
    const PipelineStepResult got = device.run(unweighted, {}, loss_scale, &weights);
    EXPECT_EQ(item(got.loss_sum), item(want.loss_sum)) << name(c);
    const auto params = device_model.named_parameters();
    const auto host_params = host_model.named_parameters();
    ASSERT_EQ(params.size(), host_params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_EQ(to_double_vector(params[i].second.grad()),
                to_double_vector(host_params[i].second.grad()))
          << name(c) << " " << params[i].first;
    }
    PipelineExecutor::DeviceLossWeights short_by_one = weights;
    short_by_one.factors.pop_back();
    try {
      device.run(unweighted, {}, loss_scale, &short_by_one);
      ADD_FAILURE() << "too few factors were taken";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("factors of the loss weights"), std::string::npos)
          << e.what();
    }
  }
}

// Scatter-gather: under tp 2 without sequence parallelism each TP rank
// sends its half of every activation and gradient and the next stage
// all-gathers the halves: the same step as sending whole payloads, bit for
// bit, for half the bytes (1F1B, ZB-H1 and evaluation).
TEST(Pipeline, ScatterGatherSendsEachTpRanksShareAndChangesNothing) {
  const int w = g_world->size();
  if (w < 4) GTEST_SKIP() << "needs tp 2 x pp 2";
  const dist::DeviceMesh mesh(g_world, dist::MeshShape{2, w / 2, 1});
  const PipelineGroups g{mesh.tp(), mesh.pp(), mesh.embedding()};
  const int p = w / 2;
  struct Run {
    PipelineStepResult res;
    std::vector<std::vector<double>> grads;
    double eval = 0;
  };
  for (ScheduleKind kind : {ScheduleKind::OneFOneB, ScheduleKind::ZbH1}) {
    auto run = [&](bool scatter_gather) {
      PipelineModel model(tiny(), 21, g, false, 1, {}, placement_of(kind));
      PipelineExecutor exec(model, make_schedule(kind, p, 2 * p, 1));
      exec.set_scatter_gather(scatter_gather);
      Run r;
      r.res = exec.run(batches(2 * p, 3), {});
      for (auto& [n, t] : model.named_parameters()) r.grads.push_back(to_double_vector(t.grad()));
      r.eval = exec.evaluate(batches(3, 4));
      return r;
    };
    const Run on = run(true), off = run(false);
    EXPECT_EQ(on.res.loss, off.res.loss) << schedule_name(kind);
    EXPECT_EQ(on.grads, off.grads) << schedule_name(kind);
    EXPECT_EQ(on.eval, off.eval) << schedule_name(kind);
    EXPECT_GT(off.res.p2p_bytes_sent, 0) << schedule_name(kind);
    EXPECT_EQ(2 * on.res.p2p_bytes_sent, off.res.p2p_bytes_sent) << schedule_name(kind);
  }
}

// A pipeline group that numbers its batches and logs each one's posting
// (receive-only or not) and first wait.
class LoggedBatches final : public testing::ForwardingGroup {
 public:
  LoggedBatches(dist::ProcessGroupPtr inner, std::vector<std::string>* log)
      : ForwardingGroup(std::move(inner)), log_(log) {}
  dist::WorkPtr batch_isend_irecv(const std::vector<dist::P2POp>& ops) override {
    const bool receive_only =
        std::none_of(ops.begin(), ops.end(), [](const dist::P2POp& o) { return o.is_send; });
    const std::string id = std::to_string(next_++);
    log_->push_back((receive_only ? "receive " : "post ") + id);
    struct Logged final : dist::Work {
      dist::WorkPtr inner;
      std::vector<std::string>* log = nullptr;
      std::string id;
      bool logged = false;
      void wait() override {
        if (!logged) log->push_back("wait " + id);
        logged = true;
        inner->wait();
      }
      void wait_for(std::chrono::milliseconds t) override { inner->wait_for(t); }
      bool is_completed() override { return inner->is_completed(); }
    };
    auto w = std::make_shared<Logged>();
    w->inner = ForwardingGroup::batch_isend_irecv(ops), w->log = log_, w->id = id;
    return w;
  }

 private:
  std::vector<std::string>* log_;
  int next_ = 0;
};

// A batch that only receives is waited for by the action consuming its
// payload, not where it was posted: ZB-H1's order posts some receives
// before other work, which now runs before the wait (some rank logs a
// compute action between a receive's posting and its wait). The gradients
// stay those of 1F1B.
TEST(Pipeline, AReceiveIsWaitedForWhereItsPayloadIsNeeded) {
  const int p = g_world->size();
  std::vector<std::string> log;
  const PipelineGroups g{g_mesh->tp(), std::make_shared<LoggedBatches>(g_mesh->pp(), &log),
                         g_mesh->embedding()};
  PipelineModel model(tiny(), 21, g, false, 1, {}, placement_of(ScheduleKind::ZbH1));
  PipelineExecutor exec(model, make_schedule(ScheduleKind::ZbH1, p, 4 * p, 1));
  exec.set_event_sink([&](const std::string& name, const std::string& category,
                          PipelineExecutor::Clock::time_point,
                          PipelineExecutor::Clock::time_point) {
    if (category != "p2p") log.push_back("compute " + name);
  });
  exec.run(batches(4 * p, 5), {});
  double overlapped = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i].rfind("receive ", 0) != 0) continue;
    const std::string wait = "wait " + log[i].substr(8);
    for (size_t j = i + 1; j < log.size() && log[j] != wait; ++j) {
      if (log[j].rfind("compute ", 0) == 0) {
        ++overlapped;
        break;
      }
    }
  }
  Tensor t = from_vector(std::vector<double>{overlapped}, {1}, DType::F64);
  g_world->all_reduce(t, dist::ReduceOp::Sum)->wait();
  EXPECT_GT(item(t), 0.0);
  // The same gradients as 1F1B's (the order of the sums differs by none).
  PipelineModel ref(tiny(), 21, groups(), false, 1, {}, placement_of(ScheduleKind::OneFOneB));
  PipelineExecutor(ref, make_schedule(ScheduleKind::OneFOneB, p, 4 * p, 1))
      .run(batches(4 * p, 5), {});
  const auto want = ref.named_parameters();
  const auto got = model.named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const auto a = to_double_vector(got[i].second.grad()),
               b = to_double_vector(want[i].second.grad());
    ASSERT_EQ(a.size(), b.size()) << got[i].first;
    for (size_t e = 0; e < a.size(); ++e)
      ASSERT_NEAR(a[e], b[e], 1e-6 + 1e-5 * std::abs(b[e])) << got[i].first << "[" << e << "]";
  }
}

TEST(Pipeline, TenStepsGiveTheSameLossesAsOneProcess) {
  const int p = g_world->size();
  for (const Case& c :
       {Case{ScheduleKind::OneFOneB, 1, 2 * p}, Case{ScheduleKind::Interleaved, 2, p},
        Case{ScheduleKind::ZbH1, 1, p + 1}, Case{ScheduleKind::ZbV, 2, p + 1}}) {
    nn::Gpt ref(config(c), 22);
    PipelineModel model = model_for(c, 22);
    PipelineExecutor exec(model, make_schedule(c.kind, p, c.m, c.v));
    optim::AdamWOptions o;
    o.lr = 3e-3;
    optim::AdamW ref_opt(ref.named_parameters(), o), opt(model.named_parameters(), o);
    for (int step = 0; step < 10; ++step) {
      auto data = batches(c.m, 100 + step);
      const double got = exec.run(data, {}).loss;
      const double norm = model.clip_grad_norm(1.0);
      double want = 0;
      for (const auto& b : data) {
        Tensor l = ref.loss(b.inputs, b.targets);
        want += item(l) / c.m;
        autograd::backward({scale(l, 1.0 / c.m)});
      }
      const double ref_norm = optim::clip_grad_norm(ref.parameters(), 1.0);
      ASSERT_NEAR(got, want, 1e-5 * want) << name(c) << " step " << step;
      ASSERT_NEAR(norm, ref_norm, 1e-4 * ref_norm) << name(c) << " step " << step;
      opt.step(o.lr);
      ref_opt.step(o.lr);
      model.zero_grad();
      ref.zero_grad();
    }
    // The gathered model equals the single-process one. Adam normalises
    // each update, so parameters whose gradients are tiny move by up to lr
    // on float noise: 1e-4 after ten steps of lr 3e-3.
    auto full = model.full_state_dict();
    for (auto& [pname, t] : ref.state_dict()) {
      auto a = to_double_vector(full.at(pname)), b = to_double_vector(t);
      for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4) << pname;
    }
  }
}

// For saving: pipeline rank 0 alone receives the whole model, as host
// tensors equal to what every rank's full_state_dict gathers (the loop and
// the V placement, a tied head on the last stage or on rank 0 itself);
// the others, and every rank of a pipeline that is not wanted, get nothing.
TEST(Pipeline, TheSavedModelIsGatheredOnTheFirstRankOnly) {
  const int p = g_world->size();
  for (const Case& c : {Case{ScheduleKind::OneFOneB, 1, p}, Case{ScheduleKind::ZbV, 2, p}}) {
    const PipelineModel model = model_for(c, 23);
    const nn::StateDict every = model.full_state_dict();
    const nn::StateDict first = model.gather_state_dict(true, true);
    if (g_mesh->pp()->rank() == 0) {
      ASSERT_EQ(first.size(), every.size()) << name(c);
      for (const auto& [pname, t] : every) {
        ASSERT_TRUE(first.count(pname)) << name(c) << " " << pname;
        EXPECT_TRUE(first.at(pname).device().is_cpu()) << pname;
        EXPECT_EQ(to_double_vector(first.at(pname)), to_double_vector(t))
            << name(c) << " " << pname;
      }
    } else {
      EXPECT_TRUE(first.empty()) << name(c);
    }
    EXPECT_TRUE(model.gather_state_dict(true, false).empty()) << name(c);
    EXPECT_TRUE(model.gather_state_dict(false, false).empty()) << name(c);
    // What the trainer's writer is given: one tensor at a time, in
    // gather_order(), the host holding one (or two) beyond what it held.
    std::vector<std::string> order;
    int64_t largest = 0;
    Allocator& host = cpu_allocator();
    const int64_t before = host.stats().allocated;
    host.reset_peak();
    model.gather_each(true, true, [&](const std::string& pname, const Tensor& t) {
      order.push_back(pname);
      largest = std::max(largest, static_cast<int64_t>(t.nbytes()));
    });  // (the values: gather_state_dict above collects them through gather_each)
    const int64_t peak = host.stats().peak_allocated - before;
    if (g_mesh->pp()->rank() == 0) {
      std::vector<std::string> want;
      for (const auto& [pname, shape] : model.gather_order()) want.push_back(pname);
      EXPECT_EQ(order, want) << name(c);
      EXPECT_EQ(order.size(), every.size()) << name(c);
      EXPECT_LE(peak, 2 * largest) << name(c);
    } else {
      EXPECT_TRUE(order.empty()) << name(c);
    }
  }
}

TEST(Pipeline, LayoutErrorsNameTheNumbers) {
  const int p = g_world->size();
  auto expect_error = [](auto fn, const std::string& fragment) {
    try {
      fn();
      FAIL() << "expected ConfigError with '" << fragment << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error([] { split_layers(6, 4, 1); },
               "model.n_layer (6) must be divisible by parallel.pp * parallel.vpp (4 * 1 = 4)");
  expect_error([] { split_layers(8, 4, 3); }, "(4 * 3 = 12)");
  expect_error([] { split_layers(2, 4, 1); }, "parallel.pp (4) must not exceed model.n_layer (2)");
  nn::GptConfig odd = tiny();
  odd.n_layer = p * 2 + 1;
  expect_error([&] { PipelineModel m(odd, 1, groups(), false, 1); },
               "must be divisible by parallel.pp");
  EXPECT_THROW(make_schedule(ScheduleKind::Interleaved, p, p, 1), ValueError);  // v < 2
  expect_error([] { PipelineModel m(tiny(), 1, groups(), false, 1, {}, Placement::V); },
               "parallel.vpp must be 2 (got 1)");
  // A schedule and a model that place the stages differently.
  expect_error(
      [&] {
        PipelineModel m(tiny(), 1, groups(), false, 2);
        PipelineExecutor e(m, make_schedule(ScheduleKind::ZbV, p, p, 2));
      },
      "schedule zb-v needs the V placement of stages, but the pipeline has the loop placement");
}

TEST(Pipeline, ZbVHoldsOneTiedEmbeddingOnTheFirstRankAndEvaluatesLikeOneProcess) {
  const int p = g_world->size(), r = g_mesh->pp_rank();
  const Case c{ScheduleKind::ZbV, 2, p};
  PipelineModel model = model_for(c, 23);
  EXPECT_EQ(model.stage_of(0), r);
  EXPECT_EQ(model.stage_of(1), 2 * p - 1 - r);
  int wte = 0;
  for (auto& [pname, t] : model.named_parameters()) wte += pname == "wte.weight";
  EXPECT_EQ(wte, r == 0 ? 1 : 0);  // the embedding and the tied head share one tensor
  if (r == 0) {
    EXPECT_EQ(&model.chunk(0).token_embedding().impl(), &model.chunk(1).token_embedding().impl());
  }
  // Evaluation hands the turn over locally and the loss comes from rank 0.
  nn::Gpt ref(tiny(), 23);
  PipelineExecutor exec(model, make_schedule(ScheduleKind::ZbV, p, c.m, 2));
  const auto data = batches(3, 7);
  double want = 0;
  for (const auto& b : data) want += item(ref.loss(b.inputs, b.targets)) / 3.0;
  EXPECT_NEAR(exec.evaluate(data), want, 1e-6 * want);
}

// zb-v's order comes from the times its measured step took, which differ
// from run to run. Its first rank runs both the embedding's stage and the
// tied head's on one token embedding; two orders that interleave their
// passes differently still give every gradient to the bit (each stage's
// part of the embedding's gradient adds up on its own, in microbatch
// order), with and without multi-token prediction modules reading it too.
TEST(Pipeline, ZbVGradientsAreTheSameInEveryOrderItsCostsChoose) {
  const int p = g_world->size(), m = 2 * p;
  Costs even;
  // A slow head's input gradients, quick weight passes at both ends.
  Costs uneven;
  uneven.forward.assign(2 * static_cast<size_t>(p), 1.0);
  uneven.backward_input.assign(2 * static_cast<size_t>(p), 1.0);
  uneven.backward_weight.assign(2 * static_cast<size_t>(p), 1.0);
  uneven.backward_input.back() = 5.0;
  uneven.backward_weight.front() = uneven.backward_weight.back() = 0.2;
  uneven.backward.resize(2 * static_cast<size_t>(p));
  for (size_t s = 0; s < uneven.backward.size(); ++s)
    uneven.backward[s] = uneven.backward_input[s] + uneven.backward_weight[s];
  const Schedule a = make_zero_bubble_v_schedule(p, m, even);
  const Schedule b = make_zero_bubble_v_schedule(p, m, uneven);
  // The first rank's weight passes, where both stages' gradients for the
  // embedding add up.
  auto weight_passes = [](const Schedule& s) {
    std::string out;
    for (const Action& x : s.ranks[0]) {
      if (x.is_compute() && x.compute == ComputeKind::BackwardWeight) out += x.str();
    }
    return out;
  };
  ASSERT_NE(weight_passes(a), weight_passes(b))
      << "the two costs must interleave the first rank's weight passes differently";
  for (const int mtp : {0, 1}) {
    nn::GptConfig cfg = tiny();
    cfg.mtp_layers = mtp;
    PipelineModel first(cfg, 31, groups(), false, 2, {}, Placement::V);
    PipelineModel second(cfg, 31, groups(), false, 2, {}, Placement::V);
    const auto data = batches(m, 11);
    PipelineExecutor(first, a).run(data, {});
    PipelineExecutor(second, b).run(data, {});
    const auto got = second.named_parameters(), want = first.named_parameters();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].second.grad().defined()) << got[i].first;
      EXPECT_EQ(to_double_vector(got[i].second.grad()), to_double_vector(want[i].second.grad()))
          << "mtp_layers " << mtp << ": " << got[i].first;
    }
  }
}

// Each row scored alone: its loss, and whether its targets are what greedy
// decoding writes, are one process's on every rank of the pipeline (the
// last stage's, broadcast). Rows whose scored targets are one process's
// argmaxes match; a row with one of them changed, or whose scored targets
// are random, does not.
TEST(Pipeline, RowLossesAndGreedyMatchesAreOneProcesss) {
  const int p = g_world->size();
  for (const Case& c : {Case{ScheduleKind::OneFOneB, 1, p}, Case{ScheduleKind::ZbV, 2, p}}) {
    PipelineModel model = model_for(c, 29);
    nn::Gpt ref(config(c), 29);
    PipelineExecutor exec(model, make_schedule(c.kind, p, c.m, c.v));
    std::vector<data::Batch> data = batches(2, 9);
    std::vector<double> want_loss;
    std::vector<bool> want_greedy;
    for (size_t b = 0; b < data.size(); ++b) {
      const std::vector<double> logits =
          to_double_vector(ref.forward(data[b].inputs));  // (2, 8, 50)
      auto argmax = [&](int64_t row, int64_t t) {
        const auto first = logits.begin() + (row * 8 + t) * 50;
        return static_cast<int64_t>(std::max_element(first, first + 50) - first);
      };
      std::vector<int64_t> tg(16, -100);
      for (int64_t row = 0; row < 2; ++row) {
        for (int64_t t = 3; t < 7; ++t) tg[static_cast<size_t>(row * 8 + t)] = argmax(row, t);
      }
      // Each batch's second row: one scored target that is not the argmax.
      const size_t wrong = b == 0 ? 8 + 6 : 8 + 3;
      tg[wrong] = (tg[wrong] + 1) % 50;
      data[b].targets = from_vector(tg, {2, 8});
      for (int64_t row = 0; row < 2; ++row) {
        want_loss.push_back(
            item(ref.loss(narrow(data[b].inputs, 0, row, 1), narrow(data[b].targets, 0, row, 1))));
      }
      want_greedy.insert(want_greedy.end(), {true, false});
    }
    std::vector<bool> greedy;
    const std::vector<double> losses = exec.row_losses(data, &greedy);
    ASSERT_EQ(losses.size(), 4u);
    for (size_t k = 0; k < 4; ++k) EXPECT_NEAR(losses[k], want_loss[k], 1e-6 * want_loss[k]) << k;
    EXPECT_EQ(greedy, want_greedy);
    // Without the flags, the same losses.
    EXPECT_EQ(exec.row_losses(data), losses);
  }
}

}  // namespace
}  // namespace triad::pipeline

int main(int argc, char** argv) {
  using namespace triad;
  return triad::testing::run_mpi_tests(
      argc, argv,
      [](const dist::ProcessGroupPtr& w) {
        pipeline::g_world = w;
        pipeline::g_mesh = std::make_unique<dist::DeviceMesh>(w, dist::MeshShape{1, w->size(), 1});
      },
      [] {
        pipeline::g_mesh.reset();
        pipeline::g_world.reset();
      });
}
