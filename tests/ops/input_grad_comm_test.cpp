// InputGradComm: a linear layer that computes on a gathered copy of its
// source returns the source's gradient through a collective it starts
// before its weight gradient and waits for after; a split backward waits at
// once. Here the "gather" is two copies of the source stacked along rows and
// the "collective" sums the two halves of dx, so the gradients must equal
// those of concat() before a plain linear, bit for bit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "triad/autograd/engine.h"
#include "triad/ops.h"

namespace triad {
namespace {

struct CommOutcome {
  std::vector<std::string> log;
  std::vector<double> y, dsource, dw, db;
};

// forward(x, w, b, comm) on x = [source; source], seeded with a random
// gradient; `split` defers the weight half and flushes it after.
template <class Forward>
CommOutcome run_with_comm(bool split, const Forward& forward) {
  CommOutcome r;
  Tensor source = randn({2, 3}, 8, 1), w = randn({5, 3}, 8, 2), b = randn({5}, 8, 3);
  for (Tensor* t : {&source, &w, &b}) t->set_requires_grad(true);
  w.register_post_accumulate_hook([&r](Tensor&) { r.log.push_back("weight gradient"); });
  InputGradComm comm;
  comm.source = source;
  comm.start = [&r](const Tensor& dx) {
    r.log.push_back("start");
    return std::function<Tensor()>([&r, dx]() {
      r.log.push_back("wait");
      return add(narrow(dx, 0, 0, 2), narrow(dx, 0, 2, 2));
    });
  };
  Tensor x = concat({source.detach(), source.detach()}, 0).detach();
  Tensor y = forward(x, w, b, comm);
  autograd::WeightGradStore store;
  autograd::BackwardOptions opts;
  if (split) opts.defer_weight_grads = &store;
  autograd::backward({y}, {randn(y.shape(), 8, 4)}, opts);
  r.log.push_back("flush");
  store.flush();
  r.y = to_double_vector(y);
  r.dsource = to_double_vector(source.grad());
  r.dw = to_double_vector(w.grad());
  r.db = to_double_vector(b.grad());
  return r;
}

template <class Forward>
CommOutcome run_composed(const Forward& forward) {
  CommOutcome r;
  Tensor source = randn({2, 3}, 8, 1), w = randn({5, 3}, 8, 2), b = randn({5}, 8, 3);
  for (Tensor* t : {&source, &w, &b}) t->set_requires_grad(true);
  Tensor y = forward(concat({source, source}, 0), w, b);
  autograd::backward({y}, {randn(y.shape(), 8, 4)});
  r.y = to_double_vector(y);
  r.dsource = to_double_vector(source.grad());
  r.dw = to_double_vector(w.grad());
  r.db = to_double_vector(b.grad());
  return r;
}

void expect_same_values(const CommOutcome& got, const CommOutcome& want) {
  EXPECT_EQ(got.y, want.y);
  EXPECT_EQ(got.dsource, want.dsource);
  EXPECT_EQ(got.dw, want.dw);
  EXPECT_EQ(got.db, want.db);
}

const std::vector<std::string> kOverlapped{"start", "weight gradient", "wait", "flush"};
const std::vector<std::string> kSplit{"start", "wait", "flush", "weight gradient"};

TEST(InputGradComm, LinearOverlapsItsCollectiveWithTheWeightGradient) {
  auto fwd = [](const Tensor& x, const Tensor& w, const Tensor& b, const InputGradComm& c) {
    return linear(x, w, b, c);
  };
  const CommOutcome want = run_composed(
      [](const Tensor& x, const Tensor& w, const Tensor& b) { return linear(x, w, b); });
  const CommOutcome whole = run_with_comm(false, fwd);
  EXPECT_EQ(whole.log, kOverlapped);
  expect_same_values(whole, want);
  const CommOutcome split = run_with_comm(true, fwd);
  EXPECT_EQ(split.log, kSplit);
  expect_same_values(split, want);
}

TEST(InputGradComm, LinearGeluPartsDoesTheSame) {
  auto fwd = [](const Tensor& x, const Tensor& w, const Tensor& b, const InputGradComm& c) {
    return linear_gelu_parts(x, w, b, c).act;
  };
  const CommOutcome want = run_composed(
      [](const Tensor& x, const Tensor& w, const Tensor& b) { return linear_gelu(x, w, b); });
  const CommOutcome whole = run_with_comm(false, fwd);
  EXPECT_EQ(whole.log, kOverlapped);
  expect_same_values(whole, want);
  EXPECT_EQ(run_with_comm(true, fwd).log, kSplit);
}

// x's own gradient would be lost (the node's edge goes to the source).
TEST(InputGradComm, AnInputWithItsOwnGradientIsRefused) {
  Tensor source = randn({2, 3}, 9, 1), x = randn({4, 3}, 9, 2), w = randn({5, 3}, 9, 3);
  source.set_requires_grad(true);
  x.set_requires_grad(true);
  InputGradComm comm;
  comm.source = source;
  comm.start = [](const Tensor& dx) { return std::function<Tensor()>([dx]() { return dx; }); };
  try {
    linear(x, w, Tensor(), comm);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("linear: with an input-gradient collective"),
              std::string::npos)
        << e.what();
  }
  // No start: a plain linear on x.
  Tensor y = linear(x, w, Tensor(), InputGradComm{});
  autograd::backward({sum(y)});
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(source.grad().defined());
}

}  // namespace
}  // namespace triad
