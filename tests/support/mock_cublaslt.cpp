// A CPU stand-in for the part of cuBLASLt that src/backend/cuda/
// cublaslt_gemm.cpp uses (the CUDA runtime calls come from tests/support/
// cuda_sim), for testing that layer
// without a GPU: it checks what the real library checks about a call (each
// operand's rows, columns and leading dimension against the operation and
// m, n, k; batch counts; the epilogue's pointers and aux leading dimension)
// and computes D = alpha op(A) op(B) + beta C (+ bias, GELU with its input
// kept) in column-major order on host memory (f32, f64, bf16, f16, and
// bf16/f16 inputs into an f32 output).
#include "support/mock_cublaslt.h"

#include "support/cuda_sim/sim.h"

#include <cblas.h>
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

struct cublasLtContext {};

namespace triad::testing::mock_cublaslt {
namespace {

struct Layout {
  cudaDataType type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;
};
struct MatmulDesc {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t aux_ld = 0;
  int32_t bias_type = -1;  // CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE (-1: D's)
};

struct State {
  std::map<const void*, Layout> layouts;
  std::map<const void*, MatmulDesc> descs;
  std::map<const void*, uint32_t> reduction_masks;  // per preference
  bool no_algorithms = false;
  bool no_bias_grad_algorithms = false;
  bool no_f32_bias_grad_algorithms = false;
  bool checks_fail = false;
  double output_factor = 1;
  std::vector<double> algorithm_delays_ms{0.0};
  Counters counters;
  std::string error;
};
// Never destroyed: a library's handles (static in the CUDA backend) may be
// released during static destruction, after this file's statics.
State& state() {
  static State* s = new State;
  return *s;
}

// Whether the switches leave no algorithm for this description (and its
// output D): the heuristic offers none, and the check accepts none.
bool none_for(const MatmulDesc& md, const Layout& d) {
  const State& s = state();
  return s.no_algorithms ||
         (s.no_bias_grad_algorithms && (md.epilogue == CUBLASLT_EPILOGUE_BGRADB ||
                                        md.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD)) ||
         (s.no_f32_bias_grad_algorithms && md.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD &&
          md.bias_type == CUDA_R_32F && d.type != CUDA_R_32F);
}

cublasStatus_t reject(cublasStatus_t st, const std::string& why) {
  state().error = why;
  return st;
}

double load(cudaDataType t, const void* p, int64_t i) {
  switch (t) {
    case CUDA_R_64F:
      return static_cast<const double*>(p)[i];
    case CUDA_R_16BF: {
      const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case CUDA_R_16F:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}
void store(cudaDataType t, void* p, int64_t i, double v) {
  switch (t) {
    case CUDA_R_64F:
      static_cast<double*>(p)[i] = v;
      return;
    case CUDA_R_16BF: {
      const float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      bits += 0x7fff + ((bits >> 16) & 1);
      static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(bits >> 16);
      return;
    }
    case CUDA_R_16F:
      static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v));
      return;
    default:
      static_cast<float*>(p)[i] = static_cast<float>(v);
  }
}

bool supported(cudaDataType t) {
  return t == CUDA_R_32F || t == CUDA_R_64F || t == CUDA_R_16BF || t == CUDA_R_16F;
}

// Checks a call's operands fit; *m, *n, *k from D and op(A).
bool fits(const MatmulDesc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dd,
          int64_t* m, int64_t* n, int64_t* k, std::string* why) {
  *m = static_cast<int64_t>(dd.rows), *n = static_cast<int64_t>(dd.cols);
  const int64_t am = static_cast<int64_t>(d.transa == CUBLAS_OP_N ? a.rows : a.cols);
  *k = static_cast<int64_t>(d.transa == CUBLAS_OP_N ? a.cols : a.rows);
  const int64_t bk = static_cast<int64_t>(d.transb == CUBLAS_OP_N ? b.rows : b.cols);
  const int64_t bn = static_cast<int64_t>(d.transb == CUBLAS_OP_N ? b.cols : b.rows);
  if (am != *m || bk != *k || bn != *n || c.rows != dd.rows || c.cols != dd.cols) {
    *why = "operands do not fit: op(A) " + std::to_string(am) + "x" + std::to_string(*k) +
           ", op(B) " + std::to_string(bk) + "x" + std::to_string(bn) + ", D " +
           std::to_string(*m) + "x" + std::to_string(*n);
    return false;
  }
  for (const Layout* l : {&a, &b, &c, &dd})
    if (l->ld < static_cast<int64_t>(l->rows) || !supported(l->type)) {
      *why = "a layout's leading dimension is below its rows, or its type is not supported";
      return false;
    }
  // One type throughout, or (cuBLASLt's mixed-precision row) bf16/f16 A and
  // B into f32 C and D under f32 compute, without an epilogue or with a
  // bias gradient's (BGRADB; its sums in D's type).
  const bool half_in = a.type == CUDA_R_16BF || a.type == CUDA_R_16F;
  const bool mixed = a.type != dd.type;
  if (a.type != b.type || c.type != dd.type ||
      (mixed &&
       (!half_in || dd.type != CUDA_R_32F || d.compute != CUBLAS_COMPUTE_32F ||
        (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT && d.epilogue != CUBLASLT_EPILOGUE_BGRADB)))) {
    *why = "operand types " + std::to_string(a.type) + ", " + std::to_string(b.type) + " -> " +
           std::to_string(c.type) + ", " + std::to_string(dd.type) +
           " are not a combination cuBLASLt takes";
    return false;
  }
  if (a.batch != dd.batch || b.batch != dd.batch || c.batch != dd.batch) {
    *why = "batch counts differ";
    return false;
  }
  if (d.bias_type != -1 && d.bias_type != static_cast<int32_t>(dd.type) &&
      d.bias_type != CUDA_R_32F) {
    *why = "bias type " + std::to_string(d.bias_type) + " (the mock takes D's, or f32)";
    return false;
  }
  if (d.epilogue == CUBLASLT_EPILOGUE_BGRADB || d.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
    if (!d.bias || dd.batch != 1) {
      *why = "a bias-gradient epilogue needs a bias pointer (and, in the mock, one batch)";
      return false;
    }
    if (d.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD &&
        (!d.aux || d.aux_ld < *m || d.aux_ld % 8 != 0)) {
      *why = "GELU aux needs a pointer and a leading dimension >= rows, divisible by 8";
      return false;
    }
  } else if (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    if (d.epilogue != CUBLASLT_EPILOGUE_BIAS && d.epilogue != CUBLASLT_EPILOGUE_GELU_AUX_BIAS &&
        d.epilogue != CUBLASLT_EPILOGUE_GELU_AUX && d.epilogue != CUBLASLT_EPILOGUE_DGELU) {
      *why = "epilogue " + std::to_string(d.epilogue) + " is not known to the mock";
      return false;
    }
    if (!d.bias && d.epilogue != CUBLASLT_EPILOGUE_DGELU &&
        d.epilogue != CUBLASLT_EPILOGUE_GELU_AUX) {
      *why = "a bias epilogue without a bias pointer";
      return false;
    }
    if (d.epilogue != CUBLASLT_EPILOGUE_BIAS && (!d.aux || d.aux_ld < *m || d.aux_ld % 8 != 0)) {
      *why = "GELU aux needs a pointer and a leading dimension >= rows, divisible by 8";
      return false;
    }
  }
  return true;
}

}  // namespace

Counters counters() {
  return state().counters;
}
void reset() {
  state().counters = Counters{};
  state().no_algorithms = false;
  state().no_bias_grad_algorithms = false;
  state().no_f32_bias_grad_algorithms = false;
  state().checks_fail = false;
  state().output_factor = 1;
  state().algorithm_delays_ms = {0.0};
  state().error.clear();
}
void set_algorithms(const std::vector<double>& delays_ms) {
  state().algorithm_delays_ms = delays_ms;
}
void set_no_algorithms(bool none) {
  state().no_algorithms = none;
}
void set_no_bias_grad_algorithms(bool none) {
  state().no_bias_grad_algorithms = none;
}
void set_no_f32_bias_grad_algorithms(bool none) {
  state().no_f32_bias_grad_algorithms = none;
}
void set_algorithm_checks_fail(bool fail) {
  state().checks_fail = fail;
}
void set_output_factor(double factor) {
  state().output_factor = factor;
}
std::string last_error() {
  return state().error;
}

}  // namespace triad::testing::mock_cublaslt

