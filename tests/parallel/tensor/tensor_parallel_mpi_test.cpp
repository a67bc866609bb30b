// Tensor parallelism against the unsharded model built from the same seed:
// outputs and every gradient, for tp = world size (CTest runs 2 and 4 ranks),
// with and without sequence parallelism. fp32; tolerances stated per test.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/expect_close.h"
#include "support/forwarding_group.h"
#include "support/mpi_main.h"
#include "support/temp_dir.h"
#include "triad/autograd/engine.h"
#include "triad/autograd/grad_mode.h"
#include "triad/core/allocator.h"
#include "triad/core/rng.h"
#include "triad/data/token_dataset.h"
#include "triad/dist/world.h"
#include "triad/io/gpt2_weights.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"
#include "triad/optim/adamw.h"
#include "triad/optim/clip.h"
#include "triad/parallel/tensor/gpt.h"
#include "triad/parallel/tensor/layers.h"
#include "triad/parallel/tensor/mappings.h"
#include "triad/parallel/tensor/sharded_muon.h"

namespace triad::tp {
namespace {

dist::ProcessGroupPtr g_world;

using testing::expect_close;

TEST(Mappings, ConjugatePairsMoveGradientsAsDefined) {
  const int P = g_world->size(), me = g_world->rank();
  Tensor x = randn({2, 4, 4 * P}, 3, 1);  // same on every rank
  x.set_requires_grad(true);
  // copy_to_region: identity forward, sum of the ranks' gradients backward.
  Tensor g = full({2, 4, 4 * P}, me + 1.0);
  autograd::backward({copy_to_region(x, g_world)}, {g});
  const double sum = P * (P + 1) / 2.0;
  for (double v : to_double_vector(x.grad())) ASSERT_EQ(v, sum);
  // gather/scatter along the last dimension round-trip.
  Tensor local = slice_along(x, -1, g_world);
  EXPECT_EQ(to_double_vector(all_gather_along(local, -1, g_world)), to_double_vector(x));
  // sequence: reduce-scatter of P copies = P x the slice.
  Tensor rs = reduce_scatter_along(x, 1, g_world);
  auto want = to_double_vector(scale(slice_along(x, 1, g_world), P));
  expect_close(to_double_vector(rs), want, 1e-5, 1e-6, "reduce_scatter_along");
}

// scatter_to_region / gather_from_region (the last dimension) and
// scatter_to_sequence_region (dim 1): each forward is the other's backward.
TEST(Mappings, ScatterAndGatherAreEachOthersGradients) {
  const int P = g_world->size(), me = g_world->rank();
  const int64_t w = 3;
  // scatter: this rank's columns forward; the ranks' gradients gathered back.
  Tensor x = randn({2, 5, w * P}, 4, 1);  // the same on every rank
  x.set_requires_grad(true);
  Tensor mine = scatter_to_region(x, g_world);
  ASSERT_EQ(mine.shape(), (Shape{2, 5, w}));
  EXPECT_EQ(to_double_vector(mine), to_double_vector(contiguous(narrow(x, 2, me * w, w))));
  autograd::backward({mine}, {full({2, 5, w}, me + 1.0)});
  auto gx = to_double_vector(x.grad());
  for (size_t i = 0; i < gx.size(); ++i) {
    const int64_t column = static_cast<int64_t>(i) % (w * P);
    ASSERT_EQ(gx[i], static_cast<double>(column / w + 1)) << i;  // its owner's rank + 1
  }
  // gather: every rank's columns forward; this rank's slice of the gradient back.
  Tensor local = randn({2, 5, w}, 4, 10 + me);  // different on every rank
  local.set_requires_grad(true);
  Tensor all = gather_from_region(local, g_world);
  ASSERT_EQ(all.shape(), (Shape{2, 5, w * P}));
  for (int r = 0; r < P; ++r) {
    EXPECT_EQ(to_double_vector(contiguous(narrow(all, 2, r * w, w))),
              to_double_vector(randn({2, 5, w}, 4, 10 + r)))
        << "rank " << r << "'s columns";
  }
  Tensor g = randn({2, 5, w * P}, 4, 2);  // the same on every rank
  autograd::backward({all}, {g});
  EXPECT_EQ(to_double_vector(local.grad()), to_double_vector(contiguous(narrow(g, 2, me * w, w))));
  // scatter along the sequence: this rank's positions forward, gathered back.
  Tensor seq = randn({2, 2 * P, w}, 4, 3);
  seq.set_requires_grad(true);
  Tensor part = scatter_to_sequence_region(seq, g_world);
  ASSERT_EQ(part.shape(), (Shape{2, 2, w}));
  EXPECT_EQ(to_double_vector(part), to_double_vector(contiguous(narrow(seq, 1, 2 * me, 2))));
  autograd::backward({part}, {full({2, 2, w}, me + 1.0)});
  auto gs = to_double_vector(seq.grad());
  for (size_t i = 0; i < gs.size(); ++i) {
    const int64_t position = static_cast<int64_t>(i) / w % (2 * P);
    ASSERT_EQ(gs[i], static_cast<double>(position / 2 + 1)) << i;  // its owner's rank + 1
  }
  // A dimension the group does not divide is an error naming the sizes.
  if (P > 1) {
    try {
      scatter_to_region(randn({2, w * P + 1}, 4, 4), g_world);
      FAIL() << "expected a ShapeError";
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("divisible by the tensor-parallel size"),
                std::string::npos)
          << e.what();
    }
  }
}

// A group whose all-reduces and reduce-scatters run only when waited for,
// as over a slow link, each start and wait written to `log`: what a
// backward pass logs between the two is what the collective overlapped.
class CollectivesRunOnWait final : public testing::ForwardingGroup {
 public:
  CollectivesRunOnWait(dist::ProcessGroupPtr inner, std::vector<std::string>* log)
      : ForwardingGroup(std::move(inner)), log_(log) {}
  dist::WorkPtr all_reduce(Tensor& t, dist::ReduceOp op) override {
    return deferred("all_reduce", [g = inner(), t, op]() mutable { g->all_reduce(t, op)->wait(); });
  }
  dist::WorkPtr reduce_scatter(const Tensor& in, Tensor& out, dist::ReduceOp op) override {
    return deferred("reduce_scatter", [g = inner(), in, out, op]() mutable {
      g->reduce_scatter(in, out, op)->wait();
    });
  }

 private:
  struct Deferred final : dist::Work {
    std::function<void()> run;
    std::vector<std::string>* log = nullptr;
    std::string name;
    bool done = false;
    void wait() override {
      if (done) return;
      log->push_back("wait " + name);
      run();
      done = true;
    }
    void wait_for(std::chrono::milliseconds) override { wait(); }
    bool is_completed() override { return done; }
  };
  dist::WorkPtr deferred(const std::string& name, std::function<void()> run) {
    log_->push_back(name);
    auto w = std::make_shared<Deferred>();
    w->run = std::move(run), w->log = log_, w->name = name;
    return w;
  }

