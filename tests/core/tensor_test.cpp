#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "support/expect_error.h"
#include "triad/autograd/engine.h"
#include "triad/backend/backend.h"
#include "triad/core/half.h"
#include "triad/core/rng.h"
#include "triad/ops.h"

namespace triad {
namespace {

TEST(Tensor, ViewsShareStorageAndRespectStrides) {
  Tensor x = from_vector(std::vector<double>{0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor t = transpose(x, 0, 1);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.storage(), x.storage());
  EXPECT_EQ(to_double_vector(t), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  Tensor n = narrow(x, 1, 1, 2);
  EXPECT_EQ(to_double_vector(n), (std::vector<double>{1, 2, 4, 5}));
  Tensor r = reshape(t, {6});  // non-contiguous: copies
  EXPECT_NE(r.storage(), x.storage());
  EXPECT_EQ(to_double_vector(r), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, AllDtypesRoundTripThroughCasts) {
  std::vector<double> v{1.0, -2.5, 3.0, 0.0};
  for (DType d : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    Tensor t = from_vector(v, {2, 2}, d);
    EXPECT_EQ(t.dtype(), d);
    EXPECT_EQ(t.nbytes(), 4 * dtype_size(d));
    auto back = to_double_vector(cast(t, DType::F64));
    const double expect1 = (d == DType::I32 || d == DType::I64) ? -2.0 : -2.5;
    EXPECT_EQ(back[1], expect1) << dtype_name(d);
    EXPECT_EQ(back[2], 3.0);
  }
}

TEST(Tensor, DtypeNamesParse) {
  EXPECT_EQ(dtype_from_name("bf16"), DType::BF16);
  EXPECT_THROW(dtype_from_name("f8"), ValueError);
  EXPECT_EQ(device_from_string("cuda:3"), Device::cuda(3));
  EXPECT_THROW(device_from_string("tpu"), ValueError);
  EXPECT_THROW(device_from_string("cuda:99999999999"), ValueError);  // (past an int)
}

// f32 <-> bf16/f16 casts of views (a transpose: strided elements; a narrowed
// row: adjacent elements in rows apart) round each element once, as the
// scalar conversions do, and half -> f32 is exact.
TEST(Tensor, HalfCastsOfViewsRoundEachElementOnce) {
  std::vector<double> v;
  for (int i = 0; i < 4 * 7; ++i) v.push_back(std::sin(1.7 * i + 0.3) * std::pow(3.0, i % 9 - 4));
  const Tensor x = from_vector(v, {4, 7});
  for (const Tensor& view : {transpose(x, 0, 1), narrow(x, 1, 2, 4)}) {
    ASSERT_FALSE(view.is_contiguous());
    const std::vector<double> want = to_double_vector(view);
    for (DType d : {DType::BF16, DType::F16}) {
      const Tensor h = cast(view, d);
      const uint16_t* bits = h.data<uint16_t>();
      for (size_t i = 0; i < want.size(); ++i) {
        const float f = static_cast<float>(want[i]);
        EXPECT_EQ(bits[i], d == DType::BF16 ? float_to_bf16(f) : float_to_f16(f)) << i;
      }
      // Back to f32 from a strided half view: exact.
      const Tensor back = cast(transpose(h, 0, 1), DType::F32);
      const std::vector<double> got = to_double_vector(back);
      const std::vector<double> from = to_double_vector(cast(transpose(h, 0, 1), DType::F64));
      EXPECT_EQ(got, from) << dtype_name(d);
    }
  }
}

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half way between two bf16 values: ties to even (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Half, F16MatchesIeeeBinary16) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(1e6f), 0x7c00);                      // overflow to inf
  EXPECT_EQ(float_to_f16(5.960464477539063e-08f), 0x0001);    // smallest subnormal
  EXPECT_EQ(float_to_f16(2.98023223876953125e-08f), 0x0000);  // half of it: ties to even
  for (uint32_t h = 0; h < 0x7c00; h += 7) {  // every 7th finite positive half round-trips
    EXPECT_EQ(float_to_f16(f16_to_float(static_cast<uint16_t>(h))), h);
  }
}

// Every half against its value from the format's definition, and floats
// converted to the nearest half found by searching the finite halves (ties to
// the even one): at every midpoint between neighbours, a float either side of
// it, and a spread of floats of every exponent, both signs.
TEST(Half, F16ConversionsMatchTheFormatsDefinitionEverywhere) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    const float got = f16_to_float(static_cast<uint16_t>(h));
    if (e == 0x1f && m != 0) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
      continue;
    }
    const double want = e == 0x1f ? sign * std::numeric_limits<double>::infinity()
                        : e == 0  ? sign * std::ldexp(m, -24)
                                  : sign * std::ldexp(1024 + m, static_cast<int>(e) - 25);
    EXPECT_EQ(static_cast<double>(got), want) << std::hex << h;
    EXPECT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;
  }
  // The finite non-negative halves in order, and 65536 (where inf begins).
  std::vector<double> halves;
  for (uint32_t h = 0; h < 0x7c00; ++h) halves.push_back(f16_to_float(static_cast<uint16_t>(h)));
  halves.push_back(65536.0);
  const auto nearest = [&](float x) -> uint16_t {
    const double a = std::fabs(static_cast<double>(x));
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    if (a >= 65520.0) return sign | 0x7c00;  // 65520 is the tie with 65536: even (inf)
    const auto hi = std::lower_bound(halves.begin(), halves.end(), a);
    if (*hi == a) return sign | static_cast<uint16_t>(hi - halves.begin());
    const uint16_t up = static_cast<uint16_t>(hi - halves.begin()), down = up - 1;
    const double below = a - halves[down], above = *hi - a;
    if (below != above) return sign | (below < above ? down : up);
    return sign | ((down & 1) ? up : down);
  };
  std::vector<float> probes = {0.0f,
                               1e-30f,
                               1e-8f,
                               65519.99f,
                               65520.0f,
                               1e30f,
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::max()};
  for (size_t i = 0; i + 1 < halves.size(); ++i) {
    const float mid = static_cast<float>((halves[i] + halves[i + 1]) / 2);  // exact in f32
    probes.push_back(mid);
    probes.push_back(std::nextafter(mid, 0.0f));
    probes.push_back(std::nextafter(mid, 1e9f));
  }
  for (uint32_t bits = 0; bits < 0x7f800000u; bits += 0x7f800000u / 100003) {
    float f;
    std::memcpy(&f, &bits, 4);
    probes.push_back(f);
  }
  for (const float p : probes) {
    for (const float x : {p, -p}) {
      ASSERT_EQ(float_to_f16(x), nearest(x)) << x;
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_f16(inf), 0x7c00);
  EXPECT_EQ(float_to_f16(-inf), 0xfc00);
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::quiet_NaN()) & 0x7fff, 0x7e00);
  EXPECT_EQ(float_to_f16(-std::numeric_limits<float>::signaling_NaN()) & 0x7fff, 0x7e00);
}