namespace mock = triad::testing::mock_cublaslt;

// ---- cuBLASLt -------------------------------------------------------------------

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = new cublasLtContext();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
// The stand-in follows the headers it is built with.
size_t cublasLtGetVersion() {
  return CUBLAS_VERSION;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = new cublasLtMatrixLayoutOpaque_t();
  mock::state().layouts[*layout] = mock::Layout{type, rows, cols, ld, 1, 0};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  if (!mock::state().layouts.erase(layout))
    return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "destroying an unknown layout");
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  auto it = mock::state().layouts.find(layout);
  if (it == mock::state().layouts.end())
    return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "unknown layout");
  if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && size == sizeof(int32_t)) {
    std::memcpy(&it->second.batch, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && size == sizeof(int64_t)) {
    std::memcpy(&it->second.stride, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "layout attribute " + std::to_string(attr) +
                                                       " with " + std::to_string(size) + " bytes");
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  *desc = new cublasLtMatmulDescOpaque_t();
  mock::MatmulDesc d;
  d.compute = compute, d.scale = scale;
  mock::state().descs[*desc] = d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  if (!mock::state().descs.erase(desc))
    return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "destroying an unknown matmul desc");
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  auto it = mock::state().descs.find(desc);
  if (it == mock::state().descs.end())
    return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "unknown matmul desc");
  mock::MatmulDesc& d = it->second;
  auto take = [&](auto* field) {
    if (size != sizeof(*field)) return false;
    std::memcpy(field, buf, size);
    return true;
  };
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      ok = take(&d.transa);
      break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      ok = take(&d.transb);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      ok = take(&d.epilogue);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      ok = take(&d.bias);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      ok = take(&d.aux);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      ok = take(&d.aux_ld);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      ok = take(&d.bias_type);
      break;
    default:
      break;
  }
  if (!ok)
    return mock::reject(
        CUBLAS_STATUS_INVALID_VALUE,
        "matmul attribute " + std::to_string(attr) + " with " + std::to_string(size) + " bytes");
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque_t();
  mock::state().reduction_masks[*pref] = CUBLASLT_REDUCTION_SCHEME_MASK;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  mock::state().reduction_masks.erase(pref);
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (!buf || size == 0) return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "empty preference value");
  if (attr == CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK) {
    uint32_t mask = 0;
    if (size != sizeof(mask) || !mock::state().reduction_masks.count(pref))
      return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "reduction scheme mask");
    std::memcpy(&mask, buf, size);
    mock::state().reduction_masks[pref] = mask;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* found) {
  auto& s = mock::state();
  ++s.counters.heuristic_queries;
  auto mask = s.reduction_masks.find(pref);
  if (mask == s.reduction_masks.end())
    return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "heuristic: unknown preference");
  if ((mask->second &
       (CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)) == 0)
    ++s.counters.compute_type_reduction_queries;
  *found = 0;
  if (!s.descs.count(desc) || !s.layouts.count(a) || !s.layouts.count(b) || !s.layouts.count(c) ||
      !s.layouts.count(d) || requested < 1)
    return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "heuristic: unknown descriptor");
  int64_t m, n, k;
  std::string why;
  if (!mock::fits(s.descs[desc], s.layouts[a], s.layouts[b], s.layouts[c], s.layouts[d], &m, &n, &k,
                  &why))
    return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "heuristic: " + why);
  if (mock::none_for(s.descs[desc], s.layouts[d])) return CUBLAS_STATUS_NOT_SUPPORTED;
  s.counters.last_requested = requested;
  const int offered = static_cast<int>(s.algorithm_delays_ms.size());
  if (offered == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  *found = std::min(requested, offered);
  for (int i = 0; i < *found; ++i) {
    results[i] = cublasLtMatmulHeuristicResult_t{};
    results[i].algo.data[0] = static_cast<uint64_t>(i);
    results[i].state = CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                       cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                       const cublasLtMatmulAlgo_t* algo,
                                       cublasLtMatmulHeuristicResult_t* result) {
  auto& s = mock::state();
  ++s.counters.algorithm_checks;
  if (!s.descs.count(desc) || !s.layouts.count(a) || !s.layouts.count(b) || !s.layouts.count(c) ||
      !s.layouts.count(d) || !algo || !result)
    return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "algorithm check: unknown descriptor");
  int64_t m, n, k;
  std::string why;
  if (!mock::fits(s.descs[desc], s.layouts[a], s.layouts[b], s.layouts[c], s.layouts[d], &m, &n, &k,
                  &why))
    return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "algorithm check: " + why);
  // (As cuBLASLt answers for a configuration the problem does not allow.)
  if (s.checks_fail || algo->data[0] >= s.algorithm_delays_ms.size() ||
      mock::none_for(s.descs[desc], s.layouts[d]))
    return CUBLAS_STATUS_INVALID_VALUE;
  *result = cublasLtMatmulHeuristicResult_t{};
  result->algo = *algo;
  result->state = CUBLAS_STATUS_SUCCESS;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t ws_bytes,
                              cudaStream_t stream) {
  auto& s = mock::state();
  if (!h || !algo || !s.descs.count(desc) || !s.layouts.count(a) || !s.layouts.count(b) ||
      !s.layouts.count(c) || !s.layouts.count(d) || (ws_bytes > 0 && !workspace))
    return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "matmul: unknown descriptor or no workspace");
  // Everything the product needs is taken now (descriptors may be destroyed
  // once the call returns); it runs when its stream does.
  const mock::MatmulDesc md = s.descs[desc];
  const mock::Layout la = s.layouts[a], lb = s.layouts[b], lc = s.layouts[c], ld = s.layouts[d];
  int64_t m, n, k;
  std::string why;
  if (!mock::fits(md, la, lb, lc, ld, &m, &n, &k, &why))
    return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "matmul: " + why);
  const bool f64 = md.scale == CUDA_R_64F;
  const double al = f64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double be = f64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  const cudaDataType t = ld.type, ta = la.type, tb = lb.type;
  ++s.counters.matmuls;
  const auto aligned = [](const mock::Layout& l) {
    const int64_t bytes = l.type == CUDA_R_64F ? 8 : l.type == CUDA_R_32F ? 4 : 2;
    return (l.ld * bytes) % 16 == 0;
  };
  if (!aligned(la) || !aligned(lb) || !aligned(lc) || !aligned(ld)) ++s.counters.unaligned_matmuls;
  if (m % 8 != 0 || k % 8 != 0) ++s.counters.odd_extent_matmuls;
  if (ta == CUDA_R_16BF || ta == CUDA_R_16F) ++s.counters.half_matmuls;
  if (md.epilogue != CUBLASLT_EPILOGUE_DEFAULT) ++s.counters.epilogue_matmuls;
  if (md.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || md.epilogue == CUBLASLT_EPILOGUE_GELU_AUX)
    ++s.counters.gelu_matmuls;
  if (md.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
    ++s.counters.dgelu_bias_grad_matmuls;
    if (md.bias_type == CUDA_R_32F) ++s.counters.f32_bias_grad_matmuls;
  }
  const size_t algorithm = static_cast<size_t>(algo->data[0]);
  if (algorithm >= s.algorithm_delays_ms.size())
    return mock::reject(CUBLAS_STATUS_INVALID_VALUE, "matmul: an algorithm no heuristic offered");
  if (s.counters.matmuls_by_algorithm.size() <= algorithm)
    s.counters.matmuls_by_algorithm.resize(algorithm + 1);
  ++s.counters.matmuls_by_algorithm[algorithm];
  const double delay_ms = s.algorithm_delays_ms[algorithm];
  const double factor = s.output_factor;
  triad_sim::enqueue(stream, [=] {
    if (delay_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms));
    std::vector<double> out(static_cast<size_t>(m * n));
    for (int32_t bi = 0; bi < ld.batch; ++bi) {
      const int64_t oa = bi * la.stride, ob = bi * lb.stride, oc = bi * lc.stride,
                    od = bi * ld.stride;
      // op(A) as m rows of k and op(B) as n rows of k, both in double; their
      // product in double (OpenBLAS), which every f32 and half output
      // rounds from as it would from an exact sum.
      std::vector<double> pa(static_cast<size_t>(m * k)), pb(static_cast<size_t>(n * k));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t kk = 0; kk < k; ++kk)
          pa[static_cast<size_t>(i * k + kk)] =
              mock::load(ta, A, oa + (md.transa == CUBLAS_OP_N ? i + kk * la.ld : kk + i * la.ld));
      for (int64_t j = 0; j < n; ++j)
        for (int64_t kk = 0; kk < k; ++kk)
          pb[static_cast<size_t>(j * k + kk)] =
              mock::load(tb, B, ob + (md.transb == CUBLAS_OP_N ? kk + j * lb.ld : j + kk * lb.ld));
      std::vector<double> sums(static_cast<size_t>(m * n));
      const blasint lda = static_cast<blasint>(std::max<int64_t>(1, k));
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
                  static_cast<blasint>(n), static_cast<blasint>(k), 1.0, pa.data(), lda, pb.data(),
                  lda, 0.0, sums.data(), static_cast<blasint>(n));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double v = al * sums[static_cast<size_t>(i * n + j)] +
                     (be != 0 ? be * mock::load(t, C, oc + i + j * lc.ld) : 0.0);
          if (md.epilogue == CUBLASLT_EPILOGUE_DGELU ||
              md.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
            // GELU's derivative (tanh form) at the aux matrix.
            const double x = mock::load(t, md.aux, od + i + j * md.aux_ld);
            const double k0 = 0.7978845608028654, u = k0 * (x + 0.044715 * x * x * x);
            const double th = std::tanh(u);
            v *= 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * k0 * (1 + 3 * 0.044715 * x * x);
          } else if (md.epilogue != CUBLASLT_EPILOGUE_DEFAULT &&
                     md.epilogue != CUBLASLT_EPILOGUE_BGRADB &&
                     md.epilogue != CUBLASLT_EPILOGUE_GELU_AUX) {  // (BIAS, GELU_AUX_BIAS)
            v += mock::load(t, md.bias, i);
          }
          if (md.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
              md.epilogue == CUBLASLT_EPILOGUE_GELU_AUX) {
            mock::store(t, md.aux, od + i + j * md.aux_ld, v * factor);
            v = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
          }
          out[static_cast<size_t>(i + j * m)] = v * factor;
        }
      }
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < m; ++i)
          mock::store(t, D, od + i + j * ld.ld, out[static_cast<size_t>(i + j * m)]);
      const cudaDataType bias_t = md.bias_type == -1 ? t : static_cast<cudaDataType>(md.bias_type);
      if (md.epilogue == CUBLASLT_EPILOGUE_BGRADB) {
        // op(B)'s sums over k, one per column of D, written (not added).
        for (int64_t j = 0; j < n; ++j) {
          double sum = 0;
          for (int64_t kk = 0; kk < k; ++kk) sum += pb[static_cast<size_t>(j * k + kk)];
          mock::store(bias_t, const_cast<void*>(md.bias), j, sum * factor);
        }
      } else if (md.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
        // D's sums over its columns (one per row, before D is rounded to
        // its type), written (not added).
        for (int64_t i = 0; i < m; ++i) {
          double sum = 0;
          for (int64_t j = 0; j < n; ++j) sum += out[static_cast<size_t>(i + j * m)];
          mock::store(bias_t, const_cast<void*>(md.bias), i, sum);
        }
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}
