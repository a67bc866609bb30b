// cublaslt_gemm.cpp against a CPU stand-in for cuBLASLt (mock_cublaslt.cpp),
// in every CUDA build and without a GPU: Triad's row-major GEMMs (plain,
// transposed, batched, a shared 2-D operand, the batch folded into rows) must
// reach cuBLASLt as column-major calls whose layouts fit and whose results
// are the row-major product; the bias and bias + GELU epilogues must add the
// bias per output feature and keep the pre-activation; problems without an
// algorithm must be NotSupportedError, remembered. What only a GPU can say:
// which algorithms cuBLASLt really has.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "src/backend/cuda/cublaslt_gemm.h"
#include "support/mock_cublaslt.h"
#include "triad/core/error.h"

namespace triad::detail {
namespace {

namespace mock = testing::mock_cublaslt;

// Host buffer of n elements of `dtype`, filled with N(0, 1) rounded to it;
// values() gives them back as double.
class Buffer {
 public:
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  // Products still queued on the stand-in's stream run before the memory
  // goes (else the workspace's cudaFree, later, would run them into it).
  ~Buffer() { cudaDeviceSynchronize(); }
  Buffer(DType dtype, int64_t n, uint32_t seed) : dtype_(dtype), n_(n) {
    bytes_.resize(static_cast<size_t>(n) * dtype_size(dtype));
    std::mt19937 rng(seed);
    std::normal_distribution<double> dist(0, 1);
    for (int64_t i = 0; i < n; ++i) set(i, dist(rng));
  }
  void set(int64_t i, double v) {
    char* p = bytes_.data();
    if (dtype_ == DType::F64) {
      reinterpret_cast<double*>(p)[i] = v;
    } else if (dtype_ == DType::F32) {
      reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
    } else {
      const float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      bits += 0x7fff + ((bits >> 16) & 1);
      reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(bits >> 16);
    }
  }
  // Reads wait for the (simulated) device: the stand-in's products run on
  // their stream.
  double get(int64_t i) const {
    cudaDeviceSynchronize();
    const char* p = bytes_.data();
    if (dtype_ == DType::F64) return reinterpret_cast<const double*>(p)[i];
    if (dtype_ == DType::F32) return reinterpret_cast<const float*>(p)[i];
    const uint32_t bits = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(p)[i]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  std::vector<double> values() const {
    std::vector<double> v;
    for (int64_t i = 0; i < n_; ++i) v.push_back(get(i));
    return v;
  }
  void* data() { return bytes_.data(); }

 private:
  DType dtype_;
  int64_t n_;
  std::vector<char> bytes_;
};

// GELU (tanh form), as cuBLASLt's epilogues take it, and its derivative.
double gelu_tanh(double v) {
  return 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}
double gelu_tanh_grad(double x) {
  const double k0 = 0.7978845608028654, th = std::tanh(k0 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * k0 * (1 + 3 * 0.044715 * x * x);
}

double tolerance(DType d) {
  return d == DType::F64 ? 1e-12 : d == DType::F32 ? 1e-5 : 1e-2;
}

struct Case {
  const char* name;
  Shape a, b, c;
  bool ta, tb;
};

// c = alpha op(a) op(b) + beta c, row-major, as Backend::gemm defines it.
std::vector<double> reference(const Case& k, const std::vector<double>& a,
                              const std::vector<double>& b, const std::vector<double>& c,
                              double alpha, double beta) {
  const int64_t batch = k.c.size() == 3 ? k.c[0] : 1;
  const int64_t M = k.c[k.c.size() - 2], N = k.c.back();
  const int64_t K = k.ta ? k.a[k.a.size() - 2] : k.a.back();
  const bool a3 = k.a.size() == 3, b3 = k.b.size() == 3;
  std::vector<double> out(c.size());
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double acc = 0;
        for (int64_t kk = 0; kk < K; ++kk) {
          const int64_t ia = (a3 ? bi * M * K : 0) + (k.ta ? kk * M + i : i * K + kk);
          const int64_t ib = (b3 ? bi * K * N : 0) + (k.tb ? j * K + kk : kk * N + j);
          acc += a[static_cast<size_t>(ia)] * b[static_cast<size_t>(ib)];
        }
        const size_t ic = static_cast<size_t>(bi * M * N + i * N + j);
        out[ic] = alpha * acc + beta * c[ic];
      }
  return out;
}

class CublasLtGemmMock : public ::testing::Test {
 protected:
  void SetUp() override { mock::reset(); }
};

TEST_F(CublasLtGemmMock, RowMajorProductsInEveryLayout) {
  const Case cases[] = {
      {"plain", {3, 4}, {4, 5}, {3, 5}, false, false},
      {"a transposed", {4, 3}, {4, 5}, {3, 5}, true, false},
      {"b transposed (linear)", {3, 4}, {5, 4}, {3, 5}, false, true},
      {"both transposed", {4, 3}, {5, 4}, {3, 5}, true, true},
      {"batched", {2, 3, 4}, {2, 4, 5}, {2, 3, 5}, false, false},
      {"batched, b transposed", {2, 3, 4}, {2, 5, 4}, {2, 3, 5}, false, true},
      {"batch folded into rows (linear on 3-d input)", {2, 3, 4}, {5, 4}, {2, 3, 5}, false, true},
      {"shared 2-d a", {3, 4}, {2, 4, 5}, {2, 3, 5}, false, false},
      {"weight gradient", {7, 5}, {7, 6}, {5, 6}, true, false},
      {"odd sizes", {9, 13}, {13, 11}, {9, 11}, false, false},
  };
  for (DType dtype : {DType::F64, DType::F32, DType::BF16}) {
    CublasLtGemm gemm(0);
    for (const Case& k : cases) {
      SCOPED_TRACE(std::string(k.name) + " " + dtype_name(dtype));
      Buffer a(dtype, numel(k.a), 1), b(dtype, numel(k.b), 2), c(dtype, numel(k.c), 3);
      const std::vector<double> want = reference(k, a.values(), b.values(), c.values(), 1.5, 0.5);
      gemm.run(plan_gemm(k.a, k.b, k.c, k.ta, k.tb), dtype, a.data(), b.data(), c.data(), 1.5, 0.5,
               nullptr);
      const std::vector<double> got = c.values();
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], tolerance(dtype) * (1 + std::fabs(want[i])))
            << "element " << i << " (" << mock::last_error() << ")";
    }
  }
}

TEST_F(CublasLtGemmMock, BiasAndGeluEpiloguesActPerOutputFeature) {
  // A linear layer: y (rows 7, out 16) = x (7, 6) w^T (w 16 x 6) + bias (16),
  // then with GELU, then a bias-free one with GELU.
  const int64_t rows = 7, in = 6, out = 16;
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    CublasLtGemm gemm(0);
    Buffer x(dtype, rows * in, 4), w(dtype, out * in, 5), bias(dtype, out, 6);
    const Case k{"linear", {rows, in}, {out, in}, {rows, out}, false, true};
    std::vector<double> lin =
        reference(k, x.values(), w.values(), std::vector<double>(rows * out, 0), 1, 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) lin[static_cast<size_t>(r * out + o)] += bias.get(o);
    const GemmPlan plan = plan_gemm(k.a, k.b, k.c, false, true);

    Buffer y(dtype, rows * out, 7);
    GemmEpilogue ep;
    ep.kind = GemmEpilogue::Kind::Bias;
    ep.bias = bias.data();
    gemm.run(plan, dtype, x.data(), w.data(), y.data(), 1, 0, nullptr, ep);
    for (int64_t i = 0; i < rows * out; ++i)
      ASSERT_NEAR(y.get(i), lin[static_cast<size_t>(i)], tolerance(dtype) * (1 + std::fabs(lin[i])))
          << "bias, element " << i;

    Buffer pre(dtype, rows * out, 8);
    ep.kind = GemmEpilogue::Kind::BiasGelu;
    ep.gelu_input = pre.data();
    gemm.run(plan, dtype, x.data(), w.data(), y.data(), 1, 0, nullptr, ep);
    for (int64_t i = 0; i < rows * out; ++i) {
      const double v = lin[static_cast<size_t>(i)];
      const double g = gelu_tanh(v);
      ASSERT_NEAR(pre.get(i), v, tolerance(dtype) * (1 + std::fabs(v))) << "pre, element " << i;
      ASSERT_NEAR(y.get(i), g, 2 * tolerance(dtype) * (1 + std::fabs(g))) << "gelu, element " << i;
    }

    // A bias-free layer's GELU (GELU_AUX): no bias read, none added.
    ep.kind = GemmEpilogue::Kind::Gelu;
    ep.bias = nullptr;
    gemm.run(plan, dtype, x.data(), w.data(), y.data(), 1, 0, nullptr, ep);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        const int64_t i = r * out + o;
        const double v = lin[static_cast<size_t>(i)] - bias.get(o);
        const double g = gelu_tanh(v);
        ASSERT_NEAR(pre.get(i), v, tolerance(dtype) * (1 + std::fabs(lin[i]))) << "pre " << i;
        ASSERT_NEAR(y.get(i), g, 2 * tolerance(dtype) * (1 + std::fabs(lin[i]))) << "gelu " << i;
      }
    }
  }
}

