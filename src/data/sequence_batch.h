#pragma once

#include <cstdint>
#include <functional>

#include "triad/data/token_dataset.h"

namespace triad::data {

// Global sequences [first, first + count) as inputs and targets:
// `read(g, out, keep)` writes the seq_len + 1 tokens of global sequence g
// and their loss mask bytes; a target whose byte is 0 becomes -100. `who`
// names the caller in the error for a negative range.
Batch read_sequences(int64_t first, int64_t count, int64_t seq_len,
                     const std::function<void(int64_t, int64_t*, uint8_t*)>& read, const char* who);

// The global sequence that sequence `first` of step `step` is (step*G +
// first), after checking that [first, first + count) lies inside the global
// batch G; the error names `who`.
int64_t batch_start(int64_t step, int64_t global_batch, int64_t first, int64_t count,
                    const char* who);

}  // namespace triad::data
