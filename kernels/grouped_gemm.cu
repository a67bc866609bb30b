// Grouped products with the groups' sizes on the device (grouped_gemm.h).
// One tile routine serves the three products a dropless mixture's experts
// need: the forward (a @ b[g]^T), the input gradient (a @ b[g]) and the
// weights' gradients (a_g^T @ b_g, summed over the group's rows). It reads
// its operands through strides, so each keeps the layout it has in memory.
#include <mma.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

#include "device_utils.cuh"
#include "grouped_gemm.h"

namespace triad::kernels {
namespace {

using namespace nvcuda;

constexpr int kThreads = 256;

template <class T>
constexpr bool kHalf = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

// The tile sizes: 128 x 128 x 32 on tensor cores, 64 x 64 x 16 as SIMT.
template <class T>
struct Tile {
  static constexpr int M = kHalf<T> ? 128 : 64;
  static constexpr int N = kHalf<T> ? 128 : 64;
  static constexpr int K = kHalf<T> ? 32 : 16;
};

// A block's shared memory: on tensor cores the tiles of A (BM x BK) and B
// (BK x BN), each laid out as it lies in memory (rows along the side that
// is not contiguous there, so that a tile is copied without transposing,
// 16 bytes at a time where it can be), rows padded by 8 elements (a
// leading dimension of a multiple of 16 bytes, each fragment 32-byte
// aligned), and each warp's 16 x 16 f32 staging tile; as SIMT A's tile
// transposed (BK x BM, a column of padding) and B's.
template <class T>
struct alignas(128) HalfTiles {
  static constexpr int BM = Tile<T>::M, BN = Tile<T>::N, BK = Tile<T>::K;
  // Leading dimensions: A as (m, k) rows or (k, m) rows, B as (k, n) or
  // (n, k) rows.
  static constexpr int lda_mk = BK + 8, lda_km = BM + 8, ldb_kn = BN + 8, ldb_nk = BK + 8;
  static constexpr int a_size = BM * lda_mk > BK* lda_km ? BM* lda_mk : BK* lda_km;
  static constexpr int b_size = BK * ldb_kn > BN* ldb_nk ? BK* ldb_kn : BN* ldb_nk;
  T a[a_size];
  T b[b_size];
  float stage[kThreads / 32][16 * 16];
};
template <class T>
struct SimtTiles {
  T a[Tile<T>::K][Tile<T>::M + 1];
  T b[Tile<T>::K][Tile<T>::N];
};

// The matrices of up to kGroupedGemmMaxGroups groups, by value.
template <class P>
struct Pointers {
  P p[kGroupedGemmMaxGroups];
};

// A tile's operand: element (i, j) at base[i * si + j * sj], present where
// i < ni and j < nj (zero elsewhere).
template <class T>
struct Operand {
  const T* base;
  int64_t si, sj, ni, nj;
};

// Loads the (R x C) tile of `op` at (r0, c0) into shared memory as
// dst[r * ld + c], walking memory along its contiguous side: along c when
// C_CONTIGUOUS (op.sj == 1), else along r.
template <int R, int C, bool C_CONTIGUOUS, class T>
__device__ __forceinline__ void load_tile(const Operand<T>& op, int64_t r0, int64_t c0, T* dst,
                                          int ld) {
  for (int i = threadIdx.x; i < R * C; i += kThreads) {
    const int r = C_CONTIGUOUS ? i / C : i % R, c = C_CONTIGUOUS ? i % C : i / R;
    const int64_t gr = r0 + r, gc = c0 + c;
    if (gr < op.ni && gc < op.nj) {
      dst[r * ld + c] = op.base[gr * op.si + gc * op.sj];
    } else {
      store(dst, r * ld + c, compute_t<T>(0));
    }
  }
}

// Copies the (R x C) tile at (r0, c0) of a matrix whose element (r, c) is
// base[r * stride + c] (c its contiguous side), present where r < r_lim
// and c < c_lim (zero elsewhere), into shared memory as dst[r * ld + c]:
// 16 bytes a thread at a time where the base, the stride and c_lim keep
// every 8 elements together and aligned (a pack is then wholly inside or
// outside, C and c0 being multiples of 8), else element by element.
template <class T>
__device__ __forceinline__ bool packable(const T* base, int64_t stride, int64_t c_lim) {
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && stride % 8 == 0 && c_lim % 8 == 0;
}

// load_rows' packed copy in two halves, so that a tile's loads are in
// flight while the block multiplies the one before: each thread's
// R * C / 8 / kThreads packs into registers, then into shared memory.
template <int R, int C>
constexpr int kPacksPerThread = R* C / 8 / kThreads;
template <int R, int C, class T>
__device__ __forceinline__ void fetch_rows(const T* base, int64_t stride, int64_t r0, int64_t c0,
                                           int64_t r_lim, int64_t c_lim,
                                           uint4 (&regs)[kPacksPerThread<R, C>]) {
  static_assert(R * C % (8 * kThreads) == 0, "whole packs a thread");
#pragma unroll
  for (int v = 0; v < kPacksPerThread<R, C>; ++v) {
    const int i = threadIdx.x + v * kThreads, r = i / (C / 8), c = (i % (C / 8)) * 8;
    const int64_t gr = r0 + r, gc = c0 + c;
    regs[v] = make_uint4(0, 0, 0, 0);
    if (gr < r_lim && gc < c_lim)
      regs[v] = *reinterpret_cast<const uint4*>(base + gr * stride + gc);
  }
}
template <int R, int C, class T>
__device__ __forceinline__ void put_rows(const uint4 (&regs)[kPacksPerThread<R, C>], T* dst,
                                         int ld) {
#pragma unroll
  for (int v = 0; v < kPacksPerThread<R, C>; ++v) {
    const int i = threadIdx.x + v * kThreads, r = i / (C / 8), c = (i % (C / 8)) * 8;
    *reinterpret_cast<uint4*>(dst + r * ld + c) = regs[v];
  }
}

template <int R, int C, class T>
__device__ __forceinline__ void load_rows(const T* base, int64_t stride, int64_t r0, int64_t c0,
                                          int64_t r_lim, int64_t c_lim, T* dst, int ld) {
  static_assert(C % 8 == 0, "whole packs a row");
  if (packable(base, stride, c_lim)) {
    for (int i = threadIdx.x; i < R * C / 8; i += kThreads) {
      const int r = i / (C / 8), c = (i % (C / 8)) * 8;
      const int64_t gr = r0 + r, gc = c0 + c;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (gr < r_lim && gc < c_lim) v = *reinterpret_cast<const uint4*>(base + gr * stride + gc);
      *reinterpret_cast<uint4*>(dst + r * ld + c) = v;
    }
    return;
  }
  for (int i = threadIdx.x; i < R * C; i += kThreads) {
    const int r = i / C, c = i % C;
    const int64_t gr = r0 + r, gc = c0 + c;
    if (gr < r_lim && gc < c_lim) {
      dst[r * ld + c] = base[gr * stride + gc];
    } else {
      store(dst, r * ld + c, compute_t<T>(0));
    }
  }
}

// acc + beta * out into out[i * ldc + j] for the tile's (i, j) inside
// (ni, nj), in out's type.
template <class TC, class V>
__device__ __forceinline__ void put(TC* out, int64_t ldc, int64_t i, int64_t j, V acc,
                                    double beta) {
  using A = compute_t<TC>;
  A v = static_cast<A>(acc);
  if (beta != 0.0) v += static_cast<A>(beta) * load(out, i * ldc + j);
  store(out, i * ldc + j, v);
}

// out (ni x nj of the tile, row stride ldc) = A (ni x K) @ B (K x nj)
// (+ beta * out), by the whole block. A is k-contiguous or not (A_K), B
// n-contiguous or not (B_N).
template <bool A_K, bool B_N, class T, class TC>
__device__ void tile_product(const Operand<T>& a, const Operand<T>& b, int64_t K, TC* out,
                             int64_t ldc, int64_t ni, int64_t nj, double beta) {
  constexpr int BM = Tile<T>::M, BN = Tile<T>::N, BK = Tile<T>::K;
  if constexpr (kHalf<T>) {
    // 8 warps, 2 x 4, each 64 x 32 of the tile: 4 x 2 accumulators.
    using Smem = HalfTiles<T>;
    __shared__ Smem smem[1];
    // Each tile kept as it lies: A by (m, k) rows when k is contiguous,
    // else (k, m) rows, read as a column-major fragment; B likewise.
    constexpr int lda = A_K ? Smem::lda_mk : Smem::lda_km;
    constexpr int ldb = B_N ? Smem::ldb_kn : Smem::ldb_nk;
    using LayoutA = std::conditional_t<A_K, wmma::row_major, wmma::col_major>;
    using LayoutB = std::conditional_t<B_N, wmma::row_major, wmma::col_major>;
    T* as = smem[0].a;
    T* bs = smem[0].b;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    // One tile of A and B in shared memory into the accumulators.
    const auto multiply = [&] {
#pragma unroll
      for (int kk = 0; kk < BK; kk += 16) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> fb[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int n = wn + j * 16;
          wmma::load_matrix_sync(fb[j], B_N ? bs + kk * ldb + n : bs + n * ldb + kk, ldb);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> fa;
          const int m = wm + i * 16;
          wmma::load_matrix_sync(fa, A_K ? as + m * lda + kk : as + kk * lda + m, lda);
#pragma unroll
          for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa, fb[j], acc[i][j]);
        }
      }
    };
    // A's (i, j) = (m, k) at base[m si + k sj], one of si and sj 1: its
    // tile kept as (m, k) rows (A_K) or (k, m) rows; B's (k, n) likewise.
    // So each tile is (R x C) rows of (stride, first row, first column,
    // rows, columns) in memory.
    constexpr int AR = A_K ? BM : BK, AC = A_K ? BK : BM;
    constexpr int BR = B_N ? BK : BN, BC = B_N ? BN : BK;
    const int64_t a_stride = A_K ? a.si : a.sj, a_rows = A_K ? a.ni : a.nj,
                  a_cols = A_K ? a.nj : a.ni;
    const int64_t b_stride = B_N ? b.si : b.sj, b_rows = B_N ? b.ni : b.nj,
                  b_cols = B_N ? b.nj : b.ni;
    // The k-th tile's first row and column of each (k moves A's columns
    // under A_K, else its rows; B's rows under B_N, else its columns).
    const auto a_at = [&](int64_t k0) {
      return A_K ? std::pair{int64_t{0}, k0} : std::pair{k0, int64_t{0}};
    };
    const auto b_at = [&](int64_t k0) {
      return B_N ? std::pair{k0, int64_t{0}} : std::pair{int64_t{0}, k0};
    };
    if (packable(a.base, a_stride, a_cols) && packable(b.base, b_stride, b_cols)) {
      // The next tile's loads in flight while this one is multiplied
      // (registers, then shared memory after the block has read it).
      uint4 ra[kPacksPerThread<AR, AC>], rb[kPacksPerThread<BR, BC>];
      const auto fetch = [&](int64_t k0) {
        fetch_rows<AR, AC>(a.base, a_stride, a_at(k0).first, a_at(k0).second, a_rows, a_cols, ra);
        fetch_rows<BR, BC>(b.base, b_stride, b_at(k0).first, b_at(k0).second, b_rows, b_cols, rb);
      };
      fetch(0);
      for (int64_t k0 = 0; k0 < K; k0 += BK) {
        put_rows<AR, AC>(ra, as, lda);
        put_rows<BR, BC>(rb, bs, ldb);
        __syncthreads();
        if (k0 + BK < K) fetch(k0 + BK);
        multiply();
        __syncthreads();
      }
    } else {
      for (int64_t k0 = 0; k0 < K; k0 += BK) {
        load_rows<AR, AC>(a.base, a_stride, a_at(k0).first, a_at(k0).second, a_rows, a_cols, as,
                          lda);
        load_rows<BR, BC>(b.base, b_stride, b_at(k0).first, b_at(k0).second, b_rows, b_cols, bs,
                          ldb);
        __syncthreads();
        multiply();
        __syncthreads();
      }
    }
    // Each accumulator through the warp's staging tile, then out.
    float* mine = smem[0].stage[warp];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int64_t r0 = wm + i * 16, c0 = wn + j * 16;
        if (r0 >= ni || c0 >= nj) continue;  // (warp-uniform)
        wmma::store_matrix_sync(mine, acc[i][j], 16, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
          const int64_t r = r0 + e / 16, c = c0 + e % 16;
          if (r < ni && c < nj) put(out, ldc, r, c, mine[e], beta);
        }
        __syncwarp();
      }
    }
  } else {
    // 16 x 16 threads, each 4 x 4 of the tile, in T.
    using Smem = SimtTiles<T>;
    __shared__ Smem smem[1];
    auto& as = smem[0].a;
    auto& bs = smem[0].b;
    const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
    T acc[4][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
      // A's tile transposed into as[k][m]: load (k, m) of A^T, whose rows
      // are A's columns.
      const Operand<T> at{a.base, a.sj, a.si, a.nj, a.ni};
      load_tile<BK, BM, !A_K>(at, k0, 0, &as[0][0], BM + 1);
      load_tile<BK, BN, B_N>(b, k0, 0, &bs[0][0], BN);
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        T x[4], y[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) x[i] = as[kk][tr * 4 + i];
#pragma unroll
        for (int j = 0; j < 4; ++j) y[j] = bs[kk][tc * 4 + j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] += x[i] * y[j];
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t r = tr * 4 + i, c = tc * 4 + j;
        if (r < ni && c < nj) put(out, ldc, r, c, acc[i][j], beta);
      }
    }
  }
}

