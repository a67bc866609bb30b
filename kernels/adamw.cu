// AdamW: one grid-stride pass; the scalar factors are formed once on the host
// exactly as the CPU backend forms them.
#include <cmath>

#include "adamw.h"
#include "device_utils.cuh"

namespace triad::kernels {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, int64_t n, float decay, float b1,
                             float b2, float step_size, float bc2_sqrt, float eps) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = load(g, i);
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

}  // namespace

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

void adamw(void* param, const void* grad, void* m, void* v, ScalarType type, int64_t n,
           const AdamWArgs& a, cudaStream_t stream) {
  require(check_adamw(type, n, a), "adamw");
  if (n == 0) return;
  const float decay = static_cast<float>(1.0 - a.lr * a.weight_decay);
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
  const float step_size = static_cast<float>(a.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  dispatch_nn(type, "adamw", [&](auto t) {
    using T = decltype(t);
    adamw_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(param), static_cast<const T*>(grad), static_cast<T*>(m), static_cast<T*>(v),
        n, decay, static_cast<float>(a.beta1), static_cast<float>(a.beta2), step_size, bc2_sqrt,
        static_cast<float>(a.eps));
  });
  check_launch("adamw");
}

}  // namespace triad::kernels
