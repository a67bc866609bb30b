// The five autograd features DESIGN.md requires, one test each (and more).
#include <gtest/gtest.h>

#include <functional>

#include "triad/autograd/engine.h"
#include "triad/autograd/grad_mode.h"
#include "triad/ops.h"

namespace triad {
namespace {

std::vector<double> vec(const Tensor& t) {
  return to_double_vector(t);
}

void expect_all_near(const std::vector<double>& a, const std::vector<double>& b,
                     double tol = 1e-12) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], tol) << "element " << i;
}

TEST(Autograd, BackwardFromNonScalarOutputWithGivenGradient) {
  Tensor x = randn({3, 4}, 1, 1, 1.0, DType::F64);
  x.set_requires_grad(true);
  Tensor y = mul(x, x);  // dy/dx = 2x
  Tensor g = randn({3, 4}, 1, 2, 1.0, DType::F64);
  autograd::backward({y}, {g});
  auto xv = vec(x), gv = vec(g), grad = vec(x.grad());
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(grad[i], 2 * xv[i] * gv[i], 1e-12);
}

TEST(Autograd, GradientShapeMismatchIsAnError) {
  Tensor x = randn({3, 4}, 1, 1);
  x.set_requires_grad(true);
  Tensor y = scale(x, 2.0);
  EXPECT_THROW(autograd::backward({y}, {zeros({4, 3})}), ShapeError);
  EXPECT_THROW(autograd::backward({y}), ShapeError);  // implicit seed needs one element
}

TEST(Autograd, GradientsAccumulateAcrossMicrobatches) {
  Tensor w = randn({4, 3}, 2, 1, 1.0, DType::F64);
  w.set_requires_grad(true);
  Tensor x1 = randn({5, 3}, 2, 2, 1.0, DType::F64), x2 = randn({5, 3}, 2, 3, 1.0, DType::F64);
  autograd::backward({sum(linear(x1, w))});
  auto g1 = vec(w.grad());
  autograd::backward({sum(linear(x2, w))});
  auto g12 = vec(w.grad());
  // Reference: a fresh leaf, each microbatch alone.
  Tensor w2 = clone(w).detach();
  w2.set_requires_grad(true);
  autograd::backward({sum(linear(x2, w2))});
  auto g2 = vec(w2.grad());
  for (size_t i = 0; i < g12.size(); ++i) EXPECT_NEAR(g12[i], g1[i] + g2[i], 1e-12);
}

// A leaf's first gradient is taken as it is when nothing else holds it (no
// copy); a gradient that something else still holds, or that shares memory
// with another tensor, is copied, so accumulating into one leaf never
// changes another's gradient or the other holder's tensor.
TEST(Autograd, ALeafTakesAGradientNothingElseHolds) {
  // `op` passes x through; its backward returns `make(g)` for x.
  auto through = [](const Tensor& x, std::function<Tensor(const Tensor&)> make) {
    Tensor y = clone(x).detach();
    autograd::record(
        "through", {x}, {y},
        [make](const autograd::TensorList& g) -> autograd::TensorList { return {make(g[0])}; });
    return y;
  };
  Tensor w = randn({4, 3}, 5, 1);
  w.set_requires_grad(true);
  const void* made = nullptr;
  autograd::backward({through(w,
                              [&](const Tensor& g) {
                                Tensor fresh = scale(g, 2.0);
                                made = fresh.raw_data();
                                return fresh;
                              })},
                     {full({4, 3}, 1.0)});
  EXPECT_EQ(w.grad().raw_data(), made);  // taken, not copied
  expect_all_near(vec(w.grad()), std::vector<double>(12, 2.0));

  // Held elsewhere: copied; the holder's tensor is untouched by later
  // accumulation into the leaf.
  Tensor v = randn({4, 3}, 5, 2);
  v.set_requires_grad(true);
  std::vector<Tensor> kept;
  for (int micro = 0; micro < 2; ++micro) {
    autograd::backward({through(v,
                                [&](const Tensor& g) {
                                  kept.push_back(scale(g, 3.0));
                                  return kept.back();
                                })},
                       {full({4, 3}, 1.0)});
  }
  EXPECT_NE(v.grad().raw_data(), kept[0].raw_data());
  expect_all_near(vec(v.grad()), std::vector<double>(12, 6.0));
  expect_all_near(vec(kept[0]), std::vector<double>(12, 3.0));

  // A view sharing memory with a larger tensor: copied.
  Tensor u = randn({3}, 5, 3);
  u.set_requires_grad(true);
  autograd::backward({through(u,
                              [&](const Tensor&) {
                                Tensor big = full({6}, 4.0);
                                return narrow(big, 0, 0, 3);
                              })},
                     {full({3}, 1.0)});
  expect_all_near(vec(u.grad()), std::vector<double>(3, 4.0));
  EXPECT_EQ(u.grad().storage()->nbytes(), 3 * sizeof(float));

  // One gradient for two leaves (an add's backward hands both the same
  // tensor): neither takes it, and their gradients stay apart.
  Tensor a = randn({2, 2}, 5, 4), b = randn({2, 2}, 5, 5);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  autograd::backward({add(a, b)}, {full({2, 2}, 1.0)});
  EXPECT_NE(a.grad().raw_data(), b.grad().raw_data());
  autograd::backward({scale(a, 5.0)}, {full({2, 2}, 1.0)});
  expect_all_near(vec(a.grad()), std::vector<double>(4, 6.0));
  expect_all_near(vec(b.grad()), std::vector<double>(4, 1.0));
}