// offsets[g] clamped into [0, M], and a group's end at least its start.
__device__ __forceinline__ int64_t clamped(const int64_t* offsets, int g, int64_t M) {
  return min(max(offsets[g], int64_t{0}), M);
}

// Which group's tile block x of the row tiles holds: group g's
// ceil(n_g / BM) tiles one after another, then (with `tail`) the rows past
// the last group's. Writes (group, first row, rows) to `where` (group -1:
// the tail; -2: no tile) for the whole block.
template <int BM>
__device__ void find_tile(const int64_t* offsets, int G, int64_t M, bool tail, int64_t* where) {
  static_assert(kGroupedGemmMaxGroups <= kThreads, "a thread a group");
  __shared__ int64_t tiles[kThreads];
  const int t = threadIdx.x;
  const int64_t x = blockIdx.x;
  // Each thread counts its group's tiles; an inclusive scan places them.
  int64_t first = 0, n = 0;
  if (t < G) {
    first = clamped(offsets, t, M);
    n = max(clamped(offsets, t + 1, M) - first, int64_t{0});
  }
  tiles[t] = (n + BM - 1) / BM;
  if (t == 0) where[0] = -2;
  __syncthreads();
  for (int step = 1; step < kThreads; step *= 2) {
    const int64_t add = t >= step ? tiles[t - step] : 0;
    __syncthreads();
    tiles[t] += add;
    __syncthreads();
  }
  const int64_t before = t > 0 ? tiles[t - 1] : 0;
  if (x >= before && x < tiles[t]) {
    const int64_t row = first + (x - before) * BM;
    where[0] = t < G ? t : -1;
    where[1] = row;
    where[2] = min(int64_t{BM}, first + n - row);
  }
  // The tail's tiles after every group's.
  const int64_t total = tiles[kThreads - 1];
  if (t == 0 && tail && x >= total) {
    const int64_t end = clamped(offsets, G, M), row = end + (x - total) * BM;
    if (row < M) {
      where[0] = -1;
      where[1] = row;
      where[2] = min(int64_t{BM}, M - row);
    }
  }
  __syncthreads();
}