// Known answers of Philox-4x32-10 (Random123's test vectors): the CPU and the
// CUDA kernels share this function (triad/core/philox.h), so dropout masks
// and initial values are the standard generator's on every device.
TEST(Rng, PhiloxMatchesTheReferenceTestVectors) {
  EXPECT_EQ(philox4x32(0, 0, 0),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  // counter 243f6a88 85a308d3 13198a2e 03707344, key a4093822 299f31d0
  EXPECT_EQ(philox4x32(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull),
            (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Rng, PhiloxIsAPureFunctionOfKeyAndCounter) {
  EXPECT_EQ(philox4x32(1, 2, 3), philox4x32(1, 2, 3));
  EXPECT_NE(philox4x32(1, 2, 3), philox4x32(1, 2, 4));
  EXPECT_NE(philox4x32(1, 2, 3), philox4x32(2, 2, 3));
  double s = 0, s2 = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double z = philox_normal(42, 7, i);
    s += z;
    s2 += z * z;
  }
  EXPECT_NEAR(s / n, 0.0, 0.03);
  EXPECT_NEAR(s2 / n, 1.0, 0.03);
  for (int i = 0; i < 1000; ++i) {
    const float u = philox_uniform(1, 1, i);
    EXPECT_GE(u, 0.0f);
    EXPECT_LT(u, 1.0f);
  }
}

// randn and rand_uniform draw large tensors in parallel: element i is still
// the draw at counter i, whatever thread took it.
TEST(Rng, LargeTensorsHoldTheDrawAtEachElementsCounter) {
  const int64_t rows = 300, cols = 257;  // past the parallel threshold, not a multiple of 2
  const std::vector<double> normal = to_double_vector(randn({rows, cols}, 9, 4, 0.5, DType::F64));
  const std::vector<double> uniform =
      to_double_vector(rand_uniform({rows, cols}, 9, 4, -1.0, 3.0, DType::F64));
  int normal_wrong = 0, uniform_wrong = 0;
  for (size_t i = 0; i < normal.size(); ++i) {
    normal_wrong += normal[i] != 0.5 * philox_normal(9, 4, i);
    uniform_wrong += uniform[i] != -1.0 + 4.0 * philox_uniform(9, 4, i);
  }
  EXPECT_EQ(normal_wrong, 0);
  EXPECT_EQ(uniform_wrong, 0);
}

TEST(Tensor, BadShapesAreClearErrors) {
  EXPECT_THROW(empty({2, -1}), ShapeError);
  Tensor x = zeros({2, 3});
  EXPECT_THROW(reshape(x, {4, 2}), ShapeError);
  EXPECT_THROW(narrow(x, 1, 2, 2), ShapeError);
  EXPECT_THROW(add(x, zeros({4})), ShapeError);
  EXPECT_THROW(matmul(x, zeros({2, 2})), ShapeError);
  EXPECT_THROW(add(x, zeros({2, 3}, DType::F64)), ValueError);
  EXPECT_THROW(x.size(5), ShapeError);
  try {
    reshape(x, {4, 2});
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
  }
  // Sizes past what int64 counts or memory addresses (a config's or a
  // file's dimensions multiplied) are named, never wrapped around.
  EXPECT_EQ(numel({int64_t{1} << 31, int64_t{1} << 31}), int64_t{1} << 62);
  triad::testing::expect_error(
      [] {
        numel({int64_t{1} << 32, int64_t{1} << 31});
      },
      {"shape [4294967296, 2147483648] holds more elements"});
  triad::testing::expect_error([] { empty({int64_t{1} << 62}, DType::F32); },
                               {"[4611686018427387904] in f32 holds more bytes"});
  triad::testing::expect_error(
      [] {
        reshape(zeros({2}), {int64_t{1} << 40, 1 << 30, 4, -1});
      },
      {"holds more elements"});
}

// Strided copies keep every bit: 64-bit integers above 2^53 (which a round
// trip through double would round) and integer arithmetic stays exact.
TEST(Tensor, SixtyFourBitIntegersStayExactThroughViewsAndArithmetic) {
  const int64_t big = (int64_t{1} << 53) + 1;
  const std::vector<int64_t> values{
      big, -big - 2, (int64_t{1} << 62) + 3, 7, -(int64_t{1} << 60) - 1, big + 4};
  Tensor t = from_vector(values, {2, 3});
  Tensor tt = contiguous(transpose(t, 0, 1));  // a strided copy
  ASSERT_TRUE(tt.is_contiguous());
  const int64_t* p = tt.data<int64_t>();
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 2; ++j) EXPECT_EQ(p[i * 2 + j], values[j * 3 + i]) << i << "," << j;
  }
  // Broadcast (strided) integer arithmetic.
  Tensor row = from_vector(std::vector<int64_t>{1, 2, 3}, {3});
  Tensor sum = add(transpose(tt, 0, 1), row);
  const int64_t* q = contiguous(sum).data<int64_t>();
  for (int64_t k = 0; k < 6; ++k) EXPECT_EQ(q[k], values[k] + (k % 3) + 1) << k;
  Tensor small = from_vector(std::vector<int64_t>{-3, 4, 100000}, {3}, DType::I32);
  Tensor prod = mul(small, from_vector(std::vector<int64_t>{5, -6, 20000}, {3}, DType::I32));
  EXPECT_EQ(std::vector<int32_t>(prod.data<int32_t>(), prod.data<int32_t>() + 3),
            (std::vector<int32_t>{-15, -24, 2000000000}));
  // Same-type half-precision views copy their bits too (NaN payloads kept).
  Tensor h = empty({2, 2}, DType::BF16);
  const uint16_t bits[4] = {0x7FC1, 0x3F80, 0xFF81, 0x0001};
  std::copy(bits, bits + 4, h.data<uint16_t>());
  Tensor ht = contiguous(transpose(h, 0, 1));
  const uint16_t* hb = ht.data<uint16_t>();
  EXPECT_EQ((std::vector<uint16_t>{hb[0], hb[1], hb[2], hb[3]}),
            (std::vector<uint16_t>{0x7FC1, 0xFF81, 0x3F80, 0x0001}));
}