TEST(Autograd, GradReadyHookRunsAfterAccumulationWithFinalValue) {
  Tensor a = randn({2, 2}, 3, 1), b = randn({2, 2}, 3, 2);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  std::vector<std::string> order;
  std::vector<double> seen_a;
  a.register_post_accumulate_hook([&](Tensor& g) {
    order.push_back("a");
    seen_a = vec(g);
  });
  b.register_post_accumulate_hook([&](Tensor&) { order.push_back("b"); });
  // b is used only at the end of the graph, a at the start: b's gradient is
  // ready first, as with the last layer of a network.
  Tensor h = mul(a, a);
  Tensor y = sum(mul(h, b));
  autograd::backward({y});
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], "b");
  EXPECT_EQ(order[1], "a");
  expect_all_near(seen_a, vec(a.grad()));
}

TEST(Autograd, HookRequiresALeafThatRequiresGrad) {
  Tensor a = randn({2}, 3, 1);
  EXPECT_THROW(a.register_post_accumulate_hook([](Tensor&) {}), ValueError);
}

TEST(Autograd, DeferredWeightGradientsMatchImmediateOnes) {
  auto make = [] {
    Tensor x = randn({4, 6}, 4, 1, 1.0, DType::F64);
    Tensor w1 = randn({5, 6}, 4, 2, 1.0, DType::F64), b1 = randn({5}, 4, 3, 1.0, DType::F64);
    Tensor w2 = randn({3, 5}, 4, 4, 1.0, DType::F64);
    x.set_requires_grad(true);
    w1.set_requires_grad(true);
    b1.set_requires_grad(true);
    w2.set_requires_grad(true);
    return std::vector<Tensor>{x, w1, b1, w2};
  };
  auto forward = [](const std::vector<Tensor>& p) {
    return sum(linear(gelu(linear(p[0], p[1], p[2])), p[3]));
  };
  auto ref = make();
  autograd::backward({forward(ref)});

  auto split = make();
  autograd::WeightGradStore store;
  autograd::BackwardOptions opts;
  opts.defer_weight_grads = &store;
  int hook_calls = 0;
  split[1].register_post_accumulate_hook([&](Tensor&) { ++hook_calls; });
  autograd::backward({forward(split)}, {}, opts);
  // B: input gradient now, weight gradients not yet.
  ASSERT_TRUE(split[0].grad().defined());
  EXPECT_FALSE(split[1].grad().defined());
  EXPECT_FALSE(split[2].grad().defined());
  EXPECT_FALSE(split[3].grad().defined());
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(hook_calls, 0);
  expect_all_near(vec(split[0].grad()), vec(ref[0].grad()));
  // W: later.
  store.flush();
  EXPECT_TRUE(store.empty());
  EXPECT_EQ(hook_calls, 1);
  for (int i = 1; i < 4; ++i) expect_all_near(vec(split[i].grad()), vec(ref[i].grad()));
}