  std::vector<std::string>* log_;
};

// Logs `what` whenever t's gradient is accumulated.
void log_gradient(Tensor& t, std::vector<std::string>& log, const std::string& what) {
  t.register_post_accumulate_hook([&log, what](Tensor&) { log.push_back(what); });
}

struct LayerGrads {
  std::vector<double> dx, dw, db;
};

// A column-parallel layer's input gradient leaves through its collective
// (all-reduce; reduce-scatter along the sequence with sequence parallelism)
// while the layer computes its weight and bias gradients: started before
// them, waited for after. A split backward (zero-bubble B) waits at once and
// leaves the weight half for later. Gradients are bitwise those of the
// region's own op (copy_to_region, gather_from_sequence_region) before a
// plain linear.
class ColumnParallelOverlapTest : public ::testing::TestWithParam<bool> {};

TEST_P(ColumnParallelOverlapTest, InputGradientCollectiveRunsDuringTheWeightGradient) {
  const int P = g_world->size(), me = g_world->rank();
  if (P == 1) GTEST_SKIP() << "a group of one has no collective";
  const bool sp = GetParam();
  const int64_t C = 8, T = 2 * P, out = 4 * P;
  const std::string coll = sp ? "reduce_scatter" : "all_reduce";
  const Tensor w = randn({out / P, C}, 7, 10 + me), b = randn({out / P}, 7, 20 + me);
  const Tensor x0 = randn({2, sp ? T / P : T, C}, 3, sp ? me : 0);
  const Tensor gy = randn({2, T, out / P}, 5, me);
  std::vector<std::string> log;
  auto slow = std::make_shared<CollectivesRunOnWait>(g_world, &log);

  auto layer_run = [&](bool split) {
    ColumnParallelLinear layer(C, out, slow, sp);
    layer.load_state_dict({{"weight", w}, {"bias", b}});
    auto params = layer.named_parameters();
    log_gradient(params[0].second, log, "weight gradient");
    log_gradient(params[1].second, log, "bias gradient");
    Tensor x = clone(x0).detach();
    x.set_requires_grad(true);
    Tensor y = layer.forward(x);
    log.clear();
    autograd::WeightGradStore store;
    autograd::backward({y}, {gy}, {.defer_weight_grads = split ? &store : nullptr});
    log.push_back("flush");
    store.flush();
    return LayerGrads{to_double_vector(x.grad()), to_double_vector(params[0].second.grad()),
                      to_double_vector(params[1].second.grad())};
  };
  const LayerGrads whole = layer_run(false);
  EXPECT_EQ(log, (std::vector<std::string>{coll, "weight gradient", "bias gradient", "wait " + coll,
                                           "flush"}));
  const LayerGrads split = layer_run(true);
  EXPECT_EQ(log, (std::vector<std::string>{coll, "wait " + coll, "flush", "weight gradient",
                                           "bias gradient"}));

  Tensor x = clone(x0).detach(), wl = clone(w).detach(), bl = clone(b).detach();
  x.set_requires_grad(true);
  wl.set_requires_grad(true);
  bl.set_requires_grad(true);
  Tensor in = sp ? gather_from_sequence_region(x, g_world) : copy_to_region(x, g_world);
  autograd::backward({linear(in, wl, bl)}, {gy});
  for (const LayerGrads* got : {&whole, &split}) {
    EXPECT_EQ(got->dx, to_double_vector(x.grad()));
    EXPECT_EQ(got->dw, to_double_vector(wl.grad()));
    EXPECT_EQ(got->db, to_double_vector(bl.grad()));
  }
}

// The vocab-parallel head does the same with x's gradient: its all-reduce
// (reduce-scatter) runs while the head's weight gradient is computed.
TEST_P(ColumnParallelOverlapTest, HeadInputGradientCollectiveRunsDuringTheWeightGradient) {
  const int P = g_world->size(), me = g_world->rank();
  if (P == 1) GTEST_SKIP() << "a group of one has no collective";
  const bool sp = GetParam();
  const int64_t C = 8, T = 2 * P, shard = 5, V = shard * P - 2;
  const std::string coll = sp ? "reduce_scatter" : "all_reduce";
  const Tensor w0 = randn({shard, C}, 7, 30 + me);
  const Tensor x0 = randn({2, sp ? T / P : T, C}, 3, sp ? me : 0);
  std::vector<int64_t> t;
  for (int64_t i = 0; i < 2 * T; ++i) t.push_back((i * 7 + 1) % V);
  const Tensor targets = from_vector(t, {2, T});
  const int64_t start = me * shard, valid = std::min(shard, V - start);
  std::vector<std::string> log;
  auto slow = std::make_shared<CollectivesRunOnWait>(g_world, &log);

  auto grads = [&](bool fused) {
    Tensor x = clone(x0).detach(), w = clone(w0).detach();
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    log_gradient(w, log, "weight gradient");
    Tensor loss;
    if (fused) {
      const RegionInput in = enter_region(x, slow, sp);
      loss = vocab_parallel_linear_cross_entropy(in.input, w, targets, start, valid, g_world, 0.0,
                                                 in.comm);
    } else {
      Tensor in = sp ? gather_from_sequence_region(x, g_world) : copy_to_region(x, g_world);
      loss = vocab_parallel_linear_cross_entropy(in, w, targets, start, valid, g_world);
    }
    log.clear();
    autograd::backward({loss});
    return LayerGrads{to_double_vector(x.grad()), to_double_vector(w.grad()), {}};
  };
  const LayerGrads fused = grads(true);
  EXPECT_EQ(log, (std::vector<std::string>{coll, "weight gradient", "wait " + coll}));
  const LayerGrads plain = grads(false);
  EXPECT_EQ(fused.dx, plain.dx);
  EXPECT_EQ(fused.dw, plain.dw);
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, ColumnParallelOverlapTest, ::testing::Bool());

// Under sequence parallelism a column-parallel layer keeps its input's
// shard for the weight gradient, not the all-gathered input (tp times its
// size): forward leaves nothing new alive but the output. Backward gathers
// again; the gradients are checked against the unfused ops above and
// against one process by the GPT tests.
TEST(ColumnParallelLinear, SequenceParallelKeepsOnlyTheInputShardForBackward) {
  const int P = g_world->size(), me = g_world->rank();
  if (P == 1) GTEST_SKIP() << "a group of one gathers nothing";
  const int64_t C = 64, T = 4 * P, out = 2 * P;
  ColumnParallelLinear layer(C, out, g_world, true);
  Tensor x = randn({2, T / P, C}, 3, me);
  x.set_requires_grad(true);
  const int64_t before = cpu_allocator().stats().allocated;
  Tensor y = layer.forward(x);
  const int64_t held = cpu_allocator().stats().allocated - before;
  EXPECT_EQ(held, static_cast<int64_t>(y.nbytes()));
  autograd::backward({sum(y)});
  EXPECT_EQ(x.grad().shape(), x.shape());
}

// The vocab-parallel embedding: summed over the ranks, each id's row of the
// whole table (ids in every shard, in the last rank's too). A rank whose
// shard holds every id multiplies by no mask, and a group of one looks up
// the caller's ids themselves: forward leaves nothing alive beside its output,
// and the table's gradient is the rows' sums.
TEST(VocabParallel, EmbeddingMasksOnlyIdsOutsideItsShard) {
  const int P = g_world->size(), me = g_world->rank();
  const int64_t V = 50 * P - 7, C = 8;
  VocabParallelEmbedding emb(V, C, g_world, false);
  // The whole table, gathered from the shards (each rank's valid rows).
  std::vector<double> table;
  for (int r = 0; r < P; ++r) {
    Tensor shard = clone(emb.weight()).detach();
    g_world->broadcast(shard, r)->wait();
    const std::vector<double> rows = to_double_vector(shard);
    const int64_t valid =
        std::clamp<int64_t>(V - r * shard.size(0), 0, shard.size(0));  // (past V: padding)
    table.insert(table.end(), rows.begin(), rows.begin() + valid * C);
  }
  ASSERT_EQ(table.size(), static_cast<size_t>(V * C));
  std::vector<int64_t> spread;
  for (int64_t i = 0; i < 12; ++i) spread.push_back((i * 37 + 11) % V);
  spread.back() = V - 1;
  const Tensor y = emb.forward(from_vector(spread, {2, 6}));
  const std::vector<double> got = to_double_vector(y);
  for (int64_t i = 0; i < 12; ++i) {
    for (int64_t c = 0; c < C; ++c) {
      ASSERT_EQ(got[i * C + c], table[spread[i] * C + c]) << "id " << spread[i];
    }
  }
  // Ids all in rank 0's shard.
  std::vector<int64_t> first;
  for (int64_t i = 0; i < 12; ++i) first.push_back((i * 7 + 3) % std::min<int64_t>(V, 50));
  const Tensor ids = from_vector(first, {2, 6});
  emb.weight().set_grad(Tensor());
  const int64_t before = cpu_allocator().stats().allocated;
  Tensor out = emb.forward(ids);
  const int64_t held = cpu_allocator().stats().allocated - before;
  if (me == 0 && P == 1) {
    // (The whole table: the caller's ids themselves are looked up, with no
    // copy and no mask.)
    EXPECT_EQ(held, static_cast<int64_t>(out.nbytes())) << "a mask or a copy of the ids held";
  }
  autograd::backward({sum(out)});
  const std::vector<double> dw = to_double_vector(emb.weight().grad());
  std::vector<double> counts(static_cast<size_t>(emb.weight().size(0)), 0.0);
  if (me == 0) {
    for (int64_t id : first) counts[static_cast<size_t>(id)] += 1.0;
  }
  for (size_t r = 0; r < counts.size(); ++r) {
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(dw[r * C + c], counts[r]) << "row " << r;
  }
}

// The vocab-parallel loss of x (2, 6, C) against this rank's shard of
// w_full (`shard` rows from rank * shard; the vocabulary is its first V):
// fused with the head, or after a plain linear. The loss, x's gradient
// summed over the ranks (as copy_to_region sums it) and the shard's. With
// z_coef > 0 the objective is the loss plus z_coef times its z-loss (z):
// the z-loss a second output, or (joined, fused only) joining the loss's
// gradient inside the op (its z_loss_coef).
struct VocabLoss {
  double loss, z = 0;
  std::vector<double> dx, dw;
};
VocabLoss vocab_loss(bool fused, const Tensor& w_full, const Tensor& targets, int64_t shard,
                     int64_t V, double z_coef = 0.0, bool joined = false) {
  const int64_t start = g_world->rank() * shard, valid = std::min(shard, V - start);
  Tensor x = randn({2, 6, w_full.size(1)}, 3, 1);
  Tensor w = contiguous(narrow(w_full, 0, start, shard)).detach();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  Tensor z;
  Tensor* z_out = z_coef > 0 ? &z : nullptr;
  Tensor loss =
      fused ? vocab_parallel_linear_cross_entropy(x, w, targets, start, valid, g_world, 0.0, {}, {},
                                                  z_out, 0.0, joined ? z_coef : 0.0)
            : vocab_parallel_cross_entropy(linear(x, w), targets, start, valid, g_world, z_out);
  autograd::backward({z_coef > 0 && !joined ? add(loss, scale(z, z_coef)) : loss});
  Tensor dx = x.grad();
  g_world->all_reduce(dx, dist::ReduceOp::Sum)->wait();
  return {item(loss), z_coef > 0 ? item(z) : 0.0, to_double_vector(dx), to_double_vector(w.grad())};
}

// The fused head + vocab-parallel loss (the GPT's last stage) against the
// unfused pair on the same shards, and against one process's cross entropy
// over the whole vocabulary: loss, the weight shard's gradient, and x's
// gradient summed over the ranks (as copy_to_region sums it). Shards of 37
// classes: rows padded to 64, and the last rank's shard partly padding.
TEST(VocabParallel, FusedHeadLossEqualsLinearThenLossAndTheUnshardedOne) {
  const int P = g_world->size(), me = g_world->rank();
  const int64_t shard = 37, V = shard * P - 5, C = 16;
  const Tensor w_full = randn({shard * P, C}, 3, 2, 0.3);  // same on every rank
  std::vector<int64_t> t;
  for (int64_t i = 0; i < 12; ++i) t.push_back((i * 29 + 3) % V);
  const Tensor targets = from_vector(t, {2, 6});
  const int64_t start = me * shard, valid = std::min(shard, V - start);
  const VocabLoss fused = vocab_loss(true, w_full, targets, shard, V),
                  plain = vocab_loss(false, w_full, targets, shard, V);
  EXPECT_NEAR(fused.loss, plain.loss, 1e-6 * plain.loss);
  expect_close(fused.dx, plain.dx, 1e-7, 1e-5, "dx");
  expect_close(fused.dw, plain.dw, 1e-7, 1e-5, "dw");
  // One process: the first V classes of the same weight.
  Tensor x = randn({2, 6, C}, 3, 1);
  Tensor w = contiguous(narrow(w_full, 0, 0, V)).detach();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  Tensor loss = cross_entropy(linear(x, w), targets);
  autograd::backward({loss});
  EXPECT_NEAR(fused.loss, to_double_vector(loss)[0], 1e-6 * fused.loss);
  expect_close(fused.dx, to_double_vector(x.grad()), 1e-7, 1e-5, "dx against one process");
  const std::vector<double> dw_full = to_double_vector(w.grad());
  for (int64_t r = 0; r < valid; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      ASSERT_NEAR(fused.dw[r * C + c], dw_full[(start + r) * C + c],
                  1e-7 + 1e-5 * std::abs(dw_full[(start + r) * C + c]))
          << "dw row " << start + r;
    }
  }
  for (int64_t i = valid * C; i < shard * C; ++i) ASSERT_EQ(fused.dw[i], 0.0) << "padding";
}