TEST_F(CublasLtGemmMock, GeluDerivativeEpilogueGivesThePreActivationGradient) {
  // dpre (rows 5, in 16) = GELU'(pre) * (dy (5, out 6) @ w (6, 16)).
  const int64_t rows = 5, out = 6, in = 16;
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    CublasLtGemm gemm(0);
    Buffer dy(dtype, rows * out, 9), w(dtype, out * in, 10), pre(dtype, rows * in, 11),
        dpre(dtype, rows * in, 12);
    const Case k{"input grad", {rows, out}, {out, in}, {rows, in}, false, false};
    const std::vector<double> da =
        reference(k, dy.values(), w.values(), std::vector<double>(rows * in, 0), 1, 0);
    GemmEpilogue ep;
    ep.kind = GemmEpilogue::Kind::DGelu;
    ep.gelu_input = pre.data();
    gemm.run(plan_gemm(k.a, k.b, k.c, false, false), dtype, dy.data(), w.data(), dpre.data(), 1, 0,
             nullptr, ep);
    for (int64_t i = 0; i < rows * in; ++i) {
      const double want = gelu_tanh_grad(pre.get(i)) * da[static_cast<size_t>(i)];
      ASSERT_NEAR(dpre.get(i), want, 2 * tolerance(dtype) * (1 + std::fabs(want)))
          << "element " << i;
    }
  }
}

