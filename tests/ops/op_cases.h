#pragma once

// The op harness's table: every op with inputs that exercise it (random,
// never all zeros). Shared by the CPU harness (tests/ops/op_harness_test.cpp)
// and the CUDA conformance suite (tests/backend/cuda_backend_test.cpp), so
// an op added here is checked on every backend. Inputs are built on the host;
// a case moves any index tensor it makes to the device of its first input.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "support/gradcheck.h"
#include "triad/ops.h"

namespace triad::testing {

struct OpCase {
  std::string name;
  // Builds the op's inputs (random, never all zeros) in the given dtype.
  std::function<std::vector<Tensor>(DType)> inputs;
  Fn fn;
  bool differentiable = true;
};

inline Tensor rnd(const Shape& s, DType dt, uint64_t stream, double stddev = 1.0) {
  return randn(s, 7, stream, stddev, dt);
}

inline Tensor ids(const std::vector<int64_t>& v, const Shape& s) {
  return from_vector(v, s, DType::I64);
}

inline std::vector<OpCase> op_cases() {
  std::vector<OpCase> c;
  c.push_back({"add_broadcast",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 4}, d, 1), rnd({4}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return add(x[0], x[1]); }});
  c.push_back({"sub_broadcast",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 1, 4}, d, 1), rnd({3, 1}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return sub(x[0], x[1]); }});
  c.push_back({"mul_broadcast",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 4}, d, 1), rnd({3, 1}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return mul(x[0], x[1]); }});
  c.push_back(
      {"div",
       [](DType d) {
         return std::vector<Tensor>{rnd({3, 5}, d, 1), rand_uniform({3, 5}, 7, 3, 0.5, 2.0, d)};
       },
       [](const std::vector<Tensor>& x) { return div(x[0], x[1]); }});
  c.push_back({"affine",
               [](DType d) {
                 return std::vector<Tensor>{rnd({4, 6}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return affine(x[0], -1.5, 0.25); }});
  c.push_back({"gelu",
               [](DType d) {
                 return std::vector<Tensor>{rnd({5, 7}, d, 1, 2.0)};
               },
               [](const std::vector<Tensor>& x) { return gelu(x[0]); }});
  c.push_back({"gelu_erf",
               [](DType d) {
                 return std::vector<Tensor>{rnd({5, 7}, d, 1, 2.0)};
               },
               [](const std::vector<Tensor>& x) { return gelu_erf(x[0]); }});
  c.push_back({"dropout_p0.3",
               [](DType d) {
                 return std::vector<Tensor>{rnd({6, 9}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return dropout(x[0], 0.3, 11, 5, 100); }});
  c.push_back({"reshape_transpose",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 4}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 return reshape(transpose(x[0], 0, 2), {4, 6});
               }});
  c.push_back({"permute",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 4}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 return contiguous(permute(x[0], {1, 2, 0}));
               }});
  c.push_back({"narrow",
               [](DType d) {
                 return std::vector<Tensor>{rnd({5, 6}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return narrow(x[0], 1, 2, 3); }});
  c.push_back({"expand",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 1}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 return expand(x[0], {2, 3, 4});
               }});
  c.push_back({"concat",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3}, d, 1), rnd({2, 2}, d, 2)};
               },
               [](const std::vector<Tensor>& x) {
                 return concat({x[0], x[1]}, 1);
               }});
  c.push_back({"split",
               [](DType d) {
                 return std::vector<Tensor>{rnd({7, 3}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 auto parts = split(x[0], {2, 5}, 0);
                 return add(sum(parts[0], 0), sum(mul(parts[1], parts[1]), 0));
               }});
  // Along a strided dimension, with an empty piece and a piece no gradient
  // reaches (its share of x's gradient is zero).
  c.push_back({"split_dim1_unused_piece",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 7}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 auto parts = split(x[0], {2, 0, 3, 2}, 1);
                 return add(sum(mul(parts[0], parts[0]), 1), sum(parts[3], 1));
               }});
  c.push_back({"sum_dim",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 4, 5}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return sum(x[0], 1); }});
  c.push_back({"mean_keepdim",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 4, 5}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return mean(x[0], -1, true); }});
  c.push_back({"mean_all",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 5}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return mean(x[0]); }});
  c.push_back({"unsqueeze_squeeze_strided",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 4}, d, 1), rnd({4, 2, 3}, d, 2)};
               },
               [](const std::vector<Tensor>& x) {
                 // A transposed view gains and loses a size-1 dimension.
                 Tensor y = mul(unsqueeze(transpose(x[0], 0, 1), 1), x[1]);  // (4, 2, 3)
                 return flatten(squeeze(narrow(y, 1, 1, 1), 1));
               }});
  c.push_back({"max_dim",
               [](DType d) {
                 return std::vector<Tensor>{rnd({4, 6}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return max(x[0], 1); }});
  c.push_back({"sum_all",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 4}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return sum(x[0]); }});
  c.push_back({"matmul_2d",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 4}, d, 1), rnd({4, 5}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }});
  c.push_back({"matmul_3d_2d",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 4}, d, 1), rnd({4, 5}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }});
  c.push_back({"matmul_batched",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 4}, d, 1), rnd({2, 4, 5}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }});
  c.push_back(
      {"linear_bias",
       [](DType d) {
         return std::vector<Tensor>{rnd({2, 3, 4}, d, 1), rnd({5, 4}, d, 2), rnd({5}, d, 3)};
       },
       [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); }});
  c.push_back(
      {"linear_gelu_bias",
       [](DType d) {
         return std::vector<Tensor>{rnd({2, 3, 4}, d, 1), rnd({5, 4}, d, 2), rnd({5}, d, 3)};
       },
       [](const std::vector<Tensor>& x) { return linear_gelu(x[0], x[1], x[2]); }});
  c.push_back({"mlp_fused_both_sides",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 4}, d, 1), rnd({8, 4}, d, 2), rnd({8}, d, 3),
                                            rnd({4, 8}, d, 4), rnd({4}, d, 5)};
               },
               [](const std::vector<Tensor>& x) {
                 return linear_after_gelu(linear_gelu_parts(x[0], x[1], x[2]), x[3], x[4]);
               }});
  c.push_back({"linear_gelu_nobias",
               [](DType d) {
                 return std::vector<Tensor>{rnd({6, 8}, d, 1), rnd({16, 8}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return linear_gelu(x[0], x[1]); }});
  c.push_back({"linear_nobias",
               [](DType d) {
                 return std::vector<Tensor>{rnd({6, 4}, d, 1), rnd({3, 4}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return linear(x[0], x[1]); }});
  c.push_back({"add_layer_norm",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 8}, d, 1), rnd({2, 3, 8}, d, 2),
                                            rnd({8}, d, 3), rnd({8}, d, 4)};
               },
               [](const std::vector<Tensor>& x) {
                 // Both outputs reach the result, as in a transformer block.
                 const AddNorm o = add_layer_norm(x[0], x[1], x[2], x[3]);
                 return add(mul(o.sum, o.sum), o.norm);
               }});
  c.push_back({"add_layer_norm_computed_params",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 8}, d, 1), rnd({2, 3, 8}, d, 2),
                                            rnd({8}, d, 3), rnd({8}, d, 4)};
               },
               [](const std::vector<Tensor>& x) {
                 // Weight and bias that are not leaves take their gradients
                 // through the op's outputs (add_layer_norm_backward), not
                 // straight into a parameter's buffer.
                 const AddNorm o =
                     add_layer_norm(x[0], x[1], mul(x[2], x[2]), affine(x[3], 2.0, 0.5));
                 return add(mul(o.sum, o.sum), o.norm);
               }});
  c.push_back({"layer_norm_computed_params",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 8}, d, 1, 2.0), rnd({8}, d, 2), rnd({8}, d, 3)};
               },
               [](const std::vector<Tensor>& x) {
                 return layer_norm(x[0], mul(x[1], x[1]), affine(x[2], 2.0, 0.5));
               }});
  c.push_back(
      {"layer_norm",
       [](DType d) {
         return std::vector<Tensor>{rnd({2, 3, 8}, d, 1, 2.0), rnd({8}, d, 2), rnd({8}, d, 3)};
       },
       [](const std::vector<Tensor>& x) { return layer_norm(x[0], x[1], x[2]); }});
  // Nemotron's LayerNorm1P (1 + weight, weights near 0), plain and with the
  // fused residual add over rows wider than a warp's packs.
  c.push_back(
      {"layer_norm_weight_offset",
       [](DType d) {
         return std::vector<Tensor>{rnd({2, 3, 8}, d, 1, 2.0), rnd({8}, d, 2, 0.1), rnd({8}, d, 3)};
       },
       [](const std::vector<Tensor>& x) { return layer_norm(x[0], x[1], x[2], 1e-5, 1.0); }});
  c.push_back({"add_layer_norm_weight_offset",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 70}, d, 1), rnd({3, 70}, d, 2),
                                            rnd({70}, d, 3, 0.1), rnd({70}, d, 4)};
               },
               [](const std::vector<Tensor>& x) {
                 const AddNorm o = add_layer_norm(x[0], x[1], x[2], x[3], 1e-3, 1.0);
                 return add(mul(o.sum, o.sum), o.norm);
               }});
  c.push_back({"swiglu",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 10}, d, 1, 2.0)};
               },
               [](const std::vector<Tensor>& x) { return swiglu(x[0]); }});
  c.push_back({"swiglu_long_rows",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 2 * 37}, d, 2, 3.0)};
               },
               [](const std::vector<Tensor>& x) { return swiglu(x[0]); }});
  c.push_back({"geglu",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 10}, d, 4, 2.0)};
               },
               [](const std::vector<Tensor>& x) { return geglu(x[0]); }});
  c.push_back({"geglu_long_rows",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 2 * 37}, d, 5, 3.0)};
               },
               [](const std::vector<Tensor>& x) { return geglu(x[0]); }});
  c.push_back({"rms_norm",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 8}, d, 1, 2.0), rnd({8}, d, 2)};
               },
               [](const std::vector<Tensor>& x) { return rms_norm(x[0], x[1]); }});
  c.push_back({"rms_norm_wide_rows",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 70}, d, 3), rnd({70}, d, 4)};
               },
               [](const std::vector<Tensor>& x) { return rms_norm(x[0], x[1], 1e-3); }});
  c.push_back(
      {"add_rms_norm",
       [](DType d) {
         return std::vector<Tensor>{rnd({2, 3, 8}, d, 1), rnd({2, 3, 8}, d, 2), rnd({8}, d, 3)};
       },
       [](const std::vector<Tensor>& x) {
         const AddNorm o = add_rms_norm(x[0], x[1], x[2], 1e-3);
         return add(mul(o.sum, o.sum), o.norm);
       }});
  c.push_back(
      {"add_rms_norm_computed_weight",
       [](DType d) {
         return std::vector<Tensor>{rnd({3, 70}, d, 1), rnd({3, 70}, d, 2), rnd({70}, d, 3)};
       },
       [](const std::vector<Tensor>& x) {
         const AddNorm o = add_rms_norm(x[0], x[1], affine(x[2], 2.0, 0.5));
         return add(mul(o.sum, o.sum), o.norm);
       }});
  // Gemma's offset (1 + weight, weights near 0), plain and with the fused
  // residual add over rows wider than a warp's packs.
  c.push_back({"rms_norm_weight_offset",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 8}, d, 1, 2.0), rnd({8}, d, 2, 0.1)};
               },
               [](const std::vector<Tensor>& x) { return rms_norm(x[0], x[1], 1e-5, 1.0); }});
  c.push_back(
      {"add_rms_norm_weight_offset",
       [](DType d) {
         return std::vector<Tensor>{rnd({3, 70}, d, 1), rnd({3, 70}, d, 2), rnd({70}, d, 3, 0.1)};
       },
       [](const std::vector<Tensor>& x) {
         const AddNorm o = add_rms_norm(x[0], x[1], x[2], 1e-3, 1.0);
         return add(mul(o.sum, o.sum), o.norm);
       }});
  c.push_back({"softmax",
               [](DType d) {
                 return std::vector<Tensor>{rnd({3, 7}, d, 1, 2.0)};
               },
               [](const std::vector<Tensor>& x) { return softmax(x[0]); }});
  c.push_back({"causal_attention_B2_T5_C12_NH3",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 5, 36}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return causal_attention(x[0], 3); }});
  // T = 70 spans two 64-row blocks of the CPU kernel (a full and a partial one).
  c.push_back({"causal_attention_B1_T70_C6_NH2",
               [](DType d) {
                 return std::vector<Tensor>{rnd({1, 70, 18}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return causal_attention(x[0], 2); }});
  // Packed documents: row 0 of the first holds documents [0, 3), [3, 4) (a
  // single token) and [4, 9), row 1 one; the second's boundaries straddle
  // the CPU kernel's 64-row blocks (a block whose rows start in an earlier
  // block's document, and one starting on a boundary).
  c.push_back({"causal_attention_documents_B2_T9_C12_NH3",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 9, 36}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 const Tensor starts = from_vector(
                     std::vector<int64_t>{0, 0, 0, 3, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0},
                     {2, 9}, DType::I32);
                 return causal_attention(x[0], 3, starts);
               }});
  c.push_back({"causal_attention_documents_B1_T70_C6_NH2",
               [](DType d) {
                 return std::vector<Tensor>{rnd({1, 70, 18}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 std::vector<int64_t> s(70);
                 for (int64_t t = 0; t < 70; ++t)
                   s[t] = t < 20 ? 0 : t < 64 ? 20 : t < 66 ? 64 : 66;
                 return causal_attention(x[0], 2, from_vector(s, {1, 70}, DType::I32));
               }});
  // A sliding window of 9 keys (each query's first key t - 8), over the
  // CPU kernel's two 64-row blocks, with grouped-query heads.
  c.push_back(
      {"causal_attention_window9_B1_T70_NH2_KV1",
       [](DType d) {
         return std::vector<Tensor>{rnd({1, 70, 12}, d, 1)};
       },
       [](const std::vector<Tensor>& x) {
         std::vector<int64_t> s(70);
         for (int64_t t = 0; t < 70; ++t) s[t] = std::max<int64_t>(0, t - 8);
         return causal_attention(x[0], AttentionHeads{2, 1}, from_vector(s, {1, 70}, DType::I32));
       }});
  // Grouped-query attention: 4 query heads over 2 key/value heads (head
  // dim 4, qkv (4 + 2 * 2) * 4 wide), and multi-query attention (6 query
  // heads over 1, head dim 2) over packed documents across the CPU
  // kernel's 64-row blocks.
  c.push_back({"causal_attention_gqa_B2_T9_NH4_KV2",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 9, 32}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 return causal_attention(x[0], AttentionHeads{4, 2});
               }});
  c.push_back(
      {"causal_attention_mqa_documents_B1_T70_NH6_KV1",
       [](DType d) {
         return std::vector<Tensor>{rnd({1, 70, 16}, d, 1)};
       },
       [](const std::vector<Tensor>& x) {
         std::vector<int64_t> s(70);
         for (int64_t t = 0; t < 70; ++t) s[t] = t < 30 ? 0 : t < 66 ? 30 : 66;
         return causal_attention(x[0], AttentionHeads{6, 1}, from_vector(s, {1, 70}, DType::I32));
       }});
  // Gemma 2's logit soft-capping: scores of about the cap's size (inputs of
  // stddev 2 against a cap of 1.5), grouped heads, and a window over the
  // CPU kernel's two 64-row blocks.
  c.push_back({"causal_attention_softcap_B2_T9_NH4_KV2",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 9, 32}, d, 1, 2.0)};
               },
               [](const std::vector<Tensor>& x) {
                 return causal_attention(x[0], AttentionHeads{4, 2}.with_softcap(1.5));
               }});
  c.push_back({"causal_attention_softcap_window9_B1_T70_NH2_KV1",
               [](DType d) {
                 return std::vector<Tensor>{rnd({1, 70, 16}, d, 1, 2.0)};
               },
               [](const std::vector<Tensor>& x) {
                 std::vector<int64_t> s(70);
                 for (int64_t t = 0; t < 70; ++t) s[t] = std::max<int64_t>(0, t - 8);
                 return causal_attention(x[0], AttentionHeads{2, 1}.with_softcap(1.5),
                                         from_vector(s, {1, 70}, DType::I32));
               }});
  // A chunk of queries apart from the keys and values (chunk_attention,
  // context parallelism's all-gather): 4 query rows over 9 keys, with
  // grouped heads, and 37 over 70 (starting inside the CPU kernel's first
  // 64-row block) with a window over packed documents and a soft cap.
  c.push_back({"chunk_attention_gqa_B2_Tq4_T9_NH4_KV2",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 4, 16}, d, 1), rnd({2, 9, 16}, d, 2)};
               },
               [](const std::vector<Tensor>& x) {
                 return chunk_attention(x[0], x[1], AttentionHeads{4, 2});
               }});
  c.push_back({"chunk_attention_window_softcap_B1_Tq37_T70_NH2_KV1",
               [](DType d) {
                 return std::vector<Tensor>{rnd({1, 37, 8}, d, 1, 2.0), rnd({1, 70, 8}, d, 2, 2.0)};
               },
               [](const std::vector<Tensor>& x) {
                 std::vector<int64_t> s(37);  // the queries of positions [33, 70)
                 for (int64_t i = 0; i < 37; ++i) {
                   const int64_t t = 33 + i;
                   s[i] = t < 40 ? std::max<int64_t>(0, t - 20) : std::max<int64_t>(40, t - 20);
                 }
                 return chunk_attention(x[0], x[1], AttentionHeads{2, 1}.with_softcap(1.5),
                                        from_vector(s, {1, 37}, DType::I32));
               }});
  // Queries after every key (a ring attention step's block of earlier
  // keys), more of them than keys, with first keys in the block's frame
  // that leave the last two rows of the first batch none.
  c.push_back({"chunk_attention_after_keys_B2_Tq6_T5_NH2_KV1",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 6, 8}, d, 1), rnd({2, 5, 8}, d, 2)};
               },
               [](const std::vector<Tensor>& x) {
                 const std::vector<int64_t> s{0, 0, 1, 3, 5, 5, 0, 0, 0, 0, 2, 2};
                 return chunk_attention(x[0], x[1], AttentionHeads{2, 1},
                                        from_vector(s, {2, 6}, DType::I32), 5);
               }});
  c.push_back({"soft_cap",
               [](DType d) {
                 return std::vector<Tensor>{rnd({5, 7}, d, 1, 3.0)};
               },
               [](const std::vector<Tensor>& x) { return soft_cap(x[0], 2.0); }});
  // Clamping: bounds inside the inputs' spread, so that values below, inside
  // and above them all occur (none within the finite differences' step of
  // a bound).
  c.push_back({"clamp",
               [](DType d) {
                 return std::vector<Tensor>{rnd({6, 7}, d, 4, 2.0)};
               },
               [](const std::vector<Tensor>& x) { return clamp(x[0], -0.75, 1.25); }});
  // Squared ReLU: inputs on both sides of 0 (its derivative, 2 max(x, 0),
  // is continuous there).
  c.push_back({"relu2",
               [](DType d) {
                 return std::vector<Tensor>{rnd({6, 7}, d, 5, 2.0)};
               },
               [](const std::vector<Tensor>& x) { return relu2(x[0]); }});
  // Rotary embedding: the rows' own positions (head dim 4), a key/value-cache
  // step's offset far along (large angles, head dim 6), and packed documents'
  // positions on the device (head dim 8, another theta).
  c.push_back({"rotary_embedding_B2_T5_C12_NH3",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 5, 36}, d, 1)};
               },
               [](const std::vector<Tensor>& x) { return rotary_embedding(x[0], 3); }});
  c.push_back(
      {"rotary_embedding_start_B1_T3_C12_NH2",
       [](DType d) {
         return std::vector<Tensor>{rnd({1, 3, 36}, d, 1)};
       },
       [](const std::vector<Tensor>& x) { return rotary_embedding(x[0], 2, {}, 1021, 500.0); }});
  c.push_back(
      {"rotary_embedding_positions_B2_T4_C16_NH2",
       [](DType d) {
         return std::vector<Tensor>{rnd({2, 4, 48}, d, 1)};
       },
       [](const std::vector<Tensor>& x) {
         const Tensor pos = to_device(ids({0, 1, 0, 1, 7, 8, 9, 300}, {2, 4}), x[0].device());
         return rotary_embedding(x[0], 2, pos, 0, 1e4 / 3);
       }});
  c.push_back({"rotary_embedding_gqa_B2_T5_NH4_KV2",  // q's 4 heads and k's 2 turn, v's 2 copied
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 5, 32}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 return rotary_embedding(x[0], AttentionHeads{4, 2});
               }});
  c.push_back({"rotary_embedding_llama3_scaling_B1_T6_C16_NH2",  // all three wavelength regions
               [](DType d) {
                 return std::vector<Tensor>{rnd({1, 6, 48}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 RopeScaling s;
                 s.kind = RopeScaling::Kind::Llama3;
                 s.factor = 4.0;
                 s.original_seq_len = 32.0;
                 return rotary_embedding(x[0], 2, {}, 900, 30.0, s);
               }});
  // YaRN: a pair kept, one on the ramp, two slowed, and every rotated pair
  // scaled by the attention factor (the backward scales alike).
  c.push_back({"rotary_embedding_yarn_scaling_B1_T6_C16_NH2_KV1",
               [](DType d) {
                 return std::vector<Tensor>{rnd({1, 6, 32}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 RopeScaling s;
                 s.kind = RopeScaling::Kind::Yarn;
                 s.factor = 4.0;
                 s.original_seq_len = 32.0;
                 return rotary_embedding(x[0], AttentionHeads{2, 1}, {}, 300, 30.0, s);
               }});
  // A partial rotation (Phi-4-mini's): each head's first 4 of 8 dimensions
  // turn as a 4-wide head's, the other 4 pass through; with yarn's scaling,
  // on the turned ones alone.
  c.push_back({"rotary_embedding_partial_R4_B2_T5_C16_NH2_KV1",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 5, 32}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 RopeScaling s;
                 s.kind = RopeScaling::Kind::Yarn;
                 s.factor = 4.0;
                 s.original_seq_len = 4.0;
                 s.rotary_dim = 4;
                 return rotary_embedding(x[0], AttentionHeads{2, 1}, {}, 7, 30.0, s);
               }});
  // longrope: each pair slowed by its own factor, the short ones within the
  // original context and the long ones past it, and scaled alike.
  for (const int64_t start : {int64_t{0}, int64_t{300}}) {
    c.push_back({"rotary_embedding_longrope_start" + std::to_string(start) + "_B1_T6_C16_NH2",
                 [](DType d) {
                   return std::vector<Tensor>{rnd({1, 6, 48}, d, 1)};
                 },
                 [start](const std::vector<Tensor>& x) {
                   RopeScaling s;
                   s.kind = RopeScaling::Kind::LongRope;
                   s.factor = 16.0;
                   s.original_seq_len = 8.0;
                   set_rope_factors(s, {1.0, 1.5, 3.0, 5.0}, {2.0, 4.0, 9.0, 31.0});
                   return rotary_embedding(x[0], 2, {}, start, 30.0, s);
                 }});
  }
  c.push_back({"embedding",
               [](DType d) {
                 return std::vector<Tensor>{rnd({6, 4}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 return embedding(x[0], to_device(ids({1, 5, 1, 0, 3}, {5}), x[0].device()));
               }});
  // embedding's transpose: rows 1 and 3 take two sources each (added in
  // index order), row 5 none (zeros). Index on the device and on the host.
  c.push_back(
      {"index_add_rows_M6_rows7",
       [](DType d) {
         return std::vector<Tensor>{rnd({6, 4}, d, 1)};
       },
       [](const std::vector<Tensor>& x) {
         return index_add_rows(x[0], to_device(ids({3, 1, 0, 3, 1, 6}, {6}), x[0].device()), 7);
       }});
  c.push_back({"index_add_rows_host_index",
               [](DType d) {
                 return std::vector<Tensor>{rnd({5, 3}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 return index_add_rows(affine(x[0], 2.0, 0.5), ids({2, 0, 2, 2, 1}, {5}), 4);
               }});
  c.push_back(
      {"cross_entropy_ignore",
       [](DType d) {
         return std::vector<Tensor>{rnd({2, 3, 7}, d, 1, 2.0)};
       },
       [](const std::vector<Tensor>& x) {
         return cross_entropy(x[0], to_device(ids({1, 6, -100, 0, 3, 3}, {2, 3}), x[0].device()));
       }});
  // The z-loss beside the loss (model.z_loss_coef): both outputs' gradients
  // in one backward; an ignored row in neither.
  c.push_back({"cross_entropy_z_loss",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 7}, d, 1, 2.0)};
               },
               [](const std::vector<Tensor>& x) {
                 Tensor z;
                 const Tensor loss = cross_entropy(
                     x[0], to_device(ids({1, 6, -100, 0, 3, 3}, {2, 3}), x[0].device()), -100, &z);
                 return cast(add(loss, scale(z, 0.3)), x[0].dtype());  // (the seed's dtype)
               }});
  // The fused head + loss: 67 classes in rows padded to 128.
  c.push_back({"linear_cross_entropy",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 5}, d, 1), rnd({67, 5}, d, 2, 0.5)};
               },
               [](const std::vector<Tensor>& x) {
                 return linear_cross_entropy(
                     x[0], x[1], to_device(ids({1, 66, -100, 0, 3, 65}, {2, 3}), x[0].device()));
               }});
  // Soft-capped logits (final_logit_softcapping), in place in the padded
  // rows: logits of stddev about 2 against a cap of 1.
  c.push_back({"linear_cross_entropy_softcap",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 5}, d, 1), rnd({67, 5}, d, 2)};
               },
               [](const std::vector<Tensor>& x) {
                 return linear_cross_entropy(
                     x[0], x[1], to_device(ids({1, 66, -100, 0, 3, 65}, {2, 3}), x[0].device()),
                     -100, 1.0);
               }});
  // The z-loss over soft-capped logits, and the z-loss alone (the loss's
  // gradient zero).
  c.push_back({"linear_cross_entropy_softcap_z_loss",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 5}, d, 1), rnd({67, 5}, d, 2)};
               },
               [](const std::vector<Tensor>& x) {
                 Tensor z;
                 const Tensor loss = linear_cross_entropy(
                     x[0], x[1], to_device(ids({1, 66, -100, 0, 3, 65}, {2, 3}), x[0].device()),
                     -100, 1.5, {}, &z);
                 return cast(add(loss, scale(z, 0.5)), x[0].dtype());
               }});
  c.push_back({"linear_cross_entropy_z_loss_alone",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 5}, d, 1), rnd({67, 5}, d, 2, 0.5)};
               },
               [](const std::vector<Tensor>& x) {
                 Tensor z;
                 linear_cross_entropy(
                     x[0], x[1], to_device(ids({1, 66, -100, 0, 3, 65}, {2, 3}), x[0].device()),
                     -100, 0.0, {}, &z);
                 return z;
               }});
  // A biased head (Phi-2's lm_head.bias), soft-capped after the bias: the
  // bias's gradient sums the padded rows' valid columns.
  c.push_back(
      {"linear_cross_entropy_bias",
       [](DType d) {
         return std::vector<Tensor>{rnd({2, 3, 5}, d, 1), rnd({67, 5}, d, 2, 0.5), rnd({67}, d, 3)};
       },
       [](const std::vector<Tensor>& x) {
         return linear_cross_entropy(x[0], x[1],
                                     to_device(ids({1, 66, -100, 0, 3, 65}, {2, 3}), x[0].device()),
                                     -100, 2.0, x[2]);
       }});
  // A computed bias: its gradient comes back through the op's outputs.
  c.push_back(
      {"linear_cross_entropy_computed_bias",
       [](DType d) {
         return std::vector<Tensor>{rnd({2, 3, 5}, d, 1), rnd({64, 5}, d, 2, 0.5), rnd({64}, d, 3)};
       },
       [](const std::vector<Tensor>& x) {
         return linear_cross_entropy(x[0], x[1],
                                     to_device(ids({1, 63, -100, 0, 3, 62}, {2, 3}), x[0].device()),
                                     -100, 0.0, affine(x[2], 1.5, 0.25));
       }});
  // Computed (non-leaf) weights and biases: their gradients come back
  // through the op's outputs rather than straight into a parameter's buffer.
  c.push_back(
      {"linear_computed_params",
       [](DType d) {
         return std::vector<Tensor>{rnd({2, 3, 4}, d, 1), rnd({5, 4}, d, 2), rnd({5}, d, 3)};
       },
       [](const std::vector<Tensor>& x) {
         return linear(x[0], affine(x[1], 1.5, 0.25), affine(x[2], -2.0, 0.5));
       }});
  c.push_back({"embedding_computed_weight",
               [](DType d) {
                 return std::vector<Tensor>{rnd({6, 4}, d, 1)};
               },
               [](const std::vector<Tensor>& x) {
                 return embedding(affine(x[0], 2.0, 0.5),
                                  to_device(ids({1, 5, 1, 0, 3}, {5}), x[0].device()));
               }});
  c.push_back({"linear_cross_entropy_computed_weight",
               [](DType d) {
                 return std::vector<Tensor>{rnd({2, 3, 5}, d, 1), rnd({67, 5}, d, 2, 0.5)};
               },
               [](const std::vector<Tensor>& x) {
                 return linear_cross_entropy(
                     x[0], affine(x[1], 1.5, 0.0),
                     to_device(ids({1, 66, -100, 0, 3, 65}, {2, 3}), x[0].device()));
               }});
  return c;
}

inline void PrintTo(const OpCase& c, std::ostream* os) {
  *os << c.name;
}

}  // namespace triad::testing