// Targets of -100 add nothing and the mean is over the others, as in one
// process's cross_entropy: fused and unfused vocab-parallel losses, loss and
// x's gradient (summed over the ranks).
TEST(VocabParallel, IgnoredTargetsAreLeftOutOfTheMean) {
  const int64_t shard = 37, V = shard * g_world->size() - 5, C = 16;
  const Tensor w_full = randn({shard * g_world->size(), C}, 3, 2, 0.3);
  std::vector<int64_t> t;
  for (int64_t i = 0; i < 12; ++i) t.push_back(i % 3 == 1 ? -100 : (i * 29 + 3) % V);
  const Tensor targets = from_vector(t, {2, 6});
  Tensor x_ref = randn({2, 6, C}, 3, 1);
  x_ref.set_requires_grad(true);
  Tensor ref = cross_entropy(linear(x_ref, contiguous(narrow(w_full, 0, 0, V))), targets);
  autograd::backward({ref});
  for (bool fused : {true, false}) {
    const VocabLoss got = vocab_loss(fused, w_full, targets, shard, V);
    EXPECT_NEAR(got.loss, item(ref), 1e-6 * item(ref)) << (fused ? "fused" : "unfused");
    expect_close(got.dx, to_double_vector(x_ref.grad()), 1e-7, 1e-5,
                 fused ? "dx (fused)" : "dx (unfused)");
  }
}

// The z-loss over the vocabulary's shards: its value, and the gradients of
// loss + 0.5 z, those of one process's over the whole vocabulary, fused,
// unfused and joining the loss's gradient, ignored rows left out of the
// means.
TEST(VocabParallel, ZLossMatchesTheUnshardedOne) {
  const int P = g_world->size(), me = g_world->rank();
  const int64_t shard = 37, V = shard * P - 5, C = 16;
  const Tensor w_full = randn({shard * P, C}, 3, 2, 0.6);
  std::vector<int64_t> t;
  for (int64_t i = 0; i < 12; ++i) t.push_back(i % 5 == 2 ? -100 : (i * 29 + 3) % V);
  const Tensor targets = from_vector(t, {2, 6});
  Tensor x = randn({2, 6, C}, 3, 1);
  Tensor w = contiguous(narrow(w_full, 0, 0, V)).detach();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  Tensor z;
  Tensor loss = cross_entropy(linear(x, w), targets, -100, &z);
  autograd::backward({add(loss, scale(z, 0.5))});
  const std::vector<double> dw_full = to_double_vector(w.grad());
  const int64_t start = me * shard, valid = std::min(shard, V - start);
  for (const auto& [fused, joined] :
       {std::pair{true, false}, std::pair{false, false}, std::pair{true, true}}) {
    SCOPED_TRACE(joined ? "joining the loss's gradient" : fused ? "fused" : "unfused");
    const VocabLoss got = vocab_loss(fused, w_full, targets, shard, V, 0.5, joined);
    EXPECT_NEAR(got.loss, item(loss), 1e-6 * item(loss));
    EXPECT_NEAR(got.z, item(z), 1e-6 * item(z));
    expect_close(got.dx, to_double_vector(x.grad()), 1e-7, 1e-5, "dx");
    for (int64_t r = 0; r < valid; ++r) {
      for (int64_t c = 0; c < C; ++c) {
        ASSERT_NEAR(got.dw[r * C + c], dw_full[(start + r) * C + c],
                    1e-7 + 1e-5 * std::abs(dw_full[(start + r) * C + c]))
            << "dw row " << start + r;
      }
    }
    // (Without the z-loss's gradient, x's differs.)
    const VocabLoss plain = vocab_loss(fused, w_full, targets, shard, V);
    double apart = 0;
    for (size_t i = 0; i < plain.dx.size(); ++i) apart += std::abs(plain.dx[i] - got.dx[i]);
    EXPECT_GT(apart, 1e-3);
  }
}

// A group of one rank holds the whole vocabulary: the fused head's loss is
// then one process's linear_cross_entropy over the valid classes, bit for
// bit (the vocab-parallel passes' arithmetic differs), with the gradient
// written ahead for the gradient expected, rescaled when another comes,
// and none for the padding classes (their weight rows are nonzero here).
// Biased and soft-capped, with ignored targets, and with a z-loss.
TEST(VocabParallel, AGroupOfOneIsOneProcesssCrossEntropyBitForBit) {
  if (g_world->size() != 1) GTEST_SKIP() << "a group of several ranks reduces between passes";
  const int64_t shard = 45, V = 40, C = 16;
  const Tensor w_full = randn({shard, C}, 3, 2, 0.5), b_full = randn({shard}, 3, 3, 0.5);
  std::vector<int64_t> t;
  for (int64_t i = 0; i < 12; ++i) t.push_back(i % 5 == 2 ? -100 : (i * 29 + 3) % V);
  const Tensor targets = from_vector(t, {2, 6});
  struct Run {
    std::vector<double> loss, z, dx, dw, db;
  };
  auto run = [&](bool vocab, double expected, double seed, bool capped, bool with_z) {
    auto leaf = [](const Tensor& v) {
      Tensor p = contiguous(v).detach();
      p.set_requires_grad(true);
      return p;
    };
    Tensor x = leaf(randn({2, 6, C}, 3, 1));
    Tensor w = leaf(vocab ? w_full : narrow(w_full, 0, 0, V));
    Tensor b = leaf(vocab ? b_full : narrow(b_full, 0, 0, V));
    const double cap = capped ? 2.0 : 0.0;
    Tensor z;
    Tensor* z_out = with_z ? &z : nullptr;
    const Tensor loss = vocab ? vocab_parallel_linear_cross_entropy(x, w, targets, 0, V, g_world,
                                                                    cap, {}, b, z_out, expected)
                              : linear_cross_entropy(x, w, targets, -100, cap, b, z_out, expected);
    autograd::backward(with_z ? autograd::TensorList{loss, z} : autograd::TensorList{loss},
                       with_z ? autograd::TensorList{full({}, seed), full({}, 0.25)}
                              : autograd::TensorList{full({}, seed)});
    return Run{to_double_vector(loss), with_z ? to_double_vector(z) : std::vector<double>{},
               to_double_vector(x.grad()), to_double_vector(w.grad()), to_double_vector(b.grad())};
  };
  for (bool capped : {false, true}) {
    for (bool with_z : {false, true}) {
      for (double expected : {0.0, 0.5, 2.0}) {
        SCOPED_TRACE(std::string(capped ? "capped" : "uncapped") + (with_z ? ", z-loss" : "") +
                     ", expected gradient " + std::to_string(expected));
        const Run one = run(false, expected, 0.5, capped, with_z);
        const Run got = run(true, expected, 0.5, capped, with_z);
        EXPECT_EQ(got.loss, one.loss);
        EXPECT_EQ(got.z, one.z);
        EXPECT_EQ(got.dx, one.dx);
        ASSERT_EQ(got.dw.size(), static_cast<size_t>(shard * C));
        EXPECT_EQ(std::vector<double>(got.dw.begin(), got.dw.begin() + V * C), one.dw);
        EXPECT_EQ(std::vector<double>(got.db.begin(), got.db.begin() + V), one.db);
        for (int64_t i = V * C; i < shard * C; ++i) ASSERT_EQ(got.dw[i], 0.0) << "padding";
        for (int64_t i = V; i < shard; ++i) ASSERT_EQ(got.db[i], 0.0) << "padding";
      }
    }
  }
}

nn::GptConfig tiny(int64_t vocab) {
  // The vocabulary is deliberately not a multiple of 128 * tp.
  return {.n_layer = 2, .n_head = 4, .d_model = 32, .vocab_size = vocab, .seq_len = 8};
}

Tensor token_ids(int64_t vocab, uint64_t stream) {
  std::vector<int64_t> ids(2 * 8);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int64_t>(philox_uniform(5, stream, i) * vocab) % vocab;
  return from_vector(ids, {2, 8});
}

