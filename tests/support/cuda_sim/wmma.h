#pragma once

// cuda_sim's WMMA (nvcuda::wmma, 16x16x16 tiles): each simulated thread's
// fragment holds the whole tile, every *_sync call is a warp barrier first
// (a warp loads before any lane stores), and a store writes only the lane's
// share of the tile, as on the GPU. The
// operand rules cuda's documentation states are checked: a 256-bit aligned
// pointer and a leading dimension that is a multiple of 16 bytes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "sim.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <class Use, int M, int N, int K>
struct Shape;
template <int M, int N, int K>
struct Shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct Shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct Shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

inline float to_float(float v) {
  return v;
}
inline float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
inline float to_float(__half v) {
  return __half2float(v);
}
template <class T>
T from_float(float v);
template <>
inline float from_float<float>(float v) {
  return v;
}
template <>
inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
inline __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

template <class T>
void check_operand(const T* p, unsigned ldm, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) {
    ::triad_sim::fail(std::string(what) + ": pointer is not 256-bit aligned");
  }
  if ((ldm * sizeof(T)) % 16 != 0) {
    ::triad_sim::fail(std::string(what) + ": ldm " + std::to_string(ldm) +
                      " is not a multiple of 16 bytes");
  }
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
 public:
  using element_type = T;
  static constexpr int rows = detail::Shape<Use, M, N, K>::rows;
  static constexpr int cols = detail::Shape<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols;
  T x[num_elements];  // row-major; the whole tile in every lane
};

template <class Use, int M, int N, int K, class T, class L, class V>
void fill_fragment(fragment<Use, M, N, K, T, L>& f, const V& v) {
  for (auto& e : f.x) e = detail::from_float<T>(static_cast<float>(v));
}

// matrix_a / matrix_b: the layout is the fragment's.
template <class Use, int M, int N, int K, class T, class L>
void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const T* p, unsigned ldm) {
  static_assert(std::is_same_v<L, row_major> || std::is_same_v<L, col_major>,
                "an operand fragment needs a layout");
  ::triad_sim::warp_barrier(0xffffffffu, "wmma::load_matrix_sync");
  detail::check_operand(p, ldm, "wmma::load_matrix_sync");
  using F = fragment<Use, M, N, K, T, L>;
  for (int r = 0; r < F::rows; ++r) {
    for (int c = 0; c < F::cols; ++c) {
      f.x[r * F::cols + c] = std::is_same_v<L, row_major> ? p[r * ldm + c] : p[c * ldm + r];
    }
  }
}
// accumulator: the layout is the call's.
template <int M, int N, int K, class T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm,
                      layout_t layout) {
  ::triad_sim::warp_barrier(0xffffffffu, "wmma::load_matrix_sync");
  detail::check_operand(p, ldm, "wmma::load_matrix_sync");
  for (int r = 0; r < M; ++r) {
    for (int c = 0; c < N; ++c) {
      f.x[r * N + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
    }
  }
}
// Each lane writes its own share of the tile (every 32nd element), as on a
// GPU, so a lane reading what other lanes stored needs a __syncwarp first.
template <int M, int N, int K, class T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm,
                       layout_t layout) {
  ::triad_sim::warp_barrier(0xffffffffu, "wmma::store_matrix_sync");
  detail::check_operand(p, ldm, "wmma::store_matrix_sync");
  for (int e = ::triad_sim::lane_id(); e < M * N; e += 32) {
    const int r = e / N, c = e % N;
    (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
  }
}

// d = a b + c with f32 accumulation (products of 16-bit values are exact).
template <int M, int N, int K, class T, class LA, class LB, class Acc>
void mma_sync(fragment<accumulator, M, N, K, Acc>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
              const fragment<matrix_b, M, N, K, T, LB>& b,
              const fragment<accumulator, M, N, K, Acc>& c) {
  ::triad_sim::warp_barrier(0xffffffffu, "wmma::mma_sync");
  // Every lane holds the whole tile, so the lanes of a warp (whose operands
  // are the same bytes) would each compute the same product: the last call's
  // operands and result are kept, and a call on the same bytes takes them.
  using A = fragment<matrix_a, M, N, K, T, LA>;
  using B = fragment<matrix_b, M, N, K, T, LB>;
  using C = fragment<accumulator, M, N, K, Acc>;
  struct Last {
    bool valid = false;
    A a;
    B b;
    C c, d;
  };
  static thread_local Last last;
  if (last.valid && std::memcmp(&last.a, &a, sizeof(A)) == 0 &&
      std::memcmp(&last.b, &b, sizeof(B)) == 0 && std::memcmp(&last.c, &c, sizeof(C)) == 0) {
    d = last.d;
    return;
  }
  last.valid = false;
  std::memcpy(&last.a, &a, sizeof(A));
  std::memcpy(&last.b, &b, sizeof(B));
  std::memcpy(&last.c, &c, sizeof(C));
  float fa[M * K], fb[K * N], acc[M * N];
  for (int i = 0; i < M * K; ++i) fa[i] = detail::to_float(a.x[i]);
  for (int i = 0; i < K * N; ++i) fb[i] = detail::to_float(b.x[i]);
  for (int i = 0; i < M * N; ++i) acc[i] = detail::to_float(c.x[i]);
  for (int i = 0; i < M; ++i) {
    for (int k = 0; k < K; ++k) {
      const float av = fa[i * K + k];
      for (int j = 0; j < N; ++j) acc[i * N + j] += av * fb[k * N + j];
    }
  }
  Acc out[M * N];
  for (int i = 0; i < M * N; ++i) out[i] = detail::from_float<Acc>(acc[i]);
  for (int i = 0; i < M * N; ++i) d.x[i] = out[i];
  std::memcpy(&last.d, &d, sizeof(C));
  last.valid = true;
}

}  // namespace nvcuda::wmma
