// linear_cross_entropy: the head and the loss in one op, its logits in
// padded rows and overwritten by their gradient. Same loss and gradients as
// cross_entropy(linear(x, w)) in every dtype, with deferred weight
// gradients too; errors for shapes, targets and a second backward. The op
// table (op_cases.h) checks its gradients against central differences and
// the GPU suite its kernels against the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "support/expect_close.h"
#include "triad/autograd/engine.h"
#include "triad/autograd/weight_grad_store.h"
#include "triad/backend/backend.h"
#include "triad/core/allocator.h"
#include "triad/core/error.h"
#include "triad/ops.h"

namespace triad {
namespace {

struct HeadOutcome {
  double loss = 0;
  std::vector<double> dx, dw, db;
};

// with_bias: a biased head (model.head_bias), soft-capped at `softcap`.
// expected: linear_cross_entropy's expected_grad; seed, nonzero: the
// gradient the loss gets in backward (else 1).
HeadOutcome run(DType dtype, int64_t V, bool fused, bool defer, bool with_bias = false,
                double softcap = 0.0, double expected = 0.0, double seed = 0.0) {
  Tensor x = randn({2, 5, 12}, 3, 1, 1.0, dtype);
  Tensor w = randn({V, 12}, 3, 2, 0.3, dtype);
  Tensor b = with_bias ? randn({V}, 3, 3, 1.0, dtype) : Tensor();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  if (with_bias) b.set_requires_grad(true);
  std::vector<int64_t> t;
  for (int64_t i = 0; i < 10; ++i) t.push_back(i == 4 ? -100 : (i * 37 + 5) % V);
  const Tensor targets = from_vector(t, {2, 5}, DType::I64);
  Tensor loss;
  if (fused) {
    loss = linear_cross_entropy(x, w, targets, -100, softcap, b, nullptr, expected);
  } else {
    const Tensor logits = linear(x, w, b);
    loss = cross_entropy(softcap > 0 ? soft_cap(logits, softcap) : logits, targets);
  }
  autograd::WeightGradStore store;
  autograd::BackwardOptions opts;
  if (defer) opts.defer_weight_grads = &store;
  autograd::backward(
      {loss},
      seed != 0.0 ? autograd::TensorList{full({}, seed, loss.dtype())} : autograd::TensorList{},
      opts);
  if (defer) {
    EXPECT_TRUE(x.grad().defined());
    EXPECT_FALSE(w.grad().defined());  // waits for the flush
    if (with_bias) {
      EXPECT_FALSE(b.grad().defined());
    }
    store.flush();
  }
  return {to_double_vector(loss)[0], to_double_vector(x.grad()), to_double_vector(w.grad()),
          with_bias ? to_double_vector(b.grad()) : std::vector<double>{}};
}

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double tol,
                  const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], tol * (1.0 + std::abs(b[i]))) << what << " [" << i << "]";
  }
}

TEST(LinearCrossEntropy, RowsArePaddedToMultiplesOf64) {
  EXPECT_EQ(padded_logits_row(1), 64);
  EXPECT_EQ(padded_logits_row(64), 64);
  EXPECT_EQ(padded_logits_row(65), 128);
  EXPECT_EQ(padded_logits_row(50257), 50304);
}

TEST(LinearCrossEntropy, EqualsCrossEntropyOfLinear) {
  for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    // Half types round the logits (and their gradient) once either way.
    const double tol = dtype == DType::F64 ? 1e-12 : dtype == DType::F32 ? 1e-6 : 1e-2;
    for (int64_t V : {64, 67, 301}) {  // no padding, 61 and 19 padding columns
      for (bool defer : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " V " + std::to_string(V) +
                     (defer ? " deferred" : ""));
        const HeadOutcome fused = run(dtype, V, true, defer), plain = run(dtype, V, false, false);
        EXPECT_NEAR(fused.loss, plain.loss, tol * plain.loss);
        expect_close(fused.dx, plain.dx, tol, "dx");
        expect_close(fused.dw, plain.dw, tol, "dw");
      }
    }
  }
}