// The model's gradients as full (unsharded) tensors, gathered the way the
// parameters are gathered.
nn::StateDict full_grads(const TensorParallelGpt& model) {
  TensorParallelGpt holder(model.config(), 0, g_world, model.sequence_parallel());
  nn::StateDict shard_grads;
  for (auto& [name, p] : model.named_parameters()) shard_grads[name] = p.grad();
  holder.load_state_dict(shard_grads);
  return holder.full_state_dict();
}

class TensorParallelGptTest : public ::testing::TestWithParam<bool> {};

// Loss within 1e-6 relative; logits 2e-5; gradients 1e-6 + 1e-4 relative.
TEST_P(TensorParallelGptTest, LossLogitsAndEveryGradientMatchOneProcess) {
  const bool sp = GetParam();
  const int64_t V = 300;
  nn::Gpt ref(tiny(V), 11);
  TensorParallelGpt model(tiny(V), 11, g_world, sp);
  Tensor ids = token_ids(V, 1), targets = token_ids(V, 2);
  // Same initial weights, bitwise.
  for (auto& [name, t] : model.full_state_dict()) {
    ASSERT_EQ(to_double_vector(t), to_double_vector(ref.state_dict().at(name))) << name;
  }
  expect_close(to_double_vector(model.logits(ids)), to_double_vector(ref.forward(ids)), 2e-5, 0,
               "logits");
  {
    // Some positions' logits from the final hidden states (each rank's
    // shard of them under sequence parallelism): the whole logits' slice.
    autograd::NoGradGuard no_grad;
    const nn::ForwardContext ctx = model.with_documents(ids, {});
    Tensor x = model.embed(ids, ctx);
    for (int64_t i : model.plan().layers) x = model.block(i, x, ctx);
    expect_close(to_double_vector(model.head_logits(x, 3, 4)),
                 to_double_vector(narrow(ref.forward(ids), 1, 3, 4)), 2e-5, 0, "head_logits");
    try {
      model.head_logits(x, 6, 4);
      ADD_FAILURE() << "expected ValueError";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("positions [6, 10) are not inside the sequence's 8"),
                std::string::npos)
          << e.what();
    }
  }
  Tensor l = model.loss(ids, targets), lr = ref.loss(ids, targets);
  EXPECT_NEAR(item(l), item(lr), 1e-6 * item(lr));
  autograd::backward({l});
  autograd::backward({lr});
  model.reduce_partial_grads();
  const nn::StateDict grads = full_grads(model);
  int checked = 0;
  for (auto& [name, p] : ref.named_parameters()) {
    expect_close(to_double_vector(grads.at(name)), to_double_vector(p.grad()), 1e-6, 1e-4, name);
    ++checked;
  }
  EXPECT_EQ(checked, 4 + 12 * 2);
}

// One model of `cfg` sharded over the ranks against nn::Gpt from the same
// seed: logits, the loss of (inputs, targets) and every gradient. Returns
// one process's loss.
double expect_sharded_matches_one_process(const nn::GptConfig& cfg, uint64_t seed, bool sp,
                                          const Tensor& ids, const Tensor& inputs,
                                          const Tensor& targets) {
  nn::Gpt ref(cfg, seed);
  TensorParallelGpt model(cfg, seed, g_world, sp);
  expect_close(to_double_vector(model.logits(ids)), to_double_vector(ref.forward(ids)), 2e-5, 0,
               "logits");
  Tensor l = model.loss(inputs, targets), lr = ref.loss(inputs, targets);
  EXPECT_NEAR(item(l), item(lr), 1e-6 * item(lr));
  autograd::backward({l});
  autograd::backward({lr});
  model.reduce_partial_grads();
  const nn::StateDict grads = full_grads(model);
  EXPECT_EQ(grads.size(), ref.named_parameters().size());
  for (auto& [name, p] : ref.named_parameters()) {
    expect_close(to_double_vector(grads.at(name)), to_double_vector(p.grad()), 1e-6, 1e-4, name);
  }
  return item(lr);
}

// Packed documents (each its own attention window and positions) and the
// end-of-document loss mask through the sharded model, against one process.
TEST_P(TensorParallelGptTest, PackedDocumentsMatchOneProcess) {
  const int64_t V = 300;
  nn::GptConfig cfg = tiny(V);
  cfg.eod_token = 7;
  cfg.reset_attention_mask = true;
  cfg.reset_position_ids = true;
  Tensor ids = token_ids(V, 3);
  for (int64_t i : {2, 5, 9, 10}) ids.data<int64_t>()[i] = 7;
  const data::Batch batch = data::mask_loss_after_eod({ids, token_ids(V, 4)}, 7);
  const double loss =
      expect_sharded_matches_one_process(cfg, 13, GetParam(), ids, batch.inputs, batch.targets);
  // The documents matter: without them the loss differs.
  EXPECT_GT(std::abs(item(nn::Gpt(tiny(V), 13).loss(batch.inputs, batch.targets)) - loss), 1e-4);
}

