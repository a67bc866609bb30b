// AdamW: one grid-stride pass; the scalar factors are formed once on the host
// exactly as the CPU backend forms them.
#include <cfloat>
#include <cmath>
#include <type_traits>

#include "adamw.h"
#include "device_utils.cuh"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;

// v as a T would store it, back in f32.
template <class T>
__device__ __forceinline__ float round_to(float v) {
  T r;
  store(&r, 0, v);
  return static_cast<float>(load(&r, 0));
}

// T: the parameter's and gradient's type; M: the moments' (T, or bf16
// beside an f32 parameter).
template <class T, class M>
__global__ void adamw_kernel(T* p, const T* g, M* m, M* v, int64_t n, float decay, float b1,
                             float b2, float step_size, float bc2_sqrt, float eps, float gscale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    // Rounded to T as a separate scale of the gradient would store it (and
    // never fused into the next multiply-add).
    const float gi = round_to<T>(__fmul_rn(gscale, load(g, i)));
    float pi = load(p, i) * decay;
    float mi = load(m, i);
    mi += (gi - mi) * (1.0f - b1);
    const float vi = load(v, i) * b2 + (1.0f - b2) * gi * gi;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    pi -= step_size * (mi / denom);
    store(p, i, pi);
    store(m, i, mi);
    store(v, i, vi);
  }
}

// A launch is every chunk of up to kAdamWTensorsPerLaunch tensors, a block
// of kMultiThreads per chunk of kMultiChunk elements; a chunk of a tensor
// whose pointers are all 16-byte aligned is walked in packs of 4 (16 bytes
// of each f32 array per access), with enough bytes in flight to keep the
// device's memory busy. A launch's blocks are capped only by the grid's
// limit (and the chunk table's int32 entries).
constexpr int kMultiThreads = 512;
constexpr int64_t kMultiChunk = 32768;
constexpr int kMultiPack = 4;
constexpr int64_t kMultiMaxBlocks = INT32_MAX;

// Which slot and chunk of it block b runs: slot s takes the launch's blocks
// [first_block[s], first_block[s + 1]), from its tensor's chunk
// first_chunk[s] on. A binary search over the (at most 48) slots.
struct ChunkTable {
  int32_t count;
  int32_t first_block[kAdamWTensorsPerLaunch + 1];
  int32_t first_chunk[kAdamWTensorsPerLaunch];
};

struct BlockChunk {
  int slot;
  int64_t begin;  // the chunk's first element
};

__device__ __forceinline__ BlockChunk block_chunk(const ChunkTable& table) {
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  int lo = 0, hi = table.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.first_block[mid] <= b) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t chunk = int64_t(table.first_chunk[lo]) + (b - table.first_block[lo]);
  return {lo, chunk * kMultiChunk};
}

ChunkTable chunk_table(const AdamWLaunch& l) {
  ChunkTable t{};
  t.count = static_cast<int32_t>(l.slots.size());
  int64_t block = 0;
  for (size_t s = 0; s < l.slots.size(); ++s) {
    t.first_block[s] = static_cast<int32_t>(block);
    t.first_chunk[s] = static_cast<int32_t>(l.slots[s].first_chunk);
    block += l.slots[s].chunks;
  }
  t.first_block[l.slots.size()] = static_cast<int32_t>(block);
  return t;
}

// Everything one launch needs, passed by value as the kernel's argument.
struct MultiArgs {
  void* param[kAdamWTensorsPerLaunch];
  const void* grad[kAdamWTensorsPerLaunch];
  void* m[kAdamWTensorsPerLaunch];
  void* v[kAdamWTensorsPerLaunch];
  float* master[kAdamWTensorsPerLaunch];
  int64_t n[kAdamWTensorsPerLaunch];
  float decay[kAdamWTensorsPerLaunch];
  float gscale[kAdamWTensorsPerLaunch];
  ChunkTable table;
  bool packed[kAdamWTensorsPerLaunch];
};
// Within the 4 KiB a kernel's arguments may take on every toolkit.
static_assert(sizeof(MultiArgs) + 5 * sizeof(float) <= 4096, "AdamW launch arguments too large");

