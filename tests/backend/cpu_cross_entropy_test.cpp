// The CPU backend's cross entropy written with its gradient in one call
// (cross_entropy_forward_backward): row by row, the bits of
// cross_entropy_forward followed by cross_entropy_backward, over rows padded
// apart as the head's logits are, with ignored rows and a soft cap, in place
// over the logits or into another buffer, and with a z-loss's gradient
// (z_scale) formed from the log-sum-exp as the two calls' caller forms it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "triad/backend/backend.h"
#include "triad/core/error.h"
#include "triad/ops.h"

namespace triad {
namespace {

constexpr int64_t kCeRows = 7, kV = 67, kLd = 128, kIgnore = -100;

// Logits (kCeRows, kV) whose rows lie kLd apart in their buffer, the padding
// holding a value the calls must neither read nor write (exact in bf16).
Tensor padded_logits(DType dtype) {
  std::vector<double> v(static_cast<size_t>(kCeRows * kLd), 1280.0);
  for (int64_t i = 0; i < kCeRows; ++i) {
    for (int64_t j = 0; j < kV; ++j) {
      v[static_cast<size_t>(i * kLd + j)] = 3.0 * std::sin(0.37 * static_cast<double>(i * kV + j));
    }
  }
  const Tensor rows = from_vector(v, {kCeRows, kLd}, dtype);
  return make_view(rows, {kCeRows, kV}, {kLd, 1}, 0);
}

std::vector<double> values(const Tensor& t) {
  return to_double_vector(contiguous(t));
}

// All of the buffer under a row-strided view, padding included.
std::vector<double> buffer(const Tensor& view) {
  return values(make_view(view, {kCeRows, kLd}, {kLd, 1}, view.offset()));
}

// The loss and the logits' gradient in one call (fused) or in two (with
// z_scale, dlse = (lse * dlosses) * z_scale between them).
void loss_and_gradient(bool fused, const Tensor& logits, const Tensor& targets, Tensor& losses,
                       Tensor& lse, const Tensor& dlosses, Tensor& dlogits, double softcap,
                       double z_scale = 0.0) {
  Backend& be = backend_for(logits);
  if (fused) {
    be.cross_entropy_forward_backward(logits, targets, kIgnore, losses, lse, dlosses, dlogits,
                                      softcap, z_scale);
  } else {
    be.cross_entropy_forward(logits, targets, kIgnore, losses, lse);
    Tensor dlse;
    if (z_scale != 0.0) {
      dlse = empty(lse.shape(), lse.dtype(), lse.device());
      be.binary(BinaryOp::Mul, lse, dlosses, dlse);
      be.affine(dlse, z_scale, 0.0, dlse);
    }
    be.cross_entropy_backward(logits, targets, lse, dlosses, dlse, kIgnore, dlogits, softcap);
  }
}

struct Result {
  std::vector<double> losses, lse, dlogits, logits_after;
};

Result run_ce(DType dtype, double softcap, bool fused, bool in_place, double z_scale = 0.0) {
  const DType sd = dtype == DType::F64 ? DType::F64 : DType::F32;
  Tensor logits = padded_logits(dtype);
  const Tensor targets =
      from_vector(std::vector<int64_t>{3, kIgnore, 66, 0, 41, kIgnore, 12}, {kCeRows}, DType::I64);
  Tensor losses = empty({kCeRows}, sd, logits.device()),
         lse = empty({kCeRows}, sd, logits.device());
  const Tensor dlosses =
      from_vector(std::vector<double>{0.5, 0.25, -0.75, 1.5, 0.125, 2.0, -0.375}, {kCeRows}, sd);
  Tensor dlogits = in_place ? logits : padded_logits(dtype);
  loss_and_gradient(fused, logits, targets, losses, lse, dlosses, dlogits, softcap, z_scale);
  return {values(losses), values(lse), buffer(dlogits), buffer(logits)};
}

TEST(CpuCrossEntropy, WrittenWithItsGradientItIsTheTwoCallsBits) {
  for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    for (double softcap : {0.0, 2.5}) {
      for (bool in_place : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " cap " + std::to_string(softcap) +
                     (in_place ? " in place" : " into another buffer"));
        const Result two = run_ce(dtype, softcap, false, in_place);
        const Result one = run_ce(dtype, softcap, true, in_place);
        EXPECT_EQ(one.losses, two.losses);
        EXPECT_EQ(one.lse, two.lse);
        EXPECT_EQ(one.dlogits, two.dlogits);
        EXPECT_EQ(one.logits_after, two.logits_after);
        // Ignored rows: no loss and no gradient; the padding untouched.
        EXPECT_EQ(one.losses[1], 0.0);
        for (int64_t j = 0; j < kV; ++j) EXPECT_EQ(one.dlogits[kLd + j], 0.0) << j;
        for (int64_t i = 0; i < kCeRows; ++i) EXPECT_EQ(one.dlogits[i * kLd + kV], 1280.0) << i;
        // A row's gradient: its softmax less the target's one, times its
        // loss's gradient (uncapped: the gradient sums to zero over the row).
        if (softcap == 0.0) {
          double sum = 0;
          for (int64_t j = 0; j < kV; ++j) sum += one.dlogits[3 * kLd + j];
          EXPECT_NEAR(sum, 0.0, dtype == DType::BF16 || dtype == DType::F16 ? 2e-2 : 1e-5);
          EXPECT_LT(one.dlogits[3 * kLd + 0], 0.0);  // the target's, times 1.5
        }
        if (!in_place) {
          EXPECT_EQ(one.logits_after, buffer(padded_logits(dtype)));
        }
        // With a z-loss's part: the two calls' bits still, a gradient that
        // differs from the one without it, and none for ignored rows.
        const Result two_z = run_ce(dtype, softcap, false, in_place, 0.3);
        const Result one_z = run_ce(dtype, softcap, true, in_place, 0.3);
        EXPECT_EQ(one_z.losses, two_z.losses);
        EXPECT_EQ(one_z.dlogits, two_z.dlogits);
        EXPECT_NE(one_z.dlogits, one.dlogits);
        for (int64_t j = 0; j < kV; ++j) EXPECT_EQ(one_z.dlogits[kLd + j], 0.0) << j;
      }
    }
  }
}