// The GELU-derivative product with the bias gradient in the same epilogue
// (DGELU_BGRAD): dpre as DGelu gives it, and its column sums (over Triad's
// rows: the previous layer's bias gradient) written in f32 to the
// epilogue's vector, whatever it held, whatever dpre's own type.
TEST_F(CublasLtGemmMock, AGeluDerivativeEpilogueCanWriteItsColumnSumsInF32) {
  const int64_t rows = 7, out = 6, in = 16;
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    CublasLtGemm gemm(0);
    Buffer dy(dtype, rows * out, 9), w(dtype, out * in, 10), pre(dtype, rows * in, 11),
        plain(dtype, rows * in, 12), fused(dtype, rows * in, 13), sums(DType::F32, in, 14);
    const GemmPlan plan = plan_gemm({rows, out}, {out, in}, {rows, in}, false, false);
    GemmEpilogue ep;
    ep.kind = GemmEpilogue::Kind::DGelu;
    ep.gelu_input = pre.data();
    gemm.run(plan, dtype, dy.data(), w.data(), plain.data(), 1, 0, nullptr, ep);
    ep.kind = GemmEpilogue::Kind::DGeluBiasGrad;
    ep.bias_grad = sums.data();
    const mock::Counters before = mock::counters();
    gemm.run(plan, dtype, dy.data(), w.data(), fused.data(), 1, 0, nullptr, ep);
    EXPECT_EQ(mock::counters().dgelu_bias_grad_matmuls, before.dgelu_bias_grad_matmuls + 1);
    EXPECT_EQ(mock::counters().f32_bias_grad_matmuls, before.f32_bias_grad_matmuls + 1);
    EXPECT_EQ(fused.values(), plain.values());
    const std::vector<double> dpre = fused.values(), got = sums.values();
    for (int64_t c = 0; c < in; ++c) {
      double want = 0;
      for (int64_t r = 0; r < rows; ++r) want += dpre[static_cast<size_t>(r * in + c)];
      // (The epilogue sums before dpre is rounded to its type.)
      ASSERT_NEAR(got[static_cast<size_t>(c)], want, 2 * tolerance(dtype) * (1 + std::fabs(want)))
          << "column " << c;
    }
  }
  // Without such an algorithm for the problem: NotSupportedError naming it.
  mock::set_no_bias_grad_algorithms(true);
  CublasLtGemm gemm(0);
  Buffer dy(DType::BF16, 8 * 6, 1), w(DType::BF16, 6 * 16, 2), pre(DType::BF16, 8 * 16, 3),
      dpre(DType::BF16, 8 * 16, 4), sums(DType::F32, 16, 5);
  GemmEpilogue ep;
  ep.kind = GemmEpilogue::Kind::DGeluBiasGrad;
  ep.gelu_input = pre.data();
  ep.bias_grad = sums.data();
  try {
    gemm.run(plan_gemm({8, 6}, {6, 16}, {8, 16}, false, false), DType::BF16, dy.data(), w.data(),
             dpre.data(), 1, 0, nullptr, ep);
    FAIL() << "no algorithm, yet it ran";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("GELU-derivative and f32 bias-gradient epilogue"),
              std::string::npos)
        << e.what();
  }
}