// Calls body(i, pack) over [begin, end) of a chunk: whole packs of V at i
// (pack true), then the elements past the last whole pack one at a time.
template <int V, class F>
__device__ __forceinline__ void for_each_in_chunk(int64_t begin, int64_t end, F&& body) {
  const int64_t whole = begin + (end - begin) / V * V;
  for (int64_t i = begin + threadIdx.x * int64_t(V); i < whole; i += int64_t(blockDim.x) * V) {
    body(i, std::true_type{});
  }
  if constexpr (V > 1) {
    for (int64_t i = whole + threadIdx.x; i < end; i += blockDim.x) body(i, std::false_type{});
  }
}

// P: the parameters' type; G: the gradients' (f32, or P's own beside
// masters); M: the moments' (f32 or bf16).
template <int V, class P, class G, class M, bool kMaster>
__device__ __forceinline__ void adamw_chunk(const MultiArgs& a, int t, int64_t begin, int64_t end,
                                            float b1, float b2, float step_size, float bc2_sqrt,
                                            float eps, float gscale) {
  P* p = static_cast<P*>(a.param[t]);
  const G* g = static_cast<const G*>(a.grad[t]);
  M* m = static_cast<M*>(a.m[t]);
  M* v = static_cast<M*>(a.v[t]);
  float* w = a.master[t];
  const float decay = a.decay[t];
  for_each_in_chunk<V>(begin, end, [&](int64_t i, auto pack) {
    float gi[V], pi[V], mi[V], vi[V];
    load_body<V>(g, i, gi, pack);
    if constexpr (kMaster) {
      load_body<V>(w, i, pi, pack);
    } else {
      load_body<V>(p, i, pi, pack);
    }
    load_body<V>(m, i, mi, pack);
    load_body<V>(v, i, vi, pack);
    for (int k = 0; k < body_count<V>(pack); ++k) {
      // As a scale of the gradients would store them, in their own type.
      const float gk = round_to<G>(__fmul_rn(gscale, gi[k]));
      pi[k] *= decay;
      mi[k] += (gk - mi[k]) * (1.0f - b1);
      vi[k] = vi[k] * b2 + (1.0f - b2) * gk * gk;
      const float denom = sqrtf(vi[k]) / bc2_sqrt + eps;
      pi[k] -= step_size * (mi[k] / denom);
    }
    if constexpr (kMaster) store_body<V>(w, i, pi, pack);
    store_body<V>(p, i, pi, pack);
    store_body<V>(m, i, mi, pack);
    store_body<V>(v, i, vi, pack);
  });
}

template <class P, class G, class M, bool kMaster>
__global__ void __launch_bounds__(kMultiThreads)
    adamw_multi_kernel(MultiArgs a, float b1, float b2, float step_size, float bc2_sqrt, float eps,
                       const double* clip_sum_sq, double clip_max_norm) {
  const BlockChunk c = block_chunk(a.table);
  const int t = c.slot;
  const int64_t begin = c.begin, end = min(a.n[t], begin + kMultiChunk);
  float gscale = a.gscale[t];
  if (clip_sum_sq) {
    // Clipping's coefficient as the host computes it from the same sum (the
    // same correctly rounded square root and division: the same bits).
    const double sum = *clip_sum_sq;
    if (!(fabs(sum) <= DBL_MAX)) return;  // not finite: no update
    const double coef = fmin(1.0, clip_max_norm / (sqrt(sum) + 1e-6));
    gscale = static_cast<float>(static_cast<double>(gscale) * coef);
  }
  if (a.packed[t]) {
    adamw_chunk<kMultiPack, P, G, M, kMaster>(a, t, begin, end, b1, b2, step_size, bc2_sqrt, eps,
                                              gscale);
  } else {
    adamw_chunk<1, P, G, M, kMaster>(a, t, begin, end, b1, b2, step_size, bc2_sqrt, eps, gscale);
  }
}

// The moments' types a launch may hold: f32, or bf16 (every parameter type).
template <class F>
void with_moment_type(ScalarType moment_type, F&& f) {
  if (moment_type == ScalarType::BF16) {
    f(__nv_bfloat16{});
  } else {
    f(float{});
  }
}

