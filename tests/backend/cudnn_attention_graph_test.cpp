// The graphs handed to cuDNN's fused attention, checked without a GPU: a
// small interpreter runs each graph's operations on the CPU (in float, with
// the strides, transposes, broadcasts and masks exactly as declared) and the
// result must match Triad's CPU attention forward and backward.
#include "src/backend/cuda/cudnn_attention_graph.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <string>

#include "triad/backend/backend.h"
#include "triad/core/tensor.h"

namespace triad::detail::cudnn_graph {
namespace {

using Index = std::array<int64_t, 4>;

int64_t offset_of(const TensorDesc& t, const Index& i) {
  int64_t o = 0;
  for (int d = 0; d < 4; ++d) o += i[d] * t.strides[d];
  return o;
}

int64_t extent(const TensorDesc& t) {
  int64_t e = 1;
  for (int d = 0; d < 4; ++d) e += (t.dims[d] - 1) * t.strides[d];
  return e;
}

template <class F>
void for_each_index(const TensorDesc& t, F&& f) {
  Index i{};
  for (i[0] = 0; i[0] < t.dims[0]; ++i[0])
    for (i[1] = 0; i[1] < t.dims[1]; ++i[1])
      for (i[2] = 0; i[2] < t.dims[2]; ++i[2])
        for (i[3] = 0; i[3] < t.dims[3]; ++i[3]) f(i);
}

// Index i of a dimension of size `large` in one of size `small` dividing it:
// each element of the small one stands for large / small consecutive ones
// (a broadcast dimension of size 1; grouped-query attention's key/value
// heads, each serving a group of query heads).
int64_t grouped(int64_t i, int64_t small, int64_t large) {
  return i / (large / small);
}

// Runs a graph the way the backend API defines its operations. Bound
// tensors read and write caller memory; virtual ones get buffers here;
// by-value scalars read their value.
class Interpreter {
 public:
  explicit Interpreter(const Graph& g) : g_(g) {}
  void bind(int64_t uid, float* base) { mem_[uid] = base; }

  void run() {
    for (const TensorDesc& t : g_.tensors) {
      if (t.by_value) {
        scalars_[t.uid] = t.value;
        mem_[t.uid] = &scalars_[t.uid];
      } else if (!t.is_virtual && !mem_.count(t.uid)) {
        throw std::runtime_error("tensor '" + t.name + "' is not bound");
      }
    }
    for (const Op& op : g_.ops) run(op);
  }

 private:
  float* ptr(int64_t uid) {
    auto it = mem_.find(uid);
    if (it != mem_.end()) return it->second;
    const TensorDesc& t = g_.tensor(uid);
    if (!t.is_virtual) throw std::runtime_error("tensor '" + t.name + "' is not bound");
    store_[uid].assign(static_cast<size_t>(extent(t)), std::nanf(""));
    return mem_[uid] = store_[uid].data();
  }
  // x read at y's index, broadcasting x's dimensions of size 1.
  float read(int64_t uid, const TensorDesc& y, const Index& yi) {
    const TensorDesc& x = g_.tensor(uid);
    Index xi{};
    for (int d = 0; d < 4; ++d) {
      if (x.dims[d] != y.dims[d] && x.dims[d] != 1)
        throw std::runtime_error("'" + x.name + "' does not broadcast onto '" + y.name + "'");
      xi[d] = x.dims[d] == 1 ? 0 : yi[d];
    }
    return ptr(uid)[offset_of(x, xi)];
  }

