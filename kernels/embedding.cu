// Embedding gather and its deterministic segmented backward.
#include <algorithm>
#include <type_traits>

#include "device_utils.cuh"
#include "embedding.h"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;

// Packs of V elements of a row (V divides C; V > 1 when the table and the
// output are 16-byte aligned): one division per pack. An id outside
// [0, rows) gets zeros, and its position goes to *bad (when given).
template <class T, int V>
__global__ void embedding_forward_kernel(const T* w, const void* ids, bool ids64, int64_t rows,
                                         int64_t C, int64_t N, T* out, unsigned long long* bad) {
  const int64_t row_packs = C / V, total = N * row_packs;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < total;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = p / row_packs, c = (p % row_packs) * V;
    const int64_t id = load_id(ids, ids64, row);
    compute_t<T> v[V] = {};
    if (id >= 0 && id < rows) {
      load_n<V>(w, id * C + c, v);
    } else if (bad && c == 0) {
      atomicMin(bad, static_cast<unsigned long long>(row));
    }
    store_n<V>(out, row * C + c, v);
  }
}

// V f32 values at p + i (aligned to their size), as accesses of at most 16
// bytes (a bf16 pack's 8 sums are two).
template <int V>
__device__ __forceinline__ void store_f32(float* p, int64_t i, const float (&in)[V]) {
  constexpr int W = V < 4 ? V : 4;
#pragma unroll
  for (int q = 0; q < V / W; ++q) {
    float part[W];
#pragma unroll
    for (int j = 0; j < W; ++j) part[j] = in[q * W + j];
    store_n<W>(p, i + q * W, part);
  }
}
template <int V>
__device__ __forceinline__ void load_f32(const float* p, int64_t i, float (&out)[V]) {
  constexpr int W = V < 4 ? V : 4;
#pragma unroll
  for (int q = 0; q < V / W; ++q) {
    float part[W];
    load_n<W>(p, i + q * W, part);
#pragma unroll
    for (int j = 0; j < W; ++j) out[q * W + j] = part[j];
  }
}

// acc stored to dw[at, at + V), or with `add` added to what is there.
template <class D, int V>
__device__ __forceinline__ void finish_row(D* dw, int64_t at, float (&acc)[V], bool add) {
  if (add) {
    compute_t<D> old[V];
    load_n<V>(dw, at, old);
    for (int j = 0; j < V; ++j) acc[j] = static_cast<float>(old[j]) + acc[j];
  }
  store_n<V>(dw, at, acc);
}

// blockIdx.x = piece, (blockIdx.y * blockDim.x + threadIdx.x) * V = the
// thread's first column (V columns per access when V > 1). A piece sums its
// positions in order; a whole segment's piece finishes its row of dw (with
// `add`, adds to it; D: the tensor type, or f32 for a half weight's f32
// gradient), a long segment's piece stores its sum to its slot of partials.
// (counts: a plan built on the device, whose grid is the most pieces
// there could be: counts[0] pieces are real.)
template <class T, class D, int V>
__global__ void embedding_backward_kernel(const int64_t* order, const int64_t* piece_start,
                                          const int64_t* piece_dest, const T* dout, int64_t C,
                                          D* dw, float* partials, bool add, const int64_t* counts) {
  const int64_t c = (blockIdx.y * int64_t(blockDim.x) + threadIdx.x) * V;
  if (c >= C || (counts && blockIdx.x >= counts[0])) return;
  const int64_t p = blockIdx.x, end = piece_start[p + 1];
  float acc[V] = {};
  // Unrolled so that several rows' loads are in flight; the adds keep their order.
#pragma unroll 4
  for (int64_t k = piece_start[p]; k < end; ++k) {
    float v[V];
    load_n<V>(dout, order[k] * C + c, v);
    for (int j = 0; j < V; ++j) acc[j] += v[j];
  }
  const int64_t dest = piece_dest[p];
  if (dest < 0) {
    store_f32<V>(partials, (-1 - dest) * C + c, acc);
  } else {
    finish_row<D, V>(dw, dest * C + c, acc, add);
  }
}