// LLaMA-style options. Rotary embeddings turn each rank's own heads (the
// column-parallel qkv's local q and k), over the whole sequence under
// sequence parallelism; with and without packed documents' positions.
// An untied head (lm_head) is split over the vocabulary as wte is.
// SwiGLU splits c_fc's gate and value halves each over the ranks, so every
// rank pairs its own gate and value columns. RMSNorm weights are replicated
// (summed over the ranks under sequence parallelism, as LayerNorm's), and
// without linear biases the row-parallel layers add nothing after their
// reduction. Grouped-query attention splits c_attn's q, k and v blocks
// each over the ranks (blocks of unequal heights), so a rank holds its
// query heads and the key/value heads they share; Qwen2's q, k and v biases
// split with them, block by block. Qwen3's heads of their own width
// (model.head_dim) split the same way, and its query/key norms are
// replicated, each rank normalising its own heads: their gradients are
// summed over the ranks with or without sequence parallelism. Gemma 3's
// post-norms act on the row-parallel layers' reduced outputs (under
// sequence parallelism each rank's tokens), replicated as ln_1 and ln_2;
// its windowed layer turns by a RoPE base of its own. Gemma 2's soft caps
// act on each rank's heads' scores and each vocabulary shard's logits.
// GPT-NeoX's parallel residual feeds ln_2 the block's input (each rank's
// tokens under sequence parallelism), and its exact GELU acts on each
// rank's columns of c_fc. Granite's residual multiplier scales each
// sublayer's reduced output (the parallel residual's one reduction of both
// sublayers too), and its logit scale ln_f's output before the
// vocabulary-parallel head.
TEST_P(TensorParallelGptTest, LlamaOptionsMatchOneProcess) {
  const int64_t V = 300;
  for (const std::string variant :
       {"rope",
        "rope, packed documents",
        "swiglu, F 24",
        "geglu, F 24",
        "relu2, F 24",
        "gemma's blocks",
        "gemma 3's blocks, sliding window on layer 0 only",
        "gemma 2's blocks, soft caps, sliding window on layer 0 only",
        "rmsnorm, rope, swiglu, no biases",
        "rmsnorm, rope, swiglu, no biases, untied head",
        "rmsnorm, rope, swiglu, no biases, grouped-query attention",
        "rmsnorm, rope, swiglu, no biases, grouped-query attention, qkv biases",
        "rmsnorm, rope, swiglu, no biases, grouped-query attention, qk norm, heads of 6",
        "rope, sliding window, packed documents",
        "rope, sliding window on layer 1 only, packed documents",
        "gpt-neox's blocks: parallel residual, exact gelu, half of each head turned, untied "
        "head",
        "phi's blocks: parallel residual with one norm, biased head, grouped-query "
        "attention",
        "phi's blocks as gpt-j's: biases on the mlp alone",
        "olmo 2's blocks: post-norms alone, qk norm over all heads, grouped-query "
        "attention",
        "olmo 2's blocks: post-norms alone, qk norm over all heads, one key/value head",
        "olmo's blocks: layernorms without weights, q, k and v clamped, grouped-query "
        "attention",
        "granite's blocks: residual multiplier, logit scale, attention multiplier, "
        "grouped-query attention",
        "gpt-neox's blocks with a residual multiplier: both sublayers' shares reduced at "
        "once",
        "cohere's blocks: one layernorm without a bias for both parallel sublayers, swiglu, "
        "logit scale, grouped-query attention",
        "cohere 2's blocks: cohere's, sliding window on layer 0, layer 1 without rope",
        "cohere's blocks with command r+'s layernorms on each head, grouped-query attention",
        "cohere's blocks with command r+'s layernorms on each head, one key/value head"}) {
    SCOPED_TRACE(variant);
    nn::GptConfig cfg = tiny(V);
    if (variant.find("grouped-query") != std::string::npos) {
      // 8 query heads of 4 over as few key/value heads as the ranks allow
      // (2, or one a rank): groups of 4 or 2.
      cfg.n_head = 8;
      cfg.n_kv_head = std::max(2, g_world->size());
      if (8 % cfg.n_kv_head != 0) continue;
      cfg.rope_theta = 30.0;
    }
    if (variant.rfind("rmsnorm, rope, swiglu, no biases", 0) == 0) {
      cfg.tie_embeddings = variant.find("untied") == std::string::npos;
      cfg.normalization = nn::Normalization::RmsNorm;
      cfg.linear_bias = false;
      cfg.activation = nn::Activation::SwiGlu;
      cfg.position_embedding = nn::PositionEmbedding::Rotary;
    } else if (variant.rfind("gemma", 0) == 0) {  // GeGLU, scaled embeddings, 1 + weight
      cfg.normalization = nn::Normalization::RmsNorm;
      cfg.linear_bias = false;
      cfg.activation = nn::Activation::GeGlu;
      cfg.position_embedding = nn::PositionEmbedding::Rotary;
      cfg.embedding_multiplier = 4.0;
      cfg.norm_weight_offset = true;
      if (variant.rfind("gemma 3", 0) == 0) {
        // Post-norms, head norms on heads of 6, the window on layer 0 with
        // its own RoPE base, layer 1's scaled, 27B's kind of attention scale.
        cfg.post_norms = true;
        cfg.qk_norm = true;
        cfg.head_size = 6;
        cfg.sliding_window = 3;
        cfg.full_attention_layers = {1};
        cfg.rope_theta = 30.0;
        cfg.rope_local_theta = 5.0;
        cfg.rope_scaling.kind = RopeScaling::Kind::Linear;
        cfg.rope_scaling.factor = 2.0;
        cfg.query_pre_attn_scalar = 10.0;  // scores over sqrt(10), not sqrt(6)
      }
      if (variant.rfind("gemma 2", 0) == 0) {
        // Post-norms, and soft caps of about the size of the tiny model's
        // scores and logits (the vocabulary-parallel loss caps each shard).
        cfg.post_norms = true;
        cfg.sliding_window = 3;
        cfg.full_attention_layers = {1};
        cfg.attn_logit_softcap = 0.01;
        cfg.final_logit_softcap = 0.1;
      }
    } else if (variant.rfind("gpt-neox", 0) == 0) {  // both sublayers read x
      cfg.parallel_residual = true;
      cfg.activation = nn::Activation::GeluErf;
      cfg.position_embedding = nn::PositionEmbedding::Rotary;
      cfg.rope_theta = 20.0;
      cfg.rope_dim = cfg.head_dim() / 2;
      cfg.tie_embeddings = false;
      // (The one reduction of both sublayers' shares, then scaled.)
      if (variant.find("residual multiplier") != std::string::npos) cfg.residual_multiplier = 2.5;
    } else if (variant.rfind("phi", 0) == 0) {  // both read ln_1(x); the head's bias
      cfg.parallel_residual = cfg.shared_norm = cfg.head_bias = true;
      cfg.position_embedding = nn::PositionEmbedding::Rotary;
      cfg.rope_theta = 20.0;
      cfg.rope_dim = cfg.head_dim() / 2;
      cfg.tie_embeddings = false;
      if (variant.find("gpt-j") != std::string::npos) {
        cfg.linear_bias = false;
        cfg.mlp_bias = true;
      }
    } else if (variant.rfind("olmo 2", 0) == 0) {
      // The sublayers read the stream itself; the query and key norms span
      // every rank's heads (gathered, normalised whole, split again).
      cfg.normalization = nn::Normalization::RmsNorm;
      cfg.linear_bias = false;
      cfg.activation = nn::Activation::SwiGlu;
      cfg.position_embedding = nn::PositionEmbedding::Rotary;
      cfg.tie_embeddings = false;
      cfg.pre_norms = false;
      cfg.post_norms = true;
      nn::set_qk_norm(cfg, "full");
      // One head for every rank's queries: shared by them all, its keys
      // normalised once (the first rank's copy), its weights' gradient
      // summed over them.
      if (variant.find("one key/value head") != std::string::npos) {
        cfg.n_head = 8;
        cfg.n_kv_head = 1;
      }
    } else if (variant.rfind("olmo's", 0) == 0) {
      // LLaMA's blocks with LayerNorms that learn nothing: no norm
      // parameters to replicate or reduce.
      cfg.linear_bias = false;
      cfg.activation = nn::Activation::SwiGlu;
      cfg.position_embedding = nn::PositionEmbedding::Rotary;
      cfg.tie_embeddings = false;
      cfg.norm_affine = false;
      cfg.clip_qkv = 0.05;  // (inside the tiny model's spread: some values clamped)
    } else if (variant.rfind("cohere", 0) == 0) {
      // LLaMA's sublayers in parallel on one LayerNorm whose weight alone is
      // replicated; the logits scaled before the vocabulary-parallel head.
      cfg.linear_bias = false;
      cfg.activation = nn::Activation::SwiGlu;
      cfg.position_embedding = nn::PositionEmbedding::Rotary;
      cfg.parallel_residual = cfg.shared_norm = true;
      cfg.norm_bias = false;
      cfg.logit_scale = 0.5;
      if (variant.rfind("cohere 2", 0) == 0) {  // its global layer turns nothing
        cfg.sliding_window = 3;
        cfg.full_attention_layers = cfg.nope_layers = {1};
      }
      // Command R+'s head norms: each rank the weights of its own heads, a
      // key/value head shared by every rank with its weights summed.
      if (variant.find("on each head") != std::string::npos) {
        nn::set_qk_norm(cfg, "head_layernorm");
        if (variant.find("one key/value head") != std::string::npos) {
          cfg.n_head = 8;
          cfg.n_kv_head = 1;
        }
      }
    } else if (variant.rfind("granite", 0) == 0) {
      // LLaMA's blocks with Granite's scalars: each sublayer's reduced
      // output scaled before the residual add, ln_f's output scaled before
      // the vocabulary-parallel head, and the scores' own scale.
      cfg.normalization = nn::Normalization::RmsNorm;
      cfg.linear_bias = false;
      cfg.activation = nn::Activation::SwiGlu;
      cfg.position_embedding = nn::PositionEmbedding::Rotary;
      cfg.embedding_multiplier = 3.0;
      cfg.residual_multiplier = 0.3;
      cfg.logit_scale = 0.25;
      cfg.query_pre_attn_scalar = 16.0;  // scores times 1/4 rather than 1/2
    } else if (variant == "swiglu, F 24" || variant == "geglu, F 24") {
      cfg.activation = variant[0] == 's' ? nn::Activation::SwiGlu : nn::Activation::GeGlu;
      cfg.ffn_hidden_size = 24;
    } else if (variant == "relu2, F 24") {
      cfg.activation = nn::Activation::Relu2;
      cfg.ffn_hidden_size = 24;
    } else {
      cfg.position_embedding = nn::PositionEmbedding::Rotary;
      cfg.rope_theta = 20.0;
    }
    if (variant.find("sliding window") != std::string::npos) cfg.sliding_window = 3;
    if (variant.find("on layer 1 only") != std::string::npos) cfg.full_attention_layers = {0};
    cfg.qkv_bias = variant.find("qkv biases") != std::string::npos;
    if (variant.find("qk norm") != std::string::npos) {
      cfg.qk_norm = true;
      cfg.head_size = 6;
    }
    if (variant.find("packed documents") != std::string::npos) {
      cfg.eod_token = 7;
      cfg.reset_attention_mask = true;
      cfg.reset_position_ids = true;
    }
    Tensor ids = token_ids(V, 5);
    for (int64_t i : {3, 11}) ids.data<int64_t>()[i] = 7;
    const auto shapes = TensorParallelGpt(cfg, 17, g_world, GetParam()).full_shapes();
    EXPECT_EQ(shapes.count("wpe.weight"), cfg.rotary() ? 0u : 1u);
    EXPECT_EQ(shapes.count("lm_head.weight"), cfg.tie_embeddings ? 0u : 1u);
    EXPECT_EQ(shapes.count("h.0.attn.c_attn.bias"), cfg.c_attn_bias() ? 1u : 0u);
    EXPECT_EQ(shapes.count("h.0.attn.c_proj.bias"), cfg.linear_bias ? 1u : 0u);
    EXPECT_EQ(shapes.count("h.0.mlp.c_fc.bias"), cfg.mlp_biases() ? 1u : 0u);
    EXPECT_EQ(shapes.count("h.0.attn.q_norm.weight"), cfg.qk_norm ? 1u : 0u);
    EXPECT_EQ(shapes.count("h.1.post_mlp_norm.weight"), cfg.post_norms ? 1u : 0u);
    EXPECT_EQ(shapes.count("h.1.ln_2.weight"),
              cfg.shared_norm || !cfg.pre_norms || !cfg.norm_affine ? 0u : 1u);
    EXPECT_EQ(shapes.count("ln_f.weight"), cfg.norm_affine ? 1u : 0u);
    if (cfg.qk_norm_full || cfg.qk_head_layernorm) {
      EXPECT_EQ(shapes.at("h.1.attn.k_norm.weight"), (Shape{cfg.kv_heads() * cfg.head_dim()}));
      EXPECT_EQ(shapes.at("h.1.attn.q_norm.weight"), (Shape{cfg.q_width()}));
    }
    EXPECT_EQ(shapes.count("lm_head.bias"), cfg.head_bias ? 1u : 0u);
    EXPECT_EQ(shapes.at("h.0.attn.c_proj.weight"), (Shape{cfg.d_model, cfg.q_width()}));
    expect_sharded_matches_one_process(cfg, 17, GetParam(), ids, ids, token_ids(V, 6));
  }
}

