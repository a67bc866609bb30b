// cuDNN's fused attention through its backend (graph) API: each graph of
// cudnn_attention_graph.cpp becomes tensor and operation descriptors one to
// one, cuDNN's heuristics rank the engines that can run it, and the first
// that finalizes becomes the cached execution plan for that shape.
#include "cudnn_attention.h"

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "triad/core/error.h"

namespace triad::detail {
namespace g = cudnn_graph;

namespace {

[[noreturn]] void fail(cudnnStatus_t status, const std::string& what) {
  char detail[1024] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  throw Error("cudnn attention: " + what + ": " + cudnnGetErrorString(status) +
              (detail[0] ? std::string(" (") + detail + ")" : std::string()));
}

void check(cudnnStatus_t status, const std::string& what) {
  if (status != CUDNN_STATUS_SUCCESS) fail(status, what);
}

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    check(cudnnBackendCreateDescriptor(type, &d_), "create descriptor");
  }
  ~Descriptor() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  template <class T>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T& value,
           const std::string& what) {
    check(cudnnBackendSetAttribute(d_, name, type, 1, &value), what);
  }
  template <class T>
  void set_array(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                 const std::vector<T>& values, const std::string& what) {
    check(cudnnBackendSetAttribute(d_, name, type, static_cast<int64_t>(values.size()),
                                   values.data()),
          what);
  }
  void set_desc(cudnnBackendAttributeName_t name, const Descriptor& other,
                const std::string& what) {
    cudnnBackendDescriptor_t o = other.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, o, what);
  }
  cudnnStatus_t finalize() { return cudnnBackendFinalize(d_); }
  void finalize(const std::string& what) { check(finalize(), "finalize " + what); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};
using DescriptorPtr = std::unique_ptr<Descriptor>;

cudnnDataType_t data_type(g::DataType t) {
  switch (t) {
    case g::DataType::F32:
      return CUDNN_DATA_FLOAT;
    case g::DataType::BF16:
      return CUDNN_DATA_BFLOAT16;
    case g::DataType::F16:
      return CUDNN_DATA_HALF;
    case g::DataType::I32:
      return CUDNN_DATA_INT32;
    case g::DataType::Bool:
      return CUDNN_DATA_BOOLEAN;
  }
  return CUDNN_DATA_FLOAT;
}

cudnnPointwiseMode_t pointwise_mode(g::PointwiseMode m) {
  switch (m) {
    case g::PointwiseMode::Identity:
      return CUDNN_POINTWISE_IDENTITY;
    case g::PointwiseMode::Add:
      return CUDNN_POINTWISE_ADD;
    case g::PointwiseMode::Sub:
      return CUDNN_POINTWISE_SUB;
    case g::PointwiseMode::Mul:
      return CUDNN_POINTWISE_MUL;
    case g::PointwiseMode::Div:
      return CUDNN_POINTWISE_DIV;
    case g::PointwiseMode::Exp:
      return CUDNN_POINTWISE_EXP;
    case g::PointwiseMode::Log:
      return CUDNN_POINTWISE_LOG;
    case g::PointwiseMode::GenIndex:
      return CUDNN_POINTWISE_GEN_INDEX;
    case g::PointwiseMode::CmpGe:
      return CUDNN_POINTWISE_CMP_GE;
    case g::PointwiseMode::CmpGt:
      return CUDNN_POINTWISE_CMP_GT;
    case g::PointwiseMode::BinarySelect:
      return CUDNN_POINTWISE_BINARY_SELECT;
  }
  return CUDNN_POINTWISE_IDENTITY;
}

bool unary(g::PointwiseMode m) {
  return m == g::PointwiseMode::Identity || m == g::PointwiseMode::Exp ||
         m == g::PointwiseMode::Log || m == g::PointwiseMode::GenIndex;
}

// A finalized execution plan and everything it refers to.
struct Plan {
  g::Graph graph;
  std::vector<DescriptorPtr> keep;  // tensors, operation settings, operations
  DescriptorPtr op_graph, plan;
  int64_t engine_workspace = 0;
  std::vector<g::WorkspaceTensor> workspace_tensors;
  int64_t workspace_bytes = 0;  // engine workspace + workspace tensors, 256-byte aligned
  std::map<int64_t, float> scalars;
};

int64_t align_up(int64_t n) {
  return (n + 255) / 256 * 256;
}

int64_t workspace_bytes_of(const Plan& plan, int64_t uid) {
  for (const g::WorkspaceTensor& w : plan.workspace_tensors)
    if (w.uid == uid) return w.bytes;
  return 0;
}