// blockIdx.x = long segment, columns as above: its pieces' sums added in
// order, then its row finished.
template <class D, int V>
__global__ void embedding_pieces_kernel(const int64_t* long_first, const int64_t* long_id,
                                        const float* partials, int64_t C, D* dw, bool add,
                                        const int64_t* counts) {
  const int64_t c = (blockIdx.y * int64_t(blockDim.x) + threadIdx.x) * V;
  if (c >= C || (counts && blockIdx.x >= counts[1])) return;
  const int64_t l = blockIdx.x, end = long_first[l + 1];
  float acc[V] = {};
#pragma unroll 4
  for (int64_t s = long_first[l]; s < end; ++s) {
    float v[V];
    load_f32<V>(partials, s * C + c, v);
    for (int j = 0; j < V; ++j) acc[j] += v[j];
  }
  finish_row<D, V>(dw, long_id[l] * C + c, acc, add);
}

// ---- the plan on the device ------------------------------------------------
// Each position's key is id * N + position: unique, so sorting the keys is
// a stable sort of the positions by id. An id outside [0, V) keys as
// V * N + position, after every good one, and joins no piece.
constexpr int kSortTile = 1024;    // keys a block sorts in shared memory
constexpr int kSortThreads = 512;  // each compares two pairs a step
constexpr int kPlanThreads = 1024;
constexpr int64_t kPiece = 32;  // = detail::kEmbeddingPiece (embedding_order.h)

int64_t max_longs(int64_t N) {
  return N / (kPiece + 1);
}

// The keys of tile blockIdx.x, sorted (a bitonic network; keys past N pad
// the tile as the largest key and are not written).
__global__ void __launch_bounds__(kSortThreads)
    plan_sort_tiles_kernel(const void* ids, bool ids64, int64_t N, int64_t V, int64_t* keys,
                           unsigned long long* bad) {
  __shared__ int64_t tile[kSortTile];
  const int64_t base = int64_t(blockIdx.x) * kSortTile;
  for (int t = threadIdx.x; t < kSortTile; t += blockDim.x) {
    const int64_t i = base + t;
    int64_t key = INT64_MAX;
    if (i < N) {
      const int64_t id = load_id(ids, ids64, i);
      const bool good = id >= 0 && id < V;
      if (!good && bad) atomicMin(bad, static_cast<unsigned long long>(i));
      key = (good ? id : V) * N + i;
    }
    tile[t] = key;
  }
  __syncthreads();
  for (int k = 2; k <= kSortTile; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int t = threadIdx.x; t < kSortTile; t += blockDim.x) {
        const int partner = t ^ j;
        if (partner > t) {
          const int64_t a = tile[t], b = tile[partner];
          if ((a > b) == ((t & k) == 0)) {
            tile[t] = b;
            tile[partner] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int t = threadIdx.x; t < kSortTile; t += blockDim.x) {
    if (base + t < N) keys[base + t] = tile[t];
  }
}

// The first index of sorted[lo, hi) whose key is >= key (hi if none).
__device__ __forceinline__ int64_t lower_bound_key(const int64_t* sorted, int64_t lo, int64_t hi,
                                                   int64_t key) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Sorted runs of `width` keys merged in pairs: each key lands at its index
// in its run plus the count of smaller keys in the other run.
__global__ void plan_merge_kernel(const int64_t* in, int64_t* out, int64_t N, int64_t width) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t run = i / width, start = run * width;
    const int64_t first = (run & ~int64_t(1)) * width;  // the pair's first key
    const int64_t other = (run & 1) ? start - width : start + width;
    const int64_t other_end = min(other + width, N);
    const int64_t smaller =
        other < N ? lower_bound_key(in, other, other_end, in[i]) - other : int64_t(0);
    out[first + (i - start) + smaller] = in[i];
  }
}

// What sorted position i is, for a good id: whether it starts a piece, a
// long segment's piece, a long segment (0 for a bad id's). Each position
// finds its segment's ends by binary search, all positions at once; its
// place in token order goes to order[i].
constexpr uint8_t kStartsPiece = 1, kStartsLongPiece = 2, kStartsLongSegment = 4;
__global__ void plan_flags_kernel(const int64_t* keys, int64_t N, int64_t V, uint8_t* flags,
                                  int64_t* order) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t id = keys[i] / N;
    uint8_t f = 0;
    if (id < V) {
      order[i] = keys[i] % N;
      const int64_t begin = lower_bound_key(keys, 0, i + 1, id * N);
      const int64_t end = lower_bound_key(keys, i, N, (id + 1) * N);
      const bool is_long = end - begin > kPiece;
      if ((i - begin) % kPiece == 0) f |= is_long ? kStartsPiece | kStartsLongPiece : kStartsPiece;
      if (i == begin && is_long) f |= kStartsLongSegment;
    }
    flags[i] = f;
  }
}