  void run(const Op& op) {
    const TensorDesc& y = g_.tensor(op.y);
    switch (op.kind) {
      case OpKind::Reshape: {
        // A view of x's memory: same elements, y's own dims and strides.
        const TensorDesc& x = g_.tensor(op.x);
        ASSERT_TRUE(y.is_virtual) << op.name;
        ASSERT_EQ(x.dims[0] * x.dims[1] * x.dims[2] * x.dims[3],
                  y.dims[0] * y.dims[1] * y.dims[2] * y.dims[3])
            << op.name;
        mem_[op.y] = ptr(op.x);
        return;
      }
      case OpKind::Matmul: {
        const TensorDesc& a = g_.tensor(op.x);
        const TensorDesc& b = g_.tensor(op.b);
        ASSERT_EQ(a.dims[3], b.dims[2]) << op.name;
        ASSERT_EQ(a.dims[2], y.dims[2]) << op.name;
        ASSERT_EQ(b.dims[3], y.dims[3]) << op.name;
        for (int d = 0; d < 2; ++d) {
          ASSERT_EQ(y.dims[d] % a.dims[d], 0) << op.name;
          ASSERT_EQ(y.dims[d] % b.dims[d], 0) << op.name;
        }
        float* out = ptr(op.y);
        float* pa = ptr(op.x);
        float* pb = ptr(op.b);
        for_each_index(y, [&](const Index& i) {
          double acc = 0;
          for (int64_t k = 0; k < a.dims[3]; ++k) {
            const Index ai{grouped(i[0], a.dims[0], y.dims[0]), grouped(i[1], a.dims[1], y.dims[1]),
                           i[2], k};
            const Index bi{grouped(i[0], b.dims[0], y.dims[0]), grouped(i[1], b.dims[1], y.dims[1]),
                           k, i[3]};
            acc += static_cast<double>(pa[offset_of(a, ai)]) * pb[offset_of(b, bi)];
          }
          out[offset_of(y, i)] = static_cast<float>(acc);
        });
        return;
      }
      case OpKind::Reduction: {
        const TensorDesc& x = g_.tensor(op.x);
        for (int d = 0; d < 4; ++d) ASSERT_EQ(x.dims[d] % y.dims[d], 0) << op.name;
        float* out = ptr(op.y);
        for_each_index(y, [&](const Index& i) {
          out[offset_of(y, i)] =
              op.reduction == ReductionMode::Max ? -std::numeric_limits<float>::infinity() : 0.f;
        });
        float* in = ptr(op.x);
        for_each_index(x, [&](const Index& xi) {
          Index yi{};
          for (int d = 0; d < 4; ++d) yi[d] = grouped(xi[d], y.dims[d], x.dims[d]);
          float& r = out[offset_of(y, yi)];
          const float v = in[offset_of(x, xi)];
          r = op.reduction == ReductionMode::Max ? std::max(r, v) : r + v;
        });
        return;
      }
      case OpKind::Pointwise: {
        float* out = ptr(op.y);
        for_each_index(y, [&](const Index& i) {
          float v = 0;
          switch (op.pointwise) {
            case PointwiseMode::GenIndex:
              v = static_cast<float>(i[static_cast<size_t>(op.axis)]);
              break;
            case PointwiseMode::Identity:
              v = read(op.x, y, i);
              break;
            case PointwiseMode::Exp:
              v = std::exp(read(op.x, y, i));
              break;
            case PointwiseMode::Log:
              v = std::log(read(op.x, y, i));
              break;
            case PointwiseMode::Add:
              v = read(op.x, y, i) + read(op.b, y, i);
              break;
            case PointwiseMode::Sub:
              v = read(op.x, y, i) - read(op.b, y, i);
              break;
            case PointwiseMode::Mul:
              v = read(op.x, y, i) * read(op.b, y, i);
              break;
            case PointwiseMode::Div:
              v = read(op.x, y, i) / read(op.b, y, i);
              break;
            case PointwiseMode::CmpGe:
              v = read(op.x, y, i) >= read(op.b, y, i) ? 1.f : 0.f;
              break;
            case PointwiseMode::CmpGt:
              v = read(op.x, y, i) > read(op.b, y, i) ? 1.f : 0.f;
              break;
            case PointwiseMode::BinarySelect:
              v = read(op.t, y, i) != 0 ? read(op.x, y, i) : read(op.b, y, i);
              break;
          }
          out[offset_of(y, i)] = v;
        });
        return;
      }
    }
  }

