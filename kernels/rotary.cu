// Rotary position embedding, a row (token) at a time per block. The
// block first computes the row's cos and sin for each of the R / 2 slots
// that turn (R the dimensions that turn: the head's, or
// scaling.rotary_dim's first ones), in f64 as the CPU does, once for all
// n_head + n_kv_head heads of q and k, into shared memory. Then its threads
// take the row's units: V consecutive slots i..i+V of one head's D / 2.
// In q's and k's heads a slot below R / 2 is a pair (i, i + R / 2) turned
// by that slot's cos and sin; a slot past it passes two of the head's other
// dimensions through (R + j and R + j + (D - R) / 2, j = i - R / 2). In v's
// n_kv_head heads the unit copies elements i and i + D / 2. V = 16 bytes of
// elements where D / 2 and R / 2 are multiples of it and the tensors are
// pack-aligned, else 1; neighbouring threads take neighbouring units, so a
// warp reads and writes runs of consecutive elements of the row.
//
// (One thread per slot walking every head of a row left a GPT-2-shaped
// qkv with 4 threads a row: too few loads in flight to reach the memory's
// bandwidth. Here every unit is a thread, and the trigonometry, which each
// of those threads did for its own slots, is still done once a row.)
#include <algorithm>
#include <cmath>
#include <string>

#include "device_utils.cuh"
#include "rotary.h"

namespace triad::kernels {
namespace {

template <class T, int V>
__global__ void rotary_kernel(const T* x, T* y, int64_t rows, int64_t T_len, int64_t n_head,
                              int64_t n_kv_head, int64_t D, const int64_t* positions, int64_t start,
                              double theta, RopeScaling scaling, double sign) {
  using Cp = compute_t<T>;
  extern __shared__ __align__(16) unsigned char trig_bytes[];
  const int64_t half = D / 2, rotated = n_head + n_kv_head, W = (rotated + n_kv_head) * D;
  const int64_t R = scaling.turned(D), turned_half = R / 2, kept_half = half - turned_half;
  const int64_t packs = half / V, units = (rotated + n_kv_head) * packs;
  Cp* cos_r = reinterpret_cast<Cp*>(trig_bytes);     // [turned_half]
  Cp* sin_r = cos_r + turned_half;                   // [turned_half]
  const double amplitude = rope_amplitude(scaling);  // yarn's and longrope's; 1 otherwise
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t pos = positions ? positions[r] : start + r % T_len;
    for (int64_t i = threadIdx.x; i < turned_half; i += blockDim.x) {
      const double angle = static_cast<double>(pos) * rope_frequency(i, D, theta, scaling);
      cos_r[i] = static_cast<Cp>(amplitude * cos(angle));
      sin_r[i] = static_cast<Cp>(amplitude * sign * sin(angle));
    }
    __syncthreads();
    const T* xr = x + r * W;
    T* yr = y + r * W;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
      const int64_t h = u / packs, i = (u - h * packs) * V;
      if (h < rotated && i < turned_half) {
        const int64_t a = h * D + i, b = a + turned_half;
        Cp x1[V], x2[V], y1[V], y2[V];
        load_n<V>(xr, a, x1);
        load_n<V>(xr, b, x2);
        for (int k = 0; k < V; ++k) {
          const Cp c = cos_r[i + k], s = sin_r[i + k];
          y1[k] = x1[k] * c - x2[k] * s;
          y2[k] = x2[k] * c + x1[k] * s;
        }
        store_n<V>(yr, a, y1);
        store_n<V>(yr, b, y2);
      } else {
        // q's and k's dimensions past R pass through, and v is copied (T ->
        // Cp -> T exactly): two runs of V, `apart` elements apart.
        const int64_t a = h < rotated ? h * D + R + (i - turned_half) : h * D + i;
        const int64_t apart = h < rotated ? kept_half : half;
        Cp v[V];
        load_n<V>(xr, a, v);
        store_n<V>(yr, a, v);
        load_n<V>(xr, a + apart, v);
        store_n<V>(yr, a + apart, v);
      }
    }
    __syncthreads();  // (the next row's trigonometry overwrites this row's)
  }
}

// Threads for a row's `units`: whole warps, at most 256, as few passes over
// the units as that allows and those passes evenly full.
int rotary_threads(int64_t units) {
  const int64_t passes = (units + 255) / 256;
  const int64_t per_pass = (units + passes - 1) / passes;
  return static_cast<int>(std::max<int64_t>(32, (per_pass + 31) / 32 * 32));
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
    const int threads = rotary_threads((n_head + 2 * n_kv_head) * (half / V));
    const size_t trig = 2 * static_cast<size_t>(turned / 2) * sizeof(compute_t<E>);
    rotary_kernel<E, V><<<grid_for(rows, 1), threads, trig, stream>>>(
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