TEST(Ops, IntegerDivisionIsRefusedWithTheDtype) {
  Tensor a = from_vector(std::vector<int64_t>{6, 7}, {2});
  Tensor b = from_vector(std::vector<int64_t>{0, 2}, {2});
  try {
    div(a, b);
    FAIL() << "integer div should be refused";
  } catch (const ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("div"), std::string::npos) << m;
    EXPECT_NE(m.find("i64"), std::string::npos) << m;
  }
  EXPECT_EQ(to_double_vector(div(full({2}, 3.0), full({2}, 2.0))), (std::vector<double>{1.5, 1.5}));
}

// unsqueeze and squeeze are views of any layout, differentiable, and a
// squeeze of a dimension that is not 1 is an error naming its size.
TEST(Ops, SqueezeAndUnsqueezeAreViewsOfAnyLayout) {
  Tensor x = randn({3, 4}, 5, 1);
  Tensor t = transpose(x, 0, 1);  // (4, 3), not contiguous
  Tensor u = unsqueeze(t, 1);
  EXPECT_EQ(u.shape(), (Shape{4, 1, 3}));
  EXPECT_EQ(u.storage(), x.storage());
  EXPECT_EQ(to_double_vector(u), to_double_vector(t));
  Tensor s = squeeze(u, 1);
  EXPECT_EQ(s.shape(), (Shape{4, 3}));
  EXPECT_EQ(s.storage(), x.storage());
  EXPECT_EQ(to_double_vector(s), to_double_vector(t));
  EXPECT_EQ(unsqueeze(x, -1).shape(), (Shape{3, 4, 1}));
  EXPECT_EQ(unsqueeze(x, 0).shape(), (Shape{1, 3, 4}));
  EXPECT_TRUE(unsqueeze(x, 2).is_contiguous());
  EXPECT_THROW(unsqueeze(x, 4), ShapeError);
  try {
    squeeze(t, 0);
    FAIL() << "squeeze of a size-4 dim";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("has size 4"), std::string::npos) << e.what();
  }
  // Gradients flow back through both.
  Tensor leaf = randn({3, 4}, 5, 2);
  leaf.set_requires_grad(true);
  Tensor y = squeeze(unsqueeze(transpose(leaf, 0, 1), 0), 0);
  autograd::backward({sum(mul(y, y))});
  auto lv = to_double_vector(leaf), gv = to_double_vector(leaf.grad());
  for (size_t i = 0; i < lv.size(); ++i) EXPECT_NEAR(gv[i], 2 * lv[i], 1e-6);
}