// One micro-batch through a bf16 linear layer (x [3, 5, 40], w [6, 40],
// b [6]; seeds by micro-batch), backward with its weight gradients now or
// deferred: what it adds to w's and b's gradients, exactly (x^T dy and the
// column sums of dy, in double).
struct LinearGrads {
  std::vector<double> w, b;
};
LinearGrads linear_micro_batch(const Tensor& w, const Tensor& b, uint64_t seed, uint64_t micro,
                               bool deferred) {
  const Tensor x = randn({3, 5, 40}, seed, 10 + micro, 1.0, DType::BF16);
  const Tensor dy = randn({3, 5, 6}, seed, 20 + micro, 1.0, DType::BF16);
  autograd::WeightGradStore store;
  autograd::BackwardOptions opts;
  if (deferred) opts.defer_weight_grads = &store;
  autograd::backward({linear(x, w, b)}, {dy}, opts);
  store.flush();
  const auto xv = vec(x), dv = vec(dy);
  LinearGrads g{std::vector<double>(6 * 40, 0.0), std::vector<double>(6, 0.0)};
  for (size_t o = 0; o < 6; ++o)
    for (size_t r = 0; r < 15; ++r) {
      g.b[o] += dv[r * 6 + o];
      for (size_t i = 0; i < 40; ++i) g.w[o * 40 + i] += dv[r * 6 + o] * xv[r * 40 + i];
    }
  return g;
}

// A bf16 linear layer's weight gradient is the weight-gradient GEMM's f32
// result added into the f32 gradient (gradient-accumulation fusion), not a
// bf16-rounded product added afterwards (and its bias's, the column sums): over two micro-batches
// it equals the exact sum of x^T dy products of the bf16 values to f32 precision, where rounding
// each product to bf16 would be off by ~2^-9 of its size.
TEST(Autograd, HalfWeightGradientsAccumulateInF32WithoutRounding) {
  for (bool deferred : {false, true}) {
    SCOPED_TRACE(deferred ? "deferred (zero-bubble W)" : "immediate");
    Tensor w = randn({6, 40}, 7, 1, 1.0, DType::BF16), b = randn({6}, 7, 2, 1.0, DType::BF16);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    int hooks = 0;
    w.register_post_accumulate_hook([&](Tensor& g) {
      ++hooks;
      EXPECT_EQ(g.dtype(), DType::F32);
    });
    std::vector<double> want(6 * 40, 0.0), want_b(6, 0.0);
    for (uint64_t micro = 0; micro < 2; ++micro) {
      const LinearGrads add = linear_micro_batch(w, b, 7, micro, deferred);
      for (size_t k = 0; k < want.size(); ++k) want[k] += add.w[k];
      for (size_t k = 0; k < want_b.size(); ++k) want_b[k] += add.b[k];
    }
    EXPECT_EQ(hooks, 2);  // the weight's, one per micro-batch, as AccumulateGrad runs them
    ASSERT_EQ(w.grad().dtype(), DType::F32);
    const auto got = vec(w.grad());
    for (size_t k = 0; k < want.size(); ++k)
      ASSERT_NEAR(got[k], want[k], 2e-6 * (1 + std::abs(want[k]))) << "element " << k;
    // The bias's column sums likewise, summed into its f32 gradient.
    ASSERT_EQ(b.grad().dtype(), DType::F32);
    const auto got_b = vec(b.grad());
    for (size_t k = 0; k < want_b.size(); ++k)
      ASSERT_NEAR(got_b[k], want_b[k], 2e-6 * (1 + std::abs(want_b[k]))) << "bias element " << k;
  }
}

