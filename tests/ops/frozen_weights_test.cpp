// A linear layer whose weight (and bias) need no gradient (train.freeze)
// records no weight half: nothing for a zero-bubble W pass to defer, no
// weight-gradient GEMM, and no input gathered again for one, while the
// gradients that are needed come out as with a trainable weight. One whose
// input needs none still gives its weight's gradient.
#include <gtest/gtest.h>

#include "triad/autograd/engine.h"
#include "triad/ops.h"

namespace triad {
namespace {

struct Leaves {
  Tensor x, w, b;
};

Leaves make_leaves(bool x_grad, bool w_grad, bool b_grad) {
  Leaves l{randn({4, 3}, 21, 1), randn({5, 3}, 21, 2), randn({5}, 21, 3)};
  l.x.set_requires_grad(x_grad);
  l.w.set_requires_grad(w_grad);
  l.b.set_requires_grad(b_grad);
  return l;
}

TEST(FrozenWeights, AFrozenLinearHasNoWeightHalfAndTheSameInputGradient) {
  Leaves all = make_leaves(true, true, true), frozen = make_leaves(true, false, false);
  const Tensor seed = randn({4, 5}, 21, 4);
  autograd::backward({linear(all.x, all.w, all.b)}, {seed});
  const Tensor y = linear(frozen.x, frozen.w, frozen.b);
  ASSERT_NE(y.impl().grad_fn, nullptr);
  EXPECT_TRUE(y.impl().grad_fn->deferrable_inputs().empty());
  autograd::WeightGradStore store;
  autograd::BackwardOptions opts;
  opts.defer_weight_grads = &store;
  autograd::backward({y}, {seed}, opts);
  EXPECT_TRUE(store.empty());
  EXPECT_EQ(to_double_vector(frozen.x.grad()), to_double_vector(all.x.grad()));
  EXPECT_FALSE(frozen.w.grad().defined());
  EXPECT_FALSE(frozen.b.grad().defined());
}

TEST(FrozenWeights, ATrainableBiasOnAFrozenWeightStillSplits) {
  Leaves all = make_leaves(true, true, true), bias_only = make_leaves(true, false, true);
  const Tensor seed = randn({4, 5}, 21, 4);
  autograd::backward({linear(all.x, all.w, all.b)}, {seed});
  const Tensor y = linear(bias_only.x, bias_only.w, bias_only.b);
  autograd::WeightGradStore store;
  autograd::BackwardOptions opts;
  opts.defer_weight_grads = &store;
  autograd::backward({y}, {seed}, opts);
  EXPECT_EQ(store.size(), 1u);
  EXPECT_FALSE(bias_only.b.grad().defined());
  store.flush();
  EXPECT_EQ(to_double_vector(bias_only.b.grad()), to_double_vector(all.b.grad()));
  EXPECT_EQ(to_double_vector(bias_only.x.grad()), to_double_vector(all.x.grad()));
  EXPECT_FALSE(bias_only.w.grad().defined());
}

TEST(FrozenWeights, AnInputThatNeedsNoGradientStillTrainsTheWeight) {
  Leaves all = make_leaves(true, true, true), after_frozen = make_leaves(false, true, true);
  const Tensor seed = randn({4, 5}, 21, 4);
  autograd::backward({linear(all.x, all.w, all.b)}, {seed});
  autograd::backward({linear(after_frozen.x, after_frozen.w, after_frozen.b)}, {seed});
  EXPECT_EQ(to_double_vector(after_frozen.w.grad()), to_double_vector(all.w.grad()));
  EXPECT_EQ(to_double_vector(after_frozen.b.grad()), to_double_vector(all.b.grad()));
  EXPECT_FALSE(after_frozen.x.grad().defined());
}

// Under sequence parallelism a layer gathers its input again for the weight
// gradient (InputGradComm::regather) and sends its input gradient through a
// collective: a frozen layer still sends the gradient, and never gathers.
TEST(FrozenWeights, AFrozenLayerNeverGathersItsInputAgain) {
  for (bool frozen : {false, true}) {
    Tensor source = randn({2, 3}, 22, 1), w = randn({5, 3}, 22, 2), b = randn({5}, 22, 3);
    source.set_requires_grad(true);
    w.set_requires_grad(!frozen);
    b.set_requires_grad(!frozen);
    int gathers = 0, collectives = 0;
    InputGradComm comm;
    comm.source = source;
    comm.start = [&collectives](const Tensor& dx) {
      ++collectives;
      return std::function<Tensor()>(
          [dx]() { return add(narrow(dx, 0, 0, 2), narrow(dx, 0, 2, 2)); });
    };
    comm.regather = [&gathers, source]() {
      ++gathers;
      return std::function<Tensor()>([source]() {
        return concat({source.detach(), source.detach()}, 0).detach();
      });
    };
    const Tensor x = concat({source.detach(), source.detach()}, 0).detach();
    autograd::backward({linear(x, w, b, comm)}, {randn({4, 5}, 22, 4)});
    EXPECT_EQ(collectives, 1) << (frozen ? "frozen" : "trainable");
    EXPECT_EQ(gathers, frozen ? 0 : 1) << (frozen ? "frozen" : "trainable");
    EXPECT_TRUE(source.grad().defined());
    EXPECT_EQ(w.grad().defined(), !frozen);
  }
}

}  // namespace
}  // namespace triad