// Weight gradients added straight into f32 gradients: bf16/f16 operands,
// an f32 output with beta 1 (f32 layouts for C and D, f32 compute). Any
// other pair of types, or an epilogue with mixed types, is refused by name
// before cuBLASLt is asked.
TEST_F(CublasLtGemmMock, HalfInputsIntoAnF32Output) {
  const Case k{"weight gradient", {7, 5}, {7, 6}, {5, 6}, true, false};
  {  // (Buffer writes bf16 for every half type; f16 takes the same path.)
    const DType in = DType::BF16;
    CublasLtGemm gemm(0);
    Buffer a(in, numel(k.a), 1), b(in, numel(k.b), 2), c(DType::F32, numel(k.c), 3);
    const std::vector<double> want = reference(k, a.values(), b.values(), c.values(), 1.0, 1.0);
    gemm.run(plan_gemm(k.a, k.b, k.c, k.ta, k.tb), GemmTypes(in, DType::F32), a.data(), b.data(),
             c.data(), 1.0, 1.0, nullptr);
    const std::vector<double> got = c.values();
    // f32 sums of exact products of half values: f32 precision, not half.
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << "element " << i;
  }
  CublasLtGemm gemm(0);
  Buffer a(DType::F32, 35, 1), b(DType::F32, 42, 2), c(DType::F64, 30, 3), bias(DType::F32, 6, 4);
  const GemmPlan plan = plan_gemm(k.a, k.b, k.c, k.ta, k.tb);
  const int64_t queries = mock::counters().heuristic_queries;
  try {
    gemm.run(plan, GemmTypes(DType::F32, DType::F64), a.data(), b.data(), c.data(), 1, 0, nullptr);
    FAIL() << "f32 into f64 was accepted";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("f32 inputs into a f64 output"), std::string::npos)
        << e.what();
  }
  GemmEpilogue ep;
  ep.kind = GemmEpilogue::Kind::Bias;
  ep.bias = bias.data();
  try {
    gemm.run(plan, GemmTypes(DType::BF16, DType::F32), a.data(), b.data(), c.data(), 1, 0, nullptr,
             ep);
    FAIL() << "a mixed-type epilogue was accepted";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("with a bias or GELU epilogue"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(mock::counters().heuristic_queries, queries);
}

// A weight gradient's product with its bias gradient in the epilogue
// (BGRADB): half operands into the f32 gradient, beta 1, and the column
// sums of Triad's a (the output gradient, (rows, out)) written, in f32, to
// the epilogue's vector, whatever it held.
TEST_F(CublasLtGemmMock, ABiasGradientEpilogueWritesTheOutputGradientsColumnSums) {
  const Case k{"weight gradient", {9, 5}, {9, 6}, {5, 6}, true, false};
  const DType in = DType::BF16;
  CublasLtGemm gemm(0);
  Buffer a(in, numel(k.a), 1), b(in, numel(k.b), 2), c(DType::F32, numel(k.c), 3);
  Buffer sums(DType::F32, 5, 4);
  const std::vector<double> want = reference(k, a.values(), b.values(), c.values(), 1.0, 1.0);
  const std::vector<double> av = a.values();
  GemmEpilogue ep;
  ep.kind = GemmEpilogue::Kind::BiasGrad;
  ep.bias_grad = sums.data();
  const int64_t epilogues = mock::counters().epilogue_matmuls;
  gemm.run(plan_gemm(k.a, k.b, k.c, k.ta, k.tb), GemmTypes(in, DType::F32), a.data(), b.data(),
           c.data(), 1.0, 1.0, nullptr, ep);
  EXPECT_EQ(mock::counters().epilogue_matmuls, epilogues + 1);
  const std::vector<double> got = c.values(), got_sums = sums.values();
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << "element " << i;
  for (size_t o = 0; o < 5; ++o) {
    double sum = 0;
    for (size_t r = 0; r < 9; ++r) sum += av[r * 5 + o];
    ASSERT_NEAR(got_sums[o], sum, 1e-5 * (1 + std::fabs(sum))) << "column " << o;
  }
}

// GemmReduction::ComputeType asks the heuristic for algorithms that keep
// split-k partial sums in f32 (a preference without the in-place and
// output-type schemes) for half outputs, as its own cached problem; an f32
// output has nothing to restrict and shares the unrestricted algorithm.
TEST_F(CublasLtGemmMock, ComputeTypeReductionsRestrictTheHeuristicForHalfOutputs) {
  const Case k{"input gradient", {9, 40}, {40, 8}, {9, 8}, false, false};
  const GemmPlan plan = plan_gemm(k.a, k.b, k.c, k.ta, k.tb);
  CublasLtGemm gemm(0);
  Buffer a(DType::BF16, numel(k.a), 1), b(DType::BF16, numel(k.b), 2), c(DType::BF16, 72, 3);
  const std::vector<double> want = reference(k, a.values(), b.values(), c.values(), 1.0, 0.0);
  for (GemmReduction r : {GemmReduction::Any, GemmReduction::ComputeType, GemmReduction::Any}) {
    gemm.run(plan, DType::BF16, a.data(), b.data(), c.data(), 1.0, 0.0, nullptr, {}, r);
    const std::vector<double> got = c.values();
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-2 * (1 + std::fabs(want[i]))) << "element " << i;
  }
  EXPECT_EQ(mock::counters().heuristic_queries, 2);  // one per reduction; the third is cached
  EXPECT_EQ(mock::counters().compute_type_reduction_queries, 1);
  Buffer f(DType::F32, numel(k.a), 1), g(DType::F32, numel(k.b), 2), h(DType::F32, 72, 3);
  for (GemmReduction r : {GemmReduction::Any, GemmReduction::ComputeType})
    gemm.run(plan, DType::F32, f.data(), g.data(), h.data(), 1.0, 0.0, nullptr, {}, r);
  EXPECT_EQ(mock::counters().heuristic_queries, 3);
  EXPECT_EQ(mock::counters().compute_type_reduction_queries, 1);
}

