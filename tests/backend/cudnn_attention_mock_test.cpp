// cudnn_attention.cpp against a CPU stand-in for libcudnn (mock_cudnn.cpp),
// in every build with cuDNN headers and no GPU: the descriptors it builds
// must pass the checks the library makes, its variant packs must bind every
// tensor at the right offset inside Triad's fused buffers (bf16 here), its
// workspace layout must keep its tensors out of the engine's scratch, plans
// must be cached, and executing the forward and backward graphs must give
// causal attention (against a double-precision reference). What only a GPU
// can say: whether cuDNN has a fused engine for these graphs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "src/backend/cuda/cudnn_attention.h"
#include "support/mock_cudnn.h"
#include "triad/core/error.h"

namespace triad::detail {
namespace {

namespace g = cudnn_graph;
namespace mock = testing::mock_cudnn;

uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = to_bf16(dist(rng));
  return v;
}

// Causal attention in double on the fused layout, forward and backward.
struct Reference {
  std::vector<double> out, lse, dqkv;
};
Reference reference(const g::AttentionProblem& p, const std::vector<uint16_t>& qkv,
                    const std::vector<uint16_t>& dout) {
  const int64_t B = p.B, T = p.T, C = p.C, NH = p.NH, D = p.head_dim(), W = p.qkv_width();
  const int64_t G = NH / p.kv_heads();  // query heads a key/value head serves
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  // Query head h's q (part 0), or the k (1) or v (2) of the key/value head
  // it reads, within a row of qkv.
  auto column = [&](int64_t part, int64_t h, int64_t d) {
    return part == 0 ? h * D + d : C + (part - 1) * p.kv_heads() * D + (h / G) * D + d;
  };
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
    return static_cast<double>(
        from_bf16(qkv[static_cast<size_t>((b * T + t) * W + column(part, h, d))]));
  };
  Reference r;
  r.out.assign(static_cast<size_t>(B * T * C), 0);
  r.lse.assign(static_cast<size_t>(B * NH * T), 0);
  r.dqkv.assign(static_cast<size_t>(B * T * W), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      std::vector<std::vector<double>> P(static_cast<size_t>(T));
      // The first key the query at i sees (a sliding window's, or 0).
      auto first = [&](int64_t i) {
        return p.window > 0 ? std::max<int64_t>(0, i - p.window + 1) : int64_t{0};
      };
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(static_cast<size_t>(i + 1), 0.0);
        double m = -1e300;
        for (int64_t j = first(i); j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += at(b, i, 0, h, d) * at(b, j, 1, h, d);
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (int64_t j = first(i); j <= i; ++j) z += std::exp(s[j] - m);
        P[i].assign(s.size(), 0.0);
        for (int64_t j = first(i); j <= i; ++j) P[i][j] = std::exp(s[j] - m) / z;
        r.lse[static_cast<size_t>((b * NH + h) * T + i)] = m + std::log(z);
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = first(i); j <= i; ++j) o += P[i][j] * at(b, j, 2, h, d);
          r.out[static_cast<size_t>((b * T + i) * C + h * D + d)] = o;
        }
      }
      auto dO = [&](int64_t i, int64_t d) {
        return static_cast<double>(
            from_bf16(dout[static_cast<size_t>((b * T + i) * C + h * D + d)]));
      };
      auto grad = [&](int64_t t, int64_t part, int64_t d) -> double& {
        return r.dqkv[static_cast<size_t>((b * T + t) * W + column(part, h, d))];
      };
      for (int64_t i = 0; i < T; ++i) {
        double delta = 0;
        for (int64_t d = 0; d < D; ++d)
          delta += dO(i, d) * r.out[static_cast<size_t>((b * T + i) * C + h * D + d)];
        for (int64_t j = first(i); j <= i; ++j) {
          double dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += dO(i, d) * at(b, j, 2, h, d);
          const double ds = P[i][j] * (dp - delta) * scale;
          for (int64_t d = 0; d < D; ++d) {
            grad(i, 0, d) += ds * at(b, j, 1, h, d);
            grad(j, 1, d) += ds * at(b, i, 0, h, d);
            grad(j, 2, d) += P[i][j] * dO(i, d);
          }
        }
      }
    }
  return r;
}