DescriptorPtr make_tensor(const g::TensorDesc& t) {
  auto d = std::make_unique<Descriptor>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const std::string what = "tensor '" + t.name + "'";
  const cudnnDataType_t type = data_type(t.type);
  d->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, type, what);
  d->set_array(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64,
               std::vector<int64_t>(t.dims.begin(), t.dims.end()), what);
  d->set_array(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64,
               std::vector<int64_t>(t.strides.begin(), t.strides.end()), what);
  d->set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, t.uid, what);
  const int64_t alignment = 16;
  d->set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, alignment, what);
  const bool is_virtual = t.is_virtual, by_value = t.by_value;
  d->set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, is_virtual, what);
  if (by_value) d->set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, by_value, what);
  d->finalize(what);
  return d;
}

// The operation descriptor for `op`; its settings descriptor goes to `keep`.
DescriptorPtr make_operation(const g::Op& op, const std::map<int64_t, Descriptor*>& tensors,
                             std::vector<DescriptorPtr>& keep) {
  auto tensor = [&](int64_t uid) -> const Descriptor& { return *tensors.at(uid); };
  const std::string what = "operation '" + op.name + "'";
  switch (op.kind) {
    case g::OpKind::Matmul: {
      auto mm = std::make_unique<Descriptor>(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
      const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
      mm->set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, comp, what);
      mm->finalize(what);
      auto d = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
      d->set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, tensor(op.x), what);
      d->set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, tensor(op.b), what);
      d->set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, tensor(op.y), what);
      d->set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, *mm, what);
      d->finalize(what);
      keep.push_back(std::move(mm));
      return d;
    }
    case g::OpKind::Pointwise: {
      auto pw = std::make_unique<Descriptor>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
      const cudnnPointwiseMode_t mode = pointwise_mode(op.pointwise);
      const cudnnDataType_t prec = data_type(op.compute);
      pw->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode, what);
      pw->set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, prec, what);
      // (An index's axis; cuDNN's frontend also names one on the window's add.)
      if (op.pointwise == g::PointwiseMode::GenIndex || op.axis > 0)
        pw->set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, op.axis, what);
      pw->finalize(what);
      auto d = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
      d->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *pw, what);
      d->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, tensor(op.x), what);
      if (!unary(op.pointwise))
        d->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, tensor(op.b), what);
      if (op.pointwise == g::PointwiseMode::BinarySelect)
        d->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, tensor(op.t), what);
      d->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, tensor(op.y), what);
      d->finalize(what);
      keep.push_back(std::move(pw));
      return d;
    }
    case g::OpKind::Reduction: {
      auto red = std::make_unique<Descriptor>(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
      const cudnnReduceTensorOp_t mode =
          op.reduction == g::ReductionMode::Max ? CUDNN_REDUCE_TENSOR_MAX : CUDNN_REDUCE_TENSOR_ADD;
      const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
      red->set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, mode, what);
      red->set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, comp, what);
      red->finalize(what);
      auto d = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
      d->set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, tensor(op.x), what);
      d->set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, tensor(op.y), what);
      d->set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, *red, what);
      d->finalize(what);
      keep.push_back(std::move(red));
      return d;
    }
    case g::OpKind::Reshape: {
      auto d = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
      d->set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, tensor(op.x), what);
      d->set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, tensor(op.y), what);
      d->finalize(what);
      return d;
    }
  }
  throw Error("cudnn attention: unknown operation kind in '" + op.name + "'");
}

std::string describe(const g::AttentionProblem& p, bool backward) {
  return std::string(backward ? "backward" : "forward") + " B=" + std::to_string(p.B) +
         " T=" + std::to_string(p.T) + " C=" + std::to_string(p.C) + " NH=" + std::to_string(p.NH) +
         (p.kv_heads() != p.NH ? " NKV=" + std::to_string(p.kv_heads()) : std::string()) +
         (p.windowed() ? " window=" + std::to_string(p.window) : std::string()) +
         (p.io == g::DataType::BF16 ? " bf16" : " f16");
}

// Engine configurations cuDNN's heuristics rank for the graph, best first.
std::vector<DescriptorPtr> ranked_configs(const Descriptor& op_graph, cudnnBackendHeurMode_t mode) {
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, op_graph, "heuristics");
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, mode, "heuristics");
  if (heur.finalize() != CUDNN_STATUS_SUCCESS) return {};
  int64_t count = 0;
  check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
        "count heuristic results");
  std::vector<DescriptorPtr> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.push_back(std::make_unique<Descriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(configs.back()->get());
  }
  int64_t got = 0;
  if (count > 0)
    check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
          "read heuristic results");
  configs.resize(static_cast<size_t>(got));
  return configs;
}

