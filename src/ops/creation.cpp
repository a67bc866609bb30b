#include "triad/ops/creation.h"

#include "triad/backend/backend.h"
#include "triad/core/rng.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/shape_ops.h"

namespace triad {

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  backend_for(device.type).fill(t, value);
  return t;
}
Tensor arange(int64_t start, int64_t n, DType dtype, Device device) {
  if (dtype != DType::I64 && dtype != DType::I32) {
    throw ValueError(std::string("arange: dtype ") + dtype_name(dtype) + " (expected i32 or i64)");
  }
  if (n < 0) throw ValueError("arange: negative length " + std::to_string(n));
  Tensor t = empty({n}, dtype, device);
  backend_for(device.type).arange(t, start);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor zeros_like(const Tensor& t) {
  return zeros(t.shape(), t.dtype(), t.device());
}

namespace {

Tensor from_host_f64(const std::vector<double>& values, const Shape& shape, DType dtype,
                     Device device) {
  if (static_cast<int64_t>(values.size()) != numel(shape)) {
    throw ShapeError("from_vector: " + std::to_string(values.size()) +
                     " values do not fill shape " + shape_str(shape));
  }
  Tensor host = empty(shape, DType::F64, Device::cpu());
  std::copy(values.begin(), values.end(), host.data<double>());
  Tensor out = empty(shape, dtype, device);
  backend_for(device.type).copy(host, out);
  return out;
}

}  // namespace

Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype,
                   Device device) {
  return from_host_f64(values, shape, dtype, device);
}

Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype,
                   Device device) {
  return from_host_f64(std::vector<double>(values.begin(), values.end()), shape, dtype, device);
}

Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, DType dtype,
                   Device device) {
  if (static_cast<int64_t>(values.size()) != numel(shape)) {
    throw ShapeError("from_vector: " + std::to_string(values.size()) +
                     " values do not fill shape " + shape_str(shape));
  }
  Tensor host = empty(shape, DType::I64, Device::cpu());
  std::copy(values.begin(), values.end(), host.data<int64_t>());
  Tensor out = empty(shape, dtype, device);
  backend_for(device.type).copy(host, out);
  return out;
}

// Element i of a counter-based draw depends on i alone, so the elements
// are drawn in parallel (a model's initial weights: 124M normals took 4 s
// in one thread), the same values in any thread count.
constexpr int64_t kParallelDraws = int64_t{1} << 15;

Tensor randn(const Shape& shape, uint64_t seed, uint64_t stream, double stddev, DType dtype,
             Device device) {
  const int64_t n = numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n >= kParallelDraws)
  for (int64_t i = 0; i < n; ++i) {
    v[static_cast<size_t>(i)] = stddev * philox_normal(seed, stream, static_cast<uint64_t>(i));
  }
  return from_host_f64(v, shape, dtype, device);
}

Tensor rand_uniform(const Shape& shape, uint64_t seed, uint64_t stream, double low, double high,
                    DType dtype, Device device) {
  const int64_t n = numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n >= kParallelDraws)
  for (int64_t i = 0; i < n; ++i) {
    v[static_cast<size_t>(i)] =
        low + (high - low) * philox_uniform(seed, stream, static_cast<uint64_t>(i));
  }
  return from_host_f64(v, shape, dtype, device);
}

std::vector<double> to_double_vector(const Tensor& t) {
  Tensor host = empty(t.shape(), DType::F64, Device::cpu());
  backend_for(t.device().is_cpu() ? DeviceType::CPU : t.device().type).copy(t, host);
  return std::vector<double>(host.data<double>(), host.data<double>() + host.numel());
}

std::vector<float> to_float_vector(const Tensor& t) {
  auto d = to_double_vector(t);
  return std::vector<float>(d.begin(), d.end());
}

double item(const Tensor& t) {
  if (t.numel() != 1) {
    throw ShapeError("item: tensor of shape " + shape_str(t.shape()) + " has " +
                     std::to_string(t.numel()) + " elements, expected 1");
  }
  return to_double_vector(t)[0];
}

std::vector<double> items(const std::vector<Tensor>& scalars) {
  std::vector<Tensor> parts;
  for (const Tensor& t : scalars) {
    if (t.numel() != 1) {
      throw ShapeError("items: tensor " + std::to_string(parts.size()) + " of shape " +
                       shape_str(t.shape()) + " has " + std::to_string(t.numel()) +
                       " elements, expected 1");
    }
    parts.push_back(reshape(cast(t.detach(), DType::F64), {1}));
  }
  if (parts.empty()) return {};
  return to_double_vector(parts.size() == 1 ? parts[0] : concat(parts, 0));
}

}  // namespace triad