template <class T>
void expect_near_all(const std::vector<T>& got, const std::vector<double>& want, double tol,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    double v;
    if constexpr (std::is_same_v<T, uint16_t>)
      v = from_bf16(got[i]);
    else
      v = got[i];
    ASSERT_NEAR(v, want[i], tol * (1 + std::fabs(want[i]))) << what << " element " << i;
  }
}

// 256-byte aligned host memory, as the device allocator gives.
template <class T>
struct Aligned {
  explicit Aligned(size_t n) : raw((n * sizeof(T) + 512) / sizeof(T) + 1) {
    auto p = reinterpret_cast<uintptr_t>(raw.data());
    data = reinterpret_cast<T*>((p + 255) / 256 * 256);
  }
  std::vector<T> raw;
  T* data;
};

class CudnnAttentionMock : public ::testing::Test {
 protected:
  void SetUp() override { mock::reset(); }
};

TEST_F(CudnnAttentionMock, ForwardAndBackwardComputeCausalAttention) {
  // Multi-head, grouped-query (2 key/value heads for 4) and multi-query.
  std::vector<g::AttentionProblem> problems{g::AttentionProblem{2, 9, 32, 2, g::DataType::BF16},
                                            g::AttentionProblem{1, 17, 48, 3, g::DataType::BF16},
                                            g::AttentionProblem{2, 9, 64, 4, g::DataType::BF16},
                                            g::AttentionProblem{1, 10, 48, 3, g::DataType::BF16}};
  problems[2].NKV = 2;
  problems[3].NKV = 1;
  // And a sliding window of 4 keys, with grouped heads.
  problems.push_back(g::AttentionProblem{2, 9, 64, 4, g::DataType::BF16});
  problems[4].NKV = 2;
  problems[4].window = 4;
  for (const g::AttentionProblem& p : problems) {
    SCOPED_TRACE("T=" + std::to_string(p.T) + " C=" + std::to_string(p.C) +
                 " NKV=" + std::to_string(p.kv_heads()) + " window=" + std::to_string(p.window));
    const size_t n_qkv = static_cast<size_t>(p.B * p.T * p.qkv_width());
    const size_t n_out = static_cast<size_t>(p.B * p.T * p.C);
    const size_t n_lse = static_cast<size_t>(p.B * p.NH * p.T);
    const std::vector<uint16_t> qkv_v = random_bf16(n_qkv, 1), dout_v = random_bf16(n_out, 2);
    Aligned<uint16_t> qkv(n_qkv), out(n_out), dout(n_out), dqkv(n_qkv);
    Aligned<float> lse(n_lse);
    std::copy(qkv_v.begin(), qkv_v.end(), qkv.data);
    std::copy(dout_v.begin(), dout_v.end(), dout.data);
    const Reference want = reference(p, qkv_v, dout_v);

    const size_t fws = cudnn_attention_workspace(0, p, false);
    EXPECT_GE(fws, static_cast<size_t>(mock::kEngineWorkspace));
    Aligned<char> fwork(fws);
    cudnn_attention_forward(0, nullptr, p, qkv.data, out.data, lse.data, fwork.data);
    cudaDeviceSynchronize();  // the stand-in's graphs run on the stream
    expect_near_all(std::vector<uint16_t>(out.data, out.data + n_out), want.out, 2e-2, "out");
    expect_near_all(std::vector<float>(lse.data, lse.data + n_lse), want.lse, 1e-3, "lse");

    // The backward runs on the reference's out (rounded) and lse, as Triad
    // feeds it the forward's.
    for (size_t i = 0; i < n_out; ++i) out.data[i] = to_bf16(static_cast<float>(want.out[i]));
    for (size_t i = 0; i < n_lse; ++i) lse.data[i] = static_cast<float>(want.lse[i]);
    for (bool deterministic : {true, false}) {
      SCOPED_TRACE(deterministic ? "deterministic" : "dQ accumulated");
      const size_t bws = cudnn_attention_workspace(0, p, true, deterministic);
      // The engine's scratch, then rowsum(dO * O) in f32, then (accumulated
      // dQ) dQ in f32.
      const size_t dq_accum = deterministic ? 0 : n_out * sizeof(float);
      EXPECT_GE(bws,
                static_cast<size_t>(mock::kEngineWorkspace) + n_lse * sizeof(float) + dq_accum);
      Aligned<char> bwork(bws);
      // Garbage in the workspace: the accumulator must be cleared first.
      std::fill(bwork.data, bwork.data + bws, static_cast<char>(0x5a));
      std::fill(dqkv.data, dqkv.data + n_qkv, to_bf16(std::nanf("")));
      cudnn_attention_backward(0, nullptr, p, qkv.data, out.data, lse.data, dout.data, dqkv.data,
                               bwork.data, deterministic);
      cudaDeviceSynchronize();
      expect_near_all(std::vector<uint16_t>(dqkv.data, dqkv.data + n_qkv), want.dqkv, 3e-2, "dqkv");
    }
  }
  EXPECT_EQ(mock::stats().executions, 15);
  EXPECT_EQ(mock::last_error(), "");
}