// Half logits (rows padded apart, as the head's) widened to f32, run there
// and rounded back: every output has the bits of the f32 backend on the
// widened matrix, in one call and in two, and a bad target in the last row
// is refused before any row's logits are overwritten by their gradient.
TEST(CpuCrossEntropy, HalfLogitsGiveTheBitsOfTheirF32Widening) {
  constexpr int64_t N = 24, V = 50257;
  const int64_t ld = padded_logits_row(V);
  std::vector<int64_t> t(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i)
    t[static_cast<size_t>(i)] = i % 13 == 5 ? kIgnore : (i * 7919) % V;
  const Tensor targets = from_vector(t, {N}, DType::I64);
  std::vector<double> g(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i)
    g[static_cast<size_t>(i)] = 0.01 * static_cast<double>(i % 17 - 8);
  const Tensor dlosses = from_vector(g, {N}, DType::F32);
  for (DType dtype : {DType::BF16, DType::F16}) {
    for (double softcap : {0.0, 4.0}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " cap " + std::to_string(softcap));
      const Tensor rows = randn({N, ld}, 5, 1, 2.0, dtype);
      auto logits_of = [&](const Tensor& buffer) { return make_view(buffer, {N, V}, {ld, 1}, 0); };
      // The reference: the whole matrix widened, the f32 backend, rounded.
      Tensor wide = contiguous(cast(logits_of(rows), DType::F32));
      Tensor ref_losses = empty({N}, DType::F32), ref_lse = empty({N}, DType::F32);
      Backend& f32 = backend_for(wide);
      f32.cross_entropy_forward_backward(wide, targets, kIgnore, ref_losses, ref_lse, dlosses, wide,
                                         softcap);
      const std::vector<double> ref_grad = values(cast(wide, dtype));
      // In place over the half logits, in one call and in two.
      for (bool fused : {true, false}) {
        Tensor buffer = randn({N, ld}, 5, 1, 2.0, dtype);  // (rows' values, its own)
        Tensor logits = logits_of(buffer);
        Tensor losses = empty({N}, DType::F32), lse = empty({N}, DType::F32);
        loss_and_gradient(fused, logits, targets, losses, lse, dlosses, logits, softcap);
        EXPECT_EQ(values(losses), values(ref_losses)) << (fused ? "one call" : "two calls");
        EXPECT_EQ(values(lse), values(ref_lse)) << (fused ? "one call" : "two calls");
        EXPECT_EQ(values(logits), ref_grad) << (fused ? "one call" : "two calls");
        // The padding past each row's V classes is as it was.
        EXPECT_EQ(values(make_view(buffer, {N, ld - V}, {ld, 1}, V)),
                  values(make_view(rows, {N, ld - V}, {ld, 1}, V)));
      }
    }
  }
  // A bad target in the last row: nothing overwritten.
  std::vector<int64_t> bad = t;
  bad.back() = V;
  const Tensor rows = randn({N, ld}, 5, 2, 2.0, DType::BF16);
  Tensor logits = make_view(rows, {N, V}, {ld, 1}, 0);
  const std::vector<double> before = values(logits);
  Tensor losses = empty({N}, DType::F32), lse = empty({N}, DType::F32);
  EXPECT_THROW(
      backend_for(logits).cross_entropy_forward_backward(
          logits, from_vector(bad, {N}, DType::I64), kIgnore, losses, lse, dlosses, logits, 0.0),
      ValueError);
  EXPECT_EQ(values(logits), before);
}

TEST(CpuCrossEntropy, ATargetOutsideTheClassesIsRefusedBeforeAnythingIsWritten) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor logits = padded_logits(dtype);
    const std::vector<double> before = buffer(logits);
    const Tensor targets =
        from_vector(std::vector<int64_t>{3, 1, 67, 0, 41, 2, 12}, {kCeRows}, DType::I64);
    Tensor losses = zeros({kCeRows}, DType::F32), lse = zeros({kCeRows}, DType::F32);
    const Tensor dlosses = full({kCeRows}, 1.0, DType::F32);
    try {
      backend_for(logits).cross_entropy_forward_backward(logits, targets, kIgnore, losses, lse,
                                                         dlosses, logits, 0.0);
      FAIL() << "a target of 67 among 67 classes was taken";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("target 67 at row 2"), std::string::npos) << e.what();
    }
    EXPECT_EQ(buffer(logits), before);
    EXPECT_EQ(values(losses), std::vector<double>(kCeRows, 0.0));
  }
}

}  // namespace
}  // namespace triad