// train.grad_precision bf16: a half leaf marked set_half_grad accumulates
// its gradient in its own dtype, through the fused weight-gradient GEMMs
// (direct and deferred) and through AccumulateGrad alike: each
// micro-batch's sum rounded into the bf16 buffer.
TEST(Autograd, HalfGradLeavesAccumulateInTheirOwnDtype) {
  for (const bool deferred : {false, true}) {
    SCOPED_TRACE(deferred ? "deferred" : "direct");
    Tensor w = randn({6, 40}, 17, 1, 0.1, DType::BF16), b = randn({6}, 17, 2, 0.1, DType::BF16);
    Tensor s = randn({5}, 17, 3, 1.0, DType::BF16);
    for (Tensor* t : {&w, &b, &s}) {
      t->set_requires_grad(true);
      t->set_half_grad(true);
      EXPECT_EQ(t->grad_dtype(), DType::BF16);
    }
    int hooks = 0;
    w.register_post_accumulate_hook([&](Tensor& g) {
      ++hooks;
      EXPECT_EQ(g.dtype(), DType::BF16);
    });
    std::vector<double> want(6 * 40, 0.0), want_b(6, 0.0), want_s(5, 0.0);
    for (uint64_t micro = 0; micro < 2; ++micro) {
      // What this micro-batch adds, then rounded into the buffer.
      const LinearGrads add = linear_micro_batch(w, b, 17, micro, deferred);
      // A leaf reached by an elementwise op: AccumulateGrad's path.
      autograd::backward({scale(s, 3.0)}, {full({5}, 0.5, DType::BF16)});
      auto round_in = [](std::vector<double>& acc, const std::vector<double>& part) {
        for (size_t k = 0; k < acc.size(); ++k)
          acc[k] =
              vec(cast(from_vector(std::vector<double>{acc[k] + part[k]}, {1}), DType::BF16))[0];
      };
      round_in(want, add.w);
      round_in(want_b, add.b);
      round_in(want_s, std::vector<double>(5, 1.5));
    }
    EXPECT_EQ(hooks, 2);
    ASSERT_EQ(w.grad().dtype(), DType::BF16);
    ASSERT_EQ(b.grad().dtype(), DType::BF16);
    ASSERT_EQ(s.grad().dtype(), DType::BF16);
    // Within a rounding step of bf16 (the f32 sums inside the GEMM may differ
    // from these in the last places and round the other way).
    const auto got = vec(w.grad()), got_b = vec(b.grad());
    for (size_t k = 0; k < want.size(); ++k)
      ASSERT_NEAR(got[k], want[k], std::abs(want[k]) / 128 + 1e-6) << "element " << k;
    for (size_t k = 0; k < want_b.size(); ++k)
      ASSERT_NEAR(got_b[k], want_b[k], std::abs(want_b[k]) / 128 + 1e-6) << "bias " << k;
    EXPECT_EQ(vec(s.grad()), want_s);
  }
  // f32 leaves are not affected by the mark.
  Tensor f = randn({3}, 17, 4, 1.0);
  f.set_half_grad(true);
  EXPECT_EQ(f.grad_dtype(), DType::F32);
}

// A bias parameter added by add() (the tensor-parallel row-parallel
// layers' bias, added after the reduction) takes the column sums straight
// into its f32 gradient as well; a non-broadcast or non-leaf operand does
// not.
TEST(Autograd, BroadcastBiasGradientsAccumulateInF32) {
  Tensor b = randn({7}, 10, 1, 1.0, DType::BF16);
  b.set_requires_grad(true);
  std::vector<double> want(7, 0.0);
  for (uint64_t micro = 0; micro < 2; ++micro) {
    const Tensor x = randn({3, 30, 7}, 10, 2 + micro, 1.0, DType::BF16);
    const Tensor dy = randn({3, 30, 7}, 10, 4 + micro, 1.0, DType::BF16);
    autograd::backward({add(x, b)}, {dy});
    const auto dv = vec(dy);
    for (size_t r = 0; r < 90; ++r)
      for (size_t c = 0; c < 7; ++c) want[c] += dv[r * 7 + c];
  }
  ASSERT_EQ(b.grad().dtype(), DType::F32);
  const auto got = vec(b.grad());
  for (size_t c = 0; c < 7; ++c)
    ASSERT_NEAR(got[c], want[c], 2e-6 * (1 + std::abs(want[c]))) << "element " << c;
  // Same shapes (no broadcast) and a bias reached through another op: the
  // gradient flows as before.
  Tensor a = randn({2, 3}, 10, 6, 1.0, DType::F64), base = randn({3}, 10, 7, 1.0, DType::F64);
  a.set_requires_grad(true);
  base.set_requires_grad(true);
  autograd::backward({add(a, scale(base, 3.0))}, {full({2, 3}, 1.0, DType::F64)});
  expect_all_near(vec(a.grad()), std::vector<double>(6, 1.0));
  expect_all_near(vec(base.grad()), std::vector<double>(3, 6.0));
}