  const Graph& g_;
  std::map<int64_t, float*> mem_;
  std::map<int64_t, std::vector<float>> store_;
  std::map<int64_t, float> scalars_;
};

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  Tensor t = empty(shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

void expect_graph_close(const Tensor& want, const float* got, const char* what) {
  const float* w = want.data<float>();
  for (int64_t i = 0; i < want.numel(); ++i) {
    ASSERT_NEAR(got[i], w[i], 2e-5f * (1.f + std::fabs(w[i]))) << what << " element " << i;
  }
}

struct GraphCase {
  int64_t B, T, C, NH;
  int64_t NKV = 0;     // key/value heads; 0: NH
  int64_t window = 0;  // a sliding window of keys; 0: none
  int64_t kv() const { return NKV > 0 ? NKV : NH; }
  int64_t width() const { return C + 2 * kv() * (C / NH); }
  AttentionHeads heads() const { return {NH, kv()}; }
  AttentionProblem problem(DataType io, int64_t version) const {
    AttentionProblem p{B, T, C, NH, io, version};
    p.NKV = NKV;
    p.window = window;
    return p;
  }
  // Triad's first keys for the window (undefined without one).
  Tensor starts() const {
    if (window == 0) return {};
    Tensor s = empty({B, T}, DType::I32);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        s.data<int32_t>()[b * T + t] = static_cast<int32_t>(std::max<int64_t>(0, t - window + 1));
    return s;
  }
};

class CudnnAttentionGraph : public ::testing::TestWithParam<GraphCase> {};

TEST_P(CudnnAttentionGraph, ForwardMatchesTriadAttention) {
  const GraphCase c = GetParam();
  Backend& cpu = backend_for(DeviceType::CPU);
  Tensor qkv = random_tensor({c.B, c.T, c.width()}, 1);
  Tensor out = empty({c.B, c.T, c.C}), lse = empty({c.B, c.NH, c.T});
  cpu.attention_forward(qkv, c.heads(), out, lse, c.starts());

  // Masked scores filled with the lowest float (cuDNN before 9.10) and with
  // minus infinity (9.10 on).
  for (int64_t version : {int64_t{90500}, int64_t{91900}}) {
    SCOPED_TRACE("cuDNN " + std::to_string(version));
    const AttentionProblem p = c.problem(DataType::BF16, version);
    std::vector<float> o(static_cast<size_t>(out.numel()), std::nanf(""));
    std::vector<float> stats(static_cast<size_t>(lse.numel()), std::nanf(""));
    const Graph g = attention_forward_graph(p);
    Interpreter run(g);
    float* base = qkv.data<float>();
    for (int64_t uid : {int64_t{kQ}, int64_t{kK}, int64_t{kV}})
      run.bind(uid, base + element_offset(p, uid));
    run.bind(kO, o.data());
    run.bind(kStats, stats.data());
    run.run();
    expect_graph_close(out, o.data(), "out");
    expect_graph_close(lse, stats.data(), "lse");
    EXPECT_TRUE(workspace_tensors(g).empty());
  }
}

TEST_P(CudnnAttentionGraph, BackwardMatchesTriadAttentionBothWays) {
  const GraphCase c = GetParam();
  Backend& cpu = backend_for(DeviceType::CPU);
  Tensor qkv = random_tensor({c.B, c.T, c.width()}, 2);
  Tensor dout = random_tensor({c.B, c.T, c.C}, 3);
  Tensor out = empty({c.B, c.T, c.C}), lse = empty({c.B, c.NH, c.T});
  Tensor dqkv = empty({c.B, c.T, c.width()});
  cpu.attention_forward(qkv, c.heads(), out, lse, c.starts());
  cpu.attention_backward(qkv, out, lse, dout, c.heads(), dqkv, c.starts());

  for (int64_t version : {int64_t{90500}, int64_t{91900}}) {
    for (bool deterministic : {true, false}) {
      SCOPED_TRACE("cuDNN " + std::to_string(version) +
                   (deterministic ? ", deterministic" : ", dq accumulated"));
      const AttentionProblem p = c.problem(DataType::F16, version);
      const Graph g = attention_backward_graph(p, deterministic);
      const std::vector<WorkspaceTensor> ws = workspace_tensors(g);
      ASSERT_EQ(ws.size(), deterministic ? 1u : 2u);
      EXPECT_EQ(ws[0].uid, kSoftmaxSum);
      EXPECT_EQ(ws[0].bytes, c.B * c.NH * c.T * 4);
      std::vector<std::vector<float>> scratch;
      std::vector<float> d(static_cast<size_t>(dqkv.numel()), std::nanf(""));
      Interpreter run(g);
      for (int64_t uid : {int64_t{kQ}, int64_t{kK}, int64_t{kV}})
        run.bind(uid, qkv.data<float>() + element_offset(p, uid));
      for (int64_t uid : {int64_t{kDQ}, int64_t{kDK}, int64_t{kDV}})
        run.bind(uid, d.data() + element_offset(p, uid));
      run.bind(kO, out.data<float>());
      run.bind(kDO, dout.data<float>());
      run.bind(kStats, lse.data<float>());
      for (const WorkspaceTensor& w : ws) {
        scratch.emplace_back(static_cast<size_t>(w.bytes / 4), std::nanf(""));
        run.bind(w.uid, scratch.back().data());
      }
      run.run();
      expect_graph_close(dqkv, d.data(), "dqkv");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttentionGraph,
                         ::testing::Values(GraphCase{1, 5, 16, 2}, GraphCase{2, 7, 24, 3},
                                           GraphCase{2, 16, 32, 1},
                                           // grouped-query: 2 groups of 2, 2 of 3, and
                                           // multi-query (one key/value head for 4)
                                           GraphCase{2, 7, 32, 4, 2}, GraphCase{1, 9, 48, 6, 2},
                                           GraphCase{2, 6, 32, 4, 1},
                                           // sliding windows: 3 keys of 9, one key (each
                                           // query its own), and grouped heads
                                           GraphCase{2, 9, 16, 2, 0, 3},
                                           GraphCase{1, 6, 16, 2, 0, 1},
                                           GraphCase{1, 11, 32, 4, 2, 4}));

TEST(CudnnAttentionGraphChecks, RefusesWhatCudnnCannotRun) {
  EXPECT_NE(cudnn_attention_unsupported({2, 8, 64, 4, DataType::F32}), "");
  EXPECT_NE(cudnn_attention_unsupported({2, 8, 36, 3, DataType::BF16}).find("multiple of 8"),
            std::string::npos);                                               // head dim 12
  EXPECT_NE(cudnn_attention_unsupported({2, 8, 64, 3, DataType::BF16}), "");  // 64 % 3
  EXPECT_EQ(cudnn_attention_unsupported({8, 1024, 768, 12, DataType::BF16}), "");
  EXPECT_THROW(attention_forward_graph({2, 8, 64, 4, DataType::F32}), std::invalid_argument);
}

TEST(CudnnAttentionGraphChecks, BoundTensorsSitInsideTheFusedLayout) {
  // q, k, v of head h start at h * D inside each row of qkv (B, T, 3C).
  const AttentionProblem p{2, 8, 64, 4, DataType::BF16};
  const Graph g = attention_backward_graph(p, true);
  const TensorDesc& k = g.tensor(kK);
  EXPECT_EQ(k.dims, (std::array<int64_t, 4>{2, 4, 16, 8}));  // transposed: D before T
  EXPECT_EQ(k.strides, (std::array<int64_t, 4>{8 * 192, 16, 1, 192}));
  EXPECT_EQ(element_offset(p, kK), 64);
  EXPECT_EQ(element_offset(p, kDV), 128);
  EXPECT_EQ(g.tensor(kStats).strides, (std::array<int64_t, 4>{32, 8, 1, 1}));
  EXPECT_TRUE(g.tensor(kScale).by_value);
  EXPECT_FLOAT_EQ(g.tensor(kScale).value, 0.25f);
  EXPECT_THROW(g.tensor(99), std::out_of_range);
}

// Grouped-query attention: k and v hold NKV heads after the NH query heads
// (W = C + 2 NKV D per row), their gradients are each query head's summed
// over its group, and a key/value head count that does not divide the query
// heads is refused.
TEST(CudnnAttentionGraphChecks, GroupedKeyValueHeadsSitInsideTheFusedLayout) {
  AttentionProblem p{2, 8, 64, 4, DataType::BF16};
  p.NKV = 2;  // D 16, W 128
  EXPECT_EQ(p.qkv_width(), 128);
  const Graph g = attention_backward_graph(p, true);
  EXPECT_EQ(g.tensor(kK).dims, (std::array<int64_t, 4>{2, 2, 16, 8}));
  EXPECT_EQ(g.tensor(kK).strides, (std::array<int64_t, 4>{8 * 128, 16, 1, 128}));
  EXPECT_EQ(g.tensor(kDV).dims, (std::array<int64_t, 4>{2, 2, 8, 16}));
  EXPECT_EQ(g.tensor(kQ).dims, (std::array<int64_t, 4>{2, 4, 8, 16}));
  EXPECT_EQ(element_offset(p, kK), 64);
  EXPECT_EQ(element_offset(p, kV), 96);
  EXPECT_EQ(element_offset(p, kDV), 96);
  auto group_sums = [](const Graph& graph) {
    int n = 0;
    for (const Op& op : graph.ops) {
      if (op.kind != OpKind::Reduction || graph.tensor(op.x).dims[1] == graph.tensor(op.y).dims[1])
        continue;
      EXPECT_TRUE(op.y == kDK || op.y == kDV) << op.name;
      ++n;
    }
    return n;
  };
  EXPECT_EQ(group_sums(g), 2);
  EXPECT_EQ(group_sums(attention_forward_graph(p)), 0);
  EXPECT_EQ(group_sums(attention_backward_graph({2, 8, 64, 4, DataType::BF16}, false)), 0);
  p.NKV = 3;
  EXPECT_NE(cudnn_attention_unsupported(p).find("must divide the query heads"), std::string::npos);
}

// A window of T keys or more is the causal mask alone: no second mask.
TEST(CudnnAttentionGraphChecks, AWindowAsLongAsTheSequenceAddsNoMask) {
  auto selects = [](const Graph& g) {
    int n = 0;
    for (const Op& op : g.ops) n += op.pointwise == PointwiseMode::BinarySelect;
    return n;
  };
  AttentionProblem p{1, 8, 16, 2, DataType::BF16, 91900};
  for (int64_t window : {0, 8, 20}) {
    p.window = window;
    EXPECT_EQ(selects(attention_forward_graph(p)), 1) << window;
    EXPECT_EQ(selects(attention_backward_graph(p, true)), 1) << window;
  }
  p.window = 7;
  EXPECT_EQ(selects(attention_forward_graph(p)), 2);
  EXPECT_EQ(selects(attention_backward_graph(p, false)), 2);
  p.window = -1;
  EXPECT_NE(cudnn_attention_unsupported(p).find("sliding window -1"), std::string::npos);
}

// The causal mask's fill follows cuDNN's own frontend: the lowest float
// before cuDNN 9.10, minus infinity from 9.10 on, in both directions.
TEST(CudnnAttentionGraphChecks, MaskFillFollowsTheCudnnVersion) {
  EXPECT_EQ(masked_score_fill(90900), std::numeric_limits<float>::lowest());
  EXPECT_EQ(masked_score_fill(91000), -std::numeric_limits<float>::infinity());
  for (int64_t version : {int64_t{90900}, int64_t{91000}}) {
    const AttentionProblem p{1, 8, 16, 2, DataType::BF16, version};
    for (const Graph& g : {attention_forward_graph(p), attention_backward_graph(p, true)}) {
      int fills = 0;
      for (const TensorDesc& t : g.tensors) {
        if (t.name != "mask_fill") continue;
        ++fills;
        EXPECT_TRUE(t.by_value);
        EXPECT_EQ(t.value, masked_score_fill(version));
      }
      EXPECT_EQ(fills, 1);
    }
  }
}

}  // namespace
}  // namespace triad::detail::cudnn_graph
