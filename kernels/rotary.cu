// Rotary position embedding: one thread per (token, V consecutive slots
// i..i+V of a head's D / 2). A slot below R / 2 (R the dimensions that turn:
// the head's, or scaling.rotary_dim's first ones) is a pair (i, i + R / 2):
// the thread takes its cos and sin once (f64) and turns it in all n_head +
// n_kv_head heads of q and k. A slot past it passes two of q's and k's
// other dimensions through (R + j and R + j + (D - R) / 2, j = i - R / 2).
// Either way the thread then copies elements i and i + D / 2 of v's
// n_kv_head heads. V = 16 bytes of elements where D / 2 and R / 2 are
// multiples of it and the tensors are pack-aligned, else 1; neighbouring
// threads take neighbouring slots, so a warp reads and writes runs of
// consecutive elements of each head.
#include <cmath>
#include <string>

#include "device_utils.cuh"
#include "rotary.h"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;

template <class T, int V>
__global__ void rotary_kernel(const T* x, T* y, int64_t rows, int64_t T_len, int64_t n_head,
                              int64_t n_kv_head, int64_t D, const int64_t* positions, int64_t start,
                              double theta, RopeScaling scaling, double sign) {
  using Cp = compute_t<T>;
  const int64_t half = D / 2, rotated = n_head + n_kv_head, W = (rotated + n_kv_head) * D;
  const int64_t R = scaling.turned(D), turned_half = R / 2, kept_half = half - turned_half;
  const int64_t packs = half / V, n = rows * packs;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / packs, i = (idx - r * packs) * V;
    const T* xr = x + r * W;
    T* yr = y + r * W;
    if (i < turned_half) {
      const int64_t pos = positions ? positions[r] : start + r % T_len;
      Cp c[V], s[V];
      const double amplitude = rope_amplitude(scaling);  // yarn's and longrope's; 1 otherwise
      for (int k = 0; k < V; ++k) {
        const double angle = static_cast<double>(pos) * rope_frequency(i + k, D, theta, scaling);
        c[k] = static_cast<Cp>(amplitude * cos(angle));
        s[k] = static_cast<Cp>(amplitude * sign * sin(angle));
      }
      for (int64_t h = 0; h < rotated; ++h) {
        const int64_t a = h * D + i, b = a + turned_half;
        Cp x1[V], x2[V], y1[V], y2[V];
        load_n<V>(xr, a, x1);
        load_n<V>(xr, b, x2);
        for (int k = 0; k < V; ++k) {
          y1[k] = x1[k] * c[k] - x2[k] * s[k];
          y2[k] = x2[k] * c[k] + x1[k] * s[k];
        }
        store_n<V>(yr, a, y1);
        store_n<V>(yr, b, y2);
      }
    } else {
      // q's and k's dimensions past R pass through (T -> Cp -> T exactly).
      for (int64_t h = 0; h < rotated; ++h) {
        const int64_t a = h * D + R + (i - turned_half);
        Cp v[V];
        load_n<V>(xr, a, v);
        store_n<V>(yr, a, v);
        load_n<V>(xr, a + kept_half, v);
        store_n<V>(yr, a + kept_half, v);
      }
    }
    for (int64_t h = rotated; h < rotated + n_kv_head; ++h) {  // v, copied (T -> Cp -> T exactly)
      const int64_t a = h * D + i;
      Cp v[V];
      load_n<V>(xr, a, v);
      store_n<V>(yr, a, v);
      load_n<V>(xr, a + half, v);
      store_n<V>(yr, a + half, v);
    }
  }
}

}  // namespace

Status check_rotary_embedding(int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head,
                              int64_t head_dim, double theta, int64_t start) {
  if (B < 0 || T < 0 || n_head <= 0) {
    return Status::fail("B " + std::to_string(B) + ", T " + std::to_string(T) + ", n_head " +
                        std::to_string(n_head) + ": need B, T >= 0 and n_head > 0");
  }
  if (n_kv_head <= 0 || n_head % n_kv_head != 0) {
    return Status::fail("n_kv_head " + std::to_string(n_kv_head) + " must divide n_head " +
                        std::to_string(n_head));
  }
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return Status::fail("head dimension " + std::to_string(head_dim) +
                        " must be even and positive");
  }
  if (!(theta > 0.0) || !std::isfinite(theta)) {
    return Status::fail("theta " + std::to_string(theta) + " must be a positive number");
  }
  if (start < 0) return Status::fail("start " + std::to_string(start) + " must be >= 0");
  return Status::fine();
}

void rotary_embedding(const void* qkv, void* out, ScalarType type, int64_t B, int64_t T,
                      int64_t n_head, int64_t n_kv_head, int64_t head_dim, const int64_t* positions,
                      int64_t start, double theta, const RopeScaling& scaling, bool inverse,
                      cudaStream_t stream) {
  require(check_rotary_embedding(B, T, n_head, n_kv_head, head_dim, theta, start),
          "rotary_embedding");
  const int64_t turned = scaling.turned(head_dim);
  if (turned < 2 || turned > head_dim || turned % 2 != 0) {
    require(Status::fail("rotary_dim " + std::to_string(scaling.rotary_dim) +
                         " must be an even number of the head's " + std::to_string(head_dim) +
                         " dimensions (0: all)"),
            "rotary_embedding");
  }
  const int64_t rows = B * T, half = head_dim / 2;
  if (rows * half == 0) return;
  auto run = [&](auto tag, auto v) {
    using E = decltype(tag);
    constexpr int V = decltype(v)::value;
    rotary_kernel<E, V><<<grid_for(rows * (half / V), kThreads), kThreads, 0, stream>>>(
        static_cast<const E*>(qkv), static_cast<E*>(out), rows, T, n_head, n_kv_head, head_dim,
        positions, start, theta, scaling, inverse ? -1.0 : 1.0);
  };
  if (type == ScalarType::F64) {
    run(double{}, std::integral_constant<int, 1>{});
  } else {
    dispatch_nn(type, "rotary_embedding", [&](auto tag) {
      using E = decltype(tag);
      // Every pack starts at a multiple of V elements from the row's start
      // (rows are (n_head + 2 n_kv_head) * head_dim long, heads head_dim,
      // halves D / 2, the turned halves R / 2 and the kept ones (D - R) / 2).
      if (half % kPack<E> == 0 && (turned / 2) % kPack<E> == 0 && pack_aligned(qkv) &&
          pack_aligned(out)) {
        run(tag, std::integral_constant<int, kPack<E>>{});
      } else {
        run(tag, std::integral_constant<int, 1>{});
      }
    });
  }
  check_launch("rotary_embedding");
}

}  // namespace triad::kernels
