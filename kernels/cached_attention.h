#pragma once

// Decoding's attention (cached_attention.cu): the n newest tokens' queries
// over a key/value cache, read where it lies. Forward only.
//
// qkv (B, n, (NH + 2 NKV) D) contiguous holds the new tokens' projection;
// only its NH query heads are read. keys and values hold, per row and
// key/value head, slots [0, L) of the cache, each slot's D elements
// contiguous and slots D apart; a row lies batch_stride elements after the
// previous one and a head head_stride after the previous head (a cache
// allocated for more slots than L). Query i of row b sits in slot
// p = L - n + i; query head h reads key/value head h / (NH / NKV). It
// attends to slots [first, p] with scale 1/sqrt(D) (and Gemma 2's
// soft-capping when softcap > 0): first is 0, or p - window + 1 under a
// window > 0, and at least text_starts[b] when text_starts ((B) i32 on the
// device) is given and p >= text_starts[b]. out (B, n, NH D) contiguous.
//
// Split over the keys (flash-decoding): each query's slots are cut into
// `splits` chunks, a block per (query, chunk), so that one row's few heads
// still fill the device over a long cache. In a block each lane scores a key
// of its own (a whole dot product, the query in shared memory), the warp
// takes 32 keys at a time with an online softmax in f32, the block merges
// its four warps, and a second kernel merges the chunks (one chunk: the
// block writes the output itself). No (n, L) scores in memory, no copy of
// the cache, no mask tensor, no atomics. Types f32, bf16, f16; D up to
// kCachedAttentionMaxHeadDim.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common.h"

namespace triad::kernels {

struct CachedAttentionShape {
  int64_t B = 0, n = 0, NH = 0, NKV = 0, D = 0;
  int64_t L = 0;  // slots attended over; the last n are the new tokens'
  int64_t k_batch_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_head_stride = 0;
  int64_t window = 0;    // 0: none
  double softcap = 0.0;  // 0: none
};

constexpr int64_t kCachedAttentionMaxHeadDim = 256;

// Whether cached_attention_forward can run this call, and why not.
Status check_cached_attention(ScalarType type, const CachedAttentionShape& s);
// The chunks each query's slots are split into: enough blocks to fill a
// device (about 256) while each chunk keeps at least 128 keys.
int64_t cached_attention_splits(const CachedAttentionShape& s);
// Bytes of device scratch cached_attention_forward needs (0 for one chunk).
size_t cached_attention_workspace(const CachedAttentionShape& s);

// Stores the n new tokens' keys and values (qkv's k and v heads) into
// slots [start, start + n) of key and value caches laid out as
// cached_attention_forward reads them (its s.L is unused here), in one
// launch. Types f32, bf16, f16.
void write_kv_cache(const void* qkv, void* keys, void* values, ScalarType type,
                    const CachedAttentionShape& s, int64_t start, cudaStream_t stream);

void cached_attention_forward(const void* qkv, const void* keys, const void* values, void* out,
                              ScalarType type, const CachedAttentionShape& s,
                              const int32_t* text_starts, void* workspace, cudaStream_t stream);

}  // namespace triad::kernels