TEST_F(CudnnAttentionMock, PlansAreBuiltOncePerShapeAndDescriptorsDoNotLeak) {
  const g::AttentionProblem p{1, 8, 16, 2, g::DataType::BF16};
  Aligned<uint16_t> qkv(8 * 48), out(8 * 16);
  Aligned<float> lse(16);
  std::fill(qkv.data, qkv.data + 8 * 48, to_bf16(0.5f));
  Aligned<char> work(cudnn_attention_workspace(0, p, false));
  const int64_t graphs = mock::stats().graphs_finalized;
  cudnn_attention_forward(0, nullptr, p, qkv.data, out.data, lse.data, work.data);
  const int64_t live = mock::stats().live_descriptors;
  for (int i = 0; i < 5; ++i)
    cudnn_attention_forward(0, nullptr, p, qkv.data, out.data, lse.data, work.data);
  // Run the queued graphs while their buffers live (the stand-in executes
  // on the stream, at the next synchronisation).
  cudaDeviceSynchronize();
  EXPECT_EQ(mock::stats().graphs_finalized, graphs);  // the cached plan
  EXPECT_EQ(mock::stats().live_descriptors, live);    // variant packs released
  // Another device, or another shape, gets its own plan.
  cudnn_attention_workspace(1, p, false);
  EXPECT_EQ(mock::stats().graphs_finalized, graphs + 1);
  g::AttentionProblem multi_query = p;
  multi_query.NKV = 1;
  cudnn_attention_workspace(0, multi_query, false);
  EXPECT_EQ(mock::stats().graphs_finalized, graphs + 2);
}