std::unique_ptr<Plan> build_plan(cudnnHandle_t handle, const g::AttentionProblem& problem,
                                 bool backward, bool deterministic) {
  g::AttentionProblem p = problem;
  p.cudnn_version = static_cast<int64_t>(cudnnGetVersion());
  auto plan = std::make_unique<Plan>();
  plan->graph =
      backward ? g::attention_backward_graph(p, deterministic) : g::attention_forward_graph(p);
  std::map<int64_t, Descriptor*> tensors;
  for (const g::TensorDesc& t : plan->graph.tensors) {
    plan->keep.push_back(make_tensor(t));
    tensors[t.uid] = plan->keep.back().get();
    if (t.by_value) plan->scalars[t.uid] = t.value;
  }
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const g::Op& op : plan->graph.ops) {
    DescriptorPtr d = make_operation(op, tensors, plan->keep);
    ops.push_back(d->get());
    plan->keep.push_back(std::move(d));
  }
  plan->op_graph = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  plan->op_graph->set_array(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops,
                            "operation graph");
  plan->op_graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, handle,
                      "operation graph");
  plan->op_graph->finalize("operation graph (" + describe(p, backward) + ")");

  std::string tried;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (DescriptorPtr& config : ranked_configs(*plan->op_graph, mode)) {
      auto candidate = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      candidate->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, handle, "plan");
      candidate->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *config, "plan");
      const cudnnStatus_t st = candidate->finalize();
      if (st != CUDNN_STATUS_SUCCESS) {
        tried = cudnnGetErrorString(st);
        continue;
      }
      int64_t got = 0;
      check(cudnnBackendGetAttribute(candidate->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &got, &plan->engine_workspace),
            "plan workspace size");
      plan->plan = std::move(candidate);
      plan->keep.push_back(std::move(config));
      plan->workspace_tensors = g::workspace_tensors(plan->graph);
      plan->workspace_bytes = align_up(plan->engine_workspace);
      for (const g::WorkspaceTensor& w : plan->workspace_tensors)
        plan->workspace_bytes += align_up(w.bytes);
      return plan;
    }
  }
  char detail[1024] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  throw Error("cudnn attention: no cuDNN engine runs the " + describe(p, backward) +
              " graph (cuDNN " + std::to_string(cudnnGetVersion()) +
              (tried.empty() ? std::string(", heuristics returned none") : ", last: " + tried) +
              (detail[0] ? std::string("; ") + detail : std::string()) +
              "); choose model.attention_kernel: tensor_core or simt");
}

using PlanKey =
    std::tuple<int, bool, bool, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

// Handles and plans live for the process (like the backend's streams): never
// destroyed, so no static destructor races a late attention call.
struct Registry {
  std::mutex mutex;
  std::map<int, cudnnHandle_t> handles;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

// The handle of the current device (the caller made `device` current).
cudnnHandle_t handle_locked(Registry& r, int device) {
  auto it = r.handles.find(device);
  if (it != r.handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  check(cudnnCreate(&h), "cudnnCreate on device " + std::to_string(device));
  r.handles[device] = h;
  return h;
}

Plan& plan_for(int device, const g::AttentionProblem& p, bool backward, bool deterministic,
               cudnnHandle_t* handle) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  *handle = handle_locked(r, device);
  deterministic = deterministic || !backward;  // the forward has one graph
  const PlanKey key{device, backward, deterministic, static_cast<int>(p.io),     p.B, p.T,
                    p.C,    p.NH,     p.kv_heads(),  p.windowed() ? p.window : 0};
  auto it = r.plans.find(key);
  if (it == r.plans.end())
    it = r.plans.emplace(key, build_plan(*handle, p, backward, deterministic)).first;
  return *it->second;
}

void execute(int device, cudaStream_t stream, const g::AttentionProblem& p, bool backward,
             bool deterministic, const std::map<int64_t, const void*>& bound, void* workspace) {
  cudnnHandle_t handle = nullptr;
  Plan& plan = plan_for(device, p, backward, deterministic, &handle);
  std::vector<int64_t> uids;
  std::vector<void*> pointers;
  for (const g::TensorDesc& t : plan.graph.tensors) {
    if (t.is_virtual) continue;
    uids.push_back(t.uid);
    if (t.by_value) {
      pointers.push_back(&plan.scalars.at(t.uid));
      continue;
    }
    auto it = bound.find(t.uid);
    if (it == bound.end()) {
      // A workspace tensor: laid out after the engine's own workspace.
      int64_t at = align_up(plan.engine_workspace);
      bool found = false;
      for (const g::WorkspaceTensor& w : plan.workspace_tensors) {
        if (w.uid == t.uid) {
          found = true;
          break;
        }
        at += align_up(w.bytes);
      }
      if (!found) throw Error("cudnn attention: tensor '" + t.name + "' has no memory");
      pointers.push_back(static_cast<char*>(workspace) + at);
      // dQ is accumulated into its f32 tensor: it starts from zero.
      if (t.uid == g::kDQAccum) {
        const cudaError_t err = cudaMemsetAsync(
            pointers.back(), 0, static_cast<size_t>(workspace_bytes_of(plan, t.uid)), stream);
        if (err != cudaSuccess)
          throw Error(std::string("cudnn attention: clearing dQ's accumulator: ") +
                      cudaGetErrorString(err));
      }
      continue;
    }
    // Every bound tensor was declared 16-byte aligned.
    if (reinterpret_cast<uintptr_t>(it->second) % 16 != 0)
      throw ValueError("cudnn attention: tensor '" + t.name +
                       "' is not 16-byte aligned (a view into a larger buffer?); choose "
                       "model.attention_kernel: tensor_core or simt");
    pointers.push_back(const_cast<void*>(it->second));
  }
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set_array(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids, "variant pack");
  pack.set_array(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers,
                 "variant pack");
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, workspace, "variant pack");
  pack.finalize("variant pack");
  check(cudnnSetStream(handle, stream), "cudnnSetStream");
  check(cudnnBackendExecute(handle, plan.plan->get(), pack.get()),
        "execute " + describe(p, backward));
}

