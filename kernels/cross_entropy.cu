// Fused cross entropy: one block per row; each thread keeps an online
// (max, sum of exp) pair over its columns, merged across the block.
#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "cross_entropy.h"
#include "device_utils.cuh"

namespace triad::kernels {
namespace {

// Most threads of a row's block (row_threads). Every kernel launched with
// up to them declares them as its bound, so that ptxas holds it to the 128
// registers a thread that 512 threads leave (above that the launch would
// fail, on the GPU only).
constexpr int kThreads = 512;

// Threads for a block that reads a row of n elements in packs of P (what
// block_row_packs hands out): a warp for every 32 packs, at most `most`.
// Below `most`, every thread holds at most one pack and one element of the
// row's unaligned head and tail (fewer than P <= 8 each), as it would in a
// block of `most`, whose other threads only bring the neutral (-inf, 0)
// pair, 0 or -inf to the block's reductions: a row's sums have the same
// bits in either block. A row of GPT-2's vocabulary (or a vocabulary
// shard of a few thousand) fills `most`; a short row no longer launches
// hundreds of threads with nothing to read.
template <int P>
unsigned row_threads(int64_t n, int most) {
  const int64_t warps = std::max<int64_t>(1, (n + 32 * P - 1) / (32 * P));
  return static_cast<unsigned>(std::min<int64_t>(most, warps * 32));
}

// Merges (m, s) pairs: s is the sum of exp(x - m).
__device__ __forceinline__ void merge(float& m, float& s, float om, float os) {
  if (om == -INFINITY) return;
  if (m == -INFINITY) {
    m = om, s = os;
    return;
  }
  // The larger side's sum is taken as it is, not times exp(0): a pair that
  // adds nothing (sums of exp(-1e30 - m)) then leaves the other's bits
  // whatever the fast exp gives at 0.
  if (om > m) {
    s = s * __expf(m - om) + os;
    m = om;
  } else {
    s += om == m ? os : os * __expf(om - m);
  }
}

// Every row kernel reads its row in 16-byte packs from the row's first
// 16-byte boundary on (block_row_packs); a kernel that also writes a row
// does so in packs when the output row has the input row's alignment
// (V = kPack<T>), else one element at a time (V = 1).

// The block's online (max, sum of exp(x - max)) over columns [0, n) of
// row, every thread getting the pair: (-inf, 0) for no columns.
template <class T>
__device__ void row_max_sum(const T* row, int64_t n, float& m, float& s) {
  constexpr int V = kPack<T>;
  __shared__ float sm[32], ss[32];
  m = -INFINITY;
  s = 0;
  block_row_packs<V>(row, n, [&](int64_t j, auto pack) {
    float v[V];
    load_body<V>(row, j, v, pack);
    constexpr int cnt = decltype(pack)::value ? V : 1;
    float pm = v[0];
    for (int k = 1; k < cnt; ++k) pm = fmaxf(pm, v[k]);
    if (pm > m) {
      s = m == -INFINITY ? 0.0f : s * __expf(m - pm);
      m = pm;
    }
    for (int k = 0; k < cnt; ++k) s += __expf(v[k] - m);
  });
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, om, os);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) sm[warp] = m, ss[warp] = s;
  __syncthreads();
  m = lane < warps ? sm[lane] : -INFINITY;
  s = lane < warps ? ss[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, om, os);
  }
}