// A half parameter's gradients: f32, or its own type P.
template <class P, class F>
void with_grad_type(ScalarType grad_type, F&& f) {
  if (grad_type == ScalarType::F32) {
    f(float{});
  } else {
    f(P{});
  }
}

}  // namespace

Status check_adamw_multi(const AdamWTypes& types, const std::vector<AdamWTensor>& tensors,
                         const AdamWArgs& a) {
  const ScalarType param_type = types.param, moment_type = types.moment;
  const Status base = check_adamw(param_type, 0, a);
  if (!base.ok) return base;
  if (types.grad != ScalarType::F32 &&
      (types.grad != param_type || param_type == ScalarType::F32)) {
    return Status::fail(std::string("gradient type ") + scalar_name(types.grad) + " beside " +
                        scalar_name(param_type) +
                        " parameters is not supported (f32, or a half parameter's own type)");
  }
  if (moment_type != ScalarType::F32 && moment_type != ScalarType::BF16) {
    return Status::fail(std::string("moment type ") + scalar_name(moment_type) +
                        " is not supported (f32 or bf16)");
  }
  const bool half = param_type != ScalarType::F32;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWTensor& t = tensors[i];
    if (t.n < 0 || (t.n > 0 && (!t.param || !t.grad || !t.m || !t.v))) {
      return Status::fail("tensor " + std::to_string(i) + ": a null pointer or negative size");
    }
    if (half != (t.master != nullptr)) {
      return Status::fail("tensor " + std::to_string(i) +
                          (half ? ": a bf16/f16 parameter needs f32 master weights"
                                : ": an f32 parameter takes no master weights"));
    }
    if (t.n > int64_t(kMultiChunk) * INT32_MAX) {
      return Status::fail("tensor " + std::to_string(i) + " has too many elements");
    }
  }
  return Status::fine();
}

