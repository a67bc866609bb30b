// Host-side logic of the CUDA kernels, run on every machine of a CUDA build
// (no GPU needed): the "can this run?" checks, the launchers' refusal of bad
// arguments before touching the device, and strided-view coalescing.
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <tuple>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cached_attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/softmax.h"
#include "triad/backend/cuda.h"

namespace triad::kernels {
namespace {

std::string reason(const Status& s) {
  return s.ok ? "" : s.reason;
}

TEST(CudaKernelChecks, DropoutRowsMustDivideTheElements) {
  EXPECT_TRUE(check_dropout(0.5, 12, {7, 4, 9}).ok);
  EXPECT_TRUE(check_dropout(0.5, 12, {7, 0, 0}).ok);
  EXPECT_NE(reason(check_dropout(0.5, 12, {7, 5, 9})).find("rows of 5 draws do not divide 12"),
            std::string::npos);
  EXPECT_NE(reason(check_dropout(1.0, 12)).find("[0, 1)"), std::string::npos);
  EXPECT_TRUE(check_dropout(0.5, 12, {7, 4, 9}, true).ok);
  EXPECT_NE(reason(check_dropout(0.5, 12, {7, 0, 0}, true)).find("keyed rows need a row length"),
            std::string::npos);
}

TEST(CudaKernelChecks, AttentionAcceptsGptShapesAndNamesWhatIsWrong) {
  EXPECT_TRUE(check_attention(ScalarType::BF16, {4, 1024, 768, 12}).ok);
  EXPECT_TRUE(check_attention(ScalarType::F32, {1, 7, 18, 2}).ok);
  EXPECT_NE(reason(check_attention(ScalarType::F32, {1, 8, 100, 3})).find("divisible"),
            std::string::npos);
  // Head dims up to 256 (Gemma 2's and 3's), and not past them.
  EXPECT_TRUE(check_attention(ScalarType::F32, {1, 8, 512, 2}).ok);
  EXPECT_TRUE(check_attention(ScalarType::BF16, {1, 8, 384, 2}).ok);
  EXPECT_NE(
      reason(check_attention(ScalarType::F32, {1, 8, 514, 2})).find("head dim 257 exceeds 256"),
      std::string::npos);
  EXPECT_NE(reason(check_attention(ScalarType::F64, {1, 8, 64, 2})).find("f64"), std::string::npos);
  EXPECT_TRUE(check_attention(ScalarType::F32, {70000, 8, 64, 1}).ok);  // past y's 65535
  // A chunk of queries: only with the queries apart from the keys and
  // values; its first position inside [0, T] unless its rows are counted
  // (QT: a block after every key, ring attention's), and never negative.
  AttentionShape chunk{1, 8, 64, 2};
  chunk.Q0 = 3;
  EXPECT_NE(reason(check_attention(ScalarType::F32, chunk)).find("Q0 3"), std::string::npos);
  chunk.separate = true;
  EXPECT_TRUE(check_attention(ScalarType::F32, chunk).ok);
  EXPECT_EQ(chunk.query_rows(), 5);
  chunk.Q0 = 9;
  EXPECT_NE(reason(check_attention(ScalarType::F32, chunk)).find("at most T (8)"),
            std::string::npos);
  chunk.QT = 12;  // 12 queries at positions [9, 21) over keys [0, 8)
  EXPECT_TRUE(check_attention(ScalarType::F32, chunk).ok);
  EXPECT_EQ(chunk.query_rows(), 12);
  chunk.Q0 = -1;
  EXPECT_NE(reason(check_attention(ScalarType::F32, chunk)).find("must be >= 0"),
            std::string::npos);
  AttentionShape fused{1, 8, 64, 2};
  fused.QT = 5;  // a fused qkv runs every row's queries
  EXPECT_NE(reason(check_attention(ScalarType::F32, fused)).find("QT 5"), std::string::npos);
  // The grids are flat along x: neither B * NH nor the rows meet a limit of
  // 65535 on their own (y's), only their product, in blocks of 32 rows,
  // meets x's 2^31 - 1.
  EXPECT_TRUE(check_attention(ScalarType::BF16, {65536, 8, 64, 2}).ok);
  EXPECT_TRUE(check_attention(ScalarType::BF16, {1, 65536 * 64, 64, 1}).ok);
  EXPECT_TRUE(check_attention(ScalarType::F32, {1, 32 * 65536, 32767, 32767}).ok);
  EXPECT_NE(reason(check_attention(ScalarType::F32, {1, 32 * 65536, 32768, 32768}))
                .find("B * NH (32768) heads of 2097152 rows at 32 rows a block exceed a grid's "
                      "2147483647 blocks"),
            std::string::npos);
  AttentionShape wide_chunk{1, 8, 64, 1};
  wide_chunk.separate = true;
  wide_chunk.QT = kAttentionMaxGridX * 32 + 1;  // the query rows count, not only T
  EXPECT_NE(reason(check_attention(ScalarType::F32, wide_chunk)).find("exceed a grid's"),
            std::string::npos);
  // Tensor cores: bf16/f16 and head dims a multiple of 16.
  EXPECT_TRUE(check_attention_tensor_core(ScalarType::BF16, {4, 1024, 768, 12}).ok);
  EXPECT_TRUE(check_attention_tensor_core(ScalarType::F16, {131072, 64, 128, 1}).ok);
  EXPECT_NE(reason(check_attention_tensor_core(ScalarType::F32, {1, 8, 64, 1})).find("bf16 or f16"),
            std::string::npos);
  EXPECT_NE(reason(check_attention_tensor_core(ScalarType::BF16, {1, 8, 80, 2})).find("multiple"),
            std::string::npos);
  // ... whose shared memory the device has: every width on an H100's or
  // H200's 227 KiB (the default), up to 128 on sm_80's 163 KiB, up to 64
  // on the 99 KiB of sm_86, sm_89 and sm_120 (the SIMT kernels take the
  // rest).
  const AttentionDevice a100{8, 163 * 1024}, l40{8, 99 * 1024}, b200{10, 227 * 1024};
  EXPECT_TRUE(check_attention_tensor_core(ScalarType::BF16, {1, 8, 512, 2}).ok);
  EXPECT_TRUE(check_attention_tensor_core(ScalarType::F16, {1, 8, 384, 2}, b200).ok);
  EXPECT_TRUE(check_attention_tensor_core(ScalarType::BF16, {1, 8, 256, 2}, a100).ok);
  EXPECT_TRUE(check_attention_tensor_core(ScalarType::BF16, {1, 8, 128, 2}, l40).ok);
  EXPECT_NE(
      reason(check_attention_tensor_core(ScalarType::BF16, {1, 8, 512, 2}, a100))
          .find("head dim 256 takes " + std::to_string(attention_tensor_core_shared_bytes(256)) +
                " bytes of shared memory a block on tensor cores, and the device allows " +
                std::to_string(163 * 1024)),
      std::string::npos);
  EXPECT_NE(reason(check_attention_tensor_core(ScalarType::BF16, {1, 8, 256, 2}, l40))
                .find("head dim 128 takes"),
            std::string::npos);
  EXPECT_LE(attention_tensor_core_shared_bytes(64), 99u * 1024);
  EXPECT_GT(attention_tensor_core_shared_bytes(128), 99u * 1024);
  EXPECT_LE(attention_tensor_core_shared_bytes(128), 163u * 1024);
  EXPECT_GT(attention_tensor_core_shared_bytes(256), 163u * 1024);
  EXPECT_NE(reason(check_attention_tensor_core(ScalarType::BF16, {1, 8, 360, 2}))
                .find("head dim 180 is not a multiple of 16"),
            std::string::npos);
}

TEST(CudaKernelChecks, LaunchersRefuseBadArgumentsBeforeTouchingTheDevice) {
  // No pointer is dereferenced and no CUDA call is made: the check fails first.
  EXPECT_THROW(
      attention_forward(nullptr, nullptr, nullptr, ScalarType::F32, {1, 4, 30, 4}, nullptr),
      std::invalid_argument);
  EXPECT_THROW(layer_norm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                  ScalarType::I32, 4, 8, 1e-5, nullptr),
               std::invalid_argument);
  EXPECT_THROW(layer_norm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                  ScalarType::F32, 4, 8, 0.0, nullptr),
               std::invalid_argument);
  EXPECT_THROW(softmax_forward(nullptr, nullptr, ScalarType::F32, 4, 0, nullptr),
               std::invalid_argument);
  EXPECT_THROW(
      dropout(nullptr, nullptr, ScalarType::F32, 8, 1.0, 1, 2, {3, 0, 0}, nullptr, nullptr),
      std::invalid_argument);
  // Rows of 3 draws do not divide 8 elements.
  EXPECT_THROW(
      dropout(nullptr, nullptr, ScalarType::F32, 8, 0.5, 1, 2, {3, 3, 10}, nullptr, nullptr),
      std::invalid_argument);
  // Keyed rows need a length.
  const int64_t key = 0;
  EXPECT_THROW(dropout(nullptr, nullptr, ScalarType::F32, 8, 0.5, 1, 2, {3, 0, 0}, &key, nullptr),
               std::invalid_argument);
  EXPECT_THROW(vocab_ce_sumexp(nullptr, ScalarType::F32, nullptr, 2, 10, 10, 11, nullptr, nullptr),
               std::invalid_argument);
  EXPECT_THROW(vocab_ce_shard_sums(nullptr, ScalarType::F32, nullptr, true, 2, 10, 10, 0, 11,
                                   nullptr, nullptr, nullptr, nullptr),
               std::invalid_argument);
  EXPECT_THROW(scale_by_ratio(nullptr, ScalarType::BF16, 2, 10, 9, nullptr, 1.0, nullptr),
               std::invalid_argument);  // rows overlap
  EXPECT_THROW(scale_by_ratio(nullptr, ScalarType::BF16, 2, 10, 10, nullptr, 0.0, nullptr),
               std::invalid_argument);  // nothing to divide by
  EXPECT_THROW(
      cross_entropy_forward_backward(nullptr, ScalarType::F64, nullptr, true, nullptr, 2, 10, 10,
                                     -100, 0.0, 0.0, nullptr, nullptr, nullptr, nullptr),
      std::invalid_argument);  // f64 logits
  // An embedding backward with long segments needs its scratch of partial
  // sums, and has no more long segments than rows.
  EmbeddingPlan plan;
  plan.pieces = 3;
  plan.longs = 1;
  auto embedding_refusal = [&](const EmbeddingPlan& p) {
    try {
      embedding_backward(p, nullptr, ScalarType::F32, 4, 8, nullptr, nullptr);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(embedding_refusal(plan).find("scratch of partial sums"), std::string::npos);
  plan.longs = 5;
  EXPECT_NE(embedding_refusal(plan).find("5 long segments for 4 rows"), std::string::npos);
  EXPECT_THROW(reduce(ReduceKind::Max, nullptr, ScalarType::F32, 2, 0, 3, nullptr, nullptr, nullptr,
                      nullptr),
               std::invalid_argument);
  // A long column sum (bias gradient) without its workspace.
  ASSERT_GT(reduce_workspace(ReduceKind::Sum, ScalarType::BF16, 1, 16384, 768), 0u);
  EXPECT_EQ(reduce_workspace(ReduceKind::Sum, ScalarType::BF16, 16384, 768, 1), 0u);
  EXPECT_THROW(reduce(ReduceKind::Sum, nullptr, ScalarType::BF16, 1, 16384, 768, nullptr, nullptr,
                      nullptr, nullptr),
               std::invalid_argument);
  EXPECT_THROW(layer_norm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                   nullptr, ScalarType::F32, 4, 8, nullptr, nullptr),
               std::invalid_argument);
}

// Decoding's attention: what it refuses, and how far it splits a query's
// keys (enough blocks for a device, chunks of at least 128 keys).
TEST(CudaKernelChecks, CachedAttentionChecksAndSplits) {
  auto shape = [](int64_t B, int64_t NH, int64_t NKV, int64_t D, int64_t L) {
    CachedAttentionShape s;
    s.B = B;
    s.n = 1;
    s.NH = NH;
    s.NKV = NKV;
    s.D = D;
    s.L = L;
    return s;
  };
  EXPECT_TRUE(check_cached_attention(ScalarType::BF16, shape(1, 12, 12, 64, 1024)).ok);
  EXPECT_TRUE(check_cached_attention(ScalarType::F32, shape(2, 8, 2, 256, 5)).ok);
  EXPECT_NE(reason(check_cached_attention(ScalarType::F64, shape(1, 2, 2, 64, 4))).find("f64"),
            std::string::npos);
  EXPECT_NE(
      reason(check_cached_attention(ScalarType::BF16, shape(1, 6, 4, 64, 4))).find("not divisible"),
      std::string::npos);
  EXPECT_NE(reason(check_cached_attention(ScalarType::BF16, shape(1, 2, 2, 512, 4))).find("512"),
            std::string::npos);
  CachedAttentionShape few = shape(1, 2, 2, 64, 4);
  few.n = 5;  // five new tokens in four slots
  EXPECT_NE(reason(check_cached_attention(ScalarType::BF16, few)).find("shorter"),
            std::string::npos);
  // One row of GPT-2 over 1024 slots: 12 queries, 8 chunks of 128 keys.
  EXPECT_EQ(cached_attention_splits(shape(1, 12, 12, 64, 1024)), 8);
  EXPECT_EQ(cached_attention_workspace(shape(1, 12, 12, 64, 1024)), 12u * 8u * 66u * 4u);
  // Sixteen rows already fill about 256 blocks with two chunks; a short
  // cache is one chunk (no workspace, no merge).
  EXPECT_EQ(cached_attention_splits(shape(16, 12, 12, 64, 1024)), 2);
  EXPECT_EQ(cached_attention_splits(shape(1, 12, 12, 64, 100)), 1);
  EXPECT_EQ(cached_attention_workspace(shape(1, 12, 12, 64, 100)), 0u);
  EXPECT_EQ(cached_attention_splits(shape(64, 32, 8, 128, 4096)), 1);
  EXPECT_THROW(cached_attention_forward(nullptr, nullptr, nullptr, nullptr, ScalarType::BF16,
                                        shape(1, 12, 12, 64, 1024), nullptr, nullptr, nullptr),
               std::invalid_argument);  // 8 chunks and no workspace
}

TEST(CudaKernelChecks, AttentionKernelChoice) {
  const AttentionShape gpt2{4, 1024, 768, 12};  // head dim 64
  const AttentionShape odd{1, 70, 18, 2};       // head dim 9
  using K = AttentionKernel;
  EXPECT_EQ(resolve_attention_kernel(K::Auto, ScalarType::BF16, gpt2, {9}), K::TensorCore);
  EXPECT_EQ(resolve_attention_kernel(K::Auto, ScalarType::F16, gpt2, {8, 99 * 1024}),
            K::TensorCore);
  EXPECT_EQ(resolve_attention_kernel(K::Auto, ScalarType::F32, gpt2, {9}), K::Simt);
  EXPECT_EQ(resolve_attention_kernel(K::Auto, ScalarType::BF16, odd, {9}), K::Simt);
  EXPECT_EQ(resolve_attention_kernel(K::Auto, ScalarType::BF16, gpt2, {7, 96 * 1024}), K::Simt);
  // Head dim 256: tensor cores on Hopper, SIMT on an A100; Llama's 128 on
  // an L40 (99 KiB a block) SIMT too.
  const AttentionShape gemma{1, 1024, 2048, 8};
  EXPECT_EQ(resolve_attention_kernel(K::Auto, ScalarType::BF16, gemma, {9}), K::TensorCore);
  EXPECT_EQ(resolve_attention_kernel(K::Auto, ScalarType::BF16, gemma, {8, 163 * 1024}), K::Simt);
  EXPECT_THROW(resolve_attention_kernel(K::TensorCore, ScalarType::BF16, gemma, {8, 163 * 1024}),
               std::invalid_argument);
  const AttentionShape llama{1, 4096, 4096, 32};  // head dim 128
  EXPECT_EQ(resolve_attention_kernel(K::Auto, ScalarType::BF16, llama, {8, 163 * 1024}),
            K::TensorCore);
  EXPECT_EQ(resolve_attention_kernel(K::Auto, ScalarType::BF16, llama, {8, 99 * 1024}), K::Simt);
  EXPECT_EQ(resolve_attention_kernel(K::Simt, ScalarType::BF16, gpt2, {9}), K::Simt);
  try {
    resolve_attention_kernel(K::TensorCore, ScalarType::BF16, odd, {9});
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head dim 9 is not a multiple of 16"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(resolve_attention_kernel(K::TensorCore, ScalarType::F32, gpt2, {9}),
               std::invalid_argument);
}

TEST(CudaKernelChecks, CrossEntropyChecks) {
  EXPECT_TRUE(check_cross_entropy(ScalarType::BF16, 8192, 50304, 50304).ok);
  EXPECT_TRUE(check_cross_entropy(ScalarType::BF16, 8192, 50257, 50304).ok);  // padded rows
  EXPECT_FALSE(check_cross_entropy(ScalarType::F32, 4, 0, 0).ok);
  EXPECT_FALSE(check_cross_entropy(ScalarType::F32, 4, 16, 15).ok);  // rows overlap
  EXPECT_TRUE(check_vocab_ce(ScalarType::F32, 4, 128, 128, 100).ok);
  EXPECT_NE(reason(check_vocab_ce(ScalarType::F32, 4, 128, 128, 129)).find("129"),
            std::string::npos);
  EXPECT_FALSE(check_vocab_ce(ScalarType::F32, 4, 128, 100, 100).ok);  // rows overlap
}

TEST(CudaKernelChecks, MultiTensorAdamWCoversEveryChunkOnceWithinItsLimits) {
  // Empty tensors, small ones, ones spanning several chunks and launches.
  const std::vector<int64_t> sizes = {0, 5, 100, 0, 41, 7, 7, 7, 7, 7, 7, 7, 33, 1, 2, 3};
  for (auto [max_tensors, max_blocks, chunk, launches_wanted] :
       {std::tuple<int, int64_t, int64_t, size_t>{48, INT32_MAX, 32768, 1},
        {3, 4, 10, 9},
        {1, 1, 7, 37},
        {2, 9, 50, 7},
        {16, 1000, 1, 1},
        {5, 1000, 1, 3}}) {
    SCOPED_TRACE(std::to_string(max_tensors) + " tensors, " + std::to_string(max_blocks) +
                 " blocks, chunk " + std::to_string(chunk));
    const auto launches = plan_adamw_multi(sizes, max_tensors, max_blocks, chunk);
    // As few launches as the limits allow: each full before the next.
    EXPECT_EQ(launches.size(), launches_wanted);
    std::vector<std::pair<int, int64_t>> seen;  // (tensor, chunk) in launch order
    for (const AdamWLaunch& l : launches) {
      ASSERT_FALSE(l.slots.empty());
      ASSERT_LE(static_cast<int>(l.slots.size()), max_tensors);
      ASSERT_LE(l.blocks, max_blocks);
      int64_t blocks = 0;
      for (const AdamWLaunch::Slot& s : l.slots) {
        ASSERT_GT(s.chunks, 0);
        for (int64_t c = 0; c < s.chunks; ++c) seen.push_back({s.tensor, s.first_chunk + c});
        blocks += s.chunks;
      }
      EXPECT_EQ(l.blocks, blocks);
    }
    std::vector<std::pair<int, int64_t>> want;
    for (size_t i = 0; i < sizes.size(); ++i)
      for (int64_t c = 0; c < (sizes[i] + chunk - 1) / chunk; ++c)
        want.push_back({static_cast<int>(i), c});
    EXPECT_EQ(seen, want);
  }
  // A GPT-2 350M's 292 tensors in 7 launches (not the 35 a cap of 320
  // blocks a launch made).
  std::vector<int64_t> gpt;
  gpt.push_back(50304 * 1024);
  gpt.push_back(1024 * 1024);
  for (int l = 0; l < 24; ++l) {
    for (int64_t n : {1024, 1024, 3 * 1024 * 1024, 3 * 1024, 1024 * 1024, 1024, 1024, 1024,
                      4 * 1024 * 1024, 4 * 1024, 4 * 1024 * 1024, 1024}) {
      gpt.push_back(n);
    }
  }
  gpt.push_back(1024);
  gpt.push_back(1024);
  EXPECT_EQ(plan_adamw_multi(gpt, 48, INT32_MAX, 32768).size(), 7u);
  EXPECT_TRUE(plan_adamw_multi({0, 0}, 16, 160, 32768).empty());
  EXPECT_THROW(plan_adamw_multi({5}, 0, 160, 32768), std::invalid_argument);
}

TEST(CudaKernelChecks, MultiTensorAdamWNamesAMissingOrStrayMaster) {
  AdamWArgs a;
  float buf[4] = {};
  AdamWTensor t;
  t.param = buf, t.grad = buf, t.m = buf, t.v = buf, t.n = 4;
  const AdamWTypes f32{ScalarType::F32}, bf16{ScalarType::BF16};
  EXPECT_TRUE(check_adamw_multi(f32, {t}, a).ok);
  EXPECT_NE(reason(check_adamw_multi(bf16, {t}, a)).find("needs f32 master weights"),
            std::string::npos);
  t.master = buf;
  EXPECT_NE(reason(check_adamw_multi(f32, {t}, a)).find("takes no master"), std::string::npos);
  t.grad = nullptr;
  EXPECT_NE(reason(check_adamw_multi(bf16, {t}, a)).find("null pointer"), std::string::npos);
  EXPECT_THROW(adamw_multi(bf16, {t}, a, nullptr), std::invalid_argument);
}

TEST(CudaKernelChecks, AdamWMomentsAndGradientsOfTheirTypes) {
  AdamWArgs a;
  float buf[4] = {};
  AdamWTensor t;
  t.param = buf, t.grad = buf, t.m = buf, t.v = buf, t.n = 4;
  // Multi-tensor: f32 or bf16 moments beside any parameter type.
  EXPECT_TRUE(check_adamw_multi({ScalarType::F32, ScalarType::F32, ScalarType::BF16}, {t}, a).ok);
  EXPECT_NE(reason(check_adamw_multi({ScalarType::F32, ScalarType::F32, ScalarType::F16}, {t}, a))
                .find("moment type f16 is not supported (f32 or bf16)"),
            std::string::npos);
  // Gradients: f32, or a half parameter's own type (with its masters).
  EXPECT_NE(reason(check_adamw_multi({ScalarType::F32, ScalarType::BF16}, {t}, a))
                .find("gradient type bf16 beside f32 parameters is not supported"),
            std::string::npos);
  t.master = buf;
  EXPECT_TRUE(check_adamw_multi({ScalarType::BF16, ScalarType::BF16, ScalarType::BF16}, {t}, a).ok);
  EXPECT_TRUE(check_adamw_multi({ScalarType::F16, ScalarType::F16}, {t}, a).ok);
  EXPECT_FALSE(check_adamw_multi({ScalarType::BF16, ScalarType::F16}, {t}, a).ok);
  // One tensor: the parameter's own type, or bf16 beside f32.
  EXPECT_TRUE(check_adamw_moments(ScalarType::F32, ScalarType::F32).ok);
  EXPECT_TRUE(check_adamw_moments(ScalarType::BF16, ScalarType::BF16).ok);
  EXPECT_TRUE(check_adamw_moments(ScalarType::F32, ScalarType::BF16).ok);
  EXPECT_NE(reason(check_adamw_moments(ScalarType::BF16, ScalarType::F32))
                .find("moments of type f32 beside a parameter of type bf16"),
            std::string::npos);
  EXPECT_FALSE(check_adamw_moments(ScalarType::F32, ScalarType::F16).ok);
  EXPECT_THROW(adamw(buf, buf, buf, buf, ScalarType::F16, ScalarType::F32, 4, a, nullptr),
               std::invalid_argument);
}

TEST(CudaKernelChecks, CoalesceMergesContiguousDimensions) {
  const int64_t shape[3] = {2, 3, 4};
  const int64_t contiguous[3] = {12, 4, 1};
  StridedView a = make_view(3, shape, contiguous), b = make_view(3, shape, contiguous);
  EXPECT_TRUE(is_contiguous(a));
  coalesce(a, b);
  EXPECT_EQ(a.ndim, 1);
  EXPECT_EQ(a.shape[0], 24);
  // A transposed source keeps two dimensions; the destination follows.
  const int64_t tshape[2] = {4, 6};
  const int64_t tstride[2] = {1, 4};
  const int64_t cstride[2] = {6, 1};
  StridedView t = make_view(2, tshape, tstride), c = make_view(2, tshape, cstride);
  EXPECT_FALSE(is_contiguous(t));
  coalesce(t, c);
  EXPECT_EQ(t.ndim, 2);
  EXPECT_EQ(t.stride[0], 1);
  EXPECT_EQ(c.stride[0], 6);
  // Size-1 dimensions drop out.
  const int64_t oshape[3] = {1, 5, 1};
  const int64_t ostride[3] = {99, 1, 7};
  StridedView o = make_view(3, oshape, ostride), p = make_view(3, oshape, ostride);
  coalesce(o, p);
  EXPECT_EQ(o.ndim, 1);
  EXPECT_EQ(o.shape[0], 5);
  const int64_t big[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_THROW(make_view(9, big, big), std::invalid_argument);
}

TEST(CudaKernelChecks, RuntimeQueriesWorkWithoutAGpu) {
  EXPECT_TRUE(cuda::compiled());
  EXPECT_GE(cuda::device_count(), 0);  // never throws, 0 on machines without a GPU
  // Which attention can run: shape problems named on any machine, and
  // without a GPU every implementation says so instead of throwing.
  EXPECT_NE(cuda::attention_kernel_unavailable(cuda::AttentionKernel::Simt, DType::BF16, 64, 100, 3)
                .find("divisible"),
            std::string::npos);
  EXPECT_NE(cuda::attention_kernel_unavailable(cuda::AttentionKernel::Auto, DType::I32, 64, 128, 2)
                .find("f32, bf16 or f16"),
            std::string::npos);
  if (cuda::device_count() == 0) {
    EXPECT_NE(
        cuda::attention_kernel_unavailable(cuda::AttentionKernel::Cudnn, DType::BF16, 64, 128, 2)
            .find("not visible"),
        std::string::npos);
  }
}

}  // namespace
}  // namespace triad::kernels
