// CUDA conformance suite (label gpu): every op of the shared harness table
// and the kernels' edge shapes, run on the GPU and compared with the CPU
// backend on the same inputs, in f32, bf16 and f16. Exits 77 (skipped) when
// no GPU is visible.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <thread>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <utility>

#include "ops/op_cases.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "support/tiny_deepseek.h"
#ifdef TRIAD_CUDA_SIM
#include "kernels/layernorm.h"
#include "support/mock_cublaslt.h"
#endif
#include "triad/backend/backend.h"
#include "triad/backend/cuda.h"
#include "triad/backend/device_timer.h"
#include "triad/core/allocator.h"
#include "triad/data/token_shard.h"
#include "triad/dist/nccl.h"
#include "triad/dist/world.h"
#include "triad/nn/documents.h"
#include "triad/nn/generate.h"
#include "triad/nn/gpt.h"
#include "triad/nn/moe.h"
#include "triad/ops.h"
#include "triad/optim/adamw.h"
#include "triad/optim/clip.h"
#include "triad/parallel/tensor/layers.h"
#include "triad/train/trainer.h"

#ifdef TRIAD_CUDA_SIM
#include <cuda_runtime_api.h>

#include "src/backend/cuda/cuda_backend.h"
#include "support/cuda_sim/sim.h"
#endif

namespace triad {
namespace {

const Device kGpu = Device::cuda(0);
// This binary also runs on cuda_sim (tests/support/cuda_sim), the CPU
// simulator of the CUDA backend, which skips what only a GPU can do quickly.
#ifdef TRIAD_CUDA_SIM
constexpr bool kOnSimulator = true;
#else
constexpr bool kOnSimulator = false;
#endif

// Forward output and every input gradient of fn on `device`, inputs built on
// the host in `dtype` (the same values on both devices).
struct CaseResult {
  std::vector<double> out;
  std::vector<std::vector<double>> grads;
};

CaseResult run_case(const testing::OpCase& c, DType dtype, Device device) {
  CaseResult r;
  std::vector<Tensor> in;
  for (Tensor x : c.inputs(dtype)) {
    Tensor moved = to_device(x, device).detach();
    if (is_floating(moved.dtype())) moved.set_requires_grad(true);
    in.push_back(moved);
  }
  Tensor y = c.fn(in);
  r.out = to_double_vector(y);
  if (c.differentiable) {
    Tensor g = to_device(randn(y.shape(), 3, 3, 1.0, dtype), device).detach();
    autograd::backward({y}, {g});
    for (auto& x : in) {
      if (is_floating(x.dtype())) r.grads.push_back(to_double_vector(x.grad()));
    }
  }
  return r;
}

// ||got - want|| / ||want|| over all elements: an error every element
// shares (a dropped term, a wrong scale) shows here even where each element
// would pass an elementwise tolerance.
double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

// |got - want| <= atol + rtol * |want| elementwise, with rtol/atol scaled by
// the largest magnitude for half types (their error is relative to the data).
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                  double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  // Over the whole tensor the error must also stay under half the
  // elementwise rtol: an error every element shares (a dropped term, a
  // wrong scale), which each element's tolerance would let through, fails
  // here. (On the simulator the largest whole-tensor error of any case is a
  // quarter of its rtol.)
  // A floor of 1e-6 per element (root mean square) keeps a tensor that is
  // zero on the CPU and holds rounding residue on the GPU from failing it.
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  EXPECT_LE(std::sqrt(diff),
            rtol / 2 * std::sqrt(norm) + 1e-6 * std::sqrt(static_cast<double>(want.size())))
      << what << ": whole-tensor error (relative " << relative_error(got, want) << ")";
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  int reported = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double tol = atol * (1 + scale) + rtol * std::abs(want[i]);
    if (!(std::abs(got[i] - want[i]) <= tol) && reported++ < 5) {
      ADD_FAILURE() << what << " element " << i << ": cuda " << got[i] << ", cpu " << want[i]
                    << " (tolerance " << tol << ")";
    }
  }
}

struct Tolerance {
  double rtol, atol;
};
Tolerance tolerance(DType d) {
  switch (d) {
    case DType::F32:
      return {1e-4, 1e-5};
    case DType::BF16:
      return {2e-2, 2e-2};
    default:
      return {4e-3, 4e-3};
  }
}

class CudaOpHarness : public ::testing::TestWithParam<testing::OpCase> {};

TEST_P(CudaOpHarness, MatchesCpuInF32Bf16F16) {
  const testing::OpCase& c = GetParam();
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const CaseResult cpu = run_case(c, dtype, Device::cpu());
    const CaseResult gpu = run_case(c, dtype, kGpu);
    const Tolerance t = tolerance(dtype);
    expect_close(gpu.out, cpu.out, t.rtol, t.atol, c.name + " output");
    ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
    for (size_t k = 0; k < cpu.grads.size(); ++k) {
      expect_close(gpu.grads[k], cpu.grads[k], 2 * t.rtol, 2 * t.atol,
                   c.name + " grad of input " + std::to_string(k));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, CudaOpHarness, ::testing::ValuesIn(testing::op_cases()),
                         [](const ::testing::TestParamInfo<testing::OpCase>& info) {
                           std::string n = info.param.name;
                           for (auto& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

// x's values in a contiguous view that starts one element past a 16-byte
// boundary: kernels cannot take it in 16-byte packs.
Tensor misaligned(const Tensor& x) {
  Tensor pad = zeros({1}, x.dtype(), x.device());
  return reshape(narrow(concat({pad, flatten(x)}, 0), 0, 1, x.numel()), x.shape());
}

// Edge and production shapes the small table does not reach.
testing::OpCase attention_case(int64_t B, int64_t T, int64_t C, int64_t NH) {
  return {"attention_B" + std::to_string(B) + "_T" + std::to_string(T) + "_C" + std::to_string(C) +
              "_NH" + std::to_string(NH),
          [=](DType d) {
            return std::vector<Tensor>{randn({B, T, 3 * C}, 7, 1, 1.0, d)};
          },
          [=](const std::vector<Tensor>& x) { return causal_attention(x[0], NH); }};
}

// The case's attention through `kernel` in `dtype`, on the GPU against the
// CPU: output and dqkv.
void expect_attention_kernel_matches_cpu(const testing::OpCase& c, DType dtype,
                                         cuda::AttentionKernel kernel) {
  cuda::set_attention_kernel(kernel);
  const CaseResult cpu = run_case(c, dtype, Device::cpu());
  const CaseResult gpu = run_case(c, dtype, kGpu);
  cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
  const Tolerance t = tolerance(dtype);
  expect_close(gpu.out, cpu.out, t.rtol, t.atol, "output");
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    expect_close(gpu.grads[i], cpu.grads[i], 4 * t.rtol, 4 * t.atol,
                 "gradient of input " + std::to_string(i));
  }
}

// The same in f32, bf16 and f16 through every implementation that can run
// (T, C, heads).
void expect_attention_matches_cpu(const testing::OpCase& c, int64_t T, int64_t C,
                                  const AttentionHeads& NH) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (cuda::AttentionKernel kernel :
         {cuda::AttentionKernel::Simt, cuda::AttentionKernel::TensorCore,
          cuda::AttentionKernel::Cudnn}) {
      const std::string why = cuda::attention_kernel_unavailable(kernel, dtype, T, C, NH);
      if (!why.empty()) {
        std::printf("[ note ] %s %s: %s\n", cuda::attention_kernel_name(kernel), dtype_name(dtype),
                    why.c_str());
        continue;
      }
      SCOPED_TRACE(c.name + " " + dtype_name(dtype) + " " + cuda::attention_kernel_name(kernel));
      expect_attention_kernel_matches_cpu(c, dtype, kernel);
    }
  }
}

// causal_attention over random qkv (B, T, C + 2 * kv * D; stddev `stddev`,
// seed `seed`) with `heads` and first keys `starts` (undefined: none).
testing::OpCase qkv_attention_case(const std::string& name, int64_t B, int64_t T, int64_t C,
                                   const AttentionHeads& heads, const Tensor& starts, uint64_t seed,
                                   double stddev) {
  const int64_t width = C + 2 * heads.kv * (C / heads.q);
  return {name,
          [=](DType d) {
            return std::vector<Tensor>{randn({B, T, width}, seed, 1, stddev, d)};
          },
          [=](const std::vector<Tensor>& x) { return causal_attention(x[0], heads, starts); }};
}

// The case's attention in f32, bf16 and f16 through Triad's own kernels
// (SIMT, and tensor cores where they apply) against the CPU.
void expect_own_kernels_match_cpu(const testing::OpCase& c, int64_t T, int64_t C,
                                  const AttentionHeads& heads) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (cuda::AttentionKernel kernel :
         {cuda::AttentionKernel::Simt, cuda::AttentionKernel::TensorCore}) {
      if (!cuda::attention_kernel_unavailable(kernel, dtype, T, C, heads).empty()) continue;
      SCOPED_TRACE(c.name + " " + dtype_name(dtype) + " " + cuda::attention_kernel_name(kernel));
      expect_attention_kernel_matches_cpu(c, dtype, kernel);
    }
  }
}

// More (batch, head) pairs and more row blocks than a grid's y holds
// (65535): the kernels' grids are flat along x, every head's blocks of one
// row-block index side by side (the last query rows first), so SIMT and
// tensor cores take them. They used to refuse more than 65535 pairs (the
// SIMT grids' y) and `auto` sent such shapes to cuDNN untimed. The
// simulator plays a y and z of 4 blocks, where the old grids fail to
// launch (6 pairs; 5 blocks of 64 rows, the tensor cores' y); a GPU runs
// 65538 pairs.
TEST(CudaKernels, AttentionOverMoreHeadsThanAGridsY) {
#ifdef TRIAD_CUDA_SIM
  struct PlayedLimit {
    PlayedLimit() { triad_sim::set_grid_yz_limit(4); }
    ~PlayedLimit() { triad_sim::set_grid_yz_limit(65535); }
  } played;
  const int64_t B = 3, T = 300, C = 32, NH = 2;  // head dim 16
#else
  const int64_t B = 32769, T = 17, C = 32, NH = 2;
#endif
  // (Triad's kernels: what cuDNN's grids hold is cuDNN's affair.)
  expect_own_kernels_match_cpu(attention_case(B, T, C, NH), T, C, NH);
}

TEST(CudaKernels, AttentionHeadDimsAndLongSequences) {
  // D = 64 (GPT-2), 128, 80, 16 and 8; T not a multiple of the blocks (and
  // one that is, for cuDNN before 9.16). Every implementation where it
  // applies: SIMT for every type, tensor cores for bf16/f16 with D a multiple
  // of 16, cuDNN (builds with it) for bf16/f16.
  struct Shape {
    int64_t B, T, C, NH;
  };
  for (const Shape& sh : {Shape{2, 200, 256, 4}, Shape{1, 130, 256, 2}, Shape{1, 97, 160, 2},
                          Shape{2, 65, 32, 2}, Shape{3, 33, 16, 2}, Shape{2, 256, 256, 4}}) {
    expect_attention_matches_cpu(attention_case(sh.B, sh.T, sh.C, sh.NH), sh.T, sh.C, sh.NH);
  }
  // A qkv one element past a 16-byte boundary: the tensor-core kernels copy
  // its rows into shared memory one element at a time instead of in packs.
  testing::OpCase shifted = attention_case(2, 65, 64, 2);
  shifted.fn = [](const std::vector<Tensor>& x) { return causal_attention(misaligned(x[0]), 2); };
  for (DType dtype : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string("misaligned qkv ") + dtype_name(dtype));
    expect_attention_kernel_matches_cpu(shifted, dtype, cuda::AttentionKernel::TensorCore);
  }
}

// Grouped-query attention (NKV key/value heads, each shared by NH / NKV
// query heads; NKV 1 is multi-query): SIMT, tensor cores and (without packed
// documents, which its graph has no mask for) cuDNN against the CPU, the
// dk/dv pass summing a group's query heads.
TEST(CudaKernels, GroupedQueryAttention) {
  struct Shape {
    int64_t B, T, C, NH, NKV;
  };
  for (const Shape& sh : {Shape{2, 200, 256, 4, 2}, Shape{1, 130, 128, 4, 1},
                          Shape{2, 65, 128, 8, 2}, Shape{1, 70, 48, 6, 3}}) {
    const AttentionHeads heads{sh.NH, sh.NKV};
    std::vector<int64_t> ids(static_cast<size_t>(sh.B * sh.T), 5);
    for (int64_t end : {20, 63, static_cast<int>(sh.T) - 2}) ids[end] = 0;
    const Tensor starts = nn::document_layout(from_vector(ids, {sh.B, sh.T}), 0).starts;
    for (bool documents : {false, true}) {
      const std::string name = "gqa_B" + std::to_string(sh.B) + "_T" + std::to_string(sh.T) + "_C" +
                               std::to_string(sh.C) + "_NH" + std::to_string(sh.NH) + "_KV" +
                               std::to_string(sh.NKV) + (documents ? "_documents" : "");
      const testing::OpCase c =
          qkv_attention_case(name, sh.B, sh.T, sh.C, heads, documents ? starts : Tensor(), 7, 1.0);
      if (documents)
        expect_own_kernels_match_cpu(c, sh.T, sh.C, heads);
      else
        expect_attention_matches_cpu(c, sh.T, sh.C, heads);
    }
  }
  if (cuda::cudnn_compiled()) {
    EXPECT_EQ(cuda::attention_kernel_unavailable(cuda::AttentionKernel::Cudnn, DType::BF16, 128,
                                                 128, AttentionHeads{4, 2}),
              "");
  }
  // A key/value head count that does not divide the query heads.
  EXPECT_NE(cuda::attention_kernel_unavailable(cuda::AttentionKernel::Simt, DType::BF16, 64, 128,
                                               AttentionHeads{4, 3}),
            "");
}

// Sliding windows (each query's first key t - W + 1, or its document's
// start if later): SIMT and tensor cores against the CPU, windows shorter
// than a tile and spanning several, so whole tiles before a block's first
// key are skipped in the forward, dq and dk/dv passes. A window alone,
// promised by the heads (AttentionHeads::with_window), runs through cuDNN's
// windowed graph too.
TEST(CudaKernels, AttentionOverASlidingWindow) {
  struct Case {
    int64_t B, T, C, NH, NKV, window;
    bool documents;
  };
  for (const Case& k : {Case{2, 200, 128, 2, 2, 50, false}, Case{1, 260, 256, 4, 2, 130, false},
                        Case{2, 200, 128, 4, 1, 20, true}}) {
    const AttentionHeads heads{k.NH, k.NKV};
    Tensor docs;
    if (k.documents) {
      std::vector<int64_t> ids(static_cast<size_t>(k.B * k.T), 5);
      for (int64_t end : {36, 99, 150}) ids[end] = 0;
      docs = nn::document_layout(from_vector(ids, {k.B, k.T}), 0).starts;
    }
    const Tensor starts = nn::sliding_window_starts(k.B, k.T, k.window, docs);
    const std::string name = "window" + std::to_string(k.window) + "_B" + std::to_string(k.B) +
                             "_T" + std::to_string(k.T) + "_NH" + std::to_string(k.NH) + "_KV" +
                             std::to_string(k.NKV) + (k.documents ? "_documents" : "");
    if (k.documents) {
      expect_own_kernels_match_cpu(qkv_attention_case(name, k.B, k.T, k.C, heads, starts, 9, 1.0),
                                   k.T, k.C, heads);
    } else {
      const AttentionHeads promised = heads.with_window(k.window);
      expect_attention_matches_cpu(
          qkv_attention_case(name, k.B, k.T, k.C, promised, starts, 9, 1.0), k.T, k.C, promised);
    }
  }
  // cuDNN named explicitly: a window mixed with documents has no graph.
  if (cuda::cudnn_compiled()) {
    cuda::set_attention_kernel(cuda::AttentionKernel::Cudnn);
    const Tensor qkv = randn({1, 128, 192}, 3, 1, 1.0, DType::BF16, kGpu);
    std::vector<int64_t> ids(128, 5);
    ids[40] = 0;
    const Tensor mixed = nn::sliding_window_starts(
        1, 128, 16, nn::document_layout(from_vector(ids, {1, 128}), 0).starts);
    try {
      (void)causal_attention(qkv, 2, to_device(mixed, kGpu));
      ADD_FAILURE() << "cuDNN took packed documents";
    } catch (const NotSupportedError& e) {
      EXPECT_NE(std::string(e.what()).find("document mask"), std::string::npos) << e.what();
    }
    cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
  }
}

// The tensor-core kernels over random shapes (fixed seeds): lengths that
// are and are not multiples of the 64-row tiles, head dims 16 to 256 (the simulator is sm_90),
// grouped and multi-query heads, packed documents with random boundaries
// and random windows, alone and together. Each tile is either whole
// (the per-score comparisons skipped) or masked, and which depends on the
// warp's rows, the end of the keys and every row's first key: shapes no
// hand-picked case thought of check that choice against the CPU.
TEST(CudaKernels, TensorCoreAttentionOverRandomShapes) {
  std::mt19937 rng(20261206);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t B = pick(1, 2), T = pick(1, 260), NH = int64_t(1) << pick(0, 2);
    const int64_t NKV = NH >> pick(0, NH == 4 ? 2 : NH == 2 ? 1 : 0);
    const int64_t D = 16 * pick(1, 16), C = NH * D;
    const bool documents = pick(0, 1) == 1;
    const int64_t window = pick(0, 2) == 0 ? pick(1, T + 8) : 0;
    Tensor starts;
    if (documents) {
      std::vector<int64_t> ids(static_cast<size_t>(B * T), 5);
      for (int64_t k = pick(0, 4); k > 0; --k) ids[static_cast<size_t>(pick(0, B * T - 1))] = 0;
      starts = nn::document_layout(from_vector(ids, {B, T}), 0).starts;
    }
    if (window > 0) starts = nn::sliding_window_starts(B, T, window, starts);
    const AttentionHeads heads{NH, NKV};
    const DType dtype = trial % 2 == 0 ? DType::BF16 : DType::F16;
    const std::string name =
        "random" + std::to_string(trial) + "_B" + std::to_string(B) + "_T" + std::to_string(T) +
        "_C" + std::to_string(C) + "_NH" + std::to_string(NH) + "_KV" + std::to_string(NKV) +
        (documents ? "_documents" : "") + (window > 0 ? "_window" + std::to_string(window) : "");
    SCOPED_TRACE(name + " " + dtype_name(dtype));
    std::printf("[ case ] %s %s\n", name.c_str(), dtype_name(dtype));
    const std::string why =
        cuda::attention_kernel_unavailable(cuda::AttentionKernel::TensorCore, dtype, T, C, heads);
    ASSERT_EQ(why, "") << "every shape drawn here is one the tensor cores take";
    expect_attention_kernel_matches_cpu(
        qkv_attention_case(name, B, T, C, heads, starts, 100 + trial, 1.0), dtype,
        cuda::AttentionKernel::TensorCore);
  }
}

// A chunk of queries apart from the keys and values (chunk_attention,
// context parallelism's all-gather): SIMT and tensor cores against the CPU,
// the chunk starting inside a block of either's rows and on a block's first
// row, with grouped heads and a window over packed documents. cuDNN's graph
// takes one fused qkv and, asked for by name, says so.
TEST(CudaKernels, AttentionOverAChunkOfQueries) {
  struct Case {
    int64_t B, T, C, NH, NKV, first, window;
  };
  for (const Case& k : {Case{2, 130, 128, 4, 2, 70, 0}, Case{1, 200, 128, 2, 1, 128, 0},
                        Case{2, 160, 128, 4, 1, 97, 40}, Case{1, 96, 128, 2, 2, 0, 0}}) {
    const AttentionHeads heads{k.NH, k.NKV};
    Tensor starts;
    if (k.window > 0) {
      std::vector<int64_t> ids(static_cast<size_t>(k.B * k.T), 5);
      for (int64_t end : {36, 99, 120}) ids[end] = 0;
      starts = nn::sliding_window_starts(
          k.B, k.T, k.window, nn::document_layout(from_vector(ids, {k.B, k.T}), 0).starts);
    }
    const std::string name = "chunk_from" + std::to_string(k.first) + "_B" + std::to_string(k.B) +
                             "_T" + std::to_string(k.T) + "_NH" + std::to_string(k.NH) + "_KV" +
                             std::to_string(k.NKV) +
                             (k.window ? "_window" + std::to_string(k.window) : "");
    const int64_t kv_width = 2 * heads.kv * (k.C / heads.q);
    const testing::OpCase c{
        name,
        [=](DType d) {
          return std::vector<Tensor>{randn({k.B, k.T - k.first, k.C}, 13, 2, 1.0, d),
                                     randn({k.B, k.T, kv_width}, 13, 3, 1.0, d)};
        },
        [=](const std::vector<Tensor>& x) {
          return chunk_attention(
              x[0], x[1], heads,
              starts.defined() ? contiguous(narrow(starts, 1, k.first, k.T - k.first)) : Tensor());
        }};
    expect_own_kernels_match_cpu(c, k.T, k.C, heads);
  }
  cuda::set_attention_kernel(cuda::AttentionKernel::Cudnn);
  const Tensor qkv = randn({1, 128, 192}, 3, 1, 1.0, DType::BF16, kGpu);
  try {  // (even all of a row's queries)
    (void)chunk_attention(narrow(qkv, 2, 0, 64), narrow(qkv, 2, 64, 128), 2);
    ADD_FAILURE() << "cuDNN took the queries apart";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("queries apart"), std::string::npos) << e.what();
  }
  try {  // (a window's first keys beside them: the queries apart still the reason)
    (void)chunk_attention(narrow(qkv, 2, 0, 64), narrow(qkv, 2, 64, 128), 2,
                          nn::sliding_window_starts(1, 128, 16));
    ADD_FAILURE() << "cuDNN took the queries apart with a window";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("queries apart"), std::string::npos) << e.what();
  }
  cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
}

// Blocks of queries apart from their keys (chunk_attention's query_start;
// ring attention's steps): more queries than keys, every key before every
// query, with first keys in the block's frame that leave some queries none
// (out 0, lse -inf; no gradient); the block's own run causally (query_start
// 0); queries before the last keys (those keys unseen); and a block with no
// keys at all (no grid of theirs to launch). SIMT and tensor cores against
// the CPU.
TEST(CudaKernels, AttentionOverBlocksOfEarlierKeys) {
  struct Case {
    int64_t B, Tk, Tq, C, NH, NKV, query_start;
    bool documents;
  };
  for (const Case& k :
       {Case{2, 70, 100, 128, 4, 2, 70, false}, Case{1, 130, 64, 128, 2, 1, 200, true},
        Case{2, 96, 96, 128, 4, 4, 0, true}, Case{1, 100, 40, 128, 2, 1, 10, false},
        Case{2, 0, 5, 128, 2, 1, 3, false}}) {
    const AttentionHeads heads{k.NH, k.NKV};
    Tensor starts;
    if (k.documents) {
      // Documents starting at keys 36 and 99 (queries past the block's keys:
      // its last document's start is Tk, no key).
      std::vector<int64_t> first(static_cast<size_t>(k.B * k.Tq));
      for (int64_t b = 0; b < k.B; ++b) {
        for (int64_t i = 0; i < k.Tq; ++i) {
          const int64_t t = k.query_start + i;  // the query's position
          const int64_t start = t < 36 ? 0 : t < 99 ? 36 : t < 150 ? 99 : k.Tk;
          first[static_cast<size_t>(b * k.Tq + i)] = std::min(start, t);
        }
      }
      starts = from_vector(first, {k.B, k.Tq}, DType::I32);
    }
    const std::string name = "block_at" + std::to_string(k.query_start) + "_B" +
                             std::to_string(k.B) + "_Tk" + std::to_string(k.Tk) + "_Tq" +
                             std::to_string(k.Tq) + "_NH" + std::to_string(k.NH) + "_KV" +
                             std::to_string(k.NKV) + (k.documents ? "_documents" : "");
    const int64_t kv_width = 2 * heads.kv * (k.C / heads.q);
    const testing::OpCase c{name,
                            [=](DType d) {
                              return std::vector<Tensor>{
                                  randn({k.B, k.Tq, k.C}, 17, 2, 1.0, d),
                                  randn({k.B, k.Tk, kv_width}, 17, 3, 1.0, d)};
                            },
                            [=](const std::vector<Tensor>& x) {
                              return chunk_attention(x[0], x[1], heads, starts, k.query_start);
                            }};
    expect_own_kernels_match_cpu(c, std::max(k.Tk, k.Tq), k.C, heads);
  }
}

// A ring step's block written straight in f32 under bf16/f16 inputs (no
// rounding before the fold): SIMT and tensor cores against the CPU's f32
// output from the same inputs, and closer to it than the half output is.
TEST(CudaKernels, AttentionBlockOutputInF32UnderHalves) {
  const int64_t B = 2, Tk = 70, Tq = 64, C = 128;
  const AttentionHeads heads{4, 2};
  Backend& gpu = backend_for(DeviceType::CUDA);
  for (DType dtype : {DType::BF16, DType::F16}) {
    const Tensor q = randn({B, Tq, C}, 29, 1, 1.0, dtype);
    const Tensor kv = randn({B, Tk, 2 * heads.kv * (C / heads.q)}, 29, 2, 1.0, dtype);
    Tensor want = empty({B, Tq, C}, DType::F32), want_lse = empty({B, heads.q, Tq}, DType::F32);
    backend_for(DeviceType::CPU).attention_parts_forward(q, kv, heads, Tk, want, want_lse, {});
    for (cuda::AttentionKernel kernel :
         {cuda::AttentionKernel::Simt, cuda::AttentionKernel::TensorCore}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + cuda::attention_kernel_name(kernel));
      cuda::set_attention_kernel(kernel);
      Tensor out = empty({B, Tq, C}, DType::F32, kGpu), half_out = empty({B, Tq, C}, dtype, kGpu);
      Tensor lse = empty({B, heads.q, Tq}, DType::F32, kGpu);
      const Tensor gq = to_device(q, kGpu), gkv = to_device(kv, kGpu);
      gpu.attention_parts_forward(gq, gkv, heads, Tk, out, lse, {});
      gpu.attention_parts_forward(gq, gkv, heads, Tk, half_out, lse, {});
      cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
      ASSERT_EQ(out.dtype(), DType::F32);
      const std::vector<double> got = to_double_vector(out), want_v = to_double_vector(want);
      const std::vector<double> rounded = to_double_vector(half_out);
      double err = 0, rounded_err = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, std::abs(got[i] - want_v[i]));
        rounded_err = std::max(rounded_err, std::abs(rounded[i] - want_v[i]));
      }
      EXPECT_LT(err, 2e-3);
      EXPECT_LT(err, rounded_err);  // the f32 output skips the half rounding
    }
  }
  // Another output dtype is named.
  try {
    Tensor out = empty({1, 4, 8}, DType::F16, kGpu), lse = empty({1, 2, 4}, DType::F32, kGpu);
    gpu.attention_parts_forward(to_device(randn({1, 4, 8}, 3, 1, 1.0, DType::BF16), kGpu),
                                to_device(randn({1, 6, 8}, 3, 2, 1.0, DType::BF16), kGpu),
                                AttentionHeads{2, 1}, 6, out, lse, {});
    ADD_FAILURE() << "an f16 output was taken for bf16 queries";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("f16 for bf16 queries"), std::string::npos) << e.what();
  }
}

// Backend::attention_merge (ring attention's fold) against the CPU's: f32
// accumulators and log-sum-exps, parts in each type, with rows where
// either side saw no key (-inf).
TEST(CudaKernels, AttentionMergeMatchesTheCpu) {
  const int64_t B = 2, Tq = 37, NH = 3, D = 40;
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor out = randn({B, Tq, NH * D}, 23, 1, 1.0, DType::F32);
    const Tensor part = randn({B, Tq, NH * D}, 23, 2, 1.0, dtype);
    std::vector<double> a = to_double_vector(randn({B, NH, Tq}, 23, 3, 2.0, DType::F32));
    std::vector<double> c = to_double_vector(randn({B, NH, Tq}, 23, 4, 2.0, DType::F32));
    const double inf = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < a.size(); i += 7) a[i] = -inf;
    for (size_t i = 3; i < c.size(); i += 5) c[i] = -inf;
    const Tensor lse = cast(from_vector(a, {B, NH, Tq}), DType::F32);
    const Tensor part_lse = cast(from_vector(c, {B, NH, Tq}), DType::F32);
    Tensor cpu_out = clone(out), cpu_lse = clone(lse);
    backend_for(DeviceType::CPU).attention_merge(cpu_out, cpu_lse, part, part_lse);
    Tensor gpu_out = to_device(out, kGpu), gpu_lse = to_device(lse, kGpu);
    backend_for(DeviceType::CUDA)
        .attention_merge(gpu_out, gpu_lse, to_device(part, kGpu), to_device(part_lse, kGpu));
    expect_close(to_double_vector(gpu_out), to_double_vector(cpu_out), 1e-5, 1e-6, "out");
    const std::vector<double> got = to_double_vector(gpu_lse), want = to_double_vector(cpu_lse);
    int unseen = 0;  // rows neither side saw a key of
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isinf(want[i])) {
        EXPECT_EQ(got[i], want[i]) << i;
        ++unseen;
      } else {
        EXPECT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << i;
      }
    }
    EXPECT_GT(unseen, 0);
  }
}

// Gemma 2's logit soft-capping (scores cap * tanh(s / cap)): SIMT and
// tensor cores against the CPU, with scores the size of the cap (inputs of
// stddev 2, cap 3) so the forward's capped softmax and the backward's
// 1 - (z / cap)^2 both matter; grouped heads, and a window over packed
// documents. cuDNN's graph has no cap and says so.
TEST(CudaKernels, AttentionWithLogitSoftCapping) {
  struct Case {
    int64_t B, T, C, NH, NKV, window;
  };
  for (const Case& k : {Case{2, 130, 128, 4, 2, 0}, Case{1, 150, 128, 2, 1, 40}}) {
    const AttentionHeads heads = AttentionHeads{k.NH, k.NKV}.with_softcap(3.0);
    Tensor starts;
    if (k.window > 0) {
      std::vector<int64_t> ids(static_cast<size_t>(k.B * k.T), 5);
      ids[99] = 0;
      const Tensor docs = nn::document_layout(from_vector(ids, {k.B, k.T}), 0).starts;
      starts = nn::sliding_window_starts(k.B, k.T, k.window, docs);
    }
    const std::string name = "softcap_B" + std::to_string(k.B) + "_T" + std::to_string(k.T) +
                             "_NH" + std::to_string(k.NH) + "_KV" + std::to_string(k.NKV) +
                             "_window" + std::to_string(k.window);
    expect_own_kernels_match_cpu(qkv_attention_case(name, k.B, k.T, k.C, heads, starts, 11, 2.0),
                                 k.T, k.C, heads);
  }
  EXPECT_NE(cuda::attention_kernel_unavailable(cuda::AttentionKernel::Cudnn, DType::BF16, 64, 128,
                                               AttentionHeads{2}.with_softcap(50.0))
                .find("soft-capping"),
            std::string::npos);
}

// soft_cap's kernels in each layout they take: contiguous in 16-byte packs
// (with a tail), a view one element past a boundary (element by element),
// and a padded matrix's rows, in place (the fused head + loss); f64 too.
TEST(CudaKernels, SoftCapInEveryLayout) {
  const std::vector<testing::OpCase> cases = {
      {"soft_cap_packs",
       [](DType d) {
         return std::vector<Tensor>{randn({7, 151}, 3, 1, 3.0, d)};
       },
       [](const std::vector<Tensor>& x) { return soft_cap(x[0], 2.0); }},
      {"soft_cap_misaligned",
       [](DType d) {
         return std::vector<Tensor>{randn({7, 151}, 3, 2, 3.0, d)};
       },
       [](const std::vector<Tensor>& x) { return soft_cap(misaligned(x[0]), 2.0); }},
      {"linear_cross_entropy_softcap_rows",
       [](DType d) {
         return std::vector<Tensor>{randn({3, 40, 16}, 3, 3, 1.0, d),
                                    randn({301, 16}, 3, 4, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) {
         std::vector<int64_t> t(120);
         for (int64_t i = 0; i < 120; ++i) t[i] = (i * 37) % 301;
         return linear_cross_entropy(x[0], x[1], to_device(from_vector(t, {3, 40}), x[0].device()),
                                     -100, 1.5);
       }}};
  for (const testing::OpCase& c : cases) {
    for (DType dtype : {DType::F64, DType::F32, DType::BF16}) {
      if (dtype == DType::F64 && c.name.rfind("linear", 0) == 0) continue;  // f32/bf16/f16 only
      SCOPED_TRACE(c.name + " " + dtype_name(dtype));
      const CaseResult cpu = run_case(c, dtype, Device::cpu());
      const CaseResult gpu = run_case(c, dtype, kGpu);
      const Tolerance t = dtype == DType::F64 ? Tolerance{1e-12, 1e-12} : tolerance(dtype);
      expect_close(gpu.out, cpu.out, t.rtol, t.atol, "output");
      for (size_t i = 0; i < cpu.grads.size(); ++i)
        expect_close(gpu.grads[i], cpu.grads[i], 4 * t.rtol, 4 * t.atol, "gradient");
    }
  }
}

// Packed documents (doc_starts): row 0 holds documents [0, 37), [37, 64),
// [64, 100), [100, 131), [131, T - 1) and a last one-token document, so
// boundaries fall inside the kernels' tiles, on a 64-row boundary and on the
// last row; row 1 is one document. And documents long enough that the tensor
// cores' tiles of 64 keys lie wholly inside one ([0, 101), [101, 201),
// [201, 320)), with a warp's 16 rows across the boundary at 201: its rows
// before it see keys 128-191 and its rows after it do not, so the tile is
// masked for the warp (whole tiles skip the mask). SIMT and tensor cores
// against the CPU; cuDNN's graph has no such mask and says so.
TEST(CudaKernels, AttentionOverPackedDocuments) {
  struct Shape {
    int64_t B, T, C, NH;
    std::vector<int64_t> ends;  // the end tokens' positions in the flat ids
  };
  for (const Shape& sh :
       {Shape{2, 200, 128, 2, {36, 63, 99, 130, 198}},
        Shape{2, 150, 256, 2, {36, 63, 99, 130, 148}}, Shape{1, 320, 128, 2, {100, 200}}}) {
    std::vector<int64_t> ids(static_cast<size_t>(sh.B * sh.T), 5);
    for (int64_t end : sh.ends) ids[static_cast<size_t>(end)] = 0;
    const Tensor starts = nn::document_layout(from_vector(ids, {sh.B, sh.T}), 0).starts;
    testing::OpCase c = attention_case(sh.B, sh.T, sh.C, sh.NH);
    c.name += "_documents";
    c.fn = [starts, NH = sh.NH](const std::vector<Tensor>& x) {
      return causal_attention(x[0], NH, starts);
    };
    expect_own_kernels_match_cpu(c, sh.T, sh.C, sh.NH);
  }
  cuda::set_attention_kernel(cuda::AttentionKernel::Cudnn);
  try {
    causal_attention(to_device(randn({1, 8, 192}, 1, 1, 1.0, DType::BF16), kGpu), 2,
                     from_vector(std::vector<int64_t>{0, 0, 0, 3, 3, 3, 3, 3}, {1, 8}, DType::I32));
    ADD_FAILURE() << "expected NotSupportedError";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("no document mask"), std::string::npos) << e.what();
  }
  cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
}

// Decoding's attention over a key/value cache (cached_attention's kernel)
// against the CPU in f32, bf16 and f16: one and several new tokens, grouped
// and multi-query heads, head dims below, at and between multiples of 32 up
// to 256, caches longer than the slots attended over (strided rows),
// sliding windows, left-padded rows (one whose first new query sits in its
// padding) and soft-capping; one chunk of keys per query and several (long
// caches: 3 and 8 chunks, some wholly outside a window), rows read in
// 16-byte packs and one element at a time (D 20 in bf16); more keys than a
// block's lanes, and fewer, so some warps see none.
TEST(CudaKernels, CachedAttentionMatchesTheCpu) {
  struct Case {
    int64_t B, n, NH, NKV, D, capacity, length, window;
    std::vector<int64_t> text;
    double softcap;
  };
  const std::vector<Case> cases = {
      {2, 1, 4, 4, 64, 80, 70, 0, {}, 0.0},       {3, 2, 4, 2, 96, 50, 41, 0, {0, 7, 40}, 0.0},
      {1, 3, 2, 1, 256, 40, 40, 0, {}, 0.0},      {2, 1, 2, 2, 8, 300, 257, 33, {0, 100}, 0.0},
      {2, 1, 4, 1, 128, 20, 3, 0, {}, 5.0},       {2, 2, 2, 2, 48, 64, 60, 20, {5, 0}, 3.0},
      {1, 1, 12, 12, 64, 1024, 1000, 0, {}, 0.0}, {1, 1, 2, 2, 20, 310, 300, 0, {}, 0.0}};
  autograd::NoGradGuard no_grad;
  for (size_t at = 0; at < cases.size(); ++at) {
    const Case& c = cases[at];
    const AttentionHeads heads = AttentionHeads{c.NH, c.NKV}.with_softcap(c.softcap);
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE("case " + std::to_string(at) + " " + dtype_name(dtype));
      const Tensor qkv = randn({c.B, c.n, (c.NH + 2 * c.NKV) * c.D}, 20 + at, 1, 1.5, dtype);
      const Tensor kc = randn({c.B, c.NKV, c.capacity, c.D}, 30 + at, 1, 1.0, dtype);
      const Tensor vc = randn({c.B, c.NKV, c.capacity, c.D}, 40 + at, 1, 1.0, dtype);
      const Tensor text = c.text.empty() ? Tensor() : from_vector(c.text, {c.B}, DType::I32);
      const auto want =
          to_double_vector(cached_attention(qkv, kc, vc, c.length, heads, c.window, text));
      const auto got = to_double_vector(
          cached_attention(to_device(qkv, kGpu), to_device(kc, kGpu), to_device(vc, kGpu), c.length,
                           heads, c.window, text.defined() ? to_device(text, kGpu) : text));
      const Tolerance t = tolerance(dtype);
      expect_close(got, want, t.rtol, t.atol, "output");
    }
  }
}

// The new tokens' keys and values go into their slots in one launch, the
// other slots untouched, as on the CPU (bit for bit: a copy).
TEST(CudaKernels, WriteKvCacheMatchesTheCpu) {
  autograd::NoGradGuard no_grad;
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor qkv = randn({3, 2, (4 + 2 * 2) * 24}, 5, 1, 1.0, dtype);
    Tensor kc = randn({3, 2, 10, 24}, 6, 1, 1.0, dtype),
           vc = randn({3, 2, 10, 24}, 7, 1, 1.0, dtype);
    Tensor gk = to_device(kc, kGpu), gv = to_device(vc, kGpu);
    write_kv_cache(qkv, AttentionHeads{4, 2}, 5, kc, vc);
    write_kv_cache(to_device(qkv, kGpu), AttentionHeads{4, 2}, 5, gk, gv);
    EXPECT_EQ(to_double_vector(gk), to_double_vector(kc));
    EXPECT_EQ(to_double_vector(gv), to_double_vector(vc));
  }
}

// Scores that rise along the keys: every query shares a direction u with the
// keys, scaled by t / 48, so a query's scores climb by about 10 per 64-key
// tile. The tensor-core forward keeps each row's softmax relative to a
// maximum it moves only when a tile beats it by more than its slack (8):
// here the rows move on most tiles, which random inputs (their scores within
// a few units of each other) almost never make them do.
TEST(CudaKernels, AttentionWithScoresRisingAlongTheKeys) {
  const int64_t B = 2, T = 200, C = 128, NH = 2;
  testing::OpCase c{"attention_rising_scores",
                    [=](DType d) {
                      std::mt19937 rng(11);
                      std::normal_distribution<double> normal;
                      std::vector<double> u(C), v(B * T * 3 * C);
                      for (double& x : u) x = normal(rng);
                      for (int64_t b = 0; b < B; ++b) {
                        for (int64_t t = 0; t < T; ++t) {
                          double* row = v.data() + (b * T + t) * 3 * C;
                          for (int64_t i = 0; i < C; ++i) {
                            row[i] = u[i] + 0.5 * normal(rng);                 // q
                            row[C + i] = t / 48.0 * u[i] + 0.5 * normal(rng);  // k
                            row[2 * C + i] = normal(rng);                      // v
                          }
                        }
                      }
                      return std::vector<Tensor>{from_vector(v, {B, T, 3 * C}, d)};
                    },
                    [=](const std::vector<Tensor>& x) { return causal_attention(x[0], NH); }};
  expect_attention_matches_cpu(c, T, C, NH);
}

TEST(CudaKernels, RowKernelsAtModelWidths) {
  const std::vector<testing::OpCase> cases = {
      {"layer_norm_N333_C768",
       [](DType d) {
         return std::vector<Tensor>{randn({333, 768}, 7, 1, 2.0, d), randn({768}, 7, 2, 1.0, d),
                                    randn({768}, 7, 3, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) { return layer_norm(x[0], x[1], x[2]); }},
      {"add_layer_norm_N333_C768",  // the fused residual add, both outputs used
       [](DType d) {
         return std::vector<Tensor>{randn({333, 768}, 7, 1, 2.0, d),
                                    randn({333, 768}, 7, 4, 1.0, d), randn({768}, 7, 2, 1.0, d),
                                    randn({768}, 7, 3, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) {
         const AddNorm o = add_layer_norm(x[0], x[1], x[2], x[3]);
         return add(o.sum, o.norm);
       }},
      {"layer_norm_N40_C2048",  // wider than the fused backward takes: three launches
       [](DType d) {
         return std::vector<Tensor>{randn({40, 2048}, 7, 1, 2.0, d), randn({2048}, 7, 2, 1.0, d),
                                    randn({2048}, 7, 3, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) { return layer_norm(x[0], x[1], x[2]); }},
      {"add_layer_norm_N2100_C40",  // more rows than the fused backward's warps
       [](DType d) {
         return std::vector<Tensor>{randn({2100, 40}, 7, 1, 2.0, d),
                                    randn({2100, 40}, 7, 4, 1.0, d), randn({40}, 7, 2, 1.0, d),
                                    randn({40}, 7, 3, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) {
         const AddNorm o = add_layer_norm(x[0], x[1], x[2], x[3]);
         return add(o.sum, o.norm);
       }},
      {"rms_norm_N333_C768",
       [](DType d) {
         return std::vector<Tensor>{randn({333, 768}, 7, 1, 2.0, d), randn({768}, 7, 2, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) { return rms_norm(x[0], x[1]); }},
      {"add_rms_norm_N2100_C40",  // more rows than the fused backward's warps
       [](DType d) {
         return std::vector<Tensor>{randn({2100, 40}, 7, 1, 2.0, d),
                                    randn({2100, 40}, 7, 4, 1.0, d), randn({40}, 7, 2, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) {
         const AddNorm o = add_rms_norm(x[0], x[1], x[2]);
         return add(o.sum, o.norm);
       }},
      {"add_rms_norm_N40_C4096",  // LLaMA 7B's width: three launches
       [](DType d) {
         return std::vector<Tensor>{randn({40, 4096}, 7, 1, 2.0, d),
                                    randn({40, 4096}, 7, 4, 1.0, d), randn({4096}, 7, 2, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) {
         const AddNorm o = add_rms_norm(x[0], x[1], x[2]);
         return add(o.sum, o.norm);
       }},
      {"softmax_N5_C1000",  // a warp per row, 32 columns a lane
       [](DType d) {
         return std::vector<Tensor>{randn({5, 1000}, 7, 1, 3.0, d)};
       },
       [](const std::vector<Tensor>& x) { return softmax(x[0]); }},
      {"relu2_N33_C40",  // model.activation relu2: a clamp and a product
       [](DType d) {
         return std::vector<Tensor>{randn({33, 40}, 7, 1, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) {
         return nn::unfused_activation(nn::Activation::Relu2, x[0]);
       }},
      {"softmax_N2101_C8",  // a router's rows: eight warps a block, the last block short
       [](DType d) {
         return std::vector<Tensor>{randn({2101, 8}, 7, 1, 3.0, d)};
       },
       [](const std::vector<Tensor>& x) { return softmax(x[0]); }},
      {"softmax_N3_C5000",  // past a warp's rows: a block per row
       [](DType d) {
         return std::vector<Tensor>{randn({3, 5000}, 7, 1, 3.0, d)};
       },
       [](const std::vector<Tensor>& x) { return softmax(x[0]); }},
      {"cross_entropy_N7_V50257",
       [](DType d) {
         return std::vector<Tensor>{randn({7, 50257}, 7, 1, 2.0, d)};
       },
       [](const std::vector<Tensor>& x) {
         return cross_entropy(
             x[0], to_device(from_vector(std::vector<int64_t>{0, 50256, 17, -100, 3, 3, 4096}, {7},
                                         DType::I64),
                             x[0].device()));
       }},
      {"matmul_batched_odd",
       [](DType d) {
         return std::vector<Tensor>{randn({3, 17, 33}, 7, 1, 1.0, d),
                                    randn({3, 33, 9}, 7, 2, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }},
      {"linear_fold_odd",
       [](DType d) {
         return std::vector<Tensor>{randn({4, 31, 40}, 7, 1, 1.0, d), randn({23, 40}, 7, 2, 1.0, d),
                                    randn({23}, 7, 3, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); }},
      {"linear_gelu_mlp_N257_768x3072",  // the bias + GELU epilogue at GPT-2 width
       [](DType d) {
         return std::vector<Tensor>{randn({257, 768}, 7, 1, 1.0, d),
                                    randn({3072, 768}, 7, 2, 0.05, d), randn({3072}, 7, 3, 0.5, d)};
       },
       [](const std::vector<Tensor>& x) { return linear_gelu(x[0], x[1], x[2]); }},
      {"mlp_fused_both_sides_N257_768",  // GELU + bias forward, DGELU backward epilogues
       [](DType d) {
         return std::vector<Tensor>{randn({257, 768}, 7, 1, 1.0, d),
                                    randn({3072, 768}, 7, 2, 0.05, d), randn({3072}, 7, 3, 0.5, d),
                                    randn({768, 3072}, 7, 4, 0.05, d), randn({768}, 7, 5, 0.5, d)};
       },
       [](const std::vector<Tensor>& x) {
         return linear_after_gelu(linear_gelu_parts(x[0], x[1], x[2]), x[3], x[4]);
       }},
      {"linear_gelu_nobias_N257_768x3072",  // a bias-free layer's GELU epilogue (GELU_AUX)
       [](DType d) {
         return std::vector<Tensor>{randn({257, 768}, 7, 1, 1.0, d),
                                    randn({3072, 768}, 7, 2, 0.05, d)};
       },
       [](const std::vector<Tensor>& x) { return linear_gelu(x[0], x[1]); }},
      {"linear_gelu_odd_features",  // 23 outputs: the epilogue's aux ld is not a multiple of 8
       [](DType d) {
         return std::vector<Tensor>{randn({31, 40}, 7, 1, 1.0, d), randn({23, 40}, 7, 2, 1.0, d),
                                    randn({23}, 7, 3, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) { return linear_gelu(x[0], x[1], x[2]); }},
      {"sum_columns_N20000_C77",  // a bias gradient: the two-stage column sum
       [](DType d) {
         return std::vector<Tensor>{randn({20000, 77}, 7, 1, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) { return sum(x[0], 0); }},
      {"sum_long_row",
       [](DType d) {
         return std::vector<Tensor>{randn({3, 100003}, 7, 1, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) { return sum(x[0], 1); }},
      {"sum_short_rows_N1001_C6",  // a thread per row
       [](DType d) {
         return std::vector<Tensor>{randn({1001, 6}, 7, 1, 1.0, d)};
       },
       [](const std::vector<Tensor>& x) { return sum(x[0], 1); }},
  };
  for (const auto& c : cases) {
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(c.name + " " + dtype_name(dtype));
      const CaseResult cpu = run_case(c, dtype, Device::cpu());
      const CaseResult gpu = run_case(c, dtype, kGpu);
      const Tolerance t = tolerance(dtype);
      expect_close(gpu.out, cpu.out, t.rtol, t.atol, "output");
      for (size_t k = 0; k < cpu.grads.size(); ++k) {
        expect_close(gpu.grads[k], cpu.grads[k], 4 * t.rtol, 4 * t.atol,
                     "grad " + std::to_string(k));
      }
    }
  }
}

// cuda::GemmSettings to try: the default, and each switch turned alone.
constexpr const char* kHalfReductions = "gemm with half-precision split-k reductions";
struct GemmVariant {
  std::string name;
  cuda::GemmSettings settings;
};
// (The default adds split-k partials in f32; the half-precision reductions
// are the switch turned on.)
std::vector<GemmVariant> gemm_variants() {
  cuda::GemmSettings no_epilogues, gelu_apart, half_reductions, f32_products;
  no_epilogues.epilogues = false;
  gelu_apart.gelu_epilogue = false;
  half_reductions.half_reduced_precision_reduction = true;
  f32_products.half_products = false;
  return {{"gemm default", {}},
          {"gemm without epilogues", no_epilogues},
          {"gemm with GELU apart", gelu_apart},
          {kHalfReductions, half_reductions},
          {"gemm with half products in f32", f32_products}};
}
// Puts the GEMM settings back as they were, however the test ends.
struct GemmSettingsScope {
  cuda::GemmSettings saved = cuda::gemm_settings();
  ~GemmSettingsScope() { cuda::set_gemm_settings(saved); }
};
// The default GEMM settings but for GemmSettings::bias_grad_epilogue; the
// path's name, for a trace.
const char* use_bias_grad_epilogue(bool epilogue) {
  cuda::GemmSettings settings;
  settings.bias_grad_epilogue = epilogue;
  cuda::set_gemm_settings(settings);
  return epilogue ? "bias-gradient epilogue" : "column sums";
}

// One GPT-2 124M micro-batch's GEMMs at their training shapes (4 x 1024
// tokens; on the simulator 64): the attention's qkv and output projections,
// the MLP with its bias + GELU and GELU-derivative epilogues, and the tied
// head with its loss over 50257 classes in padded rows, forward and every
// gradient (the weight gradients sum over all tokens: cuBLASLt's
// split-k algorithms, which the small cases never reach). bf16 on the GPU
// against bf16 on the CPU, over the whole tensor, in every GemmVariant.
TEST(CudaKernels, Gpt2TrainingGemmsMatchTheCpu) {
  const int64_t N = kOnSimulator ? 64 : 4096, C = 768, V = kOnSimulator ? 1001 : 50257;
  std::vector<int64_t> labels(static_cast<size_t>(N));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 7919) % V);
  const Tensor targets = from_vector(labels, {N}, DType::I64);
  const std::vector<testing::OpCase> cases = {
      {"qkv",
       [&](DType d) {
         return std::vector<Tensor>{randn({N, C}, 11, 1, 1.0, d), randn({3 * C, C}, 11, 2, 0.02, d),
                                    randn({3 * C}, 11, 3, 0.1, d)};
       },
       [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); }},
      {"attn_proj",
       [&](DType d) {
         return std::vector<Tensor>{randn({N, C}, 14, 1, 1.0, d), randn({C, C}, 14, 2, 0.02, d),
                                    randn({C}, 14, 3, 0.1, d)};
       },
       [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); }},
      {"mlp",
       [&](DType d) {
         return std::vector<Tensor>{randn({N, C}, 12, 1, 1.0, d), randn({4 * C, C}, 12, 2, 0.02, d),
                                    randn({4 * C}, 12, 3, 0.1, d),
                                    randn({C, 4 * C}, 12, 4, 0.02, d), randn({C}, 12, 5, 0.1, d)};
       },
       [](const std::vector<Tensor>& x) {
         return linear_after_gelu(linear_gelu_parts(x[0], x[1], x[2]), x[3], x[4]);
       }},
      {"head_loss",
       [&](DType d) {
         return std::vector<Tensor>{randn({N, C}, 13, 1, 1.0, d), randn({V, C}, 13, 2, 0.02, d)};
       },
       [&](const std::vector<Tensor>& x) {
         return linear_cross_entropy(x[0], x[1], to_device(targets, x[0].device()));
       }},
  };
  std::vector<CaseResult> cpu;
  for (const auto& c : cases) cpu.push_back(run_case(c, DType::BF16, Device::cpu()));
  // With cuBLASLt's liberties (the default), and with each of them taken
  // away (cuda::GemmSettings): if only some of these fail on a GPU, the
  // ones that pass name what goes wrong.
  // Every product is also checked against the reference kernel
  // (cuda::GemmSettings::verify), which names any that is wrong (on the
  // simulator, where the reference is slow, in the default variant only).
  const GemmSettingsScope restore;
  for (GemmVariant v : gemm_variants()) {
    SCOPED_TRACE(v.name);
    v.settings.verify = !kOnSimulator || v.name == "gemm default";
    cuda::set_gemm_settings(v.settings);
    cuda::reset_gemm_verification();
#ifdef TRIAD_CUDA_SIM
    testing::mock_cublaslt::reset();
#endif
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE(cases[i].name);
      const CaseResult gpu = run_case(cases[i], DType::BF16, kGpu);
      // bf16 rounds each result to 8 bits (relative 2^-9); the two devices
      // sum in different orders and round at different points.
      EXPECT_LT(relative_error(gpu.out, cpu[i].out), 1e-2) << "output";
      ASSERT_EQ(gpu.grads.size(), cpu[i].grads.size());
      std::string errors = "output " + std::to_string(relative_error(gpu.out, cpu[i].out));
      for (size_t k = 0; k < cpu[i].grads.size(); ++k) {
        const double e = relative_error(gpu.grads[k], cpu[i].grads[k]);
        EXPECT_LT(e, 2e-2) << "gradient " << k;
        errors += ", gradient " + std::to_string(k) + " " + std::to_string(e);
      }
      std::printf("[ note ] %s, %s: relative errors %s\n", v.name.c_str(), cases[i].name.c_str(),
                  errors.c_str());
    }
    const cuda::GemmVerification checked = cuda::gemm_verification();
    if (v.settings.verify)
      std::printf(
          "[ note ] %s: %lld products verified, %lld failed%s%s; nearest its tolerance %.3g "
          "of %.3g (%s)\n",
          v.name.c_str(), static_cast<long long>(checked.checked),
          static_cast<long long>(checked.failed), checked.failures.empty() ? "" : ", first: ",
          checked.failures.empty() ? "" : checked.failures[0].problem.c_str(),
          checked.worst.relative_error, checked.worst.tolerance, checked.worst.problem.c_str());
    EXPECT_EQ(checked.checked > 0, v.settings.verify);
    EXPECT_EQ(checked.failed, 0);
#ifdef TRIAD_CUDA_SIM
    // Each switch does what it says to the calls cuBLASLt sees.
    const testing::mock_cublaslt::Counters n = testing::mock_cublaslt::counters();
    EXPECT_EQ(n.epilogue_matmuls > 0, v.settings.epilogues && v.settings.half_products);
    EXPECT_EQ(n.gelu_matmuls > 0,
              v.settings.epilogues && v.settings.half_products && v.settings.gelu_epilogue);
    EXPECT_EQ(n.half_matmuls > 0, v.settings.half_products);
    // (Only a half-precision output has a reduction to restrict.)
    EXPECT_EQ(n.compute_type_reduction_queries > 0,
              !v.settings.half_reduced_precision_reduction && v.settings.half_products);
#endif
  }
}

// cuda::GemmSettings::verify: every product the backend runs (plain,
// transposed, batched, bias, bias + GELU with its kept input, GELU's
// derivative, bf16 into an f32 accumulation) is checked against the
// reference kernel and agrees with it; f64 products are counted as
// unchecked. On the simulator a product made wrong by 3% (or NaN) is
// caught and named.
TEST(CudaKernels, VerifiedGemmsAgreeWithTheReference) {
  const GemmSettingsScope restore;
  cuda::GemmSettings settings;
  settings.verify = true;
  cuda::set_gemm_settings(settings);
  std::vector<testing::OpCase> cases;
  for (const testing::OpCase& c : testing::op_cases()) {
    if (c.name.rfind("matmul", 0) == 0 || c.name.rfind("linear", 0) == 0 ||
        c.name.rfind("mlp", 0) == 0)
      cases.push_back(c);
  }
  ASSERT_GE(cases.size(), 6u);
  auto run_all = [&] {
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      for (const testing::OpCase& c : cases) run_case(c, dtype, kGpu);
    }
    // A bf16 weight gradient added into an f32 gradient (beta 1).
    const Tensor dy = to_device(randn({48, 24}, 21, 1, 1.0, DType::BF16), kGpu);
    const Tensor x = to_device(randn({48, 40}, 21, 2, 1.0, DType::BF16), kGpu);
    Tensor acc = to_device(randn({24, 40}, 21, 3), kGpu);
    backend_for(DeviceType::CUDA).gemm(dy, x, acc, true, false, 1.0, 1.0);
  };
  cuda::reset_gemm_verification();
  run_all();
  cuda::GemmVerification v = cuda::gemm_verification();
  EXPECT_GT(v.checked, 3 * static_cast<int64_t>(cases.size()));
  EXPECT_EQ(v.unchecked, 0);
  EXPECT_EQ(v.failed, 0) << (v.failures.empty() ? "" : v.failures[0].problem);
  EXPECT_FALSE(v.worst.problem.empty());
  EXPECT_LE(v.worst.relative_error, v.worst.tolerance) << v.worst.problem;
  std::printf("[ note ] verified %lld products; nearest its tolerance: %.3g of %.3g (%s)\n",
              static_cast<long long>(v.checked), v.worst.relative_error, v.worst.tolerance,
              v.worst.problem.c_str());
  // An f16 product past f16's range overflows (to infinity, or saturated
  // at 65504), as it should.
  Tensor big = empty({4, 4}, DType::F16, kGpu);
  backend_for(DeviceType::CUDA)
      .gemm(full({4, 8}, 300.0, DType::F16, kGpu), full({8, 4}, 300.0, DType::F16, kGpu), big,
            false, false, 1.0, 0.0);
  const double overflowed = to_double_vector(big)[0];
  EXPECT_TRUE(std::isinf(overflowed) || overflowed == 65504.0) << overflowed;
  EXPECT_EQ(cuda::gemm_verification().failed, 0);
  // f64 products run unchecked.
  Tensor c64 = empty({5, 3}, DType::F64, kGpu);
  backend_for(DeviceType::CUDA)
      .gemm(to_device(randn({5, 4}, 22, 1, 1.0, DType::F64), kGpu),
            to_device(randn({4, 3}, 22, 2, 1.0, DType::F64), kGpu), c64, false, false, 1.0, 0.0);
  EXPECT_EQ(cuda::gemm_verification().unchecked, 1);
  // Without verify nothing is recorded.
  cuda::set_gemm_settings({});
  cuda::reset_gemm_verification();
  run_case(cases[0], DType::F32, kGpu);
  EXPECT_EQ(cuda::gemm_verification().checked, 0);
#ifdef TRIAD_CUDA_SIM
  // A wrong product is caught, named, and recorded once per problem.
  cuda::set_gemm_settings(settings);
  for (double factor : {1.03, std::nan("")}) {
    SCOPED_TRACE(factor);
    cuda::reset_gemm_verification();
    testing::mock_cublaslt::set_output_factor(factor);
    run_all();
    run_all();
    testing::mock_cublaslt::reset();
    v = cuda::gemm_verification();
    // (After a NaN product, products of its NaN outputs have NaN references:
    // those are not the product's fault and pass.)
    if (factor == factor) {
      EXPECT_EQ(v.failed, v.checked);
    }
    ASSERT_FALSE(v.failures.empty());
    // Each problem ran at least twice and is listed once.
    EXPECT_GE(v.failed, 2 * static_cast<int64_t>(v.failures.size()));
    for (size_t i = 0; i < v.failures.size(); ++i)
      for (size_t j = 0; j < i; ++j) EXPECT_NE(v.failures[i].problem, v.failures[j].problem);
    const cuda::GemmCheck& f = v.failures[0];
    EXPECT_TRUE(f.failed());
    EXPECT_NE(f.problem.find("m "), std::string::npos) << f.problem;
    EXPECT_NE(f.problem.find("epilogue"), std::string::npos) << f.problem;
    if (factor == factor) {
      EXPECT_NEAR(f.relative_error, 0.03, 0.01) << f.problem;
      EXPECT_EQ(f.nonfinite, 0);
    } else {
      EXPECT_GT(f.nonfinite, 0);
    }
  }
#endif
}

// The memory-bound kernels move 16 bytes per access where the data allows
// and one element otherwise: both paths, and the elements past the last
// whole pack, give the CPU's results. (On cuda_sim the kernels are built
// with UBSan's alignment check, so a pack taken from a misaligned address
// stops the test.)
TEST(CudaKernels, PackedAndElementwisePathsMatchTheCpu) {
  using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
  // Each case's function once on the inputs as given, once with the first
  // input misaligned.
  auto both = [](const std::string& name, std::function<std::vector<Tensor>(DType)> inputs, Fn fn) {
    std::vector<testing::OpCase> out;
    out.push_back({name, inputs, fn});
    out.push_back({name + "_misaligned", inputs, [fn](const std::vector<Tensor>& x) {
                     std::vector<Tensor> y = x;
                     y[0] = misaligned(x[0]);
                     return fn(y);
                   }});
    return out;
  };
  std::vector<testing::OpCase> cases;
  auto add_cases = [&](std::vector<testing::OpCase> c) {
    cases.insert(cases.end(), c.begin(), c.end());
  };
  // 8 | C, 4 | C, neither; and wider than the fused LayerNorm backward takes.
  for (int64_t C : {int64_t{768}, int64_t{36}, int64_t{41}, int64_t{2056}}) {
    const std::string w = std::to_string(C);
    add_cases(both(
        "layer_norm_C" + w,
        [C](DType d) {
          return std::vector<Tensor>{randn({37, C}, 9, 1, 2.0, d), randn({C}, 9, 2, 1.0, d),
                                     randn({C}, 9, 3, 1.0, d)};
        },
        [](const std::vector<Tensor>& x) { return layer_norm(x[0], x[1], x[2]); }));
    add_cases(both(
        "add_layer_norm_C" + w,
        [C](DType d) {
          return std::vector<Tensor>{randn({37, C}, 9, 4, 1.0, d), randn({37, C}, 9, 1, 2.0, d),
                                     randn({C}, 9, 2, 1.0, d), randn({C}, 9, 3, 1.0, d)};
        },
        [](const std::vector<Tensor>& x) {
          const AddNorm o = add_layer_norm(x[1], x[0], x[2], x[3]);
          return add(o.sum, o.norm);
        }));
    add_cases(both(
        "rms_norm_C" + w,
        [C](DType d) {
          return std::vector<Tensor>{randn({37, C}, 9, 1, 2.0, d), randn({C}, 9, 2, 1.0, d)};
        },
        [](const std::vector<Tensor>& x) { return rms_norm(x[0], x[1]); }));
    add_cases(both(
        "add_rms_norm_C" + w,
        [C](DType d) {
          return std::vector<Tensor>{randn({37, C}, 9, 4, 1.0, d), randn({37, C}, 9, 1, 2.0, d),
                                     randn({C}, 9, 2, 1.0, d)};
        },
        [](const std::vector<Tensor>& x) {
          const AddNorm o = add_rms_norm(x[1], x[0], x[2]);
          return add(o.sum, o.norm);
        }));
    add_cases(both(
        "add_bias_row_C" + w,
        [C](DType d) {
          return std::vector<Tensor>{randn({3, 5, C}, 9, 5, 1.0, d), randn({C}, 9, 6, 1.0, d)};
        },
        [](const std::vector<Tensor>& x) { return add(x[0], x[1]); }));
  }
  // LLaMA's kernels: SwiGLU's F and rotary's half head (D / 2) with packs of
  // 8 and 4, of 4 only, neither.
  for (int64_t F : {int64_t{768}, int64_t{36}, int64_t{41}}) {
    add_cases(both(
        "swiglu_F" + std::to_string(F),
        [F](DType d) {
          return std::vector<Tensor>{randn({9, 2 * F}, 9, 15, 2.0, d)};
        },
        [](const std::vector<Tensor>& x) { return swiglu(x[0]); }));
    add_cases(both(
        "geglu_F" + std::to_string(F),
        [F](DType d) {
          return std::vector<Tensor>{randn({9, 2 * F}, 9, 16, 2.0, d)};
        },
        [](const std::vector<Tensor>& x) { return geglu(x[0]); }));
  }
  for (int64_t D : {int64_t{128}, int64_t{8}, int64_t{6}}) {
    add_cases(both(
        "rotary_embedding_D" + std::to_string(D),
        [D](DType d) {
          return std::vector<Tensor>{randn({2, 11, 3 * 3 * D}, 9, 16, 1.0, d)};
        },
        [](const std::vector<Tensor>& x) { return rotary_embedding(x[0], 3, {}, 5); }));
  }
  // One head of 256 (Gemma's widest): more turned slots than the block has
  // threads, so each thread computes several slots' cos and sin.
  add_cases(both(
      "rotary_embedding_D256_one_head",
      [](DType d) {
        return std::vector<Tensor>{randn({2, 11, 3 * 256}, 9, 18, 1.0, d)};
      },
      [](const std::vector<Tensor>& x) { return rotary_embedding(x[0], 1, {}, 5); }));
  // Partial rotations: Phi-4-mini's 96 of 128 (packs over both parts) and 6
  // of 8 (a turned half no pack divides).
  for (const auto& [D, R] : {std::pair<int64_t, int64_t>{128, 96}, {8, 6}}) {
    add_cases(both(
        "rotary_embedding_D" + std::to_string(D) + "_R" + std::to_string(R),
        [D](DType d) {
          return std::vector<Tensor>{randn({2, 11, 3 * 3 * D}, 9, 17, 1.0, d)};
        },
        [R](const std::vector<Tensor>& x) {
          RopeScaling s;
          s.rotary_dim = R;
          return rotary_embedding(x[0], 3, {}, 5, 10000.0, s);
        }));
  }
  for (int64_t C : {int64_t{768}, int64_t{36}}) {  // packs of 8 and 4, of 4 only
    add_cases(both(
        "embedding_C" + std::to_string(C),
        [C](DType d) {
          return std::vector<Tensor>{randn({50, C}, 9, 14, 1.0, d)};
        },
        [](const std::vector<Tensor>& x) {
          return embedding(x[0], to_device(from_vector(std::vector<int64_t>{3, 49, 3, 0, 17, 3, 49},
                                                       {7}, DType::I64),
                                           x[0].device()));
        }));
  }
  add_cases(both(
      "sum_columns_N300_C776",  // a bias gradient: two stages, packs of columns
      [](DType d) {
        return std::vector<Tensor>{randn({300, 776}, 9, 13, 1.0, d)};
      },
      [](const std::vector<Tensor>& x) { return sum(x[0], 0); }));
  add_cases(both(
      "add_1003",  // 125 packs of 8 and 3 more (250 of 4 and 3 in f32)
      [](DType d) {
        return std::vector<Tensor>{randn({1003}, 9, 7, 1.0, d), randn({1003}, 9, 8, 1.0, d)};
      },
      [](const std::vector<Tensor>& x) { return mul(x[0], x[1]); }));
  add_cases(both(
      "gelu_1003", [](DType d) { return std::vector<Tensor>{randn({1003}, 9, 9, 2.0, d)}; },
      [](const std::vector<Tensor>& x) { return gelu(x[0]); }));
  add_cases(both(
      "gelu_erf_1003", [](DType d) { return std::vector<Tensor>{randn({1003}, 9, 9, 2.0, d)}; },
      [](const std::vector<Tensor>& x) { return gelu_erf(x[0]); }));
  add_cases(both(
      "affine_1003", [](DType d) { return std::vector<Tensor>{randn({1003}, 9, 10, 2.0, d)}; },
      [](const std::vector<Tensor>& x) { return affine(x[0], 0.75, -0.5); }));
  add_cases(both(
      "cast_to_f32_and_back_1003",
      [](DType d) { return std::vector<Tensor>{randn({1003}, 9, 11, 2.0, d)}; },
      [](const std::vector<Tensor>& x) {
        const DType other = x[0].dtype() == DType::F32 ? DType::BF16 : DType::F32;
        return cast(affine(cast(x[0], other), 2.0), x[0].dtype());
      }));
  add_cases(both(
      "cross_entropy_N5_V1001",  // rows start at every offset from a boundary
      [](DType d) {
        return std::vector<Tensor>{randn({5, 1001}, 9, 12, 2.0, d)};
      },
      [](const std::vector<Tensor>& x) {
        return cross_entropy(
            x[0],
            to_device(from_vector(std::vector<int64_t>{0, 1000, 7, -100, 999}, {5}, DType::I64),
                      x[0].device()));
      }));
  for (const auto& c : cases) {
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(c.name + " " + dtype_name(dtype));
      const CaseResult cpu = run_case(c, dtype, Device::cpu());
      const CaseResult gpu = run_case(c, dtype, kGpu);
      const Tolerance t = tolerance(dtype);
      expect_close(gpu.out, cpu.out, t.rtol, t.atol, "output");
      ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
      for (size_t k = 0; k < cpu.grads.size(); ++k) {
        expect_close(gpu.grads[k], cpu.grads[k], 4 * t.rtol, 4 * t.atol,
                     "grad " + std::to_string(k));
      }
    }
  }
}

// The same elements dropped, the kept ones scaled alike.
void expect_same_dropout(const std::vector<float>& cpu, const std::vector<float>& gpu) {
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(cpu[i] == 0.0f, gpu[i] == 0.0f) << "mask differs at " << i;
    ASSERT_NEAR(gpu[i], cpu[i], 1e-6f * std::abs(cpu[i]));
  }
}

TEST(CudaKernels, DropoutMaskIsTheCpuMaskBitForBit) {
  // A thread draws one Philox counter for four elements: offsets and
  // lengths that start and end inside a counter's four, and long ones.
  struct Case {
    int64_t n;
    uint64_t offset;
  };
  for (const Case c :
       {Case{37000, 12345}, Case{1, 0}, Case{2, 3}, Case{7, 4}, Case{5, 6}, Case{1001, 8}}) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " offset " + std::to_string(c.offset));
    Tensor x = randn({c.n}, 5, 1);
    const auto cpu = to_float_vector(dropout(x, 0.25, 11, 3, c.offset));
    const auto gpu = to_float_vector(dropout(to_device(x, kGpu), 0.25, 11, 3, c.offset));
    expect_same_dropout(cpu, gpu);
  }
}

TEST(CudaKernels, DropoutRowsOfALargerMaskAreTheCpuMaskBitForBit) {
  // Rows of a piece of a larger tensor's draws (a context-parallel chunk):
  // rows starting anywhere in a counter's four, shorter and longer than it,
  // strides that are no multiple of four, and bf16 beside f32.
  struct Case {
    int64_t rows;
    philox::Counters at;
  };
  for (const Case c : {Case{3, {5, 7, 13}}, Case{64, {1, 1, 6}}, Case{5, {2, 3, 3}},
                       Case{17, {12345, 129, 1031}}, Case{1, {6, 2, 0}}}) {
    for (const DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE("rows " + std::to_string(c.rows) + " of " + std::to_string(c.at.row_length) +
                   " at " + std::to_string(c.at.offset) + " stride " +
                   std::to_string(c.at.row_stride) + " " + dtype_name(dtype));
      Tensor x = cast(randn({c.rows, static_cast<int64_t>(c.at.row_length)}, 5, 1), dtype);
      const auto cpu = to_float_vector(dropout(x, 0.25, 11, 3, c.at));
      const auto gpu = to_float_vector(dropout(to_device(x, kGpu), 0.25, 11, 3, c.at));
      expect_same_dropout(cpu, gpu);
    }
  }
}

// The call count read by the kernel from device memory (a captured step's
// replays): the CPU's mask of the moved counters, for one run, rows of a
// larger mask and keyed rows, counts positive, zero and negative.
TEST(CudaKernels, DropoutCallCountsInDeviceMemoryAreTheCpuMaskBitForBit) {
  const Tensor keys = from_vector(std::vector<int64_t>{4, 0, 2}, {3}, DType::I64);
  for (const int64_t calls : {int64_t{5}, int64_t{0}, int64_t{-3}}) {
    for (const bool keyed : {false, true}) {
      for (const philox::Counters at :
           {philox::Counters{7, 0, 0, 45}, philox::Counters{13, 15, 21, 1000}}) {
        if (keyed && at.row_length == 0) continue;
        SCOPED_TRACE("calls " + std::to_string(calls) + (keyed ? " keyed" : "") + " rows of " +
                     std::to_string(at.row_length));
        const Tensor x = cast(randn({3, 15}, 5, 1), DType::BF16);
        const Tensor count = from_vector(std::vector<int64_t>{calls}, {}, DType::I64);
        const Tensor k = keyed ? keys : Tensor{};
        const auto cpu = to_float_vector(dropout(x, 0.25, 11, 3, at, k, count));
        const auto gpu = to_float_vector(dropout(to_device(x, kGpu), 0.25, 11, 3, at,
                                                 keyed ? to_device(keys, kGpu) : Tensor{},
                                                 to_device(count, kGpu)));
        expect_same_dropout(cpu, gpu);
        // (The count moved the draws.)
        if (calls != 0) {
          EXPECT_NE(cpu, to_float_vector(dropout(x, 0.25, 11, 3, at, k)));
        }
      }
    }
  }
}

TEST(CudaKernels, DropoutKeyedRowsAreTheCpuMaskBitForBit) {
  // Rows in any order, each drawing its key's row (a mixture's experts'
  // rows by assignment): keys far apart and repeated, rows shorter and
  // longer than a counter's four, offsets inside one (a shard's features).
  struct Case {
    std::vector<int64_t> keys;
    philox::Counters at;
  };
  for (const Case& c : {Case{{9, 0, 4, 4, 1}, {0, 7, 7}}, Case{{3, 1}, {2, 3, 9}},
                        Case{{1000003, 17, 5, 250000}, {5, 130, 131}},
                        Case{std::vector<int64_t>(33, 2), {1, 1, 1}}}) {
    for (const DType dtype : {DType::F32, DType::BF16}) {
      const auto rows = static_cast<int64_t>(c.keys.size());
      SCOPED_TRACE(std::to_string(rows) + " rows of " + std::to_string(c.at.row_length) + " " +
                   dtype_name(dtype));
      Tensor x = cast(randn({rows, static_cast<int64_t>(c.at.row_length)}, 5, 1), dtype);
      const Tensor keys = from_vector(c.keys, {rows}, DType::I64);
      const auto cpu = to_float_vector(dropout(x, 0.25, 11, 3, c.at, keys));
      const auto gpu =
          to_float_vector(dropout(to_device(x, kGpu), 0.25, 11, 3, c.at, to_device(keys, kGpu)));
      expect_same_dropout(cpu, gpu);
    }
  }
}

// The vocab-parallel cross entropy's per-row loss from its reduced
// statistics, computed on the GPU (odd row count, sums from 1 to ~1e4).
TEST(CudaKernels, VocabCrossEntropyLossMatchesTheCpu) {
  const int64_t N = 1001;
  std::vector<double> m(N), t(N), s(N);
  for (int64_t i = 0; i < N; ++i) {
    m[i] = 0.37 * static_cast<double>(i % 23) - 4.0;
    t[i] = m[i] - 0.011 * static_cast<double>(i % 97);
    s[i] = 1.0 + 9.7 * static_cast<double>((i * 7919) % 1031);
  }
  auto losses_on = [&](Device dev) {
    Tensor gm = to_device(from_vector(m, {N}, DType::F32), dev);
    Tensor tl = to_device(from_vector(t, {N}, DType::F32), dev);
    Tensor se = to_device(from_vector(s, {N}, DType::F32), dev);
    Tensor out = empty({N}, DType::F32, dev);
    backend_for(out).vocab_ce_loss(gm, tl, se, out);
    return to_double_vector(out);
  };
  const auto cpu = losses_on(Device::cpu()), gpu = losses_on(kGpu);
  for (int64_t i = 0; i < N; ++i) {
    ASSERT_NEAR(cpu[i], std::log(s[i]) + m[i] - t[i], 1e-5 * (1 + std::abs(cpu[i]))) << i;
    ASSERT_NEAR(gpu[i], cpu[i], 1e-5 * (1 + std::abs(cpu[i]))) << i;
  }
  Tensor wrong = empty({N}, DType::F32, kGpu);
  Tensor short_rows = to_device(from_vector(m, {N}, DType::F32), kGpu);
  EXPECT_THROW(
      backend_for(wrong).vocab_ce_loss(narrow(short_rows, 0, 0, 5), short_rows, short_rows, wrong),
      ValueError);
}

// A shard's row max, sum of exponentials against it and target logit in
// one pass (vocab_ce_shard_sums) against the CPU's two steps: padded rows,
// targets in the shard, before it, past it and ignored, and a shard with no
// valid column (max -inf, sum 0, target logit 0), in f32 and bf16.
TEST(CudaKernels, VocabShardSumsMatchTheCpu) {
  const int64_t N = 37, Vl = 96, ld = 128, vocab_start = 200;
  std::vector<int64_t> t;
  for (int64_t i = 0; i < N; ++i) t.push_back(i % 5 == 4 ? -100 : 150 + (i * 13) % 160);
  const Tensor targets = from_vector(t, {N}, DType::I64);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t valid : {int64_t{90}, int64_t{0}}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " valid " + std::to_string(valid));
      auto run = [&](Device dev) {
        const Tensor rows = to_device(randn({N, ld}, 8, 1, 3.0, dtype), dev);
        const Tensor logits = make_view(rows, {N, Vl}, {ld, 1}, 0);
        Tensor mx = empty({N}, DType::F32, dev), se = empty({N}, DType::F32, dev),
               tl = empty({N}, DType::F32, dev);
        backend_for(logits).vocab_ce_shard_sums(logits, to_device(targets, dev), vocab_start, valid,
                                                mx, se, tl);
        return std::vector<std::vector<double>>{to_double_vector(mx), to_double_vector(se),
                                                to_double_vector(tl)};
      };
      const auto cpu = run(Device::cpu()), gpu = run(kGpu);
      int64_t inside = 0;
      for (int64_t i = 0; i < N; ++i) {
        ASSERT_EQ(gpu[0][i], cpu[0][i]) << i;  // a max is exact
        if (valid == 0) {
          ASSERT_TRUE(std::isinf(gpu[0][i]) && gpu[0][i] < 0) << i;
          ASSERT_EQ(gpu[1][i], 0.0) << i;
        }
        ASSERT_NEAR(gpu[1][i], cpu[1][i], 1e-5 * (1 + std::abs(cpu[1][i]))) << i;
        ASSERT_EQ(gpu[2][i], cpu[2][i]) << i;
        const int64_t local = t[i] - vocab_start;
        inside += local >= 0 && local < valid;
        if (!(local >= 0 && local < valid)) {
          ASSERT_EQ(gpu[2][i], 0.0) << i;
        }
      }
      if (valid > 0) {
        EXPECT_GT(inside, 5);
      }
    }
  }
}

// The vocab-parallel backward on a shard's padded rows (the layers above
// reach it only through several ranks: a group of one runs one process's
// loss): targets in the shard, outside it and ignored, a z-loss's dlse,
// soft-capped logits, written beside the logits and over them, against the
// CPU; the padding columns get 0.
TEST(CudaKernels, VocabBackwardInPaddedRowsMatchesTheCpu) {
  const int64_t N = 29, Vl = 96, ld = 128, vocab_start = 200, valid = 90;
  std::vector<int64_t> t;
  for (int64_t i = 0; i < N; ++i) t.push_back(i % 5 == 4 ? -100 : 150 + (i * 13) % 160);
  const Tensor targets = from_vector(t, {N}, DType::I64);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (bool capped : {false, true}) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (capped ? ", capped" : "") +
                     (in_place ? ", over the logits" : ""));
        auto run = [&](Device dev) {
          Tensor rows = to_device(randn({N, ld}, 8, 1, 1.5, dtype), dev);
          Tensor logits = make_view(rows, {N, Vl}, {ld, 1}, 0);
          const double cap = capped ? 2.5 : 0.0;
          if (capped) backend_for(logits).soft_cap(logits, cap, logits);
          // The statistics a shard would have after its reductions: the max
          // over its valid columns and the sum of exponentials against it.
          const Tensor host = to_device(logits, Device::cpu());
          std::vector<double> mx(N), se(N);
          const std::vector<double> v = to_double_vector(contiguous(host));
          for (int64_t i = 0; i < N; ++i) {
            mx[i] = *std::max_element(v.begin() + i * Vl, v.begin() + i * Vl + valid);
            for (int64_t j = 0; j < valid; ++j) se[i] += std::exp(v[i * Vl + j] - mx[i]);
          }
          const Tensor gmax = from_vector(mx, {N}, DType::F32, dev),
                       sumexp = from_vector(se, {N}, DType::F32, dev),
                       dloss = to_device(randn({N}, 8, 2, 0.1, DType::F32), dev),
                       dlse = to_device(randn({N}, 8, 3, 0.05, DType::F32), dev);
          Tensor out_rows = in_place ? rows : full({N, ld}, 7.0, dtype, dev);
          Tensor dlogits = make_view(out_rows, {N, Vl}, {ld, 1}, 0);
          backend_for(logits).vocab_ce_backward(logits, to_device(targets, dev), vocab_start, valid,
                                                gmax, sumexp, dloss, dlse, dlogits, cap);
          return to_double_vector(contiguous(to_device(dlogits, Device::cpu())));
        };
        const auto cpu = run(Device::cpu()), gpu = run(kGpu);
        const double tol = dtype == DType::F32 ? 1e-6 : 1e-2;
        expect_close(gpu, cpu, tol, tol, "dlogits");
        double total = 0;
        for (int64_t i = 0; i < N; ++i) {
          for (int64_t j = valid; j < Vl; ++j) ASSERT_EQ(gpu[i * Vl + j], 0.0) << i << ", " << j;
          for (int64_t j = 0; j < valid; ++j) total += std::abs(gpu[i * Vl + j]);
        }
        EXPECT_GT(total, 0.1);
      }
    }
  }
}

// Cross entropy's row kernels launch a warp for every 32 packs of a row (16
// bytes each), up to their most (512 threads; the fused kernel's 1024), and
// a row's loss, log-sum-exp and gradient have the same bits in a block of
// any size: 300 classes (96 threads a row in f32, 64 in bf16) against the
// same 300 followed by 19700 classes at -1e30, whose exponentials are 0
// (the most threads, each with a dozen packs), through the two kernels and
// the fused one. (On a GPU this holds because a merge takes the larger
// side's sum as it is, never times the fast exp at 0.)
TEST(CudaKernels, CrossEntropyBlocksFitTheirRowsWithTheSameBits) {
  const int64_t N = 6, V = 300, wide = 20000;
  std::vector<int64_t> t;
  for (int64_t i = 0; i < N; ++i) t.push_back(i == 2 ? -100 : (i * 53 + 7) % V);
  const Tensor targets = to_device(from_vector(t, {N}, DType::I64), kGpu);
  const std::vector<double> x = to_double_vector(randn({N, V}, 23, 1, 3.0));
  std::vector<double> padded(static_cast<size_t>(N * wide), -1e30);
  for (int64_t i = 0; i < N; ++i) {
    std::copy_n(x.begin() + i * V, V, padded.begin() + i * wide);
  }
  struct Out {
    std::vector<double> losses, lse, grad;
    int64_t threads = 0;
  };
  for (DType d : {DType::F32, DType::BF16}) {
    for (bool fused : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + (fused ? ", fused" : ", two kernels"));
      auto run = [&](const std::vector<double>& values, int64_t cols) {
        const Tensor logits = to_device(from_vector(values, {N, cols}, d), kGpu);
        const Tensor dlosses = full({N}, 0.7, DType::F32, kGpu);
        Tensor losses = empty({N}, DType::F32, kGpu), lse = empty({N}, DType::F32, kGpu),
               dlogits = empty({N, cols}, d, kGpu);
        Backend& be = backend_for(DeviceType::CUDA);
        cuda::synchronize(0);
        Out out;
#ifdef TRIAD_CUDA_SIM
        const int64_t before = triad_sim::counters().threads;
#endif
        if (fused) {
          be.cross_entropy_forward_backward(logits, targets, -100, losses, lse, dlosses, dlogits,
                                            0.0);
        } else {
          be.cross_entropy_forward(logits, targets, -100, losses, lse);
          be.cross_entropy_backward(logits, targets, lse, dlosses, Tensor(), -100, dlogits, 0.0);
        }
        cuda::synchronize(0);
#ifdef TRIAD_CUDA_SIM
        out.threads = triad_sim::counters().threads - before;
#endif
        out.losses = to_double_vector(losses);
        out.lse = to_double_vector(lse);
        const std::vector<double> g = to_double_vector(dlogits);
        for (int64_t i = 0; i < N; ++i) {
          out.grad.insert(out.grad.end(), g.begin() + i * cols, g.begin() + i * cols + V);
        }
        return out;
      };
      const Out narrow = run(x, V), full_rows = run(padded, wide);
      EXPECT_EQ(narrow.losses, full_rows.losses);
      EXPECT_EQ(narrow.lse, full_rows.lse);
      EXPECT_EQ(narrow.grad, full_rows.grad);
      EXPECT_TRUE(std::isfinite(narrow.lse[0]) && narrow.losses[2] == 0.0);
      if (kOnSimulator) {
        const int64_t pack = 16 / static_cast<int64_t>(dtype_size(d));
        const int64_t warps = (V + 32 * pack - 1) / (32 * pack);  // 3 in f32, 2 in bf16
        EXPECT_EQ(narrow.threads, (fused ? 1 : 2) * N * warps * 32);
        EXPECT_EQ(full_rows.threads, N * (fused ? 1024 : 2 * 512));
      }
    }
  }
}

// The vocab-parallel head and loss on a shard whose rows the logits pad (67
// classes -> rows of 128, the last 7 classes padding) through a world of
// one (NCCL on the GPU), which holds the whole vocabulary: one process's
// cross entropy over the valid classes in row-strided logits, against the
// CPU, with a z-loss too; none of the vocab-parallel kernels run, and with
// the gradient expected (or another) it is written with the loss in one
// kernel, the padding classes given none.
TEST(CudaKernels, VocabParallelHeadLossInPaddedRowsMatchesTheCpu) {
  if (!dist::nccl_available()) GTEST_SKIP() << "built without NCCL";
  dist::ProcessGroupPtr world = dist::init_world();
  ASSERT_EQ(world->size(), 1);
  dist::ProcessGroupPtr nccl = dist::make_nccl_group(world, 0);
  std::vector<int64_t> t;
  for (int64_t i = 0; i < 24; ++i) t.push_back(i == 5 ? -100 : (i * 17 + 2) % 60);
  const Tensor targets = from_vector(t, {4, 6}, DType::I64);
  using Calls = std::map<std::string, int64_t>;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (bool with_z : {false, true}) {
      for (double expected : {0.0, 1.0, 0.5}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (with_z ? " with a z-loss" : "") +
                     ", expected gradient " + std::to_string(expected));
        auto run = [&](Device dev, const dist::ProcessGroupPtr& group, Calls* calls) {
          Tensor x = to_device(randn({4, 6, 40}, 5, 1, 1.0, dtype), dev).detach();
          Tensor w = to_device(randn({67, 40}, 5, 2, 0.3, dtype), dev).detach();
          x.set_requires_grad(true);
          w.set_requires_grad(true);
          if (calls) {
            cuda::set_op_profiling(true);
            cuda::op_profile(0);  // (clears what came before)
          }
          Tensor z;
          Tensor loss = tp::vocab_parallel_linear_cross_entropy(
              x, w, targets, 0, 60, group, 0.0, {}, {}, with_z ? &z : nullptr, expected);
          autograd::backward({with_z ? add(loss, scale(z, 0.5)) : loss});
          if (calls) {
            cuda::synchronize(0);
            for (const cuda::OpTime& op : cuda::op_profile(0)) (*calls)[op.op] = op.calls;
            cuda::set_op_profiling(false);
          }
          return std::vector<std::vector<double>>{
              to_double_vector(loss), to_double_vector(x.grad()), to_double_vector(w.grad()),
              with_z ? to_double_vector(z) : std::vector<double>{}};
        };
        Calls calls;
        const auto cpu = run(Device::cpu(), world, nullptr), gpu = run(kGpu, nccl, &calls);
        const double tol = dtype == DType::F32 ? 1e-5 : 2e-2;
        expect_close(gpu[0], cpu[0], tol, tol, "loss");
        expect_close(gpu[3], cpu[3], tol, tol, "z-loss");
        expect_close(gpu[1], cpu[1], tol, tol, "dx");
        expect_close(gpu[2], cpu[2], tol, tol, "dw");
        for (size_t i = 60 * 40; i < gpu[2].size(); ++i)
          ASSERT_EQ(gpu[2][i], 0.0) << "padding class";
        for (const char* op : {"vocab_ce_shard_sums", "vocab_ce_loss", "vocab_ce_backward"})
          EXPECT_EQ(calls[op], 0) << op;
        const bool ahead = expected != 0.0 && !with_z;
        EXPECT_EQ(calls["cross_entropy_forward_backward"], ahead ? 1 : 0);
        EXPECT_EQ(calls["cross_entropy_forward"], ahead ? 0 : 1);
        EXPECT_EQ(calls["cross_entropy_backward"], ahead ? 0 : 1);
      }
    }
  }
}

// The global norm's square over many tensors: more than one launch's worth
// of tensors (48), sizes around the 32768-element chunk,
// empty tensors, all three half/f32 types and an f64 tensor (the reference
// path, added to the kernels' sum). Against the exact sum of the values the
// tensors hold, the CPU reference, itself twice (bit for bit), and with an
// infinity or a NaN planted.
TEST(CudaKernels, SumOfSquaresOfManyTensorsMatchesTheCpu) {
  std::vector<int64_t> sizes{1,     31, 0,     32768, 32769, 70000, 5,   4097, 256,   1000, 3,
                             65536, 7,  12345, 32767, 100,   0,     999, 2,    40000, 17};
  for (int64_t i = 0; i < 40; ++i) sizes.push_back(i % 7 == 3 ? 33000 + i : 3 * i + 1);
  const std::vector<DType> types{DType::F32, DType::BF16, DType::F16};
  std::vector<Tensor> host;
  for (size_t i = 0; i < sizes.size(); ++i) {
    host.push_back(
        randn({sizes[i]}, 23, i, 0.5 + 0.1 * static_cast<double>(i % 5), types[i % types.size()]));
  }
  host.push_back(randn({321}, 23, 99, 1.0, DType::F64));
  double exact = 0;
  for (const Tensor& t : host) {
    for (double v : to_double_vector(t)) exact += v * v;
  }
  auto total_on = [&](Device dev, const std::vector<Tensor>& ts) {
    std::vector<Tensor> on;
    for (const Tensor& t : ts) on.push_back(to_device(t, dev));
    Tensor out = empty({1}, DType::F64, dev);
    backend_for(out).sum_of_squares(on, out);
    return item(out);
  };
  const double gpu = total_on(kGpu, host), cpu = total_on(Device::cpu(), host);
  EXPECT_NEAR(gpu, exact, 1e-12 * exact);
  EXPECT_NEAR(cpu, exact, 1e-5 * exact);
  EXPECT_EQ(total_on(kGpu, host), gpu);  // the same bits every run
  // Only half tensors (no reference path): still the exact sum.
  const std::vector<Tensor> halves{host[1], host[4], host[7]};
  double exact_halves = 0;
  for (const Tensor& t : halves) {
    for (double v : to_double_vector(t)) exact_halves += v * v;
  }
  EXPECT_NEAR(total_on(kGpu, halves), exact_halves, 1e-12 * exact_halves);
  EXPECT_EQ(total_on(kGpu, {}), 0.0);
  // A non-finite element anywhere shows in the total: in the first launch's
  // tensors and in the second's (the last tensor, its second chunk).
  for (auto [tensor, at] : {std::pair<size_t, size_t>{5, 40000}, {59, 33010}}) {
    ASSERT_GT(sizes[tensor], static_cast<int64_t>(at));
    for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
      std::vector<Tensor> planted = host;
      std::vector<double> v = to_double_vector(host[tensor]);
      v[at] = bad;
      planted[tensor] = from_vector(v, {sizes[tensor]}, host[tensor].dtype());
      const double got = total_on(kGpu, planted);
      if (std::isnan(bad)) {
        EXPECT_TRUE(std::isnan(got)) << got;
      } else {
        EXPECT_TRUE(std::isinf(got)) << got;
      }
    }
  }
  Tensor f32_out = empty({1}, DType::F32, kGpu);
  EXPECT_THROW(backend_for(f32_out).sum_of_squares({}, f32_out), ValueError);
}

// Packed documents' layout formed on the device (what a captured step's
// forward takes from its device batch): the host's starts, positions and
// windowed starts, for rows longer than the kernel's chunk of 256 tokens
// (a document carried across chunks), ends of document at a row's first
// and last token and back to back, i32 and i64 ids, and a row of one
// document (an end no id equals).
TEST(CudaKernels, DocumentStartsAreTheHostsLayout) {
  const int64_t B = 3, T = 700, eod = 7;
  std::vector<int64_t> ids(static_cast<size_t>(B * T));
  std::mt19937 rng(5);
  for (auto& v : ids) v = 8 + static_cast<int64_t>(rng() % 50);
  for (const int64_t at : {0, 1, 2, 255, 256, 300, 699, 700 + 511, 700 + 512, 1400 + 3}) {
    ids[static_cast<size_t>(at)] = eod;
  }
  for (const DType dtype : {DType::I64, DType::I32}) {
    for (const int64_t window : {int64_t{0}, int64_t{5}, int64_t{300}}) {
      for (const int64_t end : {eod, int64_t{-1}}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " window " + std::to_string(window) +
                     " end " + std::to_string(end));
        const Tensor host = cast(from_vector(ids, {B, T}, DType::I64), dtype);
        const nn::DocumentLayout want = nn::document_layout(host, end);
        const Tensor want_starts =
            window > 0 ? nn::sliding_window_starts(B, T, window, want.starts) : want.starts;
        const Tensor dev = to_device(host, kGpu);
        Tensor starts = empty({B, T}, DType::I32, kGpu);
        Tensor positions = empty({B, T}, DType::I64, kGpu);
        backend_for(dev).document_starts(dev, end, window, starts, &positions);
        EXPECT_EQ(to_double_vector(starts), to_double_vector(want_starts));
        EXPECT_EQ(to_double_vector(positions), to_double_vector(want.positions));
        // (The host's default, the CPU backend's, alike.)
        Tensor cpu_starts = empty({B, T}, DType::I32);
        backend_for(host).document_starts(host, end, window, cpu_starts, nullptr);
        EXPECT_EQ(to_double_vector(cpu_starts), to_double_vector(want_starts));
      }
    }
  }
  // Bad shapes and types are named, on the device and the host alike.
  const Tensor dev = to_device(from_vector(ids, {B, T}, DType::I64), kGpu);
  Tensor starts = empty({B, T}, DType::I32, kGpu);
  Tensor wide = empty({B, T}, DType::I64, kGpu);
  Backend& be = backend_for(dev);
  EXPECT_THROW(be.document_starts(dev, eod, 0, wide, nullptr), ShapeError);
  EXPECT_THROW(be.document_starts(reshape(dev, {B * T}), eod, 0, starts, nullptr), ShapeError);
  EXPECT_THROW(be.document_starts(dev, eod, 0, starts, &starts), ShapeError);
  EXPECT_THROW(be.document_starts(dev, eod, -1, starts, nullptr), ValueError);
  Tensor host_starts = empty({B, 2}, DType::I32);
  EXPECT_THROW(
      backend_for(host_starts)
          .document_starts(from_vector(ids, {B, T}, DType::I64), eod, 0, host_starts, nullptr),
      ShapeError);
}

TEST(CudaKernels, EmbeddingBackwardIsDeterministicAndEqualsTheCpuSum) {
  // Many repeats of few ids: the fixed summation order makes f32 bit-equal.
  std::vector<int64_t> ids(4096);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7919) % 13);
  Tensor id = from_vector(ids, {4096}, DType::I64);
  auto grad_on = [&](Device dev) {
    Tensor w = to_device(randn({50, 64}, 9, 1), dev).detach();
    w.set_requires_grad(true);
    Tensor y = embedding(w, to_device(id, dev));
    autograd::backward({y}, {to_device(randn({4096, 64}, 9, 2), dev).detach()});
    return to_float_vector(w.grad());
  };
  const auto cpu = grad_on(Device::cpu());
  const auto a = grad_on(kGpu), b = grad_on(kGpu);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, cpu);
}

TEST(CudaKernels, EmbeddingBackwardSumsLongIdsInPiecesAsTheCpuDoes) {
  // Id 0 at 200 positions (7 pieces of at most 32), id 1 at exactly 32 (one
  // piece), id 2 at 33 (two), the rest once or twice: the GPU sums the long
  // ids' pieces side by side, then adds them in order, and its f32 gradient
  // equals the CPU's bit for bit (a straight sum of 200 rows rounds
  // differently). Both widths: packs (24) and single columns (37).
  std::vector<int64_t> ids;
  for (int i = 0; i < 200; ++i) ids.push_back(0);
  for (int i = 0; i < 32; ++i) ids.push_back(1);
  for (int i = 0; i < 33; ++i) ids.push_back(2);
  for (int i = 0; i < 60; ++i) ids.push_back(3 + (i * 7) % 30);
  std::vector<int64_t> shuffled(ids.size());  // interleaved in token order
  for (size_t i = 0; i < ids.size(); ++i) shuffled[(i * 97) % ids.size()] = ids[i];
  const int64_t N = static_cast<int64_t>(shuffled.size());
  const Tensor idt = from_vector(shuffled, {N});
  for (int64_t C : {int64_t{24}, int64_t{37}}) {
    for (DType d : {DType::F32, DType::BF16}) {
      for (DType buf : {d, DType::F32}) {
        for (double beta : {0.0, 1.0}) {
          SCOPED_TRACE("C " + std::to_string(C) + " " + dtype_name(d) + " into " + dtype_name(buf) +
                       " beta " + std::to_string(beta));
          const Tensor dout = cast(randn({N, C}, 16, 1), d);
          const Tensor start = cast(randn({40, C}, 16, 2), buf);
          Tensor acc = clone(start), gacc = to_device(start, kGpu);
          backend_for(DeviceType::CPU).embedding_backward_into(idt, dout, acc, beta);
          backend_for(DeviceType::CUDA)
              .embedding_backward_into(to_device(idt, kGpu), to_device(dout, kGpu), gacc, beta);
          if (buf == DType::F32) {
            EXPECT_EQ(to_float_vector(gacc), to_float_vector(acc));
          } else {  // the CPU rounds the sum to bf16 before adding it
            expect_close(to_double_vector(gacc), to_double_vector(acc), 1e-2, 1e-2, "embedding");
          }
        }
      }
    }
  }
}

// A mixture's top-k choice on the device is the CPU's, equal scores and
// all: plain and biased, group-limited (scored by a group's best one or
// two), f32 and f64 scores, more tokens than a block; a token whose score
// is not finite chooses -1 on both; and a list longer than a thread keeps
// (top 65 of 70) is chosen through the host, the same.
TEST(CudaKernels, RouteTopKChoosesAsTheCpuDoes) {
  struct Case {
    int64_t N, E, k, groups, top_groups, group_best;
    bool biased;
  };
  const Case cases[] = {{300, 8, 2, 1, 1, 2, false},
                        {130, 16, 4, 4, 2, 2, true},
                        {77, 12, 3, 3, 1, 1, true},
                        {40, 64, 8, 8, 4, 2, true},
                        {9, 70, 65, 1, 1, 2, false}};
  for (const Case& c : cases) {
    for (DType dtype : {DType::F32, DType::F64}) {
      SCOPED_TRACE("E " + std::to_string(c.E) + " k " + std::to_string(c.k) + " groups " +
                   std::to_string(c.groups) + " " + dtype_name(dtype));
      // Multiples of 1/8: many equal scores.
      std::vector<double> v(static_cast<size_t>(c.N * c.E));
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 2654435761u) % 8) / 8;
      v[static_cast<size_t>(5 * c.E + 1)] = NAN;  // token 5
      std::vector<double> b;
      for (int64_t e = 0; e < c.E; ++e) b.push_back(static_cast<double>(e % 3) / 16);
      const Tensor scores = from_vector(v, {c.N, c.E}, dtype);
      const Tensor bias = c.biased ? from_vector(b, {c.E}, DType::F32) : Tensor();
      Tensor cpu = empty({c.N, c.k}, DType::I64), gpu = empty({c.N, c.k}, DType::I64, kGpu);
      // Each choice's own score beside it, as the CPU gives it.
      Tensor cpu_chosen = empty({c.N, c.k}, dtype), gpu_chosen = empty({c.N, c.k}, dtype, kGpu);
      backend_for(DeviceType::CPU)
          .route_top_k(scores, bias, c.groups, c.top_groups, c.group_best, cpu, &cpu_chosen);
      backend_for(DeviceType::CUDA)
          .route_top_k(to_device(scores, kGpu), c.biased ? to_device(bias, kGpu) : Tensor(),
                       c.groups, c.top_groups, c.group_best, gpu, &gpu_chosen);
      const Tensor back = to_device(gpu, Device::cpu());
      const std::vector<int64_t> want(cpu.data<int64_t>(), cpu.data<int64_t>() + cpu.numel()),
          got(back.data<int64_t>(), back.data<int64_t>() + back.numel());
      EXPECT_EQ(got, want);
      EXPECT_EQ(want[static_cast<size_t>(5 * c.k)], -1);
      EXPECT_GE(want[0], 0);
      const std::vector<double> chosen = to_double_vector(gpu_chosen);
      EXPECT_EQ(chosen, to_double_vector(cpu_chosen));
      EXPECT_EQ(chosen[0], v[static_cast<size_t>(want[0])]);
    }
  }
  // A bias that is not finite: every token chooses -1 on the device (the
  // host refuses it up front).
  Tensor gpu = empty({4, 2}, DType::I64, kGpu);
  backend_for(DeviceType::CUDA)
      .route_top_k(
          to_device(randn({4, 8}, 3, 1), kGpu),
          to_device(from_vector(std::vector<double>{0, 0, NAN, 0, 0, 0, 0, 0}, {8}, DType::F32),
                    kGpu),
          1, 1, 2, gpu);
  EXPECT_EQ(to_double_vector(gpu), std::vector<double>(8, -1.0));
}

// A mixture's batches padded to their capacity are formed on the device as
// on the CPU: each expert's first assignments in token order (position),
// or its highest-scoring ones in token order, equal scores the earlier
// (probs; scores in multiples of 1/8, many equal, f32 and f64, some
// negative, -0 beside +0); the empty slots padding, the picked indices and each group's
// counts; capacities under and over the loads, more assignments than a
// block takes at once, tokens that could not choose (-1) left out. From 32
// experts on (kernels::kListedExperts) each expert's assignments are
// listed first (a counting sort in chunks of 32, groups and windows
// straddling chunks), at up to DeepSeek-V3's 256 experts choosing 8.
TEST(CudaKernels, CapacitySlotsFillAsTheCpuDoes) {
  struct Case {
    int64_t N, E, k, capacity, group;
    bool ranks;  // (some expert over its capacity whose best are not its first)
  };
  const Case cases[] = {{300, 8, 2, 40, 100, true},    {300, 8, 2, 200, 300, false},
                        {77, 5, 3, 1, 7, true},        {9, 70, 4, 3, 9, false},
                        {31, 32, 1, 1, 31, true},      {600, 64, 4, 20, 150, true},
                        {600, 64, 4, 400, 600, false}, {1000, 256, 8, 24, 125, true}};
  for (const Case& c : cases) {
    for (const DType ranked : {DType::I64, DType::F32, DType::F64}) {  // (I64: by position)
      SCOPED_TRACE("N " + std::to_string(c.N) + " E " + std::to_string(c.E) + " capacity " +
                   std::to_string(c.capacity) + " " + dtype_name(ranked));
      std::vector<double> v(static_cast<size_t>(c.N * c.k)), score(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        v[i] = static_cast<double>((i * 2654435761u >> 7) % static_cast<uint64_t>(c.E));
        score[i] = static_cast<double>((i * 40503u >> 3) % 16) / 8 - 0.5;
        if (score[i] == 0 && i % 2 == 0) score[i] = -0.0;  // (equal to +0)
      }
      for (int64_t j = 0; j < c.k; ++j) v[static_cast<size_t>(3 * c.k + j)] = -1;  // token 3
      const Tensor choice = from_vector(v, {c.N, c.k}, DType::I64);
      const bool by_score = ranked != DType::I64;
      const auto fill = [&](const Device& device) {
        std::vector<Tensor> out{empty({c.E * c.capacity}, DType::I64, device),
                                empty({c.E * c.capacity}, DType::I64, device),
                                empty({c.N * c.k}, DType::I64, device),
                                empty({c.N / c.group, c.E}, DType::I64, device)};
        backend_for(device.type)
            .capacity_slots(
                to_device(choice, device),
                by_score ? to_device(from_vector(score, {c.N, c.k}, ranked), device) : Tensor(),
                c.E, c.capacity, c.group, out[0], out[1], out[2], out[3]);
        std::vector<std::vector<double>> host;
        for (const Tensor& t : out) host.push_back(to_double_vector(t));
        return host;
      };
      const auto cpu = fill(Device::cpu()), gpu = fill(kGpu);
      EXPECT_EQ(gpu, cpu);
      // The CPU's by hand: expert e keeps its first (or best) `capacity`
      // assignments, its slot i the i-th of them in token order, an empty
      // one token 0 under the padding's gate.
      std::vector<std::vector<int64_t>> mine(static_cast<size_t>(c.E));
      std::vector<double> counts(static_cast<size_t>((c.N / c.group) * c.E), 0);
      for (int64_t a = 0; a < c.N * c.k; ++a) {
        const auto e = static_cast<int64_t>(v[static_cast<size_t>(a)]);
        if (e < 0) {
          EXPECT_EQ(cpu[2][static_cast<size_t>(a)], static_cast<double>(c.N * c.E));
          continue;
        }
        EXPECT_EQ(cpu[2][static_cast<size_t>(a)], static_cast<double>((a / c.k) * c.E + e));
        ++counts[static_cast<size_t>((a / c.k / c.group) * c.E + e)];
        mine[static_cast<size_t>(e)].push_back(a);
      }
      std::vector<double> token(static_cast<size_t>(c.E * c.capacity), 0),
          assignment(token.size(), static_cast<double>(c.N * c.k));
      bool ranked_some = false;
      for (int64_t e = 0; e < c.E; ++e) {
        std::vector<int64_t> kept = mine[static_cast<size_t>(e)];
        if (static_cast<int64_t>(kept.size()) > c.capacity) {
          if (by_score) {
            // (Selection by hand: the best remaining, the earlier on ties.)
            std::vector<int64_t> best;
            std::vector<bool> taken(kept.size(), false);
            for (int64_t i = 0; i < c.capacity; ++i) {
              size_t pick = kept.size();
              for (size_t j = 0; j < kept.size(); ++j) {
                if (!taken[j] &&
                    (pick == kept.size() ||
                     score[static_cast<size_t>(kept[j])] > score[static_cast<size_t>(kept[pick])]))
                  pick = j;
              }
              taken[pick] = true;
              best.push_back(kept[pick]);
            }
            std::sort(best.begin(), best.end());
            ranked_some |= best != std::vector<int64_t>(kept.begin(), kept.begin() + c.capacity);
            kept = best;
          }
          kept.resize(static_cast<size_t>(c.capacity));
        }
        for (size_t i = 0; i < kept.size(); ++i) {
          token[static_cast<size_t>(e * c.capacity) + i] = static_cast<double>(kept[i] / c.k);
          assignment[static_cast<size_t>(e * c.capacity) + i] = static_cast<double>(kept[i]);
        }
      }
      EXPECT_EQ(cpu[0], token);
      EXPECT_EQ(cpu[1], assignment);
      EXPECT_EQ(cpu[3], counts);
      // (Where an expert is over its capacity, ranking keeps others than
      // the earliest.)
      if (by_score && c.ranks) {
        EXPECT_TRUE(ranked_some);
      }
    }
  }
  // Bad arguments name the value.
  Tensor slots = empty({8}, DType::I64, kGpu), picked = empty({8}, DType::I64, kGpu),
         counts = empty({3, 4}, DType::I64, kGpu);
  try {
    backend_for(DeviceType::CUDA)
        .capacity_slots(empty({4, 2}, DType::I64, kGpu), Tensor(), 4, 2, 3, slots, slots, picked,
                        counts);
    ADD_FAILURE() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("4 tokens in groups of 3"), std::string::npos) << e.what();
  }
  try {
    Tensor four = empty({1, 4}, DType::I64, kGpu);
    backend_for(DeviceType::CUDA)
        .capacity_slots(empty({4, 2}, DType::I64, kGpu), empty({4, 2}, DType::I64, kGpu), 4, 2, 4,
                        slots, slots, picked, four);
    ADD_FAILURE() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("capacity_slots: scores i64"), std::string::npos)
        << e.what();
  }
}

// A dropless mixture's rows formed on the device (Backend::dropless_rows):
// the CPU's exactly, a token that could not choose (-1) included, with a
// few experts and with many (DeepSeek-V3's 256), and with no tokens.
TEST(CudaKernels, DroplessRowsFormAsTheCpuDoes) {
  struct Case {
    int64_t N, E, k, group;
  };
  const Case cases[] = {
      {300, 8, 2, 100}, {77, 5, 3, 7}, {9, 70, 4, 9}, {1000, 256, 8, 125}, {0, 4, 2, 1}};
  for (const Case& c : cases) {
    SCOPED_TRACE("N " + std::to_string(c.N) + " E " + std::to_string(c.E));
    std::vector<double> v(static_cast<size_t>(c.N * c.k));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<double>((i * 2654435761u >> 7) % static_cast<uint64_t>(c.E));
    if (c.N > 3) {
      for (int64_t j = 0; j < c.k; ++j) v[static_cast<size_t>(3 * c.k + j)] = -1;  // token 3
    }
    const Tensor choice = from_vector(v, {c.N, c.k}, DType::I64);
    const auto fill = [&](const Device& device) {
      std::vector<Tensor> out{
          empty({c.N * c.k}, DType::I64, device), empty({c.N * c.k}, DType::I64, device),
          empty({c.E + 1}, DType::I64, device), empty({c.N * c.k}, DType::I64, device),
          empty({c.N / c.group, c.E}, DType::I64, device)};
      backend_for(device.type)
          .dropless_rows(to_device(choice, device), c.E, c.group, out[0], out[1], out[2], out[3],
                         out[4]);
      std::vector<std::vector<double>> host;
      for (const Tensor& t : out) host.push_back(to_double_vector(t));
      return host;
    };
    const auto cpu = fill(Device::cpu()), gpu = fill(kGpu);
    EXPECT_EQ(gpu, cpu);
    // (Every token but the one that could not choose has a row.)
    EXPECT_EQ(cpu[2].back(), static_cast<double>(c.N > 3 ? (c.N - 1) * c.k : c.N * c.k));
  }
}

// The products a dropless mixture's experts run, sized on the device
// (Backend::grouped_gemm_rows and grouped_gemm_sums): the CPU's within
// rounding in every dtype, over groups of one tile, of several and ragged
// ones, an empty group, rows past the last group (zeroed), the sums'
// beta (added to what is there, or not read), the sums into f32 under
// bf16/f16, and more groups than one launch takes (300).
TEST(CudaKernels, GroupedProductsSizedOnTheDeviceMatchTheCpu) {
  struct Case {
    int64_t M, K, N;
    std::vector<int64_t> offsets;
  };
  std::vector<int64_t> many{0};
  for (int64_t g = 0; g < 300; ++g) many.push_back(many.back() + (g * 7) % 5);
  // (Widths of a multiple of 8 take 16-byte loads, the others element by
  // element.)
  const Case cases[] = {{300, 70, 136, {0, 130, 130, 290, 290}},
                        {260, 72, 136, {0, 5, 200, 250}},
                        {40, 16, 24, {0, 40}},
                        {many.back() + 3, 16, 20, many}};
  for (const Case& c : cases) {
    const int64_t G = static_cast<int64_t>(c.offsets.size()) - 1;
    for (const DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
      SCOPED_TRACE("M " + std::to_string(c.M) + " groups " + std::to_string(G) + " " +
                   dtype_name(dtype));
      const Tensor offsets = from_vector(c.offsets, {G + 1});
      const Tensor a = randn({c.M, c.K}, 5, 1, 1.0, dtype),
                   dy = randn({c.M, c.N}, 5, 2, 1.0, dtype);
      std::vector<Tensor> w, wt;
      for (int64_t g = 0; g < G; ++g) {
        w.push_back(randn({c.N, c.K}, 5, 10 + static_cast<uint64_t>(g), 0.5, dtype));
        wt.push_back(randn({c.K, c.N}, 5, 1000 + static_cast<uint64_t>(g), 0.5, dtype));
      }
      const bool half = dtype == DType::BF16 || dtype == DType::F16;
      const double tol = half ? 1e-2 : dtype == DType::F32 ? 1e-5 : 1e-12;
      const auto near = [&](const Tensor& got, const Tensor& want, const std::string& what) {
        const std::vector<double> g = to_double_vector(got), e = to_double_vector(want);
        ASSERT_EQ(g.size(), e.size()) << what;
        for (size_t i = 0; i < g.size(); ++i) {
          ASSERT_NEAR(g[i], e[i], tol * (1 + std::fabs(e[i]))) << what << " element " << i;
        }
      };
      const auto on = [](const std::vector<Tensor>& ts, const Device& d) {
        std::vector<Tensor> out;
        for (const Tensor& t : ts) out.push_back(to_device(t, d));
        return out;
      };
      for (const bool trans_b : {true, false}) {
        const std::vector<Tensor>& b = trans_b ? w : wt;
        Tensor want = full({c.M, c.N}, 7.0, dtype), got = full({c.M, c.N}, 7.0, dtype, kGpu);
        backend_for(DeviceType::CPU).grouped_gemm_rows(a, b, offsets, trans_b, want);
        backend_for(DeviceType::CUDA)
            .grouped_gemm_rows(to_device(a, kGpu), on(b, kGpu), to_device(offsets, kGpu), trans_b,
                               got);
        near(got, want, trans_b ? "a @ b^T" : "a @ b");
        // (Rows past the last group: zeros, not what was there.)
        const std::vector<double> tail =
            to_double_vector(narrow(got, 0, c.offsets.back(), c.M - c.offsets.back()));
        EXPECT_TRUE(std::all_of(tail.begin(), tail.end(), [](double x) { return x == 0.0; }));
      }
      for (const DType out :
           half ? std::vector<DType>{dtype, DType::F32} : std::vector<DType>{dtype}) {
        for (const double beta : {0.0, 1.0}) {
          SCOPED_TRACE(std::string("sums into ") + dtype_name(out) + " beta " +
                       std::to_string(beta));
          std::vector<Tensor> want, got;
          for (int64_t g = 0; g < G; ++g) {
            // (beta 0 must not read what is there: NaN on the GPU.)
            const auto start = [&](double unread) {
              return beta == 0.0 ? full({c.N, c.K}, unread, out)
                                 : randn({c.N, c.K}, 5, 500 + static_cast<uint64_t>(g), 1.0, out);
            };
            want.push_back(start(0.0));
            got.push_back(to_device(start(std::nan("")), kGpu));
          }
          backend_for(DeviceType::CPU).grouped_gemm_sums(dy, a, offsets, want, beta);
          backend_for(DeviceType::CUDA)
              .grouped_gemm_sums(to_device(dy, kGpu), to_device(a, kGpu), to_device(offsets, kGpu),
                                 got, beta);
          for (int64_t g = 0; g < G; ++g)
            near(got[static_cast<size_t>(g)], want[static_cast<size_t>(g)],
                 "dy_g^T a_g of group " + std::to_string(g));
        }
      }
    }
  }
}

TEST(CudaKernels, LayerNormBackwardIsDeterministic) {
  // The column sums run in a fixed order (warp slices, then blocks), with
  // no float atomics: the same bits every run, at a width the fused
  // backward takes and one it does not.
  for (int64_t C : {int64_t{768}, int64_t{2048}}) {
    SCOPED_TRACE("C " + std::to_string(C));
    auto grads = [C] {
      Tensor w = to_device(randn({C}, 4, 1, 1.0, DType::BF16), kGpu).detach();
      Tensor b = to_device(randn({C}, 4, 2, 1.0, DType::BF16), kGpu).detach();
      Tensor x = to_device(randn({2048, C}, 4, 3, 1.0, DType::BF16), kGpu).detach();
      for (Tensor* t : {&w, &b, &x}) t->set_requires_grad(true);
      Tensor y = layer_norm(x, w, b);
      autograd::backward({y}, {to_device(randn(y.shape(), 4, 4, 1.0, DType::BF16), kGpu)});
      return std::vector<std::vector<float>>{to_float_vector(x.grad()), to_float_vector(w.grad()),
                                             to_float_vector(b.grad())};
    };
    EXPECT_EQ(grads(), grads());
  }
}

// A bias gradient's column sums at a training step's row count run as one
// wave of the device's blocks (on the simulated H200, 132 multiprocessors
// of 8 blocks of 256 threads: 1056 blocks, 264 row chunks of the 4 tiles of
// 256 columns; a fixed 1024 left a GPU's last blocks running alone), then a
// block per 8 columns adds the chunks (128 blocks, where a block per 32
// columns kept 100 of the multiprocessors idle); the sums equal the CPU's,
// the same bits every run.
TEST(CudaKernels, ColumnSumsRunAsOneWaveAndMatchTheCpu) {
  const int64_t N = 264 * 64, C = 1024;
  const Tensor x = cast(randn({N, C}, 16, 1), DType::BF16);
  const Tensor acc = randn({C}, 16, 2);
  Tensor cpu = clone(acc);
  backend_for(DeviceType::CPU).sum_rows_into(x, cpu, 1.0);
  const Tensor xd = to_device(x, kGpu);
  auto on_gpu = [&](int64_t* blocks) {
    Tensor out = to_device(acc, kGpu);
    cuda::synchronize(0);
#ifdef TRIAD_CUDA_SIM
    const int64_t before = triad_sim::counters().blocks;
#endif
    backend_for(DeviceType::CUDA).sum_rows_into(xd, out, 1.0);
    cuda::synchronize(0);
#ifdef TRIAD_CUDA_SIM
    *blocks = triad_sim::counters().blocks - before;
#else
    (void)blocks;
#endif
    return to_double_vector(out);
  };
  int64_t blocks = -1, again = -1;
  const std::vector<double> gpu = on_gpu(&blocks);
  expect_close(gpu, to_double_vector(cpu), 1e-5, 1e-4, "column sums");
  EXPECT_EQ(on_gpu(&again), gpu);
#ifdef TRIAD_CUDA_SIM
  EXPECT_EQ(blocks, 132 * 8 + C / 8);
#endif
}

// At a training step's row count the fused LayerNorm backward fills the
// device: one wave of blocks (6 of 4 warps on each of an H200's 132 at
// C 1024, where a fixed 512 left them 3.9), but no more blocks than leave
// each warp four rows (each block's partial row is memory the second launch
// reads back), and its column sums over those blocks' partial rows still
// equal the CPU's. In f32 the row is too wide to hold (the loop over packs);
// in bf16, GPT-2 350M's norm, each lane holds its 4 packs of the row, with
// the residual's gradient added in.
TEST(CudaKernels, LayerNormBackwardFillsTheDeviceAndMatchesTheCpu) {
  const int64_t N = 4096, C = 1024;
  for (DType d : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(d));
    const bool half = d != DType::F32;
    Tensor x = cast(randn({N, C}, 12, 1), d), w = cast(randn({C}, 12, 2), d),
           b = cast(randn({C}, 12, 3), d), dy = cast(randn({N, C}, 12, 4), d),
           dh = cast(randn({N, C}, 12, 5), d);
    auto run = [&](Device dev, int64_t* blocks) {
      Backend& be = backend_for(dev.type);
      Tensor xd = to_device(x, dev), wd = to_device(w, dev), bd = to_device(b, dev);
      Tensor y = empty({N, C}, d, dev), mean = empty({N}, DType::F32, dev),
             rstd = empty({N}, DType::F32, dev), dx = empty({N, C}, d, dev),
             dw = empty({C}, DType::F32, dev), db = empty({C}, DType::F32, dev);
      be.layer_norm_forward(xd, wd, bd, 1e-5, y, mean, rstd, 0.0);
      const Tensor dyd = to_device(dy, dev), dhd = to_device(dh, dev);
      if (dev.is_cuda()) cuda::synchronize(0);
#ifdef TRIAD_CUDA_SIM
      const int64_t before = triad_sim::counters().blocks;
#endif
      // (f32 parameter gradients from half values, as training takes them.)
      be.layer_norm_backward_into(dyd, half ? &dhd : nullptr, xd, wd, mean, rstd, dx, dw, db, 0.0,
                                  0.0);
      if (dev.is_cuda()) cuda::synchronize(0);
#ifdef TRIAD_CUDA_SIM
      if (blocks) *blocks = triad_sim::counters().blocks - before;
#else
      (void)blocks;
#endif
      return std::vector<std::vector<double>>{to_double_vector(y), to_double_vector(dx),
                                              to_double_vector(dw), to_double_vector(db)};
    };
    int64_t blocks = -1;
    const auto gpu = run(kGpu, &blocks), cpu = run(Device::cpu(), nullptr);
    const double tol = half ? 1e-2 : 1e-4;
    expect_close(gpu[0], cpu[0], tol, half ? 1e-2 : 1e-6, "y");
    expect_close(gpu[1], cpu[1], tol, half ? 1e-2 : 1e-6, "dx");
    expect_close(gpu[2], cpu[2], half ? 1e-3 : 1e-4, half ? 1e-4 : 1e-6, "dweight");
    expect_close(gpu[3], cpu[3], half ? 1e-3 : 1e-4, half ? 1e-4 : 1e-6, "dbias");
#ifdef TRIAD_CUDA_SIM
    // 4096 rows: a block per 16 (four rows a warp), then the second launch,
    // a block per 8 columns.
    EXPECT_EQ(blocks, N / 16 + C / 8);
#endif
  }
#ifdef TRIAD_CUDA_SIM
  // The simulated H200: 132 multiprocessors of 228 KiB; a block's column
  // sums take 2 x 4 warps x 1024 floats (32 KiB) and 1 KiB more: 6 each.
  // 350M's 16384 rows take that wave of 792 (a partial row of dweight and
  // one of dbias each); 124M's 8192 rows of 768, 512 blocks (four rows a
  // warp), where the wave of 7 a multiprocessor ran slower on the H200.
  const size_t row = sizeof(float) * 2;
  EXPECT_EQ(kernels::layer_norm_backward_workspace(16384, 1024), 132 * 6 * 1024 * row);
  EXPECT_EQ(kernels::layer_norm_backward_workspace(8192, 768), 512 * 768 * row);
#endif
}

// cuda::set_norm_backward_register_sums: the norms' backward with each
// lane's column sums in registers gives what the shared-memory sums give.
// LayerNorm (with the residual's gradient and dx's column sums in bf16) and
// RMSNorm, in bf16 at C 1024 and 768 (rows held whole, 768 leaving a lane's
// last pack empty) and in f32 at 512 (held) and 1000 (not held: the loop
// over packs, as without the switch). Against the CPU at the dtype's
// tolerance, and, where the grid is the same (the simulator's occupancy
// counts shared memory, not registers), bit for bit: the same order of
// addition. The workspace follows the switch.
TEST(CudaKernels, NormBackwardSumsInRegistersAsInSharedMemory) {
  struct Case {
    DType dtype;
    int64_t C;
  };
  for (const Case c : {Case{DType::BF16, 1024}, Case{DType::BF16, 768}, Case{DType::F32, 512},
                       Case{DType::F32, 1000}}) {
    const int64_t N = 1000, C = c.C;
    const DType d = c.dtype;
    const bool half = d != DType::F32;
    SCOPED_TRACE(std::string(dtype_name(d)) + " C " + std::to_string(C));
    const Tensor x = cast(randn({N, C}, 21, 1), d), w = cast(randn({C}, 21, 2), d),
                 b = cast(randn({C}, 21, 3), d), dy = cast(randn({N, C}, 21, 4), d),
                 dh = cast(randn({N, C}, 21, 5), d);
    // LayerNorm's y, dx, dweight, dbias (and dx's column sums in bf16),
    // then RMSNorm's dx and dweight.
    auto run = [&](Device dev, bool registers) {
      cuda::set_norm_backward_register_sums(registers);
      Backend& be = backend_for(dev.type);
      const Tensor xd = to_device(x, dev), wd = to_device(w, dev), bd = to_device(b, dev),
                   dyd = to_device(dy, dev), dhd = to_device(dh, dev);
      Tensor y = empty({N, C}, d, dev), mean = empty({N}, DType::F32, dev),
             rstd = empty({N}, DType::F32, dev), dx = empty({N, C}, d, dev),
             dw = empty({C}, DType::F32, dev), db = empty({C}, DType::F32, dev);
      be.layer_norm_forward(xd, wd, bd, 1e-5, y, mean, rstd, 0.0);
      std::vector<std::vector<double>> out;
      if (half && dev.is_cuda()) {
        cuda::set_add_norm_bias_sums(true);
        const Tensor sums = be.layer_norm_backward_into_with_dx_sums(dyd, &dhd, xd, wd, mean, rstd,
                                                                     dx, dw, db, 0.0, 0.0);
        cuda::set_add_norm_bias_sums(false);
        EXPECT_TRUE(sums.defined());
        if (sums.defined()) out.push_back(to_double_vector(sums));
      } else {
        be.layer_norm_backward_into(dyd, half ? &dhd : nullptr, xd, wd, mean, rstd, dx, dw, db, 0.0,
                                    0.0);
      }
      for (const Tensor& t : {y, dx, dw, db}) out.push_back(to_double_vector(t));
      Tensor ry = empty({N, C}, d, dev), rrstd = empty({N}, DType::F32, dev),
             rdx = empty({N, C}, d, dev), rdw = empty({C}, DType::F32, dev);
      be.rms_norm_forward(xd, wd, 1e-5, ry, rrstd, 0.0);
      be.rms_norm_backward_into(dyd, half ? &dhd : nullptr, xd, wd, rrstd, rdx, rdw, 0.0, 0.0);
      out.push_back(to_double_vector(rdx));
      out.push_back(to_double_vector(rdw));
      if (dev.is_cuda()) cuda::synchronize(0);
      cuda::set_norm_backward_register_sums(false);
      return out;
    };
    const auto shared = run(kGpu, false), registers = run(kGpu, true);
    const auto cpu = run(Device::cpu(), false);
    ASSERT_EQ(registers.size(), shared.size());
    // (The CPU has no dx sums: its outputs line up with the GPU's last 6.)
    const size_t skip = registers.size() - cpu.size();
    const char* names[] = {"y", "dx", "dweight", "dbias", "rms dx", "rms dweight"};
    for (size_t i = 0; i < cpu.size(); ++i) {
      const bool params = i == 2 || i == 3 || i == 5;
      expect_close(registers[skip + i], cpu[i], half ? (params ? 1e-3 : 1e-2) : 1e-4,
                   half ? (params ? 1e-4 : 1e-2) : 1e-6, names[i]);
    }
#ifdef TRIAD_CUDA_SIM
    EXPECT_EQ(kernels::layer_norm_backward_workspace(N, C, half, true),
              kernels::layer_norm_backward_workspace(N, C, half, false));
    for (size_t i = 0; i < shared.size(); ++i) EXPECT_EQ(registers[i], shared[i]) << "output " << i;
#endif
  }
}

// cuda::set_add_norm_bias_sums: the fused add-norm backward also gives its
// input gradient's column sums (f32), in f32 and bf16, held and looped rows
// (C 1024 and 768 packed, 40 and 37 not), equal to the column sums of the
// dx it writes, with dx and the parameters' gradients as the CPU's; rows
// wider than its shared memory allows, or the setting off: no sums, the
// rest as before.
TEST(CudaKernels, AddNormBackwardCanSumItsInputGradientsColumns) {
  struct Restore {
    ~Restore() { cuda::set_add_norm_bias_sums(false); }
  } restore;
  const int64_t N = 600;
  for (DType d : {DType::F32, DType::BF16}) {
    for (int64_t C : {int64_t{1024}, int64_t{768}, int64_t{40}, int64_t{37}, int64_t{1040}}) {
      for (bool on : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(d)) + " C " + std::to_string(C) +
                     (on ? "" : ", setting off"));
        cuda::set_add_norm_bias_sums(on);
        const Tensor x = cast(randn({N, C}, 41, 1), d), dy = cast(randn({N, C}, 41, 2), d);
        const Tensor dh = cast(randn({N, C}, 41, 3), d), w = cast(randn({C}, 41, 4), d);
        Tensor b = cast(randn({C}, 41, 5), d), y = empty({N, C}, d);
        Tensor mean = empty({N}, DType::F32), rstd = empty({N}, DType::F32);
        Backend& cpu = backend_for(DeviceType::CPU);
        cpu.layer_norm_forward(x, w, b, 1e-5, y, mean, rstd, 0.0);
        Tensor dx = empty({N, C}, d), dw = zeros({C}, DType::F32), db = zeros({C}, DType::F32);
        cpu.layer_norm_backward_into(dy, &dh, x, w, mean, rstd, dx, dw, db, 0.0, 0.0);
        auto g = [](const Tensor& t) { return to_device(t, kGpu); };
        const Tensor gdh = g(dh);
        Tensor gdx = empty({N, C}, d, kGpu), gdw = g(dw), gdb = g(db);
        const Tensor sums =
            backend_for(DeviceType::CUDA)
                .layer_norm_backward_into_with_dx_sums(g(dy), &gdh, g(x), g(w), g(mean), g(rstd),
                                                       gdx, gdw, gdb, 0.0, 0.0);
        const double tol = d == DType::F32 ? 1e-4 : 1e-2;
        expect_close(to_double_vector(gdx), to_double_vector(dx), tol, tol, "dx");
        expect_close(to_double_vector(gdw), to_double_vector(dw), 1e-4, 1e-4, "dweight");
        expect_close(to_double_vector(gdb), to_double_vector(db), 1e-4, 1e-4, "dbias");
        ASSERT_EQ(sums.defined(), on && C <= 1024);
        if (!sums.defined()) continue;
        EXPECT_EQ(sums.dtype(), DType::F32);
        // The sums of the values before dx's rounding: against the sums of
        // the written (rounded) dx, bf16's rounding over N rows.
        const std::vector<double> written = to_double_vector(gdx);
        std::vector<double> want(static_cast<size_t>(C), 0.0);
        for (int64_t r = 0; r < N; ++r)
          for (int64_t c = 0; c < C; ++c)
            want[static_cast<size_t>(c)] += written[static_cast<size_t>(r * C + c)];
        const double stol = d == DType::F32 ? 1e-4 : 2e-2;
        expect_close(to_double_vector(sums), want, stol, stol, "dx's column sums");
      }
    }
  }
}

// The same through the ops: a linear layer's output added by add_layer_norm
// (GPT's projections into the next norm); with the setting, the layer's
// bias gradient comes from the norm's sums (no column-sum launch for it),
// over two micro-batches, in f32 and bf16, equal to the CPU's; with the
// output used again, the gradient reaching the layer is another tensor and
// it sums its own.
TEST(CudaRuntime, AProjectionsBiasGradientCanComeFromTheAddNormBackward) {
  struct Restore {
    ~Restore() {
      cuda::set_add_norm_bias_sums(false);
      cuda::set_op_profiling(false);
    }
  } restore;
  const int64_t rows = 300, C = 32;
  for (DType d : {DType::F32, DType::BF16}) {
    for (bool used_again : {false, true}) {
      auto grads = [&](Device dev, bool on, int64_t* norm_sums) {
        cuda::set_add_norm_bias_sums(on);
        auto leaf = [&](const Tensor& t) {
          Tensor p = to_device(cast(t, d), dev).detach();
          p.set_requires_grad(true);
          return p;
        };
        Tensor w = leaf(randn({C, C}, 51, 1, 0.3)), b = leaf(randn({C}, 51, 2)),
               lw = leaf(randn({C}, 51, 3)), lb = leaf(randn({C}, 51, 4));
        if (dev.is_cuda()) {
          cuda::set_op_profiling(true);
          cuda::op_profile(0);  // (clears what came before)
        }
        for (uint64_t micro = 0; micro < 2; ++micro) {
          const Tensor a = to_device(cast(randn({rows, C}, 52, micro), d), dev);
          const Tensor stream = to_device(cast(randn({rows, C}, 53, micro), d), dev);
          const Tensor r = to_device(cast(randn({rows, C}, 54, micro), d), dev);
          const Tensor proj = linear(a, w, b);
          const AddNorm o = add_layer_norm(stream, proj, lw, lb);
          Tensor loss = add(sum(mul(o.norm, r)), sum(mul(o.sum, r)));
          if (used_again) loss = add(loss, sum(mul(proj, proj)));
          autograd::backward({loss});
        }
        if (dev.is_cuda()) {
          *norm_sums = 0;
          for (const cuda::OpTime& t : cuda::op_profile(0))
            if (t.op == "layer_norm_backward_dx_sums") *norm_sums = t.calls;
          cuda::set_op_profiling(false);
        }
        return std::vector<std::vector<double>>{
            to_double_vector(b.grad()), to_double_vector(w.grad()), to_double_vector(lw.grad()),
            to_double_vector(lb.grad())};
      };
      SCOPED_TRACE(std::string(dtype_name(d)) + (used_again ? ", output used again" : ""));
      const auto cpu = grads(Device::cpu(), false, nullptr);
      for (bool on : {false, true}) {
        SCOPED_TRACE(on ? "norm's sums" : "column sums");
        int64_t norm_sums = -1;
        const auto gpu = grads(kGpu, on, &norm_sums);
        EXPECT_EQ(norm_sums, on ? 2 : 0);
        const double tol = d == DType::F32 ? 1e-4 : 3e-2;
        const char* names[] = {"b", "w", "ln weight", "ln bias"};
        for (size_t i = 0; i < cpu.size(); ++i) expect_close(gpu[i], cpu[i], tol, tol, names[i]);
      }
    }
  }
}

TEST(CudaKernels, AttentionBackwardIsDeterministic) {
  auto grads = [] {
    Tensor qkv = to_device(randn({2, 150, 3 * 128}, 3, 1, 1.0, DType::BF16), kGpu).detach();
    qkv.set_requires_grad(true);
    Tensor y = causal_attention(qkv, 2);
    autograd::backward({y}, {to_device(randn(y.shape(), 3, 2, 1.0, DType::BF16), kGpu).detach()});
    return to_float_vector(qkv.grad());
  };
  for (auto kernel : {cuda::AttentionKernel::Simt, cuda::AttentionKernel::TensorCore,
                      cuda::AttentionKernel::Cudnn}) {
    if (!cuda::attention_kernel_unavailable(kernel, DType::BF16, 150, 128, 2).empty()) continue;
    SCOPED_TRACE(cuda::attention_kernel_name(kernel));
    cuda::set_attention_kernel(kernel);
    EXPECT_EQ(grads(), grads());
  }
  cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
}

TEST(CudaKernels, CudnnAttentionNamesWhatItCannotRun) {
  if (!cuda::cudnn_compiled()) GTEST_SKIP() << "this build has no cuDNN";
  cuda::set_attention_kernel(cuda::AttentionKernel::Cudnn);
  auto attempt = [](DType dtype, int64_t C, int64_t NH) {
    try {
      causal_attention(to_device(randn({1, 8, 3 * C}, 1, 1, 1.0, dtype), kGpu), NH);
    } catch (const NotSupportedError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(attempt(DType::F32, 64, 2).find("bf16 or f16"), std::string::npos);
  EXPECT_NE(attempt(DType::BF16, 36, 3).find("multiple of 8"), std::string::npos);  // D = 12
  cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
}

// The kernels one causal attention over qkv launches (-1 off the
// simulator, which alone counts them), and its output. Which route Auto
// took shows here: cuDNN's stand-in launches fewer kernels than Triad's
// attention.
int64_t attention_launches(const Tensor& qkv, int64_t heads, std::vector<double>* out = nullptr) {
  cuda::synchronize(0);
#ifdef TRIAD_CUDA_SIM
  const int64_t before = triad_sim::counters().launches;
#endif
  Tensor y = causal_attention(qkv, heads);
  cuda::synchronize(0);
  if (out) *out = to_double_vector(y);
#ifdef TRIAD_CUDA_SIM
  return triad_sim::counters().launches - before;
#else
  return -1;
#endif
}

TEST(CudaKernels, AutoAttentionRunsTheRecordedChoice) {
  if (!cuda::cudnn_compiled()) GTEST_SKIP() << "this build has no cuDNN";
  // A shape cuDNN can run (bf16, head dim 16): tuning records a decision
  // with both times; f32, or an explicit kernel, leaves nothing to decide.
  cuda::clear_attention_choices();
  cuda::AttentionChoice c;
  ASSERT_TRUE(cuda::tune_attention(0, DType::BF16, 2, 128, 64, 4, c));
  EXPECT_GT(c.own_ms, 0.0);
  EXPECT_GT(c.cudnn_ms, 0.0);
  EXPECT_EQ(c.cudnn, c.cudnn_ms < c.own_ms);
  ASSERT_EQ(cuda::attention_choices().size(), 1u);
  EXPECT_TRUE(cuda::attention_choices()[0].same_problem(c));
  // The same sizes with grouped key/value heads are another problem, timed
  // and recorded apart.
  cuda::AttentionChoice grouped;
  ASSERT_TRUE(cuda::tune_attention(0, DType::BF16, 2, 128, 64, AttentionHeads{4, 2}, grouped));
  EXPECT_EQ(grouped.kv_heads, 2);
  EXPECT_FALSE(grouped.same_problem(c));
  EXPECT_GT(grouped.cudnn_ms, 0.0);
  ASSERT_EQ(cuda::attention_choices().size(), 2u);
  cuda::AttentionChoice f32;
  EXPECT_FALSE(cuda::tune_attention(0, DType::F32, 2, 128, 64, 4, f32));
  cuda::set_attention_kernel(cuda::AttentionKernel::TensorCore);
  EXPECT_FALSE(cuda::tune_attention(0, DType::BF16, 2, 64, 64, 4, f32));
  cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
  EXPECT_THROW(cuda::tune_attention(0, DType::BF16, 2, 64, 63, 4, f32), ValueError);
  // A recorded decision is what runs: Triad's attention kernels launch and
  // cuDNN's stand-in does not, so the cuDNN route launches fewer kernels;
  // both give the same attention.
  const Tensor qkv = to_device(randn({2, 128, 3 * 64}, 3, 1, 1.0, DType::BF16), kGpu);
  auto run = [&](bool cudnn, std::vector<double>* out) {
    c.cudnn = cudnn;
    cuda::set_attention_choice(c);
    return attention_launches(qkv, 4, out);
  };
  std::vector<double> own, fused;
  const int64_t own_launches = run(false, &own), cudnn_launches = run(true, &fused);
  if (kOnSimulator) {
    EXPECT_LT(cudnn_launches, own_launches);
  }
  ASSERT_EQ(own.size(), fused.size());
  for (size_t i = 0; i < own.size(); ++i)
    ASSERT_NEAR(own[i], fused[i], 0.02 * (1 + std::abs(own[i]))) << i;
  cuda::clear_attention_choices();
}

// Auto's choice for a shape first met inside a CUDA graph's capture: its
// timing runs cannot run there (they would join the graph, and the wait for
// them is refused), so the capture fails naming the shape and records no
// choice; run once uncaptured first, the same work captures and replays.
TEST(CudaKernels, AutoAttentionIsNotDecidedInsideACapture) {
  if (!cuda::cudnn_compiled()) GTEST_SKIP() << "this build has no cuDNN";
  cuda::clear_attention_choices();
  autograd::NoGradGuard no_grad;
  const Tensor qkv = to_device(randn({2, 128, 3 * 64}, 3, 7, 1.0, DType::BF16), kGpu);
  Tensor y;
  try {
    cuda::capture(0, [&] { y = causal_attention(qkv, 4); });
    ADD_FAILURE() << "an attention never timed was decided inside a capture";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* needle : {"cuda::capture", "attention_kernel auto", "B=2 T=128 C=64 heads=4/4",
                               "first met inside a CUDA graph's capture"})
      EXPECT_NE(m.find(needle), std::string::npos) << m;
  }
  EXPECT_TRUE(cuda::attention_choices().empty());
  std::vector<double> want;
  attention_launches(qkv, 4, &want);  // decided here, uncaptured
  ASSERT_EQ(cuda::attention_choices().size(), 1u);
  cuda::Graph g = cuda::capture(0, [&] { y = causal_attention(qkv, 4); });
  g.replay();
  g.check();
  const std::vector<double> got = to_double_vector(y);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
  cuda::clear_attention_choices();
}

TEST(CudaKernels, AutoAttentionTimesInferenceByTheForwardAlone) {
  if (!cuda::cudnn_compiled()) GTEST_SKIP() << "this build has no cuDNN";
  cuda::clear_attention_choices();
  const Tensor qkv = to_device(randn({2, 128, 3 * 64}, 3, 5, 1.0, DType::BF16), kGpu).detach();
  const auto choice_for = [](bool forward_only) -> std::optional<cuda::AttentionChoice> {
    for (const auto& c : cuda::attention_choices()) {
      if (c.forward_only == forward_only && c.batch == 2 && c.seq_len == 128) return c;
    }
    return std::nullopt;
  };
  // Inference first: a decision timed on the forward alone, recorded apart.
  Tensor inferred;
  {
    autograd::InferenceGuard inference;
    inferred = causal_attention(qkv, 4);
  }
  ASSERT_EQ(cuda::attention_choices().size(), 1u);
  const auto forward = choice_for(true);
  ASSERT_TRUE(forward.has_value());
  EXPECT_GT(forward->own_ms, 0.0);
  EXPECT_GT(forward->cudnn_ms, 0.0);
  // A no-grad forward outside inference (activation recomputation's) and a
  // training step each want the training decision: timed now, with the
  // backward, and the forward-only one is left as it was.
  Tensor no_grad_out;
  {
    autograd::NoGradGuard no_grad;
    no_grad_out = causal_attention(qkv, 4);
  }
  ASSERT_EQ(cuda::attention_choices().size(), 2u);
  const auto training = choice_for(false);
  ASSERT_TRUE(training.has_value());
  EXPECT_EQ(choice_for(true)->own_ms, forward->own_ms);
  Tensor leaf = qkv.detach();
  leaf.set_requires_grad(true);
  Tensor y = causal_attention(leaf, 4);
  autograd::backward({y}, {to_device(randn(y.shape(), 3, 6, 1.0, DType::BF16), kGpu).detach()});
  EXPECT_TRUE(leaf.grad().defined());
  EXPECT_EQ(cuda::attention_choices().size(), 2u);
  EXPECT_EQ(to_double_vector(y), to_double_vector(no_grad_out));
  // Once a training decision exists, inference takes it, whatever the
  // forward-only one says; with only the forward-only one, it follows that
  // (the route shows in the simulator's launch count).
  const auto inference_launches = [&] {
    autograd::InferenceGuard inference;
    return attention_launches(qkv, 4);
  };
  const int64_t training_route = inference_launches();
  cuda::AttentionChoice flipped = *forward;
  flipped.cudnn = !training->cudnn;
  cuda::set_attention_choice(flipped);
  EXPECT_EQ(inference_launches(), training_route);
  cuda::clear_attention_choices();
  cuda::set_attention_choice(flipped);
  const int64_t forward_route = inference_launches();
  EXPECT_EQ(cuda::attention_choices().size(), 1u);
  if (kOnSimulator) {
    EXPECT_NE(forward_route, training_route);
  }
  cuda::clear_attention_choices();
}

TEST(CudaRuntime, CopiesConvertDtypesAndStridesBothWays) {
  Tensor x = randn({37, 53}, 1, 1);  // f32 host
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    SCOPED_TRACE(dtype_name(d));
    Tensor dev = empty(x.shape(), d, kGpu);
    copy_(dev, x);
    const auto back = to_double_vector(dev);
    const auto want = to_double_vector(cast(x, d));
    EXPECT_EQ(back, want);
  }
  // Strided host source -> device, and device transpose -> host.
  Tensor t = transpose(x, 0, 1);
  Tensor dev_t = to_device(t, kGpu);
  EXPECT_EQ(to_double_vector(dev_t), to_double_vector(contiguous(t)));
  Tensor dev_x = to_device(x, kGpu);
  EXPECT_EQ(to_double_vector(contiguous(transpose(dev_x, 0, 1))), to_double_vector(contiguous(t)));
  // Strided device copies whose rows are contiguous on both sides go in
  // 16-byte packs: a permute that keeps rows, a conversion of one, and
  // views the packs cannot take (rows one element off a 16-byte boundary,
  // a row length no pack divides) in every dtype.
  Tensor cube = randn({4, 6, 24}, 1, 2);
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::F64, DType::I64}) {
    SCOPED_TRACE(std::string("strided ") + dtype_name(d));
    const Tensor host = d == DType::I64 ? cast(affine(cube, 1e3), d) : cast(cube, d);
    const Tensor dev = to_device(host, kGpu);
    for (auto view : std::vector<std::function<Tensor(const Tensor&)>>{
             [](const Tensor& v) {
               return permute(v, {1, 0, 2});
             },
             [](const Tensor& v) {
               return narrow(permute(v, {1, 0, 2}), 2, 8, 16);
             },
             [](const Tensor& v) {
               return narrow(permute(v, {1, 0, 2}), 2, 1, 16);
             },
             [](const Tensor& v) {
               return narrow(permute(v, {1, 0, 2}), 2, 0, 15);
             }}) {
      EXPECT_EQ(to_double_vector(contiguous(view(dev))), to_double_vector(contiguous(view(host))));
      if (d != DType::I64) {
        const DType other = d == DType::F32 ? DType::BF16 : DType::F32;
        EXPECT_EQ(to_double_vector(cast(view(dev), other)),
                  to_double_vector(cast(view(host), other)));
      }
    }
  }
  // Integers survive exactly, also through a strided device copy (64-bit
  // values beyond f64's 53-bit mantissa).
  const std::vector<int64_t> big{0, -5, (1ll << 60) + 1, 7, -(1ll << 55) - 3, 9};
  Tensor ids = from_vector(big, {2, 3}, DType::I64);
  Tensor dev_ids = to_device(ids, kGpu);
  Tensor back =
      to_device(contiguous(transpose(contiguous(transpose(dev_ids, 0, 1)), 0, 1)), Device::cpu());
  EXPECT_EQ(std::vector<int64_t>(back.data<int64_t>(), back.data<int64_t>() + 6), big);
}

TEST(CudaRuntime, LargeCopiesCrossSeveralStagingChunks) {
  const int64_t n = 5'000'003;  // 20 MB of f32: three 8 MiB chunks, the last partial
  Tensor x = rand_uniform({n}, 4, 4, -1, 1);
  Tensor back = to_device(to_device(x, kGpu), Device::cpu());
  ASSERT_EQ(std::memcmp(back.raw_data(), x.raw_data(), x.nbytes()), 0);
}

TEST(CudaRuntime, CachingAllocatorReportsAndReusesMemory) {
  cuda::synchronize(0);
  const AllocatorStats before = cuda::memory_stats(0);
  {
    Tensor a = empty({1 << 20}, DType::F32, kGpu);
    const AllocatorStats during = cuda::memory_stats(0);
    EXPECT_GE(during.allocated - before.allocated, 4 << 20);
    EXPECT_GE(during.reserved, during.allocated);
  }
  const AllocatorStats after_free = cuda::memory_stats(0);
  EXPECT_EQ(after_free.allocated, before.allocated);
  Tensor again = empty({1 << 20}, DType::F32, kGpu);  // served from the cache
  EXPECT_EQ(cuda::memory_stats(0).reserved, after_free.reserved);
}

// CUDA graphs (cuda::capture): a capture runs nothing; each replay runs the
// captured ops on whatever the inputs hold by then, with the same bits as
// running them again.
bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ha = to_device(a, Device::cpu()), hb = to_device(b, Device::cpu());
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

TEST(CudaRuntime, AGraphReplaysItsOpsOnNewInputs) {
  autograd::NoGradGuard no_grad;
  Tensor x = to_device(rand_uniform({48, 32}, 1, 1, -1, 1, DType::BF16), kGpu);
  const Tensor w = to_device(rand_uniform({64, 32}, 2, 1, -0.5, 0.5, DType::BF16), kGpu);
  const Tensor b = to_device(rand_uniform({64}, 3, 1, -0.5, 0.5, DType::BF16), kGpu);
  const Tensor r = to_device(rand_uniform({48, 64}, 4, 1, -1, 1, DType::BF16), kGpu);
  auto block = [&] { return add(scale(gelu(linear(x, w, b)), 2.0), r); };
  Tensor y;  // made during the capture: its memory is the graph's
  cuda::Graph g = cuda::capture(0, [&] { y = block(); });
  ASSERT_FALSE(g.empty());
  ASSERT_TRUE(y.defined());
  for (uint64_t round = 0; round < 3; ++round) {
    const Tensor fresh = to_device(rand_uniform({48, 32}, 10 + round, 1, -1, 1, DType::BF16), kGpu);
    backend_for(x).copy(fresh, x);  // the input refilled in place
    g.replay();
    const Tensor expected = block();
    EXPECT_TRUE(same_bytes(y, expected)) << "replay " << round;
  }
  // Moved, it still replays; an empty one says so.
  cuda::Graph moved = std::move(g);
  EXPECT_TRUE(g.empty());  // NOLINT(bugprone-use-after-move): a moved-from graph is empty
  moved.replay();
  EXPECT_TRUE(same_bytes(y, block()));
  EXPECT_THROW(g.replay(), Error);
}

// The graph's replays write the memory its capture was given, so no other
// tensor may be handed that memory while it lives: here the temporary `t`,
// freed during the capture, whose block an ordinary cache would give the
// next request of its size. (A size no other test asks for: the capture
// takes new blocks from the device, which CUDA 13 refuses a capturing
// thread unless its capture mode is relaxed for the call.)
TEST(CudaRuntime, AGraphsMemoryIsNotHandedToOtherTensors) {
  autograd::NoGradGuard no_grad;
  const int64_t n = (45 << 20) / 4 + 7;  // f32: a class of 46 MiB
  const Tensor x = to_device(full({n}, 1.0, DType::F32), kGpu);
  Tensor out;
  cuda::Graph g = cuda::capture(0, [&] {
    const Tensor t = scale(x, 3.0);
    out = add(t, t);
  });
  std::vector<Tensor> others;
  for (int i = 0; i < 4; ++i) others.push_back(to_device(full({n}, 7.0, DType::F32), kGpu));
  g.replay();
  g.replay();
  EXPECT_TRUE(same_bytes(out, full({n}, 6.0, DType::F32)));
  for (const Tensor& o : others) EXPECT_TRUE(same_bytes(o, full({n}, 7.0, DType::F32)));
  // Destroyed, its memory is the cache's again (behind its last replay).
  const AllocatorStats held = cuda::memory_stats(0);
  g = cuda::Graph();
  out = Tensor();
  const Tensor again = to_device(full({n}, 5.0, DType::F32), kGpu);
  EXPECT_EQ(cuda::memory_stats(0).reserved, held.reserved);
  EXPECT_TRUE(same_bytes(again, full({n}, 5.0, DType::F32)));
}

// A tensor made before the capture and read by the graph, freed after it
// while the graph lives: its memory stays the graph's, so a tensor made
// next of its size takes other memory and each replay still reads the
// freed input's values. Destroyed, the graph hands that memory back.
TEST(CudaRuntime, AnInputFreedAfterTheCaptureIsNotHandedToOtherTensors) {
  autograd::NoGradGuard no_grad;
  const int64_t n = (13 << 20) / 4 + 3;  // f32: a class of 14 MiB
  Tensor x = to_device(full({n}, 2.0, DType::F32), kGpu);
  const void* at = x.raw_data();
  Tensor out;
  cuda::Graph g = cuda::capture(0, [&] { out = scale(x, 3.0); });
  x = Tensor();  // (the caller lets its input go)
  const Tensor other = to_device(full({n}, 9.0, DType::F32), kGpu);
  EXPECT_NE(other.raw_data(), at);
  g.replay();
  EXPECT_TRUE(same_bytes(out, full({n}, 6.0, DType::F32)));
  EXPECT_TRUE(same_bytes(other, full({n}, 9.0, DType::F32)));
  const int64_t reserved = cuda::memory_stats(0).reserved;
  g = cuda::Graph();
  out = Tensor();
  const Tensor again = to_device(full({n}, 4.0, DType::F32), kGpu);
  EXPECT_EQ(cuda::memory_stats(0).reserved, reserved);  // (a cached block, the graph's before)
  EXPECT_TRUE(same_bytes(again, full({n}, 4.0, DType::F32)));
}

// What a capture cannot hold fails it, naming the capture, and leaves the
// stream as it was: here a read of a value (a wait for the device), and an
// upload from the host (whose pinned staging block every replay would read
// again, whatever it held by then), each named by the copy before CUDA
// could refuse it; and a wait the backend does not make itself, by CUDA's
// refusal at the capture's end.
TEST(CudaRuntime, ACaptureThatWaitsForTheDeviceFailsClearly) {
  autograd::NoGradGuard no_grad;
  const Tensor x = to_device(full({256}, 2.0, DType::F32), kGpu);
  // A capture of `record` fails with an Error holding each of `needles`.
  auto refused = [](const std::string& what, const std::function<void()>& record,
                    const std::vector<std::string>& needles) {
    try {
      cuda::capture(0, record);
      ADD_FAILURE() << "a capture that " << what << " succeeded";
    } catch (const Error& e) {
      const std::string m = e.what();
      for (const std::string& n : needles)
        EXPECT_NE(m.find(n), std::string::npos) << what << ": " << m;
    }
  };
  refused("reads a value back", [&] { (void)item(sum(scale(x, 0.5))); },
          {"cuda::capture", "a download to the host of ", "inside a CUDA graph's capture"});
  const Tensor host = full({64}, 3.0, DType::F32);
  refused("uploads from the host", [&] { (void)add(x, to_device(host, kGpu)); },
          {"an upload from the host of ", "inside a CUDA graph's capture", "before the capture"});
  refused("waits for the device",
          [&] {
            (void)scale(x, 0.5);
            cuda::synchronize(0);
          },
          {"cuda::capture", "StreamCapture"});
  EXPECT_DOUBLE_EQ(item(sum(scale(x, 0.5))), 256.0);  // the stream works as before
  cuda::set_op_profiling(true);
  EXPECT_THROW(cuda::capture(0, [&] { (void)scale(x, 2.0); }), Error);
  cuda::set_op_profiling(false);
  (void)cuda::op_profile(0);
}

// DeviceTimer on a GPU: its marks are events on the compute stream, so
// timing work costs the host no wait until the reading (one), and a span is
// the device's time for the work between its marks, not the host's time to
// queue it.
TEST(CudaRuntime, DeviceTimerTimesQueuedWorkWithoutWaitingForIt) {
  // (The simulator's products are exact host GEMMs; its GELU kernels run
  // thread by thread, as slowly as a simulation does: tens of milliseconds
  // here, so that a host preempted while it queues them does not take as
  // long.)
  const int64_t n = kOnSimulator ? 128 : 2048;
  const int products = kOnSimulator ? 16 : 20;
  Tensor a = to_device(randn({n, n}, 1, 1, 1.0), kGpu),
         b = to_device(randn({n, n}, 2, 2, 1.0), kGpu);
  Tensor c = matmul(a, b);  // (the library's first product pays its setup here)
  cuda::synchronize(0);
  DeviceTimer timer(kGpu);
#ifdef TRIAD_CUDA_SIM
  const int64_t waits = triad_sim::counters().host_waits;
#endif
  const auto queued_from = std::chrono::steady_clock::now();
  const DeviceTimer::Mark from = timer.mark();
  for (int i = 0; i < products; ++i) c = gelu(matmul(a, b));
  const DeviceTimer::Mark to = timer.mark();
  const double queueing =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - queued_from).count();
  timer.add("products", from, to);
  timer.add("nothing", to, timer.mark());
#ifdef TRIAD_CUDA_SIM
  EXPECT_EQ(triad_sim::counters().host_waits, waits);  // nothing waited for yet
#endif
  const std::map<std::string, double> read = timer.read();
  EXPECT_GT(read.at("products"), queueing);
  EXPECT_LT(read.at("nothing"), 0.1 * read.at("products"));
#ifdef TRIAD_CUDA_SIM
  EXPECT_EQ(triad_sim::counters().host_waits, waits + 1);  // the reading's
#endif
  EXPECT_EQ(timer.marks(), 0u);
  // The events are reused by the next reading.
  const DeviceTimer::Mark first = timer.mark();
  timer.add("again", first, timer.mark());
  EXPECT_GE(timer.read().at("again"), 0.0);
}

// Traced spans on a GPU are placed on the host's clock by an anchor event
// recorded at the reading on the idle stream: a span starts no earlier than
// the host queued its work and ends no later than the reading that waited
// for it, and lasts what the reading summed. The placing needs the anchor
// reached, so a reading's spans come out with the next reading (or when
// asked to wait), never costing a reading a second wait.
TEST(CudaRuntime, DeviceTimerPlacesTracedSpansOnTheHostsClock) {
  const int64_t n = kOnSimulator ? 64 : 2048;
  const int products = kOnSimulator ? 4 : 20;
  Tensor a = to_device(randn({n, n}, 3, 3, 1.0), kGpu),
         b = to_device(randn({n, n}, 4, 4, 1.0), kGpu);
  Tensor c = matmul(a, b);
  cuda::synchronize(0);
  DeviceTimer timer(kGpu);
  timer.set_tracing(true);
  using Clock = DeviceTimer::Clock;
  auto queue_work = [&](const std::string& name) {
    const DeviceTimer::Mark from = timer.mark();
    for (int i = 0; i < products; ++i) c = gelu(matmul(a, b));
    const DeviceTimer::Mark to = timer.mark();
    timer.add(name, from, to);
    timer.trace(name, "compute", from, to);
  };
  const Clock::time_point queued = Clock::now();
#ifdef TRIAD_CUDA_SIM
  const int64_t waits = triad_sim::counters().host_waits;
#endif
  queue_work("first");
  const double first_s = timer.read().at("first");
  const Clock::time_point read = Clock::now();
#ifdef TRIAD_CUDA_SIM
  EXPECT_EQ(triad_sim::counters().host_waits, waits + 1);  // the reading's, no more
#endif
  EXPECT_TRUE(timer.take_traced().empty());  // (its anchor not known to be reached)
  // Time passes on the host before the next reading, and before the anchor
  // is read: a span placed by an anchor that ran late would move earlier by
  // as much, before its work was queued.
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  const Clock::time_point queued_again = Clock::now();
  queue_work("second");
  const double second_s = timer.read().at("second");
  const Clock::time_point read_again = Clock::now();
  std::vector<DeviceTimer::Traced> placed = timer.take_traced();
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  for (const DeviceTimer::Traced& t : timer.take_traced(/*wait=*/true)) placed.push_back(t);
  ASSERT_EQ(placed.size(), 2u);
  auto check = [](const DeviceTimer::Traced& t, const std::string& name, Clock::time_point from,
                  Clock::time_point to, double seconds) {
    EXPECT_EQ(t.name, name);
    EXPECT_EQ(t.category, "compute");
    const auto us = [](Clock::duration d) {
      return std::chrono::duration<double, std::micro>(d).count();
    };
    // (On the simulator these hold exactly: the anchor's clock is read once
    // the device has run it, so a reading is placed late if at all. A GPU
    // takes some microseconds to reach an event on an idle stream, and its
    // events' resolution is half a microsecond.)
    const double slack = kOnSimulator ? 1.0 : 50.0;
    EXPECT_GE(us(t.start - from), -slack) << name << " starts before its work was queued";
    EXPECT_LE(us(t.end - to), slack) << name << " ends after the reading that waited for it";
    EXPECT_NEAR(us(t.end - t.start), 1e6 * seconds, 2.0 + 1e-3 * 1e6 * seconds) << name;
  };
  check(placed[0], "first", queued, read, first_s);
  check(placed[1], "second", queued_again, read_again, second_s);
  EXPECT_TRUE(timer.take_traced(true).empty());
  // Untraced, trace() keeps nothing.
  timer.set_tracing(false);
  queue_work("third");
  timer.read();
  EXPECT_TRUE(timer.take_traced(true).empty());
}

TEST(CudaRuntime, AccumulateAddsHalfAndF32IntoF32LikeTheCpu) {
  // Odd sizes (one element, a partial block, several blocks), every source
  // dtype the fused kernel takes, and a strided source (the generic path).
  for (int64_t n : {int64_t{1}, int64_t{1037}, int64_t{70001}}) {
    for (DType d : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + " n=" + std::to_string(n));
      Tensor src = cast(randn({n}, 5, 1), d), acc = randn({n}, 6, 1);
      Tensor cpu_acc = clone(acc);
      backend_for(DeviceType::CPU).accumulate(src, cpu_acc);
      Tensor dev_acc = to_device(acc, kGpu);
      backend_for(DeviceType::CUDA).accumulate(to_device(src, kGpu), dev_acc);
      EXPECT_EQ(to_double_vector(dev_acc), to_double_vector(cpu_acc));
    }
  }
  // A source one element past a 16-byte boundary (no packs).
  Tensor shifted = cast(randn({1038}, 5, 2), DType::BF16), acc_small = randn({1037}, 6, 2);
  Tensor cpu_small = clone(acc_small);
  backend_for(DeviceType::CPU).accumulate(narrow(shifted, 0, 1, 1037), cpu_small);
  Tensor dev_small = to_device(acc_small, kGpu);
  backend_for(DeviceType::CUDA).accumulate(narrow(to_device(shifted, kGpu), 0, 1, 1037), dev_small);
  EXPECT_EQ(to_double_vector(dev_small), to_double_vector(cpu_small));
  Tensor m = cast(randn({6, 9}, 7, 1), DType::BF16), acc = randn({9, 6}, 8, 1);
  Tensor cpu_acc = clone(acc);
  backend_for(DeviceType::CPU).accumulate(transpose(m, 0, 1), cpu_acc);
  Tensor dev_acc = to_device(acc, kGpu);
  backend_for(DeviceType::CUDA).accumulate(transpose(to_device(m, kGpu), 0, 1), dev_acc);
  EXPECT_EQ(to_double_vector(dev_acc), to_double_vector(cpu_acc));
  Tensor wrong = empty({5}, DType::F32, kGpu);
  EXPECT_THROW(backend_for(DeviceType::CUDA).accumulate(to_device(m, kGpu), wrong), ShapeError);
}

TEST(CudaKernels, HalfGemmIntoF32MatchesTheCpu) {
  // bf16/f16 operands summed into an f32 output (beta 1): the weight
  // gradient added straight into an f32 gradient.
  for (DType d : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(d));
    const Tensor dy = cast(randn({37, 24}, 11, 1), d), x = cast(randn({37, 19}, 11, 2), d);
    const Tensor acc = randn({24, 19}, 11, 3);
    Tensor cpu_acc = clone(acc);
    backend_for(DeviceType::CPU).gemm(dy, x, cpu_acc, true, false, 1.0, 1.0);
    Tensor dev_acc = to_device(acc, kGpu);
    backend_for(DeviceType::CUDA)
        .gemm(to_device(dy, kGpu), to_device(x, kGpu), dev_acc, true, false, 1.0, 1.0);
    const auto got = to_double_vector(dev_acc), want = to_double_vector(cpu_acc);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << "element " << i;
  }
  Tensor wrong = empty({24, 19}, DType::F16, kGpu);
  EXPECT_THROW(backend_for(DeviceType::CUDA)
                   .gemm(to_device(cast(randn({37, 24}, 11, 1), DType::BF16), kGpu),
                         to_device(cast(randn({37, 19}, 11, 2), DType::BF16), kGpu), wrong, true,
                         false, 1.0, 0.0),
               ValueError);
}

// A linear layer's weight and bias gradients in one call, as the training
// step makes it: half operands into f32 buffers, fresh (beta 0) and added to
// (beta 1), at aligned and odd extents. On the GPU the bias's sums come from
// the weight GEMM's epilogue; the CPU's are a GEMM and a column sum.
TEST(CudaKernels, LinearWeightAndBiasGradientsMatchTheCpu) {
  struct Extents {
    int64_t rows, out, in;
  };
  const GemmSettingsScope restore;
  for (bool epilogue : {true, false}) {
    SCOPED_TRACE(use_bias_grad_epilogue(epilogue));
    for (DType d : {DType::BF16, DType::F16}) {
      for (const Extents e : {Extents{64, 48, 40}, Extents{256, 96, 32}, Extents{37, 24, 19}}) {
        for (double beta : {0.0, 1.0}) {
          SCOPED_TRACE(std::string(dtype_name(d)) + " rows " + std::to_string(e.rows) + " out " +
                       std::to_string(e.out) + " in " + std::to_string(e.in) + " beta " +
                       std::to_string(beta));
          const Tensor dy = cast(randn({e.rows, e.out}, 13, 1), d);
          const Tensor x = cast(randn({e.rows, e.in}, 13, 2), d);
          const Tensor gw = randn({e.out, e.in}, 13, 3), gb = randn({e.out}, 13, 4);
          Tensor cpu_gw = clone(gw), cpu_gb = clone(gb);
          backend_for(DeviceType::CPU).linear_weight_bias_grad(dy, x, cpu_gw, cpu_gb, beta);
          Tensor dev_gw = to_device(gw, kGpu), dev_gb = to_device(gb, kGpu);
          backend_for(DeviceType::CUDA)
              .linear_weight_bias_grad(to_device(dy, kGpu), to_device(x, kGpu), dev_gw, dev_gb,
                                       beta);
          // (f32 sums of exact products in another order: a few roundings of
          // partial sums that grow as the root of the rows.)
          const double tol = 2e-6 * std::sqrt(static_cast<double>(e.rows));
          const auto got = to_double_vector(dev_gw), want = to_double_vector(cpu_gw);
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "weight element " << i;
          const auto got_b = to_double_vector(dev_gb), want_b = to_double_vector(cpu_gb);
          for (size_t i = 0; i < want_b.size(); ++i)
            ASSERT_NEAR(got_b[i], want_b[i], tol * (1 + std::abs(want_b[i])))
                << "bias element " << i;
        }
      }
    }
  }
  Tensor gw = empty({24, 19}, DType::F32, kGpu), gb = empty({24}, DType::F32, kGpu);
  EXPECT_THROW(backend_for(DeviceType::CUDA)
                   .linear_weight_bias_grad(empty({37, 24}, DType::BF16, kGpu),
                                            empty({36, 19}, DType::BF16, kGpu), gw, gb, 0.0),
               ShapeError);
}

TEST(CudaKernels, SumRowsIntoMatchesTheCpu) {
  // Column sums added into an f32 accumulator (bias gradients): one pass
  // (few rows) and two stages (many), odd widths, widths of whole 16-byte
  // packs in every dtype (776: three tiles of 256 columns and part of one),
  // beta 0 over garbage and 1.
  for (int64_t rows : {int64_t{1}, int64_t{100}, int64_t{1000}}) {
    for (int64_t cols : {int64_t{1}, int64_t{37}, int64_t{300}, int64_t{776}}) {
      for (DType d : {DType::F32, DType::BF16, DType::F16}) {
        for (double beta : {0.0, 1.0}) {
          SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " " + dtype_name(d) +
                       " beta " + std::to_string(beta));
          const Tensor x = cast(randn({rows, cols}, 13, 1), d);
          const Tensor acc = beta == 0.0 ? full({cols}, std::nan("")) : randn({cols}, 13, 2);
          Tensor cpu_acc = clone(acc);
          backend_for(DeviceType::CPU).sum_rows_into(x, cpu_acc, beta);
          Tensor dev_acc = to_device(acc, kGpu);
          backend_for(DeviceType::CUDA).sum_rows_into(to_device(x, kGpu), dev_acc, beta);
          expect_close(to_double_vector(dev_acc), to_double_vector(cpu_acc), 1e-6, 1e-5, "sums");
        }
      }
    }
  }
  Tensor wrong = empty({5}, DType::F32, kGpu);
  EXPECT_THROW(
      backend_for(DeviceType::CUDA).sum_rows_into(empty({3, 4}, DType::F32, kGpu), wrong, 0.0),
      ShapeError);
  Tensor half_acc = empty({4}, DType::F16, kGpu);
  EXPECT_THROW(
      backend_for(DeviceType::CUDA).sum_rows_into(empty({3, 4}, DType::BF16, kGpu), half_acc, 0.0),
      ValueError);
}

TEST(CudaKernels, ParameterGradientsIntoBuffersMatchTheCpu) {
  // LayerNorm (plain and with the fused residual's dh; scaling by the
  // weight and by 1 + weight) and embedding backward adding into gradient
  // buffers: f32 under half values, the values' own dtype otherwise; beta 0
  // over NaN, and beta 1.
  for (DType d : {DType::F32, DType::BF16, DType::F16}) {
    const std::vector<DType> buffers =
        d == DType::F32 ? std::vector<DType>{d} : std::vector<DType>{d, DType::F32};
    for (DType buf : buffers) {
      for (double beta : {0.0, 1.0}) {
        for (auto [with_dh, offset] :
             {std::pair{false, 0.0}, {true, 0.0}, {false, 1.0}, {true, 1.0}}) {
          SCOPED_TRACE(std::string(dtype_name(d)) + " into " + dtype_name(buf) + " beta " +
                       std::to_string(beta) + (with_dh ? " with dh" : "") + " offset " +
                       std::to_string(offset));
          const int64_t N = 300, C = 37;
          const Tensor x = cast(randn({N, C}, 14, 1), d), dy = cast(randn({N, C}, 14, 2), d);
          const Tensor dh = cast(randn({N, C}, 14, 3), d), w = cast(randn({C}, 14, 4), d);
          Tensor b = cast(randn({C}, 14, 5), d), y = empty({N, C}, d);
          Tensor mean = empty({N}, DType::F32), rstd = empty({N}, DType::F32);
          backend_for(DeviceType::CPU).layer_norm_forward(x, w, b, 1e-5, y, mean, rstd, offset);
          const Tensor start =
              beta == 0.0 ? full({C}, std::nan(""), buf) : cast(randn({C}, 14, 6), buf);
          Tensor dx = empty({N, C}, d), dw = clone(start), db = clone(start);
          backend_for(DeviceType::CPU)
              .layer_norm_backward_into(dy, with_dh ? &dh : nullptr, x, w, mean, rstd, dx, dw, db,
                                        beta, offset);
          auto g = [](const Tensor& t) { return to_device(t, kGpu); };
          const Tensor gdh = g(dh);
          Tensor gdx = empty({N, C}, d, kGpu), gdw = g(start), gdb = g(start);
          backend_for(DeviceType::CUDA)
              .layer_norm_backward_into(g(dy), with_dh ? &gdh : nullptr, g(x), g(w), g(mean),
                                        g(rstd), gdx, gdw, gdb, beta, offset);
          const double tol = d == DType::F32 ? 1e-5 : 1e-2;
          expect_close(to_double_vector(gdx), to_double_vector(dx), tol, tol, "dx");
          const double ptol = buf == DType::F32 ? 1e-5 : 1e-2;
          expect_close(to_double_vector(gdw), to_double_vector(dw), ptol, ptol, "dweight");
          expect_close(to_double_vector(gdb), to_double_vector(db), ptol, ptol, "dbias");
        }
        SCOPED_TRACE(std::string("embedding ") + dtype_name(d) + " into " + dtype_name(buf) +
                     " beta " + std::to_string(beta));
        std::vector<int64_t> ids;
        for (int i = 0; i < 90; ++i) ids.push_back((i * 11) % 41);  // rows 41.. untouched
        const Tensor idt = from_vector(ids, {90});
        const Tensor dout = cast(randn({90, 24}, 15, 1), d);
        const Tensor start =
            beta == 0.0 ? full({64, 24}, std::nan(""), buf) : cast(randn({64, 24}, 15, 2), buf);
        Tensor acc = clone(start), gacc = to_device(start, kGpu);
        backend_for(DeviceType::CPU).embedding_backward_into(idt, dout, acc, beta);
        backend_for(DeviceType::CUDA)
            .embedding_backward_into(to_device(idt, kGpu), to_device(dout, kGpu), gacc, beta);
        const double ptol = buf == DType::F32 ? 1e-5 : 1e-2;
        expect_close(to_double_vector(gacc), to_double_vector(acc), ptol, ptol, "embedding");
      }
    }
  }
}

#ifdef TRIAD_CUDA_SIM
// LayerNorm and embedding parameters take their gradients straight from
// the backward kernels: with the f32 gradients already there (the second
// micro-batch), a bf16 LayerNorm's backward is its two kernels (dx with the
// column sums' first stage, then their second) and an embedding's its one,
// where a half gradient and then an add into f32 take two launches and one
// more; a broadcast bias's add, one (a sum and an add before).
TEST(CudaRuntime, HalfLayerNormAndEmbeddingGradientsAddNoLaunches) {
  Tensor w = to_device(cast(randn({32}, 16, 1), DType::BF16), kGpu).detach();
  Tensor b = to_device(cast(randn({32}, 16, 2), DType::BF16), kGpu).detach();
  Tensor table = to_device(cast(randn({50, 32}, 16, 3), DType::BF16), kGpu).detach();
  for (Tensor* t : {&w, &b, &table}) t->set_requires_grad(true);
  std::vector<int64_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back((i * 5) % 50);
  const Tensor idt = to_device(from_vector(ids, {24}), kGpu);
  std::vector<int64_t> ln_launches, emb_launches;
  for (int micro = 0; micro < 2; ++micro) {
    const Tensor x = to_device(cast(randn({24, 32}, 17, micro), DType::BF16), kGpu);
    const Tensor dy = to_device(cast(randn({24, 32}, 18, micro), DType::BF16), kGpu);
    const Tensor y = layer_norm(x, w, b), e = embedding(table, idt);
    cuda::synchronize(0);
    int64_t before = triad_sim::counters().launches;
    autograd::backward({y}, {dy});
    cuda::synchronize(0);
    ln_launches.push_back(triad_sim::counters().launches - before);
    before = triad_sim::counters().launches;
    autograd::backward({e}, {dy});
    cuda::synchronize(0);
    emb_launches.push_back(triad_sim::counters().launches - before);
  }
  EXPECT_EQ(ln_launches, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(emb_launches, (std::vector<int64_t>{1, 1}));
  for (Tensor* t : {&w, &b, &table}) EXPECT_EQ(t->grad().dtype(), DType::F32);
  // A bias added by add() (the row-parallel layers'): its column sums only.
  const Tensor x = to_device(cast(randn({24, 32}, 19, 1), DType::BF16), kGpu);
  for (int micro = 0; micro < 2; ++micro) {
    const Tensor y = add(x, b);
    const Tensor dy = to_device(cast(randn({24, 32}, 20, micro), DType::BF16), kGpu);
    cuda::synchronize(0);
    const int64_t before = triad_sim::counters().launches;
    autograd::backward({y}, {dy});
    cuda::synchronize(0);
    EXPECT_EQ(triad_sim::counters().launches - before, 1) << "micro-batch " << micro;
  }
}

// Norms scaling by 1 + weight (Gemma's RMSNorm, Nemotron's LayerNorm1P)
// add the offset inside their kernels: a bf16 norm module is one launch
// forward and two backward, as without the offset (forming 1 + weight
// before the norm would add a launch forward and its gradient's conversion
// and add backward).
TEST(CudaRuntime, UnitOffsetNormsAddTheOffsetInTheirKernels) {
  for (bool rms : {false, true}) {
    SCOPED_TRACE(rms ? "rms_norm" : "layer_norm");
    nn::LayerNorm norm(32, 1e-5, DType::BF16, rms, /*unit_offset=*/true);
    norm.to(kGpu);
    std::vector<int64_t> forward, backward;
    for (int micro = 0; micro < 2; ++micro) {
      const Tensor x = to_device(cast(randn({24, 32}, 21, micro), DType::BF16), kGpu);
      const Tensor dy = to_device(cast(randn({24, 32}, 22, micro), DType::BF16), kGpu);
      cuda::synchronize(0);
      int64_t before = triad_sim::counters().launches;
      const Tensor y = norm.forward(x);
      cuda::synchronize(0);
      forward.push_back(triad_sim::counters().launches - before);
      before = triad_sim::counters().launches;
      autograd::backward({y}, {dy});
      cuda::synchronize(0);
      backward.push_back(triad_sim::counters().launches - before);
    }
    EXPECT_EQ(forward, (std::vector<int64_t>{1, 1}));
    EXPECT_EQ(backward, (std::vector<int64_t>{2, 2}));
    for (const auto& [name, p] : norm.named_parameters()) {
      EXPECT_EQ(p.grad().dtype(), DType::F32) << name;
    }
  }
}

// A bf16 linear layer's weight gradient is one GEMM into the f32 gradient:
// no kernel besides the GEMMs (a bf16 product and then a conversion or an
// add into f32, one launch more, fail this), and the f32 sum of the exact
// products (a bf16-rounded product would be off by ~2^-9 of its size).
TEST(CudaRuntime, AHalfLinearWeightGradientIsOneGemmIntoTheF32Gradient) {
  const GemmSettingsScope restore;
  for (bool epilogue : {false, true}) {
    SCOPED_TRACE(use_bias_grad_epilogue(epilogue));
    Tensor w = to_device(cast(randn({24, 40}, 12, 1), DType::BF16), kGpu).detach();
    Tensor b = to_device(cast(randn({24}, 12, 9), DType::BF16), kGpu).detach();
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    std::vector<double> want(24 * 40, 0.0), want_b(24, 0.0);
    for (uint64_t micro = 0; micro < 2; ++micro) {
      const Tensor x = cast(randn({16, 40}, 12, 2 + micro), DType::BF16);
      const Tensor dy = cast(randn({16, 24}, 12, 4 + micro), DType::BF16);
      const Tensor y = linear(to_device(x, kGpu), w, b);
      const Tensor dy_dev = to_device(dy, kGpu);
      cuda::synchronize(0);
      const int64_t before = triad_sim::counters().launches;
      autograd::backward({y}, {dy_dev});
      cuda::synchronize(0);
      // Besides the GEMMs, only the bias's column sums, straight into its
      // f32 gradient (a bf16 sum and then an add or conversion: 2); or, with
      // the epilogue, no launch into a fresh gradient and one small add into
      // the second micro-batch's.
      EXPECT_EQ(triad_sim::counters().launches - before, epilogue && micro == 0 ? 0 : 1)
          << "micro-batch " << micro;
      const auto xv = to_double_vector(x), dv = to_double_vector(dy);
      for (size_t o = 0; o < 24; ++o)
        for (size_t r = 0; r < 16; ++r) want_b[o] += dv[r * 24 + o];
      for (size_t o = 0; o < 24; ++o)
        for (size_t i = 0; i < 40; ++i)
          for (size_t r = 0; r < 16; ++r) want[o * 40 + i] += dv[r * 24 + o] * xv[r * 40 + i];
    }
    ASSERT_EQ(w.grad().dtype(), DType::F32);
    const auto got = to_double_vector(w.grad());
    for (size_t k = 0; k < want.size(); ++k)
      ASSERT_NEAR(got[k], want[k], 2e-6 * (1 + std::abs(want[k]))) << "element " << k;
    ASSERT_EQ(b.grad().dtype(), DType::F32);
    const auto got_b = to_double_vector(b.grad());
    for (size_t k = 0; k < want_b.size(); ++k)
      ASSERT_NEAR(got_b[k], want_b[k], 2e-6 * (1 + std::abs(want_b[k]))) << "bias element " << k;
  }
}

// cuda::GemmSettings::autotune on the device: products whose algorithms
// were timed among cuBLASLt's candidates still match the CPU, the first call
// (the one that times them) included, for a plain bf16 product, a linear
// layer's bias + GELU epilogue (timed in place) and a weight gradient added
// into its f32 buffer (timed into scratch, so it is added once); and
// gemm_tuning() counts them. (On the simulator the stand-in offers two
// algorithms, the first slow.)
TEST(CudaRuntime, AutotunedProductsMatchTheCpu) {
  const GemmSettingsScope restore;
  cuda::GemmSettings settings;
  settings.autotune = 8;
  cuda::set_gemm_settings(settings);
#ifdef TRIAD_CUDA_SIM
  testing::mock_cublaslt::set_algorithms({1.0, 0.0});
#endif
  const cuda::GemmTuning before = cuda::gemm_tuning(0);
  const Tolerance t = tolerance(DType::BF16);
  // (Shapes no other test uses, so that each is a problem of its own.)
  const Tensor x = cast(randn({264, 136}, 15, 1), DType::BF16);
  const Tensor w = cast(randn({200, 136}, 15, 2), DType::BF16);
  const Tensor bias = cast(randn({200}, 15, 3), DType::BF16);
  for (int call = 0; call < 2; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    Tensor cpu_y = empty({264, 200}, DType::BF16, Device::cpu());
    backend_for(DeviceType::CPU).gemm(x, w, cpu_y, false, true, 1.0, 0.0);
    Tensor dev_y = empty({264, 200}, DType::BF16, kGpu);
    backend_for(DeviceType::CUDA)
        .gemm(to_device(x, kGpu), to_device(w, kGpu), dev_y, false, true, 1.0, 0.0);
    expect_close(to_double_vector(dev_y), to_double_vector(cpu_y), t.rtol, t.atol, "product");

    Tensor cpu_pre = empty({264, 200}, DType::BF16, Device::cpu()), cpu_g = clone(cpu_pre);
    backend_for(DeviceType::CPU).linear_forward(x, w, bias, cpu_g, &cpu_pre);
    Tensor dev_pre = empty({264, 200}, DType::BF16, kGpu), dev_g = clone(dev_pre);
    backend_for(DeviceType::CUDA)
        .linear_forward(to_device(x, kGpu), to_device(w, kGpu), to_device(bias, kGpu), dev_g,
                        &dev_pre);
    expect_close(to_double_vector(dev_pre), to_double_vector(cpu_pre), t.rtol, t.atol,
                 "pre-activation");
    expect_close(to_double_vector(dev_g), to_double_vector(cpu_g), t.rtol, t.atol, "GELU");

    const Tensor dy = cast(randn({264, 200}, 15, 4), DType::BF16);
    const Tensor gw = randn({200, 136}, 15, 5);
    Tensor cpu_gw = clone(gw), dev_gw = to_device(gw, kGpu);
    backend_for(DeviceType::CPU).gemm(dy, x, cpu_gw, true, false, 1.0, 1.0);
    backend_for(DeviceType::CUDA)
        .gemm(to_device(dy, kGpu), to_device(x, kGpu), dev_gw, true, false, 1.0, 1.0);
    expect_close(to_double_vector(dev_gw), to_double_vector(cpu_gw), 1e-4, 1e-4,
                 "weight gradient added once");
  }
  cuda::synchronize(0);
  const cuda::GemmTuning after = cuda::gemm_tuning(0);
  EXPECT_EQ(after.untimed, before.untimed);
  EXPECT_GE(after.problems - before.problems, 3);
#ifdef TRIAD_CUDA_SIM
  testing::mock_cublaslt::reset();
#endif
}

// Where cuBLASLt has no bias-gradient epilogue for the problem, or
// cuda::GemmSettings::bias_grad_epilogue is off, the gradients are the same,
// from a plain GEMM and the column-sum kernel; where it has one, the product
// carries the epilogue and no column-sum kernel is launched.
TEST(CudaRuntime, ALinearsBiasGradientWithoutAnEpilogueAlgorithmIsTheSame) {
  namespace mock = testing::mock_cublaslt;
  // (Each case a shape of its own: the backend remembers a problem without
  // an algorithm for good.)
  const GemmSettingsScope restore;
  auto check = [&](int64_t rows, bool epilogue_algorithms, bool setting, int64_t launches,
                   int64_t epilogues) {
    SCOPED_TRACE("rows " + std::to_string(rows) + ", " + use_bias_grad_epilogue(setting));
    const Tensor dy = cast(randn({rows, 40}, 14, 1), DType::BF16);
    const Tensor x = cast(randn({rows, 24}, 14, 2), DType::BF16);
    const Tensor gw = randn({40, 24}, 14, 3), gb = randn({40}, 14, 4);
    Tensor cpu_gw = clone(gw), cpu_gb = clone(gb);
    backend_for(DeviceType::CPU).linear_weight_bias_grad(dy, x, cpu_gw, cpu_gb, 1.0);
    Tensor dev_gw = to_device(gw, kGpu), dev_gb = to_device(gb, kGpu);
    const Tensor dev_dy = to_device(dy, kGpu), dev_x = to_device(x, kGpu);
    cuda::synchronize(0);
    mock::reset();
    mock::set_no_bias_grad_algorithms(!epilogue_algorithms);
    const int64_t before = triad_sim::counters().launches;
    backend_for(DeviceType::CUDA).linear_weight_bias_grad(dev_dy, dev_x, dev_gw, dev_gb, 1.0);
    cuda::synchronize(0);
    EXPECT_EQ(triad_sim::counters().launches - before, launches);
    EXPECT_EQ(mock::counters().epilogue_matmuls, epilogues);
    mock::reset();
    const auto got = to_double_vector(dev_gw), want = to_double_vector(cpu_gw);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << "weight element " << i;
    const auto got_b = to_double_vector(dev_gb), want_b = to_double_vector(cpu_gb);
    for (size_t i = 0; i < want_b.size(); ++i)
      ASSERT_NEAR(got_b[i], want_b[i], 1e-5 * (1 + std::abs(want_b[i]))) << "bias element " << i;
  };
  check(48, true, true, 1, 1);   // the epilogue; its sums added into gb (beta 1)
  check(56, false, true, 1, 0);  // a plain product and the column-sum kernel
  // (cuda::GemmSettings::bias_grad_epilogue false: the same, by choice.)
  check(48, true, false, 1, 0);
}

// linear_cross_entropy with expected_grad: one cross_entropy_forward_backward
// launch where the forward and backward kernels ran, giving their bits
// (the loss and every gradient; a biased, soft-capped head too; f32 and
// bf16, padded rows, an ignored row) and the CPU's values. Backward reads
// no logits when the gradient that came is the one expected (one
// scale_by_ratio launch that changes nothing) and rescales when it is not.
// A z-loss joining the loss's gradient (a GPT head's model.z_loss_coef)
// rides in the same launch, its value the CPU's too.
TEST(CudaRuntime, AHeadsGradientWrittenWithItsLossIsTheSameGradient) {
  for (DType d : {DType::F32, DType::BF16}) {
    for (const auto& [biased, with_z] : {std::pair{false, false}, std::pair{true, false},
                                         std::pair{false, true}, std::pair{true, true}}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + (biased ? ", biased and capped" : "") +
                   (with_z ? ", a z-loss" : ""));
      using Calls = std::map<std::string, int64_t>;
      auto run = [&](Device dev, double expected, double seed, Calls* calls) {
        auto leaf = [&](const Tensor& t) {
          Tensor p = to_device(cast(t, d), dev).detach();
          p.set_requires_grad(true);
          return p;
        };
        Tensor x = leaf(randn({3, 7, 16}, 41, 1)), w = leaf(randn({301, 16}, 41, 2, 0.3)),
               b = biased ? leaf(randn({301}, 41, 3)) : Tensor();
        std::vector<int64_t> t;
        for (int64_t i = 0; i < 21; ++i) t.push_back(i == 6 ? -100 : (i * 37 + 5) % 301);
        const Tensor targets = from_vector(t, {3, 7}, DType::I64);
        if (calls) {
          cuda::set_op_profiling(true);
          cuda::op_profile(0);  // (clears what came before)
        }
        Tensor z;
        const Tensor loss = linear_cross_entropy(x, w, targets, -100, biased ? 3.0 : 0.0, b,
                                                 with_z ? &z : nullptr, expected, 0.02);
        autograd::backward({loss}, {full({}, seed, loss.dtype(), dev)});
        if (dev.is_cuda()) cuda::synchronize(0);
        if (calls) {
          for (const cuda::OpTime& op : cuda::op_profile(0)) (*calls)[op.op] = op.calls;
          cuda::set_op_profiling(false);
        }
        return std::vector<std::vector<double>>{
            to_double_vector(loss), to_double_vector(x.grad()), to_double_vector(w.grad()),
            biased ? to_double_vector(b.grad()) : std::vector<double>{},
            with_z ? to_double_vector(z) : std::vector<double>{}};
      };
      Calls plain_calls, ahead_calls, other_calls;
      const auto cpu = run(Device::cpu(), 0.0, 0.37, nullptr);
      const auto plain = run(kGpu, 0.0, 0.37, &plain_calls);
      const auto ahead = run(kGpu, 0.37, 0.37, &ahead_calls);
      const auto other = run(kGpu, 0.5, 0.37, &other_calls);
      const double tol = d == DType::F32 ? 1e-4 : 3e-2;
      const char* names[] = {"loss", "dx", "dw", "db", "z-loss"};
      for (size_t i = 0; i < cpu.size(); ++i) {
        EXPECT_EQ(ahead[i], plain[i]) << names[i];
        expect_close(plain[i], cpu[i], tol, tol, names[i]);
        expect_close(other[i], cpu[i], tol, tol, names[i]);
      }
      EXPECT_EQ(plain_calls["cross_entropy_forward"], 1);
      EXPECT_EQ(plain_calls["cross_entropy_backward"], 1);
      EXPECT_EQ(plain_calls["cross_entropy_forward_backward"], 0);
      for (Calls* c : {&ahead_calls, &other_calls}) {
        EXPECT_EQ((*c)["cross_entropy_forward"], 0);
        EXPECT_EQ((*c)["cross_entropy_backward"], 0);
        EXPECT_EQ((*c)["cross_entropy_forward_backward"], 1);
        EXPECT_EQ((*c)["scale_by_ratio"], 1);
      }
    }
  }
}

// cuda::GemmSettings::dgelu_bias_grad_epilogue: an MLP's first bias
// gradient from the second layer's GELU-derivative product (its epilogue's
// column sums: f32, or where cuBLASLt offers those for no algorithm, the
// gradient's own type), added into the bias's gradient over two
// micro-batches, in f32 and bf16, equal to the CPU's; and where the
// pre-activation's gradient has another part (pre used again), the sums the
// epilogue made are not that gradient's, so the column sums run as before
// and the gradient still is the CPU's. Setting off: no such product.
TEST(CudaRuntime, AnMlpsFirstBiasGradientCanComeFromTheGeluDerivativeProduct) {
  namespace mock = testing::mock_cublaslt;
  const GemmSettingsScope restore;
  const int64_t C = 16, H = 64;
  enum class Sums { Kernel, Epilogue, EpilogueOwnType };
  for (DType d : {DType::F32, DType::BF16}) {
    for (bool pre_used_again : {false, true}) {
      // (Each variant its own rows: the backend remembers a problem cuBLASLt
      // has no algorithm for.)
      auto grads = [&](Device dev, Sums how, int64_t rows, mock::Counters* seen,
                       int64_t* timed = nullptr) {
        cuda::GemmSettings settings;
        settings.dgelu_bias_grad_epilogue = how != Sums::Kernel;
        settings.verify = how != Sums::Kernel;  // (the fused products against the reference too)
        cuda::set_gemm_settings(settings);
        cuda::reset_gemm_verification();
        auto leaf = [&](const Tensor& t) {
          Tensor p = to_device(cast(t, d), dev).detach();
          p.set_requires_grad(true);
          return p;
        };
        Tensor w1 = leaf(randn({H, C}, 31, 1, 0.3)), b1 = leaf(randn({H}, 31, 2)),
               w2 = leaf(randn({C, H}, 31, 3, 0.3)), b2 = leaf(randn({C}, 31, 4));
        mock::reset();
        mock::set_no_f32_bias_grad_algorithms(how == Sums::EpilogueOwnType);
        if (timed) {
          cuda::set_op_profiling(true);
          cuda::op_profile(0);  // (clears what came before)
        }
        for (uint64_t micro = 0; micro < 2; ++micro) {  // the second adds into the first
          const Tensor x = to_device(cast(randn({rows, C}, 32, micro), d), dev);
          const Tensor r = to_device(cast(randn({rows, C}, 33, micro), d), dev);
          const LinearGelu parts = linear_gelu_parts(x, w1, b1);
          Tensor loss = sum(mul(linear_after_gelu(parts, w2, b2), r));
          if (pre_used_again) loss = add(loss, sum(mul(parts.pre, parts.pre)));
          autograd::backward({loss});
        }
        if (dev.is_cuda()) cuda::synchronize(0);
        if (seen) *seen = mock::counters();
        if (timed) {
          *timed = 0;
          for (const cuda::OpTime& t : cuda::op_profile(0))
            if (t.op == std::string("gelu_linear_input_grad_bias_sums")) *timed = t.calls;
          cuda::set_op_profiling(false);
        }
        mock::reset();
        return std::vector<std::vector<double>>{
            to_double_vector(b1.grad()), to_double_vector(w1.grad()), to_double_vector(b2.grad()),
            to_double_vector(w2.grad())};
      };
      SCOPED_TRACE(std::string(dtype_name(d)) + (pre_used_again ? ", pre used again" : ""));
      for (Sums how : {Sums::Kernel, Sums::Epilogue, Sums::EpilogueOwnType}) {
        if (how == Sums::EpilogueOwnType && d == DType::F32) continue;  // (f32 is its own type)
        SCOPED_TRACE(how == Sums::Kernel     ? "column sums"
                     : how == Sums::Epilogue ? "epilogue sums in f32"
                                             : "epilogue sums in bf16");
        const int64_t rows = 300 + 8 * static_cast<int64_t>(how) + (pre_used_again ? 4 : 0);
        const auto cpu = grads(Device::cpu(), Sums::Kernel, rows, nullptr);
        mock::Counters seen;
        int64_t timed = -1;
        const auto gpu = grads(kGpu, how, rows, &seen, &timed);
        EXPECT_EQ(seen.dgelu_bias_grad_matmuls, how == Sums::Kernel ? 0 : 2);
        // The op profile's calls: one a micro-batch, and where f32 sums are
        // refused, the first micro-batch's refused attempt (asked once).
        EXPECT_EQ(timed, how == Sums::Kernel ? 0 : how == Sums::Epilogue ? 2 : 3);
        EXPECT_EQ(seen.f32_bias_grad_matmuls, how == Sums::Epilogue ? 2 : 0);
        const cuda::GemmVerification v = cuda::gemm_verification();
        // (5 products a micro-batch, and the forward GELU epilogue's kept input.)
        EXPECT_EQ(v.checked, how == Sums::Kernel ? 0 : 2 * 6);
        EXPECT_EQ(v.failed, 0) << (v.failures.empty() ? "" : v.failures[0].problem);
        const double tol = d == DType::F32 ? 1e-4 : 3e-2;
        const char* names[] = {"b1", "w1", "b2", "w2"};
        for (size_t i = 0; i < cpu.size(); ++i) expect_close(gpu[i], cpu[i], tol, tol, names[i]);
      }
    }
  }
}

// A half-precision parameter's gradient arrives in its own dtype and is
// summed into the f32 gradient: one launch per parameter and microbatch,
// the same as the first microbatch's conversion (a conversion and then an
// add, one launch more, fail this).
TEST(CudaRuntime, AccumulatingAHalfGradientIsOneLaunch) {
  Tensor p = to_device(cast(randn({300}, 9, 1), DType::BF16), kGpu).detach();
  p.set_requires_grad(true);
  auto backward_launches = [&] {
    Tensor loss = sum(mul(p, p));
    cuda::synchronize(0);  // the simulator counts launches as they run
    const int64_t before = triad_sim::counters().launches;
    autograd::backward({loss});
    cuda::synchronize(0);
    return triad_sim::counters().launches - before;
  };
  const int64_t first = backward_launches();
  ASSERT_EQ(p.grad().dtype(), DType::F32);
  const int64_t second = backward_launches();
  EXPECT_EQ(second, first) << "first " << first;
  // And the sum is right: twice the gradient 2p, in f32.
  const auto g = to_double_vector(p.grad());
  const auto x = to_double_vector(p);
  for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], 4.0 * x[i], 1e-2 * std::abs(x[i]) + 1e-3);
}
#endif

TEST(CudaRuntime, AdamWMatchesTheCpuUpdate) {
  // The fused kernel on one flat buffer. bf16 buffers are updated in f32 and
  // rounded once, so the reference is the CPU's f32 update of the same
  // values, rounded to bf16 (the CPU backend itself refuses half-precision
  // optimizer state: the trainer keeps f32 masters).
  for (DType d : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(d));
    Tensor p = randn({1001}, 1, 1, 1.0, d), g = randn({1001}, 1, 2, 1.0, d);
    Tensor m = randn({1001}, 1, 3, 0.1, d), v = cast(rand_uniform({1001}, 1, 4, 0, 0.1), d);
    AdamWStep hp;
    hp.lr = 1e-2;
    hp.weight_decay = 0.1;
    hp.step = 3;
    Tensor pd = to_device(p, kGpu), gd = to_device(g, kGpu), md = to_device(m, kGpu),
           vd = to_device(v, kGpu);
    Tensor p32 = cast(p, DType::F32), m32 = cast(m, DType::F32), v32 = cast(v, DType::F32);
    backend_for(DeviceType::CPU).adamw(p32, cast(g, DType::F32), m32, v32, hp);
    backend_for(DeviceType::CUDA).adamw(pd, gd, md, vd, hp);
    // bf16: equal to the rounded f32 result up to one rounding step.
    const double rtol = d == DType::F32 ? 1e-5 : 1.0 / 128;
    expect_close(to_double_vector(pd), to_double_vector(cast(p32, d)), rtol, 1e-6, "param");
    expect_close(to_double_vector(md), to_double_vector(cast(m32, d)), rtol, 1e-6, "m");
    expect_close(to_double_vector(vd), to_double_vector(cast(v32, d)), rtol, 1e-6, "v");
  }
  // bf16 moments beside an f32 parameter (train.moment_precision): the
  // CPU's step on the same values, the moments within one rounding step.
  Tensor p = randn({1001}, 2, 1, 1.0), g = randn({1001}, 2, 2, 1.0);
  Tensor m = randn({1001}, 2, 3, 0.1, DType::BF16),
         v = cast(rand_uniform({1001}, 2, 4, 0, 0.1), DType::BF16);
  AdamWStep hp;
  hp.lr = 1e-2;
  hp.weight_decay = 0.1;
  hp.step = 3;
  hp.grad_scale = 0.5;
  Tensor pd = to_device(p, kGpu), gd = to_device(g, kGpu), md = to_device(m, kGpu),
         vd = to_device(v, kGpu);
  Tensor pc = clone(p), mc = clone(m), vc = clone(v);
  backend_for(DeviceType::CPU).adamw(pc, g, mc, vc, hp);
  backend_for(DeviceType::CUDA).adamw(pd, gd, md, vd, hp);
  EXPECT_EQ(md.dtype(), DType::BF16);
  expect_close(to_double_vector(pd), to_double_vector(pc), 1e-5, 1e-6, "param (bf16 moments)");
  expect_close(to_double_vector(md), to_double_vector(mc), 1.0 / 128, 1e-6, "m (bf16)");
  expect_close(to_double_vector(vd), to_double_vector(vc), 1.0 / 128, 1e-6, "v (bf16)");
  // Moments of another type beside f32 are refused by name.
  Tensor m16 = to_device(cast(m, DType::F16), kGpu), v16 = to_device(cast(v, DType::F16), kGpu);
  EXPECT_THROW(backend_for(DeviceType::CUDA).adamw(pd, gd, m16, v16, hp), ValueError);
}

TEST(CudaRuntime, MultiTensorAdamWStepMatchesTheCpuOptimizer) {
  // 52 parameters (more than one launch holds), two larger than a chunk,
  // matrices with weight decay and vectors without: the optimizer's step on
  // the GPU (multi-tensor launches) against the same step on the CPU, f32
  // in place and bf16 through f32 masters.
  auto label = [](const char* what, size_t i) {
    std::string s = what;  // (appending avoids GCC 12's -Wrestrict false alarm)
    s += std::to_string(i);
    return s;
  };
  // Each with f32 moments and with bf16 ones (train.moment_precision), and
  // bf16 parameters with bf16 gradients too (train.grad_precision).
  for (const auto& [d, moments, grads] : {std::tuple{DType::F32, DType::F32, DType::F32},
                                          {DType::BF16, DType::F32, DType::F32},
                                          {DType::F32, DType::BF16, DType::F32},
                                          {DType::BF16, DType::BF16, DType::F32},
                                          {DType::BF16, DType::F32, DType::BF16},
                                          {DType::BF16, DType::BF16, DType::BF16}}) {
    SCOPED_TRACE(std::string(dtype_name(d)) + " moments " + dtype_name(moments) + " gradients " +
                 dtype_name(grads));
    std::vector<std::pair<std::string, Tensor>> cpu, gpu;
    for (int i = 0; i < 52; ++i) {
      const Shape shape = i == 3 || i == 47 ? Shape{300, 250} : i % 2 ? Shape{17, 9} : Shape{33};
      Tensor p = randn(shape, 2, static_cast<uint64_t>(i), 1.0, d);
      cpu.push_back({label("p", static_cast<size_t>(i)), p});
      gpu.push_back({label("p", static_cast<size_t>(i)), to_device(p, kGpu).detach()});
    }
    optim::AdamWOptions o;
    o.weight_decay = 0.1;
    o.moment_dtype = moments;
    optim::AdamW opt_cpu(cpu, o), opt_gpu(gpu, o);
    ASSERT_EQ(opt_gpu.state()[0].m.dtype(), moments);
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < cpu.size(); ++i) {
        // Half leaves accumulate f32 gradients (or bf16 ones).
        Tensor g =
            randn(cpu[i].second.shape(), 3, static_cast<uint64_t>(100 * step + i), 1.0, grads);
        cpu[i].second.set_grad(g);
        gpu[i].second.set_grad(to_device(g, kGpu));
      }
      opt_cpu.step(1e-2, 0.7);
      opt_gpu.step(1e-2, 0.7);
    }
    const Tolerance t = tolerance(d);
    for (size_t i = 0; i < cpu.size(); ++i) {
      expect_close(to_double_vector(gpu[i].second), to_double_vector(cpu[i].second), t.rtol, 1e-6,
                   label("param ", i));
      // bf16 moments: within one rounding step of the CPU's, of the
      // moment's own value or of the tensor's largest. Each step rounds the
      // moments, and the GPU may contract beta * m + (1 - beta) * g into one
      // fused multiply-add where the CPU rounds twice; a value one rounding
      // apart after step 1 stays that far apart when later gradients cancel
      // the moment down (the H200, 2026-12-04: m -0.0503 against the CPU's
      // -0.0498, two of bf16's steps at that value but within one at the
      // tensor's largest). The whole-tensor error stays held to rtol / 2.
      const double mtol = moments == DType::F32 ? 1e-5 : 1.0 / 128;
      auto moment_close = [&](const Tensor& got, const Tensor& want, const std::string& what) {
        const std::vector<double> w = to_double_vector(want);
        double largest = 0;
        for (double x : w) largest = std::max(largest, std::abs(x));
        const double atol = moments == DType::F32 ? 1e-6 : mtol * largest / (1 + largest);
        expect_close(to_double_vector(got), w, mtol, atol, what);
      };
      moment_close(opt_gpu.state()[i].m, opt_cpu.state()[i].m, label("m ", i));
      moment_close(opt_gpu.state()[i].v, opt_cpu.state()[i].v, label("v ", i));
    }
  }
}

#ifdef TRIAD_CUDA_SIM
// A backend destroyed while the CUDA runtime unloads, as a static's
// destructor at exit is (every GPU benchmark ended in std::terminate this way
// on the H200, 2026-12-04: cudaGetDevice answered cudaErrorCudartUnloading
// inside the allocator's teardown), gives its memory back without throwing.
TEST(CudaRuntime, ABackendDestroyedAsTheRuntimeUnloadsEndsQuietly) {
  auto backend = std::make_unique<detail::CudaBackend>();
  Allocator& a = backend->allocator(0);
  void* handed_out = a.allocate(1 << 20);  // still held when the backend goes
  ASSERT_NE(handed_out, nullptr);
  a.deallocate(a.allocate(1 << 16), 1 << 16);  // cached
  EXPECT_GT(a.stats().reserved, 0);
  triad_sim::set_runtime_unloading(true);
  EXPECT_NO_THROW(backend.reset());
  triad_sim::set_runtime_unloading(false);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // nothing left behind for the next call
}
#endif

// The clipping coefficient folded into the step gives the same bits on the
// GPU as scaling the gradients first: the multi-tensor kernel (f32, and
// bf16 through masters) and the single-tensor one (bf16 gradients, rounded
// to bf16 after scaling as a scale of them would be).
TEST(CudaRuntime, AdamWGradScaleEqualsScalingTheGradientsFirst) {
  const double coef = 0.3718;
  for (DType d : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(d));
    std::vector<std::pair<std::string, Tensor>> scaled, folded;
    for (int i = 0; i < 18; ++i) {
      Tensor p = to_device(randn({i == 2 ? 40000 : 37}, 6, static_cast<uint64_t>(i), 1.0, d), kGpu);
      std::string name = "p";  // (appending avoids GCC 12's -Wrestrict false alarm)
      name += std::to_string(i);
      scaled.push_back({name, clone(p).detach()});
      folded.push_back({name, clone(p).detach()});
    }
    optim::AdamWOptions o;
    o.weight_decay = 0.1;
    optim::AdamW opt_scaled(scaled, o), opt_folded(folded, o);
    for (int step = 0; step < 2; ++step) {
      for (size_t i = 0; i < scaled.size(); ++i) {
        Tensor g = to_device(randn(scaled[i].second.shape(), 7,
                                   static_cast<uint64_t>(100 * step + i), 2.0, DType::F32),
                             kGpu);
        Tensor gs = clone(g).detach();
        scale_(gs, coef);
        scaled[i].second.set_grad(gs);
        folded[i].second.set_grad(g);
      }
      opt_scaled.step(1e-2);
      opt_folded.step(1e-2, coef);
    }
    for (size_t i = 0; i < scaled.size(); ++i) {
      ASSERT_EQ(to_double_vector(folded[i].second), to_double_vector(scaled[i].second)) << i;
    }
  }
  // Single-tensor kernel, bf16 throughout.
  Tensor p1 = to_device(randn({999}, 8, 1, 1.0, DType::BF16), kGpu), p2 = clone(p1).detach();
  Tensor g = to_device(randn({999}, 8, 2, 3.0, DType::BF16), kGpu);
  Tensor m1 = zeros({999}, DType::BF16, kGpu), v1 = zeros({999}, DType::BF16, kGpu);
  Tensor m2 = zeros({999}, DType::BF16, kGpu), v2 = zeros({999}, DType::BF16, kGpu);
  AdamWStep hp;
  hp.lr = 1e-2;
  Tensor gs = scale(g, coef);
  backend_for(p1).adamw(p1, gs, m1, v1, hp);
  hp.grad_scale = coef;
  backend_for(p2).adamw(p2, g, m2, v2, hp);
  EXPECT_EQ(to_double_vector(p2), to_double_vector(p1));
  EXPECT_EQ(to_double_vector(v2), to_double_vector(v1));
}

// Clipping decided on the device (AdamW::step_clipped): the multi-tensor
// launches read the sum of squares where it is, so the step queues without
// a wait, and give the same bits as step() with the coefficient the host
// computes from the global norm, binding or not, f32 in place and bf16
// through masters; a sum that is not finite leaves everything as it was.
TEST(CudaRuntime, AdamWClippedOnTheDeviceIsTheHostsClippedStep) {
  for (DType d : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(d));
    std::vector<std::pair<std::string, Tensor>> host, device;
    std::vector<Tensor> host_params;
    for (int i = 0; i < 18; ++i) {
      Tensor p = to_device(randn({i == 2 ? 40000 : 37}, 6, static_cast<uint64_t>(i), 1.0, d), kGpu);
      std::string name = "p";  // (appending avoids GCC 12's -Wrestrict false alarm)
      name += std::to_string(i);
      host.push_back({name, clone(p).detach()});
      device.push_back({name, clone(p).detach()});
      host_params.push_back(host.back().second);
    }
    optim::AdamWOptions o;
    o.weight_decay = 0.1;
    optim::AdamW opt_host(host, o), opt_device(device, o);
    for (int step = 0; step < 3; ++step) {
      const double max_norm = step == 1 ? 1e6 : 2.0;
      std::vector<Tensor> grads;
      for (size_t i = 0; i < host.size(); ++i) {
        Tensor g = to_device(
            randn(host[i].second.shape(), 7, static_cast<uint64_t>(100 * step + i), 2.0), kGpu);
        host[i].second.set_grad(clone(g).detach());
        device[i].second.set_grad(g);
        grads.push_back(g);
      }
      const double norm = optim::global_grad_norm(host_params);
      const double coef = std::min(1.0, max_norm / (norm + 1e-6));
      if (step != 1) {
        EXPECT_LT(coef, 0.1);
      }
      opt_host.step(1e-2, coef);
      const Tensor sum = optim::sum_of_squares_device(grads);
#ifdef TRIAD_CUDA_SIM
      const int64_t waits = triad_sim::counters().host_waits;
#endif
      opt_device.step_clipped(1e-2, sum, max_norm);
#ifdef TRIAD_CUDA_SIM
      EXPECT_EQ(triad_sim::counters().host_waits, waits);
#endif
    }
    for (size_t i = 0; i < host.size(); ++i) {
      ASSERT_EQ(to_double_vector(device[i].second), to_double_vector(host[i].second)) << i;
      ASSERT_EQ(to_double_vector(opt_device.state()[i].v), to_double_vector(opt_host.state()[i].v))
          << i;
    }
    // An infinite gradient: the kernels leave every tensor as it was.
    std::vector<std::vector<double>> before;
    for (const auto& s : opt_device.state()) {
      before.push_back(to_double_vector(s.param));
      before.push_back(to_double_vector(s.m));
      if (s.master.defined()) before.push_back(to_double_vector(s.master));
    }
    std::vector<Tensor> grads;
    for (auto& [name, p] : device) {
      Tensor g = to_device(randn(p.shape(), 8, 1), kGpu);
      p.set_grad(g);
      grads.push_back(g);
    }
    fill_(grads[5], INFINITY);
    opt_device.step_clipped(1e-2, optim::sum_of_squares_device(grads), 1.0);
    size_t at = 0;
    for (const auto& s : opt_device.state()) {
      EXPECT_EQ(to_double_vector(s.param), before[at++]) << s.name;
      EXPECT_EQ(to_double_vector(s.m), before[at++]) << s.name;
      if (s.master.defined()) {
        EXPECT_EQ(to_double_vector(s.master), before[at++]) << s.name;
      }
    }
    // The sum must be on the parameters' device.
    EXPECT_THROW(opt_device.step_clipped(1e-2, zeros({1}, DType::F64), 1.0), ValueError);
  }
}

// Token ids and targets (B, T) over a vocabulary of 97, on the host.
std::pair<Tensor, Tensor> token_batch(int64_t B, int64_t T) {
  std::vector<int64_t> tokens(static_cast<size_t>(B * T)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int64_t>((i * 31 + 7) % 97);
    targets[i] = static_cast<int64_t>((i * 17 + 3) % 97);
  }
  return {from_vector(tokens, {B, T}, DType::I64), from_vector(targets, {B, T}, DType::I64)};
}

TEST(CudaModel, TinyGptLossAndGradientsMatchTheCpu) {
  const nn::GptConfig cfg{
      .n_layer = 2, .n_head = 4, .d_model = 64, .vocab_size = 97, .seq_len = 32, .dropout = 0.1};
  nn::Gpt cpu_model(cfg, 1234), gpu_model(cfg, 1234);
  gpu_model.to(kGpu);
  const auto [ids, tg] = token_batch(2, 32);
  // Dropout on: the masks are the same counter-based draws on both devices.
  const nn::ForwardContext ctx{.training = true, .seed = 5, .call = 1};
  Tensor cpu_loss = cpu_model.loss(ids, tg, ctx);
  Tensor gpu_loss = gpu_model.loss(to_device(ids, kGpu), to_device(tg, kGpu), ctx);
  EXPECT_NEAR(item(gpu_loss), item(cpu_loss), 1e-5 * std::abs(item(cpu_loss)));
  autograd::backward({cpu_loss});
  autograd::backward({gpu_loss});
  auto cp = cpu_model.named_parameters(), gp = gpu_model.named_parameters();
  ASSERT_EQ(cp.size(), gp.size());
  for (size_t i = 0; i < cp.size(); ++i) {
    EXPECT_EQ(gp[i].second.device(), kGpu) << gp[i].first;
    expect_close(to_double_vector(gp[i].second.grad()), to_double_vector(cp[i].second.grad()), 1e-3,
                 1e-5, gp[i].first);
  }
}

// A training step's heads write their logits' gradients with their losses
// (linear_cross_entropy's expected_grad): the model's head with
// ctx.loss_grad, each multi-token prediction depth with its share of the
// MTP weight. No cross entropy runs in backward, where each head's check
// finds the gradient it expected; the loss and gradients are the CPU's.
TEST(CudaModel, EveryHeadWritesItsGradientWithItsLoss) {
  nn::GptConfig cfg{
      .n_layer = 2, .n_head = 2, .d_model = 32, .vocab_size = 97, .seq_len = 16, .dropout = 0.0};
  cfg.mtp_layers = 2;
  cfg.mtp_loss_weight = 0.3;
  nn::Gpt cpu_model(cfg, 7), gpu_model(cfg, 7);
  gpu_model.to(kGpu);
  const auto [ids, tg] = token_batch(2, 16);
  nn::ForwardContext ctx;
  ctx.loss_grad = 0.5;
  const Tensor cpu_loss = cpu_model.loss(ids, tg, ctx);
  autograd::backward({scale(cpu_loss, ctx.loss_grad)});
  cuda::set_op_profiling(true);
  cuda::op_profile(0);  // (clears what came before)
  const Tensor gpu_loss = gpu_model.loss(ids, tg, ctx);
  autograd::backward({scale(gpu_loss, ctx.loss_grad)});
  cuda::synchronize(0);
  std::map<std::string, int64_t> calls;
  for (const cuda::OpTime& t : cuda::op_profile(0)) calls[t.op] = t.calls;
  cuda::set_op_profiling(false);
  EXPECT_EQ(calls["cross_entropy_forward_backward"], 3);  // the head and two depths
  EXPECT_EQ(calls.count("cross_entropy_forward"), 0u);
  EXPECT_EQ(calls.count("cross_entropy_backward"), 0u);
  EXPECT_EQ(calls["scale_by_ratio"], 3);
  EXPECT_NEAR(item(gpu_loss), item(cpu_loss), 1e-5 * std::abs(item(cpu_loss)));
  auto cp = cpu_model.named_parameters(), gp = gpu_model.named_parameters();
  ASSERT_EQ(cp.size(), gp.size());
  for (size_t i = 0; i < cp.size(); ++i) {
    expect_close(to_double_vector(gp[i].second.grad()), to_double_vector(cp[i].second.grad()), 1e-3,
                 1e-5, gp[i].first);
  }
}

// A bias-free layer's GELU (a mixture's experts', `linear_bias: false`
// GELU MLPs') runs in its product's epilogue, as a biased one's does: one
// op writing the activation and its input, no GELU pass after the product.
TEST(CudaRuntime, ABiasFreeLayersGeluRunsInItsProductsEpilogue) {
  const cuda::GemmSettings before = cuda::gemm_settings();
  struct Restore {
    cuda::GemmSettings settings;
    ~Restore() {
      cuda::set_op_profiling(false);
      cuda::set_gemm_settings(settings);
      cuda::reset_gemm_verification();
    }
  } restore{before};
  const Tensor x = randn({40, 64}, 21, 1, 1.0, DType::BF16);
  const Tensor w = randn({256, 64}, 21, 2, 0.2, DType::BF16);
  const LinearGelu cpu = linear_gelu_parts(x, w, Tensor());
  cuda::GemmSettings verified = before;
  verified.verify = true;  // (the product and its GELU input against the reference kernel)
  cuda::set_gemm_settings(verified);
  cuda::reset_gemm_verification();
  cuda::set_op_profiling(true);
  cuda::op_profile(0);  // (clears what came before)
  const LinearGelu gpu = linear_gelu_parts(to_device(x, kGpu), to_device(w, kGpu), Tensor());
  cuda::synchronize(0);
  std::map<std::string, int64_t> calls;
  for (const cuda::OpTime& t : cuda::op_profile(0)) calls[t.op] = t.calls;
  cuda::set_op_profiling(false);
  EXPECT_EQ(calls["linear_gelu"], 1);
  EXPECT_EQ(calls.count("gelu_forward"), 0u);
  EXPECT_EQ(calls.count("gemm"), 0u);
  const cuda::GemmVerification checked = cuda::gemm_verification();
  EXPECT_EQ(checked.checked, 2);  // the activation and its input
  EXPECT_EQ(checked.failed, 0);
  EXPECT_NE(checked.worst.problem.find("epilogue GELU"), std::string::npos)
      << checked.worst.problem;
  expect_close(to_double_vector(gpu.pre), to_double_vector(cpu.pre), 1e-2, 1e-2, "pre");
  expect_close(to_double_vector(gpu.act), to_double_vector(cpu.act), 1e-2, 1e-2, "act");
}

// A two-layer mixture of 8 experts, top 2 within the best 2 of 4 groups,
// biased, with a balance loss and a router z-loss.
nn::GptConfig device_mixture() {
  nn::GptConfig cfg{
      .n_layer = 2, .n_head = 2, .d_model = 32, .vocab_size = 97, .seq_len = 16, .dropout = 0.0};
  cfg.moe.experts = 8;
  cfg.moe.top_k = 2;
  cfg.moe.ffn_hidden_size = 24;
  cfg.moe.groups = 4;
  cfg.moe.top_groups = 2;
  cfg.moe.expert_bias = true;
  cfg.moe.aux_loss_coef = 0.01;
  cfg.moe.z_loss_coef = 0.001;
  return cfg;
}

// cfg's mixture routes on the device: one route_top_k a layer, one wait a
// layer while reporting its balance and taking a z-loss (a cross entropy's
// second output on the device: one cross_entropy_forward a layer, besides
// the head's), and the same outputs, balance, z-loss, loads, drops and
// gradients as the CPU's.
void expect_mixture_on_device(const nn::GptConfig& cfg) {
  nn::Gpt cpu_model(cfg, 5), gpu_model(cfg, 5);
  gpu_model.to(kGpu);
  const auto [ids, tg] = token_batch(2, 16);
  nn::ForwardContext cpu_ctx, gpu_ctx;
  cpu_ctx.moe_stats = std::make_shared<nn::MoeStats>();
  gpu_ctx.moe_stats = std::make_shared<nn::MoeStats>();
  const Tensor cpu_loss = cpu_model.loss(ids, tg, cpu_ctx);
  cuda::set_op_profiling(true);
  cuda::op_profile(0);  // (clears what came before)
  cuda::synchronize(0);
#ifdef TRIAD_CUDA_SIM
  const int64_t waits = triad_sim::counters().host_waits;
#endif
  const Tensor gpu_loss = gpu_model.loss(ids, tg, gpu_ctx);
#ifdef TRIAD_CUDA_SIM
  // Each layer's read of its routing, no more: the balance's sums and the
  // z-loss's logits come in the same copy.
  EXPECT_EQ(triad_sim::counters().host_waits - waits, 2);
#endif
  cuda::synchronize(0);
  std::map<std::string, int64_t> calls;
  for (const cuda::OpTime& t : cuda::op_profile(0)) calls[t.op] = t.calls;
  cuda::set_op_profiling(false);
  EXPECT_EQ(calls["route_top_k"], 2);
  // (The routers' z-losses; the head's loss writes its gradient with it.)
  EXPECT_EQ(calls["cross_entropy_forward"], 2);
  EXPECT_EQ(calls["cross_entropy_forward_backward"], 1);
  EXPECT_NEAR(to_double_vector(gpu_loss)[0], to_double_vector(cpu_loss)[0], 1e-4);
  EXPECT_NEAR(gpu_ctx.moe_stats->balance_sum, cpu_ctx.moe_stats->balance_sum, 1e-5);
  EXPECT_NEAR(gpu_ctx.moe_stats->z_loss_sum, cpu_ctx.moe_stats->z_loss_sum, 1e-5);
  EXPECT_GT(cpu_ctx.moe_stats->z_loss_sum, 0.0);
  EXPECT_EQ(gpu_ctx.moe_stats->loads, cpu_ctx.moe_stats->loads);
  EXPECT_EQ(gpu_ctx.moe_stats->dropped_sum, cpu_ctx.moe_stats->dropped_sum);
  if (cfg.moe.capacity_factor > 0) {
    EXPECT_GT(cpu_ctx.moe_stats->dropped_sum, 0.0);
  }
  autograd::backward({cpu_loss});
  autograd::backward({gpu_loss});
  auto cp = cpu_model.named_parameters(), gp = gpu_model.named_parameters();
  ASSERT_EQ(cp.size(), gp.size());
  for (size_t i = 0; i < cp.size(); ++i) {
    if (nn::is_moe_state(cp[i].first)) continue;  // (the expert biases: no gradient)
    expect_close(to_double_vector(gp[i].second.grad()), to_double_vector(cp[i].second.grad()), 1e-3,
                 1e-5, gp[i].first);
  }
}

TEST(CudaRuntime, AMixtureChoosesItsExpertsOnTheDevice) {
  expect_mixture_on_device(device_mixture());
}

// Gated experts (SwiGLU, no adapters) run as two grouped products over
// their rows (grouped_linear: no split of the rows, no concat of the
// outputs), on the device as on the CPU.
TEST(CudaRuntime, AGatedMixtureRunsItsExpertsAsGroupedProducts) {
  nn::GptConfig cfg = device_mixture();
  cfg.activation = nn::Activation::SwiGlu;
  expect_mixture_on_device(cfg);
  // The op itself in half precision, a group of no rows and groups at odd
  // row offsets included: the CPU's products, and gradients, in bf16.
  const std::vector<int64_t> rows{11, 0, 26};
  for (DType d : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(d));
    const Tolerance t = tolerance(d);
    auto run = [&](Device where) {
      Tensor x = to_device(randn({37, 24}, 5, 1, 1.0, d), where).detach();
      std::vector<Tensor> w;
      for (uint64_t e = 0; e < 3; ++e)
        w.push_back(to_device(randn({40, 24}, 5, 2 + e, 0.3, d), where).detach());
      x.set_requires_grad(true);
      for (Tensor& v : w) v.set_requires_grad(true);
      const Tensor y = grouped_linear(x, w, rows);
      autograd::backward({y}, {to_device(randn({37, 40}, 5, 9, 1.0, d), where)});
      std::vector<std::vector<double>> out{to_double_vector(y), to_double_vector(x.grad())};
      for (const Tensor& v : w) out.push_back(to_double_vector(v.grad()));
      return out;
    };
    const auto cpu = run(Device::cpu()), gpu = run(kGpu);
    for (size_t i = 0; i < cpu.size(); ++i)
      expect_close(gpu[i], cpu[i], t.rtol, t.atol, "output " + std::to_string(i));
    EXPECT_EQ(gpu[3], std::vector<double>(960, 0.0));  // the empty group's weight
  }
}

// Under an expert capacity too: the device chooses, the host reads the
// choices and their scores in the layer's one read, and an expert over its
// capacity keeps the CPU's assignments (the most probable, or the
// earliest).
TEST(CudaRuntime, AMixtureUnderACapacityChoosesOnTheDeviceToo) {
  for (auto policy :
       {nn::GptConfig::Moe::DropPolicy::Probs, nn::GptConfig::Moe::DropPolicy::Position}) {
    SCOPED_TRACE(policy == nn::GptConfig::Moe::DropPolicy::Probs ? "probs" : "position");
    nn::GptConfig cfg = device_mixture();
    cfg.moe.capacity_factor = 0.75;  // 6 rows an expert for 64 assignments
    cfg.moe.drop_policy = policy;
    expect_mixture_on_device(cfg);
  }
}

// Token ids and targets may stay on the host (as the trainer keeps its
// batches): the same loss and gradients, bit for bit, as on the device.
TEST(CudaRuntime, OpProfileTimesEachOpOfAStep) {
  const nn::GptConfig cfg{
      .n_layer = 3, .n_head = 4, .d_model = 64, .vocab_size = 104, .seq_len = 32, .dropout = 0.0};
  nn::Gpt model(cfg, 7);
  model.to(kGpu);
  model.to(DType::BF16);
  const auto [ids, tg] = token_batch(2, 32);
  auto step = [&] {
    Tensor loss = model.loss(ids, tg);
    autograd::backward({loss});
    model.zero_grad();
  };
  step();  // attention tuning and first allocations, unprofiled
  EXPECT_TRUE(cuda::op_profile(0).empty());
  cuda::set_op_profiling(true);
  EXPECT_TRUE(cuda::op_profiling());
  step();
  step();
  cuda::set_op_profiling(false);
  const std::vector<cuda::OpTime> ops = cuda::op_profile(0);
  std::map<std::string, cuda::OpTime> by_op;
  for (const auto& t : ops) {
    EXPECT_GE(t.ms, 0.0) << t.op;
    EXPECT_GT(t.calls, 0) << t.op;
    by_op[t.op] = t;
  }
  for (size_t i = 1; i < ops.size(); ++i) EXPECT_GE(ops[i - 1].ms, ops[i].ms);  // most first
  // Two steps: per layer one attention each way, one ln_1, one fused
  // add + ln_2, the MLP's first layer with its GELU epilogue; one loss.
  EXPECT_EQ(by_op["attention_forward"].calls, 2 * cfg.n_layer);
  EXPECT_EQ(by_op["attention_backward"].calls, 2 * cfg.n_layer);
  EXPECT_EQ(by_op["linear_bias_gelu"].calls, 2 * cfg.n_layer);
  EXPECT_EQ(by_op["gelu_linear_input_grad"].calls, 2 * cfg.n_layer);
  // (The head's loss writes its gradient with it: no cross entropy in
  // backward, one check of the gradient that came.)
  EXPECT_EQ(by_op["cross_entropy_forward_backward"].calls, 2);
  EXPECT_EQ(by_op.count("cross_entropy_forward"), 0u);
  EXPECT_EQ(by_op.count("cross_entropy_backward"), 0u);
  EXPECT_EQ(by_op["scale_by_ratio"].calls, 2);
  // Weight gradients go straight into the f32 buffers: four per layer and
  // the head's (tied to the token table), and the four biases' column sums
  // straight into theirs (cuda::GemmSettings::bias_grad_epilogue is off).
  EXPECT_EQ(by_op["gemm_into_f32"].calls, 2 * (4 * cfg.n_layer + 1));
  EXPECT_EQ(by_op["sum_rows_into"].calls, 2 * 4 * cfg.n_layer);
  EXPECT_EQ(by_op.count("gemm_bias_grad_into_f32"), 0u);
  // Every residual add runs in the norm after it (ln_2, the next block's
  // ln_1, ln_f), forward and backward: one norm each way per add, and no
  // elementwise add per layer (the few left per step are the embeddings').
  EXPECT_EQ(by_op["layer_norm_forward"].calls, 2 * (2 * cfg.n_layer + 1));
  EXPECT_EQ(by_op["layer_norm_backward"].calls, 2 * (2 * cfg.n_layer + 1));
  EXPECT_LE(by_op["binary"].calls, 2 * 2);
  // Off: nothing more is recorded, and what was read is gone.
  step();
  EXPECT_TRUE(cuda::op_profile(0).empty());
  EXPECT_THROW(cuda::op_profile(cuda::device_count()), ValueError);
}

TEST(CudaModel, HostIdsGiveTheSameLossAndGradientsAsDeviceIds) {
  const nn::GptConfig cfg{
      .n_layer = 1, .n_head = 2, .d_model = 32, .vocab_size = 97, .seq_len = 16, .dropout = 0.0};
  const auto [ids, tg] = token_batch(2, 16);
  auto run = [&](bool on_host) {
    nn::Gpt model(cfg, 77);
    model.to(kGpu);
    Tensor loss =
        on_host ? model.loss(ids, tg) : model.loss(to_device(ids, kGpu), to_device(tg, kGpu));
    autograd::backward({loss});
    std::vector<std::vector<double>> out{{item(loss)}};
    for (auto& [name, p] : model.named_parameters()) out.push_back(to_double_vector(p.grad()));
    return out;
  };
  EXPECT_EQ(run(true), run(false));
  // Ids on another device than the weight's (or the host) are refused.
  Tensor w = to_device(randn({4, 3}, 1, 1), kGpu);
  EXPECT_NO_THROW(embedding(w, from_vector(std::vector<int64_t>{1, 2}, {2}, DType::I64)));
  EXPECT_THROW(embedding(w, from_vector(std::vector<int64_t>{4}, {1}, DType::I64)), ValueError);
}

// Sampling on the GPU picks the CPU's tokens: greedy past seq_len (the
// window slides) with weights large enough to have opinions, and seeded
// top-k draws.
TEST(CudaModel, GenerationPicksTheCpusTokens) {
  const nn::GptConfig cfg{
      .n_layer = 2, .n_head = 2, .d_model = 32, .vocab_size = 97, .seq_len = 16, .dropout = 0.0};
  nn::Gpt cpu(cfg, 21), gpu(cfg, 21);
  for (nn::Gpt* m : {&cpu, &gpu}) {
    autograd::NoGradGuard ng;
    for (auto& [name, p] : m->named_parameters()) {
      if (name.find("ln_") == std::string::npos) scale_(p, 8.0);
    }
  }
  gpu.to(kGpu);
  nn::SamplingOptions o;
  o.max_new_tokens = 24;
  o.temperature = 0;
  const std::vector<int64_t> prompt{3, 14, 15, 92, 65};
  const auto greedy = nn::generate(cpu, prompt, o);
  EXPECT_EQ(nn::generate(gpu, prompt, o), greedy);
  EXPECT_GE(std::set<int64_t>(greedy.begin(), greedy.end()).size(), 3u);
  o.temperature = 0.9;
  o.top_k = 10;
  o.seed = 4;
  EXPECT_EQ(nn::generate(gpu, prompt, o), nn::generate(cpu, prompt, o));
  // Prompts of different lengths decoded together in one left-padded cache
  // on the GPU: each gets the tokens it gets alone on the CPU.
  const std::vector<std::vector<int64_t>> prompts{
      prompt, {7}, {40, 41, 42, 43, 44, 45, 46, 47, 48}};
  std::vector<std::vector<int64_t>> alone;
  for (const auto& p : prompts) alone.push_back(nn::generate(cpu, p, o));
  EXPECT_EQ(nn::generate_batch(gpu, prompts, o), alone);
  // A session's cache on the GPU, kept from one prompt to the next that
  // repeats it: the second decodes only its new tokens (a piece of several
  // after cached ones), and both are the CPU's.
  nn::GenerationSession session;
  o.max_new_tokens = 6;  // (the texts stay within seq_len 16)
  std::vector<int64_t> text = prompt;
  const auto first = nn::generate(gpu, text, o, session);
  EXPECT_EQ(first, nn::generate(cpu, text, o));
  text.insert(text.end(), first.begin(), first.end());
  for (const int64_t id : {11, 12, 13}) text.push_back(id);
  EXPECT_EQ(nn::generate(gpu, text, o, session), nn::generate(cpu, text, o));
  EXPECT_EQ(session.reused, static_cast<int64_t>(prompt.size() + first.size()) - 1);
}

// Also latent attention's decoding from a cache of latents (generic ops on
// the device: the absorbed products, the host-made mask, softmax in f32).
TEST(CudaModel, KvCacheDecodingMatchesTheCpuInF32AndBf16) {
  nn::GptConfig latent{
      .n_layer = 2, .n_head = 2, .d_model = 32, .vocab_size = 97, .seq_len = 16, .dropout = 0.0};
  latent.position_embedding = nn::PositionEmbedding::Rotary;
  latent.normalization = nn::Normalization::RmsNorm;
  latent.mla = testing::tiny_latent_attention();
  latent.validate();
  for (const nn::GptConfig& cfg : {nn::GptConfig{.n_layer = 2,
                                  .n_head = 2,
                                  .d_model = 32,
                                  .vocab_size = 97,
                                  .seq_len = 16,
                                  .dropout = 0.0},
                                   latent}) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 2 * 9; ++i) ids.push_back((i * 31 + 5) % cfg.vocab_size);
    const Tensor all = from_vector(ids, {2, 9});
    for (DType d : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + (cfg.latent_attention() ? ", latent" : ""));
      nn::Gpt cpu(cfg, 23, d), gpu(cfg, 23, d);
      gpu.to(kGpu);
      nn::KvCache cpu_cache(cfg, 2, d, Device::cpu()), gpu_cache(cfg, 2, d, kGpu);
      int64_t at = 0;
      for (int64_t n : {6, 1, 2}) {  // a prompt with its causal mask, then steps
        const auto want = to_double_vector(cpu.decode(narrow(all, 1, at, n), cpu_cache));
        const auto got = to_double_vector(gpu.decode(narrow(all, 1, at, n), gpu_cache));
        ASSERT_EQ(got.size(), want.size());
        const double tol = d == DType::F32 ? 1e-4 : 0.05;
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "at " << at << ", " << i;
        at += n;
      }
    }
  }
}

#ifdef TRIAD_CUDA_SIM
// A decoding step of a left-padded batch (Gpt::decode over a KvCache, every
// layer's attention reading the cache in place) makes the host wait for the
// device once, for the logits it samples from: the token ids and the rows'
// positions and text starts go up without a wait, and no layer reads
// anything back. So too under latent attention, whose decoding masks its
// scores from the rows' starts kept on the host.
TEST(CudaModel, ADecodingStepWaitsForTheDeviceOnlyForItsLogits) {
  for (const bool latent : {false, true}) {
    SCOPED_TRACE(latent ? "latent attention" : "grouped-query attention");
    nn::GptConfig cfg{
        .n_layer = 3, .n_head = 4, .d_model = 32, .vocab_size = 97, .seq_len = 32, .dropout = 0.0};
    cfg.n_kv_head = 2;
    cfg.position_embedding = nn::PositionEmbedding::Rotary;
    cfg.sliding_window = 6;
    if (latent) {
      cfg.n_kv_head = 0;
      cfg.normalization = nn::Normalization::RmsNorm;
      cfg.mla = testing::tiny_latent_attention();
      cfg.validate();
    }
    nn::Gpt model(cfg, 3);
    model.to(kGpu);
    model.to(DType::BF16);
    autograd::InferenceGuard inference;
    nn::KvCache cache(cfg, 3, DType::BF16, kGpu);
    cache.row_start = {0, 4, 2};
    std::vector<int64_t> prompt(3 * 9);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int64_t>(i * 7 % 97);
    to_double_vector(model.decode(from_vector(prompt, {3, 9}), cache, true));
    for (int step = 0; step < 4; ++step) {
      const int64_t before = triad_sim::counters().host_waits;
      const int64_t launched = triad_sim::counters().launches;
      const Tensor logits =
          model.decode(from_vector(std::vector<int64_t>{5, 6, 7}, {3, 1}), cache, true);
      const std::vector<double> read = to_double_vector(logits);
      EXPECT_EQ(triad_sim::counters().host_waits - before, 1) << "step " << step;
      EXPECT_EQ(read.size(), 3u * 97u);
      if (step == 0) {
        std::printf("[ note ] a decoding step of 3 layers (%s): %lld kernel launches\n",
                    latent ? "latent attention" : "grouped-query attention",
                    static_cast<long long>(triad_sim::counters().launches - launched));
      }
    }
  }
}
#endif

#ifdef TRIAD_CUDA_SIM
// A training step makes the host wait for the device only where it needs a
// value (the gradient norm for clipping, the loss): every other wait would
// empty the queue of launches the GPU runs ahead on. The simulator counts
// the waits (host-side ids used to cost one per embedding, forward and
// backward, and one for the loss's target check).
TEST(CudaTraining, AStepWaitsForTheDeviceOnlyForTheGradientNormAndTheLoss) {
  const nn::GptConfig cfg{
      .n_layer = 1, .n_head = 2, .d_model = 32, .vocab_size = 97, .seq_len = 16, .dropout = 0.1};
  nn::Gpt model(cfg, 5);
  model.to(kGpu);
  model.to(DType::BF16);
  optim::AdamW opt(model.named_parameters(), {});
  const auto [ids, tg] = token_batch(2, 16);
  auto waits_of_a_step = [&](const Tensor& in, const Tensor& targets) {
    const int64_t before = triad_sim::counters().host_waits;
    Tensor loss = model.loss(in, targets, {.training = true, .seed = 1, .call = 2});
    autograd::backward({loss});
    optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step(1e-3);
    model.zero_grad();
    EXPECT_TRUE(std::isfinite(item(loss)));
    return triad_sim::counters().host_waits - before;
  };
  waits_of_a_step(ids, tg);  // first use: plans, allocator, staging
  EXPECT_EQ(waits_of_a_step(ids, tg), 2);
  // Ids on the device must come back to be checked and grouped.
  EXPECT_GT(waits_of_a_step(to_device(ids, kGpu), to_device(tg, kGpu)), 2);
}
#endif

// A training step's forward and backward captured once into a CUDA graph
// and replayed on new batches trains exactly as the same steps run eagerly:
// the same losses and the same weights, bit for bit. The ids and targets
// stay on the device, where the capture checks and counts them (the token
// table's backward sorts its ids there: here one id fills 50 positions, a
// long segment of two pieces), and the positions are made there. The
// optimizer steps outside the graph, on the gradients the graph writes.
TEST(CudaGraphs, ACapturedStepTrainsAsTheEagerSteps) {
  const nn::GptConfig cfg{
      .n_layer = 2, .n_head = 2, .d_model = 32, .vocab_size = 97, .seq_len = 64, .dropout = 0.0};
  nn::Gpt eager(cfg, 5), graphed(cfg, 5);
  for (nn::Gpt* m : {&eager, &graphed}) {
    m->to(kGpu);
    m->to(DType::BF16);
  }
  optim::AdamW eager_opt(eager.named_parameters(), {}), graphed_opt(graphed.named_parameters(), {});
  auto batch = [](int64_t k) {
    const int64_t B = 2, T = 64;
    std::vector<int64_t> tokens(B * T), targets(B * T);
    for (int64_t i = 0; i < B * T; ++i) {
      tokens[i] = (i * 31 + 7 * k + 3) % 97;
      targets[i] = i % 11 == 5 ? -100 : (i * 17 + k) % 97;  // some rows ignored
    }
    for (int64_t i = 10; i < 60; ++i) tokens[i] = (k * 13) % 97;
    return std::pair{from_vector(tokens, {B, T}, DType::I64),
                     from_vector(targets, {B, T}, DType::I64)};
  };
  auto eager_step = [&](nn::Gpt& m, optim::AdamW& opt, const Tensor& ids, const Tensor& tg) {
    Tensor loss = m.loss(ids, tg, {.training = true});
    autograd::backward({loss});
    optim::clip_grad_norm(m.parameters(), 1.0);
    opt.step(1e-3);
    m.zero_grad();
    return item(loss);
  };
  // One eager step each first (plans, the attention's choice, products).
  const auto [ids0, tg0] = batch(0);
  EXPECT_EQ(eager_step(eager, eager_opt, ids0, tg0), eager_step(graphed, graphed_opt, ids0, tg0));
  // The graph's inputs: device tensors, refilled in place before each replay.
  Tensor dev_ids = to_device(ids0, kGpu), dev_tg = to_device(tg0, kGpu);
  Tensor loss;
  cuda::Graph g = cuda::capture(0, [&] {
    loss = graphed.loss(dev_ids, dev_tg, {.training = true});
    autograd::backward({loss});
  });
  for (int64_t k = 1; k <= 3; ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    const auto [ids, tg] = batch(k);
    const double expected = eager_step(eager, eager_opt, ids, tg);
    backend_for(dev_ids).copy(ids, dev_ids);
    backend_for(dev_tg).copy(tg, dev_tg);
    g.replay();
    g.check();
    EXPECT_EQ(item(loss), expected);
    // (The gradients stay the graph's: each replay writes them again.)
    optim::clip_grad_norm(graphed.parameters(), 1.0);
    graphed_opt.step(1e-3);
  }
  const auto a = eager.named_parameters(), b = graphed.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(same_bytes(a[i].second, b[i].second)) << a[i].first;
  }
}

// The token table's backward inside a capture sorts its ids on the device
// (tiles of 1024, then merges) into the pieces the host would cut: the same
// gradient, bit for bit, over several tiles and ids of every count (one
// id at 700 positions, long segments of 33 and 64, ids seen once), for
// i32 and i64 ids and f32 and bf16 tables.
TEST(CudaGraphs, TheTokenTablesGradientSortsItsIdsOnTheDevice) {
  const int64_t V = 300, C = 24, N = 3000;
  std::vector<int64_t> ids(N);
  for (int64_t i = 0; i < N; ++i) ids[i] = (i * 7919 + i / 5) % V;
  for (int64_t i = 0; i < 700; ++i) ids[(i * 37) % N] = 11;
  for (int64_t i = 0; i < 33; ++i) ids[2000 + i] = 299;
  for (int64_t i = 0; i < 64; ++i) ids[100 + 3 * i] = 0;
  for (DType table : {DType::F32, DType::BF16}) {
    for (DType id_type : {DType::I64, DType::I32}) {
      SCOPED_TRACE(std::string(dtype_name(table)) + " table, " + dtype_name(id_type) + " ids");
      const Tensor w0 = to_device(randn({V, C}, 3, 1, 1.0, table), kGpu);
      const Tensor dy = to_device(randn({N, C}, 4, 1, 1.0, table), kGpu);
      const Tensor dev_ids = to_device(cast(from_vector(ids, {N}, DType::I64), id_type), kGpu);
      auto grad_of = [&](const Tensor& w) {
        Tensor out = embedding(w, dev_ids);
        autograd::backward({out}, {dy});
        return w.grad();
      };
      Tensor w_eager = w0.detach().set_requires_grad(true);
      const Tensor expected = grad_of(w_eager);
      Tensor w_graph = w0.detach().set_requires_grad(true);
      Tensor got;
      cuda::Graph g = cuda::capture(0, [&] { got = grad_of(w_graph); });
      g.replay();
      g.check();
      EXPECT_TRUE(same_bytes(got, expected));
    }
  }
}

// cuda::DeviceChecks: outside a capture, lookups and sums through ids
// already on the device (embedding's forward and backward, index_add_rows)
// check the ids in their kernels instead of reading them back: the same
// results, bit for bit, and (on the simulator) no wait until the words are
// read. A bad id is named by check(), or by the words read with other
// values. One scope at a time on a thread, none inside a capture; a
// capture inside one keeps its own checks.
TEST(CudaGraphs, DeviceChecksLeaveAnEagerLookupsChecksToTheDevice) {
  const int64_t V = 50, C = 8, N = 40;
  std::vector<int64_t> ids(N);
  for (int64_t i = 0; i < N; ++i) ids[i] = (i * 13 + 5) % V;
  for (int64_t i = 20; i < 30; ++i) ids[i] = 7;  // (one id many times)
  const Tensor w0 = to_device(randn({V, C}, 3, 1, 1.0, DType::F32), kGpu);
  const Tensor src0 = to_device(randn({N, C}, 5, 1, 1.0, DType::F32), kGpu);
  const Tensor dy = to_device(randn({N, C}, 4, 1, 1.0, DType::F32), kGpu);
  const Tensor dsum = to_device(randn({V, C}, 6, 1, 1.0, DType::F32), kGpu);
  Tensor dev_ids = to_device(from_vector(ids, {N}, DType::I64), kGpu);
  struct Result {
    Tensor looked_up, summed, dw, dsrc;
  };
  auto run = [&] {
    Tensor w = w0.detach().set_requires_grad(true), src = src0.detach().set_requires_grad(true);
    Result r{embedding(w, dev_ids), index_add_rows(src, dev_ids, V), {}, {}};
    autograd::backward({r.looked_up, r.summed}, {dy, dsum});
    r.dw = w.grad();
    r.dsrc = src.grad();
    return r;
  };
  const Result expected = run();
  cuda::synchronize(0);
  Result got;
  {
#ifdef TRIAD_CUDA_SIM
    const int64_t waits = triad_sim::counters().host_waits;
#endif
    cuda::DeviceChecks checks(0);
    EXPECT_TRUE(backend_for(dev_ids).checks_indices_on_device(kGpu));
    got = run();
    checks.close();
    EXPECT_FALSE(backend_for(dev_ids).checks_indices_on_device(kGpu));
#ifdef TRIAD_CUDA_SIM
    EXPECT_EQ(triad_sim::counters().host_waits, waits);  // nothing read
#endif
    EXPECT_EQ(checks.words().size(), 4u);  // (each pass's lookup and sum)
    EXPECT_NO_THROW(checks.check());
  }
  EXPECT_TRUE(same_bytes(got.looked_up, expected.looked_up));
  EXPECT_TRUE(same_bytes(got.summed, expected.summed));
  EXPECT_TRUE(same_bytes(got.dw, expected.dw));
  EXPECT_TRUE(same_bytes(got.dsrc, expected.dsrc));
  // A bad id: named by check(), or by the words read with other values.
  std::vector<int64_t> bad = ids;
  bad[13] = V;
  backend_for(dev_ids).copy(from_vector(bad, {N}, DType::I64), dev_ids);
  {
    cuda::DeviceChecks checks(0);
    const Tensor out = embedding(w0, dev_ids);
    checks.close();
    try {
      checks.check();
      ADD_FAILURE() << "no error for an id past the table";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "token id 50 at position 13 is outside [0, 50) (found on the device)"),
                std::string::npos)
          << e.what();
    }
    std::vector<int64_t> read;
    for (const double w : items(checks.words())) read.push_back(static_cast<int64_t>(w));
    EXPECT_EQ(read, std::vector<int64_t>{13});
    EXPECT_THROW(checks.check(read), ValueError);
    EXPECT_THROW(checks.check({}), ValueError);  // (one word a check)
  }
  // Without a scope the host reads and refuses it at once.
  EXPECT_THROW(embedding(w0, dev_ids), ValueError);
  // One scope at a time; none inside a capture; a capture inside one keeps
  // its own checks.
  {
    cuda::DeviceChecks outer(0);
    EXPECT_THROW(cuda::DeviceChecks inner(0), Error);
    Tensor out;
    cuda::Graph g = cuda::capture(0, [&] { out = embedding(w0, dev_ids); });
    EXPECT_TRUE(outer.words().empty());
    g.replay();
    EXPECT_THROW(g.check(), ValueError);
  }
  EXPECT_THROW(cuda::capture(0, [&] { cuda::DeviceChecks inside(0); }), Error);
  EXPECT_NO_THROW(cuda::DeviceChecks again(0));
}

// Dropout's seed and offsets are its kernel's arguments, so a graph would
// draw the same mask at every replay: the capture refuses it, naming why,
// and the stream works on as before.
// A one-layer GPT on the GPU for the capture tests (vocabulary 97, 16
// positions), and a batch of 2 x 16 tokens for it.
std::unique_ptr<nn::Gpt> one_layer_gpt(double dropout) {
  const nn::GptConfig cfg{.n_layer = 1,
                          .n_head = 2,
                          .d_model = 32,
                          .vocab_size = 97,
                          .seq_len = 16,
                          .dropout = dropout};
  auto model = std::make_unique<nn::Gpt>(cfg, 5);
  model->to(kGpu);
  return model;
}

// Dropout inside a capture reads its call count from device memory
// (ForwardContext::calls): each replay then draws the mask of the call
// written there, the losses and gradients of those calls run eagerly, bit
// for bit. Without the count the capture is refused by name, and the model
// works on as before.
TEST(CudaGraphs, ACapturedDropoutDrawsEachReplaysMask) {
  const std::unique_ptr<nn::Gpt> gpt = one_layer_gpt(0.1);
  nn::Gpt& model = *gpt;
  const auto [ids, tg] = token_batch(2, 16);
  const Tensor dev_ids = to_device(ids, kGpu), dev_tg = to_device(tg, kGpu);
  // Eager losses and a gradient at calls 2, 3 and 7.
  std::map<uint64_t, double> eager;
  std::map<uint64_t, std::vector<float>> eager_grad;
  const auto wte_grad = [&model] {
    for (const auto& [name, w] : model.named_parameters()) {
      if (name == "wte.weight") return to_float_vector(w.grad());
    }
    ADD_FAILURE() << "no wte.weight";
    return std::vector<float>{};
  };
  for (const uint64_t call : {2, 3, 7}) {
    const Tensor loss = model.loss(dev_ids, dev_tg, {.training = true, .seed = 1, .call = call});
    autograd::backward({loss});
    eager[call] = item(loss);
    eager_grad[call] = wte_grad();
    model.zero_grad();
  }
  EXPECT_NE(eager[2], eager[3]);  // (the masks differ by call)
  try {
    cuda::capture(0,
                  [&] { model.loss(dev_ids, dev_tg, {.training = true, .seed = 1, .call = 2}); });
    ADD_FAILURE() << "captured dropout without a call count";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dropout (p 0.1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("same at every replay"), std::string::npos) << e.what();
  }
  EXPECT_EQ(item(model.loss(dev_ids, dev_tg, {.training = true, .seed = 1, .call = 2})), eager[2]);
  // (Inputs made before the capture.)
  Tensor calls = to_device(from_vector(std::vector<int64_t>{0}, {}, DType::I64), kGpu);
  Tensor loss;
  cuda::Graph g = cuda::capture(0, [&] {
    nn::ForwardContext ctx{.training = true, .seed = 1, .call = 2};
    ctx.calls = calls;
    loss = model.loss(dev_ids, dev_tg, ctx);
    autograd::backward({loss});
  });
  for (const uint64_t call : {3, 2, 7}) {
    SCOPED_TRACE(call);
    copy_(calls, from_vector(std::vector<int64_t>{static_cast<int64_t>(call) - 2}, {}, DType::I64));
    g.replay();
    EXPECT_EQ(item(loss), eager[call]);
    EXPECT_EQ(wte_grad(), eager_grad[call]);
  }
}

// What the capture could not check on the host, its replay checks on the
// device: a token id or a target out of range is named by Graph::check
// (with its position), and the kernels read no memory for it.
TEST(CudaGraphs, AReplayNamesABadTokenIdAndABadTarget) {
  const std::unique_ptr<nn::Gpt> gpt = one_layer_gpt(0.0);
  nn::Gpt& model = *gpt;
  const auto [ids, tg] = token_batch(2, 16);
  {
    Tensor loss = model.loss(ids, tg, {.training = true});
    autograd::backward({loss});
    model.zero_grad();
  }
  Tensor dev_ids = to_device(ids, kGpu), dev_tg = to_device(tg, kGpu);
  Tensor loss;
  cuda::Graph g = cuda::capture(0, [&] {
    loss = model.loss(dev_ids, dev_tg, {.training = true});
    autograd::backward({loss});
  });
  g.replay();
  EXPECT_NO_THROW(g.check());
  auto expect_named = [&](const std::string& needle) {
    g.replay();
    try {
      g.check();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  std::vector<int64_t> bad_ids(32, 3);
  bad_ids[21] = 97;
  backend_for(dev_ids).copy(from_vector(bad_ids, {2, 16}, DType::I64), dev_ids);
  expect_named("token id 97 at position 21 is outside [0, 97)");
  backend_for(dev_ids).copy(ids, dev_ids);
  std::vector<int64_t> bad_targets(32, 4);
  bad_targets[7] = -3;
  backend_for(dev_tg).copy(from_vector(bad_targets, {2, 16}, DType::I64), dev_tg);
  expect_named("target -3 at position 7 is outside [0, 97)");
  // In two halves (the trainer reads the words with its gradient norm):
  // the same error from the words read after the replay.
  g.replay();
  const std::vector<Tensor> words = g.check_words();
  ASSERT_FALSE(words.empty());
  std::vector<int64_t> read;
  for (const double w : items(words)) read.push_back(static_cast<int64_t>(w));
  try {
    g.check(read);
    ADD_FAILURE() << "no error from the words read";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("target -3 at position 7"), std::string::npos) << e.what();
  }
  read.pop_back();
  EXPECT_THROW(g.check(read), ValueError);  // (one word a check)
  backend_for(dev_tg).copy(tg, dev_tg);
  g.replay();
  EXPECT_NO_THROW(g.check());
  read.clear();
  for (const double w : items(g.check_words())) read.push_back(static_cast<int64_t>(w));
  EXPECT_NO_THROW(g.check(read));
  EXPECT_TRUE(std::isfinite(item(loss)));
}

// A cross entropy's z-loss taken as a second output with a gradient of its
// own (not joined to the loss's) backpropagates inside a capture as outside
// it, over masked targets: its rows' share comes from the count the capture
// makes on the device (it once came from the host's count, which a capture
// does not make: no gradient at all).
TEST(CudaGraphs, AZLossWithAGradientOfItsOwnBackpropagatesInACaptureAsEagerly) {
  const Tensor values = randn({6, 11}, 21, 1);
  const Tensor targets =
      to_device(from_vector(std::vector<int64_t>{3, -100, 10, 0, -100, 7}, {6}, DType::I64), kGpu);
  auto pass = [&](Tensor& logits) {
    Tensor z;
    const Tensor loss = cross_entropy(logits, targets, -100, &z);
    autograd::backward({add(loss, scale(z, 0.5))});
  };
  Tensor eager = to_device(values, kGpu).detach().set_requires_grad(true);
  pass(eager);
  Tensor captured = to_device(values, kGpu).detach().set_requires_grad(true);
  cuda::synchronize(0);
  cuda::Graph g = cuda::capture(0, [&] { pass(captured); });
  g.replay();
  g.check();
  const std::vector<double> want = to_double_vector(eager.grad()),
                            got = to_double_vector(captured.grad());
  EXPECT_EQ(got, want);
  // (The z-loss's share is there: without it the gradient differs.)
  Tensor plain = to_device(values, kGpu).detach().set_requires_grad(true);
  autograd::backward({cross_entropy(plain, targets, -100)});
  EXPECT_NE(to_double_vector(plain.grad()), want);
}

// Multi-token prediction's targets beside packed documents, formed on the
// device from device targets and starts (nn::document_starts_of on device
// ids, the backend's kernel): the host's, position for position, at depths
// 1 to 3, with ignored targets among them, i32 and i64 targets.
TEST(CudaKernels, MtpTargetsWithinDocumentsOnTheDeviceAreTheHosts) {
  const int64_t B = 3, T = 37, eod = 4;
  std::vector<int64_t> ids(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    ids[i] = (i * 7 + i / 5) % 11;  // several ends of document (4) a row
    targets[i] = i % 9 == 0 ? -100 : (i * 3) % 11;
  }
  const Tensor host_ids = from_vector(ids, {B, T}, DType::I64);
  const Tensor host_starts = nn::document_starts_of(host_ids, eod);
  const Tensor dev_starts = nn::document_starts_of(to_device(host_ids, kGpu), eod);
  ASSERT_TRUE(dev_starts.device().is_cuda());
  EXPECT_EQ(to_double_vector(dev_starts), to_double_vector(host_starts));
  for (DType d : {DType::I64, DType::I32}) {
    const Tensor t = cast(from_vector(targets, {B, T}, DType::I64), d);
    for (int64_t k : {1, 2, 3}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + " depth " + std::to_string(k));
      const Tensor want = nn::mtp_targets(t, host_starts, k);
      const Tensor got = nn::mtp_targets(to_device(t, kGpu), dev_starts, k);
      ASSERT_TRUE(got.device().is_cuda());
      EXPECT_EQ(got.dtype(), DType::I64);
      EXPECT_EQ(to_double_vector(got), to_double_vector(want));
    }
  }
}

// Backend::vocab_shard_ids (tensor parallelism's embedding inside a
// capture): each replay forms a shard's local ids and marks from the ids
// refilled before it (i64 and i32 ids; marks in bf16 and f32), and an id
// outside the whole vocabulary is named by Graph::check. Outside a capture
// the op refuses (the lookup reads the ids on the host there).
TEST(CudaGraphs, AVocabularyShardsIdsAreFormedOnTheDeviceAndChecked) {
  Backend& be = backend_for(kGpu.type);
  const int64_t start = 10, valid = 6, vocab = 20;
  const std::vector<int64_t> first{0, 10, 15, 16, 19, 12, 9, 11, 3, 14};
  const std::vector<int64_t> second{13, 1, 10, 17, 15, 18, 2, 12, 11, 5};
  for (DType id_type : {DType::I64, DType::I32}) {
    for (DType keep_type : {DType::BF16, DType::F32}) {
      SCOPED_TRACE(std::string(dtype_name(id_type)) + " ids, " + dtype_name(keep_type) + " marks");
      Tensor ids = to_device(cast(from_vector(first, {2, 5}, DType::I64), id_type), kGpu);
      Tensor local = empty({2, 5}, DType::I64, kGpu), keep = empty({2, 5, 1}, keep_type, kGpu);
      EXPECT_THROW(be.vocab_shard_ids(ids, start, valid, vocab, local, keep, "shard"),
                   NotSupportedError);
      cuda::Graph g = cuda::capture(
          0, [&] { be.vocab_shard_ids(ids, start, valid, vocab, local, keep, "shard"); });
      for (const auto* values : {&first, &second}) {
        copy_(ids, cast(from_vector(*values, {2, 5}, DType::I64), id_type));
        g.replay();
        EXPECT_NO_THROW(g.check());
        const std::vector<double> got_local = to_double_vector(local),
                                  got_keep = to_double_vector(keep);
        for (size_t i = 0; i < values->size(); ++i) {
          const int64_t id = (*values)[i];
          const bool mine = id >= start && id < start + valid;
          EXPECT_EQ(got_local[i], mine ? id - start : 0) << "id " << id;
          EXPECT_EQ(got_keep[i], mine ? 1.0 : 0.0) << "id " << id;
        }
      }
      std::vector<int64_t> bad = first;
      bad[3] = vocab;
      copy_(ids, cast(from_vector(bad, {2, 5}, DType::I64), id_type));
      g.replay();
      try {
        g.check();
        ADD_FAILURE() << "no error for an id past the vocabulary";
      } catch (const ValueError& e) {
        EXPECT_NE(std::string(e.what()).find("shard: id 20 at position 3 is outside [0, 20)"),
                  std::string::npos)
            << e.what();
      }
    }
  }
}

// A rank whose rows of the padded vocabulary are all padding (vocabulary
// 300 over tp 4: 512 rows, rank 3's [384, 512) past the end) holds no id:
// inside a capture every id looks up its row 0 and is zeroed, and an id
// past the vocabulary is still named by Graph::check.
TEST(CudaGraphs, AShardOfPaddingAloneHoldsNoId) {
  Backend& be = backend_for(kGpu.type);
  const int64_t start = 384, valid = 0, vocab = 300;
  const std::vector<int64_t> ids_host{0, 299, 150, 298, 7, 42};
  Tensor ids = to_device(from_vector(ids_host, {2, 3}, DType::I64), kGpu);
  Tensor local = full({2, 3}, 5.0, DType::I64, kGpu), keep = full({2, 3, 1}, 0.5, DType::F32, kGpu);
  cuda::Graph g =
      cuda::capture(0, [&] { be.vocab_shard_ids(ids, start, valid, vocab, local, keep, "shard"); });
  g.replay();
  EXPECT_NO_THROW(g.check());
  EXPECT_EQ(to_double_vector(local), std::vector<double>(6, 0.0));
  EXPECT_EQ(to_double_vector(keep), std::vector<double>(6, 0.0));
  copy_(ids, from_vector(std::vector<int64_t>{0, 1, 2, 300, 4, 5}, {2, 3}, DType::I64));
  g.replay();
  try {
    g.check();
    ADD_FAILURE() << "no error for an id past the vocabulary";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("shard: id 300 at position 3 is outside [0, 300)"),
              std::string::npos)
        << e.what();
  }
}

// Head dims above 128 (Gemma 2's and 3's 256; latent attention's 192,
// DeepSeek V3's; 180, a multiple of neither 16 nor 8): Triad's SIMT kernels
// (two lanes a row), its tensor-core kernels where they take the width
// (227 KiB of shared memory a block, the simulator's H200's: dk/dv in two
// halves of columns) and
// cuDNN where it applies, against the CPU in every type; grouped heads with
// a soft cap over a window of packed documents (what cuDNN has no graph
// for: Gemma 2's layers), and a chunk of queries apart (context
// parallelism). Auto times Triad's kernels against cuDNN and runs what it
// recorded, to the bit. Past 256 no kernel takes the shape and
// the attention says why.
TEST(CudaKernels, AttentionAtHeadDimsAbove128) {
  struct Shape {
    int64_t B, T, C, NH;
  };
  for (const Shape& sh : {Shape{1, 70, 512, 2}, Shape{2, 45, 384, 2}, Shape{1, 33, 180, 1}}) {
    expect_attention_matches_cpu(attention_case(sh.B, sh.T, sh.C, sh.NH), sh.T, sh.C, sh.NH);
  }
  {
    const int64_t B = 2, T = 90, C = 1024;  // 4 query heads of 256 over 2 key/value heads
    const AttentionHeads heads = AttentionHeads{4, 2}.with_softcap(3.0);
    std::vector<int64_t> ids(static_cast<size_t>(B * T), 5);
    ids[40] = ids[130] = 0;
    const Tensor starts = nn::sliding_window_starts(
        B, T, 24, nn::document_layout(from_vector(ids, {B, T}), 0).starts);
    expect_own_kernels_match_cpu(
        qkv_attention_case("softcap_window_documents_D256", B, T, C, heads, starts, 11, 2.0), T, C,
        heads);
  }
  {
    const int64_t B = 1, T = 80, C = 512, first = 37;
    const AttentionHeads heads{2, 1};
    const testing::OpCase c{
        "chunk_from37_D256",
        [=](DType d) {
          return std::vector<Tensor>{randn({B, T - first, C}, 13, 2, 1.0, d),
                                     randn({B, T, 2 * 256}, 13, 3, 1.0, d)};
        },
        [=](const std::vector<Tensor>& x) { return chunk_attention(x[0], x[1], heads); }};
    expect_own_kernels_match_cpu(c, T, C, heads);
  }
  auto run = [](const Tensor& input, int64_t heads, cuda::AttentionKernel kernel, bool backward) {
    cuda::set_attention_kernel(kernel);
    Tensor qkv = input.detach();
    qkv.set_requires_grad(backward);
    const Tensor out = causal_attention(qkv, heads);
    std::vector<double> grad;
    if (backward) {
      autograd::backward({out}, {randn(out.shape(), 41, 2, 1.0, DType::BF16, kGpu)});
      grad = to_double_vector(qkv.grad());
    }
    cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
    return std::pair{to_double_vector(out), grad};
  };
  cuda::AttentionChoice choice;
  if (cuda::attention_kernel_unavailable(cuda::AttentionKernel::Cudnn, DType::BF16, 64, 512, 2)
          .empty()) {
    cuda::clear_attention_choices();
    const Tensor qkv = randn({2, 64, 3 * 512}, 41, 1, 0.5, DType::BF16, kGpu);
    const auto automatic = run(qkv, 2, cuda::AttentionKernel::Auto, true);
    ASSERT_EQ(cuda::attention_choices().size(), 1u);
    choice = cuda::attention_choices()[0];
    EXPECT_EQ(choice.d_model, 512);
    EXPECT_GT(choice.own_ms, 0.0);
    EXPECT_GT(choice.cudnn_ms, 0.0);
    // (Triad's own: tensor cores where the device's shared memory takes
    // 256, 227 KiB a block, else SIMT.)
    const cuda::AttentionKernel own =
        cuda::attention_kernel_unavailable(cuda::AttentionKernel::TensorCore, DType::BF16, 64, 512,
                                           2)
                .empty()
            ? cuda::AttentionKernel::TensorCore
            : cuda::AttentionKernel::Simt;
    const auto named = run(qkv, 2, choice.cudnn ? cuda::AttentionKernel::Cudnn : own, true);
    EXPECT_EQ(automatic.first, named.first);
    EXPECT_EQ(automatic.second, named.second);
    cuda::clear_attention_choices();
  } else {
    std::printf("[ note ] auto at head dim 256 not timed: cuDNN cannot run it here\n");
  }
  // Nothing to time in f32 (cuDNN takes halves alone); nothing takes 320.
  EXPECT_FALSE(cuda::tune_attention(0, DType::F32, 2, 64, 512, 2, choice));
  EXPECT_THROW(cuda::tune_attention(0, DType::BF16, 2, 64, 640, 2, choice), ValueError);
  try {
    (void)run(randn({1, 16, 3 * 640}, 41, 3, 0.5, DType::BF16, kGpu), 2,
              cuda::AttentionKernel::Auto, false);
    ADD_FAILURE() << "attention at head dim 320 ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dim 320 exceeds 256"), std::string::npos)
        << e.what();
  }
}

// A GPU whose blocks take 99 KiB of shared memory (sm_86, sm_89: an L40S,
// an RTX 4090; the simulator plays it): the tensor-core attention's 103 KiB
// at head dim 128 does not fit (its backward failed at cudaFuncSetAttribute
// there), so auto runs SIMT, as the CPU does it, and tensor_core named says
// why; head dim 64 (72 KiB) still takes the tensor cores.
TEST(CudaKernels, TensorCoreAttentionKeepsToTheDevicesSharedMemory) {
#ifndef TRIAD_CUDA_SIM
  GTEST_SKIP() << "only the simulator plays another GPU's shared memory";
#else
  struct Restore {
    ~Restore() {
      triad_sim::set_shared_per_block(227 * 1024);
      cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
    }
  } restore;
  triad_sim::set_shared_per_block(99 * 1024);
  EXPECT_NE(
      cuda::attention_kernel_unavailable(cuda::AttentionKernel::TensorCore, DType::BF16, 64, 256, 2)
          .find("bytes of shared memory a block on tensor cores, and the device allows " +
                std::to_string(99 * 1024)),
      std::string::npos);
  EXPECT_EQ(cuda::attention_kernel_unavailable(cuda::AttentionKernel::TensorCore, DType::BF16, 64,
                                               128, 2),
            "");
  cuda::clear_attention_choices();
  expect_attention_kernel_matches_cpu(attention_case(1, 70, 256, 2), DType::BF16,
                                      cuda::AttentionKernel::Auto);
  expect_attention_kernel_matches_cpu(attention_case(1, 70, 128, 2), DType::BF16,
                                      cuda::AttentionKernel::TensorCore);
  cuda::set_attention_kernel(cuda::AttentionKernel::TensorCore);
  try {
    (void)causal_attention(randn({1, 16, 3 * 256}, 41, 3, 0.5, DType::BF16, kGpu), 2);
    ADD_FAILURE() << "tensor cores ran head dim 128 in 99 KiB";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shared memory"), std::string::npos) << e.what();
  }
  cuda::clear_attention_choices();
#endif
}

// The config's refusals of an attention kernel by name (precision and head
// dim, Config.AnAttentionKernelByNameFitsThePrecisionAndHeadDimOnTheGpu)
// say what the kernels say, so neither drifts from the other: on a device
// that runs the kernel at all, a model the config takes the kernel can run,
// and one it refuses the kernel cannot (head dims up to 320: the tensor
// cores stop at 128, SIMT and cuDNN at 256).
TEST(CudaKernels, TheConfigRefusesANamedAttentionKernelWhereTheKernelDoes) {
  const int64_t T = 128, NH = 2;
  for (cuda::AttentionKernel kernel :
       {cuda::AttentionKernel::Simt, cuda::AttentionKernel::TensorCore,
        cuda::AttentionKernel::Cudnn}) {
    const std::string name = cuda::attention_kernel_name(kernel);
    SCOPED_TRACE(name);
    if (const std::string why =
            cuda::attention_kernel_unavailable(kernel, DType::BF16, T, NH * 64, NH);
        !why.empty()) {
      std::printf("[ note ] %s: not compared (%s)\n", name.c_str(), why.c_str());
      continue;
    }
    int refused = 0;
    for (int64_t D : {8, 12, 16, 24, 40, 64, 128, 144, 192, 256, 320}) {
      for (DType dtype : {DType::BF16, DType::F32}) {
        const bool runs = cuda::attention_kernel_unavailable(kernel, dtype, T, NH * D, NH).empty();
        bool taken = true;
        try {
          (void)train::parse_config(
              "model: {n_layer: 1, n_head: 2, d_model: " + std::to_string(NH * D) +
              ", vocab_size: 256, seq_len: " + std::to_string(T) + ", attention_kernel: " + name +
              "}\ntrain: {steps: 1, global_batch_size: 2, micro_batch_size: 2, "
              "lr: 1.0e-3, precision: " +
              (dtype == DType::BF16 ? "bf16" : "fp32") + "}\ndata: {train: x.bin}\ndevice: cuda\n");
        } catch (const ConfigError&) {
          taken = false;
          ++refused;
        }
        EXPECT_EQ(taken, runs) << "head dim " << D << ", " << dtype_name(dtype);
      }
    }
    if (kernel == cuda::AttentionKernel::Simt)
      EXPECT_EQ(refused, 2) << "head dim 320 alone, in either precision";
    else
      EXPECT_GT(refused, 11) << "every f32 model and some head dims";
  }
}

// End to end: the trainer on the GPU against the trainer on the CPU (fp32,
// tight), and bf16 against fp32 on a GPT-2 124M-shaped model.
train::Config train_config(const testing::TempDir& dir, const std::string& model,
                           const std::string& device, const std::string& precision, int64_t steps,
                           int64_t batch, int vocab = 50000, const std::string& tag = "",
                           int64_t micro = 0) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 200000; ++i) {
    tokens.push_back(static_cast<uint16_t>((i * 7 + i / 13 + (i / 1000) * 31) % vocab));
  }
  data::write_token_shard(dir.file("train.bin"), tokens);
  return train::parse_config(
      "model: " + model +
      "\n"
      "train: {steps: " +
      std::to_string(steps) + ", global_batch_size: " + std::to_string(batch) +
      ", micro_batch_size: " + std::to_string(micro > 0 ? micro : batch) +
      ", lr: 3.0e-4, warmup_steps: 5, precision: " + precision +
      "}\n"
      "data: {train: " +
      dir.file("train.bin") +
      "}\n"
      "output: {dir: " +
      dir.file("out_" + device + "_" + precision + tag) + "}\ndevice: " + device + "\n");
}

std::vector<double> losses_of(train::Trainer& t, int64_t steps) {
  std::vector<double> out;
  for (int64_t k = 0; k < steps; ++k) out.push_back(t.step(k).loss);
  return out;
}

#ifdef TRIAD_CUDA_SIM
// The trainer too: with four micro-batches of gradient accumulation and fp16
// loss scaling a step waits only once (the micro-batches' losses are summed
// on the GPU and read with the gradient norm).
TEST(CudaTraining, TheTrainerWaitsOncePerStepWhateverTheMicroBatches) {
  testing::TempDir dir;
  const std::string model =
      "{n_layer: 1, n_head: 2, d_model: 32, vocab_size: 97, seq_len: 16, dropout: 0.0}";
  train::Trainer t(train_config(dir, model, "cuda", "fp16", 3, 4, 97, "", 1));
  t.step(0);
  const int64_t before = triad_sim::counters().host_waits;
  const double loss = t.step(1).loss;
  EXPECT_EQ(triad_sim::counters().host_waits - before, 1);
  EXPECT_TRUE(std::isfinite(loss));
  // A mixture padded to its capacity too: its routing stays on the device
  // (cuda::DeviceChecks), its statistics read with the norm; and a
  // dropless one, its rows grouped and its products sized on the device
  // (it waited once a layer and micro-batch before).
  const auto mixture_step = [&](const std::string& moe, const std::string& tag) {
    const std::string model =
        "{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 97, seq_len: 16, dropout: 0.0, moe: " +
        moe + "}";
    train::Trainer m(train_config(dir, model, "cuda", "bf16", 3, 4, 97, tag, 2));
    m.step(0);
    const int64_t moe_before = triad_sim::counters().host_waits;
    const train::StepMetrics metrics = m.step(1);
    EXPECT_EQ(triad_sim::counters().host_waits - moe_before, 1) << moe;
    EXPECT_GT(metrics.moe_balance, 0.0) << moe;
    EXPECT_GT(metrics.moe_z_loss, 0.0) << moe;
    return metrics;
  };
  EXPECT_GE(mixture_step("{experts: 4, top_k: 2, capacity_factor: 1.0, pad_to_capacity: true, "
                         "z_loss_coef: 0.001}",
                         "_moe")
                .moe_dropped,
            0.0);
  EXPECT_EQ(mixture_step("{experts: 4, top_k: 2, z_loss_coef: 0.001}", "_dropless").moe_dropped,
            -1.0);  // (dropless: none to report)
}
#endif

// One training pass of `m` on (ids, targets), its mixture's statistics
// into `stats`: the host-routed layer's (without `checks`), or the
// layer's under a cuda::DeviceChecks, which must not wait for the device
// (on the simulator, its host waits counted), leave one record pending per
// layer and pass its checks.
Tensor moe_pass(nn::Gpt& m, const Tensor& ids, const Tensor& tg, nn::MoeStats& stats,
                bool checks_on_device, size_t layers = 2) {
  const auto run = [&] {
    nn::ForwardContext ctx{.training = true};
    ctx.moe_stats = std::shared_ptr<nn::MoeStats>(&stats, [](nn::MoeStats*) {});
    Tensor loss = m.loss(ids, tg, ctx);
    autograd::backward({loss});
    return loss;
  };
  if (!checks_on_device) return run();
#ifdef TRIAD_CUDA_SIM
  const int64_t waits = triad_sim::counters().host_waits;
#endif
  cuda::DeviceChecks checks(0);
  Tensor loss = run();
  checks.close();
#ifdef TRIAD_CUDA_SIM
  EXPECT_EQ(triad_sim::counters().host_waits, waits);
#endif
  EXPECT_EQ(stats.pending.size(), layers);
  EXPECT_FALSE(checks.words().empty());
  checks.check();
  return loss;
}

// A dropless mixture under a cuda::DeviceChecks groups its rows on the
// device and sizes its experts' products there (grouped_linear's offsets):
// no wait, its statistics pending until settled. The statistics equal
// those of the layer that reads its routing on the host (the same
// choices), and the loss and every gradient equal its within f32's
// rounding (Triad's grouped kernels beside cuBLASLt's products), with the
// experts' own activation (SwiGLU) and GPT-2's GELU between the products,
// a shared expert, and an expert no token chose (whose weights' gradients
// are zeros).
TEST(CudaModel, ADroplessMixtureUnderDeviceChecksEqualsTheRoutingReadOnTheHost) {
  for (const std::string run : {"gelu", "swiglu", "lora"}) {
    SCOPED_TRACE(run);
    const bool swiglu = run == "swiglu", lora = run == "lora";
    nn::GptConfig cfg{
        .n_layer = 2, .n_head = 2, .d_model = 32, .vocab_size = 97, .seq_len = 16, .dropout = 0.0};
    if (swiglu) cfg.activation = nn::Activation::SwiGlu;
    // (LoRA without dropout: the experts' adapters as grouped products too.)
    if (lora) cfg.lora = {.rank = 2, .targets = {"attn.c_attn", "mlp.c_fc", "mlp.c_proj"}};
    cfg.moe.experts = swiglu ? 16 : 4;  // (16 for 32 tokens' top-1: some expert without any)
    cfg.moe.top_k = swiglu ? 1 : 2;
    cfg.moe.z_loss_coef = 0.001;
    cfg.moe.shared_ffn_hidden_size = swiglu ? 16 : 0;
    cfg.moe.aux_loss_scope = nn::GptConfig::Moe::BalanceScope::Sequence;
    nn::Gpt host_read(cfg, 9), on_device(cfg, 9);
    for (nn::Gpt* m : {&host_read, &on_device}) m->to(kGpu);
    const auto [ids, tg] = token_batch(2, 16);
    nn::MoeStats read_stats, device_stats;
    const Tensor expected = moe_pass(host_read, ids, tg, read_stats, false);
    EXPECT_EQ(read_stats.records, 2);
    const Tensor got = moe_pass(on_device, ids, tg, device_stats, true);
    device_stats.settle();
    EXPECT_NEAR(to_double_vector(got)[0], to_double_vector(expected)[0], 1e-5);
    EXPECT_EQ(device_stats.records, read_stats.records);
    EXPECT_NEAR(device_stats.balance_sum, read_stats.balance_sum, 1e-6);
    EXPECT_EQ(device_stats.max_load, read_stats.max_load);
    EXPECT_EQ(device_stats.dropped_sum, 0.0);
    EXPECT_NEAR(device_stats.z_loss_sum, read_stats.z_loss_sum, 1e-6);
    EXPECT_EQ(device_stats.loads, read_stats.loads);
    if (run == "gelu") {
      // Inside a capture, experts whose adapters drop their input out (each
      // expert's masks its own, run on rows counted on the host) cannot
      // route: refused naming the layer and why.
      nn::GptConfig with_adapters = cfg;
      with_adapters.lora = {.rank = 2, .targets = {"mlp.c_fc"}, .dropout = 0.1};
      nn::Gpt adapted(with_adapters, 9);
      adapted.to(kGpu);
      const Tensor ids_there = to_device(ids, kGpu), tg_there = to_device(tg, kGpu);
      testing::expect_error<Error>(
          [&] {
            cuda::capture(0, [&] {
              nn::ForwardContext ctx{.training = true};
              (void)adapted.loss(ids_there, tg_there, ctx);
            });
          },
          {"MoeMlp (layer 0): a dropless mixture inside a CUDA graph needs",
           "(this layer has LoRA dropout on its experts' adapters)", "pad_to_capacity"});
    }
    bool idle_expert = false;
    for (const auto& [layer, load] : read_stats.loads)
      idle_expert = idle_expert || std::count(load.begin(), load.end(), 0.0) > 0;
    EXPECT_EQ(idle_expert, swiglu);
    const auto a = host_read.named_parameters(), b = on_device.named_parameters();
    ASSERT_EQ(a.size(), b.size());
    int64_t adapters = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(b[i].second.grad().defined(), a[i].second.grad().defined()) << a[i].first;
      if (!a[i].second.grad().defined()) continue;  // (frozen under LoRA)
      const std::vector<double> want = to_double_vector(a[i].second.grad()),
                                have = to_double_vector(b[i].second.grad());
      double scale = 1e-3;
      for (const double v : want) scale = std::max(scale, std::fabs(v));
      for (size_t j = 0; j < want.size(); ++j)
        ASSERT_NEAR(have[j], want[j], 1e-4 * scale) << a[i].first << " element " << j;
      if (a[i].first.find("experts.") != std::string::npos &&
          a[i].first.find("lora_b") != std::string::npos &&
          std::any_of(want.begin(), want.end(), [](double v) { return v != 0.0; })) {
        ++adapters;
      }
    }
    EXPECT_EQ(adapters, lora ? 2 * 4 * 2 : 0);  // (2 layers' 4 experts' 2 layers)
  }
}

// A mixture padded to its capacity under a cuda::DeviceChecks leaves its
// routing on the device (no wait; its statistics pending until settled):
// the loss, every gradient and the statistics are those of the layer that
// reads its routing on the host, bit for bit, under both drop policies,
// and with LoRA dropout on the experts (their rows' keys formed on the
// device: the same masks, so the same adapters' gradients).
TEST(CudaModel, APaddedMixtureUnderDeviceChecksEqualsTheRoutingReadOnTheHost) {
  using Policy = nn::GptConfig::Moe::DropPolicy;
  for (const auto& [policy, lora] :
       {std::pair{Policy::Probs, false}, {Policy::Position, false}, {Policy::Probs, true}}) {
    SCOPED_TRACE(std::string(policy == Policy::Probs ? "probs" : "position") +
                 (lora ? " lora" : ""));
    nn::GptConfig cfg{
        .n_layer = 2, .n_head = 2, .d_model = 32, .vocab_size = 97, .seq_len = 16, .dropout = 0.0};
    if (lora) cfg.lora = {.rank = 2, .targets = {"mlp.c_fc", "mlp.c_proj"}, .dropout = 0.3};
    cfg.moe.experts = 4;
    cfg.moe.top_k = 2;
    cfg.moe.capacity_factor = 0.75;  // (some assignments dropped)
    cfg.moe.drop_policy = policy;
    cfg.moe.pad_to_capacity = true;
    cfg.moe.z_loss_coef = 0.001;
    cfg.moe.aux_loss_scope = nn::GptConfig::Moe::BalanceScope::Sequence;
    nn::Gpt host_read(cfg, 9), on_device(cfg, 9);
    for (nn::Gpt* m : {&host_read, &on_device}) {
      m->to(kGpu);
      m->to(DType::BF16);
    }
    const auto [ids, tg] = token_batch(2, 16);
    nn::MoeStats read_stats, device_stats;
    const Tensor expected = moe_pass(host_read, ids, tg, read_stats, false);
    EXPECT_EQ(read_stats.records, 2);
    const Tensor got = moe_pass(on_device, ids, tg, device_stats, true);
    device_stats.settle();
    EXPECT_TRUE(same_bytes(got, expected));
    EXPECT_EQ(device_stats.records, read_stats.records);
    EXPECT_EQ(device_stats.balance_sum, read_stats.balance_sum);
    EXPECT_EQ(device_stats.max_load, read_stats.max_load);
    EXPECT_EQ(device_stats.dropped_sum, read_stats.dropped_sum);
    EXPECT_GT(read_stats.dropped_sum, 0.0);
    EXPECT_EQ(device_stats.z_loss_sum, read_stats.z_loss_sum);
    EXPECT_EQ(device_stats.loads, read_stats.loads);
    const auto a = host_read.named_parameters(), b = on_device.named_parameters();
    ASSERT_EQ(a.size(), b.size());
    int64_t adapters = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].second.grad().defined(), b[i].second.grad().defined()) << a[i].first;
      if (!a[i].second.grad().defined()) continue;  // (frozen under LoRA)
      EXPECT_TRUE(same_bytes(a[i].second.grad(), b[i].second.grad())) << a[i].first;
      if (a[i].first.find("experts.") != std::string::npos &&
          a[i].first.find("lora_b") != std::string::npos) {
        ++adapters;
        const std::vector<double> g = to_double_vector(a[i].second.grad());
        EXPECT_TRUE(std::any_of(g.begin(), g.end(), [](double v) { return v != 0.0; }))
            << a[i].first;
      }
    }
    EXPECT_EQ(adapters, lora ? 2 * 4 * 2 : 0);  // (2 layers' 4 experts' 2 layers)
  }
}

// train.cuda_graph: the trainer's second step captures its passes (two
// micro-batches) and the later steps replay them on their own batches: the
// same losses and weights as the uncaptured trainer's, bit for bit. Under
// fp16 the loss scale grows every 2 clean steps here, and each new scale
// is captured anew; so is each new batch size of a ramp (one micro-batch a
// step, then two). Per-token loss averaging, a sliding window, dropout,
// LoRA's adapters' dropout (fp16, beside the model's) and the output
// z-loss (its value too; over masked targets in fp32) too.
TEST(CudaTraining, ACapturedTrainerStepTrainsAsTheUncapturedOne) {
  // Each run's model settings beside the 2-layer GPT's. (A sliding
  // window's key ranges: made once, before the capture. The dropout masks:
  // each replay's call count written before it. Packed documents: each
  // batch's ends of document found on the device inside the capture.)
  const std::map<std::string, std::string> runs{
      {"bf16", "dropout: 0.0"},
      {"fp16", "dropout: 0.0"},
      {"bf16 ramp", "dropout: 0.0"},
      {"bf16 tokens", "dropout: 0.0"},
      {"bf16 window", "dropout: 0.0, sliding_window: 8"},
      {"bf16 dropout", "dropout: 0.1"},
      {"fp16 lora", "dropout: 0.1, lora: {rank: 2, dropout: 0.2}"},
      {"bf16 z-loss", "dropout: 0.0, z_loss_coef: 0.01"},
      {"fp32 z-loss tokens", "dropout: 0.0, z_loss_coef: 0.01"},
      {"bf16 mtp", "dropout: 0.0, mtp_layers: 2"},
      {"bf16 tokens mtp", "dropout: 0.0, mtp_layers: 2"},
      {"bf16 documents", "dropout: 0.0"},
      {"bf16 documents mtp", "dropout: 0.0, mtp_layers: 2"},
      {"bf16 documents rope window",
       "dropout: 0.0, position_embedding: rope, sliding_window: 6, full_attention_layers: [1]"},
      // A mixture padded to its capacity: routed on the device inside the
      // capture, its statistics read after each replay; the balance and
      // z-losses' weights each replay's (tokens).
      {"bf16 moe",
       "dropout: 0.0, moe: {experts: 4, top_k: 2, capacity_factor: 1.0, pad_to_capacity: true, "
       "z_loss_coef: 0.001, aux_loss_scope: sequence}"},
      // LoRA dropout on the padded experts: their rows' keys formed on the
      // device, each replay's call in them.
      {"bf16 lora moe",
       "dropout: 0.0, lora: {rank: 2, dropout: 0.2, targets: [attn.c_attn, mlp.c_fc, "
       "mlp.c_proj]}, moe: {experts: 4, top_k: 2, capacity_factor: 1.0, pad_to_capacity: true}"},
      {"fp32 tokens moe swiglu",
       "dropout: 0.0, activation: swiglu, moe: {experts: 4, top_k: 1, capacity_factor: 1.5, "
       "drop_policy: position, pad_to_capacity: true, shared_ffn_hidden_size: 16}"},
      // Dropless: its rows grouped and its experts' products sized on the
      // device inside the capture (GPT-2's GELU between them; SwiGLU).
      {"bf16 dropless moe",
       "dropout: 0.0, moe: {experts: 4, top_k: 2, z_loss_coef: 0.001, aux_loss_scope: sequence}"},
      {"fp32 tokens dropless moe swiglu",
       "dropout: 0.0, activation: swiglu, moe: {experts: 8, top_k: 1, shared_ffn_hidden_size: "
       "16}"},
      // Its experts' adapters (no dropout) as grouped products too.
      {"bf16 dropless lora moe",
       "dropout: 0.0, lora: {rank: 2, targets: [attn.c_attn, mlp.c_fc, mlp.c_proj]}, moe: "
       "{experts: 4, top_k: 2}"}};
  for (const auto& [run, settings] : runs) {
    SCOPED_TRACE(run);
    const std::string precision = run.substr(0, 4);
    testing::TempDir dir;
    const std::string model =
        "{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 97, seq_len: 16, " + settings + "}";
    auto make = [&](const std::string& tag, bool graph) {
      train::Config config = train_config(dir, model, "cuda", precision, 6, 4, 97, tag, 2);
      config.train.loss_scale_window = 2;
      if (run == "bf16 ramp") config.train.rampup_batch_size = {2, 2, 6};
      if (run.find("documents") != std::string::npos) {
        config.model.eod_token = 5;
        config.model.reset_attention_mask = true;
        config.model.reset_position_ids = run == "bf16 documents";
      }
      if (run.find("tokens") != std::string::npos) {
        // (Targets after an end of document masked: micro-batches of
        // different weights each step.)
        config.train.loss_average = "tokens";
        config.data_eod_mask_loss = true;
        config.model.eod_token = 5;
      }
      config.train.cuda_graph = graph;
      return config;
    };
    train::Trainer eager(make("_eager", false));
    train::Trainer graphed(make("_graph", true));
    std::vector<double> expected, got;
    for (int64_t k = 0; k < 6; ++k) {
      const train::StepMetrics a = eager.step(k), b = graphed.step(k);
      expected.push_back(a.loss);
      got.push_back(b.loss);
      // (The output z-loss each replay records: -1 without one.)
      EXPECT_EQ(b.z_loss, a.z_loss) << "step " << k;
      EXPECT_EQ(b.mtp_losses, a.mtp_losses) << "step " << k;
      if (run.find("mtp") != std::string::npos) {
        EXPECT_EQ(a.mtp_losses.size(), 2u);
      }
      if (run.find("z-loss") != std::string::npos) {
        EXPECT_GT(a.z_loss, 0.0);
      }
      EXPECT_EQ(b.moe_balance, a.moe_balance) << "step " << k;
      EXPECT_EQ(b.moe_max_load, a.moe_max_load) << "step " << k;
      EXPECT_EQ(b.moe_dropped, a.moe_dropped) << "step " << k;
      EXPECT_EQ(b.moe_z_loss, a.moe_z_loss) << "step " << k;
      if (run.find("moe") != std::string::npos) {
        EXPECT_GT(a.moe_balance, 0.0);
        if (run.find("dropless") != std::string::npos) {
          EXPECT_EQ(a.moe_dropped, -1.0);  // (no capacity: none to report)
        } else {
          EXPECT_GE(a.moe_dropped, 0.0);
        }
      }
    }
    EXPECT_EQ(got, expected);
    EXPECT_NE(expected.front(), expected.back());  // (it trains)
    if (precision == "fp16") {
      // (The scale moved during the run: at least one capture anew.)
      EXPECT_GT(graphed.loss_scaler()->scale(), 65536.0);
      EXPECT_EQ(graphed.loss_scaler()->scale(), eager.loss_scaler()->scale());
    }
    const nn::StateDict a = eager.full_state_dict(), b = graphed.full_state_dict();
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, w] : a) EXPECT_TRUE(same_bytes(w, b.at(name))) << name;
  }
}

#ifdef TRIAD_CUDA_SIM
// Three bf16 steps of a 2-layer GPT under `settings` in micro-batches of
// `micro` sequences (2 a step), the stand-in cuBLASLt reset and then set up
// by `mock_setup`: the losses, and the stand-in's counters in `seen`.
std::vector<double> tiny_gpt_losses(const cuda::GemmSettings& settings, const std::string& tag,
                                    int64_t micro, const std::function<void()>& mock_setup,
                                    testing::mock_cublaslt::Counters* seen = nullptr) {
  namespace mock = testing::mock_cublaslt;
  const testing::TempDir dir;
  const std::string model =
      "{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 96, seq_len: 16, dropout: 0.0}";
  cuda::set_gemm_settings(settings);
  mock::reset();
  if (mock_setup) mock_setup();
  train::Trainer t(train_config(dir, model, "cuda", "bf16", 3, 2, 96, tag, micro));
  std::vector<double> out = losses_of(t, 3);
  cuda::synchronize(0);
  if (seen) *seen = mock::counters();
  mock::reset();
  return out;
}
#endif

#ifdef TRIAD_CUDA_SIM
// cuda::GemmSettings::autotune: every distinct product of a bf16 training
// step is timed once among the heuristic's candidates (here the first made
// slow, so the second wins each time), weight gradients added into their
// f32 buffers included (timed into the caching allocator's scratch), and
// training goes on with the winners to the same losses (the stand-in's
// algorithms compute alike); gemm_tuning() says so. Out of range, the
// setting is refused by name.
TEST(CudaTraining, AutotunedProductsTrainToTheSameLosses) {
  namespace mock = testing::mock_cublaslt;
  const GemmSettingsScope restore;
  auto losses = [&](int candidates, const std::string& tag) {
    cuda::GemmSettings settings = cuda::gemm_settings();
    settings.autotune = candidates;
    return tiny_gpt_losses(settings, tag, 0, [] { mock::set_algorithms({2.0, 0.0}); });
  };
  const cuda::GemmTuning before = cuda::gemm_tuning(0);
  const std::vector<double> plain = losses(0, "plain");
  const cuda::GemmTuning untuned = cuda::gemm_tuning(0);
  EXPECT_EQ(untuned.problems, before.problems);
  const std::vector<double> tuned = losses(2, "tuned");
  const cuda::GemmTuning after = cuda::gemm_tuning(0);
  EXPECT_EQ(tuned, plain);
  // A 2-layer GPT's distinct products: forward, input and weight gradients.
  EXPECT_GE(after.problems - before.problems, 6);
  EXPECT_EQ(after.changed - before.changed, after.problems - before.problems);
  EXPECT_EQ(after.untimed, before.untimed);
  EXPECT_LT(after.best_ms - before.best_ms, after.first_ms - before.first_ms);
  cuda::GemmSettings bad;
  bad.autotune = 65;
  EXPECT_THROW(
      {
        try {
          cuda::set_gemm_settings(bad);
        } catch (const ValueError& e) {
          EXPECT_NE(std::string(e.what()).find("autotune = 65"), std::string::npos) << e.what();
          throw;
        }
      },
      ValueError);
}
#endif

#ifdef TRIAD_CUDA_SIM
// A GPT's MLPs take their first bias gradient from the GELU-derivative
// products under cuda::GemmSettings::dgelu_bias_grad_epilogue (one such
// product per layer and micro-batch, its sums in f32), and train to the
// losses of the column sums: bf16, two micro-batches a step.
TEST(CudaTraining, BiasGradientsFromTheGeluDerivativeProductsTrainAlike) {
  const GemmSettingsScope restore;
  auto losses = [&](bool epilogue, const std::string& tag, int64_t* fused) {
    cuda::GemmSettings settings;
    settings.dgelu_bias_grad_epilogue = epilogue;
    testing::mock_cublaslt::Counters seen;
    std::vector<double> out = tiny_gpt_losses(settings, tag, 1, nullptr, &seen);
    *fused = seen.f32_bias_grad_matmuls;
    return out;
  };
  int64_t plain_fused = -1, fused = -1;
  const std::vector<double> plain = losses(false, "plain", &plain_fused);
  const std::vector<double> summed = losses(true, "summed", &fused);
  EXPECT_EQ(plain_fused, 0);
  // 2 layers x 2 micro-batches x 3 steps.
  EXPECT_EQ(fused, 2 * 2 * 3);
  ASSERT_EQ(summed.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_NEAR(summed[i], plain[i], 1e-3 * std::abs(plain[i])) << "step " << i + 1;
}
#endif

#ifdef TRIAD_CUDA_SIM
// With cuda::set_add_norm_bias_sums a GPT's output projections (the
// attention's into ln_2, the MLP's into the next block's ln_1 or ln_f) take
// their bias gradients from the add-norm backward's sums: two such
// backwards per layer and micro-batch; the losses are the column sums'.
TEST(CudaTraining, ProjectionBiasGradientsFromTheAddNormBackwardTrainAlike) {
  struct Restore {
    ~Restore() {
      cuda::set_add_norm_bias_sums(false);
      cuda::set_op_profiling(false);
    }
  } restore;
  auto losses = [&](bool on, const std::string& tag, int64_t* norm_sums) {
    cuda::set_add_norm_bias_sums(on);
    cuda::set_op_profiling(true);
    cuda::op_profile(0);  // (clears what came before)
    std::vector<double> out = tiny_gpt_losses(cuda::GemmSettings{}, tag, 1, nullptr);
    *norm_sums = 0;
    for (const cuda::OpTime& t : cuda::op_profile(0))
      if (t.op == "layer_norm_backward_dx_sums") *norm_sums = t.calls;
    cuda::set_op_profiling(false);
    return out;
  };
  int64_t plain_sums = -1, sums = -1;
  const std::vector<double> plain = losses(false, "norm_plain", &plain_sums);
  const std::vector<double> summed = losses(true, "norm_summed", &sums);
  EXPECT_EQ(plain_sums, 0);
  EXPECT_EQ(sums, 2 * 2 * 2 * 3);  // 2 a layer, 2 layers, 2 micro-batches, 3 steps
  ASSERT_EQ(summed.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_NEAR(summed[i], plain[i], 1e-3 * std::abs(plain[i])) << "step " << i + 1;
}
#endif

#ifdef TRIAD_CUDA_SIM
// log.profile_steps [2, 3] on a GPU: cudaProfilerStart as step 2 begins,
// cudaProfilerStop once the device has run step 3 (as step 4 begins, so the
// window's evaluations and checkpoints are in it), so a profiler capturing
// that range (nsys --capture-range=cudaProfilerApi) sees the kernels of
// steps 2 and 3 and none of 1 or 4.
TEST(CudaTraining, ProfileStepsStartAndStopTheCudaProfilerAroundTheirSteps) {
  testing::TempDir dir;
  const std::string model = "{n_layer: 1, n_head: 2, d_model: 32, vocab_size: 97, seq_len: 16}";
  train::Config c = train_config(dir, model, "cuda", "fp32", 4, 2, 97);
  c.log_profile_first = 2;
  c.log_profile_last = 3;
  const triad_sim::Counters before = triad_sim::counters();
  std::vector<triad_sim::Counters> after;
  {
    train::Trainer t(c);
    for (int64_t k = 0; k < 4; ++k) {
      t.step(k);
      after.push_back(triad_sim::counters());
    }
  }
  const std::vector<int64_t> starts = {0, 1, 1, 1}, stops = {0, 0, 0, 1};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(after[k].profiler_starts - before.profiler_starts, starts[k]) << "step " << k + 1;
    EXPECT_EQ(after[k].profiler_stops - before.profiler_stops, stops[k]) << "step " << k + 1;
    const int64_t profiled = after[k].profiled_launches -
                             (k == 0 ? before.profiled_launches : after[k - 1].profiled_launches);
    if (k == 1 || k == 2) {
      EXPECT_GT(profiled, 10) << "step " << k + 1;
    } else {
      EXPECT_EQ(profiled, 0) << "step " << k + 1;
    }
  }
  EXPECT_EQ(triad_sim::counters().profiler_stops, after[3].profiler_stops);  // (closed once)
}
#endif

// The trainer's timing of each rank (StepMetrics::rank_timing, at
// log.interval's steps): every category, the compute their sum, and on the
// simulator the optimizer's time is the device's: its kernels run in one
// go when the host next waits, far longer than the host took to queue them
// (trace.json's optimizer events, host times).
TEST(CudaTraining, RankTimingIsTheDevicesTime) {
  testing::TempDir dir;
  const std::string model = "{n_layer: 1, n_head: 2, d_model: 32, vocab_size: 97, seq_len: 16}";
  train::Config c = train_config(dir, model, "cuda", "fp32", 4, 4, 97, "", 2);
  c.log_interval = 2;
  train::Trainer t(c);
  const std::vector<train::StepMetrics> steps = t.run();
  ASSERT_EQ(steps.size(), 4u);
  EXPECT_TRUE(steps[0].rank_timing.empty());
  EXPECT_TRUE(steps[2].rank_timing.empty());
  double optimizer_ms = 0, forward_ms = 0;
  for (size_t k : {size_t{1}, size_t{3}}) {
    std::map<std::string, train::StepMetrics::RankTiming> by;
    for (const auto& r : steps[k].rank_timing) by[r.category] = r;
    ASSERT_EQ(by.size(), 7u) << "step " << k + 1;
    for (const char* busy : {"forward", "backward", "optimizer"})
      EXPECT_GT(by.at(busy).max_ms, 0.0) << busy << ", step " << k + 1;
    EXPECT_EQ(by.at("weight-grad").max_ms, 0.0);  // (no zero-bubble split)
    EXPECT_EQ(by.at("compute").slowest_rank, 0);
    EXPECT_DOUBLE_EQ(by.at("compute").min_ms, by.at("compute").max_ms);  // one rank
    EXPECT_NEAR(by.at("compute").mean_ms,
                by.at("forward").mean_ms + by.at("backward").mean_ms +
                    by.at("weight-grad").mean_ms + by.at("optimizer").mean_ms,
                1e-9);
    optimizer_ms += by.at("optimizer").mean_ms / 2;
    forward_ms += by.at("forward").mean_ms / 2;
  }
  // trace.json's device row has the same device times, placed on the host's
  // clock: the passes and optimizers of every step (the last one's read at
  // the end), in the order the stream ran them, one after the other. Its
  // host row has the same events as the host queued them (the whole trace
  // before it had a device row; on the simulator its optimizer, the time to
  // queue it, is about a tenth of the device row's, which is rank_timing's).
  std::ifstream in(c.output_dir + "/trace.json");
  const nlohmann::json trace = nlohmann::json::parse(in);
  struct Event {
    double ts, dur;
    std::string name;
  };
  std::vector<Event> events;
  std::vector<std::string> host_names;
  std::map<int, std::string> rows;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("name", "") == "thread_name") rows[e["tid"]] = e["args"]["name"];
    if (e.value("ph", "") != "X") continue;
    if (e["tid"] == 1) {
      host_names.push_back(e["name"]);
      continue;
    }
    ASSERT_EQ(e["tid"], 0) << e.dump();
    events.push_back({e["ts"].get<double>(), e["dur"].get<double>(), e["name"]});
  }
  EXPECT_EQ(rows, (std::map<int, std::string>{{0, "device (cuda:0)"}, {1, "host (queueing)"}}));
  std::sort(events.begin(), events.end(),
            [](const Event& a, const Event& b) { return a.ts < b.ts; });
  std::vector<std::string> names;
  double traced_optimizer_ms = 0, traced_forward_ms = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    names.push_back(events[i].name);
    EXPECT_GT(events[i].ts, 0.0) << events[i].name;  // (after the trainer's start)
    // (Anchors place a reading within microseconds, but a host preempted
    // between recording one and reading its clock places that reading late
    // by as much: 0.2 ms of slack.)
    if (i > 0) {
      EXPECT_LE(events[i - 1].ts + events[i - 1].dur, events[i].ts + 200.0)
          << events[i - 1].name << " overlaps " << events[i].name << " (event " << i << ")";
    }
    if (events[i].name == "optimizer") traced_optimizer_ms += events[i].dur / 1e3 / 4;
    if (events[i].name[0] == 'F') traced_forward_ms += events[i].dur / 1e3 / 4;
  }
  std::vector<std::string> want;
  for (int step = 0; step < 4; ++step)
    want.insert(want.end(), {"F0", "B0", "F1", "B1", "optimizer"});
  EXPECT_EQ(names, want);
  want.push_back("evaluation");  // (the last step's, which the host times)
  EXPECT_EQ(host_names, want);
  // (Each span's ends placed apart: a GPU event's half-microsecond each.)
  EXPECT_NEAR(traced_optimizer_ms, optimizer_ms, 5e-3 + 1e-3 * optimizer_ms);
  EXPECT_NEAR(traced_forward_ms, forward_ms, 5e-3 + 1e-3 * forward_ms);
}

#ifdef TRIAD_CUDA_SIM
// No kernel of a bf16 training step depends on the order its blocks or
// their threads run in: the simulator runs them first to last and last to
// first, and the losses and gradient norms agree bit for bit (a block that
// reads what another block of the same launch writes, or a missing barrier,
// changes the bits). Head dim 64 (the tensor-core attention), two layers.
TEST(CudaTraining, Bf16StepsAreBitForBitTheSameInEitherSimulatedOrder) {
  testing::TempDir dir;
  const std::string model = "{n_layer: 2, n_head: 2, d_model: 128, vocab_size: 300, seq_len: 96}";
  std::vector<std::vector<double>> runs;
  for (triad_sim::Order order : {triad_sim::Order::Forward, triad_sim::Order::Reverse}) {
    triad_sim::set_order(order);
    const std::string tag = order == triad_sim::Order::Forward ? "_forward" : "_reverse";
    train::Trainer t(train_config(dir, model, "cuda", "bf16", 3, 2, 300, tag));
    std::vector<double> seen;
    for (int64_t k = 0; k < 3; ++k) {
      const train::StepMetrics m = t.step(k);
      seen.push_back(m.loss);
      seen.push_back(m.grad_norm);
    }
    runs.push_back(seen);
  }
  triad_sim::set_order(triad_sim::Order::Forward);
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_TRUE(std::isfinite(runs[0].back()));
}
#endif

#ifdef TRIAD_CUDA_SIM
// Kernel launches per step (the simulator counts them), with clipping
// active: per layer, and fixed (embeddings, loss, optimizer, norm). The
// gradient norm is one multi-tensor pass and clipping rides in the AdamW
// step; per-parameter launches for either (79 per layer before) fail this.
TEST(CudaTraining, AStepLaunchesAFewKernelsPerLayer) {
  testing::TempDir dir;
  auto launches_per_step = [&](int layers) {
    const std::string model =
        "{n_layer: " + std::to_string(layers) +
        ", n_head: 2, d_model: 32, vocab_size: 97, seq_len: 16, dropout: 0.0}";
    train::Config cfg = train_config(dir, model, "cuda", "fp32", 3, 2, 97, std::to_string(layers));
    cfg.train.grad_clip = 1e-3;  // always clips
    train::Trainer t(cfg);
    t.step(0);
    const int64_t before = triad_sim::counters().launches;
    const train::StepMetrics m = t.step(1);
    EXPECT_GT(m.grad_norm, 1e-3);
    return triad_sim::counters().launches - before;
  };
  const int64_t one = launches_per_step(1), three = launches_per_step(3);
  const int64_t per_layer = (three - one) / 2, fixed = one - per_layer;
  EXPECT_LE(per_layer, 24) << one << " launches with 1 layer, " << three << " with 3";
  EXPECT_LE(fixed, 40) << one << " launches with 1 layer, " << three << " with 3";
}
#endif

// ZeRO-1's optimizer step on the GPU is one multi-tensor update over every
// piece, clipping's coefficient included: the parameters end where AdamW's
// step puts them, in a few launches whatever the number of parameters (an
// update per piece, two launches each under bf16, fails this).
TEST(CudaTraining, ZeroOneStepMatchesAdamWInAFewLaunches) {
  if (!dist::nccl_available()) GTEST_SKIP() << "built without NCCL";
  dist::ProcessGroupPtr world = dist::init_world();
  ASSERT_EQ(world->size(), 1);
  dist::ProcessGroupPtr nccl = dist::make_nccl_group(world, 0);
  const auto [ids, tg] = token_batch(2, 16);
  auto step_launches = [&](int layers, DType dtype, DType moments) {
    SCOPED_TRACE(std::to_string(layers) + " layers, " + dtype_name(dtype) + ", moments " +
                 dtype_name(moments));
    const nn::GptConfig cfg{
        .n_layer = layers, .n_head = 2, .d_model = 32, .vocab_size = 97, .seq_len = 16};
    nn::Gpt sharded(cfg, 7, dtype), plain(cfg, 7, dtype);
    sharded.to(kGpu);
    plain.to(kGpu);
    dp::GradientReducer reducer(sharded.named_parameters(), nccl, 1e9, true);
    optim::AdamWOptions o;
    o.moment_dtype = moments;
    dp::ZeroAdamW zero(reducer, o);
    EXPECT_EQ(zero.m().dtype(), moments);
    optim::AdamW adamw(plain.named_parameters(), o);
    for (nn::Gpt* m : {&sharded, &plain})
      autograd::backward({m->loss(to_device(ids, kGpu), to_device(tg, kGpu))});
    reducer.finish();
    cuda::synchronize(0);
#ifdef TRIAD_CUDA_SIM
    const int64_t before = triad_sim::counters().launches;
#endif
    zero.step(1e-2, 0.5);
    cuda::synchronize(0);
#ifdef TRIAD_CUDA_SIM
    const int64_t launches = triad_sim::counters().launches - before;
#else
    const int64_t launches = 0;
#endif
    adamw.step(1e-2, 0.5);
    const auto a = sharded.named_parameters(), b = plain.named_parameters();
    for (size_t i = 0; i < a.size(); ++i)
      expect_close(to_double_vector(a[i].second), to_double_vector(b[i].second), 1e-6, 1e-6,
                   a[i].first);
    return launches;
  };
  for (const auto& [dtype, moments] :
       {std::pair{DType::F32, DType::F32}, {DType::BF16, DType::F32}, {DType::BF16, DType::BF16}}) {
    const int64_t one = step_launches(1, dtype, moments), three = step_launches(3, dtype, moments);
    if (kOnSimulator) {
      // Two more layers are 24 more parameters: under two launches' worth
      // of multi-tensor chunks.
      EXPECT_LE(three - one, 2) << one << " launches with 1 layer, " << three << " with 3";
      EXPECT_LE(one, 8) << dtype_name(dtype);
    }
  }
}

#ifdef TRIAD_CUDA_SIM
// GPT-2's vocabulary (50257, odd) in one process: the head's logits rows are
// padded (linear_cross_entropy), so no GEMM of a training step has a leading
// dimension cuBLASLt's aligned kernels cannot take, nor an odd m or k (the
// forward and input-gradient products run against a zero-padded copy of the
// weight), and the loss is the unpadded model's.
TEST(CudaTraining, OneProcessHeadGemmsStayAlignedWithAnOddVocabulary) {
  namespace mock = testing::mock_cublaslt;
  testing::TempDir dir;
  const std::string model = "{n_layer: 1, n_head: 2, d_model: 32, vocab_size: 50257, seq_len: 16}";
  train::Trainer cpu(train_config(dir, model, "cpu", "bf16", 2, 2));
  train::Trainer gpu(train_config(dir, model, "cuda", "bf16", 2, 2));
  const double reference = cpu.step(0).loss;
  mock::reset();
  const double loss = gpu.step(0).loss;
  EXPECT_GT(mock::counters().matmuls, 0);
  EXPECT_EQ(mock::counters().unaligned_matmuls, 0);
  EXPECT_EQ(mock::counters().odd_extent_matmuls, 0);
  EXPECT_NEAR(loss, reference, 0.01 * reference);
  // The unfused head (forward(), generation) still has the odd leading
  // dimension: the counter sees it.
  nn::Gpt m(gpu.config().model, 1, DType::BF16);
  m.to(Device::cuda(0));
  mock::reset();
  (void)to_device(
      m.forward(from_vector(std::vector<int64_t>{1, 2, 3}, {1, 3}, DType::I64, Device::cuda(0))),
      Device::cpu());
  EXPECT_GT(mock::counters().unaligned_matmuls, 0);
}
#endif

// On a GPU each step also reports what the caching allocator holds from the
// device (reserved_memory_bytes): what the allocator says at the step's end,
// at least the step's peak of tensors; the CPU, which caches nothing,
// reports none.
TEST(CudaTraining, StepsReportTheCachingAllocatorsReservedBytes) {
  testing::TempDir dir;
  const std::string model = "{n_layer: 1, n_head: 2, d_model: 32, vocab_size: 97, seq_len: 16}";
  train::Trainer gpu(train_config(dir, model, "cuda", "fp32", 2, 2, 97));
  for (int64_t k = 0; k < 2; ++k) {
    const train::StepMetrics m = gpu.step(k);
    EXPECT_GT(m.peak_memory_bytes, 0) << "step " << k + 1;
    EXPECT_GE(m.reserved_memory_bytes, m.peak_memory_bytes) << "step " << k + 1;
    EXPECT_EQ(m.reserved_memory_bytes, cuda::memory_stats(0).reserved) << "step " << k + 1;
  }
  train::Trainer cpu(train_config(dir, model, "cpu", "fp32", 1, 2, 97));
  EXPECT_EQ(cpu.step(0).reserved_memory_bytes, -1);
}

TEST(CudaTraining, Fp32LossesMatchTheCpuTrainerFor10Steps) {
  testing::TempDir dir;
  const std::string model =
      "{n_layer: 2, n_head: 4, d_model: 64, vocab_size: 50257, seq_len: 64, dropout: 0.1}";
  train::Trainer cpu(train_config(dir, model, "cpu", "fp32", 10, 4));
  train::Trainer gpu(train_config(dir, model, "cuda", "fp32", 10, 4));
  const auto a = losses_of(cpu, 10), b = losses_of(gpu, 10);
  // Stated tolerance: 1e-4 relative per step (f32 sums in other orders).
  for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(b[k], a[k], 1e-4 * a[k]) << "step " << k;
}

// train.optimizer muon on the GPU against the CPU trainer: the
// Newton-Schulz iterations' GEMMs, the momentum and the fused q, k, v and
// gate/value blocks (grouped-query attention, SwiGLU), in fp32 and through
// bf16's f32 masters.
TEST(CudaTraining, MuonLossesMatchTheCpuTrainer) {
  testing::TempDir dir;
  const std::string model =
      "{n_layer: 2, n_head: 4, n_kv_head: 2, d_model: 32, vocab_size: 128, seq_len: 32, "
      "position_embedding: rope, activation: swiglu, ffn_hidden_size: 88, normalization: "
      "rmsnorm, linear_bias: false, tie_embeddings: false}";
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    auto config = [&](const std::string& device) {
      train::Config c = train_config(dir, model, device, precision, 6, 4, 128, "muon");
      c.train.optimizer = "muon";
      c.train.lr = 3e-3;
      return c;
    };
    train::Trainer cpu(config("cpu")), gpu(config("cuda"));
    const auto a = losses_of(cpu, 6), b = losses_of(gpu, 6);
    // fp32: 1e-4 relative (f32 sums in other orders); bf16: 1% (each side
    // rounds its own activations).
    const double tol = precision == "fp32" ? 1e-4 : 1e-2;
    for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(b[k], a[k], tol * a[k]) << "step " << k;
    // Muon moved the weights: the loss fell.
    EXPECT_LT(a.back(), a.front());
  }
}

// Packed documents (per-document attention, positions and the end token's
// loss mask; their starts uploaded once per micro-batch) and a batch-size
// ramp (2, then 4 sequences a step) on the GPU against the CPU trainer, in
// fp32 (the SIMT attention) and bf16 (tensor cores, head dim 16). On the
// simulator a step still waits for the device only twice.
TEST(CudaTraining, PackedDocumentsAndABatchRampMatchTheCpuTrainer) {
  testing::TempDir dir;
  const std::string model =
      "{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 128, seq_len: 32, dropout: 0.1}";
  const std::vector<std::string> extra = {"data.eod_token=5",
                                          "data.reset_attention_mask=true",
                                          "data.reset_position_ids=true",
                                          "data.eod_mask_loss=true",
                                          "train.rampup_batch_size=[2, 2, 8]",
                                          "train.micro_batch_size=2"};
  // LLaMA's options: rotary embeddings take the documents' positions on the
  // GPU (uploaded once a forward pass, no host wait), a SwiGLU MLP, RMSNorm
  // (its residual add fused in), an untied head, and multi-query attention
  // (the 2 query heads share one key/value head). Qwen3's on top: RMSNorm
  // over each query and key head, and heads of 32 (64 wide on d_model 32).
  // Command R+'s instead: a LayerNorm on each query and key head with
  // weights of its own (the non-affine norm's constants made on the device,
  // each head's weights broadcast over the tokens).
  for (const std::string precision :
       {"fp32", "bf16", "bf16 llama", "bf16 qwen3", "bf16 command r+"}) {
    SCOPED_TRACE(precision);
    const bool rope = precision.rfind("bf16 ", 0) == 0, qwen3 = precision == "bf16 qwen3";
    const bool plus = precision == "bf16 command r+";
    auto config = [&](const std::string& device) {
      std::vector<std::string> overrides = extra;
      if (rope) {
        overrides.insert(overrides.end(), {"model.position_embedding=rope",
                                           "model.activation=swiglu", "model.ffn_hidden_size=88",
                                           "model.normalization=rmsnorm", "model.linear_bias=false",
                                           "model.tie_embeddings=false", "model.n_kv_head=1"});
      }
      if (qwen3) overrides.insert(overrides.end(), {"model.head_dim=32", "model.qk_norm=true"});
      if (plus) overrides.push_back("model.qk_norm=head_layernorm");
      return train::parse_config(
          train::to_yaml(train_config(dir, model, device, rope ? "bf16" : precision, 6, 4, 128)),
          overrides);
    };
    train::Trainer cpu(config("cpu"));
    train::Trainer gpu(config("cuda"));
    for (int64_t k = 0; k < 6; ++k) {
#ifdef TRIAD_CUDA_SIM
      const int64_t before = triad_sim::counters().host_waits;
#endif
      const train::StepMetrics a = cpu.step(k), b = gpu.step(k);
#ifdef TRIAD_CUDA_SIM
      if (k > 0) {
        EXPECT_EQ(triad_sim::counters().host_waits - before, 1) << "step " << k;
      }
#endif
      EXPECT_EQ(b.global_batch_size, a.global_batch_size) << "step " << k;
      // Stated tolerance: fp32 1e-4, bf16 1% per step.
      EXPECT_NEAR(b.loss, a.loss, (precision == "fp32" ? 1e-4 : 0.01) * a.loss) << "step " << k;
      if (rope) {
        EXPECT_EQ(gpu.config().model.position_embedding, nn::PositionEmbedding::Rotary);
        EXPECT_EQ(gpu.config().model.activation, nn::Activation::SwiGlu);
        EXPECT_TRUE(gpu.config().model.rms_norm());
        EXPECT_FALSE(gpu.config().model.linear_bias);
        EXPECT_FALSE(gpu.config().model.tie_embeddings);
        EXPECT_EQ(gpu.config().model.kv_heads(), 1);
        EXPECT_EQ(gpu.config().model.qk_norm, qwen3 || plus);
        EXPECT_EQ(gpu.config().model.qk_head_layernorm, plus);
        EXPECT_EQ(gpu.config().model.q_width(), qwen3 ? 64 : 32);
      }
    }
  }
}

TEST(CudaTraining, MixedPrecisionMatchesTheCpuTrainer) {
  // bf16 and fp16 (with its loss scaler) on the GPU against the same
  // precision on the CPU: half parameters and activations, f32 masters and
  // the multi-tensor AdamW, tensor-core attention (head dim 16).
  testing::TempDir dir;
  const std::string model =
      "{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 128, seq_len: 32, dropout: 0.1}";
  // And bf16 with bf16 gradients (train.grad_precision): bf16 buffers the
  // weight-gradient GEMMs add into, and the multi-tensor AdamW reading them.
  // And grouped-query attention (4 query heads over 2 key/value heads)
  // through cuDNN's fused graph, where the build has it.
  // And a sliding window of 8 on the first layer (its own problem, the
  // second layer's whole causal attention another).
  const std::string grouped =
      "{n_layer: 2, n_head: 4, n_kv_head: 2, d_model: 64, vocab_size: 128, seq_len: 32, "
      "dropout: 0.1}";
  const std::string windowed =
      "{n_layer: 2, n_head: 4, n_kv_head: 2, d_model: 64, vocab_size: 128, seq_len: 32, "
      "dropout: 0.1, sliding_window: 8, full_attention_layers: [1]}";
  for (const std::string precision :
       {"bf16", "fp16", "bf16 grads", "bf16 grouped cudnn", "bf16 windowed cudnn"}) {
    SCOPED_TRACE(precision);
    const bool window = precision == "bf16 windowed cudnn";
    const bool gqa = precision == "bf16 grouped cudnn" || window;
    if (gqa && !cuda::cudnn_compiled()) continue;
    auto make = [&](const std::string& device) {
      train::Config c = train_config(dir,
                                     window ? windowed
                                     : gqa  ? grouped
                                            : model,
                                     device, precision.substr(0, 4), 8, 4, 128,
                                     window ? "window"
                                     : gqa  ? "gqa"
                                            : "",
                                     2);
      if (precision == "bf16 grads") c.train.grad_precision = "bf16";
      if (gqa) c.attention_kernel = "cudnn";
      return c;
    };
    train::Trainer cpu(make("cpu"));
    train::Trainer gpu(make("cuda"));
    for (int64_t k = 0; k < 8; ++k) {
      const train::StepMetrics a = cpu.step(k), b = gpu.step(k);
      // Stated tolerance: 1% per step (half roundings at different points).
      EXPECT_NEAR(b.loss, a.loss, 0.01 * a.loss) << "step " << k;
      EXPECT_EQ(b.skipped, a.skipped) << "step " << k;
      EXPECT_EQ(b.loss_scale, a.loss_scale) << "step " << k;
    }
  }
}

// A checkpoint written in the step (checkpoint.async: false) moves each
// tensor to the host as it writes it, and so does the final
// model.safetensors: the host never holds a copy of the rank's state (the
// parameters and both moments, three times the model here), nor of the
// model. The checkpoint still resumes.
TEST(CudaTraining, SavingMovesOneTensorAtATimeToTheHost) {
  testing::TempDir dir;
  train::Config cfg = train_config(
      dir, "{n_layer: 2, n_head: 2, d_model: 64, vocab_size: 97, seq_len: 16, dropout: 0.0}",
      "cuda", "fp32", 2, 2, 97, "_save");
  cfg.checkpoint.dir = dir.file("ckpt");
  cfg.checkpoint.interval = 1;
  cfg.checkpoint.async = false;
  cfg.checkpoint.resume = "auto";
  int64_t model_bytes = 0;
  for (const auto& [name, shape] : nn::gpt_parameter_shapes(cfg.model))
    model_bytes += numel(shape) * 4;  // f32
  {
    train::Trainer t(cfg);
    Allocator& host = cpu_allocator();
    const int64_t before = host.stats().allocated;
    host.reset_peak();
    t.run();
    const int64_t peak = host.stats().peak_allocated - before;
    EXPECT_LT(peak, model_bytes / 2) << "of a " << model_bytes << "-byte model";
  }
  cfg.train.steps = 3;
  const auto resumed = train::Trainer(cfg).run();
  ASSERT_EQ(resumed.size(), 1u);  // only the third step
  EXPECT_EQ(resumed[0].step, 3);
}

TEST(CudaTraining, AResumedRunKeepsItsAttentionChoice) {
  if (!cuda::cudnn_compiled()) GTEST_SKIP() << "this build has no cuDNN";
  testing::TempDir dir;
  const std::string model =
      "{n_layer: 1, n_head: 2, d_model: 32, vocab_size: 97, seq_len: 16, dropout: 0.0}";
  cuda::clear_attention_choices();
  train::Config cfg = train_config(dir, model, "cuda", "bf16", 2, 4, 97, "_choice", 2);
  cfg.checkpoint.dir = dir.file("ckpt");
  cfg.checkpoint.interval = 2;
  cfg.checkpoint.resume = "auto";
  train::Trainer(cfg).run();
  // The trainer decided for its microbatch (2 sequences of 16, 2 heads of
  // 16) before the first step.
  cuda::AttentionChoice decided;
  decided.dtype = DType::BF16;
  decided.batch = 2, decided.seq_len = 16, decided.d_model = 32, decided.n_head = 2;
  ASSERT_TRUE(cuda::find_attention_choice(decided));
  // This process now holds the opposite decision; the resumed run takes the
  // checkpoint's back.
  cuda::AttentionChoice flipped = decided;
  flipped.cudnn = !decided.cudnn;
  cuda::set_attention_choice(flipped);
  cfg.train.steps = 3;
  const auto resumed = train::Trainer(cfg).run();
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0].step, 3);
  cuda::AttentionChoice now = decided;
  ASSERT_TRUE(cuda::find_attention_choice(now));
  EXPECT_EQ(now.cudnn, decided.cudnn);
  cuda::clear_attention_choices();
}

TEST(CudaTraining, RecomputeLeavesTheRunUnchanged) {
  // model.recompute on the GPU: the same losses and gradient norms with
  // activations kept, with the attention core recomputed, with every block
  // recomputed (dropout masks are redrawn from the same counters), and with
  // the first block alone recomputed (model.recompute_layers).
  // In bf16 too: a recomputed block hands on bf16 gradients (an f32 one
  // reaching the next block's bf16 GEMMs failed there); the stated tolerance
  // there is bf16's, since the block-input gradients round at other points.
  testing::TempDir dir;
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const double tol = precision == "fp32" ? 1e-5 : 2e-2;
    std::vector<std::vector<train::StepMetrics>> runs;
    for (const std::string mode : {"none", "selective", "full", "full, recompute_layers: 1"}) {
      const std::string model =
          "{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 128, seq_len: 32, dropout: 0.1, "
          "recompute: " +
          mode + "}";
      train::Trainer t(train_config(dir, model, "cuda", precision, 3, 4, 128,
                                    std::to_string(runs.size()) + precision));
      runs.emplace_back();
      for (int64_t k = 0; k < 3; ++k) runs.back().push_back(t.step(k));
    }
    for (size_t r = 1; r < runs.size(); ++r) {
      for (size_t k = 0; k < runs[0].size(); ++k) {
        EXPECT_NEAR(runs[r][k].loss, runs[0][k].loss, 0.1 * tol * runs[0][k].loss) << r << " " << k;
        EXPECT_NEAR(runs[r][k].grad_norm, runs[0][k].grad_norm, tol * runs[0][k].grad_norm)
            << r << " " << k;
      }
    }
  }
}

// The loss (first, named "loss") and every parameter's gradient of one
// backward of `model` on (ids, targets), by name, on the host.
using LossAndGradients = std::vector<std::pair<std::string, std::vector<double>>>;
LossAndGradients loss_and_gradients(nn::Gpt& model, const Tensor& ids, const Tensor& targets) {
  Tensor loss = model.loss(ids, targets);
  LossAndGradients out;
  out.emplace_back("loss", std::vector<double>{item(loss)});
  autograd::backward({loss});
  for (auto& [name, p] : model.named_parameters())
    out.emplace_back(name, to_double_vector(p.grad()));
  return out;
}

// Expects `got` (a bf16 backward) to follow `want`: bf16 rounds each operand
// to 8 bits of mantissa, so a correct backward keeps the loss within 0.2%
// and every gradient at a cosine above 0.99 with its norm within 5%
// (measured on the simulator at GPT-2's width, T 256 and 1024: every cosine
// above 0.9999). Returns each gradient's cosine and name, lowest first.
std::vector<std::pair<double, std::string>> expect_gradients_follow(const LossAndGradients& got,
                                                                    const LossAndGradients& want) {
  std::vector<std::pair<double, std::string>> cosines;
  EXPECT_EQ(got.size(), want.size());
  if (got.size() != want.size() || want.empty()) return cosines;
  EXPECT_NEAR(got[0].second[0], want[0].second[0], 2e-3 * want[0].second[0]) << "loss";
  for (size_t i = 1; i < want.size(); ++i) {
    const auto& g = got[i].second;
    const auto& w = want[i].second;
    double dot = 0, gg = 0, ww = 0;
    for (size_t j = 0; j < w.size(); ++j) {
      dot += g[j] * w[j];
      gg += g[j] * g[j];
      ww += w[j] * w[j];
    }
    cosines.emplace_back(dot / std::sqrt(gg * ww + 1e-300), want[i].first);
    EXPECT_GT(cosines.back().first, 0.99) << "gradient of " << want[i].first;
    EXPECT_NEAR(std::sqrt(gg), std::sqrt(ww), 0.05 * std::sqrt(ww)) << want[i].first;
  }
  std::sort(cosines.begin(), cosines.end());
  return cosines;
}

// One backward of a GPT-2-wide model (on the simulator a narrow one) in
// bf16 against the same model in f32, through each attention kernel the
// device has: every parameter's gradient must point the same way (cosine)
// and have the same length. A wrong gradient in one kernel at these shapes
// shows up here by name, where the 50-step run below only sees the loss.
TEST(CudaTraining, Bf16GradientsFollowF32AtGpt2Shapes) {
  nn::GptConfig cfg{.n_layer = 2};  // GPT-2's width, heads, vocabulary and context
  if (kOnSimulator) {
    cfg = {.n_layer = 1, .n_head = 2, .d_model = 128, .vocab_size = 1001, .seq_len = 64};
  }
  const int64_t B = 2, T = cfg.seq_len, V = cfg.vocab_size;
  std::vector<int64_t> tokens(static_cast<size_t>(B * T)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int64_t>((i * 7919 + i / 13) % static_cast<size_t>(V));
    targets[i] = static_cast<int64_t>((i * 7919 + 7 + i / 13) % static_cast<size_t>(V));
  }
  const Tensor ids = from_vector(tokens, {B, T}, DType::I64),
               tg = from_vector(targets, {B, T}, DType::I64);
  auto gradients = [&](DType dtype) {
    nn::Gpt model(cfg, 4321);
    model.to(kGpu);
    if (dtype != DType::F32) model.to(dtype);
    return loss_and_gradients(model, ids, tg);
  };
  const auto want = gradients(DType::F32);
  for (cuda::AttentionKernel kernel :
       {cuda::AttentionKernel::Simt, cuda::AttentionKernel::TensorCore,
        cuda::AttentionKernel::Cudnn}) {
    const std::string why =
        cuda::attention_kernel_unavailable(kernel, DType::BF16, T, cfg.d_model, cfg.n_head);
    if (!why.empty()) {
      std::printf("[ note ] %s: %s\n", cuda::attention_kernel_name(kernel), why.c_str());
      continue;
    }
    SCOPED_TRACE(cuda::attention_kernel_name(kernel));
    cuda::set_attention_kernel(kernel);
    const auto got = gradients(DType::BF16);
    cuda::set_attention_kernel(cuda::AttentionKernel::Auto);
    const auto cosines = expect_gradients_follow(got, want);
    ASSERT_FALSE(cosines.empty());
    std::printf("[ note ] %s: bf16 loss %.5f (f32 %.5f), lowest gradient cosine %.5f (%s)\n",
                cuda::attention_kernel_name(kernel), got[0].second[0], want[0].second[0],
                cosines[0].first, cosines[0].second.c_str());
  }
}

// Each parameter as f32 on the host, by name (a trainer's weights at one
// point of its run).
using WeightSnapshot = std::vector<std::pair<std::string, std::vector<float>>>;
WeightSnapshot snapshot_weights(const train::Trainer& t) {
  WeightSnapshot out;
  for (const auto& [name, p] : t.full_state_dict()) {
    const std::vector<double> v = to_double_vector(p);
    out.emplace_back(name, std::vector<float>(v.begin(), v.end()));
  }
  return out;
}

// How each parameter moved in two runs from the same start: the cosine
// between their updates (end minus start) and the ratio of the updates'
// lengths (b's over a's), lowest cosines first. A parameter whose gradient
// one run gets wrong moves elsewhere in that run while the others follow.
struct UpdateAgreement {
  std::string name;
  double cosine = 1, length_ratio = 1;
};
std::vector<UpdateAgreement> update_agreement(const WeightSnapshot& a0, const WeightSnapshot& a1,
                                              const WeightSnapshot& b0, const WeightSnapshot& b1) {
  std::vector<UpdateAgreement> out;
  for (size_t i = 0; i < a0.size(); ++i) {
    const std::vector<float>&wa0 = a0[i].second, &wa1 = a1.at(i).second;
    const std::vector<float>&wb0 = b0.at(i).second, &wb1 = b1.at(i).second;
    double dot = 0, aa = 0, bb = 0;
    for (size_t j = 0; j < wa0.size(); ++j) {
      const double da = double(wa1.at(j)) - wa0[j], db = double(wb1.at(j)) - wb0.at(j);
      dot += da * db, aa += da * da, bb += db * db;
    }
    out.push_back(
        {a0[i].first, dot / std::sqrt(aa * bb + 1e-300), std::sqrt(bb) / std::sqrt(aa + 1e-300)});
  }
  std::sort(out.begin(), out.end(),
            [](const UpdateAgreement& x, const UpdateAgreement& y) { return x.cosine < y.cosine; });
  return out;
}

// bf16 training of a GPT-2 124M-shaped model against the same run in fp32
// (on the simulator a small model, so that the test's variants and notes
// run in every CUDA build before a GPU session depends on them).
TEST(CudaTraining, Bf16Gpt2SmallTracksFp32For50Steps) {
  testing::TempDir dir;
  struct Shape {
    int64_t n_layer, n_head, d_model, vocab_size, seq_len;
  };
  const Shape shape = kOnSimulator ? Shape{2, 2, 32, 128, 32} : Shape{12, 12, 768, 50257, 1024};
  const int data_vocab = kOnSimulator ? 128 : 50000;
  auto model = [&](const std::string& attention) {
    return "{n_layer: " + std::to_string(shape.n_layer) +
           ", n_head: " + std::to_string(shape.n_head) +
           ", d_model: " + std::to_string(shape.d_model) +
           ", vocab_size: " + std::to_string(shape.vocab_size) +
           ", seq_len: " + std::to_string(shape.seq_len) + ", attention_kernel: " + attention + "}";
  };
  struct Run {
    std::vector<double> loss, norm;
    std::vector<bool> skipped;
    WeightSnapshot start, end;
  };
  // `verify`: the products of steps 1-3 and every fifth step are checked
  // against the reference kernel (cuda::GemmSettings::verify).
  auto train = [&](const std::string& precision, const std::string& attention,
                   const std::string& tag, bool verify = false) {
    train::Trainer t(
        train_config(dir, model(attention), "cuda", precision, 50, 4, data_vocab, tag));
    Run r;
    r.start = snapshot_weights(t);
    const cuda::GemmSettings settings = cuda::gemm_settings();
    for (int64_t k = 0; k < 50; ++k) {
      cuda::GemmSettings step_settings = settings;
      step_settings.verify = verify && (k < 3 || k % 5 == 4);
      cuda::set_gemm_settings(step_settings);
      const train::StepMetrics m = t.step(k);
      r.loss.push_back(m.loss);
      r.norm.push_back(m.grad_norm);
      r.skipped.push_back(m.skipped);
    }
    cuda::set_gemm_settings(settings);
    r.end = snapshot_weights(t);
    return r;
  };
  const Run a = train("fp32", "auto", "");
  const nn::GptConfig gpt{.n_layer = shape.n_layer,
                          .n_head = shape.n_head,
                          .d_model = shape.d_model,
                          .vocab_size = shape.vocab_size,
                          .seq_len = shape.seq_len};
  auto bf16_gradients_at = [&](const WeightSnapshot& weights) {
    const int64_t T = gpt.seq_len;
    std::vector<int64_t> tokens(static_cast<size_t>(T)), targets(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int64_t>((i * 7 + i / 13) % static_cast<size_t>(data_vocab));
      targets[i] = static_cast<int64_t>(((i + 1) * 7 + (i + 1) / 13) % data_vocab);
    }
    auto gradients = [&](Device device) {
      nn::Gpt model(gpt, 1);
      nn::StateDict state;
      for (const auto& [name, p] : model.named_parameters()) {
        const auto it = std::find_if(weights.begin(), weights.end(),
                                     [&](const auto& w) { return w.first == name; });
        EXPECT_NE(it, weights.end()) << name;
        if (it != weights.end()) state[name] = from_vector(it->second, p.shape());
      }
      model.load_state_dict(state);
      model.to(device);
      model.to(DType::BF16);
      return loss_and_gradients(model, to_device(from_vector(tokens, {1, T}, DType::I64), device),
                                to_device(from_vector(targets, {1, T}, DType::I64), device));
    };
    // Both in bf16 from the same weights: only the order of roundings differs.
    const auto cpu = gradients(Device::cpu()), gpu = gradients(kGpu);
    const auto cosines = expect_gradients_follow(gpu, cpu);
    ASSERT_FALSE(cosines.empty());
    std::string lowest;
    for (size_t i = 0; i < std::min<size_t>(3, cosines.size()); ++i) {
      char item_text[128];
      std::snprintf(item_text, sizeof item_text, "%s%s %.5f", i ? ", " : "",
                    cosines[i].second.c_str(), cosines[i].first);
      lowest += item_text;
    }
    std::printf(
        "[ note ] bf16, trained weights, one batch: loss %.5f on the GPU, %.5f on the CPU; lowest "
        "gradient cosines GPU vs CPU: %s\n",
        gpu[0].second[0], cpu[0].second[0], lowest.c_str());
  };
  // bf16 as it trains by default (the attention the trainer times fastest),
  // then with each of cuBLASLt's liberties taken away (cuda::GemmSettings),
  // and through each attention kernel: when the default fails, the variants
  // that pass name the cause.
  struct Variant {
    std::string name;
    cuda::GemmSettings gemm;
    cuda::AttentionKernel attention = cuda::AttentionKernel::Auto;
  };
  std::vector<Variant> variants;
  for (const GemmVariant& g : gemm_variants()) variants.push_back({g.name, g.settings});
  for (cuda::AttentionKernel k : {cuda::AttentionKernel::TensorCore, cuda::AttentionKernel::Simt,
                                  cuda::AttentionKernel::Cudnn}) {
    variants.push_back({std::string(cuda::attention_kernel_name(k)) + " attention", {}, k});
  }
  // Every liberty taken away at once (plain f32 products, Triad's bias and
  // GELU, SIMT attention): if even this run fails, the fault is outside the
  // GEMMs and the attention.
  cuda::GemmSettings plain;
  plain.epilogues = plain.half_reduced_precision_reduction = plain.half_products = false;
  variants.push_back(
      {"gemm in f32 without epilogues, simt attention", plain, cuda::AttentionKernel::Simt});
  const GemmSettingsScope restore;
  for (size_t v = 0; v < variants.size(); ++v) {
    const Variant& variant = variants[v];
    SCOPED_TRACE("bf16, " + variant.name);
    const std::string why = cuda::attention_kernel_unavailable(
        variant.attention, DType::BF16, shape.seq_len, shape.d_model, shape.n_head);
    if (!why.empty()) {
      std::printf("[ note ] bf16, %s: not run (%s)\n", variant.name.c_str(), why.c_str());
      continue;
    }
    cuda::set_gemm_settings(variant.gemm);
    const std::string attention = cuda::attention_kernel_name(variant.attention);
    // The default run's products are verified on some steps: a wrong one is
    // named by shape, layout and epilogue.
    const bool verify = v == 0;
    cuda::reset_gemm_verification();
    const Run b = train("bf16", attention, "_variant" + std::to_string(v), verify);
    if (verify) {
      const cuda::GemmVerification checked = cuda::gemm_verification();
      std::string failures;
      for (const cuda::GemmCheck& f : checked.failures) {
        char error[64];
        std::snprintf(error, sizeof error, "; failed %.3g (%lld non-finite): ", f.relative_error,
                      static_cast<long long>(f.nonfinite));
        failures += error + f.problem;
      }
      std::printf(
          "[ note ] bf16, %s: %lld products verified, %lld failed; nearest its tolerance "
          "%.3g of %.3g (%s)%s\n",
          variant.name.c_str(), static_cast<long long>(checked.checked),
          static_cast<long long>(checked.failed), checked.worst.relative_error,
          checked.worst.tolerance, checked.worst.problem.c_str(), failures.c_str());
      EXPECT_GT(checked.checked, 0);
      EXPECT_EQ(checked.failed, 0) << failures;
      // The trained weights' gradients on one batch, bf16 on the GPU
      // against bf16 on the CPU: if they agree and the run still drifts,
      // the fault is in the step (clipping, AdamW, master weights); if not,
      // the parameter named is the one whose gradient goes wrong.
      bf16_gradients_at(b.end);
    }
    std::string ran = attention;
    cuda::AttentionChoice chosen;  // what auto took, when it had a choice
    chosen.dtype = DType::BF16, chosen.batch = 4, chosen.seq_len = shape.seq_len;
    chosen.d_model = shape.d_model, chosen.n_head = shape.n_head;
    if (attention == "auto" && cuda::find_attention_choice(chosen))
      ran += chosen.cudnn ? " (cudnn)" : " (triad)";
    // Both runs start from the same weights (bf16's rounded from them).
    ASSERT_EQ(b.start.size(), a.start.size());
    for (size_t i = 0; i < a.start.size(); ++i) ASSERT_EQ(b.start[i].first, a.start[i].first);
    std::string table = "step  f32 loss (grad norm)  bf16 loss (grad norm)\n";
    for (size_t k = 0; k < a.loss.size(); ++k) {
      char line[128];
      std::snprintf(line, sizeof line, "%4zu  %8.4f (%7.4f)%s  %8.4f (%7.4f)%s\n", k, a.loss[k],
                    a.norm[k], a.skipped[k] ? " skipped" : "", b.loss[k], b.norm[k],
                    b.skipped[k] ? " skipped" : "");
      table += line;
    }
    // Where the two runs' weights went, parameter by parameter: the
    // parameters whose 50 updates agree least with fp32's.
    const std::vector<UpdateAgreement> moved = update_agreement(a.start, a.end, b.start, b.end);
    std::string least = "";
    for (size_t i = 0; i < std::min<size_t>(5, moved.size()); ++i) {
      char item[160];
      std::snprintf(item, sizeof item, "%s%s %.3f (length x%.2f)", i ? ", " : "",
                    moved[i].name.c_str(), moved[i].cosine, moved[i].length_ratio);
      least += item;
    }
    std::printf("[ note ] bf16, %s: attention %s; update cosines with f32, lowest: %s\n",
                variant.name.c_str(), ran.c_str(), least.c_str());
    SCOPED_TRACE(table);
    // Stated tolerance. The first 8 steps, before the two runs' roundings
    // have moved their weights apart, agree within 0.1%: the CPU's bf16 and
    // fp32 runs within 0.03% (2026-11-22, docs/benchmarks.md), every
    // variant on the H200 within 0.024% (2026-12-04), where cuBLASLt's
    // half-precision reductions were 0.36% off by step 6. Later steps are
    // compared as a mean, and loosely: each step's loss is one batch's, and
    // at this learning rate and batch the f32 run itself is chaotic (its
    // gradient norm jumps from 0.5 to 16 and back); on the H200, correct
    // variants' means over steps 11-50 lie 0.12 below to 0.07 above f32's,
    // so they are held to 0.2. And bf16 learns: its last 10 steps average at
    // least 0.1 below its first 5 (H200: 0.19 to 0.37; the broken run of the
    // first GPU session ended above its start).
    auto mean = [](const std::vector<double>& x, size_t from, size_t to) {
      double sum = 0;
      for (size_t k = from; k < to; ++k) sum += x[k];
      return sum / static_cast<double>(to - from);
    };
    double early = 0;  // the largest relative difference over the first 8 steps
    for (size_t k = 0; k < 8; ++k) early = std::max(early, std::fabs(b.loss[k] / a.loss[k] - 1));
    std::printf(
        "[ note ] bf16, %s: first 8 steps within %.4f%%, mean over steps 11-50 %.4f (f32 %.4f), "
        "last 10 %.4f vs first 5 %.4f\n",
        variant.name.c_str(), 100 * early, mean(b.loss, 10, 50), mean(a.loss, 10, 50),
        mean(b.loss, 40, 50), mean(b.loss, 0, 5));
    // cuBLASLt's half-precision split-k reductions drifted on the H200
    // (2026-12-04: 0.36% off by step 6, the mean over steps 11-50 0.11
    // above f32's); that run is kept for its notes, not held to f32's.
    if (variant.name == kHalfReductions) continue;
    for (size_t k = 0; k < 8; ++k)
      EXPECT_NEAR(b.loss[k], a.loss[k], 0.001 * a.loss[k]) << "step " << k;
    EXPECT_NEAR(mean(b.loss, 10, 50), mean(a.loss, 10, 50), 0.2) << "mean loss over steps 11-50";
    EXPECT_LT(mean(b.loss, 40, 50), mean(b.loss, 0, 5) - 0.1) << "bf16's progress";
  }
}

// The NCCL group at world size 1 (one GPU): every call runs through NCCL on
// the group's stream; the multi-rank paths are the same code.
TEST(NcclProcessGroup, WorldOfOneRunsEveryCallOnTheGpu) {
  if (!dist::nccl_available()) GTEST_SKIP() << "built without NCCL";
  dist::ProcessGroupPtr world = dist::init_world();
  ASSERT_EQ(world->size(), 1);
  dist::ProcessGroupPtr nccl = dist::make_nccl_group(world, 0);
  nccl->set_validate(true);
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    SCOPED_TRACE(dtype_name(d));
    Tensor host = randn({37, 5}, 2, 1, 1.0, d);
    for (dist::ReduceOp op : {dist::ReduceOp::Sum, dist::ReduceOp::Avg, dist::ReduceOp::Max}) {
      Tensor t = to_device(host, kGpu);
      nccl->all_reduce(t, op)->wait();
      EXPECT_EQ(to_double_vector(t), to_double_vector(host));
    }
  }
  Tensor ints =
      to_device(from_vector(std::vector<int64_t>{5, -3, 1ll << 40}, {3}, DType::I64), kGpu);
  nccl->all_reduce(ints, dist::ReduceOp::Min)->wait();
  EXPECT_EQ(to_double_vector(ints), (std::vector<double>{5, -3, static_cast<double>(1ll << 40)}));
  Tensor in = to_device(randn({6, 4}, 3, 1), kGpu), out = empty({6, 4}, DType::F32, kGpu);
  nccl->all_gather(in, out)->wait();
  EXPECT_EQ(to_double_vector(out), to_double_vector(in));
  Tensor piece = empty({6, 4}, DType::F32, kGpu);
  nccl->reduce_scatter(in, piece, dist::ReduceOp::Sum)->wait();
  EXPECT_EQ(to_double_vector(piece), to_double_vector(in));
  nccl->broadcast(in, 0)->wait();
  nccl->barrier()->wait();
  EXPECT_THROW(nccl->all_reduce(ints, dist::ReduceOp::Avg), ValueError);  // avg of integers
  Tensor on_host = randn({3}, 1, 1);
  EXPECT_THROW(nccl->all_reduce(on_host, dist::ReduceOp::Sum), NotSupportedError);
  // The routed group sends each tensor where it lives.
  dist::ProcessGroupPtr routed = dist::make_device_routed_group(world, nccl);
  Tensor dev = to_device(randn({8}, 4, 1), kGpu);
  routed->all_reduce(on_host, dist::ReduceOp::Sum)->wait();
  routed->all_reduce(dev, dist::ReduceOp::Avg)->wait();
  EXPECT_EQ(to_double_vector(dev), to_double_vector(randn({8}, 4, 1)));
}

#ifdef TRIAD_CUDA_SIM
// Issuing a collective creates no CUDA event once the group is warm: its
// ordering after the compute stream and its completion event are reused
// (each creation is a driver call the host waits for).
TEST(NcclProcessGroup, CollectivesReuseTheirEvents) {
  if (!dist::nccl_available()) GTEST_SKIP() << "built without NCCL";
  dist::ProcessGroupPtr nccl = dist::make_nccl_group(dist::init_world(), 0);
  Tensor t = to_device(randn({16}, 5, 1), kGpu);
  auto call = [&] {
    nccl->all_reduce(t, dist::ReduceOp::Sum)->wait();
    cuda::synchronize(0);
    // Long enough for the watchdog to poll and let go of the event.
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
  };
  call();
  const int64_t before = triad_sim::counters().events_created;
  for (int i = 0; i < 10; ++i) call();
  EXPECT_EQ(triad_sim::counters().events_created - before, 0);
  EXPECT_EQ(to_double_vector(t), to_double_vector(randn({16}, 5, 1)));
}
#endif

}  // namespace
}  // namespace triad

int main(int argc, char** argv) {
  if (triad::cuda::device_count() == 0) {
    std::printf("no CUDA device visible: the gpu suite is skipped\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