TEST_F(CublasLtGemmMock, GeluAuxNeedsAWidthDivisibleBy8) {
  // What CudaBackend::linear_forward steers around: 5 output features.
  CublasLtGemm gemm(0);
  Buffer x(DType::F32, 3 * 4, 1), w(DType::F32, 5 * 4, 2), bias(DType::F32, 5, 3),
      y(DType::F32, 15, 4), pre(DType::F32, 15, 5);
  GemmEpilogue ep;
  ep.kind = GemmEpilogue::Kind::BiasGelu;
  ep.bias = bias.data();
  ep.gelu_input = pre.data();
  EXPECT_THROW(gemm.run(plan_gemm({3, 4}, {5, 4}, {3, 5}, false, true), DType::F32, x.data(),
                        w.data(), y.data(), 1, 0, nullptr, ep),
               Error);
  EXPECT_NE(mock::last_error().find("divisible by 8"), std::string::npos) << mock::last_error();
}

TEST_F(CublasLtGemmMock, ProblemsWithoutAnAlgorithmAreRememberedAsNotSupported) {
  CublasLtGemm gemm(0);
  Buffer a(DType::BF16, 12, 1), b(DType::BF16, 20, 2), c(DType::BF16, 15, 3);
  const GemmPlan plan = plan_gemm({3, 4}, {4, 5}, {3, 5}, false, false);
  mock::set_no_algorithms(true);
  EXPECT_THROW(gemm.run(plan, DType::BF16, a.data(), b.data(), c.data(), 1, 0, nullptr),
               NotSupportedError);
  const int64_t queries = mock::counters().heuristic_queries;
  mock::set_no_algorithms(false);
  // The same problem again: refused from the cache, cuBLASLt not asked.
  EXPECT_THROW(gemm.run(plan, DType::BF16, a.data(), b.data(), c.data(), 1, 0, nullptr),
               NotSupportedError);
  EXPECT_EQ(mock::counters().heuristic_queries, queries);
  // A problem with an algorithm is planned once and then reused.
  const GemmPlan other = plan_gemm({3, 4}, {5, 4}, {3, 5}, false, true);
  Buffer b2(DType::BF16, 20, 4);
  gemm.run(other, DType::BF16, a.data(), b2.data(), c.data(), 1, 0, nullptr);
  gemm.run(other, DType::BF16, a.data(), b2.data(), c.data(), 1, 0, nullptr);
  EXPECT_EQ(mock::counters().heuristic_queries, queries + 1);
  EXPECT_EQ(mock::counters().matmuls, 2);
}

// Products run with algorithm i: the warm-up and kTuneRuns timed calls of
// each candidate, then the calls themselves.
int64_t runs_with(size_t algorithm) {
  const std::vector<int64_t> by = mock::counters().matmuls_by_algorithm;
  return algorithm < by.size() ? by[algorithm] : 0;
}