template <class T, bool TRANS_B>
__global__ void __launch_bounds__(kThreads)
    grouped_rows_kernel(const T* a, Pointers<const T*> b, const int64_t* offsets, int G, bool tail,
                        int64_t M, int64_t K, int64_t N, T* c) {
  __shared__ int64_t where[3];
  find_tile<Tile<T>::M>(offsets, G, M, tail, where);
  const int64_t g = where[0];
  if (g == -2) return;  // (the whole block)
  const int64_t row = where[1], rows = where[2], col = int64_t(blockIdx.y) * Tile<T>::N;
  const int64_t cols = min(int64_t{Tile<T>::N}, N - col);
  T* out = c + row * N + col;
  if (g == -1) {
    for (int i = threadIdx.x; i < rows * cols; i += kThreads)
      store(out, (i / cols) * N + i % cols, compute_t<T>(0));
    return;
  }
  const Operand<T> ao{a + row * K, K, 1, rows, K};
  // op(b)'s (k, n): b (N, K) transposed, or b (K, N) as it is.
  const T* bg = b.p[g];
  const Operand<T> bo =
      TRANS_B ? Operand<T>{bg + col * K, 1, K, K, cols} : Operand<T>{bg + col, N, 1, K, cols};
  tile_product<true, !TRANS_B>(ao, bo, K, out, N, rows, cols, 0.0);
}