// Mixtures of experts (model.moe): every expert split as the MLP is (c_fc's
// gate and up halves by rows, c_proj by columns), the router whole on every
// rank. Each rank routes the whole sequence alike (under sequence
// parallelism its own tokens, the probabilities gathered), runs its shard
// of each chosen expert, and the experts' partial sums are reduced once;
// the gates' gradient, which each rank's partial outputs give only in part,
// is all-reduced, and under sequence parallelism the router's (each rank's
// tokens) too. The load-balancing loss joins every rank's gradients alike.
// Mixtral's kind (SwiGLU, renormalised top 2, every layer), GELU experts
// on a dense first layer's model (top 1, raw probabilities), and the
// parallel residual whose attention and experts reduce together.
TEST_P(TensorParallelGptTest, MixtureOfExpertsMatchesOneProcess) {
  const int64_t V = 300;
  for (const std::string variant :
       {"mixtral's kind: swiglu, rmsnorm, rope, top 2 of 4 renormalised, balance loss",
        "gelu experts, dense layer 0, top 1 of 3, raw probabilities",
        "parallel residual, top 2 of 4, balance loss, capacity 0.75 by probability",
        "mixtral's kind, capacity 0.75 by position",
        "qwen2-moe's kind: swiglu, qkv biases, a shared expert of 8 under a sigmoid gate",
        "olmoe's kind: swiglu, qk norm over all heads, top 2 of 4, raw probabilities"}) {
    SCOPED_TRACE(variant);
    nn::GptConfig cfg = tiny(V);
    cfg.moe.experts = 4;
    cfg.moe.top_k = 2;
    cfg.moe.ffn_hidden_size = 8;
    cfg.moe.aux_loss_coef = 0.1;
    if (variant.rfind("mixtral", 0) == 0) {
      cfg.normalization = nn::Normalization::RmsNorm;
      cfg.linear_bias = false;
      cfg.activation = nn::Activation::SwiGlu;
      cfg.position_embedding = nn::PositionEmbedding::Rotary;
      cfg.rope_theta = 20.0;
      cfg.tie_embeddings = false;
    } else if (variant.rfind("gelu", 0) == 0) {
      cfg.moe.experts = 3;
      cfg.moe.top_k = 1;
      cfg.moe.normalize_top_k = false;
      cfg.moe.aux_loss_coef = 0;
      cfg.moe.dense_layers = {0};
    } else if (variant.rfind("qwen2", 0) == 0) {
      cfg.normalization = nn::Normalization::RmsNorm;
      cfg.linear_bias = false;
      cfg.qkv_bias = true;
      cfg.activation = nn::Activation::SwiGlu;
      cfg.position_embedding = nn::PositionEmbedding::Rotary;
      cfg.rope_theta = 20.0;
      cfg.moe.normalize_top_k = false;
      cfg.moe.shared_ffn_hidden_size = 8;
      cfg.moe.shared_gate = true;
    } else if (variant.rfind("olmoe", 0) == 0) {
      cfg.normalization = nn::Normalization::RmsNorm;
      cfg.linear_bias = false;
      cfg.activation = nn::Activation::SwiGlu;
      cfg.position_embedding = nn::PositionEmbedding::Rotary;
      cfg.rope_theta = 20.0;
      cfg.moe.normalize_top_k = false;
      nn::set_qk_norm(cfg, "full");
    } else {
      cfg.parallel_residual = true;
      cfg.linear_bias = false;
      ASSERT_TRUE(cfg.reduces_sublayers_at_once());
    }
    // Capacity: every rank drops the same assignments (one process's).
    if (variant.find("capacity") != std::string::npos) {
      cfg.moe.capacity_factor = 0.75;
      if (variant.find("position") != std::string::npos)
        cfg.moe.drop_policy = nn::GptConfig::Moe::DropPolicy::Position;
    }
    const Tensor ids = token_ids(V, 5);
    const auto shapes = TensorParallelGpt(cfg, 19, g_world, GetParam()).full_shapes();
    if (cfg.moe.shared_gate) {
      EXPECT_EQ(shapes.at("h.1.mlp.shared.c_fc.weight"), (Shape{16, cfg.d_model}));
      EXPECT_EQ(shapes.at("h.1.mlp.shared_gate.weight"), (Shape{1, cfg.d_model}));
    }
    EXPECT_EQ(shapes.at("h.1.mlp.router.weight"), (Shape{cfg.moe.experts, cfg.d_model}));
    EXPECT_EQ(shapes.at("h.1.mlp.experts.0.c_proj.weight"), (Shape{cfg.d_model, 8}));
    EXPECT_EQ(shapes.count("h.0.mlp.c_fc.weight"), cfg.moe.dense_layers.empty() ? 0u : 1u);
    expect_sharded_matches_one_process(cfg, 19, GetParam(), ids, ids, token_ids(V, 6));
  }
}

// Fewer key/value heads than ranks: multi-query attention (one head on
// every rank) and two heads over four ranks. Each rank computes the head its
// query heads use; the head's weight (and Qwen2's bias) gradients, partial
// sums over the ranks sharing it, are summed over them, so every holder has
// one process's gradient (not only the first, which the gathered tensors
// show), and the global norm counts each head once. One process's shared
// key/value head under RMSNorm (qk norm) and RoPE.
TEST_P(TensorParallelGptTest, SharedKeyValueHeadsMatchOneProcess) {
  const int64_t V = 300;
  for (int64_t kv : {1, 2}) {
    if (kv >= g_world->size()) continue;  // split, not shared (tested above)
    SCOPED_TRACE("key/value heads " + std::to_string(kv));
    nn::GptConfig cfg = tiny(V);
    cfg.n_head = 8;
    cfg.n_kv_head = kv;
    cfg.qkv_bias = true;
    cfg.qk_norm = true;
    cfg.normalization = nn::Normalization::RmsNorm;
    cfg.position_embedding = nn::PositionEmbedding::Rotary;
    cfg.rope_theta = 30.0;
    const Tensor ids = token_ids(V, 5), targets = token_ids(V, 6);
    expect_sharded_matches_one_process(cfg, 17, GetParam(), ids, ids, targets);
    nn::Gpt ref(cfg, 17);
    TensorParallelGpt model(cfg, 17, g_world, GetParam());
    autograd::backward({model.loss(ids, targets)});
    autograd::backward({ref.loss(ids, targets)});
    model.reduce_partial_grads();
    std::vector<Tensor> ref_params;
    for (auto& [name, p] : ref.named_parameters()) ref_params.push_back(p);
    EXPECT_NEAR(model.grad_norm(), optim::global_grad_norm(ref_params), 1e-6);
    // Every rank's c_attn gradient is its cut of one process's.
    for (auto& [name, p] : model.named_parameters()) {
      if (name.find("c_attn") == std::string::npos) continue;
      EXPECT_TRUE(model.reduces_after_backward(name)) << name;
      const Tensor want = model.shard_specs().at(name).cut(ref.find_parameter(name)->grad(),
                                                           g_world->rank(), g_world->size());
      expect_close(to_double_vector(p.grad()), to_double_vector(want), 1e-6, 1e-4, name);
    }
    // The norm counts a shared head on its first holder only.
    const bool first_holder = g_world->rank() % (g_world->size() / kv) == 0;
    EXPECT_EQ(model.repeated_elements("h.0.attn.c_attn.weight").empty(), first_holder);
  }
}

// A group that counts its all-reduces and reduce-scatters.
class CountingGroup final : public testing::ForwardingGroup {
 public:
  using ForwardingGroup::ForwardingGroup;
  dist::WorkPtr all_reduce(Tensor& t, dist::ReduceOp op) override {
    ++all_reduces;
    return ForwardingGroup::all_reduce(t, op);
  }
  dist::WorkPtr reduce_scatter(const Tensor& in, Tensor& out, dist::ReduceOp op) override {
    ++reduce_scatters;
    return ForwardingGroup::reduce_scatter(in, out, op);
  }
  int all_reduces = 0, reduce_scatters = 0;
};

// GPT-NeoX's parallel residual sums the attention's and the MLP's
// row-parallel shares and reduces them once: a forward pass makes one
// reduction per layer fewer than the same model wired sequentially (with
// sequence parallelism, one reduce-scatter fewer), and the same losses as
// one process (LlamaOptionsMatchOneProcess). With dropout, each sublayer's
// output is dropped out apart, and both reduce.
TEST(TensorParallelGpt, ParallelResidualReducesBothSublayersAtOnce) {
  if (g_world->size() == 1) GTEST_SKIP() << "nothing to reduce on one rank";
  const Tensor ids = token_ids(300, 5), targets = token_ids(300, 6);
  for (const bool sp : {false, true}) {
    for (const double dropout : {0.0, 0.1}) {
      SCOPED_TRACE(std::string(sp ? "sp" : "no sp") + ", dropout " + std::to_string(dropout));
      int reductions[2];
      for (const bool parallel : {false, true}) {
        nn::GptConfig cfg = tiny(300);
        cfg.parallel_residual = parallel;
        cfg.dropout = dropout;
        auto counting = std::make_shared<CountingGroup>(g_world);
        TensorParallelGpt model(cfg, 17, counting, sp);
        const double loss = item(model.loss(ids, targets));
        EXPECT_TRUE(std::isfinite(loss));
        reductions[parallel] = sp ? counting->reduce_scatters : counting->all_reduces;
      }
      EXPECT_EQ(reductions[0] - reductions[1], dropout > 0 ? 0 : tiny(300).n_layer);
    }
  }
}