// The block's log-sum-exp over columns [0, n) of row.
template <class T>
__device__ float row_lse(const T* row, int64_t n) {
  float m, s;
  row_max_sum(row, n, m, s);
  return m + logf(s);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    ce_forward_kernel(const T* logits, const void* targets, bool t64, int64_t V, int64_t ld,
                      int64_t ignore_index, float* losses, float* lse) {
  const T* row = logits + blockIdx.x * ld;
  const float l = row_lse(row, V);
  if (threadIdx.x == 0) {
    const int64_t t = load_id(targets, t64, blockIdx.x);
    lse[blockIdx.x] = l;
    if (t == ignore_index) {
      losses[blockIdx.x] = 0.0f;
    } else {
      losses[blockIdx.x] = (t >= 0 && t < V) ? l - load(row, t) : NAN;
    }
  }
}

// out[j] = f(j, logit j) for j in [0, n) of a row (P packs of the output too).
template <int P, class T, class F>
__device__ __forceinline__ void map_row(const T* row, T* out, int64_t n, F&& f) {
  block_row_packs<P>(row, n, [&](int64_t j, auto pack) {
    float v[P];
    load_body<P>(row, j, v, pack);
    constexpr int cnt = decltype(pack)::value ? P : 1;
    for (int k = 0; k < cnt; ++k) v[k] = f(j + k, v[k]);
    store_body<P>(out, j, v, pack);
  });
}

// The soft cap's derivative at a capped logit z: 1 - (z / cap)^2; 1 without
// a cap (cap 0).
__device__ __forceinline__ float cap_slope(float z, float cap) {
  if (cap <= 0.0f) return 1.0f;
  const float r = z / cap;
  return 1.0f - r * r;
}

template <class T, int P>
__global__ void __launch_bounds__(kThreads)
    ce_backward_kernel(const T* logits, const void* targets, bool t64, const float* lse,
                       const float* dlosses, const float* dlse, int64_t V, int64_t ld,
                       int64_t ignore_index, float cap, T* dlogits) {
  const int64_t r = blockIdx.x;
  const int64_t t = load_id(targets, t64, r);
  const float g = t == ignore_index ? 0.0f : dlosses[r];
  // The softmax's weight: the loss's, and the z-loss's on the lse.
  const float gs = t == ignore_index ? 0.0f : g + (dlse ? dlse[r] : 0.0f);
  const float l = lse[r];
  map_row<P>(logits + r * ld, dlogits + r * ld, V, [&](int64_t j, float x) {
    return (__expf(x - l) * gs - (j == t ? g : 0.0f)) * cap_slope(x, cap);
  });
}

// The forward and the backward in one block a row (dlosses known before
// the backward pass): the row's log-sum-exp as ce_forward_kernel's, then
// its gradient as ce_backward_kernel's (dlse, with a z-loss, from the
// log-sum-exp: (lse * dloss) * z_scale), the second pass
// reading the row the first has just brought into cache. The target's
// logit is read before any thread can write (dlogits may be the logits),
// and every thread takes thread 0's log-sum-exp, the one stored, so the
// gradient's bits are the two kernels'.
// Blocks of up to 1024 threads, twice the others': half as many rows in flight
// (2 blocks a multiprocessor, not 4), so that the rows read but not yet
// reread (264 of 100 KB at GPT-2's vocabulary on an H200) fit in L2.
constexpr int kFusedThreads = 1024;
template <class T, int P>
__global__ void __launch_bounds__(kFusedThreads)
    ce_forward_backward_kernel(const T* logits, const void* targets, bool t64, const float* dlosses,
                               int64_t V, int64_t ld, int64_t ignore_index, float cap,
                               float z_scale, float* losses, float* lse, T* dlogits) {
  __shared__ float row_l[1];
  const int64_t r = blockIdx.x;
  const T* row = logits + r * ld;
  const int64_t t = load_id(targets, t64, r);
  const bool counted = t != ignore_index, inside = t >= 0 && t < V;
  float target_logit = 0.0f;
  if (threadIdx.x == 0 && counted && inside) target_logit = load(row, t);
  float l = row_lse(row, V);
  if (threadIdx.x == 0) {
    row_l[0] = l;
    lse[r] = l;
    losses[r] = !counted ? 0.0f : inside ? l - target_logit : NAN;
  }
  __syncthreads();
  l = row_l[0];
  const float g = counted ? dlosses[r] : 0.0f;
  // The softmax's weight: the loss's, and a z-loss's on the lse.
  const float gs = !counted ? 0.0f : z_scale != 0.0f ? g + __fmul_rn(z_scale, __fmul_rn(l, g)) : g;
  map_row<P>(row, dlogits + r * ld, V, [&](int64_t j, float x) {
    return (__expf(x - l) * gs - (j == t ? g : 0.0f)) * cap_slope(x, cap);
  });
}

// x *= *actual / expected over rows of `cols` elements `ld` apart, unless
// *actual == expected: then every block returns having read one float.
template <class T>
__global__ void scale_by_ratio_kernel(T* x, int64_t rows, int64_t cols, int64_t ld,
                                      const float* actual, float expected) {
  const float a = *actual;
  if (a == expected) return;
  const float ratio = a / expected;
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, at = r * ld + (i - r * cols);
    store(x, at, load(x, at) * ratio);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    vce_partial_kernel(const T* logits, const void* targets, bool t64, int64_t ld,
                       int64_t vocab_start, int64_t valid, float* row_max, float* target_logit) {
  constexpr int V = kPack<T>;
  __shared__ float scratch[32];
  const T* row = logits + blockIdx.x * ld;
  float m = -INFINITY;
  block_row_packs<V>(row, valid, [&](int64_t j, auto pack) {
    float v[V];
    load_body<V>(row, j, v, pack);
    for (int k = 0; k < (decltype(pack)::value ? V : 1); ++k) m = fmaxf(m, v[k]);
  });
  m = block_max(m, scratch, -INFINITY);
  if (threadIdx.x == 0) {
    row_max[blockIdx.x] = m;
    const int64_t t = load_id(targets, t64, blockIdx.x) - vocab_start;
    target_logit[blockIdx.x] = (t >= 0 && t < valid) ? load(row, t) : 0.0f;
  }
}

// One pass over a shard's row: its max and sum of exponentials against it,
// and, from thread 0, the target's logit when it lies here.
template <class T>
__global__ void __launch_bounds__(kThreads)
    vce_shard_sums_kernel(const T* logits, const void* targets, bool t64, int64_t ld,
                          int64_t vocab_start, int64_t valid, float* row_max, float* sumexp,
                          float* target_logit) {
  const T* row = logits + blockIdx.x * ld;
  float m, s;
  row_max_sum(row, valid, m, s);
  if (threadIdx.x == 0) {
    row_max[blockIdx.x] = m;
    sumexp[blockIdx.x] = s;
    const int64_t t = load_id(targets, t64, blockIdx.x) - vocab_start;
    target_logit[blockIdx.x] = (t >= 0 && t < valid) ? load(row, t) : 0.0f;
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    vce_sumexp_kernel(const T* logits, const float* gmax, int64_t ld, int64_t valid,
                      float* sumexp) {
  constexpr int V = kPack<T>;
  __shared__ float scratch[32];
  const T* row = logits + blockIdx.x * ld;
  const float m = gmax[blockIdx.x];
  float s = 0;
  block_row_packs<V>(row, valid, [&](int64_t j, auto pack) {
    float v[V];
    load_body<V>(row, j, v, pack);
    for (int k = 0; k < (decltype(pack)::value ? V : 1); ++k) s += __expf(v[k] - m);
  });
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) sumexp[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kThreads)
    vce_loss_kernel(const float* gmax, const float* tlogit, const float* sumexp, int64_t N,
                    float* losses) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < N) losses[i] = logf(sumexp[i]) + gmax[i] - tlogit[i];
}

template <class T, int P>
__global__ void __launch_bounds__(kThreads)
    vce_backward_kernel(const T* logits, const void* targets, bool t64, int64_t Vl, int64_t ld,
                        int64_t vocab_start, int64_t valid, const float* gmax, const float* sumexp,
                        const float* dloss, const float* dlse, float cap, T* dlogits) {
  const int64_t r = blockIdx.x;
  const float g = dloss[r], m = gmax[r], scale = (g + (dlse ? dlse[r] : 0.0f)) / sumexp[r];
  const int64_t t = load_id(targets, t64, r) - vocab_start;
  map_row<P>(logits + r * ld, dlogits + r * ld, Vl, [&](int64_t j, float x) {
    if (j >= valid) return 0.0f;
    float d = __expf(x - m) * scale;
    if (j == t) d -= g;
    return d * cap_slope(x, cap);
  });
}

// Packs for a kernel writing rows of `out` read from rows of `in`: whole
// packs when both rows start at the same offset from a 16-byte boundary.
inline bool same_alignment(const void* in, const void* out) {
  return reinterpret_cast<uintptr_t>(in) % 16 == reinterpret_cast<uintptr_t>(out) % 16;
}

}  // namespace

Status check_cross_entropy(ScalarType type, int64_t N, int64_t V, int64_t ld) {
  if (!is_nn_type(type)) {
    return Status::fail(std::string("logits type ") + scalar_name(type) +
                        " is not supported (f32, bf16 or f16)");
  }
  if (N < 0 || N > 2147483647LL || V <= 0) {
    return Status::fail("logits shape (N " + std::to_string(N) + ", V " + std::to_string(V) +
                        ") needs 0 <= N < 2^31 and V > 0");
  }
  if (ld < V) {
    return Status::fail("row stride " + std::to_string(ld) + " is shorter than a row of V " +
                        std::to_string(V));
  }
  return Status::fine();
}

namespace {
constexpr int kCountThreads = 1024;

// (The count is an integer sum: the same in any order.)
__global__ void __launch_bounds__(kCountThreads)
    inverse_target_count_kernel(const void* targets, bool t64, int64_t N, int64_t ignore_index,
                                int64_t V, float* inv32, double* inv64, unsigned long long* bad) {
  __shared__ int64_t scratch[32];
  int64_t counted = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    const int64_t t = load_id(targets, t64, i);
    if (t == ignore_index) continue;
    ++counted;
    if ((t < 0 || t >= V) && bad) atomicMin(bad, static_cast<unsigned long long>(i));
  }
  counted = block_sum(counted, scratch);
  if (threadIdx.x != 0) return;
  const double inv = counted ? 1.0 / static_cast<double>(counted) : 0.0;
  if (inv32) *inv32 = static_cast<float>(inv);
  if (inv64) *inv64 = inv;
}
}  // namespace

