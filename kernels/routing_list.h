#pragma once

// The short best-first list a mixture's top-k choice keeps, one definition
// for the host (src/backend/expert_choice.cpp) and the device
// (routing.cu), so that both choose the same experts. Plain C++ that nvcc
// also compiles for the device.
#include "triad/core/host_device.h"

namespace triad::kernels {

// x (index i) into the best-first list (value, top) of at most k entries,
// holding `held`: by insertion, a later index passing an earlier one only
// with a higher value, so equal values keep the lower index first when
// offered in index order.
template <class I>
TRIAD_HOST_DEVICE inline void insert_best(double x, I i, double* value, I* top, I& held, I k) {
  if (held == k && !(x > value[k - 1])) return;
  I at = held < k ? held++ : k - 1;
  for (; at > 0 && value[at - 1] < x; --at) {
    value[at] = value[at - 1];
    top[at] = top[at - 1];
  }
  value[at] = x;
  top[at] = i;
}

}  // namespace triad::kernels