template <class T, class TC>
__global__ void __launch_bounds__(kThreads)
    grouped_sums_kernel(const T* a, const T* b, const int64_t* offsets, Pointers<TC*> c, int64_t M,
                        int64_t K, int64_t N, double beta) {
  const int g = blockIdx.z;
  const int64_t start = clamped(offsets, g, M);
  const int64_t rows = max(clamped(offsets, g + 1, M) - start, int64_t{0});
  const int64_t i0 = int64_t(blockIdx.y) * Tile<T>::M, j0 = int64_t(blockIdx.x) * Tile<T>::N;
  const int64_t ni = min(int64_t{Tile<T>::M}, K - i0), nj = min(int64_t{Tile<T>::N}, N - j0);
  // A = a_g^T: (i, r) at a[(start + r) K + i]; B = b_g: (r, j).
  const Operand<T> ao{a + start * K + i0, 1, K, ni, rows};
  const Operand<T> bo{b + start * N + j0, N, 1, rows, nj};
  tile_product<false, true>(ao, bo, rows, c.p[g] + i0 * N + j0, N, ni, nj, beta);
}

template <class T>
void rows_of(const GroupedGemmShape& s, const void* a, const void* const* b, const int64_t* offsets,
             bool trans_b, void* c, cudaStream_t stream) {
  const int64_t M = s.rows, N = s.cols, K = s.inner;
  if (M == 0 || N == 0) return;
  for (int64_t g0 = 0; g0 < s.groups; g0 += kGroupedGemmMaxGroups) {
    const int G = static_cast<int>(std::min(kGroupedGemmMaxGroups, s.groups - g0));
    const bool tail = g0 + G == s.groups;
    Pointers<const T*> p{};
    for (int g = 0; g < G; ++g) p.p[g] = static_cast<const T*>(b[g0 + g]);
    // At most ceil(M / BM) tiles, plus one more for each group's ragged
    // end and the tail's.
    const int64_t tiles = (M + Tile<T>::M - 1) / Tile<T>::M + G + 1;
    const dim3 grid(static_cast<unsigned>(tiles),
                    static_cast<unsigned>((N + Tile<T>::N - 1) / Tile<T>::N));
    auto run = [&](auto trans) {
      grouped_rows_kernel<T, decltype(trans)::value><<<grid, kThreads, 0, stream>>>(
          static_cast<const T*>(a), p, offsets + g0, G, tail, M, K, N, static_cast<T*>(c));
    };
    if (trans_b) {
      run(std::true_type{});
    } else {
      run(std::false_type{});
    }
  }
}

