#pragma once

// What every kernel family shares on the host side: the element types,
// argument checks that say why a launch cannot run, and the strided-view
// descriptor. Host-only C++ (no CUDA headers), so the checks are unit-tested
// on machines without a GPU.
#include <cstdint>
#include <stdexcept>
#include <string>

namespace triad::kernels {

// Element types, in the order of triad::DType (the adapter checks that).
enum class ScalarType : uint8_t { F32, F64, BF16, F16, I32, I64 };

const char* scalar_name(ScalarType type);
int scalar_size(ScalarType type);
inline bool is_half(ScalarType t) {
  return t == ScalarType::BF16 || t == ScalarType::F16;
}
// f32, bf16, f16: the types the neural-network kernels compute in.
inline bool is_nn_type(ScalarType t) {
  return t == ScalarType::F32 || is_half(t);
}

// "Can this run?": ok, or the reason it cannot.
struct Status {
  bool ok = true;
  std::string reason;
  static Status fine() { return {}; }
  static Status fail(std::string why) { return {false, std::move(why)}; }
};

// Throws std::invalid_argument naming the kernel when `s` is not ok.
void require(const Status& s, const char* kernel);

// Memory-bound kernels move 16 bytes per access where every pointer they
// are given is 16-byte aligned (device_utils.cuh: kPack, load_n, store_n);
// a null pointer (an absent operand) counts as aligned.
inline bool pack_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// A strided view of up to kMaxDims dimensions, passed to kernels by value.
constexpr int kMaxDims = 8;
struct StridedView {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};  // in elements
};

// Builds a view; throws std::invalid_argument when there are more than
// kMaxDims dimensions.
StridedView make_view(int ndim, const int64_t* shape, const int64_t* stride);
// True when the view walks memory 0, 1, 2, ... in row-major order.
bool is_contiguous(const StridedView& v);
// Merges adjacent dimensions that are contiguous with each other in both
// views (same shape), so most copies become one or two dimensions.
void coalesce(StridedView& a, StridedView& b);

}  // namespace triad::kernels
