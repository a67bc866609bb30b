#pragma once

#include <cstddef>
#include <cstdint>

#include "triad/data/indexed_dataset.h"

namespace triad::data {

// Tokens [first, first + count) of a run of `dtype` elements at `p`
// (unaligned, little-endian), widened to int64.
void widen_tokens(const std::byte* p, IndexedDType dtype, int64_t first, int64_t count,
                  int64_t* out);
// The first position in [0, count) whose token is outside [0, limit), or -1.
int64_t find_token_outside(const std::byte* p, IndexedDType dtype, int64_t count, int64_t limit);

}  // namespace triad::data