template <class T, class TC>
void sums_of(const GroupedGemmShape& s, const void* a, const void* b, const int64_t* offsets,
             void* const* c, double beta, cudaStream_t stream) {
  const int64_t M = s.rows, N = s.cols, K = s.inner;
  if (K == 0 || N == 0) return;
  for (int64_t g0 = 0; g0 < s.groups; g0 += kGroupedGemmMaxGroups) {
    const int G = static_cast<int>(std::min(kGroupedGemmMaxGroups, s.groups - g0));
    Pointers<TC*> p{};
    for (int g = 0; g < G; ++g) p.p[g] = static_cast<TC*>(c[g0 + g]);
    const dim3 grid(static_cast<unsigned>((N + Tile<T>::N - 1) / Tile<T>::N),
                    static_cast<unsigned>((K + Tile<T>::M - 1) / Tile<T>::M),
                    static_cast<unsigned>(G));
    grouped_sums_kernel<T, TC><<<grid, kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), offsets + g0, p, M, K, N, beta);
  }
}

bool grouped_type(ScalarType t) {
  return t == ScalarType::F32 || t == ScalarType::F64 || is_half(t);
}

}  // namespace

Status check_grouped_gemm(ScalarType type, ScalarType out_type, const GroupedGemmShape& s) {
  if (!grouped_type(type) ||
      !(out_type == type || (is_half(type) && out_type == ScalarType::F32))) {
    return Status::fail(std::string("operands ") + scalar_name(type) + " and output " +
                        scalar_name(out_type) +
                        " (expected f32, f64, bf16 or f16 operands and an output of their type, "
                        "or f32 under bf16/f16)");
  }
  if (s.rows < 0 || s.cols < 0 || s.inner < 0 || s.groups < 1) {
    return Status::fail("rows " + std::to_string(s.rows) + ", cols " + std::to_string(s.cols) +
                        ", inner " + std::to_string(s.inner) + ", groups " +
                        std::to_string(s.groups) + " (expected sizes >= 0 and groups >= 1)");
  }
  return Status::fine();
}

