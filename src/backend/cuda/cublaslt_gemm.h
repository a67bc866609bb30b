#pragma once

// Matrix products on the GPU through cuBLASLt: f32 (f32 compute, no TF32, so
// results track the CPU reference), f64, and bf16/f16 with f32 accumulation,
// stored in the inputs' type or (weight gradients added straight into f32
// gradients) in f32.
// Algorithms come from cuBLASLt's heuristic, cached per problem: its first
// choice, or (set_autotune) the fastest of its first few, timed on the
// problem's first call. A new problem of a class already chosen for (its m,
// n and k in the classes of gemm_extent_class, each one's remainder mod 8
// zero or not alike, all else equal) takes that class's algorithm when
// cublasLtMatmulAlgoCheck accepts it, without a query or a timing: a
// mixture's experts see new token counts every step. At most
// kMaxCachedProblems problems stay cached; past that the cache starts over
// (the classes' algorithms stay). One workspace per device is reused by every call. Weight-gradient
// and input-gradient products are separate calls (the zero-bubble B/W split needs them apart): the
// autograd layer issues them as two GEMMs. A linear layer's bias, and a GELU after it, can run in
// the GEMM's epilogue.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "gemm_plan.h"
#include "triad/backend/cuda.h"
#include "triad/core/dtype.h"

namespace triad::detail {

// What the GEMM's epilogue does to op(a) op(b): Bias adds a bias per
// column-major row (Triad's output feature; `bias` has plan.m elements);
// BiasGelu then applies GELU (tanh form), storing the pre-activation in
// `gelu_input` (laid out as the output); DGelu multiplies by GELU's
// derivative at `gelu_input` (read, laid out as the output); BiasGrad writes
// the column sums of op(second) over k, Triad's a (the output gradient of a
// weight-gradient product), to `bias_grad`: plan.n elements of the output's
// type (cuBLASLt's BGRADB; overwritten, never added to); DGeluBiasGrad is
// DGelu that also writes the output's sums over each column-major row
// (Triad's column sums of the GELU input's gradient, a linear layer's bias
// gradient: plan.m elements) to `bias_grad`, in f32 or (bias_grad_f32
// false) the output's type (cuBLASLt's DGELU_BGRAD; overwritten). Gelu is
// BiasGelu without a bias (a bias-free layer's; cuBLASLt's GELU_AUX).
struct GemmEpilogue {
  enum class Kind : uint8_t { None, Bias, BiasGelu, DGelu, BiasGrad, DGeluBiasGrad, Gelu };
  Kind kind = Kind::None;
  const void* bias = nullptr;
  void* gelu_input = nullptr;
  void* bias_grad = nullptr;
  bool bias_grad_f32 = true;  // (DGeluBiasGrad)
};

// The operands' element types: a and b share `inputs`; c is `output`,
// either the same or f32 under bf16/f16 inputs. A plain DType means all alike.
struct GemmTypes {
  DType inputs = DType::F32, output = DType::F32;
  GemmTypes(DType all) : inputs(all), output(all) {}  // NOLINT(google-explicit-constructor)
  GemmTypes(DType in, DType out) : inputs(in), output(out) {}
};

// Where cuBLASLt may add a split-k product's partial sums: Any lets it pick
// (for bf16/f16 outputs, possibly in the output type, in place or in the
// workspace); ComputeType keeps them in f32 (the compute type) until the
// one final rounding. f32 and f64 outputs are the same either way.
enum class GemmReduction : uint8_t { Any, ComputeType };

class CublasLtGemm {
 public:
  // Device memory for autotuning a product that reads its output into a
  // scratch output instead: null, or a throw, leaves that problem to the
  // heuristic's first choice. Default: cudaMalloc.
  using ScratchSource = std::function<std::shared_ptr<void>(size_t bytes)>;

  explicit CublasLtGemm(int device);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // c = alpha * op(a) op(b) + beta * c for the plan's geometry.
  // NotSupportedError when cuBLASLt has no algorithm (for this epilogue), or
  // for a type pair it does not take (epilogues need one type throughout,
  // but for BiasGrad, which also takes bf16/f16 inputs into f32).
  void run(const GemmPlan& plan, GemmTypes types, const void* a, const void* b, void* c,
           double alpha, double beta, cudaStream_t stream, const GemmEpilogue& epilogue = {},
           GemmReduction reduction = GemmReduction::Any);

  // candidates > 1: each problem's first call asks the heuristic for up to
  // that many algorithms and times each on the call's own operands (a
  // warm-up, then kTuneRuns calls between two events on its stream; the
  // host waits), keeping the fastest; a product that reads its output
  // (beta != 0, or a GELU derivative over its own input) is timed into
  // scratch from set_scratch_source(). The results stay
  // those of an algorithm cuBLASLt offers, but which one may differ between
  // processes, so runs repeat bit for bit only with it off (0 or 1, the
  // default: the heuristic's first choice, never timed). Problems are
  // cached per candidate count.
  void set_autotune(int candidates);
  void set_scratch_source(ScratchSource scratch);
  cuda::GemmTuning tuning() const;  // what autotuning found (cuda.h)

  static constexpr size_t kWorkspaceBytes = 32u << 20;
  static constexpr int kTuneRuns = 3;
  static constexpr size_t kMaxCachedProblems = 4096;
  size_t cached_problems() const;  // problems with their descriptors cached

 private:
  struct Cached;
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int, bool>;
  Cached& lookup(const GemmPlan& plan, GemmTypes types, int alignment, const GemmEpilogue& epilogue,
                 GemmReduction reduction);
  // The class key of a problem's key (gemm_extent_class's m, n and k, and
  // whether each is a multiple of 8).
  static Key class_of(const Key& key);
  void tune(Cached& e, const GemmPlan& plan, GemmTypes types, const void* a, const void* b, void* c,
            const void* alpha, const void* beta, bool reads_output, cudaStream_t stream);

  int device_;
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  mutable std::mutex mutex_;
  std::map<Key, std::unique_ptr<Cached>> cache_;
  std::map<Key, cublasLtMatmulAlgo_t> class_algo_;  // by class_of: the algorithm chosen
  std::map<Key, std::string> unsupported_;          // problems with no algorithm, and why
  int autotune_ = 0;
  ScratchSource scratch_;
  cuda::GemmTuning tuning_;
};

}  // namespace triad::detail
