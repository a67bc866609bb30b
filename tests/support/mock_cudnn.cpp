// See mock_cudnn.h. Implements the part of cuDNN's C backend API that
// Triad's fused attention calls, with the validation a caller would meet in
// the real library and a CPU interpreter for execution.
#include "support/mock_cudnn.h"

#include "support/cuda_sim/sim.h"

#include <cuda_fp16.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

struct cudnnContext {
  cudaStream_t stream = nullptr;
};

namespace triad::testing::mock_cudnn {
namespace {

struct Attr {
  cudnnBackendAttributeType_t type;
  int64_t count = 0;
  std::vector<uint8_t> bytes;
};

struct Desc {
  cudnnBackendDescriptorType_t type;
  bool finalized = false;
  std::map<cudnnBackendAttributeName_t, Attr> attrs;
  const Desc* graph = nullptr;  // engine configs and plans: their operation graph
};

struct State {
  std::set<Desc*> live;
  std::vector<Desc*> retired;
  Stats stats;
  bool no_engines = false;
  size_t version = 91900;
  std::string error;
};

// Never destroyed: a library's handles (static in the CUDA backend) may be
// released during static destruction, after this file's statics.
State& state() {
  static State* s = new State;
  return *s;
}

cudnnStatus_t reject(cudnnStatus_t status, const std::string& why) {
  state().error = why;
  return status;
}

size_t element_size(cudnnBackendAttributeType_t t) {
  switch (t) {
    case CUDNN_TYPE_HANDLE:
      return sizeof(cudnnHandle_t);
    case CUDNN_TYPE_DATA_TYPE:
      return sizeof(cudnnDataType_t);
    case CUDNN_TYPE_BOOLEAN:
      return sizeof(bool);
    case CUDNN_TYPE_INT64:
      return sizeof(int64_t);
    case CUDNN_TYPE_FLOAT:
      return sizeof(float);
    case CUDNN_TYPE_VOID_PTR:
      return sizeof(void*);
    case CUDNN_TYPE_HEUR_MODE:
      return sizeof(cudnnBackendHeurMode_t);
    case CUDNN_TYPE_POINTWISE_MODE:
      return sizeof(cudnnPointwiseMode_t);
    case CUDNN_TYPE_BACKEND_DESCRIPTOR:
      return sizeof(cudnnBackendDescriptor_t);
    case CUDNN_TYPE_REDUCTION_OPERATOR_TYPE:
      return sizeof(cudnnReduceTensorOp_t);
    default:
      return 0;
  }
}

// The type each attribute this mock knows takes; anything else is refused.
bool expected_type(cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t* t) {
  static const std::map<cudnnBackendAttributeName_t, cudnnBackendAttributeType_t> table = {
      {CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE},
      {CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64},
      {CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64},
      {CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64},
      {CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64},
      {CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN},
      {CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN},
      {CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE},
      {CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE},
      {CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64},
      {CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE},
      {CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE},
      {CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE},
      {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE},
      {CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE},
      {CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE},
      {CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR},
      {CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64},
      {CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64},
      {CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR},
      {CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR},
  };
  auto it = table.find(n);
  if (it == table.end()) return false;
  *t = it->second;
  return true;
}

template <class T>
std::vector<T> values(const Desc& d, cudnnBackendAttributeName_t n) {
  auto it = d.attrs.find(n);
  if (it == d.attrs.end()) return {};
  std::vector<T> out;
  for (int64_t i = 0; i < it->second.count; ++i) {
    T v;  // element by element: std::vector<bool> has no data()
    std::memcpy(&v, it->second.bytes.data() + static_cast<size_t>(i) * sizeof(T), sizeof(T));
    out.push_back(v);
  }
  return out;
}
template <class T>
T value(const Desc& d, cudnnBackendAttributeName_t n, T fallback) {
  auto v = values<T>(d, n);
  return v.empty() ? fallback : v[0];
}
bool has(const Desc& d, cudnnBackendAttributeName_t n) {
  return d.attrs.count(n) > 0;
}
const Desc* ref(const Desc& d, cudnnBackendAttributeName_t n) {
  return static_cast<const Desc*>(value<cudnnBackendDescriptor_t>(d, n, nullptr));
}

// A tensor descriptor, read back.
struct TensorInfo {
  int64_t uid = 0;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  std::vector<int64_t> dims, strides;
  bool is_virtual = false, by_value = false;
};
TensorInfo tensor_info(const Desc* d) {
  TensorInfo t;
  t.uid = value<int64_t>(*d, CUDNN_ATTR_TENSOR_UNIQUE_ID, 0);
  t.type = value<cudnnDataType_t>(*d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_DATA_FLOAT);
  t.dims = values<int64_t>(*d, CUDNN_ATTR_TENSOR_DIMENSIONS);
  t.strides = values<int64_t>(*d, CUDNN_ATTR_TENSOR_STRIDES);
  t.is_virtual = value<bool>(*d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, false);
  t.by_value = value<bool>(*d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, false);
  return t;
}

// Calls f(attribute, tensor) for every tensor an operation of `ops` names;
// stops at the first non-empty reason f returns, and returns it.
template <class F>
std::string each_tensor(const std::vector<cudnnBackendDescriptor_t>& ops, F&& f) {
  for (auto* op : ops) {
    const Desc* o = static_cast<const Desc*>(op);
    for (auto& [name, attr] : o->attrs) {
      if (attr.type != CUDNN_TYPE_BACKEND_DESCRIPTOR) continue;
      const Desc* t = ref(*o, name);
      if (t->type != CUDNN_BACKEND_TENSOR_DESCRIPTOR) continue;
      std::string why = f(name, tensor_info(t));
      if (!why.empty()) return why;
    }
  }
  return "";
}

bool broadcasts(const TensorInfo& x, const TensorInfo& y) {
  if (x.dims.size() != y.dims.size()) return false;
  for (size_t i = 0; i < x.dims.size(); ++i)
    if (x.dims[i] != y.dims[i] && x.dims[i] != 1) return false;
  return true;
}

// A matmul's batch dimension of size `small` read at index i of one of size
// `large`, or a reduction's output dimension `small` taking input index i:
// equal, 1 (broadcast, or all reduced), or a divisor, each element standing
// for a group of large / small consecutive ones (cuDNN's grouped-query
// attention: query head h reads key/value head h / (NH / NKV), and dK's
// reduction sums each group).
bool groups(int64_t small, int64_t large) {
  return small >= 1 && large % small == 0;
}
int64_t grouped_index(int64_t i, int64_t small, int64_t large) {
  return i / (large / small);
}

bool unary(cudnnPointwiseMode_t m) {
  return m == CUDNN_POINTWISE_IDENTITY || m == CUDNN_POINTWISE_EXP || m == CUDNN_POINTWISE_LOG ||
         m == CUDNN_POINTWISE_GEN_INDEX;
}

bool finalized_ref(const Desc& d, cudnnBackendAttributeName_t n, cudnnBackendDescriptorType_t t,
                   std::string* why) {
  const Desc* r = ref(d, n);
  if (!r || !state().live.count(const_cast<Desc*>(r)) || r->type != t || !r->finalized) {
    *why = "attribute " + std::to_string(n) + " is not a finalized descriptor of type " +
           std::to_string(t);
    return false;
  }
  return true;
}

// What finalizing `d` requires.
bool valid(const Desc& d, std::string* why) {
  switch (d.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
      const TensorInfo t = tensor_info(&d);
      if (!has(d, CUDNN_ATTR_TENSOR_UNIQUE_ID) || !has(d, CUDNN_ATTR_TENSOR_DATA_TYPE) ||
          !has(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT) || t.dims.empty() ||
          t.dims.size() != t.strides.size()) {
        *why =
            "tensor " + std::to_string(t.uid) + ": uid, type, alignment, dims and strides needed";
        return false;
      }
      if (t.is_virtual && t.by_value) {
        *why = "tensor " + std::to_string(t.uid) + " is both virtual and by value";
        return false;
      }
      for (size_t i = 0; i < t.dims.size(); ++i)
        if (t.dims[i] < 1 || t.strides[i] < 1) {
          *why = "tensor " + std::to_string(t.uid) + " has a dimension or stride below 1";
          return false;
        }
      return true;
    }
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
      if (!has(d, CUDNN_ATTR_POINTWISE_MODE) || !has(d, CUDNN_ATTR_POINTWISE_MATH_PREC)) {
        *why = "pointwise: mode and math precision needed";
        return false;
      }
      if (value<cudnnPointwiseMode_t>(d, CUDNN_ATTR_POINTWISE_MODE, CUDNN_POINTWISE_ADD) ==
              CUDNN_POINTWISE_GEN_INDEX &&
          !has(d, CUDNN_ATTR_POINTWISE_AXIS)) {
        *why = "pointwise GEN_INDEX needs an axis";
        return false;
      }
      return true;
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
      if (d.type == CUDNN_BACKEND_REDUCTION_DESCRIPTOR && !has(d, CUDNN_ATTR_REDUCTION_OPERATOR)) {
        *why = "reduction: operator needed";
        return false;
      }
      return true;
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
      if (!finalized_ref(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                         CUDNN_BACKEND_POINTWISE_DESCRIPTOR, why) ||
          !finalized_ref(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_BACKEND_TENSOR_DESCRIPTOR,
                         why) ||
          !finalized_ref(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_BACKEND_TENSOR_DESCRIPTOR,
                         why))
        return false;
      const auto mode =
          value<cudnnPointwiseMode_t>(*ref(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR),
                                      CUDNN_ATTR_POINTWISE_MODE, CUDNN_POINTWISE_ADD);
      const TensorInfo x = tensor_info(ref(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC));
      const TensorInfo y = tensor_info(ref(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC));
      if (!broadcasts(x, y)) {
        *why = "pointwise: x does not broadcast onto y";
        return false;
      }
      if (!unary(mode)) {
        if (!finalized_ref(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_BACKEND_TENSOR_DESCRIPTOR,
                           why))
          return false;
        if (!broadcasts(tensor_info(ref(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC)), y)) {
          *why = "pointwise: b does not broadcast onto y";
          return false;
        }
      } else if (has(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC)) {
        *why = "pointwise: a unary mode given a b tensor";
        return false;
      }
      if (mode == CUDNN_POINTWISE_BINARY_SELECT &&
          !finalized_ref(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_BACKEND_TENSOR_DESCRIPTOR,
                         why))
        return false;
      return true;
    }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
      if (!finalized_ref(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_BACKEND_REDUCTION_DESCRIPTOR,
                         why) ||
          !finalized_ref(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_BACKEND_TENSOR_DESCRIPTOR,
                         why) ||
          !finalized_ref(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_BACKEND_TENSOR_DESCRIPTOR,
                         why))
        return false;
      const TensorInfo x = tensor_info(ref(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC));
      const TensorInfo y = tensor_info(ref(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC));
      bool fits = x.dims.size() == y.dims.size();
      for (size_t i = 0; fits && i < x.dims.size(); ++i) fits = groups(y.dims[i], x.dims[i]);
      if (!fits) {
        *why = "reduction: y is not x with some dimensions reduced to 1 or to groups";
        return false;
      }
      return true;
    }
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
      for (auto n : {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                     CUDNN_ATTR_OPERATION_MATMUL_CDESC})
        if (!finalized_ref(d, n, CUDNN_BACKEND_TENSOR_DESCRIPTOR, why)) return false;
      if (!finalized_ref(d, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_BACKEND_MATMUL_DESCRIPTOR, why))
        return false;
      const TensorInfo a = tensor_info(ref(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC));
      const TensorInfo b = tensor_info(ref(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC));
      const TensorInfo c = tensor_info(ref(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC));
      if (a.dims.size() != 4 || b.dims.size() != 4 || c.dims.size() != 4 ||
          a.dims[3] != b.dims[2] || a.dims[2] != c.dims[2] || b.dims[3] != c.dims[3] ||
          a.dims[0] != c.dims[0] || b.dims[0] != c.dims[0] || !groups(a.dims[1], c.dims[1]) ||
          !groups(b.dims[1], c.dims[1])) {
        *why =
            "matmul: A [b, h, M, K], B [b, h, K, N] and C [b, h, M, N] do not fit (A's and B's "
            "h may divide C's)";
        return false;
      }
      return true;
    }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {
      if (!finalized_ref(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_BACKEND_TENSOR_DESCRIPTOR,
                         why) ||
          !finalized_ref(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_BACKEND_TENSOR_DESCRIPTOR,
                         why))
        return false;
      const TensorInfo x = tensor_info(ref(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC));
      const TensorInfo y = tensor_info(ref(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC));
      int64_t nx = 1, ny = 1;
      for (int64_t v : x.dims) nx *= v;
      for (int64_t v : y.dims) ny *= v;
      if (nx != ny || !y.is_virtual) {
        *why = "reshape: y must be virtual with x's element count";
        return false;
      }
      return true;
    }
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: {
      if (!has(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE) || !has(d, CUDNN_ATTR_OPERATIONGRAPH_OPS)) {
        *why = "operation graph: handle and operations needed";
        return false;
      }
      // One description per uid; every virtual tensor read is written first
      // (the operations are listed in an order that runs).
      std::map<int64_t, TensorInfo> seen;
      std::set<int64_t> written;
      for (auto* op : values<cudnnBackendDescriptor_t>(d, CUDNN_ATTR_OPERATIONGRAPH_OPS)) {
        const Desc* o = static_cast<const Desc*>(op);
        if (!state().live.count(const_cast<Desc*>(o)) || !o->finalized) {
          *why = "operation graph: an operation is not finalized";
          return false;
        }
        for (auto& [name, attr] : o->attrs) {
          if (attr.type != CUDNN_TYPE_BACKEND_DESCRIPTOR) continue;
          const Desc* t = ref(*o, name);
          if (t->type != CUDNN_BACKEND_TENSOR_DESCRIPTOR) continue;
          const TensorInfo info = tensor_info(t);
          auto [it, fresh] = seen.emplace(info.uid, info);
          if (!fresh &&
              (it->second.dims != info.dims || it->second.strides != info.strides ||
               it->second.type != info.type || it->second.is_virtual != info.is_virtual)) {
            *why = "operation graph: uid " + std::to_string(info.uid) + " described twice";
            return false;
          }
          const bool output = name == CUDNN_ATTR_OPERATION_POINTWISE_YDESC ||
                              name == CUDNN_ATTR_OPERATION_REDUCTION_YDESC ||
                              name == CUDNN_ATTR_OPERATION_MATMUL_CDESC ||
                              name == CUDNN_ATTR_OPERATION_RESHAPE_YDESC;
          if (output) {
            if (!written.insert(info.uid).second) {
              *why = "operation graph: uid " + std::to_string(info.uid) + " written twice";
              return false;
            }
          } else if (info.is_virtual && !written.count(info.uid)) {
            *why = "operation graph: virtual uid " + std::to_string(info.uid) +
                   " read before it is written";
            return false;
          }
        }
      }
      return true;
    }
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      return finalized_ref(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                           CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, why) &&
             has(d, CUDNN_ATTR_ENGINEHEUR_MODE);
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      return has(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE) &&
             finalized_ref(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                           CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, why);
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
      const auto uids = values<int64_t>(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
      if (uids.size() != values<void*>(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS).size()) {
        *why = "variant pack: as many pointers as uids needed";
        return false;
      }
      return true;
    }
    default:
      *why = "descriptor type " + std::to_string(d.type) + " is not known to the mock";
      return false;
  }
}