TEST(LinearCrossEntropy, ABiasedHeadEqualsCrossEntropyOfLinearWithItsBias) {
  for (DType dtype : {DType::F64, DType::F32, DType::BF16}) {
    const double tol = dtype == DType::F64 ? 1e-12 : dtype == DType::F32 ? 1e-6 : 1e-2;
    for (int64_t V : {64, 67}) {  // the bias's gradient sums padded rows for 67
      for (double softcap : {0.0, 3.0}) {
        for (bool defer : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " V " + std::to_string(V) + " cap " +
                       std::to_string(softcap) + (defer ? " deferred" : ""));
          const HeadOutcome fused = run(dtype, V, true, defer, true, softcap),
                            plain = run(dtype, V, false, false, true, softcap);
          EXPECT_NEAR(fused.loss, plain.loss, tol * plain.loss);
          expect_close(fused.dx, plain.dx, tol, "dx");
          expect_close(fused.dw, plain.dw, tol, "dw");
          expect_close(fused.db, plain.db, tol, "db");
          // (A bias that changed nothing would leave the loss of no bias.)
          if (softcap == 0.0 && defer) {
            EXPECT_GT(std::abs(fused.loss - run(dtype, V, true, false).loss), 1e-3);
          }
        }
      }
    }
  }
  Tensor x = randn({2, 12}, 3, 1), w = randn({67, 12}, 3, 2);
  const Tensor targets = from_vector(std::vector<int64_t>{1, 2}, {2}, DType::I64);
  try {
    linear_cross_entropy(x, w, targets, -100, 0.0, randn({66}, 3, 3));
    FAIL() << "a bias of the wrong length was accepted";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("bias [66]"), std::string::npos) << e.what();
  }
}

// expected_grad: the logits' gradient written with the loss in the forward
// pass. With the gradient that then comes, every output has the bits of the
// op without it (biased, capped, padded, deferred); with another, backward
// rescales it to the same values. Beside a z-loss, or with nothing to
// train, it changes nothing.
TEST(LinearCrossEntropy, AGradientWrittenAheadIsTheGradientItself) {
  for (DType dtype : {DType::F64, DType::F32, DType::BF16}) {
    const double tol = dtype == DType::F64 ? 1e-12 : dtype == DType::F32 ? 1e-6 : 1e-2;
    for (int64_t V : {64, 67}) {
      for (const auto& [bias, cap] : {std::pair{false, 0.0}, {true, 3.0}}) {
        for (bool defer : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " V " + std::to_string(V) +
                       (bias ? " biased, capped" : "") + (defer ? " deferred" : ""));
          const HeadOutcome plain = run(dtype, V, true, defer, bias, cap, 0.0, 0.37);
          const HeadOutcome ahead = run(dtype, V, true, defer, bias, cap, 0.37, 0.37);
          EXPECT_EQ(ahead.loss, plain.loss);
          EXPECT_EQ(ahead.dx, plain.dx);
          EXPECT_EQ(ahead.dw, plain.dw);
          EXPECT_EQ(ahead.db, plain.db);
          const HeadOutcome other = run(dtype, V, true, defer, bias, cap, 0.5, 0.37);
          EXPECT_EQ(other.loss, plain.loss);
          expect_close(other.dx, plain.dx, tol, "dx");
          expect_close(other.dw, plain.dw, tol, "dw");
          expect_close(other.db, plain.db, tol, "db");
          // (A gradient of 0.5 left as it was would be a third too long.)
          EXPECT_GT(std::abs(run(dtype, V, true, defer, bias, cap, 0.5, 0.5).dx[3] - plain.dx[3]),
                    0.1 * std::abs(plain.dx[3]));
        }
      }
    }
  }
  // Beside a z-loss, and with nothing to train: the op as without it.
  Tensor x = randn({2, 5, 12}, 3, 1), w = randn({67, 12}, 3, 2, 0.3);
  std::vector<int64_t> t;
  for (int64_t i = 0; i < 10; ++i) t.push_back((i * 37 + 5) % 67);
  const Tensor targets = from_vector(t, {2, 5}, DType::I64);
  const double frozen = to_double_vector(linear_cross_entropy(x, w, targets))[0];
  EXPECT_EQ(to_double_vector(linear_cross_entropy(x, w, targets, -100, 0.0, {}, nullptr, 2.0))[0],
            frozen);
  x.set_requires_grad(true);
  auto with_z = [&](double expected) {
    x.set_grad(Tensor());
    Tensor z;
    const Tensor loss = linear_cross_entropy(x, w, targets, -100, 0.0, {}, &z, expected);
    autograd::backward({add(loss, scale(z, 0.1))});
    return std::pair{to_double_vector(loss)[0], to_double_vector(x.grad())};
  };
  EXPECT_EQ(with_z(1.0), with_z(0.0));
}

