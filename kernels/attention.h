#pragma once

// Causal flash attention (attention.cu), forward and backward, for GPT's
// fused projection layout: qkv (B, T, 3*C) holds q, k, v side by side, each
// split into NH heads of D = C / NH; out (B, T, C); lse (B, NH, T) f32, the
// log-sum-exp of each query's scaled scores. Scores never exist as a T x T
// matrix: keys and values stream through shared memory in tiles while each
// query keeps an online softmax (running max, running sum) in f32. The
// backward recomputes probabilities from lse and runs two passes without
// atomics (dq per query; dk, dv per key), so results are deterministic.
// Inputs f32, bf16 or f16; head dims up to 256 (Gemma 2's and 3's; latent
// attention's 192, DeepSeek V3's).
//
// Grouped-query attention: NKV key/value heads (NKV divides NH) make qkv
// (B, T, C + 2 * NKV * D) = [q | k | v], k and v NKV heads wide; query head
// h uses key/value head h / (NH / NKV). The dk/dv pass runs one block per
// key/value head and sums its group's query heads in a fixed order.
//
// Packed documents and sliding windows: doc_starts, when not null, is
// (B, T) i32 on the device, the first key each query sees (its document's
// start, or t - window + 1 if later; 0 <= start <= t, never decreasing
// along a row); query t then sees keys [start, t] only, and tiles wholly
// before a block's first start are skipped.
//
// Queries apart (`separate`, the *_parts functions; context parallelism's
// all-gather and ring): q (B, Tq, C) holds the queries of positions [Q0, Q0
// + Tq) in the keys' frame (Tq = query_rows(): QT, or T - Q0 when QT is
// left at -1) and kv (B, T, 2 * NKV * D) the keys then values of positions
// [0, T); each query at position t sees keys up to min(t, T - 1), so Q0 = T
// - Tq is a chunk at the end of a sequence and Q0 >= T a block of queries
// after every key. out, lse, dout and delta hold the Tq query rows ((B, Tq,
// C), (B, NH, Tq)); doc_starts is then (B, Tq), one first key per query in
// the keys' frame (it may be T: the query sees none; out 0, lse -inf); the
// gradients dq and dkv have q's and kv's shapes. A fused qkv always runs
// every row's queries (Q0 0).
//
// Two implementations: SIMT kernels (attention.cu: one thread per query or
// key, two above head dim 128; every type and head dim) and tensor-core
// kernels (attention_tensor_core.cu: WMMA tiles, bf16/f16, head dims a
// multiple of 16 whose shared memory the device has: AttentionDevice;
// sm_80+). AttentionKernel::Auto picks the tensor cores where they apply.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace triad::kernels {

struct AttentionShape {
  int64_t B = 0, T = 0, C = 0, NH = 0;
  int64_t NKV = 0;  // key/value heads; 0 means NH (multi-head attention)
  // Logit soft-capping (Gemma 2's): scaled scores s become
  // softcap * tanh(s / softcap) before the softmax; 0: none.
  double softcap = 0.0;
  // The first query's position in the keys' frame (0 in a fused qkv; any
  // position >= 0 with the queries apart).
  int64_t Q0 = 0;
  // The query rows with the queries apart; -1: T - Q0 (the sequence's last).
  int64_t QT = -1;
  // The queries in a tensor of their own and the keys and values in another
  // (attention_*_parts), instead of one fused qkv.
  bool separate = false;
  // The forward's output in f32 under bf16/f16 inputs (the parts alone: a
  // ring step's block, folded into the running output without a rounding).
  bool out_f32 = false;
  // The call's first keys are a sliding window of this many keys alone
  // (AttentionHeads::with_window): Triad's kernels read them from doc_starts
  // all the same; the backend may hand the call to cuDNN's windowed graph
  // instead. 0: no such promise.
  int64_t window = 0;
  // Query rows: out's, lse's and dout's.
  int64_t query_rows() const { return QT >= 0 ? QT : T - Q0; }
  int64_t head_dim() const { return NH > 0 ? C / NH : 0; }
  int64_t kv_heads() const { return NKV > 0 ? NKV : NH; }
  bool grouped() const { return kv_heads() != NH; }
  // Width of qkv's rows: C for q plus k's and v's heads.
  int64_t qkv_width() const { return C + 2 * kv_heads() * head_dim(); }
};

