#pragma once

#include <cstdint>

#include "triad/core/tensor.h"

namespace triad {

// Reductions over one dimension (differentiable).
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);
// Maximum along dim. The gradient is shared equally by tied maxima (like
// torch.amax).
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
// Over all elements, returning a scalar (shape []).
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

// Sums x down to `shape` (the reverse of broadcasting); used by backward.
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace triad