void inverse_target_count(const void* targets, bool targets64, int64_t N, int64_t ignore_index,
                          int64_t V, void* inv_count, ScalarType inv_type, unsigned long long* bad,
                          cudaStream_t stream) {
  if (inv_type != ScalarType::F32 && inv_type != ScalarType::F64) {
    throw std::invalid_argument(std::string("inverse_target_count: result type ") +
                                scalar_name(inv_type) + " (expected f32 or f64)");
  }
  if (N < 0 || V <= 0) {
    throw std::invalid_argument("inverse_target_count: " + std::to_string(N) + " targets over " +
                                std::to_string(V) + " classes");
  }
  const bool f32 = inv_type == ScalarType::F32;
  inverse_target_count_kernel<<<1, kCountThreads, 0, stream>>>(
      targets, targets64, N, ignore_index, V, f32 ? static_cast<float*>(inv_count) : nullptr,
      f32 ? nullptr : static_cast<double*>(inv_count), bad);
  check_launch("inverse_target_count");
}

void cross_entropy_forward(const void* logits, ScalarType type, const void* targets, bool targets64,
                           int64_t N, int64_t V, int64_t ld, int64_t ignore_index, float* losses,
                           float* lse, cudaStream_t stream) {
  require(check_cross_entropy(type, N, V, ld), "cross_entropy_forward");
  if (N == 0) return;
  dispatch_nn(type, "cross_entropy_forward", [&](auto t) {
    using T = decltype(t);
    ce_forward_kernel<T>
        <<<static_cast<unsigned>(N), row_threads<kPack<T>>(V, kThreads), 0, stream>>>(
            static_cast<const T*>(logits), targets, targets64, V, ld, ignore_index, losses, lse);
  });
  check_launch("cross_entropy_forward");
}

