#pragma once

// The operation graphs behind cuDNN's fused causal attention, as plain data
// (host logic, compiled and unit-tested in every build). cuDNN's backend API
// recognises a flash-attention pattern of matmuls, pointwise operations and
// reductions and runs it as one fused kernel; this file says which
// operations, on which tensors, with which dimensions and strides.
// cudnn_attention.cpp turns a graph into backend descriptors one to one, and
// tests/backend/cudnn_attention_graph_test.cpp runs the same graphs through
// a small CPU interpreter against Triad's attention, so every stride,
// transpose, mask and scale is checked without a GPU.
//
// Layout: GPT's fused projection, qkv (B, T, W) holding q (NH heads of
// D = C / NH), then k and v (NKV heads each), W = C + 2 * NKV * D, seen as
// [B, heads, T, D] through strides (no copies); out and dout (B, T, C); lse
// (B, NH, T) f32, the log-sum-exp of each query's scaled scores (cuDNN's
// "stats"). Under grouped-query attention (NKV < NH) query head h reads
// key/value head h / (NH / NKV): cuDNN's matmuls broadcast a [B, NKV, ...]
// operand over the NH heads in groups of NH / NKV, and its reductions sum
// [B, NH, ...] into [B, NKV, ...] the same way, as its own frontend builds
// grouped-query attention.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace triad::detail::cudnn_graph {

enum class DataType : uint8_t { F32, BF16, F16, I32, Bool };

struct TensorDesc {
  int64_t uid = 0;
  std::string name;
  DataType type = DataType::F32;
  std::array<int64_t, 4> dims{};
  std::array<int64_t, 4> strides{};
  bool is_virtual = true;  // lives only inside the fused kernel
  bool by_value = false;   // a host scalar passed with the launch
  float value = 0;         // the scalar, when by_value
};

enum class OpKind : uint8_t { Matmul, Pointwise, Reduction, Reshape };
enum class PointwiseMode : uint8_t {
  Identity,
  Add,
  Sub,
  Mul,
  Div,
  Exp,
  Log,
  GenIndex,      // y = the index of each element along `axis` (x gives the shape)
  CmpGe,         // y = x >= b
  CmpGt,         // y = x > b
  BinarySelect,  // y = t ? x : b
};
enum class ReductionMode : uint8_t { Add, Max };

// One operation; tensors by uid (0 = unused). Matmul: y = x @ b batched
// over the first two dimensions. Reduction: y's dimensions of size 1 are
// reduced. Reshape: y views x's memory through y's own dims and strides.
struct Op {
  OpKind kind = OpKind::Pointwise;
  std::string name;
  PointwiseMode pointwise = PointwiseMode::Identity;
  ReductionMode reduction = ReductionMode::Add;
  DataType compute = DataType::F32;
  int64_t axis = 0;
  int64_t x = 0, b = 0, t = 0, y = 0;
};

struct Graph {
  std::vector<TensorDesc> tensors;
  std::vector<Op> ops;
  const TensorDesc& tensor(int64_t uid) const;  // std::out_of_range for an unknown uid
};

// The tensors a caller binds to memory (each graph uses a subset).
enum Uid : int64_t {
  kQ = 1,
  kK,  // K seen transposed, [B, NKV, D, T]
  kV,  // forward: [B, NKV, T, D]; backward: transposed, [B, NKV, D, T]
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSoftmaxSum,  // backward workspace: rowsum(dO * O), [B, NH, T, 1] f32
  kDQAccum,     // backward workspace (non-deterministic graph): dQ in f32
  kScale,       // by value: 1 / sqrt(D)
  kFirstInternal = 100,
};

struct AttentionProblem {
  int64_t B = 0, T = 0, C = 0, NH = 0;
  DataType io = DataType::BF16;  // q, k, v, o and their gradients
  // The loaded cuDNN's version (cudnnGetVersion()); it picks the causal
  // mask's fill value (masked_score_fill).
  int64_t cudnn_version = 0;
  // Key/value heads (grouped-query attention; 1: multi-query); 0: NH.
  int64_t NKV = 0;
  // A sliding window: the query at t sees keys t - window + 1 .. t (a
  // second mask after the causal one, cuDNN's frontend's left bound:
  // col + window > row); 0, or a window of T or more: the causal mask alone.
  int64_t window = 0;
  bool windowed() const { return window > 0 && window < T; }
  int64_t head_dim() const { return NH > 0 ? C / NH : 0; }
  int64_t kv_heads() const { return NKV > 0 ? NKV : NH; }
  int64_t qkv_width() const { return C + 2 * kv_heads() * head_dim(); }
};

// What the causal mask writes over scores above the diagonal: minus
// infinity from cuDNN 9.10 on, the lowest finite float before (what cuDNN's
// own frontend passes to each version). Either makes exp() exactly zero.
float masked_score_fill(int64_t cudnn_version);

// Why cuDNN's fused attention cannot take `p`, or "" when it can (bf16/f16,
// head dim a multiple of 8 up to 256, key/value heads dividing the query
// heads, a window >= 0; cudnn_attention.cpp adds what depends on the device
// and the library's version).
std::string cudnn_attention_unsupported(const AttentionProblem& p);

// Forward: O and Stats from Q, K, V.
Graph attention_forward_graph(const AttentionProblem& p);
// Backward: dQ, dK, dV from Q, K, V, O, dO and Stats. Deterministic graphs
// write dQ straight from the dS @ K matmul (cuDNN's dP-workspace engine);
// the others accumulate dQ in an f32 workspace tensor (kDQAccum). Under
// grouped-query attention dK and dV are each query head's (virtual,
// [B, NH, T, D]) summed over its group by a reduction.
Graph attention_backward_graph(const AttentionProblem& p, bool deterministic);

// Where a bound tensor starts, in elements, from the base of its buffer
// (qkv for kQ/kK/kV and their gradients, out/dout, lse, workspace).
int64_t element_offset(const AttentionProblem& p, int64_t uid);
// Workspace tensors the caller provides next to the engine's own workspace:
// bytes of each, in order (kSoftmaxSum, then kDQAccum when present).
struct WorkspaceTensor {
  int64_t uid;
  int64_t bytes;
};
std::vector<WorkspaceTensor> workspace_tensors(const Graph& g);

}  // namespace triad::detail::cudnn_graph