// A weight that is not a leaf (here a scaled leaf) still gets its gradient
// through the graph, and a leaf whose gradient buffer has another dtype is
// left to AccumulateGrad.
TEST(Autograd, LinearWeightGradientsReachNonLeafWeightsAndOddBuffers) {
  Tensor x = randn({4, 3}, 8, 1, 1.0, DType::F64);
  Tensor base = randn({2, 3}, 8, 2, 1.0, DType::F64);
  base.set_requires_grad(true);
  const Tensor dy = randn({4, 2}, 8, 3, 1.0, DType::F64);
  autograd::backward({linear(x, scale(base, 2.0))}, {dy});
  const Tensor want = matmul(transpose(dy, 0, 1), x);
  expect_all_near(vec(base.grad()), vec(scale(want, 2.0)));

  Tensor w = randn({2, 3}, 8, 4, 1.0, DType::F64);
  w.set_requires_grad(true);
  autograd::backward({linear(x, w)}, {dy});
  expect_all_near(vec(w.grad()), vec(want));
  // An f32 buffer for an f64 leaf: the fused path declines it, and
  // AccumulateGrad converts and adds as before.
  Tensor other = full({2, 3}, 1.0, DType::F32);
  w.impl().grad = other.impl_ptr();
  autograd::backward({linear(x, w)}, {dy});
  EXPECT_EQ(w.grad().dtype(), DType::F32);
  expect_all_near(vec(w.grad()), vec(add(want, full({2, 3}, 1.0, DType::F64))), 1e-5);
}

// A backward that returns a gradient of the wrong dtype is named where it
// happens, not at a later mixed-dtype kernel call.
TEST(Autograd, AGradientOfTheWrongDtypeIsAnErrorNamingTheNode) {
  Tensor w = randn({3}, 9, 1, 1.0, DType::BF16);
  w.set_requires_grad(true);
  Tensor h = scale(w, 2.0);  // a bf16 activation
  Tensor y = clone(h).detach();
  autograd::record("widening", {h}, {y}, [](const autograd::TensorList& g) -> autograd::TensorList {
    return {cast(g[0], DType::F32)};
  });
  try {
    autograd::backward({y}, {full({3}, 1.0, DType::BF16)});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("widening produced a gradient"), std::string::npos) << what;
    EXPECT_NE(what.find("dtype=f32"), std::string::npos) << what;
    EXPECT_NE(what.find("which is bf16 [3]"), std::string::npos) << what;
  }
}

TEST(Autograd, SavedTensorsAreFreedAsSoonAsANodeHasRun) {
  Allocator& alloc = cpu_allocator();
  Tensor w = randn({256, 256}, 5, 1);
  w.set_requires_grad(true);
  const int64_t before = alloc.stats().allocated;
  Tensor loss;
  {
    Tensor x = randn({64, 256}, 5, 2);
    Tensor h = x;
    for (int i = 0; i < 4; ++i) h = gelu(linear(h, w));
    loss = sum(h);
  }
  const int64_t with_graph = alloc.stats().allocated;
  // Each layer saves its input (64*256 floats) for linear and gelu.
  EXPECT_GT(with_graph - before, 4 * 64 * 256 * 4);
  autograd::backward({loss});
  loss = Tensor();
  const int64_t after = alloc.stats().allocated;
  // What remains is w's gradient (and nothing from the graph).
  EXPECT_LE(after - before, 256 * 256 * 4 + 4096);
}