// A z-loss joining the loss's gradient (z_loss_coef > 0, as a GPT's head
// takes model.z_loss_coef): the same z-loss value, and the gradients of
// loss + coef * z with the z-loss as a second output, for any gradient the
// loss gets (they scale together); biased and soft-capped, in f32 and bf16,
// with the gradient expected ahead (written in the forward pass, or
// rescaled when another comes) the same bits as without it. A negative or
// non-finite coefficient is refused by name.
TEST(LinearCrossEntropy, AZLossJoiningTheLossesGradientIsLossPlusCoefTimesZ) {
  const double coef = 0.05;
  std::vector<int64_t> t;
  for (int64_t i = 0; i < 10; ++i) t.push_back(i == 4 ? -100 : (i * 37 + 5) % 67);
  const Tensor targets = from_vector(t, {2, 5}, DType::I64);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (bool capped : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (capped ? ", biased and capped" : ""));
      auto run = [&](bool joined, double expected, double seed) {
        auto leaf = [&](const Tensor& v) {
          Tensor p = cast(v, dtype).detach();
          p.set_requires_grad(true);
          return p;
        };
        Tensor x = leaf(randn({2, 5, 12}, 3, 1)), w = leaf(randn({67, 12}, 3, 2, 0.6));
        Tensor b = capped ? leaf(randn({67}, 3, 3)) : Tensor();
        Tensor z;
        const Tensor loss = linear_cross_entropy(x, w, targets, -100, capped ? 2.0 : 0.0, b, &z,
                                                 expected, joined ? coef : 0.0);
        if (joined) {
          EXPECT_FALSE(z.requires_grad());
          autograd::backward({loss}, {full({}, seed, loss.dtype())});
        } else {
          autograd::backward({add(loss, scale(z, coef))}, {full({}, seed, loss.dtype())});
        }
        return std::vector<std::vector<double>>{
            to_double_vector(loss), to_double_vector(z), to_double_vector(x.grad()),
            to_double_vector(w.grad()),
            capped ? to_double_vector(b.grad()) : std::vector<double>{}};
      };
      const char* names[] = {"loss", "z", "dx", "dw", "db"};
      for (double seed : {1.0, 0.37}) {
        const auto second_output = run(false, 0.0, seed);
        const auto joined = run(true, 0.0, seed);
        EXPECT_EQ(run(true, seed, seed), joined) << "written ahead";
        const auto rescaled = run(true, 0.5, seed);
        const double tol = dtype == DType::F32 ? 1e-6 : 1e-2;
        for (size_t i = 0; i < joined.size(); ++i) {
          testing::expect_close(joined[i], second_output[i], tol, tol, names[i]);
          testing::expect_close(rescaled[i], joined[i], tol, tol, names[i]);
        }
      }
      // (Without the z-loss's part, x's gradient differs.)
      const auto plain = run(true, 0.0, 1.0);
      Tensor x = cast(randn({2, 5, 12}, 3, 1), dtype).detach();
      x.set_requires_grad(true);
      const Tensor w = cast(randn({67, 12}, 3, 2, 0.6), dtype);
      autograd::backward(
          {linear_cross_entropy(x, w, targets, -100, capped ? 2.0 : 0.0,
                                capped ? cast(randn({67}, 3, 3), dtype) : Tensor())});
      double apart = 0;
      const std::vector<double> without = to_double_vector(x.grad());
      for (size_t i = 0; i < without.size(); ++i) apart += std::abs(without[i] - plain[2][i]);
      EXPECT_GT(apart, 1e-3);
    }
  }
  const Tensor x = randn({2, 5, 12}, 3, 1), w = randn({67, 12}, 3, 2, 0.6);
  for (double bad : {-0.1, std::nan(""), std::numeric_limits<double>::infinity()}) {
    Tensor z;
    try {
      linear_cross_entropy(x, w, targets, -100, 0.0, {}, &z, 0.0, bad);
      ADD_FAILURE() << "z_loss_coef " << bad << " accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("z_loss_coef"), std::string::npos) << e.what();
    }
  }
}