TEST(Ops, MeanFlattenAndInPlaceAdd) {
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_DOUBLE_EQ(item(mean(x)), 3.5);
  EXPECT_THROW(mean(zeros({0, 3})), ShapeError);
  Tensor f = flatten(transpose(x, 0, 1));
  EXPECT_EQ(f.shape(), (Shape{6}));
  EXPECT_EQ(to_double_vector(f), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  Tensor acc = ones({2, 3});
  add_(acc, x);
  EXPECT_EQ(to_double_vector(acc), (std::vector<double>{2, 3, 4, 5, 6, 7}));
  Tensor h = cast(x, DType::BF16);
  EXPECT_EQ(to_float_vector(h), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(Ops, ItemsReadsOneElementTensorsOfAnyDtypeAndShapeInOrder) {
  const Tensor a = from_vector(std::vector<double>{2.5}, {1, 1}, DType::F32);
  const Tensor b = from_vector(std::vector<double>{-7}, {1}, DType::I64);
  const Tensor c = cast(from_vector(std::vector<double>{0.375}, {1}), DType::BF16);
  EXPECT_EQ(items({a, b, c}), (std::vector<double>{2.5, -7, 0.375}));
  EXPECT_EQ(items({b}), (std::vector<double>{-7}));
  EXPECT_TRUE(items({}).empty());
  try {
    items({a, ones({2, 2})});
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("items: tensor 1 of shape [2, 2] has 4 elements"),
              std::string::npos)
        << e.what();
  }
}

TEST(Ops, DropoutMaskDependsOnlyOnSeedStreamAndOffset) {
  Tensor x = ones({1000});
  Tensor a = dropout(x, 0.25, 9, 3, 0);
  Tensor b = dropout(x, 0.25, 9, 3, 0);
  Tensor c = dropout(x, 0.25, 9, 3, 1000);
  EXPECT_EQ(to_double_vector(a), to_double_vector(b));
  EXPECT_NE(to_double_vector(a), to_double_vector(c));
  // The tail of a longer call equals a call at the matching offset.
  Tensor whole = dropout(ones({2000}), 0.25, 9, 3, 0);
  auto w = to_double_vector(whole), cv = to_double_vector(c);
  EXPECT_TRUE(std::equal(cv.begin(), cv.end(), w.begin() + 1000));
  int kept = 0;
  for (double v : to_double_vector(a)) kept += v != 0.0;
  EXPECT_NEAR(kept / 1000.0, 0.75, 0.05);
  EXPECT_THROW(dropout(x, 1.0, 0, 0, 0), ValueError);
}

TEST(Ops, DropoutRowsTakeALargerTensorsMask) {
  // A (6, 10) tensor's mask; a piece of it, rows 1-4 and columns 3-7, takes
  // its elements' draws when its rows of 5 start at 1 * 10 + 3 and lie 10
  // apart, in the forward pass and backward.
  const Tensor whole = dropout(ones({6, 10}), 0.5, 9, 3, 100);
  Tensor piece = ones({4, 5});
  piece.set_requires_grad(true);
  const Tensor y = dropout(piece, 0.5, 9, 3, philox::Counters{100 + 13, 5, 10});
  const Tensor expected = contiguous(narrow(narrow(whole, 0, 1, 4), 1, 3, 5));
  EXPECT_EQ(to_double_vector(y), to_double_vector(expected));
  autograd::backward({sum(y)});
  EXPECT_EQ(to_double_vector(piece.grad()), to_double_vector(expected));
  // Rows must divide the elements and may not overlap (shared draws).
  EXPECT_THROW(dropout(piece, 0.5, 9, 3, philox::Counters{0, 3, 10}), ShapeError);
  EXPECT_THROW(dropout(piece, 0.5, 9, 3, philox::Counters{0, 5, 4}), ValueError);
  // One row of the whole length is the plain call.
  EXPECT_EQ(to_double_vector(dropout(piece, 0.5, 9, 3, philox::Counters{7, 20, 0})),
            to_double_vector(dropout(piece, 0.5, 9, 3, 7)));
}

// A call count in memory (what a CUDA graph's replay reads) moves every
// draw by its value times per_call, forward and backward, modulo 2^64 (a
// negative count goes back); rows keep their layout. One i64 on x's device.
TEST(Ops, DropoutCallCountsMoveTheDraws) {
  const Tensor x = ones({4, 5});
  for (const int64_t calls : {int64_t{3}, int64_t{0}, int64_t{-2}}) {
    SCOPED_TRACE(calls);
    const Tensor count = from_vector(std::vector<int64_t>{calls}, {}, DType::I64);
    Tensor in = ones({4, 5});
    in.set_requires_grad(true);
    const Tensor y = dropout(in, 0.5, 9, 3, philox::Counters{100, 5, 10, 40}, Tensor{}, count);
    const uint64_t moved = 100 + static_cast<uint64_t>(calls) * 40;
    const Tensor expected = dropout(x, 0.5, 9, 3, philox::Counters{moved, 5, 10});
    EXPECT_EQ(to_double_vector(y), to_double_vector(expected));
    autograd::backward({sum(y)});
    EXPECT_EQ(to_double_vector(in.grad()), to_double_vector(expected));
  }
  // (The counts do move the mask: 3 calls of 40 draws is not 0.)
  EXPECT_NE(to_double_vector(dropout(x, 0.5, 9, 3, philox::Counters{100, 0, 0, 40}, Tensor{},
                                     from_vector(std::vector<int64_t>{3}, {}, DType::I64))),
            to_double_vector(dropout(x, 0.5, 9, 3, 100)));
  EXPECT_THROW(dropout(x, 0.5, 9, 3, philox::Counters{0, 0, 0, 20}, Tensor{},
                       from_vector(std::vector<float>{1.0f}, {}, DType::F32)),
               ShapeError);
  EXPECT_THROW(dropout(x, 0.5, 9, 3, philox::Counters{0, 0, 0, 20}, Tensor{},
                       from_vector(std::vector<int64_t>{1, 2}, {2}, DType::I64)),
               ShapeError);
}

TEST(Ops, DropoutKeyedRowsTakeTheirKeysRowsOfALargerMask) {
  // A (6, 10) tensor's mask; rows 4, 0, 4 and 2 of it, columns 3-7 (a
  // shard's features), in that order: row r draws row keys[r]'s elements
  // at 100 + keys[r] * 10 + 3 + c, forward and backward.
  const Tensor whole = dropout(ones({6, 10}), 0.5, 9, 3, 100);
  const std::vector<int64_t> order{4, 0, 4, 2};
  const Tensor keys = from_vector(order, {4}, DType::I64);
  Tensor rows = ones({4, 5});
  rows.set_requires_grad(true);
  const Tensor y = dropout(rows, 0.5, 9, 3, philox::Counters{100 + 3, 5, 10}, keys);
  const Tensor expected = contiguous(narrow(embedding(whole, keys), 1, 3, 5));
  EXPECT_EQ(to_double_vector(y), to_double_vector(expected));
  autograd::backward({sum(y)});
  EXPECT_EQ(to_double_vector(rows.grad()), to_double_vector(expected));
  // Keys in order are the rows' own.
  const Tensor in_order = from_vector(std::vector<int64_t>{0, 1, 2, 3}, {4}, DType::I64);
  EXPECT_EQ(to_double_vector(dropout(rows, 0.5, 9, 3, philox::Counters{7, 5, 10}, in_order)),
            to_double_vector(dropout(rows, 0.5, 9, 3, philox::Counters{7, 5, 10})));
  // One key per row, i64 and non-negative; rows no closer than their length.
  EXPECT_THROW(dropout(rows, 0.5, 9, 3, philox::Counters{0, 5, 10}, narrow(keys, 0, 0, 3)),
               ShapeError);
  EXPECT_THROW(dropout(rows, 0.5, 9, 3, philox::Counters{0, 5, 10}, cast(keys, DType::F32)),
               ShapeError);
  EXPECT_THROW(dropout(rows, 0.5, 9, 3, philox::Counters{0, 5, 4}, keys), ValueError);
  EXPECT_THROW(dropout(rows, 0.5, 9, 3, philox::Counters{0, 0, 0}, keys), ValueError);
  try {
    dropout(rows, 0.5, 9, 3, philox::Counters{0, 5, 10},
            from_vector(std::vector<int64_t>{1, -2, 0, 0}, {4}, DType::I64));
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("key -2 of row 1 is negative"), std::string::npos)
        << e.what();
  }
}

TEST(Ops, UnsupportedDtypeNamesOpDtypeAndDevice) {
  auto expect = [](auto fn, const char* op, const char* dtype) {
    try {
      fn();
      FAIL() << "expected NotSupportedError for " << op;
    } catch (const NotSupportedError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(op), std::string::npos) << m;
      EXPECT_NE(m.find(dtype), std::string::npos) << m;
      EXPECT_NE(m.find("cpu"), std::string::npos) << m;
    }
  };
  Backend& cpu = backend_for(DeviceType::CPU);
  Tensor i = zeros({4}, DType::I32);
  expect([&] { cpu.affine(i, 2.0, 0.0, i); }, "affine", "i32");
  Tensor h = zeros({4}, DType::BF16), f = zeros({4});
  Tensor m = zeros({4}, DType::BF16), v = zeros({4}, DType::BF16);
  expect([&] { cpu.adamw(h, f, m, v, AdamWStep{}); }, "adamw", "bf16");
}

}  // namespace
}  // namespace triad

namespace triad {
namespace {

TEST(Ops, CastIsDifferentiableAndConvertsTheGradientBack) {
  Tensor x = randn({3, 2}, 4, 4);  // f32 leaf
  x.set_requires_grad(true);
  Tensor y = cast(x, DType::F64);
  EXPECT_EQ(y.dtype(), DType::F64);
  Tensor g = randn({3, 2}, 4, 5, 1.0, DType::F64);
  autograd::backward({mul(y, y)}, {g});
  ASSERT_EQ(x.grad().dtype(), DType::F32);
  auto xv = to_double_vector(x), gv = to_double_vector(g), gx = to_double_vector(x.grad());
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(gx[i], 2 * xv[i] * gv[i], 1e-6);
}

}  // namespace
}  // namespace triad