void cross_entropy_backward(const void* logits, ScalarType type, const void* targets,
                            bool targets64, const float* lse, const float* dlosses,
                            const float* dlse, int64_t N, int64_t V, int64_t ld,
                            int64_t ignore_index, double softcap, void* dlogits,
                            cudaStream_t stream) {
  require(check_cross_entropy(type, N, V, ld), "cross_entropy_backward");
  if (N == 0) return;
  dispatch_nn(type, "cross_entropy_backward", [&](auto t) {
    using T = decltype(t);
    auto launch = [&](auto p) {
      constexpr int P = decltype(p)::value;
      ce_backward_kernel<T, P>
          <<<static_cast<unsigned>(N), row_threads<P>(V, kThreads), 0, stream>>>(
              static_cast<const T*>(logits), targets, targets64, lse, dlosses, dlse, V, ld,
              ignore_index, static_cast<float>(softcap), static_cast<T*>(dlogits));
    };
    if (same_alignment(logits, dlogits)) {
      launch(std::integral_constant<int, kPack<T>>{});
    } else {
      launch(std::integral_constant<int, 1>{});
    }
  });
  check_launch("cross_entropy_backward");
}

void cross_entropy_forward_backward(const void* logits, ScalarType type, const void* targets,
                                    bool targets64, const float* dlosses, int64_t N, int64_t V,
                                    int64_t ld, int64_t ignore_index, double softcap,
                                    double z_scale, float* losses, float* lse, void* dlogits,
                                    cudaStream_t stream) {
  require(check_cross_entropy(type, N, V, ld), "cross_entropy_forward_backward");
  if (N == 0) return;
  dispatch_nn(type, "cross_entropy_forward_backward", [&](auto t) {
    using T = decltype(t);
    auto launch = [&](auto p) {
      // (Sized for the gradient's packs of P; the log-sum-exp reads packs
      // of kPack<T> >= P, so its threads are never short either.)
      ce_forward_backward_kernel<T, decltype(p)::value>
          <<<static_cast<unsigned>(N), row_threads<decltype(p)::value>(V, kFusedThreads), 0,
             stream>>>(static_cast<const T*>(logits), targets, targets64, dlosses, V, ld,
                       ignore_index, static_cast<float>(softcap), static_cast<float>(z_scale),
                       losses, lse, static_cast<T*>(dlogits));
    };
    if (same_alignment(logits, dlogits)) {
      launch(std::integral_constant<int, kPack<T>>{});
    } else {
      launch(std::integral_constant<int, 1>{});
    }
  });
  check_launch("cross_entropy_forward_backward");
}