// Autotuning asks the heuristic for several algorithms, times each on the
// problem's first call and keeps the fastest (here the third of four, the
// others made slow), for every later call of the problem; the product is the
// same. Without it the heuristic is asked for one and its first choice runs.
TEST_F(CublasLtGemmMock, AutotuneKeepsTheFastestOfTheHeuristicsCandidates) {
  const Case k{"linear", {8, 16}, {24, 16}, {8, 24}, false, true};
  const GemmPlan plan = plan_gemm(k.a, k.b, k.c, k.ta, k.tb);
  Buffer a(DType::BF16, numel(k.a), 1), b(DType::BF16, numel(k.b), 2), c(DType::BF16, 8 * 24, 3);
  const std::vector<double> want = reference(k, a.values(), b.values(), c.values(), 1.0, 0.0);
  mock::set_algorithms({3, 3, 0, 3});
  {
    CublasLtGemm gemm(0);
    gemm.run(plan, DType::BF16, a.data(), b.data(), c.data(), 1, 0, nullptr);
    EXPECT_EQ(mock::counters().last_requested, 1);
    EXPECT_EQ(runs_with(0), 1);
    EXPECT_EQ(gemm.tuning().problems, 0);
  }
  mock::reset();
  mock::set_algorithms({3, 3, 0, 3});
  CublasLtGemm gemm(0);
  gemm.set_autotune(4);
  for (int call = 0; call < 3; ++call) {
    gemm.run(plan, DType::BF16, a.data(), b.data(), c.data(), 1, 0, nullptr);
    const std::vector<double> got = c.values();
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-2 * (1 + std::fabs(want[i]))) << "element " << i;
  }
  EXPECT_EQ(mock::counters().heuristic_queries, 1);
  EXPECT_EQ(mock::counters().last_requested, 4);
  const int64_t timing = 1 + CublasLtGemm::kTuneRuns;
  EXPECT_EQ(runs_with(0), timing);
  EXPECT_EQ(runs_with(1), timing);
  EXPECT_EQ(runs_with(2), timing + 3);  // the three calls themselves
  EXPECT_EQ(runs_with(3), timing);
  const cuda::GemmTuning t = gemm.tuning();
  EXPECT_EQ(t.problems, 1);
  EXPECT_EQ(t.changed, 1);
  EXPECT_EQ(t.untimed, 0);
  EXPECT_GE(t.first_ms, 3.0);
  EXPECT_LT(t.best_ms, t.first_ms);
  // Another candidate count is a problem of its own: asked for anew.
  gemm.set_autotune(0);
  gemm.run(plan, DType::BF16, a.data(), b.data(), c.data(), 1, 0, nullptr);
  EXPECT_EQ(mock::counters().heuristic_queries, 2);
  EXPECT_EQ(mock::counters().last_requested, 1);
  EXPECT_EQ(runs_with(0), timing + 1);
}