// One block cuts the flagged positions into pieces in two passes over each
// thread's run of positions: count, then (after a scan of the counts)
// write. counts = {pieces, long segments}.
__global__ void __launch_bounds__(kPlanThreads)
    plan_pieces_kernel(const int64_t* keys, const uint8_t* flags, int64_t N, int64_t V,
                       int64_t* piece_start, int64_t* piece_dest, int64_t* long_first,
                       int64_t* long_id, int64_t* counts) {
  __shared__ int64_t scan[3 * kPlanThreads];  // [count][thread]
  const int t = threadIdx.x;
  const int64_t per = (N + kPlanThreads - 1) / kPlanThreads;
  const int64_t lo = min(N, t * per), hi = min(N, lo + per);
  int64_t mine[3] = {0, 0, 0};
  for (int64_t i = lo; i < hi; ++i) {
    const uint8_t f = flags[i];
    mine[0] += (f & kStartsPiece) != 0;
    mine[1] += (f & kStartsLongPiece) != 0;
    mine[2] += (f & kStartsLongSegment) != 0;
  }
  for (int q = 0; q < 3; ++q) scan[q * kPlanThreads + t] = mine[q];
  __syncthreads();
  // Inclusive scan (Hillis-Steele), then each thread's exclusive start.
  for (int d = 1; d < kPlanThreads; d <<= 1) {
    int64_t add[3] = {0, 0, 0};
    if (t >= d) {
      for (int q = 0; q < 3; ++q) add[q] = scan[q * kPlanThreads + t - d];
    }
    __syncthreads();
    for (int q = 0; q < 3; ++q) scan[q * kPlanThreads + t] += add[q];
    __syncthreads();
  }
  int64_t piece = scan[t] - mine[0], slot = scan[kPlanThreads + t] - mine[1],
          seg = scan[2 * kPlanThreads + t] - mine[2];
  for (int64_t i = lo; i < hi; ++i) {
    const uint8_t f = flags[i];
    if (f == 0) continue;
    const int64_t id = keys[i] / N;
    if (f & kStartsLongSegment) {
      long_first[seg] = slot;
      long_id[seg++] = id;
    }
    piece_start[piece] = i;  // (every flagged position starts a piece)
    piece_dest[piece++] = (f & kStartsLongPiece) ? -1 - slot++ : id;
  }
  if (t == kPlanThreads - 1) {
    piece_start[piece] = lower_bound_key(keys, 0, N, V * N);  // the good positions
    long_first[seg] = slot;
    counts[0] = piece;
    counts[1] = seg;
  }
}

}  // namespace

Status check_embedding(ScalarType type, int64_t V, int64_t C, int64_t N) {
  if (!is_nn_type(type)) {
    return Status::fail(std::string("weight type ") + scalar_name(type) +
                        " is not supported (f32, bf16 or f16)");
  }
  if (V <= 0 || C <= 0 || N < 0) {
    return Status::fail("shape (V " + std::to_string(V) + ", C " + std::to_string(C) + ", N " +
                        std::to_string(N) + ") needs V > 0, C > 0, N >= 0");
  }
  return Status::fine();
}

void embedding_forward(const void* weight, ScalarType type, const void* ids, bool ids64, int64_t V,
                       int64_t C, int64_t N, void* out, cudaStream_t stream,
                       unsigned long long* bad) {
  require(check_embedding(type, V, C, N), "embedding_forward");
  if (N == 0) return;
  dispatch_nn(type, "embedding_forward", [&](auto t) {
    using T = decltype(t);
    const T* w = static_cast<const T*>(weight);
    if (C % kPack<T> == 0 && pack_aligned(weight) && pack_aligned(out)) {
      embedding_forward_kernel<T, kPack<T>>
          <<<grid_for(N * C / kPack<T>, kThreads), kThreads, 0, stream>>>(
              w, ids, ids64, V, C, N, static_cast<T*>(out), bad);
    } else {
      embedding_forward_kernel<T, 1><<<grid_for(N * C, kThreads), kThreads, 0, stream>>>(
          w, ids, ids64, V, C, N, static_cast<T*>(out), bad);
    }
  });
  check_launch("embedding_forward");
}