TEST(Autograd, SecondBackwardNeedsRetainGraph) {
  Tensor x = randn({3}, 6, 1);
  x.set_requires_grad(true);
  Tensor y = sum(mul(x, x));
  autograd::BackwardOptions keep;
  keep.retain_graph = true;
  autograd::backward({y}, {}, keep);
  auto once = vec(x.grad());
  autograd::backward({y}, {}, keep);
  auto twice = vec(x.grad());
  for (size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-5);
  autograd::backward({y});  // frees
  try {
    autograd::backward({y});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = randn({3}, 7, 1);
  x.set_requires_grad(true);
  autograd::NoGradGuard guard;
  Tensor y = mul(x, x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
}

TEST(Autograd, DiamondGraphSumsBothPaths) {
  Tensor x = from_vector(std::vector<double>{1.5, -2.0}, {2}, DType::F64);
  x.set_requires_grad(true);
  Tensor a = scale(x, 3.0), b = mul(x, x);
  autograd::backward({sum(add(a, b))});
  expect_all_near(vec(x.grad()), {3.0 + 3.0, 3.0 - 4.0});
}

TEST(Autograd, SplitIsOneNodeWhoseGradientIsThePiecesSideBySide) {
  // One node for every piece (a narrow per piece would make each a zero
  // tensor the size of x and add them): x's gradient is the pieces' written
  // once, zero where no gradient reached.
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {6}, DType::F64);
  x.set_requires_grad(true);
  const std::vector<Tensor> parts = split(x, {2, 1, 3}, 0);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].grad_fn(), parts[2].grad_fn());
  EXPECT_EQ(parts[0].grad_fn()->name(), "split");
  EXPECT_EQ(vec(parts[2]), (std::vector<double>{4, 5, 6}));  // views of x
  autograd::backward({add(sum(scale(parts[0], 2.0)), sum(mul(parts[2], parts[2])))});
  expect_all_near(vec(x.grad()), {2, 2, 0, 8, 10, 12});
  // A piece's gradient in another dtype joins in x's, as narrow's would.
  Tensor y = from_vector(std::vector<double>{1, 2, 3}, {3}, DType::F64);
  y.set_requires_grad(true);
  const std::vector<Tensor> halves = split(y, {1, 2}, 0);
  autograd::backward({halves[0], halves[1]},
                     {from_vector(std::vector<float>{0.5f}, {1}),
                      from_vector(std::vector<double>{2, 4}, {2}, DType::F64)});
  EXPECT_EQ(y.grad().dtype(), DType::F64);
  expect_all_near(vec(y.grad()), {0.5, 2, 4});
  // (Both roots are one node's outputs: the node runs once and its edges
  // count once, so the leaf is reached. The same output twice adds its
  // gradients.)
  Tensor z = from_vector(std::vector<double>{1, 2}, {2}, DType::F64);
  z.set_requires_grad(true);
  const Tensor twice = scale(z, 3.0);
  autograd::backward({twice, twice}, {from_vector(std::vector<double>{1, 1}, {2}, DType::F64),
                                      from_vector(std::vector<double>{1, 2}, {2}, DType::F64)});
  expect_all_near(vec(z.grad()), {6, 9});
  // A root another root reaches waits for it: dz/dz = 1 and d(3z)/dz = 3
  // both arrive before z's node runs.
  Tensor w = from_vector(std::vector<double>{1}, {1}, DType::F64);
  w.set_requires_grad(true);
  const Tensor inner = scale(w, 2.0), outer = scale(inner, 3.0);
  autograd::backward({outer, inner}, {from_vector(std::vector<double>{1}, {1}, DType::F64),
                                      from_vector(std::vector<double>{1}, {1}, DType::F64)});
  expect_all_near(vec(w.grad()), {8});
  EXPECT_THROW(split(x, {2, 5}, 0), ShapeError);
  EXPECT_THROW(split(x, {7, -1}, 0), ShapeError);
}

}  // namespace
}  // namespace triad