TEST_F(CudnnAttentionMock, NoEngineAndBadPointersAreClearErrors) {
  mock::set_no_engines(true);
  const g::AttentionProblem p{3, 5, 16, 2, g::DataType::F16};
  try {
    cudnn_attention_workspace(0, p, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no cuDNN engine runs the backward B=3 T=5 C=16 NH=2 f16"), std::string::npos)
        << m;
    EXPECT_NE(m.find("model.attention_kernel"), std::string::npos) << m;
  }
  mock::set_no_engines(false);
  const g::AttentionProblem q{1, 4, 16, 2, g::DataType::BF16};
  Aligned<uint16_t> qkv(4 * 48 + 8), out(4 * 16);
  Aligned<float> lse(8);
  Aligned<char> work(cudnn_attention_workspace(0, q, false));
  EXPECT_THROW(cudnn_attention_forward(0, nullptr, q, qkv.data + 1, out.data, lse.data, work.data),
               ValueError);
}

// The stand-in refuses an output that shares bytes with another bound
// tensor, as cuDNN's graphs assume they do not; touching is not sharing.
TEST_F(CudnnAttentionMock, AnOutputOverAnInputIsRefused) {
  const g::AttentionProblem p{1, 4, 16, 2, g::DataType::BF16};
  const size_t n_qkv = 4 * 48, n_out = 4 * 16;
  Aligned<uint16_t> buffer(n_qkv + n_out);
  const std::vector<uint16_t> qkv_v = random_bf16(n_qkv, 3);
  std::copy(qkv_v.begin(), qkv_v.end(), buffer.data);
  Aligned<float> lse(8);
  Aligned<char> work(cudnn_attention_workspace(0, p, false));
  // Right after qkv's last element: runs.
  cudnn_attention_forward(0, nullptr, p, buffer.data, buffer.data + n_qkv, lse.data, work.data);
  cudaDeviceSynchronize();
  EXPECT_EQ(mock::last_error(), "");
  // Over v of the last token: refused, naming the two tensors.
  EXPECT_ANY_THROW(cudnn_attention_forward(0, nullptr, p, buffer.data, buffer.data + n_qkv - 16,
                                           lse.data, work.data));
  EXPECT_NE(mock::last_error().find("is written over uid"), std::string::npos)
      << mock::last_error();
}

// The causal mask's fill follows the loaded library's version, as cuDNN's
// own frontend does: the lowest float before 9.10, minus infinity after.
TEST_F(CudnnAttentionMock, MaskFillFollowsTheLoadedVersion) {
  // Plans are cached per shape for the process (whose library never
  // changes), so each version gets a shape no other test uses.
  for (const auto& [version, T] : {std::pair<size_t, int64_t>{90500, 6}, {91900, 7}}) {
    SCOPED_TRACE("cuDNN " + std::to_string(version));
    mock::reset();
    mock::set_version(version);
    const g::AttentionProblem p{1, T, 16, 2, g::DataType::BF16};
    const size_t n_qkv = static_cast<size_t>(T * 48), n_lse = static_cast<size_t>(2 * T);
    Aligned<uint16_t> qkv(n_qkv), out(static_cast<size_t>(T * 16));
    Aligned<float> lse(n_lse);
    const std::vector<uint16_t> values = random_bf16(n_qkv, 3);
    std::copy(values.begin(), values.end(), qkv.data);
    Aligned<char> work(cudnn_attention_workspace(0, p, false));
    cudnn_attention_forward(0, nullptr, p, qkv.data, out.data, lse.data, work.data);
    cudaDeviceSynchronize();
    EXPECT_EQ(mock::stats().select_fill, version >= 91000 ? -std::numeric_limits<float>::infinity()
                                                          : std::numeric_limits<float>::lowest());
    const Reference want =
        reference(p, values, std::vector<uint16_t>(values.begin(), values.begin() + T * 16));
    expect_near_all(std::vector<float>(lse.data, lse.data + n_lse), want.lse, 1e-3, "lse");
  }
}

TEST_F(CudnnAttentionMock, AvailabilityNamesTheReason) {
  const g::AttentionProblem p{2, 64, 768, 12, g::DataType::BF16};
  EXPECT_TRUE(cudnn_attention_compiled());
  EXPECT_EQ(cudnn_attention_unavailable(p, 9), "");
  EXPECT_NE(cudnn_attention_unavailable(p, 7).find("compute capability 8.0"), std::string::npos);
  EXPECT_NE(cudnn_attention_unavailable({2, 64, 768, 12, g::DataType::F32}, 9).find("bf16 or f16"),
            std::string::npos);
  // cuDNN before 9.16: sequence lengths a multiple of 128 only.
  mock::set_version(91500);
  EXPECT_NE(cudnn_attention_unavailable(p, 9).find("multiple of 128 only, not 64"),
            std::string::npos);
  EXPECT_EQ(cudnn_attention_unavailable({2, 256, 768, 12, g::DataType::BF16}, 9), "");
  // Sliding windows from cuDNN 9.2 on.
  g::AttentionProblem windowed{2, 256, 768, 12, g::DataType::BF16};
  windowed.window = 64;
  mock::set_version(90100);
  EXPECT_NE(cudnn_attention_unavailable(windowed, 9).find("before 9.2"), std::string::npos);
  windowed.window = 256;  // (the whole sequence: no window)
  EXPECT_EQ(cudnn_attention_unavailable(windowed, 9), "");
  mock::set_version(80900);
  EXPECT_NE(cudnn_attention_unavailable(p, 9).find("cuDNN 9 or newer"), std::string::npos);
}

}  // namespace
}  // namespace triad::detail
