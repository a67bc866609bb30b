#include "common.h"

namespace triad::kernels {

const char* scalar_name(ScalarType type) {
  switch (type) {
    case ScalarType::F32:
      return "f32";
    case ScalarType::F64:
      return "f64";
    case ScalarType::BF16:
      return "bf16";
    case ScalarType::F16:
      return "f16";
    case ScalarType::I32:
      return "i32";
    case ScalarType::I64:
      return "i64";
  }
  return "?";
}

int scalar_size(ScalarType type) {
  switch (type) {
    case ScalarType::F64:
    case ScalarType::I64:
      return 8;
    case ScalarType::BF16:
    case ScalarType::F16:
      return 2;
    default:
      return 4;
  }
}

void require(const Status& s, const char* kernel) {
  if (!s.ok) throw std::invalid_argument(std::string(kernel) + ": " + s.reason);
}

StridedView make_view(int ndim, const int64_t* shape, const int64_t* stride) {
  if (ndim < 0 || ndim > kMaxDims) {
    throw std::invalid_argument("strided view: " + std::to_string(ndim) + " dimensions, at most " +
                                std::to_string(kMaxDims) + " are supported");
  }
  StridedView v;
  v.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    v.shape[d] = shape[d];
    v.stride[d] = stride[d];
  }
  return v;
}

bool is_contiguous(const StridedView& v) {
  int64_t expected = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    if (v.shape[d] == 1) continue;
    if (v.stride[d] != expected) return false;
    expected *= v.shape[d];
  }
  return true;
}

void coalesce(StridedView& a, StridedView& b) {
  if (a.ndim <= 1) return;
  StridedView ra, rb;
  ra.ndim = rb.ndim = 0;
  for (int d = 0; d < a.ndim; ++d) {
    if (a.shape[d] == 1) continue;  // size-1 dimensions carry no stride information
    if (ra.ndim > 0) {
      const int last = ra.ndim - 1;
      if (ra.stride[last] == a.stride[d] * a.shape[d] &&
          rb.stride[last] == b.stride[d] * b.shape[d]) {
        ra.shape[last] *= a.shape[d];
        rb.shape[last] *= a.shape[d];
        ra.stride[last] = a.stride[d];
        rb.stride[last] = b.stride[d];
        continue;
      }
    }
    ra.shape[ra.ndim] = rb.shape[rb.ndim] = a.shape[d];
    ra.stride[ra.ndim++] = a.stride[d];
    rb.stride[rb.ndim++] = b.stride[d];
  }
  if (ra.ndim == 0) {  // every dimension had size 1: one element
    ra.ndim = rb.ndim = 1;
    ra.shape[0] = rb.shape[0] = 1;
    ra.stride[0] = rb.stride[0] = 1;
  }
  a = ra;
  b = rb;
}

}  // namespace triad::kernels