// A product first seen inside a CUDA graph's capture cannot be timed there
// (the timing runs would be captured, and the wait for them is refused): it
// runs the heuristic's first choice in the graph, and is timed at its first
// call outside the capture.
TEST_F(CublasLtGemmMock, AutotuneWaitsForACallOutsideACapture) {
  const Case k{"linear", {8, 16}, {24, 16}, {8, 24}, false, true};
  const GemmPlan plan = plan_gemm(k.a, k.b, k.c, k.ta, k.tb);
  Buffer a(DType::BF16, numel(k.a), 1), b(DType::BF16, numel(k.b), 2), c(DType::BF16, 8 * 24, 3);
  const std::vector<double> want = reference(k, a.values(), b.values(), c.values(), 1.0, 0.0);
  mock::set_algorithms({3, 0});
  CublasLtGemm gemm(0);
  gemm.set_autotune(2);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_NO_THROW(gemm.run(plan, DType::BF16, a.data(), b.data(), c.data(), 1, 0, stream));
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(gemm.tuning().problems, 0);
  // The captured call: the heuristic's first choice, untimed.
  EXPECT_EQ(runs_with(0), 1);
  EXPECT_EQ(runs_with(1), 0);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<double> got = c.values();
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-2 * (1 + std::fabs(want[i]))) << "element " << i;
  gemm.run(plan, DType::BF16, a.data(), b.data(), c.data(), 1, 0, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(gemm.tuning().problems, 1);
  EXPECT_EQ(gemm.tuning().changed, 1);
  // Both timed (a warm-up, then kTuneRuns), then the call with the faster.
  EXPECT_EQ(runs_with(0), 1 + 1 + CublasLtGemm::kTuneRuns);
  EXPECT_EQ(runs_with(1), 1 + CublasLtGemm::kTuneRuns + 1);
  got = c.values();
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-2 * (1 + std::fabs(want[i]))) << "element " << i;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// A product that reads its output is timed into scratch, so that the timing
// runs leave it as it was: a weight gradient added into its f32 buffer
// (beta 1) adds once, and a GELU derivative written over its own input
// reads the input intact. Without scratch the heuristic's first choice runs
// untimed. The epilogues' other outputs come out as without autotuning.
TEST_F(CublasLtGemmMock, AutotuneTimesProductsThatReadTheirOutputIntoScratch) {
  const Case k{"weight gradient", {9, 16}, {9, 8}, {16, 8}, true, false};
  const GemmPlan plan = plan_gemm(k.a, k.b, k.c, k.ta, k.tb);
  Buffer a(DType::BF16, numel(k.a), 1), b(DType::BF16, numel(k.b), 2);
  for (bool scratch : {true, false}) {
    SCOPED_TRACE(scratch ? "with scratch" : "without scratch");
    mock::reset();
    mock::set_algorithms({2, 0});
    CublasLtGemm gemm(0);
    gemm.set_autotune(2);
    int64_t handed_out = 0;
    if (!scratch) {
      gemm.set_scratch_source([&](size_t) -> std::shared_ptr<void> {
        ++handed_out;
        return nullptr;
      });
    }
    Buffer c(DType::F32, 16 * 8, 3);
    const std::vector<double> want = reference(k, a.values(), b.values(), c.values(), 1.0, 1.0);
    gemm.run(plan, GemmTypes(DType::BF16, DType::F32), a.data(), b.data(), c.data(), 1, 1, nullptr);
    const std::vector<double> got = c.values();
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << "element " << i;
    const cuda::GemmTuning t = gemm.tuning();
    EXPECT_EQ(t.problems, scratch ? 1 : 0);
    EXPECT_EQ(t.untimed, scratch ? 0 : 1);
    EXPECT_EQ(handed_out, scratch ? 0 : 1);
    EXPECT_EQ(runs_with(0), scratch ? 1 + CublasLtGemm::kTuneRuns : 1);
    EXPECT_EQ(runs_with(1), scratch ? 2 + CublasLtGemm::kTuneRuns : 0);
  }
  // dpre over pre itself: GELU'(pre) * (dy @ w), pre read before it is
  // overwritten, however many times the candidates ran.
  mock::reset();
  mock::set_algorithms({1, 0, 1});
  const int64_t rows = 5, out = 6, in = 16;
  Buffer dy(DType::F32, rows * out, 9), w(DType::F32, out * in, 10), pre(DType::F32, rows * in, 11);
  const Case d{"input grad", {rows, out}, {out, in}, {rows, in}, false, false};
  const std::vector<double> da =
      reference(d, dy.values(), w.values(), std::vector<double>(rows * in, 0), 1, 0);
  const std::vector<double> x = pre.values();
  CublasLtGemm gemm(0);
  gemm.set_autotune(3);
  GemmEpilogue ep;
  ep.kind = GemmEpilogue::Kind::DGelu;
  ep.gelu_input = pre.data();
  gemm.run(plan_gemm(d.a, d.b, d.c, false, false), DType::F32, dy.data(), w.data(), pre.data(), 1,
           0, nullptr, ep);
  for (int64_t i = 0; i < rows * in; ++i) {
    const double v = gelu_tanh_grad(x[static_cast<size_t>(i)]) * da[static_cast<size_t>(i)];
    ASSERT_NEAR(pre.get(i), v, 1e-5 * (1 + std::fabs(v))) << "element " << i;
  }
  EXPECT_EQ(gemm.tuning().problems, 1);
  EXPECT_EQ(runs_with(1), 2 + CublasLtGemm::kTuneRuns);
  // A GELU epilogue timed in place: its pre-activation and output as the
  // untuned call's.
  const int64_t lin_rows = 7, lin_in = 6, lin_out = 16;
  Buffer xs(DType::F32, lin_rows * lin_in, 4), ws(DType::F32, lin_out * lin_in, 5),
      bias(DType::F32, lin_out, 6);
  const GemmPlan lin =
      plan_gemm({lin_rows, lin_in}, {lin_out, lin_in}, {lin_rows, lin_out}, false, true);
  auto gelu_run = [&](int candidates) {
    CublasLtGemm g(0);
    g.set_autotune(candidates);
    Buffer y(DType::F32, lin_rows * lin_out, 7), p(DType::F32, lin_rows * lin_out, 8);
    GemmEpilogue e;
    e.kind = GemmEpilogue::Kind::BiasGelu;
    e.bias = bias.data();
    e.gelu_input = p.data();
    g.run(lin, DType::F32, xs.data(), ws.data(), y.data(), 1, 0, nullptr, e);
    return std::pair{y.values(), p.values()};
  };
  EXPECT_EQ(gelu_run(3), gelu_run(0));
}