// Where a bound tensor starts inside its buffer; the graphs take bf16 or f16
// only, two bytes an element.
const void* at(const void* base, const g::AttentionProblem& p, int64_t uid) {
  return static_cast<const char*>(base) + g::element_offset(p, uid) * 2;
}

}  // namespace

bool cudnn_attention_compiled() {
  return true;
}

std::string cudnn_attention_unavailable(const g::AttentionProblem& p, int sm_major) {
  if (sm_major < 8)
    return "cuDNN fused attention needs compute capability 8.0 or newer, this device has " +
           std::to_string(sm_major) + ".x";
  if (cudnnGetVersion() < 90000)
    return "cuDNN fused attention needs cuDNN 9 or newer, the loaded library is " +
           std::to_string(cudnnGetVersion());
  const std::string why = g::cudnn_attention_unsupported(p);
  if (!why.empty()) return why;
  // Sliding windows (a left bound) from cuDNN 9.2 on, as PyTorch asks.
  if (p.windowed() && cudnnGetVersion() < 90200)
    return "cuDNN " + std::to_string(cudnnGetVersion()) +
           " has no sliding window (a left bound) before 9.2";
  // Before 9.16 cuDNN's backward needs a padding mask unless the sequence
  // is a multiple of 128 (what cuDNN's own frontend works around).
  if (cudnnGetVersion() < 91600 && p.T % 128 != 0)
    return "cuDNN " + std::to_string(cudnnGetVersion()) +
           " (before 9.16) runs fused attention for sequence lengths that are a multiple of "
           "128 only, not " +
           std::to_string(p.T);
  return "";
}

size_t cudnn_attention_workspace(int device, const g::AttentionProblem& p, bool backward,
                                 bool deterministic) {
  cudnnHandle_t handle = nullptr;
  return static_cast<size_t>(plan_for(device, p, backward, deterministic, &handle).workspace_bytes);
}

void cudnn_attention_forward(int device, cudaStream_t stream, const g::AttentionProblem& p,
                             const void* qkv, void* out, float* lse, void* workspace) {
  execute(device, stream, p, false, true,
          {{g::kQ, at(qkv, p, g::kQ)},
           {g::kK, at(qkv, p, g::kK)},
           {g::kV, at(qkv, p, g::kV)},
           {g::kO, out},
           {g::kStats, lse}},
          workspace);
}

void cudnn_attention_backward(int device, cudaStream_t stream, const g::AttentionProblem& p,
                              const void* qkv, const void* out, const float* lse, const void* dout,
                              void* dqkv, void* workspace, bool deterministic) {
  execute(device, stream, p, true, deterministic,
          {{g::kQ, at(qkv, p, g::kQ)},
           {g::kK, at(qkv, p, g::kK)},
           {g::kV, at(qkv, p, g::kV)},
           {g::kO, out},
           {g::kDO, dout},
           {g::kStats, lse},
           {g::kDQ, at(dqkv, p, g::kDQ)},
           {g::kDK, at(dqkv, p, g::kDK)},
           {g::kDV, at(dqkv, p, g::kDV)}},
          workspace);
}

}  // namespace triad::detail