void scale_by_ratio(void* x, ScalarType type, int64_t rows, int64_t cols, int64_t ld,
                    const float* actual, double expected, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || ld < cols || expected == 0.0) {
    require(Status::fail("rows " + std::to_string(rows) + ", cols " + std::to_string(cols) +
                         ", ld " + std::to_string(ld) + ", expected " + std::to_string(expected) +
                         ": need rows, cols >= 0, ld >= cols and a nonzero expectation"),
            "scale_by_ratio");
  }
  if (rows * cols == 0) return;
  dispatch_nn(type, "scale_by_ratio", [&](auto t) {
    using T = decltype(t);
    // (Eight elements a thread or more, and a few waves at most: when
    // nothing is to change, each block reads one float and returns.)
    scale_by_ratio_kernel<T><<<grid_for((rows * cols + 7) / 8, 256, 1024), 256, 0, stream>>>(
        static_cast<T*>(x), rows, cols, ld, actual, static_cast<float>(expected));
  });
  check_launch("scale_by_ratio");
}

Status check_vocab_ce(ScalarType type, int64_t N, int64_t Vl, int64_t ld, int64_t valid) {
  Status s = check_cross_entropy(type, N, Vl, ld);
  if (!s.ok) return s;
  if (valid < 0 || valid > Vl) {
    return Status::fail("valid columns " + std::to_string(valid) + " must be in [0, " +
                        std::to_string(Vl) + "]");
  }
  return Status::fine();
}