// The z-loss (the op's second output, model.z_loss_coef's): the mean over
// the scored rows of each row's squared log-sum-exp, of the capped logits
// under a soft cap, computed here on the host; the loss beside it is the
// loss without it, bitwise. cross_entropy's agrees.
TEST(LinearCrossEntropy, ZLossIsTheMeanSquaredLogSumExpOfTheScoredRows) {
  for (double softcap : {0.0, 2.0}) {
    SCOPED_TRACE("cap " + std::to_string(softcap));
    const Tensor x = randn({2, 5, 12}, 3, 1, 1.0, DType::F64);
    const Tensor w = randn({67, 12}, 3, 2, 0.6, DType::F64);
    std::vector<int64_t> t;
    for (int64_t i = 0; i < 10; ++i) t.push_back(i == 4 || i == 7 ? -100 : (i * 37 + 5) % 67);
    const Tensor targets = from_vector(t, {2, 5}, DType::I64);
    Tensor z;
    const Tensor loss = linear_cross_entropy(x, w, targets, -100, softcap, {}, &z);
    EXPECT_EQ(item(loss), item(linear_cross_entropy(x, w, targets, -100, softcap)));
    const Tensor capped = softcap > 0 ? soft_cap(linear(x, w), softcap) : linear(x, w);
    const std::vector<double> logits = to_double_vector(capped);
    double sum = 0;
    int64_t scored = 0;
    for (int64_t i = 0; i < 10; ++i) {
      if (t[static_cast<size_t>(i)] == -100) continue;
      double m = -1e300, e = 0;
      for (int64_t j = 0; j < 67; ++j) m = std::max(m, logits[static_cast<size_t>(i * 67 + j)]);
      for (int64_t j = 0; j < 67; ++j) e += std::exp(logits[static_cast<size_t>(i * 67 + j)] - m);
      const double lse = m + std::log(e);
      sum += lse * lse;
      ++scored;
    }
    const double expected = sum / static_cast<double>(scored);
    EXPECT_GT(expected, 1.0);  // (far from any value a mistake would give by chance)
    EXPECT_NEAR(item(z), expected, 1e-12 * expected);
    Tensor z_plain;
    cross_entropy(capped, targets, -100, &z_plain);
    EXPECT_NEAR(item(z_plain), expected, 1e-12 * expected);
  }
}

TEST(LinearCrossEntropy, OnlyTheWeightCanTakeAGradient) {
  // x without a gradient (a frozen trunk): the weight's still matches.
  Tensor x = randn({4, 8}, 3, 1, 1.0, DType::F32);
  Tensor w = randn({67, 8}, 3, 2, 0.3, DType::F32);
  w.set_requires_grad(true);
  const Tensor targets = from_vector(std::vector<int64_t>{0, 66, 5, 9}, {4}, DType::I64);
  autograd::backward({linear_cross_entropy(x, w, targets)});
  Tensor w2 = w.detach();
  w2.set_requires_grad(true);
  autograd::backward({cross_entropy(linear(x, w2), targets)});
  expect_close(to_double_vector(w.grad()), to_double_vector(w2.grad()), 1e-6, "dw");
  EXPECT_FALSE(x.grad().defined());
}

