#pragma once

#include <cstdint>
#include <vector>

#include "triad/core/tensor.h"

namespace triad {

Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
            Device device = Device::cpu());
Tensor zeros_like(const Tensor& t);
// start, start + 1, ..., start + n - 1 (i32 or i64), made on `device`
// (on a GPU by a kernel: no copy from the host, so a CUDA graph can hold it).
Tensor arange(int64_t start, int64_t n, DType dtype = DType::I64, Device device = Device::cpu());

// A tensor holding `values` (converted to dtype), of the given shape.
Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::F32,
                   Device device = Device::cpu());
Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::F32,
                   Device device = Device::cpu());
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::I64,
                   Device device = Device::cpu());

// Standard normal values times `stddev`; element i is philox_normal(seed,
// stream, i), so the result does not depend on the device or thread count.
Tensor randn(const Shape& shape, uint64_t seed, uint64_t stream = 0, double stddev = 1.0,
             DType dtype = DType::F32, Device device = Device::cpu());
// Uniform in [low, high).
Tensor rand_uniform(const Shape& shape, uint64_t seed, uint64_t stream, double low, double high,
                    DType dtype = DType::F32, Device device = Device::cpu());

// Host copies of the elements in row-major order.
std::vector<double> to_double_vector(const Tensor& t);
std::vector<float> to_float_vector(const Tensor& t);
// The value of a one-element tensor.
double item(const Tensor& t);
// The values of one-element tensors on one device, in one copy: on a GPU
// one wait for the work queued before them, where an item() each would
// wait once per value.
std::vector<double> items(const std::vector<Tensor>& scalars);

}  // namespace triad