void vocab_ce_partial(const void* logits, ScalarType type, const void* targets, bool targets64,
                      int64_t N, int64_t Vl, int64_t ld, int64_t vocab_start, int64_t valid,
                      float* row_max, float* target_logit, cudaStream_t stream) {
  require(check_vocab_ce(type, N, Vl, ld, valid), "vocab_ce_partial");
  if (N == 0) return;
  dispatch_nn(type, "vocab_ce_partial", [&](auto t) {
    using T = decltype(t);
    vce_partial_kernel<T>
        <<<static_cast<unsigned>(N), row_threads<kPack<T>>(valid, kThreads), 0, stream>>>(
            static_cast<const T*>(logits), targets, targets64, ld, vocab_start, valid, row_max,
            target_logit);
  });
  check_launch("vocab_ce_partial");
}

void vocab_ce_shard_sums(const void* logits, ScalarType type, const void* targets, bool targets64,
                         int64_t N, int64_t Vl, int64_t ld, int64_t vocab_start, int64_t valid,
                         float* row_max, float* sumexp, float* target_logit, cudaStream_t stream) {
  require(check_vocab_ce(type, N, Vl, ld, valid), "vocab_ce_shard_sums");
  if (N == 0) return;
  dispatch_nn(type, "vocab_ce_shard_sums", [&](auto t) {
    using T = decltype(t);
    vce_shard_sums_kernel<T>
        <<<static_cast<unsigned>(N), row_threads<kPack<T>>(valid, kThreads), 0, stream>>>(
            static_cast<const T*>(logits), targets, targets64, ld, vocab_start, valid, row_max,
            sumexp, target_logit);
  });
  check_launch("vocab_ce_shard_sums");
}

void vocab_ce_sumexp(const void* logits, ScalarType type, const float* global_max, int64_t N,
                     int64_t Vl, int64_t ld, int64_t valid, float* sumexp, cudaStream_t stream) {
  require(check_vocab_ce(type, N, Vl, ld, valid), "vocab_ce_sumexp");
  if (N == 0) return;
  dispatch_nn(type, "vocab_ce_sumexp", [&](auto t) {
    using T = decltype(t);
    vce_sumexp_kernel<T>
        <<<static_cast<unsigned>(N), row_threads<kPack<T>>(valid, kThreads), 0, stream>>>(
            static_cast<const T*>(logits), global_max, ld, valid, sumexp);
  });
  check_launch("vocab_ce_sumexp");
}

void vocab_ce_loss(const float* global_max, const float* target_logit, const float* sumexp,
                   int64_t N, float* losses, cudaStream_t stream) {
  require(N >= 0 ? Status::fine() : Status::fail("N " + std::to_string(N) + " is negative"),
          "vocab_ce_loss");
  if (N == 0) return;
  vce_loss_kernel<<<static_cast<unsigned>((N + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      global_max, target_logit, sumexp, N, losses);
  check_launch("vocab_ce_loss");
}

void vocab_ce_backward(const void* logits, ScalarType type, const void* targets, bool targets64,
                       int64_t N, int64_t Vl, int64_t ld, int64_t vocab_start, int64_t valid,
                       const float* global_max, const float* sumexp, const float* dloss,
                       const float* dlse, double softcap, void* dlogits, cudaStream_t stream) {
  require(check_vocab_ce(type, N, Vl, ld, valid), "vocab_ce_backward");
  if (N == 0) return;
  dispatch_nn(type, "vocab_ce_backward", [&](auto t) {
    using T = decltype(t);
    auto launch = [&](auto p) {
      constexpr int P = decltype(p)::value;
      vce_backward_kernel<T, P>
          <<<static_cast<unsigned>(N), row_threads<P>(Vl, kThreads), 0, stream>>>(
              static_cast<const T*>(logits), targets, targets64, Vl, ld, vocab_start, valid,
              global_max, sumexp, dloss, dlse, static_cast<float>(softcap),
              static_cast<T*>(dlogits));
    };
    if (same_alignment(logits, dlogits)) {
      launch(std::integral_constant<int, kPack<T>>{});
    } else {
      launch(std::integral_constant<int, 1>{});
    }
  });
  check_launch("vocab_ce_backward");
}

}  // namespace triad::kernels