// The partial gradients after backward — under sequence parallelism every
// norm and row-parallel bias, the query/key norms, a shared key/value
// head's rows — are summed by one all-reduce, not one per tensor (a
// 12-layer model under sequence parallelism has 75 of them), and the sums
// are each tensor's own all-reduce's.
TEST(TensorParallelGpt, PartialGradientsAreSummedInOneAllReduce) {
  if (g_world->size() == 1) GTEST_SKIP() << "nothing to sum on one rank";
  nn::GptConfig cfg = tiny(300);
  cfg.n_head = 8;
  cfg.n_kv_head = 1;
  cfg.qk_norm = true;
  const Tensor ids = token_ids(300, 5), targets = token_ids(300, 6);
  auto counting = std::make_shared<CountingGroup>(g_world);
  TensorParallelGpt model(cfg, 17, counting, /*sequence_parallel=*/true);
  autograd::backward({model.loss(ids, targets)});
  // Each partial gradient summed on its own, for comparison.
  std::map<std::string, Tensor> want;
  int partial = 0;
  for (auto& [name, p] : model.named_parameters()) {
    if (!model.reduces_after_backward(name)) continue;
    ++partial;
    want[name] = clone(p.grad());
    if (model.shard_specs().at(name).partial_grad)
      g_world->all_reduce(want[name], dist::ReduceOp::Sum)->wait();
  }
  EXPECT_GT(partial, 10);
  counting->all_reduces = 0;
  model.reduce_partial_grads();
  EXPECT_EQ(counting->all_reduces, 1);
  for (const auto& [name, w] : want) {
    if (!model.shard_specs().at(name).partial_grad) continue;  // (the shared head: above)
    // (Bit for bit on two ranks; more may add in another order.)
    const bool two = g_world->size() == 2;
    expect_close(to_double_vector(model.find_parameter(name)->grad()), to_double_vector(w),
                 two ? 0.0 : 1e-7, two ? 0.0 : 1e-6, name);
  }
}

// A rank never holds the whole model on the host while it initialises or
// reads init.from: its shards, and one full tensor (initialisation) or one
// block of the file (reading) beside them. Measured by the host allocator's
// peak against the full model's bytes; the loaded shards are the file's.
TEST(TensorParallelGpt, InitAndLoadingHoldOneBlockOfTheModelAtATime) {
  nn::GptConfig cfg = tiny(60);
  cfg.n_layer = 16;
  testing::TempDir dir;
  const std::string path = dir.file("weights.safetensors");
  int64_t model_bytes = 0;
  {
    nn::Gpt source(cfg, 5);
    io::save_gpt2_safetensors(source, path);
    for (const auto& [name, p] : source.named_parameters()) model_bytes += p.nbytes();
  }
  Allocator& host = cpu_allocator();
  const int64_t before = host.stats().allocated;
  host.reset_peak();
  auto model = std::make_unique<TensorParallelGpt>(cfg, 1, g_world, false);
  const int64_t init_peak = host.stats().peak_allocated - before;
  host.reset_peak();
  int parts = 0;
  io::read_gpt2_weights(path, model->full_shapes(), nullptr, [&](nn::StateDict&& part) {
    model->load_full_tensors(part);
    ++parts;
  });
  const int64_t load_peak = host.stats().peak_allocated - before;
  EXPECT_EQ(parts, 1 + cfg.n_layer);  // the tensors outside the blocks, then each block
  const double bound = static_cast<double>(model_bytes) * (1.0 / g_world->size() + 0.25);
  EXPECT_LT(static_cast<double>(init_peak), bound) << "of a " << model_bytes << "-byte model";
  EXPECT_LT(static_cast<double>(load_peak), bound) << "of a " << model_bytes << "-byte model";
  // What was loaded is the file's model.
  const nn::StateDict loaded = model->full_state_dict();
  model.reset();
  const nn::Gpt source(cfg, 5);
  for (const auto& [name, p] : source.named_parameters()) {
    ASSERT_EQ(to_double_vector(loaded.at(name)), to_double_vector(p)) << name;
  }
}

// A target outside the vocabulary is named, as one process's loss names it
// (each shard alone cannot tell it from another shard's token).
TEST(TensorParallelGpt, ATargetOutsideTheVocabularyIsNamed) {
  TensorParallelGpt model(tiny(300), 1, g_world, false);
  Tensor targets = token_ids(300, 2);
  targets.data<int64_t>()[5] = 300;
  try {
    model.loss(token_ids(300, 1), targets);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("target 300 at row 5 is outside [0, 300)"),
              std::string::npos)
        << e.what();
  }
}

TEST_P(TensorParallelGptTest, ThreeAdamWStepsGiveTheSameLosses) {
  const bool sp = GetParam();
  const int64_t V = 200;
  nn::Gpt ref(tiny(V), 12);
  TensorParallelGpt model(tiny(V), 12, g_world, sp);
  optim::AdamWOptions o;
  o.lr = 1e-2;
  optim::AdamW a(ref.named_parameters(), o), b(model.named_parameters(), o);
  for (int step = 0; step < 3; ++step) {
    Tensor ids = token_ids(V, 10 + step), targets = token_ids(V, 20 + step);
    Tensor lr = ref.loss(ids, targets), l = model.loss(ids, targets);
    EXPECT_NEAR(item(l), item(lr), 1e-5 * item(lr)) << "step " << step;
    autograd::backward({lr});
    autograd::backward({l});
    model.reduce_partial_grads();
    a.step(o.lr);
    b.step(o.lr);
    ref.zero_grad();
    model.zero_grad();
  }
}

// Global-norm clipping over the sharded model: the norm of one process's
// model (split parameters summed over the group, replicated ones once), and
// the clipped gradients equal one process's clipped gradients.
TEST_P(TensorParallelGptTest, ClippingEqualsOneProcessClipping) {
  const bool sp = GetParam();
  const int64_t V = 300;
  nn::Gpt ref(tiny(V), 13);
  TensorParallelGpt model(tiny(V), 13, g_world, sp);
  Tensor ids = token_ids(V, 3), targets = token_ids(V, 4);
  autograd::backward({ref.loss(ids, targets)});
  autograd::backward({model.loss(ids, targets)});
  model.reduce_partial_grads();
  const double unclipped = model.grad_norm();
  const double max_norm = 0.25 * unclipped;  // so that clipping scales
  const double want = optim::clip_grad_norm(ref.parameters(), max_norm);
  EXPECT_NEAR(unclipped, want, 1e-5 * want);
  EXPECT_NEAR(model.clip_grad_norm(max_norm), want, 1e-5 * want);  // the norm before clipping
  EXPECT_NEAR(model.grad_norm(), max_norm, 1e-4 * max_norm);       // after it
  const nn::StateDict grads = full_grads(model);
  for (auto& [name, p] : ref.named_parameters()) {
    expect_close(to_double_vector(grads.at(name)), to_double_vector(p.grad()), 1e-7, 1e-4, name);
  }
  // max_norm 0 reports the norm and leaves the gradients alone.
  EXPECT_NEAR(model.clip_grad_norm(0.0), max_norm, 1e-4 * max_norm);
  EXPECT_NEAR(model.grad_norm(), max_norm, 1e-4 * max_norm);
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, TensorParallelGptTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "SP" : "NoSP";
                         });

// The RNG rule: every dropout site draws one process's mask, a
// sequence-parallel shard its slice's elements of it (nn::sequence_dropout),
// so the loss equals one process's with and without sequence parallelism,
// on every rank; the masks matter (evaluation's loss is another).
TEST(TensorParallelGpt, DropoutFollowsTheRngRule) {
  nn::GptConfig c = tiny(100);
  c.dropout = 0.2;
  Tensor ids = token_ids(100, 5), targets = token_ids(100, 6);
  const nn::ForwardContext ctx{true, 77, 3};
  nn::Gpt ref(c, 4);
  const double want = item(ref.loss(ids, targets, ctx));
  EXPECT_NE(item(ref.loss(ids, targets, nn::ForwardContext{})), want);
  TensorParallelGpt plain(c, 4, g_world, false);
  EXPECT_NEAR(item(plain.loss(ids, targets, ctx)), want, 1e-6 * want);
  TensorParallelGpt sp(c, 4, g_world, true);
  const double a = item(sp.loss(ids, targets, ctx));
  EXPECT_NEAR(a, want, 1e-6 * want);
  Tensor t = from_vector(std::vector<double>{a}, {1}, DType::F64), hi = clone(t), lo = clone(t);
  g_world->all_reduce(hi, dist::ReduceOp::Max)->wait();
  g_world->all_reduce(lo, dist::ReduceOp::Min)->wait();
  EXPECT_EQ(item(hi), item(lo));  // every rank reports the same loss
}

// One process's model `c` (seed `seed`, its adapters' B random from
// stream `first_stream` on) against a tensor-parallel one loaded from it: a
// training pass drawing dropout masks (seed `draw`; evaluation and another
// call must give other losses, so the masks matter) gives the same loss
// and, summed over the group, every gradient. The parameters compared are appended to `compared`.
void expect_lora_matches_one_process(const nn::GptConfig& c, uint64_t seed, uint64_t first_stream,
                                     uint64_t draw, bool sp, std::vector<std::string>& compared) {
  const int64_t V = c.vocab_size;
  nn::Gpt ref(c, seed);
  uint64_t stream = first_stream;
  for (auto& [name, t] : ref.named_parameters()) {
    if (name.ends_with(".lora_b")) copy_(t, randn(t.shape(), seed, stream++, 0.3));
  }
  TensorParallelGpt model(c, seed, g_world, sp);
  model.load_full_state_dict(ref.state_dict());
  Tensor ids = token_ids(V, 3), targets = token_ids(V, 4);
  const nn::ForwardContext ctx{true, draw, 3};
  Tensor l = model.loss(ids, targets, ctx), lr = ref.loss(ids, targets, ctx);
  EXPECT_NEAR(item(l), item(lr), 1e-6 * item(lr));
  const double eval = item(ref.loss(ids, targets, nn::ForwardContext{false, draw, 3}));
  const double other = item(ref.loss(ids, targets, nn::ForwardContext{true, draw, 4}));
  EXPECT_GT(std::abs(eval - item(lr)), 1e-5);
  EXPECT_GT(std::abs(other - item(lr)), 1e-5);
  autograd::backward({l});
  autograd::backward({lr});
  model.reduce_partial_grads();
  const nn::StateDict grads = full_grads(model);
  for (auto& [name, p] : ref.named_parameters()) {
    expect_close(to_double_vector(grads.at(name)), to_double_vector(p.grad()), 1e-6, 1e-4, name);
    compared.push_back(name);
  }
}