// ---- execution ------------------------------------------------------------

float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even (finite inputs)
  return static_cast<uint16_t>(bits >> 16);
}

// Where a tensor's elements live: bound memory in its declared type, or a
// float buffer for a virtual tensor (a reshape aliases its input's).
struct Memory {
  void* base = nullptr;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
};

class Run {
 public:
  Run(const std::map<int64_t, void*>& bound) : bound_(bound) {}

  bool op(const Desc& o, std::string* why) {
    switch (o.type) {
      case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {
        const TensorInfo x = tensor_info(ref(o, CUDNN_ATTR_OPERATION_RESHAPE_XDESC));
        const TensorInfo y = tensor_info(ref(o, CUDNN_ATTR_OPERATION_RESHAPE_YDESC));
        Memory m;
        if (!memory(x, &m, why)) return false;
        mem_[y.uid] = m;
        return true;
      }
      case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
        const TensorInfo a = tensor_info(ref(o, CUDNN_ATTR_OPERATION_MATMUL_ADESC));
        const TensorInfo b = tensor_info(ref(o, CUDNN_ATTR_OPERATION_MATMUL_BDESC));
        const TensorInfo c = tensor_info(ref(o, CUDNN_ATTR_OPERATION_MATMUL_CDESC));
        Memory ma, mb, mc;
        if (!memory(a, &ma, why) || !memory(b, &mb, why) || !memory(c, &mc, why)) return false;
        each(c, [&](const int64_t* i) {
          double acc = 0;
          const int64_t ha = grouped_index(i[1], a.dims[1], c.dims[1]),
                        hb = grouped_index(i[1], b.dims[1], c.dims[1]);
          for (int64_t k = 0; k < a.dims[3]; ++k) {
            const int64_t ai[4] = {i[0], ha, i[2], k}, bi[4] = {i[0], hb, k, i[3]};
            acc += static_cast<double>(load(a, ma, ai)) * load(b, mb, bi);
          }
          store(c, mc, i, static_cast<float>(acc));
        });
        return true;
      }
      case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
        const TensorInfo x = tensor_info(ref(o, CUDNN_ATTR_OPERATION_REDUCTION_XDESC));
        const TensorInfo y = tensor_info(ref(o, CUDNN_ATTR_OPERATION_REDUCTION_YDESC));
        const bool max =
            value<cudnnReduceTensorOp_t>(*ref(o, CUDNN_ATTR_OPERATION_REDUCTION_DESC),
                                         CUDNN_ATTR_REDUCTION_OPERATOR,
                                         CUDNN_REDUCE_TENSOR_ADD) == CUDNN_REDUCE_TENSOR_MAX;
        Memory mx, my;
        if (!memory(x, &mx, why) || !memory(y, &my, why)) return false;
        // By y's offset; an element no x element reduces into stays 0.
        std::vector<double> acc(static_cast<size_t>(extent(y)), 0.0);
        std::vector<char> seen(acc.size(), 0);
        each(x, [&](const int64_t* i) {
          int64_t yi[4];
          for (int d = 0; d < 4; ++d) yi[d] = grouped_index(i[d], y.dims[d], x.dims[d]);
          const auto at = static_cast<size_t>(offset(y, yi));
          const double v = load(x, mx, i);
          if (!seen[at]) {
            acc[at] = v;
            seen[at] = 1;
          } else {
            acc[at] = max ? std::max(acc[at], v) : acc[at] + v;
          }
        });
        each(y, [&](const int64_t* i) {
          store(y, my, i, static_cast<float>(acc[static_cast<size_t>(offset(y, i))]));
        });
        return true;
      }
      case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
        const Desc& pw = *ref(o, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
        const auto mode =
            value<cudnnPointwiseMode_t>(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_POINTWISE_ADD);
        const int64_t axis = value<int64_t>(pw, CUDNN_ATTR_POINTWISE_AXIS, 0);
        const TensorInfo x = tensor_info(ref(o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC));
        const TensorInfo y = tensor_info(ref(o, CUDNN_ATTR_OPERATION_POINTWISE_YDESC));
        TensorInfo b, t;
        Memory mx, my, mb, mt;
        if (!memory(x, &mx, why) || !memory(y, &my, why)) return false;
        if (has(o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC)) {
          b = tensor_info(ref(o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC));
          if (!memory(b, &mb, why)) return false;
        }
        if (has(o, CUDNN_ATTR_OPERATION_POINTWISE_TDESC)) {
          t = tensor_info(ref(o, CUDNN_ATTR_OPERATION_POINTWISE_TDESC));
          if (!memory(t, &mt, why)) return false;
        }
        bool ok = true;
        each(y, [&](const int64_t* i) {
          auto in = [&](const TensorInfo& info, const Memory& m) {
            int64_t j[4];
            for (int d = 0; d < 4; ++d) j[d] = info.dims[d] == 1 ? 0 : i[d];
            return load(info, m, j);
          };
          float v = 0;
          switch (mode) {
            case CUDNN_POINTWISE_GEN_INDEX:
              v = static_cast<float>(i[axis]);
              break;
            case CUDNN_POINTWISE_IDENTITY:
              v = in(x, mx);
              break;
            case CUDNN_POINTWISE_EXP:
              v = std::exp(in(x, mx));
              break;
            case CUDNN_POINTWISE_LOG:
              v = std::log(in(x, mx));
              break;
            case CUDNN_POINTWISE_ADD:
              v = in(x, mx) + in(b, mb);
              break;
            case CUDNN_POINTWISE_SUB:
              v = in(x, mx) - in(b, mb);
              break;
            case CUDNN_POINTWISE_MUL:
              v = in(x, mx) * in(b, mb);
              break;
            case CUDNN_POINTWISE_DIV:
              v = in(x, mx) / in(b, mb);
              break;
            case CUDNN_POINTWISE_CMP_GE:
              v = in(x, mx) >= in(b, mb) ? 1.f : 0.f;
              break;
            case CUDNN_POINTWISE_CMP_GT:
              v = in(x, mx) > in(b, mb) ? 1.f : 0.f;
              break;
            case CUDNN_POINTWISE_BINARY_SELECT:
              v = in(t, mt) != 0 ? in(x, mx) : in(b, mb);
              state().stats.select_fill = in(b, mb);
              break;
            default:
              ok = false;
          }
          store(y, my, i, v);
        });
        if (!ok) *why = "pointwise mode " + std::to_string(mode) + " is not known to the mock";
        return ok;
      }
      default:
        *why = "operation type " + std::to_string(o.type) + " is not known to the mock";
        return false;
    }
  }

 private:
  // Elements from the first to one past the last a 4-d tensor reaches.
  static int64_t extent(const TensorInfo& t) {
    int64_t e = 1;
    for (int d = 0; d < 4; ++d) e += (t.dims[d] - 1) * t.strides[d];
    return e;
  }
  static int64_t offset(const TensorInfo& t, const int64_t* i) {
    int64_t o = 0;
    for (int d = 0; d < 4; ++d) o += i[d] * t.strides[d];
    return o;
  }
  template <class F>
  static void each(const TensorInfo& t, F&& f) {
    int64_t i[4];
    for (i[0] = 0; i[0] < t.dims[0]; ++i[0])
      for (i[1] = 0; i[1] < t.dims[1]; ++i[1])
        for (i[2] = 0; i[2] < t.dims[2]; ++i[2])
          for (i[3] = 0; i[3] < t.dims[3]; ++i[3]) f(i);
  }
  bool memory(const TensorInfo& t, Memory* m, std::string* why) {
    if (t.dims.size() != 4) {
      *why = "the mock runs 4-d tensors only";
      return false;
    }
    auto it = mem_.find(t.uid);
    if (it != mem_.end()) {
      *m = it->second;
      return true;
    }
    if (!t.is_virtual) {
      auto b = bound_.find(t.uid);
      if (b == bound_.end()) {
        *why = "tensor " + std::to_string(t.uid) + " is not in the variant pack";
        return false;
      }
      if (t.type != CUDNN_DATA_FLOAT && t.type != CUDNN_DATA_BFLOAT16 &&
          t.type != CUDNN_DATA_HALF) {
        *why = "the mock binds f32, bf16 and f16 memory only";
        return false;
      }
      *m = mem_[t.uid] = Memory{b->second, t.type};
      return true;
    }
    store_.push_back(
        std::make_unique<std::vector<float>>(static_cast<size_t>(extent(t)), std::nanf("")));
    *m = mem_[t.uid] = Memory{store_.back()->data(), CUDNN_DATA_FLOAT};
    return true;
  }
  static float load(const TensorInfo& t, const Memory& m, const int64_t* i) {
    const int64_t o = offset(t, i);
    if (m.type == CUDNN_DATA_BFLOAT16)
      return bf16_to_float(static_cast<const uint16_t*>(m.base)[o]);
    if (m.type == CUDNN_DATA_HALF) return __half2float(static_cast<const __half*>(m.base)[o]);
    return static_cast<const float*>(m.base)[o];
  }
  static void store(const TensorInfo& t, const Memory& m, const int64_t* i, float v) {
    const int64_t o = offset(t, i);
    if (m.type == CUDNN_DATA_BFLOAT16)
      static_cast<uint16_t*>(m.base)[o] = float_to_bf16(v);
    else if (m.type == CUDNN_DATA_HALF)
      static_cast<__half*>(m.base)[o] = __float2half_rn(v);
    else
      static_cast<float*>(m.base)[o] = v;
  }

  const std::map<int64_t, void*>& bound_;
  std::map<int64_t, Memory> mem_;
  std::vector<std::unique_ptr<std::vector<float>>> store_;
};