void grouped_gemm_rows(ScalarType type, const GroupedGemmShape& s, const void* a,
                       const void* const* b, const int64_t* offsets, bool trans_b, void* c,
                       cudaStream_t stream) {
  require(check_grouped_gemm(type, type, s), "grouped_gemm_rows");
  switch (type) {
    case ScalarType::F32:
      rows_of<float>(s, a, b, offsets, trans_b, c, stream);
      break;
    case ScalarType::F64:
      rows_of<double>(s, a, b, offsets, trans_b, c, stream);
      break;
    case ScalarType::BF16:
      rows_of<__nv_bfloat16>(s, a, b, offsets, trans_b, c, stream);
      break;
    default:
      rows_of<__half>(s, a, b, offsets, trans_b, c, stream);
      break;
  }
  check_launch("grouped_gemm_rows");
}

void grouped_gemm_sums(ScalarType type, ScalarType out_type, const GroupedGemmShape& s,
                       const void* a, const void* b, const int64_t* offsets, void* const* c,
                       double beta, cudaStream_t stream) {
  require(check_grouped_gemm(type, out_type, s), "grouped_gemm_sums");
  const bool wide = out_type != type;
  switch (type) {
    case ScalarType::F32:
      sums_of<float, float>(s, a, b, offsets, c, beta, stream);
      break;
    case ScalarType::F64:
      sums_of<double, double>(s, a, b, offsets, c, beta, stream);
      break;
    case ScalarType::BF16:
      if (wide) {
        sums_of<__nv_bfloat16, float>(s, a, b, offsets, c, beta, stream);
      } else {
        sums_of<__nv_bfloat16, __nv_bfloat16>(s, a, b, offsets, c, beta, stream);
      }
      break;
    default:
      if (wide) {
        sums_of<__half, float>(s, a, b, offsets, c, beta, stream);
      } else {
        sums_of<__half, __half>(s, a, b, offsets, c, beta, stream);
      }
      break;
  }
  check_launch("grouped_gemm_sums");
}

}  // namespace triad::kernels