// LoRA's dropout (model.lora.dropout) draws each element's mask from its
// place in the whole input, so the column-parallel layers (their input
// whole, or gathered under SP) and the row-parallel ones (a slice of the
// features each) drop exactly what one process drops: the same loss and
// gradients, with or without sequence parallelism. B is random, so that the
// adapters (and the masks) matter.
TEST_P(TensorParallelGptTest, LoraDropoutDrawsTheMasksOfOneProcess) {
  const bool sp = GetParam();
  const int64_t V = 100;
  nn::GptConfig c = tiny(V);
  c.lora = {.rank = 2, .alpha = 4, .targets = nn::GptConfig::lora_layers(), .dropout = 0.3};
  std::vector<std::string> compared;
  expect_lora_matches_one_process(c, 6, 50, 77, sp, compared);
  EXPECT_EQ(std::count_if(compared.begin(), compared.end(),
                          [](const std::string& n) { return nn::is_lora_adapter(n); }),
            2 * 4 * 2);
}

// LoRA on a mixture's experts (model.lora.targets mlp.c_fc, mlp.c_proj):
// each expert's and the shared expert's adapters split with their shards
// (c_fc's B by its gate and up rows, c_proj's A by columns; c_fc's A and
// c_proj's B whole, their gradients summed over the group), with dropout
// on their input: every rank runs the gathered tokens through its shards
// and draws its slice of one process's masks, so loss and gradients are one
// process's, with or without sequence parallelism.
TEST_P(TensorParallelGptTest, LoraOnExpertsMatchesOneProcess) {
  const bool sp = GetParam();
  const int64_t V = 100;
  nn::GptConfig c = tiny(V);
  c.normalization = nn::Normalization::RmsNorm;
  c.linear_bias = false;
  c.activation = nn::Activation::SwiGlu;
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.rope_theta = 20.0;
  c.moe = {.experts = 4,
           .top_k = 2,
           .ffn_hidden_size = 8,
           .aux_loss_coef = 0.1,
           .dense_layers = {0},
           .shared_ffn_hidden_size = 8,
           .shared_gate = true};
  c.lora = {
      .rank = 2, .alpha = 4, .targets = {"attn.c_attn", "mlp.c_fc", "mlp.c_proj"}, .dropout = 0.3};
  c.validate();
  std::vector<std::string> compared;
  expect_lora_matches_one_process(c, 8, 70, 78, sp, compared);
  EXPECT_EQ(std::count_if(compared.begin(), compared.end(),
                          [](const std::string& n) {
                            return nn::is_lora_adapter(n) && n.find(".mlp.experts.") != n.npos;
                          }),
            4 * 2 * 2);  // 4 experts' c_fc and c_proj, A and B, in layer 1
}

// Full recomputation under TP + SP with dropout: the same loss and gradients
// as keeping every activation, while the graph holds far less.
TEST(TensorParallelGpt, FullRecomputationChangesNothingButMemory) {
  nn::GptConfig c = tiny(100);
  c.dropout = 0.1;
  Tensor ids = token_ids(100, 7), targets = token_ids(100, 8);
  const nn::ForwardContext ctx{true, 31, 1};
  auto run = [&](nn::Recompute r, int64_t* held, int64_t layers = 0) {
    c.recompute = r;
    c.recompute_layers = layers;
    auto m = std::make_unique<TensorParallelGpt>(c, 9, g_world, true);
    const int64_t before = cpu_allocator().stats().allocated;
    Tensor l = m->loss(ids, targets, ctx);
    *held = cpu_allocator().stats().allocated - before;
    autograd::backward({l});
    m->reduce_partial_grads();
    return std::make_pair(item(l), std::move(m));
  };
  int64_t held_none = 0, held_full = 0;
  auto [loss_none, plain] = run(nn::Recompute::None, &held_none);
  auto [loss_full, again] = run(nn::Recompute::Full, &held_full);
  EXPECT_EQ(loss_full, loss_none);
  auto want = plain->state_dict();
  for (auto& [name, p] : again->named_parameters()) {
    expect_close(to_double_vector(p.grad()), to_double_vector(want.at(name).grad()), 1e-7, 1e-6,
                 name);
  }
  EXPECT_LT(held_full * 2, held_none) << "full " << held_full << " none " << held_none;
  // model.recompute_layers: the first block recomputes, the second keeps
  // its activations; the same gradients, the memory between.
  ASSERT_EQ(c.n_layer, 2);
  int64_t held_first = 0;
  auto [loss_first, first] = run(nn::Recompute::Full, &held_first, 1);
  EXPECT_EQ(loss_first, loss_none);
  for (auto& [name, p] : first->named_parameters()) {
    expect_close(to_double_vector(p.grad()), to_double_vector(want.at(name).grad()), 1e-7, 1e-6,
                 name);
  }
  EXPECT_LT(held_full, held_first);
  EXPECT_LT(held_first, held_none);
}

TEST(TensorParallelGpt, ConfigErrorsNameTheNumbers) {
  if (g_world->size() < 2) GTEST_SKIP();
  nn::GptConfig c = tiny(100);
  c.n_head = 3;
  c.d_model = 30;
  try {
    TensorParallelGpt m(c, 1, g_world, false);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_head (3) must be divisible by parallel.tp"),
              std::string::npos)
        << e.what();
  }
  nn::GptConfig g = tiny(100);
  g.n_head = 12;  // 3 key/value heads neither split nor share over 2 or 4 ranks
  g.d_model = 48;
  g.n_kv_head = 3;
  if (g_world->size() > 1) {
    try {
      TensorParallelGpt m(g, 1, g_world, false);
      FAIL();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("model.n_kv_head (3) must be divisible by parallel.tp"),
                std::string::npos)
          << e.what();
    }
  }
  nn::GptConfig s = tiny(100);
  s.seq_len = 9;
  EXPECT_THROW(TensorParallelGpt(s, 1, g_world, true), ConfigError);
  EXPECT_EQ(padded_vocab(300, 2), 512);
  EXPECT_EQ(padded_vocab(50257, 1), 50304);
}

// Muon's updates of split matrices, each orthogonalised whole by one rank
// of the group (tp::ShardedMuon): every rank's shard of every update is its
// cut of the update of the whole matrix, for column blocks of two widths
// (grouped-query attention's q, k and v, the key/value heads shared by
// ranks under tp 4), two equal blocks (SwiGLU's), a row-parallel matrix and
// a replicated one, in more matrices than ranks (rounds, the last short).
TEST(ShardedMuon, EachShardGetsItsCutOfTheWholeMatrixsUpdate) {
  const int P = g_world->size(), me = g_world->rank();
  optim::MuonOptions o;
  std::map<std::string, ShardedMuon::Matrix> matrices;
  std::vector<std::string> names;
  std::vector<Tensor> wholes;  // each matrix's full u, the same on every rank
  auto add = [&](const std::string& name, ShardSpec spec, Shape shape, std::vector<int64_t> blocks,
                 uint64_t seed) {
    matrices[name] = {spec, shape, blocks};
    names.push_back(name);
    wholes.push_back(randn(shape, 61, seed));
  };
  // 4 heads of 4 and 2 key/value heads: q 16 rows, k and v 8 each.
  add("qkv", ShardSpec::along_blocks(0, {16, 8, 8}, {4, 4, 4}), {32, 12}, {16, 8, 8}, 1);
  add("gate_value", ShardSpec::along(0, 2), {16, 12}, {8, 8}, 2);
  add("row", ShardSpec::along(1), {12, 16}, {}, 3);
  add("replicated", ShardSpec::replicated(), {6, 5}, {}, 4);
  for (int k = 0; k < P + 1; ++k)
    add("column" + std::to_string(k), ShardSpec::along(0), {8, 6}, {}, 10 + k);
  const ShardedMuon muon(g_world, matrices, o);
  std::vector<int> asked(names.size(), 0), applied(names.size(), 0);
  muon.update(
      names,
      [&](size_t i) {
        ++asked[i];
        return matrices.at(names[i]).spec.cut(wholes[i], me, P);
      },
      [&](size_t i, const Tensor& update) {
        ++applied[i];
        const auto& m = matrices.at(names[i]);
        const Tensor want =
            m.spec.cut(optim::muon_update(wholes[i], m.row_blocks, o, names[i]), me, P);
        expect_close(to_double_vector(update), to_double_vector(want), 1e-6, 1e-6, names[i]);
      });
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(asked[i], 1) << names[i];
    EXPECT_EQ(applied[i], 1) << names[i];
  }
  EXPECT_THROW(muon.update(
                   {"unknown"}, [](size_t) { return Tensor(); }, [](size_t, const Tensor&) {}),
               ValueError);
}

}  // namespace
}  // namespace triad::tp

int main(int argc, char** argv) {
  return triad::testing::run_mpi_tests(
      argc, argv, [](const triad::dist::ProcessGroupPtr& w) { triad::tp::g_world = w; },
      [] { triad::tp::g_world.reset(); });
}