// The largest head dimension the kernels are built for (the tensor-core
// kernels' where the device has the shared memory: AttentionDevice).
constexpr int64_t kAttentionMaxHeadDim = 256;

// The kernels' grids are flat along x (2^31 - 1 blocks at most): B * NH
// heads times their blocks of rows must fit in it (check_attention).
constexpr int64_t kAttentionMaxGridX = 2147483647;

enum class AttentionKernel : uint8_t { Auto, Simt, TensorCore };

Status check_attention(ScalarType type, const AttentionShape& s);
// What the tensor-core kernels need of a device: its compute capability's
// major number (8.0 or newer) and the shared memory a block may take
// (cudaDevAttrMaxSharedMemoryPerBlockOptin). The default is an H100's or
// H200's: 9.x, 227 KiB.
struct AttentionDevice {
  int sm_major = 9;
  int64_t shared_bytes = 227 * 1024;
  // Device `device`'s, and the current one's (cudaGetDevice).
  static AttentionDevice of(int device);
  static AttentionDevice current();
};
// The shared memory a block of the tensor-core kernels takes at head dim D
// (their largest pass, bf16 or f16): about 72 KiB up to 64 (within the 99
// KiB of sm_86, sm_89 and sm_120), 103 KiB up to 128 (sm_80's 163 KiB)
// and 167 KiB up to 256 (sm_90's and sm_100's 227 KiB).
size_t attention_tensor_core_shared_bytes(int64_t head_dim);
// Whether the tensor-core kernels can run this call on `device` (type, a
// head dim that is a multiple of 16 whose shared memory the device has,
// compute capability 8.0 or newer).
Status check_attention_tensor_core(ScalarType type, const AttentionShape& s,
                                   AttentionDevice device = {});
// The implementation a request resolves to: Auto becomes TensorCore when
// check_attention_tensor_core passes, else Simt; an explicit TensorCore that
// cannot run is an error (std::invalid_argument with the reason).
AttentionKernel resolve_attention_kernel(AttentionKernel requested, ScalarType type,
                                         const AttentionShape& s, AttentionDevice device);

void attention_forward(const void* qkv, void* out, float* lse, ScalarType type,
                       const AttentionShape& s, cudaStream_t stream,
                       AttentionKernel kernel = AttentionKernel::Auto,
                       const int32_t* doc_starts = nullptr);

// Bytes of device scratch attention_backward needs.
size_t attention_backward_workspace(const AttentionShape& s);
// dqkv (B, T, qkv_width) is overwritten.
void attention_backward(const void* qkv, const void* out, const float* lse, const void* dout,
                        void* dqkv, ScalarType type, const AttentionShape& s, void* workspace,
                        cudaStream_t stream, AttentionKernel kernel = AttentionKernel::Auto,
                        const int32_t* doc_starts = nullptr);

// The same with the queries apart (s.separate): q (B, query_rows(), C), kv
// (B, T, 2 NKV D); dq and dkv of their shapes are overwritten.
void attention_forward_parts(const void* q, const void* kv, void* out, float* lse, ScalarType type,
                             const AttentionShape& s, cudaStream_t stream,
                             AttentionKernel kernel = AttentionKernel::Auto,
                             const int32_t* doc_starts = nullptr);
void attention_backward_parts(const void* q, const void* kv, const void* out, const float* lse,
                              const void* dout, void* dq, void* dkv, ScalarType type,
                              const AttentionShape& s, void* workspace, cudaStream_t stream,
                              AttentionKernel kernel = AttentionKernel::Auto,
                              const int32_t* doc_starts = nullptr);

// The tensor-core kernels themselves (attention_tensor_core.cu), over the
// queries at q and the keys and values at kv (the same fused qkv twice, or
// the parts as s.separate says); the backward takes delta (B, NH, query_rows())
// = rowsum(dout * out), computed by attention_backward.
void attention_forward_tensor_core(const void* q, const void* kv, void* out, float* lse,
                                   ScalarType type, const AttentionShape& s, cudaStream_t stream,
                                   const int32_t* doc_starts = nullptr);
void attention_backward_tensor_core(const void* q, const void* kv, const void* dout,
                                    const float* lse, const float* delta, void* dq, void* dkv,
                                    ScalarType type, const AttentionShape& s, cudaStream_t stream,
                                    const int32_t* doc_starts = nullptr);

}  // namespace triad::kernels