TEST(LinearCrossEntropy, ASecondBackwardIsRefused) {
  Tensor x = randn({3, 8}, 3, 1, 1.0, DType::F32);
  Tensor w = randn({67, 8}, 3, 2, 0.3, DType::F32);
  x.set_requires_grad(true);
  const Tensor targets = from_vector(std::vector<int64_t>{1, 2, 3}, {3}, DType::I64);
  Tensor loss = linear_cross_entropy(x, w, targets);
  autograd::BackwardOptions keep;
  keep.retain_graph = true;
  autograd::backward({loss}, {}, keep);
  try {
    autograd::backward({loss}, {}, keep);
    FAIL() << "a second backward through the overwritten logits ran";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(LinearCrossEntropy, BadInputsNameWhatWasExpected) {
  const Tensor x = randn({2, 3, 8}, 3, 1, 1.0, DType::F32);
  const Tensor w = randn({10, 8}, 3, 2, 0.3, DType::F32);
  const Tensor t = from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5}, {2, 3}, DType::I64);
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message([&] {
              linear_cross_entropy(x, randn({10, 7}, 3, 2, 1.0), t);
            }).find("weight must be [classes, C]"),
            std::string::npos);
  EXPECT_NE(message([&] { linear_cross_entropy(x, w, reshape(t, {6})); }).find("expected [2, 3]"),
            std::string::npos);
  const Tensor far = from_vector(std::vector<int64_t>{0, 1, 2, 10, 4, 5}, {2, 3}, DType::I64);
  EXPECT_NE(message([&] {
              linear_cross_entropy(x, w, far);
            }).find("target 10 at row 3 is outside [0, 10)"),
            std::string::npos);
  EXPECT_NE(message([&] { linear_cross_entropy(x, cast(w, DType::F64), t); }), "no error");
  EXPECT_NE(message([&] {
              linear_cross_entropy(randn({2, 3, 0}, 3, 1, 1.0), randn({10, 0}, 3, 2, 1.0), t);
            }).find("classes and C > 0"),
            std::string::npos);
}

// A graph dropped without backward (a forward with gradients on, then an
// exception or a skipped step) gives back everything, its logits included:
// no backward closure holds the loss it produced (that would be a cycle).
TEST(LinearCrossEntropy, AGraphDroppedWithoutBackwardFreesItsLogits) {
  Tensor x = randn({4, 6, 16}, 3, 1, 1.0, DType::F32);
  Tensor w = randn({301, 16}, 3, 2, 0.3, DType::F32);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const Tensor targets = full({4, 6}, 3.0, DType::I64);
  const int64_t before = cpu_allocator().stats().allocated;
  for (int fused = 0; fused < 2; ++fused) {
    {
      Tensor loss =
          fused ? linear_cross_entropy(x, w, targets) : cross_entropy(linear(x, w), targets);
      EXPECT_GT(cpu_allocator().stats().allocated, before + 24 * 301 * 4);  // the logits
    }
    EXPECT_EQ(cpu_allocator().stats().allocated, before) << (fused ? "fused" : "plain");
  }
}

// The row strides backends take for padded logits, and what they refuse.
TEST(LinearCrossEntropy, MatrixLdAcceptsPaddedRowsOnly) {
  const Tensor buf = randn({4, 128}, 3, 1, 1.0, DType::F32);
  EXPECT_EQ(matrix_ld(buf, "test"), 128);
  EXPECT_EQ(matrix_ld(make_view(buf, {4, 67}, {128, 1}, 0), "test"), 128);
  EXPECT_EQ(matrix_ld(make_view(buf, {1, 67}, {5, 1}, 0), "test"), 67);  // one row
  EXPECT_EQ(matrix_ld(randn({2, 3, 5}, 3, 1, 1.0, DType::F32), "test"), 5);
  EXPECT_THROW(matrix_ld(make_view(buf, {4, 67}, {64, 1}, 0), "test"), ShapeError);   // overlap
  EXPECT_THROW(matrix_ld(make_view(buf, {4, 60}, {128, 2}, 0), "test"), ShapeError);  // gaps
  EXPECT_THROW(matrix_ld(make_view(buf, {2, 2, 60}, {256, 128, 1}, 0), "test"), ShapeError);
  // A row-strided product on the CPU backend: only the first 67 columns of
  // each 128-element row are written.
  Tensor out = zeros({4, 128}, DType::F32);
  Tensor view = make_view(out, {4, 67}, {128, 1}, 0);
  const Tensor a = randn({4, 8}, 3, 2, 1.0, DType::F32), b = randn({67, 8}, 3, 3, 1.0, DType::F32);
  backend_for(a).gemm(a, b, view, false, true, 1.0, 0.0);
  const std::vector<double> got = to_double_vector(out), want = to_double_vector(linear(a, b));
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 128; ++c) {
      EXPECT_NEAR(got[r * 128 + c], c < 67 ? want[r * 67 + c] : 0.0, 1e-5) << r << ", " << c;
    }
  }
}

}  // namespace
}  // namespace triad