void embedding_backward(const EmbeddingPlan& plan, const void* dout, ScalarType type, int64_t V,
                        int64_t C, void* dweight, cudaStream_t stream, bool f32_grad,
                        bool accumulate) {
  require(check_embedding(type, V, C, 0), "embedding_backward");
  // (A plan built on the device gives bounds on N ids, which may pass V.)
  if (plan.pieces < 0 || plan.pieces > 2147483647LL || plan.longs < 0 ||
      (!plan.counts && plan.longs > V) || plan.longs > plan.pieces) {
    throw std::invalid_argument("embedding_backward: " + std::to_string(plan.pieces) +
                                " pieces and " + std::to_string(plan.longs) +
                                " long segments for " + std::to_string(V) + " rows");
  }
  if (plan.longs > 0 && plan.partials == nullptr) {
    throw std::invalid_argument("embedding_backward: " + std::to_string(plan.longs) +
                                " long segments need a scratch of partial sums (null)");
  }
  if (!accumulate) {
    const size_t element = f32_grad ? sizeof(float) : scalar_size(type);
    check_cuda(cudaMemsetAsync(dweight, 0, static_cast<size_t>(V * C) * element, stream),
               "embedding_backward: cudaMemsetAsync");
  }
  if (plan.pieces == 0) return;
  const bool aligned = pack_aligned(dout) && pack_aligned(dweight);
  dispatch_nn(type, "embedding_backward", [&](auto t) {
    using T = decltype(t);
    auto launch = [&](auto d, auto v, bool add) {
      using D = decltype(d);
      constexpr int W = decltype(v)::value;
      const int64_t threads = (C / W + 31) / 32 * 32;  // a block covers the row when it can
      const int block = static_cast<int>(std::min<int64_t>(threads, kThreads));
      const unsigned column_blocks = static_cast<unsigned>((C / W + block - 1) / block);
      D* dw = static_cast<D*>(dweight);
      embedding_backward_kernel<T, D, W>
          <<<dim3(static_cast<unsigned>(plan.pieces), column_blocks), block, 0, stream>>>(
              plan.order, plan.piece_start, plan.piece_dest, static_cast<const T*>(dout), C, dw,
              plan.partials, add, plan.counts);
      if (plan.longs > 0) {
        embedding_pieces_kernel<D, W>
            <<<dim3(static_cast<unsigned>(plan.longs), column_blocks), block, 0, stream>>>(
                plan.long_first, plan.long_id, plan.partials, C, dw, add, plan.counts);
      }
    };
    // Packs of the wider of the two types (4 for f32 gradients).
    if (f32_grad) {
      if (aligned && C % 4 == 0) {
        launch(float{}, std::integral_constant<int, 4>{}, true);
      } else {
        launch(float{}, std::integral_constant<int, 1>{}, true);
      }
    } else if (aligned && C % kPack<T> == 0) {
      launch(T{}, std::integral_constant<int, kPack<T>>{}, accumulate);
    } else {
      launch(T{}, std::integral_constant<int, 1>{}, accumulate);
    }
  });
  check_launch("embedding_backward");
}

size_t embedding_device_plan_bytes(int64_t N) {
  // keys twice (the merge passes' two buffers), order, piece_start,
  // piece_dest, long_first, long_id, counts, then the flags.
  return static_cast<size_t>(5 * N + 2 * max_longs(N) + 4) * sizeof(int64_t) +
         static_cast<size_t>(N);  // (the flags, a byte each, last)
}

int64_t embedding_device_plan_slots(int64_t N) {
  // A long segment of n > kPiece positions takes ceil(n / kPiece) slots.
  return max_longs(N) > 0 ? (N + (kPiece - 1) * max_longs(N) + kPiece - 1) / kPiece : 0;
}