// A mixture's experts multiply a new number of tokens every step. A new
// problem of a class already chosen for (rows 41, then 43 and 44: one class
// of gemm_extent_class, none a multiple of 8) takes that class's algorithm
// once cuBLASLt's check accepts it: no query, no timing, the right product.
// A multiple of 8 (40), another class (88), or an algorithm the check
// refuses asks the heuristic as before.
TEST_F(CublasLtGemmMock, ProblemsOfOneClassShareTheirAlgorithm) {
  const int64_t in = 16, out = 24;
  Buffer w(DType::BF16, out * in, 2);
  mock::set_algorithms({3, 0, 3});
  CublasLtGemm gemm(0);
  gemm.set_autotune(3);
  auto product = [&](int64_t rows) {
    const Case k{"an expert's rows", {rows, in}, {out, in}, {rows, out}, false, true};
    Buffer x(DType::BF16, rows * in, static_cast<uint32_t>(rows)), y(DType::BF16, rows * out, 3);
    const std::vector<double> want = reference(k, x.values(), w.values(), y.values(), 1.0, 0.0);
    gemm.run(plan_gemm(k.a, k.b, k.c, k.ta, k.tb), DType::BF16, x.data(), w.data(), y.data(), 1, 0,
             nullptr);
    const std::vector<double> got = y.values();
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-2 * (1 + std::fabs(want[i]))) << rows << " rows, " << i;
  };
  product(41);  // asked, timed: the second candidate wins
  EXPECT_EQ(mock::counters().heuristic_queries, 1);
  EXPECT_EQ(gemm.tuning().problems, 1);
  const int64_t timing = 1 + CublasLtGemm::kTuneRuns;
  EXPECT_EQ(runs_with(1), timing + 1);
  product(43);
  product(44);
  EXPECT_EQ(mock::counters().heuristic_queries, 1);
  EXPECT_EQ(mock::counters().algorithm_checks, 2);
  EXPECT_EQ(gemm.tuning().problems, 1);  // not timed again
  EXPECT_EQ(gemm.tuning().reused, 2);
  EXPECT_EQ(gemm.tuning().queried, 1);
  EXPECT_EQ(runs_with(1), timing + 3);  // the winner ran them
  EXPECT_EQ(runs_with(0), timing);
  product(43);  // cached as itself: not even checked
  EXPECT_EQ(mock::counters().algorithm_checks, 2);
  product(40);  // a multiple of 8
  product(88);  // another class
  EXPECT_EQ(mock::counters().heuristic_queries, 3);
  EXPECT_EQ(gemm.tuning().problems, 3);
  mock::set_algorithm_checks_fail(true);
  product(42);  // 41's class, but refused for this problem
  EXPECT_EQ(mock::counters().heuristic_queries, 4);
  EXPECT_EQ(gemm.tuning().reused, 2);
  EXPECT_EQ(gemm.tuning().queried, 4);
}

// The cache of problems is bounded: past kMaxCachedProblems it starts over,
// keeping the classes' algorithms, so a problem seen before is not asked
// for again and still multiplies right.
TEST_F(CublasLtGemmMock, TheCacheOfProblemsStartsOverPastItsBound) {
  CublasLtGemm gemm(0);
  const int64_t in = 2, out = 3, most = 8 * 1024;
  Buffer x(DType::F32, most * in, 1), w(DType::F32, out * in, 2), y(DType::F32, most * out, 3);
  auto product = [&](int64_t rows) {
    gemm.run(plan_gemm({rows, in}, {out, in}, {rows, out}, false, true), DType::F32, x.data(),
             w.data(), y.data(), 1, 0, nullptr);
  };
  // Problems of 1 to 15 rows are each their own class, so each asks; the
  // rest fill the cache through their classes.
  int64_t rows = 1;
  for (; gemm.cached_problems() < CublasLtGemm::kMaxCachedProblems; ++rows) product(rows);
  EXPECT_LT(mock::counters().heuristic_queries, 200);
  product(rows);  // one past the bound: the cache starts over
  EXPECT_EQ(gemm.cached_problems(), 1u);
  const int64_t queries = mock::counters().heuristic_queries;
  product(5);
  product(1000);
  EXPECT_EQ(mock::counters().heuristic_queries, queries);  // their classes were known
  EXPECT_EQ(gemm.cached_problems(), 3u);
  const Case k{"1000 rows", {1000, in}, {out, in}, {1000, out}, false, true};
  const std::vector<double> want = reference(k, x.values(), w.values(), y.values(), 1.0, 0.0);
  for (int64_t i = 0; i < 1000 * out; ++i)
    ASSERT_NEAR(y.get(i), want[static_cast<size_t>(i)], 1e-5 * (1 + std::fabs(want[i])));
}

}  // namespace
}  // namespace triad::detail