Desc* live(cudnnBackendDescriptor_t d) {
  Desc* p = static_cast<Desc*>(d);
  return state().live.count(p) ? p : nullptr;
}

}  // namespace

Stats stats() {
  Stats s = state().stats;
  s.live_descriptors = static_cast<int64_t>(state().live.size());
  return s;
}
void reset() {
  state().stats = Stats{};
  state().no_engines = false;
  state().version = 91900;
  state().error.clear();
}
void set_version(size_t version) {
  state().version = version;
}
void set_no_engines(bool none) {
  state().no_engines = none;
}
std::string last_error() {
  return state().error;
}

}  // namespace triad::testing::mock_cudnn

namespace mock = triad::testing::mock_cudnn;

size_t cudnnGetVersion(void) {
  return mock::state().version;
}

const char* cudnnGetErrorString(cudnnStatus_t status) {
  return status == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS" : "CUDNN_STATUS_(mock error)";
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (!message || max_size == 0) return;
  std::snprintf(message, max_size, "%s", mock::state().error.c_str());
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  *handle = new cudnnContext();
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (!handle) return mock::reject(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: null handle");
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t* descriptor) {
  auto* d = new mock::Desc{type, false, {}, nullptr};
  mock::state().live.insert(d);
  *descriptor = d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  mock::Desc* d = mock::live(descriptor);
  if (!d) return mock::reject(CUDNN_STATUS_BAD_PARAM, "destroy: not a live descriptor");
  mock::state().live.erase(d);
  // Not freed: work already queued on a stream may still read it (cuDNN
  // takes what it needs when a plan is executed), and its address is never
  // handed out again, so a stale handle stays detectable.
  mock::state().retired.push_back(d);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count,
                                       const void* elements) {
  mock::Desc* d = mock::live(descriptor);
  if (!d) return mock::reject(CUDNN_STATUS_BAD_PARAM, "set: not a live descriptor");
  if (d->finalized)
    return mock::reject(CUDNN_STATUS_NOT_INITIALIZED,
                        "set attribute " + std::to_string(name) + " on a finalized descriptor");
  cudnnBackendAttributeType_t want;
  if (!mock::expected_type(name, &want))
    return mock::reject(CUDNN_STATUS_NOT_SUPPORTED,
                        "attribute " + std::to_string(name) + " is not known to the mock");
  if (type != want || count < 1 || !elements)
    return mock::reject(CUDNN_STATUS_BAD_PARAM, "attribute " + std::to_string(name) +
                                                    " set with type " + std::to_string(type) +
                                                    " (wants " + std::to_string(want) +
                                                    ") or no elements");
  mock::Attr a{type, count, {}};
  const size_t bytes = mock::element_size(type) * static_cast<size_t>(count);
  a.bytes.resize(bytes);
  std::memcpy(a.bytes.data(), elements, bytes);
  d->attrs[name] = std::move(a);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  mock::Desc* d = mock::live(descriptor);
  if (!d) return mock::reject(CUDNN_STATUS_BAD_PARAM, "finalize: not a live descriptor");
  std::string why;
  if (!mock::valid(*d, &why)) return mock::reject(CUDNN_STATUS_BAD_PARAM, why);
  if (d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) {
    d->graph = mock::ref(*d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG)->graph;
    ++mock::state().stats.plans_finalized;
  }
  if (d->type == CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR) ++mock::state().stats.graphs_finalized;
  d->finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested,
                                       int64_t* count, void* elements) {
  mock::Desc* d = mock::live(descriptor);
  if (!d || !d->finalized)
    return mock::reject(CUDNN_STATUS_BAD_PARAM, "get: not a live, finalized descriptor");
  if (name == CUDNN_ATTR_ENGINEHEUR_RESULTS && type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
    const int64_t available = mock::state().no_engines ? 0 : 1;
    if (count) *count = std::min(available, std::max<int64_t>(requested, 0));
    if (requested == 0) {
      if (count) *count = available;
      return CUDNN_STATUS_SUCCESS;
    }
    auto** out = static_cast<cudnnBackendDescriptor_t*>(elements);
    for (int64_t i = 0; i < std::min(available, requested); ++i) {
      mock::Desc* cfg = mock::live(out[i]);
      if (!cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
        return mock::reject(CUDNN_STATUS_BAD_PARAM, "heuristic results need engine configs");
      cfg->graph = mock::ref(*d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
      cfg->finalized = true;
    }
    return CUDNN_STATUS_SUCCESS;
  }
  if (name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE && type == CUDNN_TYPE_INT64 &&
      d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && requested >= 1 && elements) {
    *static_cast<int64_t*>(elements) = mock::kEngineWorkspace;
    if (count) *count = 1;
    return CUDNN_STATUS_SUCCESS;
  }
  return mock::reject(CUDNN_STATUS_NOT_SUPPORTED,
                      "get attribute " + std::to_string(name) + " is not known to the mock");
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan_desc,
                                  cudnnBackendDescriptor_t pack_desc) {
  mock::Desc* plan = mock::live(plan_desc);
  mock::Desc* pack = mock::live(pack_desc);
  if (!handle || !plan || !pack || !plan->finalized || !pack->finalized ||
      plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !plan->graph ||
      !mock::live(const_cast<mock::Desc*>(plan->graph)))
    return mock::reject(CUDNN_STATUS_BAD_PARAM, "execute: plan or variant pack not ready");
  const auto uids = mock::values<int64_t>(*pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
  const auto ptrs = mock::values<void*>(*pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
  auto* ws =
      static_cast<char*>(mock::value<void*>(*pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, nullptr));
  if (!ws) return mock::reject(CUDNN_STATUS_BAD_PARAM, "execute: no workspace");
  std::map<int64_t, void*> bound;
  for (size_t i = 0; i < uids.size(); ++i) {
    if (!bound.emplace(uids[i], ptrs[i]).second)
      return mock::reject(CUDNN_STATUS_BAD_PARAM, "variant pack: uid listed twice");
    // No bound tensor may sit in the engine's own workspace.
    auto* p = static_cast<char*>(ptrs[i]);
    if (p >= ws && p < ws + mock::kEngineWorkspace)
      return mock::reject(CUDNN_STATUS_BAD_PARAM, "variant pack: uid " + std::to_string(uids[i]) +
                                                      " lies inside the engine's workspace");
  }
  // Every non-virtual tensor bound (by-value ones to a host scalar), no
  // virtual one, no stranger.
  std::set<int64_t> needed;
  const auto ops =
      mock::values<cudnnBackendDescriptor_t>(*plan->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS);
  std::string why = mock::each_tensor(ops, [&](auto, const mock::TensorInfo& info) {
    if (info.is_virtual)
      return bound.count(info.uid) ? "variant pack binds virtual uid " + std::to_string(info.uid)
                                   : std::string();
    needed.insert(info.uid);
    return !bound.count(info.uid) || !bound[info.uid]
               ? "variant pack lacks uid " + std::to_string(info.uid)
               : std::string();
  });
  if (!why.empty()) return mock::reject(CUDNN_STATUS_BAD_PARAM, why);
  for (auto& [uid, p] : bound)
    if (!needed.count(uid))
      return mock::reject(CUDNN_STATUS_BAD_PARAM,
                          "variant pack binds uid " + std::to_string(uid) + " the graph lacks");
  // No tensor an operation writes may share memory with another bound one
  // (element by element: q, k and v interleave inside one buffer).
  {
    // Each tensor's bytes as sorted, merged [begin, end) spans.
    using Spans = std::vector<std::pair<uintptr_t, uintptr_t>>;
    std::map<int64_t, Spans> bytes;
    std::set<int64_t> written;
    mock::each_tensor(ops, [&](cudnnBackendAttributeName_t name, const mock::TensorInfo& info) {
      if (info.is_virtual || info.by_value || bytes.count(info.uid)) return std::string();
      if (name == CUDNN_ATTR_OPERATION_POINTWISE_YDESC ||
          name == CUDNN_ATTR_OPERATION_REDUCTION_YDESC || name == CUDNN_ATTR_OPERATION_MATMUL_CDESC)
        written.insert(info.uid);
      const size_t elem = info.type == CUDNN_DATA_FLOAT ? 4 : 2;
      Spans all;
      std::vector<int64_t> i(info.dims.size(), 0);
      const auto base = reinterpret_cast<uintptr_t>(bound[info.uid]);
      for (bool more = true; more;) {
        int64_t off = 0;
        for (size_t d = 0; d < i.size(); ++d) off += i[d] * info.strides[d];
        const uintptr_t at = base + static_cast<uintptr_t>(off) * elem;
        all.emplace_back(at, at + elem);
        more = false;
        for (size_t d = i.size(); d-- > 0;) {
          if (++i[d] < info.dims[d]) {
            more = true;
            break;
          }
          i[d] = 0;
        }
      }
      std::sort(all.begin(), all.end());
      Spans& merged = bytes[info.uid];
      for (const auto& span : all) {
        if (!merged.empty() && span.first <= merged.back().second)
          merged.back().second = std::max(merged.back().second, span.second);
        else
          merged.push_back(span);
      }
      return std::string();
    });
    const auto overlap = [](const Spans& a, const Spans& b) {
      for (size_t x = 0, y = 0; x < a.size() && y < b.size();) {
        if (a[x].first < b[y].second && b[y].first < a[x].second) return true;
        if (a[x].second <= b[y].second)
          ++x;
        else
          ++y;
      }
      return false;
    };
    for (int64_t w : written)
      for (auto& [uid, spans] : bytes) {
        if (uid != w && overlap(bytes[w], spans))
          return mock::reject(CUDNN_STATUS_BAD_PARAM, "uid " + std::to_string(w) +
                                                          " is written over uid " +
                                                          std::to_string(uid) + "'s memory");
      }
  }
  // The graph runs when the handle's stream does (descriptors destroyed in
  // the meantime are kept until then: see cudnnBackendDestroyDescriptor).
  ++mock::state().stats.executions;
  triad_sim::enqueue(handle->stream, [bound, ops] {
    mock::Run run(bound);
    std::string failed;
    for (auto* op : ops)
      if (!run.op(*static_cast<const mock::Desc*>(op), &failed))
        throw std::runtime_error("mock cuDNN: an execution failed on the stream: " + failed);
  });
  return CUDNN_STATUS_SUCCESS;
}
