#include "gemm_verification.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "gemm_check_record.h"
#include "kernels/gemm_reference.h"
#include "scalar_type.h"
#include "triad/core/error.h"

namespace triad::detail {
namespace {

namespace k = triad::kernels;

// The reference's epilogue for a product's. (A bias-gradient epilogue
// leaves the product as it is: the reference checks the product; the
// column sums it writes are not compared.)
k::RefGemm::Epilogue reference_epilogue(GemmEpilogue::Kind kind) {
  switch (kind) {
    case GemmEpilogue::Kind::Bias:
      return k::RefGemm::Epilogue::Bias;
    case GemmEpilogue::Kind::BiasGelu:
      return k::RefGemm::Epilogue::BiasGelu;
    case GemmEpilogue::Kind::Gelu:
      return k::RefGemm::Epilogue::Gelu;
    case GemmEpilogue::Kind::DGelu:
    case GemmEpilogue::Kind::DGeluBiasGrad:
      return k::RefGemm::Epilogue::DGelu;
    default:
      return k::RefGemm::Epilogue::None;
  }
}

// Whether the epilogue also writes GELU's input (checked as a second output).
bool writes_gelu_input(GemmEpilogue::Kind kind) {
  return kind == GemmEpilogue::Kind::BiasGelu || kind == GemmEpilogue::Kind::Gelu;
}

// The product's element count, and its reference's f32 values (twice as
// many for bias + GELU: the GELU input too), rounded up so that the two
// GemmDiff results after them are 8-byte aligned.
size_t elements(const GemmPlan& p) {
  return static_cast<size_t>(p.m * p.n * p.batch);
}
size_t reference_floats(const GemmPlan& p, const GemmEpilogue& e) {
  const size_t n = elements(p) * (writes_gelu_input(e.kind) ? 2 : 1);
  return (n + 1) / 2 * 2;
}

std::string describe(const GemmOperandLayout& l) {
  return std::to_string(l.rows) + " x " + std::to_string(l.cols) + " ld " + std::to_string(l.ld) +
         (l.transpose ? " transposed" : "") +
         (l.batch_stride ? " batch stride " + std::to_string(l.batch_stride) : "");
}

const char* epilogue_name(GemmEpilogue::Kind kind) {
  switch (kind) {
    case GemmEpilogue::Kind::Bias:
      return "bias";
    case GemmEpilogue::Kind::BiasGelu:
      return "bias + GELU";
    case GemmEpilogue::Kind::Gelu:
      return "GELU";
    case GemmEpilogue::Kind::DGelu:
      return "GELU derivative";
    case GemmEpilogue::Kind::BiasGrad:
      return "bias gradient (its sums unchecked)";
    case GemmEpilogue::Kind::DGeluBiasGrad:
      return "GELU derivative and bias gradient (its sums unchecked)";
    default:
      return "none";
  }
}

// The product as a check names it: cuBLASLt's column-major view (first is
// Triad's b, second its a).
std::string describe(const GemmPlan& p, GemmTypes types, double alpha, double beta,
                     const GemmEpilogue& epilogue, GemmReduction reduction) {
  char scalars[96];
  std::snprintf(scalars, sizeof scalars, "alpha %g, beta %g", alpha, beta);
  return "m " + std::to_string(p.m) + ", n " + std::to_string(p.n) + ", k " + std::to_string(p.k) +
         ", batch " + std::to_string(p.batch) + "; first " + describe(p.first) + ", second " +
         describe(p.second) + ", out " + describe(p.out) + "; " + dtype_name(types.inputs) +
         " into " + dtype_name(types.output) + ", epilogue " + epilogue_name(epilogue.kind) + ", " +
         scalars + (reduction == GemmReduction::ComputeType ? ", split-k sums in f32" : "");
}

// ||out - ref|| / ||ref|| that a correct product stays within: its output
// type's rounding (bf16 keeps 8 bits, relative 2^-9; f16 11) with room for
// split-k sums rounded to it; f32 sums in another order, and an epilogue's
// GELU through a faster tanh, stay far inside 1e-3. A wrong layout, operand
// or epilogue is off by far more.
double tolerance_of(GemmTypes types) {
  switch (types.output) {
    case DType::BF16:
      return 1e-2;
    case DType::F16:
      return 2.5e-3;
    default:
      return 1e-3;
  }
}

cuda::GemmCheck to_check(const k::GemmDiff& d, std::string problem, double tolerance) {
  cuda::GemmCheck c;
  c.problem = std::move(problem);
  c.tolerance = tolerance;
  c.max_error = d.max_error;
  c.max_reference = d.max_reference;
  c.nonfinite = static_cast<int64_t>(d.nonfinite);
  if (d.reference_sq > 0) {
    c.relative_error = std::sqrt(d.error_sq / d.reference_sq);
  } else {
    c.relative_error = d.error_sq > 0 ? 1.0 : 0.0;  // the reference is all zeros
  }
  return c;
}

void record(const cuda::GemmCheck& c) {
  if (!record_gemm_check(c)) return;
  spdlog::error(
      "gemm verification: cuBLASLt's product is {:.3g} from the reference (relative to its norm; "
      "tolerance {:.3g}), largest difference {:.3g} where the largest value is {:.3g}, {} "
      "non-finite outputs: {}",
      c.relative_error, c.tolerance, c.max_error, c.max_reference, c.nonfinite, c.problem);
}

void check_rt(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

size_t GemmProductCheck::scratch_bytes(const GemmPlan& plan, const GemmEpilogue& epilogue) {
  return reference_floats(plan, epilogue) * sizeof(float) + 2 * sizeof(k::GemmDiff);
}

bool GemmProductCheck::checkable(const GemmPlan& plan, GemmTypes types) {
  // (The reference's grid: 16 x 16 tiles, at most 65535 in y and z.)
  return types.inputs != DType::F64 && types.output != DType::F64 && plan.batch <= 65535 &&
         (plan.n + 15) / 16 <= 65535;
}

GemmProductCheck::GemmProductCheck(const GemmPlan& plan, GemmTypes types, const void* a,
                                   const void* b, const void* c, double alpha, double beta,
                                   const GemmEpilogue& epilogue, GemmReduction reduction,
                                   void* scratch, cudaStream_t stream)
    : plan_(plan),
      types_(types),
      c_(c),
      alpha_(alpha),
      beta_(beta),
      epilogue_(epilogue),
      reduction_(reduction),
      scratch_(scratch),
      stream_(stream) {
  float* ref = static_cast<float*>(scratch_);
  const bool gelu = writes_gelu_input(epilogue.kind);
  k::RefGemm g;
  g.m = plan.m, g.n = plan.n, g.k = plan.k, g.batch = plan.batch;
  g.inputs = scalar(types.inputs), g.output = scalar(types.output);
  // Column-major, as cuBLASLt is called: its first operand is Triad's b.
  g.first = {b, plan.first.ld, plan.first.batch_stride, plan.first.transpose};
  g.second = {a, plan.second.ld, plan.second.batch_stride, plan.second.transpose};
  g.c = {c, plan.out.ld, plan.out.batch_stride, false};
  g.alpha = alpha, g.beta = beta;
  g.epilogue = reference_epilogue(epilogue.kind);
  g.bias = epilogue.bias;
  g.aux = epilogue.gelu_input;
  k::gemm_reference(g, ref, gelu ? ref + elements(plan) : nullptr, stream);
}

void GemmProductCheck::finish() {
  const float* ref = static_cast<const float*>(scratch_);
  auto* diffs = reinterpret_cast<k::GemmDiff*>(static_cast<char*>(scratch_) +
                                               reference_floats(plan_, epilogue_) * sizeof(float));
  const bool gelu = writes_gelu_input(epilogue_.kind);
  const k::ScalarType out = scalar(types_.output);
  k::gemm_compare(out, c_, plan_.out.ld, plan_.out.batch_stride, plan_.m, plan_.n, plan_.batch, ref,
                  diffs, stream_);
  if (gelu) {
    k::gemm_compare(out, epilogue_.gelu_input, plan_.out.ld, plan_.out.batch_stride, plan_.m,
                    plan_.n, plan_.batch, ref + elements(plan_), diffs + 1, stream_);
  }
  k::GemmDiff host[2];
  check_rt(cudaMemcpyAsync(host, diffs, sizeof host, cudaMemcpyDeviceToHost, stream_),
           "gemm verification copy");
  check_rt(cudaStreamSynchronize(stream_), "gemm verification");
  const std::string problem = describe(plan_, types_, alpha_, beta_, epilogue_, reduction_);
  const double tolerance = tolerance_of(types_);
  record(to_check(host[0], problem, tolerance));
  if (gelu) record(to_check(host[1], problem + " (its GELU input)", tolerance));
}

}  // namespace triad::detail