EmbeddingPlan embedding_plan_on_device(const void* ids, bool ids64, int64_t N, int64_t V,
                                       void* workspace, float* partials, unsigned long long* bad,
                                       cudaStream_t stream) {
  if (N < 1 || V < 1 || N > INT32_MAX || V > INT64_MAX / (N + 1)) {
    throw std::invalid_argument("embedding_plan_on_device: " + std::to_string(N) + " ids over " +
                                std::to_string(V) + " rows (needs 1 <= N <= 2^31 - 1 and " +
                                "(V + 1) * N within int64)");
  }
  if (!workspace) throw std::invalid_argument("embedding_plan_on_device: workspace is null");
  if (max_longs(N) > 0 && !partials) {
    throw std::invalid_argument("embedding_plan_on_device: " + std::to_string(N) +
                                " ids need a scratch of partial sums (null)");
  }
  int64_t* keys = static_cast<int64_t*>(workspace);
  int64_t* spare = keys + N;
  const unsigned tiles = static_cast<unsigned>((N + kSortTile - 1) / kSortTile);
  plan_sort_tiles_kernel<<<tiles, kSortThreads, 0, stream>>>(ids, ids64, N, V, keys, bad);
  for (int64_t width = kSortTile; width < N; width *= 2) {
    plan_merge_kernel<<<grid_for(N, kThreads), kThreads, 0, stream>>>(keys, spare, N, width);
    std::swap(keys, spare);
  }
  int64_t* order = static_cast<int64_t*>(workspace) + 2 * N;
  EmbeddingPlan plan;
  plan.order = order;
  int64_t* piece_start = order + N;
  int64_t* piece_dest = piece_start + N + 1;
  int64_t* long_first = piece_dest + N;
  int64_t* long_id = long_first + max_longs(N) + 1;
  int64_t* counts = long_id + max_longs(N);
  uint8_t* flags = reinterpret_cast<uint8_t*>(counts + 2);
  plan_flags_kernel<<<grid_for(N, kThreads), kThreads, 0, stream>>>(keys, N, V, flags, order);
  plan_pieces_kernel<<<1, kPlanThreads, 0, stream>>>(keys, flags, N, V, piece_start, piece_dest,
                                                     long_first, long_id, counts);
  check_launch("embedding_plan_on_device");
  plan.piece_start = piece_start;
  plan.piece_dest = piece_dest;
  plan.pieces = N;
  plan.long_first = long_first;
  plan.long_id = long_id;
  plan.longs = max_longs(N);
  plan.partials = partials;
  plan.counts = counts;
  return plan;
}

namespace {
template <class T>
__global__ void vocab_shard_ids_kernel(const void* ids, bool ids64, int64_t N, int64_t start,
                                       int64_t valid, int64_t vocab, int64_t* local, T* keep,
                                       unsigned long long* bad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t id = load_id(ids, ids64, i);
    if ((id < 0 || id >= vocab) && bad) atomicMin(bad, static_cast<unsigned long long>(i));
    const bool mine = id >= start && id - start < valid;
    local[i] = mine ? id - start : 0;
    store(keep, i, mine ? 1.0f : 0.0f);
  }
}
}  // namespace

void vocab_shard_ids(const void* ids, bool ids64, int64_t N, int64_t start, int64_t valid,
                     int64_t vocab, int64_t* local, void* keep, ScalarType keep_type,
                     unsigned long long* bad, cudaStream_t stream) {
  // (A shard of padding alone, past the vocabulary's end, holds no id:
  // valid 0 wherever it starts.)
  if (N < 0 || start < 0 || valid < 0 || (valid > 0 && vocab < start + valid)) {
    throw std::invalid_argument("vocab_shard_ids: " + std::to_string(N) + " ids, shard [" +
                                std::to_string(start) + ", " + std::to_string(start + valid) +
                                ") of a vocabulary of " + std::to_string(vocab));
  }
  if (N == 0) return;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((N + kThreads - 1) / kThreads, 4096));
  dispatch_nn(keep_type, "vocab_shard_ids", [&](auto t) {
    using T = decltype(t);
    vocab_shard_ids_kernel<T><<<blocks, kThreads, 0, stream>>>(ids, ids64, N, start, valid, vocab,
                                                               local, static_cast<T*>(keep), bad);
  });
  check_launch("vocab_shard_ids");
}

}  // namespace triad::kernels