void adamw_multi(const AdamWTypes& types, const std::vector<AdamWTensor>& tensors,
                 const AdamWArgs& a, cudaStream_t stream) {
  require(check_adamw_multi(types, tensors, a), "adamw_multi");
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
  const float step_size = static_cast<float>(a.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float b1 = static_cast<float>(a.beta1), b2 = static_cast<float>(a.beta2);
  const float eps = static_cast<float>(a.eps);
  auto launch = [&](const MultiArgs& args, int blocks) {
    with_moment_type(types.moment, [&](auto moment) {
      using M = decltype(moment);
      auto half = [&](auto param) {
        using P = decltype(param);
        with_grad_type<P>(types.grad, [&](auto grad) {
          adamw_multi_kernel<P, decltype(grad), M, true><<<blocks, kMultiThreads, 0, stream>>>(
              args, b1, b2, step_size, bc2_sqrt, eps, a.clip_sum_sq, a.clip_max_norm);
        });
      };
      switch (types.param) {
        case ScalarType::BF16:
          half(__nv_bfloat16{});
          break;
        case ScalarType::F16:
          half(__half{});
          break;
        default:
          adamw_multi_kernel<float, float, M, false><<<blocks, kMultiThreads, 0, stream>>>(
              args, b1, b2, step_size, bc2_sqrt, eps, a.clip_sum_sq, a.clip_max_norm);
      }
    });
    check_launch("adamw_multi");
  };
  std::vector<int64_t> sizes;
  for (const AdamWTensor& t : tensors) sizes.push_back(t.n);
  for (const AdamWLaunch& l :
       plan_adamw_multi(sizes, kAdamWTensorsPerLaunch, kMultiMaxBlocks, kMultiChunk)) {
    MultiArgs args{};
    for (size_t s = 0; s < l.slots.size(); ++s) {
      const AdamWTensor& t = tensors[static_cast<size_t>(l.slots[s].tensor)];
      args.param[s] = t.param, args.grad[s] = t.grad, args.m[s] = t.m, args.v[s] = t.v;
      args.master[s] = t.master, args.n[s] = t.n;
      args.packed[s] = pack_aligned(t.param) && pack_aligned(t.grad) && pack_aligned(t.m) &&
                       pack_aligned(t.v) && pack_aligned(t.master);
      args.decay[s] = static_cast<float>(1.0 - a.lr * t.weight_decay);
      args.gscale[s] = static_cast<float>(t.grad_scale);
    }
    args.table = chunk_table(l);
    launch(args, static_cast<int>(l.blocks));
  }
}

// ---- the global norm --------------------------------------------------------
namespace {

struct SumSquaresArgs {
  const void* x[kAdamWTensorsPerLaunch];
  int64_t n[kAdamWTensorsPerLaunch];
  ChunkTable table;
  bool packed[kAdamWTensorsPerLaunch];
};
static_assert(sizeof(SumSquaresArgs) + sizeof(double*) <= 4096,
              "sum of squares launch arguments too large");

// A thread's squares over its packs of a chunk, kSquaresInFlight packs'
// loads issued before any is added (nothing is stored between them, so
// nothing orders them), where one pack at a time left the H200's memory
// half idle (52% of its bandwidth). Added in the thread's order of packs as
// before, so the same bits.
constexpr int kSquaresInFlight = 4;
template <int V, class T>
__device__ __forceinline__ double sum_squares_chunk(const T* x, int64_t begin, int64_t end) {
  double acc = 0;
  auto add = [&acc](const compute_t<T>* xi, int count) {
    for (int k = 0; k < count; ++k) {
      const double d = static_cast<double>(xi[k]);
      acc += d * d;
    }
  };
  const int64_t whole = begin + (end - begin) / V * V;
  const int64_t step = int64_t(blockDim.x) * V;
  int64_t i = begin + threadIdx.x * int64_t(V);
  for (; i + (kSquaresInFlight - 1) * step < whole; i += kSquaresInFlight * step) {
    compute_t<T> xi[kSquaresInFlight][V];
#pragma unroll
    for (int u = 0; u < kSquaresInFlight; ++u) load_n<V>(x, i + u * step, xi[u]);
#pragma unroll
    for (int u = 0; u < kSquaresInFlight; ++u) add(xi[u], V);
  }
  for (; i < whole; i += step) {
    compute_t<T> xi[V];
    load_n<V>(x, i, xi);
    add(xi, V);
  }
  if constexpr (V > 1) {
    for (int64_t j = whole + threadIdx.x; j < end; j += blockDim.x) {
      const compute_t<T> xj[1] = {load(x, j)};
      add(xj, 1);
    }
  }
  return acc;
}

template <class T>
__global__ void __launch_bounds__(kMultiThreads)
    sum_squares_multi_kernel(SumSquaresArgs a, double* partial) {
  __shared__ double scratch[32];
  const BlockChunk c = block_chunk(a.table);
  const int t = c.slot;
  const int64_t begin = c.begin, end = min(a.n[t], begin + kMultiChunk);
  const T* x = static_cast<const T*>(a.x[t]);
  double acc = a.packed[t] ? sum_squares_chunk<kPack<T>>(x, begin, end)
                           : sum_squares_chunk<1>(x, begin, end);
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// One block: each thread adds a fixed stride of the partials in order, then
// the block sums the threads' totals in a fixed tree.
constexpr int kPartialsThreads = 1024;
__global__ void __launch_bounds__(kPartialsThreads)
    sum_partials_kernel(const double* partial, int64_t count, double* out, bool accumulate) {
  __shared__ double scratch[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) out[0] = accumulate ? out[0] + acc : acc;
}

std::vector<int64_t> sizes_of(const std::vector<SumSquaresTensor>& tensors) {
  std::vector<int64_t> sizes;
  for (const SumSquaresTensor& t : tensors) sizes.push_back(t.n);
  return sizes;
}

}  // namespace

int64_t sum_squares_partials(const std::vector<SumSquaresTensor>& tensors) {
  int64_t chunks = 0;
  for (const SumSquaresTensor& t : tensors) chunks += (t.n + kMultiChunk - 1) / kMultiChunk;
  return chunks;
}

Status check_sum_squares(ScalarType type, const std::vector<SumSquaresTensor>& tensors) {
  if (!is_nn_type(type)) {
    return Status::fail(std::string("element type ") + scalar_name(type) +
                        " is not supported (f32, bf16 or f16)");
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SumSquaresTensor& t = tensors[i];
    if (t.n < 0 || (t.n > 0 && t.x == nullptr)) {
      return Status::fail("tensor " + std::to_string(i) + ": a null pointer or negative size");
    }
    if (t.n > int64_t(kMultiChunk) * INT32_MAX) {
      return Status::fail("tensor " + std::to_string(i) + " has too many elements");
    }
  }
  return Status::fine();
}

void sum_squares_multi(ScalarType type, const std::vector<SumSquaresTensor>& tensors,
                       double* partial, double* out, bool accumulate, cudaStream_t stream) {
  require(check_sum_squares(type, tensors), "sum_squares_multi");
  int64_t done = 0;
  for (const AdamWLaunch& l :
       plan_adamw_multi(sizes_of(tensors), kAdamWTensorsPerLaunch, kMultiMaxBlocks, kMultiChunk)) {
    SumSquaresArgs args{};
    for (size_t s = 0; s < l.slots.size(); ++s) {
      const SumSquaresTensor& t = tensors[static_cast<size_t>(l.slots[s].tensor)];
      args.x[s] = t.x, args.n[s] = t.n, args.packed[s] = pack_aligned(t.x);
    }
    args.table = chunk_table(l);
    const int blocks = static_cast<int>(l.blocks);
    switch (type) {
      case ScalarType::BF16:
        sum_squares_multi_kernel<__nv_bfloat16>
            <<<blocks, kMultiThreads, 0, stream>>>(args, partial + done);
        break;
      case ScalarType::F16:
        sum_squares_multi_kernel<__half>
            <<<blocks, kMultiThreads, 0, stream>>>(args, partial + done);
        break;
      default:
        sum_squares_multi_kernel<float><<<blocks, kMultiThreads, 0, stream>>>(args, partial + done);
    }
    check_launch("sum_squares_multi");
    done += blocks;
  }
  sum_partials_kernel<<<1, kPartialsThreads, 0, stream>>>(partial, done, out, accumulate);
  check_launch("sum_squares_multi (partials)");
}

Status check_adamw(ScalarType type, int64_t n, const AdamWArgs& a) {
  if (!is_nn_type(type)) {
    return Status::fail(std::string("element type ") + scalar_name(type) +
                        " is not supported (f32, bf16 or f16)");
  }
  if (n < 0) return Status::fail("negative element count " + std::to_string(n));
  if (a.step < 1) return Status::fail("step " + std::to_string(a.step) + " must be >= 1");
  if (!(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1)) {
    return Status::fail("betas (" + std::to_string(a.beta1) + ", " + std::to_string(a.beta2) +
                        ") must be in [0, 1)");
  }
  return Status::fine();
}

Status check_adamw_moments(ScalarType type, ScalarType moment_type) {
  if (moment_type == type || (type == ScalarType::F32 && moment_type == ScalarType::BF16))
    return Status::fine();
  return Status::fail(std::string("moments of type ") + scalar_name(moment_type) +
                      " beside a parameter of type " + scalar_name(type) +
                      " are not supported (the parameter's type, or bf16 beside f32)");
}

void adamw(void* param, const void* grad, void* m, void* v, ScalarType type, ScalarType moment_type,
           int64_t n, const AdamWArgs& a, cudaStream_t stream) {
  require(check_adamw(type, n, a), "adamw");
  require(check_adamw_moments(type, moment_type), "adamw");
  if (a.clip_sum_sq) {
    require(Status::fail("clipping on the device is adamw_multi's (its caller scales instead)"),
            "adamw");
  }
  if (n == 0) return;
  const float decay = static_cast<float>(1.0 - a.lr * a.weight_decay);
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
  const float step_size = static_cast<float>(a.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  auto run = [&](auto t, auto moment) {
    using T = decltype(t);
    using M = decltype(moment);
    adamw_kernel<T, M><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(param), static_cast<const T*>(grad), static_cast<M*>(m), static_cast<M*>(v),
        n, decay, static_cast<float>(a.beta1), static_cast<float>(a.beta2), step_size, bc2_sqrt,
        static_cast<float>(a.eps), static_cast<float>(a.grad_scale));
  };
  if (moment_type != type) {
    run(float{}, __nv_bfloat16{});  // (bf16 moments beside an f32 parameter)
  } else {
    dispatch_nn(type, "adamw", [&](auto t) { run(t, t); });
  }
  check_launch("adamw");
}

}  // namespace triad::kernels
